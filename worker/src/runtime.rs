//! The worker loop: consume hints, Claim, run the Attempt off the consumer's path, finalise
//! behind the Fence. The retry scheduler and the sweeps run in their own tasks.
//!
//! ```text
//!  doorbell ─express hint─┐ (the relay's NOTIFY after the ack; express.rs)
//!  deliveries topic ─Announcement─▶ fresh lane ─(permit)─▶ claim_batch ──┐ store offsets
//!  retries topic   ─RetryHint────▶ retry lane ─(permit)─▶ swap_batch ───┤ (after the
//!                                                                       │  statement)
//!                                                                       ▼
//!        spawn: gate, limits → re-stamp if the Claim aged → Attempt (transport/) → decide → finalise
//!  scheduler task, every retry_scheduler_ms: claim_due (SKIP LOCKED) → publish RetryHints,
//!                 acks awaited together → mark published │ failed → unclaim
//!  sweeps task, every sweep_ms: PROCESSING too long → PENDING; PENDING unscheduled too long
//!                 → retry path
//!  group watch: a partition this worker does not hold stood still with messages waiting
//!               for worker_stall_rejoin_seconds → leave and rejoin the group (group_watch.rs);
//!               a partition it holds has messages waiting while it dozes → wake
//!  doze: nothing read and no doorbell for worker_doze_after_ms → pause both lanes until
//!        the doorbell rings (doze.rs)
//! ```
//!
//! The loop never waits on an Attempt or on the scheduler: it claims only what it has free
//! permits for and pauses a lane's topic while hints wait (lanes.rs), so it polls Kafka
//! well within `max.poll.interval.ms` however slow the endpoints are.
//!
//! Offsets: a message's offset is stored only after its Claim's transaction committed or
//! matched nothing, so a crash before that redelivers the hint and a crash after it leaves a
//! claimed row that the processing sweep hands back. An express hint's Claim counts for its
//! Kafka copy, which then stores its offset without a second Claim (express.rs).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use railhook_common::doorbell::{Express, Hearing};
use railhook_common::health::{Backoff, Dependencies};
use railhook_common::kafka::{self};
use railhook_common::vocabulary::Lane as LaneName;
use rdkafka::consumer::Consumer;
use rdkafka::consumer::StreamConsumer;
use rdkafka::message::Message;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::config::{WorkerConfig, WorkerError};
use crate::consumer::{
    AbortOnDrop, LagContext, Seen, orphaned, subscribe, waiting_on, watch_group,
};
use crate::dispatch::{dispatch, drain};
use crate::doze::{self, Doze, WATCH_WHILE_DOZING};
use crate::fence;
use crate::group_watch::Probe;
use crate::lanes::{CLAIM_BATCH, Lane, Pauses, Taken};
use crate::limits::Limits;
use crate::metrics::{WakeReason, WorkerMetrics};
use crate::retry_publisher::run_scheduler;
use crate::ssrf::Allowlist;
use crate::sweeps::run_sweeps;
use crate::transport::Transports;

