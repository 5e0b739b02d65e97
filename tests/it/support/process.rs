//! `railhook` as its own process (`railhook all`, `ingest`, `relay`, `worker`) with its own
//! Slot, topics and group, logging to a file: for tests that want the real binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::{eventually, free_port};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub const ADMIN: &str = "admin-token-connectivity-0123";
pub const WAIT: Duration = Duration::from_secs(90);

pub fn unique() -> String {
    ulid::Ulid::new().to_string().to_lowercase()
}

/// One `railhook` process with its own slot, topics and group, logging to a file.
pub struct Process {
    pub child: tokio::process::Child,
    pub log: PathBuf,
    pub api: String,
    pub metrics: String,
}

/// Settings every process here shares; `extra` comes last and wins.
pub fn base_env(extra: &[(String, String)]) -> Vec<(String, String)> {
    let u = unique();
    let mut env: Vec<(String, String)> = vec![
        ("RAILHOOK_ADMIN_TOKEN".into(), ADMIN.into()),
        ("RAILHOOK_SLOT".into(), format!("rh_conn_{u}")),
        ("RAILHOOK_TOPIC_PREFIX".into(), format!("conn{u}.")),
        ("RAILHOOK_WORKER_GROUP".into(), format!("conn{u}")),
        ("RAILHOOK_KAFKA_PARTITIONS".into(), "2".into()),
        (
            "RAILHOOK_ALLOW_PRIVATE_TARGETS".into(),
            "127.0.0.0/8".into(),
        ),
        ("RAILHOOK_RETRY_OUTGOING_DELAYS".into(), "0.2".into()),
        ("RAILHOOK_RETRY_OVERLOAD_FLOOR_MS".into(), "0".into()),
        ("RAILHOOK_RELAY_STATUS_MS".into(), "200".into()),
        ("RAILHOOK_DASHBOARD_COOKIE_SECURE".into(), "false".into()),
        ("RUST_LOG".into(), "info".into()),
    ];
    for (k, v) in extra {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

pub fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs `railhook ARGS` to completion.
pub fn run_once(args: &[&str], env: &[(String, String)]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run railhook");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

impl Process {
    pub fn start(role: &str, env: &[(String, String)]) -> Self {
        let http = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let log = std::env::temp_dir().join(format!("rh-conn-{}.log", unique()));
        let file = std::fs::File::create(&log).expect("log file");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
            .arg(role)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("RAILHOOK_HTTP_ADDR", &http)
            .env("RAILHOOK_METRICS_ADDR", &metrics)
            .env("RAILHOOK_API_METRICS", "true")
            .env("RAILHOOK_METRICS_TOKEN", crate::support::METRICS_TOKEN)
            .stdout(Stdio::from(file.try_clone().expect("log")))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn railhook");
        Self {
            child,
            log,
            api: format!("http://{http}"),
            metrics: format!("http://{metrics}"),
        }
    }

    pub fn log(&self) -> String {
        log_text(&self.log)
    }

    /// `/readyz` of the API (`all`, `ingest`) or of the metrics listener (`relay`, `worker`).
    pub async fn readyz(&self, on_metrics_port: bool) -> Option<(StatusCode, Value)> {
        let base = if on_metrics_port {
            &self.metrics
        } else {
            &self.api
        };
        let r = reqwest::get(format!("{base}/readyz")).await.ok()?;
        let status = r.status();
        Some((status, r.json().await.ok()?))
    }

    /// Waits until `/readyz` shows `dependency` down with an error containing one of `words`.
    pub async fn wait_down(
        &mut self,
        on_metrics_port: bool,
        dependency: &str,
        words: &[&str],
    ) -> String {
        let seen = eventually(&format!("{dependency} reported down"), WAIT, || async {
            let (status, body) = self.readyz(on_metrics_port).await?;
            let dep = &body["dependencies"][dependency];
            let error = dep["last_error"].as_str().unwrap_or_default().to_owned();
            (status == StatusCode::SERVICE_UNAVAILABLE
                && dep["up"] == false
                && words.iter().any(|w| error.to_lowercase().contains(w)))
            .then_some(error)
        })
        .await;
        assert!(
            self.child.try_wait().expect("status").is_none(),
            "the process exited: {}",
            self.log()
        );
        seen
    }

    /// `/metrics` on the API port.
    pub async fn metrics_page(&self) -> String {
        reqwest::Client::new()
            .get(format!("{}/metrics", self.api))
            .bearer_auth(crate::support::METRICS_TOKEN)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn wait_ready(&self, on_metrics_port: bool) -> Value {
        eventually("ready", WAIT, || async {
            let (status, body) = self.readyz(on_metrics_port).await?;
            (status == StatusCode::OK).then_some(body)
        })
        .await
    }
}

/// An organisation, a project and an endpoint at `url` subscribed to everything, through
/// the API of a `railhook` process; returns the project's key.
pub async fn project_with_endpoint(api: &str, url: &str) -> String {
    let http = reqwest::Client::new();
    let post = |path: &str, token: &str, body: Value| {
        http.post(format!("{api}{path}"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let org: Value = post(
        "/v1/organizations",
        ADMIN,
        json!({"name": "c", "monthly_quota": 100_000}),
    )
    .await
    .expect("org")
    .json()
    .await
    .expect("org body");
    let project: Value = post(
        "/v1/projects",
        ADMIN,
        json!({"organization_id": org["id"], "name": "c"}),
    )
    .await
    .expect("project")
    .json()
    .await
    .expect("project body");
    let key = project["api_key"].as_str().expect("key").to_owned();
    let ep: Value = post("/v1/endpoints", &key, json!({"url": url}))
        .await
        .expect("endpoint")
        .json()
        .await
        .expect("endpoint body");
    let r = post(
        "/v1/subscriptions",
        &key,
        json!({"endpoint_id": ep["id"], "event_types": ["*"]}),
    )
    .await
    .expect("subscription");
    assert!(r.status().is_success());
    key
}

/// Posts Event `n` (`{"n": n}`); the status the API answered.
pub async fn post_event(api: &str, key: &str, n: usize) -> StatusCode {
    reqwest::Client::new()
        .post(format!("{api}/v1/events"))
        .bearer_auth(key)
        .json(&json!({"type": "order.paid", "payload": {"n": n}}))
        .send()
        .await
        .expect("post event")
        .status()
}
