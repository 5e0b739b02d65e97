//! HTTP, one transport among equals: the Attempt as a signed POST, through the SSRF guard
//! (ssrf.rs) as the client's resolver, directly or through the egress proxy (tunnel.rs).
//! Invariants 1, 2 and 5 of attempt.rs are kept here.
//!
//! An endpoint's client certificate (mutual TLS) selects a client of its own, built once
//! per certificate and kept while used ([`Ways`]); its OAuth2 client credentials add a
//! bearer token (oauth.rs), and a `401` to a token fetches one new token and sends once
//! more, inside the same Attempt.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::Utc;
use http_body_util::BodyExt;
use railhook_common::endpoint_auth::ClientCertificate;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};

use super::oauth::Tokens;
use super::tunnel::{self, Proxy, ProxyRefused};
use super::{BrokerError, Pool, pool_key};
use crate::attempt::{Attempt, EXCERPT_BYTES, EXCERPT_WAIT, ErrorClass, Report};
use crate::retry_policy::classify;
use crate::ssrf::{Allowlist, GuardedResolver, Refused};

/// How the worker reaches endpoints over TLS and through which proxy (config.rs).
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    /// Extra trust roots (PEM), beside the system's.
    pub ca_file: Option<PathBuf>,
    /// `RAILHOOK_EGRESS_PROXY`.
    pub proxy: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the HTTP client")]
    Build(#[from] reqwest::Error),
    #[error("cannot build the TLS settings: {0}")]
    Tls(#[from] rustls::Error),
    #[error("RAILHOOK_EGRESS_CA_FILE: {0}")]
    CaFile(String),
    #[error("RAILHOOK_EGRESS_PROXY: {0}")]
    Proxy(String),
}

/// One request: what an Attempt or a token fetch sends.
pub struct Exchange {
    /// POST, or PUT when a transformation asked for it.
    pub method: reqwest::Method,
    pub url: url::Url,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Exchange {
    /// A POST: what every exchange but a transformed Attempt is.
    pub fn post(url: url::Url, headers: Vec<(String, String)>, body: Bytes) -> Self {
        Exchange {
            method: reqwest::Method::POST,
            url,
            headers,
            body,
        }
    }
}

/// A response's status line and headers; its body is read only on demand.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: AnswerBody,
}

enum AnswerBody {
    Direct(reqwest::Response),
    Tunnel(hyper::body::Incoming),
}

impl Answer {
    /// Up to `limit` bytes of the body, waiting at most `wait`; whatever arrived.
    pub async fn read_body(self, limit: usize, wait: Duration) -> Vec<u8> {
        let mut buf = Vec::new();
        let read = async {
            match self.body {
                AnswerBody::Direct(mut r) => {
                    while buf.len() < limit {
                        match r.chunk().await {
                            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
                            _ => break,
                        }
                    }
                }
                AnswerBody::Tunnel(mut b) => {
                    while buf.len() < limit {
                        match b.frame().await {
                            Some(Ok(frame)) => {
                                if let Some(data) = frame.data_ref() {
                                    buf.extend_from_slice(data);
                                }
                            }
                            _ => break,
                        }
                    }
                }
            }
        };
        let _ = tokio::time::timeout(wait, read).await;
        buf.truncate(limit);
        buf
    }
}

/// One way out: directly (reqwest, the guard as its resolver, literal hosts checked in
/// [`Way::send`]) or through the egress proxy (its connector checks, tunnel.rs).
#[derive(Clone)]
pub enum Way {
    Direct(reqwest::Client, Allowlist),
    Tunnel(Arc<tunnel::Client>),
}

impl Way {
    /// Sends `x`; an error is why no status line came back. Every HTTP request the worker
    /// makes (an Attempt, an OAuth2 token request, an SQS call) is sent here, so this is
    /// where a literal IP host meets the egress rule: hyper's connector never asks the
    /// resolver about one (issue #53: an OAuth2 `token_url` of `http://127.0.0.1:…` was
    /// requested and its answer shown as the Attempt's excerpt).
    pub async fn send(&self, x: Exchange) -> Result<Answer, ErrorClass> {
        let mut headers = HeaderMap::new();
        for (name, value) in &x.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(n, v);
            }
        }
        match self {
            Way::Direct(client, allow) => {
                if allow.refuses_url(&x.url).is_some() {
                    return Err(ErrorClass::TargetRefused);
                }
                let r = client
                    .request(x.method, x.url)
                    .headers(headers)
                    .body(x.body)
                    .send()
                    .await
                    .map_err(|e| error_class(&e))?;
                Ok(Answer {
                    status: r.status(),
                    headers: r.headers().clone(),
                    body: AnswerBody::Direct(r),
                })
            }
            Way::Tunnel(client) => {
                let mut request = hyper::Request::builder()
                    .method(x.method)
                    .uri(x.url.as_str())
                    .body(http_body_util::Full::new(x.body))
                    .map_err(|_| ErrorClass::Request)?;
                *request.headers_mut() = headers;
                let r = client
                    .request(request)
                    .await
                    .map_err(|e| tunnel_error_class(&e))?;
                let (parts, body) = r.into_parts();
                Ok(Answer {
                    status: parts.status,
                    headers: parts.headers,
                    body: AnswerBody::Tunnel(body),
                })
            }
        }
    }
}