/// Everything an Attempt task needs; cheap to clone.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) transports: Transports,
    pub(crate) metrics: WorkerMetrics,
    /// Every retry decision (retry_policy.rs).
    pub(crate) policy: crate::retry_policy::RetryPolicy,
    pub(crate) limits: Limits,
    pub(crate) gap_timeout: Duration,
    pub(crate) streak: fence::StreakPolicy,
    /// How long an Attempt's outcome is retried while Postgres is away (the stranded
    /// window: past it the Delivery is someone else's to resend anyway).
    pub(crate) finalise_for: Duration,
    /// No request runs longer than this, whatever an older endpoint row says.
    pub(crate) endpoint_timeout_max: Duration,
    pub(crate) keyring: railhook_common::sealing::Keyring,
    /// Set when the worker was told to stop: no new hand-offs.
    pub(crate) draining: Arc<AtomicBool>,
    /// The writers of successful outcomes (successes.rs).
    pub(crate) successes: crate::successes::Successes,
    /// The Claims whose turns are running, by Delivery id: what a drain that timed out
    /// hands back.
    pub(crate) running: Arc<Mutex<HashMap<String, Uuid>>>,
    /// The running turns' tasks, so that a drain that timed out can stop them before it
    /// hands their Claims back (dispatch.rs, `drain`).
    pub(crate) turn_tasks: Arc<Mutex<tokio::task::JoinSet<()>>>,
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
    pools: impl Into<crate::Pools>,
    metrics: WorkerMetrics,
    deps: Dependencies,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    deps.declare("kafka", true);
    tokio::pin!(shutdown);
    if !wait_for_topics(&config, &deps, &mut shutdown).await {
        return Ok(());
    }
    let mut running = start(&config, pools.into(), metrics)?;
    // A new membership gets a full stall window to settle before it may rejoin again.
    let mut rejoined: Option<Instant> = None;
    // One pass per group membership: a rejoin (see `group_watch`) drops the consumer, which
    // commits the stored offsets and leaves the group, and subscribes a new one.
    loop {
        match membership(&config, &mut running, &mut shutdown, rejoined).await? {
            Membership::Stopped => return Ok(()),
            Membership::Rejoin => rejoined = Some(Instant::now()),
        }
    }
}

/// What lives across group memberships: the shared state, the scheduler's and the sweeps'
/// tasks, the group watch and the doorbell.
struct Running {
    shared: Shared,
    pauses: Arc<Pauses>,
    /// Tells the scheduler and the sweeps to stop (their rounds in progress end).
    stop_background: watch::Sender<bool>,
    background: [AbortOnDrop; 2],
    _watch: Option<AbortOnDrop>,
    /// The group watch's reports (consumer.rs, `watch_group`).
    seen: mpsc::Receiver<Seen>,
    /// The doorbell's rings, while dozing is on.
    bell: Option<watch::Receiver<Hearing>>,
    /// The doorbell's express hints, while they are on.
    express: Option<mpsc::Receiver<Vec<Express>>>,
}

/// How one group membership ended.
enum Membership {
    /// Told to stop: drained, Claims handed back.
    Stopped,
    /// A stalled partition nobody reads: leave the group and join again.
    Rejoin,
}

