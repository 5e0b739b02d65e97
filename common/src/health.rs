//! What each role depends on, whether it answers now, and why not.
//!
//! A process never exits because a dependency is away: it retries with a capped back-off and
//! says so here. `/readyz` (the API port, and the metrics port of the relay and worker roles)
//! answers 503 while a *required* dependency is down, with a JSON body naming each dependency
//! and its last error; `railhook_dependency_up{dependency}` shows the same on `/metrics`.
//!
//! Required by role: Postgres (every role), Kafka (relay, worker), the Slot (relay). Redis is
//! reported but never required: quota and limits fail open by design (docs/ARCHITECTURE.md),
//! so a Redis outage degrades a process without making it unready.
//!
//! Errors shown here are short and carry no database text or secrets: a TLS problem keeps
//! rustls' words (they say what is wrong with the certificate), a Postgres error only its
//! SQLSTATE.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntGaugeVec, Opts, Registry};
use serde::Serialize;

/// The longest wait between two attempts to reach a dependency.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Doubling waits from 250 ms up to [`MAX_BACKOFF`].
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(250),
        }
    }
}

impl Backoff {
    /// The wait before the next attempt; each call doubles the following one.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DependencyState {
    pub up: bool,
    pub required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the state last changed (RFC 3339).
    pub since: String,
}

/// The dependencies of one process. Cheap to clone; all clones share the state.
#[derive(Clone)]
pub struct Dependencies {
    states: Arc<Mutex<BTreeMap<&'static str, DependencyState>>>,
    /// What this process is doing in a set of peers, where that differs: a relay is
    /// `active` (it holds the Slot) or `standby`. Shown on `/readyz`.
    role: Arc<Mutex<Option<&'static str>>>,
    up_gauge: IntGaugeVec,
    registry: Registry,
}

impl Default for Dependencies {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Serialize)]
pub struct Readiness {
    /// `ready` or `unready`.
    pub status: &'static str,
    /// `active` or `standby` for a relay; absent for roles without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    pub dependencies: BTreeMap<&'static str, DependencyState>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Dependencies {
    #[allow(clippy::expect_used)] // a constant name: a failure is a programming error
    pub fn new() -> Self {
        let registry = Registry::new();
        let up_gauge = IntGaugeVec::new(
            Opts::new(
                "railhook_dependency_up",
                "1 while the dependency answers, 0 while it does not (its last error is on /readyz)",
            ),
            &["dependency"],
        )
        .expect("valid gauge");
        registry
            .register(Box::new(up_gauge.clone()))
            .expect("unique metric");
        Self {
            states: Arc::default(),
            role: Arc::default(),
            up_gauge,
            registry,
        }
    }

    /// Records the process's current role among its peers (`active`, `standby`).
    pub fn set_role(&self, role: &'static str) {
        *self.role.lock().unwrap_or_else(|p| p.into_inner()) = Some(role);
    }

    pub fn role(&self) -> Option<&'static str> {
        *self.role.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry holding `railhook_dependency_up`, for a `/metrics` page.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Declares a dependency, down until it is first seen up. `required` ones gate readiness;
    /// declaring one twice keeps the stricter flag (`railhook all` declares Postgres thrice).
    pub fn declare(&self, name: &'static str, required: bool) {
        let mut states = self.lock();
        let entry = states.entry(name).or_insert_with(|| DependencyState {
            up: false,
            required,
            last_error: Some("not checked yet".into()),
            since: now(),
        });
        entry.required |= required;
        self.up_gauge
            .with_label_values(&[name])
            .set(i64::from(entry.up));
    }

    pub fn up(&self, name: &'static str) {
        let mut states = self.lock();
        if let Some(s) = states.get_mut(name) {
            if !s.up {
                tracing::info!(dependency = name, "dependency up");
                s.since = now();
            }
            s.up = true;
            s.last_error = None;
        }
        self.up_gauge.with_label_values(&[name]).set(1);
    }

    /// Marks it down with a short reason (see the module doc for what a reason may hold).
    pub fn down(&self, name: &'static str, reason: impl Into<String>) {
        let reason = reason.into();
        let mut states = self.lock();
        if let Some(s) = states.get_mut(name) {
            if s.up || s.last_error.as_deref() != Some(reason.as_str()) {
                tracing::warn!(dependency = name, error = %reason, "dependency down");
            }
            if s.up {
                s.since = now();
            }
            s.up = false;
            s.last_error = Some(reason);
        }
        self.up_gauge.with_label_values(&[name]).set(0);
    }

