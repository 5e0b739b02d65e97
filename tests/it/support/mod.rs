//! Test harness: every test gets its own database on the local Postgres (created from
//! `migrations/`), a real Railhook API on 127.0.0.1:0, and a real HTTP client. Connection
//! settings come from the environment or from the env file that `deploy/local/up.sh` writes.
#![allow(dead_code)]

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use figment::Figment;
use railhook_common::config::Settings;
use railhook_common::db::MIGRATOR;
use railhook_ingest::AppState;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
/// The bearer token of every test server's `/metrics` (served on the API port only with one).
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789";

/// A setting from the environment, else from `.local/env`.
pub fn local_setting(name: &str) -> String {
    if let Ok(v) = std::env::var(name) {
        return v;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.local/env");
    let file = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("{name} not set and {path} missing: run deploy/local/up.sh"));
    let values: HashMap<&str, &str> = file
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .collect();
    values
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing from {path}"))
        .to_string()
}

/// A fresh, migrated database; returns its URL.
pub async fn fresh_database() -> String {
    let server = local_setting("DATABASE_URL");
    let base = server.rsplit_once('/').expect("database url").0.to_owned();
    let name = format!("rh_test_{}", ulid::Ulid::new().to_string().to_lowercase());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{base}/postgres"))
        .await
        .expect("connect to postgres");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create test database");
    admin.close().await;
    let url = format!("{base}/{name}");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    MIGRATOR.run(&pool).await.expect("migrate");
    pool.close().await;
    url
}

pub fn settings(database_url: &str, redis_url: &str) -> Settings {
    Settings::from_figment(test_figment(database_url, redis_url)).expect("test settings")
}

fn test_figment(database_url: &str, redis_url: &str) -> Figment {
    Settings::defaults()
        .merge(("database_url", database_url))
        .merge(("redis_url", redis_url))
        .merge(("admin_token", ADMIN_TOKEN))
        .merge(("api_metrics", true))
        .merge(("metrics_token", METRICS_TOKEN))
        .merge(("db_max_connections", 30))
        // As the pipeline's worker (support/pipeline.rs): receivers, token endpoints and
        // brokers on loopback. The API reads it too: an OAuth2 token_url may be plain http
        // only where private targets are allowed.
        .merge(("allow_private_targets", "127.0.0.0/8"))
        // The tests' ladders are a fraction of a second; the overload floor (5 s by default,
        // unit-tested in worker/src/retry_policy.rs) would hold every retry after a timeout.
        .merge(("retry_overload_floor_ms", 0))
}

pub struct TestApp {
    pub base: String,
    pub pool: PgPool,
    pub state: AppState,
    pub client: reqwest::Client,
    pub database_url: String,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with_redis(&local_setting("REDIS_URL")).await
}

pub async fn spawn_app_with_redis(redis_url: &str) -> TestApp {
    spawn_app_tuned(redis_url, |f| f).await
}

/// An API whose settings the test adjusts on top of the test defaults.
pub async fn spawn_app_tuned(redis_url: &str, tune: impl FnOnce(Figment) -> Figment) -> TestApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    spawn_app_at(listener, redis_url, tune).await
}

/// An API on `listener` (a test that must know its address before the settings are made,
/// such as a redirect URL, binds it first).
pub async fn spawn_app_at(
    listener: TcpListener,
    redis_url: &str,
    tune: impl FnOnce(Figment) -> Figment,
) -> TestApp {
    let database_url = fresh_database().await;
    let settings = Settings::from_figment(tune(test_figment(&database_url, redis_url)))
        .expect("test settings");
    let pool = railhook_common::db::connect(&settings).expect("pool");
    let state = AppState::new(pool.clone(), &settings).expect("state");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let served = state.clone();
    tokio::spawn(
        async move { railhook_ingest::serve(listener, served, std::future::pending()).await },
    );
    TestApp {
        base,
        pool,
        state,
        client: reqwest::Client::new(),
        database_url,
    }
}

/// A response: status, headers we look at, and the JSON body (Null when empty).
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Value,
}

impl Reply {
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }
}

