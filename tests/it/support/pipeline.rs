//! The whole path in one test process: ingest (real HTTP), the relay on the test database's
//! own Slot, and a worker with its own consumer group and topics, on the shared broker.
#![allow(dead_code)]

use railhook_common::health::Dependencies;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_common::config::Settings;
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use railhook_worker::{WorkerConfig, WorkerMetrics};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{TestApp, local_setting, settings, spawn_app};

pub struct Pipeline {
    pub app: TestApp,
    pub key: String,
    pub settings: Settings,
    pub slot: String,
    pub worker_metrics: WorkerMetrics,
    pub relay_metrics: RelayMetrics,
    stops: Vec<oneshot::Sender<()>>,
    workers: Vec<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// Worker settings for tests: loopback allowed, a ladder of short waits, fast scans.
pub fn test_settings(app: &TestApp, tweak: impl FnOnce(&mut Settings)) -> Settings {
    let mut s = settings(&app.database_url, &local_setting("REDIS_URL"));
    s.kafka_brokers = local_setting("KAFKA_BROKERS");
    s.slot = unique("rh_");
    s.topic_prefix = format!("{}.", unique("t"));
    s.worker_group = unique("g");
    s.kafka_partitions = 3;
    s.allow_private_targets = "127.0.0.0/8".into();
    s.retry_outgoing_delays = "0.2".into();
    s.retry_scheduler_ms = 100;
    s.sweep_ms = 200;
    s.relay_heartbeat_ms = 500;
    s.relay_status_ms = 500;
    tweak(&mut s);
    s
}

impl Pipeline {
    pub async fn start(tweak: impl FnOnce(&mut Settings)) -> Self {
        let app = spawn_app().await;
        let settings = test_settings(&app, tweak);
        railhook_common::db::ensure_publication(&app.pool, &settings.publication)
            .await
            .expect("publication");
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&settings.slot)
            .execute(&app.pool)
            .await
            .expect("slot");
        let (_, key) = app.project().await;
        let relay_metrics = RelayMetrics::new();
        let worker_metrics = WorkerMetrics::new();
        let (relay_stop, relay_stopped) = oneshot::channel::<()>();
        tokio::spawn(railhook_relay::run(
            RelayConfig::from_settings(&settings).expect("relay config"),
            relay_metrics.clone(),
            Arc::new(Faults::default()),
            Dependencies::new(),
            async move {
                let _ = relay_stopped.await;
            },
        ));
        let mut p = Self {
            app,
            key,
            settings,
            slot: String::new(),
            worker_metrics,
            relay_metrics,
            stops: vec![relay_stop],
            workers: Vec::new(),
        };
        p.slot = p.settings.slot.clone();
        p.spawn_worker();
        p
    }

    /// Starts one more worker in the same consumer group.
    pub fn spawn_worker(&mut self) {
        let (stop, stopped) = oneshot::channel::<()>();
        // The pools `railhook worker` makes: JIT off, one generic plan per statement, the
        // success writes on connections of their own.
        let pool = railhook_worker::Pools::connect(&self.settings).expect("worker pools");
        let run = railhook_worker::run(
            WorkerConfig::from_settings(&self.settings).expect("worker config"),
            pool,
            self.worker_metrics.clone(),
            Dependencies::new(),
            async move {
                let _ = stopped.await;
            },
        );
        let handle = tokio::spawn(async move {
            if let Err(e) = run.await {
                eprintln!("worker ended: {e}");
            }
        });
        self.workers.push((stop, handle));
    }

    /// Tells every worker to stop (as SIGTERM does) and waits until each has drained and
    /// returned; returns how long that took.
    pub async fn stop_workers(&mut self) -> Duration {
        let started = Instant::now();
        for (stop, handle) in self.workers.drain(..) {
            let _ = stop.send(());
            handle.await.expect("worker task");
        }
        started.elapsed()
    }

    /// An endpoint at `url` subscribed to everything; returns (endpoint id, secret).
    pub async fn endpoint(&self, url: &str, timeout_ms: i32) -> (String, String) {
        let r = self
            .app
            .call(
                Method::POST,
                "/v1/endpoints",
                Some(&self.key),
                Some(json!({"url": url, "timeout_ms": timeout_ms})),
            )
            .await;
        let id = r.body["id"].as_str().expect("id").to_owned();
        let secret = r.body["secret"].as_str().expect("secret").to_owned();
        self.app.subscribe(&self.key, &id, &["*"], false).await;
        (id, secret)
    }

    pub async fn send(&self, payload: Value) -> (String, String) {
        let r = self
            .app
            .post_event(&self.key, "order.paid", payload, None)
            .await;
        assert_eq!(r.status, reqwest::StatusCode::CREATED, "{:?}", r.body);
        (
            r.body["id"].as_str().expect("event").to_owned(),
            r.body["deliveries"][0]["id"]
                .as_str()
                .expect("delivery")
                .to_owned(),
        )
    }

    /// Posts an Event of `event_type`; returns the id of its Delivery to `endpoint`.
    pub async fn send_to(&self, event_type: &str, endpoint: &str) -> String {
        let r = self
            .app
            .post_event(&self.key, event_type, json!({}), None)
            .await;
        let deliveries = r.body["deliveries"].as_array().expect("deliveries");
        let to = deliveries
            .iter()
            .find(|d| d["endpoint_id"] == json!(endpoint))
            .expect("delivery");
        to["id"].as_str().expect("id").to_owned()
    }

    pub async fn delivery(&self, id: &str) -> Value {
        self.app
            .call(
                Method::GET,
                &format!("/v1/deliveries/{id}"),
                Some(&self.key),
                None,
            )
            .await
            .body
    }

    /// Polls the Delivery until its status is `status`.
    pub async fn wait_status(&self, id: &str, status: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let d = self.delivery(id).await;
            if d["status"] == json!(status) {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "delivery never reached {status}: {d}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn drop_slot(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&self.slot)
            .execute(&self.app.pool)
            .await
            .is_err()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Produces `copies` Announcements of `delivery` straight to the deliveries topic, as
    /// relay restarts or a hand-made hint would: no Outbox row, no doorbell.
    pub async fn announce_by_hand(&self, delivery: &str, endpoint: &str, copies: usize) {
        use railhook_common::announcement::{ANNOUNCEMENT_VERSION, Announcement};
        use railhook_common::ids::{DeliveryId, EndpointId, ProjectId};
        use railhook_common::status::OutboxReason;
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.settings.kafka_brokers)
            .create()
            .expect("producer");
        let topic = railhook_common::kafka::deliveries_topic(&self.settings.topic_prefix);
        let payload = Announcement {
            v: ANNOUNCEMENT_VERSION,
            delivery_id: DeliveryId::from_trusted(delivery.to_owned()),
            endpoint_id: EndpointId::from_trusted(endpoint.to_owned()),
            project_id: ProjectId::from_trusted("proj".into()),
            reason: OutboxReason::Created,
            outbox_id: 0,
            commit_lsn: "0/0".into(),
        }
        .encode();
        for _ in 0..copies {
            producer
                .send(
                    FutureRecord::to(&topic).key(endpoint).payload(&payload),
                    Duration::from_secs(5),
                )
                .await
                .expect("produce");
        }
    }

    /// Stops the relay (the first task started); workers keep running.
    pub async fn stop_relay(&mut self) {
        if !self.stops.is_empty() {
            self.stops.remove(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    pub async fn stop(mut self) {
        self.stops.clear();
        self.workers.clear();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.drop_slot().await;
    }
}
