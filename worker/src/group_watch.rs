//! A liveness guard for the workers' consumer group: partitions that have messages waiting
//! but whose committed offset does not move, and that this worker does not hold, make it
//! leave and rejoin the group, which forces the coordinator to assign every partition again.
//!
//! Why it exists: tansu 0.6.0, the broker we ship with, drops a member that missed its
//! heartbeats but keeps the group's old assignment, so the dead member's partitions stay
//! assigned to nobody until the group's membership changes again (docs/RELIABILITY.md has the
//! trace). Nothing is lost — the Delivery rows are in Postgres and the sweeps would reach
//! them after the stranded window — but an hour's stall is not delivery. The guard looks
//! only at what any Kafka broker exposes (committed offsets and high watermarks), so it is
//! harmless with a broker that rebalances correctly: there, it never fires.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use railhook_common::kafka::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

/// Where the group stands on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    /// The group's committed offset, or the partition's low watermark when nothing was
    /// committed yet (the group starts at the earliest message).
    pub committed: i64,
    /// The high watermark: the offset the next message will get.
    pub end: i64,
}

/// Remembers since when each partition's committed offset has stood still while messages
/// wait behind it. Pure: fed positions and the time, it answers which partitions stalled.
#[derive(Debug)]
pub struct Stalls {
    after: Duration,
    /// (topic, partition) → (committed offset, first seen at that offset).
    still: HashMap<(String, i32), (i64, Instant)>,
}

impl Stalls {
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            still: HashMap::new(),
        }
    }

    /// The partitions that have had messages waiting and the same committed offset for at
    /// least `after`, as of `now`.
    pub fn observe(&mut self, now: Instant, positions: &[Position]) -> Vec<(String, i32)> {
        let mut stalled = Vec::new();
        let mut next = HashMap::with_capacity(positions.len());
        for p in positions {
            if p.committed >= p.end {
                // Caught up: nothing waits, so standing still is fine.
                continue;
            }
            let key = (p.topic.clone(), p.partition);
            let since = match self.still.get(&key) {
                Some(&(committed, since)) if committed == p.committed => since,
                _ => now,
            };
            if now.duration_since(since) >= self.after {
                stalled.push(key.clone());
            }
            next.insert(key, (p.committed, since));
        }
        self.still = next;
        stalled
    }
}

/// Reads the group's positions without joining it: a consumer with the group's id that
/// never subscribes, so it neither takes partitions nor commits.
pub struct Probe {
    consumer: BaseConsumer,
    topics: Vec<String>,
}

impl Probe {
    pub fn new(kafka: &KafkaConnection, group: &str, topics: &[&str]) -> KafkaResult<Self> {
        let consumer = kafka
            .client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        Ok(Self {
            consumer,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        })
    }

    /// Every partition's committed offset and high watermark. Blocking: call it off the
    /// async threads.
    pub fn positions(&self, timeout: Duration) -> KafkaResult<Vec<Position>> {
        let mut wanted = TopicPartitionList::new();
        for topic in &self.topics {
            let metadata = self.consumer.fetch_metadata(Some(topic), timeout)?;
            for t in metadata.topics() {
                for p in t.partitions() {
                    wanted.add_partition(topic, p.id());
                }
            }
        }
        let committed = self.consumer.committed_offsets(wanted, timeout)?;
        let mut positions = Vec::new();
        for e in committed.elements() {
            let (low, end) = self
                .consumer
                .fetch_watermarks(e.topic(), e.partition(), timeout)?;
            let committed = match e.offset() {
                Offset::Offset(n) => n,
                _ => low,
            };
            positions.push(Position {
                topic: e.topic().to_owned(),
                partition: e.partition(),
                committed,
                end,
            });
        }
        Ok(positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, committed: i64, end: i64) -> Position {
        Position {
            topic: "d".to_owned(),
            partition,
            committed,
            end,
        }
    }

    #[test]
    fn a_partition_stalls_only_after_standing_still_with_messages_waiting() {
        let t0 = Instant::now();
        let after = Duration::from_secs(30);
        let mut s = Stalls::new(after);
        assert!(s.observe(t0, &[at(0, 5, 10), at(1, 7, 7)]).is_empty());
        // 29 s on: not yet.
        let t = t0 + Duration::from_secs(29);
        assert!(s.observe(t, &[at(0, 5, 12), at(1, 7, 7)]).is_empty());
        // 30 s on: partition 0 has not moved while messages wait; partition 1 is caught up.
        let t = t0 + after;
        assert_eq!(
            s.observe(t, &[at(0, 5, 12), at(1, 7, 7)]),
            vec![("d".to_owned(), 0)]
        );
    }

    #[test]
    fn progress_or_catching_up_resets_the_clock() {
        let t0 = Instant::now();
        let mut s = Stalls::new(Duration::from_secs(30));
        s.observe(t0, &[at(0, 5, 10)]);
        // It moved at 20 s: the 30 s count starts again.
        s.observe(t0 + Duration::from_secs(20), &[at(0, 6, 10)]);
        assert!(
            s.observe(t0 + Duration::from_secs(40), &[at(0, 6, 10)])
                .is_empty()
        );
        assert_eq!(
            s.observe(t0 + Duration::from_secs(50), &[at(0, 6, 10)]),
            vec![("d".to_owned(), 0)]
        );
        // Caught up, then behind again at the same offset: a fresh start.
        s.observe(t0 + Duration::from_secs(51), &[at(0, 6, 6)]);
        assert!(
            s.observe(t0 + Duration::from_secs(60), &[at(0, 6, 9)])
                .is_empty()
        );
    }

    #[test]
    fn partitions_that_disappear_are_forgotten() {
        let t0 = Instant::now();
        let mut s = Stalls::new(Duration::from_secs(1));
        s.observe(t0, &[at(0, 1, 2), at(1, 1, 2)]);
        s.observe(t0 + Duration::from_secs(2), &[at(0, 1, 2)]);
        assert_eq!(s.still.len(), 1);
    }
}
