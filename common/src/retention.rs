//! Retention: `events`, `deliveries` and `attempts` are partitioned by UTC day (the day in
//! each row's ULID id; `attempts` by its Delivery's id), and storage stays bounded by
//! dropping whole days, never by deleting rows (migration 20261204000010 explains the key).
//!
//! One pass ([`run`]), by one process at a time (a session advisory lock; a second process
//! skips its turn):
//! 1. finishes what a killed pass left half done (a `DETACH … CONCURRENTLY` still pending, a
//!    partition detached and not yet dropped);
//! 2. creates the day partitions up to [`AHEAD_DAYS`] ahead;
//! 3. retires each day that ended more than the retention ago: its Deliveries (with their
//!    Attempts), then its Events.
//!
//! Invariant: a partition that holds a Delivery that is not final (PENDING or PROCESSING), or
//! an Event partition that such a Delivery points into, is never dropped. It is held back,
//! counted in `railhook_partitions_held_back`, and looked at again on the next pass. The
//! check is made twice: before the partition is detached, and again once it is detached,
//! when no transaction can reach its rows any more (`DETACH … CONCURRENTLY` waits for every
//! transaction that could). A row that became open in between (a person retried a FAILED
//! Delivery, a replay read an Event) puts the partition back.
//!
//! Detaching concurrently locks the parent only SHARE UPDATE EXCLUSIVE: ingest and the
//! workers write on. Every DDL statement runs under [`LOCK_TIMEOUT`], so a long transaction
//! elsewhere makes the pass give up and try again rather than queue writers behind it.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use prometheus::{
    Gauge, IntCounterVec, IntGaugeVec, Opts, Registry, register_gauge_with_registry,
    register_int_counter_vec_with_registry, register_int_gauge_vec_with_registry,
};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};

use crate::retry::Ladder;

/// How long an Idempotency-Key keeps answering with its Event.
pub const IDEMPOTENCY_WINDOW_HOURS: i32 = 24;
/// How long a provider's event id is remembered by incoming deduplication. Stripe retries a
/// webhook for up to three days and Shopify for two; GitHub never resends by itself.
pub const DEDUPLICATION_WINDOW_HOURS: i32 = 72;
/// Days of partitions kept ready after today. The alert fires below two.
pub const AHEAD_DAYS: u64 = 7;
/// Added to the longest horizon to get the shortest retention configuration accepts.
const MARGIN: Duration = Duration::from_secs(24 * 3600);
/// The most a DDL statement of a pass waits for a lock before the pass gives up.
pub const LOCK_TIMEOUT: &str = "10s";
/// Key of the session advisory lock that makes one pass run at a time.
const PASS_LOCK: &str = "railhook.retention";

/// The shortest retention that keeps every promise that reads old rows: no Attempt starts
/// later than a ladder's hard cap after its Delivery's ladder started, and the deduplication
/// windows look back into old partitions. One day of margin on top, rounded up to days.
pub fn minimum_days() -> u32 {
    let hours = |h: i32| Duration::from_secs(h as u64 * 3600);
    let longest = Ladder::outgoing()
        .hard_cap
        .max(Ladder::incoming().hard_cap)
        .max(hours(IDEMPOTENCY_WINDOW_HOURS))
        .max(hours(DEDUPLICATION_WINDOW_HOURS))
        + MARGIN;
    longest.as_secs().div_ceil(24 * 3600) as u32
}

/// A partitioned table, in the order a day is retired: a Delivery's Attempts go with it, and
/// Events last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Attempts,
    Deliveries,
    Events,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Attempts, Table::Deliveries, Table::Events];

    pub fn name(self) -> &'static str {
        match self {
            Table::Attempts => "attempts",
            Table::Deliveries => "deliveries",
            Table::Events => "events",
        }
    }

    /// The id prefix its partition bounds are made of.
    fn prefix(self) -> &'static str {
        match self {
            Table::Events => "evt_",
            Table::Deliveries | Table::Attempts => "dlv_",
        }
    }

    fn partition(self, day: NaiveDate) -> String {
        format!("{}_p{}", self.name(), day.format("%Y%m%d"))
    }

    fn parse_partition(name: &str) -> Option<(Table, NaiveDate)> {
        let (parent, day) = name.rsplit_once("_p")?;
        let table = Table::ALL.into_iter().find(|t| t.name() == parent)?;
        let day = NaiveDate::parse_from_str(day, "%Y%m%d").ok()?;
        Some((table, day))
    }
}

