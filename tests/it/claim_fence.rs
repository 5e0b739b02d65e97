//! The Claim and the Fence against real Postgres, and duplicate hints through real Kafka.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::spawn_app;
use railhook_common::DeliveryStatus;
use railhook_worker::attempt::{Outcome, Report};
use railhook_worker::retry_policy::Decision;
use railhook_worker::{claim, fence, sweeps};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

const STREAK: fence::StreakPolicy = fence::StreakPolicy {
    disable_after: Duration::from_secs(5 * 24 * 3600),
    min_failures: 5,
    failing_after: 4,
};

fn report(outcome: Outcome) -> Report {
    Report {
        started_at: chrono::Utc::now(),
        duration: Duration::from_millis(5),
        status: Some(200),
        outcome,
        error: None,
        excerpt: None,
        sent: true,
        request: None,
    }
}

/// Claims one Delivery with the statement production runs (`claim_batch`, which the
/// worker uses for every batch of Announcements).
async fn claim_one(pool: &sqlx::PgPool, id: &str) -> Option<claim::Claimed> {
    claim::claim_batch(pool, &[id.to_owned()], std::time::Duration::from_secs(60))
        .await
        .expect("claim")
        .won
        .into_iter()
        .next()
        .map(|(claimed, _)| claimed)
}

/// An app with one endpoint and one Event: returns the app and the Delivery's id.
async fn one_pending_delivery() -> (crate::support::TestApp, String) {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let r = app.post_event(&key, "a.b", json!({}), None).await;
    let id = r.body["deliveries"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    (app, id)
}

#[tokio::test]
async fn a_claim_the_sweep_took_back_cannot_be_restamped() {
    // Review #19 item 1: a Claim that waited (gate, limits) is re-stamped through the Fence
    // right before its request; once the sweep took the row back the re-stamp fails and
    // the request is not sent.
    let (app, id) = one_pending_delivery().await;
    let a = claim_one(&app.pool, &id).await.expect("won");
    assert!(fence::restamp(&app.pool, &a).await.expect("restamp"));
    let stamp = || {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
            "SELECT last_attempt_at FROM deliveries WHERE id = $1",
        )
        .bind(&id)
        .fetch_one(&app.pool)
    };
    let before = stamp().await.expect("stamp");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(fence::restamp(&app.pool, &a).await.expect("restamp"));
    let after = stamp().await.expect("stamp");
    assert!(after > before, "the re-stamp moved the stamp");
    assert_eq!(
        sweeps::sweep_processing(&app.pool, 0.0, 3600.0, 3600.0)
            .await
            .expect("sweep"),
        1
    );
    assert!(!fence::restamp(&app.pool, &a).await.expect("restamp"));
    let b = claim_one(&app.pool, &id).await.expect("won again");
    assert!(!fence::restamp(&app.pool, &a).await.expect("restamp"));
    assert!(fence::restamp(&app.pool, &b).await.expect("restamp"));
}

#[tokio::test]
async fn a_stalled_worker_that_wakes_after_the_sweep_is_fenced_out() {
    let (app, id) = one_pending_delivery().await;

    // Worker A claims; a duplicate hint claims nothing.
    let a = claim_one(&app.pool, &id).await.expect("won");
    assert!(claim_one(&app.pool, &id).await.is_none());
    // A stalls past the processing timeout; the sweep hands the row back; B claims it.
    assert_eq!(
        sweeps::sweep_processing(&app.pool, 0.0, 3600.0, 3600.0)
            .await
            .expect("sweep"),
        1
    );
    let b = claim_one(&app.pool, &id).await.expect("won");
    // B finishes first: its outcome counts. A wakes: its outcome lands on nothing.
    assert!(
        fence::finalise(
            &app.pool,
            &b,
            &report(Outcome::Delivered),
            &Decision::Succeeded,
            &STREAK
        )
        .await
        .expect("b")
        .wrote
    );
    let retry = Decision::RetryAfter(Duration::from_secs(60));
    let late = report(Outcome::Retry { retry_after: None });
    assert!(
        !fence::finalise(&app.pool, &a, &late, &retry, &STREAK)
            .await
            .expect("a")
            .wrote
    );
    // Read back through the type (stored as text, decoded by its sqlx::Type).
    let (status, count): (DeliveryStatus, i32) =
        sqlx::query_as("SELECT status, attempt_count FROM deliveries WHERE id = $1")
            .bind(&id)
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert_eq!((status, count), (DeliveryStatus::Succeeded, 1));
    // Both requests went out, so both are recorded; A's is marked fenced.
    let fenced: Vec<bool> =
        sqlx::query_scalar("SELECT fenced FROM attempts WHERE delivery_id = $1 ORDER BY id")
            .bind(&id)
            .fetch_all(&app.pool)
            .await
            .expect("attempts");
    assert_eq!(fenced, vec![false, true]);
}

