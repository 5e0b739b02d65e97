//! Operational webhooks through the whole path (ingest, relay, Kafka, worker, real HTTP):
//! endpoint changes and Attempt outcomes reach the project's operational endpoint, signed
//! with that endpoint's own secret, in the common body shape; a change that fails sends
//! nothing; operational endpoints never report on themselves, and stay out of the project's
//! Events and endpoints.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use railhook_common::signing::SigningKey;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// Each operational request received so far: (type, body), after checking its signature
/// with `secret` and the body's shape.
fn operational(rx: &Receiver, secret: &str) -> Vec<(String, Value)> {
    let key = SigningKey::parse(secret).expect("secret");
    rx.requests()
        .iter()
        .map(|r| {
            let ts: i64 = r.headers["webhook-timestamp"].parse().expect("ts");
            assert_eq!(
                r.headers["webhook-signature"],
                key.sign(&r.headers["webhook-id"], ts, r.body.as_bytes()),
                "signed with the operational endpoint's own secret"
            );
            let body: Value = serde_json::from_str(&r.body).expect("json");
            let keys: Vec<&str> = body
                .as_object()
                .expect("object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys, ["data", "timestamp", "type"], "{body}");
            assert!(
                chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().expect("ts"))
                    .is_ok()
            );
            (body["type"].as_str().expect("type").to_owned(), body)
        })
        .collect()
}

