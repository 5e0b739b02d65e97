//! The event-type catalogue against real Postgres over real HTTP: its CRUD and isolation,
//! and its JSON Schemas enforced at the door — a payload that breaks one is refused with
//! 422 `schema_violation` naming the JSON Pointer, and nothing is written (no Event, no
//! Delivery, no Outbox row), for single Events and batches alike.

use crate::support::{TestApp, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn order_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["amount", "currency"],
        "properties": {
            "amount": {"type": "integer", "minimum": 0},
            "currency": {"type": "string", "enum": ["EUR", "USD"]},
            "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
        }
    })
}

async fn rows(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn the_catalogue_is_managed_per_project() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (_, other) = app.project().await;
    let r = app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&key),
            Some(json!({"name": "order.paid", "description": "An order was paid", "schema": order_schema()})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body["schema_version"], 1);
    assert_eq!(r.body["deprecated"], false);
    let again = app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&key),
            Some(json!({"name": "order.paid"})),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.code(), "already_exists");
    // Bad names and bad schemas: 422 with a stable code; nothing stored.
    for (body, code) in [
        (json!({"name": "order.*"}), "validation_failed"),
        (
            json!({"name": "a.b", "schema": {"type": "nope"}}),
            "invalid_schema",
        ),
        (json!({"name": "a.b", "schema": [1]}), "invalid_schema"),
        // A remote reference would make the API fetch a URL: refused, nothing fetched.
        (
            json!({"name": "a.b", "schema": {"$ref": "http://127.0.0.1:9/schema.json"}}),
            "invalid_schema",
        ),
        // What jsonb cannot store is a 422, not the INSERT's 500 (found by the fuzzer).
        (
            json!({"name": "a.b", "schema": {"a\u{0}b": {}}}),
            "validation_failed",
        ),
    ] {
        let r = app
            .call(
                Method::POST,
                "/v1/event-types",
                Some(&key),
                Some(body.clone()),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            r.body
        );
        assert_eq!(r.code(), code, "{body}: {:?}", r.body);
    }
    assert_eq!(rows(&app, "event_types").await, 1);
    app.call(
        Method::POST,
        "/v1/event-types",
        Some(&key),
        Some(json!({"name": "order.refunded"})),
    )
    .await;
    let list = app
        .call(Method::GET, "/v1/event-types?limit=1", Some(&key), None)
        .await;
    assert_eq!(list.body["data"][0]["name"], "order.paid");
    let cursor = list.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let next = app
        .call(
            Method::GET,
            &format!("/v1/event-types?limit=1&cursor={cursor}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(next.body["data"][0]["name"], "order.refunded");
    // Another project sees none of it.
    let theirs = app
        .call(
            Method::GET,
            "/v1/event-types/order.paid",
            Some(&other),
            None,
        )
        .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    let theirs = app
        .call(Method::GET, "/v1/event-types", Some(&other), None)
        .await;
    assert_eq!(theirs.body["data"], json!([]));
    // Update: the description alone keeps the version; a schema change bumps it.
    let r = app
        .call(
            Method::PATCH,
            "/v1/event-types/order.paid",
            Some(&key),
            Some(json!({"description": "Paid"})),
        )
        .await;
    assert_eq!(
        (
            r.body["description"].clone(),
            r.body["schema_version"].clone()
        ),
        (json!("Paid"), json!(1))
    );
    let r = app
        .call(
            Method::PATCH,
            "/v1/event-types/order.paid",
            Some(&key),
            Some(json!({"schema": {"type": "object"}})),
        )
        .await;
    assert_eq!(r.body["schema_version"], 2);
    let r = app
        .call(
            Method::POST,
            "/v1/event-types/order.paid/deprecate",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["deprecated"], true);
    let listed = app
        .call(
            Method::GET,
            "/v1/event-types?include_deprecated=false",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(listed.body["data"].as_array().map(Vec::len), Some(1));
    let r = app
        .call(
            Method::DELETE,
            "/v1/event-types/order.paid",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app
        .call(Method::GET, "/v1/event-types/order.paid", Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.content_type, "application/problem+json");
    // The OpenAPI document lists the catalogue.
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    assert!(doc.body["paths"]["/v1/event-types/{name}/deprecate"]["post"].is_object());
}

#[tokio::test]
async fn a_payload_that_breaks_its_schema_is_refused_and_nothing_is_written() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let r = app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&key),
            Some(json!({"name": "order.paid", "schema": order_schema()})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);

    let bad = app
        .post_event(
            &key,
            "order.paid",
            json!({"amount": -5, "currency": "EUR"}),
            Some("k-bad"),
        )
        .await;
    assert_eq!(
        bad.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        bad.body
    );
    assert_eq!(bad.code(), "schema_violation");
    assert_eq!(bad.body["pointer"], "/amount");
    assert_eq!(bad.body["field"], "payload");
    let detail = bad.body["detail"].as_str().expect("detail");
    assert!(
        detail.contains("/amount") && detail.contains("minimum"),
        "{detail}"
    );
    assert!(
        !detail.contains("-5"),
        "the payload's values are not quoted: {detail}"
    );
    let nested = app
        .post_event(
            &key,
            "order.paid",
            json!({"amount": 5, "currency": "EUR", "items": [{"sku": "a"}, {"name": "b"}]}),
            None,
        )
        .await;
    assert_eq!(nested.body["pointer"], "/items/1", "{:?}", nested.body);
    let missing = app
        .post_event(&key, "order.paid", json!({"amount": 5}), None)
        .await;
    assert_eq!(missing.code(), "schema_violation");
    for table in ["events", "deliveries", "outbox"] {
        assert_eq!(rows(&app, table).await, 0, "{table}");
    }

    // A good payload, and a type without a schema, are accepted as before.
    let good = app
        .post_event(
            &key,
            "order.paid",
            json!({"amount": 5, "currency": "EUR"}),
            Some("k-bad"),
        )
        .await;
    assert_eq!(good.status, StatusCode::CREATED, "{:?}", good.body);
    let free = app
        .post_event(&key, "order.shipped", json!({"anything": true}), None)
        .await;
    assert_eq!(free.status, StatusCode::CREATED);

    // A batch with one bad item writes nothing at all, and names the item.
    let before = rows(&app, "events").await;
    let batch = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": [
                {"type": "order.paid", "payload": {"amount": 1, "currency": "USD"}},
                {"type": "order.paid", "payload": {"amount": 2, "currency": "GBP"}},
            ]})),
        )
        .await;
    assert_eq!(
        batch.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        batch.body
    );
    assert_eq!(batch.body["field"], "events[1].payload");
    assert_eq!(batch.body["pointer"], "/currency");
    assert_eq!(rows(&app, "events").await, before);

    // A schema change applies to the next request on this replica; removing it frees the type.
    let r = app
        .call(
            Method::PATCH,
            "/v1/event-types/order.paid",
            Some(&key),
            Some(json!({"schema": {"type": "object", "required": ["id"]}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = app
        .post_event(
            &key,
            "order.paid",
            json!({"amount": 5, "currency": "EUR"}),
            None,
        )
        .await;
    assert_eq!(r.code(), "schema_violation");
    assert_eq!(r.body["pointer"], "");
    let r = app
        .call(
            Method::PATCH,
            "/v1/event-types/order.paid",
            Some(&key),
            Some(json!({"schema": null})),
        )
        .await;
    assert_eq!(r.body["schema"], Value::Null);
    let r = app
        .post_event(&key, "order.paid", json!({"amount": "any"}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
}

/// Review #34 item 2: a tenant's schema is a program the API runs on every Event of its
/// type, so its cost is bounded. Patterns that need a backtracking engine (look-around,
/// back-references: the ones that could pin a thread for a million steps per match) are
/// refused when stored, as is a schema with more than 64 patterns; what is stored runs on
/// a linear-time engine, off the runtime's threads, under a deadline. A flood of large
/// payloads against one tenant's pattern-heavy schema leaves another tenant's POST
/// answering in its normal time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_schema_cannot_hold_the_api_for_another() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (_, other) = app.project().await;
    let store = |name: &'static str, schema: Value| {
        let (app, key) = (&app, key.clone());
        async move {
            app.call(
                Method::POST,
                "/v1/event-types",
                Some(&key),
                Some(json!({"name": name, "schema": schema})),
            )
            .await
        }
    };
    let string_with = |pattern: &str| json!({"type": "string", "pattern": pattern});
    for (name, pattern) in [
        ("evil.lookahead", "^(?=a)(a+)+$"),
        ("evil.backref", "^(a+)\\1$"),
    ] {
        let r = store(
            name,
            json!({"type": "object", "properties": {"s": string_with(pattern)}}),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name}: {:?}",
            r.body
        );
        assert_eq!(r.code(), "invalid_schema", "{name}");
    }
    let many: serde_json::Map<String, Value> = (0..65)
        .map(|i| (format!("p{i}"), string_with("^a+$")))
        .collect();
    let r = store("evil.many", json!({"type": "object", "properties": many})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.code(), "invalid_schema");

    // The most a schema may hold: 64 patterns, here as `patternProperties`, so a payload of
    // 40,000 keys costs 2.5 million matches: heavy enough that 16 such requests hold every
    // slot of the blocking pool they may have (issue #53: the first version of this test
    // was too light to hold a slot, and its victim had no schema, so it never waited).
    let heavy: serde_json::Map<String, Value> = (0..64)
        .map(|i| (format!("^k{i}(a+)+[0-9]*$"), json!({"type": "integer"})))
        .collect();
    let r = store(
        "heavy.thing",
        json!({"type": "object", "patternProperties": heavy}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let payload: serde_json::Map<String, Value> =
        (0..40_000).map(|i| (format!("k{i}"), json!(i))).collect();
    let body = json!({"type": "heavy.thing", "payload": payload});
    // The victim has a schema of its own, so its Events wait for a validation slot too.
    let r = app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&other),
            Some(json!({"name": "order.paid", "schema":
                {"type": "object", "properties": {"n": {"type": "integer"}}}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);

    let baseline = std::time::Instant::now();
    let r = app
        .post_event(&other, "order.paid", json!({"n": 0}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let normal = baseline.elapsed();

    let one = std::time::Instant::now();
    let r = app
        .call(Method::POST, "/v1/events", Some(&key), Some(body.clone()))
        .await;
    println!("one heavy validation: {:?} ({})", one.elapsed(), r.code());

    let flood: Vec<_> = (0..16)
        .map(|_| {
            let (url, client, key, body) = (
                format!("{}/v1/events", app.base),
                app.client.clone(),
                key.clone(),
                body.clone(),
            );
            tokio::spawn(async move {
                let r = client.post(url).bearer_auth(key).json(&body).send().await;
                let r = r.expect("request");
                let status = r.status();
                (status, r.json::<Value>().await.expect("problem"))
            })
        })
        .collect();
    // Once the flood holds its slots, the victim posts five Events, each with its schema.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut slowest = std::time::Duration::ZERO;
    for n in 1..=5 {
        let during = std::time::Instant::now();
        let r = app
            .post_event(&other, "order.paid", json!({"n": n}), None)
            .await;
        slowest = slowest.max(during.elapsed());
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    println!("another tenant's POST: {normal:?} alone, at most {slowest:?} during the flood");
    assert!(
        slowest < std::time::Duration::from_secs(2).max(normal * 20),
        "another tenant waited {slowest:?} (alone: {normal:?})"
    );
    for f in flood {
        let (status, problem) = f.await.expect("flood");
        assert!(
            ["schema_violation", "schema_too_slow", "timeout"]
                .contains(&problem["code"].as_str().unwrap_or("")),
            "{status}: {problem}"
        );
    }
    assert_eq!(
        rows(&app, "events").await,
        6,
        "only the other tenant's Events"
    );
}