#[tokio::test]
async fn the_retry_path_hands_a_row_to_exactly_one_consumer() {
    let (app, id) = one_pending_delivery().await;
    let c = claim_one(&app.pool, &id).await.expect("won");
    let retry = Decision::RetryAfter(Duration::ZERO);
    assert!(
        fence::finalise(
            &app.pool,
            &c,
            &report(Outcome::Retry { retry_after: None }),
            &retry,
            &STREAK
        )
        .await
        .expect("f")
        .wrote
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Two schedulers race: one gets the row, the other nothing (SKIP LOCKED + status).
    let (first, second) = tokio::join!(
        claim::claim_due(&app.pool, 10),
        claim::claim_due(&app.pool, 10)
    );
    let due: Vec<_> = first
        .expect("1")
        .into_iter()
        .chain(second.expect("2"))
        .collect();
    assert_eq!(due.len(), 1);
    let (_, _, scheduler_token) = due[0].clone();
    // While its RetryHint waits in Kafka the row is nobody's Claim: the processing timeout
    // does not sweep it (that re-claimed rows in a loop under Kafka lag), the hint window
    // would.
    assert_eq!(
        sweeps::sweep_processing(&app.pool, 0.0, 3600.0, 3600.0)
            .await
            .expect("sweep"),
        0
    );
    // The hint is delivered twice, in one batch and again later: only one swap wins.
    let hint = (id.clone(), scheduler_token);
    let one = claim::swap_batch(&app.pool, &[hint.clone(), hint.clone()])
        .await
        .expect("swap");
    let two = claim::swap_batch(&app.pool, std::slice::from_ref(&hint))
        .await
        .expect("swap");
    assert_eq!((one.len(), two.len()), (1, 0));
    // Once a consumer swapped the token in, it is a worker's Claim like any other.
    assert_eq!(
        sweeps::sweep_processing(&app.pool, 0.0, 3600.0, 3600.0)
            .await
            .expect("sweep"),
        1
    );
    let taken_back = claim_one(&app.pool, &id)
        .await
        .expect("the swept row is claimable again");
    assert!(
        sweeps::sweep_processing(&app.pool, 3600.0, 3600.0, 3600.0)
            .await
            .expect("sweep")
            == 0,
        "a fresh Claim is not swept"
    );
    // The Claim taken back is the live one: the swapped-in Claim it replaced is fenced out.
    let (swapped, _) = one.into_iter().next().expect("swapped");
    assert!(
        !fence::finalise(
            &app.pool,
            &swapped,
            &report(Outcome::Delivered),
            &Decision::Succeeded,
            &STREAK
        )
        .await
        .expect("stale")
        .wrote,
        "a swept Claim's token still finalised"
    );
    assert!(
        fence::finalise(
            &app.pool,
            &taken_back,
            &report(Outcome::Delivered),
            &Decision::Succeeded,
            &STREAK
        )
        .await
        .expect("live")
        .wrote,
        "the Claim that took the row back could not finalise"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_hints_in_kafka_deliver_once_across_two_workers() {
    let mut p = Pipeline::start(|_| {}).await;
    p.spawn_worker();
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_millis(200), 200)).await;
    let (endpoint, _) = p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    // The relay's Announcement plus five copies, as after relay restarts and redeliveries.
    p.announce_by_hand(&delivery, &endpoint, 5).await;
    p.wait_status(&delivery, "SUCCEEDED", Duration::from_secs(30))
        .await;
    // Every duplicate hint was produced before the first arrived; a Claim that let one
    // through would send it within the worker's next poll and Attempt (well under 2 s).
    const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);
    crate::support::holds_for(
        "no duplicate reaches the receiver",
        DUPLICATE_WINDOW,
        || async {
            match receiver.count() {
                1 => Ok(()),
                n => Err(format!("{n} requests")),
            }
        },
    )
    .await;
    assert!(p.worker_metrics.claim_misses.get() >= 5);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_round_whose_worker_died_before_publishing_is_recovered_in_minutes_not_an_hour() {
    // A worker's retry scheduler took a due row and was killed before its hint was
    // acknowledged: simulated by taking the row here, as `claim_due` does, and publishing
    // nothing. The running worker's sweep must hand it back within the unpublished window
    // (twice the 3 s message timeout here), not the stranded window (an hour).
    let p = Pipeline::start(|s| {
        s.kafka_message_timeout_ms = 3_000;
        s.retry_scheduler_ms = 3_600_000;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({"n": 1})).await;
    p.wait_status(&delivery, "SUCCEEDED", Duration::from_secs(30))
        .await;
    sqlx::query(
        "UPDATE deliveries SET status = 'PENDING', next_retry_at = now() - interval '1 second'
         WHERE id = $1",
    )
    .bind(&delivery)
    .execute(&p.app.pool)
    .await
    .expect("due again");
    let taken = claim::claim_due(&p.app.pool, 10).await.expect("claim_due");
    assert_eq!(taken.len(), 1, "the killed scheduler's round");
    // Nothing was published; the row is PROCESSING with a scheduler's token.
    crate::support::eventually(
        "the row handed back by the sweep",
        Duration::from_secs(30),
        || async {
            let status: String = sqlx::query_scalar("SELECT status FROM deliveries WHERE id = $1")
                .bind(&delivery)
                .fetch_one(&p.app.pool)
                .await
                .ok()?;
            // The sweep counts after its commit: wait for both, not one then the other.
            let counted = p
                .worker_metrics
                .swept
                .with_label_values(&["processing"])
                .get()
                >= 1;
            (status == "PENDING" && counted).then_some(())
        },
    )
    .await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_of_a_newer_version_is_claimed_not_dropped() {
    // A rolling deploy: a newer relay writes version 2, with fields this worker does not
    // know. The worker must still claim the Delivery it names (before: the message was
    // counted as bad and its offset stored, so the Delivery waited an hour for the sweep).
    let mut p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (endpoint, _) = p.endpoint(&receiver.url, 5_000).await;
    p.stop_relay().await;
    let (_, delivery) = p.send(json!({"n": 2})).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &p.settings.kafka_brokers)
        .create()
        .expect("producer");
    let topic = railhook_common::kafka::deliveries_topic(&p.settings.topic_prefix);
    let v2 = json!({
        "v": 2,
        "delivery_id": delivery,
        "endpoint_id": endpoint,
        "route": {"shard": 4, "reason": "CREATED"},
    })
    .to_string();
    producer
        .send(
            FutureRecord::to(&topic).key(&endpoint).payload(&v2),
            Duration::from_secs(5),
        )
        .await
        .expect("produce");
    p.wait_status(&delivery, "SUCCEEDED", Duration::from_secs(30))
        .await;
    assert_eq!(receiver.count(), 1);
    assert_eq!(p.worker_metrics.bad_hints.get(), 0);
    p.stop().await;
}

/// The ages behind `railhook_worker_oldest_unclaimed_age_seconds` and
/// `railhook_worker_oldest_due_retry_age_seconds`, read from real rows: a Delivery waiting
/// for its first hint counts as unclaimed from its last update; one with a retry time that
/// has passed counts as a due retry from that time; each is 0 once nothing waits.
#[tokio::test]
async fn the_oldest_waiting_ages_follow_the_rows() {
    let (app, id) = one_pending_delivery().await;
    let set = |sql: &'static str| {
        let pool = app.state.pool.clone();
        let id = id.clone();
        async move {
            sqlx::query(sql)
                .bind(id)
                .execute(&pool)
                .await
                .expect("update");
        }
    };
    set("UPDATE deliveries SET updated_at = now() - interval '100 seconds' WHERE id = $1").await;
    let (due, unclaimed) = sweeps::oldest_waiting(&app.state.pool).await.expect("ages");
    assert_eq!(due, 0);
    assert!((100..110).contains(&unclaimed), "{unclaimed}");
    set("UPDATE deliveries SET next_retry_at = now() - interval '50 seconds' WHERE id = $1").await;
    let (due, unclaimed) = sweeps::oldest_waiting(&app.state.pool).await.expect("ages");
    assert!((50..60).contains(&due), "{due}");
    assert_eq!(unclaimed, 0);
    // A retry scheduled for later is not due yet.
    set("UPDATE deliveries SET next_retry_at = now() + interval '1 hour' WHERE id = $1").await;
    assert_eq!(
        sweeps::oldest_waiting(&app.state.pool).await.expect("ages"),
        (0, 0)
    );
    set("UPDATE deliveries SET status = 'SUCCEEDED', next_retry_at = NULL WHERE id = $1").await;
    assert_eq!(
        sweeps::oldest_waiting(&app.state.pool).await.expect("ages"),
        (0, 0)
    );
}

/// A hint can reach the worker before its row is visible: Postgres puts the commit record in
/// the WAL (which the relay decodes and publishes) before the transaction shows in other
/// snapshots. Here the row's transaction stays open while its hint is consumed, then
/// commits: the worker must look again rather than take the hint for a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_that_arrives_before_its_row_is_visible_is_claimed_once_it_is() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (endpoint, _) = p.endpoint(&receiver.url, 5_000).await;
    let (_, first) = p.send(json!({})).await;
    p.wait_status(&first, "SUCCEEDED", Duration::from_secs(30))
        .await;
    // A second Delivery of the same Event, inserted in a transaction that is still open
    // when its hint is consumed.
    let early = format!("dlv_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut tx = p.app.pool.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id) \
         SELECT $1, project_id, event_id, endpoint_id, subscription_id FROM deliveries WHERE id = $2",
    )
    .bind(&early)
    .bind(&first)
    .execute(&mut *tx)
    .await
    .expect("insert");
    let misses = p.worker_metrics.claim_misses.get();
    p.announce_by_hand(&early, &endpoint, 1).await;
    crate::support::eventually(
        "the worker looked and did not see the row",
        Duration::from_secs(30),
        || async { (p.worker_metrics.early_hints.get() > 0).then_some(()) },
    )
    .await;
    tx.commit().await.expect("commit");
    p.wait_status(&early, "SUCCEEDED", Duration::from_secs(30))
        .await;
    assert_eq!(receiver.count(), 2);
    assert_eq!(
        p.worker_metrics.claim_misses.get(),
        misses,
        "the early hint was not counted as a duplicate"
    );
    p.stop().await;
}

