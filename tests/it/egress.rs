//! Egress a security review accepts (issue #40, docs/EGRESS.md), against real servers
//! (support/egress.rs): mutual TLS to a receiver behind stunnel that requires a client
//! certificate, directly and through Debian's tinyproxy as the egress proxy; OAuth2 client
//! credentials against oauth2-mock-server with a receiver that accepts only its tokens
//! (caching, expiry, a receiver's 401, a revoked client, the provider down).
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use reqwest::{Method, StatusCode};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::support::egress::{MutualTls, OAuth2, Tinyproxy, client_certificate, tls_dir};
use crate::support::eventually;
use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};

const WAIT: Duration = Duration::from_secs(60);

async fn call(p: &Pipeline, method: Method, path: &str, body: Value) -> crate::support::Reply {
    p.app.call(method, path, Some(&p.key), Some(body)).await
}

/// Error classes of the Attempts of `delivery`, in order.
async fn attempt_errors(p: &Pipeline, delivery: &str) -> Vec<(Option<i32>, Option<String>)> {
    sqlx::query_as(
        "SELECT status_code, error_class FROM attempts WHERE delivery_id = $1
         ORDER BY attempt_number",
    )
    .bind(delivery)
    .fetch_all(&p.app.pool)
    .await
    .expect("attempts")
}

/// Creates an endpoint from `body`, subscribed to everything, with a patient ladder.
async fn endpoint(p: &Pipeline, mut body: Value) -> String {
    body["retry_delays_seconds"] = json!([0.5]);
    body["max_attempts"] = json!(50);
    let r = call(p, Method::POST, "/v1/endpoints", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &id, &["*"], false).await;
    id
}

