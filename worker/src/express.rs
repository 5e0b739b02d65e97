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
    entries: BTreeMap<(i32, i64), State>,
    /// The highest offset read from Kafka, per partition.
    read_to: HashMap<i32, i64>,
}

impl Book {
    /// Whether an express hint for (`partition`, `offset`) may be queued; if so, it is
    /// recorded as waiting.
    pub(crate) fn admit(&mut self, partition: i32, offset: i64) -> Admit {
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
        self.entries.insert((partition, offset), State::Waiting);
        Admit::Queued
    }

    /// The Claims of these express hints were answered.
    pub(crate) fn answered(&mut self, keys: &[(i32, i64)]) {
        for key in keys {
            // The Kafka copy may have been read meanwhile (it then took the hint's place).
            if let Some(state) = self.entries.get_mut(key) {
                *state = State::Answered;
            }
        }
    }

    /// The Kafka copy of (`partition`, `offset`) was read: what the book knew of it, now
    /// forgotten. Entries of the partition behind it are forgotten too: their Kafka copies
    /// can no longer come (a partition is read in order).
    pub(crate) fn kafka_copy(&mut self, partition: i32, offset: i64) -> Option<State> {
        let read = self.read_to.entry(partition).or_insert(offset);
        *read = (*read).max(offset);
        let state = self.entries.remove(&(partition, offset));
        let behind: Vec<(i32, i64)> = self
            .entries
            .range((partition, i64::MIN)..(partition, offset))
            .filter(|(_, s)| **s == State::Answered)
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
        assert_eq!(b.admit(0, 10), Admit::Queued);
        b.answered(&[(0, 10)]);
        assert_eq!(b.kafka_copy(0, 10), Some(State::Answered));
        assert_eq!(b.len(), 0);
        // Kafka read it: the same hint again is late.
        assert_eq!(b.admit(0, 10), Admit::KafkaFirst);
        assert_eq!(b.admit(0, 9), Admit::KafkaFirst);
        assert_eq!(b.admit(1, 3), Admit::Queued, "another partition");
    }

    #[test]
    fn a_kafka_copy_read_before_the_claim_says_the_hint_still_waits() {
        let mut b = Book::default();
        b.admit(0, 5);
        assert_eq!(b.kafka_copy(0, 5), Some(State::Waiting));
        // The lane dropped the express hint; its late answer changes nothing.
        b.answered(&[(0, 5)]);
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn answered_entries_behind_a_read_offset_are_forgotten() {
        let mut b = Book::default();
        b.admit(0, 1);
        b.admit(0, 2);
        b.admit(0, 7);
        b.answered(&[(0, 1), (0, 2)]);
        assert_eq!(b.kafka_copy(0, 4), None);
        assert_eq!(b.len(), 1, "only offset 7 is still ahead");
    }

    #[test]
    fn the_book_is_bounded_and_forgets_partitions_no_longer_held() {
        let mut b = Book::default();
        for o in 0..BOOK_MAX as i64 {
            assert_eq!(b.admit(3, o), Admit::Queued);
        }
        assert_eq!(b.admit(4, 0), Admit::Full);
        b.keep_only(&[4]);
        assert_eq!(b.len(), 0);
        assert_eq!(b.admit(4, 0), Admit::Queued);
    }
}