/// Parking in the Claim (worker/src/ordering.rs): an ordered hint behind an unresolved
/// Delivery is parked by the Claim statement itself, not claimed; the head goes without the
/// gate; and a parked Delivery whose predecessor resolved is taken by exactly one of the two
/// second looks (the resolver's `hand_off_next`, the parker's `take_parked`).
#[tokio::test]
async fn ordered_hints_behind_their_predecessor_are_parked_by_the_claim_and_taken_once() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], true).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let r = app.post_event(&key, "a.b", json!({"n": n}), None).await;
        ids.push(
            r.body["deliveries"][0]["id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }
    let numbers: Vec<Option<i64>> = sqlx::query_scalar(
        "SELECT sequence_number FROM deliveries WHERE id = ANY($1) ORDER BY sequence_number",
    )
    .bind(&ids)
    .fetch_all(&app.pool)
    .await
    .expect("numbers");
    assert_eq!(
        numbers,
        vec![Some(1), Some(2), Some(3)],
        "numbered by ingest"
    );
    let gap = Duration::from_secs(60);
    let state = |id: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_as::<_, (String, bool, bool)>(
                "SELECT status, parked_at IS NOT NULL,
                        coalesce(next_retry_at > now() + interval '30 seconds', false)
                 FROM deliveries WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("row")
        }
    };

    // The hints of the second and third come first: both parked, neither claimed.
    let got = claim::claim_batch(&app.pool, &ids[1..], gap)
        .await
        .expect("claim");
    assert!(got.won.is_empty());
    assert_eq!(got.parked.len(), 2);
    assert_eq!(state(ids[1].clone()).await, ("PENDING".into(), true, true));
    // A repeated hint for a parked row is not due: nothing at all.
    let again = claim::claim_batch(&app.pool, &ids[1..2], gap)
        .await
        .expect("claim");
    assert!(again.won.is_empty() && again.parked.is_empty());
    // The head goes without the gate.
    let head = claim::claim_batch(&app.pool, &ids[..1], gap)
        .await
        .expect("claim");
    assert_eq!(head.won.len(), 1);
    let (first, _) = &head.won[0];
    assert!(first.gated && first.sequence_number == Some(1));
    // Still behind it: the parker's look takes nothing.
    assert!(
        claim::take_parked(&app.pool, &ids[1..])
            .await
            .expect("look")
            .is_empty()
    );

    // The head resolves without its hand-off (as when the park committed after its look):
    // the resolver's second look takes the next one, and the parker's look then finds it
    // gone and the third still behind it.
    assert!(
        fence::finalise(
            &app.pool,
            first,
            &report(Outcome::Delivered),
            &Decision::Succeeded,
            &STREAK
        )
        .await
        .expect("finalise")
        .wrote
    );
    let (second, _) = claim::hand_off_next(&app.pool, &ep, 1)
        .await
        .expect("hand-off")
        .expect("the second is handed off");
    assert_eq!(second.id, ids[1]);
    assert!(second.gated && second.sequence_number == Some(2));
    assert_eq!(
        state(ids[1].clone()).await,
        ("PROCESSING".into(), false, false)
    );
    assert!(
        claim::take_parked(&app.pool, &ids[1..])
            .await
            .expect("look")
            .is_empty()
    );

    // The second resolves and nobody hands off: the parker's look takes the third, once.
    assert!(
        fence::finalise(
            &app.pool,
            &second,
            &report(Outcome::Delivered),
            &Decision::Succeeded,
            &STREAK
        )
        .await
        .expect("finalise")
        .wrote
    );
    let taken = claim::take_parked(&app.pool, &ids[2..])
        .await
        .expect("look");
    assert_eq!(taken.len(), 1);
    assert!(taken[0].0.gated && taken[0].0.sequence_number == Some(3));
    assert!(
        claim::take_parked(&app.pool, &ids[2..])
            .await
            .expect("look")
            .is_empty()
    );
    assert!(
        claim::hand_off_next(&app.pool, &ep, 2)
            .await
            .expect("hand-off")
            .is_none(),
        "taken once"
    );
}

