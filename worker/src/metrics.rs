//! Worker metrics: names, help texts and label sets in one place. No ids as labels.

use prometheus::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub const ATTEMPTS_TOTAL: &str = "railhook_worker_attempts_total";
pub const CLAIM_MISSES_TOTAL: &str = "railhook_worker_claim_misses_total";
pub const EARLY_HINTS_TOTAL: &str = "railhook_worker_early_hints_total";
pub const FENCE_REJECTIONS_TOTAL: &str = "railhook_worker_fence_rejections_total";
pub const CLAIMS_FRESH_TOTAL: &str = "railhook_worker_claims_fresh_total";
pub const SUCCESS_GROUP: &str = "railhook_worker_success_group_outcomes";
pub const SUCCESS_GROUP_RETRIED_TOTAL: &str = "railhook_worker_success_group_retried_total";
pub const ENDPOINTS_DISABLED_TOTAL: &str = "railhook_worker_endpoints_disabled_total";
pub const RETRIES_SCHEDULED_TOTAL: &str = "railhook_worker_retries_published_total";
pub const SWEPT_TOTAL: &str = "railhook_worker_swept_total";
pub const FAILED_MESSAGES_TOTAL: &str = "railhook_worker_failed_messages_total";
pub const DELIVERY_LATENCY_SECONDS: &str = "railhook_worker_delivery_latency_seconds";
pub const BAD_HINTS_TOTAL: &str = "railhook_worker_bad_hints_total";
pub const DEFERRALS_TOTAL: &str = "railhook_worker_deferrals_total";
pub const ORDERING_GAP_TIMEOUT_TOTAL: &str = "railhook_ordering_gap_timeout_total";
pub const ORDERING_RELEASED_TOTAL: &str = "railhook_ordering_released_total";
pub const ORDERING_HANDOFFS_TOTAL: &str = "railhook_ordering_handoffs_total";
pub const BREAKER_TRANSITIONS_TOTAL: &str = "railhook_worker_breaker_transitions_total";
pub const ENDPOINT_BREAKERS: &str = "railhook_endpoint_breakers";
pub const LIMITS_UNAVAILABLE_TOTAL: &str = "railhook_worker_limits_unavailable_total";
pub const RETRY_BACKLOG: &str = "railhook_worker_retry_backlog";
pub const CONSUMER_LAG: &str = "railhook_worker_consumer_lag";
pub const GROUP_REJOINS_TOTAL: &str = "railhook_worker_group_rejoins_total";
pub const REBALANCES_TOTAL: &str = "railhook_worker_rebalances_total";
pub const HINTS_WAITING: &str = "railhook_worker_hints_waiting";
pub const DOZING: &str = "railhook_worker_dozing";
pub const WAKES_TOTAL: &str = "railhook_worker_wakes_total";
pub const EXPRESS_HINTS_TOTAL: &str = "railhook_worker_express_hints_total";
pub const ATTEMPT_DURATION_SECONDS: &str = "railhook_worker_attempt_duration_seconds";
pub const TRANSFORMATION_DURATION_SECONDS: &str = "railhook_worker_transformation_duration_seconds";
pub const INTERNAL_ERRORS_TOTAL: &str = "railhook_worker_internal_errors_total";
pub const OLDEST_DUE_RETRY_AGE_SECONDS: &str = "railhook_worker_oldest_due_retry_age_seconds";
pub const OLDEST_UNCLAIMED_AGE_SECONDS: &str = "railhook_worker_oldest_unclaimed_age_seconds";

/// Transformations are bounded by their 100 ms time limit: finer buckets below it.
pub const TRANSFORMATION_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// Buckets for request latencies, fine around a 100 ms objective.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];

railhook_common::words! {
    /// `kind` label values of [`REBALANCES_TOTAL`].
    RebalanceKind { Assign, Revoke, Error }
}

railhook_common::words! {
    /// `reason` label values of [`WAKES_TOTAL`] (see `doze.rs`): the doorbell rang, or a
    /// rebalance assigned partitions, or the group watch found messages waiting on a
    /// partition of a dozing worker (a missed ring: non-zero means the doorbell is not
    /// reaching it).
    WakeReason { Ring, Rebalance, MissedRing }
}

