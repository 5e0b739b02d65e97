//! Worker metrics: names, help texts and label sets in one place. No ids as labels.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

pub const ATTEMPTS_TOTAL: &str = "railhook_worker_attempts_total";
pub const CLAIM_MISSES_TOTAL: &str = "railhook_worker_claim_misses_total";
pub const FENCE_REJECTIONS_TOTAL: &str = "railhook_worker_fence_rejections_total";
pub const RETRIES_SCHEDULED_TOTAL: &str = "railhook_worker_retries_published_total";
pub const SWEPT_TOTAL: &str = "railhook_worker_swept_total";
pub const FAILED_MESSAGES_TOTAL: &str = "railhook_worker_failed_messages_total";
pub const DELIVERY_LATENCY_SECONDS: &str = "railhook_worker_delivery_latency_seconds";
pub const BAD_HINTS_TOTAL: &str = "railhook_worker_bad_hints_total";

/// `outcome` label values of [`ATTEMPTS_TOTAL`].
pub const OUTCOMES: [&str; 3] = ["succeeded", "retry", "failed"];

#[derive(Clone)]
pub struct WorkerMetrics {
    pub registry: Registry,
    pub attempts: IntCounterVec,
    pub claim_misses: IntCounter,
    pub fence_rejections: IntCounter,
    pub retries_published: IntCounter,
    /// `sweep`: `processing` or `stranded`.
    pub swept: IntCounterVec,
    pub failed_messages: IntCounter,
    pub delivery_latency: Histogram,
    pub bad_hints: IntCounter,
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
            registry: r,
        };
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