/// Railhook's pool never JIT-compiles, even on a server set to compile every statement
/// (common/src/db.rs, `start_session`): at 1,000 Events/s each Claim spent 3–5 s of CPU
/// compiling itself once the planner's estimate passed `jit_above_cost`. The control, a plain
/// connection to the same database, shows the server would compile.
#[tokio::test]
async fn the_pool_never_jit_compiles_even_where_the_server_would() {
    let url = crate::support::fresh_database().await;
    let name = url.rsplit_once('/').expect("database url").1.to_owned();
    let plain = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::raw_sql(&format!(
        "ALTER DATABASE {name} SET jit = on; ALTER DATABASE {name} SET jit_above_cost = 0"
    ))
    .execute(&plain)
    .await
    .expect("alter database");
    plain.close().await;
    let probe = "EXPLAIN (ANALYZE, FORMAT TEXT) SELECT count(*) FROM deliveries";
    let plan = |rows: Vec<String>| rows.join("\n");

    let control = sqlx::PgPool::connect(&url).await.expect("connect");
    let available: bool = sqlx::query_scalar("SELECT pg_jit_available()")
        .fetch_one(&control)
        .await
        .expect("pg_jit_available");
    assert!(
        available,
        "this Postgres has no JIT provider: the control cannot show one"
    );
    let compiled = plan(
        sqlx::query_scalar(probe)
            .fetch_all(&control)
            .await
            .expect("explain"),
    );
    assert!(
        compiled.contains("JIT:"),
        "the control connection should compile:\n{compiled}"
    );
    control.close().await;

    let settings = crate::support::settings(&url, &crate::support::local_setting("REDIS_URL"));
    let pool = railhook_common::db::connect(&settings).expect("pool");
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&pool)
        .await
        .expect("show jit");
    assert_eq!(jit, "off");
    let interpreted = plan(
        sqlx::query_scalar(probe)
            .fetch_all(&pool)
            .await
            .expect("explain"),
    );
    assert!(
        !interpreted.contains("JIT:"),
        "Railhook's pool compiled a statement:\n{interpreted}"
    );
}