/// Everything the worker runs besides its consumer: the shared state its turns use, the
/// scheduler and the sweeps (in their own tasks, never on the consumer's loop), the group
/// watch and the doorbell's listener.
fn start(
    config: &WorkerConfig,
    pools: crate::Pools,
    metrics: WorkerMetrics,
) -> Result<Running, WorkerError> {
    // The first Claims find their connections open and their statements planned (warm.rs).
    tokio::spawn({
        let (pools, streak, gap) = (pools.clone(), config.streak, config.ordering_gap_timeout);
        async move { crate::warm::warm(&pools, &streak, gap).await }
    });
    let shared = shared(config, pools, metrics)?;
    let (stop_background, background_stop) = watch::channel(false);
    let background = [
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
    let (seen_tx, seen) = mpsc::channel(1);
    let (bell, express) = doorbell(config, &shared.pool);
    Ok(Running {
        pauses: Arc::new(Pauses::new(&config.deliveries_topic, &config.retries_topic)),
        _watch: group_watch(config, seen_tx)?,
        shared,
        stop_background,
        background,
        seen,
        bell,
        express,
    })
}

fn shared(
    config: &WorkerConfig,
    pools: crate::Pools,
    metrics: WorkerMetrics,
) -> Result<Shared, WorkerError> {
    let pool = pools.claims;
    let successes = crate::successes::Successes::new(
        pools.outcomes,
        config.outcome_writers,
        config.streak,
        metrics.clone(),
    );
    Ok(Shared {
        successes,
        pool,
        transports: Transports::new(
            Allowlist::parse(&config.allow_private_targets)?,
            &config.egress,
        )?,
        metrics,
        policy: crate::retry_policy::RetryPolicy {
            outgoing: config.outgoing.clone(),
            incoming: config.incoming.clone(),
            deferral_max: config.deferral_max,
            overload_floor: config.overload_floor,
        },
        limits: Limits::new(config.redis.clone(), config.breaker.clone())?,
        gap_timeout: config.ordering_gap_timeout,
        streak: config.streak,
        finalise_for: config.stranded_after,
        endpoint_timeout_max: config.endpoint_timeout_max,
        keyring: config.keyring.clone(),
        draining: Arc::new(AtomicBool::new(false)),
        running: Arc::new(Mutex::new(HashMap::new())),
        turn_tasks: Arc::default(),
    })
}

/// The group watch, looking every few seconds: for stalls (a sixth of the stall window),
/// and, while dozing is on, for a missed doorbell (WATCH_WHILE_DOZING). None when neither
/// is on.
fn group_watch(
    config: &WorkerConfig,
    seen: mpsc::Sender<Seen>,
) -> Result<Option<AbortOnDrop>, WorkerError> {
    let every = [
        config
            .stall_rejoin_after
            .map(|after| (after / 6).max(Duration::from_secs(1))),
        config.doze_after.map(|_| WATCH_WHILE_DOZING),
    ]
    .into_iter()
    .flatten()
    .min();
    let Some(every) = every else {
        return Ok(None);
    };
    let topics = [
        config.deliveries_topic.as_str(),
        config.retries_topic.as_str(),
    ];
    let probe = Probe::new(&config.kafka, &config.group, &topics)?;
    let task = watch_group(probe, config.stall_rejoin_after, every, seen);
    Ok(Some(AbortOnDrop(tokio::spawn(task))))
}

/// The doorbell's listener, on a connection of its own (common/src/doorbell.rs): its rings
/// wake a dozing worker, its express hints are claimed without waiting for Kafka.
#[allow(clippy::type_complexity)]
fn doorbell(
    config: &WorkerConfig,
    pool: &PgPool,
) -> (
    Option<watch::Receiver<Hearing>>,
    Option<mpsc::Receiver<Vec<Express>>>,
) {
    if config.doze_after.is_none() && !config.express_hints {
        return (None, None);
    }
    let dial = railhook_common::doorbell::Dial::Pool(pool.clone(), "railhook-worker-doorbell");
    let (hearing, express) = railhook_common::doorbell::listen_with_express(dial);
    (
        config.doze_after.map(|_| hearing),
        config.express_hints.then_some(express),
    )
}

/// One group membership: a new consumer with empty, unpaused lanes (what the last one read
/// and did not claim is read again from the committed offsets), claiming until told to
/// stop or to rejoin.
async fn membership(
    config: &WorkerConfig,
    running: &mut Running,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    rejoined: Option<Instant>,
) -> Result<Membership, WorkerError> {
    let shared = running.shared.clone();
    let pauses = running.pauses.clone();
    let settle = config.stall_rejoin_after.unwrap_or_default();
    let consumer = subscribe(config, &shared.metrics, pauses.clone())?;
    let mut fresh = Lane::new(
        LaneName::Fresh,
        &config.deliveries_topic,
        config.max_in_flight,
        pauses.clone(),
    );
    let mut retry = Lane::new(
        LaneName::Retry,
        &config.retries_topic,
        config.max_in_flight.div_ceil(2),
        pauses.clone(),
    );
    let mut doze = Doze::new(
        config.doze_after,
        running.bell.clone(),
        shared.metrics.clone(),
    );
    // Whatever the consumer has ready, up to a batch.
    let mut hints = consumer.stream().ready_chunks(CLAIM_BATCH);
    loop {
        claim_ready(&shared, &consumer, [&mut fresh, &mut retry]).await;
        let fresh_free = fresh.permits.clone();
        let retry_free = retry.permits.clone();
        let doze_at = doze.due();
        tokio::select! {
            _ = &mut *shutdown => {
                stop(config, running, &fresh, &retry).await;
                return Ok(Membership::Stopped);
            }
            batch = hints.next() => {
                let Some(batch) = batch else { return Ok(Membership::Stopped) };
                doze.read();
                for m in batch {
                    match m {
                        Ok(m) if m.topic() == config.retries_topic => retry.push(&m, &shared.metrics),
                        Ok(m) => fresh.push(&m, &shared.metrics),
                        Err(e) => tracing::warn!(error = %e, "consumer error"),
                    }
                }
            },
            Some(mut heard) = next_express(running.express.as_mut()) => {
                // Everything heard so far goes into one Claim statement.
                if let Some(rx) = running.express.as_mut() {
                    while let Ok(more) = rx.try_recv() {
                        heard.extend(more);
                    }
                }
                doze.read();
                let held = crate::lanes::held_partitions(&consumer, &config.deliveries_topic);
                fresh.push_express(heard, &held, &shared.metrics);
            }
            // A permit came free: the next pass claims for the lane that waits on it.
            _ = fresh_free.acquire(), if fresh.has_waiting() => {}
            _ = retry_free.acquire(), if retry.has_waiting() => {}
            () = doze::rung(doze.bell.as_mut()) => {
                doze.wake([&mut fresh, &mut retry], &consumer, WakeReason::Ring);
            }
            () = doze::until(doze_at) => doze.sleep([&mut fresh, &mut retry], &consumer),
            () = pauses.assigned.notified() => {
                doze.wake([&mut fresh, &mut retry], &consumer, WakeReason::Rebalance);
            }
            Some(report) = running.seen.recv() => {
                if doze.is_dozing() && waiting_on(&consumer, &report) {
                    doze.wake([&mut fresh, &mut retry], &consumer, WakeReason::MissedRing);
                }
                let settled = rejoined.is_none_or(|at| at.elapsed() >= settle);
                if settled && orphaned(&consumer, &report) {
                    shared.metrics.group_rejoins.inc();
                    // Dropping the consumer commits the stored offsets and leaves the group.
                    return Ok(Membership::Rejoin);
                }
            }
        }
    }
}

/// Claims what can start now, fresh first, and stores the offsets once the Claims committed.
async fn claim_ready(
    shared: &Shared,
    consumer: &StreamConsumer<LagContext>,
    lanes: [&mut Lane; 2],
) {
    for lane in lanes {
        while let Some(Taken {
            asks,
            permits,
            offsets,
            express,
        }) = lane.take()
        {
            dispatch(shared, lane.name, &lane.permits, asks, permits).await;
            lane.answered(&express);
            for (partition, offset) in offsets {
                if let Err(e) = consumer.store_offset(&lane.topic, partition, offset) {
                    tracing::warn!(error = %e, "offset not stored");
                }
            }
        }
        lane.throttle(consumer, &shared.metrics);
    }
}

/// Told to stop: the scheduler and the sweeps stop first (a round in progress ends), so
/// nothing claims rows again while the worker drains and hands back. Dropping the consumer
/// afterwards commits the stored offsets and leaves the group; hints read and not claimed
/// are read again by the next member.
async fn stop(config: &WorkerConfig, running: &mut Running, fresh: &Lane, retry: &Lane) {
    let _ = running.stop_background.send(true);
    let stopped = futures::future::join_all(running.background.iter_mut().map(|t| &mut t.0));
    let _ = tokio::time::timeout(config.drain_timeout, stopped).await;
    drain(&running.shared, config, fresh, retry).await;
}

/// The next batch of express hints, or never when they are off.
async fn next_express(
    express: Option<&mut mpsc::Receiver<Vec<railhook_common::doorbell::Express>>>,
) -> Option<Vec<railhook_common::doorbell::Express>> {
    match express {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
