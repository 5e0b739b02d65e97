//! Secrets never reach a log line or an error body. The real binary (`railhook all`, debug
//! logging, JSON lines) runs a whole story — tenants, endpoints with signing secrets, a
//! Source with a provider secret, Events delivered and retried, wrong keys, bad signatures,
//! dashboard sign-ins — and then every byte it logged and every error body it sent is
//! searched for each secret.

use std::process::Stdio;
use std::time::Duration;

use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{eventually, free_port, fresh_database, local_setting};
use reqwest::StatusCode;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-7c1e0b9f4a2d48e6b3";
const DB_PASSWORD: &str = "db-pass-51f0c2a9e8";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_an_error_body() {
    let db = fresh_database().await;
    // The local cluster trusts loopback, so a password in the URL is accepted and ignored:
    // enough to see whether the URL ever gets printed.
    let db_with_password = db.replacen("://railhook@", &format!("://railhook:{DB_PASSWORD}@"), 1);
    let unique = ulid::Ulid::new().to_string().to_lowercase();
    let http = format!("127.0.0.1:{}", free_port());
    let api = format!("http://{http}");
    let log_path = std::env::temp_dir().join(format!("rh-secrets-{unique}.log"));
    let log = std::fs::File::create(&log_path).expect("log file");
    let env = [
        ("DATABASE_URL", db_with_password.as_str()),
        ("KAFKA_BROKERS", &local_setting("KAFKA_BROKERS")),
        ("REDIS_URL", &local_setting("REDIS_URL")),
        ("RAILHOOK_ADMIN_TOKEN", ADMIN),
        ("RAILHOOK_HTTP_ADDR", &http),
        (
            "RAILHOOK_METRICS_ADDR",
            &format!("127.0.0.1:{}", free_port()),
        ),
        ("RAILHOOK_SLOT", &format!("rh_sec_{unique}")),
        ("RAILHOOK_TOPIC_PREFIX", &format!("sec{unique}.")),
        ("RAILHOOK_WORKER_GROUP", &format!("sec{unique}")),
        ("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8"),
        ("RAILHOOK_RETRY_OUTGOING_DELAYS", "0.2"),
        ("RAILHOOK_RETRY_OVERLOAD_FLOOR_MS", "0"),
        ("RAILHOOK_LOG_FORMAT", "json"),
        ("RAILHOOK_DASHBOARD_COOKIE_SECURE", "false"),
        ("RUST_LOG", "debug"),
    ];
    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("migrate")
        .envs(env)
        .stdout(log.try_clone().expect("log"))
        .stderr(log.try_clone().expect("log"))
        .status()
        .expect("railhook migrate");
    assert!(
        migrate.success(),
        "{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("all")
        .envs(env)
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("railhook all");

    let client = reqwest::Client::new();
    let mut errors: Vec<String> = Vec::new();
    eventually("the API answers", Duration::from_secs(30), || async {
        client
            .get(format!("{api}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let call = |method: reqwest::Method, path: &str, token: Option<&str>, body: Option<Value>| {
        let mut req = client.request(method, format!("{api}{path}"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.expect("request");
            (r.status(), r.text().await.expect("body"))
        }
    };
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;
    let (_, org) = call(
        post.clone(),
        "/v1/organizations",
        Some(ADMIN),
        Some(json!({"name": "s", "monthly_quota": 1000})),
    )
    .await;
    let org: Value = serde_json::from_str(&org).expect("org");
    let (_, project) = call(
        post.clone(),
        "/v1/projects",
        Some(ADMIN),
        Some(json!({"organization_id": org["id"], "name": "s"})),
    )
    .await;
    let project: Value = serde_json::from_str(&project).expect("project");
    let key = project["api_key"].as_str().expect("key").to_owned();
    let receiver = Receiver::start(
        vec![Behaviour::Status(500), Behaviour::Status(401)],
        Behaviour::Status(200),
    )
    .await;
    let (_, ep) = call(post.clone(), "/v1/endpoints", Some(&key), Some(json!({"url": receiver.url, "headers": {"Authorization": "Bearer receiver-token-9d3e"}}))).await;
    let ep: Value = serde_json::from_str(&ep).expect("endpoint");
    let secret = ep["secret"].as_str().expect("secret").to_owned();
    call(
        post.clone(),
        "/v1/subscriptions",
        Some(&key),
        Some(json!({"endpoint_id": ep["id"], "event_types": ["*"]})),
    )
    .await;
    let (_, rotated) = call(
        post.clone(),
        &format!(
            "/v1/endpoints/{}/secret/rotate",
            ep["id"].as_str().expect("id")
        ),
        Some(&key),
        None,
    )
    .await;
    let rotated: Value = serde_json::from_str(&rotated).expect("rotated");
    let new_secret = rotated["key"].as_str().expect("new secret").to_owned();
    let source_secret = "whsec_c291cmNlLXNlY3JldC0xMjM0NTY3ODkw";
    let (_, src) = call(
        post.clone(),
        "/v1/sources",
        Some(&key),
        Some(json!({"provider": "standard", "secret": source_secret})),
    )
    .await;
    let src: Value = serde_json::from_str(&src).expect("source");

    for n in 0..3 {
        let (status, _) = call(
            post.clone(),
            "/v1/events",
            Some(&key),
            Some(json!({"type": "order.paid", "payload": {"n": n}})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    // Every way to be refused, collecting the bodies.
    let refusals = [
        call(get.clone(), "/v1/endpoints", Some(&format!("{key}x")), None).await,
        call(get.clone(), "/v1/endpoints", Some(ADMIN), None).await,
        call(
            post.clone(),
            "/v1/organizations",
            Some(&key),
            Some(json!({"name": "x", "monthly_quota": 1})),
        )
        .await,
        call(
            post.clone(),
            "/v1/events",
            Some(&key),
            Some(json!({"type": "bad..type", "payload": {}})),
        )
        .await,
        call(
            post.clone(),
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": format!("https://user:{secret}@example.com/")})),
        )
        .await,
        call(
            post.clone(),
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": "https://example.com/", "headers": {"webhook-signature": secret}})),
        )
        .await,
        call(get.clone(), "/v1/events?cursor=!!!", Some(&key), None).await,
    ];
    for (status, body) in refusals {
        assert!(status.is_client_error(), "{status} {body}");
        errors.push(body);
    }
    let forged = client
        .post(format!(
            "{api}/in/{}",
            src["id"].as_str().expect("source id")
        ))
        .header("webhook-id", "msg_1")
        .header(
            "webhook-timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("webhook-signature", format!("v1,{}", "A".repeat(44)))
        .body("{}")
        .send()
        .await
        .expect("incoming");
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    errors.push(forged.text().await.expect("body"));
    let form = client
        .get(format!("{api}/dashboard/login"))
        .send()
        .await
        .expect("login form");
    let login_cookie = form.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let form = form.text().await.expect("form");
    let at = form.find("name=\"csrf\" value=\"").expect("csrf field") + 19;
    let token = form[at..].split('"').next().expect("token").to_owned();
    let login = client
        .post(format!("{api}/dashboard/login"))
        .header("cookie", login_cookie)
        .form(&[("api_key", format!("{key}-typo")), ("csrf", token)])
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), StatusCode::UNAUTHORIZED);
    errors.push(login.text().await.expect("body"));

    // The three Events arrive (one after a 500 and a 401 retried... the 401 is final).
    eventually(
        "deliveries were attempted",
        Duration::from_secs(30),
        || async { (receiver.count() >= 4).then_some(()) },
    )
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;

    let logged = std::fs::read_to_string(&log_path).expect("log");
    let _ = std::fs::remove_file(&log_path);
    assert!(logged.lines().count() > 20, "the binary logged: {logged}");
    assert!(
        logged.contains("\"request_id\""),
        "request spans are logged"
    );
    let secret_body = secret.trim_start_matches("whsec_");
    let new_body = new_secret.trim_start_matches("whsec_");
    let hidden: [(&str, &str); 9] = [
        ("the API key", &key),
        (
            "the API key's secret part",
            key.rsplit('_').next().unwrap_or(&key),
        ),
        ("the admin token", ADMIN),
        ("the signing secret", secret_body),
        ("the rotated signing secret", new_body),
        (
            "the Source secret",
            source_secret.trim_start_matches("whsec_"),
        ),
        ("the database password", DB_PASSWORD),
        ("an endpoint's custom header value", "receiver-token-9d3e"),
        ("the typed dashboard key", &format!("{key}-typo")),
    ];
    for (what, value) in hidden {
        assert!(value.len() >= 12, "{what} is too short to search for");
        assert!(!logged.contains(value), "{what} is in the log");
        for body in &errors {
            assert!(!body.contains(value), "{what} is in an error body: {body}");
        }
    }
}

const KEY_A: &str = "5b0c8e1f2a3d4c5b6a7980f1e2d3c4b5a69788f9e0d1c2b3a4958677e8f9a0b1";
const KEY_B: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const ADMIN_OLD: &str = "admin-token-old-2b7d91c4e05f";

/// The database as `pg_dump` writes it, data only.
fn dump(database_url: &str) -> String {
    let out = std::process::Command::new("pg_dump")
        .args(["--data-only", database_url])
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `railhook secrets rotate-key` with `keys`; returns its output.
fn rotate_key(env: &[(&str, String)], keys: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .args(["secrets", "rotate-key"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RAILHOOK_ENCRYPTION_KEYS", keys)
        .output()
        .expect("railhook secrets rotate-key");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_at_rest_still_sign_and_the_key_rotates() {
    let db = fresh_database().await;
    let unique = ulid::Ulid::new().to_string().to_lowercase();
    let http = format!("127.0.0.1:{}", free_port());
    let api = format!("http://{http}");
    let env: Vec<(&str, String)> = vec![
        ("DATABASE_URL", db.clone()),
        ("KAFKA_BROKERS", local_setting("KAFKA_BROKERS")),
        ("REDIS_URL", local_setting("REDIS_URL")),
        ("RAILHOOK_ADMIN_TOKEN", ADMIN.to_owned()),
        ("RAILHOOK_ADMIN_TOKEN_PREVIOUS", ADMIN_OLD.to_owned()),
        ("RAILHOOK_HTTP_ADDR", http.clone()),
        (
            "RAILHOOK_METRICS_ADDR",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("RAILHOOK_SLOT", format!("rh_seal_{unique}")),
        ("RAILHOOK_TOPIC_PREFIX", format!("seal{unique}.")),
        ("RAILHOOK_WORKER_GROUP", format!("seal{unique}")),
        ("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8".to_owned()),
    ];
    let with_key = |keys: &str| {
        let mut e = env.clone();
        e.push(("RAILHOOK_ENCRYPTION_KEYS", keys.to_owned()));
        e
    };
    let started = with_key(KEY_A);
    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("migrate")
        .envs(started.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("railhook migrate");
    assert!(migrate.status.success(), "{migrate:?}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("all")
        .envs(started.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("railhook all");
    let client = reqwest::Client::new();
    eventually("the API answers", Duration::from_secs(30), || async {
        client
            .get(format!("{api}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let call = |token: &str, path: &str, body: Option<Value>| {
        let req = match body {
            Some(b) => client.post(format!("{api}{path}")).json(&b),
            None => client.get(format!("{api}{path}")),
        };
        let req = req.bearer_auth(token);
        async move {
            let r = req.send().await.expect("request");
            let status = r.status();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Both admin tokens work during the admin token's rotation; another does not.
    let (status, org) = call(
        ADMIN_OLD,
        "/v1/organizations",
        Some(json!({"name": "s", "monthly_quota": 1000})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{org}");
    let (status, project) = call(
        ADMIN,
        "/v1/projects",
        Some(json!({"organization_id": org["id"], "name": "s"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{project}");
    let (status, _) = call(
        "admin-token-neither-9f8e7d6c",
        "/v1/organizations",
        Some(json!({"name": "x", "monthly_quota": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let key = project["api_key"].as_str().expect("key").to_owned();

    let receiver = Receiver::start(Vec::new(), Behaviour::Status(204)).await;
    // A receiver's credential in a custom header (review #34 item 4): sealed at rest too.
    // A client certificate's key (mutual TLS): one line of it must never be in the dump.
    let tls = std::path::PathBuf::from(crate::support::local_setting("RAILHOOK_TLS_DIR"));
    let client_pem = std::fs::read_to_string(tls.join("client.pem")).expect("client.pem");
    let client_key = std::fs::read_to_string(tls.join("client.key")).expect("client.key");
    let key_line = client_key.lines().nth(2).expect("a key line").to_owned();
    let credential = "Bearer receiver-credential-6f1d0a93c2";
    let (_, hmac) = call(
        &key,
        "/v1/endpoints",
        Some(json!({"url": receiver.url, "headers": {"Authorization": credential}})),
    )
    .await;
    assert_eq!(hmac["headers"]["Authorization"], credential, "{hmac}");
    let (_, ed) = call(
        &key,
        "/v1/endpoints",
        Some(json!({"url": receiver.url, "signing": "ed25519",
                    "authentication": {"type": "basic", "username": "railhook",
                                       "password": "basic-password-5e2a"},
                    "client_certificate": {"certificate_pem": client_pem,
                                           "private_key_pem": client_key}})),
    )
    .await;
    assert!(!ed.to_string().contains(key_line.as_str()), "{ed}");
    assert_eq!(
        ed["signing"], "ed25519",
        "the scheme is read from the sealed secret"
    );
    assert!(
        ed["public_key"]
            .as_str()
            .is_some_and(|k| k.starts_with("whpk_"))
    );
    // A broker endpoint's credentials (docs/DESTINATIONS.md): its whole settings sealed.
    let (status, broker) = call(
        &key,
        "/v1/endpoints",
        Some(json!({"type": "nats", "nats": {
            "url": "nats://app:broker-password-3c9e1b@127.0.0.1:4222", "subject": "hooks"}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{broker}");
    assert!(
        !broker.to_string().contains("broker-password-3c9e1b"),
        "{broker}"
    );
    let source_secret = "whsec_c2VhbGVkLXNvdXJjZS1zZWNyZXQtMDk4Nw==";
    let (_, src) = call(
        &key,
        "/v1/sources",
        Some(json!({"provider": "standard", "secret": source_secret})),
    )
    .await;
    let (status, _) = call(
        &key,
        "/v1/subscriptions",
        Some(json!({"endpoint_id": hmac["id"], "event_types": ["*"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let hmac_secret = hmac["secret"].as_str().expect("secret").to_owned();
    let ed_secret = ed["secret"].as_str().expect("secret").to_owned();
    // The API opens what it stored.
    let (_, read) = call(
        &key,
        &format!("/v1/endpoints/{}/secret", hmac["id"].as_str().expect("id")),
        None,
    )
    .await;
    assert_eq!(read["key"], hmac_secret.as_str());

    // A delivery is signed with the opened secret.
    let (status, _) = call(
        &key,
        "/v1/events",
        Some(json!({"type": "order.paid", "payload": {"n": 1}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    eventually("the webhook arrives", Duration::from_secs(30), || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    let got = receiver.requests().remove(0);
    let signing = railhook_common::signing::SigningKey::parse(&hmac_secret).expect("secret");
    let id = &got.headers["webhook-id"];
    let ts: i64 = got.headers["webhook-timestamp"].parse().expect("timestamp");
    assert!(
        got.headers["webhook-signature"].contains(&signing.sign(id, ts, got.body.as_bytes())),
        "signed with the endpoint's secret"
    );
    assert_eq!(
        got.headers.get("authorization").map(String::as_str),
        Some(credential),
        "the worker opened the header's sealed value"
    );
    // A provider webhook is verified with the opened Source secret.
    let body = r#"{"type":"invoice.paid"}"#;
    let now = chrono::Utc::now().timestamp();
    let provider_key = railhook_common::signing::SigningKey::parse(source_secret).expect("secret");
    let accepted = client
        .post(format!("{api}/in/{}", src["id"].as_str().expect("source")))
        .header("webhook-id", "msg_sealed_1")
        .header("webhook-timestamp", now.to_string())
        .header(
            "webhook-signature",
            provider_key.sign("msg_sealed_1", now, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .expect("incoming");
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let _ = child.start_kill();
    let _ = child.wait().await;

    // At rest: no secret in a dump of the database, only sealed values.
    let bodies = [
        hmac_secret.trim_start_matches("whsec_"),
        ed_secret.trim_start_matches("whsk_"),
        source_secret.trim_start_matches("whsec_"),
        "receiver-credential-6f1d0a93c2",
        "broker-password-3c9e1b",
        "basic-password-5e2a",
        key_line.as_str(),
    ];
    let before = dump(&db);
    for b in bodies {
        assert!(!before.contains(b), "a secret is in the dump");
    }
    let key_a = railhook_common::sealing::Keyring::parse(KEY_A).expect("key");
    let key_b = railhook_common::sealing::Keyring::parse(KEY_B).expect("key");
    let sealed_a = format!("rhenc1:{}:", key_a.sealing_key_id().expect("id"));
    let sealed_b = format!("rhenc1:{}:", key_b.sealing_key_id().expect("id"));
    assert_eq!(
        before.matches(&sealed_a).count(),
        8,
        "three endpoints' secrets, a header value, a broker's settings, an endpoint's \
         authentication and client certificate, and a Source, sealed"
    );

    // Rotation: B first, A still opens; every value moves to B.
    let out = rotate_key(&env, &format!("{KEY_B},{KEY_A}"));
    assert!(out.contains("endpoints: 3 rows sealed again"), "{out}");
    assert!(out.contains("sources: 1 rows sealed again"), "{out}");
    assert!(
        out.contains("endpoint headers: 1 rows sealed again"),
        "{out}"
    );
    assert!(
        out.contains("endpoint transport settings: 1 rows sealed again"),
        "{out}"
    );
    assert!(
        out.contains("endpoint authentication: 1 rows sealed again"),
        "{out}"
    );
    assert!(
        out.contains("endpoint client certificates: 1 rows sealed again"),
        "{out}"
    );
    // Run again with B alone: nothing is left to seal (nothing needs A any more).
    let out = rotate_key(&env, KEY_B);
    assert!(out.contains("endpoints: 0 rows sealed again"), "{out}");
    assert!(
        out.contains("endpoint transport settings: 0 rows sealed again"),
        "{out}"
    );
    let after = dump(&db);
    assert_eq!(
        after.matches(&sealed_a).count(),
        0,
        "nothing left under the old key"
    );
    assert_eq!(after.matches(&sealed_b).count(), 8);
    for b in bodies {
        assert!(!after.contains(b), "a secret is in the dump");
    }
}
