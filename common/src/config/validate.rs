//! The checks a loaded `Settings` must pass before any role starts: each failure names its
//! setting.

use std::time::Duration;

use secrecy::ExposeSecret;

use super::{ConfigError, Settings, invalid};

/// What the processing timeout keeps beyond the largest endpoint timeout: the moments between
/// a Claim's stamp and its request's start, and the finalise after the response.
pub const PROCESSING_MARGIN: Duration = Duration::from_secs(5);

impl Settings {
    /// Why the processing timeout is unsafe, if it is. The sweep takes back a Claim older
    /// than the processing timeout; the worker stamps a Claim right before its request
    /// starts (or re-stamps it through the Fence), so a request that runs its full endpoint
    /// timeout and the finalise after it must end inside the window, with
    /// [`PROCESSING_MARGIN`] to spare. A window no larger than that lets the sweep hand a
    /// Delivery to a second worker while the first one's request is still in flight: the
    /// same `webhook-id` goes out twice.
    pub fn processing_timeout_problem(&self) -> Option<String> {
        if !(1_000..=3_600_000).contains(&self.endpoint_timeout_max_ms) {
            return Some("endpoint_timeout_max_ms must be between 1000 and 3600000".into());
        }
        let needed = Duration::from_millis(self.endpoint_timeout_max_ms) + PROCESSING_MARGIN;
        (Duration::from_secs(self.processing_timeout_seconds) <= needed).then(|| {
            format!(
                "must be larger than endpoint_timeout_max_ms ({} ms) plus {} s, i.e. at least {} s",
                self.endpoint_timeout_max_ms,
                PROCESSING_MARGIN.as_secs(),
                needed.as_secs() + 1
            )
        })
    }

