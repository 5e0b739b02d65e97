//! The egress proxy (`RAILHOOK_EGRESS_PROXY`, docs/EGRESS.md): HTTP Attempts leave through
//! a forward proxy, so receivers allow-list the proxy's static addresses, without the proxy
//! becoming a way around the SSRF guard.
//!
//! Invariant: **the proxy never resolves a name.** The connector here resolves the
//! endpoint's host itself, runs the SSRF guard over every address (ssrf.rs, as the direct
//! client's resolver does), and asks the proxy to `CONNECT` to the checked address, not to
//! the name: a proxy asked for a name would resolve it again, and a name that answers a
//! public address to the guard and `10.0.0.5` to the proxy would reach inside. TLS to the
//! receiver then runs through the tunnel with the endpoint's name as SNI and `Host`, so the
//! receiver's certificate is checked against its name as without a proxy. Plain `http://`
//! endpoints are tunnelled the same way (one path, and no proxy-side request rewriting).
//!
//! reqwest's own proxy support sends the name to the proxy, which is why this path has its
//! own connector under hyper's client (one pooled client per TLS identity, as direct).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::ssrf::Allowlist;

/// Bounds on the proxy's answer to `CONNECT`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_PROXY_ANSWER: usize = 8 * 1024;

/// The configured proxy: where it listens, whether it speaks TLS, its credentials.
#[derive(Clone)]
pub struct Proxy {
    host: String,
    port: u16,
    tls: bool,
    /// `Proxy-Authorization` for every `CONNECT`, when the URL carried credentials.
    authorization: Option<String>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        write!(f, "Proxy({}:{}, tls: {})", self.host, self.port, self.tls)
    }
}

impl Proxy {
    /// Parses `http://[user:password@]host:port` or `https://…`; the error never repeats
    /// the URL (it may hold a password).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let url = url::Url::parse(raw).map_err(|_| "not a URL".to_owned())?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err("the scheme must be http or https".into()),
        };
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("no host".into()),
        };
        let port = url.port_or_known_default().ok_or("no port")?;
        let authorization = (!url.username().is_empty()).then(|| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            let pair = format!(
                "{}:{}",
                decode(url.username()),
                decode(url.password().unwrap_or(""))
            );
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        Ok(Self {
            host,
            port,
            tls,
            authorization,
        })
    }

    /// `host:port`, for logs.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The proxy refused or failed the `CONNECT` (its status code; 0 when it did not answer
/// HTTP). Classified as a connect error: the receiver was never reached.
#[derive(Debug, thiserror::Error)]
#[error("the egress proxy answered CONNECT with {0}")]
pub struct ProxyRefused(pub u16);

/// Any byte stream the tunnel is made of (TCP, TLS to the proxy, TLS inside the tunnel).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection to a receiver through the proxy.
pub struct Tunnel(Box<dyn Io>);

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for Tunnel {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// The connector: guard, `CONNECT` to the checked address, then TLS to the receiver.
#[derive(Clone)]
pub struct Connector {
    proxy: Arc<Proxy>,
    allow: Allowlist,
    /// TLS towards the proxy itself (the platform's roots and the extra ones).
    proxy_tls: TlsConnector,
    /// TLS towards receivers, with this client's identity when it has one.
    receiver_tls: TlsConnector,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Tunnel>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(uri).await.map(TokioIo::new) })
    }
}

impl Connector {
    async fn connect(&self, uri: Uri) -> Result<Tunnel, BoxError> {
        let host = uri
            .host()
            .ok_or("no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let target = self.checked_address(&host, port).await?;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, self.open_tunnel(target))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "egress proxy timed out"))??;
        if !https {
            return Ok(Tunnel(stream));
        }
        let name = ServerName::try_from(host)?;
        let tls = self.receiver_tls.connect(name, stream).await?;
        Ok(Tunnel(Box::new(tls)))
    }

    /// The egress rule (ssrf.rs), as the direct client's resolver applies it: every address
    /// of the name must be allowed, and the first is the one the proxy is asked for.
    async fn checked_address(&self, host: &str, port: u16) -> Result<SocketAddr, BoxError> {
        match crate::ssrf::addresses(&self.allow, host, port).await {
            Ok(addrs) => Ok(addrs[0]),
            Err(crate::ssrf::Unreachable::Refused(r)) => Err(Box::new(r)),
            Err(e) => Err(Box::new(io::Error::other(e.to_string()))),
        }
    }

    /// Connects to the proxy (TLS when configured) and asks it for `target`.
    async fn open_tunnel(&self, target: SocketAddr) -> Result<Box<dyn Io>, BoxError> {
        let tcp = TcpStream::connect((self.proxy.host.as_str(), self.proxy.port)).await?;
        tcp.set_nodelay(true)?;
        let mut stream: Box<dyn Io> = if self.proxy.tls {
            let name = ServerName::try_from(self.proxy.host.clone())?;
            Box::new(self.proxy_tls.connect(name, tcp).await?)
        } else {
            Box::new(tcp)
        };
        // `SocketAddr`'s Display brackets IPv6 addresses, as the request line wants them.
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.proxy.authorization {
            request.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await?;
        stream.flush().await?;
        let status = read_connect_answer(&mut stream).await?;
        if status != 200 {
            return Err(Box::new(ProxyRefused(status)));
        }
        Ok(stream)
    }
}

/// Reads the proxy's answer head byte by byte (nothing of the tunnel may be consumed) and
/// returns its status code.
async fn read_connect_answer(stream: &mut Box<dyn Io>) -> Result<u16, BoxError> {
    let mut head = Vec::with_capacity(128);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_PROXY_ANSWER {
            return Err(Box::new(ProxyRefused(0)));
        }
        let byte = stream.read_u8().await?;
        head.push(byte);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let status = std::str::from_utf8(line)
        .ok()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok(status)
}

/// A pooled HTTP/1.1 client through the proxy.
pub type Client = hyper_util::client::legacy::Client<Connector, Full<Bytes>>;

/// Builds a client through `proxy` with `tls` towards receivers (its identity included)
/// and `proxy_tls` towards the proxy.
pub fn client(
    proxy: Arc<Proxy>,
    allow: Allowlist,
    proxy_tls: Arc<rustls::ClientConfig>,
    receiver_tls: Arc<rustls::ClientConfig>,
) -> Client {
    let connector = Connector {
        proxy,
        allow,
        proxy_tls: TlsConnector::from(proxy_tls),
        receiver_tls: TlsConnector::from(receiver_tls),
    };
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_url_parses_and_its_credentials_never_print() {
        let p = Proxy::parse("http://egress:p%40ss@proxy.internal:3128").expect("parse");
        assert_eq!(p.address(), "proxy.internal:3128");
        assert!(!p.tls);
        assert_eq!(
            p.authorization.as_deref(),
            Some(
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("egress:p@ss")
                )
                .as_str()
            )
        );
        assert!(!format!("{p:?}").contains("p@ss"));
        let tls = Proxy::parse("https://proxy.internal").expect("parse");
        assert_eq!((tls.port, tls.tls), (443, true));
        assert!(tls.authorization.is_none());
        for bad in ["socks5://h:1080", "not a url", "http://"] {
            let e = Proxy::parse(bad).expect_err(bad);
            assert!(!e.contains("p@ss"));
        }
    }
}
