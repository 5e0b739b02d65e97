//! The CDC relay against real Postgres (wal_level=logical) and a real Kafka-protocol broker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::support::local_setting;
use crate::support::relay::{KafkaReader, PrivateBroker, RelayFixture};
use railhook_relay::Faults;

const WAIT: Duration = Duration::from_secs(30);

fn shared_brokers() -> String {
    local_setting("KAFKA_BROKERS")
}

/// The end LSN of the first commit, as the observer Slot decodes it, of a transaction that
/// inserted into the Outbox (the observer was created after every earlier one).
async fn first_outbox_commit(fx: &RelayFixture, observer: &str) -> u64 {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT lsn::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)")
            .bind(observer)
            .fetch_all(&fx.pool)
            .await
            .expect("peek");
    let mut in_outbox_txn = false;
    for (lsn, data) in rows {
        if data.starts_with("table public.outbox: INSERT") {
            in_outbox_txn = true;
        } else if data.starts_with("COMMIT") && in_outbox_txn {
            return crate::support::relay::parse_lsn(&lsn);
        } else if data.starts_with("BEGIN") {
            in_outbox_txn = false;
        }
    }
    panic!("the observer saw no Outbox transaction");
}

async fn eventually_confirmed_past(fx: &RelayFixture, lsn: u64) {
    let deadline = Instant::now() + WAIT;
    while fx.confirmed_lsn().await < lsn {
        assert!(
            Instant::now() < deadline,
            "slot never confirmed past {lsn:x}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_row_reaches_kafka_and_rolled_back_rows_never_do() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let relay = fx.spawn(Arc::new(Faults::default()));
    for chunk in 0..10 {
        fx.insert(chunk * 200, chunk * 200 + 200).await;
    }
    // A rolled-back transaction's rows are in the WAL but must never be announced.
    let mut tx = fx.pool.begin().await.expect("begin");
    fx.insert_in(&mut *tx, 10_000, 10_050).await;
    tx.rollback().await.expect("rollback");
    fx.insert(2_000, 2_010).await;
    let end = fx.current_wal_lsn().await;

    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(
        reader.read_all(0..2_010, WAIT),
        "missing rows: {}",
        2_010 - reader.seen.len()
    );
    reader.read_until(Duration::from_millis(500), |_| false);
    let rolled_back = |k: &String| k[4..].parse::<i64>().is_ok_and(|n| n >= 10_000);
    assert!(
        !reader.seen.keys().any(rolled_back),
        "a rolled-back row reached Kafka"
    );
    assert_eq!(reader.seen.len(), 2_010);
    // One endpoint, one partition.
    let mut partition_of = std::collections::HashMap::new();
    for (partition, key) in reader.placed.values() {
        assert_eq!(
            *partition_of.entry(key.clone()).or_insert(*partition),
            *partition,
            "{key} split"
        );
    }
    eventually_confirmed_past(&fx, end).await;
    assert_eq!(relay.metrics.published.get(), 2_010);
    assert_eq!(relay.metrics.active.get(), 1);
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_ack_and_before_the_confirm_republishes_without_gaps() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let faults = Arc::new(Faults::default());
    faults
        .crash_after_ack_before_confirm
        .store(true, Ordering::SeqCst);
    let before = fx.confirmed_lsn().await;
    let relay = fx.spawn(faults.clone());
    fx.insert(0, 100).await;
    let end = fx.current_wal_lsn().await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(reader.read_all(0..100, WAIT));
    // Acknowledged by Kafka, but every session crashed before confirming: the slot has not
    // moved past the rows, so a restart must read them again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        fx.confirmed_lsn().await < end,
        "confirmed past an unconfirmed transaction"
    );
    assert!(fx.confirmed_lsn().await >= before);
    faults
        .crash_after_ack_before_confirm
        .store(false, Ordering::SeqCst);
    eventually_confirmed_past(&fx, end).await;
    reader.read_until(Duration::from_secs(2), |_| false);
    assert!(
        (0..100).all(|n| reader.seen[&format!("dlv_{n}")] >= 2),
        "the restart did not republish"
    );
    assert!(relay.metrics.sessions.get() >= 2);
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_produce_loses_nothing() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let faults = Arc::new(Faults::default());
    faults.crash_before_produce.store(true, Ordering::SeqCst);
    let relay = fx.spawn(faults.clone());
    fx.insert(0, 50).await;
    let end = fx.current_wal_lsn().await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    reader.read_until(Duration::from_secs(2), |_| false);
    assert!(reader.seen.is_empty());
    assert!(fx.confirmed_lsn().await < end);
    faults.crash_before_produce.store(false, Ordering::SeqCst);
    assert!(reader.read_all(0..50, WAIT));
    eventually_confirmed_past(&fx, end).await;
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_down_nothing_is_confirmed_memory_stays_bounded_and_all_arrives_after() {
    let mut broker = PrivateBroker::start();
    let fx = RelayFixture::new(&broker.brokers).await;
    let mut config = fx.config.clone();
    config.max_in_flight = 50;
    config.message_timeout = Duration::from_secs(60);
    let relay = fx.spawn_with(config, Arc::new(Faults::default()));
    fx.insert(0, 100).await;
    let mut reader = KafkaReader::new(&broker.brokers, &fx.config.topic, 3);
    assert!(reader.read_all(0..100, WAIT));
    eventually_confirmed_past(&fx, fx.current_wal_lsn().await).await;

    // An observer Slot (test_decoding) on the same database says exactly where the first
    // transaction written after the kill commits.
    let observer = format!("{}_obs", fx.slot);
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
        .bind(&observer)
        .execute(&fx.pool)
        .await
        .expect("observer slot");
    broker.kill();
    // Ten rows first: fewer than the window, so the relay goes on reading the Slot (and its
    // keepalives) while they wait for acks that cannot come.
    fx.insert(100, 110).await;
    let first_commit = first_outbox_commit(&fx, &observer).await;
    // WAL of a table outside the publication: the walsender skips those transactions and
    // sends keepalives past them, so the keepalive branch runs while the window holds
    // messages Kafka never acknowledged. It may confirm a keepalive only when idle.
    sqlx::query("CREATE TABLE noise (id serial primary key, body text)")
        .execute(&fx.pool)
        .await
        .expect("noise table");
    for _ in 0..5 {
        sqlx::query(
            "INSERT INTO noise (body) SELECT repeat('x', 200) FROM generate_series(1, 500)",
        )
        .execute(&fx.pool)
        .await
        .expect("noise");
    }
    // Backpressure, observed: at most the window is held, and the confirmed LSN never
    // reaches the first transaction written after the kill. 4 s: several status intervals
    // and keepalives, longer than the producer takes to find the broker gone.
    const BROKER_DOWN_WINDOW: Duration = Duration::from_secs(4);
    let nothing_past_the_last_ack = || async {
        let in_flight = relay.metrics.in_flight_messages.get();
        let confirmed = fx.confirmed_lsn().await;
        if in_flight > 50 {
            return Err(format!(
                "{in_flight} messages in flight over a window of 50"
            ));
        }
        if confirmed >= first_commit {
            return Err(format!(
                "confirmed {confirmed:x} at or past the unacknowledged commit {first_commit:x}"
            ));
        }
        Ok(())
    };
    crate::support::holds_for(
        "keepalives confirm nothing while messages wait",
        BROKER_DOWN_WINDOW,
        nothing_past_the_last_ack,
    )
    .await;
    // The rest: far more than the window, which stays full.
    fx.insert(110, 150).await;
    for chunk in 1..10 {
        fx.insert(100 + chunk * 50, 150 + chunk * 50).await;
    }
    crate::support::holds_for(
        "the window bounds what is held",
        BROKER_DOWN_WINDOW,
        nothing_past_the_last_ack,
    )
    .await;
    let end = fx.current_wal_lsn().await;
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&observer)
        .execute(&fx.pool)
        .await
        .expect("drop observer");

    broker.restart();
    let mut reader = KafkaReader::new(&broker.brokers, &fx.config.topic, 3);
    assert!(
        reader.read_all(0..600, Duration::from_secs(90)),
        "lost: {}",
        600 - reader.seen.len()
    );
    eventually_confirmed_past(&fx, end).await;
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_slot_advances_while_other_tables_are_written() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let relay = fx.spawn(Arc::new(Faults::default()));
    sqlx::query("CREATE TABLE noise (id serial primary key, body text)")
        .execute(&fx.pool)
        .await
        .expect("table");
    for _ in 0..20 {
        sqlx::query(
            "INSERT INTO noise (body) SELECT repeat('x', 500) FROM generate_series(1, 200)",
        )
        .execute(&fx.pool)
        .await
        .expect("noise");
    }
    let end = fx.current_wal_lsn().await;
    eventually_confirmed_past(&fx, end).await;
    // Heartbeats travel the slot: lag in seconds stays measurable with no Outbox traffic.
    let deadline = Instant::now() + WAIT;
    while relay.metrics.heartbeat_age_seconds.get() == 0.0 {
        assert!(Instant::now() < deadline, "no heartbeat seen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(relay.metrics.heartbeat_age_seconds.get() < 5.0);
    // ... and the operator's `railhook slot status` can print when the last one was seen.
    let deadline = Instant::now() + WAIT;
    loop {
        let seen: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch from now() - last_heartbeat_seen_at)::float8 FROM relay_status WHERE slot = $1",
        )
        .bind(&fx.slot)
        .fetch_optional(&fx.pool)
        .await
        .expect("relay_status")
        .flatten();
        if seen.is_some_and(|age| age < 5.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "relay_status never recorded a heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(relay.metrics.lag_seconds.get() < 5.0);
    assert_eq!(relay.metrics.published.get(), 0);
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_slot_makes_the_relay_wait_and_it_streams_once_the_slot_exists() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let mut config = fx.config.clone();
    let slot = format!("rh_late_{}", ulid::Ulid::new().to_string().to_lowercase());
    config.slot = slot.clone();
    let relay = fx.spawn_with(config, Arc::new(Faults::default()));
    crate::support::eventually("the relay reports the Slot unusable", WAIT, || async {
        (relay.metrics.slot_unusable.get() == 1).then_some(())
    })
    .await;
    let readiness = relay.deps.readiness();
    assert_eq!(readiness.status, "unready");
    let reason = readiness.dependencies["slot"]
        .last_error
        .clone()
        .unwrap_or_default();
    assert!(reason.contains("railhook slot create"), "{reason}");
    assert!(!relay.task.is_finished(), "the relay must wait, not stop");

    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')::text")
        .bind(&slot)
        .execute(&fx.pool)
        .await
        .expect("create the slot");
    crate::support::eventually("the relay streams the new Slot", WAIT, || async {
        (relay.metrics.slot_unusable.get() == 0 && relay.metrics.active.get() == 1).then_some(())
    })
    .await;
    fx.insert(0, 20).await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(
        reader.read_all(0..20, WAIT),
        "rows written after the Slot came back"
    );
    assert_eq!(relay.deps.readiness().status, "ready");
    drop(relay);
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&fx.pool)
        .await
        .ok();
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_outbox_rows_are_pruned() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let mut config = fx.config.clone();
    config.outbox_retention = Duration::ZERO;
    let relay = fx.spawn_with(config, Arc::new(Faults::default()));
    fx.insert(0, 300).await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(reader.read_all(0..300, WAIT));
    let deadline = Instant::now() + WAIT;
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&fx.pool)
            .await
            .expect("count");
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} rows never pruned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(relay.metrics.pruned.get(), 300);
    crate::support::eventually(
        "the oldest-row gauge reads 0 on an empty outbox",
        WAIT,
        || async { (relay.metrics.outbox_oldest_age_seconds.get() == 0.0).then_some(()) },
    )
    .await;
    // Deletes are not published (publish = 'insert'): nothing more reached Kafka.
    reader.read_until(Duration::from_millis(500), |_| false);
    assert_eq!(reader.seen.values().sum::<usize>(), 300);
    drop(relay);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_kept_by_the_retention_show_their_age() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let mut config = fx.config.clone();
    config.outbox_retention = Duration::from_secs(3600);
    let relay = fx.spawn_with(config, Arc::new(Faults::default()));
    fx.insert(0, 10).await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(reader.read_all(0..10, WAIT));
    // Confirmed but younger than the retention: kept, and the gauge shows them ageing.
    crate::support::eventually("the gauge shows the kept rows' age", WAIT, || async {
        (relay.metrics.outbox_oldest_age_seconds.get() >= 1.0).then_some(())
    })
    .await;
    assert_eq!(relay.metrics.pruned.get(), 0);
    drop(relay);
    fx.drop_slot().await;
}

