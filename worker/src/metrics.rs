//! Worker metrics: names, help texts and label sets in one place. No ids as labels.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

pub const ATTEMPTS_TOTAL: &str = "railhook_worker_attempts_total";
pub const CLAIM_MISSES_TOTAL: &str = "railhook_worker_claim_misses_total";
pub const EARLY_HINTS_TOTAL: &str = "railhook_worker_early_hints_total";
pub const FENCE_REJECTIONS_TOTAL: &str = "railhook_worker_fence_rejections_total";
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
pub const INTERNAL_ERRORS_TOTAL: &str = "railhook_worker_internal_errors_total";
pub const OLDEST_DUE_RETRY_AGE_SECONDS: &str = "railhook_worker_oldest_due_retry_age_seconds";
pub const OLDEST_UNCLAIMED_AGE_SECONDS: &str = "railhook_worker_oldest_unclaimed_age_seconds";

/// `result` label values of [`ATTEMPT_DURATION_SECONDS`]: what the receiver did
/// (`success`, `http_4xx`, `http_5xx`, `http_other` for 1xx/3xx, `timeout`, `connect`,
/// `reset`, `request`), or `target_refused` when the SSRF guard kept the request from being
/// sent (the endpoint's configuration, not Railhook's fault). Railhook's own failures are in
/// [`INTERNAL_ERRORS_TOTAL`] instead, so a receiver's bad day and ours never share a series.
pub const ATTEMPT_RESULTS: [&str; 9] = [
    "success",
    "http_4xx",
    "http_5xx",
    "http_other",
    "timeout",
    "connect",
    "reset",
    "request",
    "target_refused",
];
/// `kind` label values of [`INTERNAL_ERRORS_TOTAL`]: an Attempt's outcome that could not
/// be written (Postgres away past the retries; the sweep hands the Delivery back), and a
/// Delivery deferred because no configured key opens its endpoint's secret.
pub const INTERNAL_ERROR_KINDS: [&str; 2] = ["outcome_not_written", "secret_unavailable"];
/// Buckets for request latencies, fine around a 100 ms objective.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// `kind` label values of [`REBALANCES_TOTAL`].
pub const REBALANCE_KINDS: [&str; 3] = ["assign", "revoke", "error"];
/// `lane` label values of [`HINTS_WAITING`] (see `lanes.rs`).
pub const LANES: [&str; 2] = ["fresh", "retry"];

/// `reason` label values of [`WAKES_TOTAL`] (see `doze.rs`): the doorbell rang, or a
/// rebalance assigned partitions, or the group watch found messages waiting on a partition
/// of a dozing worker (a missed ring: non-zero means the doorbell is not reaching it).
pub const WAKE_REASONS: [&str; 3] = ["ring", "rebalance", "missed_ring"];

/// `outcome` label values of [`EXPRESS_HINTS_TOTAL`] (see `express.rs`): queued for a
/// Claim; superseded by its Kafka copy before the Claim; dropped because Kafka delivered
/// it first, because another worker holds its partition, because the lane had a backlog,
/// or because the book was full.
pub const EXPRESS_OUTCOMES: [&str; 6] = [
    "queued",
    "superseded",
    "kafka_first",
    "not_held",
    "backlog",
    "full",
];

/// `reason` label values of [`DEFERRALS_TOTAL`] (see `limits::Reason`).
pub const DEFERRAL_REASONS: [&str; 5] = ["breaker", "throttled", "concurrency", "rate", "ordering"];
/// `state` label values of [`BREAKER_TRANSITIONS_TOTAL`] and [`ENDPOINT_BREAKERS`].
pub const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

/// `outcome` label values of [`ATTEMPTS_TOTAL`].
pub const OUTCOMES: [&str; 3] = ["succeeded", "retry", "failed"];

