//! Endpoints beyond HTTP, end to end against the real servers (docs/DESTINATIONS.md): Kafka
//! (a private broker), Amazon SQS (moto's server), RabbitMQ (Debian's server) and NATS
//! JetStream (Debian's nats-server). For each kind, through the whole pipeline (ingest,
//! relay, worker):
//! - 100 Events delivered exactly once, read back by the broker's own client with every
//!   signature verified (tests/transports/broker.py);
//! - the server stopped for 30 s while Events stream in: retries, then every Event
//!   delivered, nothing lost;
//! - a permanent error (no such queue, exchange or stream) ends in Failed Messages with the
//!   broker's answer, and a bulk retry after the fix delivers it;
//! - an ordered endpoint's Events arrive in order.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::brokers::{self, Gate, Moto, Nats};
use crate::support::eventually;
use crate::support::pipeline::Pipeline;

const SEALING_KEY: &str = "5b0c8e1f2a3d4c5b6a7980f1e2d3c4b5a69788f9e0d1c2b3a4958677e8f9a0b1";

const OUTAGE: Duration = Duration::from_secs(30);

/// A ladder that outlasts the outage: 13 Attempts over ~140 s.
fn patient() -> Value {
    json!([1, 2, 3, 5, 8, 10, 15, 15, 20, 20, 20, 20])
}

/// Creates an endpoint of `kind` with `settings`, subscribed to everything; returns its id
/// and secret.
async fn endpoint(p: &Pipeline, kind: &str, settings: Value, ordered: bool) -> (String, String) {
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"type": kind, kind: settings, "timeout_ms": 5000,
                        "retry_delays_seconds": patient(), "max_attempts": 13})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body["type"], kind);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let secret = r.body["secret"].as_str().expect("secret").to_owned();
    p.app.subscribe(&p.key, &id, &["*"], ordered).await;
    (id, secret)
}

/// Sends `n` Events numbered from `from`; returns their ids in order.
async fn send(p: &Pipeline, from: usize, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in from..from + n {
        let r = p
            .app
            .post_event(&p.key, "order.paid", json!({"n": i}), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        ids.push(r.body["id"].as_str().expect("event id").to_owned());
    }
    ids
}

async fn count(p: &Pipeline, endpoint: &str, status: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND status::text = $2",
    )
    .bind(endpoint)
    .bind(status)
    .fetch_one(&p.app.pool)
    .await
    .expect("count")
}

async fn all_in(p: &Pipeline, endpoint: &str, status: &str, n: i64, within: Duration) {
    eventually(&format!("{n} deliveries {status}"), within, || async {
        (count(p, endpoint, status).await >= n).then_some(())
    })
    .await;
}

/// Exactly once: every Event once, no other message, every signature verified (by the
/// reader), and for an ordered endpoint in the order sent.
fn assert_exactly(read: &brokers::ReadBack, sent: &[String], ordered: bool) {
    let got = read.event_ids();
    let unique: HashSet<&String> = got.iter().collect();
    assert_eq!(got.len(), sent.len(), "messages read: {got:?}");
    assert_eq!(unique.len(), sent.len(), "a duplicate: {got:?}");
    assert_eq!(unique, sent.iter().collect(), "not the Events sent");
    if ordered {
        assert_eq!(got, sent, "an ordered endpoint's Events out of order");
    }
}

/// Nothing lost: every Event at least once (a retry after a lost acknowledgement may
/// repeat one; each repeat carries the same `webhook-id` for the consumer to drop).
fn assert_none_lost(read: &brokers::ReadBack, sent: &[String]) {
    let got: HashSet<String> = read.event_ids().into_iter().collect();
    let missing: Vec<&String> = sent.iter().filter(|s| !got.contains(*s)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
}

/// 100 Events, exactly once and verified.
async fn hundred_exactly_once(p: &Pipeline, kind: &str, settings: Value, target: &Value) {
    let (id, secret) = endpoint(p, kind, settings, false).await;
    let sent = send(p, 0, 100).await;
    all_in(p, &id, "SUCCEEDED", 100, Duration::from_secs(120)).await;
    let read = brokers::read(kind, target, &secret, 100).await;
    assert_exactly(&read, &sent, false);
}

/// An ordered endpoint: 30 Events in the order sent.
async fn ordered_in_order(p: &Pipeline, kind: &str, settings: Value, target: &Value) {
    let (id, secret) = endpoint(p, kind, settings, true).await;
    let sent = send(p, 1000, 30).await;
    all_in(p, &id, "SUCCEEDED", 30, Duration::from_secs(120)).await;
    let read = brokers::read(kind, target, &secret, 30).await;
    assert_exactly(&read, &sent, true);
}

/// Events stream in while `stop` takes the server away for [`OUTAGE`]; `start` brings it
/// back. Every Event is delivered afterwards.
async fn outage<S, R>(p: &Pipeline, kind: &str, settings: Value, target: &Value, stop: S, start: R)
where
    S: AsyncFnOnce(),
    R: AsyncFnOnce(),
{
    let (id, secret) = endpoint(p, kind, settings, false).await;
    let mut sent = send(p, 2000, 20).await;
    stop().await;
    let down = tokio::time::Instant::now();
    sent.extend(send(p, 2020, 60).await);
    // Attempts made while it is down end in retries, not in Failed Messages.
    eventually(
        "an Attempt failed against the stopped server",
        OUTAGE,
        || async {
            let retried: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
             WHERE d.endpoint_id = $1 AND upper(a.outcome::text) = 'RETRY'",
            )
            .bind(&id)
            .fetch_one(&p.app.pool)
            .await
            .expect("attempts");
            (retried > 0).then_some(())
        },
    )
    .await;
    tokio::time::sleep_until(down + OUTAGE).await;
    start().await;
    sent.extend(send(p, 2080, 20).await);
    all_in(p, &id, "SUCCEEDED", 100, Duration::from_secs(240)).await;
    assert_eq!(count(p, &id, "FAILED").await, 0, "a Delivery failed");
    let read = brokers::read(kind, target, &secret, 100).await;
    assert_none_lost(&read, &sent);
}

