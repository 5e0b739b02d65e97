//! The consumer's two lanes: fresh Announcements and RetryHints. Each lane queues the hints
//! it has read, claims only as many as it has free in-flight permits (so a Claim starts its
//! request at once, and never spends its processing window in a queue), and pauses its
//! topic while too many hints wait, so the consumer keeps polling (and keeps its place in
//! the group) however slow the endpoints are.
//!
//! ```text
//!  stream ──▶ fresh lane: [hint hint hint …] ──(free permit)──▶ claim_batch ─▶ Attempt task
//!        └──▶ retry lane: [hint hint …]      ──(free permit)──▶ swap_batch  ─▶ Attempt task
//!   waiting ≥ PAUSE_AT: pause the lane's topic (polling goes on; librdkafka drops what it
//!   prefetched and fetches it again after the resume, from the position the loop read to)
//! ```
//!
//! Each lane has its own permits, so a storm of due retries cannot take the permits fresh
//! Deliveries need (review #19 item 2): fresh Attempts get `max_in_flight`, retries half as
//! many more.
//!
//! Offsets: a hint's offset is stored only after its Claim's statement committed or matched
//! nothing, and a lane takes hints from its front, so per partition the stored offset only
//! ever passes hints that were claimed (a lane holds one topic, and a partition's hints
//! arrive in order). The fresh lane also queues express hints from the doorbell: they are
//! claimed like the rest but have no offset to store; their Kafka copies, when read, are
//! `Answered` and only move the offset (express.rs).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use railhook_common::announcement::{Announcement, AnnouncementError};
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::express::{Admit, Book, State};
use crate::metrics::{ExpressOutcome, WorkerMetrics};
use railhook_common::Word;
use railhook_common::doorbell::Express;
use railhook_common::retry_hint::RetryHint;
use railhook_common::vocabulary::Lane as LaneName;

/// Most hints claimed in one statement.
pub(crate) const CLAIM_BATCH: usize = 256;
/// A lane with this many hints waiting pauses its topic.
const PAUSE_AT: usize = CLAIM_BATCH;
/// A paused lane resumes when fewer than this wait: the next fetch arrives before the
/// permits run dry.
const RESUME_BELOW: usize = CLAIM_BATCH / 2;

/// What a hint asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// An Announcement: claim this Delivery.
    Claim(String),
    /// A RetryHint: swap the scheduler's token for ours.
    Swap(String, Uuid),
    /// Undecodable: skipped (its offset is stored in turn).
    Bad,
    /// Its Delivery was claimed from an express hint already (express.rs): only the
    /// offset is stored, in turn.
    Answered,
}

impl Ask {
    /// Whether the hint needs a Claim (and a permit for it).
    fn claims(&self) -> bool {
        !matches!(self, Ask::Bad | Ask::Answered)
    }
}

/// One hint waiting in a lane.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    pub partition: i32,
    pub offset: i64,
    pub ask: Ask,
    /// From the doorbell, not from Kafka: it has no offset to store.
    pub express: bool,
    /// The Outbox row of the Announcement (an express hint's, or a Kafka copy's).
    pub outbox_id: Option<i64>,
}

/// Which lanes are paused, shared with the consumer's context so a rebalance keeps a paused
/// lane paused on the partitions it assigns. A rebalance that assigns partitions also wakes
/// a dozing worker (`assigned`): the partitions may come from a member that died with
/// hints unread, and no doorbell rings for those.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    deliveries_topic: String,
    retries_topic: String,
    fresh: AtomicBool,
    retry: AtomicBool,
    /// Notified by every rebalance that assigns partitions.
    pub(crate) assigned: Notify,
}

impl Pauses {
    pub(crate) fn new(deliveries_topic: &str, retries_topic: &str) -> Self {
        Self {
            deliveries_topic: deliveries_topic.to_owned(),
            retries_topic: retries_topic.to_owned(),
            ..Self::default()
        }
    }

