//! The egress test matrix (issue #53, docs/EGRESS.md "One rule where each socket opens"):
//! for every kind of outbound connection — HTTP Attempts, OAuth2 token requests, SQS,
//! Kafka, RabbitMQ, NATS — a target name that resolves to a refused address, a literal
//! refused address, and a hostile server that points elsewhere (an HTTP redirect, a Kafka
//! cluster whose metadata names another broker, a NATS server whose `INFO` announces
//! another server). The refused address is `[::1]` while only `127.0.0.0/8` is allowed; a
//! listener there counts every connection, and nothing may ever reach it.
//!
//! The name is `rh-egress-trap.test`, which the test writes into `/etc/hosts` as `::1`
//! only (a name with an AAAA record and no A record; the tests run as root).
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{eventually, free_port};

const WAIT: Duration = Duration::from_secs(120);
const TRAP_NAME: &str = "rh-egress-trap.test";

/// A listener that counts the connections it accepts, and closes each.
struct Trap {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Trap {
    async fn bind(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("trap bind");
        let port = listener.local_addr().expect("trap addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Makes [`TRAP_NAME`] resolve to `::1` only, through `/etc/hosts`.
fn trap_name() -> &'static str {
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let listed = hosts
        .lines()
        .any(|l| l.split_whitespace().skip(1).any(|n| n == TRAP_NAME));
    if !listed {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open("/etc/hosts")
            .expect("/etc/hosts (the tests run as root)");
        writeln!(f, "::1 {TRAP_NAME}").expect("write /etc/hosts");
    }
    TRAP_NAME
}

/// A Kafka-protocol broker on a loopback port whose metadata names `[::1]:advertised` as its
/// only broker, with the topic `trapped` (created through the broker's own command line,
/// which talks to the listener and never to the advertised address).
struct HostileKafka {
    port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl HostileKafka {
    fn start(advertised: u16) -> Self {
        let bin = crate::support::relay::broker_bin();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("rh-hostile-kafka-{port}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&bin)
            .current_dir(&dir)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
            ])
            .arg(format!("tcp://[::1]:{advertised}"))
            .args(["--storage-engine", "sqlite://hostile.db"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the broker (deploy/local/broker.sh install)");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let created = Command::new("timeout")
                .args(["10", &bin, "topic", "create", "--broker", &url])
                .args(["--partitions", "1", "trapped"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if created {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the hostile broker did not start"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Self { port, dir, child }
    }
}

impl Drop for HostileKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A NATS server that answers the handshake with an `INFO` announcing `[::1]:announced` in
/// its `connect_urls`, then closes the connection so the client reconnects; counts the
/// connections it gets.
async fn hostile_nats(announced: u16) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    let info = json!({"server_id": "hostile", "server_name": "hostile", "version": "2.10.0",
        "proto": 1, "go": "go1.22", "host": "127.0.0.1", "port": port, "headers": true,
        "max_payload": 1_048_576, "jetstream": true,
        "connect_urls": [format!("[::1]:{announced}")]});
    let info = format!("INFO {info}\r\n");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let info = info.clone();
            tokio::spawn(async move {
                let _ = stream.write_all(info.as_bytes()).await;
                let mut buf = [0u8; 4096];
                let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf));
                if let Ok(Ok(n)) = read.await
                    && buf[..n].windows(4).any(|w| w == b"PING")
                {
                    let _ = stream.write_all(b"PONG\r\n").await;
                }
                // The announcement again, as a server does when its cluster changes.
                let _ = stream.write_all(info.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            });
        }
    });
    (port, conns)
}

/// What a row's Attempts must say.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Refused by the egress rule: the Delivery FAILED without an Attempt (nothing sent).
    Refused,
    /// The receiver's status line, not followed.
    Status(i32),
    /// Failed, whatever the class: the hostile server is not a working broker.
    Failed,
}

async fn endpoint(p: &Pipeline, mut body: Value) -> String {
    body["retry_delays_seconds"] = json!([0.5]);
    body["max_attempts"] = json!(50);
    body["timeout_ms"] = json!(3000);
    let r = p
        .app
        .call(Method::POST, "/v1/endpoints", Some(&p.key), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &id, &["*"], false).await;
    id
}

/// The status and failure reason of the Delivery to `endpoint` (the test sends one Event).
async fn delivery_of(p: &Pipeline, endpoint: &str) -> (String, String) {
    sqlx::query_as(
        "SELECT status::text, coalesce(failure_reason, '') FROM deliveries WHERE endpoint_id = $1",
    )
    .bind(endpoint)
    .fetch_optional(&p.app.pool)
    .await
    .expect("delivery")
    .unwrap_or_default()
}

/// The (status code, error class) of each Attempt to `endpoint`.
async fn attempts(p: &Pipeline, endpoint: &str) -> Vec<(Option<i32>, Option<String>)> {
    sqlx::query_as(
        "SELECT a.status_code, a.error_class FROM attempts a
         JOIN deliveries d ON d.id = a.delivery_id
         WHERE d.endpoint_id = $1 ORDER BY a.started_at",
    )
    .bind(endpoint)
    .fetch_all(&p.app.pool)
    .await
    .expect("attempts")
}

#[allow(clippy::too_many_lines)] // the matrix: one row per kind and case
fn rows(
    trap: u16,
    redirect: &str,
    receiver: &str,
    kafka: u16,
    nats: u16,
) -> Vec<(String, Value, Expect)> {
    let name = trap_name();
    let oauth = |token_url: String| {
        json!({"url": receiver, "authentication": {"type": "oauth2_client_credentials",
               "token_url": token_url, "client_id": "c", "client_secret": "s"}})
    };
    let sqs = |endpoint_url: String| {
        json!({"type": "sqs", "sqs": {"queue_url": format!("{endpoint_url}/123456789012/q"),
               "region": "us-east-1", "access_key_id": "a", "secret_access_key": "b",
               "endpoint_url": endpoint_url}})
    };
    let kafka_row = |broker: String| json!({"type": "kafka", "kafka": {"brokers": [broker], "topic": "trapped"}});
    let amqp = |url: String| json!({"type": "rabbitmq", "rabbitmq": {"url": url, "exchange": "x", "routing_key": "k"}});
    let nats_row = |url: String| json!({"type": "nats", "nats": {"url": url, "subject": "s"}});
    vec![
        (
            "http literal".into(),
            json!({"url": format!("http://[::1]:{trap}/hook")}),
            Expect::Refused,
        ),
        (
            "http name".into(),
            json!({"url": format!("http://{name}:{trap}/hook")}),
            Expect::Refused,
        ),
        (
            "http redirect".into(),
            json!({"url": redirect}),
            Expect::Status(307),
        ),
        (
            "oauth2 literal".into(),
            oauth(format!("http://[::1]:{trap}/token")),
            Expect::Refused,
        ),
        (
            "oauth2 name".into(),
            oauth(format!("http://{name}:{trap}/token")),
            Expect::Refused,
        ),
        (
            "oauth2 redirect".into(),
            oauth(redirect.to_owned()),
            Expect::Failed,
        ),
        (
            "sqs literal".into(),
            sqs(format!("http://[::1]:{trap}")),
            Expect::Refused,
        ),
        (
            "sqs name".into(),
            sqs(format!("http://{name}:{trap}")),
            Expect::Refused,
        ),
        (
            "sqs redirect".into(),
            sqs(redirect.trim_end_matches("/hook").to_owned()),
            Expect::Failed,
        ),
        (
            "kafka literal".into(),
            kafka_row(format!("[::1]:{trap}")),
            Expect::Refused,
        ),
        (
            "kafka name".into(),
            kafka_row(format!("{name}:{trap}")),
            Expect::Refused,
        ),
        (
            "kafka metadata".into(),
            kafka_row(format!("127.0.0.1:{kafka}")),
            Expect::Refused,
        ),
        (
            "rabbitmq literal".into(),
            amqp(format!("amqp://[::1]:{trap}")),
            Expect::Refused,
        ),
        (
            "rabbitmq name".into(),
            amqp(format!("amqp://{name}:{trap}")),
            Expect::Refused,
        ),
        (
            "nats literal".into(),
            nats_row(format!("nats://[::1]:{trap}")),
            Expect::Refused,
        ),
        (
            "nats name".into(),
            nats_row(format!("nats://{name}:{trap}")),
            Expect::Refused,
        ),
        (
            "nats info".into(),
            nats_row(format!("nats://127.0.0.1:{nats}")),
            Expect::Failed,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_of_any_kind_reaches_a_refused_address() {
    let trap = Trap::bind("[::1]:0".parse().expect("addr")).await;
    let redirect = Receiver::start(vec![], Behaviour::Redirect(307)).await;
    redirect.set_location(&format!("http://[::1]:{}/hook", trap.port));
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let kafka = HostileKafka::start(trap.port);
    let (nats, nats_conns) = hostile_nats(trap.port).await;
    // Only 127.0.0.0/8 is allowed (the test settings' default): [::1] is refused.
    let p = Pipeline::start(|s| s.allow_private_targets = "127.0.0.0/8".into()).await;
    let mut made = Vec::new();
    for (row, body, expect) in rows(trap.port, &redirect.url, &receiver.url, kafka.port, nats) {
        made.push((row, endpoint(&p, body).await, expect));
    }
    p.send(json!({"order": 1})).await;
    // A refusal ends the Delivery at once, with no Attempt row (nothing was sent); the other
    // rows have an Attempt with the hostile server's answer (a 3xx ends the Delivery too).
    for (row, id, expect) in &made {
        if *expect == Expect::Refused {
            let reason = eventually(&format!("{row} refused"), WAIT, || async {
                let (status, reason) = delivery_of(&p, id).await;
                (status == "FAILED").then_some(reason)
            })
            .await;
            assert!(
                reason.contains("not allowed") || reason.contains("target_refused"),
                "{row}: {reason}"
            );
            assert!(attempts(&p, id).await.is_empty(), "{row}");
        } else {
            eventually(&format!("an Attempt of {row}"), WAIT, || async {
                (!attempts(&p, id).await.is_empty()).then_some(())
            })
            .await;
        }
    }
    eventually("the hostile NATS server reconnected to", WAIT, || async {
        (nats_conns.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    for (row, id, expect) in &made {
        let seen = attempts(&p, id).await;
        for (status, class) in &seen {
            match expect {
                Expect::Refused => {
                    assert_eq!(class.as_deref(), Some("target_refused"), "{row}: {seen:?}")
                }
                Expect::Status(code) => assert_eq!(*status, Some(*code), "{row}: {seen:?}"),
                Expect::Failed => assert!(
                    class.is_some() || status.is_some_and(|s| s >= 300),
                    "{row}: {seen:?}"
                ),
            }
        }
    }
    assert_eq!(trap.hits(), 0, "a connection reached the refused address");
    p.stop().await;
}

/// Issue #53 finding 2: lapin was given the checked address written back into the URL, and
/// re-parsed an IPv6 one as `localhost`. Here `::1` is allowed and `127.0.0.0/8` is not: the
/// broker's name (AAAA only) must be reached at `[::1]`, and nothing at 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_host_with_only_an_ipv6_address_is_reached_there() {
    let refused = Trap::bind("127.0.0.1:0".parse().expect("addr")).await;
    let allowed = Trap::bind(format!("[::1]:{}", refused.port).parse().expect("addr")).await;
    let p = Pipeline::start(|s| s.allow_private_targets = "::1/128".into()).await;
    let id = endpoint(
        &p,
        json!({"type": "rabbitmq", "rabbitmq": {
            "url": format!("amqp://{}:{}", trap_name(), refused.port),
            "exchange": "x", "routing_key": "k"}}),
    )
    .await;
    p.send(json!({"order": 1})).await;
    eventually("two Attempts", WAIT, || async {
        (attempts(&p, &id).await.len() >= 2).then_some(())
    })
    .await;
    assert!(
        allowed.hits() >= 1,
        "the broker's IPv6 address was never connected to"
    );
    assert_eq!(refused.hits(), 0, "a connection went to 127.0.0.1 instead");
    p.stop().await;
}

/// Issue #53 finding 1: where private targets are not allowed, a token_url in clear would
/// send the client secret unencrypted: refused at the API (and by the worker, http.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_url_in_clear_is_refused_where_private_targets_are_not_allowed() {
    let app = crate::support::spawn_app_tuned(&crate::support::local_setting("REDIS_URL"), |f| {
        f.merge(("allow_private_targets", ""))
    })
    .await;
    let (_, key) = app.project().await;
    let auth = |token_url: &str| {
        json!({"url": "https://hooks.example.com/in", "authentication": {
            "type": "oauth2_client_credentials", "token_url": token_url,
            "client_id": "c", "client_secret": "s"}})
    };
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(auth("http://idp.example.com/token")),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "authentication.token_url");
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(auth("https://idp.example.com/token")),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
}

/// Issue #53 finding 14: a PATCH of an endpoint's `url` kept its stored password (and the
/// worker its token) for the new host, so anyone allowed to change the URL (a portal
/// session included) could point it at a host of theirs and collect the write-only secret.
/// Moving to another origin now needs the credential again; a path change does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_does_not_follow_the_url_to_another_origin() {
    let app = crate::support::spawn_app().await;
    let (_, key) = app.project().await;
    let patch = |id: String, body: Value| {
        let (app, key) = (&app, key.clone());
        async move {
            app.call(
                Method::PATCH,
                &format!("/v1/endpoints/{id}"),
                Some(&key),
                Some(body),
            )
            .await
        }
    };
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(
                json!({"url": "https://hooks.example.com/in", "authentication":
                {"type": "basic", "username": "u", "password": "write-only"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    // Same origin, another path: the password stays.
    let r = patch(
        id.clone(),
        json!({"url": "https://hooks.example.com/other"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    // Another host, the credential left out or sent without its secret: refused.
    for body in [
        json!({"url": "https://collector.example.net/in"}),
        json!({"url": "https://collector.example.net/in",
               "authentication": {"type": "basic", "username": "u"}}),
        json!({"url": "https://hooks.example.com:8443/in"}),
        json!({"url": "http://hooks.example.com/other"}),
    ] {
        let r = patch(id.clone(), body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            r.body
        );
        assert!(
            r.body["field"]
                .as_str()
                .unwrap_or("")
                .starts_with("authentication"),
            "{body}: {:?}",
            r.body
        );
    }
    // Sent again with its secret, or removed: accepted.
    let r = patch(
        id.clone(),
        json!({"url": "https://collector.example.net/in",
               "authentication": {"type": "basic", "username": "u", "password": "new-one"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let r = patch(
        id.clone(),
        json!({"url": "https://elsewhere.example.org/in", "authentication": null}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["authentication"], Value::Null, "{:?}", r.body);
}
