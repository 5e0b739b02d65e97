//! Relay benchmark.
//!
//! 1. A backlog of `--rows` Outbox rows (transactions of `--batch` rows) is written while two
//!    Slots hold the WAL: one for `pg_recvlogical`, one for the relay.
//! 2. Baselines: `pg_recvlogical` drains its Slot to /dev/null; a bare rdkafka producer (same
//!    settings as the relay: idempotent, acks=all, same window) sends the same Announcements.
//! 3. The relay drains its Slot: decode + produce + ack + confirm, until the confirmed LSN
//!    passes the backlog's end.
//! 4. Latency: a fresh relay, caught up, while rows are committed at `--rate` per second
//!    for `--seconds` (one row per transaction): commit → Kafka ack (the relay's histogram)
//!    and commit → consumer receipt (exact, per row).

use railhook_common::health::Dependencies;
use railhook_common::kafka::KafkaConnection;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use railhook_common::OutboxReason;
use railhook_common::announcement::{ANNOUNCEMENT_VERSION, Announcement};
use railhook_common::config::Settings;
use railhook_common::ids::{DeliveryId, EndpointId, ProjectId};
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::setup::unique;
use crate::stats::{histogram_quantile, percentiles};

#[derive(clap::Args)]
pub struct Args {
    /// Backlog size, in Outbox rows.
    #[arg(long, default_value_t = 100_000)]
    rows: i64,
    /// Rows per backlog transaction.
    #[arg(long, default_value_t = 500)]
    batch: i64,
    /// Steady-state rate for the latency phase, rows (= transactions) per second.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// Length of the latency phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
}

struct Setup {
    pool: PgPool,
    url: String,
    settings: Settings,
    relay_slot: String,
    raw_slot: String,
}

async fn setup(args: &Args) -> anyhow::Result<Setup> {
    let (mut settings, url, pool) = crate::setup::fresh().await?;
    let (relay_slot, raw_slot) = (unique("rh_bench_relay_"), unique("rh_bench_raw_"));
    for slot in [&relay_slot, &raw_slot] {
        crate::setup::create_slot(&pool, slot).await?;
    }
    settings.topic_prefix = format!("{}.", unique("bench"));
    settings.kafka_partitions = args.partitions;
    Ok(Setup {
        pool,
        url,
        settings,
        relay_slot,
        raw_slot,
    })
}

async fn current_lsn(pool: &PgPool) -> anyhow::Result<u64> {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?;
    parse_lsn(&lsn)
}

fn parse_lsn(s: &str) -> anyhow::Result<u64> {
    let (hi, lo) = s.split_once('/').context("lsn")?;
    Ok((u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?)
}

fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

async fn write_backlog(pool: &PgPool, rows: i64, batch: i64) -> anyhow::Result<()> {
    let mut written = 0;
    while written < rows {
        let n = batch.min(rows - written);
        insert_outbox_rows(pool, written, n).await?;
        written += n;
        if written % (rows / 10).max(1) < n {
            eprint!("\r  backlog: {written}/{rows} rows");
        }
    }
    eprintln!();
    Ok(())
}

/// `count` Outbox rows numbered from `from`, in one transaction (the rows the relay
/// benchmarks stream; nothing else reads them).
pub(crate) async fn insert_outbox_rows(pool: &PgPool, from: i64, count: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
         SELECT 'dlv_01jbench' || lpad(g::text, 16, '0'), 'ep_01jbench' || lpad((g % 64)::text, 15, '0'),
                'proj_01jbench0000000000000000', 'CREATED'
         FROM generate_series($1::bigint, $2::bigint - 1) g",
    )
    .bind(from)
    .bind(from + count)
    .execute(pool)
    .await?;
    Ok(())
}

/// pg_recvlogical from the raw Slot to /dev/null, until `end`.
fn pg_recvlogical(url: &str, slot: &str, publication: &str, end: u64) -> anyhow::Result<Duration> {
    let bin = std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    let started = Instant::now();
    let status = std::process::Command::new(format!("{bin}/pg_recvlogical"))
        .args([
            "-d",
            url,
            "--slot",
            slot,
            "--start",
            "--no-loop",
            "-f",
            "/dev/null",
        ])
        .args(["--endpos", &lsn_text(end)])
        .args([
            "-o",
            "proto_version=1",
            "-o",
            &format!("publication_names={publication}"),
        ])
        .status()
        .context("pg_recvlogical")?;
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    Ok(started.elapsed())
}