async fn wait_for(rx: &Receiver, secret: &str, kind: &str, endpoint: &str) -> Value {
    crate::support::eventually(&format!("{kind} for {endpoint}"), WAIT, || async {
        operational(rx, secret)
            .into_iter()
            .find(|(t, b)| t == kind && b["data"]["endpoint_id"] == json!(endpoint))
            .map(|(_, b)| b)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_changes_and_attempt_outcomes_reach_the_operational_endpoint() {
    let p = Pipeline::start(|s| {
        s.retry_outgoing_delays = "0.1".into();
        s.operational_failing_after = 2;
        s.breaker_consecutive_failures = 1000;
    })
    .await;
    let ops_rx = Receiver::start(vec![], Behaviour::Status(204)).await;
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/operational-endpoints",
            Some(&p.key),
            Some(json!({"url": ops_rx.url, "description": "pager"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body["event_types"], json!(["*"]));
    let ops_id = r.body["id"].as_str().expect("id").to_owned();
    let secret = r.body["secret"].as_str().expect("secret").to_owned();
    // Unknown types are refused by name.
    let bad = p
        .app
        .call(
            Method::POST,
            "/v1/operational-endpoints",
            Some(&p.key),
            Some(json!({"url": ops_rx.url, "event_types": ["order.paid"]})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);

    // A webhook endpoint that fails twice, then recovers.
    let flaky = Receiver::start(
        vec![Behaviour::Status(500), Behaviour::Status(500)],
        Behaviour::Status(204),
    )
    .await;
    let (flaky_id, _) = p.endpoint(&flaky.url, 5_000).await;
    let created = wait_for(&ops_rx, &secret, "endpoint.created", &flaky_id).await;
    assert_eq!(created["data"]["url"], json!(flaky.url));
    let (event, delivery) = p.send(json!({"n": 1})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let failing = wait_for(&ops_rx, &secret, "message.attempt.failing", &flaky_id).await;
    assert_eq!(failing["data"]["delivery_id"], json!(delivery));
    assert_eq!(failing["data"]["event_id"], json!(event));
    assert_eq!(failing["data"]["last_attempt"]["status_code"], json!(500));
    let recovered = wait_for(&ops_rx, &secret, "message.attempt.recovered", &flaky_id).await;
    assert_eq!(recovered["data"]["attempt_count"], json!(3));

    // An endpoint that answers 410: disabled, and its message exhausted.
    let gone = Receiver::start(vec![], Behaviour::Status(410)).await;
    let (gone_id, _) = p.endpoint(&gone.url, 5_000).await;
    let to_gone = p.send_to("order.shipped", &gone_id).await;
    p.wait_status(&to_gone, "FAILED", WAIT).await;
    let disabled = wait_for(&ops_rx, &secret, "endpoint.disabled", &gone_id).await;
    assert!(
        disabled["data"]["reason"]
            .as_str()
            .expect("reason")
            .contains("410")
    );
    let exhausted = wait_for(&ops_rx, &secret, "message.attempt.exhausted", &gone_id).await;
    assert_eq!(exhausted["data"]["delivery_id"], json!(to_gone));

    // Enable, update, delete through the API.
    let r = p
        .app
        .call(
            Method::POST,
            &format!("/v1/endpoints/{gone_id}/enable"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    wait_for(&ops_rx, &secret, "endpoint.enabled", &gone_id).await;
    let r = p
        .app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{gone_id}"),
            Some(&p.key),
            Some(json!({"description": "new"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let updated = wait_for(&ops_rx, &secret, "endpoint.updated", &gone_id).await;
    assert_eq!(updated["data"]["description"], json!("new"));
    // A change that fails sends nothing.
    let r = p
        .app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{gone_id}"),
            Some(&p.key),
            Some(json!({"timeout_ms": 1})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = p
        .app
        .call(
            Method::DELETE,
            &format!("/v1/endpoints/{gone_id}"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    wait_for(&ops_rx, &secret, "endpoint.deleted", &gone_id).await;
    let updates = operational(&ops_rx, &secret)
        .into_iter()
        .filter(|(t, b)| t == "endpoint.updated" && b["data"]["endpoint_id"] == json!(gone_id))
        .count();
    assert_eq!(updates, 1, "the refused PATCH sent no endpoint.updated");

    // The operational endpoint is not a project endpoint, and its Events are not the
    // project's Events.
    let endpoints = p
        .app
        .call(Method::GET, "/v1/endpoints", Some(&p.key), None)
        .await;
    assert!(!endpoints.body.to_string().contains(&ops_id));
    let r = p
        .app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{ops_id}"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let events = p
        .app
        .call(Method::GET, "/v1/events?limit=100", Some(&p.key), None)
        .await;
    let types: Vec<&str> = events.body["data"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert!(types.iter().all(|t| t.starts_with("order.")), "{types:?}");
    let listed = p
        .app
        .call(Method::GET, "/v1/operational-endpoints", Some(&p.key), None)
        .await;
    assert_eq!(listed.body["data"][0]["id"], json!(ops_id));
    let rotated = p
        .app
        .call(
            Method::POST,
            &format!("/v1/operational-endpoints/{ops_id}/secret/rotate"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(rotated.body["previous_key"], json!(secret));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operational_endpoint_never_reports_on_itself() {
    let p = Pipeline::start(|s| {
        s.retry_outgoing_delays = "0.1".into();
    })
    .await;
    // One operational endpoint that answers 410 (it is disabled by its own Delivery), one
    // that listens to endpoint.* events and works.
    let broken = Receiver::start(vec![], Behaviour::Status(410)).await;
    let watcher = Receiver::start(vec![], Behaviour::Status(204)).await;
    let mut ids = Vec::new();
    let mut secrets = Vec::new();
    for (url, types) in [
        (&broken.url, json!(["*"])),
        (
            &watcher.url,
            json!(["endpoint.disabled", "endpoint.created"]),
        ),
    ] {
        let r = p
            .app
            .call(
                Method::POST,
                "/v1/operational-endpoints",
                Some(&p.key),
                Some(json!({"url": url, "event_types": types})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        ids.push(r.body["id"].as_str().expect("id").to_owned());
        secrets.push(r.body["secret"].as_str().expect("secret").to_owned());
    }
    // A project endpoint's creation goes to both; the broken one answers 410 and is
    // disabled, which the watcher must not hear about.
    let (ep, _) = p.endpoint("http://127.0.0.1:9/never", 5_000).await;
    wait_for(&watcher, &secrets[1], "endpoint.created", &ep).await;
    crate::support::eventually("the broken operational endpoint disabled", WAIT, || async {
        let r = p
            .app
            .call(
                Method::GET,
                &format!("/v1/operational-endpoints/{}", ids[0]),
                Some(&p.key),
                None,
            )
            .await;
        (r.body["enabled"] == json!(false)).then_some(())
    })
    .await;
    assert_eq!(broken.count(), 1);
    crate::support::holds_for(
        "no operational webhook about an operational endpoint",
        Duration::from_secs(2),
        || async {
            let about_itself = operational(&watcher, &secrets[1])
                .into_iter()
                .any(|(_, b)| {
                    ids.contains(&b["data"]["endpoint_id"].as_str().unwrap_or("").to_owned())
                });
            if about_itself {
                Err("reported".to_owned())
            } else {
                Ok(())
            }
        },
    )
    .await;
    p.stop().await;
}