/// Without a certificate the receiver's TLS refuses the handshake; with one it accepts;
/// removed, it refuses again. The key is never returned.
async fn mutual_tls(p: &Pipeline, receiver: &Receiver, server: &MutualTls) {
    let (certificate, key) = client_certificate();
    // Refused at the API: a key that is not the certificate's, and on a broker endpoint.
    let (_, other_key) = {
        let tls = tls_dir();
        (
            (),
            std::fs::read_to_string(tls.join("server.key")).expect("server.key"),
        )
    };
    for (body, field) in [
        (
            json!({"url": server.url(), "client_certificate":
                   {"certificate_pem": certificate, "private_key_pem": other_key}}),
            "client_certificate.private_key_pem",
        ),
        (
            json!({"url": server.url(), "client_certificate":
                   {"certificate_pem": "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----", "private_key_pem": key}}),
            "client_certificate.certificate_pem",
        ),
        (
            json!({"type": "nats", "nats": {"url": "nats://h:4222", "subject": "a"},
                   "client_certificate": {"certificate_pem": certificate, "private_key_pem": key}}),
            "client_certificate",
        ),
    ] {
        let r = call(p, Method::POST, "/v1/endpoints", body).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
        assert!(!r.body.to_string().contains("PRIVATE KEY"));
    }

    // No certificate: the handshake fails, the Delivery retries, nothing arrives.
    let id = endpoint(p, json!({"url": server.url()})).await;
    let first = p.send_to("order.paid", &id).await;
    eventually("a refused handshake", WAIT, || async {
        (attempt_errors(p, &first).await.len() >= 2).then_some(())
    })
    .await;
    assert_eq!(receiver.count(), 0, "nothing passes without a certificate");

    // With the certificate: the waiting Delivery and a new one arrive.
    let r = call(
        p,
        Method::PATCH,
        &format!("/v1/endpoints/{id}"),
        json!({"client_certificate": {"certificate_pem": certificate, "private_key_pem": key}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        r.body["client_certificate"]["certificate_pem"],
        json!(certificate)
    );
    assert!(!r.body.to_string().contains("PRIVATE KEY"));
    let second = p.send_to("order.paid", &id).await;
    p.wait_status(&first, "SUCCEEDED", WAIT).await;
    p.wait_status(&second, "SUCCEEDED", WAIT).await;
    let shown = call(p, Method::GET, &format!("/v1/endpoints/{id}"), json!(null)).await;
    assert!(!shown.body.to_string().contains("PRIVATE KEY"));

    // A PATCH that sends the certificate back without the key keeps the key.
    let r = call(
        p,
        Method::PATCH,
        &format!("/v1/endpoints/{id}"),
        json!({"client_certificate": {"certificate_pem": certificate}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let third = p.send_to("order.paid", &id).await;
    p.wait_status(&third, "SUCCEEDED", WAIT).await;

    // Removed: refused again.
    let r = call(
        p,
        Method::PATCH,
        &format!("/v1/endpoints/{id}"),
        json!({"client_certificate": null}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["client_certificate"], Value::Null);
    let delivered = receiver.count();
    let fourth = p.send_to("order.paid", &id).await;
    eventually("a refused handshake again", WAIT, || async {
        (!attempt_errors(p, &fourth).await.is_empty()).then_some(())
    })
    .await;
    let errors = attempt_errors(p, &fourth).await;
    assert!(
        errors.iter().all(|(status, _)| status.is_none()),
        "{errors:?}"
    );
    assert_eq!(receiver.count(), delivered);
}

fn tls_settings(s: &mut railhook_common::config::Settings) {
    s.egress_ca_file = Some(tls_dir().join("ca.pem"));
    s.allow_private_targets = "127.0.0.0/8,::1/128".into();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_opens_a_receiver_that_requires_one() {
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let server = MutualTls::start(receiver.port());
    let p = Pipeline::start(tls_settings).await;
    mutual_tls(&p, &receiver, &server).await;
}

/// Through the egress proxy: every Attempt is a CONNECT to the checked address (never the
/// name), TLS and the client certificate run inside the tunnel to the endpoint's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_leave_through_the_egress_proxy_to_checked_addresses() {
    let proxy = Tinyproxy::start();
    let plain = Receiver::start(vec![], Behaviour::Status(200)).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let server = MutualTls::start(receiver.port());
    let url = proxy.url();
    let p = Pipeline::start(move |s| {
        tls_settings(s);
        s.egress_proxy = Some(SecretString::from(url));
    })
    .await;

    // Plain HTTP, by name: tunnelled to the address the guard checked.
    let port = plain.port();
    endpoint(&p, json!({"url": format!("http://localhost:{port}/plain")})).await;
    let (_, d) = p.send(json!({"n": 0})).await;
    p.wait_status(&d, "SUCCEEDED", WAIT).await;
    assert_eq!(plain.count(), 1);
    let connects = proxy.connects();
    assert!(
        connects.contains(&format!("127.0.0.1:{port}")),
        "{connects:?}"
    );
    assert!(
        connects.iter().all(|c| !c.starts_with("localhost")),
        "the proxy was asked for a name: {connects:?}"
    );
    // The plain endpoint hears every Event from here on; mutual TLS through the tunnel.
    mutual_tls(&p, &receiver, &server).await;
    assert!(
        proxy
            .connects()
            .contains(&format!("127.0.0.1:{}", server.port)),
        "{:?}",
        proxy.connects()
    );
}

/// With the proxy set and no private range allowed, every SSRF case is refused before the
/// proxy is asked for anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_holds_with_the_egress_proxy() {
    let proxy = Tinyproxy::start();
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let url = proxy.url();
    let p = Pipeline::start(move |s| {
        s.allow_private_targets = String::new();
        s.egress_proxy = Some(SecretString::from(url));
    })
    .await;
    let port = receiver.port();
    for target in [
        format!("http://localhost:{port}/"),
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://0x7f000001:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://[::1]/".to_owned(),
    ] {
        let r = call(&p, Method::POST, "/v1/endpoints", json!({"url": target})).await;
        if r.status == StatusCode::UNPROCESSABLE_ENTITY {
            continue; // refused at the API already
        }
        assert_eq!(r.status, StatusCode::CREATED, "{target}: {:?}", r.body);
        let id = r.body["id"].as_str().expect("id").to_owned();
        p.app.subscribe(&p.key, &id, &["*"], false).await;
        let delivery = p.send_to("order.paid", &id).await;
        let d = p.wait_status(&delivery, "FAILED", WAIT).await;
        assert!(d.to_string().contains("not allowed"), "{target}: {d}");
        call(
            &p,
            Method::DELETE,
            &format!("/v1/endpoints/{id}"),
            json!(null),
        )
        .await;
    }
    assert_eq!(receiver.count(), 0);
    assert!(
        proxy.connects().is_empty(),
        "the proxy was asked: {:?}",
        proxy.connects()
    );
}

fn statuses(oauth: &OAuth2) -> Vec<i64> {
    oauth
        .received()
        .iter()
        .filter_map(|l| l["status"].as_i64())
        .collect()
}

fn token_requests(oauth: &OAuth2) -> usize {
    oauth.token_requests().len()
}

/// Waits until the wall clock is past the second `not_before` names, so tokens fetched
/// from now on are issued after it.
async fn refuse_tokens_issued_until_now(oauth: &OAuth2) {
    let now = chrono::Utc::now().timestamp();
    oauth.set("not_before", &now.to_string());
    eventually("the next second", Duration::from_secs(5), || async {
        (chrono::Utc::now().timestamp() > now).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_tokens_are_fetched_cached_renewed_and_retried() {
    let mut oauth = OAuth2::start();
    oauth.set("ttl", "4");
    let p = Pipeline::start(|s| s.allow_private_targets = "127.0.0.0/8".into()).await;
    let auth = json!({"type": "oauth2_client_credentials", "token_url": oauth.token_url(),
                      "client_id": "railhook", "client_secret": "s3cret-oauth-5c2e",
                      "scope": "webhooks", "audience": "https://receiver.example"});
    // Refused at the API, each naming its field.
    for (body, field) in [
        (
            json!({"url": oauth.receiver_url(), "authentication":
                   {"type": "oauth2_client_credentials", "token_url": "ftp://x/token",
                    "client_id": "a", "client_secret": "b"}}),
            "authentication.token_url",
        ),
        (
            json!({"url": oauth.receiver_url(), "authentication":
                   {"type": "oauth2_client_credentials", "token_url": oauth.token_url(),
                    "client_id": "a"}}),
            "authentication.client_secret",
        ),
    ] {
        let r = call(&p, Method::POST, "/v1/endpoints", body).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
    }
    let id = endpoint(
        &p,
        json!({"url": oauth.receiver_url(), "authentication": auth}),
    )
    .await;
    let shown = call(&p, Method::GET, &format!("/v1/endpoints/{id}"), json!(null)).await;
    assert_eq!(shown.body["authentication"]["client_id"], "railhook");
    assert!(!shown.body.to_string().contains("s3cret-oauth"));

    // Three Events, one token.
    let mut deliveries = Vec::new();
    for n in 0..3 {
        deliveries.push(p.send(json!({"n": n})).await.1);
    }
    for d in &deliveries {
        p.wait_status(d, "SUCCEEDED", WAIT).await;
    }
    assert_eq!(token_requests(&oauth), 1, "{:?}", oauth.token_requests());
    let first = &oauth.token_requests()[0];
    assert_eq!(first["scope"], "webhooks");
    assert_eq!(first["audience"], "https://receiver.example");
    assert_eq!(first["grant_type"], "client_credentials");
    assert!(statuses(&oauth).iter().all(|s| *s == 200));

    // Expiry: after the token's life a new one is fetched before sending, no 401 seen.
    let issued = std::time::Instant::now();
    eventually("the token's life", Duration::from_secs(10), || async {
        (issued.elapsed() > Duration::from_secs(4)).then_some(())
    })
    .await;
    let (_, d) = p.send(json!({"n": "after expiry"})).await;
    p.wait_status(&d, "SUCCEEDED", WAIT).await;
    assert_eq!(token_requests(&oauth), 2);
    assert!(statuses(&oauth).iter().all(|s| *s == 200));
    oauth.set("ttl", "3600");

    // The receiver refuses the token: one new token, one more request, in one Attempt.
    refuse_tokens_issued_until_now(&oauth).await;
    let (_, d) = p.send(json!({"n": "revoked token"})).await;
    p.wait_status(&d, "SUCCEEDED", WAIT).await;
    assert_eq!(attempt_errors(&p, &d).await, vec![(Some(200), None)]);
    assert_eq!(token_requests(&oauth), 3);
    assert_eq!(statuses(&oauth).iter().filter(|s| **s == 401).count(), 1);

    // A revoked client: oauth_token_refused, retried; restored, delivered.
    oauth.set("revoked", "railhook");
    refuse_tokens_issued_until_now(&oauth).await;
    let (_, d) = p.send(json!({"n": "revoked client"})).await;
    eventually("oauth_token_refused", WAIT, || async {
        attempt_errors(&p, &d)
            .await
            .iter()
            .any(|(_, e)| e.as_deref() == Some("oauth_token_refused"))
            .then_some(())
    })
    .await;
    let attempt = sqlx::query_scalar::<_, Option<String>>(
        "SELECT response_excerpt FROM attempts WHERE delivery_id = $1 AND error_class = 'oauth_token_refused' LIMIT 1",
    )
    .bind(&d)
    .fetch_one(&p.app.pool)
    .await
    .expect("excerpt");
    assert!(
        attempt.as_deref().unwrap_or("").contains("invalid_client"),
        "{attempt:?}"
    );
    oauth.clear("revoked");
    p.wait_status(&d, "SUCCEEDED", WAIT).await;

    // The provider down: oauth_token_unavailable, retried; back, delivered.
    oauth.stop_issuer();
    refuse_tokens_issued_until_now(&oauth).await;
    let (_, d) = p.send(json!({"n": "provider down"})).await;
    eventually("oauth_token_unavailable", WAIT, || async {
        attempt_errors(&p, &d)
            .await
            .iter()
            .any(|(_, e)| e.as_deref() == Some("oauth_token_unavailable"))
            .then_some(())
    })
    .await;
    oauth.restart_issuer();
    p.wait_status(&d, "SUCCEEDED", WAIT).await;

    // Every Event reached the receiver with a valid token exactly once.
    let ok: Vec<String> = oauth
        .received()
        .iter()
        .filter(|l| l["status"] == 200)
        .filter_map(|l| l["webhook_id"].as_str().map(str::to_owned))
        .collect();
    let mut unique = ok.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((ok.len(), unique.len()), (7, 7), "{:?}", oauth.received());
}

/// The Svix surface's Railhook calls read, set and remove an endpoint's authentication and
/// client certificate, never returning a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_on_the_svix_surface_are_write_only() {
    let p = Pipeline::start(|_| {}).await;
    let app = call(
        &p,
        Method::POST,
        "/api/v1/app",
        json!({"name": "Acme", "uid": "acme"}),
    )
    .await;
    assert_eq!(app.status, StatusCode::CREATED, "{:?}", app.body);
    let ep = call(
        &p,
        Method::POST,
        "/api/v1/app/acme/endpoint",
        json!({"url": "https://hooks.example.com/acme"}),
    )
    .await;
    assert_eq!(ep.status, StatusCode::CREATED, "{:?}", ep.body);
    let base = format!(
        "/api/v1/app/acme/endpoint/{}",
        ep.body["id"].as_str().expect("id")
    );
    let auth = format!("{base}/authentication");
    let r = call(&p, Method::GET, &auth, json!(null)).await;
    assert_eq!(r.body, json!({"authentication": null}));
    let r = call(
        &p,
        Method::PUT,
        &auth,
        json!({"type": "oauth2_client_credentials", "token_url": "https://idp.example.com/token",
               "client_id": "acme", "client_secret": "s3cret-svix-91"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    let r = call(&p, Method::GET, &auth, json!(null)).await;
    assert_eq!(r.body["authentication"]["client_id"], "acme");
    assert!(!r.body.to_string().contains("s3cret-svix"));
    let r = call(
        &p,
        Method::PUT,
        &auth,
        json!({"type": "basic", "username": "a:b", "password": "p"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);

    let (certificate, key) = client_certificate();
    let cert = format!("{base}/client-certificate");
    let r = call(
        &p,
        Method::PUT,
        &cert,
        json!({"certificate_pem": certificate, "private_key_pem": key}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    let r = call(&p, Method::GET, &cert, json!(null)).await;
    assert_eq!(
        r.body["client_certificate"]["certificate_pem"],
        json!(certificate)
    );
    assert!(!r.body.to_string().contains("PRIVATE KEY"));
    let native = call(
        &p,
        Method::GET,
        &format!("/v1/endpoints/{}", ep.body["id"].as_str().expect("id")),
        json!(null),
    )
    .await;
    assert_eq!(
        native.body["authentication"]["type"],
        "oauth2_client_credentials"
    );
    assert!(native.body["client_certificate"].is_object());

    for path in [&auth, &cert] {
        let r = call(&p, Method::DELETE, path, json!(null)).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    }
    let r = call(&p, Method::GET, &cert, json!(null)).await;
    assert_eq!(r.body, json!({"client_certificate": null}));
    let r = call(&p, Method::GET, &auth, json!(null)).await;
    assert_eq!(r.body, json!({"authentication": null}));
}
