//! The settings that say how to reach Postgres, Kafka and Redis, read into the values every
//! connection is built from (`PostgresTarget`, `KafkaConnection`, `RedisClient`), and the
//! lenient string readers their secrets and names need.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::{ConfigError, Settings, invalid};
use crate::kafka::{KafkaConnection, KafkaSecurity};
use crate::postgres_url::PostgresTarget;

/// A string setting. Figment types environment values, so a numeric password or user name
/// (`KAFKA_SASL_PASSWORD=123456`) arrives as a number and must still read as text.
#[derive(Deserialize)]
#[serde(untagged)]
enum Lenient {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Lenient {
    fn into_string(self) -> String {
        match self {
            Lenient::Text(s) => s,
            Lenient::Int(n) => n.to_string(),
            Lenient::Float(f) => f.to_string(),
            Lenient::Bool(b) => b.to_string(),
        }
    }
}

pub(super) fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Lenient::deserialize(d)?.into_string())
}

pub(super) fn opt_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Lenient>::deserialize(d)?.map(Lenient::into_string))
}

pub(super) fn opt_secret<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SecretString>, D::Error> {
    Ok(opt_text(d)?.map(SecretString::from))
}

impl Settings {
    /// How every Kafka client reaches the brokers: the security settings checked at load,
    /// with `kafka_brokers` as it is now (tests point a loaded `Settings` at another broker).
    pub fn kafka(&self) -> KafkaConnection {
        self.kafka_checked.clone().with_brokers(&self.kafka_brokers)
    }

    /// The pools' Postgres, parsed (validated at load, so this cannot fail afterwards
    /// unless a certificate file was removed since).
    pub fn postgres(&self) -> Result<PostgresTarget, ConfigError> {
        PostgresTarget::parse(&self.database_url)
            .map_err(|e| invalid("database_url", e.to_string()))
    }

    /// The relay's Postgres (replication stream and control connection).
    pub fn replication_postgres(&self) -> Result<PostgresTarget, ConfigError> {
        match &self.replication_database_url {
            Some(url) => PostgresTarget::parse(url)
                .map_err(|e| invalid("replication_database_url", e.to_string())),
            None => self.postgres(),
        }
    }

    /// Every Kafka client's connection settings, checked.
    pub(super) fn kafka_connection(&self) -> Result<KafkaConnection, ConfigError> {
        let security = KafkaSecurity {
            protocol: &self.kafka_security_protocol,
            ca_location: self.kafka_ssl_ca_location.as_deref(),
            certificate_location: self.kafka_ssl_certificate_location.as_deref(),
            key_location: self.kafka_ssl_key_location.as_deref(),
            key_password: self
                .kafka_ssl_key_password
                .as_ref()
                .map(|s| s.expose_secret()),
            sasl_mechanism: self.kafka_sasl_mechanism.as_deref(),
            sasl_username: self.kafka_sasl_username.as_deref(),
            sasl_password: self.kafka_sasl_password.as_ref().map(|s| s.expose_secret()),
            properties_file: self.kafka_properties.as_deref(),
        };
        KafkaConnection::new(&self.kafka_brokers, &security).map_err(|e| ConfigError::Invalid {
            field: "kafka",
            problem: e.to_string(),
        })
    }

    /// The Redis client for `redis_url`, with the CA and client certificate settings.
    #[cfg(feature = "redis")]
    pub fn redis_client(&self) -> Result<crate::redis_client::RedisClient, ConfigError> {
        crate::redis_client::redis_client(
            &self.redis_url,
            &crate::redis_client::RedisTls {
                ca_file: self.redis_ca_file.clone(),
                client_cert_file: self.redis_client_cert_file.clone(),
                client_key_file: self.redis_client_key_file.clone(),
            },
            self.redis_cluster,
        )
        .map_err(|e| invalid("redis_url", e.to_string()))
    }
}