    pub(crate) fn is_paused(&self, topic: &str) -> bool {
        if topic == self.deliveries_topic {
            self.fresh.load(Ordering::Relaxed)
        } else if topic == self.retries_topic {
            self.retry.load(Ordering::Relaxed)
        } else {
            false
        }
    }
}

/// The hints a lane took, with a permit for each that needs one.
pub(crate) struct Taken {
    pub asks: Vec<Ask>,
    pub permits: Vec<OwnedSemaphorePermit>,
    /// (partition, offset) of every Kafka hint taken, in order: stored once the Claim
    /// committed.
    pub offsets: Vec<(i32, i64)>,
    /// The Announcements (Delivery, Outbox row) the express hints taken name: answered once
    /// the Claim committed.
    pub express: Vec<(String, Option<i64>)>,
}

pub(crate) struct Lane {
    pub name: LaneName,
    pub topic: String,
    pub permits: Arc<Semaphore>,
    /// All the lane's permits: holding them all means none of its Attempts is running.
    pub capacity: u32,
    waiting: VecDeque<Waiting>,
    /// The express hints queued or answered, whose Kafka copies are still to come.
    book: Book,
    /// Paused because too many hints wait (`throttle`).
    backlog: bool,
    /// Paused because the worker dozes (`doze`, runtime.rs).
    dozing: bool,
    /// What the consumer was last told: paused if either of the above.
    paused: bool,
    pauses: Arc<Pauses>,
}

impl Lane {
    pub(crate) fn new(name: LaneName, topic: &str, permits: usize, pauses: Arc<Pauses>) -> Self {
        Self {
            name,
            topic: topic.to_owned(),
            permits: Arc::new(Semaphore::new(permits)),
            capacity: u32::try_from(permits).unwrap_or(u32::MAX),
            waiting: VecDeque::new(),
            book: Book::default(),
            backlog: false,
            dozing: false,
            paused: false,
            pauses,
        }
    }

    pub(crate) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Queues a hint read from this lane's topic.
    pub(crate) fn push(&mut self, m: &BorrowedMessage<'_>, metrics: &WorkerMetrics) {
        self.push_read(
            m.partition(),
            m.offset(),
            m.payload().unwrap_or_default(),
            metrics,
        );
    }

    /// Queues the hint read from Kafka at (`partition`, `offset`).
    fn push_read(&mut self, partition: i32, offset: i64, payload: &[u8], metrics: &WorkerMetrics) {
        let (mut ask, outbox_id) = decode_with_outbox(self.name, payload);
        if ask == Ask::Bad {
            metrics.bad_hints.inc();
        }
        let named = match &ask {
            Ask::Claim(id) => Some(id.as_str()),
            _ => None,
        };
        match self.book.kafka_copy(partition, offset, named, outbox_id) {
            Some(State::Answered) => ask = Ask::Answered,
            // Not claimed yet: this copy takes the express hint's place.
            Some(State::Waiting) => {
                let id = named.map(str::to_owned);
                self.waiting.retain(|w| {
                    // Every express hint of this Delivery still queued: the copy claims.
                    !(w.express && matches!((&w.ask, &id), (Ask::Claim(a), Some(b)) if a == b))
                });
                metrics
                    .express_hints
                    .with_label_values(&[ExpressOutcome::Superseded.as_str()])
                    .inc();
            }
            None => {}
        }
        self.waiting.push_back(Waiting {
            partition,
            offset,
            ask,
            express: false,
            outbox_id,
        });
    }

