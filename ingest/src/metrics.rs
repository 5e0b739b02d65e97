//! Ingest metrics: every name, help text and label set in one place. Labels take values from
//! small fixed sets (route templates, status classes), never ids.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use railhook_common::metrics_http::{FinalOutcome, counter, register};

pub const HTTP_REQUESTS_TOTAL: &str = "railhook_http_requests_total";
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "railhook_http_request_duration_seconds";
pub const EVENTS_CREATED_TOTAL: &str = "railhook_ingest_events_created_total";
pub const DELIVERIES_CREATED_TOTAL: &str = "railhook_ingest_deliveries_created_total";
pub const IDEMPOTENT_REPLAYS_TOTAL: &str = "railhook_ingest_idempotent_replays_total";
pub const PAYLOADS_EXPUNGED_TOTAL: &str = "railhook_ingest_payloads_expunged_total";
pub const QUOTA_CHARGE_SKIPPED_TOTAL: &str = "railhook_quota_charge_skipped_total";
pub const QUOTA_REJECTED_TOTAL: &str = "railhook_quota_rejected_total";
pub const INCOMING_RECEIVED_TOTAL: &str = "railhook_incoming_received_total";
pub const INCOMING_REJECTED_TOTAL: &str = "railhook_incoming_rejected_total";
pub const GROUP_COMMIT_EVENTS: &str = "railhook_ingest_group_commit_events";
pub const GROUP_COMMIT_WAITING: &str = "railhook_ingest_group_commit_waiting";
pub const GROUP_COMMIT_RETRIED_TOTAL: &str = "railhook_ingest_group_commit_retried_total";
pub const GROUP_COMMIT_ABANDONED_TOTAL: &str = "railhook_ingest_group_commit_abandoned_total";
pub const FILTER_TABLES_RESENT_TOTAL: &str = "railhook_ingest_filter_tables_resent_total";
pub const SEQUENCE_ASSIGNMENT_FAILED_TOTAL: &str =
    "railhook_ingest_sequence_assignment_failed_total";

#[derive(Clone)]
pub struct IngestMetrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub events_created: IntCounter,
    pub deliveries_created: IntCounter,
    pub idempotent_replays: IntCounter,
    /// `DELETE /v1/events/{id}/payload` calls that found their Event.
    pub payloads_expunged: IntCounter,
    /// `railhook_deliveries_final_total`; the ingest counts `expunged` (Deliveries its
    /// payload expunge ended FAILED), the worker the rest.
    pub deliveries_final: IntCounterVec,
    /// Labelled by `stage`: `check` (the reservation), `refund` (Events reserved and not created)
    /// or `charge` (after the commit, when the reservation could not be made).
    pub quota_charge_skipped: IntCounterVec,
    pub quota_rejected: IntCounter,
    pub sequence_assignment_failed: IntCounter,
    /// Events per single-Event ingest statement (group_commit.rs): 1 while a writer is free,
    /// more when requests waited for one.
    pub group_events: Histogram,
    /// Single-Event requests waiting for a free writer.
    pub group_waiting: IntGauge,
    /// `railhook listen` sessions connected to this instance (crate::listen).
    pub listen_sessions: IntGauge,
    /// Group statements that failed and were written again one request at a time.
    pub group_retried: IntCounter,
    /// Queued requests left out of their statement because their caller had gone (timed out
    /// at the API, or hung up): nothing was written for them.
    pub group_abandoned: IntCounter,
    /// Single-Event statements that named stored filter tables Postgres did not have (SQLSTATE
    /// RH001, migration 20261206000028) and were written again with the tables' texts.
    pub filter_tables_resent: IntCounter,
    /// `provider`, `result`: `accepted` or `duplicate`.
    pub incoming_received: IntCounterVec,
    /// `provider`, `reason`: `missing`, `malformed`, `mismatch` or `stale`.
    pub incoming_rejected: IntCounterVec,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let family = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, family)
}

