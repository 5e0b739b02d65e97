//! Relay fixtures: a database with the Outbox, its own Slot and topic, a Kafka reader, and a
//! private broker that a test may kill and restart.
#![allow(dead_code)]

use railhook_common::health::Dependencies;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_common::announcement::Announcement;
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::oneshot;

use super::{fresh_database, local_setting, settings};

pub struct RelayFixture {
    pub database_url: String,
    pub pool: PgPool,
    pub slot: String,
    pub config: RelayConfig,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new().to_string().to_lowercase())
}

impl RelayFixture {
    /// A fresh database with the publication and a Slot of its own, and a config whose topic
    /// is this test's alone.
    pub async fn new(brokers: &str) -> Self {
        let database_url = fresh_database().await;
        let slot = unique("rh_");
        let prefix = format!("{}.", unique("t"));
        let mut s = settings(&database_url, &local_setting("REDIS_URL"));
        s.slot = slot.clone();
        s.topic_prefix = prefix;
        s.kafka_brokers = brokers.to_owned();
        s.kafka_partitions = 3;
        s.relay_heartbeat_ms = 200;
        s.relay_status_ms = 200;
        s.kafka_message_timeout_ms = 10_000;
        let pool = PgPool::connect(&database_url).await.expect("connect");
        railhook_common::db::ensure_publication(&pool, &s.publication)
            .await
            .expect("publication");
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&slot)
            .execute(&pool)
            .await
            .expect("slot");
        Self {
            database_url,
            pool,
            slot,
            config: RelayConfig::from_settings(&s).expect("relay config"),
        }
    }

    /// Starts the relay in this process; dropping the handle's sender stops it.
    pub fn spawn(&self, faults: Arc<Faults>) -> RunningRelay {
        self.spawn_with(self.config.clone(), faults)
    }

    pub fn spawn_with(&self, config: RelayConfig, faults: Arc<Faults>) -> RunningRelay {
        let metrics = RelayMetrics::new();
        let deps = Dependencies::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(railhook_relay::run(
            config,
            metrics.clone(),
            faults,
            deps.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        RunningRelay {
            metrics,
            deps,
            _stop: stop,
            task,
        }
    }

    /// Inserts Outbox rows `from..to` in one transaction (delivery `dlv_N`, endpoint `ep_{N%7}`).
    pub async fn insert(&self, from: i64, to: i64) {
        self.insert_in(&self.pool, from, to).await;
    }

    pub async fn insert_in<'e>(&self, conn: impl sqlx::PgExecutor<'e>, from: i64, to: i64) {
        sqlx::query(
            "INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
             SELECT 'dlv_' || g, 'ep_' || (g % 7), 'proj_t', 'CREATED' FROM generate_series($1, $2 - 1) g",
        )
        .bind(from)
        .bind(to)
        .execute(conn)
        .await
        .expect("insert outbox");
    }

    pub async fn current_wal_lsn(&self) -> u64 {
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&self.pool)
            .await
            .expect("lsn");
        parse_lsn(&lsn)
    }

    pub async fn confirmed_lsn(&self) -> u64 {
        let lsn: Option<String> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_one(&self.pool)
        .await
        .expect("slot");
        lsn.as_deref().map_or(0, parse_lsn)
    }

    pub async fn drop_slot(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(&self.slot)
                .execute(&self.pool)
                .await;
            if r.is_ok() || Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub fn parse_lsn(s: &str) -> u64 {
    let (hi, lo) = s.split_once('/').expect("lsn");
    (u64::from_str_radix(hi, 16).expect("hi") << 32) | u64::from_str_radix(lo, 16).expect("lo")
}

pub struct RunningRelay {
    pub metrics: RelayMetrics,
    /// What the relay says on `/readyz`.
    pub deps: Dependencies,
    _stop: oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<Result<(), railhook_relay::RelayError>>,
}

/// Reads a topic from the beginning of every partition.
pub struct KafkaReader {
    consumer: BaseConsumer,
    /// delivery id -> how many times it arrived
    pub seen: HashMap<String, usize>,
    /// delivery id -> (partition, key)
    pub placed: HashMap<String, (i32, String)>,
}

impl KafkaReader {
    pub fn new(brokers: &str, topic: &str, partitions: i32) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", unique("reader-"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        Self {
            consumer,
            seen: HashMap::new(),
            placed: HashMap::new(),
        }
    }

    /// Reads for up to `for_at_most`, or until `done` says enough.
    pub fn read_until(
        &mut self,
        for_at_most: Duration,
        done: impl Fn(&HashMap<String, usize>) -> bool,
    ) {
        let deadline = Instant::now() + for_at_most;
        while Instant::now() < deadline && !done(&self.seen) {
            if let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(50)) {
                let a = Announcement::decode(m.payload().expect("payload")).expect("announcement");
                let key = String::from_utf8(m.key().expect("key").to_vec()).expect("utf8 key");
                assert_eq!(key, a.endpoint_id.as_str(), "key is the endpoint id");
                self.placed
                    .insert(a.delivery_id.to_string(), (m.partition(), key));
                *self.seen.entry(a.delivery_id.into_string()).or_default() += 1;
            }
        }
    }

    /// Reads until every `dlv_N` for N in `range` arrived at least once.
    pub fn read_all(&mut self, range: std::ops::Range<i64>, for_at_most: Duration) -> bool {
        let wanted: Vec<String> = range.map(|n| format!("dlv_{n}")).collect();
        self.read_until(for_at_most, |seen| {
            wanted.iter().all(|w| seen.contains_key(w))
        });
        wanted.iter().all(|w| self.seen.contains_key(w))
    }
}

