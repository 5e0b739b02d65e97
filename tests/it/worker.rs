//! The worker end to end: ingest → Outbox → Slot → relay → Kafka → worker → a real HTTP
//! receiver on loopback, plus the Claim and the Fence against real Postgres.

use std::time::{Duration, Instant};

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use railhook_common::signing::SigningKey;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Runs an independent verifier (`program script key`) on one received request, handed to
/// it on stdin as `{"headers", "body"}`; true when it exits 0.
fn verifies(
    program: &str,
    script: &str,
    key: &str,
    r: &crate::support::receiver::Received,
) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new(program)
        .arg(format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR")))
        .arg(key)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect(program);
    let input = json!({"headers": r.headers, "body": r.body}).to_string();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    child.wait().expect("wait").success()
}

/// Verifies a received request with the official Standard Webhooks library (Python).
fn python_verifies(secret: &str, r: &crate::support::receiver::Received) -> bool {
    verifies("python3", "verify_signature.py", secret, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_arrives_once_signed_with_standard_webhooks_headers() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(204)).await;
    let (endpoint, secret) = p.endpoint(&receiver.url, 5_000).await;
    let started = Instant::now();
    let (event, delivery) = p.send(json!({"order": 42})).await;
    let d = p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let latency = receiver.requests()[0].at - started;
    println!("POST /v1/events → receiver: {} ms", latency.as_millis());

    assert_eq!(receiver.count(), 1);
    let r = &receiver.requests()[0];
    assert_eq!(r.headers["webhook-id"], delivery);
    assert_eq!(r.headers["x-event-id"], event);
    assert_eq!(r.headers["x-event-type"], "order.paid");
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(r.headers["user-agent"].starts_with("Railhook/"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.body).expect("json"),
        json!({"order": 42})
    );
    let ts: i64 = r.headers["webhook-timestamp"].parse().expect("timestamp");
    let key = SigningKey::parse(&secret).expect("secret");
    assert_eq!(
        r.headers["webhook-signature"],
        key.sign(&delivery, ts, r.body.as_bytes())
    );
    assert!(
        python_verifies(&secret, r),
        "the official library rejected the signature"
    );
    assert_eq!(d["attempt_count"], json!(1));
    assert_eq!(d["attempts"][0]["status_code"], json!(204));
    assert_eq!(d["attempts"][0]["outcome"], json!("SUCCEEDED"));
    assert_eq!(d["endpoint_id"], json!(endpoint));
    // Delivery latency runs from the Event's commit to the 2xx, observed once the SUCCEEDED
    // row is written (so a moment after `wait_status` may have seen it): it cannot exceed
    // the time from before the POST to when the observation is seen here. (A bound of the
    // receiver's timestamp plus 50 ms failed on a loaded machine, where writing the outcome
    // alone took longer.)
    let h = &p.worker_metrics.delivery_latency;
    crate::support::eventually("the delivery latency observed", WAIT, || async {
        (h.get_sample_count() > 0).then_some(())
    })
    .await;
    let bound = started.elapsed().as_secs_f64();
    assert_eq!(h.get_sample_count(), 1);
    assert!(
        h.get_sample_sum() > 0.0 && h.get_sample_sum() <= bound,
        "{} s against {bound} s",
        h.get_sample_sum()
    );
    // The SLO series: one Attempt timed as a receiver's success, one Delivery final.
    let m = &p.worker_metrics;
    assert_eq!(attempt_results(m, "success"), 1);
    assert_eq!(attempt_results(m, "http_5xx"), 0);
    assert_eq!(
        m.deliveries_final.with_label_values(&["succeeded"]).get(),
        1
    );
    p.stop().await;
}

/// Attempts timed under `result` in `railhook_worker_attempt_duration_seconds`.
fn attempt_results(m: &railhook_worker::WorkerMetrics, result: &str) -> u64 {
    m.attempt_duration
        .with_label_values(&[result])
        .get_sample_count()
}

