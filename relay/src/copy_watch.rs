//! The standby copies of a failover Slot, watched while the relay streams (issue #53,
//! finding 15; docs/operate/failover.md, "Failover").
//!
//! A failover Slot survives a promotion only on a standby whose synchronized copy is
//! *ready* (`synced` and not `temporary` in that standby's `pg_replication_slots`); a copy
//! that is not ready is dropped at promotion, and every later Event then waits for an
//! operator's `railhook slot create`. The primary cannot tell: only the standby knows its
//! copy's state. So the active relay asks each other server of its multi-host URL, every
//! [`LOOK_EVERY`], and reports the answer three ways: `railhook_relay_slot_copy_ready
//! {server}` (1/0), `/readyz`'s `slot_copy` entry (informational: the relay works without
//! it, so it does not gate readiness), and through the metric the `RailhookSlotCopyNotReady`
//! alert.
//!
//! While no copy is ready the watch also logs a running-transactions snapshot on the
//! primary (`pg_log_standby_snapshot()`, PostgreSQL 16+) at each look. A copy becomes ready
//! once the Slot's `catalog_xmin` and `restart_lsn` have passed the standby's own, and
//! those advance only when decoding meets such a snapshot and the relay confirms past it;
//! Postgres logs one by itself only every 15 s (and only when the server is busy), which is
//! the wait this shortens. The snapshot is one small WAL record per look, and none once a
//! copy is ready.
//!
//! Each look has a deadline ([`railhook_common::db::answered`]): a standby that stops
//! answering is reported unreachable, never waited on.

use std::time::Duration;

use railhook_common::db::{ANSWER_WITHIN, answered};
use railhook_common::health::{self, Dependencies};
use railhook_common::postgres_url::PostgresTarget;
use sqlx::PgConnection;

use crate::metrics::RelayMetrics;
use crate::slot;

/// How often the copies are looked at while none is ready, and once one is.
const LOOK_EVERY: Duration = Duration::from_secs(1);
const LOOK_EVERY_WHEN_READY: Duration = Duration::from_secs(10);
/// `/readyz`'s name for the copies' state.
pub(crate) const SLOT_COPY: &str = "slot_copy";

pub(crate) struct CopyWatch {
    /// The primary this session streams from; every other server of the URL is a standby.
    pub(crate) primary: PostgresTarget,
    pub(crate) slot: String,
    pub(crate) metrics: RelayMetrics,
    pub(crate) deps: Dependencies,
}

impl CopyWatch {
    /// The servers of the URL other than the primary, as `host:port` with a connection
    /// kept for each.
    fn standbys(&self) -> Vec<(String, Kept)> {
        self.primary
            .hosts
            .iter()
            .filter(|(h, p)| (h.as_str(), *p) != (self.primary.host.as_str(), self.primary.port))
            .map(|(h, p)| (format!("{h}:{p}"), Kept::new(self.primary.at(h, *p))))
            .collect()
    }

    /// Runs until the session ends (the task is aborted with it).
    pub(crate) async fn run(self) {
        let mut standbys = self.standbys();
        if standbys.is_empty() {
            return;
        }
        let mut primary = Kept::new(self.primary.clone());
        // Whether the Slot is a failover Slot is asked once per session (it changes only
        // by dropping and creating the Slot, which ends the session).
        let failover = loop {
            let asked = primary
                .ask("the failover flag", &self.slot, |c, slot| {
                    Box::pin(slot::is_failover(c, slot))
                })
                .await;
            match asked {
                Ok(f) => break f == Some(true),
                Err(e) => {
                    tracing::debug!(error = %e, "failover flag not read; looking again");
                    tokio::time::sleep(LOOK_EVERY).await;
                }
            }
        };
        if !failover {
            return;
        }
        self.deps.declare(SLOT_COPY, false);
        loop {
            let mut ready = Vec::new();
            let mut not_ready = Vec::new();
            for (server, kept) in &mut standbys {
                let copy = kept
                    .ask("a standby's copy", &self.slot, |c, slot| {
                        Box::pin(slot::copy_on(c, slot))
                    })
                    .await;
                let is_ready = matches!(copy, Ok(ref c) if c.is_ready());
                self.metrics
                    .slot_copy_ready
                    .with_label_values(&[server.as_str()])
                    .set(i64::from(is_ready));
                match copy {
                    Ok(c) if c.is_ready() => ready.push(server.clone()),
                    Ok(c) => not_ready.push(format!("{server}: {c}")),
                    Err(e) => not_ready.push(format!(
                        "{server}: unreachable ({})",
                        health::postgres_reason(&e)
                    )),
                }
            }
            if ready.is_empty() {
                self.deps.down(
                    SLOT_COPY,
                    format!(
                        "no standby holds a ready copy of the failover Slot {}: a promotion now \
                         loses it ({})",
                        self.slot,
                        not_ready.join("; ")
                    ),
                );
                let nudge = primary
                    .ask("a standby snapshot", &self.slot, |c, _| {
                        Box::pin(slot::log_standby_snapshot(c))
                    })
                    .await;
                if let Err(e) = nudge {
                    tracing::debug!(error = %e, "standby snapshot not logged");
                }
            } else {
                self.deps.up(SLOT_COPY);
            }
            let wait = if ready.is_empty() {
                LOOK_EVERY
            } else {
                LOOK_EVERY_WHEN_READY
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A connection of the watch's own to one server, kept between questions and opened again
/// after any failure.
struct Kept {
    target: PostgresTarget,
    conn: Option<PgConnection>,
}

impl Kept {
    fn new(target: PostgresTarget) -> Self {
        Self { target, conn: None }
    }

    /// One question (`ask`, given the connection and the Slot's name), with a deadline.
    async fn ask<T>(
        &mut self,
        what: &'static str,
        slot_name: &str,
        ask: impl for<'c> FnOnce(
            &'c mut PgConnection,
            &'c str,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'c>,
        >,
    ) -> Result<T, sqlx::Error> {
        let (target, conn) = (&self.target, &mut self.conn);
        let result = answered(ANSWER_WITHIN, what, async {
            let c = match conn {
                Some(c) => c,
                None => conn.insert(slot::connect(target).await.map_err(to_sqlx)?),
            };
            ask(c, slot_name).await
        })
        .await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }
}

fn to_sqlx(e: slot::SlotError) -> sqlx::Error {
    match e {
        slot::SlotError::Postgres(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}