/// A broker of the test's own (the local broker's binary, tansu or nisshi, which share their
/// command line) on a free port and data folder; SIGKILLed on drop.
pub struct PrivateBroker {
    pub brokers: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// `RAILHOOK_BROKER_BIN`, which deploy/local/broker.sh records in `.local/env`.
pub fn broker_bin() -> String {
    std::env::var("RAILHOOK_BROKER_BIN")
        .unwrap_or_else(|_| "/opt/railhook-tools/tansu-0.6.0/bin/tansu".to_owned())
}

/// The broker's log, appended across restarts: in `$RAILHOOK_RELIABILITY_LOGS` when that is
/// set (kept for diagnosis), else in its data folder (gone with the broker).
/// The broker's log: in its data folder, or under `$RAILHOOK_RELIABILITY_LOGS` when set.
fn broker_log_path(dir: &std::path::Path) -> PathBuf {
    match std::env::var("RAILHOOK_RELIABILITY_LOGS") {
        Ok(logs) => {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            std::path::Path::new(&logs).join(format!("{name}.log"))
        }
        Err(_) => dir.join("broker.log"),
    }
}

fn broker_log(dir: &std::path::Path) -> Stdio {
    let path = broker_log_path(dir);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

impl PrivateBroker {
    pub fn start() -> Self {
        let port = super::free_port();
        let dir = std::env::temp_dir().join(unique("rh-broker-"));
        std::fs::create_dir_all(&dir).expect("broker dir");
        let mut b = Self {
            brokers: format!("127.0.0.1:{port}"),
            port,
            dir,
            child: None,
        };
        b.restart();
        b
    }

    /// (Re)starts the broker on the same port and data folder and waits for a metadata answer.
    pub fn restart(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(broker_bin())
            .current_dir(&self.dir)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "sqlite://broker.db",
            ])
            .stdout(broker_log(&self.dir))
            .stderr(broker_log(&self.dir))
            .spawn()
            .expect("the broker (deploy/local/broker.sh install)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new("timeout")
                .args(["5", &broker_bin(), "topic", "list", "--broker", &url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "private broker did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether the broker's storage task has panicked since its last start. tansu 0.6.0's
    /// SQLite storage can panic on a Produce after a restart ("more or less than one row");
    /// the process keeps listening but answers every request with a storage error, so the
    /// only cure is what an operator would do: restart it (docs/RELIABILITY.md).
    pub fn storage_panicked(&self) -> bool {
        let log = std::fs::read_to_string(broker_log_path(&self.dir)).unwrap_or_default();
        let since_start = log.rfind("ready in").map_or("", |i| &log[i..]);
        since_start.contains("panicked at")
    }

    /// Whether the broker process is still running, and the end of its log: printed when a
    /// scenario lost something, so a failed CI run says whether the broker had died.
    pub fn diagnose(&mut self) -> String {
        let running = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => "running".to_owned(),
            Some(Ok(Some(status))) => format!("exited ({status})"),
            Some(Err(e)) => format!("unknown ({e})"),
            None => "not started".to_owned(),
        };
        let log = std::fs::read_to_string(broker_log_path(&self.dir)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        // What went wrong first matters more than the repeats at the end: any panic, and
        // the first lines after the last start.
        let panics: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("panick"))
            .take(10)
            .collect();
        let last_start = lines
            .iter()
            .rposition(|l| l.contains("ready in"))
            .unwrap_or(0);
        let after_start = &lines[last_start..(last_start + 25).min(lines.len())];
        let tail = &lines[lines.len().saturating_sub(10)..];
        format!(
            "broker {running}\npanics: {}\nafter its last start:\n{}\nits log ends:\n{}",
            panics.join("\n"),
            after_start.join("\n"),
            tail.join("\n")
        )
    }

    /// SIGKILL, as the broker notes require for tansu with sqlite.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
