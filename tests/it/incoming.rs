//! Incoming webhooks through real HTTP and Postgres. Requests are signed with each
//! provider's own published code: `@octokit/webhooks-methods` (GitHub) and `stripe`'s
//! `generateTestHeaderString` (Node, tests/providers), the official `standardwebhooks`
//! library (Python), and Shopify's documented recipe (it publishes no signing library).
//! The forwarding test runs the whole path: ingest, relay, broker, worker, a receiver.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{TestApp, eventually, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::json;

const PROVIDERS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/providers");

fn run_signer(mut cmd: Command, body: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("signer starts (node/python3 installed by deploy/local/test.sh)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("signer");
    assert!(out.status.success(), "signer failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Signs with the provider's own library (node, tests/providers/sign.mjs).
fn node_sign(provider: &str, secret: &str, body: &str, timestamp: Option<i64>) -> String {
    let mut cmd = Command::new("node");
    cmd.arg(format!("{PROVIDERS_DIR}/sign.mjs"))
        .arg(provider)
        .arg(secret);
    if let Some(t) = timestamp {
        cmd.arg(t.to_string());
    }
    run_signer(cmd, body)
}

/// Signs with the official Standard Webhooks library (python).
fn standard_sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg(format!("{PROVIDERS_DIR}/sign_standard.py"))
        .arg(secret)
        .arg(id)
        .arg(timestamp.to_string());
    run_signer(cmd, body)
}

async fn source(app: &TestApp, key: &str, provider: &str, secret: &str) -> String {
    let r = app
        .call(
            Method::POST,
            "/v1/sources",
            Some(key),
            Some(json!({"provider": provider, "secret": secret, "name": provider})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert!(
        r.body.get("secret").is_none(),
        "the secret is never returned"
    );
    r.body["id"].as_str().expect("id").to_owned()
}

async fn destination(app: &TestApp, key: &str, source: &str, url: &str) -> (String, String) {
    let r = app
        .call(
            Method::POST,
            &format!("/v1/sources/{source}/destinations"),
            Some(key),
            Some(json!({"url": url, "timeout_ms": 5000})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    (
        r.body["id"].as_str().expect("id").to_owned(),
        r.body["secret"].as_str().expect("secret").to_owned(),
    )
}

async fn post_in(
    app: &TestApp,
    source: &str,
    headers: &[(&str, String)],
    body: &str,
) -> crate::support::Reply {
    let mut req = app
        .client
        .post(format!("{}/in/{source}", app.base))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    TestApp::reply(req.send().await.expect("request")).await
}

async fn incoming_events(app: &TestApp, source: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE source_id = $1")
        .bind(source)
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test]
async fn github_signed_webhooks_are_accepted_once_and_bad_ones_store_nothing() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let secret = "It's a Secret to Everybody";
    let src = source(&app, &key, "github", secret).await;
    let body = r#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let sig = node_sign("github", secret, body, None);
    let headers = vec![
        ("x-hub-signature-256", sig.clone()),
        ("x-github-event", "ping".to_owned()),
        (
            "x-github-delivery",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned(),
        ),
    ];
    let first = post_in(&app, &src, &headers, body).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    assert_eq!(first.body["created"], json!(true));
    // GitHub's "Redeliver": same X-GitHub-Delivery ⇒ 200, nothing new.
    let again = post_in(&app, &src, &headers, body).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["created"], json!(false));
    assert_eq!(again.body["event_id"], first.body["event_id"]);
    assert_eq!(incoming_events(&app, &src).await, 1);

    let event: (String, Vec<u8>) =
        sqlx::query_as("SELECT event_type, raw_body FROM events WHERE source_id = $1")
            .bind(&src)
            .fetch_one(&app.pool)
            .await
            .expect("event");
    assert_eq!(event.0, "github.ping");
    assert_eq!(event.1, body.as_bytes(), "the body is kept byte for byte");

    // Tampered body, wrong secret, missing header: 401 problem+json, nothing stored.
    let tampered = body.replace("awesome", "awful");
    let other = node_sign("github", "another secret", body, None);
    for (hs, b) in [
        (headers.clone(), tampered.as_str()),
        (
            vec![
                ("x-hub-signature-256", other),
                ("x-github-delivery", "d2".into()),
            ],
            body,
        ),
        (vec![("x-github-delivery", "d3".to_owned())], body),
    ] {
        let r = post_in(&app, &src, &hs, b).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{:?}", r.body);
        assert_eq!(r.code(), "invalid_signature");
        assert_eq!(r.content_type, "application/problem+json");
    }
    assert_eq!(incoming_events(&app, &src).await, 1);
    let metrics = app.metrics().await;
    assert!(
        metrics
            .contains(r#"railhook_incoming_rejected_total{provider="github",reason="mismatch"} 2"#)
    );
    assert!(
        metrics
            .contains(r#"railhook_incoming_rejected_total{provider="github",reason="missing"} 1"#)
    );
}

#[tokio::test]
async fn stripe_signatures_are_checked_with_the_five_minute_tolerance() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let secret = "whsec_test_secret_for_railhook";
    let src = source(&app, &key, "stripe", secret).await;
    let body = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"invoice.paid"}"#;

    let fresh = node_sign("stripe", secret, body, None);
    let ok = post_in(&app, &src, &[("stripe-signature", fresh.clone())], body).await;
    assert_eq!(ok.status, StatusCode::ACCEPTED, "{:?}", ok.body);
    // Stripe retries the same evt_… ⇒ deduplicated on the id in the body.
    let resend = node_sign("stripe", secret, body, None);
    let dup = post_in(&app, &src, &[("stripe-signature", resend)], body).await;
    assert_eq!(dup.status, StatusCode::OK);

    let stale_body = r#"{"id":"evt_stale","type":"invoice.paid"}"#;
    let stale = node_sign("stripe", secret, stale_body, Some(now() - 360));
    let r = post_in(&app, &src, &[("stripe-signature", stale)], stale_body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let future = node_sign("stripe", secret, stale_body, Some(now() + 360));
    let r = post_in(&app, &src, &[("stripe-signature", future)], stale_body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let malformed = post_in(&app, &src, &[("stripe-signature", "garbage".into())], body).await;
    assert_eq!(malformed.status, StatusCode::UNAUTHORIZED);

    assert_eq!(incoming_events(&app, &src).await, 1);
    let event_type: String =
        sqlx::query_scalar("SELECT event_type FROM events WHERE source_id = $1")
            .bind(&src)
            .fetch_one(&app.pool)
            .await
            .expect("type");
    assert_eq!(event_type, "stripe.invoice.paid");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"railhook_incoming_rejected_total{provider="stripe",reason="stale"} 2"#)
    );
}

#[tokio::test]
async fn shopify_and_standard_webhooks_verify_and_dedupe() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;

    let shop_secret = "shpss_0123456789abcdef";
    let shop = source(&app, &key, "shopify", shop_secret).await;
    let body = r#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let hmac = node_sign("shopify", shop_secret, body, None);
    let headers = vec![
        ("x-shopify-hmac-sha256", hmac),
        ("x-shopify-topic", "orders/create".to_owned()),
        (
            "x-shopify-webhook-id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".to_owned(),
        ),
    ];
    assert_eq!(
        post_in(&app, &shop, &headers, body).await.status,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        post_in(&app, &shop, &headers, body).await.status,
        StatusCode::OK
    );
    let mut bad = headers.clone();
    bad[0].1 = "AAAA".into();
    assert_eq!(
        post_in(&app, &shop, &bad, body).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(incoming_events(&app, &shop).await, 1);

    let std_secret = railhook_common::keygen::generate_signing_secret();
    let std_src = source(&app, &key, "standard", &std_secret).await;
    let body = r#"{"type":"user.created","data":{"id":1}}"#;
    let t = now();
    let sig = standard_sign(&std_secret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", t, body);
    let headers = vec![
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W".to_owned()),
        ("webhook-timestamp", t.to_string()),
        ("webhook-signature", sig),
    ];
    let r = post_in(&app, &std_src, &headers, body).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert_eq!(
        post_in(&app, &std_src, &headers, body).await.status,
        StatusCode::OK
    );
    let old = now() - 600;
    let stale = vec![
        ("webhook-id", "msg_old".to_owned()),
        ("webhook-timestamp", old.to_string()),
        (
            "webhook-signature",
            standard_sign(&std_secret, "msg_old", old, body),
        ),
    ];
    assert_eq!(
        post_in(&app, &std_src, &stale, body).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(incoming_events(&app, &std_src).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_resends_collide_on_the_provider_id() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let secret = "concurrent-secret";
    let src = source(&app, &key, "github", secret).await;
    let rx = Receiver::start(vec![], Behaviour::Status(200)).await;
    destination(&app, &key, &src, &rx.url).await;
    let body = r#"{"action":"opened"}"#;
    let sig = node_sign("github", secret, body, None);
    let headers = vec![
        ("x-hub-signature-256", sig),
        ("x-github-event", "issues".to_owned()),
        ("x-github-delivery", "same-delivery-id".to_owned()),
    ];
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (app_base, client, src, headers) = (
            app.base.clone(),
            app.client.clone(),
            src.clone(),
            headers.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut req = client.post(format!("{app_base}/in/{src}")).body(body);
            for (k, v) in &headers {
                req = req.header(*k, v);
            }
            req.send().await.expect("request").status()
        }));
    }
    let mut created = 0;
    for t in tasks {
        let status = t.await.expect("task");
        assert!(
            status == StatusCode::ACCEPTED || status == StatusCode::OK,
            "{status}"
        );
        created += usize::from(status == StatusCode::ACCEPTED);
    }
    assert_eq!(created, 1, "one resend created the Event");
    assert_eq!(incoming_events(&app, &src).await, 1);
    let (deliveries, outbox): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM deliveries d JOIN events e ON e.id = d.event_id WHERE e.source_id = $1),
                (SELECT count(*) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id
                   JOIN events e ON e.id = d.event_id WHERE e.source_id = $1)",
    )
    .bind(&src)
    .fetch_one(&app.pool)
    .await
    .expect("counts");
    assert_eq!((deliveries, outbox), (1, 1));
}

#[tokio::test]
async fn oversized_unknown_and_foreign_requests_are_refused_cleanly() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let src = source(&app, &key, "generic", "generic-secret").await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let r = post_in(&app, &src, &[], &huge).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.code(), "payload_too_large");
    let r = post_in(&app, "src_01arz3ndektsv4rrffq69g5fav", &[], "{}").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = post_in(&app, "not-an-id", &[], "{}").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(incoming_events(&app, &src).await, 0);
    // Bad source definitions.
    let bad = app
        .call(
            Method::POST,
            "/v1/sources",
            Some(&key),
            Some(json!({"provider": "paypal", "secret": "whatever-secret"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.body["field"], json!("provider"));
    let bad = app
        .call(
            Method::POST,
            "/v1/sources",
            Some(&key),
            Some(json!({"provider": "standard", "secret": "not-a-whsec-secret"})),
        )
        .await;
    assert_eq!(bad.body["field"], json!("secret"));
    // Another project cannot see the Source, nor subscribe a Destination to its Events.
    let (_, other_key) = app.project().await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/sources/{src}"),
            Some(&other_key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let rx = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (dest, _) = destination(&app, &key, &src, &rx.url).await;
    let r = app
        .call(
            Method::POST,
            "/v1/subscriptions",
            Some(&key),
            Some(json!({"endpoint_id": dest, "event_types": ["*"]})),
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a Destination takes no subscriptions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_verified_webhook_is_forwarded_byte_for_byte_and_signed_by_railhook() {
    let p = Pipeline::start(|s| s.retry_incoming_delays = "0.2".into()).await;
    let secret = "forwarding-secret";
    let src = source(&p.app, &p.key, "github", secret).await;
    let rx = Receiver::start(vec![Behaviour::Status(503)], Behaviour::Status(200)).await;
    let (dest, dest_secret) = destination(&p.app, &p.key, &src, &rx.url).await;
    // Odd spacing and key order on purpose: re-serialised JSON would not match.
    let body = "{ \"ref\" : \"refs/heads/main\",\"after\":\"abc\" }";
    let headers = vec![
        (
            "x-hub-signature-256",
            node_sign("github", secret, body, None),
        ),
        ("x-github-event", "push".to_owned()),
        ("x-github-delivery", "forward-1".to_owned()),
    ];
    let r = post_in(&p.app, &src, &headers, body).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let event_id = r.body["event_id"].as_str().expect("event").to_owned();
    // The first Attempt gets a 503 and is retried on the incoming ladder (set short here).
    eventually("forwarded", Duration::from_secs(90), || async {
        rx.requests()
            .iter()
            .any(|r| r.answered == Some(200))
            .then_some(())
    })
    .await;
    let got = rx
        .requests()
        .into_iter()
        .find(|r| r.answered == Some(200))
        .expect("the 200");
    assert_eq!(got.body, body, "the provider's body, byte for byte");
    assert_eq!(
        got.headers.get("x-github-event").map(String::as_str),
        Some("push")
    );
    assert_eq!(
        got.headers.get("x-github-delivery").map(String::as_str),
        Some("forward-1")
    );
    assert!(
        !got.headers.contains_key("x-hub-signature-256"),
        "not the provider's signature"
    );
    assert_eq!(got.headers.get("x-event-id"), Some(&event_id));
    assert_eq!(
        got.headers.get("x-event-type").map(String::as_str),
        Some("github.push")
    );
    // Railhook's own Standard Webhooks signature, with the Destination's secret.
    let verified = {
        let mut child = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/verify_signature.py"
            ))
            .arg(&dest_secret)
            .stdin(Stdio::piped())
            .spawn()
            .expect("python3");
        let input = json!({"headers": got.headers, "body": got.body}).to_string();
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write");
        child.wait().expect("wait").success()
    };
    assert!(verified, "the Destination verifies Railhook's signature");
    let d: (String, String, i32) = sqlx::query_as(
        "SELECT direction, status, attempt_count FROM deliveries WHERE endpoint_id = $1",
    )
    .bind(&dest)
    .fetch_one(&p.app.pool)
    .await
    .expect("delivery");
    assert_eq!(d, ("incoming".to_owned(), "SUCCEEDED".to_owned(), 2));
    p.stop().await;
}

#[tokio::test]
async fn an_incoming_receipt_can_be_expunged_raw_body_and_all() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let secret = "expunge secret";
    let src = source(&app, &key, "github", secret).await;
    destination(&app, &key, &src, "http://127.0.0.1:9/hook").await;
    let marker = "incoming-expunge-9c1d";
    let body = format!(r#"{{"zen":"{marker}","hook_id":2}}"#);
    let sig = node_sign("github", secret, &body, None);
    let headers = vec![
        ("x-hub-signature-256", sig),
        ("x-github-event", "ping".to_owned()),
        ("x-github-delivery", format!("{marker}-delivery")),
    ];
    let r = post_in(&app, &src, &headers, &body).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let event = r.body["event_id"].as_str().expect("event").to_owned();
    assert!(
        app.tables_containing(marker)
            .await
            .contains(&"events".to_owned())
    );

    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/events/{event}/payload"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["deliveries_failed"], json!(1));
    // The raw body (bytea) and the JSON payload are gone; the provider's delivery id is
    // metadata (the dedup key) and stays, so the scan looks for the body's own text.
    let left: Vec<String> = app.tables_containing(&format!("\"{marker}\"")).await;
    let body_text: (Option<Vec<u8>>, String) =
        sqlx::query_as("SELECT raw_body, payload::text FROM events WHERE id = $1")
            .bind(&event)
            .fetch_one(&app.pool)
            .await
            .expect("event");
    assert_eq!(body_text, (None, "null".to_owned()));
    assert!(left.is_empty(), "the body is still stored in {left:?}");
    // The provider's resend is still recognised as a duplicate (the metadata stayed).
    let again = post_in(&app, &src, &headers, &body).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.body["created"], json!(false));
}

/// Issue #53 finding 13: a provider's JSON holding `\u0000` (which `jsonb` cannot store) was
/// a 500 on every resend, so the provider retried it until it gave up. It is accepted like
/// any other body: forwarded byte for byte, its payload column holding the body as text.
#[tokio::test]
async fn a_webhook_holding_a_nul_escape_is_accepted_and_its_resend_is_a_duplicate() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let secret = "nul-secret";
    let src = source(&app, &key, "github", secret).await;
    let body = r#"{"action":"opened","title":"a\u0000b","id":"x\u0000y"}"#;
    let headers = vec![
        (
            "x-hub-signature-256",
            node_sign("github", secret, body, None),
        ),
        ("x-github-event", "issues".to_owned()),
        ("x-github-delivery", "nul-1".to_owned()),
    ];
    let first = post_in(&app, &src, &headers, body).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    let event = first.body["event_id"].as_str().expect("event").to_owned();
    let again = post_in(&app, &src, &headers, body).await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "a duplicate: {:?}",
        again.body
    );
    assert_eq!(again.body["event_id"], json!(event));
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw_body FROM events WHERE id = $1")
        .bind(&event)
        .fetch_one(&app.pool)
        .await
        .expect("raw body");
    assert_eq!(raw, body.as_bytes(), "kept byte for byte, to forward");
    assert_eq!(incoming_events(&app, &src).await, 1);
}
