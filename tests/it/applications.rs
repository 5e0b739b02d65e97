//! Applications and channels (issue #37, docs/APPLICATIONS.md): the native API, and an
//! Event's audience — its application's endpoints only, narrowed by channels — decided
//! where its Deliveries are planned, at ingest and at replay alike.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{TestApp, eventually, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn application(app: &TestApp, key: &str, body: Value) -> String {
    let r = app
        .call(Method::POST, "/v1/applications", Some(key), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

/// An endpoint with `extra` fields (application, channels), subscribed to everything.
async fn endpoint(app: &TestApp, key: &str, extra: Value) -> String {
    let mut body = json!({"url": "http://127.0.0.1:9/hook"});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let r = app
        .call(Method::POST, "/v1/endpoints", Some(key), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    app.subscribe(key, &id, &["*"], false).await;
    id
}

/// The endpoints an accepted Event's Deliveries go to.
fn reached(reply: &Value) -> BTreeSet<String> {
    reply["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["endpoint_id"].as_str().expect("endpoint").to_owned())
        .collect()
}

fn set(ids: &[&String]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).clone()).collect()
}

#[tokio::test]
async fn applications_are_created_found_by_id_or_uid_changed_and_deleted() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let id = application(
        &app,
        &key,
        json!({"name": "Globex", "uid": "globex", "metadata": {"plan": "gold"},
               "rate_limit_per_second": 20}),
    )
    .await;
    assert!(id.starts_with("app_"));
    for name in [&id, &"globex".to_owned()] {
        let r = app
            .call(
                Method::GET,
                &format!("/v1/applications/{name}"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{name}");
        assert_eq!(r.body["id"], json!(id));
        assert_eq!(r.body["metadata"], json!({"plan": "gold"}));
        assert_eq!(r.body["rate_limit_per_second"], json!(20));
    }
    // A uid is unique among the project's live applications; a bad one names its field.
    let r = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(&key),
            Some(json!({"name": "Again", "uid": "globex"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.code(), "already_exists");
    for (field, body) in [
        ("uid", json!({"name": "x", "uid": "app_looks_like_an_id"})),
        ("uid", json!({"name": "x", "uid": "has space"})),
        ("name", json!({"name": ""})),
        (
            "metadata",
            json!({"name": "x", "metadata": {"": "empty key"}}),
        ),
        (
            "rate_limit_per_second",
            json!({"name": "x", "rate_limit_per_second": 0}),
        ),
    ] {
        let r = app
            .call(Method::POST, "/v1/applications", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_eq!(r.body["field"], json!(field));
    }
    // Another project has its own uids.
    let (_, other) = app.project().await;
    application(&app, &other, json!({"name": "Globex", "uid": "globex"})).await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/applications/{id}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let r = app
        .call(
            Method::PATCH,
            "/v1/applications/globex",
            Some(&key),
            Some(json!({"name": "Globex Corp", "rate_limit_per_second": null})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["name"], json!("Globex Corp"));
    assert_eq!(r.body["rate_limit_per_second"], Value::Null);
    assert_eq!(r.body["uid"], json!("globex"));
    let list = app
        .call(Method::GET, "/v1/applications", Some(&key), None)
        .await;
    assert_eq!(list.body["data"].as_array().expect("data").len(), 1);

    // Deleting ends its endpoints at once; the uid is free again.
    let ep = endpoint(&app, &key, json!({"application": "globex"})).await;
    let r = app
        .call(Method::DELETE, "/v1/applications/globex", Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{ep}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let (enabled, reason): (bool, Option<String>) =
        sqlx::query_as("SELECT enabled, disabled_reason FROM endpoints WHERE id = $1")
            .bind(&ep)
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert!(!enabled);
    assert_eq!(reason.as_deref(), Some("the application was deleted"));
    application(&app, &key, json!({"name": "Globex", "uid": "globex"})).await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/applications/{id}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "the deleted one by its id");
}

#[tokio::test]
async fn an_event_reaches_its_own_scope_and_shared_channels_only() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, json!({"name": "A", "uid": "tenant-a"})).await;
    application(&app, &key, json!({"name": "B", "uid": "tenant-b"})).await;
    let project_ep = endpoint(&app, &key, json!({})).await;
    let a_all = endpoint(&app, &key, json!({"application": a, "uid": "main"})).await;
    let a_eu = endpoint(
        &app,
        &key,
        json!({"application": "tenant-a", "channels": ["eu"]}),
    )
    .await;
    let b_all = endpoint(
        &app,
        &key,
        json!({"application": "tenant-b", "uid": "main"}),
    )
    .await;

    // An endpoint's uid is unique in its application, not across the project.
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": "http://127.0.0.1:9/x", "application": "tenant-a", "uid": "main"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{:?}", r.body);

    let send = |body: Value| {
        let app = &app;
        let key = key.clone();
        async move {
            let r = app
                .call(Method::POST, "/v1/events", Some(&key), Some(body))
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
            r.body
        }
    };
    let p = json!({"n": 1});
    let project_event = send(json!({"type": "order.paid", "payload": p})).await;
    assert_eq!(reached(&project_event), set(&[&project_ep]));
    let to_a = send(json!({"type": "order.paid", "payload": p, "application": "tenant-a"})).await;
    assert_eq!(reached(&to_a), set(&[&a_all]));
    assert_eq!(to_a["application_id"], json!(a));
    let to_a_eu = send(json!({"type": "order.paid", "payload": p, "application": a,
                              "channels": ["eu", "us"]}))
    .await;
    assert_eq!(reached(&to_a_eu), set(&[&a_all, &a_eu]));
    let to_a_us = send(json!({"type": "order.paid", "payload": p, "application": a,
                              "channels": ["us"]}))
    .await;
    assert_eq!(reached(&to_a_us), set(&[&a_all]));
    let to_b = send(
        json!({"type": "order.paid", "payload": p, "application": "tenant-b",
                           "channels": ["eu"]}),
    )
    .await;
    assert_eq!(reached(&to_b), set(&[&b_all]));

    // The batch route takes an audience per item.
    let r = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": [
                {"type": "order.paid", "payload": p, "application": "tenant-b"},
                {"type": "order.paid", "payload": p}]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(reached(&r.body["data"][0]), set(&[&b_all]));
    assert_eq!(reached(&r.body["data"][1]), set(&[&project_ep]));

    // Refusals name the field, and nothing is written.
    let before = app.counts().await;
    for (field, body) in [
        (
            "application",
            json!({"type": "t", "payload": {}, "application": "nobody"}),
        ),
        (
            "channels",
            json!({"type": "t", "payload": {}, "channels": []}),
        ),
        (
            "channels",
            json!({"type": "t", "payload": {}, "channels": ["a b"]}),
        ),
    ] {
        let r = app
            .call(Method::POST, "/v1/events", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_eq!(r.body["field"], json!(field));
    }
    let r = app
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(&key),
            Some(json!({"events": [{"type": "t", "payload": {}},
                                   {"type": "t", "payload": {}, "application": "nobody"}]})),
        )
        .await;
    assert_eq!(r.body["field"], json!("events[1].application"));
    assert_eq!(app.counts().await, before);

    // The Event shows its audience; the list filters by application and channel.
    let id = to_a_eu["id"].as_str().expect("id");
    let r = app
        .call(Method::GET, &format!("/v1/events/{id}"), Some(&key), None)
        .await;
    assert_eq!(r.body["application_id"], json!(a));
    assert_eq!(r.body["channels"], json!(["eu", "us"]));
    let r = app
        .call(
            Method::GET,
            "/v1/events?application=tenant-a",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["data"].as_array().expect("data").len(), 3);
    let r = app
        .call(
            Method::GET,
            "/v1/events?application=tenant-a&channel=eu",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["data"].as_array().expect("data").len(), 1);
    let r = app
        .call(
            Method::GET,
            &format!("/v1/endpoints?application={a}"),
            Some(&key),
            None,
        )
        .await;
    let listed: BTreeSet<String> = r.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(listed, set(&[&a_all, &a_eu]));

    // A Replay keeps the Event's audience: the application's endpoints that share a
    // channel, never the project's or another application's.
    let r = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key),
            Some(json!({"event_ids": [id]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let replayed: BTreeSet<String> =
        eventually("the replay's Deliveries", Duration::from_secs(30), || {
            let pool = app.pool.clone();
            let id = id.to_owned();
            async move {
                let rows: Vec<String> = sqlx::query_scalar(
                    "SELECT endpoint_id FROM deliveries WHERE event_id = $1 AND origin = 'replay'",
                )
                .bind(&id)
                .fetch_all(&pool)
                .await
                .expect("rows");
                (rows.len() >= 2).then(|| rows.into_iter().collect())
            }
        })
        .await;
    assert_eq!(replayed, set(&[&a_all, &a_eu]));

    // The application's figures: its endpoints, its Events (3 posted, none in the batch),
    // and their Deliveries (1 + 2 + 1 at ingest, 2 replayed), by id or uid.
    for name in [&a, &"tenant-a".to_owned()] {
        let r = app
            .call(
                Method::GET,
                &format!("/v1/applications/{name}/stats"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(r.body["endpoints"], json!(2));
        assert_eq!(r.body["events"], json!(3));
        let total: i64 = ["pending", "processing", "succeeded", "failed"]
            .iter()
            .map(|s| r.body[*s].as_i64().expect("count"))
            .sum();
        assert_eq!(total, 6, "{:?}", r.body);
    }
    let r = app
        .call(
            Method::GET,
            "/v1/applications/tenant-b/stats",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["events"], json!(2), "{:?}", r.body);
    let r = app
        .call(
            Method::GET,
            "/v1/applications/tenant-a/stats?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn failed_messages_and_operational_webhooks_know_the_application() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let r = app
        .call(
            Method::POST,
            "/v1/operational-endpoints",
            Some(&key),
            Some(json!({"url": "http://127.0.0.1:9/ops"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let a = application(&app, &key, json!({"name": "A", "uid": "tenant-a"})).await;
    let a_ep = endpoint(&app, &key, json!({"application": "tenant-a"})).await;
    let project_ep = endpoint(&app, &key, json!({})).await;

    // The operational Event about the application's endpoint names the application; the
    // one about the project's endpoint does not.
    let data: Vec<Value> = sqlx::query_scalar(
        "SELECT payload->'data' FROM events
         WHERE operational AND event_type = 'endpoint.created' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("operational events");
    let of = |ep: &str| {
        data.iter()
            .find(|d| d["endpoint_id"] == json!(ep))
            .cloned()
            .expect("endpoint.created")
    };
    assert_eq!(of(&a_ep)["application_id"], json!(a));
    assert!(of(&project_ep).get("application_id").is_none());

    // One failed Delivery in each scope; the filter by application (id or uid) finds its own.
    for body in [
        json!({"type": "order.paid", "payload": {}, "application": "tenant-a"}),
        json!({"type": "order.paid", "payload": {}}),
    ] {
        let r = app
            .call(Method::POST, "/v1/events", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    let ours = vec![a_ep.clone(), project_ep.clone()];
    sqlx::query(
        "UPDATE deliveries SET status = 'FAILED', failure_reason = 'test'
         WHERE endpoint_id = ANY($1)",
    )
    .bind(&ours)
    .execute(&app.pool)
    .await
    .expect("fail them");
    for filter in ["tenant-a", a.as_str()] {
        let r = app
            .call(
                Method::GET,
                &format!("/v1/failed-messages?application={filter}"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let eps: Vec<&str> = r.body["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|m| m["endpoint_id"].as_str().expect("endpoint"))
            .collect();
        assert_eq!(eps, vec![a_ep.as_str()], "{filter}");
    }
    let r = app
        .call(
            Method::GET,
            "/v1/failed-messages?application=nobody",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["field"], json!("application"));
    let r = app
        .call(
            Method::POST,
            "/v1/failed-messages/retry",
            Some(&key),
            Some(json!({"application": "tenant-a"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["retried"], json!(1));
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE status = 'FAILED' AND endpoint_id = ANY($1)",
    )
    .bind(&ours)
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(left, 1, "the project's own failed message stays failed");
}
