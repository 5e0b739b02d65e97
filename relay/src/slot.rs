//! The replication Slot and publication, seen from an ordinary (control) connection:
//! creating and dropping the Slot, reading its status and lag, and writing heartbeats.
//!
//! The relay never creates its Slot: a new Slot starts at "now" and would silently skip
//! every Outbox row written while none existed. `railhook migrate` / `railhook slot create`
//! create it; a relay that finds it missing or invalidated waits (`railhook_relay_slot_unusable`
//! = 1) and picks it up once it exists again.
//!
//! The control connection is an sqlx connection built from the same parsed URL as the
//! replication stream ([`railhook_common::postgres_url`]), so both use one TLS rule.

use railhook_common::postgres_url::PostgresTarget;
use sqlx::{Connection, PgConnection, PgExecutor};

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("control connection to Postgres failed")]
    Postgres(#[from] sqlx::Error),
    #[error(
        "replication slot '{0}' does not exist: create it with `railhook slot create` (see docs/operate/slot.md); the relay never creates it, since a new slot would skip rows"
    )]
    Missing(String),
    #[error(
        "replication slot '{0}' was invalidated (wal_status = lost): recreate it and let the stranded-PENDING sweep re-announce (docs/operate/slot.md)"
    )]
    Invalidated(String),
    #[error("publication '{0}' does not exist: run `railhook migrate`")]
    NoPublication(String),
    #[error(
        "failover slots need PostgreSQL 17 or later; this server is {0}: create an ordinary slot and follow the lost-slot recovery after a failover (docs/operate/failover.md)"
    )]
    FailoverUnsupported(i32),
}

/// A control connection (TLS as the URL says); closed when dropped.
pub async fn connect(target: &PostgresTarget) -> Result<PgConnection, SlotError> {
    let options = target
        .sqlx_options()?
        .application_name("railhook-relay-control");
    Ok(PgConnection::connect_with(&options).await?)
}

pub use railhook_common::slot_status::SlotStatus;

/// The Slot's status (common/src/slot_status.rs: the one query every reader shares).
pub async fn status<'e>(
    db: impl PgExecutor<'e>,
    slot: &str,
) -> Result<Option<SlotStatus>, SlotError> {
    Ok(railhook_common::slot_status::read(db, slot).await?)
}

/// Refuses to stream from a Slot that is missing or lost, or without the publication.
pub async fn ensure_usable(
    conn: &mut PgConnection,
    slot: &str,
    publication: &str,
) -> Result<SlotStatus, SlotError> {
    let publication_exists = sqlx::query!(
        "SELECT 1 AS one FROM pg_publication WHERE pubname = $1",
        publication
    )
    .fetch_optional(&mut *conn)
    .await?
    .is_some();
    if !publication_exists {
        return Err(SlotError::NoPublication(publication.to_owned()));
    }
    let status = status(&mut *conn, slot)
        .await?
        .ok_or_else(|| SlotError::Missing(slot.to_owned()))?;
    if status.wal_status.as_deref() == Some("lost") {
        return Err(SlotError::Invalidated(slot.to_owned()));
    }
    Ok(status)
}

/// A physical slot named in `synchronized_standby_slots`: its standby must confirm WAL
/// before logical decoding may send it, so an inactive one holds the relay back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlot {
    pub slot: String,
    pub active: bool,
    pub lag_bytes: i64,
}

/// The slots of `synchronized_standby_slots` (PostgreSQL 17+; none before, or when unset).
pub async fn standby_slots(conn: &mut PgConnection) -> Result<Vec<StandbySlot>, SlotError> {
    let rows = sqlx::query!(
        r#"SELECT s.slot_name AS "slot!", s.active AS "active!",
                  coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint
                      AS "lag_bytes!"
           FROM pg_replication_slots s
           WHERE s.slot_type = 'physical'
             AND s.slot_name = ANY (string_to_array(replace(
                   coalesce(current_setting('synchronized_standby_slots', true), ''), ' ', ''), ','))
           ORDER BY 1"#
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| StandbySlot {
            slot: r.slot,
            active: r.active,
            lag_bytes: r.lag_bytes,
        })
        .collect())
}

/// Creates the Slot (pgoutput) if missing; returns whether it created one.
pub async fn create(conn: &mut PgConnection, slot: &str) -> Result<bool, SlotError> {
    create_with(conn, slot, false).await
}

