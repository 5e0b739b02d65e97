//! Every status interval: the Slot as Postgres sees it (lag, retained WAL, `safe_wal_size`,
//! `wal_status`) into the metrics, what this relay last saw into `relay_status` (for
//! `railhook slot status`), and the prune job's new limit.

use sqlx::PgConnection;

use super::{Relay, RelayError, Session, seconds_since_pg_micros};
use crate::slot::{self, SlotError};

impl Relay {
    pub(super) async fn report_status(
        &self,
        control: &mut PgConnection,
        s: &Session,
    ) -> Result<(), RelayError> {
        let status = slot::status(&mut *control, &self.config.slot)
            .await?
            .ok_or_else(|| SlotError::Missing(self.config.slot.clone()))?;
        self.metrics
            .slot_lag_bytes
            .set(status.lag_bytes.unwrap_or(0));
        self.metrics
            .retained_wal_bytes
            .set(status.retained_bytes.unwrap_or(0));
        self.metrics
            .safe_wal_size_bytes
            .set(status.safe_wal_size.unwrap_or(-1));
        self.metrics.set_wal_status(status.wal_status.as_deref());
        if status.wal_status.as_deref() == Some("lost") {
            return Err(SlotError::Invalidated(self.config.slot.clone()).into());
        }
        if let Some(hb) = s.last_heartbeat_micros {
            self.metrics
                .heartbeat_age_seconds
                .set(seconds_since_pg_micros(hb));
        }
        let confirmed = s.confirmed.as_u64();
        slot::record_seen(
            &mut *control,
            &self.config.slot,
            s.last_heartbeat_micros,
            confirmed,
        )
        .await?;
        // The prune job (its own task) prunes up to here; the loop never waits on it.
        s.prune_up_to.send_replace(s.last_confirmed_commit_micros);
        Ok(())
    }
}
