//! The express hints' book: which Announcements a lane claimed from the doorbell
//! (common/src/doorbell.rs, `Express`) before Kafka delivered them, so that the Kafka copy,
//! when it arrives, only moves the offset.
//!
//! ```text
//!  doorbell: (partition, offset?, dlv) ─admit─▶ Waiting ─claimed─▶ Answered ─┐
//!                                                   │                          │ Kafka copy of dlv read:
//!  Kafka: message naming dlv ───────────────────────┴─ still Waiting:         └▶ offset stored,
//!                                                      the Kafka copy claims       no Claim
//!                                                      (the express one is dropped)
//! ```
//!
//! The relay sends most hints when it reads the Outbox row, before the broker acknowledged
//! it (issue #54): such a hint has no offset, so the book keys every hint by the Delivery it
//! names, and a Kafka copy finds its hint by the Delivery it names.
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
//!   copy is, or was, claimed. (A hint without an offset whose copy was read first is
//!   claimed once more; that Claim matches nothing: a duplicate hint, left alone.)
//! - The book keeps the Delivery id an express hint named, and a Kafka copy counts as
//!   answered only when it names the same Delivery (issue #53). Any role that can connect
//!   to the database can send a NOTIFY on the doorbell's channel, and a stale or forged
//!   hint for an offset would otherwise turn the real Announcement at that offset into an
//!   offset-only copy, leaving its Delivery to the stranded sweep. On a mismatch the Kafka
//!   copy claims, as if there had been no express hint; the forged hint's own Claim decided
//!   nothing the Delivery row did not allow.
//!
//! The book is bounded ([`BOOK_MAX`]): past it, entries older than [`FORGET_AFTER`] are
//! forgotten, and if it is still full express hints are dropped and their Announcements
//! take the Kafka path. Entries of partitions the worker no longer holds are
//! forgotten at the next express batch (their Kafka copies will be read by another member,
//! whose Claim finds the row already taken: a duplicate, left alone).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Express hints a lane tracks at most.
pub(crate) const BOOK_MAX: usize = 4_096;

/// How long an entry waits for its Kafka copy before the book forgets it: a hint sent at read
/// time to a partition the broker did not choose, or a forged one, has no copy coming here.
/// A copy that arrives later still claims; the Claim then matches nothing (a duplicate hint).
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Queued in the lane, not claimed yet.
    Waiting,
    /// Its Claim's statement committed or matched nothing.
    Answered,
}

#[derive(Debug)]
struct Entry {
    state: State,
    partition: i32,
    /// The Announcement's offset, for a hint sent after the acknowledgement.
    offset: Option<i64>,
    /// The Outbox row of the Announcement (a Delivery can be announced again: a manual
    /// retry, a replay, an ordering release); `None` from a relay of an earlier release.
    outbox_id: Option<i64>,
    admitted: Instant,
}

