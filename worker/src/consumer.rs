//! The Kafka side of the worker loop: subscribing a member of the workers' group, its lag
//! statistics, and the group watch's reports (see `group_watch`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientContext, Statistics};
use tokio::sync::mpsc;

use crate::config::{WorkerConfig, WorkerError};
use crate::group_watch::{Probe, Stalls};
use crate::lanes::Pauses;
use crate::metrics::{RebalanceKind, WorkerMetrics};
use railhook_common::Word;

/// Subscribes a new member of the workers' group.
pub(crate) fn subscribe(
    config: &WorkerConfig,
    metrics: &WorkerMetrics,
    pauses: Arc<Pauses>,
) -> Result<StreamConsumer<LagContext>, WorkerError> {
    let lag = LagContext {
        lag: metrics.consumer_lag.clone(),
        rebalances: metrics.rebalances.clone(),
        pauses,
        deliveries_topic: config.deliveries_topic.clone(),
        retries_topic: config.retries_topic.clone(),
    };
    let consumer: StreamConsumer<LagContext> = config
        .kafka
        .client_config()
        .set("statistics.interval.ms", "5000")
        .set("group.id", &config.group)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "fetch.wait.max.ms",
            config.fetch_wait.as_millis().to_string(),
        )
        .set("auto.commit.interval.ms", "500")
        // A worker killed with SIGKILL never says goodbye: the group notices through its
        // missing heartbeats after the session timeout, and waits at most the rebalance
        // timeout (max.poll.interval.ms) for members to rejoin. librdkafka's defaults (45 s,
        // 300 s) left a partition unread for minutes after a worker was killed
        // (docs/RELIABILITY.md); these bound it to seconds. The loop never waits on an
        // Attempt (it claims only what it can start, lanes.rs), so 60 s between polls is
        // only ever exceeded by a wedged process.
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "2000")
        .set(
            "max.poll.interval.ms",
            config.max_poll_interval.as_millis().to_string(),
        )
        // librdkafka prefetches up to 100,000 messages per partition by default. Under a
        // backlog, a RetryHint fetched later then waits behind every Announcement fetched
        // before it, and a partition the worker holds looks unread to the group watch for
        // as long as that local queue takes to drain (seen: over 30 s at 10,000 Events).
        // A short prefetch per partition keeps the partitions interleaved; one claim batch
        // is 500 hints, so 1,000 per partition still keeps the worker fed.
        .set("queued.min.messages", "1000")
        // librdkafka compares a partition's queue with queued.min.messages, but every
        // partition's queue is forwarded into the one consumer queue, so it is the total
        // that counts: a backlog of RetryHints stops the fetching of fresh Announcements
        // too, for fetch.queue.backoff.ms (1 s by default). Seen: fresh Deliveries arriving
        // in bursts a second apart during a storm of retries. The retry lane pauses its
        // topic (which drops what was prefetched of it), so the queue empties within
        // milliseconds; a short backoff lets the fresh partitions fetch again at once.
        .set("fetch.queue.backoff.ms", "20")
        .create_with_context(lag)?;
    consumer.subscribe(&[&config.deliveries_topic, &config.retries_topic])?;
    Ok(consumer)
}

/// What the group watch saw at `at`.
pub(crate) struct Seen {
    at: Instant,
    /// Partitions that stood still with messages waiting for the stall window.
    stalled: Vec<(String, i32)>,
    /// Partitions with messages past the group's committed offset: a dozing worker that
    /// holds one of them missed a doorbell (runtime.rs).
    pub(crate) waiting: Vec<(String, i32)>,
}

/// Aborts the task when dropped, so the watch ends with `run`.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads the group's positions about every `every` (off the async threads: the probe
/// blocks) and reports the partitions that stalled (when `after` is set) and those with
/// messages waiting.
pub(crate) async fn watch_group(
    probe: Probe,
    after: Option<Duration>,
    every: Duration,
    tx: mpsc::Sender<Seen>,
) {
    let probe = Arc::new(probe);
    let new_stalls = || after.map(Stalls::new);
    let mut stalls = new_stalls();
    loop {
        // Jittered, so the workers of a group do not look (and rejoin) in step.
        let jitter = rand::random_range(0.75..1.25);
        tokio::time::sleep(every.mul_f64(jitter)).await;
        let p = probe.clone();
        let read = tokio::task::spawn_blocking(move || p.positions(Duration::from_secs(5))).await;
        let positions = match read {
            Ok(Ok(positions)) => positions,
            Ok(Err(e)) => {
                // The broker is away: what happened meanwhile is unknown, so every clock
                // starts again (a restarted broker is not a stall).
                tracing::debug!(error = %e, "group positions not read");
                stalls = new_stalls();
                continue;
            }
            Err(_) => return,
        };
        let stalled = match stalls.as_mut() {
            Some(s) => s.observe(Instant::now(), &positions),
            None => Vec::new(),
        };
        let waiting: Vec<(String, i32)> = positions
            .into_iter()
            .filter(|p| p.committed < p.end)
            .map(|p| (p.topic, p.partition))
            .collect();
        if !stalled.is_empty() || !waiting.is_empty() {
            // A full channel means the last report is still unread: this one can wait.
            let _ = tx.try_send(Seen {
                at: Instant::now(),
                stalled,
                waiting,
            });
        }
    }
}

