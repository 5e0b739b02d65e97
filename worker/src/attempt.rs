//! An Attempt and its Report, in words every transport shares (transport/: HTTP, Kafka,
//! SQS, RabbitMQ, NATS): what is sent towards one Delivery, for both directions (outgoing
//! Events and forwarded incoming webhooks), and how it ended.
//!
//! Invariants (each has a test in `tests/it/worker.rs`, `tests/it/transports.rs` or below):
//! 0. **Delivered means acknowledged.** Every transport reports `Delivered` only on the
//!    receiver's own acknowledgement: a 2xx status line, Kafka's `acks=all`, SQS's message
//!    id, AMQP's publisher confirm, JetStream's ack. Nothing is fire-and-forget.
//! 1. **The status line of a 2xx is delivery.** Once a 2xx status line arrived, the Attempt
//!    counts as delivered whether or not the body follows; the body is read only for an
//!    excerpt, briefly, and failing to read it changes nothing. Without this, a receiver
//!    that answered 2xx and then dawdled over its body collected the whole ladder: one
//!    Delivery, seven arrivals.
//! 2. **No DB, Redis or Kafka work while the request is in flight.** A transport holds only
//!    its clients towards receivers (see [`crate::transport::Transports::send`]); the outcome is written afterwards by
//!    `fence::finalise`. A slow write inside the request's time budget could otherwise turn
//!    a delivered webhook into a timeout and retry it.
//! 4. **One function classifies outcomes**: `retry_policy::classify`, with every other retry
//!    rule.
//! 5. `Retry-After` on 429/503 is reported so the retry policy can honour it within bounds.
//!
//! (Invariants 3 and 6 are kept by `fence::finalise`: it writes only behind the Fence, and
//! records an Attempt row for every request actually sent.)

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use railhook_common::endpoint_auth::{ClientCertificate, OAuth2Client};
use railhook_common::headers::{self, Extra};
use railhook_common::signing::{SigningKey, signature_header};
use railhook_common::transport::TransportSettings;
use railhook_common::vocabulary::AttemptResult;

pub use crate::transport::http::{ClientError, Runner};

pub use railhook_common::headers::USER_AGENT_VALUE;
/// How much of a response body is kept for the Attempt row.
pub const EXCERPT_BYTES: usize = 1024;
/// How long the runner waits for that excerpt after the status line.
pub const EXCERPT_WAIT: Duration = Duration::from_secs(1);

/// What to send.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The Delivery id: `webhook-id`, stable across retries.
    pub delivery_id: String,
    pub event_id: String,
    pub event_type: String,
    /// POST, or PUT when the endpoint's transformation asked for it.
    pub method: reqwest::Method,
    pub url: url::Url,
    pub body: Bytes,
    /// Forwarded provider headers and the endpoint's custom ones, and the body's media type
    /// (`application/json` unless a forwarded webhook said otherwise): common/src/headers.rs.
    pub extra: Extra,
    /// Every active signing key (two during a rotation's overlap).
    pub keys: Vec<SigningKey>,
    pub timeout: Duration,
    pub sequence_number: Option<i64>,
    /// W3C trace context for the receiver: the Event's trace, this Attempt as the parent
    /// (common/src/trace_context.rs), and the `tracestate` the sender gave.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The endpoint, and its application: what a broker's ordering key may be made of.
    pub endpoint_id: String,
    pub application_id: Option<String>,
    /// What carries it: `None` is HTTP to `url`; otherwise the endpoint's opened settings
    /// (`url` is then only the target's display name).
    pub via: Option<Arc<TransportSettings>>,
    /// HTTP: the client certificate to present (mutual TLS), when the endpoint has one.
    pub identity: Option<Arc<ClientCertificate>>,
    /// HTTP: the OAuth2 client whose bearer token goes with the request.
    pub oauth: Option<Arc<OAuth2Client>>,
    /// What the endpoint's transformation made of the Event (method, URL, added headers,
    /// body), as JSON: recorded with the Attempt (`attempts.request`). `None`: untransformed.
    pub transformed: Option<String>,
}

