//! Production connectivity, against real servers on loopback:
//!
//! - a TLS-only stack (`deploy/local/tls.sh`: Postgres whose pg_hba.conf accepts only
//!   hostssl, Redis on a TLS-only port with a password, the broker behind stunnel requiring
//!   a client certificate): Events flow end to end through `railhook all`, and
//!   `pg_stat_ssl` shows every Railhook backend, the walsender included, on TLS;
//! - a wrong CA is refused, with a message that says so, for Postgres, Redis and Kafka;
//! - a process started before its broker waits, turns ready and delivers;
//! - Postgres away at start: the process waits and says why on `/readyz`;
//! - a Slot dropped under `railhook all`: the API keeps answering 201, and Events posted
//!   after `railhook slot create` are delivered.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::receiver::{Behaviour, Receiver};
use crate::support::relay::PrivateBroker;
use crate::support::{eventually, free_port, fresh_database, local_setting};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;

use crate::support::process::{
    Process, WAIT, base_env, post_event, project_with_endpoint, run_once, unique,
};

/// The TLS-only servers that `deploy/local/tls.sh up` started.
struct TlsStack {
    dir: PathBuf,
    password: String,
    pg_port: String,
    pg_socket: String,
    redis_port: String,
    kafka_port: String,
}

impl TlsStack {
    fn from_env() -> Self {
        Self {
            dir: PathBuf::from(local_setting("RAILHOOK_TLS_DIR")),
            password: local_setting("RAILHOOK_TLS_PASSWORD"),
            pg_port: local_setting("RAILHOOK_TLS_PG_PORT"),
            pg_socket: local_setting("RAILHOOK_TLS_PG_SOCKET"),
            redis_port: local_setting("RAILHOOK_TLS_REDIS_PORT"),
            kafka_port: local_setting("RAILHOOK_TLS_KAFKA_PORT"),
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The cluster through its Unix socket (trusted, not TLS): for the test's own look at
    /// `pg_stat_ssl`, never for Railhook.
    fn admin_url(&self, db: &str) -> String {
        format!(
            "postgresql:///{db}?host={}&port={}&user=railhook",
            self.pg_socket, self.pg_port
        )
    }

    /// A fresh database on the TLS-only cluster; Railhook's URL to it over verify-full with
    /// a client certificate, trusting `ca`.
    async fn fresh_database(&self, ca: &str) -> (String, String) {
        let name = format!("rh_test_{}", unique());
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.admin_url("postgres"))
            .await
            .expect("admin connection over the socket");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create database");
        admin.close().await;
        let url = format!(
            "postgres://railhook:{}@localhost:{}/{name}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            self.password,
            self.pg_port,
            self.file(ca),
            self.file("client.pem"),
            self.file("client.key"),
        );
        (name, url)
    }

    fn tls_env(&self, ca: &str) -> Vec<(String, String)> {
        vec![
            (
                "REDIS_URL".into(),
                format!(
                    "rediss://default:{}@127.0.0.1:{}/0",
                    self.password, self.redis_port
                ),
            ),
            ("RAILHOOK_REDIS_CA_FILE".into(), self.file(ca)),
            (
                "RAILHOOK_REDIS_CLIENT_CERT_FILE".into(),
                self.file("client.pem"),
            ),
            (
                "RAILHOOK_REDIS_CLIENT_KEY_FILE".into(),
                self.file("client.key"),
            ),
            (
                "KAFKA_BROKERS".into(),
                format!("127.0.0.1:{}", self.kafka_port),
            ),
            ("KAFKA_SECURITY_PROTOCOL".into(), "SSL".into()),
            ("KAFKA_SSL_CA_LOCATION".into(), self.file(ca)),
            (
                "KAFKA_SSL_CERTIFICATE_LOCATION".into(),
                self.file("client.pem"),
            ),
            ("KAFKA_SSL_KEY_LOCATION".into(), self.file("client.key")),
        ]
    }
}

/// A project with an endpoint at `url` subscribed to everything; returns its API key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_stack_carries_events_end_to_end_on_encrypted_connections() {
    let tls = TlsStack::from_env();
    let (db, url) = tls.fresh_database("ca.pem").await;
    let mut extra = tls.tls_env("ca.pem");
    extra.push(("DATABASE_URL".into(), url));
    let env = base_env(&extra);
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "migrate over TLS: {out}");

    let mut all = Process::start("all", &env);
    let ready = all.wait_ready(false).await;
    for dep in ["postgres", "postgres_replication", "kafka", "redis", "slot"] {
        assert_eq!(ready["dependencies"][dep]["up"], true, "{dep}: {ready}");
    }
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let key = project_with_endpoint(&all.api, &receiver.url).await;
    for n in 0..20 {
        assert_eq!(post_event(&all.api, &key, n).await, StatusCode::CREATED);
    }
    eventually("20 deliveries over TLS", WAIT, || async {
        (receiver.count() >= 20).then_some(())
    })
    .await;

    // Every backend of this database and the walsender streaming its Slot: all on TLS.
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&tls.admin_url("postgres"))
        .await
        .expect("admin");
    let rows: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT a.backend_type, a.application_name, s.ssl
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
    )
    .bind(&db)
    .fetch_all(&admin)
    .await
    .expect("pg_stat_ssl");
    assert!(
        rows.iter().any(|(kind, _, _)| kind == "walsender"),
        "no walsender: {rows:?}"
    );
    assert!(rows.len() >= 3, "pools, control and stream: {rows:?}");
    assert!(
        rows.iter().all(|(_, _, ssl)| *ssl),
        "a plaintext backend: {rows:?}"
    );
    // The quota was charged in the TLS Redis (the key exists there).
    let redis = railhook_common::redis_client::client(
        &secrecy::SecretString::from(format!(
            "rediss://default:{}@127.0.0.1:{}/0",
            tls.password, tls.redis_port
        )),
        &railhook_common::redis_client::RedisTls {
            ca_file: Some(tls.dir.join("ca.pem")),
            ..Default::default()
        },
    )
    .expect("redis client");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis over TLS");
    // Ingest waits for Redis no longer than its quota timeout and charges nothing when Redis
    // did not answer in time (ingest/src/quota.rs: the quota never fails an accepted Event),
    // then leaves Redis alone for a second. On a loaded machine the first TLS connection can
    // miss that timeout for all 20 Events above (seen once in a clean-clone run), so one
    // more Event a second is posted until one is charged.
    let deadline = std::time::Instant::now() + WAIT;
    let mut n = 20;
    let charged = loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("railhook:quota:*")
            .query_async(&mut conn)
            .await
            .expect("keys");
        if !keys.is_empty() {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        assert_eq!(post_event(&all.api, &key, n).await, StatusCode::CREATED);
        n += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let log = all.log();
    let quota_lines: Vec<&str> = log.lines().filter(|l| l.contains("quota")).collect();
    assert!(
        charged,
        "no quota counter in the TLS Redis; the process said: {quota_lines:?}"
    );
    assert!(!log.contains(&tls.password), "the password reached the log");
    let _ = all.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_with_a_clear_error_for_each_dependency() {
    let tls = TlsStack::from_env();
    // Postgres: a configuration error, so the process stops at once and says why.
    let (_, wrong_pg) = tls.fresh_database("wrong-ca.pem").await;
    let env = base_env(&[("DATABASE_URL".into(), wrong_pg)]);
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(!ok, "migrate trusted the wrong CA: {out}");
    assert!(
        out.contains("invalid peer certificate: UnknownIssuer"),
        "{out}"
    );
    assert!(!out.contains(&tls.password), "{out}");
    let mut ingest = Process::start("ingest", &env);
    let status = tokio::time::timeout(WAIT, ingest.child.wait())
        .await
        .expect("ingest must stop on a refused certificate")
        .expect("status");
    assert!(!status.success());
    assert!(ingest.log().contains("UnknownIssuer"), "{}", ingest.log());

    // Redis and Kafka with the wrong CA (Postgres right): the worker keeps running and
    // `/readyz` carries the TLS verdict for each.
    let (_, good_pg) = tls.fresh_database("ca.pem").await;
    let mut extra = tls.tls_env("wrong-ca.pem");
    extra.push(("DATABASE_URL".into(), good_pg));
    let mut worker = Process::start("worker", &base_env(&extra));
    let redis = worker
        .wait_down(true, "redis", &["certificate", "unknownissuer"])
        .await;
    let kafka = worker
        .wait_down(true, "kafka", &["certificate verify failed", "certificate"])
        .await;
    eprintln!("redis: {redis}\nkafka: {kafka}");
    let _ = worker.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_its_broker_railhook_waits_turns_ready_and_delivers() {
    let mut broker = PrivateBroker::start();
    broker.kill();
    let db = fresh_database().await;
    let env = base_env(&[
        ("DATABASE_URL".into(), db),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), broker.brokers.clone()),
    ]);
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "{out}");
    let mut all = Process::start("all", &env);
    all.wait_down(false, "kafka", &["", "broker"]).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    // The API serves while the broker is away: Events are accepted and kept.
    let key = project_with_endpoint(&all.api, &receiver.url).await;
    for n in 0..5 {
        assert_eq!(post_event(&all.api, &key, n).await, StatusCode::CREATED);
    }
    broker.restart();
    all.wait_ready(false).await;
    for n in 5..10 {
        assert_eq!(post_event(&all.api, &key, n).await, StatusCode::CREATED);
    }
    eventually(
        "all 10 delivered after the broker came up",
        WAIT,
        || async { (receiver.count() >= 10).then_some(()) },
    )
    .await;
    let _ = all.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_away_at_start_is_waited_for_and_named_on_readyz() {
    let port = free_port();
    let env = base_env(&[
        (
            "DATABASE_URL".into(),
            format!("postgres://u:hunter2-db@127.0.0.1:{port}/nowhere"),
        ),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), local_setting("KAFKA_BROKERS")),
    ]);
    let mut ingest = Process::start("ingest", &env);
    let error = ingest
        .wait_down(false, "postgres", &["connection refused", "io:"])
        .await;
    assert!(!error.contains("hunter2"), "{error}");
    let metrics = ingest.metrics_page().await;
    assert!(
        metrics.contains("railhook_dependency_up{dependency=\"postgres\"} 0"),
        "{metrics}"
    );
    let mut relay = Process::start("relay", &env);
    relay
        .wait_down(true, "postgres_replication", &["connection refused", "io"])
        .await;
    assert!(!ingest.log().contains("hunter2") && !relay.log().contains("hunter2"));
    let _ = ingest.child.kill().await;
    let _ = relay.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_under_railhook_all_keeps_the_api_accepting_and_comes_back() {
    let db = fresh_database().await;
    let env = base_env(&[
        ("DATABASE_URL".into(), db.clone()),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), local_setting("KAFKA_BROKERS")),
    ]);
    let slot = env
        .iter()
        .find(|(k, _)| k == "RAILHOOK_SLOT")
        .map(|(_, v)| v.clone())
        .expect("slot");
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "{out}");
    let mut all = Process::start("all", &env);
    all.wait_ready(false).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let key = project_with_endpoint(&all.api, &receiver.url).await;
    assert_eq!(post_event(&all.api, &key, 0).await, StatusCode::CREATED);
    eventually("the first delivery", WAIT, || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;

    // Drop the Slot under the running relay: end its walsender, then drop before the relay
    // reconnects (it retries every few hundred milliseconds, so try until the drop wins).
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db)
        .await
        .expect("pool");
    eventually("the Slot dropped", WAIT, || async {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(&slot)
        .execute(&pool)
        .await
        .ok()?;
        sqlx::query("SELECT pg_drop_replication_slot($1)::text")
            .bind(&slot)
            .execute(&pool)
            .await
            .ok()
    })
    .await;
    all.wait_down(false, "slot", &["railhook slot create"])
        .await;
    for n in 1..=30 {
        assert_eq!(
            post_event(&all.api, &key, n).await,
            StatusCode::CREATED,
            "the API must keep accepting while the Slot is gone"
        );
    }
    let metrics = all.metrics_page().await;
    assert!(
        metrics.contains("railhook_relay_slot_unusable 1"),
        "{metrics}"
    );
    let (ok, out) = run_once(&["slot", "create"], &env);
    assert!(ok, "{out}");
    all.wait_ready(false).await;
    for n in 31..36 {
        assert_eq!(post_event(&all.api, &key, n).await, StatusCode::CREATED);
    }
    // Events posted after the Slot is back are announced through it; those accepted while
    // it was gone never were in any Slot, and `slot create` handed them to the retry path:
    // every one arrives within the test's wait, not after the hour-long stranded sweep.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let bodies: Vec<String> = receiver.requests().into_iter().map(|r| r.body).collect();
        let seen: Vec<u64> = bodies
            .iter()
            .filter_map(|b| serde_json::from_str::<Value>(b).ok()?["n"].as_u64())
            .collect();
        if (1..36).all(|n| seen.contains(&n)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Events posted while the Slot was gone or after `slot create` not delivered; received {bodies:?}\nlog:\n{}",
            all.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        all.child.try_wait().expect("status").is_none(),
        "{}",
        all.log()
    );
    let _ = all.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambient_proxy_never_carries_a_delivery_past_the_ssrf_guard() {
    // Through a proxy, the guarded resolver would see only the proxy's host (allowed here)
    // and the proxy would fetch whatever the endpoint names. The "proxy" is a receiver that
    // records what reaches it; the endpoint's host name resolves nowhere the guard allows.
    let proxy = Receiver::start(vec![], Behaviour::Status(200)).await;
    let proxy_addr = proxy.url.trim_end_matches("/hook").to_owned();
    let db = fresh_database().await;
    let env = base_env(&[
        ("DATABASE_URL".into(), db),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), local_setting("KAFKA_BROKERS")),
        ("RAILHOOK_RETRY_OUTGOING_MAX_ATTEMPTS".into(), "2".into()),
        ("HTTP_PROXY".into(), proxy_addr.clone()),
        ("HTTPS_PROXY".into(), proxy_addr.clone()),
        ("ALL_PROXY".into(), proxy_addr),
    ]);
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "{out}");
    let all = Process::start("all", &env);
    all.wait_ready(false).await;
    let key = project_with_endpoint(&all.api, "http://metadata.railhook-ssrf.invalid/latest").await;
    assert_eq!(post_event(&all.api, &key, 1).await, StatusCode::CREATED);
    // Both Attempts are made (and fail) within a few seconds; the proxy must see neither.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&env.iter().find(|(k, _)| k == "DATABASE_URL").expect("db").1)
        .await
        .expect("pool");
    eventually("the Delivery's Attempts", WAIT, || async {
        let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts")
            .fetch_one(&pool)
            .await
            .ok()?;
        (attempts >= 1).then_some(())
    })
    .await;
    assert_eq!(
        proxy.count(),
        0,
        "a delivery went through the ambient proxy: {:?}",
        proxy.requests().first().map(|r| r.headers.clone())
    );
}