    /// Queues the express hints of partitions this worker holds (`held`) that Kafka has not
    /// delivered yet (express.rs). None while a backlog keeps the lane paused: those hints
    /// would only wait behind it, and their Kafka copies come soon enough.
    pub(crate) fn push_express(
        &mut self,
        hints: Vec<Express>,
        held: &[i32],
        metrics: &WorkerMetrics,
    ) {
        self.book.keep_only(held);
        let count = |outcome: ExpressOutcome, n: usize| {
            metrics
                .express_hints
                .with_label_values(&[outcome.as_str()])
                .inc_by(n as u64)
        };
        if self.backlog {
            count(ExpressOutcome::Backlog, hints.len());
            return;
        }
        for h in hints {
            if !held.contains(&h.partition) {
                count(ExpressOutcome::NotHeld, 1);
                continue;
            }
            match self
                .book
                .admit(h.partition, h.known_offset(), &h.delivery_id, h.outbox_id)
            {
                Admit::Queued => {
                    count(ExpressOutcome::Queued, 1);
                    self.waiting.push_back(Waiting {
                        partition: h.partition,
                        offset: h.offset,
                        ask: Ask::Claim(h.delivery_id),
                        express: true,
                        outbox_id: h.outbox_id,
                    });
                }
                Admit::KafkaFirst => count(ExpressOutcome::KafkaFirst, 1),
                Admit::Full => count(ExpressOutcome::Full, 1),
            }
        }
    }

    /// The express hints of `taken` were claimed (or matched nothing): their Kafka copies
    /// only move the offset.
    pub(crate) fn answered(&mut self, express: &[(String, Option<i64>)]) {
        self.book.answered(express);
    }

    /// Takes hints from the front while there are permits for them, at most a claim batch.
    pub(crate) fn take(&mut self) -> Option<Taken> {
        let mut taken = Taken {
            asks: Vec::new(),
            permits: Vec::new(),
            offsets: Vec::new(),
            express: Vec::new(),
        };
        while taken.offsets.len() + taken.express.len() < CLAIM_BATCH {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if front.ask.claims() {
                let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                    break;
                };
                taken.permits.push(permit);
            }
            let w = self.waiting.pop_front().expect("front exists");
            if w.express {
                if let Ask::Claim(id) = &w.ask {
                    taken.express.push((id.clone(), w.outbox_id));
                }
            } else {
                taken.offsets.push((w.partition, w.offset));
            }
            if w.ask.claims() {
                taken.asks.push(w.ask);
            }
        }
        (!taken.offsets.is_empty() || !taken.express.is_empty()).then_some(taken)
    }

    /// Pauses the lane's topic while too many hints wait, resumes it when few do. Polling
    /// goes on either way: a paused partition simply returns nothing.
    pub(crate) fn throttle<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
        &mut self,
        consumer: &C,
        metrics: &WorkerMetrics,
    ) {
        metrics
            .hints_waiting
            .with_label_values(&[self.name.as_str()])
            .set(self.waiting.len() as i64);
        if !self.backlog && self.waiting.len() >= PAUSE_AT {
            self.backlog = true;
        } else if self.backlog && self.waiting.len() < RESUME_BELOW {
            self.backlog = false;
        }
        self.apply(consumer);
    }

    /// Pauses the lane's topic while the worker dozes, resumes it (unless a backlog keeps
    /// it paused) when it wakes.
    pub(crate) fn doze<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
        &mut self,
        consumer: &C,
        dozing: bool,
    ) {
        self.dozing = dozing;
        self.apply(consumer);
    }

    /// Tells the consumer when the lane's pause changed: paused while a backlog waits or
    /// the worker dozes.
    fn apply<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(&mut self, consumer: &C) {
        let pause = self.backlog || self.dozing;
        if pause == self.paused {
            return;
        }
        self.paused = pause;
        let flag = if self.name == LaneName::Fresh {
            &self.pauses.fresh
        } else {
            &self.pauses.retry
        };
        // Set before the call, so a rebalance in between pauses what it assigns.
        flag.store(pause, Ordering::Relaxed);
        let mut mine = TopicPartitionList::new();
        for partition in held_partitions(consumer, &self.topic) {
            mine.add_partition(&self.topic, partition);
        }
        let result = if pause {
            consumer.pause(&mine)
        } else {
            consumer.resume(&mine)
        };
        tracing::debug!(
            lane = self.name.as_str(),
            pause,
            backlog = self.backlog,
            dozing = self.dozing,
            waiting = self.waiting.len(),
            "lane paused or resumed"
        );
        if let Err(e) = result {
            tracing::warn!(error = %e, lane = self.name.as_str(), pause, "lane's partitions not paused or resumed");
        }
    }
}

