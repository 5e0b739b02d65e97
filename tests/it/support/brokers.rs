//! The receivers' brokers for tests/it/transports.rs, each a real server: NATS with
//! JetStream and moto's SQS server started here (one per test, so a test may stop its own),
//! RabbitMQ started by deploy/local/rabbitmq.sh, Kafka as a private broker (relay.rs). A
//! [`Gate`] is a TCP relay a test can close, for a server whose state a restart would lose
//! (moto keeps its queues in memory). Reading back is done by each broker's own client, in
//! tests/transports/broker.py.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::free_port;

fn wait_port(port: u16, what: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `nats-server -js` on a loopback port, its JetStream store in a folder that survives a
/// restart.
pub struct Nats {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Nats {
    pub fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("rh-nats-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("nats dir");
        let mut n = Self {
            port,
            dir,
            child: None,
        };
        n.restart();
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn restart(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (apt-get install nats-server)");
        self.child = Some(child);
        wait_port(self.port, "nats-server", Duration::from_secs(20));
    }

    /// SIGKILL, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// moto's server mode (the AWS emulator from PyPI) on a loopback port.
pub struct Moto {
    pub port: u16,
    child: Child,
}

impl Moto {
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (pip install 'moto[server]')");
        wait_port(port, "moto_server", Duration::from_secs(60));
        Self { port, child }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP relay from its own loopback port to `to`, which a test closes (new connections are
/// refused and open ones cut) and opens again.
pub struct Gate {
    pub port: u16,
    open: Arc<AtomicBool>,
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl Gate {
    pub async fn start(to: u16) -> Self {
        let port = free_port();
        let open = Arc::new(AtomicBool::new(true));
        let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let gate = Self {
            port,
            open: open.clone(),
            generation: generation.clone(),
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("gate bind");
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !open.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let born = generation.load(Ordering::SeqCst);
                let generation = generation.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                    else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    let cut = async {
                        while generation.load(Ordering::SeqCst) == born {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    };
                    tokio::select! { _ = copy => {}, () = cut => {} }
                });
            }
        });
        gate
    }

    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/transports/broker.py");

/// Creates what an endpoint delivers into, with the broker's own client.
pub fn setup(kind: &str, target: &Value) {
    let out = Command::new("python3")
        .args([SCRIPT, "setup", kind, &target.to_string()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "setup {kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a consumer read back: one entry per message, each verified (or the test fails).
pub struct ReadBack {
    pub messages: Vec<Value>,
}

impl ReadBack {
    pub fn event_ids(&self) -> Vec<String> {
        self.messages
            .iter()
            .map(|m| m["event_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// Reads until `n` messages (and a short settle for any extra), verifying each message's
/// Standard Webhooks signature with `secret`.
pub async fn read(kind: &str, target: &Value, secret: &str, n: usize) -> ReadBack {
    let out = tokio::process::Command::new("python3")
        .args([
            SCRIPT,
            "read",
            kind,
            &target.to_string(),
            secret,
            &n.to_string(),
        ])
        .output()
        .await
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "read {kind}: a signature did not verify or the reader failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let summary = lines.pop().expect("summary");
    assert_eq!(summary["unverified"], 0, "{summary}");
    ReadBack { messages: lines }
}