fn announcement(n: i64) -> Announcement {
    Announcement {
        v: ANNOUNCEMENT_VERSION,
        delivery_id: DeliveryId::from_trusted(format!("dlv_01jbench{n:016}")),
        endpoint_id: EndpointId::from_trusted(format!("ep_01jbench{:015}", n % 64)),
        project_id: ProjectId::from_trusted("proj_01jbench0000000000000000".into()),
        reason: OutboxReason::Created,
        outbox_id: n,
        commit_lsn: "0/0".into(),
    }
}

/// A topic of its own and a producer with the relay's settings, for a baseline.
async fn baseline_producer(
    config: &RelayConfig,
    suffix: &str,
) -> anyhow::Result<(String, railhook_common::kafka_producer::Producer)> {
    let topic = format!("{}-{suffix}", config.topic);
    railhook_common::kafka::ensure_topic(&config.kafka, &topic, config.partitions, 1).await?;
    let producer = railhook_common::kafka::producer(
        &config.kafka,
        config.message_timeout,
        config.max_in_flight,
    )?;
    Ok((topic, producer))
}

/// The same Announcements through a bare producer with the relay's settings and window.
async fn bare_producer(config: &RelayConfig, rows: i64) -> anyhow::Result<Duration> {
    let (topic, producer) = baseline_producer(config, "bare").await?;
    let started = Instant::now();
    let mut acks: FuturesUnordered<railhook_common::kafka_producer::Ack> = FuturesUnordered::new();
    for n in 0..rows {
        while acks.len() >= config.max_in_flight {
            let ack = acks.next().await.context("ack")?;
            ack.map_err(|_| anyhow::anyhow!("canceled"))?
                .map_err(|(e, _)| e)?;
        }
        let a = announcement(n);
        let payload = a.encode();
        acks.push(producer.send(&topic, a.key(), &payload)?);
    }
    while let Some(ack) = acks.next().await {
        ack.map_err(|_| anyhow::anyhow!("canceled"))?
            .map_err(|(e, _)| e)?;
    }
    Ok(started.elapsed())
}