    /// Every setting's check, by concern: where it connects, who may call, how much it takes
    /// on, and how Deliveries are retried and given up.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_connections()?;
        self.validate_access()?;
        self.validate_sso()?;
        self.validate_capacity()?;
        self.validate_delivery()
    }

    /// Postgres, Redis, Kafka, the Slot's and publication's names, the public URL.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        self.postgres()?;
        self.replication_postgres()?;
        // Only a build that can talk to Redis checks its URL (the relay's alone has no client;
        // every binary that runs the ingest or the worker has one).
        #[cfg(feature = "redis")]
        self.redis_client()?;
        if self.kafka_brokers.trim().is_empty() {
            return Err(invalid("kafka_brokers", "must name at least one host:port"));
        }
        for (field, value) in [("slot", &self.slot), ("publication", &self.publication)] {
            let ok = !value.is_empty()
                && value.len() <= 63
                && value
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(invalid(
                    field,
                    "must be 1-63 characters of a-z, 0-9 and '_'",
                ));
            }
        }
        self.validate_public_url()
    }

    /// Retention and the limits on what one request, batch or process takes on.
    fn validate_capacity(&self) -> Result<(), ConfigError> {
        let shortest = crate::retention::minimum_days();
        if self.retention_days < shortest {
            return Err(invalid(
                "retention_days",
                format!(
                    "must be at least {shortest}: the longest retry horizon (96 h) and a day's margin"
                ),
            ));
        }
        if !(10..=86_400).contains(&self.retention_interval_seconds) {
            return Err(invalid(
                "retention_interval_seconds",
                "must be between 10 and 86400",
            ));
        }
        if self.max_payload_bytes == 0 {
            return Err(invalid("max_payload_bytes", "must be greater than 0"));
        }
        if !(1..=3600).contains(&self.http_header_timeout_seconds) {
            return Err(invalid(
                "http_header_timeout_seconds",
                "must be between 1 and 3600",
            ));
        }
        if !(1..=10_000).contains(&self.max_batch_size) {
            return Err(invalid("max_batch_size", "must be between 1 and 10000"));
        }
        if !(1..=10_000).contains(&self.kafka_partitions) {
            return Err(invalid("kafka_partitions", "must be between 1 and 10000"));
        }
        if !(1..=16).contains(&self.kafka_replication_factor) {
            return Err(invalid(
                "kafka_replication_factor",
                "must be between 1 and 16",
            ));
        }
        if self.relay_max_in_flight == 0 || self.relay_max_in_flight_bytes < 64 * 1024 {
            return Err(invalid(
                "relay_max_in_flight",
                "must be at least 1 message and relay_max_in_flight_bytes at least 65536",
            ));
        }
        if !(1..=5_000).contains(&self.kafka_fetch_wait_ms) {
            return Err(invalid(
                "kafka_fetch_wait_ms",
                "must be between 1 and 5000 (below the consumer's session timeout)",
            ));
        }
        if self.worker_doze_after_ms != 0 && !(1_000..=600_000).contains(&self.worker_doze_after_ms)
        {
            return Err(invalid(
                "worker_doze_after_ms",
                "must be 0 (never doze) or between 1000 and 600000",
            ));
        }
        if self.relay_heartbeat_ms < 10 || self.relay_status_ms < 10 {
            return Err(invalid(
                "relay_heartbeat_ms",
                "intervals must be at least 10 ms",
            ));
        }
        Ok(())
    }

    /// The retry ladders, the processing window, the worker's limits, the breaker and the
    /// endpoint-disable policy.
    fn validate_delivery(&self) -> Result<(), ConfigError> {
        for (field, raw) in [
            ("retry_outgoing_delays", &self.retry_outgoing_delays),
            ("retry_incoming_delays", &self.retry_incoming_delays),
        ] {
            if let Err(e) = crate::retry::RetryDelays::parse(raw) {
                return Err(invalid(field, e.to_string()));
            }
        }
        if self.retry_outgoing_max_attempts == 0 || self.retry_incoming_max_attempts == 0 {
            return Err(invalid(
                "retry_outgoing_max_attempts",
                "attempt counts must be at least 1",
            ));
        }
        if let Some(problem) = self.processing_timeout_problem() {
            return Err(invalid("processing_timeout_seconds", problem));
        }
        if !(10_000..=3_600_000).contains(&self.worker_max_poll_interval_ms) {
            return Err(invalid(
                "worker_max_poll_interval_ms",
                "must be between 10000 (the session timeout) and 3600000",
            ));
        }
        if self.worker_max_in_flight == 0 {
            return Err(invalid("worker_max_in_flight", "must be at least 1"));
        }
        if self.db_max_connections == 0 {
            return Err(invalid("db_max_connections", "must be greater than 0"));
        }
        if !(self.breaker_failure_rate > 0.0 && self.breaker_failure_rate <= 1.0) {
            return Err(invalid(
                "breaker_failure_rate",
                "must be above 0 and at most 1",
            ));
        }
        if self.breaker_consecutive_failures == 0 || self.breaker_min_requests == 0 {
            return Err(invalid(
                "breaker_consecutive_failures",
                "and breaker_min_requests must be at least 1",
            ));
        }
        if self.breaker_window_seconds == 0 || self.deferral_max_seconds == 0 {
            return Err(invalid(
                "breaker_window_seconds",
                "and deferral_max_seconds must be at least 1",
            ));
        }
        if self.endpoint_disable_min_failures == 0
            || self.dashboard_session_seconds == 0
            || self.operational_failing_after == 0
        {
            return Err(invalid(
                "endpoint_disable_min_failures",
                "dashboard_session_seconds and operational_failing_after must be at least 1",
            ));
        }
        if self.listen_idle_seconds == 0 {
            return Err(invalid("listen_idle_seconds", "must be at least 1"));
        }
        Ok(())
    }

    /// Who may call: the admin tokens and where `/metrics` is served.
    fn validate_access(&self) -> Result<(), ConfigError> {
        if let Some(token) = &self.admin_token
            && token.expose_secret().len() < 16
        {
            return Err(invalid("admin_token", "must be at least 16 characters"));
        }
        if self.api_metrics == Some(true) && self.metrics_token.is_none() {
            return Err(invalid(
                "api_metrics",
                "true needs RAILHOOK_METRICS_TOKEN: the API port is public, and /metrics there must ask for a token (or leave api_metrics unset or false: the metrics port serves it)",
            ));
        }
        if let Some(token) = &self.admin_token_previous
            && token.expose_secret().len() < 16
        {
            return Err(invalid(
                "admin_token_previous",
                "must be at least 16 characters",
            ));
        }
        Ok(())
    }

    /// The URL links and the portal are built from, and where workers reach this instance
    /// for `railhook listen` relays.
    fn validate_public_url(&self) -> Result<(), ConfigError> {
        base_url(
            "listen_relay_url",
            self.listen_relay_url.as_deref(),
            "http://10.0.3.7:8080",
        )?;
        base_url(
            "public_url",
            self.public_url.as_deref(),
            "https://hooks.example.com",
        )
    }
}

/// A base URL setting, if set: absolute http(s), with a host, no query, no credentials.
fn base_url(field: &'static str, raw: Option<&str>, example: &str) -> Result<(), ConfigError> {
    let ok = raw.is_none_or(|raw| {
        url::Url::parse(raw).is_ok_and(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host_str().is_some()
                && u.query().is_none()
                && u.username().is_empty()
        })
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("must be an absolute http(s) URL without a query, like {example}"),
        ))
    }
}