/// The (topic, partition) pairs this member holds, if `report` is fresh enough to act on: a
/// report from before a long pause of the loop (Postgres away) is stale.
fn held_if_fresh(
    consumer: &StreamConsumer<LagContext>,
    report: &Seen,
) -> Option<Vec<(String, i32)>> {
    if report.at.elapsed() > Duration::from_secs(5) {
        return None;
    }
    let mine = consumer.assignment().ok()?;
    Some(
        mine.elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect(),
    )
}

/// Whether a partition this member holds has messages waiting in `report` (a dozing worker
/// then missed a doorbell, doze.rs).
pub(crate) fn waiting_on(consumer: &StreamConsumer<LagContext>, report: &Seen) -> bool {
    !report.waiting.is_empty()
        && held_if_fresh(consumer, report)
            .is_some_and(|held| report.waiting.iter().any(|w| held.contains(w)))
}

/// Whether `report` names a stalled partition this member does not hold: then some other
/// member holds it and does not read it, or nobody does, and a rejoin makes the coordinator
/// assign every partition again. A stall of this member's own partitions is its own
/// slowness (a full in-flight bound, Postgres away), which a rejoin would not cure.
pub(crate) fn orphaned(consumer: &StreamConsumer<LagContext>, report: &Seen) -> bool {
    if report.stalled.is_empty() {
        return false;
    }
    let Some(held) = held_if_fresh(consumer, report) else {
        return false;
    };
    let orphans: Vec<String> = report
        .stalled
        .iter()
        .filter(|s| !held.contains(s))
        .map(|(t, p)| format!("{t}/{p}"))
        .collect();
    if orphans.is_empty() {
        return false;
    }
    tracing::warn!(
        partitions = %orphans.join(","),
        "partitions this worker does not hold have not been read; rejoining the consumer group so they are assigned again"
    );
    true
}

/// Reads the consumer's lag per partition out of librdkafka's periodic statistics into
/// `railhook_worker_consumer_lag`. Each worker reports the partitions assigned to it; the
/// group's lag is the sum over workers.
pub(crate) struct LagContext {
    lag: prometheus::IntGaugeVec,
    rebalances: prometheus::IntCounterVec,
    pauses: Arc<Pauses>,
    deliveries_topic: String,
    retries_topic: String,
}

impl ClientContext for LagContext {
    fn stats(&self, statistics: Statistics) {
        // Only the partitions this worker holds now: after a rebalance, a partition it lost
        // would otherwise keep its last value forever and hide who holds the lag.
        self.lag.reset();
        for (name, topic) in statistics.topics {
            let label = if name == self.deliveries_topic {
                "deliveries"
            } else if name == self.retries_topic {
                "retries"
            } else {
                continue;
            };
            for (partition, p) in topic.partitions {
                // -1 is librdkafka's "unassigned" pseudo-partition; a lag of -1 is unknown.
                // Only partitions this consumer is fetching: librdkafka keeps reporting one
                // it lost in a rebalance, with its last lag, as fetch state "none".
                if partition < 0 || !p.desired || p.fetch_state == "none" {
                    continue;
                }
                let gauge = self
                    .lag
                    .with_label_values(&[label, partition.to_string().as_str()]);
                gauge.set(p.consumer_lag.max(0));
            }
        }
    }
}

impl ConsumerContext for LagContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let kind = match rebalance {
            Rebalance::Assign(assigned) => {
                // A lane paused before the rebalance stays paused on what is assigned now.
                let mut paused = TopicPartitionList::new();
                for e in assigned.elements() {
                    if self.pauses.is_paused(e.topic()) {
                        paused.add_partition(e.topic(), e.partition());
                    }
                }
                if paused.count() > 0
                    && let Err(e) = consumer.pause(&paused)
                {
                    tracing::warn!(error = %e, "assigned partitions of a paused lane not paused");
                }
                if assigned.count() > 0 {
                    self.pauses.assigned.notify_one();
                }
                RebalanceKind::Assign
            }
            Rebalance::Revoke(_) => RebalanceKind::Revoke,
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "consumer group rebalance failed");
                RebalanceKind::Error
            }
        };
        tracing::info!(kind = kind.as_str(), "consumer group rebalance");
        self.rebalances.with_label_values(&[kind.as_str()]).inc();
    }
}
