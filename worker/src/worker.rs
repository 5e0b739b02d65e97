//! The worker loop: consume hints, Claim, run the Attempt off the consumer's path, finalise
//! behind the Fence; plus the retry scheduler and the sweeps.
//!
//! ```text
//!  deliveries topic ─Announcement─▶ claim(id) ──┐
//!  retries topic   ─RetryHint────▶ swap(token) ─┤  store offset (after the claim committed
//!                                               │  or matched nothing)
//!                                               ▼
//!                        spawn: target → Attempt Runner (HTTP only) → decide → finalise
//!  every retry_scheduler_ms: claim_due (SKIP LOCKED) → publish RetryHint (ack) → never write
//!                                                     └ publish failed → unclaim
//!  every sweep_ms: PROCESSING too long → PENDING; PENDING unscheduled too long → retry path
//!  group watch: a partition this worker does not hold stood still with messages waiting
//!               for worker_stall_rejoin_seconds → leave and rejoin the group (group_watch.rs)
//! ```
//!
//! Offsets: a message's offset is stored only after its Claim's transaction committed or
//! matched nothing, so a crash before that redelivers the hint and a crash after it leaves a
//! claimed row that the processing sweep hands back. Claims run in message order on one
//! task; Attempts run concurrently, at most `max_in_flight` at a time.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use railhook_common::announcement::{Announcement, AnnouncementError};
use railhook_common::config::{ConfigError, Settings};
use railhook_common::health::{Backoff, Dependencies};
use railhook_common::kafka::{self, KafkaConnection};
use railhook_common::retry::Ladder;
use railhook_common::signing::SigningKey;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Statistics};
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc};
use tracing::Instrument;
use uuid::Uuid;

use crate::attempt::{Attempt, ClientError, Outcome, Runner};
use crate::group_watch::{Probe, Stalls};
use crate::hint::RetryHint;
use crate::limits::{
    Admission, BreakerPolicy, BreakerState, EndpointLimits, Limits, Reason, Verdict, deferral_wait,
    rate_hold,
};
use crate::metrics::WorkerMetrics;
use crate::ordering::{self, Gate};
use crate::schedule::{Decision, decide};
use crate::ssrf::{Allowlist, BadCidr};
use crate::store::{self, Claimed};

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub kafka: KafkaConnection,
    pub deliveries_topic: String,
    pub retries_topic: String,
    pub group: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub max_in_flight: usize,
    pub outgoing: Ladder,
    pub incoming: Ladder,
    pub scheduler_interval: Duration,
    pub sweep_interval: Duration,
    pub processing_timeout: Duration,
    pub stranded_after: Duration,
    /// See [`crate::group_watch`]; `None` turns the guard off.
    pub stall_rejoin_after: Option<Duration>,
    pub allow_private_targets: String,
    pub message_timeout: Duration,
    pub redis: railhook_common::redis_client::RedisClient,
    pub breaker: BreakerPolicy,
    pub ordering_gap_timeout: Duration,
    pub deferral_max: Duration,
    pub streak: store::StreakPolicy,
}

