//! Endpoints and subscriptions, the service routes, and the binary's own start-up checks.

use std::collections::BTreeSet;
use std::process::Command;

use crate::support::{fresh_database, spawn_app, spawn_app_tuned};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn endpoints_create_patch_rotate_and_delete() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let body = json!({"url": "https://example.com/hooks", "description": "orders",
                      "timeout_ms": 5000, "rate_limit_per_second": 10,
                      "headers": {"X-Team": "payments"}});
    let r = app
        .call(Method::POST, "/v1/endpoints", Some(&key), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let secret = r.body["secret"].as_str().expect("secret").to_owned();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(r.body["timeout_ms"], json!(5000));
    assert_eq!(r.body["headers"], json!({"X-Team": "payments"}));

    // PATCH: absent fields stay, null clears a limit, enabling clears the reason.
    let path = format!("/v1/endpoints/{id}");
    let r = app
        .call(
            Method::PATCH,
            &path,
            Some(&key),
            Some(json!({"rate_limit_per_second": null, "max_concurrency": 3})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["rate_limit_per_second"], Value::Null);
    assert_eq!(r.body["max_concurrency"], json!(3));
    assert_eq!(r.body["timeout_ms"], json!(5000));
    assert_eq!(r.body["description"], json!("orders"));
    assert!(
        r.body.get("secret").is_none(),
        "secret only on create and /secret"
    );

    for (field, bad) in [
        ("url", json!({"url": "ftp://example.com"})),
        ("url", json!({"url": "not a url"})),
        ("timeout_ms", json!({"timeout_ms": 10})),
        ("max_concurrency", json!({"max_concurrency": 0})),
        (
            "headers",
            json!({"headers": {"webhook-signature": "forged"}}),
        ),
    ] {
        let r = app.call(Method::PATCH, &path, Some(&key), Some(bad)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_eq!(r.body["field"], json!(field));
    }

    let s = app
        .call(Method::GET, &format!("{path}/secret"), Some(&key), None)
        .await;
    assert_eq!(s.body["key"], json!(secret));
    assert_eq!(s.body["previous_key"], Value::Null);
    let rotated = app
        .call(
            Method::POST,
            &format!("{path}/secret/rotate"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK);
    assert_ne!(rotated.body["key"], json!(secret));
    assert_eq!(rotated.body["previous_key"], json!(secret));
    assert!(rotated.body["previous_key_expires_at"].is_string());

    let health = app
        .call(Method::GET, &format!("{path}/health"), Some(&key), None)
        .await;
    assert_eq!(health.body["breaker_state"], json!("closed"));
    assert_eq!(health.body["attempts_24h"], json!(0));
    assert_eq!(health.body["success_rate_24h"], Value::Null);

    let r = app.call(Method::DELETE, &path, Some(&key), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app.call(Method::GET, &path, Some(&key), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app.call(Method::DELETE, &path, Some(&key), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app
        .call(Method::GET, "/v1/endpoints/not-an-id", Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn lists_page_through_every_row_once() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let mut created = BTreeSet::new();
    for _ in 0..7 {
        created.insert(app.endpoint(&key).await);
    }
    let mut seen = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/endpoints?limit=3&cursor={c}"),
            None => "/v1/endpoints?limit=3".to_owned(),
        };
        let r = app.call(Method::GET, &path, Some(&key), None).await;
        pages += 1;
        for e in r.body["data"].as_array().expect("data") {
            assert!(
                seen.insert(e["id"].as_str().expect("id").to_owned()),
                "seen twice"
            );
        }
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10);
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created);
}

#[tokio::test]
async fn subscriptions_validate_patterns_and_update() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    for bad in [
        json!([]),
        json!(["order.**"]),
        json!(["order..x"]),
        json!([""]),
    ] {
        let r = app
            .call(
                Method::POST,
                "/v1/subscriptions",
                Some(&key),
                Some(json!({"endpoint_id": ep, "event_types": bad})),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(r.body["field"], json!("event_types"));
    }
    let sub = app
        .subscribe(&key, &ep, &["order.paid", "order.*", "order.paid"], false)
        .await;
    let r = app
        .call(
            Method::GET,
            &format!("/v1/subscriptions/{sub}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["event_types"], json!(["order.*", "order.paid"]));
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/subscriptions/{sub}"),
            Some(&key),
            Some(json!({"event_types": ["invoice.*"], "ordered": true})),
        )
        .await;
    assert_eq!(r.body["event_types"], json!(["invoice.*"]));
    assert_eq!(r.body["ordered"], json!(true));
    let none = app.post_event(&key, "order.paid", json!({}), None).await;
    assert_eq!(none.body["deliveries"], json!([]));
    let one = app.post_event(&key, "invoice.paid", json!({}), None).await;
    assert_eq!(one.body["deliveries"].as_array().expect("d").len(), 1);
}

#[tokio::test]
async fn service_routes_answer_and_openapi_describes_every_route() {
    let app = spawn_app().await;
    let get = |path: &'static str| {
        let client = app.client.clone();
        let url = format!("{}{path}", app.base);
        async move { client.get(url).send().await.expect("get") }
    };
    assert_eq!(get("/healthz").await.status(), StatusCode::OK);
    let ready: Value = get("/readyz").await.json().await.expect("readyz body");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["dependencies"]["postgres"]["up"], true, "{ready}");
    let missing = get("/nope").await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let doc: Value = get("/openapi.json").await.json().await.expect("openapi");
    let paths: BTreeSet<String> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    for p in [
        "/v1/organizations",
        "/v1/projects",
        "/v1/projects/{id}/api-keys",
        "/v1/api-keys/{id}",
        "/v1/endpoints",
        "/v1/endpoints/{id}",
        "/v1/endpoints/{id}/secret",
        "/v1/endpoints/{id}/secret/rotate",
        "/v1/endpoints/{id}/health",
        "/v1/subscriptions",
        "/v1/subscriptions/{id}",
        "/v1/events",
        "/v1/events/batch",
        "/v1/events/{id}",
        "/v1/deliveries",
        "/v1/deliveries/{id}",
        "/v1/deliveries/{id}/attempts",
        "/v1/deliveries/{id}/retry",
    ] {
        assert!(paths.contains(p), "openapi lacks {p}");
    }
    let (_, key) = app.project().await;
    app.post_event(&key, "a.b", json!({}), None).await;
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            r#"railhook_http_requests_total{method="POST",route="/v1/events",status="2xx"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("railhook_ingest_events_created_total 1"));
}

fn railhook(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_railhook"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run railhook")
}

#[tokio::test]
async fn migrate_is_safe_to_run_twice_and_creates_the_publication_and_slot() {
    let url = fresh_database().await;
    // Slot names are cluster-wide: this test's own.
    let slot = format!("rh_{}", ulid::Ulid::new().to_string().to_lowercase());
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("RAILHOOK_SLOT", slot.as_str()),
    ];
    for _ in 0..2 {
        let out = railhook(&["migrate"], &env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = railhook(&["slot", "status"], &env);
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        printed.contains("wal_status           reserved"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("slot                 {slot}")),
        "{printed}"
    );
    let dropped = railhook(&["slot", "drop"], &env);
    assert!(String::from_utf8_lossy(&dropped.stdout).contains("dropped"));
    let missing = railhook(&["slot", "status"], &env);
    assert_eq!(missing.status.code(), Some(3));
    // A failover Slot needs PostgreSQL 17: an older server refuses the flag by name and
    // creates nothing; on 17 or later the Slot is created with failover set.
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .expect("version");
    let failover = railhook(&["slot", "create", "--failover"], &env);
    if version < 170_000 {
        assert!(!failover.status.success());
        assert!(
            String::from_utf8_lossy(&failover.stderr).contains("failover slots need PostgreSQL 17"),
            "{}",
            String::from_utf8_lossy(&failover.stderr)
        );
        let missing = railhook(&["slot", "status"], &env);
        assert_eq!(missing.status.code(), Some(3), "nothing was created");
    } else {
        assert!(failover.status.success());
        let flagged: bool =
            sqlx::query_scalar("SELECT failover FROM pg_replication_slots WHERE slot_name = $1")
                .bind(&slot)
                .fetch_one(&pool)
                .await
                .expect("slot");
        assert!(flagged);
        railhook(&["slot", "drop"], &env);
    }
    let created = railhook(&["slot", "create"], &env);
    assert!(String::from_utf8_lossy(&created.stdout).contains("created"));
    railhook(&["slot", "drop"], &env);
    let publishes: (bool, bool, bool) = sqlx::query_as(
        "SELECT pubinsert, pubdelete, pubupdate FROM pg_publication WHERE pubname = 'railhook_outbox'",
    )
    .fetch_one(&pool)
    .await
    .expect("publication");
    assert_eq!(publishes, (true, false, false));
}

#[test]
fn bad_configuration_stops_the_binary_with_a_message_naming_the_setting() {
    let out = railhook(&["ingest"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("database_url"));
    let out = railhook(
        &["ingest"],
        &[
            ("DATABASE_URL", "postgres://x/y"),
            ("RAILHOOK_HTTP_ADDR", "nowhere"),
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .to_lowercase()
            .contains("http_addr")
    );
    let out = railhook(
        &["ingest"],
        &[
            ("DATABASE_URL", "postgres://x/y"),
            ("RAILHOOK_ADMIN_TOKEN", "short"),
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin_token"));
    // A TLS setting that cannot work is configuration: the process stops at once and names
    // the parameter. (Postgres merely away is not: tests/it/connectivity.rs.)
    let out = railhook(
        &["ingest"],
        &[
            (
                "DATABASE_URL",
                "postgres://u:hunter2@127.0.0.1:1/y?sslmode=verify-full&sslrootcert=/nope/ca.pem",
            ),
            ("RAILHOOK_ADMIN_TOKEN", "0123456789abcdef0"),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sslrootcert") && !stderr.contains("hunter2"),
        "{stderr}"
    );
    let out = railhook(
        &["worker"],
        &[
            ("DATABASE_URL", "postgres://x/y"),
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_USERNAME", "u"),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kafka_sasl_password"), "{stderr}");
    // The replication stream checks certificate names only: verify-full on an IP address
    // is refused when the relay starts, not at every reconnect.
    let ca = std::env::temp_dir().join("railhook-api-test-ca.pem");
    std::fs::write(&ca, "not read before the check").expect("write");
    let url = format!(
        "postgres://u@127.0.0.1:1/y?sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    let out = railhook(&["relay"], &[("DATABASE_URL", url.as_str())]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("database_url") && stderr.contains("verify-full"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_expunged_payload_is_gone_from_every_table_and_its_unsent_deliveries_fail() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (_, other_key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let marker = "expunge-me-7f3a";
    let r = app
        .post_event(&key, "card.saved", json!({"pan": marker}), Some("k1"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let event = r.body["id"].as_str().expect("id").to_owned();
    let delivery = r.body["deliveries"][0]["id"]
        .as_str()
        .expect("d")
        .to_owned();
    assert!(!app.tables_containing(marker).await.is_empty());
    // A receiver that echoed the body into its answer (review #34 item 6): the Attempt's
    // excerpt holds the payload too, and must go with it; so must the request a
    // transformation made (issue #53), whose body is often the payload itself.
    sqlx::query(
        "INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at,
                               status_code, outcome, duration_ms, response_excerpt, fenced,
                               request)
         VALUES ($1, 1, now(), now(), 422, 'FAILED', 5, $2, false,
                 jsonb_build_object('method', 'POST', 'url', 'https://x.example/in',
                                    'headers', '{}'::jsonb, 'body', $2::text))",
    )
    .bind(&delivery)
    .bind(format!("invalid card: {{\"pan\": \"{marker}\"}}"))
    .execute(&app.pool)
    .await
    .expect("an echoed attempt");

    // Another project's key, an unknown id, a malformed id: 404 problem+json, nothing changed.
    for (k, id) in [
        (&other_key, event.as_str()),
        (&key, "evt_01jzzzzzzzzzzzzzzzzzzzzzzz"),
        (&key, "nonsense"),
    ] {
        let r = app
            .call(
                Method::DELETE,
                &format!("/v1/events/{id}/payload"),
                Some(k),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{id}");
        assert_eq!(r.content_type, "application/problem+json");
    }
    assert!(!app.tables_containing(marker).await.is_empty());

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
    let expunged_at = r.body["expunged_at"].clone();
    assert!(
        app.tables_containing(marker).await.is_empty(),
        "still stored in {:?}",
        app.tables_containing(marker).await
    );
    // The metadata stays; the API and the Delivery say what happened.
    let got = app
        .call(
            Method::GET,
            &format!("/v1/events/{event}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(got.body["payload"], Value::Null);
    assert_eq!(got.body["type"], json!("card.saved"));
    assert_eq!(got.body["expunged_at"], expunged_at);
    let d = app
        .call(
            Method::GET,
            &format!("/v1/deliveries/{delivery}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(d.body["status"], json!("FAILED"));
    assert_eq!(d.body["failure_reason"], json!("payload_expunged"));
    // It cannot be sent again, by hand or by a replay.
    let retry = app
        .call(
            Method::POST,
            &format!("/v1/deliveries/{delivery}/retry"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{:?}", retry.body);
    let replay = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key),
            Some(json!({"event_ids": [event], "dry_run": true})),
        )
        .await;
    assert_eq!(
        replay.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        replay.body
    );
    assert!(
        replay.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("expunged")),
        "{:?}",
        replay.body
    );
    // Twice is harmless: the first time stays.
    let again = app
        .call(
            Method::DELETE,
            &format!("/v1/events/{event}/payload"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["expunged_at"], expunged_at);
    assert_eq!(again.body["deliveries_failed"], json!(0));
    let (events, deliveries, _) = app.counts().await;
    assert_eq!((events, deliveries), (1, 1));
}

/// Review #34 item 14: `/readyz` takes no credentials, so a flood of it must not become a
/// flood of queries. With every connection of the API's pool taken, one request at a time
/// asks Postgres (and waits for a connection); the rest answer at once from the last probe.
/// Before, every request ran its own query and all of them waited for the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_answers_from_the_last_probe_without_a_query_per_request() {
    let app = spawn_app_tuned(&crate::support::local_setting("REDIS_URL"), |f| {
        f.merge(("db_max_connections", 4))
    })
    .await;
    let first = app
        .client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .expect("readyz");
    assert_eq!(first.status(), StatusCode::OK);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(app.state.pool.acquire().await.expect("a connection"));
    }
    // Past the refresh interval, so the next request probes (and waits for the pool).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let quick = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .expect("client");
    let answers = futures::future::join_all((0..20).map(|_| {
        let (quick, url) = (quick.clone(), format!("{}/readyz", app.base));
        async move { quick.get(url).send().await.map(|r| r.status()) }
    }))
    .await;
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    assert!(
        answered >= 19,
        "{answered} of 20 answered while the pool was taken: {answers:?}"
    );
    drop(held);
}
