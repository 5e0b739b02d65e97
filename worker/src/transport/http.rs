//! HTTP, one transport among equals: the Attempt as a signed POST, through the SSRF guard
//! (ssrf.rs) as the client's resolver. Invariants 1, 2 and 5 of attempt.rs are kept here.

use std::time::Duration;

use chrono::Utc;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::attempt::{Attempt, EXCERPT_BYTES, EXCERPT_WAIT, ErrorClass, Report};
use crate::retry_policy::classify;
use crate::ssrf::{Allowlist, GuardedResolver, Refused};

/// The client every HTTP Attempt (and SQS) goes through.
fn guarded_client(allow: &Allowlist) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
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
        .build()
}

pub(crate) fn error_class(e: &reqwest::Error) -> ErrorClass {
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
        let client = guarded_client(&allow)?;
        Ok(Self { client, allow })
    }

    /// The client, for a transport that speaks HTTP to a broker (SQS).
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Literal IP hosts never reach the guarded resolver; they are checked here.
    pub(crate) fn literal_refused(&self, url: &url::Url) -> bool {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => !self.allow.permits(ip.into()),
            Some(url::Host::Ipv6(ip)) => !self.allow.permits(ip.into()),
            _ => false,
        }
    }

    /// The request's headers: the Attempt's signed headers.
    fn headers(a: &Attempt, timestamp: i64) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in a.signed_headers(timestamp) {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                h.insert(n, v);
            }
        }
        h
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