#[derive(Clone)]
pub struct WorkerMetrics {
    pub registry: Registry,
    pub attempts: IntCounterVec,
    pub claim_misses: IntCounter,
    /// Looks again at hints whose rows were not visible yet (claim.rs, `invisible`).
    pub early_hints: IntCounter,
    pub fence_rejections: IntCounter,
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
    /// `reason`: one of [`DEFERRAL_REASONS`].
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
    /// Times a dozing worker woke, by `reason` (one of [`WAKE_REASONS`]).
    pub wakes: IntCounterVec,
    /// Express hints heard from the doorbell, by `outcome` (one of [`EXPRESS_OUTCOMES`]).
    pub express_hints: IntCounterVec,
    /// Each Attempt's request time by `result` (one of [`ATTEMPT_RESULTS`]).
    pub attempt_duration: HistogramVec,
    /// Final states reached by this worker's writes: `succeeded` or `failed`.
    pub deliveries_final: IntCounterVec,
    /// `kind`: one of [`INTERNAL_ERROR_KINDS`].
    pub internal_errors: IntCounterVec,
    /// Seconds since the oldest due retry became due (0 when none is due); from the sweeps.
    pub oldest_due_retry_age: IntGauge,
    /// Seconds since the oldest never-tried PENDING Delivery was created (0 when none).
    pub oldest_unclaimed_age: IntGauge,
}

use railhook_common::metrics_http::register as reg;

