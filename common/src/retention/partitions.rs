//! The catalogue side of retention: the four partitioned tables, their day partitions,
//! what a pass would do with each ([`plan`]), and the questions it asks before it drops
//! one (does an open Delivery need this day?).

use chrono::{DateTime, Days, NaiveDate, Utc};

use super::AHEAD_DAYS;

/// A partitioned table, in the order a day is retired: a Delivery's Attempts go with it, and
/// Events last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Attempts,
    Deliveries,
    Events,
    /// The audit log (ingest/src/audit.rs): nothing else needs an old day of it.
    AuditLog,
}

impl Table {
    pub const ALL: [Table; 4] = [
        Table::Attempts,
        Table::Deliveries,
        Table::Events,
        Table::AuditLog,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Attempts => "attempts",
            Table::Deliveries => "deliveries",
            Table::Events => "events",
            Table::AuditLog => "audit_log",
        }
    }

    /// The id prefix its partition bounds are made of.
    pub(super) fn prefix(self) -> &'static str {
        match self {
            Table::Events => "evt_",
            Table::Deliveries | Table::Attempts => "dlv_",
            Table::AuditLog => "aud_",
        }
    }

    /// The name of its partition for `day`.
    pub fn partition(self, day: NaiveDate) -> String {
        format!("{}_p{}", self.name(), day.format("%Y%m%d"))
    }

    pub(super) fn parse_partition(name: &str) -> Option<(Table, NaiveDate)> {
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
pub(super) fn end_of(day: NaiveDate) -> DateTime<Utc> {
    (day + Days::new(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
}

/// Whether `day` ended more than `retention_days` before `now`.
pub fn expired(day: NaiveDate, now: DateTime<Utc>, retention_days: u32) -> bool {
    end_of(day) + chrono::Duration::days(i64::from(retention_days)) <= now
}

/// Every day partition of the four tables, oldest first, with what a pass at `now` would
/// do with it. Reads only; `railhook retention --dry-run` prints this.
pub async fn plan(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    retention_days: u32,
) -> Result<Vec<Partition>, sqlx::Error> {
    let rows: Vec<(String, i64, f32)> = sqlx::query!(
        r#"SELECT c.relname::text AS "name!", pg_total_relation_size(c.oid) AS "bytes!",
                  c.reltuples AS "tuples!"
           FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid
           JOIN pg_class p ON p.oid = i.inhparent
           WHERE p.relname IN ('events', 'deliveries', 'attempts', 'audit_log') AND c.relkind = 'r'
             AND p.relnamespace = 'public'::regnamespace
           ORDER BY c.relname"#,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.name, r.bytes, r.tuples))
    .collect();
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
                Table::AuditLog => 0,
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
#[allow(clippy::disallowed_methods)] // composed: the partition is named by the day
pub(super) async fn open_deliveries_in(
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
pub(super) async fn open_deliveries_into_events_of(
    conn: &mut sqlx::PgConnection,
    day: NaiveDate,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "open!" FROM (
             SELECT 1 FROM deliveries
             WHERE status IN ('PENDING', 'PROCESSING')
               AND event_id >= railhook_ulid_floor('evt_', $1::date::timestamp AT TIME ZONE 'UTC')
               AND event_id < railhook_ulid_floor('evt_', ($1::date + 1)::timestamp AT TIME ZONE 'UTC')
             LIMIT 1000) open"#,
        day
    )
    .fetch_one(&mut *conn)
    .await
}

pub(super) async fn table_exists(
    conn: &mut sqlx::PgConnection,
    name: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT to_regclass($1) IS NOT NULL AS "exists!""#, name)
        .fetch_one(&mut *conn)
        .await
}

pub(super) async fn is_attached(
    conn: &mut sqlx::PgConnection,
    name: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT coalesce((SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)), false)
               AS "attached!""#,
        name
    )
    .fetch_one(&mut *conn)
    .await
}

/// Creates the partitions from yesterday to [`AHEAD_DAYS`] after `today` that are missing;
/// returns how many tables it made. Idempotent; callers queue on the function's own lock.
pub async fn ensure_ahead(
    conn: impl sqlx::PgExecutor<'_>,
    today: NaiveDate,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT railhook_ensure_partitions($1, $2) AS "made!""#,
        today - Days::new(1),
        today + Days::new(AHEAD_DAYS)
    )
    .fetch_one(conn)
    .await
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
}
