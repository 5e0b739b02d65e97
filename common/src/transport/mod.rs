//! Endpoints beyond HTTP (docs/DESTINATIONS.md): what carries an endpoint's Attempts, and
//! the settings of each kind. Shared by ingest (which validates them at create time and
//! seals them) and the worker (which opens them when an Attempt is made).
//!
//! An endpoint's settings are stored twice: whole, credentials included, sealed with the
//! keyring that seals signing secrets (`endpoints.transport_secret`), and without their
//! credentials ([`TransportSettings::shown`], `endpoints.transport_settings`) for the API,
//! the dashboard and the portal. Credentials are never returned after create.

use serde::{Deserialize, Serialize};

mod checks;

/// The name an endpoint's sealed transport settings are bound to (the sealing's associated
/// data), distinct from its signing secret's, so neither sealed value opens in the other's
/// column.
pub fn sealing_id(endpoint_id: &str) -> String {
    format!("{endpoint_id}/transport")
}

pub use crate::vocabulary::TransportKind;

/// What decides a Kafka record's key, and so its partition: `endpoint` (the default: one
/// partition, so an ordered endpoint stays ordered end to end), `event_id`, `application`
/// (the endpoint's application, or the endpoint when it has none), or a JSON pointer into
/// the payload (`/customer/id`; a pointer that finds no string or number falls back to the
/// endpoint id).
pub const KAFKA_KEYS: &[&str] = &["endpoint", "event_id", "application"];

/// A Kafka topic on the receiver's cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KafkaTarget {
    /// Bootstrap brokers, `host:port` each (1–10).
    pub brokers: Vec<String>,
    pub topic: String,
    /// `endpoint` (default), `event_id`, `application`, or a JSON pointer into the payload.
    #[serde(default = "default_kafka_key")]
    pub key: String,
    /// How to reach the cluster: the same choices as Railhook's own Kafka connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<KafkaSecurity>,
}

fn default_kafka_key() -> String {
    "endpoint".to_owned()
}

/// TLS and SASL for a Kafka target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KafkaSecurity {
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub protocol: String,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (with a `sasl_` protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_mechanism: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_username: Option<String>,
    /// Write-only: sealed at rest, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_password: Option<String>,
    /// The CA certificate(s) to trust, PEM; absent: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssl_ca_pem: Option<String>,
}

/// An Amazon SQS queue (standard or FIFO).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SqsTarget {
    /// `https://sqs.<region>.amazonaws.com/<account>/<name>`; a name ending in `.fifo` is a
    /// FIFO queue (group id: the ordering key; deduplication id: the Delivery id).
    pub queue_url: String,
    pub region: String,
    pub access_key_id: String,
    /// Write-only: sealed at rest, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    /// Where the API is reached instead of `https://sqs.<region>.amazonaws.com` (a VPC
    /// endpoint, an emulator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
}

/// A RabbitMQ (AMQP 0-9-1) exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RabbitmqTarget {
    /// `amqp://user:password@host:port/vhost` or `amqps://…`; the password is sealed and
    /// shown as `***`.
    pub url: String,
    /// The exchange; `""` is the default exchange (the routing key names the queue).
    #[serde(default)]
    pub exchange: String,
    pub routing_key: String,
}

/// A NATS JetStream subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NatsTarget {
    /// `nats://[user:password@]host:port` or `tls://…`; the password is sealed and shown as
    /// `***`.
    pub url: String,
    /// A subject a JetStream stream captures (no wildcards).
    pub subject: String,
    /// Must be `true`: only JetStream acknowledges a publish (docs/DESTINATIONS.md).
    #[serde(default = "yes")]
    pub jetstream: bool,
}

fn yes() -> bool {
    true
}

/// A polling endpoint (docs/POLLING.md): nothing is sent anywhere. Its receiver reads the
/// endpoint's Deliveries in Sequence Number order through the poller routes, so its one
/// "Attempt" is the Delivery taking its place in that order. No settings; the object exists
/// so the kind travels with the sealed settings like every other kind's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PollerTarget {}

/// A `railhook listen` session's endpoint (docs/RECEIVERS.md): each Attempt is POSTed to the
/// API instance holding the session's connection, which passes it down to the developer's
/// machine and answers with the local receiver's answer. Made by the API when a session
/// opens, never from a tenant's input (the API refuses `type: listen`), so the worker sends
/// to it without the egress rule: the URL is Railhook's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ListenTarget {
    /// `<the instance's relay base URL>/v1/listen/relay/<session token>`: the token is the
    /// relay's credential, so it is sealed with the rest and never shown.
    pub relay_url: String,
}

