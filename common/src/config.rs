//! Typed settings, read once at start: defaults < TOML file (`RAILHOOK_CONFIG`) < plain
//! `DATABASE_URL` / `KAFKA_BROKERS` / `REDIS_URL` < `RAILHOOK_*` environment variables.
//!
//! Validation (config/validate.rs) happens before any role starts, so a mistake is reported
//! as one clear message naming the setting rather than as a failure deep inside a
//! connection attempt. The defaults live in config/defaults.rs, the connection settings'
//! readers in config/connections.rs.
//! Secrets (`database_url`, `admin_token`) are [`SecretString`]s: they never print through
//! `Debug`, so a logged `Settings` cannot leak them.

use std::net::SocketAddr;
use std::path::PathBuf;

use figment::Figment;

mod connections;
mod defaults;
mod sso;
mod validate;

pub use sso::{OidcRoleRule, OidcRoles};

use defaults::DEFAULTS;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
pub use validate::PROCESSING_MARGIN;

/// Everything a Railhook process can be told.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Postgres connection string (`DATABASE_URL` or `RAILHOOK_DATABASE_URL`).
    pub database_url: SecretString,
    /// A second Postgres URL for the relay's replication stream and control connection,
    /// when the pools go through a pooler that cannot carry replication (PgBouncer, RDS
    /// Proxy). Defaults to `database_url`.
    #[serde(default)]
    pub replication_database_url: Option<SecretString>,
    /// Redis, for the monthly quota and distributed limits. `rediss://` for TLS; a user and
    /// password in the URL are kept secret.
    pub redis_url: SecretString,
    /// `REDIS_URL` names one node of a Redis Cluster (ElastiCache cluster mode, …); the
    /// client discovers the others and follows their redirects.
    pub redis_cluster: bool,
    /// A PEM file of CA certificates trusted for `rediss://` (default: the system's roots).
    #[serde(default)]
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for Redis mutual TLS.
    #[serde(default)]
    pub redis_client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub redis_client_key_file: Option<PathBuf>,
    /// Comma-separated Kafka bootstrap servers.
    pub kafka_brokers: String,
    /// `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` (`KAFKA_SECURITY_PROTOCOL`).
    #[serde(deserialize_with = "connections::text")]
    pub kafka_security_protocol: String,
    /// CA certificates (PEM) that sign the brokers' certificates (default: the system's).
    #[serde(default)]
    pub kafka_ssl_ca_location: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS to the brokers.
    #[serde(default)]
    pub kafka_ssl_certificate_location: Option<PathBuf>,
    #[serde(default)]
    pub kafka_ssl_key_location: Option<PathBuf>,
    #[serde(default, deserialize_with = "connections::opt_secret")]
    pub kafka_ssl_key_password: Option<SecretString>,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`, with a `SASL_*` protocol.
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub kafka_sasl_mechanism: Option<String>,
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub kafka_sasl_username: Option<String>,
    #[serde(default, deserialize_with = "connections::opt_secret")]
    pub kafka_sasl_password: Option<SecretString>,
    /// A file of further librdkafka properties (`name=value` lines) for every client;
    /// properties the guarantees rest on are refused by name (`kafka::GUARDED`).
    #[serde(default)]
    pub kafka_properties: Option<PathBuf>,
    /// Built from the Kafka settings above by validation; read through [`Settings::kafka`].
    #[serde(skip)]
    kafka_checked: crate::kafka::KafkaConnection,
    /// Where the REST API listens.
    pub http_addr: SocketAddr,
    /// Where roles without the REST API serve `/metrics` (and ingest too, when
    /// `api_metrics` is off).
    pub metrics_addr: SocketAddr,
    /// Whether the API port serves `/metrics` (`RAILHOOK_API_METRICS`). Unset, it does only
    /// when `metrics_token` is set, so a default install never publishes its series on the
    /// public port; `true` without a token is refused (review #34 item 14). Off, the ingest
    /// and `all` roles serve it on `metrics_addr` instead, which a NetworkPolicy can keep to
    /// the monitoring namespace. Read it through [`Settings::api_metrics`].
    #[serde(default)]
    pub api_metrics: Option<bool>,
    /// A bearer token every `/metrics` asks for when set (`RAILHOOK_METRICS_TOKEN`).
    #[serde(default)]
    pub metrics_token: Option<SecretString>,
    /// Bearer token for tenant management (`/v1/organizations`, `/v1/projects`).
    pub admin_token: Option<SecretString>,
    /// A second admin token accepted beside `admin_token` while callers move to a new one
    /// (`RAILHOOK_ADMIN_TOKEN_PREVIOUS`); remove it once they have.
    #[serde(default)]
    pub admin_token_previous: Option<SecretString>,
    /// Keys that seal signing and Source secrets at rest (`RAILHOOK_ENCRYPTION_KEYS`): 32-byte
    /// keys as 64 hex characters, comma-separated; the first seals, all open
    /// (common/src/sealing.rs). Without any, secrets are stored in plaintext.
    #[serde(default)]
    pub encryption_keys: Option<SecretString>,
    /// Built from `encryption_keys` by validation; read through [`Settings::keyring`].
    #[serde(skip)]
    keyring: crate::sealing::Keyring,
    /// CIDRs that the SSRF guard lets through, comma-separated (e.g. `127.0.0.0/8` in tests).
    pub allow_private_targets: String,
    /// Trust roots added to the system's for endpoints' TLS (`RAILHOOK_EGRESS_CA_FILE`): a
    /// PEM bundle, e.g. the private CA a receiver's server certificate chains to.
    #[serde(default)]
    pub egress_ca_file: Option<PathBuf>,
    /// The forward proxy every HTTP Attempt leaves through (`RAILHOOK_EGRESS_PROXY`):
    /// `http://[user:password@]host:port`, or `https://…` for TLS to the proxy. The worker
    /// checks the target's address first and asks the proxy to CONNECT to that address
    /// (docs/EGRESS.md). Ambient `HTTP(S)_PROXY` is never used.
    #[serde(default, deserialize_with = "connections::opt_secret")]
    pub egress_proxy: Option<SecretString>,
    pub slot: String,
    /// Create the Slot as a failover Slot (`RAILHOOK_SLOT_FAILOVER`, PostgreSQL 17+): a
    /// standby running `sync_replication_slots` keeps a copy the relay resumes from after
    /// a promotion (docs/operate/failover.md, "Failover"). Used by `railhook migrate` when it
    /// creates the Slot; `railhook slot create --failover` does the same by hand.
    #[serde(default)]
    pub slot_failover: bool,
    pub publication: String,
    pub topic_prefix: String,
    /// Largest accepted request body; larger ones get `413`.
    pub max_payload_bytes: usize,
    /// Most events accepted by one `POST /v1/events/batch`.
    pub max_batch_size: usize,
    /// How long a rotated-out signing secret keeps signing alongside the new one.
    pub secret_rotation_overlap_seconds: u64,
    pub db_max_connections: u32,
    /// Single-Event ingest statements in flight at once; requests that find them all busy
    /// share the next one (group commit, ingest/src/group_commit.rs). 0: no group commit.
    pub ingest_writers: u32,
    /// Upper bound on one quota round trip to Redis; past it the charge is skipped.
    pub quota_timeout_ms: u64,
    /// How long a client has to send a request's headers (and how long a kept-alive
    /// connection may sit idle) before the API closes the connection.
    pub http_header_timeout_seconds: u64,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// OTLP/HTTP collector (`http://collector:4318`); spans are exported only when set.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Partitions of the deliveries topic when the relay creates it.
    pub kafka_partitions: i32,
    /// Replication factor of topics the relay creates (3 in production; 1 on one broker).
    pub kafka_replication_factor: i32,
    /// How long librdkafka keeps retrying one message before the relay restarts its
    /// session from the last confirmed LSN.
    pub kafka_message_timeout_ms: u64,
    /// Most Outbox messages the relay holds un-acknowledged before it stops reading the Slot.
    pub relay_max_in_flight: usize,
    /// Send each Announcement's express hint as soon as it is read from the Slot, to the
    /// partition librdkafka's partitioner will give it, instead of after the broker's
    /// acknowledgement (relay.rs, `produce`; a wrong guess is corrected at the ack).
    pub relay_express_at_read: bool,
    /// Most bytes of un-acknowledged messages before the relay stops reading the Slot.
    pub relay_max_in_flight_bytes: usize,
    /// Interval between transactional heartbeats written into the WAL.
    pub relay_heartbeat_ms: u64,
    /// Interval between slot status reads (lag, wal_status) and prune rounds.
    pub relay_status_ms: u64,
    /// Outbox rows older than this, and confirmed by the Slot, are deleted.
    pub outbox_retention_seconds: u64,
    /// How long the workers' fetch requests wait at the broker for new messages
    /// (`fetch.wait.max.ms`): the poll interval of an idle consumer, and, on a broker that
    /// answers a waiting fetch only at its deadline, the latency it adds (docs/CONFIGURATION.md
    /// has the measured values per broker).
    pub kafka_fetch_wait_ms: u64,
    /// Kafka consumer group of the workers.
    pub worker_group: String,
    /// Attempts one worker process runs at once.
    pub worker_max_in_flight: usize,
    /// Statements writing successful outcomes at once; successes that find them all busy
    /// share the next one (worker/src/successes.rs). 0: each outcome on its own.
    pub worker_outcome_writers: u32,
    /// Outgoing ladder: waits in seconds, comma-separated, and the number of Attempts.
    #[serde(deserialize_with = "seconds_list")]
    pub retry_outgoing_delays: String,
    pub retry_outgoing_max_attempts: u32,
    /// Incoming ladder (forwarded provider webhooks).
    #[serde(deserialize_with = "seconds_list")]
    pub retry_incoming_delays: String,
    pub retry_incoming_max_attempts: u32,
    /// The shortest wait after a timeout or a 429, whatever an endpoint's ladder says
    /// (worker/src/retry_policy.rs).
    pub retry_overload_floor_ms: u64,
    /// How often the retry scheduler looks for due Deliveries.
    pub retry_scheduler_ms: u64,
    /// How often the sweeps run.
    pub sweep_ms: u64,
    /// PROCESSING longer than this goes back to PENDING (the stalled worker is fenced out).
    /// Must exceed `endpoint_timeout_max_ms` by [`PROCESSING_MARGIN`]: a request in flight
    /// is never swept (see `processing_timeout_problem`).
    pub processing_timeout_seconds: u64,
    /// The largest `timeout_ms` an endpoint may have (the API refuses more; the worker caps
    /// older endpoints at it).
    pub endpoint_timeout_max_ms: u64,
    /// PENDING with nothing scheduled for longer than this goes to the retry path.
    pub stranded_after_seconds: u64,
    /// A worker leaves and rejoins its consumer group when a partition it does not hold has
    /// had messages waiting and an unmoving committed offset for this long (0: never). The
    /// guard against a broker that keeps a dead member's partitions assigned (group_watch.rs).
    pub worker_stall_rejoin_seconds: u64,
    /// A worker that has read nothing and heard no doorbell for this long pauses its
    /// partitions until the doorbell rings (common/src/doorbell.rs); 0: never doze, always
    /// fetch. At least 1,000 ms, so a ring always outlives the ringer's gap.
    pub worker_doze_after_ms: u64,
    /// Whether the worker's commits (Claims, re-stamps, outcomes, Deferrals) wait for their
    /// WAL flush. Off: a Postgres crash can lose the last fraction of a second of them, and
    /// the Deliveries they moved are sent again (docs/ARCHITECTURE.md, duplicate windows);
    /// no Event answered 201 is ever at risk (the API's commits always wait).
    pub worker_synchronous_commit: bool,
    /// Whether the commits of successful outcomes (the group success writes, successes.rs)
    /// wait for their WAL flush, when the worker's other commits do. Off (the default): they
    /// run on connections of their own with `synchronous_commit = off`; a Postgres crash
    /// within a fraction of a second of one loses it, and its Delivery, still PROCESSING under
    /// its synchronously committed Claim, is sent again after the processing sweep
    /// (docs/ARCHITECTURE.md, duplicate window 8). The Claims stay synchronous: a lost
    /// Claim would wait for the stranded sweep instead.
    pub worker_outcome_synchronous_commit: bool,
    /// Claim the Deliveries the relay's doorbell names as soon as it rings, before their
    /// Announcements arrive through Kafka (common/src/doorbell.rs, `Express`).
    pub worker_express_hints: bool,
    /// librdkafka's `max.poll.interval.ms` for the workers' consumer (at least the 10 s
    /// session timeout). The loop never waits on an Attempt, so only a wedged worker
    /// exceeds it.
    pub worker_max_poll_interval_ms: u64,
    /// On SIGTERM a worker stops taking work and lets its running Attempts finish for up to
    /// this long; Claims still running then go back to PENDING at once. Kubernetes'
    /// `terminationGracePeriodSeconds` must be longer.
    pub worker_drain_seconds: u64,
    /// On SIGTERM the active relay stops reading the Slot (after the transaction it is in),
    /// waits up to this long for Kafka to acknowledge what it sent, confirms it and ends its
    /// replication connection, so the standby takes the Slot at once and resends nothing.
    pub relay_drain_seconds: u64,
    /// Days of Events, Deliveries and Attempts kept (`RAILHOOK_RETENTION_DAYS`): a day's
    /// partitions are dropped once the day ended this long ago (common/src/retention/).
    /// Never shorter than [`crate::retention::minimum_days`].
    pub retention_days: u32,
    /// Seconds between two retention passes (creating partitions ahead, dropping expired).
    pub retention_interval_seconds: u64,
    /// How long a parked ordered Delivery waits for a stuck predecessor (from its first
    /// park) before it goes without it. Also read as `ORDERING_GAP_TIMEOUT_SECONDS`.
    pub ordering_gap_timeout_seconds: u64,
    /// Circuit breaker: opens after this many retryable failures in a row...
    pub breaker_consecutive_failures: u32,
    /// ...or at this failure rate (0-1) over at least `breaker_min_requests` Attempts in a
    /// `breaker_window_seconds` window.
    pub breaker_failure_rate: f64,
    pub breaker_min_requests: u32,
    pub breaker_window_seconds: u64,
    /// How long an open breaker defers everything before one probe may go (half-open).
    pub breaker_cooldown_seconds: u64,
    /// The longest a single Deferral waits (the doubling back-off's cap).
    pub deferral_max_seconds: u64,
    /// An endpoint whose Attempts have all failed for this long is disabled (Svix's five
    /// days by default); its Deliveries then go to Failed Messages until someone enables it.
    pub endpoint_disable_after_seconds: u64,
    /// … and only once the streak counts at least this many failed Attempts.
    pub endpoint_disable_min_failures: u32,
    /// A Delivery whose Attempts failed this many times in a row triggers the operational
    /// webhook `message.attempt.failing` (and a later success `message.attempt.recovered`).
    pub operational_failing_after: u32,
    /// A failure streak older than this shows the endpoint as `warning`.
    pub endpoint_warn_after_seconds: u64,
    /// Sets `Secure` on the dashboard's session cookie. Leave on behind TLS; the local demo
    /// turns it off because it serves plain HTTP.
    pub dashboard_cookie_secure: bool,
    /// How long a dashboard sign-in lasts.
    pub dashboard_session_seconds: u64,
    /// Where browsers reach this API (`https://hooks.example.com`): the base of the customer
    /// portal's access links. Absent: the request's `Host`, with `https` unless the
    /// dashboard's cookies are not `Secure` (a plain-HTTP local demo).
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub public_url: Option<String>,
    /// Where workers reach this API instance to pass a `railhook listen` session's Attempts
    /// down its connection (`http://10.0.3.7:8080`): the instance's own address, not a
    /// load balancer's. Absent: `http://` and `RAILHOOK_HTTP_ADDR` (an unspecified address
    /// read as loopback), right when the workers share the host (`railhook all`).
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub listen_relay_url: Option<String>,
    /// A `railhook listen` session's endpoint left without its connection this long is
    /// deleted (its undelivered Deliveries with it, as for any deleted endpoint).
    pub listen_idle_seconds: u64,
    /// Dashboard single sign-on (docs/ACCESS.md): the OpenID Connect issuer
    /// (`https://accounts.example.com`), discovered through its
    /// `.well-known/openid-configuration`. Unset: no single sign-on.
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub oidc_issuer_url: Option<String>,
    /// The client Railhook is registered as at the issuer.
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub oidc_client_id: Option<String>,
    #[serde(default)]
    pub oidc_client_secret: Option<SecretString>,
    /// This API's `/dashboard/sso/callback` as browsers reach it (registered at the issuer).
    #[serde(default, deserialize_with = "connections::opt_text")]
    pub oidc_redirect_url: Option<String>,
    /// Who gets which role where ([`OidcRoleRule`]); a person no rule matches is refused.
    #[serde(default)]
    pub oidc_roles: Option<OidcRoles>,
    /// Whether a person may sign in to the dashboard with an API key. Turn it off once
    /// single sign-on works, so that people stop sharing keys.
    pub dashboard_key_sign_in: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A ladder of waits: "60,300,900" arrives as a string, but a one-rung ladder set from the