/// How one connection ran the statement whose text starts with `prefix`: (calls on its one
/// cached generic plan, calls planned anew), from `pg_prepared_statements`.
async fn plans_of(conn: &mut sqlx::PgConnection, prefix: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements
         WHERE ltrim(statement) LIKE $1 || '%'",
    )
    .bind(prefix)
    .fetch_one(conn)
    .await
    .expect("the statement is prepared on this connection")
}

/// The worker's pool plans its outcome write once per connection, however many day
/// partitions retention keeps (common/src/db.rs, `Planning::Generic`); the server's default
/// choice plans it at every call, since a generic plan spans every partition. With 30 days
/// of partitions that planning cost more than the statement's execution.
#[tokio::test]
async fn the_worker_pool_plans_its_outcome_write_once_over_a_month_of_partitions() {
    let (app, id) = one_pending_delivery().await;
    sqlx::query("SELECT railhook_ensure_partitions(current_date - 30, current_date)")
        .execute(&app.pool)
        .await
        .expect("a month of partitions");
    let claimed = claim_one(&app.pool, &id).await.expect("won");
    // A stale token: every call runs the whole statement and lands on nothing.
    let stale = claim::Claimed {
        token: uuid::Uuid::new_v4(),
        ..claimed
    };
    let unsent = Report {
        sent: false,
        request: None,
        ..report(Outcome::Delivered)
    };
    let mut settings = crate::support::settings(
        &app.database_url,
        &crate::support::local_setting("REDIS_URL"),
    );
    settings.db_max_connections = 1;
    let mut seen = Vec::new();
    for planning in [
        railhook_common::db::Planning::Generic,
        railhook_common::db::Planning::Server,
    ] {
        let pool = railhook_common::db::connect_planned(&settings, planning).expect("pool");
        for _ in 0..8 {
            // A retry: `finalise`'s own statement (a success goes to the group statement).
            let retry = Decision::RetryAfter(Duration::from_secs(60));
            let done = fence::finalise(&pool, &stale, &unsent, &retry, &STREAK)
                .await
                .expect("finalise");
            assert!(!done.wrote, "a stale token writes nothing");
        }
        let mut conn = pool.acquire().await.expect("conn");
        seen.push(plans_of(&mut conn, "WITH upd AS").await);
    }
    assert_eq!(
        seen[0],
        (8, 0),
        "the worker's pool: every call on the generic plan"
    );
    assert_eq!(
        seen[1].1, 8,
        "the server's choice plans every call: if this fails, Postgres now prefers the generic plan by itself and Planning::Generic may be unneeded ({seen:?})"
    );
}