/// What a pass does, or would do, with one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its day has not come yet.
    Future,
    /// Inside the retention.
    Keep,
    /// Expired and nothing open in it: dropped by the pass.
    Drop,
    /// Expired, but `open` Deliveries that are not final need it (counted up to 1,000).
    HeldBack { open: i64 },
}

/// One day partition as `railhook retention` lists it.
#[derive(Debug, Clone)]
pub struct Partition {
    pub table: Table,
    pub day: NaiveDate,
    pub name: String,
    pub bytes: i64,
    /// Postgres' estimate (`reltuples`), -1 before the partition was first analysed.
    pub rows_estimate: i64,
    pub verdict: Verdict,
}

/// The first instant after `day` (UTC).
fn end_of(day: NaiveDate) -> DateTime<Utc> {
    (day + Days::new(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
}

/// Whether `day` ended more than `retention_days` before `now`.
pub fn expired(day: NaiveDate, now: DateTime<Utc>, retention_days: u32) -> bool {
    end_of(day) + chrono::Duration::days(i64::from(retention_days)) <= now
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Partition tables created ahead.
    pub created: i32,
    /// Partitions dropped, by table name.
    pub dropped: Vec<String>,
    /// Expired partitions kept because a non-final Delivery needs them.
    pub held_back: Vec<String>,
    /// Another process held the pass lock: this pass did nothing.
    pub skipped: bool,
    /// Time spent detaching, checking and dropping expired days (the rest of a pass is
    /// reading the catalogue and creating partitions ahead).
    pub retiring: Duration,
}

/// The retention task's metrics, on their own registry (served by the process that runs it).
#[derive(Clone)]
pub struct RetentionMetrics {
    pub registry: Registry,
    partitions: IntGaugeVec,
    bytes: IntGaugeVec,
    oldest_age: IntGaugeVec,
    ahead_days: IntGaugeVec,
    held_back: IntGaugeVec,
    dropped: IntCounterVec,
    runs: IntCounterVec,
    last_success: Gauge,
}

impl RetentionMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            register_int_gauge_vec_with_registry!(Opts::new(name, help), &["table"], registry)
                .expect("metric registers once")
        };
        Self {
            partitions: gauge(
                "railhook_partitions",
                "Day partitions per partitioned table.",
            ),
            bytes: gauge(
                "railhook_table_bytes",
                "Bytes on disk per partitioned table, indexes and TOAST included.",
            ),
            oldest_age: gauge(
                "railhook_oldest_partition_age_seconds",
                "Age of the start of the oldest partition's day.",
            ),
            ahead_days: gauge(
                "railhook_partitions_ahead_days",
                "Whole days after today that already have a partition (alert below 2).",
            ),
            held_back: gauge(
                "railhook_partitions_held_back",
                "Expired partitions kept because a Delivery that is not final needs them.",
            ),
            dropped: register_int_counter_vec_with_registry!(
                Opts::new(
                    "railhook_partitions_dropped_total",
                    "Expired partitions dropped."
                ),
                &["table"],
                registry
            )
            .expect("metric registers once"),
            runs: register_int_counter_vec_with_registry!(
                Opts::new(
                    "railhook_retention_runs_total",
                    "Retention passes by result: ok, skipped (another process ran), error."
                ),
                &["result"],
                registry
            )
            .expect("metric registers once"),
            last_success: register_gauge_with_registry!(
                "railhook_retention_last_success_timestamp_seconds",
                "Unix time of the last retention pass that completed.",
                registry
            )
            .expect("metric registers once"),
            registry,
        }
    }
}

impl Default for RetentionMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Every day partition of the three tables, oldest first, with what a pass at `now` would
/// do with it. Reads only; `railhook retention --dry-run` prints this.
pub async fn plan(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    retention_days: u32,
) -> Result<Vec<Partition>, sqlx::Error> {
    let rows: Vec<(String, i64, f32)> = sqlx::query_as(
        "SELECT c.relname::text, pg_total_relation_size(c.oid), c.reltuples
         FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid
         JOIN pg_class p ON p.oid = i.inhparent
         WHERE p.relname IN ('events', 'deliveries', 'attempts') AND c.relkind = 'r'
           AND p.relnamespace = 'public'::regnamespace
         ORDER BY c.relname",
    )
    .fetch_all(&mut *conn)
    .await?;
    let today = now.date_naive();
    let mut out = Vec::new();
    for (name, bytes, tuples) in rows {
        let Some((table, day)) = Table::parse_partition(&name) else {
            continue;
        };
        out.push(Partition {
            table,
            day,
            name,
            bytes,
            rows_estimate: tuples as i64,
            verdict: if day > today {
                Verdict::Future
            } else {
                Verdict::Keep
            },
        });
    }
    // Expired days: ask each day's question once, for Deliveries (Attempts follow them) and
    // for Events.
    let mut days: Vec<NaiveDate> = out
        .iter()
        .filter(|p| expired(p.day, now, retention_days))
        .map(|p| p.day)
        .collect();
    days.sort();
    days.dedup();
    for day in days {
        let deliveries_open = open_deliveries_in(&mut *conn, day).await?;
        let events_open = open_deliveries_into_events_of(&mut *conn, day).await?;
        for p in out.iter_mut().filter(|p| p.day == day) {
            let open = match p.table {
                Table::Events => events_open,
                Table::Deliveries | Table::Attempts => deliveries_open,
            };
            p.verdict = if open > 0 {
                Verdict::HeldBack { open }
            } else {
                Verdict::Drop
            };
        }
    }
    out.sort_by(|a, b| (a.day, a.table.name()).cmp(&(b.day, b.table.name())));
    Ok(out)
}