struct RelayProcess {
    child: std::process::Child,
    metrics_url: String,
    /// The process's log (info level), printed when a scenario fails; removed on drop.
    log: std::path::PathBuf,
}

impl RelayProcess {
    /// The last lines of the process's log, for a failed assertion's message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl RelayProcess {
    fn start(fx: &RelayFixture, brokers: &str) -> Self {
        let port = crate::support::free_port();
        let prefix = fx.config.topic.trim_end_matches("deliveries");
        let log = std::env::temp_dir().join(format!("rh-relay-{}-{port}.log", fx.slot));
        let out = std::fs::File::create(&log).expect("relay log");
        let err = out.try_clone().expect("relay log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
            .arg("relay")
            .env("DATABASE_URL", &fx.database_url)
            .env("KAFKA_BROKERS", brokers)
            .env("RAILHOOK_SLOT", &fx.slot)
            .env("RAILHOOK_TOPIC_PREFIX", prefix)
            .env("RAILHOOK_KAFKA_PARTITIONS", "3")
            .env("RAILHOOK_RELAY_HEARTBEAT_MS", "200")
            .env("RAILHOOK_RELAY_STATUS_MS", "200")
            .env("RAILHOOK_METRICS_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info")
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("railhook relay");
        Self {
            child,
            metrics_url: format!("http://127.0.0.1:{port}/metrics"),
            log,
        }
    }

    /// `/readyz` (with `query`): the status code and the JSON body.
    async fn readyz(&self, query: &str) -> (u16, serde_json::Value) {
        let url = self
            .metrics_url
            .replace("/metrics", &format!("/readyz{query}"));
        let r = reqwest::get(&url).await.expect("readyz");
        let code = r.status().as_u16();
        (code, r.json().await.expect("readyz json"))
    }

    /// `Some(true)` when active, `Some(false)` when standing by, `None` when not answering.
    async fn active(&self) -> Option<bool> {
        let body = reqwest::get(&self.metrics_url)
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix("railhook_relay_active "))
            .map(|v| v.trim() == "1")
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Waits until both relays answer and exactly one holds the Slot; returns its index.
async fn single_active(relays: &[RelayProcess; 2]) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let states = [relays[0].active().await, relays[1].active().await];
        if states.iter().all(Option::is_some)
            && states.iter().filter(|s| **s == Some(true)).count() == 1
        {
            return usize::from(states[1] == Some(true));
        }
        assert!(
            Instant::now() < deadline,
            "no single active relay: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_after_the_active_relay_is_killed() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let mut relays = [
        RelayProcess::start(&fx, &brokers),
        RelayProcess::start(&fx, &brokers),
    ];
    let active = single_active(&relays).await;
    let standby = 1 - active;
    // Readiness: both relays are ready (the standby takes over within a second, so rollouts
    // count it); the body names each one's role, and `?role=active` finds the streaming one.
    for (i, role) in [(active, "active"), (standby, "standby")] {
        // Dependencies are probed on their own clocks; wait for this relay's to be in.
        let relay = &relays[i];
        let body =
            crate::support::eventually(&format!("the {role} relay ready"), WAIT, || async move {
                let (code, body) = relay.readyz("").await;
                (code == 200).then_some(body)
            })
            .await;
        assert_eq!(body["role"], role, "{body}");
        let (code, _) = relays[i].readyz("?role=active").await;
        assert_eq!(code, if role == "active" { 200 } else { 503 }, "{role}");
    }
    fx.insert(0, 500).await;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);
    assert!(reader.read_all(0..500, WAIT));

