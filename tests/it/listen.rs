//! `railhook listen` (issue #56, docs/RECEIVERS.md) as a developer runs it: the binary as a
//! child process with one outbound WebSocket to a real `railhook all`, forwarding to a local
//! receiver in its own process (tests/listen/receiver.py). 100 Events arrive, each verified
//! with the official Standard Webhooks library; the receiver's 500 is retried by the ladder;
//! `listen` is killed (-9) mid-stream and started again, and every Event still arrives; a
//! revoked key is refused with a clear error and leaves no endpoint behind.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::process::{ADMIN, post_event, unique};
use crate::support::{eventually, free_port};
use crate::svix_sdk::{Server, server_with};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const WAIT: Duration = Duration::from_secs(120);

/// `railhook listen` forwarding to `forward_to`, its output lines collected.
struct Listen {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Listen {
    fn start(api: &str, key: &str, forward_to: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_railhook"))
            .args([
                "listen",
                "--api-url",
                api,
                "--api-key",
                key,
                "--forward-to",
                forward_to,
                "--event-types",
                "order.*",
                "--name",
                "laptop",
            ])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn railhook listen");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(out).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().expect("lines").push(line);
                }
            });
        }
        Self { child, lines }
    }

    fn output(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// The signing secret its "Ready" line shows.
    async fn ready(&self) -> String {
        eventually("railhook listen ready", WAIT, || async {
            self.output().iter().find_map(|l| {
                let rest = l.strip_prefix("Ready:")?;
                let secret = rest.split("signing secret ").nth(1)?;
                Some(secret.trim_end_matches(')').to_owned())
            })
        })
        .await
    }
}

/// The receiver's log: each request's payload `n`, webhook-id and status.
fn received(log: &str) -> Vec<(u64, String, u16)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let r: Value = serde_json::from_str(l).ok()?;
            let body: Value = serde_json::from_str(r["body"].as_str()?).ok()?;
            let id = r["headers"]
                .as_object()?
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("webhook-id"))?
                .1
                .as_str()?
                .to_owned();
            Some((
                body["n"].as_u64()?,
                id,
                u16::try_from(r["status"].as_u64()?).ok()?,
            ))
        })
        .collect()
}