impl Attempt {
    /// The signed headers, as common/src/headers.rs lays them out (the dashboard shows the
    /// same list): HTTP sends them as request headers, brokers as message headers or
    /// attributes, so a consumer verifies a message as an HTTP receiver does.
    pub fn signed_headers(&self, timestamp: i64) -> Vec<(String, String)> {
        let timestamp_text = timestamp.to_string();
        let signature = signature_header(&self.keys, &self.delivery_id, timestamp, &self.body);
        headers::request_headers(&headers::Request {
            delivery_id: &self.delivery_id,
            event_id: &self.event_id,
            event_type: &self.event_type,
            timestamp: &timestamp_text,
            signature: &signature,
            sequence_number: self.sequence_number,
            traceparent: self.traceparent.as_deref(),
            tracestate: self.tracestate.as_deref(),
            extra: &self.extra,
        })
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
    }
}

/// How an Attempt ended, decided by `retry_policy::classify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Retry { retry_after: Option<Duration> },
    Failed { gone: bool },
}

impl Outcome {
    /// The word `attempts.outcome` records for it.
    pub fn recorded(&self) -> railhook_common::AttemptOutcome {
        use railhook_common::AttemptOutcome;
        match self {
            Outcome::Delivered => AttemptOutcome::Succeeded,
            Outcome::Retry { .. } => AttemptOutcome::Retry,
            Outcome::Failed { .. } => AttemptOutcome::Failed,
        }
    }
}

/// Why a request produced no status line (or was never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Timeout,
    Connect,
    Reset,
    /// The SSRF guard refused the target address; nothing was sent.
    TargetRefused,
    Request,
    /// A broker could not be reached or did not acknowledge (connection lost, no
    /// confirm, a nack, a timeout waiting for the ack): worth another Attempt.
    BrokerUnavailable,
    /// A broker said to slow down (SQS throttling, Kafka quota): another Attempt, later.
    BrokerThrottled,
    /// A broker refused the message in a way a retry will not change (no such topic,
    /// queue or exchange, access refused, too large).
    BrokerRefused,
    /// The endpoint's OAuth2 token endpoint could not be reached, timed out or answered
    /// 5xx/429: no token, so nothing went to the receiver; worth another Attempt.
    OAuthTokenUnavailable,
    /// The token endpoint refused the client (4xx: a wrong or revoked secret): retried on
    /// the ladder, so a fixed client still gets every Delivery.
    OAuthTokenRefused,
}

impl ErrorClass {
    /// The Attempt's result when nothing came back, and why.
    pub fn result(self) -> AttemptResult {
        match self {
            ErrorClass::Timeout => AttemptResult::Timeout,
            ErrorClass::Connect => AttemptResult::Connect,
            ErrorClass::Reset => AttemptResult::Reset,
            ErrorClass::TargetRefused => AttemptResult::TargetRefused,
            ErrorClass::Request => AttemptResult::Request,
            ErrorClass::BrokerUnavailable => AttemptResult::BrokerUnavailable,
            ErrorClass::BrokerThrottled => AttemptResult::BrokerThrottled,
            ErrorClass::BrokerRefused => AttemptResult::BrokerRefused,
            ErrorClass::OAuthTokenUnavailable => AttemptResult::OAuthTokenUnavailable,
            ErrorClass::OAuthTokenRefused => AttemptResult::OAuthTokenRefused,
        }
    }

    pub fn as_str(self) -> &'static str {
        railhook_common::Word::as_str(self.result())
    }
}

/// What happened, for `fence::finalise` to write.
#[derive(Debug, Clone)]
pub struct Report {
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
    pub status: Option<u16>,
    pub outcome: Outcome,
    pub error: Option<ErrorClass>,
    pub excerpt: Option<String>,
    /// False when nothing went on the wire (the SSRF guard refused the target).
    pub sent: bool,
    /// What a transformed Attempt sent ([`Attempt::transformed`]), for the Attempt row.
    pub request: Option<String>,
}

impl Report {
    /// The `result` label of `railhook_worker_attempt_duration_seconds`: what the receiver
    /// did, or why nothing came back.
    pub fn result(&self) -> AttemptResult {
        if self.status.is_none() && self.outcome == Outcome::Delivered {
            // A broker's acknowledgement.
            return AttemptResult::Success;
        }
        match (self.status, self.error) {
            (Some(s), _) if (200..300).contains(&s) => AttemptResult::Success,
            (Some(s), _) if (400..500).contains(&s) => AttemptResult::Http4xx,
            (Some(s), _) if s >= 500 => AttemptResult::Http5xx,
            (Some(_), _) => AttemptResult::HttpOther,
            (None, Some(e)) => e.result(),
            (None, None) => AttemptResult::Request,
        }
    }
}
