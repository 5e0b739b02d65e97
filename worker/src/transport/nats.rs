//! NATS JetStream as a transport: one client per endpoint's settings; an Attempt is
//! delivered when JetStream acknowledges the publish (the stream and its sequence are the
//! evidence). Core NATS has no acknowledgement, so an endpoint must say `jetstream: true`
//! (common/src/transport/ refuses the other).
//!
//! `Nats-Msg-Id` is the Delivery id, so JetStream's own duplicate window drops an Attempt
//! re-sent after a lost ack; the Standard Webhooks headers travel as NATS headers. One
//! client per endpoint publishes in the order the worker sends.
//!
//! "No stream for the subject" is refused only when JetStream itself answers (its account
//! info): a server that just restarted answers "no responders" until its streams are back,
//! and that is worth another Attempt.
//!
//! SSRF: the server's name is resolved and checked by the guard (mod.rs), and a plain
//! `nats://` connection is opened to the checked address; `tls://` keeps the name for the
//! certificate check (docs/DESTINATIONS.md). The client's reconnects go to the same address.

use std::sync::Arc;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, Context};
use railhook_common::transport::NatsTarget;

use super::{BrokerError, Pool, Stopwatch, guard, pool_key};
use crate::attempt::{Attempt, ErrorClass, Report};
use crate::ssrf::Allowlist;

#[derive(Clone)]
pub struct Streams {
    pool: Arc<Pool<Context>>,
    allow: Allowlist,
}

impl Streams {
    pub fn new(allow: Allowlist) -> Self {
        Self {
            pool: Arc::new(Pool::default()),
            allow,
        }
    }

    pub async fn send(&self, a: &Attempt, n: &NatsTarget) -> Report {
        let watch = Stopwatch::start();
        let key = pool_key(n, "");
        let answer = tokio::time::timeout(a.timeout, async {
            let js = self.pool.get(&key, open(n, &self.allow, a)).await?;
            publish(&js, a, n).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(BrokerError::unavailable(
                "nats: no JetStream ack within the timeout",
            ))
        });
        if matches!(&answer, Err(e) if e.class == ErrorClass::TargetRefused) {
            self.pool.forget(&key);
        }
        watch.report(answer)
    }
}

async fn open(n: &NatsTarget, allow: &Allowlist, a: &Attempt) -> Result<Context, BrokerError> {
    let mut url = url::Url::parse(&n.url)
        .map_err(|_| BrokerError::refused("nats: the URL does not parse"))?;
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port().unwrap_or(4222);
    let addrs = guard(allow, &host, port).await?;
    if url.scheme() == "nats"
        && let Some(first) = addrs.first()
    {
        let _ = url.set_ip_host(first.ip());
    }
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(a.timeout)
        .name("railhook")
        .connect(url.as_str())
        .await
        .map_err(|e| {
            let message = format!("nats: {e}");
            match e.kind() {
                async_nats::ConnectErrorKind::AuthorizationViolation
                | async_nats::ConnectErrorKind::Authentication => BrokerError::refused(message),
                _ => BrokerError::unavailable(message),
            }
        })?;
    let mut js = jetstream::new(client);
    js.set_timeout(a.timeout);
    Ok(js)
}

/// Whether JetStream itself answers (its account info request gets a reply), read raw so a
/// server older than the client's account-info model still counts.
async fn jetstream_answers(js: &Context) -> bool {
    let client = js.client();
    let request = client.request("$JS.API.INFO", bytes::Bytes::new());
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), request).await,
        Ok(Ok(reply)) if !reply.payload.is_empty()
    )
}

async fn publish(js: &Context, a: &Attempt, n: &NatsTarget) -> Result<String, BrokerError> {
    let mut headers = async_nats::HeaderMap::new();
    for (name, value) in a.signed_headers(chrono::Utc::now().timestamp()) {
        headers.insert(name.to_ascii_lowercase().as_str(), value.as_str());
    }
    headers.insert("Nats-Msg-Id", a.delivery_id.as_str());
    let acked = match js
        .publish_with_headers(n.subject.clone(), headers, a.body.clone())
        .await
    {
        Ok(pending) => pending.await,
        Err(e) => Err(e),
    };
    match acked {
        Ok(ack) => Ok(format!(
            "nats: JetStream ack, stream {} sequence {}{}",
            ack.stream,
            ack.sequence,
            if ack.duplicate {
                " (a duplicate, dropped by JetStream)"
            } else {
                ""
            }
        )),
        Err(e) => {
            let message = format!("nats: {e}");
            match e.kind() {
                PublishErrorKind::StreamNotFound if jetstream_answers(js).await => {
                    Err(BrokerError::refused(message))
                }
                PublishErrorKind::MaxPayloadExceeded => Err(BrokerError::refused(message)),
                _ => Err(BrokerError::unavailable(message)),
            }
        }
    }
}