/// Verifies a received request's v1a signature with Node's crypto (tests/verify_v1a.mjs).
fn node_verifies_v1a(public_key: &str, r: &crate::support::receiver::Received) -> bool {
    verifies("node", "verify_v1a.mjs", public_key, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ed25519_endpoint_signs_v1a_that_its_public_key_verifies_through_a_rotation() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(204)).await;
    let created = p
        .app
        .call(
            reqwest::Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": receiver.url, "timeout_ms": 5_000, "signing": "ed25519"})),
        )
        .await;
    assert_eq!(
        created.status,
        reqwest::StatusCode::CREATED,
        "{:?}",
        created.body
    );
    assert_eq!(created.body["signing"], json!("ed25519"));
    assert!(
        created.body["secret"]
            .as_str()
            .expect("secret")
            .starts_with("whsk_")
    );
    let endpoint = created.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &endpoint, &["*"], false).await;
    let read = |path: String| {
        let app = &p.app;
        let key = &p.key;
        async move { app.call(reqwest::Method::GET, &path, Some(key), None).await }
    };
    let first_public = read(format!("/v1/endpoints/{endpoint}")).await.body["public_key"]
        .as_str()
        .expect("public key")
        .to_owned();
    assert!(first_public.starts_with("whpk_"));
    assert_eq!(created.body["public_key"], json!(first_public));

    let (_, delivery) = p.send(json!({"order": 1})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let got = receiver.requests()[0].clone();
    assert!(got.headers["webhook-signature"].starts_with("v1a,"));
    assert!(
        node_verifies_v1a(&first_public, &got),
        "Node's crypto rejected the v1a signature"
    );
    // Another key's public half does not verify it (the check can fail).
    let other = railhook_common::signing::SigningKey::parse(
        &railhook_common::keygen::generate_ed25519_secret(),
    )
    .expect("other")
    .public_key()
    .expect("public");
    assert!(!node_verifies_v1a(&other, &got));

    // A rotation keeps the scheme; during the overlap both keys sign.
    let rotated = p
        .app
        .call(
            reqwest::Method::POST,
            &format!("/v1/endpoints/{endpoint}/secret/rotate"),
            Some(&p.key),
            None,
        )
        .await;
    assert!(
        rotated.body["key"]
            .as_str()
            .expect("key")
            .starts_with("whsk_")
    );
    let second_public = read(format!("/v1/endpoints/{endpoint}")).await.body["public_key"]
        .as_str()
        .expect("public key")
        .to_owned();
    assert_ne!(second_public, first_public);
    let (_, delivery) = p.send(json!({"order": 2})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let got = receiver.requests()[1].clone();
    let entries: Vec<&str> = got.headers["webhook-signature"].split(' ').collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert!(entries.iter().all(|e| e.starts_with("v1a,")));
    assert!(node_verifies_v1a(&first_public, &got));
    assert!(node_verifies_v1a(&second_public, &got));
    // An unknown scheme is refused, naming the field.
    let bad = p
        .app
        .call(
            reqwest::Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": receiver.url, "signing": "rsa"})),
        )
        .await;
    assert_eq!(bad.status, reqwest::StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.body["field"], json!("signing"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_answers_climb_the_ladder_with_the_same_webhook_id() {
    let p = Pipeline::start(|_| {}).await;
    let script = vec![
        Behaviour::Status(500),
        Behaviour::RetryAfter(429, 0),
        Behaviour::Status(503),
    ];
    let receiver = Receiver::start(script, Behaviour::Status(200)).await;
    let (_, secret) = p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({"n": 1})).await;
    let d = p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 4);
    assert!(requests.iter().all(|r| r.headers["webhook-id"] == delivery));
    assert!(requests.iter().all(|r| python_verifies(&secret, r)));
    assert_eq!(d["attempt_count"], json!(4));
    let codes: Vec<_> = d["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["status_code"].clone())
        .collect();
    assert_eq!(codes, vec![json!(500), json!(429), json!(503), json!(200)]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_ladder_ends_in_failed_messages_after_seven_attempts() {
    // Seven failures in a row would open the circuit breaker (default: five) and defer the
    // rest of the ladder for its cooldown; this test is about the ladder, tests/it/deferrals.rs
    // about the breaker.
    let p = Pipeline::start(|s| {
        s.retry_outgoing_delays = "0.1,0.1,0.1,0.1,0.1,0.1".into();
        s.breaker_consecutive_failures = 1000;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Status(502)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    let d = p.wait_status(&delivery, "FAILED", WAIT).await;
    assert_eq!(receiver.count(), 7);
    assert_eq!(d["attempt_count"], json!(7));
    assert_eq!(attempt_results(&p.worker_metrics, "http_5xx"), 7);
    assert_eq!(
        p.worker_metrics
            .deliveries_final
            .with_label_values(&["failed"])
            .get(),
        1
    );
    assert!(
        d["failure_reason"]
            .as_str()
            .expect("reason")
            .contains("7 attempts")
    );
    // An eighth Attempt would follow the 0.2 s rung and the 100 ms scheduler within 1 s.
    const AFTER_FAILED: Duration = Duration::from_secs(1);
    crate::support::holds_for("no Attempt after FAILED", AFTER_FAILED, || async {
        match receiver.count() {
            7 => Ok(()),
            n => Err(format!("{n} requests")),
        }
    })
    .await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_fail_at_once_and_410_disables_the_endpoint() {
    let p = Pipeline::start(|_| {}).await;
    let bad_request = Receiver::start(vec![], Behaviour::Status(400)).await;
    let gone = Receiver::start(vec![], Behaviour::Status(410)).await;
    let (_, _) = p.endpoint(&bad_request.url, 5_000).await;
    let r = p.app.post_event(&p.key, "a.b", json!({}), None).await;
    let first = r.body["deliveries"][0]["id"]
        .as_str()
        .expect("d")
        .to_owned();
    let d = p.wait_status(&first, "FAILED", WAIT).await;
    assert_eq!(d["attempt_count"], json!(1));
    assert!(
        d["failure_reason"]
            .as_str()
            .expect("reason")
            .contains("400")
    );

    let (gone_id, _) = p.endpoint(&gone.url, 5_000).await;
    let to_gone = p.send_to("a.c", &gone_id).await;
    p.wait_status(&to_gone, "FAILED", WAIT).await;
    let ep = p
        .app
        .call(
            reqwest::Method::GET,
            &format!("/v1/endpoints/{gone_id}"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(ep.body["enabled"], json!(false));
    // Every 4xx a receiver sent is timed under http_4xx (the "a.c" Delivery to the first
    // endpoint may still be finishing).
    crate::support::eventually("each 4xx in the histogram", WAIT, || async {
        (attempt_results(&p.worker_metrics, "http_4xx")
            == (bad_request.count() + gone.count()) as u64)
            .then_some(())
    })
    .await;
    assert_eq!(attempt_results(&p.worker_metrics, "success"), 0);
    assert!(
        ep.body["disabled_reason"]
            .as_str()
            .expect("reason")
            .contains("410")
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_status_line_is_delivery_even_when_the_body_never_comes() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(
        vec![Behaviour::StallAfterStatus(200)],
        Behaviour::Status(500),
    )
    .await;
    p.endpoint(&receiver.url, 2_000).await;
    let (_, delivery) = p.send(json!({})).await;
    let d = p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    // A retry would follow the 0.2 s rung and the 100 ms scheduler within 1 s.
    const NO_RETRY: Duration = Duration::from_secs(1);
    crate::support::holds_for("a stalled body is not retried", NO_RETRY, || async {
        match receiver.count() {
            1 => Ok(()),
            n => Err(format!("{n} requests")),
        }
    })
    .await;
    assert_eq!(d["attempts"][0]["response_excerpt"], json!("partial"));
    // A body that trickles in: delivered on the status line; the excerpt waits at most ~1 s.
    let slow = Receiver::start(vec![Behaviour::SlowBody(200)], Behaviour::Status(500)).await;
    let (slow_ep, _) = p.endpoint(&slow.url, 2_000).await;
    let to_slow = p.send_to("b.c", &slow_ep).await;
    let d = p.wait_status(&to_slow, "SUCCEEDED", WAIT).await;
    assert_eq!(slow.count(), 1);
    assert!(d["attempts"][0]["duration_ms"].as_i64().expect("ms") < 1_000);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_resets_are_retried() {
    let p = Pipeline::start(|_| {}).await;
    let script = vec![
        Behaviour::Delay(Duration::from_secs(3), 200),
        Behaviour::Reset,
    ];
    let receiver = Receiver::start(script, Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 1_000).await;
    let (_, delivery) = p.send(json!({})).await;
    let d = p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let classes: Vec<_> = d["attempts"]
        .as_array()
        .expect("a")
        .iter()
        .map(|a| a["error_class"].clone())
        .collect();
    assert_eq!(classes[0], json!("timeout"));
    assert!(
        classes[1] == json!("reset") || classes[1] == json!("request"),
        "{classes:?}"
    );
    assert_eq!(classes[2], serde_json::Value::Null);
    // The receiver's failures are told apart in the Attempt histogram by their cause.
    let m = &p.worker_metrics;
    assert_eq!(attempt_results(m, "timeout"), 1);
    assert_eq!(
        attempt_results(m, "reset") + attempt_results(m, "request"),
        1
    );
    assert_eq!(attempt_results(m, "success"), 1);
    assert!(
        m.attempt_duration
            .with_label_values(&["timeout"])
            .get_sample_sum()
            >= 0.9,
        "a timed-out Attempt is timed to its 1 s timeout"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_allowlist_loopback_targets_are_refused_and_nothing_is_sent() {
    let p = Pipeline::start(|s| s.allow_private_targets = String::new()).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    // The same loopback receiver spelled every way a URL can spell it: by name, and as
    // decimal, hex, short and IPv6-mapped literals (the url crate normalises the numeric
    // forms; the guard judges the address itself, at send time, for names after DNS).
    for host in [
        "127.0.0.1",
        "localhost",
        "2130706433",
        "0x7f000001",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::1]",
    ] {
        p.endpoint(&receiver.url.replace("127.0.0.1", host), 5_000)
            .await;
    }
    let r = p.app.post_event(&p.key, "a.b", json!({}), None).await;
    assert_eq!(r.body["deliveries"].as_array().expect("d").len(), 7);
    for d in r.body["deliveries"].as_array().expect("d") {
        let d = p
            .wait_status(d["id"].as_str().expect("id"), "FAILED", WAIT)
            .await;
        assert!(
            d["failure_reason"]
                .as_str()
                .expect("reason")
                .contains("not allowed"),
            "{d}"
        );
    }
    assert_eq!(receiver.count(), 0);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_retried_by_hand_goes_out_again_with_a_fresh_ladder() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![Behaviour::Status(400)], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    p.wait_status(&delivery, "FAILED", WAIT).await;
    let path = format!("/v1/deliveries/{delivery}/retry");
    let r = p
        .app
        .call(reqwest::Method::POST, &path, Some(&p.key), None)
        .await;
    assert_eq!(r.status, reqwest::StatusCode::ACCEPTED, "{:?}", r.body);
    // No longer FAILED; a worker may already have claimed it (or more) by the time the
    // answer reads it back (seen in CI: PROCESSING).
    assert_ne!(r.body["status"], json!("FAILED"), "{:?}", r.body);
    let d = p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    assert_eq!(d["attempt_count"], json!(1), "the ladder restarts");
    assert_eq!(
        d["attempts"].as_array().expect("attempts").len(),
        2,
        "history is kept"
    );
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].headers["webhook-id"],
        requests[1].headers["webhook-id"]
    );
    let reasons: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM outbox WHERE delivery_id = $1 ORDER BY id")
            .bind(&delivery)
            .fetch_all(&p.app.pool)
            .await
            .expect("outbox");
    assert_eq!(reasons, vec!["CREATED", "MANUAL_RETRY"]);
    // Only FAILED deliveries can be retried.
    let again = p
        .app
        .call(reqwest::Method::POST, &path, Some(&p.key), None)
        .await;
    assert_eq!(again.status, reqwest::StatusCode::CONFLICT);
    assert_eq!(again.code(), "invalid_state");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_may_carry_its_own_ladder() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(500)).await;
    let body = json!({"url": receiver.url, "retry_delays_seconds": [0.1, 0.1], "max_attempts": 3});
    let r = p
        .app
        .call(
            reqwest::Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(body),
        )
        .await;
    assert_eq!(r.body["retry_delays_seconds"], json!([0.1, 0.1]));
    assert_eq!(r.body["max_attempts"], json!(3));
    let id = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &id, &["*"], false).await;
    let (_, delivery) = p.send(json!({})).await;
    let d = p.wait_status(&delivery, "FAILED", WAIT).await;
    assert_eq!(d["attempt_count"], json!(3));
    assert_eq!(receiver.count(), 3);
    let patch = |body: serde_json::Value| {
        let path = format!("/v1/endpoints/{id}");
        let (app, key) = (&p.app, &p.key);
        async move {
            app.call(reqwest::Method::PATCH, &path, Some(key), Some(body))
                .await
        }
    };
    let r = patch(json!({"max_attempts": 0})).await;
    assert_eq!(r.body["field"], json!("max_attempts"));
    let r = patch(json!({"retry_delays_seconds": null, "max_attempts": null})).await;
    assert_eq!(r.body["max_attempts"], serde_json::Value::Null);
    assert_eq!(r.body["retry_delays_seconds"], serde_json::Value::Null);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed() {
    let p = Pipeline::start(|_| {}).await;
    let inner = Receiver::start(vec![], Behaviour::Status(200)).await;
    let redirecting = Receiver::start(vec![], Behaviour::Redirect(302)).await;
    redirecting.set_location(&inner.url);
    p.endpoint(&redirecting.url, 5_000).await;
    let (_, delivery) = p.send(json!({})).await;
    let d = p.wait_status(&delivery, "FAILED", WAIT).await;
    assert_eq!(d["attempts"][0]["status_code"], json!(302));
    assert_eq!(inner.count(), 0, "the redirect was followed");
    p.stop().await;
}

/// How long a test watches for requests that should not come: two of the slow receiver's
/// answers, so a send still queued behind the in-flight ones would have arrived.
const QUIET_WINDOW: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_with_a_backlog_gets_each_delivery_once_and_keeps_the_group() {
    // Review #19 items 1 and 2. Two permits, a receiver that answers 2xx after 2 s, twenty
    // Deliveries: ten waves, twenty seconds of backlog. The old worker claimed all twenty at
    // once and waited for permits on the consumer's loop: Claims older than the 9 s window
    // (the least the 3 s endpoint timeout allows) were swept and sent again by the
    // retry path while their first copies still waited
    // (the same webhook-id twice), and the loop stopped polling for longer than the 10 s
    // max.poll.interval (an eviction and a rebalance).
    let p = Pipeline::start(|s| {
        s.worker_max_in_flight = 2;
        s.processing_timeout_seconds = 9;
        s.endpoint_timeout_max_ms = 3_000;
        s.worker_max_poll_interval_ms = 10_000;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_secs(2), 200)).await;
    p.endpoint(&receiver.url, 3_000).await;
    let mut deliveries = Vec::new();
    for n in 0..20 {
        deliveries.push(p.send(json!({"n": n})).await.1);
    }
    for d in &deliveries {
        p.wait_status(d, "SUCCEEDED", Duration::from_secs(180))
            .await;
    }
    // A copy still queued behind the last wave would arrive within the window.
    crate::support::holds_for(
        "no request after the last SUCCEEDED",
        QUIET_WINDOW,
        || async {
            match receiver.count() {
                20 => Ok(()),
                n => Err(format!("{n} requests for 20 deliveries")),
            }
        },
    )
    .await;
    let settled = receiver.count();
    let mut ids: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.headers["webhook-id"].clone())
        .collect();
    let received = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (received, ids.len(), settled),
        (20, 20, 20),
        "every webhook-id exactly once"
    );
    let rebalances = |kind: &str| p.worker_metrics.rebalances.with_label_values(&[kind]).get();
    assert_eq!(
        (rebalances("assign"), rebalances("revoke")),
        (1, 0),
        "the slow endpoint cost the worker its place in the group"
    );
    assert_eq!(p.worker_metrics.fence_rejections.get(), 0);
    p.stop().await;
}

/// Posts `n` Events one after another and returns each one's latency, POST to arrival.
async fn fresh_latencies(p: &Pipeline, receiver: &Receiver, n: usize) -> Vec<Duration> {
    let mut sent = Vec::new();
    for i in 0..n {
        let at = Instant::now();
        let (_, delivery) = p.send(json!({"fresh": i})).await;
        sent.push((delivery, at));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    crate::support::eventually("the fresh deliveries", Duration::from_secs(120), || async {
        let arrived = receiver.requests();
        sent.iter()
            .map(|(id, at)| {
                arrived
                    .iter()
                    .find(|r| r.headers["webhook-id"] == *id)
                    .map(|r| r.at - *at)
            })
            .collect::<Option<Vec<_>>>()
    })
    .await
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_due_retries_does_not_hold_up_fresh_deliveries() {
    // Review #19 item 2: 5,000 Deliveries fall due for a retry at once. The old worker
    // published their RetryHints one acknowledgement at a time on the consumer's loop and
    // let them take the permits fresh Deliveries needed.
    const STORM: i64 = 5_000;
    let p = Pipeline::start(|_| {}).await;
    let fresh = Receiver::start(vec![], Behaviour::Status(204)).await;
    let storm = Receiver::start(vec![], Behaviour::Status(204)).await;
    p.endpoint(&fresh.url, 5_000).await;
    // The storm's endpoint subscribes to nothing: only the rows made below go there.
    let r = p
        .app
        .call(
            reqwest::Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": storm.url, "timeout_ms": 5_000})),
        )
        .await;
    let storm_ep = r.body["id"].as_str().expect("id").to_owned();
    // The first Delivery waits for the worker to join its group; that is not the baseline.
    let (_, first) = p.send(json!({"warm": true})).await;
    p.wait_status(&first, "SUCCEEDED", WAIT).await;
    let baseline = p99(fresh_latencies(&p, &fresh, 100).await);

    // Deliveries that failed once and all fall due together, as after an endpoint outage.
    sqlx::query(
        "WITH ev AS (
             INSERT INTO events (id, project_id, event_type, payload)
             -- Ids of today, as ingest makes them: the day's partitions hold them.
             SELECT left(railhook_ulid_floor('evt_', now()), 14) || lpad(g::text, 16, '0'),
                    e.project_id, 'storm.due', '{}'
             FROM generate_series(1, $2) g, endpoints e WHERE e.id = $1
             RETURNING id, project_id)
         INSERT INTO deliveries (id, project_id, event_id, endpoint_id, attempt_count,
                                 next_retry_at, last_attempt_at)
         SELECT 'dlv_' || substr(id, 5), project_id, id, $1, 1,
                now() + interval '1 second', now()
         FROM ev",
    )
    .bind(&storm_ep)
    .bind(STORM)
    .execute(&p.app.pool)
    .await
    .expect("storm rows");
    crate::support::eventually("the storm to start", Duration::from_secs(60), || async {
        (storm.count() > 0).then_some(())
    })
    .await;
    let before = storm.count();
    let during = p99(fresh_latencies(&p, &fresh, 100).await);
    let after = storm.count();
    println!(
        "fresh p99: {} ms alone, {} ms during the storm ({} storm requests meanwhile, {before} before)",
        baseline.as_millis(),
        during.as_millis(),
        after - before
    );
    assert!(
        (after as i64) < STORM,
        "the storm ended before the fresh Events were measured; it proves nothing"
    );
    // The bug this guards against held fresh Deliveries for 9.2 s behind the storm. Without
    // it, fresh p99 during the storm was ~330 ms when first measured and 600-1,080 ms on a
    // busier 2-core host (the broker and Postgres share the cores with 5,000 retries in
    // flight; CI runs this file's tests side by side), so the bound leaves room for load
    // and still fails the bug by three times over.
    assert!(
        during <= baseline + Duration::from_secs(3),
        "fresh p99 {during:?} during the storm, {baseline:?} without"
    );
    crate::support::eventually("every storm delivery", Duration::from_secs(300), || async {
        (storm.count() as i64 >= STORM).then_some(())
    })
    .await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_drains_its_attempts_and_leaves_nothing_processing() {
    // #24 item 1: told to stop (SIGTERM in the binary) while slow Attempts run, the worker
    // lets them finish and writes their outcomes before it returns; the rest is left for the
    // next worker, and every webhook-id arrives once.
    let mut p = Pipeline::start(|s| {
        s.worker_max_in_flight = 3;
        s.worker_drain_seconds = 20;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_secs(2), 200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let mut deliveries = Vec::new();
    for n in 0..9 {
        deliveries.push(p.send(json!({"n": n})).await.1);
    }
    crate::support::eventually("three Attempts in flight", WAIT, || async {
        (receiver.count() >= 3).then_some(())
    })
    .await;
    let took = p.stop_workers().await;
    let sent = receiver.count();
    let processing: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'")
            .fetch_one(&p.app.pool)
            .await
            .expect("count");
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'SUCCEEDED'")
            .fetch_one(&p.app.pool)
            .await
            .expect("count");
    println!("drained in {took:?}: {sent} requests sent, {succeeded} written SUCCEEDED");
    assert_eq!(processing, 0, "a drained worker left Claims PROCESSING");
    assert_eq!(
        succeeded as usize, sent,
        "every request sent has its outcome written"
    );
    assert!(
        took < Duration::from_secs(20),
        "the drain waited for its timeout"
    );
    // A new worker takes the rest; nothing is sent twice.
    p.spawn_worker();
    for d in &deliveries {
        p.wait_status(d, "SUCCEEDED", Duration::from_secs(60)).await;
    }
    let mut ids: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.headers["webhook-id"].clone())
        .collect();
    let total = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!((total, ids.len()), (9, 9), "every webhook-id exactly once");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_hands_its_claims_back_at_once() {
    // The Attempts outlast the drain timeout: their Claims go back to PENDING, due now,
    // rather than after the processing sweep (6 min by default).
    let mut p = Pipeline::start(|s| {
        s.worker_max_in_flight = 2;
        s.worker_drain_seconds = 1;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_secs(4), 200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    for n in 0..2 {
        p.send(json!({"n": n})).await;
    }
    crate::support::eventually("two Attempts in flight", WAIT, || async {
        (receiver.count() >= 2).then_some(())
    })
    .await;
    let took = p.stop_workers().await;
    assert!(
        took < Duration::from_secs(4),
        "the drain outlived its timeout: {took:?}"
    );
    let (processing, due): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'PROCESSING'),
                count(*) FILTER (WHERE status = 'PENDING' AND next_retry_at <= now())
         FROM deliveries",
    )
    .fetch_one(&p.app.pool)
    .await
    .expect("counts");
    assert_eq!((processing, due), (0, 2));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_a_worker_process_drains_it_and_it_exits_cleanly() {
    // #24 item 1 with a real process: `railhook worker`, SIGTERM while slow Attempts run.
    let mut p = Pipeline::start(|s| {
        s.worker_max_in_flight = 3;
    })
    .await;
    // The in-process worker steps aside; the binary takes its place in the same group.
    p.stop_workers().await;
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_secs(2), 200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let s = &p.settings;
    // The child's log is kept until the end, and printed if it never starts delivering.
    let log = std::env::temp_dir().join(format!("rh-worker-{}.log", s.worker_group));
    let out = std::fs::File::create(&log).expect("worker log");
    let err = out.try_clone().expect("worker log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("worker")
        .env("DATABASE_URL", &p.app.database_url)
        .env("KAFKA_BROKERS", &s.kafka_brokers)
        .env("REDIS_URL", crate::support::local_setting("REDIS_URL"))
        .env("RAILHOOK_TOPIC_PREFIX", &s.topic_prefix)
        .env("RAILHOOK_WORKER_GROUP", &s.worker_group)
        .env("RAILHOOK_KAFKA_PARTITIONS", s.kafka_partitions.to_string())
        .env("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8")
        .env("RAILHOOK_WORKER_MAX_IN_FLIGHT", "3")
        .env("RAILHOOK_WORKER_DRAIN_SECONDS", "20")
        .env(
            "RAILHOOK_METRICS_ADDR",
            format!("127.0.0.1:{}", crate::support::free_port()),
        )
        .env("RUST_LOG", "info")
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("railhook worker");
    let mut deliveries = Vec::new();
    for n in 0..9 {
        deliveries.push(p.send(json!({"n": n})).await.1);
    }
    let waiting = Instant::now();
    while receiver.count() < 3 {
        if waiting.elapsed() > Duration::from_secs(60) {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            panic!(
                "timed out waiting for three Attempts in flight; the worker's log ends:\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "exit status {exit:?}");
    let sent = receiver.count();
    let (processing, succeeded): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'PROCESSING'),
                count(*) FILTER (WHERE status = 'SUCCEEDED')
         FROM deliveries",
    )
    .fetch_one(&p.app.pool)
    .await
    .expect("counts");
    println!(
        "SIGTERM: exited 0 after {:?}, {sent} sent, {succeeded} SUCCEEDED",
        started.elapsed()
    );
    assert_eq!(processing, 0, "the drained process left Claims PROCESSING");
    assert_eq!(
        succeeded as usize, sent,
        "every request sent has its outcome"
    );
    p.spawn_worker();
    for d in &deliveries {
        p.wait_status(d, "SUCCEEDED", Duration::from_secs(60)).await;
    }
    let mut ids: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.headers["webhook-id"].clone())
        .collect();
    let total = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!((total, ids.len()), (9, 9), "every webhook-id exactly once");
    p.stop().await;
    let _ = std::fs::remove_file(&log);
}

/// The worker's pools as `railhook worker` makes them (worker/src/pools.rs): the success
/// writes commit on connections that do not wait for the WAL flush, everything else on
/// connections that do; with `worker_outcome_synchronous_commit` (or an asynchronous
/// worker) one pool serves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_success_writes_commit_without_waiting_for_the_flush() {
    use railhook_worker::Pools;
    let url = crate::support::fresh_database().await;
    let redis = crate::support::local_setting("REDIS_URL");
    async fn commits(pool: &sqlx::PgPool) -> String {
        sqlx::query_scalar!(r#"SELECT current_setting('synchronous_commit') AS "s!""#)
            .fetch_one(pool)
            .await
            .expect("synchronous_commit")
    }
    let settings = crate::support::settings(&url, &redis);
    let pools = Pools::connect(&settings).expect("pools");
    assert!(pools.split());
    assert_eq!(commits(&pools.claims).await, "on");
    assert_eq!(commits(&pools.outcomes).await, "off");
    assert_eq!(
        pools.outcomes.options().get_max_connections(),
        settings.worker_outcome_writers + 1
    );

    let mut synchronous = settings.clone();
    synchronous.worker_outcome_synchronous_commit = true;
    let pools = Pools::connect(&synchronous).expect("pools");
    assert!(!pools.split());
    assert_eq!(commits(&pools.outcomes).await, "on");

    let mut asynchronous = settings.clone();
    asynchronous.worker_synchronous_commit = false;
    let pools = Pools::connect(&asynchronous).expect("pools");
    assert!(!pools.split());
    assert_eq!(commits(&pools.claims).await, "off");
}
