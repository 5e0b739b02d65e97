//! Dozing: an idle worker pauses its partitions, so the broker stops answering its fetches,
//! and wakes when the doorbell rings (common/src/doorbell.rs).
//!
//! ```text
//!  awake ── nothing read, no ring, no hint waiting for doze_after ──▶ dozing (both lanes paused)
//!    ▲                                                                  │
//!    └── ring │ rebalance assigned partitions │ group watch: a partition it holds has
//!        messages waiting (a missed ring) ◀─────────────────────────────┘
//! ```
//!
//! Why: a consumer that fetches costs the broker CPU for every partition of every fetch,
//! whether anything arrives or not (docs/BENCHMARKS-HISTORY.md, idle cost); paused partitions are
//! not fetched at all. Only the group's heartbeats and the group watch's probe remain.
//!
//! Invariants, and why they hold:
//! - A worker dozes only while its LISTEN connection is up, so a ring is heard; a listener
//!   that connects or drops counts as a ring (it may have hidden one).
//! - Every hint Kafka acknowledged is followed by a NOTIFY within the ringer's gap, and a
//!   ring keeps the worker awake for `doze_after` (at least 1 s, ten times the gap), so a
//!   hint published just before the worker dozed is read before it can doze.
//! - Dozing never loses a hint, only delays one: the offsets are untouched, and a paused
//!   partition is read from where it stopped once resumed. The group watch's probe bounds
//!   the delay of a missed ring to its interval (`WATCH_WHILE_DOZING`).

use std::time::Duration;

use railhook_common::doorbell::Hearing;
use rdkafka::consumer::{Consumer, ConsumerContext};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lanes::Lane;
use crate::metrics::{WakeReason, WorkerMetrics};
use railhook_common::Word;

/// How often the group watch looks at the positions when dozing is on: the longest a
/// missed ring delays a hint.
pub(crate) const WATCH_WHILE_DOZING: Duration = Duration::from_secs(5);

pub(crate) struct Doze {
    /// `None`: never doze (`RAILHOOK_WORKER_DOZE_AFTER_MS=0`).
    after: Option<Duration>,
    /// What the doorbell's listener heard; `None` when dozing is off.
    pub(crate) bell: Option<watch::Receiver<Hearing>>,
    awake_until: Instant,
    dozing: bool,
    /// Woken because hints were found waiting: stay awake until one is read. A broker that
    /// is slow to answer fetches must not send the worker back to sleep before they arrive.
    until_read: bool,
    metrics: WorkerMetrics,
}

impl Doze {
    pub(crate) fn new(
        after: Option<Duration>,
        bell: Option<watch::Receiver<Hearing>>,
        metrics: WorkerMetrics,
    ) -> Self {
        metrics.dozing.set(0);
        Self {
            awake_until: Instant::now() + after.unwrap_or_default(),
            after,
            bell,
            dozing: false,
            until_read: false,
            metrics,
        }
    }

    pub(crate) fn is_dozing(&self) -> bool {
        self.dozing
    }

    /// When the worker may doze next; `None` while dozing, or while a ring could not be
    /// heard.
    pub(crate) fn due(&self) -> Option<Instant> {
        let listening = self.bell.as_ref().is_some_and(|b| b.borrow().listening);
        (!self.dozing && !self.until_read && listening).then_some(self.awake_until)
    }

    /// A hint was read: stay awake for another `doze_after`.
    pub(crate) fn read(&mut self) {
        self.until_read = false;
        self.stir();
    }

    /// Something happened: stay awake for another `doze_after`.
    pub(crate) fn stir(&mut self) {
        if let Some(after) = self.after {
            self.awake_until = Instant::now() + after;
        }
    }

    /// Pauses both lanes, unless a hint waits to be claimed (then stays awake).
    pub(crate) fn sleep<C: Consumer<X>, X: ConsumerContext>(
        &mut self,
        lanes: [&mut Lane; 2],
        consumer: &C,
    ) {
        if self.dozing || self.due().is_none() {
            return;
        }
        if lanes.iter().any(|l| l.has_waiting()) {
            self.stir();
            return;
        }
        for lane in lanes {
            lane.doze(consumer, true);
        }
        self.dozing = true;
        self.metrics.dozing.set(1);
        tracing::debug!("worker dozing");
    }

    /// Resumes both lanes (a lane with a backlog stays paused) and stays awake for
    /// `doze_after`; `reason` says why (`WakeReason`).
    pub(crate) fn wake<C: Consumer<X>, X: ConsumerContext>(
        &mut self,
        lanes: [&mut Lane; 2],
        consumer: &C,
        reason: WakeReason,
    ) {
        self.stir();
        if reason == WakeReason::MissedRing {
            self.until_read = true;
        }
        if !self.dozing {
            return;
        }
        for lane in lanes {
            lane.doze(consumer, false);
        }
        poke_fetchers(consumer);
        self.dozing = false;
        self.metrics.dozing.set(0);
        self.metrics
            .wakes
            .with_label_values(&[reason.as_str()])
            .inc();
        if reason == WakeReason::MissedRing {
            tracing::warn!("a dozing worker found hints waiting that no doorbell announced; woke");
        } else {
            tracing::debug!(reason = reason.as_str(), "worker woke");
        }
    }
}

/// Wakes librdkafka's broker threads after a resume, so the resumed partitions are fetched
/// now rather than at the thread's next timer.
///
/// Why (issue #35, docs/BENCHMARKS-HISTORY.md "Why the resume is slow"): librdkafka handles a resume
/// on its main thread and does not wake the broker thread, which sleeps while every
/// partition is paused. The first fetch after a ring then waited for that thread's next
/// timer: traced at 805 ms after the resume, and the first second after an idle minute had a
/// p50 of 422 ms at 600 Events/s with warm pools (61 ms when never dozing). Any request
/// queued for a broker wakes its thread, which then decides its fetches. A watermark query
/// per assigned partition reaches each partition's leader; it is not waited for (zero
/// time-out: the request is queued and its answer dropped). Two small requests per
/// partition, once per wake, and only after the worker dozed.
fn poke_fetchers<C: Consumer<X>, X: ConsumerContext>(consumer: &C) {
    let Ok(assigned) = consumer.assignment() else {
        return;
    };
    for e in assigned.elements() {
        let _ = consumer.fetch_watermarks(e.topic(), e.partition(), Duration::ZERO);
    }
}

/// Resolves when the doorbell's listener heard something (a ring, or its connection came
/// or went); never, without a listener or once it ended.
pub(crate) async fn rung(bell: Option<&mut watch::Receiver<Hearing>>) {
    match bell {
        Some(b) => {
            if b.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Resolves at `at`; never when `None`.
pub(crate) async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