/// An endpoint's settings for a kind other than HTTP, as sealed: `{"kafka": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum TransportSettings {
    Kafka(KafkaTarget),
    Sqs(SqsTarget),
    Rabbitmq(RabbitmqTarget),
    Nats(NatsTarget),
    Poller(PollerTarget),
    Listen(ListenTarget),
}

/// A setting that does not hold, with the field it names (`kafka.brokers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub detail: String,
}

fn invalid(field: &str, detail: impl Into<String>) -> Invalid {
    Invalid {
        field: field.to_owned(),
        detail: detail.into(),
    }
}

const MASK: &str = "***";

/// The URL-shaped name of every polling endpoint (`endpoints.url`).
pub const POLLER_URL: &str = "poller:";

/// The URL-shaped name of every `railhook listen` session's endpoint.
pub const LISTEN_URL: &str = "listen:";

impl TransportSettings {
    pub fn kind(&self) -> TransportKind {
        match self {
            TransportSettings::Kafka(_) => TransportKind::Kafka,
            TransportSettings::Sqs(_) => TransportKind::Sqs,
            TransportSettings::Rabbitmq(_) => TransportKind::Rabbitmq,
            TransportSettings::Nats(_) => TransportKind::Nats,
            TransportSettings::Poller(_) => TransportKind::Poller,
            TransportSettings::Listen(_) => TransportKind::Listen,
        }
    }

    /// Checks every setting, naming the first that does not hold.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            TransportSettings::Kafka(k) => checks::validate_kafka(k),
            TransportSettings::Sqs(s) => checks::validate_sqs(s),
            TransportSettings::Rabbitmq(r) => checks::validate_rabbitmq(r),
            TransportSettings::Nats(n) => checks::validate_nats(n),
            TransportSettings::Poller(_) => Ok(()),
            // Written by the API itself, never from input.
            TransportSettings::Listen(_) => Ok(()),
        }
    }

    /// Takes `old`'s credentials where these settings leave them out (a PATCH cannot send
    /// back what the API never returns): Kafka's `sasl_password`, SQS's
    /// `secret_access_key`, and the password of a RabbitMQ or NATS URL whose user is the
    /// same. Settings of another kind keep nothing: a credential never crosses kinds.
    ///
    /// Every kind has its own arm (issue #55): a new kind does not compile until it says
    /// what its PATCH keeps, instead of silently dropping its stored credential.
    pub fn keep_credentials_of(&mut self, old: &TransportSettings) {
        match self {
            TransportSettings::Kafka(new) => {
                let TransportSettings::Kafka(old) = old else {
                    return;
                };
                if let (Some(n), Some(o)) = (&mut new.security, &old.security)
                    && n.sasl_password.is_none()
                    && n.sasl_username == o.sasl_username
                {
                    n.sasl_password.clone_from(&o.sasl_password);
                }
            }
            TransportSettings::Sqs(new) => {
                let TransportSettings::Sqs(old) = old else {
                    return;
                };
                if new.secret_access_key.is_none() && new.access_key_id == old.access_key_id {
                    new.secret_access_key.clone_from(&old.secret_access_key);
                }
            }
            TransportSettings::Rabbitmq(new) => {
                if let TransportSettings::Rabbitmq(old) = old {
                    new.url = with_password_of(&new.url, &old.url);
                }
            }
            TransportSettings::Nats(new) => {
                if let TransportSettings::Nats(old) = old {
                    new.url = with_password_of(&new.url, &old.url);
                }
            }
            // No credentials.
            TransportSettings::Poller(_) => {}
            // Never patched: a session rewrites its own.
            TransportSettings::Listen(_) => {}
        }
    }

    /// The settings without their credentials: what is stored in the clear and shown.
    pub fn shown(&self) -> serde_json::Value {
        let mut shown = self.clone();
        match &mut shown {
            TransportSettings::Kafka(k) => {
                if let Some(s) = &mut k.security {
                    s.sasl_password = None;
                }
            }
            TransportSettings::Sqs(s) => s.secret_access_key = None,
            TransportSettings::Rabbitmq(r) => r.url = masked(&r.url),
            TransportSettings::Nats(n) => n.url = masked(&n.url),
            TransportSettings::Poller(_) => {}
            // The relay URL carries the session's token.
            TransportSettings::Listen(l) => l.relay_url = MASK.to_owned(),
        }
        let value = serde_json::to_value(&shown).unwrap_or_default();
        // `{"kafka": {…}}` → `{…}`: the kind is the endpoint's `type`.
        value
            .as_object()
            .and_then(|o| o.values().next().cloned())
            .unwrap_or_default()
    }

    /// A URL-shaped name for the target, stored in `endpoints.url` so every list and log
    /// that shows an endpoint's URL shows where it delivers (never a credential).
    pub fn display_url(&self) -> String {
        match self {
            TransportSettings::Kafka(k) => {
                format!(
                    "kafka://{}/{}",
                    k.brokers.first().map_or("", String::as_str),
                    k.topic
                )
            }
            TransportSettings::Sqs(s) => s.queue_url.clone(),
            TransportSettings::Rabbitmq(r) => {
                let base = without_credentials(&r.url);
                format!(
                    "{}#{}/{}",
                    base.trim_end_matches('/'),
                    r.exchange,
                    r.routing_key
                )
            }
            TransportSettings::Nats(n) => {
                format!(
                    "{}/{}",
                    without_credentials(&n.url).trim_end_matches('/'),
                    n.subject
                )
            }
            // Nowhere: the receiver comes to read (the poller routes name the endpoint).
            TransportSettings::Poller(_) => POLLER_URL.to_owned(),
            // Where it ends: a developer's machine, through its session.
            TransportSettings::Listen(_) => LISTEN_URL.to_owned(),
        }
    }

    /// Where the SSRF guard must look before connecting: every `host:port` this target
    /// names (the Kafka cluster's further brokers are checked as librdkafka meets them).
    pub fn hosts(&self) -> Vec<(String, u16)> {
        match self {
            TransportSettings::Kafka(k) => k.brokers.iter().filter_map(|b| host_port(b)).collect(),
            TransportSettings::Sqs(s) => {
                let url = s.endpoint_url.as_deref().unwrap_or(&s.queue_url);
                url_host(url).into_iter().collect()
            }
            TransportSettings::Rabbitmq(r) => url_host(&r.url).into_iter().collect(),
            TransportSettings::Nats(n) => url_host(&n.url).into_iter().collect(),
            // Opens no socket.
            TransportSettings::Poller(_) => Vec::new(),
            // Railhook's own API instance: not a tenant's target (see `ListenTarget`).
            TransportSettings::Listen(_) => Vec::new(),
        }
    }
}

