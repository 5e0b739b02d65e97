//! The standby copies of a failover Slot, watched while the relay streams (issue #53,
//! finding 15; docs/OPERATIONS.md, "Failover").
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

use std::collections::HashMap;
use std::time::Duration;

use railhook_common::db::{ANSWER_WITHIN, answered};
use railhook_common::health::Dependencies;
use railhook_common::postgres_url::PostgresTarget;
use sqlx::PgConnection;

use crate::metrics::RelayMetrics;
use crate::slot::{self, Copy};

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
    /// The servers of the URL other than the primary, as `host:port` with their target.
    fn standbys(&self) -> Vec<(String, PostgresTarget)> {
        self.primary
            .hosts
            .iter()
            .filter(|(h, p)| (h.as_str(), *p) != (self.primary.host.as_str(), self.primary.port))
            .map(|(h, p)| (format!("{h}:{p}"), self.primary.at(h, *p)))
            .collect()
    }

    /// Runs until the session ends (the task is aborted with it).
    pub(crate) async fn run(self) {
        let standbys = self.standbys();
        if standbys.is_empty() {
            return;
        }
        let mut primary: Option<PgConnection> = None;
        let mut conns: HashMap<String, PgConnection> = HashMap::new();
        // Whether the Slot is a failover Slot is asked once per session (it changes only
        // by dropping and creating the Slot, which ends the session).
        let failover = loop {
            match self
                .ask_primary(&mut primary, |c, slot| Box::pin(slot::is_failover(c, slot)))
                .await
            {
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
            for (server, target) in &standbys {
                let copy = look(&mut conns, server, target, &self.slot).await;
                let is_ready = matches!(copy, Ok(ref c) if c.is_ready());
                self.metrics
                    .slot_copy_ready
                    .with_label_values(&[server])
                    .set(i64::from(is_ready));
                match copy {
                    Ok(c) if c.is_ready() => ready.push(server.clone()),
                    Ok(c) => not_ready.push(format!("{server}: {}", describe(&c))),
                    Err(e) => not_ready.push(format!("{server}: unreachable ({})", short(&e))),
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
                let nudge = self
                    .ask_primary(&mut primary, |c, _| Box::pin(slot::log_standby_snapshot(c)))
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

    /// One statement on the watch's own connection to the primary, with a deadline; the
    /// connection is opened again after any failure.
    async fn ask_primary<T>(
        &self,
        conn: &mut Option<PgConnection>,
        ask: impl for<'c> FnOnce(
            &'c mut PgConnection,
            &'c str,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'c>,
        >,
    ) -> Result<T, sqlx::Error> {
        let result = answered(ANSWER_WITHIN, "the copy watch's question", async {
            if conn.is_none() {
                *conn = Some(slot::connect(&self.primary).await.map_err(to_sqlx)?);
            }
            match conn.as_mut() {
                Some(c) => ask(c, &self.slot).await,
                None => Err(sqlx::Error::PoolClosed),
            }
        })
        .await;
        if result.is_err() {
            *conn = None;
        }
        result
    }
}

/// One look at `server`'s copy, on a connection kept between looks.
async fn look(
    conns: &mut HashMap<String, PgConnection>,
    server: &str,
    target: &PostgresTarget,
    slot_name: &str,
) -> Result<Copy, sqlx::Error> {
    let result = answered(ANSWER_WITHIN, "a standby's copy", async {
        if !conns.contains_key(server) {
            let c = slot::connect(target).await.map_err(to_sqlx)?;
            conns.insert(server.to_owned(), c);
        }
        match conns.get_mut(server) {
            Some(c) => slot::copy_on(c, slot_name).await,
            None => Err(sqlx::Error::PoolClosed),
        }
    })
    .await;
    if result.is_err() {
        conns.remove(server);
    }
    result
}

fn to_sqlx(e: slot::SlotError) -> sqlx::Error {
    match e {
        slot::SlotError::Postgres(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

fn describe(copy: &Copy) -> &'static str {
    match copy {
        Copy::Ready { .. } => "ready",
        Copy::NotReady => "synchronized, not ready yet",
        Copy::Missing => "no copy",
        Copy::NotACopy => "a Slot of the same name that is not a synchronized copy",
    }
}

/// An error's kind without database text (docs: no database text in /readyz).
fn short(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .map_or_else(|| "database error".into(), |c| format!("SQLSTATE {c}")),
        sqlx::Error::Io(io) => io.kind().to_string(),
        _ => "connection failed".into(),
    }
}