/// Waits until the receiver answered 2xx for every `n` in `0..count`.
async fn all_delivered(log: &str, count: u64) {
    eventually(
        &format!("{count} Events delivered through listen"),
        WAIT,
        || async {
            let ok: HashSet<u64> = received(log)
                .into_iter()
                .filter(|(_, _, s)| *s == 200)
                .map(|(n, _, _)| n)
                .collect();
            (0..count).all(|n| ok.contains(&n)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_forwards_retries_and_survives_a_kill() {
    // A ladder that waits out a restart of `listen` (0.5 s a rung, 60 rungs).
    let Server { all, key, .. } = server_with(&[
        ("RAILHOOK_RETRY_OUTGOING_DELAYS", "0.5"),
        ("RAILHOOK_RETRY_OUTGOING_MAX_ATTEMPTS", "60"),
    ])
    .await;
    let port = free_port();
    let log = std::env::temp_dir()
        .join(format!("rh-listen-{}.jsonl", unique()))
        .to_string_lossy()
        .into_owned();
    let mut receiver = Command::new("python3")
        .args([
            &format!("{ROOT}/tests/listen/receiver.py"),
            &port.to_string(),
            &log,
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("receiver");
    let mut first = String::new();
    BufReader::new(receiver.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .await
        .expect("receiver started");
    assert_eq!(first.trim(), "listening");
    let forward_to = format!("http://127.0.0.1:{port}/webhooks");

    let mut listen = Listen::start(&all.api, &key, &forward_to);
    let secret = listen.ready().await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    for n in 0..50 {
        assert!(post_event(&all.api, &key, n).await.is_success());
    }
    all_delivered(&log, 50).await;

    // Mid-stream: killed while Events keep coming, then started again under the same name.
    listen.child.kill().await.expect("kill -9 listen");
    for n in 50..100 {
        assert!(post_event(&all.api, &key, n).await.is_success());
    }
    // Wait until an Attempt failed while it was away (the relay's 503), so the restart
    // below really meets Deliveries the ladder has to bring back.
    let http = reqwest::Client::new();
    eventually("an Attempt refused while listen was away", WAIT, || async {
        let page: Value = http
            .get(format!(
                "{}/v1/deliveries?status=PENDING&limit=100",
                all.api
            ))
            .bearer_auth(&key)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        page["data"]
            .as_array()?
            .iter()
            .any(|d| d["attempt_count"].as_i64() >= Some(1))
            .then_some(())
    })
    .await;
    let again = Listen::start(&all.api, &key, &forward_to);
    assert_eq!(
        again.ready().await,
        secret,
        "the same endpoint, the same secret"
    );
    all_delivered(&log, 100).await;

    // Every delivered request verifies with the official Standard Webhooks library.
    let verified = std::process::Command::new("python3")
        .args([&format!("{ROOT}/tests/listen/verify_all.py"), &secret, &log])
        .output()
        .expect("verify");
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    let count: usize = String::from_utf8_lossy(&verified.stdout)
        .trim()
        .parse()
        .expect("count");
    assert!(count >= 100, "{count} verified");

    // The receiver's 500 for Event 7 was retried: the same webhook-id, then a 200.
    let seven: Vec<(String, u16)> = received(&log)
        .into_iter()
        .filter(|(n, _, _)| *n == 7)
        .map(|(_, id, s)| (id, s))
        .collect();
    assert!(seven.len() >= 2 && seven[0].1 == 500, "{seven:?}");
    assert!(
        seven.iter().any(|(id, s)| *id == seven[0].0 && *s == 200),
        "{seven:?}"
    );
    // One line per request on the terminal: event type, webhook-id, status.
    let lines = again.output();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("order.paid") && l.contains("dlv_") && l.contains("  200  ")),
        "{lines:?}"
    );

    // Once each: the ids that got a 200 are distinct per Event.
    let mut per_event: HashMap<u64, HashSet<String>> = HashMap::new();
    for (n, id, s) in received(&log) {
        if s == 200 {
            per_event.entry(n).or_default().insert(id);
        }
    }
    assert!(
        per_event.values().all(|ids| ids.len() == 1),
        "{per_event:?}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_with_a_revoked_key_is_refused_and_makes_nothing() {
    let Server {
        all,
        key,
        project_id,
        ..
    } = server_with(&[]).await;
    let http = reqwest::Client::new();
    let second: Value = http
        .post(format!("{}/v1/projects/{project_id}/api-keys", all.api))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("key")
        .json()
        .await
        .expect("key body");
    let (revoked, id) = (
        second["api_key"].as_str().expect("api_key").to_owned(),
        second["id"].as_str().expect("id").to_owned(),
    );
    let r = http
        .delete(format!("{}/v1/api-keys/{id}", all.api))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("revoke");
    assert!(r.status().is_success(), "{}", r.status());
    let mut listen = Listen::start(&all.api, &revoked, "http://127.0.0.1:9/none");
    let status = tokio::time::timeout(WAIT, listen.child.wait())
        .await
        .expect("listen exits")
        .expect("status");
    assert!(!status.success());
    // The pipes' reader threads may still be collecting the output after the exit: wait
    // for the line, do not read once (a loaded full run read it empty, 2026-12-07).
    eventually("listen says why it was refused", WAIT, || async {
        listen
            .output()
            .iter()
            .any(|l| l.contains("refused the session (401"))
            .then_some(())
    })
    .await;
    // A bad pattern is a 422, also said once.
    let mut bad = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .args(["listen", "--api-url", &all.api, "--api-key", &key])
        .args([
            "--forward-to",
            "http://127.0.0.1:9/none",
            "--event-types",
            "a b",
        ])
        .env_clear()
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("listen");
    let status = tokio::time::timeout(WAIT, bad.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(!status.success());
    // Neither left an endpoint behind.
    let endpoints: Value = http
        .get(format!("{}/v1/endpoints", all.api))
        .bearer_auth(&key)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("list body");
    assert_eq!(
        endpoints["data"].as_array().map(Vec::len),
        Some(0),
        "{endpoints}"
    );
}

/// A listen client is a tenant's connection into the shared API process: a message over
/// 1 MiB closes it, and the API goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_from_a_listen_client_closes_its_connection() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
    let app = crate::support::spawn_app().await;
    let (_, key) = app.project().await;
    let url = format!(
        "{}/v1/listen?name=big",
        app.base.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the session opens");
    let big = "x".repeat(2 * 1024 * 1024);
    let _ = socket.send(tungstenite::Message::Text(big.into())).await;
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) | Some(Ok(tungstenite::Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "the server closed the connection");
    let r = app
        .call(reqwest::Method::GET, "/v1/endpoints", Some(&key), None)
        .await;
    assert_eq!(r.status, reqwest::StatusCode::OK);
}