/// `host:port` (an IPv6 literal in brackets).
pub fn host_port(raw: &str) -> Option<(String, u16)> {
    let (host, port) = raw.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_')))
    .then(|| (host.to_owned(), port))
}

fn url_host(raw: &str) -> Option<(String, u16)> {
    let url = url::Url::parse(raw).ok()?;
    let port = url.port_or_known_default().or(match url.scheme() {
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        "nats" | "tls" => Some(4222),
        _ => None,
    })?;
    let host = url
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    Some((host.to_owned(), port))
}

/// `new` with `old`'s password when `new` has none (or shows the mask) and names the same
/// user.
fn with_password_of(new: &str, old: &str) -> String {
    let (Ok(mut n), Ok(o)) = (url::Url::parse(new), url::Url::parse(old)) else {
        return new.to_owned();
    };
    let missing = n.password().is_none_or(|p| p == MASK);
    if missing && !n.username().is_empty() && n.username() == o.username() {
        let _ = n.set_password(o.password());
        return n.into();
    }
    new.to_owned()
}

fn masked(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some(MASK));
            url.into()
        }
        _ => raw.to_owned(),
    }
}

fn without_credentials(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            let _ = url.set_password(None);
            let _ = url.set_username("");
            url.into()
        }
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka() -> TransportSettings {
        TransportSettings::Kafka(KafkaTarget {
            brokers: vec!["127.0.0.1:9092".into()],
            topic: "orders".into(),
            key: "endpoint".into(),
            security: Some(KafkaSecurity {
                protocol: "sasl_ssl".into(),
                sasl_mechanism: Some("SCRAM-SHA-256".into()),
                sasl_username: Some("u".into()),
                sasl_password: Some("hunter2".into()),
                ssl_ca_pem: None,
            }),
        })
    }

    #[test]
    fn shown_settings_carry_no_credential() {
        let k = kafka();
        assert!(k.validate().is_ok());
        assert!(!k.shown().to_string().contains("hunter2"));
        let r = TransportSettings::Rabbitmq(RabbitmqTarget {
            url: "amqp://app:hunter2@mq.example.com:5672/prod".into(),
            exchange: "events".into(),
            routing_key: "orders".into(),
        });
        assert!(r.validate().is_ok());
        assert!(!r.shown().to_string().contains("hunter2"));
        assert!(!r.display_url().contains("hunter2"));
        assert!(!r.display_url().contains("app@"));
        let s = TransportSettings::Sqs(SqsTarget {
            queue_url: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo".into(),
            region: "eu-west-1".into(),
            access_key_id: "AKIAEXAMPLE".into(),
            secret_access_key: Some("hunter2".into()),
            endpoint_url: None,
        });
        assert!(s.validate().is_ok());
        assert!(!s.shown().to_string().contains("hunter2"));
        assert_eq!(
            s.hosts(),
            vec![("sqs.eu-west-1.amazonaws.com".to_owned(), 443)]
        );
    }

    #[test]
    fn each_bad_setting_names_its_field() {
        let mut bad = kafka();
        if let TransportSettings::Kafka(k) = &mut bad {
            k.brokers = vec!["no-port".into()];
        }
        assert_eq!(bad.validate().expect_err("invalid").field, "kafka.brokers");
        let n = TransportSettings::Nats(NatsTarget {
            url: "nats://127.0.0.1:4222".into(),
            subject: "orders.*".into(),
            jetstream: true,
        });
        assert_eq!(n.validate().expect_err("invalid").field, "nats.subject");
        let n = TransportSettings::Nats(NatsTarget {
            url: "nats://127.0.0.1:4222".into(),
            subject: "orders".into(),
            jetstream: false,
        });
        assert_eq!(n.validate().expect_err("invalid").field, "nats.jetstream");
        let r = TransportSettings::Rabbitmq(RabbitmqTarget {
            url: "http://mq".into(),
            exchange: String::new(),
            routing_key: "q".into(),
        });
        assert_eq!(r.validate().expect_err("invalid").field, "rabbitmq.url");
    }

    #[test]
    fn a_patch_keeps_the_credentials_it_leaves_out() {
        let old = TransportSettings::Nats(NatsTarget {
            url: "tls://app:hunter2@nats.example.com:4222".into(),
            subject: "a".into(),
            jetstream: true,
        });
        let mut same_user = TransportSettings::Nats(NatsTarget {
            url: "tls://app@nats2.example.com:4222".into(),
            subject: "b".into(),
            jetstream: true,
        });
        same_user.keep_credentials_of(&old);
        assert!(same_user.display_url().contains("nats2.example.com"));
        let TransportSettings::Nats(n) = &same_user else {
            panic!("nats");
        };
        assert_eq!(n.url, "tls://app:hunter2@nats2.example.com:4222");
        let mut other_user = TransportSettings::Nats(NatsTarget {
            url: "tls://ops@nats.example.com:4222".into(),
            subject: "a".into(),
            jetstream: true,
        });
        other_user.keep_credentials_of(&old);
        assert!(
            !serde_json::to_string(&other_user)
                .expect("json")
                .contains("hunter2")
        );
        let old_sqs = TransportSettings::Sqs(SqsTarget {
            queue_url: "https://sqs.eu-west-1.amazonaws.com/1/q".into(),
            region: "eu-west-1".into(),
            access_key_id: "AK1".into(),
            secret_access_key: Some("s1".into()),
            endpoint_url: None,
        });
        let mut new_key = old_sqs.clone();
        if let TransportSettings::Sqs(s) = &mut new_key {
            s.access_key_id = "AK2".into();
            s.secret_access_key = None;
        }
        new_key.keep_credentials_of(&old_sqs);
        assert_eq!(
            new_key
                .validate()
                .expect_err("a new key id needs its secret")
                .field,
            "sqs.secret_access_key"
        );
    }

    #[test]
    fn settings_round_trip_through_their_sealed_form() {
        let k = kafka();
        let text = serde_json::to_string(&k).expect("json");
        assert!(text.starts_with("{\"kafka\":"));
        assert_eq!(
            serde_json::from_str::<TransportSettings>(&text).expect("parse"),
            k
        );
    }
}
