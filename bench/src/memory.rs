//! Relay memory while Kafka is down: the relay (the release `railhook relay` binary, its own
//! process, so its RSS is its own) streams from its Slot into a private broker (the local one's binary); the
//! broker is killed; `--rows` Outbox rows are committed while it is down; the broker comes
//! back and the relay drains them. RSS is sampled from /proc every 500 ms throughout.
//!
//! The relay's window (`RELAY_MAX_IN_FLIGHT` messages, `RELAY_MAX_IN_FLIGHT_BYTES`) is what
//! should keep this flat: with Kafka down it stops reading the Slot and the backlog waits
//! in Postgres's WAL, not in the relay.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::PgPool;

use crate::setup::unique;

#[derive(clap::Args)]
pub struct Args {
    /// Outbox rows committed while the broker is down.
    #[arg(long, default_value_t = 1_000_000)]
    rows: i64,
    /// Rows per transaction.
    #[arg(long, default_value_t = 1_000)]
    batch: i64,
    /// The `railhook` binary (built by deploy/local/bench.sh).
    #[arg(long, default_value = "target/release/railhook")]
    railhook: PathBuf,
    /// The broker's binary (tansu or nisshi; deploy/local/broker.sh records it).
    #[arg(
        long,
        env = "RAILHOOK_BROKER_BIN",
        default_value = "/opt/railhook-tools/tansu-0.6.0/bin/tansu"
    )]
    broker_bin: PathBuf,
}

struct Broker {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Broker {
    fn start(bin: PathBuf) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(unique("rh-bench-broker-"));
        std::fs::create_dir_all(&dir)?;
        let mut b = Self {
            bin,
            port,
            dir,
            child: None,
        };
        b.restart()?;
        Ok(b)
    }

    fn url(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        let url = self.url();
        self.child = Some(
            Command::new(&self.bin)
                .current_dir(&self.dir)
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "sqlite://broker.db"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("the broker (deploy/local/broker.sh install)")?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ok = Command::new("timeout")
                .arg("5")
                .arg(&self.bin)
                .args(["topic", "list", "--broker", &url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the private broker did not start")
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Resident set size of a process, in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    crate::stats::process_usage(pid).map(|(_, rss)| rss)
}

async fn confirmed_lag(pool: &PgPool, slot: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_one(pool)
    .await?)
}

/// Waits until the Slot's confirmed LSN passes the current WAL end as of now.
async fn wait_drained(
    pool: &PgPool,
    slot: &str,
    limit: Duration,
    pid: u32,
    peak: &mut f64,
) -> anyhow::Result<Duration> {
    let target: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    loop {
        let done: bool = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot)
        .bind(&target)
        .fetch_one(pool)
        .await?;
        if let Some(r) = rss_mib(pid) {
            *peak = peak.max(r);
        }
        if done {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!("the relay did not drain within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (settings, url, pool) = crate::setup::fresh().await?;
    let slot = unique("rh_bench_mem_");
    crate::setup::create_slot(&pool, &slot).await?;
    let mut broker = Broker::start(args.broker_bin.clone())?;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut relay = Command::new(&args.railhook)
        .arg("relay")
        .env("DATABASE_URL", &url)
        .env("KAFKA_BROKERS", format!("127.0.0.1:{}", broker.port))
        .env("RAILHOOK_SLOT", &slot)
        .env("RAILHOOK_PUBLICATION", &settings.publication)
        .env("RAILHOOK_TOPIC_PREFIX", format!("{}.", unique("mem")))
        .env("RAILHOOK_METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("{} (cargo build --release)", args.railhook.display()))?;
    let pid = relay.id();
    let result = measure(&args, &pool, &slot, pid, &mut broker).await;
    let _ = relay.kill();
    let _ = relay.wait();
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&pool)
        .await;
    result
}

async fn measure(
    args: &Args,
    pool: &PgPool,
    slot: &str,
    pid: u32,
    broker: &mut Broker,
) -> anyhow::Result<()> {
    // Warm up: 10,000 rows through a live broker.
    write(pool, 10_000, args.batch, 0).await?;
    let mut peak = 0.0;
    let warm = wait_drained(pool, slot, Duration::from_secs(120), pid, &mut peak).await?;
    let rss_live = rss_mib(pid).context("relay RSS")?;
    eprintln!(
        "  warm-up drained in {:.1} s; relay RSS {rss_live:.1} MiB",
        warm.as_secs_f64()
    );

    broker.kill();
    eprintln!("  broker killed; writing {} rows", args.rows);
    let mut samples: Vec<(f64, f64, i64)> = Vec::new();
    let started = Instant::now();
    let mut written = 0;
    let mut next_sample = Instant::now();
    while written < args.rows {
        let n = args.batch.min(args.rows - written);
        write(pool, n, args.batch, 10_000 + written).await?;
        written += n;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(500);
            let rss = rss_mib(pid).context("the relay died")?;
            samples.push((started.elapsed().as_secs_f64(), rss, written));
            eprint!("\r  {written}/{} rows, relay RSS {rss:.1} MiB", args.rows);
        }
    }
    eprintln!();
    // Ten more seconds down, with the whole backlog waiting.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss = rss_mib(pid).context("the relay died")?;
        samples.push((started.elapsed().as_secs_f64(), rss, written));
    }
    let backlog = confirmed_lag(pool, slot).await?;
    let down_peak = samples.iter().map(|s| s.1).fold(0.0, f64::max);
    broker.restart()?;
    eprintln!("  broker back; draining");
    let mut drain_peak = 0.0;
    let drained = wait_drained(pool, slot, Duration::from_secs(1800), pid, &mut drain_peak).await?;
    let rss_end = rss_mib(pid).context("relay RSS")?;

    println!(
        "## Relay memory with Kafka down ({} rows committed while the broker was down)\n",
        args.rows
    );
    println!("| moment | relay RSS MiB |\n| --- | ---: |");
    println!("| live, after 10,000 rows | {rss_live:.1} |");
    for (i, (t, rss, rows)) in samples.iter().enumerate() {
        if i % (samples.len() / 8).max(1) == 0 {
            println!("| broker down, t = {t:.0} s, {rows} rows written | {rss:.1} |");
        }
    }
    println!(
        "| **peak while down** (backlog {:.0} MiB of WAL) | **{down_peak:.1}** |",
        backlog as f64 / 1048576.0
    );
    println!("| peak while draining after the broker came back | {drain_peak:.1} |");
    println!("| after the drain | {rss_end:.1} |");
    println!(
        "\nDrain after restart: {} rows in {:.1} s ({:.0} rows/s).",
        args.rows,
        drained.as_secs_f64(),
        args.rows as f64 / drained.as_secs_f64()
    );
    Ok(())
}

async fn write(pool: &PgPool, rows: i64, batch: i64, offset: i64) -> anyhow::Result<()> {
    let mut done = 0;
    while done < rows {
        let n = batch.min(rows - done);
        crate::relay::insert_outbox_rows(pool, offset + done, n).await?;
        done += n;
    }
    Ok(())
}