/// A group of successes (worker/src/successes.rs) writes, row for row, what `fence::finalise`
/// writes for each success on its own: the same Delivery columns, the same Attempt rows
/// (fenced where the Claim was lost), the failure streak reset and the same
/// `message.attempt.recovered` operational Events.
#[tokio::test]
async fn a_group_of_successes_writes_what_finalise_writes_one_by_one() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ops = app
        .call(
            reqwest::Method::POST,
            "/v1/operational-endpoints",
            Some(&key),
            Some(json!({"url": "https://ops.example.com/hook"})),
        )
        .await;
    assert_eq!(ops.status, reqwest::StatusCode::CREATED, "{:?}", ops.body);
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        let r = app
            .post_event(&key, "order.paid", json!({"n": n}), None)
            .await;
        ids.push(
            r.body["deliveries"][0]["id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }
    // Every Delivery past STREAK.failing_after Attempts: its success is a recovery.
    sqlx::query("UPDATE deliveries SET attempt_count = 4 WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&app.pool)
        .await
        .expect("attempts");
    let failing = || async {
        sqlx::query(
            "UPDATE endpoints SET consecutive_failures = 3,
                    failing_since = now() - interval '1 hour' WHERE id = $1",
        )
        .bind(&ep)
        .execute(&app.pool)
        .await
        .expect("failing");
    };
    let claims = claim::claim_batch(&app.pool, &ids, Duration::from_secs(60))
        .await
        .expect("claim");
    let mut claimed: Vec<claim::Claimed> = ids
        .iter()
        .map(|id| {
            claims
                .won
                .iter()
                .find(|(c, _)| &c.id == id)
                .expect("won")
                .0
                .clone()
        })
        .collect();
    // The third of each half lost its Claim to another worker.
    for lost in [2, 5] {
        sqlx::query("UPDATE deliveries SET claim_token = gen_random_uuid() WHERE id = $1")
            .bind(&ids[lost])
            .execute(&app.pool)
            .await
            .expect("steal");
    }
    let mut report = report(Outcome::Delivered);
    report.status = Some(204);
    report.excerpt = Some("ok".into());

    // One by one through finalise, then the same as one group.
    failing().await;
    let mut alone = Vec::new();
    for c in &claimed[..3] {
        let done = fence::finalise(&app.pool, c, &report, &Decision::Succeeded, &STREAK)
            .await
            .expect("finalise");
        alone.push(done.wrote);
    }
    assert_eq!(alone, [true, true, false]);
    failing().await;
    let group: Vec<_> = claimed.drain(3..).map(|c| (c, report.clone())).collect();
    let outcomes = group.iter().map(|(c, r)| (c, r));
    let wrote = railhook_worker::successes::write_successes(&app.pool, &STREAK, outcomes)
        .await
        .expect("group");
    assert_eq!(wrote, [ids[3].clone(), ids[4].clone()]);

    let (failures, since): (i32, Option<chrono::DateTime<chrono::Utc>>) =
        sqlx::query_as("SELECT consecutive_failures, failing_since FROM endpoints WHERE id = $1")
            .bind(&ep)
            .fetch_one(&app.pool)
            .await
            .expect("endpoint");
    assert_eq!((failures, since), (0, None), "the streak is reset");
    type Row = (String, i32, Option<i32>, Option<String>, bool, bool);
    let delivery = |id: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_as::<_, Row>(
                "SELECT status, attempt_count, last_status_code, failure_reason,
                        claim_token IS NULL, next_retry_at IS NULL
                 FROM deliveries WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("delivery")
        }
    };
    type AttemptRow = (
        i32,
        Option<i32>,
        String,
        i32,
        Option<String>,
        Option<String>,
        bool,
    );
    let attempts = |id: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_as::<_, AttemptRow>(
                "SELECT attempt_number, status_code, outcome, duration_ms, error_class,
                        response_excerpt, fenced
                 FROM attempts WHERE delivery_id = $1 ORDER BY id",
            )
            .bind(id)
            .fetch_all(&pool)
            .await
            .expect("attempts")
        }
    };
    let recovered = |id: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, serde_json::Value>(
                "SELECT (payload->'data') - 'delivery_id'::text - 'event_id'::text
                 FROM events WHERE operational AND event_type = 'message.attempt.recovered'
                   AND payload->'data'->>'delivery_id' = $1",
            )
            .bind(id)
            .fetch_all(&pool)
            .await
            .expect("operational")
        }
    };
    for (a, g) in [(0, 3), (1, 4), (2, 5)] {
        assert_eq!(
            delivery(ids[a].clone()).await,
            delivery(ids[g].clone()).await,
            "delivery {a} vs {g}"
        );
        assert_eq!(
            attempts(ids[a].clone()).await,
            attempts(ids[g].clone()).await,
            "attempts {a} vs {g}"
        );
        let (one, other) = (
            recovered(ids[a].clone()).await,
            recovered(ids[g].clone()).await,
        );
        assert_eq!(one.len(), usize::from(a < 2), "recovered for {a}");
        assert_eq!(one, other, "recovered {a} vs {g}");
    }
    assert_eq!(
        delivery(ids[4].clone()).await.0,
        DeliveryStatus::Succeeded.as_str()
    );
    assert!(
        attempts(ids[5].clone()).await[0].6,
        "the lost Claim's Attempt is fenced"
    );
}