/// The ways out, one per TLS identity: the shared one, and one per client certificate in
/// use, kept in the brokers' connection [`Pool`] (keyed by certificate and key, forgotten
/// once unused for [`super::IDLE`]).
#[derive(Clone)]
pub struct Ways {
    allow: Allowlist,
    extra_roots: Arc<Vec<rustls::pki_types::CertificateDer<'static>>>,
    proxy: Option<Arc<Proxy>>,
    shared: Way,
    by_identity: Arc<Pool<Way>>,
}

impl Ways {
    fn new(allow: Allowlist, egress: &EgressConfig) -> Result<Self, ClientError> {
        let extra_roots = match &egress.ca_file {
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                let pem = std::fs::read(path).map_err(|e| ClientError::CaFile(e.to_string()))?;
                rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| ClientError::CaFile("not a PEM bundle".into()))?
            }
            None => Vec::new(),
        };
        let proxy = egress
            .proxy
            .as_deref()
            .map(Proxy::parse)
            .transpose()
            .map_err(ClientError::Proxy)?
            .map(Arc::new);
        let mut ways = Self {
            allow,
            extra_roots: Arc::new(extra_roots),
            proxy,
            shared: Way::Direct(reqwest::Client::new(), Allowlist::default()),
            by_identity: Arc::new(Pool::default()),
        };
        ways.shared = ways.build(None)?;
        Ok(ways)
    }

    /// A rustls configuration with the system's roots and the extra ones.
    fn tls(
        &self,
        identity: Option<&ClientCertificate>,
        alpn: bool,
    ) -> Result<Arc<rustls::ClientConfig>, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
            self.extra_roots.iter().cloned(),
            provider.clone(),
        )?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(cert) => {
                let (chain, key) = identity_parts(cert).ok_or_else(|| {
                    ClientError::Tls(rustls::Error::General("bad identity".into()))
                })?;
                builder.with_client_auth_cert(chain, key)?
            }
        };
        if alpn {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        Ok(Arc::new(config))
    }

    fn build(&self, identity: Option<&ClientCertificate>) -> Result<Way, ClientError> {
        if let Some(proxy) = &self.proxy {
            return Ok(Way::Tunnel(Arc::new(tunnel::client(
                proxy.clone(),
                self.allow.clone(),
                self.tls(None, false)?,
                self.tls(identity, true)?,
            ))));
        }
        let mut builder = reqwest::Client::builder()
            // Never through an ambient proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY): through
            // one, the guarded resolver would see only the proxy's host and the proxy would
            // reach whatever address the endpoint's name has, private ones included. The
            // configured egress proxy goes through tunnel.rs instead.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(GuardedResolver {
                allow: self.allow.clone(),
            }))
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .tls_certs_merge(
                self.extra_roots
                    .iter()
                    .filter_map(|c| reqwest::Certificate::from_der(c).ok()),
            );
        if let Some(cert) = identity {
            let pem = cert.identity_pem().unwrap_or_default();
            builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes())?);
        }
        Ok(Way::Direct(builder.build()?, self.allow.clone()))
    }

    /// The way for an Attempt with this client certificate (or none).
    async fn for_identity(&self, identity: Option<&ClientCertificate>) -> Result<Way, BrokerError> {
        let Some(cert) = identity else {
            return Ok(self.shared.clone());
        };
        let key = pool_key(cert, "identity");
        let build = async {
            self.build(Some(cert))
                .map_err(|e| BrokerError::refused(e.to_string()))
        };
        self.by_identity.get(&key, build).await
    }
}

type Identity = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

fn identity_parts(cert: &ClientCertificate) -> Option<Identity> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert.certificate_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let key = PrivateKeyDer::from_pem_slice(cert.private_key_pem.as_deref()?.as_bytes()).ok()?;
    Some((chain, key))
}

pub(crate) fn error_class(e: &reqwest::Error) -> ErrorClass {
    if let Some(class) = chain_class(e) {
        return class;
    }
    if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_connect() {
        ErrorClass::Connect
    } else {
        ErrorClass::Request
    }
}

fn tunnel_error_class(e: &hyper_util::client::legacy::Error) -> ErrorClass {
    if let Some(class) = chain_class(e) {
        return class;
    }
    if e.is_connect() {
        ErrorClass::Connect
    } else {
        ErrorClass::Request
    }
}

/// What the error's causes say: the guard's refusal, a reset, a timed-out proxy, a proxy
/// that refused the tunnel.
fn chain_class(e: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<Refused>() {
            return Some(ErrorClass::TargetRefused);
        }
        if err.is::<ProxyRefused>() {
            return Some(ErrorClass::Connect);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe => return Some(ErrorClass::Reset),
                std::io::ErrorKind::TimedOut => return Some(ErrorClass::Timeout),
                _ => {}
            }
        }
        source = err.source();
    }
    None
}

