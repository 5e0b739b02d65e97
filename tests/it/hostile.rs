//! Hostile input over real HTTP: every one gets a clear 4xx (or is stored exactly as sent,
//! when it is valid data), nothing is half-written, and the server keeps serving others.

use std::time::{Duration, Instant};

use crate::support::{local_setting, spawn_app, spawn_app_tuned};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ish_nul_and_unicode_input_is_refused_or_kept_verbatim() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let before = app.counts().await;
    for bad_type in [
        "order'; DROP TABLE events;--",
        "ördér.paid",
        "order.paid\u{0}",
        "order.\u{202e}diap",
        "",
        " order.paid",
    ] {
        let r = app.post_event(&key, bad_type, json!({}), None).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad_type:?}: {:?}",
            r.body
        );
        assert_eq!(r.body["field"], json!("type"));
    }
    // NUL inside a JSON string: Postgres's jsonb cannot hold it, so it is refused up front.
    let r = app
        .post_event(&key, "order.paid", json!({"note": "a\u{0}b"}), None)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    // Numbers jsonb cannot hold (review #34 item 11): refused at the door with 422, never a
    // 500 from inside the ingest statement, alone or in a batch.
    for (path, body) in [
        (
            "/v1/events",
            r#"{"type":"order.paid","payload":{"n":1e999999}}"#,
        ),
        (
            "/v1/events",
            r#"{"type":"order.paid","payload":{"n":[0.5e-16383]}}"#,
        ),
        (
            "/v1/events/batch",
            r#"{"events":[{"type":"order.paid","payload":{}},{"type":"order.paid","payload":{"n":-10e131071}}]}"#,
        ),
    ] {
        let r = app
            .client
            .post(format!("{}{path}", app.base))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let problem: serde_json::Value = r.json().await.expect("problem");
        assert_eq!(problem["code"], json!("validation_failed"), "{problem}");
        assert!(
            problem["field"]
                .as_str()
                .is_some_and(|f| f.ends_with("payload")),
            "{problem}"
        );
    }
    assert_eq!(
        app.counts().await,
        before,
        "nothing written by refused requests"
    );

    // Valid data that merely looks hostile is stored and returned exactly.
    let payload = json!({
        "q": "' OR 1=1; --", "emoji": "🚚📦", "rtl": "\u{202e}abc", "big": 1e308,
        "nested": {"a": [1, 2, {"b": "\\\\\""}]}
    });
    let r = app
        .post_event(&key, "order.paid", payload.clone(), Some("key';DROP--"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id");
    let got = app
        .call(Method::GET, &format!("/v1/events/{id}"), Some(&key), None)
        .await;
    assert_eq!(got.body["payload"], payload);

    for path in [
        "/v1/deliveries?status=' OR 1=1--",
        "/v1/deliveries?limit=-1",
        "/v1/deliveries?limit=99999999999999999999",
        "/v1/events?cursor=%00%01",
        // A NUL in a filter reached Postgres's text and answered 500 (schemathesis, once the
        // list routes' parameters were declared in the query).
        "/v1/events?application=a%00b",
        "/v1/events?channel=a%00",
        "/v1/audit-log?object_id=a%00",
        "/v1/failed-messages?since=yesterday",
        "/v1/endpoints/ep_'--",
    ] {
        let r = app.call(Method::GET, path, Some(&key), None).await;
        assert!(r.status.is_client_error(), "{path}: {}", r.status);
        assert_eq!(r.content_type, "application/problem+json", "{path}");
    }
    // The Svix surface answers in the Svix shape, and refuses the same.
    let r = app
        .call(Method::GET, "/api/v1/app?iterator=%00", Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_floods_and_slow_clients_do_not_stop_the_api() {
    let header_timeout = Duration::from_secs(3);
    let app = spawn_app_tuned(&local_setting("REDIS_URL"), |f| {
        f.merge(("http_header_timeout_seconds", header_timeout.as_secs()))
    })
    .await;
    let (_, key) = app.project().await;
    let addr = app.base.trim_start_matches("http://").to_owned();

    // A flood of headers: refused (431) or the connection is closed; never a 5xx.
    let mut req = app
        .client
        .get(format!("{}/v1/endpoints", app.base))
        .bearer_auth(&key);
    for n in 0..300 {
        req = req.header(format!("x-flood-{n}"), "x".repeat(1024));
    }
    match req.send().await {
        Ok(r) => assert!(r.status().is_client_error(), "{}", r.status()),
        Err(e) => assert!(e.is_request() || e.is_connect() || e.is_body(), "{e}"),
    }
    let huge = app
        .client
        .get(format!("{}/v1/endpoints", app.base))
        .bearer_auth(&key)
        .header("x-huge", "y".repeat(512 * 1024))
        .send()
        .await;
    if let Ok(r) = huge {
        assert!(r.status().is_client_error(), "{}", r.status());
    }

    // 200 slowloris connections (half a request line each, then silence) and one slow body.
    let mut idle = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        s.write_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Le")
            .await
            .expect("write");
        idle.push(s);
    }
    let mut slow = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    slow.write_all(
        format!(
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"type\":"
        )
        .as_bytes(),
    )
    .await
    .expect("write");

    // Everyone else is still served, and quickly.
    let started = Instant::now();
    for n in 0..20 {
        let r = app
            .post_event(&key, "order.paid", json!({"n": n}), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "20 events took {:?} beside the slow clients",
        started.elapsed()
    );
    // The slowloris connections are closed by the server once the header timeout has
    // passed: each sees the end of its stream (or a reset), not silence.
    let deadline = Instant::now() + header_timeout + Duration::from_secs(5);
    for mut s in idle {
        let mut buf = [0u8; 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => panic!("a half-sent request was still open {header_timeout:?} on"),
            }
        }
    }
    // The slow body never completed, so it stored nothing.
    drop(slow);
    let (events, _, _) = app.counts().await;
    assert_eq!(events, 20);
}