/// Open (PENDING or PROCESSING) Deliveries in the day's Delivery partition, up to 1,000.
/// Reads the partition itself, attached or not.
async fn open_deliveries_in(
    conn: &mut sqlx::PgConnection,
    day: NaiveDate,
) -> Result<i64, sqlx::Error> {
    let name = Table::Deliveries.partition(day);
    if !table_exists(&mut *conn, &name).await? {
        return Ok(0);
    }
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM (SELECT 1 FROM {name}
                               WHERE status IN ('PENDING', 'PROCESSING') LIMIT 1000) open"
    ))
    .fetch_one(&mut *conn)
    .await
}

/// Open Deliveries, anywhere, whose Event was created on `day` (replays make Deliveries of
/// old Events), up to 1,000. Uses `deliveries_open_event_idx`, which holds only open rows.
async fn open_deliveries_into_events_of(
    conn: &mut sqlx::PgConnection,
    day: NaiveDate,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT 1 FROM deliveries
             WHERE status IN ('PENDING', 'PROCESSING')
               AND event_id >= railhook_ulid_floor('evt_', $1::date::timestamp AT TIME ZONE 'UTC')
               AND event_id < railhook_ulid_floor('evt_', ($1::date + 1)::timestamp AT TIME ZONE 'UTC')
             LIMIT 1000) open",
    )
    .bind(day)
    .fetch_one(&mut *conn)
    .await
}

async fn table_exists(conn: &mut sqlx::PgConnection, name: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
}

async fn is_attached(conn: &mut sqlx::PgConnection, name: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)), false)",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
}

/// Creates the partitions from yesterday to [`AHEAD_DAYS`] after `today` that are missing;
/// returns how many tables it made. Idempotent; callers queue on the function's own lock.
pub async fn ensure_ahead(
    conn: impl sqlx::PgExecutor<'_>,
    today: NaiveDate,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT railhook_ensure_partitions($1, $2)")
        .bind(today - Days::new(1))
        .bind(today + Days::new(AHEAD_DAYS))
        .fetch_one(conn)
        .await
}

/// One retention pass at `now`; see the module documentation. Uses one connection of its
/// own from `pool`, closed at the end, so the session lock and `lock_timeout` never leak
/// into the pool.
pub async fn run(
    pool: &PgPool,
    now: DateTime<Utc>,
    retention_days: u32,
    metrics: Option<&RetentionMetrics>,
) -> Result<Report, sqlx::Error> {
    let conn = pool.acquire().await?;
    let mut conn: sqlx::PgConnection = PoolConnection::<Postgres>::detach(conn);
    let result = pass(&mut conn, now, retention_days, metrics).await;
    let _ = conn.close().await;
    if let Some(m) = metrics {
        let outcome = match &result {
            Ok(r) if r.skipped => "skipped",
            Ok(_) => "ok",
            Err(_) => "error",
        };
        m.runs.with_label_values(&[outcome]).inc();
        if matches!(&result, Ok(r) if !r.skipped) {
            m.last_success.set(now.timestamp() as f64);
        }
    }
    result
}