    /// Marks it down, keeping the reason already recorded if it was down: for a caller whose
    /// own error is vaguer than a probe's (a time-out where the probe saw the TLS verdict).
    pub fn down_keep_reason(&self, name: &'static str, reason: impl Into<String>) {
        let known = self.lock().get(name).is_some_and(|s| {
            !s.up
                && s.last_error
                    .as_deref()
                    .is_some_and(|e| e != "not checked yet")
        });
        if !known {
            self.down(name, reason);
        }
    }

    pub fn is_up(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|s| s.up)
    }

    /// Ready when every required dependency is up.
    pub fn readiness(&self) -> Readiness {
        let dependencies = self.lock().clone();
        let ready = dependencies.values().all(|s| s.up || !s.required);
        Readiness {
            status: if ready { "ready" } else { "unready" },
            role: self.role(),
            dependencies,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, DependencyState>> {
        // A poisoned lock only means a panic elsewhere while holding it; the map is still
        // a valid map.
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A Postgres error as a dependency reason: TLS and I/O problems in full (they say what is
/// wrong and hold no data), a server error by SQLSTATE only.
pub fn postgres_reason(e: &sqlx::Error) -> String {
    if let Some(tls) = tls_failure(e) {
        return format!("tls: {tls}");
    }
    match e {
        sqlx::Error::Io(io) => format!("io: {io}"),
        sqlx::Error::Database(db) => format!(
            "server refused: SQLSTATE {}",
            db.code().as_deref().unwrap_or("?")
        ),
        sqlx::Error::PoolTimedOut => "no connection within the pool's timeout".into(),
        sqlx::Error::Configuration(_) => "configuration refused by the driver".into(),
        sqlx::Error::Protocol(_) => "protocol error".into(),
        other => {
            // Other variants are driver-side and hold no server text; keep their kind only.
            let text = other.to_string();
            text.split(':').next().unwrap_or("error").to_owned()
        }
    }
}

/// True for an error that waiting cannot fix: the server's certificate is refused, or the
/// client's TLS settings are unusable. Such an error stops the process at start, naming the
/// problem; nothing falls back to plaintext or to an unverified connection.
pub fn postgres_is_configuration(e: &sqlx::Error) -> bool {
    tls_failure(e).is_some() || matches!(e, sqlx::Error::Configuration(_))
}

/// The TLS problem behind `e`, if that is what it is. sqlx reports a refused certificate as
/// an I/O error wrapping rustls' error (the handshake runs inside the stream), and TLS set-up
/// problems (an unreadable key) as `Error::Tls`.
fn tls_failure(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Tls(inner) => Some(inner.to_string()),
        sqlx::Error::Io(io)
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            Some(io.to_string())
        }
        _ => None,
    }
}

/// Probes `pool` with `SELECT 1` and records the outcome.
pub async fn probe_postgres(deps: &Dependencies, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    // Bounded (db::answered): /readyz must say "down" about a primary that froze, not wait.
    let within = crate::db::ANSWER_WITHIN;
    let one = sqlx::query_scalar!(r#"SELECT 1 AS "one!""#).fetch_one(pool);
    let result = match crate::db::answered(within, "a readiness probe", one).await {
        // The pool only says it found no connection in time; one direct attempt says why
        // (refused, a certificate, …). If that attempt succeeds, the pool is saturated.
        Err(sqlx::Error::PoolTimedOut) => {
            use sqlx::Connection;
            let options = pool.connect_options();
            let connect = sqlx::PgConnection::connect_with(&options);
            match crate::db::answered(within, "a readiness probe's connect", connect).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    Err(sqlx::Error::PoolTimedOut)
                }
                Err(e) => Err(e),
            }
        }
        other => other,
    };
    match result {
        Ok(_) => {
            deps.up("postgres");
            Ok(())
        }
        Err(e) => {
            deps.down("postgres", postgres_reason(&e));
            Err(e)
        }
    }
}

/// Waits until `pool` answers, retrying with a capped back-off. Returns an error only for a
/// configuration problem ([`postgres_is_configuration`]).
pub async fn wait_for_postgres(
    deps: &Dependencies,
    pool: &sqlx::PgPool,
) -> Result<(), sqlx::Error> {
    let mut backoff = Backoff::default();
    loop {
        match probe_postgres(deps, pool).await {
            Ok(()) => return Ok(()),
            Err(e) if postgres_is_configuration(&e) => return Err(e),
            Err(_) => tokio::time::sleep(backoff.next_wait()).await,
        }
    }
}

/// Probes Redis with `PING` through `client` and records the outcome.
#[cfg(feature = "redis")]
pub async fn probe_redis(deps: &Dependencies, client: &crate::redis_client::RedisClient) {
    let result = async {
        let mut conn = client.connect(Duration::from_secs(5)).await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    }
    .await;
    match result {
        Ok(_) => deps.up("redis"),
        Err(e) => deps.down("redis", redis_reason(&e)),
    }
}

/// A Redis error as a reason: its kind and text (the redis crate never puts the URL or the
/// password into an error).
#[cfg(feature = "redis")]
pub fn redis_reason(e: &redis::RedisError) -> String {
    e.to_string()
}

/// A Kafka client that only asks for metadata, remembering librdkafka's last error report:
/// a failed TLS handshake is only ever said there ("certificate verify failed ..."), and
/// that sentence is what `/readyz` should show rather than a bare time-out.
pub struct KafkaProbe {
    producer: rdkafka::producer::BaseProducer<ProbeContext>,
}

#[derive(Default)]
pub struct ProbeContext {
    /// The last error librdkafka reported, preferring a TLS or SASL one: after a failed
    /// handshake it goes on to say "1/1 brokers are down", which hides the cause.
    last_error: Mutex<Option<String>>,
}

fn is_security_error(reason: &str) -> bool {
    [
        "SSL",
        "certificate",
        "SASL",
        "Authentication",
        "authentication",
    ]
    .iter()
    .any(|w| reason.contains(w))
}

impl rdkafka::ClientContext for ProbeContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::warn!(%error, reason, "kafka client error");
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        let keep = last
            .as_deref()
            .is_some_and(|l| is_security_error(l) && !is_security_error(reason));
        if !keep {
            *last = Some(reason.to_owned());
        }
    }
}

