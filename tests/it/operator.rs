//! The operator surface over real HTTP, Postgres, the relay and workers: Replays, Failed
//! Messages, and endpoints disabled by a failure streak.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{TestApp, eventually, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

async fn get(app: &TestApp, key: &str, path: &str) -> Value {
    let r = app.call(Method::GET, path, Some(key), None).await;
    assert_eq!(r.status, StatusCode::OK, "{path}: {:?}", r.body);
    r.body
}

async fn replay_done(app: &TestApp, key: &str, id: &str) -> Value {
    eventually("the replay completes", WAIT, || async {
        let r = get(app, key, &format!("/v1/replays/{id}")).await;
        (r["status"] == json!("COMPLETED")).then_some(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_sends_a_new_webhook_id_with_the_same_event_id() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let (event, delivery) = p.send(json!({"order": 7})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;

    let r = p
        .app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&p.key),
            Some(json!({"event_ids": [event]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let replay = replay_done(&p.app, &p.key, r.body["id"].as_str().expect("id")).await;
    assert_eq!(replay["events_total"], json!(1));
    assert_eq!(replay["deliveries_created"], json!(1));

    eventually("the replayed delivery arrives", WAIT, || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    let got = receiver.requests();
    assert_ne!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    assert_eq!(got[0].headers["x-event-id"], got[1].headers["x-event-id"]);
    assert_eq!(got[1].headers["x-event-id"], event);
    assert_eq!(got[0].body, got[1].body);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_replay_runs_in_bounded_batches_and_stays_in_its_project() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let from = chrono::Utc::now() - chrono::Duration::seconds(5);
    // 1,201 order.paid Events (three batches of the replay engine) and 50 of another type.
    for chunk in 0..4 {
        let n = if chunk == 3 { 1201 - 3 * 400 } else { 400 };
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"type": "order.paid", "payload": {"chunk": chunk, "i": i}}))
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
    }
    let others: Vec<Value> = (0..50)
        .map(|i| json!({"type": "user.created", "payload": {"i": i}}))
        .collect();
    app.call(
        Method::POST,
        "/v1/events/batch",
        Some(&key),
        Some(json!({"events": others})),
    )
    .await;
    let to = chrono::Utc::now() + chrono::Duration::seconds(5);
    let range = json!({"from": from, "to": to, "event_types": ["order.paid"]});

    let mut preview = range.clone();
    preview["dry_run"] = json!(true);
    let r = app
        .call(Method::POST, "/v1/replays", Some(&key), Some(preview))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["events_total"], json!(1201));

    let r = app
        .call(Method::POST, "/v1/replays", Some(&key), Some(range))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let replay = replay_done(&app, &key, &id).await;
    assert_eq!(replay["events_done"], json!(1201));
    assert_eq!(replay["deliveries_created"], json!(1201));
    let (replayed, announced): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM deliveries WHERE replay_id = $1 AND origin = 'replay'),
                (SELECT count(*) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id
                 WHERE d.replay_id = $1 AND o.reason = 'REPLAY')",
    )
    .bind(&id)
    .fetch_one(&app.pool)
    .await
    .expect("counts");
    assert_eq!((replayed, announced), (1201, 1201));

    // Another project sees neither the Replay nor the Events.
    let (_, other) = app.project().await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/replays/{id}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let some_event: String = sqlx::query_scalar("SELECT id FROM events LIMIT 1")
        .fetch_one(&app.pool)
        .await
        .expect("event");
    let r = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&other),
            Some(json!({"event_ids": [some_event]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], json!("event_ids"));
    // Bad requests are refused whole.
    for bad in [
        json!({}),
        json!({"event_ids": []}),
        json!({"from": to, "to": from}),
        json!({"from": from, "to": to, "event_types": ["order.*"]}),
        json!({"event_ids": ["not-an-id"]}),
        json!({"from": from, "to": to, "endpoint_id": "ep_01arz3ndektsv4rrffq69g5fav"}),
    ] {
        let r = app
            .call(Method::POST, "/v1/replays", Some(&key), Some(bad.clone()))
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {:?}",
            r.body
        );
        assert_eq!(r.content_type, "application/problem+json");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM replays")
        .fetch_one(&app.pool)
        .await
        .expect("replays");
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_messages_filter_and_retry_in_bulk() {
    let p = Pipeline::start(|_| {}).await;
    let bad = Receiver::start(vec![], Behaviour::Status(400)).await;
    let missing = Receiver::start(vec![], Behaviour::Status(404)).await;
    let (bad_ep, _) = p.endpoint(&bad.url, 5_000).await;
    let (missing_ep, _) = p.endpoint(&missing.url, 5_000).await;
    for n in 0..3 {
        p.send(json!({"n": n})).await;
    }
    let list = |query: String| {
        let (app, key) = (&p.app, &p.key);
        async move {
            get(app, key, &format!("/v1/failed-messages?{query}")).await["data"]
                .as_array()
                .expect("data")
                .clone()
        }
    };
    eventually("six failed messages", WAIT, || async {
        (list(String::new()).await.len() == 6).then_some(())
    })
    .await;
    let by_code = list("status_code=400".into()).await;
    assert_eq!(by_code.len(), 3);
    assert!(by_code.iter().all(|m| m["endpoint_id"] == json!(bad_ep)));
    assert_eq!(by_code[0]["event_type"], json!("order.paid"));
    assert_eq!(list(format!("endpoint_id={missing_ep}")).await.len(), 3);
    assert_eq!(list("event_type=user.created".into()).await.len(), 0);
    let page = get(&p.app, &p.key, "/v1/failed-messages?limit=4").await;
    assert_eq!(page["data"].as_array().expect("data").len(), 4);
    let rest = list(format!(
        "limit=4&cursor={}",
        page["next_cursor"].as_str().expect("cursor")
    ))
    .await;
    assert_eq!(rest.len(), 2);
    let r = p
        .app
        .call(
            Method::GET,
            "/v1/failed-messages?status_code=99",
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let (_, other) = p.app.project().await;
    assert_eq!(
        get(&p.app, &other, "/v1/failed-messages").await["data"],
        json!([])
    );
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/failed-messages/retry",
            Some(&other),
            Some(json!({})),
        )
        .await;
    assert_eq!(
        r.body["retried"],
        json!(0),
        "another project retries nothing"
    );

    let r = p
        .app
        .call(
            Method::POST,
            "/v1/failed-messages/retry",
            Some(&p.key),
            Some(json!({"endpoint_id": bad_ep})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["retried"], json!(3));
    eventually("the retried messages are sent again", WAIT, || async {
        (bad.count() == 6).then_some(())
    })
    .await;
    assert_eq!(missing.count(), 3, "the other endpoint's were left alone");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_keeps_failing_is_disabled_with_a_reason_and_comes_back() {
    let p = Pipeline::start(|s| {
        s.endpoint_disable_after_seconds = 1;
        s.endpoint_disable_min_failures = 3;
        s.breaker_consecutive_failures = 1000;
    })
    .await;
    let receiver = Receiver::start(vec![], Behaviour::Status(500)).await;
    let fixed = Receiver::start(vec![], Behaviour::Status(200)).await;
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": receiver.url, "retry_delays_seconds": [0.4], "max_attempts": 20})),
        )
        .await;
    let ep = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &ep, &["*"], false).await;
    let (_, delivery) = p.send(json!({})).await;

    let health = eventually("the endpoint is disabled", WAIT, || async {
        let h = get(&p.app, &p.key, &format!("/v1/endpoints/{ep}/health")).await;
        (h["enabled"] == json!(false)).then_some(h)
    })
    .await;
    assert_eq!(health["state"], json!("disabled"));
    let reason = health["disabled_reason"].as_str().expect("reason");
    assert!(reason.contains("every Attempt failed since"), "{reason}");
    assert!(health["consecutive_failures"].as_i64().expect("streak") >= 3);
    let d = p.wait_status(&delivery, "FAILED", WAIT).await;
    // Counted once, for the alert (RailhookEndpointsDisabled): the disabling turn counted
    // it before the later one that failed the Delivery.
    assert_eq!(p.worker_metrics.endpoints_disabled.get(), 1);
    assert!(
        d["failure_reason"]
            .as_str()
            .expect("reason")
            .contains("disabled"),
        "{d}"
    );

    // Enabling clears the reason and the streak; a retry then goes through.
    let r = p
        .app
        .call(
            Method::POST,
            &format!("/v1/endpoints/{ep}/enable"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["enabled"], json!(true));
    assert_eq!(r.body["disabled_reason"], Value::Null);
    let h = get(&p.app, &p.key, &format!("/v1/endpoints/{ep}/health")).await;
    assert_eq!(h["consecutive_failures"], json!(0));
    assert_eq!(h["state"], json!("healthy"));
    // The receiver is fixed (here: the endpoint now points at one that answers 200), and
    // the failed message is sent again.
    let r = p
        .app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{ep}"),
            Some(&p.key),
            Some(json!({"url": fixed.url})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/failed-messages/retry",
            Some(&p.key),
            Some(json!({"endpoint_id": ep})),
        )
        .await;
    assert_eq!(r.body["retried"], json!(1), "{:?}", r.body);
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;

    // A person may disable it too, with a reason that is shown.
    let r = p
        .app
        .call(
            Method::POST,
            &format!("/v1/endpoints/{ep}/disable"),
            Some(&p.key),
            Some(json!({"reason": "maintenance until 14:00"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        r.body["disabled_reason"],
        json!("disabled by a person: maintenance until 14:00")
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_command_starts_a_replay_and_follows_it_to_the_end() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    let event = app
        .post_event(&key, "order.paid", json!({"n": 1}), None)
        .await
        .body["id"]
        .as_str()
        .expect("event")
        .to_owned();
    let run = |args: Vec<String>| {
        let base = app.base.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
                .arg("replay")
                .args(args)
                .env("RAILHOOK_API_URL", base)
                .env("RAILHOOK_API_KEY", key)
                .env_remove("DATABASE_URL")
                .output()
                .expect("railhook replay")
        })
    };
    let out = run(vec!["--event-id".into(), event.clone()])
        .await
        .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("completed: 1 events, 1 deliveries created"),
        "{stdout}"
    );
    // A refused request exits non-zero with the API's reason, and no key in the output.
    let out = run(vec!["--event-id".into(), "evt_nope".into()])
        .await
        .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("validation_failed"), "{stderr}");
    assert!(!stderr.contains(&key));
}

/// Review #34 item 12: a time-range Replay resends the sender's Events, never Railhook's
/// own operational Events of the project (`endpoint.created`, `message.attempt.failing`…),
/// which are hidden from /v1/events and meant for the operational endpoint only.
#[tokio::test]
async fn a_range_replay_leaves_operational_events_out() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let from = chrono::Utc::now() - chrono::Duration::seconds(5);
    for i in 0..3 {
        let r = app
            .post_event(&key, "order.paid", json!({"i": i}), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    sqlx::query(
        "INSERT INTO events (id, project_id, event_type, payload, operational)
         VALUES ($1, $2, 'endpoint.created', '{}', true)",
    )
    .bind(railhook_common::ids::EventId::generate().into_string())
    .bind(&project)
    .execute(&app.pool)
    .await
    .expect("an operational Event");
    let to = chrono::Utc::now() + chrono::Duration::seconds(5);
    let r = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key),
            Some(json!({"from": from, "to": to, "dry_run": true})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["events_total"], json!(3), "{:?}", r.body);
    let r = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key),
            Some(json!({"from": from, "to": to})),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let replay = replay_done(&app, &key, &id).await;
    assert_eq!(replay["events_done"], json!(3));
}
