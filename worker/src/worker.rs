//! The worker loop: consume hints, Claim, run the Attempt off the consumer's path, finalise
//! behind the Fence. The retry scheduler and the sweeps run in their own tasks.
//!
//! ```text
//!  deliveries topic ─Announcement─▶ fresh lane ─(permit)─▶ claim_batch ──┐ store offsets
//!  retries topic   ─RetryHint────▶ retry lane ─(permit)─▶ swap_batch ───┤ (after the
//!                                                                       │  statement)
//!                                                                       ▼
//!        spawn: gate, limits → re-stamp if the Claim aged → Attempt Runner → decide → finalise
//!  scheduler task, every retry_scheduler_ms: claim_due (SKIP LOCKED) → publish RetryHints,
//!                 acks awaited together → mark published │ failed → unclaim
//!  sweeps task, every sweep_ms: PROCESSING too long → PENDING; PENDING unscheduled too long
//!                 → retry path
//!  group watch: a partition this worker does not hold stood still with messages waiting
//!               for worker_stall_rejoin_seconds → leave and rejoin the group (group_watch.rs)
//! ```
//!
//! The loop never waits on an Attempt or on the scheduler: it claims only what it has free
//! permits for and pauses a lane's topic while hints wait (lanes.rs), so it polls Kafka
//! well within `max.poll.interval.ms` however slow the endpoints are.
//!
//! Offsets: a message's offset is stored only after its Claim's transaction committed or
//! matched nothing, so a crash before that redelivers the hint and a crash after it leaves a
//! claimed row that the processing sweep hands back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use railhook_common::config::PROCESSING_MARGIN;
use railhook_common::health::{Backoff, Dependencies};
use railhook_common::kafka::{self};
use railhook_common::retry::Ladder;
use railhook_common::signing::SigningKey;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tracing::Instrument;
use uuid::Uuid;

use crate::attempt::{Attempt, Outcome, Runner};
use crate::config::{WorkerConfig, WorkerError};
use crate::consumer::{AbortOnDrop, orphaned, subscribe, watch_group};
use crate::group_watch::Probe;
use crate::lanes::{Ask, CLAIM_BATCH, Lane, Pauses, Taken};
use crate::limits::{Admission, BreakerState, EndpointLimits, Limits, Reason, Verdict, rate_hold};
use crate::metrics::WorkerMetrics;
use crate::ordering::{self, Gate};
use crate::resolution::{Resolved, defer, finalise_with_retry, give_up};
use crate::schedule::{Decision, decide};
use crate::scheduler::{run_scheduler, run_sweeps};
use crate::ssrf::Allowlist;
use crate::store::{self, Claimed};

/// Everything an Attempt task needs; cheap to clone.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) runner: Runner,
    pub(crate) metrics: WorkerMetrics,
    pub(crate) outgoing: Ladder,
    pub(crate) incoming: Ladder,
    pub(crate) limits: Limits,
    pub(crate) gap_timeout: Duration,
    pub(crate) deferral_max: Duration,
    pub(crate) streak: store::StreakPolicy,
    /// How long an Attempt's outcome is retried while Postgres is away (the stranded
    /// window: past it the Delivery is someone else's to resend anyway).
    pub(crate) finalise_for: Duration,
    /// The sweep's window: a Claim older than this may be handed to another worker.
    pub(crate) processing_timeout: Duration,
    /// No request runs longer than this, whatever an older endpoint row says.
    pub(crate) endpoint_timeout_max: Duration,
    /// Set when the worker was told to stop: no new hand-offs.
    pub(crate) draining: Arc<AtomicBool>,
    /// The Claims whose turns are running, by Delivery id: what a drain that timed out
    /// hands back.
    pub(crate) running: Arc<Mutex<HashMap<String, Uuid>>>,
}

