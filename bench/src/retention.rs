//! Retention benchmark: simulated months on this machine.
//!
//! Railhook's API runs in this process on a fresh database. Day after simulated day (the
//! days end yesterday), a day's Events, Deliveries and Attempts are written into that day's
//! partitions (ids carry the simulated time), then the real retention pass runs with the
//! simulated "now" (`railhook_common::retention::run`), dropping the days that left the
//! retention. Printed per day: database size, partitions, the pass's time and WAL.
//!
//! Then, in the same run:
//! - single-Event ingest (real HTTP, closed loop) on the first and on the last day;
//! - ingest latency while one more day is retired by the pass, against the same load with
//!   nothing retired;
//! - the baseline: the same day's rows retired from unpartitioned copies of the tables with
//!   batched `DELETE`s (5,000 rows a statement), with the same ingest load running: time,
//!   WAL, dead tuples left for vacuum, ingest latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Days, NaiveDate, Utc};
use railhook_common::retention;
use sqlx::PgPool;
use tokio::sync::Mutex;

use crate::ingest::{Api, start_api};
use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    /// Simulated days to fill (the last one is yesterday).
    #[arg(long, default_value_t = 40)]
    days: u64,
    /// Retention in days for the pass.
    #[arg(long, default_value_t = 30)]
    retention_days: u32,
    /// Events per simulated day (each with one Delivery and one Attempt).
    #[arg(long, default_value_t = 50_000)]
    events_per_day: i64,
    /// Length of each ingest measurement.
    #[arg(long, default_value_t = 5)]
    ingest_seconds: u64,
    /// Closed-loop clients for the ingest measurements.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

/// Writes `n` Events of `day` (spread over its 24 h), one SUCCEEDED Delivery each and one
/// Attempt each, into the given tables, in three statements.
async fn fill_day(
    pool: &PgPool,
    tables: [&str; 3],
    project: &str,
    endpoint: &str,
    day: NaiveDate,
    n: i64,
) -> anyhow::Result<()> {
    let [events, deliveries, attempts] = tables;
    // An id: the day's time prefix (railhook_ulid_floor, 14 characters with the type
    // prefix) and 16 hex characters (valid ULID characters) that make it unique.
    let ids = "WITH s AS (
                   SELECT i, $1::date::timestamp AT TIME ZONE 'UTC'
                             + (i * 86400.0 / $2) * interval '1 second' AS at
                   FROM generate_series(0, $2 - 1) AS i)";
    sqlx::query(&format!(
        "{ids}
         INSERT INTO {events} (id, project_id, event_type, payload, idempotency_key, created_at)
         SELECT left(railhook_ulid_floor('evt_', at), 14) || substr(md5(i::text || 'e'), 1, 16),
                $3, 'order.paid',
                jsonb_build_object('order_id', i, 'amount_cents', 4200, 'currency', 'EUR',
                                   'customer', md5(i::text), 'note', repeat('x', 80)),
                md5(i::text || 'k'), at
         FROM s"
    ))
    .bind(day)
    .bind(n)
    .bind(project)
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "{ids}
         INSERT INTO {deliveries} (id, project_id, event_id, endpoint_id, status, attempt_count,
                                   last_attempt_at, last_status_code, created_at, updated_at)
         SELECT left(railhook_ulid_floor('dlv_', at), 14) || substr(md5(i::text || 'd'), 1, 16),
                $3, left(railhook_ulid_floor('evt_', at), 14) || substr(md5(i::text || 'e'), 1, 16),
                $4, 'SUCCEEDED', 1, at, 200, at, at
         FROM s"
    ))
    .bind(day)
    .bind(n)
    .bind(project)
    .bind(endpoint)
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "{ids}
         INSERT INTO {attempts} (delivery_id, attempt_number, started_at, finished_at,
                                 status_code, outcome, duration_ms, response_excerpt)
         SELECT left(railhook_ulid_floor('dlv_', at), 14) || substr(md5(i::text || 'd'), 1, 16),
                1, at, at, 200, 'succeeded', 35, '{{\"ok\":true}}'
         FROM s"
    ))
    .bind(day)
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

async fn wal_lsn(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(pool)
            .await?,
    )
}

async fn database_mb(pool: &PgPool) -> anyhow::Result<f64> {
    let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(pool)
        .await?;
    Ok(bytes as f64 / 1_048_576.0)
}

