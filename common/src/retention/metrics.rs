//! The retention task's metrics, set from the catalogue after each pass.

use chrono::{DateTime, Days, Utc};
use prometheus::{
    Gauge, IntCounterVec, IntGaugeVec, Opts, Registry, register_gauge_with_registry,
    register_int_counter_vec_with_registry, register_int_gauge_vec_with_registry,
};

use super::Report;
use super::partitions::{Partition, Table, end_of, plan};

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
    pub(super) runs: IntCounterVec,
    pub(super) last_success: Gauge,
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

/// Sets the gauges from the catalogue as the pass left it.
pub(super) async fn observe(
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
