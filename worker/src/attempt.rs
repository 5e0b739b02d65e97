//! The Attempt Runner: one HTTP request towards one Delivery, for both directions (outgoing
//! Events and forwarded incoming webhooks).
//!
//! Invariants (each has a test in `tests/it/worker.rs` or below):
//! 1. **The status line of a 2xx is delivery.** Once a 2xx status line arrived, the Attempt
//!    counts as delivered whether or not the body follows; the body is read only for an
//!    excerpt, briefly, and failing to read it changes nothing. Without this, a receiver
//!    that answered 2xx and then dawdled over its body collected the whole ladder: one
//!    Delivery, seven arrivals.
//! 2. **No DB, Redis or Kafka work while the request is in flight.** The runner holds only
//!    an HTTP client (see [`Runner::run`]'s signature); the outcome is written afterwards by
//!    `fence::finalise`. A slow write inside the request's time budget could otherwise turn
//!    a delivered webhook into a timeout and retry it.
//! 4. **One function classifies outcomes**: `retry_policy::classify`, with every other retry
//!    rule.
//! 5. `Retry-After` on 429/503 is reported so the retry policy can honour it within bounds.
//!
//! (Invariants 3 and 6 are kept by `fence::finalise`: it writes only behind the Fence, and
//! records an Attempt row for every request actually sent.)

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use railhook_common::headers::{self, Extra};
use railhook_common::signing::{SigningKey, signature_header};
use railhook_common::vocabulary::AttemptResult;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::retry_policy::classify;
use crate::ssrf::{Allowlist, GuardedResolver, Refused};

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
}

impl Report {
    /// The `result` label of `railhook_worker_attempt_duration_seconds`: what the receiver
    /// did, or why nothing came back.
    pub fn result(&self) -> AttemptResult {
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

fn error_class(e: &reqwest::Error) -> ErrorClass {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<Refused>() {
            return ErrorClass::TargetRefused;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return ErrorClass::Reset;
        }
        source = err.source();
    }
    if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_connect() {
        ErrorClass::Connect
    } else {
        ErrorClass::Request
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client")]
pub struct ClientError(#[from] reqwest::Error);

/// Sends Attempts. Holds an HTTP client and the SSRF allowlist, and nothing else.
#[derive(Clone)]
pub struct Runner {
    client: reqwest::Client,
    allow: Allowlist,
}

impl Runner {
    pub fn new(allow: Allowlist) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            // Never through an ambient proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY): through one,
            // the guarded resolver would see only the proxy's host and the proxy would reach
            // whatever address the endpoint's name has, private ones included.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(std::sync::Arc::new(GuardedResolver {
                allow: allow.clone(),
            }))
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self { client, allow })
    }

    /// The request's headers, as common/src/headers.rs lays them out (the dashboard shows
    /// the same list).
    fn headers(a: &Attempt, timestamp: i64) -> HeaderMap {
        let timestamp_text = timestamp.to_string();
        let signature = signature_header(&a.keys, &a.delivery_id, timestamp, &a.body);
        let pairs = headers::request_headers(&headers::Request {
            delivery_id: &a.delivery_id,
            event_id: &a.event_id,
            event_type: &a.event_type,
            timestamp: &timestamp_text,
            signature: &signature,
            sequence_number: a.sequence_number,
            traceparent: a.traceparent.as_deref(),
            tracestate: a.tracestate.as_deref(),
            extra: &a.extra,
        });
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                h.insert(n, v);
            }
        }
        h
    }

    /// Literal IP hosts never reach the guarded resolver; they are checked here.
    fn literal_refused(&self, url: &url::Url) -> bool {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => !self.allow.permits(ip.into()),
            Some(url::Host::Ipv6(ip)) => !self.allow.permits(ip.into()),
            _ => false,
        }
    }

    /// Runs one Attempt. Invariant 2: this function can reach nothing but the network.
    pub async fn run(&self, a: &Attempt) -> Report {
        let started_at = Utc::now();
        let clock = std::time::Instant::now();
        if self.literal_refused(&a.url) {
            return Report {
                started_at,
                duration: clock.elapsed(),
                status: None,
                outcome: classify(None, Some(ErrorClass::TargetRefused), None),
                error: Some(ErrorClass::TargetRefused),
                excerpt: None,
                sent: false,
            };
        }
        let request = self
            .client
            .post(a.url.clone())
            .headers(Self::headers(a, started_at.timestamp()))
            .body(a.body.clone());
        let response = match tokio::time::timeout(a.timeout, request.send()).await {
            Err(_) => Err(ErrorClass::Timeout),
            Ok(Err(e)) => Err(error_class(&e)),
            Ok(Ok(r)) => Ok(r),
        };
        match response {
            Err(class) => Report {
                started_at,
                duration: clock.elapsed(),
                status: None,
                outcome: classify(None, Some(class), None),
                error: Some(class),
                excerpt: None,
                sent: class != ErrorClass::TargetRefused,
            },
            Ok(mut response) => {
                // Invariant 1: decided here, on the status line alone.
                let status = response.status();
                let outcome = classify(Some(status), None, Some(response.headers()));
                let duration = clock.elapsed();
                let excerpt = read_excerpt(&mut response).await;
                Report {
                    started_at,
                    duration,
                    status: Some(status.as_u16()),
                    outcome,
                    error: None,
                    excerpt,
                    sent: true,
                }
            }
        }
    }
}

/// Up to [`EXCERPT_BYTES`] of the body, waiting at most [`EXCERPT_WAIT`]; whatever arrived.
async fn read_excerpt(response: &mut reqwest::Response) -> Option<String> {
    let mut buf = Vec::new();
    let read = async {
        while buf.len() < EXCERPT_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(EXCERPT_WAIT, read).await;
    buf.truncate(EXCERPT_BYTES);
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}