/// A target that does not exist: Failed Messages with the broker's refusal, then `fix` and a
/// bulk retry delivers every one.
async fn refused_then_retried<F>(p: &Pipeline, kind: &str, settings: Value, target: &Value, fix: F)
where
    F: FnOnce(),
{
    let (id, secret) = endpoint(p, kind, settings, false).await;
    let sent = send(p, 3000, 5).await;
    all_in(p, &id, "FAILED", 5, Duration::from_secs(120)).await;
    let class: Option<String> = sqlx::query_scalar(
        "SELECT a.error_class FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
         WHERE d.endpoint_id = $1 ORDER BY a.started_at DESC LIMIT 1",
    )
    .bind(&id)
    .fetch_one(&p.app.pool)
    .await
    .expect("attempt");
    assert_eq!(class.as_deref(), Some("broker_refused"));
    let failed = p
        .app
        .call(
            Method::GET,
            &format!("/v1/failed-messages?endpoint_id={id}"),
            Some(&p.key),
            None,
        )
        .await;
    assert_eq!(
        failed.body["data"].as_array().map(Vec::len),
        Some(5),
        "{:?}",
        failed.body
    );
    fix();
    let retried = p
        .app
        .call(
            Method::POST,
            "/v1/failed-messages/retry",
            Some(&p.key),
            Some(json!({"endpoint_id": id})),
        )
        .await;
    assert_eq!(retried.body["retried"], 5, "{:?}", retried.body);
    all_in(p, &id, "SUCCEEDED", 5, Duration::from_secs(120)).await;
    let read = brokers::read(kind, target, &secret, 5).await;
    assert_exactly(&read, &sent, false);
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new().to_string().to_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_jetstream_endpoints() {
    let nats = std::sync::Mutex::new(Nats::start());
    let url = nats.lock().expect("nats").url();
    let p = Pipeline::start(|_| {}).await;
    let stream = |name: &str| {
        let subject = format!("hooks.{name}");
        let target = json!({"url": url, "subject": subject, "stream": name});
        brokers::setup("nats", &target);
        (
            json!({"url": url, "subject": subject, "jetstream": true}),
            target,
        )
    };
    let (settings, target) = stream("plain");
    hundred_exactly_once(&p, "nats", settings, &target).await;
    let (settings, target) = stream("ordered");
    ordered_in_order(&p, "nats", settings, &target).await;
    // A subject no stream captures: refused, until the stream exists.
    let missing = json!({"url": url, "subject": "hooks.later", "stream": "later"});
    let settings = json!({"url": url, "subject": "hooks.later", "jetstream": true});
    refused_then_retried(&p, "nats", settings, &missing, || {
        brokers::setup("nats", &missing);
    })
    .await;
    let (settings, target) = stream("outage");
    let stop = async || nats.lock().expect("nats").kill();
    let start = async || nats.lock().expect("nats").restart();
    outage(&p, "nats", settings, &target, stop, start).await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_endpoints() {
    let moto = Moto::start();
    let gate = Gate::start(moto.port).await;
    let p = Pipeline::start(|_| {}).await;
    let queue = |name: &str, through: u16| {
        let queue_url = format!("http://127.0.0.1:{}/123456789012/{name}", moto.port);
        let settings = json!({"queue_url": queue_url, "region": "us-east-1",
            "access_key_id": "AKIDTESTING", "secret_access_key": "testing",
            "endpoint_url": format!("http://127.0.0.1:{through}")});
        let mut target = settings.clone();
        target["endpoint_url"] = json!(moto.url());
        (settings, target)
    };
    let (settings, target) = queue("plain", moto.port);
    brokers::setup("sqs", &target);
    hundred_exactly_once(&p, "sqs", settings, &target).await;
    // A FIFO queue: the group id is the endpoint, the deduplication id the Delivery.
    let (settings, target) = queue("ordered.fifo", moto.port);
    brokers::setup("sqs", &target);
    ordered_in_order(&p, "sqs", settings, &target).await;
    let (settings, missing) = queue("later", moto.port);
    refused_then_retried(&p, "sqs", settings, &missing, || {
        brokers::setup("sqs", &missing);
    })
    .await;
    // moto keeps its queues in memory: the outage is the gate in front of it closing.
    let (settings, target) = queue("outage", gate.port);
    brokers::setup("sqs", &target);
    let stop = async || gate.close();
    let start = async || gate.open();
    outage(&p, "sqs", settings, &target, stop, start).await;
    p.stop().await;
}

fn rabbitmq(action: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/local/rabbitmq.sh");
    let ok = std::process::Command::new(script)
        .arg(action)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "rabbitmq.sh {action}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_endpoints() {
    let url = crate::support::local_setting("RABBITMQ_URL");
    // The node may be left with its broker stopped by an earlier run that failed mid-outage.
    rabbitmq("start-app");
    let p = Pipeline::start(|_| {}).await;
    let queue = |name: &str, exchange: &str| {
        let queue = unique(&format!("{name}-"));
        let settings = json!({"url": url, "exchange": exchange, "routing_key": queue});
        let target = json!({"url": url, "queue": queue, "exchange": exchange,
                            "routing_key": queue});
        (settings, target)
    };
    let (settings, target) = queue("plain", "");
    brokers::setup("rabbitmq", &target);
    hundred_exactly_once(&p, "rabbitmq", settings, &target).await;
    let (settings, target) = queue("ordered", "");
    brokers::setup("rabbitmq", &target);
    ordered_in_order(&p, "rabbitmq", settings, &target).await;
    // An exchange that does not exist yet: the broker closes the channel with 404.
    let exchange = unique("later-");
    let (settings, missing) = queue("later", &exchange);
    refused_then_retried(&p, "rabbitmq", settings, &missing, || {
        brokers::setup("rabbitmq", &missing);
    })
    .await;
    let (settings, target) = queue("outage", "");
    brokers::setup("rabbitmq", &target);
    let stop = async || rabbitmq("stop-app");
    let start = async || rabbitmq("start-app");
    outage(&p, "rabbitmq", settings, &target, stop, start).await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_endpoints() {
    let broker = std::sync::Mutex::new(crate::support::relay::PrivateBroker::start());
    let brokers = broker.lock().expect("broker").brokers.clone();
    let p = Pipeline::start(|_| {}).await;
    let topic = |name: &str, key: &str| {
        let topic = unique(&format!("{name}-"));
        let settings = json!({"brokers": [brokers], "topic": topic, "key": key});
        let target = json!({"brokers": [brokers], "topic": topic, "partitions": 3});
        brokers::setup("kafka", &target);
        (settings, target)
    };
    let (settings, target) = topic("plain", "event_id");
    hundred_exactly_once(&p, "kafka", settings, &target).await;
    // The default key is the endpoint: one partition, in order.
    let (settings, target) = topic("ordered", "endpoint");
    ordered_in_order(&p, "kafka", settings, &target).await;
    // A topic that does not exist: the cluster's metadata says so, and it is refused.
    let later = unique("later-");
    let settings = json!({"brokers": [brokers], "topic": later, "key": "event_id"});
    let missing = json!({"brokers": [brokers], "topic": later, "partitions": 3});
    refused_then_retried(&p, "kafka", settings, &missing, || {
        brokers::setup("kafka", &missing);
    })
    .await;
    let (settings, target) = topic("outage", "event_id");
    let stop = async || broker.lock().expect("broker").kill();
    let start = async || broker.lock().expect("broker").restart();
    outage(&p, "kafka", settings, &target, stop, start).await;
    p.stop().await;
}

/// Each kind's settings are checked at create time, naming the field; credentials are never
/// returned; `type` and a kind's object must agree.
#[tokio::test]
async fn broker_settings_are_validated_and_credentials_never_shown() {
    // A sealing key, so the settings are sealed at rest as in production.
    let app = crate::support::spawn_app_tuned(&crate::support::local_setting("REDIS_URL"), |f| {
        f.merge(("encryption_keys", SEALING_KEY))
    })
    .await;
    let (_, key) = app.project().await;
    let post = |body: Value| {
        let app = &app;
        let key = key.clone();
        async move {
            app.call(Method::POST, "/v1/endpoints", Some(&key), Some(body))
                .await
        }
    };
    for (body, field) in [
        (
            json!({"type": "kafka", "kafka": {"brokers": [], "topic": "t"}}),
            "kafka.brokers",
        ),
        (
            json!({"type": "kafka", "kafka": {"brokers": ["h:1"], "topic": "a b"}}),
            "kafka.topic",
        ),
        (json!({"type": "kafka"}), "kafka"),
        (
            json!({"type": "kafka", "url": "https://example.com",
                "kafka": {"brokers": ["h:1"], "topic": "t"}}),
            "url",
        ),
        (
            json!({"type": "sqs", "sqs": {"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q",
                "region": "eu-west-1", "access_key_id": "AK"}}),
            "sqs.secret_access_key",
        ),
        (
            json!({"type": "nats", "nats": {"url": "nats://h:4222", "subject": "a", "jetstream": false}}),
            "nats.jetstream",
        ),
        (
            json!({"type": "rabbitmq", "rabbitmq": {"url": "http://h", "routing_key": "q"}}),
            "rabbitmq.url",
        ),
        (
            json!({"url": "https://example.com", "nats": {"url": "nats://h:4222", "subject": "a"}}),
            "nats",
        ),
    ] {
        let r = post(body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            r.body
        );
        assert_eq!(r.code(), "validation_failed");
        assert_eq!(r.body["field"], field, "{body}: {:?}", r.body);
    }
    let r = post(json!({"type": "rabbitmq", "rabbitmq": {
        "url": "amqp://app:hunter2@mq.example.com/prod", "exchange": "events",
        "routing_key": "orders"}}))
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let shown = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{id}"),
            Some(&key),
            None,
        )
        .await;
    for body in [&r.body, &shown.body] {
        assert!(!body.to_string().contains("hunter2"), "{body}");
        assert_eq!(body["type"], "rabbitmq");
        assert_eq!(body["rabbitmq"]["exchange"], "events");
    }
    let stored: (String, Option<String>) =
        sqlx::query_as("SELECT url, transport_secret FROM endpoints WHERE id = $1")
            .bind(&id)
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert!(!stored.0.contains("hunter2"));
    let sealed = stored.1.expect("sealed settings");
    assert!(
        !sealed.contains("hunter2"),
        "the credential is sealed at rest"
    );
    let patch = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{id}"),
            Some(&key),
            Some(json!({"url": "https://example.com/hook"})),
        )
        .await;
    assert_eq!(
        patch.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        patch.body
    );
    assert_eq!(patch.body["field"], "url");
    // Its own display name sent back unchanged (a form, a Svix PUT) is no change.
    let same = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{id}"),
            Some(&key),
            Some(json!({"url": stored.0, "description": "orders"})),
        )
        .await;
    assert_eq!(same.status, StatusCode::OK, "{:?}", same.body);
    assert_eq!(same.body["type"], "rabbitmq");
    assert_eq!(same.body["description"], "orders");
    // New settings of its own kind: a password left out is kept (the API never returns it).
    let moved = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{id}"),
            Some(&key),
            Some(
                json!({"rabbitmq": {"url": "amqp://app@mq2.example.com/prod",
                                     "exchange": "events2", "routing_key": "orders"}}),
            ),
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{:?}", moved.body);
    assert_eq!(moved.body["rabbitmq"]["exchange"], "events2");
    assert!(
        moved.body["url"]
            .as_str()
            .is_some_and(|u| u.contains("mq2.example.com"))
    );
    assert!(
        !moved.body.to_string().contains("hunter2"),
        "{}",
        moved.body
    );
    let sealed: String = sqlx::query_scalar("SELECT transport_secret FROM endpoints WHERE id = $1")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .expect("row");
    let keyring = railhook_common::sealing::Keyring::parse(SEALING_KEY).expect("key");
    let opened = keyring
        .open(&railhook_common::transport::sealing_id(&id), &sealed)
        .expect("opens");
    assert!(opened.contains("app:hunter2@mq2.example.com"), "{opened}");
    // Another kind's settings, or a bad setting of its own kind: refused, naming the field.
    for (body, field) in [
        (
            json!({"nats": {"url": "nats://h:4222", "subject": "a"}}),
            "nats",
        ),
        (
            json!({"rabbitmq": {"url": "http://h", "routing_key": "q"}}),
            "rabbitmq.url",
        ),
    ] {
        let r = app
            .call(
                Method::PATCH,
                &format!("/v1/endpoints/{id}"),
                Some(&key),
                Some(body),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
    }
    // An HTTP endpoint's type does not change.
    let http = post(json!({"url": "https://example.com/hook"})).await;
    let http_id = http.body["id"].as_str().expect("id");
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{http_id}"),
            Some(&key),
            Some(json!({"kafka": {"brokers": ["h:1"], "topic": "t"}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "kafka");
}