railhook_common::words! {
    /// `outcome` label values of [`EXPRESS_HINTS_TOTAL`] (see `express.rs`): queued for a
    /// Claim; superseded by its Kafka copy before the Claim; dropped because Kafka delivered
    /// it first, because another worker holds its partition, because the lane had a
    /// backlog, or because the book was full.
    ExpressOutcome { Queued, Superseded, KafkaFirst, NotHeld, Backlog, Full }
}

railhook_common::words! {
    /// `sweep` label values of [`SWEPT_TOTAL`] (see `sweeps.rs`).
    Sweep { Processing, Stranded, MissedHint }
}

railhook_common::words! {
    /// `state` label values of [`RETRY_BACKLOG`]: PENDING with a retry time, and those
    /// whose time has passed.
    BacklogState { Scheduled, Due }
}

#[derive(Clone)]
pub struct WorkerMetrics {
    pub registry: Registry,
    pub attempts: IntCounterVec,
    pub claim_misses: IntCounter,
    /// Looks again at hints whose rows were not visible yet (claim.rs, `invisible`).
    pub early_hints: IntCounter,
    pub fence_rejections: IntCounter,
    /// Requests started under a Claim young enough to be its own re-stamp (turn.rs).
    pub claims_fresh: IntCounter,
    /// Successful outcomes written by one statement (successes.rs).
    pub success_group: Histogram,
    /// Group statements of successes that failed and were written one by one.
    pub success_group_retried: IntCounter,
    pub endpoints_disabled: IntCounter,
    pub retries_published: IntCounter,
    /// `sweep`: `processing`, `stranded` or `missed_hint`.
    pub swept: IntCounterVec,
    pub failed_messages: IntCounter,
    pub delivery_latency: Histogram,
    pub bad_hints: IntCounter,
    /// `reason`: one of [`DeferralReason`].
    pub deferrals: IntCounterVec,
    pub ordering_gap_timeouts: IntCounter,
    pub ordering_released: IntCounter,
    /// Released Deliveries the releasing worker claimed and delivered itself.
    pub ordering_handoffs: IntCounter,
    /// `state`: the state entered.
    pub breaker_transitions: IntCounterVec,
    /// `state`: live endpoints in that state (read from Postgres by the sweep).
    pub endpoint_breakers: IntGaugeVec,
    pub limits_unavailable: IntCounter,
    /// `state`: `scheduled` (PENDING with a retry time) or `due` (that time has passed).
    pub retry_backlog: IntGaugeVec,
    /// Messages behind the partition's high watermark, per `topic` (`deliveries`, `retries`)
    /// and `partition`, from librdkafka's statistics. Partitions are few and fixed.
    pub consumer_lag: IntGaugeVec,
    /// Times this worker left and rejoined its consumer group because a partition it does
    /// not hold stood still with messages waiting (group_watch.rs).
    pub group_rejoins: IntCounter,
    /// Consumer-group rebalances this member went through, by `kind`: one assign at start
    /// is normal; more mean members came and went, or this one was evicted (it stopped
    /// polling for longer than `max.poll.interval.ms`).
    pub rebalances: IntCounterVec,
    /// Hints read from Kafka and not yet claimed, per `lane`: they wait for a free in-flight
    /// permit, and the lane's topic is paused while too many wait.
    pub hints_waiting: IntGaugeVec,
    /// 1 while the worker dozes: its partitions are paused until the doorbell rings.
    pub dozing: IntGauge,
    /// Times a dozing worker woke, by `reason` (one of [`WakeReason`]).
    pub wakes: IntCounterVec,
    /// Express hints heard from the doorbell, by `outcome` (one of [`ExpressOutcome`]).
    pub express_hints: IntCounterVec,
    /// Each Attempt's request time by `result` (one of [`AttemptResult`]).
    pub attempt_duration: HistogramVec,
    /// Endpoint transformations run before an Attempt, by `outcome` (`send`, `skip`,
    /// `failed`): the time each took in its sandbox.
    pub transformation_duration: HistogramVec,
    /// Final states reached by this worker's writes: `succeeded` or `failed`.
    pub deliveries_final: IntCounterVec,
    /// `kind`: one of [`InternalError`].
    pub internal_errors: IntCounterVec,
    /// Seconds since the oldest due retry became due (0 when none is due); from the sweeps.
    pub oldest_due_retry_age: IntGauge,
    /// Seconds since the oldest never-tried PENDING Delivery was created (0 when none).
    pub oldest_unclaimed_age: IntGauge,
}

