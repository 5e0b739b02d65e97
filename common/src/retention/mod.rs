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

mod metrics;
mod partitions;
mod retire;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};

use crate::retry::Ladder;

pub use metrics::RetentionMetrics;
pub use partitions::{Partition, Table, Verdict, ensure_ahead, expired, plan};

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
    /// Of `retiring`, the time spent in `DROP TABLE`: almost all of it is the filesystem
    /// freeing the day's files (docs/BENCHMARKS-HISTORY.md, Retention), which grows with the day's
    /// bytes; the rest of a retirement does not.
    pub dropping: Duration,
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

#[tracing::instrument(level = "info", name = "retention_pass", skip_all)]
async fn pass(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    retention_days: u32,
    metrics: Option<&RetentionMetrics>,
) -> Result<Report, sqlx::Error> {
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_lock(hashtext($1)) AS "locked!""#,
        PASS_LOCK
    )
    .fetch_one(&mut *conn)
    .await?;
    if !locked {
        return Ok(Report {
            skipped: true,
            ..Report::default()
        });
    }
    sqlx::query!(
        "SELECT set_config('lock_timeout', $1, false) AS applied",
        LOCK_TIMEOUT
    )
    .fetch_one(&mut *conn)
    .await?;
    // Days ahead first, and whatever follows: a pass that cannot finish an interrupted
    // retirement (a lock it waits for, a partition it cannot put back) must still leave
    // tomorrow's partitions in place, or ingest fails at midnight (review #34 item 13).
    let mut report = Report {
        created: ensure_ahead(&mut *conn, now.date_naive()).await?,
        ..Report::default()
    };
    retire::finish_interrupted(&mut *conn, &mut report).await?;
    let partitions = plan(&mut *conn, now, retention_days).await?;
    let mut days: Vec<chrono::NaiveDate> = partitions
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
        retire::retire_day(&mut *conn, day, &partitions, &mut report).await?;
    }
    report.retiring = started.elapsed();
    if let Some(m) = metrics {
        metrics::observe(&mut *conn, now, retention_days, m, &report).await?;
    }
    Ok(report)
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
    let mut said_not_owner = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut shutdown => return,
        }
        // A process connected as a least-privilege role (docs/OPERATIONS.md, Roles) cannot
        // create or drop partitions; it leaves the pass to one that owns the tables (the
        // relay, connected as the owner) instead of failing every turn.
        match owns_tables(&pool).await {
            Ok(true) => said_not_owner = false,
            Ok(false) => {
                if !said_not_owner {
                    tracing::info!(
                        "retention: this process's database role does not own the partitioned tables; a process connected as their owner (the relay, `railhook retention`) runs the passes"
                    );
                    said_not_owner = true;
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %crate::health::postgres_reason(&e), "retention: cannot read the tables' owner; trying again next time");
                continue;
            }
        }
        // Expiry is judged by the database's clock, the one that stamped the rows and
        // names the day partitions, never by this host's (review #34 item 13).
        let now = match database_now(&pool).await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %crate::health::postgres_reason(&e), "retention: cannot read the database's clock; trying again next time");
                continue;
            }
        };
        match run(&pool, now, retention_days, Some(&metrics)).await {
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

/// The database's clock: what a pass measures expiry against.
pub async fn database_now(pool: &PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(pool)
        .await
}

/// Whether the connection's role may run a pass: it is (or is a member of) the owner of
/// the four partitioned tables, which creating, detaching and dropping partitions needs.
pub async fn owns_tables(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(bool_and(pg_has_role(current_user, c.relowner, 'USAGE')), false) AS "owns!"
           FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'p'
             AND c.relname IN ('events', 'deliveries', 'attempts', 'audit_log')"#
    )
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_retention_covers_the_longest_hard_cap_and_a_day() {
        // The outgoing hard cap (96 h) is the longest horizon: 4 days and 1 of margin.
        assert_eq!(minimum_days(), 5);
    }
}