impl rdkafka::producer::ProducerContext for ProbeContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

impl KafkaProbe {
    pub fn new(kafka: &crate::kafka::KafkaConnection) -> rdkafka::error::KafkaResult<Self> {
        Ok(Self {
            producer: kafka
                .client_config()
                .create_with_context(ProbeContext::default())?,
        })
    }

    /// One metadata request (blocking: run it off the async threads); records the outcome.
    pub fn probe(&self, deps: &Dependencies) {
        use rdkafka::producer::Producer;
        let client = self.producer.client();
        match client.fetch_metadata(None, Duration::from_secs(5)) {
            Ok(m) if !m.brokers().is_empty() => {
                *client
                    .context()
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                deps.up("kafka");
            }
            Ok(_) => deps.down("kafka", "the cluster named no brokers"),
            Err(e) => {
                // librdkafka hands its error events (a failed TLS handshake among them) to
                // the context only when the client is polled.
                self.producer.poll(Duration::from_millis(100));
                let said = client
                    .context()
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                deps.down("kafka", said.unwrap_or_else(|| e.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_required_dependencies_only() {
        let deps = Dependencies::new();
        deps.declare("postgres", true);
        deps.declare("redis", false);
        assert_eq!(deps.readiness().status, "unready");
        deps.up("postgres");
        assert_eq!(deps.readiness().status, "ready");
        deps.down("redis", "connection refused");
        let r = deps.readiness();
        assert_eq!(r.status, "ready");
        assert_eq!(
            r.dependencies["redis"].last_error.as_deref(),
            Some("connection refused")
        );
        deps.down("postgres", "io: connection refused");
        assert_eq!(deps.readiness().status, "unready");
        let text =
            String::from_utf8(crate::metrics_http::render(&[deps.registry()])).expect("utf8");
        assert!(
            text.contains("railhook_dependency_up{dependency=\"postgres\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("railhook_dependency_up{dependency=\"redis\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn declaring_twice_keeps_the_stricter_flag() {
        let deps = Dependencies::new();
        deps.declare("redis", false);
        deps.declare("redis", true);
        assert!(deps.readiness().dependencies["redis"].required);
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let mut b = Backoff::default();
        let waits: Vec<_> = (0..10).map(|_| b.next_wait()).collect();
        assert_eq!(waits[0], Duration::from_millis(250));
        assert_eq!(waits[1], Duration::from_millis(500));
        assert_eq!(*waits.last().expect("ten"), MAX_BACKOFF);
    }
}
