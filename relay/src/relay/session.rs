//! What one replication session knows (its window, the transaction being read, what it
//! confirmed); dropped with the session, so a new one starts from the Slot alone.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use pgwire_replication::{Lsn, ReplicationClient};
use railhook_common::doorbell::Ringer;
use railhook_common::kafka_producer::Producer;
use tokio::sync::watch;

use crate::config::RelayConfig;
use crate::metrics::RelayMetrics;
use crate::pgoutput::Relation;
use crate::window::Window;

/// Seconds between the Unix epoch and Postgres' epoch (2000-01-01).
const PG_EPOCH_OFFSET_SECS: i64 = 946_684_800;

/// What one session knows; dropped with it.
pub(super) struct Session {
    pub(super) producer: Producer,
    pub(super) window: Window,
    pub(super) relations: HashMap<u32, Relation>,
    pub(super) current: Option<Current>,
    pub(super) confirmed: Lsn,
    pub(super) last_confirmed_commit_micros: Option<i64>,
    pub(super) last_heartbeat_micros: Option<i64>,
    /// The newest confirmed commit, for the prune job.
    pub(super) prune_up_to: watch::Sender<Option<i64>>,
    /// Carries each Announcement's express hint to the worker holding its partition (when
    /// it is read, or when acknowledged), and wakes dozing workers.
    pub(super) ringer: Ringer,
    /// The deliveries topic's partition count, when express hints go out at read time
    /// (`RelayConfig::express_at_read` and the broker told it at the session's start).
    pub(super) partitions: Option<i32>,
}

/// The transaction being read (between Begin and Commit).
pub(super) struct Current {
    pub(super) seq: u64,
    pub(super) commit_lsn: Lsn,
    pub(super) heartbeat: bool,
}

impl Session {
    pub(super) fn new(
        config: &RelayConfig,
        producer: Producer,
        prune_up_to: watch::Sender<Option<i64>>,
        ringer: Ringer,
        partitions: Option<i32>,
    ) -> Self {
        Self {
            producer,
            window: Window::new(config.max_in_flight, config.max_in_flight_bytes),
            relations: HashMap::new(),
            current: None,
            confirmed: Lsn(0),
            last_confirmed_commit_micros: None,
            last_heartbeat_micros: None,
            prune_up_to,
            ringer,
            partitions,
        }
    }

    /// LSNs only move forward: a position at or behind the last confirmed one is ignored
    /// (a keepalive may report a position the last Commit already passed).
    pub(super) fn confirm(&mut self, stream: &ReplicationClient, metrics: &RelayMetrics, lsn: Lsn) {
        if lsn <= self.confirmed {
            return;
        }
        self.confirmed = lsn;
        stream.update_applied_lsn(lsn);
        metrics.confirmed_lsn.set(lsn.as_u64() as i64);
    }
}

pub(super) fn seconds_since_pg_micros(micros: i64) -> f64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    let then = micros + PG_EPOCH_OFFSET_SECS * 1_000_000;
    ((now - then) as f64 / 1e6).max(0.0)
}
