//! The worker's connections to Postgres: one pool for the Claims and every other statement,
//! and, by default, one of its own for the group success writes, whose commits do not wait
//! for their WAL flush.
//!
//! Why the split (issue #54): a delivery commits three times in Postgres (the ingest's
//! statement, the Claim, the outcome), and each synchronous commit waits for an `fdatasync`
//! of its own — at 300 Events/s the commits and their flushes were about a sixth of what
//! Postgres spent per delivery (perf, docs/BENCHMARKS.md). Of the three, only the outcome
//! can be lost without cost beyond a resend:
//!
//! - The ingest's commit stands behind a 201: it always waits.
//! - A lost Claim would leave its Delivery PENDING with its Kafka hint already consumed, until
//!   the stranded sweep (an hour): it waits.
//! - A lost success write leaves its Delivery PROCESSING under the Claim that did commit, so
//!   the processing sweep hands it out again and the receiver gets it twice — duplicate
//!   window 8 of docs/ARCHITECTURE.md (an Attempt that reached the receiver and whose outcome
//!   never reached Postgres), which the receiver closes by `webhook-id` anyway. Only a
//!   Postgres crash (or failover) within `wal_writer_delay` × 3 of the write loses it.
//!
//! Failures, retries, Deferrals and ordered resolutions stay on the synchronous pool: they
//! are rarer, and losing a retry's schedule would delay it by the stranded sweep.

use railhook_common::config::Settings;
use railhook_common::db::{self, Planning};
use sqlx::PgPool;

/// The worker's two pools; the same pool twice when outcomes commit synchronously.
#[derive(Clone, Debug)]
pub struct Pools {
    /// Claims, re-stamps, Deferrals, failures and retries, sweeps, the scheduler.
    pub claims: PgPool,
    /// The group success writes (successes.rs).
    pub outcomes: PgPool,
    split: bool,
}

impl From<PgPool> for Pools {
    /// One pool for everything: every commit as that pool's settings say.
    fn from(pool: PgPool) -> Self {
        Self {
            claims: pool.clone(),
            outcomes: pool,
            split: false,
        }
    }
}

impl Pools {
    /// The pools `railhook worker` uses (lazy: nothing connects yet). Every statement keeps
    /// one generic plan (`Planning::Generic`). The outcomes' pool holds one connection per
    /// outcome writer and one for the fallback that writes a failed group one by one.
    pub fn connect(settings: &Settings) -> Result<Self, sqlx::Error> {
        let claims = db::connect_committing(
            settings,
            Planning::Generic,
            settings.worker_synchronous_commit,
        )?;
        if !settings.worker_synchronous_commit || settings.worker_outcome_synchronous_commit {
            return Ok(claims.into());
        }
        let mut own = settings.clone();
        own.db_max_connections = (settings.worker_outcome_writers + 1)
            .min(settings.db_max_connections)
            .max(1);
        let outcomes = db::connect_committing(&own, Planning::Generic, false)?;
        Ok(Self {
            claims,
            outcomes,
            split: true,
        })
    }

    /// Whether the outcomes have a pool of their own.
    pub fn split(&self) -> bool {
        self.split
    }
}