impl WorkerMetrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let counter =
            |name: &str, help: &str| reg(&r, IntCounter::new(name, help).expect("valid metric"));
        let m = Self {
            attempts: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(ATTEMPTS_TOTAL, "HTTP Attempts sent, by outcome."),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            early_hints: counter(
                EARLY_HINTS_TOTAL,
                "Second looks at hints that arrived before their Delivery's row was visible (the commit was in the WAL, not yet in snapshots).",
            ),
            claim_misses: counter(
                CLAIM_MISSES_TOTAL,
                "Hints whose Claim matched nothing (a duplicate, or a Delivery not due).",
            ),
            fence_rejections: counter(
                FENCE_REJECTIONS_TOTAL,
                "Outcomes refused by the Fence: the worker had lost its Claim.",
            ),
            success_group: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        SUCCESS_GROUP,
                        "Successful outcomes written by one statement: 1 while an outcome writer is free, more when they waited for one.",
                    )
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
                )
                .expect("valid metric"),
            ),
            success_group_retried: counter(
                SUCCESS_GROUP_RETRIED_TOTAL,
                "Group statements of successful outcomes that failed and were written one outcome at a time.",
            ),
            endpoints_disabled: counter(
                ENDPOINTS_DISABLED_TOTAL,
                "Endpoints disabled by an Attempt's outcome: a 410 Gone, or a failure streak past the policy.",
            ),
            retries_published: counter(
                RETRIES_SCHEDULED_TOTAL,
                "Due Deliveries the retry scheduler published to the retry topic.",
            ),
            swept: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(SWEPT_TOTAL, "Deliveries moved by a sweep."),
                    &["sweep"],
                )
                .expect("valid metric"),
            ),
            failed_messages: counter(
                FAILED_MESSAGES_TOTAL,
                "Deliveries that ended FAILED (Failed Messages).",
            ),
            delivery_latency: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        DELIVERY_LATENCY_SECONDS,
                        "Event commit to the 2xx of its Delivery.",
                    )
                    .buckets(
                        LATENCY_BUCKETS
                            .iter()
                            .copied()
                            .chain([60.0, 300.0, 3600.0])
                            .collect(),
                    ),
                )
                .expect("valid metric"),
            ),
            bad_hints: counter(
                BAD_HINTS_TOTAL,
                "Kafka messages that could not be decoded (skipped).",
            ),
            deferrals: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        DEFERRALS_TOTAL,
                        "Claimed Deliveries put back without an Attempt, by reason.",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            ordering_gap_timeouts: counter(
                ORDERING_GAP_TIMEOUT_TOTAL,
                "Ordered Deliveries that went without a stuck predecessor after the gap timeout.",
            ),
            ordering_released: counter(
                ORDERING_RELEASED_TOTAL,
                "Parked ordered Deliveries released through the Outbox when a predecessor resolved.",
            ),
            ordering_handoffs: counter(
                ORDERING_HANDOFFS_TOTAL,
                "Released ordered Deliveries the releasing worker claimed and delivered itself (no trip through the relay).",
            ),
            breaker_transitions: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        BREAKER_TRANSITIONS_TOTAL,
                        "Circuit-breaker state changes, by the state entered.",
                    ),
                    &["state"],
                )
                .expect("valid metric"),
            ),
            endpoint_breakers: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        ENDPOINT_BREAKERS,
                        "Live endpoints by circuit-breaker state.",
                    ),
                    &["state"],
                )
                .expect("valid metric"),
            ),
            limits_unavailable: counter(
                LIMITS_UNAVAILABLE_TOTAL,
                "Deliveries sent without the breaker and limit checks because Redis did not answer.",
            ),
            retry_backlog: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        RETRY_BACKLOG,
                        "PENDING Deliveries with a retry scheduled, and those already due (refreshed by the sweeps).",
                    ),
                    &["state"],
                )
                .expect("valid metric"),
            ),
            consumer_lag: reg(
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
                GROUP_REJOINS_TOTAL,
                "Consumer-group rejoins forced by partitions left unread (a broker that kept a dead member's partitions assigned).",
            ),
            rebalances: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        REBALANCES_TOTAL,
                        "Consumer-group rebalances this worker went through, by kind.",
                    ),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            hints_waiting: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        HINTS_WAITING,
                        "Hints read and not yet claimed, waiting for an in-flight permit, by lane.",
                    ),
                    &["lane"],
                )
                .expect("valid metric"),
            ),
            dozing: reg(
                &r,
                IntGauge::new(
                    DOZING,
                    "1 while this worker dozes (idle, its partitions paused until the doorbell rings).",
                )
                .expect("valid metric"),
            ),
            wakes: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        WAKES_TOTAL,
                        "Times this dozing worker woke, by reason (missed_ring: the doorbell did not reach it).",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            express_hints: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        EXPRESS_HINTS_TOTAL,
                        "Express hints heard from the doorbell, by outcome (queued: claimed without waiting for Kafka).",
                    ),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            attempt_duration: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        ATTEMPT_DURATION_SECONDS,
                        "Time from an Attempt's request to its response (or error), by result.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["result"],
                )
                .expect("valid metric"),
            ),
            deliveries_final: railhook_common::metrics_http::deliveries_final(&r),
            internal_errors: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        INTERNAL_ERRORS_TOTAL,
                        "Railhook's own failures on the delivery path (not the receiver's), by kind.",
                    ),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            oldest_due_retry_age: reg(
                &r,
                IntGauge::new(
                    OLDEST_DUE_RETRY_AGE_SECONDS,
                    "Seconds the oldest due retry has waited past its time (refreshed by the sweeps).",
                )
                .expect("valid metric"),
            ),
            oldest_unclaimed_age: reg(
                &r,
                IntGauge::new(
                    OLDEST_UNCLAIMED_AGE_SECONDS,
                    "Age in seconds of the oldest PENDING Delivery never tried yet (refreshed by the sweeps).",
                )
                .expect("valid metric"),
            ),
            registry: r,
        };
        for result in ATTEMPT_RESULTS {
            m.attempt_duration.with_label_values(&[result]);
        }
        for outcome in ["succeeded", "failed"] {
            m.deliveries_final.with_label_values(&[outcome]);
        }
        for kind in INTERNAL_ERROR_KINDS {
            m.internal_errors.with_label_values(&[kind]);
        }
        for kind in REBALANCE_KINDS {
            m.rebalances.with_label_values(&[kind]);
        }
        for lane in LANES {
            m.hints_waiting.with_label_values(&[lane]);
        }
        for state in ["scheduled", "due"] {
            m.retry_backlog.with_label_values(&[state]);
        }
        for outcome in EXPRESS_OUTCOMES {
            m.express_hints.with_label_values(&[outcome]);
        }
        for reason in WAKE_REASONS {
            m.wakes.with_label_values(&[reason]);
        }
        for reason in DEFERRAL_REASONS {
            m.deferrals.with_label_values(&[reason]);
        }
        for state in BREAKER_STATES {
            m.breaker_transitions.with_label_values(&[state]);
            m.endpoint_breakers.with_label_values(&[state]);
        }
        for o in OUTCOMES {
            m.attempts.with_label_values(&[o]);
        }
        for s in ["processing", "stranded", "missed_hint"] {
            m.swept.with_label_values(&[s]);
        }
        m
    }
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self::new()
    }
}
