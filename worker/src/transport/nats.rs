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
//! Egress: the server's name is resolved and checked by the egress rule (ssrf.rs), and the
//! client is given the checked address, never the name, so neither its first connection
//! nor a reconnection resolves anything. It ignores the servers a server announces in its
//! `INFO` (`connect_urls`), which would otherwise join its reconnect pool unchecked
//! (issue #53). `tls://` verifies the certificate against the endpoint's name
//! ([`NamedVerifier`]), not against the address connected to.

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
    let host = crate::ssrf::host_of(&url)
        .ok_or_else(|| BrokerError::refused("nats: the URL has no host"))?;
    let port = url.port().unwrap_or(4222);
    let addrs = guard(allow, &host, port).await?;
    let checked = addrs[0];
    let _ = url.set_ip_host(checked.ip());
    let _ = url.set_port(Some(checked.port()));
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(a.timeout)
        .name("railhook")
        .ignore_discovered_servers();
    if url.scheme() == "tls" {
        options = options.require_tls(true).tls_client_config(tls_for(&host)?);
    }
    let client = options.connect(url.as_str()).await.map_err(|e| {
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

/// TLS towards a server reached by its checked address: the system's roots, and the
/// certificate verified against the endpoint's own host name.
fn tls_for(name: &str) -> Result<rustls::ClientConfig, BrokerError> {
    let bad = |e: String| BrokerError::refused(format!("nats: TLS settings: {e}"));
    let expected =
        rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| bad(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| bad(e.to_string()))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NamedVerifier {
            expected,
            inner: Arc::new(inner),
        }))
        .with_no_client_auth();
    Ok(config)
}

/// Verifies a server's certificate against the name the endpoint gave, whatever address the
/// connection was made to (the checked one).
#[derive(Debug)]
struct NamedVerifier {
    expected: rustls::pki_types::ServerName<'static>,
    inner: Arc<dyn rustls::client::danger::ServerCertVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _connected_to: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        self.inner.verify_server_cert(
            end_entity,
            intermediates,
            &self.expected,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
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
