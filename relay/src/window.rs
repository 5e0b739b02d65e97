//! The in-flight window: which transactions have messages Kafka has not acknowledged yet,
//! and therefore how far the Slot may be confirmed.
//!
//! Invariant: the relay confirms a Commit's `end_lsn` only when every message of that
//! transaction *and of every earlier transaction* is acknowledged by Kafka (`acks=all`). If
//! it confirmed a later transaction while an earlier one was still in flight, a crash would
//! make Postgres resume after the earlier one's rows: a gap, i.e. lost Announcements.
//! Confirming too little only costs duplicates on restart, which the worker's Claim absorbs.
//!
//! The window is also the backpressure: when it holds `max_messages` messages or
//! `max_bytes` bytes, the relay stops reading the Slot, so its memory stays flat however long
//! Kafka is away, while Postgres keeps the WAL (the Slot's lag grows instead).

use std::collections::VecDeque;

use pgwire_replication::Lsn;

/// A transaction seen from Begin on.
#[derive(Debug)]
struct Txn {
    seq: u64,
    /// Messages handed to Kafka and not acknowledged yet.
    pending: usize,
    /// Messages handed to Kafka in all.
    sent: usize,
    commit: Option<Committed>,
}

/// What is known once a transaction's Commit was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 (Postgres' epoch).
    pub commit_time_micros: i64,
}

#[derive(Debug)]
pub struct Window {
    txns: VecDeque<Txn>,
    next_seq: u64,
    messages: usize,
    bytes: usize,
    max_messages: usize,
    max_bytes: usize,
}

impl Window {
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        Self {
            txns: VecDeque::new(),
            next_seq: 0,
            messages: 0,
            bytes: 0,
            max_messages,
            max_bytes,
        }
    }

    /// A Begin: returns the transaction's sequence number.
    pub fn begin(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.txns.push_back(Txn {
            seq,
            pending: 0,
            sent: 0,
            commit: None,
        });
        seq
    }

    fn txn(&mut self, seq: u64) -> Option<&mut Txn> {
        let front = self.txns.front()?.seq;
        let idx = usize::try_from(seq.checked_sub(front)?).ok()?;
        self.txns.get_mut(idx)
    }

    /// A message of transaction `seq` handed to Kafka.
    pub fn sent(&mut self, seq: u64, bytes: usize) {
        if let Some(t) = self.txn(seq) {
            t.pending += 1;
            t.sent += 1;
            self.messages += 1;
            self.bytes += bytes;
        }
    }

    /// Transaction `seq`'s Commit was read.
    pub fn commit(&mut self, seq: u64, committed: Committed) {
        if let Some(t) = self.txn(seq) {
            t.commit = Some(committed);
        }
    }

    /// Kafka acknowledged one message of transaction `seq`.
    pub fn acked(&mut self, seq: u64, bytes: usize) {
        if let Some(t) = self.txn(seq) {
            t.pending = t.pending.saturating_sub(1);
            self.messages = self.messages.saturating_sub(1);
            self.bytes = self.bytes.saturating_sub(bytes);
        }
    }

    /// Pops every leading transaction that is committed and fully acknowledged; returns the
    /// newest of them, whose `end_lsn` may now be confirmed.
    pub fn confirmable(&mut self) -> Option<Committed> {
        self.drain_confirmable(|_, _| {})
    }

    /// Like [`confirmable`](Self::confirmable), calling `each` with every popped
    /// transaction and the number of messages it carried.
    pub fn drain_confirmable(
        &mut self,
        mut each: impl FnMut(Committed, usize),
    ) -> Option<Committed> {
        let mut newest = None;
        while let Some(front) = self.txns.front() {
            match front.commit {
                Some(c) if front.pending == 0 => {
                    each(c, front.sent);
                    newest = Some(c);
                    self.txns.pop_front();
                }
                _ => break,
            }
        }
        newest
    }

    /// Nothing read from the Slot is waiting for Kafka or for its Commit.
    pub fn is_idle(&self) -> bool {
        self.txns.is_empty()
    }

    pub fn has_room(&self) -> bool {
        self.messages < self.max_messages && self.bytes < self.max_bytes
    }

    pub fn messages(&self) -> usize {
        self.messages
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(lsn: u64) -> Committed {
        Committed {
            end_lsn: Lsn(lsn),
            commit_time_micros: 0,
        }
    }

    #[test]
    fn confirms_only_up_to_the_oldest_unacknowledged_transaction() {
        let mut w = Window::new(100, 1 << 20);
        let a = w.begin();
        w.sent(a, 10);
        w.sent(a, 10);
        w.commit(a, committed(100));
        let b = w.begin();
        w.sent(b, 10);
        w.commit(b, committed(200));
        // b is fully acknowledged, but a is not: nothing may be confirmed.
        w.acked(b, 10);
        assert_eq!(w.confirmable(), None);
        w.acked(a, 10);
        assert_eq!(w.confirmable(), None);
        w.acked(a, 10);
        assert_eq!(w.confirmable(), Some(committed(200)));
        assert!(w.is_idle());
        assert_eq!((w.messages(), w.bytes()), (0, 0));
    }

    #[test]
    fn an_open_transaction_blocks_confirmation_even_when_acked() {
        let mut w = Window::new(100, 1 << 20);
        let a = w.begin();
        w.sent(a, 1);
        w.acked(a, 1);
        assert_eq!(w.confirmable(), None);
        assert!(!w.is_idle());
        w.commit(a, committed(5));
        assert_eq!(w.confirmable(), Some(committed(5)));
    }

    #[test]
    fn empty_transactions_confirm_at_once_and_the_window_fills() {
        let mut w = Window::new(2, 1 << 20);
        let hb = w.begin();
        w.commit(hb, committed(7));
        assert_eq!(w.confirmable(), Some(committed(7)));
        let t = w.begin();
        w.sent(t, 1);
        assert!(w.has_room());
        w.sent(t, 1);
        assert!(!w.has_room());
        w.acked(t, 1);
        assert!(w.has_room());
    }

    proptest::proptest! {
        /// Whatever order acks arrive in, a confirmed LSN never covers a transaction that
        /// still has an unacknowledged message, and confirmations only move forward.
        #[test]
        fn never_confirms_past_an_unacked_message(
            sizes in proptest::collection::vec(0usize..4, 1..12),
            order in proptest::collection::vec(proptest::num::usize::ANY, 0..64),
        ) {
            let mut w = Window::new(usize::MAX, usize::MAX);
            let mut outstanding: Vec<(u64, u64)> = Vec::new(); // (seq, end_lsn)
            for (i, &n) in sizes.iter().enumerate() {
                let seq = w.begin();
                for _ in 0..n { w.sent(seq, 1); outstanding.push((seq, (i as u64 + 1) * 10)); }
                w.commit(seq, committed((i as u64 + 1) * 10));
            }
            let mut last = 0;
            for pick in order {
                if outstanding.is_empty() { break; }
                let (seq, _) = outstanding.remove(pick % outstanding.len());
                w.acked(seq, 1);
                if let Some(c) = w.confirmable() {
                    let oldest_unacked = outstanding.iter().map(|o| o.1).min().unwrap_or(u64::MAX);
                    proptest::prop_assert!(c.end_lsn.0 < oldest_unacked);
                    proptest::prop_assert!(c.end_lsn.0 >= last);
                    last = c.end_lsn.0;
                }
            }
        }
    }
}
