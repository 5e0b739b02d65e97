//! Shaping (issue #42, docs/ROUTING.md): transformations run by the worker in their sandbox,
//! against the real pipeline (Postgres, the relay's Slot, the broker, a worker, a receiver
//! over HTTP).
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::routing::call;
use crate::support::eventually;
use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};

const WAIT: Duration = Duration::from_secs(60);

const SLACK: &str = r##"
function handler(webhook) {
  const p = webhook.payload;
  webhook.payload = {
    text: `Order ${p.order_id} paid: ${(p.amount_cents / 100).toFixed(2)} ${p.currency}`,
    blocks: [{ type: "section", text: { type: "mrkdwn", text: `*${webhook.eventType}* by ${p.customer.name}` } }],
  };
  webhook.url = "/services/T0/B1?channel=" + encodeURIComponent("#sales");
  webhook.headers = { "X-Slack-Team": "T0" };
  webhook.cancel = p.amount_cents < 100;
  return webhook;
}
"##;

/// The Delivery's status and failure reason, once it is final.
async fn final_state(p: &Pipeline, delivery: &str) -> (String, Option<String>) {
    eventually("a final state", WAIT, || {
        let pool = p.app.pool.clone();
        let id = delivery.to_owned();
        async move {
            let (status, reason): (String, Option<String>) =
                sqlx::query_as("SELECT status, failure_reason FROM deliveries WHERE id = $1")
                    .bind(&id)
                    .fetch_one(&pool)
                    .await
                    .expect("delivery");
            matches!(status.as_str(), "SUCCEEDED" | "FAILED").then_some((status, reason))
        }
    })
    .await
}