impl IngestMetrics {
    #[allow(clippy::expect_used)] // names are constants: a failure is a programming error
    #[allow(
        clippy::too_many_lines,
        reason = "a declarative table: one entry per metric"
    )]
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                HTTP_REQUEST_DURATION_SECONDS,
                "Time to answer an API request, by route template.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5,
                5.0,
            ]),
            &["route"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(http_duration.clone()))
            .expect("unique metric");
        let group_events = Histogram::with_opts(
            HistogramOpts::new(
                GROUP_COMMIT_EVENTS,
                "Events written by one single-Event ingest statement (group commit).",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )
        .expect("valid metric");
        registry
            .register(Box::new(group_events.clone()))
            .expect("unique metric");
        Self {
            http_requests: counter_vec(
                &registry,
                HTTP_REQUESTS_TOTAL,
                "API requests answered, by route template, method and status class.",
                &["route", "method", "status"],
            ),
            http_duration,
            events_created: counter(&registry, EVENTS_CREATED_TOTAL, "Events committed."),
            deliveries_created: counter(
                &registry,
                DELIVERIES_CREATED_TOTAL,
                "Deliveries (and their Outbox rows) committed with new Events.",
            ),
            payloads_expunged: counter(
                &registry,
                PAYLOADS_EXPUNGED_TOTAL,
                "Event payloads expunged through the API (each call that found its Event).",
            ),
            idempotent_replays: counter(
                &registry,
                IDEMPOTENT_REPLAYS_TOTAL,
                "Requests answered with an Event already created under the same Idempotency-Key.",
            ),
            quota_charge_skipped: counter_vec(
                &registry,
                QUOTA_CHARGE_SKIPPED_TOTAL,
                "Quota reservations, refunds or charges skipped because Redis did not answer in time.",
                &["stage"],
            ),
            quota_rejected: counter(
                &registry,
                QUOTA_REJECTED_TOTAL,
                "Ingest requests refused with 429 because the monthly quota is used up.",
            ),
            group_events,
            group_waiting: {
                let g = IntGauge::new(
                    GROUP_COMMIT_WAITING,
                    "Single-Event ingest requests waiting for a free writer (group commit).",
                )
                .expect("valid metric");
                registry
                    .register(Box::new(g.clone()))
                    .expect("unique metric");
                g
            },
            listen_sessions: {
                let g = IntGauge::new(
                    "railhook_listen_sessions",
                    "railhook listen sessions connected to this instance.",
                )
                .expect("valid metric");
                registry
                    .register(Box::new(g.clone()))
                    .expect("unique metric");
                g
            },
            group_retried: counter(
                &registry,
                GROUP_COMMIT_RETRIED_TOTAL,
                "Group ingest statements that failed and were written again one request at a time.",
            ),
            filter_tables_resent: counter(
                &registry,
                FILTER_TABLES_RESENT_TOTAL,
                "Single-Event ingest statements that named stored filter tables Postgres did not have, written again with their texts.",
            ),
            group_abandoned: counter(
                &registry,
                GROUP_COMMIT_ABANDONED_TOTAL,
                "Queued single-Event requests not written because their caller had gone.",
            ),
            sequence_assignment_failed: counter(
                &registry,
                SEQUENCE_ASSIGNMENT_FAILED_TOTAL,
                "Post-commit Sequence Number assignments that failed (the worker assigns later).",
            ),
            incoming_received: counter_vec(
                &registry,
                INCOMING_RECEIVED_TOTAL,
                "Provider webhooks with a valid signature, by provider and result (accepted or duplicate).",
                &["provider", "result"],
            ),
            incoming_rejected: counter_vec(
                &registry,
                INCOMING_REJECTED_TOTAL,
                "Provider webhooks refused with 401 before anything was stored, by provider and reason.",
                &["provider", "reason"],
            ),
            deliveries_final: railhook_common::metrics_http::deliveries_final(
                &registry,
                &[FinalOutcome::Expunged],
            ),
            registry,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// Registries in Prometheus text format (one process may hold several roles).
pub fn render(registries: &[&Registry]) -> String {
    String::from_utf8(railhook_common::metrics_http::render(registries)).unwrap_or_default()
}

impl IngestMetrics {
    /// This registry in Prometheus text format.
    pub fn render(&self) -> String {
        render(&[&self.registry])
    }
}

impl Default for IngestMetrics {
    fn default() -> Self {
        Self::new()
    }
}