impl TestApp {
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        Self::reply(resp).await
    }

    pub async fn reply(resp: reqwest::Response) -> Reply {
        let status = resp.status();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = resp.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            content_type,
            body,
        }
    }

    pub async fn admin(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(ADMIN_TOKEN), Some(body))
            .await
    }

    /// A new organization (with `quota`) and project; returns (project id, API key).
    pub async fn project_with_quota(&self, quota: i64) -> (String, String) {
        let org = self
            .admin(
                "/v1/organizations",
                json!({"name": "Acme", "monthly_quota": quota}),
            )
            .await;
        assert_eq!(org.status, StatusCode::CREATED, "{:?}", org.body);
        let project = self
            .admin(
                "/v1/projects",
                json!({"organization_id": org.body["id"], "name": "Checkout"}),
            )
            .await;
        assert_eq!(project.status, StatusCode::CREATED, "{:?}", project.body);
        (
            project.body["id"].as_str().expect("id").to_owned(),
            project.body["api_key"].as_str().expect("key").to_owned(),
        )
    }

    pub async fn project(&self) -> (String, String) {
        self.project_with_quota(1_000_000).await
    }

    pub async fn endpoint(&self, key: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/endpoints",
                Some(key),
                Some(json!({"url": "http://127.0.0.1:9/hook"})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body["id"].as_str().expect("id").to_owned()
    }

    pub async fn subscribe(
        &self,
        key: &str,
        endpoint: &str,
        patterns: &[&str],
        ordered: bool,
    ) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/subscriptions",
                Some(key),
                Some(json!({"endpoint_id": endpoint, "event_types": patterns, "ordered": ordered})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body["id"].as_str().expect("id").to_owned()
    }

    pub async fn post_event(
        &self,
        key: &str,
        event_type: &str,
        payload: Value,
        idem: Option<&str>,
    ) -> Reply {
        let mut req = self
            .client
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(key)
            .json(&json!({"type": event_type, "payload": payload}));
        if let Some(k) = idem {
            req = req.header("Idempotency-Key", k);
        }
        Self::reply(req.send().await.expect("request")).await
    }

    /// Revokes the project's only API key through the admin API.
    pub async fn revoke_key_of(&self, project: &str) {
        let key_id: String = sqlx::query_scalar("SELECT id FROM api_keys WHERE project_id = $1")
            .bind(project)
            .fetch_one(&self.pool)
            .await
            .expect("key id");
        let r = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/api-keys/{key_id}"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        assert!(r.status.is_success(), "{:?}", r.body);
    }

    /// Row counts of (events, deliveries, outbox).
    pub async fn counts(&self) -> (i64, i64, i64) {
        let count = |table: &'static str| {
            let pool = self.pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                    .fetch_one(&pool)
                    .await
                    .expect("count")
            }
        };
        (
            count("events").await,
            count("deliveries").await,
            count("outbox").await,
        )
    }

    /// Every table of the database with a row whose text form contains `marker` (as text, or
    /// hex-encoded inside a bytea): the check that something is gone from the tables, not
    /// only from the API.
    pub async fn tables_containing(&self, marker: &str) -> Vec<String> {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'
               AND tablename NOT LIKE '\\_sqlx%' ESCAPE '\\'",
        )
        .fetch_all(&self.pool)
        .await
        .expect("tables");
        let mut found = Vec::new();
        for t in tables {
            let hits: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM \"{t}\" x WHERE x::text LIKE '%' || $1 || '%'
                   OR x::text LIKE '%' || encode(convert_to($1, 'UTF8'), 'hex') || '%'"
            ))
            .bind(marker)
            .fetch_one(&self.pool)
            .await
            .expect("scan");
            if hits > 0 {
                found.push(t);
            }
        }
        found
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

/// A private Redis server on a free loopback port, killed on drop.
pub struct PrivateRedis {
    pub url: String,
    child: Child,
}

/// A free TCP port on 127.0.0.1, chosen by the kernel.
/// A free loopback port, never one this test process was handed before. The port is
/// released before a child process binds it, so two calls could otherwise return the same
/// port for two processes of one stack (the kernel reuses a released port at random): one
/// would fail to bind, and a test waiting on the other's `/readyz` (the API and the metrics
/// listeners both serve it) would talk to the wrong server.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

impl PrivateRedis {
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "private redis did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { url, child }
    }

    /// SIGKILL: Redis is gone without a goodbye, as in a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A named, bounded observation window for "nothing (more) happened": `probe` must hold at
/// every look (every 50 ms) for the whole `window`, and the first look that fails ends the
/// test with what it saw. Every caller names its window with the reason for its length.
pub async fn holds_for<F, Fut>(what: &str, window: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let end = Instant::now() + window;
    loop {
        if let Err(seen) = probe().await {
            panic!("{what}: {seen}");
        }
        if Instant::now() >= end {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` until it yields Some or the deadline passes.
/// How many sessions of this test's database wait on an advisory lock (an Idempotency-Key's,
/// held by a writer the test keeps open).
pub async fn waiting_on_advisory_locks(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'advisory'",
    )
    .fetch_one(pool)
    .await
    .expect("activity")
}

pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
pub mod brokers;
pub mod egress;
pub mod netns;
pub mod pipeline;
pub mod process;
pub mod receiver;
pub mod relay;
