//! HTTP authentication beyond the signature (issue #40, common/src/endpoint_auth.rs): an
//! endpoint's HTTP Basic credentials reach a real receiver on every Attempt, are never
//! returned, survive a PATCH that leaves the password out, and go when removed.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::eventually;
use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};

const PASSWORD: &str = "s3cret-basic-7d1f";

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The `authorization` header of the receiver's `n`-th request (1-based), once it came.
async fn authorization_of(receiver: &Receiver, n: usize) -> Option<String> {
    eventually(&format!("request {n}"), Duration::from_secs(60), || async {
        (receiver.count() >= n).then_some(())
    })
    .await;
    receiver.requests()[n - 1]
        .headers
        .get("authorization")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_credentials_reach_the_receiver_and_are_never_returned() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let call = |method: Method, path: String, body: serde_json::Value| {
        let (app, key) = (&p.app, p.key.clone());
        async move { app.call(method, &path, Some(&key), Some(body)).await }
    };
    // Refused, each naming its field.
    for (body, field) in [
        (
            json!({"url": receiver.url, "headers": {"Authorization": "Bearer x"},
                   "authentication": {"type": "basic", "username": "u", "password": "p"}}),
            "authentication",
        ),
        (
            json!({"type": "nats", "nats": {"url": "nats://h:4222", "subject": "a"},
                   "authentication": {"type": "basic", "username": "u", "password": "p"}}),
            "authentication",
        ),
        (
            json!({"url": receiver.url,
                   "authentication": {"type": "basic", "username": "a:b", "password": "p"}}),
            "authentication.username",
        ),
        (
            json!({"url": receiver.url, "authentication": {"type": "basic", "username": "u"}}),
            "authentication.password",
        ),
    ] {
        let r = call(Method::POST, "/v1/endpoints".into(), body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            r.body
        );
        assert_eq!(r.body["field"], field, "{body}: {:?}", r.body);
    }
    let r = call(
        Method::POST,
        "/v1/endpoints".into(),
        json!({"url": receiver.url,
               "authentication": {"type": "basic", "username": "railhook", "password": PASSWORD}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(
        r.body["authentication"],
        json!({"type": "basic", "username": "railhook"})
    );
    assert!(!r.body.to_string().contains(PASSWORD));
    let id = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &id, &["*"], false).await;
    let shown = p
        .app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{id}"),
            Some(&p.key),
            None,
        )
        .await;
    assert!(!shown.body.to_string().contains(PASSWORD));

    p.send(json!({"n": 1})).await;
    let expected = basic("railhook", PASSWORD);
    assert_eq!(authorization_of(&receiver, 1).await, Some(expected.clone()));

    // A PATCH that leaves the password out under the same username keeps it.
    let r = call(
        Method::PATCH,
        format!("/v1/endpoints/{id}"),
        json!({"authentication": {"type": "basic", "username": "railhook"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    p.send(json!({"n": 2})).await;
    assert_eq!(authorization_of(&receiver, 2).await, Some(expected));
    // A custom Authorization header beside it is refused.
    let r = call(
        Method::PATCH,
        format!("/v1/endpoints/{id}"),
        json!({"headers": {"Authorization": "Bearer x"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "headers");
    // Removed: the next Attempt carries none.
    let r = call(
        Method::PATCH,
        format!("/v1/endpoints/{id}"),
        json!({"authentication": null}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["authentication"], json!(null));
    p.send(json!({"n": 3})).await;
    assert_eq!(authorization_of(&receiver, 3).await, None);
    p.stop().await;
}