async fn pass(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    retention_days: u32,
    metrics: Option<&RetentionMetrics>,
) -> Result<Report, sqlx::Error> {
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
        .bind(PASS_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Ok(Report {
            skipped: true,
            ..Report::default()
        });
    }
    sqlx::query(&format!("SET lock_timeout = '{LOCK_TIMEOUT}'"))
        .execute(&mut *conn)
        .await?;
    let mut report = Report::default();
    finish_interrupted(&mut *conn, &mut report).await?;
    report.created = ensure_ahead(&mut *conn, now.date_naive()).await?;
    let partitions = plan(&mut *conn, now, retention_days).await?;
    let mut days: Vec<NaiveDate> = partitions
        .iter()
        .filter(|p| p.verdict == Verdict::Drop)
        .map(|p| p.day)
        .collect();
    days.sort();
    days.dedup();
    for p in partitions
        .iter()
        .filter(|p| matches!(p.verdict, Verdict::HeldBack { .. }))
    {
        report.held_back.push(p.name.clone());
    }
    let started = std::time::Instant::now();
    for day in days {
        retire_day(&mut *conn, day, &partitions, &mut report).await?;
    }
    report.retiring = started.elapsed();
    if let Some(m) = metrics {
        observe(&mut *conn, now, retention_days, m, &report).await?;
    }
    Ok(report)
}

/// Retires one expired day: Deliveries with their Attempts, then Events; each kept if the
/// check after its detach finds something open.
async fn retire_day(
    conn: &mut sqlx::PgConnection,
    day: NaiveDate,
    plan: &[Partition],
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    let verdict = |t: Table| {
        plan.iter()
            .find(|p| p.table == t && p.day == day)
            .map(|p| p.verdict.clone())
    };
    if verdict(Table::Deliveries) == Some(Verdict::Drop) {
        let deliveries = Table::Deliveries.partition(day);
        detach(&mut *conn, Table::Deliveries, &deliveries).await?;
        if open_deliveries_in(&mut *conn, day).await? > 0 {
            attach(&mut *conn, Table::Deliveries, day).await?;
            report.held_back.push(deliveries);
        } else {
            drop_deliveries_day(&mut *conn, day, report).await?;
        }
    }
    if verdict(Table::Events) == Some(Verdict::Drop) {
        let events = Table::Events.partition(day);
        detach(&mut *conn, Table::Events, &events).await?;
        if open_deliveries_into_events_of(&mut *conn, day).await? > 0 {
            attach(&mut *conn, Table::Events, day).await?;
            report.held_back.push(events);
        } else {
            drop_table(&mut *conn, &events, report).await?;
        }
    }
    Ok(())
}

/// A pass killed half way leaves a `DETACH … CONCURRENTLY` pending, or a partition detached
/// and not dropped (a standalone `<table>_p<day>`; nothing else makes one). Both are
/// finished the way the killed pass would have: the check is made again, then drop or put
/// back.
async fn finish_interrupted(
    conn: &mut sqlx::PgConnection,
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    let pending: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.relname::text, c.relname::text FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
         WHERE i.inhdetachpending",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (parent, child) in pending {
        tracing::info!(partition = %child, "retention: finishing an interrupted detach");
        sqlx::query(&format!(
            "ALTER TABLE {parent} DETACH PARTITION {child} FINALIZE"
        ))
        .execute(&mut *conn)
        .await?;
    }
    let loose: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class
         WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND NOT relispartition
           AND relname ~ '^(events|deliveries|attempts)_p[0-9]{8}$'
         ORDER BY relname",
    )
    .fetch_all(&mut *conn)
    .await?;
    for name in loose {
        let Some((table, day)) = Table::parse_partition(&name) else {
            continue;
        };
        let open = match table {
            Table::Events => open_deliveries_into_events_of(&mut *conn, day).await?,
            Table::Deliveries => open_deliveries_in(&mut *conn, day).await?,
            // Attempts stay while their Deliveries' partition is still attached.
            Table::Attempts => {
                i64::from(is_attached(&mut *conn, &Table::Deliveries.partition(day)).await?)
            }
        };
        if open > 0 {
            tracing::info!(partition = %name, "retention: putting back a partition still needed");
            attach(&mut *conn, table, day).await?;
        } else if table == Table::Deliveries {
            drop_deliveries_day(&mut *conn, day, report).await?;
        } else {
            drop_table(&mut *conn, &name, report).await?;
        }
    }
    Ok(())
}

/// Drops a detached Delivery partition with its day's Attempts (detached first if need be).
async fn drop_deliveries_day(
    conn: &mut sqlx::PgConnection,
    day: NaiveDate,
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    let attempts = Table::Attempts.partition(day);
    if is_attached(&mut *conn, &attempts).await? {
        detach(&mut *conn, Table::Attempts, &attempts).await?;
    }
    if table_exists(&mut *conn, &attempts).await? {
        drop_table(&mut *conn, &attempts, report).await?;
    }
    drop_table(&mut *conn, &Table::Deliveries.partition(day), report).await
}