use railhook_common::AttemptOutcome;
use railhook_common::metrics_http::{
    FinalOutcome, counter, counters, gauge, gauges, histogram, histograms,
};
use railhook_common::transformation::RunOutcome;
use railhook_common::vocabulary::{
    AttemptResult, BreakerState, DeferralReason, InternalError, Lane,
};

impl WorkerMetrics {
    #[allow(
        clippy::too_many_lines,
        reason = "a declarative table: one entry per metric"
    )]
    pub fn new() -> Self {
        let r = Registry::new();
        let delivery_buckets: Vec<f64> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([60.0, 300.0, 3600.0])
            .collect();
        Self {
            attempts: railhook_common::metrics_http::counters_of(
                &r,
                ATTEMPTS_TOTAL,
                "HTTP Attempts sent, by outcome.",
                "outcome",
                AttemptOutcome::ALL.map(AttemptOutcome::label),
            ),
            early_hints: counter(
                &r,
                EARLY_HINTS_TOTAL,
                "Second looks at hints that arrived before their Delivery's row was visible (the commit was in the WAL, not yet in snapshots).",
            ),
            claim_misses: counter(
                &r,
                CLAIM_MISSES_TOTAL,
                "Hints whose Claim matched nothing (a duplicate, or a Delivery not due).",
            ),
            fence_rejections: counter(
                &r,
                FENCE_REJECTIONS_TOTAL,
                "Outcomes refused by the Fence: the worker had lost its Claim.",
            ),
            claims_fresh: counter(
                &r,
                CLAIMS_FRESH_TOTAL,
                "Requests started under a Claim under 100 ms old, which is its own re-stamp (no re-stamp statement).",
            ),
            success_group: histogram(
                &r,
                SUCCESS_GROUP,
                "Successful outcomes written by one statement: 1 while an outcome writer is free, more when they waited for one.",
                &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
            ),
            success_group_retried: counter(
                &r,
                SUCCESS_GROUP_RETRIED_TOTAL,
                "Group statements of successful outcomes that failed and were written one outcome at a time.",
            ),
            endpoints_disabled: counter(
                &r,
                ENDPOINTS_DISABLED_TOTAL,
                "Endpoints disabled by an Attempt's outcome: a 410 Gone, or a failure streak past the policy.",
            ),
            retries_published: counter(
                &r,
                RETRIES_SCHEDULED_TOTAL,
                "Due Deliveries the retry scheduler published to the retry topic.",
            ),
            swept: counters::<Sweep>(&r, SWEPT_TOTAL, "Deliveries moved by a sweep.", "sweep"),
            failed_messages: counter(
                &r,
                FAILED_MESSAGES_TOTAL,
                "Deliveries that ended FAILED (Failed Messages).",
            ),
            delivery_latency: histogram(
                &r,
                DELIVERY_LATENCY_SECONDS,
                "Event commit to the 2xx of its Delivery.",
                &delivery_buckets,
            ),
            bad_hints: counter(
                &r,
                BAD_HINTS_TOTAL,
                "Kafka messages that could not be decoded (skipped).",
            ),
            deferrals: counters::<DeferralReason>(
                &r,
                DEFERRALS_TOTAL,
                "Claimed Deliveries put back without an Attempt, by reason.",
                "reason",
            ),
            ordering_gap_timeouts: counter(
                &r,
                ORDERING_GAP_TIMEOUT_TOTAL,
                "Ordered Deliveries that went without a stuck predecessor after the gap timeout.",
            ),
            ordering_released: counter(
                &r,
                ORDERING_RELEASED_TOTAL,
                "Parked ordered Deliveries released through the Outbox when a predecessor resolved.",
            ),
            ordering_handoffs: counter(
                &r,
                ORDERING_HANDOFFS_TOTAL,
                "Released ordered Deliveries the releasing worker claimed and delivered itself (no trip through the relay).",
            ),
            breaker_transitions: counters::<BreakerState>(
                &r,
                BREAKER_TRANSITIONS_TOTAL,
                "Circuit-breaker state changes, by the state entered.",
                "state",
            ),
            endpoint_breakers: gauges::<BreakerState>(
                &r,
                ENDPOINT_BREAKERS,
                "Live endpoints by circuit-breaker state.",
                "state",
            ),
            limits_unavailable: counter(
                &r,
                LIMITS_UNAVAILABLE_TOTAL,
                "Deliveries sent without the breaker and limit checks because Redis did not answer.",
            ),
            retry_backlog: gauges::<BacklogState>(
                &r,
                RETRY_BACKLOG,
                "PENDING Deliveries with a retry scheduled, and those already due (refreshed by the sweeps).",
                "state",
            ),
            consumer_lag: railhook_common::metrics_http::register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        CONSUMER_LAG,
                        "Kafka messages not yet consumed by this worker, by topic and partition.",
                    ),
                    &["topic", "partition"],
                )
                .expect("valid metric"),
            ),
            group_rejoins: counter(
                &r,
                GROUP_REJOINS_TOTAL,
                "Consumer-group rejoins forced by partitions left unread (a broker that kept a dead member's partitions assigned).",
            ),
            rebalances: counters::<RebalanceKind>(
                &r,
                REBALANCES_TOTAL,
                "Consumer-group rebalances this worker went through, by kind.",
                "kind",
            ),
            hints_waiting: gauges::<Lane>(
                &r,
                HINTS_WAITING,
                "Hints read and not yet claimed, waiting for an in-flight permit, by lane.",
                "lane",
            ),
            dozing: gauge(
                &r,
                DOZING,
                "1 while this worker dozes (idle, its partitions paused until the doorbell rings).",
            ),
            wakes: counters::<WakeReason>(
                &r,
                WAKES_TOTAL,
                "Times this dozing worker woke, by reason (missed_ring: the doorbell did not reach it).",
                "reason",
            ),
            express_hints: counters::<ExpressOutcome>(
                &r,
                EXPRESS_HINTS_TOTAL,
                "Express hints heard from the doorbell, by outcome (queued: claimed without waiting for Kafka).",
                "outcome",
            ),
            attempt_duration: histograms::<AttemptResult>(
                &r,
                ATTEMPT_DURATION_SECONDS,
                "Time from an Attempt's request to its response (or error), by result.",
                "result",
                &LATENCY_BUCKETS,
            ),
            transformation_duration: histograms::<RunOutcome>(
                &r,
                TRANSFORMATION_DURATION_SECONDS,
                "Time an endpoint's transformation took in its sandbox, by outcome (send, skip, failed).",
                "outcome",
                &TRANSFORMATION_BUCKETS,
            ),
            deliveries_final: railhook_common::metrics_http::deliveries_final(
                &r,
                &[FinalOutcome::Succeeded, FinalOutcome::Failed],
            ),
            internal_errors: counters::<InternalError>(
                &r,
                INTERNAL_ERRORS_TOTAL,
                "Railhook's own failures on the delivery path (not the receiver's), by kind.",
                "kind",
            ),
            oldest_due_retry_age: gauge(
                &r,
                OLDEST_DUE_RETRY_AGE_SECONDS,
                "Seconds the oldest due retry has waited past its time (refreshed by the sweeps).",
            ),
            oldest_unclaimed_age: gauge(
                &r,
                OLDEST_UNCLAIMED_AGE_SECONDS,
                "Age in seconds of the oldest PENDING Delivery never tried yet (refreshed by the sweeps).",
            ),
            registry: r,
        }
    }
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self::new()
    }
}
