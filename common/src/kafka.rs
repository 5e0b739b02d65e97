//! Kafka set-up shared by the relay and the worker: how every client reaches the brokers
//! (address, TLS, SASL, an operator's extra properties), topic names, the idempotent
//! `acks=all` producer, and topic creation.
//!
//! Every producer, consumer and admin client starts from [`KafkaConnection::client_config`],
//! so a TLS or SASL setting cannot reach one client and miss another. Properties the
//! delivery guarantees rest on are set by the code after it, and an operator's properties
//! file that names one of them is refused at start ([`GUARDED`]): an `acks=1` slipped into a
//! file would let the relay confirm an LSN for a message one broker failure can lose.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Properties an operator's file may not set, each with the setting to use instead or the
/// guarantee it protects.
pub const GUARDED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set KAFKA_BROKERS"),
    ("metadata.broker.list", "set KAFKA_BROKERS"),
    ("security.protocol", "set KAFKA_SECURITY_PROTOCOL"),
    ("ssl.ca.location", "set KAFKA_SSL_CA_LOCATION"),
    (
        "ssl.certificate.location",
        "set KAFKA_SSL_CERTIFICATE_LOCATION",
    ),
    ("ssl.key.location", "set KAFKA_SSL_KEY_LOCATION"),
    ("ssl.key.password", "set KAFKA_SSL_KEY_PASSWORD"),
    ("sasl.mechanism", "set KAFKA_SASL_MECHANISM"),
    ("sasl.mechanisms", "set KAFKA_SASL_MECHANISM"),
    ("sasl.username", "set KAFKA_SASL_USERNAME"),
    ("sasl.password", "set KAFKA_SASL_PASSWORD"),
    ("acks", "the relay confirms an LSN only after acks=all"),
    (
        "request.required.acks",
        "the relay confirms an LSN only after acks=all",
    ),
    (
        "enable.idempotence",
        "retries must not duplicate or reorder a partition",
    ),
    (
        "enable.gapless.guarantee",
        "retries must not duplicate or reorder a partition",
    ),
    (
        "max.in.flight.requests.per.connection",
        "bounded by idempotence",
    ),
    ("max.in.flight", "bounded by idempotence"),
    ("retries", "bounded by idempotence and message.timeout.ms"),
    (
        "message.send.max.retries",
        "bounded by idempotence and message.timeout.ms",
    ),
    (
        "transactional.id",
        "the relay is not a transactional producer",
    ),
    (
        "message.timeout.ms",
        "set RAILHOOK_KAFKA_MESSAGE_TIMEOUT_MS",
    ),
    (
        "delivery.timeout.ms",
        "set RAILHOOK_KAFKA_MESSAGE_TIMEOUT_MS",
    ),
    (
        "partitioner",
        "an endpoint's hints share a partition (the key)",
    ),
    ("group.id", "set RAILHOOK_WORKER_GROUP"),
    (
        "enable.auto.offset.store",
        "an offset is stored only after its Claim committed",
    ),
    (
        "enable.auto.commit",
        "an offset is stored only after its Claim committed",
    ),
    (
        "auto.offset.reset",
        "a new group must read from the earliest hint",
    ),
    (
        "isolation.level",
        "the worker reads what the relay had acknowledged",
    ),
];

/// `security.protocol` values librdkafka knows, in the spelling the docs use.
pub const SECURITY_PROTOCOLS: &[&str] = &["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
/// SASL mechanisms Railhook supports (GSSAPI and OAUTHBEARER need more than a password).
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Property names whose values are secrets: never printed.
fn is_secret(name: &str) -> bool {
    name.contains("password")
        || name.contains("secret")
        || name.ends_with(".pem")
        || name.contains("jaas")
}

/// How every Kafka client reaches the brokers. `Debug` prints secret values as `***`.
#[derive(Clone, Default)]
pub struct KafkaConnection {
    pub brokers: String,
    /// Security settings and the operator's extra properties, already validated.
    properties: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("KafkaConnection")
            .field("brokers", &self.brokers)
            .field("properties", &shown)
            .finish()
    }
}

