//! The metrics catalogue against what operators are given: every metric the Grafana
//! dashboard and the alert rules name must be one the code exports, the rules must pass
//! `promtool check rules`, and a live `/metrics` must pass `promtool check metrics`.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("railhook_") {
        let start = i + at;
        let end = bytes[start..]
            .iter()
            .position(|b| !(b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_'))
            .map_or(bytes.len(), |n| start + n);
        // `railhook_common::…` is a crate path, not a metric.
        if !text[end..].starts_with("::") {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// The metric names declared as constants in the roles' metrics modules (and the Postgres
/// pool's, which every role with a pool shares).
pub(crate) fn exported() -> BTreeSet<String> {
    [
        "ingest/src/metrics.rs",
        "relay/src/metrics.rs",
        "worker/src/metrics.rs",
        "common/src/db.rs",
        "common/src/retention/metrics.rs",
        "common/src/metrics_http.rs",
        "common/src/health.rs",
    ]
    .iter()
    .flat_map(|f| {
        names_in(&std::fs::read_to_string(format!("{ROOT}/{f}")).expect("metrics source"))
    })
    .filter(|n| n.len() > "railhook_".len())
    .collect()
}

/// A referenced name is known if it, or its histogram base, is exported.
fn unknown(referenced: &BTreeSet<String>, exported: &BTreeSet<String>) -> Vec<String> {
    referenced
        .iter()
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !exported.contains(*n) && !exported.contains(base)
        })
        .cloned()
        .collect()
}

#[test]
fn the_dashboard_leads_with_the_slot_and_names_only_exported_metrics() {
    let raw =
        std::fs::read_to_string(format!("{ROOT}/deploy/grafana/railhook.json")).expect("dashboard");
    let dash: serde_json::Value = serde_json::from_str(&raw).expect("dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert_eq!(panels[0]["type"], json!("row"));
    assert_eq!(panels[0]["title"], json!("Replication slot"));
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() > 10);
    let referenced: BTreeSet<String> = exprs.iter().flat_map(|e| names_in(e)).collect();
    let exported = exported();
    assert!(exported.len() > 25, "{exported:?}");
    assert_eq!(unknown(&referenced, &exported), Vec::<String>::new());
    for must in [
        "railhook_relay_slot_lag_bytes",
        "railhook_relay_lag_seconds",
        "railhook_relay_safe_wal_size_bytes",
        "railhook_relay_wal_status",
        "railhook_relay_active",
        "railhook_relay_heartbeat_age_seconds",
    ] {
        assert!(referenced.contains(must), "the dashboard lacks {must}");
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_name_only_exported_metrics() {
    let path = format!("{ROOT}/deploy/prometheus/alerts.yml");
    let rules = std::fs::read_to_string(&path).expect("alerts.yml");
    assert_eq!(
        unknown(&names_in(&rules), &exported()),
        Vec::<String>::new()
    );
    let out = Command::new("promtool")
        .args(["check", "rules", &path])
        .output()
        .expect("promtool (apt: prometheus)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_alert_fires_when_it_should_and_has_its_runbook_row() {
    let dir = format!("{ROOT}/deploy/prometheus");
    let out = Command::new("promtool")
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool (apt: prometheus)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = std::fs::read_to_string(format!("{dir}/alerts.yml")).expect("alerts.yml");
    let tests = std::fs::read_to_string(format!("{dir}/alerts_test.yml")).expect("tests");
    let runbook =
        std::fs::read_to_string(format!("{ROOT}/docs/operate/monitoring.md")).expect("runbook");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 20, "{alerts:?}");
    for alert in &alerts {
        let anchor = alert.to_lowercase();
        assert!(
            rules.contains(&format!(
                "runbook_url: \"docs/operate/monitoring.md#{anchor}\""
            )),
            "{alert} has no runbook_url to its row"
        );
        assert!(
            runbook.contains(&format!("| <a id=\"{anchor}\"></a>`{alert}` |")),
            "{alert} has no row in the runbook"
        );
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no promtool test"
        );
    }
    // And no row for an alert that does not exist.
    for row in runbook
        .lines()
        .filter(|l| l.starts_with("| <a id=\"railhook"))
    {
        assert!(
            alerts.iter().any(|a| row.contains(&format!("`{a}`"))),
            "runbook row without an alert: {row}"
        );
    }
}

#[tokio::test]
async fn a_live_metrics_page_passes_promtool() {
    let mut app = crate::support::spawn_app().await;
    // The page of `railhook all`: ingest's registry plus the relay's and the worker's.
    let relay = railhook_relay::RelayMetrics::new();
    let worker = railhook_worker::WorkerMetrics::new();
    app.state.other_registries = vec![relay.registry.clone(), worker.registry.clone()];
    let state = app.state.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    app.base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(
        async move { railhook_ingest::serve(listener, state, std::future::pending()).await },
    );
    let (_, key) = app.project().await;
    app.post_event(&key, "a.b", json!({}), None).await;
    relay.commit_to_ack_seconds.observe(0.01);
    worker.attempts.with_label_values(&["succeeded"]).inc();
    worker
        .consumer_lag
        .with_label_values(&["deliveries", "0"])
        .set(3);
    // `railhook all` has two pools, each registering the same gauges in its role's registry.
    railhook_common::db::PoolCollector::register(
        &worker.registry,
        "worker",
        app.state.pool.clone(),
    );
    let page = app.metrics().await;
    assert!(
        page.contains("railhook_relay_slot_lag_bytes")
            && page.contains("railhook_worker_attempts_total")
            && page.contains("railhook_worker_retry_backlog{state=\"due\"}")
            && page
                .contains("railhook_worker_consumer_lag{partition=\"0\",topic=\"deliveries\"} 3")
            && page.contains("railhook_relay_outbox_oldest_age_seconds")
    );
    for pool in ["ingest", "worker"] {
        assert!(
            page.contains(&format!(
                "railhook_db_pool_max_connections{{pool=\"{pool}\"}}"
            )),
            "{pool} pool missing"
        );
    }
    // Every page carries the build and process series, and one final-outcome family whose
    // series come from two roles (ingest counts expunged, the worker the rest).
    assert!(page.contains("railhook_build_info{commit=\"unknown\",version=\""));
    assert!(page.contains("process_resident_memory_bytes"));
    assert!(page.contains("process_start_time_seconds"));
    for outcome in ["succeeded", "failed", "expunged"] {
        assert!(
            page.contains(&format!(
                "railhook_deliveries_final_total{{outcome=\"{outcome}\"}}"
            )),
            "{outcome}"
        );
    }
    assert_eq!(
        page.matches("# TYPE railhook_deliveries_final_total counter")
            .count(),
        1
    );
    assert!(page.contains(
        "railhook_worker_attempt_duration_seconds_bucket{result=\"http_5xx\",le=\"0.075\"}"
    ));
    assert_eq!(
        page.matches("# TYPE railhook_db_pool_connections gauge")
            .count(),
        1,
        "one family for both pools"
    );
    // Every answer carries a request id: the caller's, or a new one.
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{}/healthz", app.base))
        .header("x-request-id", "support-1234")
        .send()
        .await
        .expect("healthz");
    assert_eq!(r.headers()["x-request-id"], "support-1234");
    let r = http
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .expect("healthz");
    assert_eq!(r.headers()["x-request-id"].len(), 26, "a new ULID");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt: prometheus)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (content type, body) of each export the collector received.
type Exports = std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

/// A loopback OTLP/HTTP collector: its base URL and what it received.
async fn collector() -> (String, Exports) {
    let bodies: Exports = Exports::default();
    let seen = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let kind = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().expect("lock").push((kind, body.to_vec()));
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, bodies)
}

/// With `RAILHOOK_OTLP_ENDPOINT` set, the real binary exports its spans over OTLP/HTTP: a
/// loopback collector receives protobuf at `/v1/traces` holding the request span with the
/// caller's request id and the role's service name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_to_an_otlp_collector_when_one_is_configured() {
    use std::time::{Duration, Instant};

    let (otlp, bodies) = collector().await;
    let database_url = crate::support::fresh_database().await;
    let port = crate::support::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("ingest")
        .env("DATABASE_URL", &database_url)
        .env("REDIS_URL", crate::support::local_setting("REDIS_URL"))
        .env("RAILHOOK_ADMIN_TOKEN", crate::support::ADMIN_TOKEN)
        .env("RAILHOOK_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("RAILHOOK_OTLP_ENDPOINT", &otlp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("railhook ingest");
    let api = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    crate::support::eventually("ingest answers", Duration::from_secs(20), || async {
        http.get(format!("{api}/healthz"))
            .header("x-request-id", "otlp-probe-42")
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    // The batch exporter sends every few seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let hit = bodies.lock().expect("lock").iter().any(|(kind, body)| {
            let text = String::from_utf8_lossy(body);
            kind == "application/x-protobuf"
                && text.contains("otlp-probe-42")
                && text.contains("railhook-ingest")
                && text.contains("request")
        });
        if hit || Instant::now() > deadline {
            break hit;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        found,
        "no OTLP export with the request span arrived ({} posts)",
        bodies.lock().expect("lock").len()
    );
}

/// `/metrics` can leave the public API port and ask for a token: with
/// `RAILHOOK_API_METRICS=false` the real binary answers 404 problem+json there and serves
/// the page on the metrics port instead, and with `RAILHOOK_METRICS_TOKEN` set that page is
/// 401 without the bearer token (or with a wrong one) and complete with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_leave_the_api_port_and_ask_for_a_token_when_configured() {
    const TOKEN: &str = "scrape-token-0123456789";
    let database_url = crate::support::fresh_database().await;
    let port = crate::support::free_port();
    let metrics_port = crate::support::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("ingest")
        .env("DATABASE_URL", &database_url)
        .env("REDIS_URL", crate::support::local_setting("REDIS_URL"))
        .env("RAILHOOK_ADMIN_TOKEN", crate::support::ADMIN_TOKEN)
        .env("RAILHOOK_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("RAILHOOK_METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env("RAILHOOK_API_METRICS", "false")
        .env("RAILHOOK_METRICS_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("railhook ingest");
    let api = format!("http://127.0.0.1:{port}");
    let scrape = format!("http://127.0.0.1:{metrics_port}/metrics");
    let http = reqwest::Client::new();
    crate::support::eventually(
        "both ports answer",
        std::time::Duration::from_secs(30),
        || async {
            let api_up = http.get(format!("{api}/healthz")).send().await.ok()?;
            let metrics_up = http
                .get(format!("http://127.0.0.1:{metrics_port}/healthz"))
                .send()
                .await
                .ok()?;
            (api_up.status().is_success() && metrics_up.status().is_success()).then_some(())
        },
    )
    .await;
    let on_api = http
        .get(format!("{api}/metrics"))
        .send()
        .await
        .expect("api");
    assert_eq!(on_api.status(), 404);
    assert_eq!(on_api.headers()["content-type"], "application/problem+json");
    let bare = http.get(&scrape).send().await.expect("scrape");
    assert_eq!(bare.status(), 401);
    let wrong = http
        .get(&scrape)
        .bearer_auth("scrape-token-0123456788")
        .send()
        .await
        .expect("scrape");
    assert_eq!(wrong.status(), 401);
    let page = http
        .get(&scrape)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("scrape");
    assert_eq!(page.status(), 200);
    let page = page.text().await.expect("page");
    let _ = child.kill();
    let _ = child.wait();
    for name in [
        "railhook_build_info",
        "railhook_http_requests_total",
        "railhook_deliveries_final_total{outcome=\"expunged\"}",
        "railhook_retention_",
        "process_cpu_seconds_total",
    ] {
        assert!(page.contains(name), "{name} missing from the metrics port");
    }
}

/// One trace from the sender's request to the receiver's, through the real processes: a
/// `traceparent` on `POST /v1/events` is stored with the Event and its Outbox row; the relay
/// publishes under it, the worker's Attempt continues it, and the receiver gets
/// `traceparent` with the sender's trace id and a new parent id (plus the `tracestate`).
/// The loopback collector receives spans of that trace from all three services. An Event
/// posted without one gets a trace Railhook started, and the API shows its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_api_call_through_relay_and_worker_to_the_receiver() {
    use crate::support::receiver::{Behaviour, Receiver};
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(60);
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SENDER_SPAN: &str = "00f067aa0ba902b7";
    let (otlp, bodies) = collector().await;
    let database_url = crate::support::fresh_database().await;
    let unique = ulid::Ulid::new().to_string().to_lowercase();
    let api_port = crate::support::free_port();
    let api = format!("http://127.0.0.1:{api_port}");
    let env = |metrics_port: u16| -> Vec<(String, String)> {
        [
            ("DATABASE_URL", database_url.clone()),
            ("REDIS_URL", crate::support::local_setting("REDIS_URL")),
            (
                "KAFKA_BROKERS",
                crate::support::local_setting("KAFKA_BROKERS"),
            ),
            (
                "RAILHOOK_ADMIN_TOKEN",
                crate::support::ADMIN_TOKEN.to_owned(),
            ),
            ("RAILHOOK_SLOT", format!("rh_{unique}")),
            ("RAILHOOK_TOPIC_PREFIX", format!("t{unique}.")),
            ("RAILHOOK_WORKER_GROUP", format!("g{unique}")),
            ("RAILHOOK_KAFKA_PARTITIONS", "3".to_owned()),
            ("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8".to_owned()),
            ("RAILHOOK_HTTP_ADDR", format!("127.0.0.1:{api_port}")),
            ("RAILHOOK_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
            ("RAILHOOK_OTLP_ENDPOINT", otlp.clone()),
            // Export each batch of spans within half a second.
            ("OTEL_BSP_SCHEDULE_DELAY", "500".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    let migrate = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("migrate")
        .envs(env(crate::support::free_port()))
        .output()
        .expect("migrate");
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let mut processes: Vec<std::process::Child> = ["ingest", "relay", "worker"]
        .iter()
        .map(|role| {
            Command::new(env!("CARGO_BIN_EXE_railhook"))
                .arg(role)
                .envs(env(crate::support::free_port()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("railhook")
        })
        .collect();
    let http = reqwest::Client::new();
    crate::support::eventually("ingest ready", WAIT, || async {
        http.get(format!("{api}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let admin = |path: &'static str, body: serde_json::Value| {
        let (http, api) = (http.clone(), api.clone());
        async move {
            let r = http
                .post(format!("{api}{path}"))
                .bearer_auth(crate::support::ADMIN_TOKEN)
                .json(&body)
                .send()
                .await
                .expect("admin");
            r.json::<serde_json::Value>().await.expect("json")
        }
    };
    let org = admin(
        "/v1/organizations",
        json!({"name": "t", "monthly_quota": 1000}),
    )
    .await;
    let project = admin(
        "/v1/projects",
        json!({"organization_id": org["id"], "name": "t"}),
    )
    .await;
    let key = project["api_key"].as_str().expect("key").to_owned();
    let receiver = Receiver::start(vec![], Behaviour::Status(204)).await;
    let post = |path: &'static str, body: serde_json::Value, trace: Option<&'static str>| {
        let (http, api, key) = (http.clone(), api.clone(), key.clone());
        async move {
            let mut req = http
                .post(format!("{api}{path}"))
                .bearer_auth(&key)
                .json(&body);
            if let Some(tp) = trace {
                req = req
                    .header("traceparent", tp)
                    .header("tracestate", "rojo=00f067aa0ba902b7");
            }
            let r = req.send().await.expect("post");
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json::<serde_json::Value>().await.expect("json")
        }
    };
    let ep = post(
        "/v1/endpoints",
        json!({"url": receiver.url, "timeout_ms": 5000}),
        None,
    )
    .await;
    post(
        "/v1/subscriptions",
        json!({"endpoint_id": ep["id"], "event_types": ["*"]}),
        None,
    )
    .await;
    let traced = post(
        "/v1/events",
        json!({"type": "order.paid", "payload": {"n": 1}}),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )
    .await;
    let first = crate::support::eventually("the traced delivery", WAIT, || async {
        receiver.requests().into_iter().next()
    })
    .await;
    let got = railhook_common::trace_context::TraceParent::parse(&first.headers["traceparent"])
        .expect("a valid traceparent at the receiver");
    assert_eq!(got.trace_id_hex(), TRACE);
    assert_ne!(
        got.to_string().split('-').nth(2),
        Some(SENDER_SPAN),
        "the receiver's parent is the Attempt, not the sender"
    );
    assert_eq!(first.headers["tracestate"], "rojo=00f067aa0ba902b7");
    let stored = http
        .get(format!(
            "{api}/v1/events/{}",
            traced["id"].as_str().expect("id")
        ))
        .bearer_auth(&key)
        .send()
        .await
        .expect("get")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    assert_eq!(stored["trace_id"], TRACE);

    // Spans of that trace from each of the three processes reach the collector.
    let trace_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&TRACE[i * 2..i * 2 + 2], 16).expect("hex"))
        .collect();
    for service in ["railhook-ingest", "railhook-relay", "railhook-worker"] {
        crate::support::eventually(
            &format!("a span of the trace from {service}"),
            WAIT,
            || async {
                bodies
                    .lock()
                    .expect("lock")
                    .iter()
                    .any(|(_, body)| {
                        body.windows(service.len()).any(|w| w == service.as_bytes())
                            && body.windows(16).any(|w| w == trace_bytes.as_slice())
                    })
                    .then_some(())
            },
        )
        .await;
    }

    // Without a traceparent, Railhook starts a trace and the receiver joins it.
    let untraced = post(
        "/v1/events",
        json!({"type": "order.paid", "payload": {"n": 2}}),
        None,
    )
    .await;
    let second = crate::support::eventually("the untraced delivery", WAIT, || async {
        receiver.requests().into_iter().nth(1)
    })
    .await;
    let started =
        railhook_common::trace_context::TraceParent::parse(&second.headers["traceparent"])
            .expect("a traceparent Railhook started");
    assert_ne!(started.trace_id_hex(), TRACE);
    assert!(!second.headers.contains_key("tracestate"));
    let stored = http
        .get(format!(
            "{api}/v1/events/{}",
            untraced["id"].as_str().expect("id")
        ))
        .bearer_auth(&key)
        .send()
        .await
        .expect("get")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    assert_eq!(stored["trace_id"], started.trace_id_hex());
    for p in &mut processes {
        let _ = p.kill();
        let _ = p.wait();
    }
}
