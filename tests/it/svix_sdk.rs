//! The official Svix SDKs, unchanged, against a real `railhook all` (issue #37): the
//! scenario in tests/svix/ (pinned SDK versions in its manifests) creates applications,
//! endpoints with filters and channels, sends 200 messages and checks each arrived once, at
//! the right endpoints only, signed so the SDK's own `Webhook(secret).verify` accepts it;
//! then lists across pages, resends, rotates, recovers, expunges, and meets the SDK's own
//! exception types for 404, 409 and 422.

use std::process::Stdio;
use std::time::Duration;

use crate::support::fresh_database;
use crate::support::local_setting;
use crate::support::process::{ADMIN, Process, base_env, run_once};
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `railhook all` on a fresh database, and a project's API key.
async fn server() -> (Process, String) {
    let s = server_with(&[]).await;
    (s.all, s.key)
}

/// A started server, its project, and the environment it runs with (to start it again on
/// the same database).
pub(crate) struct Server {
    pub all: Process,
    pub key: String,
    pub project_id: String,
    pub env: Vec<(String, String)>,
}

/// [`server`] with `extra` settings (they win over the defaults here).
pub(crate) async fn server_with(extra: &[(&str, &str)]) -> Server {
    let mut env = base_env(&[
        ("DATABASE_URL".into(), fresh_database().await),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), local_setting("KAFKA_BROKERS")),
        // A failing receiver's messages end FAILED quickly, for the recover step.
        ("RAILHOOK_RETRY_OUTGOING_MAX_ATTEMPTS".into(), "2".into()),
        // …without opening its breaker (that is tests/it/worker.rs's subject), so the
        // recovered ones go at once rather than after a half-open probe.
        (
            "RAILHOOK_BREAKER_CONSECUTIVE_FAILURES".into(),
            "1000".into(),
        ),
        ("RAILHOOK_BREAKER_MIN_REQUESTS".into(), "1000".into()),
    ]);
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push(((*k).to_owned(), (*v).to_owned()));
    }
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "migrate: {out}");
    let (ok, out) = run_once(&["slot", "create"], &env);
    assert!(ok, "slot create: {out}");
    let all = Process::start("all", &env);
    all.wait_ready(false).await;
    let http = reqwest::Client::new();
    let org: Value = http
        .post(format!("{}/v1/organizations", all.api))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "svix", "monthly_quota": 1_000_000}))
        .send()
        .await
        .expect("org")
        .json()
        .await
        .expect("org body");
    let project: Value = http
        .post(format!("{}/v1/projects", all.api))
        .bearer_auth(ADMIN)
        .json(&json!({"organization_id": org["id"], "name": "svix"}))
        .send()
        .await
        .expect("project")
        .json()
        .await
        .expect("project body");
    let key = project["api_key"].as_str().expect("key").to_owned();
    let project_id = project["id"].as_str().expect("project id").to_owned();
    Server {
        all,
        key,
        project_id,
        env,
    }
}

async fn run_scenario(program: &str, args: &[&str], all: &Process, key: &str) {
    run_scenario_with(program, args, all, key, &[]).await;
}

/// Runs a scenario of tests/svix/ against `all` with `key`, and `extra` environment.
pub(crate) async fn run_scenario_with(
    program: &str,
    args: &[&str],
    all: &Process,
    key: &str,
    extra: &[(&str, &str)],
) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(format!("{ROOT}/tests/svix"))
        .env("RAILHOOK_URL", &all.api)
        .env("RAILHOOK_KEY", key)
        .envs(extra.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{program} (installed by deploy/local/test.sh): {e}"));
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
        .await
        .expect("the scenario finished within 5 minutes")
        .expect("scenario status");
    let output = child.wait_with_output().await.expect("output");
    if let Ok(path) = std::env::var("SVIX_SCENARIO_LOG") {
        let _ = std::fs::write(path, &output.stderr);
    }
    assert!(
        status.success(),
        "{program} scenario failed:\n{}{}\nrailhook log:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        all.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_runs_the_scenario_unchanged() {
    let (all, key) = server().await;
    run_scenario("python3", &["scenario.py"], &all, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_javascript_sdk_runs_the_scenario_unchanged() {
    let (all, key) = server().await;
    run_scenario("node", &["scenario.mjs"], &all, &key).await;
}