/// What is wrong with the Kafka settings; each names the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KafkaSettingsError {
    #[error("{field} must be one of {allowed}, not '{value}'")]
    NotOneOf {
        field: &'static str,
        allowed: String,
        value: String,
    },
    #[error("{field} is required when {because}")]
    Missing {
        field: &'static str,
        because: &'static str,
    },
    #[error("{field} is only used with {with}")]
    Unused {
        field: &'static str,
        with: &'static str,
    },
    #[error("{field} names {path}, which cannot be read ({problem})")]
    Unreadable {
        field: &'static str,
        path: String,
        problem: String,
    },
    #[error("{file} line {line}: expected 'name=value'")]
    Syntax { file: String, line: usize },
    #[error("{file} sets '{name}', which Railhook sets itself: {why}")]
    Guarded {
        file: String,
        name: String,
        why: &'static str,
    },
    #[error("librdkafka refused the configuration: {0}")]
    Refused(String),
}

/// The security part of the settings, as read from the environment or the file.
#[derive(Debug, Clone, Default)]
pub struct KafkaSecurity<'a> {
    pub protocol: &'a str,
    pub ca_location: Option<&'a Path>,
    pub certificate_location: Option<&'a Path>,
    pub key_location: Option<&'a Path>,
    pub key_password: Option<&'a str>,
    pub sasl_mechanism: Option<&'a str>,
    pub sasl_username: Option<&'a str>,
    pub sasl_password: Option<&'a str>,
    pub properties_file: Option<&'a Path>,
}

fn readable(field: &'static str, path: &Path) -> Result<String, KafkaSettingsError> {
    std::fs::File::open(path)
        .map(|_| path.display().to_string())
        .map_err(|e| KafkaSettingsError::Unreadable {
            field,
            path: path.display().to_string(),
            problem: e.kind().to_string(),
        })
}

/// The SASL properties for a `SASL_*` protocol (mechanism, username and password, all
/// required); for any other protocol, none, and a SASL setting given anyway is refused.
fn sasl_properties(
    sasl: bool,
    security: &KafkaSecurity<'_>,
) -> Result<Vec<(&'static str, String)>, KafkaSettingsError> {
    if !sasl {
        for (field, value) in [
            ("kafka_sasl_mechanism", security.sasl_mechanism.is_some()),
            ("kafka_sasl_username", security.sasl_username.is_some()),
            ("kafka_sasl_password", security.sasl_password.is_some()),
        ] {
            if value {
                return Err(KafkaSettingsError::Unused {
                    field,
                    with: "KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL",
                });
            }
        }
        return Ok(Vec::new());
    }
    let missing = |field| KafkaSettingsError::Missing {
        field,
        because: "the protocol is SASL_*",
    };
    let mechanism = security
        .sasl_mechanism
        .ok_or(missing("kafka_sasl_mechanism"))?
        .to_ascii_uppercase();
    if !SASL_MECHANISMS.contains(&mechanism.as_str()) {
        return Err(KafkaSettingsError::NotOneOf {
            field: "kafka_sasl_mechanism",
            allowed: SASL_MECHANISMS.join(", "),
            value: mechanism,
        });
    }
    let username = security
        .sasl_username
        .ok_or(missing("kafka_sasl_username"))?;
    let password = security
        .sasl_password
        .ok_or(missing("kafka_sasl_password"))?;
    Ok(vec![
        ("sasl.mechanism", mechanism),
        ("sasl.username", username.to_owned()),
        ("sasl.password", password.to_owned()),
    ])
}

