//! The Attempt Runner on its own: a real HTTP server on loopback and no database, Redis or
//! Kafka anywhere in the process. Invariant 2 (no such work while a request is in flight) is
//! kept by construction — the runner holds only an HTTP client — and this test shows it runs
//! whole Attempts with nothing else available.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use railhook_common::signing::SigningKey;
use railhook_worker::attempt::{Attempt, ErrorClass, Outcome, Runner};
use railhook_worker::ssrf::Allowlist;

async fn server() -> String {
    let app = Router::new()
        .route(
            "/ok",
            post(|headers: HeaderMap| async move {
                let sig = headers
                    .get("webhook-signature")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                (axum::http::StatusCode::OK, sig)
            }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn attempt(url: &str, keys: Vec<SigningKey>, timeout: Duration) -> Attempt {
    Attempt {
        delivery_id: "dlv_test".into(),
        event_id: "evt_test".into(),
        event_type: "order.paid".into(),
        method: reqwest::Method::POST,
        url: url.parse().expect("url"),
        body: bytes::Bytes::from_static(b"{\"n\":1}"),
        extra: railhook_common::headers::Extra {
            content_type: None,
            headers: vec![("X-Team".into(), "payments".into())],
        },
        keys,
        timeout,
        sequence_number: Some(7),
        traceparent: None,
        tracestate: None,
        endpoint_id: "ep_test".into(),
        application_id: None,
        via: None,
        identity: None,
        oauth: None,
        transformed: None,
    }
}

#[tokio::test]
async fn attempts_run_with_nothing_but_http() {
    let base = server().await;
    let runner = Runner::new(Allowlist::parse("127.0.0.0/8").expect("allow")).expect("runner");
    let old = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("old");
    let new = SigningKey::parse(&railhook_common::keygen::generate_signing_secret()).expect("new");
    let report = runner
        .run(&attempt(
            &format!("{base}/ok"),
            vec![new.clone(), old.clone()],
            Duration::from_secs(5),
        ))
        .await;
    assert_eq!(report.outcome, Outcome::Delivered);
    assert_eq!(report.status, Some(200));
    // The echoed signature header carries one entry per active secret (rotation overlap).
    let echoed = report.excerpt.expect("excerpt");
    let entries: Vec<&str> = echoed.split(' ').collect();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e.starts_with("v1,")));

    let report = runner
        .run(&attempt(
            &format!("{base}/slow"),
            vec![old.clone()],
            Duration::from_millis(300),
        ))
        .await;
    assert_eq!(report.error, Some(ErrorClass::Timeout));
    assert!(matches!(report.outcome, Outcome::Retry { .. }));
    assert!(report.duration < Duration::from_secs(2));

    // Without the allowlist, a literal loopback address is refused before anything is sent.
    let strict = Runner::new(Allowlist::default()).expect("runner");
    let report = strict
        .run(&attempt(
            &format!("{base}/ok"),
            vec![old],
            Duration::from_secs(5),
        ))
        .await;
    assert_eq!(report.error, Some(ErrorClass::TargetRefused));
    assert!(!report.sent);
}