impl WorkerConfig {
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        Ok(Self {
            kafka: s.kafka(),
            deliveries_topic: kafka::deliveries_topic(&s.topic_prefix),
            retries_topic: kafka::retries_topic(&s.topic_prefix),
            group: s.worker_group.clone(),
            partitions: s.kafka_partitions,
            replication_factor: s.kafka_replication_factor,
            max_in_flight: s.worker_max_in_flight,
            outgoing: s.outgoing_ladder(),
            incoming: s.incoming_ladder(),
            scheduler_interval: Duration::from_millis(s.retry_scheduler_ms),
            sweep_interval: Duration::from_millis(s.sweep_ms),
            processing_timeout: Duration::from_secs(s.processing_timeout_seconds),
            stranded_after: Duration::from_secs(s.stranded_after_seconds),
            stall_rejoin_after: (s.worker_stall_rejoin_seconds > 0)
                .then(|| Duration::from_secs(s.worker_stall_rejoin_seconds)),
            allow_private_targets: s.allow_private_targets.clone(),
            message_timeout: Duration::from_millis(s.kafka_message_timeout_ms),
            redis: s.redis_client()?,
            breaker: BreakerPolicy {
                consecutive_failures: s.breaker_consecutive_failures,
                failure_rate: s.breaker_failure_rate,
                min_requests: s.breaker_min_requests,
                window: Duration::from_secs(s.breaker_window_seconds),
                cooldown: Duration::from_secs(s.breaker_cooldown_seconds),
                probe_lease: Duration::from_secs(60),
            },
            ordering_gap_timeout: Duration::from_secs(s.ordering_gap_timeout_seconds),
            deferral_max: Duration::from_secs(s.deferral_max_seconds),
            streak: store::StreakPolicy {
                disable_after: Duration::from_secs(s.endpoint_disable_after_seconds),
                min_failures: s.endpoint_disable_min_failures,
            },
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Kafka")]
    Kafka(#[from] KafkaError),
    #[error("RAILHOOK_ALLOW_PRIVATE_TARGETS")]
    Allowlist(#[from] BadCidr),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("REDIS_URL")]
    Redis(#[from] redis::RedisError),
}

/// Everything an Attempt task needs; cheap to clone.
#[derive(Clone)]
struct Shared {
    pool: PgPool,
    runner: Runner,
    metrics: WorkerMetrics,
    outgoing: Ladder,
    incoming: Ladder,
    limits: Limits,
    gap_timeout: Duration,
    deferral_max: Duration,
    streak: store::StreakPolicy,
    /// How long an Attempt's outcome is retried while Postgres is away (the stranded
    /// window: past it the Delivery is someone else's to resend anyway).
    finalise_for: Duration,
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
    let mut producer = kafka::producer(&config.kafka, config.message_timeout, 10_000)?;
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
    };
    let permits = Arc::new(Semaphore::new(config.max_in_flight));
    let mut scheduler = tokio::time::interval(config.scheduler_interval);
    let mut sweep = tokio::time::interval(config.sweep_interval);
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
        let consumer = subscribe(&config, &shared.metrics)?;
        // Whatever the consumer has ready, up to a batch: claimed in one statement, so one
        // commit (one WAL flush) serves the whole batch.
        let mut hints = consumer.stream().ready_chunks(CLAIM_BATCH);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                batch = hints.next() => {
                    let Some(batch) = batch else { return Ok(()) };
                    let messages: Vec<BorrowedMessage<'_>> = batch
                        .into_iter()
                        .filter_map(|m| m.map_err(|e| tracing::warn!(error = %e, "consumer error")).ok())
                        .collect();
                    on_batch(&shared, &config, &permits, &messages).await;
                    for m in &messages {
                        if let Err(e) = consumer.store_offset_from_message(m) {
                            tracing::warn!(error = %e, "offset not stored");
                        }
                    }
                },
                _ = scheduler.tick() => {
                    if schedule_retries(&shared, &config, &producer).await.is_err() {
                        // A new producer id rather than librdkafka's epoch bump after the
                        // timeout, which tansu 0.6.0 cannot handle (relay.rs, `session`).
                        match kafka::producer(&config.kafka, config.message_timeout, 10_000) {
                            Ok(p) => producer = p,
                            Err(e) => tracing::warn!(error = %e, "retry producer not recreated"),
                        }
                    }
                }
                _ = sweep.tick() => sweeps(&shared, &config).await,
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

/// Subscribes a new member of the workers' group.
fn subscribe(
    config: &WorkerConfig,
    metrics: &WorkerMetrics,
) -> Result<StreamConsumer<LagContext>, WorkerError> {
    let lag = LagContext {
        lag: metrics.consumer_lag.clone(),
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
        .set("fetch.wait.max.ms", "10")
        .set("auto.commit.interval.ms", "500")
        // A worker killed with SIGKILL never says goodbye: the group notices through its
        // missing heartbeats after the session timeout, and waits at most the rebalance
        // timeout (max.poll.interval.ms) for members to rejoin. librdkafka's defaults (45 s,
        // 300 s) left a partition unread for minutes after a worker was killed
        // (docs/RELIABILITY.md); these bound it to seconds. 60 s between polls is still far
        // more than a batch waits for permits (Attempts time out at 30 s by default).
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "2000")
        .set("max.poll.interval.ms", "60000")
        // librdkafka prefetches up to 100,000 messages per partition by default. Under a
        // backlog, a RetryHint fetched later then waits behind every Announcement fetched
        // before it, and a partition the worker holds looks unread to the group watch for
        // as long as that local queue takes to drain (seen: over 30 s at 10,000 Events).
        // A short prefetch per partition keeps the partitions interleaved; one claim batch
        // is 500 hints, so 1,000 per partition still keeps the worker fed.
        .set("queued.min.messages", "1000")
        .create_with_context(lag)?;
    consumer.subscribe(&[&config.deliveries_topic, &config.retries_topic])?;
    Ok(consumer)
}

/// Stalled partitions, as the group watch saw them at `at`.
struct Stalled {
    at: Instant,
    partitions: Vec<(String, i32)>,
}

/// Aborts the task when dropped, so the watch ends with `run`.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads the group's positions every few seconds (off the async threads: the probe blocks)
/// and reports the partitions that stalled.
async fn watch_group(probe: Probe, after: Duration, tx: mpsc::Sender<Stalled>) {
    let probe = Arc::new(probe);
    let mut stalls = Stalls::new(after);
    // A few seconds, jittered, so the workers of a group do not look (and rejoin) in step.
    let every = (after / 6).max(Duration::from_secs(1));
    loop {
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
                stalls = Stalls::new(after);
                continue;
            }
            Err(_) => return,
        };
        let partitions = stalls.observe(Instant::now(), &positions);
        if !partitions.is_empty() {
            // A full channel means the last report is still unread: this one can wait.
            let _ = tx.try_send(Stalled {
                at: Instant::now(),
                partitions,
            });
        }
    }
}

/// Whether `report` names a partition this member does not hold: then some other member
/// holds it and does not read it, or nobody does, and a rejoin makes the coordinator assign
/// every partition again. A stall of this member's own partitions is its own slowness (a
/// full in-flight bound, Postgres away), which a rejoin would not cure. A report from before
/// a long pause of this loop (Postgres away) is stale and ignored.
fn orphaned(consumer: &StreamConsumer<LagContext>, report: Stalled) -> bool {
    if report.at.elapsed() > Duration::from_secs(5) {
        return false;
    }
    let Ok(mine) = consumer.assignment() else {
        return false;
    };
    let elements = mine.elements();
    let held: Vec<(&str, i32)> = elements
        .iter()
        .map(|e| (e.topic(), e.partition()))
        .collect();
    let orphans: Vec<String> = report
        .partitions
        .iter()
        .filter(|(t, p)| !held.contains(&(t.as_str(), *p)))
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
struct LagContext {
    lag: prometheus::IntGaugeVec,
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

impl ConsumerContext for LagContext {}

/// Most hints claimed in one statement.
const CLAIM_BATCH: usize = 256;

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

/// Claims what a batch of hints names and hands each won Claim to an Attempt task. Returns
/// once every Claim's statement committed (or matched nothing): only then are the batch's
/// offsets stored.
async fn on_batch(
    shared: &Shared,
    config: &WorkerConfig,
    permits: &Arc<Semaphore>,
    messages: &[BorrowedMessage<'_>],
) {
    let mut announced = Vec::new();
    let mut retries = Vec::new();
    for m in messages {
        let payload = m.payload().unwrap_or_default();
        if m.topic() == config.retries_topic {
            match RetryHint::decode(payload) {
                Some(h) => retries.push(h),
                None => shared.metrics.bad_hints.inc(),
            }
        } else {
            match Announcement::decode(payload) {
                Ok(a) => announced.push(a.delivery_id),
                // A newer release's Announcement (a rolling deploy): it still names its
                // Delivery, and the Claim reads the rest from the row, so it is claimed
                // like any other rather than dropped (common/src/announcement.rs).
                Err(AnnouncementError::UnknownVersion(_)) => {
                    match Announcement::delivery_of_any_version(payload) {
                        Ok((v, id)) => {
                            tracing::info!(version = v, delivery_id = %id, "announcement of a newer version; claiming the delivery it names");
                            announced.push(id);
                        }
                        Err(_) => shared.metrics.bad_hints.inc(),
                    }
                }
                Err(_) => shared.metrics.bad_hints.inc(),
            }
        }
    }
    let mut won = Vec::new();
    if !announced.is_empty() {
        won = until_ok("claim", || store::claim_batch(&shared.pool, &announced)).await;
        let misses = announced.len().saturating_sub(won.len());
        shared.metrics.claim_misses.inc_by(misses as u64);
    }
    for h in retries {
        let token = Uuid::new_v4();
        let swapped = until_ok("swap", || {
            store::swap(&shared.pool, &h.delivery_id, h.token, token)
        })
        .await;
        let Some(claimed) = swapped else {
            shared.metrics.claim_misses.inc();
            continue;
        };
        match until_ok("target", || store::target(&shared.pool, &claimed)).await {
            Some(target) => won.push((claimed, target)),
            None => {
                tracing::warn!(delivery_id = %claimed.id, "claimed delivery has no endpoint or event")
            }
        }
    }
    for (claimed, target) in won {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let shared = shared.clone();
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
        tokio::spawn(
            async move {
                deliver(&shared, claimed, target).await;
                drop(permit);
            }
            .instrument(span),
        );
    }
}

/// Ends a claimed Delivery as FAILED without sending anything; counted only if it wrote.
async fn give_up(shared: &Shared, claimed: &Claimed, reason: &str) {
    if let Ok(true) = resolve(shared, claimed, Resolution::Unsent(reason)).await {
        shared.metrics.failed_messages.inc();
    }
}

/// A write that ends a claimed Delivery's turn.
enum Resolution<'a> {
    /// The Attempt's outcome, through `store::finalise`.
    Outcome(&'a crate::attempt::Report, &'a Decision),
    /// FAILED without an Attempt.
    Unsent(&'a str),
}

async fn write_resolution(
    db: impl sqlx::PgExecutor<'_>,
    shared: &Shared,
    claimed: &Claimed,
    what: &Resolution<'_>,
) -> sqlx::Result<bool> {
    match what {
        Resolution::Outcome(report, decision) => {
            store::finalise(db, claimed, report, decision, &shared.streak).await
        }
        Resolution::Unsent(reason) => store::fail_unsent(db, claimed, reason).await,
    }
}

/// Writes a Resolution behind the Fence. For an ordered Delivery that resolves (SUCCEEDED
/// or FAILED, not a retry), the write runs under the endpoint's ordering lock and, if it
/// landed, releases the next parked Delivery in the same transaction (see `ordering`).
async fn resolve(shared: &Shared, claimed: &Claimed, what: Resolution<'_>) -> sqlx::Result<bool> {
    let resolves = !matches!(what, Resolution::Outcome(_, Decision::RetryAfter(_)));
    if !(claimed.ordered && resolves) {
        return write_resolution(&shared.pool, shared, claimed, &what).await;
    }
    let mut tx = ordering::begin_resolve(&shared.pool, &claimed.endpoint_id).await?;
    let wrote = write_resolution(&mut *tx, shared, claimed, &what).await?;
    let mut released = false;
    if wrote && let Some(seq) = claimed.sequence_number {
        released = ordering::release_next(&mut tx, &claimed.endpoint_id, seq).await?;
    }
    tx.commit().await?;
    if released {
        shared.metrics.ordering_released.inc();
    }
    Ok(wrote)
}

/// A Deferral: the Claim goes back, no Attempt is spent.
async fn defer(shared: &Shared, claimed: &Claimed, reason: Reason, asked: Duration) {
    let wait = deferral_wait(
        reason,
        asked,
        claimed.deferral_count,
        shared.deferral_max,
        rand::random::<f64>(),
    );
    match store::defer(&shared.pool, claimed, wait).await {
        Ok(true) => shared
            .metrics
            .deferrals
            .with_label_values(&[reason.as_str()])
            .inc(),
        Ok(false) => shared.metrics.fence_rejections.inc(),
        Err(e) => {
            tracing::warn!(error = %e, delivery_id = %claimed.id, "deferral not written; the sweep will hand the delivery back")
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

/// One claimed Delivery: gate and limits (or a Deferral), Attempt, decision, finalise.
async fn deliver(shared: &Shared, mut claimed: Claimed, target: store::Target) {
    if !target.enabled {
        return give_up(shared, &claimed, "the endpoint is disabled or deleted").await;
    }
    let Some(mut attempt) = build_attempt(&claimed, &target) else {
        return give_up(shared, &claimed, "the endpoint's URL or secret is invalid").await;
    };
    let Some(lease) = admit(shared, &mut claimed, &target).await else {
        return;
    };
    attempt.sequence_number = claimed.sequence_number;
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
        Some(true) => {
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
        }
        Some(false) => {
            shared.metrics.fence_rejections.inc();
            tracing::info!(delivery_id = %claimed.id, "outcome fenced out: the claim was lost");
        }
        None => {
            tracing::error!(delivery_id = %claimed.id, "outcome not written; the sweep will hand the delivery back")
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

/// The longest pause between two tries of an outcome's write.
const FINALISE_MAX_PAUSE: Duration = Duration::from_secs(5);

/// Writes an Attempt's outcome behind the Fence, retrying while Postgres does not answer.
///
/// Invariant: one attempt row per request sent. A request that went out must leave its row
/// even when Postgres restarts under it, so the write is retried (backing off to
/// [`FINALISE_MAX_PAUSE`]) for as long as it could still matter: until it lands, is fenced
/// out (recorded as a fenced Attempt), or `finalise_for` (the stranded window) has passed.
/// Giving up after a few seconds, as this once did, lost the row of every request that
/// finished during a Postgres restart. Each try is one transaction; a try whose commit
/// succeeded but whose answer was lost with the connection is retried and then lands as a
/// fenced Attempt (the Claim is gone): a second row for that one request, never a lost one.
async fn finalise_with_retry(
    shared: &Shared,
    claimed: &Claimed,
    report: &crate::attempt::Report,
    decision: &Decision,
) -> Option<bool> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(200);
    loop {
        match resolve(shared, claimed, Resolution::Outcome(report, decision)).await {
            Ok(wrote) => return Some(wrote),
            Err(e) => {
                tracing::warn!(error = %e, delivery_id = %claimed.id, "finalise failed; retrying")
            }
        }
        if started.elapsed() >= shared.finalise_for {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(FINALISE_MAX_PAUSE);
    }
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

/// The retry scheduler: claims due rows and publishes a hint for each. Once a hint is
/// acknowledged by Kafka the scheduler never writes that row again (the consumer owns it);
/// only a failed publish hands the row back. The first failed publish ends the round and
/// hands back the rest too: the broker is away, and trying each hint would hold the loop for
/// a message timeout apiece.
async fn schedule_retries(
    shared: &Shared,
    config: &WorkerConfig,
    producer: &FutureProducer,
) -> Result<(), KafkaError> {
    let due = match store::claim_due(&shared.pool, 500).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "retry scheduler could not read due deliveries");
            return Ok(());
        }
    };
    let mut due = due.into_iter();
    let mut published = Vec::new();
    while let Some((delivery_id, endpoint_id, token)) = due.next() {
        let hint = RetryHint {
            delivery_id,
            endpoint_id,
            token,
        };
        let payload = hint.encode();
        let record = FutureRecord::to(&config.retries_topic)
            .key(&hint.endpoint_id)
            .payload(&payload);
        match producer.send(record, Duration::from_secs(5)).await {
            Ok(_) => {
                shared.metrics.retries_published.inc();
                published.push(hint.token);
            }
            Err((e, _)) => {
                mark_published(shared, &published).await;
                tracing::warn!(error = %e, "retry hint not published; handing the round's deliveries back");
                let _ = store::unclaim(&shared.pool, &hint.delivery_id, hint.token).await;
                for (id, _, token) in due {
                    let _ = store::unclaim(&shared.pool, &id, token).await;
                }
                return Err(e);
            }
        }
    }
    mark_published(shared, &published).await;
    Ok(())
}

/// Best-effort: a row left unmarked is swept back after the unpublished window and hinted
/// again, which the Claim absorbs.
async fn mark_published(shared: &Shared, tokens: &[Uuid]) {
    if let Err(e) = store::mark_published(&shared.pool, tokens).await {
        tracing::warn!(error = %e, hints = tokens.len(), "published hints not marked; the sweep will hint them again");
    }
}

/// How long a row the scheduler took may wait for its hint's acknowledgement before the
/// sweep takes it back: twice the producer's whole retry budget for one message (4 min by
/// default). Taking one back early costs only a second hint, which the Claim absorbs.
fn unpublished_window(config: &WorkerConfig) -> Duration {
    config.message_timeout * 2
}

async fn sweeps(shared: &Shared, config: &WorkerConfig) {
    match store::sweep_processing(
        &shared.pool,
        config.processing_timeout.as_secs_f64(),
        config.stranded_after.as_secs_f64(),
        unpublished_window(config).as_secs_f64(),
    )
    .await
    {
        Ok(n) => shared
            .metrics
            .swept
            .with_label_values(&["processing"])
            .inc_by(n),
        Err(e) => tracing::warn!(error = %e, "processing sweep failed"),
    }
    match store::sweep_stranded(&shared.pool, config.stranded_after.as_secs_f64()).await {
        Ok(n) => shared
            .metrics
            .swept
            .with_label_values(&["stranded"])
            .inc_by(n),
        Err(e) => tracing::warn!(error = %e, "stranded sweep failed"),
    }
    if let Ok((scheduled, due)) = store::retry_backlog(&shared.pool).await {
        let backlog = &shared.metrics.retry_backlog;
        backlog.with_label_values(&["scheduled"]).set(scheduled);
        backlog.with_label_values(&["due"]).set(due);
    }
    if let Ok(counts) = store::breaker_counts(&shared.pool).await {
        for state in crate::metrics::BREAKER_STATES {
            let n = counts
                .iter()
                .find(|(s, _)| s == state)
                .map_or(0, |(_, n)| *n);
            shared
                .metrics
                .endpoint_breakers
                .with_label_values(&[state])
                .set(n);
        }
    }
}
