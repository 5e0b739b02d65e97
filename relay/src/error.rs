//! Why a relay session ended, and what each reason means for the next one: stop (a
//! configuration error), wait for the Slot, or restart from the confirmed LSN.

use pgwire_replication::PgWireError;
use railhook_common::health::{self};
use rdkafka::error::KafkaError;

use crate::pgoutput::DecodeError;
use crate::slot::SlotError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Slot(#[from] SlotError),
    #[error("replication stream failed")]
    Stream(#[source] PgWireError),
    #[error("the slot is held by another relay")]
    SlotBusy,
    #[error("the replication stream ended")]
    StreamEnded,
    #[error("cannot decode the replication stream")]
    Decode(#[from] DecodeError),
    #[error("an outbox row lacks its {0} column")]
    OutboxRow(&'static str),
    #[error("an insert names relation {0}, which the stream never described")]
    UnknownRelation(u32),
    #[error("Kafka client")]
    Kafka(#[from] KafkaError),
    #[error("Kafka did not acknowledge an announcement")]
    Publish(#[source] KafkaError),
    #[error("injected crash: {0}")]
    InjectedCrash(&'static str),
}

impl RelayError {
    /// Configuration errors: no wait can fix them, so the relay stops and says why. Only a
    /// certificate refused under the URL's `sslmode` (or TLS settings the driver cannot use)
    /// is one; the relay never falls back to plaintext or to an unverified connection.
    pub(crate) fn is_configuration(&self) -> bool {
        match self {
            RelayError::Slot(SlotError::Postgres(e)) => health::postgres_is_configuration(e),
            RelayError::Stream(PgWireError::Tls(_)) => true,
            _ => false,
        }
    }

    /// The Slot cannot be streamed until an operator acts (create it, run the migration).
    pub(crate) fn is_slot_unusable(&self) -> bool {
        matches!(
            self,
            RelayError::Slot(
                SlotError::Missing(_) | SlotError::Invalidated(_) | SlotError::NoPublication(_)
            )
        )
    }

    /// The stream holds something this relay cannot read. Retried (slowly) rather than
    /// stopping: in `railhook all` the API and the worker keep serving meanwhile.
    pub(crate) fn is_undecodable(&self) -> bool {
        matches!(
            self,
            RelayError::Decode(_) | RelayError::OutboxRow(_) | RelayError::UnknownRelation(_)
        )
    }

    /// A short reason for `/readyz`: no server text beyond the SQLSTATE.
    pub(crate) fn reason(&self) -> String {
        match self {
            RelayError::Slot(SlotError::Postgres(e)) => health::postgres_reason(e),
            RelayError::Stream(PgWireError::Server(msg)) => {
                let code = msg
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .find(|w| w.len() == 5 && w.chars().any(|c| c.is_ascii_digit()))
                    .unwrap_or("?");
                format!("replication stream: server refused (SQLSTATE {code})")
            }
            RelayError::Stream(e) => format!("replication stream: {e}"),
            other => other.to_string(),
        }
    }
}

/// SQLSTATE 55006 (object in use) on START_REPLICATION: another relay streams the Slot.
pub(crate) fn stream_error(e: PgWireError) -> RelayError {
    match &e {
        PgWireError::Server(msg) if msg.contains("55006") => RelayError::SlotBusy,
        _ => RelayError::Stream(e),
    }
}
