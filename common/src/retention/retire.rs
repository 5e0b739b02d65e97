//! Retiring a day: detach concurrently, check again on the detached table, then drop it or
//! put it back; and finishing what a killed pass left half done (module docs of
//! `retention`).

use chrono::NaiveDate;

use super::Report;
use super::partitions::{
    Partition, Table, Verdict, is_attached, open_deliveries_in, open_deliveries_into_events_of,
    table_exists,
};

/// Retires one expired day: Deliveries with their Attempts, then Events; each kept if the
/// check after its detach finds something open.
pub(super) async fn retire_day(
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
    if verdict(Table::AuditLog) == Some(Verdict::Drop) {
        let audit = Table::AuditLog.partition(day);
        detach(&mut *conn, Table::AuditLog, &audit).await?;
        drop_table(&mut *conn, &audit, report).await?;
    }
    Ok(())
}

/// A pass killed half way leaves a `DETACH … CONCURRENTLY` pending, or a partition detached
/// and not dropped (a standalone `<table>_p<day>`; nothing else makes one). Both are
/// finished the way the killed pass would have: the check is made again, then drop or put
/// back.
#[allow(clippy::disallowed_methods)] // composed: DDL naming a partition
pub(super) async fn finish_interrupted(
    conn: &mut sqlx::PgConnection,
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    let pending: Vec<(String, String)> = sqlx::query!(
        r#"SELECT p.relname::text AS "parent!", c.relname::text AS "child!" FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
           WHERE i.inhdetachpending"#,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.parent, r.child))
    .collect();
    for (parent, child) in pending {
        tracing::info!(partition = %child, "retention: finishing an interrupted detach");
        sqlx::query(&format!(
            "ALTER TABLE {parent} DETACH PARTITION {child} FINALIZE"
        ))
        .execute(&mut *conn)
        .await?;
    }
    let loose: Vec<String> = sqlx::query_scalar!(
        r#"SELECT relname::text AS "name!" FROM pg_class
           WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND NOT relispartition
             AND relname ~ '^(events|deliveries|attempts|audit_log)_p[0-9]{8}$'
           ORDER BY relname"#,
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
            Table::AuditLog => 0,
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

#[allow(clippy::disallowed_methods)] // composed: DDL naming a partition
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
#[allow(clippy::disallowed_methods)] // composed: DDL naming a partition
async fn attach(
    conn: &mut sqlx::PgConnection,
    table: Table,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    let bounds = sqlx::query!(
        r#"SELECT railhook_ulid_floor($1, $2::date::timestamp AT TIME ZONE 'UTC') AS "lo!",
                  railhook_ulid_floor($1, ($2::date + 1)::timestamp AT TIME ZONE 'UTC') AS "hi!""#,
        table.prefix(),
        day
    )
    .fetch_one(&mut *conn)
    .await?;
    let (lo, hi) = (bounds.lo, bounds.hi);
    sqlx::query(&format!(
        "ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ('{lo}') TO ('{hi}')",
        table.name(),
        table.partition(day)
    ))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[allow(clippy::disallowed_methods)] // composed: DDL naming a partition
async fn drop_table(
    conn: &mut sqlx::PgConnection,
    name: &str,
    report: &mut Report,
) -> Result<(), sqlx::Error> {
    let started = std::time::Instant::now();
    sqlx::query(&format!("DROP TABLE IF EXISTS {name}"))
        .execute(&mut *conn)
        .await?;
    report.dropping += started.elapsed();
    tracing::info!(partition = %name, "retention: dropped");
    report.dropped.push(name.to_owned());
    Ok(())
}
