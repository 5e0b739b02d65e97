//! The Event ingest transaction against real Postgres and Redis over real HTTP.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::{TestApp, spawn_app};
use railhook_common::ids::EventId;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn delivery_ids(body: &Value) -> Vec<String> {
    body["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect()
}

async fn outbox_rows(app: &TestApp) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT delivery_id, endpoint_id, reason FROM outbox ORDER BY delivery_id")
        .fetch_all(&app.pool)
        .await
        .expect("outbox")
}

#[tokio::test]
async fn an_event_commits_with_one_delivery_and_outbox_row_per_matching_endpoint() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let paid = app.endpoint(&key).await;
    let all = app.endpoint(&key).await;
    let refunds = app.endpoint(&key).await;
    app.subscribe(&key, &paid, &["order.paid"], false).await;
    app.subscribe(&key, &all, &["order.*"], false).await;
    // A second matching subscription on the same endpoint must not double the Delivery.
    app.subscribe(&key, &all, &["*"], false).await;
    app.subscribe(&key, &refunds, &["order.refunded"], false)
        .await;

    let r = app
        .post_event(&key, "order.paid", json!({"order": 42}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert!(r.body["id"].as_str().expect("id").starts_with("evt_"));
    let mut endpoints: Vec<&str> = r.body["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["endpoint_id"].as_str().expect("endpoint"))
        .collect();
    endpoints.sort();
    let mut expected = vec![paid.as_str(), all.as_str()];
    expected.sort();
    assert_eq!(endpoints, expected);

    assert_eq!(app.counts().await, (1, 2, 2));
    let outbox = outbox_rows(&app).await;
    let mut ids = delivery_ids(&r.body);
    ids.sort();
    assert_eq!(outbox.iter().map(|o| o.0.clone()).collect::<Vec<_>>(), ids);
    assert!(outbox.iter().all(|o| o.2 == "CREATED"));
    let stored: (String, String, Value) = sqlx::query_as(
        "SELECT project_id, status, (SELECT payload FROM events) FROM deliveries LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("delivery");
    assert_eq!(
        stored,
        (project, "PENDING".to_owned(), json!({"order": 42}))
    );

    // Only the catch-all subscription matches another type.
    let r = app.post_event(&key, "invoice.sent", json!({}), None).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["deliveries"][0]["endpoint_id"], json!(all));
    assert_eq!(app.counts().await, (2, 3, 3));

    // No subscription at all: the Event is stored and has no Deliveries.
    let (_, lonely) = app.project().await;
    let r = app
        .post_event(&lonely, "invoice.sent", json!({}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(delivery_ids(&r.body).len(), 0);
    assert_eq!(app.counts().await, (3, 3, 3));
}

#[tokio::test]
async fn a_failure_before_commit_leaves_no_event_delivery_or_outbox_row() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    for _ in 0..3 {
        let ep = app.endpoint(&key).await;
        app.subscribe(&key, &ep, &["order.*"], true).await;
    }
    app.state
        .faults
        .fail_ingest_before_commit
        .store(true, Ordering::SeqCst);
    let r = app
        .post_event(&key, "order.paid", json!({"n": 1}), Some("k-1"))
        .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.code(), "internal");
    assert_eq!(r.content_type, "application/problem+json");
    assert_eq!(app.counts().await, (0, 0, 0));
    let batch = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": [{"type": "order.paid", "payload": {}}, {"type": "order.x", "payload": {}}]})),
        )
        .await;
    assert_eq!(batch.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(app.counts().await, (0, 0, 0));

    // The same request, retried once the fault is gone, goes through whole, and the rolled
    // back attempts burned no Sequence Numbers.
    app.state
        .faults
        .fail_ingest_before_commit
        .store(false, Ordering::SeqCst);
    let r = app
        .post_event(&key, "order.paid", json!({"n": 1}), Some("k-1"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(app.counts().await, (1, 3, 3));
    let sequences: Vec<Option<i64>> = sqlx::query_scalar("SELECT sequence_number FROM deliveries")
        .fetch_all(&app.pool)
        .await
        .expect("sequences");
    assert_eq!(sequences, vec![Some(1), Some(1), Some(1)]);
}

#[tokio::test]
async fn twenty_concurrent_retries_create_one_event() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.paid"], false).await;

    let requests =
        (0..20).map(|_| app.post_event(&key, "order.paid", json!({"order": 7}), Some("order-7")));
    let replies = futures::future::join_all(requests).await;
    let created = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    let replayed = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    assert_eq!((created, replayed), (1, 19));
    let ids: HashSet<&str> = replies
        .iter()
        .map(|r| r.body["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids.len(), 1);
    // Every answer is the same body: same Event, same Deliveries.
    let first = &replies[0].body;
    assert!(replies.iter().all(|r| &r.body == first), "bodies differ");
    assert_eq!(app.counts().await, (1, 1, 1));
    assert!(
        app.metrics()
            .await
            .contains("railhook_ingest_idempotent_replays_total 19")
    );
}

/// The race the lock closes, made deterministic: a first writer of a key holds its
/// transaction open; a second writer of the same key must wait for it (not look for the
/// Event before the first commits) and then insert nothing. Both call the function
/// production calls (`group_commit::insert_rows`: 28 arguments, with the stored filter tables),
/// not an older overload (review #34 item 16).
#[tokio::test]
async fn a_second_writer_of_a_key_waits_for_the_first_and_inserts_nothing() {
    let app = spawn_app().await;
    let (project, _) = app.project().await;
    let ingest = |id: String| {
        sqlx::query_scalar::<_, String>(
            "SELECT id FROM railhook_ingest($1, ARRAY[$2], ARRAY['order.paid'], ARRAY['{}'],
                                            ARRAY['held-key'], '{}', '{}', '{}', '{}', '{}', 24,
                                            ARRAY[NULL]::text[], ARRAY[NULL]::text[],
                                            ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[],
                                            '{}', '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL, NULL, NULL, NULL)",
        )
        .bind(project.clone())
        .bind(id)
    };
    let mut first = app.pool.begin().await.expect("begin");
    let created = ingest(EventId::generate().into_string())
        .fetch_all(&mut *first)
        .await
        .expect("first writer");
    assert_eq!(created.len(), 1);
    let second = tokio::spawn({
        let pool = app.pool.clone();
        let query = ingest(EventId::generate().into_string());
        async move { query.fetch_all(&pool).await.expect("second writer") }
    });
    crate::support::holds_for(
        "the second writer waits for the first's key lock",
        Duration::from_millis(500),
        || async {
            if second.is_finished() {
                Err("it did not wait".to_owned())
            } else {
                Ok(())
            }
        },
    )
    .await;
    first.commit().await.expect("commit");
    let inserted = second.await.expect("task");
    assert_eq!(
        inserted,
        Vec::<String>::new(),
        "the key already holds an Event"
    );
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE idempotency_key = 'held-key'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(events, 1);
}

#[tokio::test]
async fn a_reused_key_with_another_request_is_a_conflict() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let first = app
        .post_event(&key, "order.paid", json!({"a": 1, "b": 2}), Some("k"))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Same JSON, other formatting and key order: the same request.
    let again = app
        .client
        .post(format!("{}/v1/events", app.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "k")
        .header("content-type", "application/json")
        .body(r#"{ "payload": {"b":2,  "a":1}, "type": "order.paid" }"#)
        .send()
        .await
        .expect("send");
    let again = TestApp::reply(again).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body, first.body);
    let other = app
        .post_event(&key, "order.paid", json!({"a": 2}), Some("k"))
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    assert_eq!(other.code(), "idempotency_key_reused");
    let other_type = app
        .post_event(&key, "order.refunded", json!({"a": 1, "b": 2}), Some("k"))
        .await;
    assert_eq!(other_type.status, StatusCode::CONFLICT);
    // Keys are per project: another project may use the same key.
    let (_, key2) = app.project().await;
    let elsewhere = app
        .post_event(&key2, "order.paid", json!({"z": 1}), Some("k"))
        .await;
    assert_eq!(elsewhere.status, StatusCode::CREATED);
    assert_eq!(app.counts().await.0, 2);
}

#[tokio::test]
async fn a_batch_is_one_transaction() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], true).await;
    let earlier = app
        .post_event(&key, "order.paid", json!({"n": 0}), Some("b-0"))
        .await;
    assert_eq!(earlier.status, StatusCode::CREATED);

    let events: Vec<Value> = (0..5)
        .map(|n| json!({"type": "order.paid", "payload": {"n": n}, "idempotency_key": format!("b-{n}")}))
        .collect();
    let r = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": events})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let data = r.body["data"].as_array().expect("data");
    assert_eq!(data.len(), 5);
    assert_eq!(data[0]["created"], json!(false));
    assert_eq!(data[0]["id"], earlier.body["id"]);
    assert!(data[1..].iter().all(|e| e["created"] == json!(true)));
    assert_eq!(app.counts().await, (5, 5, 5));
    // Ordered: the endpoint's Sequence Numbers follow the batch order without gaps.
    let seq: Vec<i64> = sqlx::query_scalar(
        "SELECT d.sequence_number FROM deliveries d JOIN events e ON e.id = d.event_id
         ORDER BY (e.payload->>'n')::int",
    )
    .fetch_all(&app.pool)
    .await
    .expect("seq");
    assert_eq!(seq, vec![1, 2, 3, 4, 5]);

    // One bad item refuses the whole batch, naming it, and writes nothing.
    let bad = json!({"events": [
        {"type": "order.paid", "payload": {}},
        {"type": "order..paid", "payload": {}}
    ]});
    let r = app
        .call(Method::POST, "/v1/events/batch", Some(&key), Some(bad))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["field"], json!("events[1].type"));
    // A key reused with another payload inside a batch refuses the whole batch too.
    let conflict = json!({"events": [
        {"type": "order.paid", "payload": {"new": true}},
        {"type": "order.paid", "payload": {"n": 99}, "idempotency_key": "b-1"}
    ]});
    let r = app
        .call(Method::POST, "/v1/events/batch", Some(&key), Some(conflict))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let empty = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": []})),
        )
        .await;
    assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.counts().await, (5, 5, 5));
}