/// Creates the worker's topics, waiting with a capped back-off while Kafka is away (the
/// worker never exits because the broker is not up yet). Returns `false` if `shutdown`
/// came first.
async fn wait_for_topics(
    config: &WorkerConfig,
    deps: &Dependencies,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> bool {
    let mut backoff = Backoff::default();
    loop {
        let mut result = Ok(());
        for topic in [&config.deliveries_topic, &config.retries_topic] {
            result = kafka::ensure_topic(
                &config.kafka,
                topic,
                config.partitions,
                config.replication_factor,
            )
            .await;
            if result.is_err() {
                break;
            }
        }
        match result {
            Ok(()) => {
                deps.up("kafka");
                return true;
            }
            Err(e) => deps.down_keep_reason("kafka", e.to_string()),
        }
        tokio::select! {
            _ = &mut *shutdown => return false,
            _ = tokio::time::sleep(backoff.next_wait()) => {}
        }
    }
}

/// Runs the worker until `shutdown` resolves. Kafka or Postgres away at start is waited for,
/// not an error (`deps` says what is missing).
pub async fn run(
    config: WorkerConfig,
    pool: PgPool,
    metrics: WorkerMetrics,
    deps: Dependencies,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    deps.declare("kafka", true);
    tokio::pin!(shutdown);
    if !wait_for_topics(&config, &deps, &mut shutdown).await {
        return Ok(());
    }
    let shared = Shared {
        pool,
        runner: Runner::new(Allowlist::parse(&config.allow_private_targets)?)?,
        metrics,
        outgoing: config.outgoing.clone(),
        incoming: config.incoming.clone(),
        limits: Limits::new(config.redis.clone(), config.breaker.clone())?,
        gap_timeout: config.ordering_gap_timeout,
        deferral_max: config.deferral_max,
        streak: config.streak,
        finalise_for: config.stranded_after,
        processing_timeout: config.processing_timeout,
        endpoint_timeout_max: config.endpoint_timeout_max,
        draining: Arc::new(AtomicBool::new(false)),
        running: Arc::new(Mutex::new(HashMap::new())),
    };
    // The scheduler and the sweeps run in their own tasks, never on the consumer's loop.
    let (stop_background, background_stop) = watch::channel(false);
    let mut background = [
        AbortOnDrop(tokio::spawn(run_scheduler(
            shared.clone(),
            config.clone(),
            background_stop.clone(),
        ))),
        AbortOnDrop(tokio::spawn(run_sweeps(
            shared.clone(),
            config.clone(),
            background_stop,
        ))),
    ];
    let pauses = Arc::new(Pauses::new(&config.deliveries_topic, &config.retries_topic));
    let (stalled_tx, mut stalled) = mpsc::channel(1);
    let _watch = match config.stall_rejoin_after {
        Some(after) => {
            let probe = Probe::new(
                &config.kafka,
                &config.group,
                &[&config.deliveries_topic, &config.retries_topic],
            )?;
            Some(AbortOnDrop(tokio::spawn(watch_group(
                probe, after, stalled_tx,
            ))))
        }
        None => None,
    };
    // A new membership gets a full stall window to settle before it may rejoin again.
    let settle = config.stall_rejoin_after.unwrap_or_default();
    let mut rejoined: Option<Instant> = None;
    // One pass per group membership: a rejoin (see `group_watch`) drops the consumer, which
    // commits the stored offsets and leaves the group, and subscribes a new one.
    loop {
        let consumer = subscribe(&config, &shared.metrics, pauses.clone())?;
        // A new membership starts with empty, unpaused lanes: what the last one read and
        // did not claim is read again from the committed offsets.
        let mut fresh = Lane::new(
            "fresh",
            &config.deliveries_topic,
            config.max_in_flight,
            pauses.clone(),
        );
        let mut retry = Lane::new(
            "retry",
            &config.retries_topic,
            config.max_in_flight.div_ceil(2),
            pauses.clone(),
        );
        // Whatever the consumer has ready, up to a batch.
        let mut hints = consumer.stream().ready_chunks(CLAIM_BATCH);
        loop {
            // Claim what can start now, fresh first; store offsets once the Claims committed.
            for lane in [&mut fresh, &mut retry] {
                while let Some(Taken {
                    asks,
                    permits,
                    offsets,
                }) = lane.take()
                {
                    start(&shared, lane.name, asks, permits).await;
                    for (partition, offset) in offsets {
                        if let Err(e) = consumer.store_offset(&lane.topic, partition, offset) {
                            tracing::warn!(error = %e, "offset not stored");
                        }
                    }
                }
                lane.throttle(&consumer, &shared.metrics);
            }
            let fresh_free = fresh.permits.clone();
            let retry_free = retry.permits.clone();
            tokio::select! {
                _ = &mut shutdown => {
                    // The scheduler and the sweeps stop first (a round in progress ends), so
                    // nothing claims rows again while the worker drains and hands back.
                    let _ = stop_background.send(true);
                    let stopped = futures::future::join_all(background.iter_mut().map(|t| &mut t.0));
                    let _ = tokio::time::timeout(config.drain_timeout, stopped).await;
                    drain(&shared, &config, &fresh, &retry).await;
                    // Dropping the consumer commits the stored offsets and leaves the group;
                    // hints read and not claimed are read again by the next member.
                    return Ok(());
                }
                batch = hints.next() => {
                    let Some(batch) = batch else { return Ok(()) };
                    for m in batch {
                        match m {
                            Ok(m) if m.topic() == config.retries_topic => retry.push(&m, &shared.metrics),
                            Ok(m) => fresh.push(&m, &shared.metrics),
                            Err(e) => tracing::warn!(error = %e, "consumer error"),
                        }
                    }
                },
                // A permit came free: the next pass claims for the lane that waits on it.
                _ = fresh_free.acquire(), if fresh.has_waiting() => {}
                _ = retry_free.acquire(), if retry.has_waiting() => {}
                Some(report) = stalled.recv() => {
                    let settled = rejoined.is_none_or(|at| at.elapsed() >= settle);
                    if settled && orphaned(&consumer, report) {
                        shared.metrics.group_rejoins.inc();
                        rejoined = Some(Instant::now());
                        break;
                    }
                }
            }
        }
    }
}

/// Graceful drain: no new hand-offs; the running Attempts finish (and write their outcomes
/// through the Fence) for up to `drain_timeout`, which the loop sees as every permit of
/// both lanes coming back; Claims still running after that go back to PENDING at once
/// rather than after the processing sweep.
async fn drain(shared: &Shared, config: &WorkerConfig, fresh: &Lane, retry: &Lane) {
    shared.draining.store(true, Ordering::SeqCst);
    let running = shared.running.lock().map(|r| r.len()).unwrap_or(0);
    tracing::info!(running, timeout = ?config.drain_timeout, "worker draining");
    let all_back = async {
        let _fresh = fresh.permits.acquire_many(fresh.capacity).await;
        let _retry = retry.permits.acquire_many(retry.capacity).await;
    };
    if tokio::time::timeout(config.drain_timeout, all_back)
        .await
        .is_ok()
    {
        tracing::info!("worker drained: every Attempt finished");
        return;
    }
    let left: Vec<(String, Uuid)> = shared
        .running
        .lock()
        .map(|r| r.iter().map(|(id, t)| (id.clone(), *t)).collect())
        .unwrap_or_default();
    match store::release(&shared.pool, &left).await {
        Ok(n) => tracing::warn!(
            released = n,
            "drain timed out; unfinished claims handed back"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "drain timed out and claims not handed back; the sweep will")
        }
    }
}

