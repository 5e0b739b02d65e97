//! What carries an Attempt (docs/DESTINATIONS.md): HTTP, Kafka, Amazon SQS, RabbitMQ or
//! NATS JetStream. The turn (turn.rs) hands a transport-neutral [`Attempt`] to
//! [`Transports::send`] and gets back a transport-neutral [`Report`]; the Claim, the Fence,
//! the ladders, the breaker, the limits and the metrics never see which kind made it.
//!
//! Invariants kept by every kind (numbers as in attempt.rs):
//! - 0: `Delivered` only on the receiver's own acknowledgement.
//! - 2: a transport holds only its clients towards receivers: no database, Redis or
//!   Railhook-Kafka work while an Attempt is in flight.
//! - 4: outcomes are read by `retry_policy::classify` (HTTP) and
//!   `retry_policy::classify_broker` (brokers), nowhere else.
//! - The egress rule (ssrf.rs) sees every address a transport connects to before the
//!   socket connects, and the socket connects to the address it saw (`guard`; librdkafka's
//!   `connect_cb` for every Kafka broker connection, kafka.rs).
//! - Connections are pooled per target (one connection per endpoint's settings, so a
//!   broker keeps one endpoint's publish order) and closed once unused for [`IDLE`]
//!   (checked when an Attempt of that kind is made, at most once a minute).

pub mod amqp;
pub mod http;
pub mod kafka;
pub mod nats;
pub mod oauth;
pub mod sqs;
pub mod tunnel;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use railhook_common::transport::TransportSettings;

use crate::attempt::{Attempt, ErrorClass, Report};
use crate::retry_policy::classify_broker;
use crate::ssrf::Allowlist;

/// How long an unused broker connection stays open.
pub const IDLE: Duration = Duration::from_secs(300);

/// Every transport, each holding only its clients.
#[derive(Clone)]
pub struct Transports {
    pub http: http::Runner,
    kafka: kafka::Producers,
    sqs: sqs::Queues,
    amqp: amqp::Channels,
    nats: nats::Streams,
    /// Sends `railhook listen` Attempts to the API instance holding the session: any
    /// address, no proxy (the URL is Railhook's own, see `ListenTarget`).
    listen: http::Runner,
}

impl Transports {
    pub fn new(allow: Allowlist, egress: &http::EgressConfig) -> Result<Self, http::ClientError> {
        let http = http::Runner::with_egress(allow.clone(), egress)?;
        Ok(Self {
            sqs: sqs::Queues::new(http.clone()),
            kafka: kafka::Producers::new(allow.clone()),
            amqp: amqp::Channels::new(allow.clone()),
            nats: nats::Streams::new(allow),
            listen: http::Runner::new(Allowlist::everything())?,
            http,
        })
    }

    /// Makes one Attempt by the endpoint's transport. Invariant 2: nothing here reaches
    /// Railhook's own database, Redis or Kafka.
    pub async fn send(&self, a: &Attempt) -> Report {
        match a.via.as_deref() {
            None => self.http.run(a).await,
            Some(TransportSettings::Kafka(k)) => self.kafka.send(a, k).await,
            Some(TransportSettings::Sqs(s)) => self.sqs.send(a, s).await,
            Some(TransportSettings::Rabbitmq(r)) => self.amqp.send(a, r).await,
            Some(TransportSettings::Nats(n)) => self.nats.send(a, n).await,
            // A polling endpoint's receiver reads the Delivery by its Sequence Number, which
            // the ingest (or the ordering gate, before this turn) gave it: taking its place
            // in that order is the whole Attempt (docs/POLLING.md).
            // Railhook's own API instance, which answers with the developer's receiver's
            // answer: an HTTP Attempt to a URL the API wrote, not a tenant (no egress rule).
            Some(TransportSettings::Listen(l)) => match url::Url::parse(&l.relay_url) {
                Ok(url) => {
                    let mut relayed = a.clone();
                    relayed.url = url;
                    self.listen.run(&relayed).await
                }
                Err(_) => Stopwatch::start().report(Err(BrokerError::refused(
                    "the listen session's relay URL does not parse",
                ))),
            },
            Some(TransportSettings::Poller(_)) => Stopwatch::start().report(Ok(format!(
                "available to pollers at sequence {}",
                a.sequence_number
                    .map_or_else(|| "?".to_owned(), |n| n.to_string())
            ))),
        }
    }
}

/// Why a broker did not acknowledge, in Railhook's words.
#[derive(Debug, Clone)]
pub struct BrokerError {
    pub class: ErrorClass,
    /// The broker's own words (its code and message), for the Attempt row's excerpt.
    pub message: String,
    /// A throttling broker's hint, when it gave one.
    pub retry_after: Option<Duration>,
}

impl BrokerError {
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::BrokerUnavailable, message)
    }
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::BrokerRefused, message)
    }
    /// Refused by the egress rule (ssrf.rs): nothing was sent.
    pub fn target_refused(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::TargetRefused, message)
    }
    pub fn throttled(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::BrokerThrottled, message)
    }
    fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// The clock of one broker Attempt, and its report once the broker answered.
