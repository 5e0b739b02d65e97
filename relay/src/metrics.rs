//! Relay metrics: names, help texts and label sets in one place. No ids as labels.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts, Registry,
};

pub const SLOT_LAG_BYTES: &str = "railhook_relay_slot_lag_bytes";
pub const RETAINED_WAL_BYTES: &str = "railhook_relay_retained_wal_bytes";
pub const LAG_SECONDS: &str = "railhook_relay_lag_seconds";
pub const RECEIVED_LSN: &str = "railhook_relay_received_lsn";
pub const CONFIRMED_LSN: &str = "railhook_relay_confirmed_lsn";
pub const IN_FLIGHT_MESSAGES: &str = "railhook_relay_in_flight_messages";
pub const IN_FLIGHT_BYTES: &str = "railhook_relay_in_flight_bytes";
pub const PUBLISHED_TOTAL: &str = "railhook_relay_published_total";
pub const EXPRESS_MISPREDICTED_TOTAL: &str = "railhook_relay_express_mispredicted_total";
pub const PUBLISH_ERRORS_TOTAL: &str = "railhook_relay_publish_errors_total";
pub const ACTIVE: &str = "railhook_relay_active";
pub const WAL_STATUS: &str = "railhook_relay_wal_status";
pub const SAFE_WAL_SIZE_BYTES: &str = "railhook_relay_safe_wal_size_bytes";
pub const HEARTBEAT_AGE_SECONDS: &str = "railhook_relay_heartbeat_age_seconds";
pub const SESSIONS_TOTAL: &str = "railhook_relay_sessions_total";
pub const SLOT_UNUSABLE: &str = "railhook_relay_slot_unusable";
pub const PRUNED_TOTAL: &str = "railhook_relay_outbox_pruned_total";
pub const OUTBOX_OLDEST_AGE_SECONDS: &str = "railhook_relay_outbox_oldest_age_seconds";
pub const COMMIT_TO_ACK_SECONDS: &str = "railhook_relay_commit_to_ack_seconds";
pub const COMMIT_TO_READ_SECONDS: &str = "railhook_relay_commit_to_read_seconds";
pub const STANDBY_SLOT_ACTIVE: &str = "railhook_relay_standby_slot_active";
pub const STANDBY_SLOT_LAG_BYTES: &str = "railhook_relay_standby_slot_lag_bytes";
pub const SLOT_COPY_READY: &str = "railhook_relay_slot_copy_ready";
const SLOT_COPY_READY_HELP: &str = "1 while this server (a standby of the multi-host URL) holds a ready copy of the failover Slot; 0: a promotion there now loses the Slot.";

/// The values `wal_status` can take (PostgreSQL 13+).
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreachable", "lost"];

#[derive(Clone)]
pub struct RelayMetrics {
    pub registry: Registry,
    pub slot_lag_bytes: IntGauge,
    pub retained_wal_bytes: IntGauge,
    pub lag_seconds: Gauge,
    pub received_lsn: IntGauge,
    pub confirmed_lsn: IntGauge,
    pub in_flight_messages: IntGauge,
    pub in_flight_bytes: IntGauge,
    pub published: IntCounter,
    /// Express hints sent at read time to a partition the broker did not put the
    /// Announcement in (sent again at the acknowledgement).
    pub express_mispredicted: IntCounter,
    pub publish_errors: IntCounter,
    pub active: IntGauge,
    pub wal_status: IntGaugeVec,
    pub safe_wal_size_bytes: IntGauge,
    pub heartbeat_age_seconds: Gauge,
    pub sessions: IntCounter,
    /// 1 while the Slot is missing or invalidated (the relay stops; this is its last word).
    pub slot_unusable: IntGauge,
    pub pruned: IntCounter,
    /// Age of the oldest Outbox row after a prune (0 when empty). Grows past the retention
    /// only when the prune stalls (confirmation stuck or the job failing).
    pub outbox_oldest_age_seconds: Gauge,
    /// Per transaction with Outbox rows: commit time to the last Kafka acknowledgement.
    pub commit_to_ack_seconds: Histogram,
    /// Per transaction: commit time to the relay reading its Commit from the Slot. The
    /// difference to `commit_to_ack` is Kafka's share.
    pub commit_to_read_seconds: Histogram,
    /// Per physical slot named in `synchronized_standby_slots` (PostgreSQL 17+): 1 while its
    /// standby streams. While one is 0, Postgres holds logical decoding back, so the relay
    /// waits for that standby (docs/operate/failover.md, "Failover").
    pub standby_slot_active: IntGaugeVec,
    /// The same slots' distance behind the primary's WAL.
    pub standby_slot_lag_bytes: IntGaugeVec,
    /// Per other server of a multi-host URL, 1 while it holds a ready copy of a failover
    /// Slot (one a promotion keeps), 0 otherwise (relay/src/copy_watch.rs).
    pub slot_copy_ready: IntGaugeVec,
}

use railhook_common::metrics_http::register as reg;

/// Gauges by one label.
fn labelled(registry: &Registry, name: &str, help: &str, label: &str) -> IntGaugeVec {
    reg(
        registry,
        IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric"),
    )
}

