//! Routing (issue #42, docs/ROUTING.md): payload filters decided by the ingest statement,
//! against real Postgres over real HTTP. Transformations are in transformations.rs.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestApp, eventually, spawn_app};

const WAIT: Duration = Duration::from_secs(60);

pub(crate) async fn call(
    app: &TestApp,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> crate::support::Reply {
    app.call(method, path, Some(key), body).await
}

/// An endpoint from `body` (a dead URL unless given), subscribed to `order.*`.
pub(crate) async fn endpoint(app: &TestApp, key: &str, mut body: Value) -> String {
    if body.get("url").is_none() {
        body["url"] = json!("http://127.0.0.1:9/hook");
    }
    let r = call(app, key, Method::POST, "/v1/endpoints", Some(body)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

pub(crate) async fn subscription(
    app: &TestApp,
    key: &str,
    endpoint: &str,
    filter: Option<&str>,
) -> String {
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
pub(crate) async fn reached(app: &TestApp, event: &Value) -> BTreeSet<String> {
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

/// `POST /v1/events/batch` of `order.paid` Events with these payloads: the Events created.
pub(crate) async fn batch(
    app: &TestApp,
    key: &str,
    payloads: impl IntoIterator<Item = Value>,
) -> Vec<Value> {
    let events: Vec<Value> = payloads
        .into_iter()
        .map(|p| json!({"type": "order.paid", "payload": p}))
        .collect();
    let r = call(
        app,
        key,
        Method::POST,
        "/v1/events/batch",
        Some(json!({ "events": events })),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["data"].as_array().expect("data").clone()
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
    let created = batch(&app, &key, cases.iter().map(|(p, _)| p.clone())).await;
    for (event, (payload, want)) in created.iter().zip(&cases) {
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

/// Issue #53 finding 5: one tenant's filter `exists($.a[*] ? (@ == $.b[*]))` on 12,000-item
/// arrays ran inside the shared ingest writers for minutes, held them from every other
/// tenant (503 after 30 s) and grew a backend to 6 GB until the kernel killed it. A filter
/// whose cost is a product of two parts of the payload is now refused where it is stored
/// (ingest/src/routes/filter_cost.rs), on an endpoint and on a subscription, so what a
/// stored filter costs grows with its own Events' size only: while one project posts
/// Events of two 12,000-item arrays through a filter of its own, another project's single
/// Events keep their normal answer time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_projects_filter_cannot_cost_another_project() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (_, other) = app.project().await;
    let plain = endpoint(&app, &key, json!({})).await;
    for (filter, words) in [
        ("exists($.a[*] ? (@ == $.b[*]))", "`$` path inside a filter"),
        ("$.a[*] == $.b[*]", "compares two parts"),
        ("$.a == $.b", "compares two parts"),
        ("exists($.a[*] ? (@.x > $.min))", "`$` path inside a filter"),
        ("exists($.a[*] ? (@.x[*] == @.y[*]))", "compares two parts"),
        (r#"$.s like_regex "(a+)\\1""#, "back reference"),
    ] {
        for (method, path, body) in [
            (
                Method::POST,
                "/v1/endpoints".to_owned(),
                json!({"url": "http://127.0.0.1:9/x", "filter": filter}),
            ),
            (
                Method::PATCH,
                format!("/v1/endpoints/{plain}"),
                json!({"filter": filter}),
            ),
            (
                Method::POST,
                "/v1/subscriptions".to_owned(),
                json!({"endpoint_id": plain, "event_types": ["order.*"], "filter": filter}),
            ),
        ] {
            let r = call(&app, &key, method.clone(), &path, Some(body)).await;
            assert_eq!(
                r.status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{method} {path} {filter}: {:?}",
                r.body
            );
            let detail = r.body["detail"].as_str().unwrap_or_default();
            assert!(detail.contains(words), "{filter}: {detail}");
        }
    }
    // What is allowed costs one pass over the payload: the same question asked of one part.
    let filtered = endpoint(&app, &key, json!({"filter": "exists($.a[*] ? (@ == 7))"})).await;
    subscription(&app, &key, &filtered, None).await;
    let victim = endpoint(&app, &other, json!({"filter": "$.n >= 0"})).await;
    subscription(&app, &other, &victim, None).await;

    let alone = std::time::Instant::now();
    let r = app
        .post_event(&other, "order.paid", json!({"n": 0}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let normal = alone.elapsed();
    let big: Vec<i64> = (0..12_000).collect();
    let heavy = json!({"a": big, "b": big});
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (url, client, key) = (
                format!("{}/v1/events", app.base),
                app.client.clone(),
                key.clone(),
            );
            let body = json!({"type": "order.paid", "payload": heavy});
            tokio::spawn(async move {
                let r = client.post(url).bearer_auth(key).json(&body).send().await;
                r.expect("request").status()
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for n in 1..=5 {
        let during = std::time::Instant::now();
        let r = app
            .post_event(&other, "order.paid", json!({"n": n}), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        slowest = slowest.max(during.elapsed());
    }
    for f in flood {
        assert_eq!(f.await.expect("flood"), StatusCode::CREATED);
    }
    println!("the other project's POST: {normal:?} alone, at most {slowest:?} beside the flood");
    assert!(
        slowest < Duration::from_secs(2).max(normal * 20),
        "the other project waited {slowest:?} (alone: {normal:?})"
    );
}