/// Reads a librdkafka properties file: `name=value` lines, `#` comments, blank lines.
pub fn read_properties(path: &Path) -> Result<BTreeMap<String, String>, KafkaSettingsError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| KafkaSettingsError::Unreadable {
        field: "kafka_properties",
        path: file.clone(),
        problem: e.kind().to_string(),
    })?;
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once('=').ok_or(KafkaSettingsError::Syntax {
            file: file.clone(),
            line: i + 1,
        })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(KafkaSettingsError::Syntax { file, line: i + 1 });
        }
        if let Some((_, why)) = GUARDED.iter().find(|(g, _)| *g == name) {
            return Err(KafkaSettingsError::Guarded {
                file,
                name: name.to_owned(),
                why,
            });
        }
        out.insert(name.to_owned(), value.trim().to_owned());
    }
    Ok(out)
}

impl KafkaConnection {
    /// Brokers reached in plaintext with no extra properties (tests, benchmarks).
    pub fn plaintext(brokers: &str) -> Self {
        Self {
            brokers: brokers.to_owned(),
            properties: BTreeMap::new(),
        }
    }

    /// The same security settings towards other brokers.
    pub fn with_brokers(mut self, brokers: &str) -> Self {
        self.brokers = brokers.to_owned();
        self
    }

    /// Checks the security settings and builds the connection. Every file named must be
    /// readable now; librdkafka itself then checks every property name and value, so a typo
    /// in the properties file stops the start with librdkafka's own words.
    pub fn new(brokers: &str, security: &KafkaSecurity<'_>) -> Result<Self, KafkaSettingsError> {
        let protocol = security.protocol.to_ascii_uppercase();
        if !SECURITY_PROTOCOLS.contains(&protocol.as_str()) {
            return Err(KafkaSettingsError::NotOneOf {
                field: "kafka_security_protocol",
                allowed: SECURITY_PROTOCOLS.join(", "),
                value: security.protocol.to_owned(),
            });
        }
        let tls = protocol.ends_with("SSL");
        let sasl = protocol.starts_with("SASL");
        let mut properties = match security.properties_file {
            Some(path) => read_properties(path)?,
            None => BTreeMap::new(),
        };
        let mut set = |k: &str, v: String| properties.insert(k.to_owned(), v);
        set("security.protocol", protocol.to_ascii_lowercase());
        let tls_files = [
            (
                "kafka_ssl_ca_location",
                "ssl.ca.location",
                security.ca_location,
            ),
            (
                "kafka_ssl_certificate_location",
                "ssl.certificate.location",
                security.certificate_location,
            ),
            (
                "kafka_ssl_key_location",
                "ssl.key.location",
                security.key_location,
            ),
        ];
        for (field, property, path) in tls_files {
            if let Some(path) = path {
                if !tls {
                    return Err(KafkaSettingsError::Unused {
                        field,
                        with: "KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL",
                    });
                }
                set(property, readable(field, path)?);
            }
        }
        match (security.certificate_location, security.key_location) {
            (Some(_), None) => {
                return Err(KafkaSettingsError::Missing {
                    field: "kafka_ssl_key_location",
                    because: "a client certificate is set",
                });
            }
            (None, Some(_)) => {
                return Err(KafkaSettingsError::Missing {
                    field: "kafka_ssl_certificate_location",
                    because: "a client key is set",
                });
            }
            _ => {}
        }
        if let Some(p) = security.key_password {
            set("ssl.key.password", p.to_owned());
        }
        for (property, value) in sasl_properties(sasl, security)? {
            set(property, value);
        }
        let connection = Self {
            brokers: brokers.to_owned(),
            properties,
        };
        connection
            .client_config()
            .create_native_config()
            .map_err(|e| KafkaSettingsError::Refused(e.to_string()))?;
        Ok(connection)
    }

    /// The starting point of every client: brokers, security, the operator's properties.
    /// Callers add their own settings after it (and may override none of [`GUARDED`]: the
    /// file cannot name them).
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
    }

    /// The protocol in use (`plaintext`, `ssl`, `sasl_ssl`, …).
    pub fn security_protocol(&self) -> &str {
        self.properties
            .get("security.protocol")
            .map_or("plaintext", String::as_str)
    }

    /// A property as it will be given to librdkafka (tests and diagnostics).
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }
}

/// The deliveries topic (Announcements from the relay), under the configured prefix.
pub fn deliveries_topic(prefix: &str) -> String {
    format!("{prefix}deliveries")
}

