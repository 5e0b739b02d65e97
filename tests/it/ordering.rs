//! The Ordering Buffer, end to end (real Postgres, relay, broker, worker, HTTP receiver):
//! ordered Deliveries arrive in Sequence Number order through injected retries; a poisoned
//! Event holds its successors only until the gap timeout; unordered subscriptions on the
//! same endpoint are never held.

use std::time::{Duration, Instant};

use crate::support::eventually;
use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Received, Receiver};
use reqwest::Method;
use serde_json::{Value, json};

/// An endpoint at `url` with a short retry ladder and many Attempts (so a poisoned Event
/// keeps retrying for the whole test); returns its id.
async fn endpoint(p: &Pipeline, url: &str) -> String {
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": url, "timeout_ms": 5000,
                        "retry_delays_seconds": [0.3], "max_attempts": 50})),
        )
        .await;
    assert_eq!(r.status, reqwest::StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

/// Posts `n` events of `event_type` (payload `{"i": from..}`) in batches of 250; a batch
/// is numbered in its own order.
async fn post_many(p: &Pipeline, event_type: &str, from: usize, n: usize) {
    let mut i = from;
    while i < from + n {
        let upto = (i + 250).min(from + n);
        let events: Vec<Value> = (i..upto)
            .map(|k| json!({"type": event_type, "payload": {"i": k}}))
            .collect();
        let r = p
            .app
            .call(
                Method::POST,
                "/v1/events/batch",
                Some(&p.key),
                Some(json!({ "events": events })),
            )
            .await;
        assert_eq!(r.status, reqwest::StatusCode::CREATED, "{:?}", r.body);
        i = upto;
    }
}

async fn count_status(p: &Pipeline, endpoint: &str, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND status = $2")
        .bind(endpoint)
        .bind(status)
        .fetch_one(&p.app.pool)
        .await
        .expect("count")
}

fn sequence(r: &Received) -> i64 {
    r.headers
        .get("x-sequence-number")
        .expect("ordered deliveries carry X-Sequence-Number")
        .parse()
        .expect("a number")
}

fn accepted(rx: &Receiver) -> Vec<Received> {
    rx.requests()
        .into_iter()
        .filter(|r| r.answered.is_some_and(|s| (200..300).contains(&s)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_ordered_events_arrive_in_order_through_retries() {
    let p = Pipeline::start(|s| s.ordering_gap_timeout_seconds = 120).await;
    // Every 97th request fails: the Delivery it carried goes through the retry path while
    // everything numbered after it waits in the buffer.
    let script: Vec<Behaviour> = (1..=2000)
        .map(|k| {
            if k % 97 == 0 {
                Behaviour::Status(500)
            } else {
                Behaviour::Status(200)
            }
        })
        .collect();
    let rx = Receiver::start(script, Behaviour::Status(200)).await;
    let ep = endpoint(&p, &rx.url).await;
    p.app.subscribe(&p.key, &ep, &["order.*"], true).await;

    const N: usize = 1000;
    let started = Instant::now();
    post_many(&p, "order.paid", 0, N).await;
    eventually(
        "all ordered deliveries succeeded",
        Duration::from_secs(240),
        || async { (count_status(&p, &ep, "SUCCEEDED").await == N as i64).then_some(()) },
    )
    .await;
    let took = started.elapsed();

    let ok = accepted(&rx);
    let seqs: Vec<i64> = ok.iter().map(sequence).collect();
    assert_eq!(seqs.len(), N, "each Delivery accepted exactly once");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "accepted out of order: {:?}",
        seqs.windows(2).find(|w| w[0] >= w[1])
    );
    assert_eq!(seqs.first(), Some(&1));
    assert_eq!(seqs.last(), Some(&(N as i64)));
    // The payload order is the numbering order (a batch is numbered in its own order).
    let payload_order: Vec<u64> = ok
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(&r.body).expect("json")["i"]
                .as_u64()
                .expect("i")
        })
        .collect();
    assert!(payload_order.windows(2).all(|w| w[0] < w[1]));
    let failed_first = rx.count() - N;
    assert!(failed_first >= 9, "retries were injected: {failed_first}");
    assert_eq!(p.worker_metrics.ordering_gap_timeouts.get(), 0);
    assert!(p.worker_metrics.ordering_released.get() > 0);
    // Most links of the line are handed off by the worker that resolved the one before,
    // without the trip through the relay and Kafka (review #19 item 13).
    let handoffs = p.worker_metrics.ordering_handoffs.get();
    assert!(
        handoffs * 2 > p.worker_metrics.ordering_released.get(),
        "{handoffs} hand-offs"
    );
    // librdkafka's statistics (every 5 s) reached the consumer-lag gauge during the run.
    let lag_series = p
        .worker_metrics
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == railhook_worker::metrics::CONSUMER_LAG)
        .map(|f| f.get_metric().len())
        .sum::<usize>();
    assert!(lag_series > 0, "consumer lag per partition is reported");
    eprintln!(
        "ordering: {N} events in order in {:.1} s, {failed_first} injected failures, {} parks, {} releases, {handoffs} hand-offs",
        took.as_secs_f64(),
        p.worker_metrics
            .deferrals
            .with_label_values(&["ordering"])
            .get(),
        p.worker_metrics.ordering_released.get()
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poisoned_event_holds_the_line_only_until_the_gap_timeout() {
    let gap = 3;
    // The poisoned Event fails every few hundred ms with nothing succeeding in between: with
    // the default threshold the breaker would open and defer the whole endpoint, which is
    // the breaker's test, not this one.
    let p = Pipeline::start(|s| {
        s.ordering_gap_timeout_seconds = gap;
        s.breaker_consecutive_failures = 1000;
    })
    .await;
    let rx = Receiver::start(vec![], Behaviour::Status(200)).await;
    rx.set_poison("\"poison\"");
    let ep = endpoint(&p, &rx.url).await;
    p.app.subscribe(&p.key, &ep, &["order.*"], true).await;

    let first = p
        .app
        .post_event(&p.key, "order.paid", json!({"poison": true}), None)
        .await;
    let poisoned = first.body["deliveries"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let sent = Instant::now();
    post_many(&p, "order.paid", 1, 5).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while accepted(&rx).len() < 5 {
        if Instant::now() > deadline {
            let rows: Vec<(Option<i64>, String, i32, i32, bool, bool)> = sqlx::query_as(
                "SELECT sequence_number, status, attempt_count, deferral_count,
                        parked_at IS NOT NULL, ordering_skipped_at IS NOT NULL
                 FROM deliveries WHERE endpoint_id = $1 ORDER BY sequence_number",
            )
            .bind(&ep)
            .fetch_all(&p.app.pool)
            .await
            .expect("rows");
            panic!("the successors never went on: {rows:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ok = accepted(&rx);
    let first_ok = ok[0].at.duration_since(sent);
    assert!(
        first_ok >= Duration::from_secs(gap - 1),
        "successors waited for the gap timeout, not less: {first_ok:?}"
    );
    assert!(
        first_ok < Duration::from_secs(gap + 10),
        "successors waited about the gap timeout, not more: {first_ok:?}"
    );
    let seqs: Vec<i64> = ok.iter().map(sequence).collect();
    assert_eq!(
        seqs,
        vec![2, 3, 4, 5, 6],
        "the successors kept their own order"
    );
    assert!(p.worker_metrics.ordering_gap_timeouts.get() >= 1);
    // The poisoned one is still on its ladder, out of the line.
    let row: (String, bool, i32) = sqlx::query_as(
        "SELECT status, ordering_skipped_at IS NOT NULL, attempt_count FROM deliveries WHERE id = $1",
    )
    .bind(&poisoned)
    .fetch_one(&p.app.pool)
    .await
    .expect("row");
    // PROCESSING when the query lands while an Attempt is in flight.
    assert!(
        row.0 == "PENDING" || row.0 == "PROCESSING",
        "still retrying, not resolved: {}",
        row.0
    );
    assert!(row.1, "the stuck Delivery left the line");
    assert!(row.2 >= 2, "and kept retrying: {} attempts", row.2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unordered_subscriptions_on_the_same_endpoint_are_never_held() {
    let p = Pipeline::start(|s| {
        s.ordering_gap_timeout_seconds = 60;
        s.breaker_consecutive_failures = 1000;
    })
    .await;
    let rx = Receiver::start(vec![], Behaviour::Status(200)).await;
    rx.set_poison("\"poison\"");
    let ep = endpoint(&p, &rx.url).await;
    p.app.subscribe(&p.key, &ep, &["order.*"], true).await;
    p.app.subscribe(&p.key, &ep, &["user.*"], false).await;

    p.app
        .post_event(&p.key, "order.paid", json!({"poison": true}), None)
        .await;
    post_many(&p, "order.paid", 1, 3).await;
    let sent = Instant::now();
    post_many(&p, "user.created", 100, 5).await;
    eventually(
        "the unordered deliveries arrived",
        Duration::from_secs(20),
        || async {
            let users = accepted(&rx)
                .into_iter()
                .filter(|r| !r.headers.contains_key("x-sequence-number"))
                .count();
            (users == 5).then_some(())
        },
    )
    .await;
    assert!(
        sent.elapsed() < Duration::from_secs(20),
        "unordered deliveries did not wait for the ordered line"
    );
    // Meanwhile the ordered successors are parked behind the poisoned Event.
    assert!(
        accepted(&rx)
            .iter()
            .all(|r| !r.headers.contains_key("x-sequence-number")),
        "no ordered successor went before the gap timeout"
    );
    eventually(
        "successors wait in the buffer",
        Duration::from_secs(10),
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND parked_at IS NOT NULL",
            )
            .bind(&ep)
            .fetch_one(&p.app.pool)
            .await
            .expect("count");
            (parked >= 1).then_some(())
        },
    )
    .await;
    p.stop().await;
}

/// Review #34 item 3: while an ordered endpoint is down, its parked Deliveries wait for
/// their predecessor instead of being hinted every second. Here the breaker holds the
/// line's first Delivery (deferred, never tried) and 499 more are parked behind it past
/// their gap timeout: the hints published in ten seconds of the outage stay a handful
/// (before: every parked Delivery once a second, about 5,000), and once the endpoint is
/// back all 500 arrive, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_costs_a_parked_line_no_hints_and_the_line_arrives_in_order_after_it() {
    let p = Pipeline::start(|s| {
        s.ordering_gap_timeout_seconds = 2;
        s.breaker_consecutive_failures = 3;
        s.breaker_cooldown_seconds = 20;
    })
    .await;
    // The endpoint's port, with nothing listening yet: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let ep = endpoint(&p, &format!("http://127.0.0.1:{port}/hook")).await;
    p.app.subscribe(&p.key, &ep, &["trip.*"], false).await;
    p.app.subscribe(&p.key, &ep, &["order.*"], true).await;
    // Unordered Events open the breaker, so the ordered line's first Delivery is deferred
    // without ever being tried (a predecessor that has not failed is waited for).
    post_many(&p, "trip.x", 0, 3).await;
    eventually("the breaker opens", Duration::from_secs(60), || async {
        let state: String = sqlx::query_scalar("SELECT breaker_state FROM endpoints WHERE id = $1")
            .bind(&ep)
            .fetch_one(&p.app.pool)
            .await
            .expect("state");
        (state == "open").then_some(())
    })
    .await;
    post_many(&p, "order.paid", 0, 500).await;
    eventually(
        "499 parked behind the first",
        Duration::from_secs(120),
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND parked_at IS NOT NULL",
            )
            .bind(&ep)
            .fetch_one(&p.app.pool)
            .await
            .expect("parked");
            (parked == 499).then_some(())
        },
    )
    .await;
    // Past the gap timeout of every park, then ten seconds of outage.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hints = || p.worker_metrics.retries_published.get();
    let before = hints();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = hints() - before;
    println!("hints published in 10 s of outage with 499 parked: {during}");
    assert!(
        during < 100,
        "{during} hints in 10 s: the parked line is polled"
    );

    // The endpoint comes back on its port; after the breaker's cool-down the line goes, whole
    // and in order.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("rebind");
    listener.set_nonblocking(true).expect("nonblocking");
    let rx = Receiver::start_on(listener, vec![], Behaviour::Status(200));
    eventually(
        "all 500 ordered arrive",
        Duration::from_secs(120),
        || async { (count_status(&p, &ep, "SUCCEEDED").await == 503).then_some(()) },
    )
    .await;
    let seqs: Vec<i64> = accepted(&rx)
        .iter()
        .filter(|r| r.headers.contains_key("x-sequence-number"))
        .map(sequence)
        .collect();
    assert_eq!(seqs.len(), 500, "each ordered Delivery once");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "out of order: {:?}",
        &seqs[..seqs.len().min(20)]
    );
    p.stop().await;
}