/// Review #34 item 9: a Delivery whose Event row is missing is still returned by the Claim
/// (a LEFT join) and failed `event_gone` by its turn. Before, the Claim's inner join flipped
/// it to PROCESSING under a token it handed to nobody, and it sat there until the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_event_is_gone_is_claimed_and_failed_event_gone() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (endpoint, _) = p.endpoint(&receiver.url, 5_000).await;
    let (_, first) = p.send(json!({})).await;
    p.wait_status(&first, "SUCCEEDED", Duration::from_secs(30))
        .await;
    let orphan = format!("dlv_{}", ulid::Ulid::new().to_string().to_lowercase());
    let missing = format!("evt_{}", ulid::Ulid::new().to_string().to_lowercase());
    sqlx::query(
        "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id) \
         SELECT $1, project_id, $3, endpoint_id, subscription_id FROM deliveries WHERE id = $2",
    )
    .bind(&orphan)
    .bind(&first)
    .bind(&missing)
    .execute(&p.app.pool)
    .await
    .expect("insert");
    p.announce_by_hand(&orphan, &endpoint, 1).await;
    let (status, reason, token) =
        crate::support::eventually("the orphan is failed", Duration::from_secs(30), || async {
            let row: (String, Option<String>, Option<uuid::Uuid>) = sqlx::query_as(
                "SELECT status, failure_reason, claim_token FROM deliveries WHERE id = $1",
            )
            .bind(&orphan)
            .fetch_one(&p.app.pool)
            .await
            .expect("row");
            (row.0 == "FAILED").then_some(row)
        })
        .await;
    assert_eq!(
        (status.as_str(), reason.as_deref(), token),
        ("FAILED", Some("event_gone"), None)
    );
    assert_eq!(receiver.count(), 1, "nothing was sent for it");
}