/// The retry topic (hints from the retry scheduler), under the configured prefix.
pub fn retries_topic(prefix: &str) -> String {
    format!("{prefix}retries")
}

/// The producers' batching defaults, each overridable in `KAFKA_PROPERTIES`.
///
/// `linger.ms` 5, not 1: since express hints ring at read time (the Announcement's
/// acknowledgement only moves the Slot's LSN), a longer linger costs a Delivery no latency,
/// and fewer, larger produce requests cost the broker and the relay less: at 300 Events/s on
/// tansu, broker 1.80 → 1.30 ms and relay 0.58 → 0.28 ms of CPU per message, p50 unchanged
/// (docs/CONFIGURATION.md, "The relay's batching"; issue #54).
const PRODUCER_TUNING: [(&str, &str); 2] = [("linger.ms", "5"), ("compression.type", "none")];

/// `enable.idempotence` makes librdkafka's own retries write each message once per
/// partition, in order; `acks=all` means an acknowledgement survives the loss of a broker.
/// Only such an acknowledgement lets the relay confirm an LSN.
pub fn producer(
    kafka: &KafkaConnection,
    message_timeout: Duration,
    queue_messages: usize,
) -> Result<crate::kafka_producer::Producer, KafkaError> {
    let mut config = kafka.client_config();
    // Batching is tuning, so `KAFKA_PROPERTIES` may change it; the guarantees above may not
    // (`GUARDED`). The defaults were chosen by measurement (docs/CONFIGURATION.md, "The
    // relay's batching").
    for (name, value) in PRODUCER_TUNING {
        if kafka.property(name).is_none() {
            config.set(name, value);
        }
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            message_timeout.as_millis().to_string(),
        )
        // The window bounds what is in flight; librdkafka's own queue gets ample headroom so
        // it never refuses a message the window admitted.
        .set(
            "queue.buffering.max.messages",
            (queue_messages * 4 + 10_000).to_string(),
        )
        .set("reconnect.backoff.max.ms", "1000");
    crate::kafka_producer::Producer::create(&config)
}

