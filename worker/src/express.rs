//! The express hints' book: which Announcements a lane claimed from the doorbell
//! (common/src/doorbell.rs, `Express`) before Kafka delivered them, so that the Kafka copy,
//! when it arrives, only moves the offset.
//!
//! ```text
//!  doorbell: (partition, offset, dlv) ─admit─▶ Waiting ─claimed─▶ Answered ─┐
//!                                                  │                          │ Kafka copy read:
//!  Kafka: message at (partition, offset) ──────────┴─ still Waiting:         └▶ offset stored,
//!                                                     the Kafka copy claims       no Claim
//!                                                     (the express one is dropped)
//! ```
//!
//! Why this is safe:
//! - The Claim decides, whichever hint leads to it: an express hint claims the Delivery
//!   exactly as its Announcement would, through the same statement (dispatch.rs).
//! - Offsets are never moved by an express hint. The Kafka copy's offset is stored only
//!   once the express Claim's statement committed or matched nothing (`Answered`), which is
//!   what a Kafka hint's own Claim would have guaranteed (lanes.rs).
//! - A Kafka copy read while its express hint still waits takes its place, so no hint is
//!   claimed twice by one lane, and none is skipped.
//! - An express hint for an offset the lane already read from Kafka is dropped: the Kafka
//!   copy is, or was, claimed.
//! - The book keeps the Delivery id an express hint named, and a Kafka copy counts as
//!   answered only when it names the same Delivery (issue #53). Any role that can connect
//!   to the database can send a NOTIFY on the doorbell's channel, and a stale or forged
//!   hint for an offset would otherwise turn the real Announcement at that offset into an
//!   offset-only copy, leaving its Delivery to the stranded sweep. On a mismatch the Kafka
//!   copy claims, as if there had been no express hint; the forged hint's own Claim decided
//!   nothing the Delivery row did not allow.
//!
//! The book is bounded ([`BOOK_MAX`]): past it, express hints are dropped, and their
//! Announcements take the Kafka path. Entries of partitions the worker no longer holds are
//! forgotten at the next express batch (their Kafka copies will be read by another member,
//! whose Claim finds the row already taken: a duplicate, left alone).

use std::collections::{BTreeMap, HashMap};

/// Express hints a lane tracks at most.
pub(crate) const BOOK_MAX: usize = 4_096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Queued in the lane, not claimed yet.
    Waiting,
    /// Its Claim's statement committed or matched nothing.
    Answered,
}

#[derive(Debug, Default)]
pub(crate) struct Book {
    /// Each express hint's state and the Delivery id it named.
    entries: BTreeMap<(i32, i64), (State, String)>,
    /// The highest offset read from Kafka, per partition.
    read_to: HashMap<i32, i64>,
}

impl Book {
    /// Whether an express hint for (`partition`, `offset`) may be queued; if so, it is
    /// recorded as waiting.
    pub(crate) fn admit(&mut self, partition: i32, offset: i64, delivery_id: &str) -> Admit {
        if self
            .read_to
            .get(&partition)
            .is_some_and(|read| offset <= *read)
        {
            return Admit::KafkaFirst;
        }
        if self.entries.contains_key(&(partition, offset)) {
            return Admit::KafkaFirst;
        }
        if self.entries.len() >= BOOK_MAX {
            return Admit::Full;
        }
        self.entries.insert(
            (partition, offset),
            (State::Waiting, delivery_id.to_owned()),
        );
        Admit::Queued
    }

    /// The Claims of these express hints were answered.
    pub(crate) fn answered(&mut self, keys: &[(i32, i64)]) {
        for key in keys {
            // The Kafka copy may have been read meanwhile (it then took the hint's place).
            if let Some((state, _)) = self.entries.get_mut(key) {
                *state = State::Answered;
            }
        }
    }