/// The Claim reads its rows by primary key whatever the statistics say (claim.rs,
/// `claim_batch`): the statistics are taken with one open Delivery, autovacuum is kept off
/// the partition, then a backlog of 20,000 PENDING rows arrives. A generic plan made from
/// those statistics could read every open row through a partial index per Claim (issue #54:
/// 15 ms for one hint over 50,000); the Claim must read (almost) none of them.
#[tokio::test]
async fn the_claim_reads_by_primary_key_even_with_stale_statistics() {
    use sqlx::Connection;
    let (app, id) = one_pending_delivery().await;
    let partition: String =
        sqlx::query_scalar("SELECT tableoid::regclass::text FROM deliveries WHERE id = $1")
            .bind(&id)
            .fetch_one(&app.pool)
            .await
            .expect("partition");
    sqlx::raw_sql(&format!(
        "ALTER TABLE {partition} SET (autovacuum_enabled = off); ANALYZE {partition};"
    ))
    .execute(&app.pool)
    .await
    .expect("analyze");
    // The backlog: copies of the Delivery, in the same day partition (the same millisecond
    // of the id's time), written after the statistics.
    sqlx::query(
        "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id)
         SELECT left($1, 14) || lpad(g::text, 16, '0'), project_id, event_id, endpoint_id,
                subscription_id
         FROM deliveries, generate_series(1, 20000) AS g WHERE id = $1",
    )
    .bind(&id)
    .execute(&app.pool)
    .await
    .expect("backlog");
    // A connection planned as the worker's are: one generic plan per statement.
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan; SET jit = off")
        .execute(&mut conn)
        .await
        .expect("plans");
    // The Claims in one transaction, whose own counters (`pg_stat_xact_user_tables`) say
    // how many rows of the partition its index and sequential scans read.
    let mut tx = sqlx::Connection::begin(&mut conn).await.expect("begin");
    let claims = claim::claim_batch(&mut *tx, std::slice::from_ref(&id), Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claims.won.len(), 1, "the Claim took its row");
    // Two more calls on the same connection: the plan is the cached generic one by then.
    for _ in 0..2 {
        let again =
            claim::claim_batch(&mut *tx, std::slice::from_ref(&id), Duration::from_secs(60))
                .await
                .expect("claim");
        assert!(again.won.is_empty(), "a repeated hint claims nothing");
    }
    let (read,): (i64,) = sqlx::query_as(
        "SELECT (coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::int8
         FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
    )
    .bind(&partition)
    .fetch_one(&mut *tx)
    .await
    .expect("transaction's scans");
    tx.rollback().await.expect("rollback");
    println!("rows of the partition read by 3 Claims: {read}");
    assert!(
        read < 100,
        "3 Claims read {read} rows of a partition holding a backlog of 20,000"
    );
}