/// Creates the topic with `partitions` if it does not exist yet.
pub async fn ensure_topic(
    kafka: &KafkaConnection,
    topic: &str,
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn security(protocol: &str) -> KafkaSecurity<'_> {
        KafkaSecurity {
            protocol,
            ..KafkaSecurity::default()
        }
    }

    #[test]
    fn plaintext_by_default_sets_only_the_protocol() {
        let k = KafkaConnection::new("b:9092", &security("PLAINTEXT")).expect("valid");
        assert_eq!(k.security_protocol(), "plaintext");
        assert_eq!(k.property("sasl.mechanism"), None);
    }

    // No local broker here is set up for SASL (tansu 0.6.0's `--authentication` option is
    // unexplored), so the SASL settings are checked as librdkafka receives them: librdkafka itself accepts them
    // (`create_native_config` inside `new`), and every client starts from them.
    #[test]
    fn sasl_scram_over_tls_reaches_every_client_config() {
        let s = KafkaSecurity {
            protocol: "sasl_ssl",
            sasl_mechanism: Some("scram-sha-512"),
            sasl_username: Some("railhook"),
            sasl_password: Some("s3cret-pw"),
            ..KafkaSecurity::default()
        };
        let k = KafkaConnection::new("b:9096", &s).expect("valid");
        let config = k.client_config();
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(config.get("sasl.username"), Some("railhook"));
        assert_eq!(config.get("sasl.password"), Some("s3cret-pw"));
        assert_eq!(config.get("bootstrap.servers"), Some("b:9096"));
        let shown = format!("{k:?}");
        assert!(!shown.contains("s3cret-pw"), "{shown}");
        for mechanism in ["PLAIN", "SCRAM-SHA-256"] {
            let s = KafkaSecurity {
                sasl_mechanism: Some(mechanism),
                protocol: "SASL_PLAINTEXT",
                ..s.clone()
            };
            KafkaConnection::new("b:9092", &s).expect(mechanism);
        }
    }

    #[test]
    fn sasl_mistakes_name_the_setting() {
        let no_password = KafkaSecurity {
            protocol: "SASL_SSL",
            sasl_mechanism: Some("PLAIN"),
            sasl_username: Some("u"),
            ..KafkaSecurity::default()
        };
        let err = KafkaConnection::new("b:1", &no_password).expect_err("no password");
        assert!(err.to_string().contains("kafka_sasl_password"), "{err}");
        let gssapi = KafkaSecurity {
            sasl_mechanism: Some("GSSAPI"),
            sasl_password: Some("p"),
            ..no_password.clone()
        };
        let err = KafkaConnection::new("b:1", &gssapi).expect_err("gssapi");
        assert!(err.to_string().contains("kafka_sasl_mechanism"), "{err}");
        let stray = KafkaSecurity {
            protocol: "SSL",
            ..no_password
        };
        let err = KafkaConnection::new("b:1", &stray).expect_err("sasl without SASL_*");
        assert!(err.to_string().contains("kafka_sasl_mechanism"), "{err}");
        let err = KafkaConnection::new("b:1", &security("TLS")).expect_err("protocol");
        assert!(err.to_string().contains("kafka_security_protocol"), "{err}");
    }

    #[test]
    fn tls_files_must_exist_and_come_in_pairs() {
        let missing = KafkaSecurity {
            protocol: "SSL",
            ca_location: Some(Path::new("/nope/ca.pem")),
            ..KafkaSecurity::default()
        };
        let err = KafkaConnection::new("b:1", &missing).expect_err("missing CA");
        assert!(err.to_string().contains("kafka_ssl_ca_location"), "{err}");
        let file = std::env::temp_dir().join("railhook-kafka-cert.pem");
        std::fs::write(&file, "x").expect("write");
        let half = KafkaSecurity {
            protocol: "SSL",
            certificate_location: Some(&file),
            ..KafkaSecurity::default()
        };
        let err = KafkaConnection::new("b:1", &half).expect_err("cert without key");
        assert!(err.to_string().contains("kafka_ssl_key_location"), "{err}");
        let plaintext_ca = KafkaSecurity {
            protocol: "PLAINTEXT",
            ca_location: Some(&file),
            ..KafkaSecurity::default()
        };
        let err = KafkaConnection::new("b:1", &plaintext_ca).expect_err("CA on plaintext");
        assert!(err.to_string().contains("kafka_ssl_ca_location"), "{err}");
    }

    #[test]
    fn a_properties_file_cannot_weaken_a_guarantee() {
        let path = std::env::temp_dir().join(format!("railhook-{}.properties", std::process::id()));
        std::fs::write(&path, "# tuning\nsocket.keepalive.enable=true\nacks = 1\n").expect("write");
        let s = KafkaSecurity {
            protocol: "PLAINTEXT",
            properties_file: Some(&path),
            ..KafkaSecurity::default()
        };
        let err = KafkaConnection::new("b:1", &s).expect_err("acks");
        assert!(
            matches!(&err, KafkaSettingsError::Guarded { name, .. } if name == "acks"),
            "{err}"
        );
        std::fs::write(
            &path,
            "socket.keepalive.enable=true\nclient.rack=use1-az1\n",
        )
        .expect("write");
        let k = KafkaConnection::new("b:1", &s).expect("valid");
        assert_eq!(k.client_config().get("client.rack"), Some("use1-az1"));
        std::fs::write(&path, "no.such.property=1\n").expect("write");
        let err = KafkaConnection::new("b:1", &s).expect_err("unknown");
        assert!(err.to_string().contains("no.such.property"), "{err}");
        std::fs::write(&path, "just words\n").expect("write");
        let err = KafkaConnection::new("b:1", &s).expect_err("syntax");
        assert!(err.to_string().contains("line 1"), "{err}");
        let _ = std::fs::remove_file(&path);
    }
}