async fn set_program(p: &Pipeline, endpoint: &str, code: &str) -> crate::support::Reply {
    call(
        &p.app,
        &p.key,
        Method::PUT,
        &format!("/v1/endpoints/{endpoint}/transformation"),
        Some(json!({"code": code})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformations_reshape_skip_and_stop_at_their_limits() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (ep, secret) = p.endpoint(&receiver.url, 10_000).await;

    // Refused when stored: it must load and declare a handler, within the limits.
    for (code, words) in [
        ("function handler(w) {", "does not compile"),
        ("const x = 1;", "no `function handler"),
        ("for (;;) {}", "time limit"),
    ] {
        let r = set_program(&p, &ep, code).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{code}: {:?}",
            r.body
        );
        assert!(
            r.body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(words),
            "{:?}",
            r.body
        );
    }
    let r = set_program(&p, &ep, SLACK).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["enabled"], json!(true));

    // An order.paid Event becomes a Slack message, on the path the program chose, signed
    // as sent, and the Attempt records what was sent.
    let order = json!({"order_id": "ord_1", "amount_cents": 12550, "currency": "EUR", "customer": {"name": "Ada"}});
    let (_, delivery) = p.send(order.clone()).await;
    assert_eq!(final_state(&p, &delivery).await.0, "SUCCEEDED");
    let got = receiver.requests().pop().expect("a request");
    assert_eq!(got.request_line, "POST /services/T0/B1?channel=%23sales");
    let body: Value = serde_json::from_str(&got.body).expect("json body");
    assert_eq!(body["text"], json!("Order ord_1 paid: 125.50 EUR"));
    assert_eq!(
        body["blocks"][0]["text"]["text"],
        json!("*order.paid* by Ada")
    );
    assert_eq!(
        got.headers.get("x-slack-team").map(String::as_str),
        Some("T0")
    );
    let key = railhook_common::signing::SigningKey::parse(&secret).expect("secret");
    let ts: i64 = got.headers["webhook-timestamp"].parse().expect("ts");
    let expected = key.sign(&delivery, ts, got.body.as_bytes());
    assert!(
        got.headers["webhook-signature"]
            .split(' ')
            .any(|s| s == expected),
        "signed as sent"
    );
    let recorded: Value = sqlx::query_scalar("SELECT request FROM attempts WHERE delivery_id = $1")
        .bind(&delivery)
        .fetch_one(&p.app.pool)
        .await
        .expect("attempt");
    assert_eq!(recorded["body"], json!(got.body));
    assert_eq!(
        recorded["url"],
        json!(format!(
            "http://127.0.0.1:{}/services/T0/B1?channel=%23sales",
            receiver.port()
        ))
    );

    // cancel: nothing sent, no Attempt, not counted as a failure.
    let before = receiver.count();
    let (_, skipped) = p.send(json!({"order_id": "ord_2", "amount_cents": 50, "currency": "EUR", "customer": {"name": "Bo"}})).await;
    assert_eq!(
        final_state(&p, &skipped).await,
        ("FAILED".into(), Some("transformation_skipped".into()))
    );
    assert_eq!(receiver.count(), before);

    // A program that loops for ever, allocates without bound or reaches for a file fails
    // its Delivery with the reason, at once (no retry), and nothing is sent.
    for (code, words) in [
        (
            "function handler(w) { while (true) {} }",
            "time limit of 100 ms",
        ),
        (
            "function handler(w) { const a = []; for (;;) a.push(new Array(1e5).fill(w)); }",
            "memory limit of 32 MiB",
        ),
        (
            "function handler(w) { w.payload = require('fs').readFileSync('/etc/passwd', 'utf8'); return w; }",
            "ReferenceError",
        ),
        (
            "function handler(w) { w.payload = std.loadFile('/etc/passwd'); return w; }",
            "ReferenceError",
        ),
        (
            "function handler(w) { w.url = 'http://169.254.169.254/latest'; return w; }",
            "not the scheme, host or port",
        ),
    ] {
        let r = set_program(&p, &ep, code).await;
        assert_eq!(r.status, StatusCode::OK, "{code}: {:?}", r.body);
        let before = receiver.count();
        let started = Instant::now();
        let (_, delivery) = p.send(order.clone()).await;
        let (status, reason) = final_state(&p, &delivery).await;
        assert_eq!(status, "FAILED", "{code}");
        let reason = reason.unwrap_or_default();
        assert!(
            reason.starts_with("transformation_failed: ") && reason.contains(words),
            "{code}: {reason}"
        );
        assert_eq!(receiver.count(), before, "{code}: nothing sent");
        let attempts: i64 =
            sqlx::query_scalar("SELECT count(*) FROM attempts WHERE delivery_id = $1")
                .bind(&delivery)
                .fetch_one(&p.app.pool)
                .await
                .expect("attempts");
        assert_eq!(attempts, 0, "{code}");
        eprintln!("{words}: failed in {:?} from POST", started.elapsed());
        let r = call(
            &p.app,
            &p.key,
            Method::GET,
            &format!("/v1/endpoints/{ep}/transformation"),
            None,
        )
        .await;
        assert_eq!(
            r.body["last_result"]["outcome"],
            json!("failed"),
            "{:?}",
            r.body
        );
        assert!(
            r.body["last_result"]["error"]
                .as_str()
                .unwrap_or_default()
                .contains(words),
            "{:?}",
            r.body
        );
    }

    // The test route runs a program on an example without sending; limits as measured.
    let before = receiver.count();
    for (code, outcome, error) in [
        (SLACK, "send", None),
        (
            "function handler(w) { for (;;) {} }",
            "failed",
            Some("time_limit"),
        ),
        (
            "function handler(w) { const a = []; for (;;) a.push('x'.repeat(1 << 16)); }",
            "failed",
            Some("memory_limit"),
        ),
    ] {
        let r = call(
            &p.app,
            &p.key,
            Method::POST,
            &format!("/v1/endpoints/{ep}/transformation/test"),
            Some(json!({"code": code, "event_type": "order.paid", "payload": order})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(r.body["outcome"], json!(outcome), "{:?}", r.body);
        assert_eq!(r.body["error"]["code"].as_str(), error, "{:?}", r.body);
        eprintln!(
            "test route: {outcome} {error:?} in {} ms",
            r.body["duration_ms"]
        );
    }
    assert_eq!(receiver.count(), before, "the test route sends nothing");

    // Svix's shape: GET and PATCH, and a disabled program does not run.
    let r = call(
        &p.app,
        &p.key,
        Method::POST,
        "/api/v1/app",
        Some(json!({"name": "Tenant"})),
    )
    .await;
    let app_id = r.body["id"].as_str().expect("app").to_owned();
    let r = call(
        &p.app,
        &p.key,
        Method::POST,
        &format!("/api/v1/app/{app_id}/endpoint"),
        Some(json!({"url": receiver.url})),
    )
    .await;
    let svix_ep = r.body["id"].as_str().expect("id").to_owned();
    let path = format!("/api/v1/app/{app_id}/endpoint/{svix_ep}/transformation");
    let r = call(
        &p.app,
        &p.key,
        Method::PATCH,
        &path,
        Some(json!({"code": SLACK, "enabled": false})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    let r = call(&p.app, &p.key, Method::GET, &path, None).await;
    assert_eq!(
        (r.body["code"].as_str(), r.body["enabled"].clone()),
        (Some(SLACK), json!(false)),
        "{:?}",
        r.body
    );
    let r = call(
        &p.app,
        &p.key,
        Method::PATCH,
        &path,
        Some(json!({"code": "function handler("})),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);

    // Turned off, the endpoint gets the Event as it was.
    let r = call(
        &p.app,
        &p.key,
        Method::PATCH,
        &format!("/v1/endpoints/{ep}"),
        Some(json!({"transformation": {"code": SLACK, "enabled": false}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["transformation"]["enabled"], json!(false));
    let (_, plain) = p.send(order.clone()).await;
    assert_eq!(final_state(&p, &plain).await.0, "SUCCEEDED");
    let got = receiver.requests().pop().expect("request");
    assert_eq!(
        serde_json::from_str::<Value>(&got.body).expect("json"),
        order
    );
    assert_eq!(got.request_line, "POST /hook");
    let r = call(
        &p.app,
        &p.key,
        Method::DELETE,
        &format!("/v1/endpoints/{ep}/transformation"),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = call(
        &p.app,
        &p.key,
        Method::GET,
        &format!("/v1/endpoints/{ep}"),
        None,
    )
    .await;
    assert_eq!(r.body["transformation"], Value::Null, "{:?}", r.body);
}