/// The partitions of `topic` this member holds now.
pub(crate) fn held_partitions<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    topic: &str,
) -> Vec<i32> {
    consumer
        .assignment()
        .map(|a| {
            a.elements()
                .iter()
                .filter(|e| e.topic() == topic)
                .map(|e| e.partition())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a hint of either lane. A newer release's Announcement (a rolling deploy) still
/// names its Delivery, and the Claim reads the rest from the row, so it is claimed like any
/// other rather than dropped (common/src/announcement.rs).
#[cfg(test)]
fn decode(lane: LaneName, payload: &[u8]) -> Ask {
    decode_with_outbox(lane, payload).0
}

/// What a hint asks, and for an Announcement the Outbox row it was written from (what
/// tells two Announcements of one Delivery apart, express.rs).
fn decode_with_outbox(lane: LaneName, payload: &[u8]) -> (Ask, Option<i64>) {
    if lane == LaneName::Retry {
        let ask = match RetryHint::decode(payload) {
            Some(h) => Ask::Swap(h.delivery_id.into_string(), h.token),
            None => Ask::Bad,
        };
        return (ask, None);
    }
    let ask = match Announcement::decode(payload) {
        Ok(a) => return (Ask::Claim(a.delivery_id.into_string()), Some(a.outbox_id)),
        // A newer version, or a field of this one with a value this release does not know
        // (an Outbox reason added later): the Delivery it names is still claimed.
        Err(e) => match Announcement::delivery_of_any_version(payload) {
            Ok((v, id)) => {
                let why = matches!(e, AnnouncementError::UnknownVersion(_))
                    .then_some("a newer version")
                    .unwrap_or("a field this release does not know");
                tracing::info!(version = v, delivery_id = %id, why, "announcement not fully understood; claiming the delivery it names");
                Ask::Claim(id.into_string())
            }
            Err(_) => Ask::Bad,
        },
    };
    (ask, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use railhook_common::ids::{DeliveryId, EndpointId};

    fn lane(permits: usize) -> Lane {
        Lane::new(
            LaneName::Fresh,
            "t",
            permits,
            Arc::new(Pauses::new("t", "r")),
        )
    }

    fn waiting(offset: i64, ask: Ask) -> Waiting {
        Waiting {
            partition: 0,
            offset,
            ask,
            express: false,
            outbox_id: None,
        }
    }

    #[test]
    fn takes_only_what_it_has_permits_for() {
        let mut l = lane(2);
        for i in 0..5 {
            l.waiting.push_back(waiting(i, Ask::Claim(format!("d{i}"))));
        }
        let t = l.take().expect("two");
        assert_eq!(t.asks.len(), 2);
        assert_eq!(t.offsets, vec![(0, 0), (0, 1)]);
        assert!(l.take().is_none(), "no permit left");
        drop(t);
        let t = l.take().expect("permits back");
        assert_eq!(t.offsets, vec![(0, 2), (0, 3)]);
    }

    #[test]
    fn a_bad_hint_needs_no_permit_and_keeps_its_place() {
        let mut l = lane(1);
        l.waiting.push_back(waiting(0, Ask::Bad));
        l.waiting.push_back(waiting(1, Ask::Claim("d".into())));
        l.waiting.push_back(waiting(2, Ask::Bad));
        l.waiting.push_back(waiting(3, Ask::Claim("e".into())));
        let t = l.take().expect("taken");
        assert_eq!(t.asks, vec![Ask::Claim("d".into())]);
        assert_eq!(t.offsets, vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!(t.permits.len(), 1);
    }

    fn announcement(id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "v": 1, "delivery_id": id, "endpoint_id": "ep_1", "project_id": "prj_1",
            "reason": "CREATED", "outbox_id": 1, "commit_lsn": "0/1"
        }))
        .expect("json")
    }

    fn express(partition: i32, offset: i64, id: &str) -> Express {
        Express {
            partition,
            offset,
            delivery_id: id.into(),
            outbox_id: None,
        }
    }

    #[test]
    fn an_express_hint_is_claimed_and_its_kafka_copy_only_moves_the_offset() {
        let metrics = WorkerMetrics::new();
        let mut l = lane(4);
        l.push_express(vec![express(0, 7, "dlv_a")], &[0], &metrics);
        let t = l.take().expect("the express hint");
        assert_eq!(t.asks, vec![Ask::Claim("dlv_a".into())]);
        assert!(t.offsets.is_empty(), "an express hint stores no offset");
        assert_eq!(t.express, vec![("dlv_a".to_owned(), None)]);
        l.answered(&t.express);
        drop(t);
        // The Kafka copy: no Claim, no permit, just its offset.
        l.push_read(0, 7, &announcement("dlv_a"), &metrics);
        let t = l.take().expect("the copy");
        assert!(t.asks.is_empty());
        assert!(t.permits.is_empty());
        assert_eq!(t.offsets, vec![(0, 7)]);
        // Kafka has read past it: the same express hint again is dropped.
        l.push_express(vec![express(0, 7, "dlv_a")], &[0], &metrics);
        assert!(l.take().is_none());
    }

    /// Issue #54: a hint sent when the relay read the row (no offset yet) is claimed, and
    /// the Kafka copy naming its Delivery, wherever it lands, only moves the offset.
    #[test]
    fn a_hint_sent_at_read_time_is_claimed_and_its_copy_found_by_delivery() {
        let metrics = WorkerMetrics::new();
        let mut l = lane(4);
        l.push_read(0, 40, &announcement("dlv_old"), &metrics);
        let _ = l.take();
        let mut early = express(0, Express::AT_READ, "dlv_e");
        early.outbox_id = Some(1); // the Outbox row `announcement` names
        l.push_express(vec![early], &[0], &metrics);
        let t = l.take().expect("the early hint, not late by offset");
        assert_eq!(t.asks, vec![Ask::Claim("dlv_e".into())]);
        l.answered(&t.express);
        drop(t);
        l.push_read(0, 41, &announcement("dlv_e"), &metrics);
        let t = l.take().expect("the copy");
        assert!(t.asks.is_empty(), "no second Claim");
        assert_eq!(t.offsets, vec![(0, 41)]);
    }

    #[test]
    fn a_kafka_copy_read_before_its_express_claim_replaces_it() {
        let metrics = WorkerMetrics::new();
        let mut l = lane(0);
        l.push_express(vec![express(0, 3, "dlv_b")], &[0], &metrics);
        assert!(l.take().is_none(), "no permit: it waits");
        l.push_read(0, 3, &announcement("dlv_b"), &metrics);
        assert_eq!(l.waiting.len(), 1, "the copy took the express hint's place");
        assert!(!l.waiting[0].express);
        assert_eq!(l.waiting[0].ask, Ask::Claim("dlv_b".into()));
    }

    #[test]
    fn express_hints_of_other_partitions_or_behind_a_backlog_are_left_to_kafka() {
        let metrics = WorkerMetrics::new();
        let mut l = lane(4);
        l.push_express(vec![express(5, 1, "dlv_c")], &[0, 1], &metrics);
        assert!(l.take().is_none(), "partition 5 is another worker's");
        l.backlog = true;
        l.push_express(vec![express(0, 1, "dlv_d")], &[0], &metrics);
        assert!(l.waiting.is_empty(), "a lane with a backlog takes none");
    }

    #[test]
    fn decodes_both_kinds_and_flags_garbage() {
        let token = Uuid::new_v4();
        let hint = RetryHint {
            delivery_id: DeliveryId::from_trusted("dlv_1".into()),
            endpoint_id: EndpointId::from_trusted("ep_1".into()),
            token,
        };
        assert_eq!(
            decode(LaneName::Retry, &hint.encode()),
            Ask::Swap("dlv_1".into(), token)
        );
        assert_eq!(decode(LaneName::Retry, b"{}"), Ask::Bad);
        assert_eq!(decode(LaneName::Fresh, b"nonsense"), Ask::Bad);
    }
}
