//! Routing and shaping (issue #42, docs/ROUTING.md): payload filters decided by the ingest
//! statement, and transformations run by the worker in their sandbox, against the real
//! pipeline (Postgres, the relay's Slot, the broker, a worker, a receiver over HTTP).
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{TestApp, eventually, spawn_app};

const WAIT: Duration = Duration::from_secs(60);

async fn call(
    app: &TestApp,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> crate::support::Reply {
    app.call(method, path, Some(key), body).await
}

/// An endpoint from `body` (a dead URL unless given), subscribed to `order.*`.
async fn endpoint(app: &TestApp, key: &str, mut body: Value) -> String {
    if body.get("url").is_none() {
        body["url"] = json!("http://127.0.0.1:9/hook");
    }
    let r = call(app, key, Method::POST, "/v1/endpoints", Some(body)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

async fn subscription(app: &TestApp, key: &str, endpoint: &str, filter: Option<&str>) -> String {
    let r = call(
        app,
        key,
        Method::POST,
        "/v1/subscriptions",
        Some(json!({"endpoint_id": endpoint, "event_types": ["order.*"], "filter": filter})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

/// The endpoints an accepted Event's answer names, checked against what is stored: the
/// same Deliveries (ids and endpoints; a filtered one's id is derived, not returned by the
/// statement) and one Outbox row each.
async fn reached(app: &TestApp, event: &Value) -> BTreeSet<String> {
    let answered: BTreeSet<(String, String)> = event["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| {
            (
                d["id"].as_str().expect("id").to_owned(),
                d["endpoint_id"].as_str().expect("endpoint").to_owned(),
            )
        })
        .collect();
    let id = event["id"].as_str().expect("id");
    let stored: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT d.id, d.endpoint_id, (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id)
         FROM deliveries d WHERE d.event_id = $1 AND d.origin = 'ingest'",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .expect("deliveries");
    let stored_pairs: BTreeSet<(String, String)> = stored
        .iter()
        .map(|(d, e, _)| (d.clone(), e.clone()))
        .collect();
    assert_eq!(answered, stored_pairs, "the answer names what was stored");
    assert!(
        stored.iter().all(|(_, _, n)| *n == 1),
        "one Outbox row per Delivery"
    );
    stored_pairs.into_iter().map(|(_, e)| e).collect()
}

fn set(items: &[&String]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_filters_are_decided_by_the_ingest_statement() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let big_eur = r#"$.amount_cents > 10000 && $.currency == "EUR""#;
    // a: the endpoint's filter; b: none; c: its subscription's; d: both kinds, two
    // subscriptions (either may let an Event through, the endpoint's must).
    let a = endpoint(&app, &key, json!({"filter": big_eur})).await;
    subscription(&app, &key, &a, None).await;
    let b = endpoint(&app, &key, json!({})).await;
    subscription(&app, &key, &b, None).await;
    let c = endpoint(&app, &key, json!({})).await;
    subscription(&app, &key, &c, Some(r#"$.status == "shipped""#)).await;
    let d = endpoint(&app, &key, json!({"filter": "$.amount_cents >= 500"})).await;
    subscription(&app, &key, &d, Some(r#"$.currency == "EUR""#)).await;
    subscription(&app, &key, &d, Some(r#"$.status == "shipped""#)).await;

    // The canonical form is what is stored and shown.
    let r = call(&app, &key, Method::GET, &format!("/v1/endpoints/{a}"), None).await;
    assert_eq!(
        r.body["filter"],
        json!(r#"($."amount_cents" > 10000 && $."currency" == "EUR")"#)
    );

    let cases = [
        (
            json!({"amount_cents": 12550, "currency": "EUR"}),
            set(&[&a, &b, &d]),
        ),
        (
            json!({"amount_cents": 900, "currency": "EUR"}),
            set(&[&b, &d]),
        ),
        (
            json!({"amount_cents": 12550, "currency": "USD"}),
            set(&[&b]),
        ),
        (
            json!({"amount_cents": 600, "status": "shipped"}),
            set(&[&b, &c, &d]),
        ),
        // Missing keys and wrong types decline, never fail the statement.
        (json!({"amount_cents": "lots"}), set(&[&b])),
        (
            json!({"amount_cents": null, "currency": ["EUR"]}),
            set(&[&b]),
        ),
    ];
    let mut ids = Vec::new();
    for (payload, want) in &cases {
        let r = app
            .post_event(&key, "order.paid", payload.clone(), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        assert_eq!(&reached(&app, &r.body).await, want, "{payload}");
        ids.push(r.body["id"].as_str().expect("id").to_owned());
    }
    // A batch takes the transaction path: the same decisions.
    let batch: Vec<Value> = cases
        .iter()
        .map(|(p, _)| json!({"type": "order.paid", "payload": p}))
        .collect();
    let r = call(
        &app,
        &key,
        Method::POST,
        "/v1/events/batch",
        Some(json!({"events": batch})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    for (event, (payload, want)) in r.body["data"].as_array().expect("data").iter().zip(&cases) {
        assert_eq!(&reached(&app, event).await, want, "batch: {payload}");
    }

    // Refusals name the field and, for a syntax error, where it is.
    for (filter, words) in [
        ("$.amount_cents >> 3", "character 17"),
        (r#"$.a == 1 && && $.b"#, "character 13"),
        ("$.status", "must be a predicate"),
        ("strict $.a > 1", "strict mode"),
        ("", "must be a SQL/JSON path predicate"),
    ] {
        let r = call(
            &app,
            &key,
            Method::POST,
            "/v1/endpoints",
            Some(json!({"url": "http://127.0.0.1:9/x", "filter": filter})),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{filter}: {:?}",
            r.body
        );
        assert_eq!(r.body["code"], json!("validation_failed"), "{:?}", r.body);
        let detail = r.body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(words), "{filter}: {detail}");
        assert!(
            !detail.contains("jsonpath input"),
            "no database text: {detail}"
        );
    }
    let long = format!("$.a == \"{}\"", "x".repeat(1_100));
    let r = call(
        &app,
        &key,
        Method::PATCH,
        &format!("/v1/endpoints/{a}"),
        Some(json!({"filter": long})),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    // Nothing was written by a refused change.
    let r = call(&app, &key, Method::GET, &format!("/v1/endpoints/{a}"), None).await;
    assert!(
        r.body["filter"]
            .as_str()
            .unwrap_or_default()
            .contains("amount_cents")
    );

    // A Replay applies the filters of today: `a` now wants USD.
    let r = call(
        &app,
        &key,
        Method::PATCH,
        &format!("/v1/endpoints/{a}"),
        Some(json!({"filter": r#"$.currency == "USD""#})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let r = call(
        &app,
        &key,
        Method::POST,
        "/v1/replays",
        Some(json!({"event_ids": ids, "endpoint_id": a})),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let replay = r.body["id"].as_str().expect("replay").to_owned();
    eventually("the replay to complete", WAIT, || {
        let (app, key, replay) = (&app, &key, &replay);
        async move {
            let r = call(
                app,
                key,
                Method::GET,
                &format!("/v1/replays/{replay}"),
                None,
            )
            .await;
            (r.body["status"] == json!("COMPLETED")).then_some(())
        }
    })
    .await;
    let replayed: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM deliveries WHERE replay_id = $1 ORDER BY event_id",
    )
    .bind(&replay)
    .fetch_all(&app.pool)
    .await
    .expect("replayed");
    assert_eq!(
        replayed,
        vec![ids[2].clone()],
        "only the USD Event passes today's filter"
    );
    let r = call(
        &app,
        &key,
        Method::GET,
        &format!("/v1/replays/{replay}"),
        None,
    )
    .await;
    assert_eq!(r.body["deliveries_created"], json!(1), "{:?}", r.body);

    // `null` removes a filter: `a` hears everything again.
    let r = call(
        &app,
        &key,
        Method::PATCH,
        &format!("/v1/endpoints/{a}"),
        Some(json!({"filter": null})),
    )
    .await;
    assert_eq!(r.body["filter"], Value::Null, "{:?}", r.body);
    let r = app
        .post_event(&key, "order.paid", json!({"n": 1}), None)
        .await;
    assert!(reached(&app, &r.body).await.contains(&a));

    // The Svix surface carries the filter too.
    let r = call(
        &app,
        &key,
        Method::POST,
        "/api/v1/app",
        Some(json!({"name": "Tenant"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let app_id = r.body["id"].as_str().expect("app").to_owned();
    let r = call(
        &app,
        &key,
        Method::POST,
        &format!("/api/v1/app/{app_id}/endpoint"),
        Some(json!({"url": "http://127.0.0.1:9/svix", "filter": "$.tier == \"gold\""})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body["filter"], json!(r#"($."tier" == "gold")"#));
    let svix_ep = r.body["id"].as_str().expect("id").to_owned();
    let r = call(
        &app,
        &key,
        Method::POST,
        &format!("/api/v1/app/{app_id}/endpoint"),
        Some(json!({"url": "http://127.0.0.1:9/svix", "filter": "$.tier"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    for (tier, want) in [("gold", 1), ("silver", 0)] {
        let r = call(
            &app,
            &key,
            Method::POST,
            &format!("/api/v1/app/{app_id}/msg"),
            Some(json!({"eventType": "order.paid", "payload": {"tier": tier}})),
        )
        .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM deliveries WHERE event_id = $1 AND endpoint_id = $2",
        )
        .bind(r.body["id"].as_str().expect("msg"))
        .bind(&svix_ep)
        .fetch_one(&app.pool)
        .await
        .expect("count");
        assert_eq!(n, want, "{tier}");
    }
    let r = call(
        &app,
        &key,
        Method::PATCH,
        &format!("/api/v1/app/{app_id}/endpoint/{svix_ep}"),
        Some(json!({"filter": null})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert!(r.body.get("filter").is_none(), "{:?}", r.body);
}

/// An ordered endpoint behind a filter: only the Deliveries written get Sequence Numbers,
/// in the order of their Events, with no gap for the declined one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_ordered_endpoint_numbers_only_what_was_written() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = endpoint(&app, &key, json!({"filter": "$.n != 2"})).await;
    app.subscribe(&key, &ep, &["order.*"], true).await;
    let r = call(
        &app,
        &key,
        Method::POST,
        "/v1/events/batch",
        Some(json!({"events": (1..=3)
            .map(|n| json!({"type": "order.paid", "payload": {"n": n}}))
            .collect::<Vec<_>>()})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let events = r.body["data"].as_array().expect("data");
    let mut numbered = Vec::new();
    for event in events {
        reached(&app, event).await;
        for d in event["deliveries"].as_array().expect("deliveries") {
            let seq: Option<i64> =
                sqlx::query_scalar("SELECT sequence_number FROM deliveries WHERE id = $1")
                    .bind(d["id"].as_str().expect("id"))
                    .fetch_one(&app.pool)
                    .await
                    .expect("sequence");
            numbered.push((event["id"].clone(), seq));
        }
    }
    let ns: Vec<Option<i64>> = numbered.iter().map(|(_, s)| *s).collect();
    assert_eq!(ns, [Some(1), Some(2)], "{numbered:?}");
}

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