    /// The Kafka copy of (`partition`, `offset`) was read, naming `delivery_id` (`None`: an
    /// undecodable or non-Announcement record): what the book knew of the express hint for
    /// that offset, now forgotten; `None` when there was none or it named another Delivery
    /// (then the copy claims for itself). Entries of the partition behind it are forgotten
    /// too: their Kafka copies can no longer come (a partition is read in order).
    pub(crate) fn kafka_copy(
        &mut self,
        partition: i32,
        offset: i64,
        delivery_id: Option<&str>,
    ) -> Option<State> {
        let read = self.read_to.entry(partition).or_insert(offset);
        *read = (*read).max(offset);
        let state = self
            .entries
            .remove(&(partition, offset))
            .filter(|(_, named)| delivery_id == Some(named.as_str()))
            .map(|(state, _)| state);
        let behind: Vec<(i32, i64)> = self
            .entries
            .range((partition, i64::MIN)..(partition, offset))
            .filter(|(_, (s, _))| *s == State::Answered)
            .map(|(k, _)| *k)
            .collect();
        for k in behind {
            self.entries.remove(&k);
        }
        state
    }

    /// Forgets the partitions this worker no longer holds.
    pub(crate) fn keep_only(&mut self, held: &[i32]) {
        self.entries.retain(|(p, _), _| held.contains(p));
        self.read_to.retain(|p, _| held.contains(p));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What became of an express hint; the label of `railhook_worker_express_hints_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Queued for a Claim.
    Queued,
    /// Its Kafka copy was read first.
    KafkaFirst,
    /// The book is full.
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answered_hint_turns_its_kafka_copy_into_an_offset_only() {
        let mut b = Book::default();
        assert_eq!(b.admit(0, 10, "d"), Admit::Queued);
        b.answered(&[(0, 10)]);
        assert_eq!(b.kafka_copy(0, 10, Some("d")), Some(State::Answered));
        assert_eq!(b.len(), 0);
        // Kafka read it: the same hint again is late.
        assert_eq!(b.admit(0, 10, "d"), Admit::KafkaFirst);
        assert_eq!(b.admit(0, 9, "d"), Admit::KafkaFirst);
        assert_eq!(b.admit(1, 3, "d"), Admit::Queued, "another partition");
    }

    #[test]
    fn a_kafka_copy_read_before_the_claim_says_the_hint_still_waits() {
        let mut b = Book::default();
        b.admit(0, 5, "d");
        assert_eq!(b.kafka_copy(0, 5, Some("d")), Some(State::Waiting));
        // The lane dropped the express hint; its late answer changes nothing.
        b.answered(&[(0, 5)]);
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn answered_entries_behind_a_read_offset_are_forgotten() {
        let mut b = Book::default();
        b.admit(0, 1, "d");
        b.admit(0, 2, "d");
        b.admit(0, 7, "d");
        b.answered(&[(0, 1), (0, 2)]);
        assert_eq!(b.kafka_copy(0, 4, Some("d")), None);
        assert_eq!(b.len(), 1, "only offset 7 is still ahead");
    }

    /// Issue #53 finding 12: a hint naming another Delivery at that offset (stale, or a
    /// forged NOTIFY) does not turn the real Announcement into an offset-only copy.
    #[test]
    fn a_kafka_copy_naming_another_delivery_claims_for_itself() {
        let mut b = Book::default();
        b.admit(0, 10, "dlv_forged");
        b.answered(&[(0, 10)]);
        assert_eq!(b.kafka_copy(0, 10, Some("dlv_real")), None);
        assert_eq!(b.len(), 0);
        b.admit(0, 11, "dlv_a");
        b.answered(&[(0, 11)]);
        assert_eq!(b.kafka_copy(0, 11, None), None, "an undecodable copy");
    }

    #[test]
    fn the_book_is_bounded_and_forgets_partitions_no_longer_held() {
        let mut b = Book::default();
        for o in 0..BOOK_MAX as i64 {
            assert_eq!(b.admit(3, o, "d"), Admit::Queued);
        }
        assert_eq!(b.admit(4, 0, "d"), Admit::Full);
        b.keep_only(&[4]);
        assert_eq!(b.len(), 0);
        assert_eq!(b.admit(4, 0, "d"), Admit::Queued);
    }
}