/// environment ("3600", "0.5") arrives as a number (figment guesses the type of env values),
/// and must mean the same thing.
fn seconds_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Int(u64),
        Float(f64),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::Text(s) => s,
        Raw::Int(n) => n.to_string(),
        Raw::Float(f) => f.to_string(),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Figment's message already names the key and where it came from.
    #[error("configuration: {0}")]
    Load(Box<figment::Error>),
    #[error("configuration: {field} {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

/// `base` with the configured waits (checked at start by `validate`) and Attempt count.
fn configured(base: crate::retry::Ladder, delays: &str, max_attempts: u32) -> crate::retry::Ladder {
    base.with_override(&crate::retry::LadderOverride {
        delays: crate::retry::RetryDelays::parse(delays).ok(),
        max_attempts: Some(max_attempts),
    })
}

fn invalid(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        problem: problem.into(),
    }
}

impl Settings {
    /// Whether the API port serves `/metrics`: as configured, or, unset, only behind a
    /// metrics token.
    pub fn api_metrics(&self) -> bool {
        self.api_metrics.unwrap_or(self.metrics_token.is_some())
    }

    /// Reads the process environment (and `RAILHOOK_CONFIG`, if set).
    pub fn load() -> Result<Self, ConfigError> {
        let mut figment = Self::defaults();
        if let Ok(path) = std::env::var("RAILHOOK_CONFIG") {
            figment = figment.merge(Toml::file_exact(PathBuf::from(path)));
        }
        let figment = figment
            .merge(Env::raw().only(&[
                "DATABASE_URL",
                "KAFKA_BROKERS",
                "KAFKA_SECURITY_PROTOCOL",
                "KAFKA_SSL_CA_LOCATION",
                "KAFKA_SSL_CERTIFICATE_LOCATION",
                "KAFKA_SSL_KEY_LOCATION",
                "KAFKA_SSL_KEY_PASSWORD",
                "KAFKA_SASL_MECHANISM",
                "KAFKA_SASL_USERNAME",
                "KAFKA_SASL_PASSWORD",
                "REDIS_URL",
                "ORDERING_GAP_TIMEOUT_SECONDS",
            ]))
            .merge(Env::prefixed("RAILHOOK_").ignore(&["CONFIG"]));
        Self::from_figment(figment)
    }