impl Entry {
    /// Whether the Kafka copy at `offset`, of the Outbox row `outbox_id`, is this entry's
    /// Announcement; `Some(false)` when it is a later one (this entry's copy went by
    /// unseen: the hint came after it), `None` when it cannot tell (then it is not).
    fn is_copy(&self, offset: i64, outbox_id: Option<i64>) -> Option<bool> {
        match (self.outbox_id, outbox_id) {
            (Some(mine), Some(copy)) if mine == copy => Some(true),
            (Some(mine), Some(copy)) => (mine < copy).then_some(false),
            _ => match self.offset {
                Some(mine) if mine == offset => Some(true),
                Some(mine) => (mine < offset).then_some(false),
                None => None,
            },
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Book {
    /// Each express hint by the Delivery it names (issue #54: a hint sent at read time has
    /// no offset yet, and its Kafka copy is recognised by the Delivery it names).
    entries: HashMap<String, Entry>,
    /// The highest offset read from Kafka, per partition.
    read_to: HashMap<i32, i64>,
}

impl Book {
    /// Whether an express hint for `delivery_id` (in `partition`, at `offset` when the hint
    /// knows it) may be queued; if so, it is recorded as waiting.
    pub(crate) fn admit(
        &mut self,
        partition: i32,
        offset: Option<i64>,
        delivery_id: &str,
        outbox_id: Option<i64>,
    ) -> Admit {
        if let Some(offset) = offset
            && self
                .read_to
                .get(&partition)
                .is_some_and(|read| offset <= *read)
        {
            return Admit::KafkaFirst;
        }
        // The same Announcement named twice (the hint at read time and, after a wrong guess
        // of the partition, the one at the acknowledgement; a replayed NOTIFY): one Claim.
        // An entry of an earlier Announcement of the Delivery gives way to this one: its
        // copy went by before its hint came, and must not stand for this one's.
        if let Some(e) = self.entries.get(delivery_id) {
            let later = matches!((e.outbox_id, outbox_id), (Some(old), Some(new)) if new > old);
            if !later {
                return Admit::KafkaFirst;
            }
            self.entries.remove(delivery_id);
        }
        if self.entries.len() >= BOOK_MAX {
            self.entries
                .retain(|_, e| e.admitted.elapsed() < FORGET_AFTER);
            if self.entries.len() >= BOOK_MAX {
                return Admit::Full;
            }
        }
        self.entries.insert(
            delivery_id.to_owned(),
            Entry {
                state: State::Waiting,
                partition,
                offset,
                outbox_id,
                admitted: Instant::now(),
            },
        );
        Admit::Queued
    }

    /// The Claims of these express hints (Delivery id, Outbox row) were answered.
    pub(crate) fn answered(&mut self, hints: &[(String, Option<i64>)]) {
        for (id, outbox_id) in hints {
            // The Kafka copy may have been read meanwhile (it then took the hint's place), or
            // a later Announcement's hint replaced the entry: only this hint's entry counts.
            if let Some(entry) = self.entries.get_mut(id)
                && entry.outbox_id == *outbox_id
            {
                entry.state = State::Answered;
            }
        }
    }

    /// The Kafka copy of (`partition`, `offset`) was read, naming `delivery_id` (`None`: an
    /// undecodable or non-Announcement record): what the book knew of the express hint for
    /// that Delivery, now forgotten; `None` when there was none (then the copy claims for
    /// itself). Only a hint naming this very Delivery counts, so a stale or forged hint
    /// cannot turn another Announcement into an offset-only copy (issue #53). Answered
    /// entries with a known offset behind it in the partition are forgotten too: their Kafka
    /// copies can no longer come (a partition is read in order).
    pub(crate) fn kafka_copy(
        &mut self,
        partition: i32,
        offset: i64,
        delivery_id: Option<&str>,
        outbox_id: Option<i64>,
    ) -> Option<State> {
        let read = self.read_to.entry(partition).or_insert(offset);
        *read = (*read).max(offset);
        let mut state = None;
        if let Some(id) = delivery_id
            && let Some(entry) = self.entries.get(id)
        {
            match entry.is_copy(offset, outbox_id) {
                Some(true) => state = self.entries.remove(id).map(|e| e.state),
                // A later Announcement of the Delivery: the entry's own copy went by, so it
                // is forgotten, and this copy claims for itself.
                Some(false) => {
                    self.entries.remove(id);
                }
                None => {}
            }
        }
        self.entries.retain(|_, e| {
            !(e.partition == partition
                && e.state == State::Answered
                && e.offset.is_some_and(|o| o < offset))
        });
        state
    }

    /// Forgets the partitions this worker no longer holds.
    pub(crate) fn keep_only(&mut self, held: &[i32]) {
        self.entries.retain(|_, e| held.contains(&e.partition));
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

    fn ids(v: &[&str]) -> Vec<(String, Option<i64>)> {
        v.iter().map(|s| ((*s).to_owned(), None)).collect()
    }

    #[test]
    fn an_answered_hint_turns_its_kafka_copy_into_an_offset_only() {
        let mut b = Book::default();
        assert_eq!(b.admit(0, Some(10), "d", None), Admit::Queued);
        b.answered(&ids(&["d"]));
        assert_eq!(b.kafka_copy(0, 10, Some("d"), None), Some(State::Answered));
        assert_eq!(b.len(), 0);
        // Kafka read it: the same hint again is late.
        assert_eq!(b.admit(0, Some(10), "d", None), Admit::KafkaFirst);
        assert_eq!(b.admit(0, Some(9), "e", None), Admit::KafkaFirst);
        assert_eq!(
            b.admit(1, Some(3), "f", None),
            Admit::Queued,
            "another partition"
        );
    }

    /// Issue #54: a hint sent when the relay read the row knows no offset; its Kafka copy is
    /// known by the Delivery and the Outbox row it names, wherever it lands in the partition.
    #[test]
    fn a_hint_sent_at_read_time_is_matched_by_its_announcement() {
        let mut b = Book::default();
        b.kafka_copy(0, 40, Some("older"), Some(1));
        assert_eq!(
            b.admit(0, None, "d", Some(7)),
            Admit::Queued,
            "never late by offset"
        );
        b.answered(&[("d".to_owned(), Some(7))]);
        // Copies of other Deliveries pass by and leave it alone.
        assert_eq!(b.kafka_copy(0, 41, Some("x"), Some(8)), None);
        assert_eq!(b.len(), 1);
        assert_eq!(
            b.kafka_copy(0, 42, Some("d"), Some(7)),
            Some(State::Answered)
        );
        assert_eq!(b.len(), 0);
        // The acknowledgement's hint for the same Announcement (a wrong guess corrected)
        // after the read-time one: one Claim.
        assert_eq!(b.admit(1, None, "e", Some(9)), Admit::Queued);
        assert_eq!(b.admit(0, Some(50), "e", Some(9)), Admit::KafkaFirst);
    }

    /// A Delivery announced again (a manual retry, a replay, an ordering release) is not
    /// taken for claimed by an entry of its earlier Announcement whose hint came after its
    /// copy (found by the Python SDK scenario's `recover`).
    #[test]
    fn a_later_announcement_of_a_delivery_is_not_taken_for_an_earlier_one() {
        let mut b = Book::default();
        // The copy of Outbox row 1 was read before its hint came; the hint is claimed.
        b.kafka_copy(0, 10, Some("d"), Some(1));
        assert_eq!(b.admit(0, None, "d", Some(1)), Admit::Queued);
        b.answered(&[("d".to_owned(), Some(1))]);
        // Row 2 announces the Delivery again, without a hint reaching this worker: its copy
        // claims, and the stale entry is gone.
        assert_eq!(b.kafka_copy(0, 11, Some("d"), Some(2)), None);
        assert_eq!(b.len(), 0);
        // With a hint for row 3: it replaces a stale entry of row 1 and stands for row 3 only.
        b.admit(0, None, "d", Some(1));
        b.answered(&[("d".to_owned(), Some(1))]);
        assert_eq!(b.admit(0, None, "d", Some(3)), Admit::Queued);
        b.answered(&[("d".to_owned(), Some(1))]);
        assert_eq!(
            b.kafka_copy(0, 12, Some("d"), Some(3)),
            Some(State::Waiting),
            "row 1's late answer does not answer row 3's hint"
        );
    }

    #[test]
    fn a_kafka_copy_read_before_the_claim_says_the_hint_still_waits() {
        let mut b = Book::default();
        b.admit(0, Some(5), "d", None);
        assert_eq!(b.kafka_copy(0, 5, Some("d"), None), Some(State::Waiting));
        // The lane dropped the express hint; its late answer changes nothing.
        b.answered(&ids(&["d"]));
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn answered_entries_behind_a_read_offset_are_forgotten() {
        let mut b = Book::default();
        b.admit(0, Some(1), "a", None);
        b.admit(0, Some(2), "b", None);
        b.admit(0, Some(7), "c", None);
        b.admit(0, None, "early", None);
        b.answered(&ids(&["a", "b", "early"]));
        assert_eq!(b.kafka_copy(0, 4, Some("x"), None), None);
        assert_eq!(
            b.len(),
            2,
            "offset 7 is still ahead; the early one waits for its copy"
        );
    }

    /// Issue #53 finding 12: a hint naming another Delivery (stale, or a forged NOTIFY) does
    /// not turn the real Announcement into an offset-only copy.
    #[test]
    fn a_kafka_copy_naming_another_delivery_claims_for_itself() {
        let mut b = Book::default();
        b.admit(0, Some(10), "dlv_forged", None);
        b.answered(&ids(&["dlv_forged"]));
        assert_eq!(b.kafka_copy(0, 10, Some("dlv_real"), None), None);
        b.admit(0, Some(11), "dlv_a", None);
        b.answered(&ids(&["dlv_a"]));
        assert_eq!(b.kafka_copy(0, 11, None, None), None, "an undecodable copy");
    }

    #[test]
    fn the_book_is_bounded_and_forgets_partitions_no_longer_held() {
        let mut b = Book::default();
        for o in 0..BOOK_MAX as i64 {
            assert_eq!(b.admit(3, Some(o), &format!("d{o}"), None), Admit::Queued);
        }
        assert_eq!(b.admit(4, Some(0), "another", None), Admit::Full);
        b.keep_only(&[4]);
        assert_eq!(b.len(), 0);
        assert_eq!(b.admit(4, Some(0), "another", None), Admit::Queued);
    }
}
