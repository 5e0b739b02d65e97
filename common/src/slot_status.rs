//! How the replication Slot stands, read from an ordinary connection: the one query behind
//! `railhook slot status`, the relay's lag gauges and the dashboard's relay page.

use sqlx::PgExecutor;

/// Everything an operator needs to judge a Slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStatus {
    pub slot: String,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`: WAL written that the relay has not
    /// confirmed yet.
    pub lag_bytes: Option<i64>,
    /// `pg_current_wal_lsn() - restart_lsn`: WAL Postgres keeps on disk for this Slot.
    pub retained_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreachable` or `lost`.
    pub wal_status: Option<String>,
    /// Bytes that can still be written before the Slot is in danger of being invalidated
    /// (null when `max_slot_wal_keep_size` is unlimited).
    pub safe_wal_size: Option<i64>,
    /// Seconds since the last heartbeat the active relay saw come through the Slot (an
    /// upper bound of the lag in time), from `relay_status`.
    pub heartbeat_age_seconds: Option<f64>,
    /// Seconds since the active relay last wrote `relay_status`.
    pub status_age_seconds: Option<f64>,
}

/// The Slot named `slot`, or `None` when it does not exist.
pub async fn read<'e>(
    db: impl PgExecutor<'e>,
    slot: &str,
) -> Result<Option<SlotStatus>, sqlx::Error> {
    sqlx::query_as!(
        SlotStatus,
        r#"SELECT s.slot_name::text AS "slot!", s.active AS "active!", s.active_pid,
                  s.confirmed_flush_lsn::text AS confirmed_flush_lsn,
                  s.restart_lsn::text AS restart_lsn,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS retained_bytes,
                  s.wal_status, s.safe_wal_size,
                  (SELECT extract(epoch FROM now() - st.last_heartbeat_seen_at)::float8
                   FROM relay_status st WHERE st.slot = s.slot_name) AS heartbeat_age_seconds,
                  (SELECT extract(epoch FROM now() - st.updated_at)::float8
                   FROM relay_status st WHERE st.slot = s.slot_name) AS status_age_seconds
           FROM pg_replication_slots s WHERE s.slot_name = $1"#,
        slot
    )
    .fetch_optional(db)
    .await
}