    /// The defaults alone, for callers (tests) that layer their own values on top.
    pub fn defaults() -> Figment {
        Figment::from(Serialized::defaults(DEFAULTS))
    }

    pub fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let mut settings: Settings = figment
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        settings.validate()?;
        settings.kafka_checked = settings.kafka_connection()?;
        settings.keyring = match &settings.encryption_keys {
            Some(raw) => crate::sealing::Keyring::parse(raw.expose_secret())
                .map_err(|e| invalid("encryption_keys", e.to_string()))?,
            None => crate::sealing::Keyring::default(),
        };
        Ok(settings)
    }

    /// The keys that seal secrets at rest (none configured: an empty keyring).
    pub fn keyring(&self) -> crate::sealing::Keyring {
        self.keyring.clone()
    }

    /// The database URL, for tools that must derive other URLs from it (benchmarks, tests).
    pub fn database_url_string(&self) -> String {
        self.database_url.expose_secret().to_owned()
    }

    pub fn set_database_url(&mut self, url: &str) {
        self.database_url = SecretString::from(url.to_owned());
    }

    /// The outgoing ladder as configured (hard cap 96 h).
    pub fn outgoing_ladder(&self) -> crate::retry::Ladder {
        configured(
            crate::retry::Ladder::outgoing(),
            &self.retry_outgoing_delays,
            self.retry_outgoing_max_attempts,
        )
    }

    /// The incoming ladder as configured (hard cap 24 h).
    pub fn incoming_ladder(&self) -> crate::retry::Ladder {
        configured(
            crate::retry::Ladder::incoming(),
            &self.retry_incoming_delays,
            self.retry_incoming_max_attempts,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut figment = Settings::defaults();
        for (k, v) in pairs {
            figment = figment.merge((*k, *v));
        }
        Settings::from_figment(figment)
    }

    #[test]
    fn defaults_plus_database_url_is_enough() {
        let s = with(&[("database_url", "postgres://localhost/x")]).expect("valid");
        assert_eq!(s.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(s.slot, "railhook_outbox");
        assert_eq!(s.max_payload_bytes, 1024 * 1024);
    }

    /// Review #34 item 14: `/metrics` on the public API port only behind a token.
    #[test]
    fn the_api_port_serves_metrics_only_behind_a_token() {
        let db = ("database_url", "postgres://localhost/x");
        assert!(!with(&[db]).expect("valid").api_metrics(), "off by default");
        let token = ("metrics_token", "scrape-token-0123456789");
        assert!(
            with(&[db, token]).expect("valid").api_metrics(),
            "on with a token"
        );
        let set = |on: bool, token: Option<&str>| {
            let mut f = Settings::defaults().merge(db).merge(("api_metrics", on));
            if let Some(t) = token {
                f = f.merge(("metrics_token", t));
            }
            Settings::from_figment(f)
        };
        assert!(!set(false, Some(token.1)).expect("valid").api_metrics());
        let refused = set(true, None).expect_err("refused");
        assert!(refused.to_string().contains("api_metrics"), "{refused}");
        assert!(set(true, Some(token.1)).expect("valid").api_metrics());
    }

    #[test]
    fn a_one_rung_ladder_from_the_environment_is_read_as_seconds() {
        // Regression: RAILHOOK_RETRY_OUTGOING_DELAYS=0.2 failed ("found float, expected a
        // string") because figment types environment values.
        for (raw, want) in [(0.2f64, "0.2"), (3600.0, "3600")] {
            let figment = Settings::defaults()
                .merge(("database_url", "postgres://localhost/x"))
                .merge(("retry_outgoing_delays", raw));
            let s = Settings::from_figment(figment).expect("valid");
            assert_eq!(s.retry_outgoing_delays, want);
        }
        let figment = Settings::defaults()
            .merge(("database_url", "postgres://localhost/x"))
            .merge(("retry_incoming_delays", 60u64));
        assert_eq!(
            Settings::from_figment(figment)
                .expect("valid")
                .retry_incoming_delays,
            "60"
        );
    }

    #[test]
    fn missing_database_url_names_the_field() {
        let err = with(&[]).expect_err("must fail").to_string();
        assert!(err.contains("database_url"), "{err}");
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            (("database_url", "mysql://x"), "database_url"),
            (("redis_url", "http://x"), "redis_url"),
            (("admin_token", "short"), "admin_token"),
            (("slot", "Bad-Slot"), "slot"),
            (("http_addr", "not an address"), "http_addr"),
        ];
        for ((k, v), field) in cases {
            // A build without the Redis client (the relay's) does not read its URL.
            if k == "redis_url" && !cfg!(feature = "redis") {
                continue;
            }
            let mut pairs = vec![("database_url", "postgres://localhost/x")];
            pairs.retain(|(pk, _)| *pk != k);
            pairs.push((k, v));
            let err = with(&pairs).expect_err(field).to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn a_processing_timeout_within_the_largest_endpoint_timeout_is_refused() {
        // Review #19 item 1: at 300 s against 300 s endpoints the sweep could take back a
        // Claim whose request was still in flight.
        let load = |processing: u64, max: u64| {
            Settings::from_figment(
                Settings::defaults()
                    .merge(("database_url", "postgres://localhost/x"))
                    .merge(("processing_timeout_seconds", processing))
                    .merge(("endpoint_timeout_max_ms", max)),
            )
        };
        for (processing, max) in [(300, 300_000), (305, 300_000), (7, 2_000)] {
            let err = load(processing, max).expect_err("refused").to_string();
            assert!(err.contains("processing_timeout_seconds"), "{err}");
        }
        for (processing, max) in [(306, 300_000), (8, 2_000)] {
            load(processing, max).expect("accepted");
        }
        let err = load(360, 10).expect_err("too small").to_string();
        assert!(err.contains("endpoint_timeout_max_ms"), "{err}");
    }

    #[test]
    fn secrets_do_not_print() {
        let s = with(&[
            ("database_url", "postgres://u:hunter2@localhost/x"),
            ("admin_token", "a-very-secret-admin-token"),
        ])
        .expect("valid");
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("a-very-secret"));
    }
}
