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
//! - a big day (`--big-day-events` more Events) retired by the pass, once with nothing else
//!   running (time, WAL) and once while ingest runs (ingest p99 in the pass's window);
//! - the baseline: the same day's rows retired from unpartitioned copies of the tables with
//!   batched `DELETE`s (5,000 rows a statement), the same two ways, plus the VACUUM its dead
//!   tuples need.

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
    /// Extra Events in each day retired by the comparison at the end (both ways).
    #[arg(long, default_value_t = 1_000_000)]
    big_day_events: i64,
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
    from: i64,
) -> anyhow::Result<()> {
    let [events, deliveries, attempts] = tables;
    // An id: the day's time prefix (railhook_ulid_floor, 14 characters with the type
    // prefix) and 16 hex characters (valid ULID characters) that make it unique.
    // Rows `from .. from + n`: a second fill of a day with another `from` adds to it.
    let ids_text = "WITH s AS (
                   SELECT i, $1::date::timestamp AT TIME ZONE 'UTC'
                             + ((i - $FROM) * 86400.0 / $2) * interval '1 second' AS at
                   FROM generate_series($FROM::bigint, $FROM::bigint + $2 - 1) AS i)";
    let ids = |param: usize| ids_text.replace("$FROM", &format!("${param}"));
    sqlx::query(&format!(
        "{}
         INSERT INTO {events} (id, project_id, event_type, payload, idempotency_key, created_at)
         SELECT left(railhook_ulid_floor('evt_', at), 14) || substr(md5(i::text || 'e'), 1, 16),
                $3, 'order.paid',
                jsonb_build_object('order_id', i, 'amount_cents', 4200, 'currency', 'EUR',
                                   'customer', md5(i::text), 'note', repeat('x', 80)),
                md5(i::text || 'k'), at
         FROM s",
        ids(4)
    ))
    .bind(day)
    .bind(n)
    .bind(project)
    .bind(from)
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "{}
         INSERT INTO {deliveries} (id, project_id, event_id, endpoint_id, status, attempt_count,
                                   last_attempt_at, last_status_code, created_at, updated_at)
         SELECT left(railhook_ulid_floor('dlv_', at), 14) || substr(md5(i::text || 'd'), 1, 16),
                $3, left(railhook_ulid_floor('evt_', at), 14) || substr(md5(i::text || 'e'), 1, 16),
                $4, 'SUCCEEDED', 1, at, 200, at, at
         FROM s",
        ids(5)
    ))
    .bind(day)
    .bind(n)
    .bind(project)
    .bind(endpoint)
    .bind(from)
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "{}
         INSERT INTO {attempts} (delivery_id, attempt_number, started_at, finished_at,
                                 status_code, outcome, duration_ms, response_excerpt)
         SELECT left(railhook_ulid_floor('dlv_', at), 14) || substr(md5(i::text || 'd'), 1, 16),
                1, at, at, 200, 'succeeded', 35, '{{\"ok\":true}}'
         FROM s",
        ids(3)
    ))
    .bind(day)
    .bind(n)
    .bind(from)
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
    // The last daily pass that retired a day, with no load: (pass ms, retiring ms, WAL).
    let mut last_drop: Option<(f64, f64, i64)> = None;
    let fill_started = Instant::now();
    let partitioned = ["events", "deliveries", "attempts"];
    for d in 0..args.days {
        let day = first + Days::new(d);
        sqlx::query("SELECT railhook_ensure_partitions($1, $1)")
            .bind(day)
            .execute(&pool)
            .await?;
        fill_day(&pool, partitioned, &project, &endpoint, day, n, 0).await?;
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
            last_drop = Some((took, report.retiring.as_secs_f64() * 1e3, wal));
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

    // Retiring a big day, both ways. The partitioned side: the two oldest remaining days get
    // `--big-day-events` more Events; the next pass (tomorrow 00:01) retires the first with
    // nothing else running, the one after (the day after, 00:01) the second while ingest
    // runs. Their partitions ahead are made first, so each measured pass only retires.
    let big = args.big_day_events;
    let oldest = today - Days::new(u64::from(args.retention_days));
    for day in [oldest, oldest + Days::new(1)] {
        fill_day(&pool, partitioned, &project, &endpoint, day, big, n).await?;
    }
    let at = |d: u64| {
        (today + Days::new(d))
            .and_hms_opt(0, 1, 0)
            .expect("time")
            .and_utc()
    };
    retention::ensure_ahead(&pool, at(2).date_naive()).await?;
    sqlx::query("CHECKPOINT").execute(&pool).await?;
    // The bytes the quiet pass gives back: the first big day's three partitions.
    let big_day_bytes: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
         WHERE c.relname IN ($1, $2, $3)",
    )
    .bind(retention::Table::Events.partition(oldest))
    .bind(retention::Table::Deliveries.partition(oldest))
    .bind(retention::Table::Attempts.partition(oldest))
    .fetch_one(&pool)
    .await?;
    let wal0 = wal_lsn(&pool).await?;
    let report = retention::run(&pool, at(1), args.retention_days, None).await?;
    let drop_wal = wal_lsn(&pool).await? - wal0;
    anyhow::ensure!(!report.dropped.is_empty(), "the quiet pass dropped nothing");
    let retire_ms = report.retiring.as_secs_f64() * 1e3;
    let drop_ms = report.dropping.as_secs_f64() * 1e3;
    let (pass_window, pass_ms, pass_load) = {
        let loader = load(&api, args.concurrency, args.ingest_seconds);
        let retire = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let started = Instant::now();
            let report = retention::run(&pool, at(2), args.retention_days, None).await?;
            anyhow::Ok((started.elapsed(), report.dropped.len()))
        };
        let (samples, retired) = tokio::join!(loader, retire);
        let (took, dropped) = retired?;
        anyhow::ensure!(dropped > 0, "the pass during the load dropped nothing");
        let from = Duration::from_secs(1);
        ((from, from + took), took.as_secs_f64() * 1e3, samples)
    };

    // The baseline: unpartitioned copies holding two such days; the older one deleted in
    // batches, first with nothing else running (time, WAL, dead tuples, and the VACUUM the
    // dead tuples need), then again (refilled) while the same load runs.
    for t in partitioned {
        sqlx::query(&format!(
            "CREATE TABLE {t}_flat (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        ))
        .execute(&pool)
        .await?;
    }
    let flat = ["events_flat", "deliveries_flat", "attempts_flat"];
    let old_day = today - Days::new(2);
    for day in [old_day, old_day + Days::new(1)] {
        fill_day(&pool, flat, &project, &endpoint, day, n, 0).await?;
        fill_day(&pool, flat, &project, &endpoint, day, big, n).await?;
    }
    let settle = |pool: PgPool| async move {
        sqlx::query("VACUUM ANALYZE events_flat, deliveries_flat, attempts_flat")
            .execute(&pool)
            .await?;
        sqlx::query("CHECKPOINT").execute(&pool).await?;
        anyhow::Ok(())
    };
    settle(pool.clone()).await?;
    let (delete_took, delete_wal, deleted) = delete_day(&pool, old_day).await?;
    let wal0 = wal_lsn(&pool).await?;
    let t0 = Instant::now();
    sqlx::query("VACUUM events_flat, deliveries_flat, attempts_flat")
        .execute(&pool)
        .await?;
    let (vacuum_ms, vacuum_wal) = (
        t0.elapsed().as_secs_f64() * 1e3,
        wal_lsn(&pool).await? - wal0,
    );
    fill_day(&pool, flat, &project, &endpoint, old_day, n, 0).await?;
    fill_day(&pool, flat, &project, &endpoint, old_day, big, n).await?;
    settle(pool.clone()).await?;
    let (delete_window, delete_load) = {
        let loader = load(&api, args.concurrency, args.ingest_seconds.max(10));
        let delete = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (took, _, _) = delete_day(&pool, old_day).await?;
            anyhow::Ok(took)
        };
        let (samples, took) = tokio::join!(loader, delete);
        let from = Duration::from_secs(1);
        ((from, from + took?), samples)
    };
    let dead_partitioned = dead_tuples(&pool, "^(events|deliveries|attempts)_p").await?;
    let (quiet_p99, _) = p99(&last_samples, None);
    let (during_pass_p99, during_pass_n) = p99(&pass_load.1, Some(pass_window));
    let (during_delete_p99, during_delete_n) = p99(&delete_load.1, Some(delete_window));
    let (daily_ms, daily_retire_ms, daily_wal) = last_drop.expect("a daily pass retired a day");
    let delete_ms = delete_took.as_secs_f64() * 1e3;
    let kb = |b: i64| b as f64 / 1024.0;
    let rows = n + big;
    println!();
    println!(
        "retiring one day ({rows} Events, {rows} Deliveries, {rows} Attempts), nothing else running:"
    );
    println!();
    println!("| | time (ms) | WAL (KB) | dead tuples left |");
    println!("|---|---:|---:|---:|");
    println!(
        "| batched DELETE (baseline) | {delete_ms:.0} | {:.0} | {deleted} |",
        kb(delete_wal)
    );
    println!(
        "| + the VACUUM it needs | {vacuum_ms:.0} | {:.0} | 0 |",
        kb(vacuum_wal)
    );
    println!(
        "| retention pass: detach + check + drop | {retire_ms:.0} | {:.0} (whole pass) | {dead_partitioned} |",
        kb(drop_wal)
    );
    println!(
        "| … of which `DROP TABLE` (the filesystem freeing {:.0} MB) | {drop_ms:.0} | | |",
        big_day_bytes as f64 / 1048576.0
    );
    println!(
        "| … the rest: detach, checks, catalogue | {:.0} | | |",
        retire_ms - drop_ms
    );
    println!(
        "| a daily pass of the run above ({n} Events a day): whole pass / detach + drop | {daily_ms:.0} / {daily_retire_ms:.0} | {:.0} (whole pass) | 0 |",
        kb(daily_wal)
    );
    println!();
    println!(
        "ratios, DELETE / partition retirement: time {:.0}x ({:.0}x with its VACUUM; {:.0}x against the retirement without its DROP), WAL {:.0}x ({:.0}x with its VACUUM)",
        delete_ms / retire_ms.max(0.001),
        (delete_ms + vacuum_ms) / retire_ms.max(0.001),
        delete_ms / (retire_ms - drop_ms).max(0.001),
        delete_wal as f64 / drop_wal.max(1) as f64,
        (delete_wal + vacuum_wal) as f64 / drop_wal.max(1) as f64
    );
    println!();
    println!(
        "single-Event ingest ({} clients) while a day of {rows} Events is retired:",
        args.concurrency
    );
    println!();
    println!("| | window (ms) | requests in it | p99 (ms) |");
    println!("|---|---:|---:|---:|");
    println!(
        "| batched DELETE | {:.0} | {during_delete_n} | {during_delete_p99:.1} |",
        (delete_window.1 - delete_window.0).as_secs_f64() * 1e3
    );
    println!("| retention pass | {pass_ms:.0} | {during_pass_n} | {during_pass_p99:.1} |");
    println!("| nothing (day {} run) | | | {quiet_p99:.1} |", args.days);
    Ok(())
}

/// Deletes `day`'s rows from the unpartitioned copies, 5,000 a statement (the way a
/// retention job on unpartitioned tables must, to keep its locks and transactions short).
/// Returns the time and WAL it took and the rows it deleted (each a dead tuple until the
/// next VACUUM).
async fn delete_day(pool: &PgPool, day: NaiveDate) -> anyhow::Result<(Duration, i64, u64)> {
    let started = Instant::now();
    let mut total = 0;
    let wal0 = wal_lsn(pool).await?;
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
            .bind(day + Days::new(1))
            .execute(pool)
            .await?
            .rows_affected();
            if deleted == 0 {
                break;
            }
            total += deleted;
        }
    }
    Ok((started.elapsed(), wal_lsn(pool).await? - wal0, total))
}