    // kill -9 mid-stream: rows keep arriving while the active relay dies.
    let writer = {
        let pool = fx.pool.clone();
        tokio::spawn(async move {
            for chunk in 0..20i64 {
                sqlx::query(
                    "INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
                     SELECT 'dlv_' || g, 'ep_' || (g % 7), 'proj_t', 'CREATED' FROM generate_series($1, $2 - 1) g",
                )
                .bind(500 + chunk * 100)
                .bind(600 + chunk * 100)
                .execute(&pool)
                .await
                .expect("insert");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    relays[active].child.kill().expect("kill -9");
    let killed_at = Instant::now();
    while relays[standby].active().await != Some(true) {
        assert!(killed_at.elapsed() < WAIT, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let takeover = killed_at.elapsed();
    writer.await.expect("writer");
    assert!(
        reader.read_all(0..2_500, WAIT),
        "lost: {}",
        2_500 - reader.seen.len()
    );
    eventually_confirmed_past(&fx, fx.current_wal_lsn().await).await;
    println!(
        "standby takeover after kill -9: {} ms",
        takeover.as_millis()
    );
    assert!(
        takeover < Duration::from_secs(10),
        "takeover took {takeover:?}"
    );
    drop(relays);
    fx.drop_slot().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_sent_sigterm_drains_and_its_standby_resends_nothing() {
    let brokers = shared_brokers();
    let fx = RelayFixture::new(&brokers).await;
    let mut relays = [
        RelayProcess::start(&fx, &brokers),
        RelayProcess::start(&fx, &brokers),
    ];
    let active = single_active(&relays).await;
    let standby = 1 - active;
    let mut reader = KafkaReader::new(&brokers, &fx.config.topic, 3);

    // SIGTERM mid-stream: transactions of 100 rows keep committing while the active relay
    // is told to stop.
    let writer = {
        let pool = fx.pool.clone();
        tokio::spawn(async move {
            for chunk in 0..60i64 {
                sqlx::query(
                    "INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
                     SELECT 'dlv_' || g, 'ep_' || (g % 7), 'proj_t', 'CREATED' FROM generate_series($1, $2 - 1) g",
                )
                .bind(chunk * 100)
                .bind(chunk * 100 + 100)
                .execute(&pool)
                .await
                .expect("insert");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = relays[active].child.id().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    assert!(signalled.success());
    let stopped_at = Instant::now();
    let status = loop {
        if let Some(status) = relays[active].child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            stopped_at.elapsed() < WAIT,
            "the relay did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let exited = stopped_at.elapsed();
    assert!(status.success(), "the relay exited with {status}");
    while relays[standby].active().await != Some(true) {
        assert!(stopped_at.elapsed() < WAIT, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let takeover = stopped_at.elapsed();
    writer.await.expect("writer");
    assert!(
        reader.read_all(0..6_000, WAIT),
        "lost: {}",
        6_000 - reader.seen.len()
    );
    // A named window for a late resend to show up before counting.
    reader.read_until(Duration::from_secs(2), |_| false);
    let duplicates: usize = reader.seen.values().map(|n| n - 1).sum();
    println!(
        "SIGTERM: relay exited after {} ms, standby active after {} ms, {duplicates} duplicates",
        exited.as_millis(),
        takeover.as_millis()
    );
    assert_eq!(
        duplicates,
        0,
        "a drained relay's standby resent messages\ndrained relay's log:\n{}\nstandby's log:\n{}",
        relays[active].log_tail(),
        relays[standby].log_tail()
    );
    assert!(
        takeover < Duration::from_secs(10),
        "takeover took {takeover:?}"
    );
    eventually_confirmed_past(&fx, fx.current_wal_lsn().await).await;
    drop(relays);
    fx.drop_slot().await;
}
