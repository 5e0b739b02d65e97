//! The relay's settings: which Postgres (replication stream and control connection, with
//! the TLS of its URL), which brokers and topic, and the window and timers.

use std::time::Duration;

use pgwire_replication::{SslMode, TlsConfig};
use railhook_common::config::{ConfigError, Settings};
use railhook_common::kafka::KafkaConnection;
use railhook_common::postgres_url::{self, PostgresTarget, RootCerts};

use railhook_common::kafka as producer;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The replication stream's and the control connection's Postgres
    /// (`RAILHOOK_REPLICATION_DATABASE_URL`, else `DATABASE_URL`).
    pub postgres: PostgresTarget,
    pub kafka: KafkaConnection,
    pub slot: String,
    pub publication: String,
    pub topic: String,
    pub partitions: i32,
    /// Express hints at read time (`RELAY_EXPRESS_AT_READ`), unless `KAFKA_PROPERTIES` names
    /// a partitioner other than librdkafka's default, which the relay cannot foresee.
    pub express_at_read: bool,
    pub replication_factor: i32,
    pub message_timeout: Duration,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub heartbeat_interval: Duration,
    pub status_interval: Duration,
    pub outbox_retention: Duration,
    /// How long a relay told to stop waits for its last acks (see [`crate::run`]).
    pub drain_timeout: Duration,
}

impl RelayConfig {
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        let postgres = s.replication_postgres()?;
        // pgwire-replication checks a verify-full certificate only against a host *name*:
        // an IP address there is refused at every connect. Say so once, at start.
        if postgres.ssl_mode == postgres_url::SslMode::VerifyFull
            && postgres.host.parse::<std::net::IpAddr>().is_ok()
        {
            return Err(ConfigError::Invalid {
                field: if s.replication_database_url.is_some() {
                    "replication_database_url"
                } else {
                    "database_url"
                },
                problem: format!(
                    "uses sslmode=verify-full with the IP address {}: the replication stream \
                     verifies host names only; use the name in the server's certificate",
                    postgres.host
                ),
            });
        }
        Ok(Self {
            postgres,
            kafka: s.kafka(),
            slot: s.slot.clone(),
            publication: s.publication.clone(),
            topic: producer::deliveries_topic(&s.topic_prefix),
            partitions: s.kafka_partitions,
            express_at_read: s.relay_express_at_read
                && s.kafka()
                    .property("partitioner")
                    .is_none_or(|p| p == "consistent_random"),
            replication_factor: s.kafka_replication_factor,
            message_timeout: Duration::from_millis(s.kafka_message_timeout_ms),
            max_in_flight: s.relay_max_in_flight,
            max_in_flight_bytes: s.relay_max_in_flight_bytes,
            heartbeat_interval: Duration::from_millis(s.relay_heartbeat_ms),
            status_interval: Duration::from_millis(s.relay_status_ms),
            outbox_retention: Duration::from_secs(s.outbox_retention_seconds),
            drain_timeout: Duration::from_secs(s.relay_drain_seconds),
        })
    }
}

/// The replication stream's TLS, from the same parsed URL as the pools: one mode, one CA.
pub(crate) fn replication_tls(pg: &PostgresTarget) -> TlsConfig {
    railhook_common::install_crypto_provider();
    let mode = match pg.ssl_mode {
        postgres_url::SslMode::Disable => SslMode::Disable,
        postgres_url::SslMode::Prefer => SslMode::Prefer,
        postgres_url::SslMode::Require => SslMode::Require,
        postgres_url::SslMode::VerifyCa => SslMode::VerifyCa,
        postgres_url::SslMode::VerifyFull => SslMode::VerifyFull,
    };
    let mut tls = TlsConfig {
        mode,
        ca_pem_path: match &pg.root_certs {
            RootCerts::File(path) => Some(path.clone()),
            RootCerts::System => None,
        },
        ..TlsConfig::default()
    };
    if let Some((cert, key)) = &pg.client_cert {
        tls = tls.with_client_cert(cert, key);
    }
    tls
}