/// A latency histogram with buckets fine enough for millisecond percentiles.
fn latency(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(vec![
        0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
        0.25, 0.5, 1.0, 2.5, 5.0,
    ]);
    reg(registry, Histogram::with_opts(opts).expect("valid metric"))
}

impl RelayMetrics {
    #[allow(
        clippy::too_many_lines,
        reason = "a declarative table: one entry per metric"
    )]
    pub fn new() -> Self {
        let r = Registry::new();
        let gauge = |name: &str, help: &str| railhook_common::metrics_http::gauge(&r, name, help);
        let fgauge =
            |name: &str, help: &str| reg(&r, Gauge::new(name, help).expect("valid metric"));
        let counter =
            |name: &str, help: &str| railhook_common::metrics_http::counter(&r, name, help);
        let gauges = |name: &str, help: &str, label: &str| labelled(&r, name, help, label);
        let m = Self {
            slot_lag_bytes: gauge(
                SLOT_LAG_BYTES,
                "WAL written but not yet confirmed by the relay (pg_current_wal_lsn - confirmed_flush_lsn).",
            ),
            retained_wal_bytes: gauge(
                RETAINED_WAL_BYTES,
                "WAL Postgres keeps for the slot (pg_current_wal_lsn - restart_lsn).",
            ),
            lag_seconds: fgauge(
                LAG_SECONDS,
                "Commit time to Kafka ack of the newest confirmed transaction (heartbeats keep it fresh when idle).",
            ),
            received_lsn: gauge(RECEIVED_LSN, "Newest commit LSN read from the slot."),
            confirmed_lsn: gauge(
                CONFIRMED_LSN,
                "Newest LSN confirmed to Postgres (everything before it is acknowledged by Kafka).",
            ),
            in_flight_messages: gauge(
                IN_FLIGHT_MESSAGES,
                "Announcements handed to Kafka and not yet acknowledged.",
            ),
            in_flight_bytes: gauge(
                IN_FLIGHT_BYTES,
                "Bytes of announcements not yet acknowledged.",
            ),
            published: counter(
                PUBLISHED_TOTAL,
                "Announcements acknowledged by Kafka (acks=all).",
            ),
            express_mispredicted: counter(
                EXPRESS_MISPREDICTED_TOTAL,
                "Express hints sent at read time to another partition than the broker's; each is sent again with the acknowledgement.",
            ),
            publish_errors: counter(
                PUBLISH_ERRORS_TOTAL,
                "Announcements Kafka refused or timed out; each restarts the session from the confirmed LSN.",
            ),
            active: gauge(
                ACTIVE,
                "1 when this relay holds the slot, 0 when it waits as a standby.",
            ),
            standby_slot_active: gauges(
                STANDBY_SLOT_ACTIVE,
                "1 while the standby of a slot in synchronized_standby_slots streams; 0 holds the relay back.",
                "slot",
            ),
            slot_copy_ready: gauges(SLOT_COPY_READY, SLOT_COPY_READY_HELP, "server"),
            standby_slot_lag_bytes: gauges(
                STANDBY_SLOT_LAG_BYTES,
                "WAL the standby of a slot in synchronized_standby_slots has not confirmed (pg_current_wal_lsn - restart_lsn).",
                "slot",
            ),
            wal_status: gauges(WAL_STATUS, "1 for the slot's current wal_status.", "status"),
            safe_wal_size_bytes: gauge(
                SAFE_WAL_SIZE_BYTES,
                "WAL that can still be written before the slot risks invalidation (-1 when unlimited).",
            ),
            heartbeat_age_seconds: fgauge(
                HEARTBEAT_AGE_SECONDS,
                "Time since the newest heartbeat seen through the slot was committed.",
            ),
            sessions: counter(
                SESSIONS_TOTAL,
                "Replication sessions started (restarts after errors included).",
            ),
            slot_unusable: gauge(
                SLOT_UNUSABLE,
                "1 when the slot is missing or invalidated and the relay stopped.",
            ),
            pruned: counter(
                PRUNED_TOTAL,
                "Outbox rows deleted after the slot confirmed them.",
            ),
            outbox_oldest_age_seconds: fgauge(
                OUTBOX_OLDEST_AGE_SECONDS,
                "Age of the oldest Outbox row after the latest prune (0 when the table is empty).",
            ),
            commit_to_ack_seconds: latency(
                &r,
                COMMIT_TO_ACK_SECONDS,
                "Commit of a transaction with Outbox rows to Kafka's acknowledgement of its last Announcement.",
            ),
            commit_to_read_seconds: latency(
                &r,
                COMMIT_TO_READ_SECONDS,
                "Commit of a transaction to the relay reading its Commit message from the slot.",
            ),
            registry: r,
        };
        for s in WAL_STATUSES {
            m.wal_status.with_label_values(&[s]).set(0);
        }
        m
    }

    pub fn set_wal_status(&self, status: Option<&str>) {
        for s in WAL_STATUSES {
            self.wal_status
                .with_label_values(&[s])
                .set(i64::from(Some(s) == status));
        }
    }
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self::new()
    }
}