async fn dead_tuples(pool: &PgPool, pattern: &str) -> anyhow::Result<i64> {
    // Counters reach pg_stat_user_tables when a backend reports them; force it.
    let _ = sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE relname ~ $1",
    )
    .bind(pattern)
    .fetch_one(pool)
    .await?)
}

/// Single-Event POSTs from `concurrency` clients for `seconds`; each sample is (start
/// offset, latency).
async fn load(api: &Api, concurrency: usize, seconds: u64) -> (f64, Vec<(Duration, Duration)>) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_default();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let samples = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (http, samples, target) = (http.clone(), samples.clone(), api.target());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                if crate::ingest::post(&http, &target, crate::ingest::Shape::Single).await {
                    mine.push((t0 - started, t0.elapsed()));
                }
            }
            samples.lock().await.extend(mine);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let samples = std::mem::take(&mut *samples.lock().await);
    (samples.len() as f64 / elapsed, samples)
}

fn p99(samples: &[(Duration, Duration)], during: Option<(Duration, Duration)>) -> (f64, usize) {
    let mut picked: Vec<Duration> = samples
        .iter()
        .filter(|(at, took)| during.is_none_or(|(from, to)| *at + *took >= from && *at <= to))
        .map(|(_, took)| *took)
        .collect();
    let n = picked.len();
    (percentiles(&mut picked).map_or(f64::NAN, |p| p[2]), n)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.days > u64::from(args.retention_days),
        "--days must exceed --retention-days"
    );
    let api = start_api(1).await?;
    let pool = api.pool.clone();
    let endpoint: String = sqlx::query_scalar("SELECT id FROM endpoints LIMIT 1")
        .fetch_one(&pool)
        .await?;
    let project = api.project.clone();
    let n = args.events_per_day;
    let today = Utc::now().date_naive();
    let first = today - Days::new(args.days);
    println!(
        "retention bench: {} simulated days of {n} Events (+1 Delivery, +1 Attempt each), retention {} days",
        args.days, args.retention_days
    );
    println!();
    println!(
        "| day | DB size (MB) | event partitions | pass (ms) | pass WAL (KB) | dropped tables |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut ingest_first = None;
    let mut last_drop: Option<(f64, i64)> = None;
    let fill_started = Instant::now();
    let partitioned = ["events", "deliveries", "attempts"];
    for d in 0..args.days {
        let day = first + Days::new(d);
        sqlx::query("SELECT railhook_ensure_partitions($1, $1)")
            .bind(day)
            .execute(&pool)
            .await?;
        fill_day(&pool, partitioned, &project, &endpoint, day, n).await?;
        let sim_now = (day + Days::new(1))
            .and_hms_opt(0, 1, 0)
            .expect("time")
            .and_utc();
        let wal0 = wal_lsn(&pool).await?;
        let t0 = Instant::now();
        let report = retention::run(&pool, sim_now, args.retention_days, None).await?;
        let took = t0.elapsed().as_secs_f64() * 1e3;
        let wal = wal_lsn(&pool).await? - wal0;
        if !report.dropped.is_empty() {
            last_drop = Some((took, wal));
        }
        let partitions: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass",
        )
        .fetch_one(&pool)
        .await?;
        println!(
            "| {} | {:.0} | {partitions} | {took:.0} | {:.0} | {} |",
            d + 1,
            database_mb(&pool).await?,
            wal as f64 / 1024.0,
            report.dropped.len()
        );
        if d == 0 {
            ingest_first = Some(load(&api, args.concurrency, args.ingest_seconds).await);
        }
    }
    println!();
    println!(
        "fill and passes: {:.0} s",
        fill_started.elapsed().as_secs_f64()
    );
    let ingest_last = load(&api, args.concurrency, args.ingest_seconds).await;
    let (first_rate, first_samples) = ingest_first.expect("day 1 measured");
    let (last_rate, last_samples) = ingest_last;
    println!();
    println!("| single-Event ingest | events/s | p99 (ms) |");
    println!("|---|---:|---:|");
    println!(
        "| day 1 | {first_rate:.0} | {:.1} |",
        p99(&first_samples, None).0
    );
    println!(
        "| day {} | {last_rate:.0} | {:.1} |",
        args.days,
        p99(&last_samples, None).0
    );

    // One more day leaves the retention (the pass runs at tomorrow's 00:01): retired by the
    // pass while ingest runs.
    let retire_at = (today + Days::new(1))
        .and_hms_opt(0, 1, 0)
        .expect("time")
        .and_utc();
    // Tomorrow's partitions first, so the measured pass only retires.
    retention::ensure_ahead(&pool, retire_at.date_naive()).await?;
    let (pass_window, pass_ms, pass_wal, pass_load) = {
        let loader = load(&api, args.concurrency, args.ingest_seconds);
        let retire = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let started = Instant::now();
            let wal0 = wal_lsn(&pool).await?;
            let report = retention::run(&pool, retire_at, args.retention_days, None).await?;
            let wal = wal_lsn(&pool).await? - wal0;
            anyhow::Ok((started.elapsed(), wal, report.dropped.len()))
        };
        let (samples, retired) = tokio::join!(loader, retire);
        let (took, wal, dropped) = retired?;
        anyhow::ensure!(dropped > 0, "the pass during the load dropped nothing");
        let from = Duration::from_secs(1);
        ((from, from + took), took.as_secs_f64() * 1e3, wal, samples)
    };

    // The baseline: unpartitioned copies, two days of the same rows; the older day deleted
    // in batches while the same load runs.
    for t in partitioned {
        sqlx::query(&format!(
            "CREATE TABLE {t}_flat (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        ))
        .execute(&pool)
        .await?;
    }
    let old_day = today - Days::new(2);
    for day in [old_day, old_day + Days::new(1)] {
        fill_day(
            &pool,
            ["events_flat", "deliveries_flat", "attempts_flat"],
            &project,
            &endpoint,
            day,
            n,
        )
        .await?;
    }
    sqlx::query("VACUUM ANALYZE events_flat, deliveries_flat, attempts_flat")
        .execute(&pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(&pool).await?;
    let (delete_window, delete_ms, delete_wal, delete_load) = {
        let loader = load(&api, args.concurrency, args.ingest_seconds.max(10));
        let delete = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let started = Instant::now();
            let wal0 = wal_lsn(&pool).await?;
            for (table, prefix, column) in [
                ("attempts_flat", "dlv_", "delivery_id"),
                ("deliveries_flat", "dlv_", "id"),
                ("events_flat", "evt_", "id"),
            ] {
                loop {
                    let deleted = sqlx::query(&format!(
                        "DELETE FROM {table} WHERE ctid IN (
                             SELECT ctid FROM {table}
                             WHERE {column} < railhook_ulid_floor('{prefix}', $1::date::timestamp AT TIME ZONE 'UTC')
                             LIMIT 5000)"
                    ))
                    .bind(old_day + Days::new(1))
                    .execute(&pool)
                    .await?
                    .rows_affected();
                    if deleted == 0 {
                        break;
                    }
                }
            }
            let wal = wal_lsn(&pool).await? - wal0;
            anyhow::Ok((started.elapsed(), wal))
        };
        let (samples, deleted) = tokio::join!(loader, delete);
        let (took, wal) = deleted?;
        let from = Duration::from_secs(1);
        ((from, from + took), took.as_secs_f64() * 1e3, wal, samples)
    };
    let dead_flat = dead_tuples(&pool, "_flat$").await?;
    let dead_partitioned = dead_tuples(&pool, "^(events|deliveries|attempts)_p").await?;
    let (quiet_p99, _) = p99(&last_samples, None);
    let (during_pass_p99, during_pass_n) = p99(&pass_load.1, Some(pass_window));
    let (during_delete_p99, during_delete_n) = p99(&delete_load.1, Some(delete_window));
    let (drop_ms, drop_wal) = last_drop.unwrap_or((pass_ms, pass_wal));
    println!();
    println!("retiring one day ({n} Events, {n} Deliveries, {n} Attempts):");
    println!();
    println!("| | time (ms) | WAL (KB) | dead tuples left | ingest p99 while it runs (ms) |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| batched DELETE (baseline) | {delete_ms:.0} | {:.0} | {dead_flat} | {during_delete_p99:.1} ({during_delete_n} requests) |",
        delete_wal as f64 / 1024.0
    );
    println!(
        "| partition drop (retention pass) | {pass_ms:.0} | {:.0} | {dead_partitioned} | {during_pass_p99:.1} ({during_pass_n} requests) |",
        pass_wal as f64 / 1024.0
    );
    println!("| no retirement (same load) | | | | {quiet_p99:.1} |");
    println!();
    println!(
        "ratios, DELETE / drop: time {:.0}x, WAL {:.0}x (a pass of the daily run: {drop_ms:.0} ms, {:.0} KB)",
        delete_ms / pass_ms.max(0.001),
        delete_wal as f64 / (pass_wal.max(1)) as f64,
        drop_wal as f64 / 1024.0
    );
    Ok(())
}