/// The broker's own floor: a bare producer paced at `rate`, send → ack per message.
async fn bare_producer_latency(
    config: &RelayConfig,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<Vec<Duration>> {
    let (topic, producer) = baseline_producer(config, "bare-paced").await?;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let mut acks = FuturesUnordered::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    for n in 0..(rate * seconds) as i64 {
        tokio::time::sleep_until((started + period * n as u32).into()).await;
        let a = announcement(n);
        let payload = a.encode();

        let sent = Instant::now();
        let delivery = producer.send(&topic, a.key(), &payload)?;
        acks.push(async move {
            match delivery.await {
                Ok(Ok(_)) => Ok(sent.elapsed()),
                Ok(Err((e, _))) => Err(anyhow::Error::from(e)),
                Err(_) => Err(anyhow::anyhow!("canceled")),
            }
        });
        while let Some(Some(done)) = futures::FutureExt::now_or_never(acks.next()) {
            latencies.push(done?);
        }
    }
    while let Some(done) = acks.next().await {
        latencies.push(done?);
    }
    Ok(latencies)
}

struct Running {
    metrics: RelayMetrics,
    _stop: oneshot::Sender<()>,
}

fn start_relay(config: RelayConfig) -> Running {
    let metrics = RelayMetrics::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let m = metrics.clone();
    tokio::spawn(async move {
        if let Err(e) = railhook_relay::run(
            config,
            m,
            Arc::new(Faults::default()),
            Dependencies::new(),
            async move {
                let _ = stopped.await;
            },
        )
        .await
        {
            eprintln!("relay: {e}");
        }
    });
    Running {
        metrics,
        _stop: stop,
    }
}

async fn wait_confirmed(metrics: &RelayMetrics, end: u64, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    while (metrics.confirmed_lsn.get() as u64) < end {
        if started.elapsed() > limit {
            bail!("relay did not confirm {} within {limit:?}", lsn_text(end));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Commit → ack at the steady rate with a fresh relay, once with nothing to prune and once
/// while the prune job deletes every Outbox row written so far (the backlog and the latency
/// phase: `--rows` + rate × seconds), with a retention of zero. Review #19 item 6: the
/// prune runs in its own task, so the p99 must not move.
async fn prune_phase(s: &Setup, config: &RelayConfig, args: &Args) -> anyhow::Result<()> {
    println!();
    println!(
        "## commit → Kafka ack while the prune job runs ({} rows/s for {} s)",
        args.rate, args.seconds
    );
    println!(
        "| run | Outbox rows at start | rows pruned during the run | p50 ms | p90 ms | p99 ms |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut p99s = Vec::new();
    for (name, retention) in [
        (
            "nothing to prune (retention 1 h)",
            Duration::from_secs(3600),
        ),
        ("pruning everything (retention 0)", Duration::ZERO),
    ] {
        let mut config = config.clone();
        config.outbox_retention = retention;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&s.pool)
            .await?;
        let relay = start_relay(config);
        wait_confirmed(
            &relay.metrics,
            current_lsn(&s.pool).await?,
            Duration::from_secs(60),
        )
        .await?;
        let pruned_before = relay.metrics.pruned.get();
        steady_load(&s.pool, args.rate, args.seconds).await?;
        wait_confirmed(
            &relay.metrics,
            current_lsn(&s.pool).await?,
            Duration::from_secs(60),
        )
        .await?;
        let pruned = relay.metrics.pruned.get() - pruned_before;
        let h = &relay.metrics.commit_to_ack_seconds;
        let p99 = histogram_quantile(h, 0.99);
        println!(
            "| {name} | {rows} | {pruned} | {:.2} | {:.2} | {p99:.2} |",
            histogram_quantile(h, 0.5),
            histogram_quantile(h, 0.9),
        );
        p99s.push(p99);
        drop(relay);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let [quiet, pruning] = p99s[..] {
        println!(
            "p99 while pruning ÷ p99 without: {:.2}",
            pruning / quiet.max(0.001)
        );
    }
    Ok(())
}

/// Commits one row per transaction at `rate`/s for `seconds`; returns commit instants by id.
async fn steady_load(
    pool: &PgPool,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<HashMap<i64, Instant>> {
    let mut committed = HashMap::new();
    let total = rate * seconds;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let started = Instant::now();
    for i in 0..total {
        let due = started + period * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
             VALUES ('dlv_01jsteady' || $1::text, 'ep_01jsteady' || ($1 % 64)::text, 'proj_01jsteady', 'CREATED')
             RETURNING id",
        )
        .bind(i as i64)
        .fetch_one(pool)
        .await?;
        committed.insert(id, Instant::now());
    }
    Ok(committed)
}

/// Reads the topic from the end and records when each outbox id arrives.
fn receive(
    kafka: &KafkaConnection,
    topic: &str,
    partitions: i32,
    expect: usize,
    limit: Duration,
) -> anyhow::Result<HashMap<i64, Instant>> {
    let consumer: BaseConsumer = kafka
        .client_config()
        .set("group.id", unique("bench-"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::End)?;
    }
    consumer.assign(&tpl)?;
    let mut arrived = HashMap::new();
    let started = Instant::now();
    while arrived.len() < expect && started.elapsed() < limit {
        if expect == usize::MAX && started.elapsed() > limit.saturating_sub(Duration::from_secs(29))
        {
            break; // a load-only reader: stop shortly after the paced run ends
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) {
            let a = Announcement::decode(m.payload().unwrap_or_default())?;
            if a.delivery_id.as_str().starts_with("dlv_01jsteady") {
                arrived.entry(a.outbox_id).or_insert_with(Instant::now);
            }
        }
    }
    Ok(arrived)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let s = setup(&args).await?;
    eprintln!(
        "relay bench: {} rows in transactions of {}, {} partitions",
        args.rows, args.batch, args.partitions
    );
    write_backlog(&s.pool, args.rows, args.batch).await?;
    let end = current_lsn(&s.pool).await?;

    let recv = pg_recvlogical(&s.url, &s.raw_slot, &s.settings.publication, end)?;
    let mut relay_settings = s.settings.clone();
    relay_settings.slot = s.relay_slot.clone();
    let config = RelayConfig::from_settings(&relay_settings)?;
    let bare = bare_producer(&config, args.rows).await?;
    eprintln!("  baselines: pg_recvlogical {recv:.2?}, bare producer {bare:.2?}");

    let started = Instant::now();
    let relay = start_relay(config.clone());
    wait_confirmed(&relay.metrics, end, Duration::from_secs(600)).await?;
    let drained = started.elapsed();
    drop(relay);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let rate = |d: Duration| args.rows as f64 / d.as_secs_f64();
    let slower = rate(recv).min(rate(bare));
    println!();
    println!(
        "## relay backlog drain ({} rows, transactions of {})",
        args.rows, args.batch
    );
    println!("| path | time | rows/s | relay ÷ this |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, d) in [
        ("pg_recvlogical (raw slot drain)", recv),
        ("bare rdkafka producer (acks=all, idempotent)", bare),
        ("railhook relay (decode + produce + ack + confirm)", drained),
    ] {
        println!(
            "| {name} | {:.2} s | {:.0} | {:.2} |",
            d.as_secs_f64(),
            rate(d),
            rate(drained) / rate(d)
        );
    }
    println!(
        "relay vs the slower baseline: {:.0} %",
        100.0 * rate(drained) / slower
    );

    // Latency at a steady rate, with a fresh relay (fresh histogram) that is caught up.
    let relay = start_relay(config.clone());
    wait_confirmed(
        &relay.metrics,
        current_lsn(&s.pool).await?,
        Duration::from_secs(60),
    )
    .await?;
    let expect = (args.rate * args.seconds) as usize;
    let (brokers, topic, partitions) = (
        config.kafka.clone(),
        config.topic.clone(),
        config.partitions,
    );
    let limit = Duration::from_secs(args.seconds + 30);
    let receiver = std::thread::spawn(move || receive(&brokers, &topic, partitions, expect, limit));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let committed = steady_load(&s.pool, args.rate, args.seconds).await?;
    let arrived = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    let mut e2e: Vec<Duration> = committed
        .iter()
        .filter_map(|(id, at)| {
            arrived
                .get(id)
                .map(|got| got.saturating_duration_since(*at))
        })
        .collect();
    let h = &relay.metrics.commit_to_ack_seconds;
    println!();
    println!(
        "## commit → Kafka at {} rows/s for {} s (one row per transaction)",
        args.rate, args.seconds
    );
    println!("| measure | p50 ms | p90 ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| commit → Kafka ack (relay histogram, {} txns) | {:.2} | {:.2} | {:.2} | — |",
        h.get_sample_count(),
        histogram_quantile(h, 0.5),
        histogram_quantile(h, 0.9),
        histogram_quantile(h, 0.99)
    );
    let r = &relay.metrics.commit_to_read_seconds;
    println!(
        "| of which commit → read from the slot (relay histogram) | {:.2} | {:.2} | {:.2} | — |",
        histogram_quantile(r, 0.5),
        histogram_quantile(r, 0.9),
        histogram_quantile(r, 0.99)
    );
    if let Some([p50, p90, p99, max]) = percentiles(&mut e2e) {
        println!(
            "| commit → consumer receipt ({} of {} rows) | {p50:.2} | {p90:.2} | {p99:.2} | {max:.2} |",
            e2e.len(),
            committed.len()
        );
    }
    drop(relay);
    // The floor under the same conditions: a consumer reading the topic meanwhile.
    let bare_topic = format!("{}-bare-paced", config.topic);
    let (brokers, partitions) = (config.kafka.clone(), config.partitions);
    railhook_common::kafka::ensure_topic(&brokers, &bare_topic, partitions, 1).await?;
    let reader =
        std::thread::spawn(move || receive(&brokers, &bare_topic, partitions, usize::MAX, limit));
    let mut floor = bare_producer_latency(&config, args.rate, args.seconds).await?;
    let _ = reader.join();
    if let Some([p50, p90, p99, max]) = percentiles(&mut floor) {
        println!(
            "| baseline: bare producer send → ack at the same rate ({} msgs) | {p50:.2} | {p90:.2} | {p99:.2} | {max:.2} |",
            floor.len()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    prune_phase(&s, &config, &args).await?;
    for slot in [&s.relay_slot, &s.raw_slot] {
        let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(slot)
            .execute(&s.pool)
            .await;
    }
    Ok(())
}
