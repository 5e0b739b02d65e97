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
        self.report_standbys(&mut *control).await?;
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

    /// The standbys Postgres waits for before decoding (`synchronized_standby_slots`): each
    /// one's slot into the metrics, and `/readyz` names one that does not stream, since the
    /// relay then waits for it (no Event is lost; none is announced either).
    async fn report_standbys(&self, control: &mut PgConnection) -> Result<(), RelayError> {
        let standbys = slot::standby_slots(control).await?;
        if !standbys.is_empty() {
            // Declared once there is one (idempotent): servers without them never show it.
            self.deps.declare("standby", true);
        }
        for st in &standbys {
            self.metrics
                .standby_slot_active
                .with_label_values(&[&st.slot])
                .set(i64::from(st.active));
            self.metrics
                .standby_slot_lag_bytes
                .with_label_values(&[&st.slot])
                .set(st.lag_bytes);
        }
        match standbys.iter().find(|st| !st.active) {
            Some(st) => self.deps.down(
                "standby",
                format!(
                    "the standby of slot {} (synchronized_standby_slots) is not streaming: \
                     Postgres holds the relay back until it is",
                    st.slot
                ),
            ),
            None if !standbys.is_empty() => self.deps.up("standby"),
            None => {}
        }
        Ok(())
    }
}