/// [`create`], optionally as a PostgreSQL 17 failover Slot: Postgres then synchronises it
/// to physical standbys listed in `synchronized_standby_slots`, so a promoted standby has
/// the Slot at a position the relay can resume from. An older server refuses the flag here,
/// by name, rather than creating an ordinary Slot the operator believes will survive a
/// failover. An existing Slot is left as it is (its failover flag cannot be changed here).
pub async fn create_with(
    conn: &mut PgConnection,
    slot: &str,
    failover: bool,
) -> Result<bool, SlotError> {
    if failover {
        let version = sqlx::query_scalar!(
            r#"SELECT current_setting('server_version_num')::int AS "version!""#
        )
        .fetch_one(&mut *conn)
        .await?;
        if version < 170_000 {
            return Err(SlotError::FailoverUnsupported(version / 10_000));
        }
    }
    if status(&mut *conn, slot).await?.is_some() {
        return Ok(false);
    }
    if failover {
        create_failover_slot(conn, slot).await?;
    } else {
        sqlx::query!(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')::text AS created",
            slot
        )
        .fetch_one(&mut *conn)
        .await?;
    }
    Ok(true)
}

/// The five-argument form (name, plugin, temporary, two_phase, failover) exists only from
/// PostgreSQL 17, so it is sent unchecked: the compile-time check runs against whatever
/// server the crate is built with, which may be older. The caller checked the server is 17
/// or later.
#[allow(clippy::disallowed_methods)]
async fn create_failover_slot(conn: &mut PgConnection, slot: &str) -> Result<(), SlotError> {
    sqlx::query(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)::text",
    )
    .bind(slot)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// After a Slot was created again (it was dropped, or lost and recreated): every Delivery
/// whose Outbox row is still in the table and that is still `PENDING` with nothing scheduled
/// may have been written while no Slot existed, so its Announcement never left. Each is
/// handed to the retry path now (the retry scheduler announces it within a second or so)
/// instead of waiting an hour for the stranded-PENDING sweep. One whose Announcement did go
/// out is at worst hinted twice, and the Claim absorbs the second (duplicate window 4).
/// Returns how many were handed over.
pub async fn reannounce_missed(conn: &mut PgConnection) -> Result<u64, SlotError> {
    let moved = sqlx::query!(
        "UPDATE deliveries d SET next_retry_at = now(), updated_at = now()
         WHERE d.status = 'PENDING' AND d.next_retry_at IS NULL
           AND EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)",
    )
    .execute(&mut *conn)
    .await?;
    Ok(moved.rows_affected())
}

/// Drops the Slot; returns whether one existed.
pub async fn drop(conn: &mut PgConnection, slot: &str) -> Result<bool, SlotError> {
    if status(&mut *conn, slot).await?.is_none() {
        return Ok(false);
    }
    sqlx::query!("SELECT pg_drop_replication_slot($1)::text AS dropped", slot)
        .fetch_one(&mut *conn)
        .await?;
    Ok(true)
}

