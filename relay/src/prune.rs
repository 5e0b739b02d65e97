//! The prune job: deletes old, confirmed Outbox rows, in its own task on its own connection.
//!
//! It used to run on the session's loop, between reading the Slot and handling Kafka's acks:
//! a large prune (ten statements of 5,000 rows) held both for as long as it took (review #19
//! item 6). Now the loop only hands over the newest confirmed commit time through a watch
//! channel, and this task prunes up to it. A prune that fails (Postgres away) is logged and
//! tried again on the next tick with a new connection; it never ends the session, since the
//! rows it leaves are only kept longer.

use std::time::Duration;

use railhook_common::postgres_url::PostgresTarget;
use sqlx::PgConnection;
use tokio::sync::watch;

use crate::metrics::RelayMetrics;
use crate::slot;

/// Outbox rows deleted per statement.
const PRUNE_BATCH: i64 = 5_000;
/// Statements per tick, at most: a backlog is pruned over several ticks.
const BATCHES_PER_TICK: usize = 10;
/// Seconds between the Unix epoch and Postgres' epoch (2000-01-01).
const PG_EPOCH_OFFSET_SECS: i64 = 946_684_800;

pub(crate) struct Pruner {
    pub postgres: PostgresTarget,
    pub retention: Duration,
    pub every: Duration,
    pub metrics: RelayMetrics,
}

/// Aborts the task when dropped, so the prune job ends with its session: only the relay that
/// holds the Slot prunes.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Pruner {
    /// Prunes every `every`, up to the newest confirmed commit (Postgres microseconds) the
    /// session has sent; nothing before the first confirmation.
    pub(crate) async fn run(self, confirmed: watch::Receiver<Option<i64>>) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut conn: Option<PgConnection> = None;
        loop {
            tick.tick().await;
            let Some(up_to) = *confirmed.borrow() else {
                continue;
            };
            if conn.is_none() {
                match slot::connect(&self.postgres).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "outbox prune: no connection; trying again");
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            if let Err(e) = self.prune(c, up_to).await {
                tracing::warn!(error = %e, "outbox prune failed; trying again");
                conn = None;
            }
        }
    }

    /// Deletes Outbox rows older than the retention that were committed before the newest
    /// confirmed transaction. Deleting a committed row never hides it from the relay (the
    /// insert is decoded from the WAL, not the table); the age and the confirmation bound
    /// keep the table small while leaving recent rows for an operator to inspect.
    async fn prune(
        &self,
        conn: &mut PgConnection,
        confirmed_micros: i64,
    ) -> Result<(), sqlx::Error> {
        let retention = self.retention.as_secs_f64();
        let confirmed_unix = confirmed_micros as f64 / 1e6 + PG_EPOCH_OFFSET_SECS as f64;
        for _ in 0..BATCHES_PER_TICK {
            let deleted = sqlx::query!(
                "DELETE FROM outbox WHERE id IN (
                     SELECT id FROM outbox
                     WHERE created_at < now() - make_interval(secs => $1)
                       AND created_at < to_timestamp($2)
                     ORDER BY id LIMIT $3)",
                retention,
                confirmed_unix,
                PRUNE_BATCH
            )
            .execute(&mut *conn)
            .await?
            .rows_affected();
            self.metrics.pruned.inc_by(deleted);
            if deleted < PRUNE_BATCH as u64 {
                break;
            }
        }
        // The oldest row by id is the oldest by time (ids follow inserts); one index probe.
        let oldest = sqlx::query_scalar!(
            r#"SELECT coalesce(extract(epoch FROM now() - (
                 SELECT created_at FROM outbox ORDER BY id LIMIT 1)), 0)::float8 AS "age!""#,
        )
        .fetch_one(&mut *conn)
        .await?;
        self.metrics.outbox_oldest_age_seconds.set(oldest.max(0.0));
        Ok(())
    }
}