#[tokio::test]
async fn disabled_and_deleted_endpoints_get_no_deliveries() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let disabled = app.endpoint(&key).await;
    let deleted = app.endpoint(&key).await;
    app.subscribe(&key, &disabled, &["*"], false).await;
    app.subscribe(&key, &deleted, &["*"], false).await;
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{disabled}"),
            Some(&key),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/endpoints/{deleted}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app.post_event(&key, "a.b", json!({}), None).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(app.counts().await, (1, 0, 0));
}

#[tokio::test]
async fn bad_input_gets_a_clear_problem_and_writes_nothing() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let url = format!("{}/v1/events", app.base);
    let raw = |body: String, ct: Option<&'static str>| {
        let mut req = app.client.post(&url).bearer_auth(&key).body(body);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        async move { TestApp::reply(req.send().await.expect("send")).await }
    };
    let json_ct = Some("application/json");
    let big = format!(
        r#"{{"type":"a.b","payload":{{"x":"{}"}}}}"#,
        "y".repeat(1024 * 1024)
    );
    let deep = format!(
        r#"{{"type":"a.b","payload":{{"a":{}{}}}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    // (body, content-type, status, code, field)
    type Case = (
        String,
        Option<&'static str>,
        StatusCode,
        &'static str,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            big,
            json_ct,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            None,
        ),
        (
            "{not json".into(),
            json_ct,
            StatusCode::BAD_REQUEST,
            "malformed_json",
            None,
        ),
        (
            deep,
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("payload"),
        ),
        (
            r#"{"type":"a.b","payload":{}}"#.into(),
            None,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            None,
        ),
        (
            r#"{"type":"a b","payload":{}}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("type"),
        ),
        (
            r#"{"type":"","payload":{}}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("type"),
        ),
        (
            r#"{"type":"a.b","payload":[1]}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("payload"),
        ),
        (
            r#"{"type":"a.b","payload":{"s":"\u0000"}}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("payload"),
        ),
        (
            r#"{"type":"a.b"}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("body"),
        ),
        (
            r#"{"type":"a.b","payload":{},"extra":1}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("body"),
        ),
        (
            r#"{"type":"ünïcode.type","payload":{}}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("type"),
        ),
        (
            r#"{"type":"a.b'; DROP TABLE events;--","payload":{}}"#.into(),
            json_ct,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            Some("type"),
        ),
    ];
    for (body, ct, status, code, field) in cases {
        let preview: String = body.chars().take(60).collect();
        let r = raw(body, ct).await;
        assert_eq!(r.status, status, "{preview}: {:?}", r.body);
        assert_eq!(r.code(), code, "{preview}");
        assert_eq!(r.content_type, "application/problem+json", "{preview}");
        assert_eq!(r.body["status"], json!(status.as_u16()));
        if let Some(f) = field {
            assert_eq!(r.body["field"], json!(f), "{preview}");
        }
    }
    // Invalid UTF-8 in the body.
    let r = app
        .client
        .post(&url)
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(vec![b'{', b'"', 0xff, 0xfe, b'"', b'}'])
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // A bad Idempotency-Key header.
    let r = app
        .post_event(&key, "a.b", json!({}), Some(&"k".repeat(300)))
        .await;
    assert_eq!(r.body["field"], json!("Idempotency-Key"));
    assert_eq!(app.counts().await, (0, 0, 0));

    // Just under the limit is fine.
    let fits = format!(r#"{{"x":"{}"}}"#, "y".repeat(1024 * 1024 - 10));
    let body = format!(r#"{{"type":"a.b","payload":{fits}}}"#);
    let r = raw(body, json_ct).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(app.counts().await, (1, 1, 1));
}

#[tokio::test]
async fn stored_events_read_back_with_their_deliveries() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["user.*"], false).await;
    let created = app
        .post_event(
            &key,
            "user.signed_up",
            json!({"name": "Ada", "n": [1, 2]}),
            Some("u1"),
        )
        .await;
    let id = created.body["id"].as_str().expect("id");
    let r = app
        .call(Method::GET, &format!("/v1/events/{id}"), Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["payload"], json!({"name": "Ada", "n": [1, 2]}));
    assert_eq!(r.body["type"], json!("user.signed_up"));
    assert_eq!(r.body["idempotency_key"], json!("u1"));
    assert_eq!(r.body["deliveries"][0]["status"], json!("PENDING"));
    let dlv = r.body["deliveries"][0]["id"].as_str().expect("dlv");
    let d = app
        .call(
            Method::GET,
            &format!("/v1/deliveries/{dlv}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(d.body["event_id"], json!(id));
    assert_eq!(d.body["attempt_count"], json!(0));
    assert_eq!(d.body["attempts"], json!([]));

    for i in 0..4 {
        app.post_event(&key, "order.paid", json!({"i": i}), None)
            .await;
    }
    let filtered = app
        .call(
            Method::GET,
            "/v1/events?type=order.paid&limit=3",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(filtered.body["data"].as_array().expect("data").len(), 3);
    let cursor = filtered.body["next_cursor"].as_str().expect("cursor");
    let rest = app
        .call(
            Method::GET,
            &format!("/v1/events?type=order.paid&limit=3&cursor={cursor}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(rest.body["data"].as_array().expect("data").len(), 1);
    assert_eq!(rest.body["next_cursor"], Value::Null);
    let future = app
        .call(
            Method::GET,
            "/v1/events?created_after=2999-01-01T00:00:00Z",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(future.body["data"], json!([]));
    let bad_cursor = app
        .call(Method::GET, "/v1/events?cursor=%%%", Some(&key), None)
        .await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);
    let bad_limit = app
        .call(Method::GET, "/v1/events?limit=501", Some(&key), None)
        .await;
    assert_eq!(bad_limit.status, StatusCode::UNPROCESSABLE_ENTITY);
    let deliveries = app
        .call(
            Method::GET,
            &format!("/v1/deliveries?status=PENDING&event_id={id}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(deliveries.body["data"].as_array().expect("data").len(), 1);
}

/// The sender cache (auth::SenderCache): a change made through this process applies to the
/// very next Event; one made through another replica within about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_and_subscription_changes_reach_the_next_event() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let first = app.post_event(&key, "order.paid", json!({}), None).await;
    assert_eq!(
        first.body["deliveries"],
        json!([]),
        "nothing subscribed yet"
    );
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    let second = app.post_event(&key, "order.paid", json!({}), None).await;
    assert_eq!(
        second.body["deliveries"][0]["endpoint_id"],
        json!(ep),
        "{:?}",
        second.body
    );
    let r = app
        .call(
            Method::POST,
            &format!("/v1/endpoints/{ep}/disable"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let third = app.post_event(&key, "order.paid", json!({}), None).await;
    assert_eq!(third.body["deliveries"], json!([]), "disabled at once");

    // A second replica on the same database has its own cache.
    let mut other = app.state.clone();
    other.senders = railhook_ingest::store::subscriptions::SenderCache::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(railhook_ingest::serve(
        listener,
        other,
        std::future::pending(),
    ));
    let post_there = || {
        let (base, key) = (base.clone(), key.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/events"))
                .bearer_auth(key)
                .json(&json!({"type": "order.paid", "payload": {}}))
                .send()
                .await
                .expect("post")
                .status()
        }
    };
    assert_eq!(post_there().await, StatusCode::CREATED);
    app.revoke_key_of(&project).await;
    let revoked = app.post_event(&key, "order.paid", json!({}), None).await;
    assert_eq!(revoked.status, StatusCode::UNAUTHORIZED, "at once here");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        post_there().await,
        StatusCode::UNAUTHORIZED,
        "within a second there"
    );
}
