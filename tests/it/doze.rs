//! Dozing workers, the doorbell and its express hints (common/src/doorbell.rs,
//! worker/src/doze.rs, worker/src/express.rs), against
//! real Postgres, the broker and real HTTP: an idle worker pauses its partitions, the relay's
//! and the scheduler's rings wake it, a hint nobody rang for is still found, and the
//! doorbell's listener comes back after its connection is killed.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{eventually, spawn_app};
use railhook_common::doorbell::{self, Ringer};
use serde_json::json;
use sqlx::postgres::PgConnectOptions;

const WAIT: Duration = Duration::from_secs(30);

fn wakes(p: &Pipeline, reason: &str) -> u64 {
    p.worker_metrics.wakes.with_label_values(&[reason]).get()
}

async fn wait_dozing(p: &Pipeline) {
    eventually("the worker dozes", WAIT, || async {
        (p.worker_metrics.dozing.get() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_dozes_and_the_relays_ring_wakes_it_for_the_next_event() {
    let p = Pipeline::start(|s| s.worker_doze_after_ms = 1_000).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    wait_dozing(&p).await;
    let (_, delivery) = p.send(json!({"n": 1})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    assert!(wakes(&p, "ring") >= 1, "the relay's ring woke the worker");
    assert_eq!(wakes(&p, "missed_ring"), 0, "no hint waited unannounced");
    // It dozes again once idle, and the next Event wakes it again.
    wait_dozing(&p).await;
    let before = wakes(&p, "ring");
    let (_, second) = p.send(json!({"n": 2})).await;
    p.wait_status(&second, "SUCCEEDED", WAIT).await;
    assert!(wakes(&p, "ring") > before);
    assert_eq!(wakes(&p, "missed_ring"), 0);
    assert_eq!(receiver.count(), 2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_due_while_the_worker_dozes_is_rung_in_by_the_scheduler() {
    // The retry waits 3 s, three times the doze threshold: the worker is dozing when the
    // scheduler publishes the RetryHint.
    let p = Pipeline::start(|s| {
        s.worker_doze_after_ms = 1_000;
        s.retry_outgoing_delays = "3".into();
    })
    .await;
    let receiver = Receiver::start(vec![Behaviour::Status(503)], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    eventually("the first attempt", WAIT, || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    wait_dozing(&p).await;
    let (rings, rebalances) = (wakes(&p, "ring"), wakes(&p, "rebalance"));
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    // On a loaded machine the group may rebalance meanwhile (a missed heartbeat), which
    // wakes the worker first; the ring then finds it awake and counts no wake of its own.
    assert!(
        wakes(&p, "ring") > rings || wakes(&p, "rebalance") > rebalances,
        "the scheduler's ring woke the worker"
    );
    assert_eq!(wakes(&p, "missed_ring"), 0);
    assert_eq!(receiver.count(), 2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_no_doorbell_announced_is_found_by_the_group_watch() {
    let mut p = Pipeline::start(|s| s.worker_doze_after_ms = 1_000).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (endpoint, _) = p.endpoint(&receiver.url, 5_000).await;
    // One Delivery first, so the worker holds its partitions before it dozes: on a broker
    // whose group join takes seconds (nisshi: ~5 s) the assignment would wake it otherwise,
    // and it would find the hint without the group watch.
    let (_, first) = p.send(json!({"n": 0})).await;
    p.wait_status(&first, "SUCCEEDED", WAIT).await;
    // Without the relay nothing rings: the Delivery is PENDING and only the hint produced
    // here, behind the doorbell's back, names it.
    p.stop_relay().await;
    let (_, delivery) = p.send(json!({})).await;
    wait_dozing(&p).await;
    p.announce_by_hand(&delivery, &endpoint, 1).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    assert!(
        wakes(&p, "missed_ring") >= 1,
        "the group watch found the hint waiting"
    );
    p.stop().await;
}

fn options(database_url: &str) -> PgConnectOptions {
    database_url.parse().expect("database url")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_in_a_burst_become_at_most_two_notifies_and_each_is_heard() {
    let app = spawn_app().await;
    let mut heard = doorbell::listen(options(&app.database_url));
    eventually("the listener is up", WAIT, || async {
        heard.borrow().listening.then_some(())
    })
    .await;
    let start = heard.borrow_and_update().rings;
    let ringer = Ringer::spawn(options(&app.database_url));
    for _ in 0..1_000 {
        ringer.ring();
    }
    eventually("the first ring is heard", WAIT, || async {
        (heard.borrow().rings > start).then_some(())
    })
    .await;
    // The rest of the burst is folded into at most one more NOTIFY, after the gap.
    tokio::time::sleep(doorbell::GAP * 5).await;
    let burst = heard.borrow().rings - start;
    assert!(
        (1..=2).contains(&burst),
        "1,000 rings made {burst} notifies"
    );
    // A ring after the gap is heard on its own.
    ringer.ring();
    eventually("a later ring is heard", WAIT, || async {
        (heard.borrow().rings > start + burst).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_connection_is_killed_says_so_and_listens_again() {
    let app = spawn_app().await;
    let listener_options = options(&app.database_url).application_name("doze-test-listener");
    let mut heard = doorbell::listen(listener_options);
    eventually("the listener is up", WAIT, || async {
        heard.borrow().listening.then_some(())
    })
    .await;
    let before = heard.borrow_and_update().rings;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'doze-test-listener'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("terminate");
    assert_eq!(killed, vec![true]);
    // The loss counts as a ring and so does the new LISTEN (either may have hidden a
    // real ring): two more than before, and listening again.
    eventually(
        "the listener reports the loss and listens again",
        WAIT,
        || async {
            let h = *heard.borrow();
            (h.listening && h.rings >= before + 2).then_some(())
        },
    )
    .await;
    let before = heard.borrow().rings;
    Ringer::spawn(options(&app.database_url)).ring();
    eventually("a ring after the reconnect is heard", WAIT, || async {
        (heard.borrow().rings > before).then_some(())
    })
    .await;
}

fn express(p: &Pipeline, outcome: &str) -> u64 {
    p.worker_metrics
        .express_hints
        .with_label_values(&[outcome])
        .get()
}

/// Express hints (common/src/doorbell.rs `Express`, worker/src/express.rs): with a fetch that
/// waits 2 s at the broker, the relay's NOTIFY reaches the worker first, which claims from
/// it; each Event is still delivered once, no Claim misses (the Kafka copies are answered,
/// not claimed again), and the group's committed offsets still reach the end of every
/// partition: Kafka stays the path that moves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn express_hints_deliver_once_and_the_kafka_copies_still_move_the_offsets() {
    let p = Pipeline::start(|s| s.kafka_fetch_wait_ms = 2_000).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    // The relay rings as it reads each row (issue #54), which can be before a worker that
    // is still starting listens: the first Delivery, through Kafka, says the worker is up.
    let first = p.send(json!({ "n": -1 })).await.1;
    p.wait_status(&first, "SUCCEEDED", WAIT).await;
    let mut deliveries = Vec::new();
    for n in 0..20 {
        deliveries.push(p.send(json!({ "n": n })).await.1);
    }
    for d in &deliveries {
        p.wait_status(d, "SUCCEEDED", WAIT).await;
    }
    assert!(express(&p, "queued") >= 1, "the doorbell carried hints");
    assert_eq!(
        p.relay_metrics.express_mispredicted.get(),
        0,
        "every hint sent at read time went to the partition the broker chose"
    );
    let topic = railhook_common::kafka::deliveries_topic(&p.settings.topic_prefix);
    let probe = railhook_worker::group_watch::Probe::new(
        &p.settings.kafka(),
        &p.settings.worker_group,
        &[&topic],
    )
    .expect("probe");
    let probe = std::sync::Arc::new(probe);
    eventually(
        "the committed offsets reach every partition's end",
        WAIT,
        || {
            let probe = probe.clone();
            async move {
                let positions =
                    tokio::task::spawn_blocking(move || probe.positions(Duration::from_secs(5)))
                        .await
                        .ok()?
                        .ok()?;
                let total: i64 = positions.iter().map(|p| p.end).sum();
                (total == 21 && positions.iter().all(|p| p.committed == p.end)).then_some(())
            }
        },
    )
    .await;
    assert_eq!(receiver.count(), 21, "each Event delivered once");
    assert_eq!(p.worker_metrics.claim_misses.get(), 0, "no second Claim");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_express_hints_off_the_fetch_alone_delivers() {
    let p = Pipeline::start(|s| s.worker_express_hints = false).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let heard: u64 = <railhook_worker::metrics::ExpressOutcome as railhook_common::Word>::ALL
        .iter()
        .map(|o| express(&p, railhook_common::Word::as_str(*o)))
        .sum();
    assert_eq!(heard, 0, "the worker took no express hint");
    assert_eq!(receiver.count(), 1);
    p.stop().await;
}
