//! The ingest's own express hints (issue #54): right after a statement that wrote Events
//! commits, the ingest tells the workers which Deliveries it announced, through the same
//! doorbell the relay rings (common/src/doorbell.rs, `Express`), so the worker holding the
//! partition claims without waiting for the relay to read the commit from the WAL.
//!
//! ```text
//!  ingest: commit ──▶ 201, and Express(partition, AT_READ, dlv, outbox) ──NOTIFY──▶ worker: Claim
//!  relay:  WAL read ─▶ Express(…same Announcement…) ──NOTIFY──▶ worker: already in its book, dropped
//!          Kafka ack ─▶ (nothing: the guess was right)        Kafka copy ─▶ worker: offset only
//! ```
//!
//! It is a hint about a hint, as every express hint is, so it can cost latency but never a
//! Delivery:
//! - It is sent only after the statement committed (the pool's statement is its own
//!   transaction, and the ringer sends it later still), so the row is visible to the Claim.
//! - A hint lost (the ingest stopped before the NOTIFY, a full ringer queue) leaves the relay's
//!   hint and the Kafka copy, as before.
//! - The partition is the one the relay's producer will choose, computed the same way
//!   (`predicted_partition` of the endpoint, the key, modulo `KAFKA_PARTITIONS`). If the
//!   topic has another partition count than the setting, the guess may be wrong: the worker
//!   holding the guessed partition claims (the Claim decides, once), and the worker reading
//!   the real copy finds the row taken — a duplicate hint, left alone.
//! - The same Announcement named twice (this hint and the relay's) is one Claim: the worker's
//!   book keys hints by Delivery and Outbox row (worker/src/express.rs, `admit`).
//!
//! Only the plain ingest statement reports what it announced; Events written through
//! `railhook_ingest()` (an Idempotency-Key, a payload filter) or in a batch's transaction take
//! the relay's hints alone.

use std::sync::OnceLock;

use railhook_common::config::Settings;
use railhook_common::doorbell::{Dial, Express, Ringer};
use railhook_common::kafka_producer::predicted_partition;
use sqlx::PgPool;

/// A Delivery the statement announced: its id, its endpoint (the Kafka key) and the Outbox
/// row it was announced by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Announced {
    pub delivery_id: String,
    pub endpoint_id: String,
    pub outbox_id: i64,
}

/// Sends the ingest's express hints; `None` from [`IngestHints::new`] when they are off.
pub(crate) struct IngestHints {
    dial: Dial,
    partitions: i32,
    /// Started with the first hint (inside the runtime), on a connection of its own.
    ringer: OnceLock<Ringer>,
}

impl IngestHints {
    /// Off when `INGEST_EXPRESS_HINTS` is false, or when `KAFKA_PROPERTIES` names a
    /// partitioner the ingest cannot foresee (as the relay's hints at read time).
    pub(crate) fn new(pool: &PgPool, settings: &Settings) -> Option<Self> {
        let foreseeable = settings
            .kafka()
            .property("partitioner")
            .is_none_or(|p| p == "consistent_random");
        (settings.ingest_express_hints && foreseeable && settings.kafka_partitions > 0).then(|| {
            Self {
                dial: Dial::Pool(pool.clone(), "railhook-ingest-doorbell"),
                partitions: settings.kafka_partitions,
                ringer: OnceLock::new(),
            }
        })
    }

    /// Hints every Delivery of `announced`; call only once their statement committed.
    pub(crate) fn send(&self, announced: &[Announced]) {
        if announced.is_empty() {
            return;
        }
        let ringer = self.ringer.get_or_init(|| Ringer::spawn(self.dial.clone()));
        for a in announced {
            if let Some(hint) = hint_of(a, self.partitions) {
                ringer.express(hint);
            }
        }
    }
}

/// The hint for `a`, to the partition the relay's producer will give its Announcement.
fn hint_of(a: &Announced, partitions: i32) -> Option<Express> {
    let partition = predicted_partition(&a.endpoint_id, partitions)?;
    Some(Express {
        partition,
        offset: Express::AT_READ,
        delivery_id: a.delivery_id.clone(),
        outbox_id: Some(a.outbox_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_names_the_announcement_and_the_partition_of_its_key() {
        let a = Announced {
            delivery_id: "dlv_01m98zzzzzzzzzzzzzzzzzzzzz".into(),
            endpoint_id: "ep_1".into(),
            outbox_id: 42,
        };
        let hint = hint_of(&a, 6).expect("hint");
        assert_eq!(
            hint.partition,
            predicted_partition("ep_1", 6).expect("partition")
        );
        assert_eq!(hint.offset, Express::AT_READ);
        assert_eq!(hint.delivery_id, a.delivery_id);
        assert_eq!(hint.outbox_id, Some(42));
        assert!(hint_of(&a, 0).is_none(), "no partitions, no guess");
    }
}
