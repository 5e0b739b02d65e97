//! Real servers for tests/it/egress.rs (issue #40): Debian's tinyproxy as the egress proxy
//! (its log shows each CONNECT), stunnel in front of a test receiver requiring a client
//! certificate from deploy/local/tls.sh's CA (mutual TLS), and oauth2-mock-server from npm
//! with a receiver that accepts only its tokens (tests/egress/oauth2.mjs).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::free_port;

fn wait_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "rh-{what}-{}-{}",
        std::process::id(),
        ulid::Ulid::new()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// deploy/local/tls.sh's private CA and certificates (server for localhost, client).
pub fn tls_dir() -> PathBuf {
    PathBuf::from(super::local_setting("RAILHOOK_TLS_DIR"))
}

/// tinyproxy on a loopback port, logging every CONNECT.
pub struct Tinyproxy {
    pub port: u16,
    log: PathBuf,
    child: Child,
}

impl Tinyproxy {
    pub fn start() -> Self {
        let port = free_port();
        let dir = scratch("tinyproxy");
        // tinyproxy started as root runs as nobody: its log must be writable by it.
        let _ = Command::new("chmod").arg("777").arg(&dir).status();
        let log = dir.join("tinyproxy.log");
        let conf = dir.join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{}\"\nLogLevel Connect\n\
                 MaxClients 100\nAllow 127.0.0.1\nUser nobody\nGroup nogroup\n",
                log.display()
            ),
        )
        .expect("tinyproxy.conf");
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tinyproxy (apt-get install tinyproxy)");
        wait_port(port, "tinyproxy");
        Self { port, log, child }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The targets of the CONNECTs the proxy was asked for, in order.
    pub fn connects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split("): CONNECT ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stunnel accepting TLS for `localhost` on a loopback port and requiring a client
/// certificate signed by the local CA, in front of a plain receiver.
pub struct MutualTls {
    pub port: u16,
    child: Child,
}

impl MutualTls {
    pub fn start(receiver_port: u16) -> Self {
        let tls = tls_dir();
        let port = free_port();
        let dir = scratch("stunnel");
        let conf = dir.join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\n[receiver]\naccept = 127.0.0.1:{port}\n\
                 connect = 127.0.0.1:{receiver_port}\ncert = {}\nkey = {}\nCAfile = {}\n\
                 verifyChain = yes\nrequireCert = yes\n",
                tls.join("server.pem").display(),
                tls.join("server.key").display(),
                tls.join("ca.pem").display()
            ),
        )
        .expect("stunnel.conf");
        let child = Command::new("stunnel4")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("stunnel4");
        wait_port(port, "stunnel");
        Self { port, child }
    }

    /// The endpoint URL: by name, so the server certificate is checked against it.
    pub fn url(&self) -> String {
        format!("https://localhost:{}/hook", self.port)
    }
}

impl Drop for MutualTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client certificate and key deploy/local/tls.sh made (CN=railhook, clientAuth).
pub fn client_certificate() -> (String, String) {
    let tls = tls_dir();
    (
        std::fs::read_to_string(tls.join("client.pem")).expect("client.pem"),
        std::fs::read_to_string(tls.join("client.key")).expect("client.key"),
    )
}

/// One node process of tests/egress/oauth2.mjs, its JSON lines collected.
pub struct Node {
    pub port: u16,
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Node {
    fn start(args: &[&str]) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/egress/oauth2.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node (tests/egress: npm ci)");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first).expect("READY line");
        let port: u16 = first
            .trim()
            .strip_prefix("READY ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("oauth2.mjs did not start: {first:?}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().expect("lines").push(v);
                }
            }
        });
        Self { port, child, lines }
    }

    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().expect("lines").clone()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The provider and its receiver, steered through files in `dir` (see oauth2.mjs).
pub struct OAuth2 {
    pub dir: PathBuf,
    pub issuer: Node,
    pub receiver: Node,
}

impl OAuth2 {
    pub fn start() -> Self {
        let dir = scratch("oauth2");
        let d = dir.to_str().expect("dir").to_owned();
        let issuer = Node::start(&["issuer", "0", &d]);
        let receiver = Node::start(&["receiver", &format!("http://127.0.0.1:{}", issuer.port), &d]);
        Self {
            dir,
            issuer,
            receiver,
        }
    }

    pub fn token_url(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.issuer.port)
    }

    pub fn receiver_url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.receiver.port)
    }

    pub fn set(&self, name: &str, value: &str) {
        std::fs::write(self.dir.join(name), value).expect("control file");
    }

    pub fn clear(&self, name: &str) {
        let _ = std::fs::remove_file(self.dir.join(name));
    }

    /// Token requests the provider served, refused ones included.
    pub fn token_requests(&self) -> Vec<Value> {
        self.issuer.lines()
    }

    /// Requests the receiver served, with the status it gave.
    pub fn received(&self) -> Vec<Value> {
        self.receiver.lines()
    }

    /// Stops the provider (its port closes).
    pub fn stop_issuer(&mut self) {
        self.issuer.kill();
    }

    /// Starts the provider again on its port, with its signing key.
    pub fn restart_issuer(&mut self) {
        let d = self.dir.to_str().expect("dir").to_owned();
        let port = self.issuer.port.to_string();
        self.issuer = Node::start(&["issuer", &port, &d]);
    }
}
