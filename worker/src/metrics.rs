//! Worker metrics: names, help texts and label sets in one place. No ids as labels.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

pub const ATTEMPTS_TOTAL: &str = "railhook_worker_attempts_total";
pub const CLAIM_MISSES_TOTAL: &str = "railhook_worker_claim_misses_total";
pub const FENCE_REJECTIONS_TOTAL: &str = "railhook_worker_fence_rejections_total";
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

/// `kind` label values of [`REBALANCES_TOTAL`].
pub const REBALANCE_KINDS: [&str; 3] = ["assign", "revoke", "error"];
/// `lane` label values of [`HINTS_WAITING`] (see `lanes.rs`).
pub const LANES: [&str; 2] = ["fresh", "retry"];

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
    pub fence_rejections: IntCounter,
    pub endpoints_disabled: IntCounter,
    pub retries_published: IntCounter,
    /// `sweep`: `processing` or `stranded`.
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
            claim_misses: counter(
                CLAIM_MISSES_TOTAL,
                "Hints whose Claim matched nothing (a duplicate, or a Delivery not due).",
            ),
            fence_rejections: counter(
                FENCE_REJECTIONS_TOTAL,
                "Outcomes refused by the Fence: the worker had lost its Claim.",
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
                    .buckets(vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0, 3600.0,
                    ]),
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
            registry: r,
        };
        for kind in REBALANCE_KINDS {
            m.rebalances.with_label_values(&[kind]);
        }
        for lane in LANES {
            m.hints_waiting.with_label_values(&[lane]);
        }
        for state in ["scheduled", "due"] {
            m.retry_backlog.with_label_values(&[state]);
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
        for s in ["processing", "stranded"] {
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
