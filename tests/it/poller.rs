//! Polling endpoints (issue #56, docs/POLLING.md) read by the official Svix SDKs, unchanged,
//! against a real `railhook all`: tests/svix/poller.py reads part of a poller's stream with
//! two consumers, Railhook is killed (-9) and started again on the same database, and the
//! consumers read on: each must see every message once, in order (nothing lost, nothing
//! skipped); then seek, the poll token and bad input. tests/svix/poller.mjs runs one
//! scenario with the JavaScript SDK.

use crate::support::process::Process;
use crate::svix_sdk::{run_scenario_with, server_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reads_a_poller_across_a_kill_and_restart() {
    let crate::svix_sdk::Server {
        mut all, key, env, ..
    } = server_with(&[]).await;
    let state = std::env::temp_dir().join(format!(
        "rh-poller-{}.json",
        crate::support::process::unique()
    ));
    let state = state.to_string_lossy().into_owned();
    let extra = [("POLLER_STATE", state.as_str())];
    run_scenario_with("python3", &["poller.py", "setup"], &all, &key, &extra).await;
    // Mid-stream: both consumers have committed positions part-way through.
    all.child.kill().await.expect("kill -9 railhook");
    let again = Process::start("all", &env);
    again.wait_ready(false).await;
    run_scenario_with("python3", &["poller.py", "finish"], &again, &key, &extra).await;
    let _ = std::fs::remove_file(&state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_sdk_reads_a_poller_with_a_consumer() {
    let server = server_with(&[]).await;
    let (all, key) = (server.all, server.key);
    run_scenario_with("node", &["poller.mjs"], &all, &key, &[]).await;
}