pub(crate) struct Stopwatch {
    started_at: DateTime<Utc>,
    clock: Instant,
}

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Self {
            started_at: Utc::now(),
            clock: Instant::now(),
        }
    }

    /// `evidence`: the broker's acknowledgement (partition and offset, message id, stream
    /// sequence), kept as the Attempt's excerpt.
    pub(crate) fn report(self, answer: Result<String, BrokerError>) -> Report {
        let duration = self.clock.elapsed();
        let (error, excerpt, retry_after) = match answer {
            Ok(evidence) => (None, Some(evidence), None),
            Err(e) => (Some(e.class), Some(e.message), e.retry_after),
        };
        let mut excerpt = excerpt;
        if let Some(text) = &mut excerpt {
            railhook_common::text::truncate_at_char(text, crate::attempt::EXCERPT_BYTES);
        }
        Report {
            started_at: self.started_at,
            duration,
            status: None,
            outcome: classify_broker(error, retry_after),
            error,
            excerpt,
            sent: error != Some(ErrorClass::TargetRefused),
            request: None,
        }
    }
}

/// The egress rule (ssrf.rs, `addresses`) for a broker address, in a broker Attempt's
/// words. Returns the addresses to connect to: the checked ones, so there is no window
/// for the name to resolve elsewhere in between.
pub(crate) async fn guard(
    allow: &Allowlist,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, BrokerError> {
    crate::ssrf::addresses(allow, host, port)
        .await
        .map_err(|e| match e {
            crate::ssrf::Unreachable::Refused(r) => BrokerError::target_refused(r.to_string()),
            other => BrokerError::unavailable(other.to_string()),
        })
}

/// Connections towards brokers, one per target's settings (the key), opened on first use
/// and closed after [`IDLE`] unused. A connection that failed is forgotten, so the next
/// Attempt opens a new one. HTTP keeps its clients per TLS identity here too (http.rs
/// `Ways`), and OAuth2 its token per endpoint (oauth.rs).
pub(crate) struct Pool<C: Clone> {
    entries: Mutex<HashMap<String, (C, Instant)>>,
    swept: Mutex<Instant>,
}

impl<C: Clone> Default for Pool<C> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            swept: Mutex::new(Instant::now()),
        }
    }
}

impl<C: Clone> Pool<C> {
    /// The open connection for `key`, or one opened by `open` (outside the lock: a slow
    /// broker does not hold up another endpoint's Attempts).
    pub(crate) async fn get<F>(&self, key: &str, open: F) -> Result<C, BrokerError>
    where
        F: Future<Output = Result<C, BrokerError>>,
    {
        self.sweep();
        if let Ok(mut entries) = self.entries.lock()
            && let Some((conn, used)) = entries.get_mut(key)
        {
            *used = Instant::now();
            return Ok(conn.clone());
        }
        let conn = open.await?;
        if let Ok(mut entries) = self.entries.lock() {
            // Another Attempt may have opened one meanwhile: keep the first, drop ours.
            let entry = entries
                .entry(key.to_owned())
                .or_insert_with(|| (conn, Instant::now()));
            return Ok(entry.0.clone());
        }
        Ok(conn)
    }

    pub(crate) fn forget(&self, key: &str) {
        drop(self.take(key));
    }

    /// Removes `key`'s connection and hands it over (to be closed).
    pub(crate) fn take(&self, key: &str) -> Option<C> {
        self.entries
            .lock()
            .ok()
            .and_then(|mut entries| entries.remove(key))
            .map(|(conn, _)| conn)
    }

    /// Drops connections unused for [`IDLE`], at most once a minute.
    fn sweep(&self) {
        let Ok(mut swept) = self.swept.lock() else {
            return;
        };
        if swept.elapsed() < Duration::from_secs(60) {
            return;
        }
        *swept = Instant::now();
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, (_, used)| used.elapsed() < IDLE);
        }
    }
}

/// A pool's key: the target's settings, credentials included (a changed setting opens a
/// new connection), and the Attempt timeout where a client is built around it.
pub(crate) fn pool_key(settings: &impl serde::Serialize, extra: &str) -> String {
    let mut key = serde_json::to_string(settings).unwrap_or_default();
    key.push('|');
    key.push_str(extra);
    key
}

/// The ordering key of an Attempt: the endpoint (the default), the Event, the endpoint's
/// application, or a JSON pointer into the payload; what a Kafka key or an SQS FIFO group
/// id is made of.
pub(crate) fn ordering_key(a: &Attempt, rule: &str) -> String {
    match rule {
        "event_id" => a.event_id.clone(),
        "application" => a
            .application_id
            .clone()
            .unwrap_or_else(|| a.endpoint_id.clone()),
        pointer if pointer.starts_with('/') => serde_json::from_slice::<serde_json::Value>(&a.body)
            .ok()
            .and_then(|v| match v.pointer(pointer) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| a.endpoint_id.clone()),
        _ => a.endpoint_id.clone(),
    }
}
