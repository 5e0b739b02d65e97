//! Stopping: the active relay's drain (module docs of `relay`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use pgwire_replication::ReplicationClient;

use super::{Relay, RelayError, Session};
use crate::error::stream_error;

impl Relay {
    /// Lets a session that was told to stop finish its drain, for at most the drain
    /// timeout. A session still connecting or standing by just ends.
    pub(super) async fn drain(
        &self,
        session: Pin<&mut impl Future<Output = Result<(), RelayError>>>,
    ) {
        let slot = &self.config.slot;
        match tokio::time::timeout(self.config.drain_timeout, session).await {
            Ok(Ok(())) | Ok(Err(RelayError::SlotBusy)) => tracing::info!(%slot, "relay stopped"),
            Ok(Err(e)) => {
                tracing::warn!(%slot, error = %e, "relay stopped during its drain; the next relay resumes from the confirmed LSN")
            }
            Err(_) => tracing::warn!(
                %slot,
                "relay drain timed out; the next relay resumes from the confirmed LSN and resends what was not confirmed"
            ),
        }
        self.metrics.active.set(0);
    }

    /// The end of a drain: waits until the feedback that carries the confirmed LSN has gone
    /// to Postgres (the client sends it within its status interval), then ends the stream
    /// with CopyDone, which frees the Slot for the standby at once.
    pub(super) async fn end_drained(
        &self,
        stream: &mut ReplicationClient,
        s: &Session,
    ) -> Result<(), RelayError> {
        let sent = stream.metrics();
        while sent.last_applied_lsn() < s.confirmed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stream.shutdown().await.map_err(stream_error)?;
        tracing::info!(slot = %self.config.slot, confirmed = %s.confirmed, "relay drained: every message it read was acknowledged and confirmed");
        Ok(())
    }
}