/// Sends Attempts. Holds its ways out, the SSRF allowlist and the OAuth2 tokens, nothing else.
#[derive(Clone)]
pub struct Runner {
    ways: Ways,
    allow: Allowlist,
    tokens: Tokens,
}

impl Runner {
    pub fn new(allow: Allowlist) -> Result<Self, ClientError> {
        Self::with_egress(allow, &EgressConfig::default())
    }

    pub fn with_egress(allow: Allowlist, egress: &EgressConfig) -> Result<Self, ClientError> {
        Ok(Self {
            ways: Ways::new(allow.clone(), egress)?,
            allow,
            tokens: Tokens::default(),
        })
    }

    /// The shared way out, for a transport that speaks HTTP to a broker (SQS).
    pub(crate) fn way(&self) -> &Way {
        &self.ways.shared
    }

    /// A literal IP host outside the allowlist: refused before anything else is done
    /// (`Way::send` refuses it again, for every request, token requests included).
    pub(crate) fn literal_refused(&self, url: &url::Url) -> bool {
        self.allow.refuses_url(url).is_some()
    }

    /// Whether an OAuth2 client's secret may be sent to its `token_url`: over TLS, or in
    /// clear only where the deployment allows private targets (tests, internal networks).
    fn token_url_allowed(&self, token_url: &str) -> bool {
        url::Url::parse(token_url)
            .is_ok_and(|u| u.scheme() == "https" || self.allow.allows_private())
    }

    /// Runs one Attempt. Invariant 2: this function can reach nothing but the network.
    pub async fn run(&self, a: &Attempt) -> Report {
        let started_at = Utc::now();
        let clock = Instant::now();
        let failed = |class: ErrorClass, excerpt: Option<String>| Report {
            started_at,
            duration: clock.elapsed(),
            status: None,
            outcome: classify(None, Some(class), None),
            error: Some(class),
            excerpt,
            sent: class != ErrorClass::TargetRefused,
            request: None,
        };
        if self.literal_refused(&a.url) {
            return failed(ErrorClass::TargetRefused, None);
        }
        let way = match self.ways.for_identity(a.identity.as_deref()).await {
            Ok(way) => way,
            Err(e) => {
                tracing::warn!(endpoint = %a.endpoint_id, error = %e.message,
                    "the endpoint's client certificate does not load");
                return failed(
                    ErrorClass::Request,
                    Some("the endpoint's client certificate does not load".into()),
                );
            }
        };
        let deadline = clock + a.timeout;
        let mut answer = self
            .exchange(a, &way, started_at.timestamp(), deadline)
            .await;
        // A receiver that refuses the token: one new token, one more request.
        if let (Some(oauth), Ok((r, Some(token)))) = (&a.oauth, &answer)
            && r.status == StatusCode::UNAUTHORIZED
        {
            self.tokens
                .reject(&a.endpoint_id, &a.url, oauth, token)
                .await;
            answer = self
                .exchange(a, &way, started_at.timestamp(), deadline)
                .await;
        }
        match answer {
            Err((class, excerpt)) => failed(class, excerpt),
            Ok((response, _)) => {
                // Invariant 1: decided here, on the status line alone.
                let outcome = classify(Some(response.status), None, Some(&response.headers));
                let status = response.status.as_u16();
                let duration = clock.elapsed();
                let body = response.read_body(EXCERPT_BYTES, EXCERPT_WAIT).await;
                Report {
                    started_at,
                    duration,
                    status: Some(status),
                    outcome,
                    error: None,
                    excerpt: (!body.is_empty())
                        .then(|| String::from_utf8_lossy(&body).into_owned()),
                    sent: true,
                    request: None,
                }
            }
        }
    }

    /// One request of the Attempt (with a bearer token when the endpoint has OAuth2), and
    /// the token it carried.
    async fn exchange(
        &self,
        a: &Attempt,
        way: &Way,
        timestamp: i64,
        deadline: Instant,
    ) -> Result<(Answer, Option<Arc<str>>), (ErrorClass, Option<String>)> {
        let left = || deadline.saturating_duration_since(Instant::now());
        let mut headers = a.signed_headers(timestamp);
        let token = match &a.oauth {
            None => None,
            Some(client) if !self.token_url_allowed(&client.token_url) => {
                return Err((
                    ErrorClass::OAuthTokenRefused,
                    Some("the OAuth2 token_url must be https: the client secret is not sent in clear".into()),
                ));
            }
            Some(client) => {
                let token = self
                    .tokens
                    .get(&a.endpoint_id, &a.url, client, way, left())
                    .await
                    .map_err(|e| (e.class, Some(e.message)))?;
                headers.retain(|(n, _)| !n.eq_ignore_ascii_case(AUTHORIZATION.as_str()));
                headers.push((AUTHORIZATION.to_string(), format!("Bearer {token}")));
                Some(token)
            }
        };
        let x = Exchange {
            method: a.method.clone(),
            url: a.url.clone(),
            headers,
            body: a.body.clone(),
        };
        match tokio::time::timeout(left(), way.send(x)).await {
            Err(_) => Err((ErrorClass::Timeout, None)),
            Ok(Err(class)) => Err((class, None)),
            Ok(Ok(answer)) => Ok((answer, token)),
        }
    }
}