/// Retries `op` while Postgres is away, so no offset moves past an unanswered hint.
async fn until_ok<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Claims (fresh lane) or swaps (retry lane) what a lane took, in one statement, and starts
/// an Attempt task for each won Claim with one of the permits taken for it. Returns once the
/// statement committed (or matched nothing): only then are the hints' offsets stored.
async fn start(
    shared: &Shared,
    lane: &str,
    asks: Vec<Ask>,
    mut permits: Vec<OwnedSemaphorePermit>,
) {
    if asks.is_empty() {
        return;
    }
    // Before the statement: the Claim's stamp is no earlier than this, so the age measured
    // from here is never less than the Claim's own (see `deliver`).
    let stamped = Instant::now();
    let won = if lane == "retry" {
        let hints: Vec<(String, Uuid)> = asks
            .iter()
            .filter_map(|a| match a {
                Ask::Swap(id, token) => Some((id.clone(), *token)),
                _ => None,
            })
            .collect();
        until_ok("swap", || store::swap_batch(&shared.pool, &hints)).await
    } else {
        let ids: Vec<String> = asks
            .iter()
            .filter_map(|a| match a {
                Ask::Claim(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        until_ok("claim", || store::claim_batch(&shared.pool, &ids)).await
    };
    let misses = asks.len().saturating_sub(won.len());
    shared.metrics.claim_misses.inc_by(misses as u64);
    for (claimed, target) in won {
        let Some(permit) = permits.pop() else {
            // More rows than hints cannot happen (one row per id); never send unpermitted.
            tracing::error!(delivery_id = %claimed.id, "claimed without a permit; the sweep will hand it back");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            turns(&shared, claimed, target, stamped).await;
            drop(permit);
        });
    }
}

/// Delivers a claimed Delivery, then, while each one resolved and released the next parked
/// ordered Delivery of its endpoint, claims that one and delivers it too, in the same task
/// and under the same permit (the ordering hand-off, ordering.rs). A hand-off that loses its
/// Claim (another worker took the Outbox hint first) simply ends the chain here.
async fn turns(shared: &Shared, claimed: Claimed, target: store::Target, stamped: Instant) {
    let mut next = Some((claimed, target, stamped));
    while let Some((claimed, target, stamped)) = next.take() {
        let id = claimed.id.clone();
        if let Ok(mut running) = shared.running.lock() {
            running.insert(id.clone(), claimed.token);
        }
        // One span per Attempt, with the ids as fields (never as metric labels): every log
        // line of the Claim's turn carries them.
        let span = tracing::info_span!(
            "attempt",
            delivery_id = %claimed.id,
            event_id = %claimed.event_id,
            endpoint_id = %claimed.endpoint_id,
            attempt = claimed.attempt_count + 1,
            direction = %claimed.direction,
        );
        let released = deliver(shared, claimed, target, stamped)
            .instrument(span)
            .await;
        if let Ok(mut running) = shared.running.lock() {
            running.remove(&id);
        }
        // A draining worker starts nothing new: the Outbox hint brings the released one.
        let Some(released) = released.filter(|_| !shared.draining.load(Ordering::SeqCst)) else {
            return;
        };
        let stamped = Instant::now();
        match store::claim_batch(&shared.pool, &[released]).await {
            Ok(mut won) => {
                if let Some((claimed, target)) = won.pop() {
                    shared.metrics.ordering_handoffs.inc();
                    next = Some((claimed, target, stamped));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "hand-off claim failed; the Outbox hint will bring the delivery")
            }
        }
    }
}

async fn breaker_changed(shared: &Shared, endpoint_id: &str, state: BreakerState) {
    shared
        .metrics
        .breaker_transitions
        .with_label_values(&[state.as_str()])
        .inc();
    tracing::info!(
        endpoint_id,
        state = state.as_str(),
        "circuit breaker changed"
    );
    if let Err(e) = store::set_breaker(&shared.pool, endpoint_id, state.as_str()).await {
        tracing::warn!(error = %e, "breaker state not mirrored to the endpoint row");
    }
}

/// The checks before a request is built: the ordering gate, then the endpoint's breaker and
/// limits. `None` means the Delivery was deferred (or parked) and must not be sent; `Some`
/// carries the concurrency lease to give back.
async fn admit(
    shared: &Shared,
    claimed: &mut Claimed,
    target: &store::Target,
) -> Option<Option<String>> {
    if claimed.ordered {
        match ordering::gate(&shared.pool, claimed, shared.gap_timeout).await {
            Ok(Gate::Go { sequence_number }) => claimed.sequence_number = Some(sequence_number),
            Ok(Gate::GoAfterGap { sequence_number }) => {
                shared.metrics.ordering_gap_timeouts.inc();
                claimed.sequence_number = Some(sequence_number);
            }
            Ok(Gate::Parked) => {
                shared
                    .metrics
                    .deferrals
                    .with_label_values(&[Reason::Ordering.as_str()])
                    .inc();
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, delivery_id = %claimed.id, "ordering gate failed; the sweep will hand the delivery back");
                return None;
            }
        }
    }
    let positive = |v: Option<i32>| v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
    let limits = EndpointLimits {
        rate_per_second: positive(target.rate_limit_per_second),
        burst: positive(target.rate_limit_burst),
        max_concurrency: positive(target.max_concurrency),
        timeout: Duration::from_millis(u64::try_from(target.timeout_ms).unwrap_or(30_000)),
    };
    let lease_token = claimed.token.to_string();
    let hold = rate_hold(limits.rate_per_second.unwrap_or(0));
    // A reserved rate slot within `hold` is waited for here (the Claim is held, nothing is
    // in flight), then admitted again: the reservation redeems at its slot. Three waits at
    // most; a slot that moved farther (another check refused meanwhile) is deferred.
    let mut waits = 0;
    loop {
        match shared
            .limits
            .admit(&claimed.endpoint_id, &claimed.id, &lease_token, &limits)
            .await
        {
            Admission::Go { lease, changed } => {
                if let Some(state) = changed {
                    breaker_changed(shared, &claimed.endpoint_id, state).await;
                }
                return Some(lease);
            }
            Admission::Defer {
                reason: Reason::Rate,
                wait,
            } if wait <= hold && waits < 3 => {
                waits += 1;
                tokio::time::sleep(wait).await;
            }
            Admission::Defer { reason, wait } => {
                // A far rate slot: come back `hold` early and wait out the rest here.
                let wait = if reason == Reason::Rate {
                    wait.saturating_sub(hold)
                } else {
                    wait
                };
                defer(shared, claimed, reason, wait).await;
                return None;
            }
            Admission::Unavailable => {
                shared.metrics.limits_unavailable.inc();
                return Some(None);
            }
        }
    }
}

/// How the breaker reads a report, and how long a 429 (or a 503 with `Retry-After`) pauses
/// the whole endpoint.
fn breaker_verdict(report: &crate::attempt::Report, max: Duration) -> (Verdict, Option<Duration>) {
    if !report.sent {
        return (Verdict::Neutral, None);
    }
    match &report.outcome {
        Outcome::Delivered => (Verdict::Ok, None),
        Outcome::Retry { retry_after } => {
            if report.status == Some(429) {
                let pause = retry_after.unwrap_or(Duration::from_secs(1)).min(max);
                (Verdict::Neutral, Some(pause))
            } else {
                (Verdict::Fail, retry_after.map(|d| d.min(max)))
            }
        }
        Outcome::Failed { .. } => (Verdict::Neutral, None),
    }
}

/// Whether a Claim stamped `age` ago must be re-stamped before a request of up to `timeout`
/// starts: the request and its finalise must end inside the sweep's window, with
/// [`PROCESSING_MARGIN`] to spare (common/src/config.rs, `processing_timeout_problem`).
pub(crate) fn needs_restamp(age: Duration, timeout: Duration, window: Duration) -> bool {
    age + timeout + PROCESSING_MARGIN >= window
}

/// One claimed Delivery: gate and limits (or a Deferral), Attempt, decision, finalise.
/// `stamped`: no later than the Claim's stamp in Postgres. Returns the ordered Delivery its
/// resolution released, if any.
async fn deliver(
    shared: &Shared,
    mut claimed: Claimed,
    target: store::Target,
    stamped: Instant,
) -> Option<String> {
    if !target.enabled {
        return give_up(shared, &claimed, "the endpoint is disabled or deleted").await;
    }
    // The expunge fails every Delivery not sent yet in its own transaction; this guards
    // any path that could make one PENDING again.
    if target.expunged {
        return give_up(shared, &claimed, "payload_expunged").await;
    }
    let Some(mut attempt) = build_attempt(&claimed, &target) else {
        return give_up(shared, &claimed, "the endpoint's URL or secret is invalid").await;
    };
    attempt.timeout = attempt.timeout.min(shared.endpoint_timeout_max);
    let lease = admit(shared, &mut claimed, &target).await?;
    attempt.sequence_number = claimed.sequence_number;
    // Invariant: a Claim is never older than its sweep window allows when its request
    // starts (review #19 item 1). The gate and the limits may have held it; then it is
    // re-stamped through the Fence, and a Claim the sweep already took back is not sent.
    if needs_restamp(
        stamped.elapsed(),
        attempt.timeout,
        shared.processing_timeout,
    ) {
        let kept = store::restamp(&shared.pool, &claimed).await;
        if !matches!(kept, Ok(true)) {
            if let Err(e) = &kept {
                tracing::warn!(error = %e, "claim not re-stamped; not sending, the sweep will hand it back");
            } else {
                shared.metrics.fence_rejections.inc();
                tracing::info!("claim lost before its request started; not sending");
            }
            shared
                .limits
                .record(
                    &claimed.endpoint_id,
                    lease.as_deref(),
                    Verdict::Neutral,
                    None,
                )
                .await;
            return None;
        }
    }
    let report = shared.runner.run(&attempt).await;
    let (verdict, throttle) = breaker_verdict(&report, shared.deferral_max);
    if let Some(state) = shared
        .limits
        .record(&claimed.endpoint_id, lease.as_deref(), verdict, throttle)
        .await
    {
        breaker_changed(shared, &claimed.endpoint_id, state).await;
    }
    let ladder = endpoint_ladder(shared, &claimed, &target);
    let attempts = u32::try_from(claimed.attempt_count).unwrap_or(0) + 1;
    let age = (chrono::Utc::now() - claimed.ladder_started_at)
        .to_std()
        .unwrap_or_default();
    let decision = decide(
        &report.outcome,
        report.status,
        attempts,
        age,
        &ladder,
        rand::random::<f64>(),
    );
    let label = match report.outcome {
        Outcome::Delivered => "succeeded",
        Outcome::Retry { .. } => "retry",
        Outcome::Failed { .. } => "failed",
    };
    if report.sent {
        shared.metrics.attempts.with_label_values(&[label]).inc();
    }
    match finalise_with_retry(shared, &claimed, &report, &decision).await {
        Some(Resolved {
            wrote: true,
            released,
        }) => {
            if decision == Decision::Succeeded {
                let since_commit = chrono::Utc::now() - target.event_created_at;
                shared
                    .metrics
                    .delivery_latency
                    .observe(since_commit.to_std().unwrap_or_default().as_secs_f64());
            }
            if matches!(decision, Decision::Failed { .. }) {
                shared.metrics.failed_messages.inc();
            }
            released
        }
        Some(Resolved { wrote: false, .. }) => {
            shared.metrics.fence_rejections.inc();
            tracing::info!(delivery_id = %claimed.id, "outcome fenced out: the claim was lost");
            None
        }
        None => {
            tracing::error!(delivery_id = %claimed.id, "outcome not written; the sweep will hand the delivery back");
            None
        }
    }
}

/// The direction's ladder, with the endpoint's own waits and Attempt count where it has them.
fn endpoint_ladder(shared: &Shared, claimed: &Claimed, target: &store::Target) -> Ladder {
    let mut ladder = if claimed.direction == "incoming" {
        shared.incoming.clone()
    } else {
        shared.outgoing.clone()
    };
    if let Some(delays) = target
        .retry_delays
        .as_deref()
        .and_then(Ladder::parse_delays)
    {
        ladder.delays = delays;
    }
    if let Some(n) = target.max_attempts.and_then(|n| u32::try_from(n).ok()) {
        ladder.max_attempts = n;
    }
    ladder
}

fn build_attempt(claimed: &Claimed, target: &store::Target) -> Option<Attempt> {
    let mut keys = vec![SigningKey::parse(&target.secret).ok()?];
    if let Some(prev) = &target.previous_secret {
        keys.push(SigningKey::parse(prev).ok()?);
    }
    let as_pairs = |v: Option<&serde_json::Value>| -> Vec<(String, String)> {
        v.and_then(|v| v.as_object())
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    };
    // A forwarded webhook keeps the provider's headers (a fixed safe subset chosen at
    // receipt) and its content type; the endpoint's own custom headers come last and win.
    let mut forwarded = as_pairs(target.forward_headers.as_ref());
    let content_type = forwarded
        .iter()
        .position(|(k, _)| k == "content-type")
        .map(|i| forwarded.remove(i).1);
    let mut custom_headers = forwarded;
    custom_headers.extend(as_pairs(Some(&target.headers)));
    let body = match &target.raw_body {
        Some(raw) => bytes::Bytes::from(raw.clone()),
        None => bytes::Bytes::from(target.payload.clone().into_bytes()),
    };
    Some(Attempt {
        delivery_id: claimed.id.clone(),
        event_id: claimed.event_id.clone(),
        event_type: target.event_type.clone(),
        url: url::Url::parse(&target.url).ok()?,
        body,
        custom_headers,
        keys,
        timeout: Duration::from_millis(u64::try_from(target.timeout_ms).unwrap_or(30_000)),
        sequence_number: claimed.sequence_number,
        content_type,
    })
}
