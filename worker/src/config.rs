//! The worker's settings, read from `Settings`, and the errors that stop it.

use std::time::Duration;

use railhook_common::config::{ConfigError, Settings};
use railhook_common::kafka::{self, KafkaConnection};
use railhook_common::retry::Ladder;
use rdkafka::error::KafkaError;

use crate::attempt::ClientError;
use crate::fence;
use crate::limits::BreakerPolicy;
use crate::ssrf::BadCidr;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub kafka: KafkaConnection,
    pub deliveries_topic: String,
    pub retries_topic: String,
    pub group: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub max_in_flight: usize,
    /// Statements writing successful outcomes at once (successes.rs); 0: each on its own.
    pub outcome_writers: usize,
    pub outgoing: Ladder,
    pub incoming: Ladder,
    pub scheduler_interval: Duration,
    pub sweep_interval: Duration,
    pub processing_timeout: Duration,
    pub endpoint_timeout_max: Duration,
    /// librdkafka's `max.poll.interval.ms`: a member that does not poll for this long is
    /// taken out of the group.
    pub max_poll_interval: Duration,
    /// `fetch.wait.max.ms` of the consumer (`RAILHOOK_KAFKA_FETCH_WAIT_MS`).
    pub fetch_wait: Duration,
    /// How long a worker told to stop lets its running Attempts finish.
    pub drain_timeout: Duration,
    pub stranded_after: Duration,
    /// See [`crate::group_watch`]; `None` turns the guard off.
    pub stall_rejoin_after: Option<Duration>,
    /// How long a worker that read nothing and heard no doorbell stays awake before it
    /// pauses its partitions (`RAILHOOK_WORKER_DOZE_AFTER_MS`); `None`: never doze.
    pub doze_after: Option<Duration>,
    /// Claim from the doorbell's express hints (`RAILHOOK_WORKER_EXPRESS_HINTS`).
    pub express_hints: bool,
    pub allow_private_targets: String,
    /// Endpoint TLS and the egress proxy (transport/http.rs, transport/tunnel.rs).
    pub egress: crate::transport::http::EgressConfig,
    pub message_timeout: Duration,
    pub redis: railhook_common::redis_client::RedisClient,
    pub breaker: BreakerPolicy,
    pub ordering_gap_timeout: Duration,
    pub deferral_max: Duration,
    /// worker/src/retry_policy.rs: the shortest wait after a timeout or a 429.
    pub overload_floor: Duration,
    pub streak: fence::StreakPolicy,
    /// Opens the endpoints' sealed signing secrets (common/src/sealing.rs).
    pub keyring: railhook_common::sealing::Keyring,
}

impl WorkerConfig {
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        // Settings::load checks this too; settings built in code reach here unchecked.
        if let Some(problem) = s.processing_timeout_problem() {
            return Err(ConfigError::Invalid {
                field: "processing_timeout_seconds",
                problem,
            });
        }
        Ok(Self {
            kafka: s.kafka(),
            deliveries_topic: kafka::deliveries_topic(&s.topic_prefix),
            retries_topic: kafka::retries_topic(&s.topic_prefix),
            group: s.worker_group.clone(),
            partitions: s.kafka_partitions,
            replication_factor: s.kafka_replication_factor,
            max_in_flight: s.worker_max_in_flight,
            // Each writer holds a connection while its statement runs.
            outcome_writers: s.worker_outcome_writers.min(s.db_max_connections) as usize,
            outgoing: s.outgoing_ladder(),
            incoming: s.incoming_ladder(),
            scheduler_interval: Duration::from_millis(s.retry_scheduler_ms),
            sweep_interval: Duration::from_millis(s.sweep_ms),
            processing_timeout: Duration::from_secs(s.processing_timeout_seconds),
            endpoint_timeout_max: Duration::from_millis(s.endpoint_timeout_max_ms),
            max_poll_interval: Duration::from_millis(s.worker_max_poll_interval_ms),
            fetch_wait: Duration::from_millis(s.kafka_fetch_wait_ms),
            drain_timeout: Duration::from_secs(s.worker_drain_seconds),
            stranded_after: Duration::from_secs(s.stranded_after_seconds),
            stall_rejoin_after: (s.worker_stall_rejoin_seconds > 0)
                .then(|| Duration::from_secs(s.worker_stall_rejoin_seconds)),
            doze_after: (s.worker_doze_after_ms > 0)
                .then(|| Duration::from_millis(s.worker_doze_after_ms)),
            express_hints: s.worker_express_hints,
            allow_private_targets: s.allow_private_targets.clone(),
            egress: crate::transport::http::EgressConfig {
                ca_file: s.egress_ca_file.clone(),
                proxy: s
                    .egress_proxy
                    .as_ref()
                    .map(|p| secrecy::ExposeSecret::expose_secret(p).to_owned()),
            },
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
            overload_floor: Duration::from_millis(s.retry_overload_floor_ms),
            streak: fence::StreakPolicy {
                disable_after: Duration::from_secs(s.endpoint_disable_after_seconds),
                min_failures: s.endpoint_disable_min_failures,
                failing_after: s.operational_failing_after,
            },
            keyring: s.keyring(),
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