async fn detach(
    conn: &mut sqlx::PgConnection,
    table: Table,
    partition: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "ALTER TABLE {} DETACH PARTITION {partition} CONCURRENTLY",
        table.name()
    ))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Puts a detached day back with the bounds it was created with.
async fn attach(
    conn: &mut sqlx::PgConnection,
    table: Table,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    let (lo, hi): (String, String) = sqlx::query_as(
        "SELECT railhook_ulid_floor($1, $2::date::timestamp AT TIME ZONE 'UTC'),
                railhook_ulid_floor($1, ($2::date + 1)::timestamp AT TIME ZONE 'UTC')",
    )
    .bind(table.prefix())
    .bind(day)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ('{lo}') TO ('{hi}')",
        table.name(),
        table.partition(day)
    ))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn drop_table(
    conn: &mut sqlx::PgConnection,
    name: &str,
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!("DROP TABLE IF EXISTS {name}"))
        .execute(&mut *conn)
        .await?;
    tracing::info!(partition = %name, "retention: dropped");
    report.dropped.push(name.to_owned());
    Ok(())
}

/// Sets the gauges from the catalogue as the pass left it.
async fn observe(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    retention_days: u32,
    m: &RetentionMetrics,
    report: &Report,
) -> Result<(), sqlx::Error> {
    let partitions = plan(&mut *conn, now, retention_days).await?;
    let today = now.date_naive();
    for table in Table::ALL {
        let mine: Vec<&Partition> = partitions.iter().filter(|p| p.table == table).collect();
        let label = [table.name()];
        m.partitions
            .with_label_values(&label)
            .set(mine.len() as i64);
        m.bytes
            .with_label_values(&label)
            .set(mine.iter().map(|p| p.bytes).sum());
        let oldest = mine.iter().map(|p| p.day).min();
        m.oldest_age
            .with_label_values(&label)
            .set(oldest.map_or(0, |d| {
                (now - end_of(d) + chrono::Duration::days(1)).num_seconds()
            }));
        // Consecutive days after today that have a partition.
        let mut ahead = 0;
        while mine
            .iter()
            .any(|p| p.day == today + Days::new(ahead as u64 + 1))
        {
            ahead += 1;
        }
        m.ahead_days.with_label_values(&label).set(ahead);
        let held = report
            .held_back
            .iter()
            .filter(|n| Table::parse_partition(n).is_some_and(|(t, _)| t == table))
            .count();
        m.held_back.with_label_values(&label).set(held as i64);
        let dropped = report
            .dropped
            .iter()
            .filter(|n| Table::parse_partition(n).is_some_and(|(t, _)| t == table))
            .count();
        m.dropped.with_label_values(&label).inc_by(dropped as u64);
    }
    Ok(())
}

/// Runs a pass every `every` (the first at once) until `shutdown` resolves. A failed pass
/// is logged and counted; the next one starts from whatever it left.
pub async fn task(
    pool: PgPool,
    retention_days: u32,
    every: Duration,
    metrics: RetentionMetrics,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut shutdown => return,
        }
        match run(&pool, Utc::now(), retention_days, Some(&metrics)).await {
            Ok(r) if r.skipped => tracing::debug!("retention: another process runs the pass"),
            Ok(r) => tracing::info!(
                created = r.created,
                dropped = r.dropped.len(),
                held_back = r.held_back.len(),
                "retention pass done"
            ),
            Err(e) => {
                tracing::warn!(error = %crate::health::postgres_reason(&e), "retention pass failed; trying again next time")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_expires_once_it_ended_the_retention_ago() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 1).expect("date");
        let at = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .expect("time")
                .with_timezone(&Utc)
        };
        assert!(!expired(day, at("2026-12-01T23:59:59Z"), 30));
        assert!(expired(day, at("2026-12-02T00:00:00Z"), 30));
    }

    #[test]
    fn partition_names_round_trip() {
        let day = NaiveDate::from_ymd_opt(2026, 1, 9).expect("date");
        for t in Table::ALL {
            assert_eq!(Table::parse_partition(&t.partition(day)), Some((t, day)));
        }
        assert_eq!(Table::parse_partition("events_pnotaday"), None);
        assert_eq!(Table::parse_partition("outbox_p20260109"), None);
    }

    #[test]
    fn the_minimum_retention_covers_the_longest_hard_cap_and_a_day() {
        // The outgoing hard cap (96 h) is the longest horizon: 4 days and 1 of margin.
        assert_eq!(minimum_days(), 5);
    }
}