/// Records what the active relay saw: the commit time of the newest heartbeat that came
/// through the Slot (microseconds since 2000-01-01) and the confirmed LSN. Committed
/// locally only, as [`heartbeat`] is and for the same reason: an observation the next
/// report repeats, which must not hold the relay's loop behind a stalled standby.
pub async fn record_seen(
    conn: &mut PgConnection,
    slot: &str,
    heartbeat_micros: Option<i64>,
    confirmed_lsn: u64,
) -> Result<(), SlotError> {
    let lsn = format!(
        "{:X}/{:X}",
        confirmed_lsn >> 32,
        confirmed_lsn & 0xffff_ffff
    );
    sqlx::query!(
        "WITH local AS (SELECT set_config('synchronous_commit', 'local', true))
         INSERT INTO relay_status (slot, last_heartbeat_seen_at, confirmed_lsn, updated_at)
         SELECT $1, timestamptz '2000-01-01 00:00:00+00' + make_interval(secs => $2::float8 / 1e6),
                 $3::text::pg_lsn, now() FROM local
         ON CONFLICT (slot) DO UPDATE SET
             last_heartbeat_seen_at = coalesce(EXCLUDED.last_heartbeat_seen_at, relay_status.last_heartbeat_seen_at),
             confirmed_lsn = greatest(EXCLUDED.confirmed_lsn, relay_status.confirmed_lsn),
             updated_at = now()",
        slot,
        heartbeat_micros.map(|m| m as f64),
        lsn
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The last heartbeat the active relay saw through the Slot, as text, if any.
pub async fn last_heartbeat_seen(
    conn: &mut PgConnection,
    slot: &str,
) -> Result<Option<String>, SlotError> {
    let seen = sqlx::query_scalar!(
        r#"SELECT to_char(last_heartbeat_seen_at, 'YYYY-MM-DD"T"HH24:MI:SS.MSOF')
                || ' (' || round(extract(epoch from now() - last_heartbeat_seen_at)::numeric, 1) || ' s ago)'
                AS seen
           FROM relay_status WHERE slot = $1"#,
        slot
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(seen.flatten())
}

/// The prefix of the relay's heartbeat messages in the WAL.
pub const HEARTBEAT_PREFIX: &str = "railhook";

/// Writes a transactional heartbeat: it travels the Slot like any transaction, so an idle
/// Outbox still moves the confirmed LSN and lag stays measurable.
///
/// Committed locally only (`synchronous_commit = local`, for this transaction): the relay's
/// loop awaits it, and a heartbeat that waited for a stalled synchronous standby held the
/// stream for the whole answer deadline and then ended the session, every session, so Events
/// whose commits were already decoded waited for the stall to end before their hints went out
/// (CI, stop 61; `tests/whole_server/standby.rs`). A heartbeat lost in a failover costs
/// nothing: the next one carries the same news.
pub async fn heartbeat(conn: &mut PgConnection) -> Result<(), SlotError> {
    sqlx::query!(
        "WITH local AS (SELECT set_config('synchronous_commit', 'local', true))
         SELECT pg_logical_emit_message(true, $1, now()::text)::text AS lsn FROM local",
        HEARTBEAT_PREFIX
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(())
}

/// Whether `name` is a failover Slot (`failover` exists from PostgreSQL 17: read through
/// `to_jsonb`, so older servers answer `None`).
pub async fn is_failover(conn: &mut PgConnection, name: &str) -> Result<Option<bool>, sqlx::Error> {
    Ok(sqlx::query_scalar!(
        r#"SELECT (to_jsonb(s) ->> 'failover')::boolean AS failover
           FROM pg_replication_slots s WHERE s.slot_name = $1"#,
        name
    )
    .fetch_optional(&mut *conn)
    .await?
    .flatten())
}

/// How another server (a standby) holds the Slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotCopy {
    /// A synchronized copy a promotion keeps: `synced` and not `temporary`.
    Ready { confirmed_flush_lsn: Option<String> },
    /// Synchronized but still temporary: a promotion now drops it.
    NotReady,
    /// No Slot of that name.
    Missing,
    /// A Slot of that name that is not a synchronized copy.
    NotACopy,
}

/// What `railhook slot status` and the relay's `/readyz` say of a copy.
impl std::fmt::Display for SlotCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotCopy::Ready {
                confirmed_flush_lsn,
            } => write!(
                f,
                "ready: synchronized, confirmed_flush_lsn {}",
                confirmed_flush_lsn.as_deref().unwrap_or_default()
            ),
            SlotCopy::NotReady => {
                f.write_str("synchronized but not ready yet (temporary: dropped if promoted now)")
            }
            SlotCopy::Missing => f.write_str("no copy of the Slot"),
            SlotCopy::NotACopy => {
                f.write_str("a Slot of the same name that is not a synchronized copy")
            }
        }
    }
}

impl SlotCopy {
    pub fn is_ready(&self) -> bool {
        matches!(self, SlotCopy::Ready { .. })
    }
}

/// How the server behind `conn` holds a copy of `name` (docs/operate/failover.md, "Failover").
pub async fn copy_on(conn: &mut PgConnection, name: &str) -> Result<SlotCopy, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT (to_jsonb(s) ->> 'synced')::boolean AS synced,
                  (to_jsonb(s) ->> 'temporary')::boolean AS temporary,
                  s.confirmed_flush_lsn::text AS confirmed
           FROM pg_replication_slots s WHERE s.slot_name = $1"#,
        name
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match row {
        None => SlotCopy::Missing,
        Some(r) if r.synced == Some(true) && r.temporary != Some(true) => SlotCopy::Ready {
            confirmed_flush_lsn: r.confirmed,
        },
        Some(r) if r.synced == Some(true) => SlotCopy::NotReady,
        Some(_) => SlotCopy::NotACopy,
    })
}

/// Logs a running-transactions snapshot in the WAL now (`pg_log_standby_snapshot()`,
/// PostgreSQL 16+), so decoding can advance the Slot's `catalog_xmin` and `restart_lsn`
/// without waiting for the checkpointer's own (relay/src/copy_watch.rs says why).
#[allow(clippy::disallowed_methods)] // The function is PostgreSQL 16+; the offline query data is prepared against 15.
pub async fn log_standby_snapshot(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_log_standby_snapshot()")
        .execute(&mut *conn)
        .await?;
    Ok(())
}
