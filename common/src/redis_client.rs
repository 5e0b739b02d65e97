//! The one way a Railhook process builds its Redis client: `redis://` in plaintext,
//! `rediss://` over TLS (rustls) with the system's roots or a private CA, and optionally a
//! client certificate; a single server or a Redis Cluster (`RAILHOOK_REDIS_CLUSTER`, the
//! URL naming one seed node). A user and password travel in the URL, which is a secret: it
//! is never printed, and errors here name the setting, not the URL.
//!
//! In a cluster, every key a script touches must hash to one slot, or Redis refuses the
//! script with CROSSSLOT: callers put the shared part of their keys in a hash tag
//! (`rh:ep:{ep_…}:rl`), see `worker/src/limits.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use secrecy::{ExposeSecret, SecretString};

/// A Redis server or a Redis Cluster.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per process, built at start: its size is irrelevant
pub enum RedisClient {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// A connection from [`RedisClient::connect`]; cheap to clone (both kinds multiplex).
#[derive(Clone)]
pub enum RedisConnection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

/// After a failed connect, how long [`Lazy::get`] answers `None` at once instead of trying
/// again: a Redis that is down costs each request nothing, and is tried about once a second.
pub const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// The one Redis connection of a role's fail-open users (the ingest's quota, the worker's
/// limits): opened on first use within `timeout`, shared by every clone (it multiplexes),
/// dropped by [`Lazy::forget`] when a command failed, and not retried for
/// [`RECONNECT_BACKOFF`] after a failed connect. Its users fail open on `None`.
#[derive(Clone)]
pub struct Lazy {
    client: RedisClient,
    timeout: Duration,
    state: Arc<tokio::sync::Mutex<LazyState>>,
}

#[derive(Default)]
struct LazyState {
    conn: Option<RedisConnection>,
    last_failure: Option<Instant>,
}

impl Lazy {
    pub fn new(client: RedisClient, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            state: Arc::default(),
        }
    }

    /// The connection, opened now if there is none; `None` while Redis cannot be reached
    /// (at once within [`RECONNECT_BACKOFF`] of the last failure).
    pub async fn get(&self) -> Option<RedisConnection> {
        let mut state = self.state.lock().await;
        if let Some(conn) = &state.conn {
            return Some(conn.clone());
        }
        if state
            .last_failure
            .is_some_and(|t| t.elapsed() < RECONNECT_BACKOFF)
        {
            return None;
        }
        match self.client.connect(self.timeout).await {
            Ok(conn) => {
                state.conn = Some(conn.clone());
                Some(conn)
            }
            Err(_) => {
                state.last_failure = Some(Instant::now());
                None
            }
        }
    }

    /// Drops the connection after a command failed on it; the next [`Lazy::get`] after the
    /// back-off opens a new one.
    pub async fn forget(&self) {
        let mut state = self.state.lock().await;
        state.conn = None;
        state.last_failure = Some(Instant::now());
    }
}

impl RedisClient {
    /// Connects, with `timeout` bounding the connection and each response.
    pub async fn connect(&self, timeout: Duration) -> redis::RedisResult<RedisConnection> {
        match self {
            RedisClient::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(RedisConnection::Single)
            }
            RedisClient::Cluster(client) => {
                let connect = client.get_async_connection();
                match tokio::time::timeout(timeout, connect).await {
                    Ok(conn) => conn.map(RedisConnection::Cluster),
                    Err(_) => Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "timed out connecting to the Redis cluster",
                    ))),
                }
            }
        }
    }
}

/// Files for `rediss://`.
#[derive(Debug, Clone, Default)]
pub struct RedisTls {
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RedisSettingsError {
    #[error("must be a redis:// or rediss:// URL")]
    Scheme,
    #[error("is not a valid Redis URL ({0})")]
    Url(String),
    #[error("{0} is set, which is only used with a rediss:// URL")]
    TlsFileWithoutTls(&'static str),
    #[error("{0} is set without {1}: a client certificate needs both")]
    HalfClientCert(&'static str, &'static str),
    #[error("{field} names {path}, which cannot be read ({problem})")]
    Unreadable {
        field: &'static str,
        path: String,
        problem: String,
    },
}

fn read(field: &'static str, path: &PathBuf) -> Result<Vec<u8>, RedisSettingsError> {
    std::fs::read(path).map_err(|e| RedisSettingsError::Unreadable {
        field,
        path: path.display().to_string(),
        problem: e.kind().to_string(),
    })
}

/// Builds the client for a single server or, with `cluster`, for a Redis Cluster that `url`
/// names one node of. Nothing connects here.
pub fn redis_client(
    url: &SecretString,
    tls: &RedisTls,
    cluster: bool,
) -> Result<RedisClient, RedisSettingsError> {
    let single = client(url, tls)?;
    if !cluster {
        return Ok(RedisClient::Single(single));
    }
    let info = single.get_connection_info().clone();
    let mut builder = redis::cluster::ClusterClientBuilder::new(vec![info])
        .connection_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5));
    if tls.ca_file.is_some() || tls.client_cert_file.is_some() {
        builder = builder.certs(certificates(tls)?);
    }
    builder
        .build()
        .map(RedisClient::Cluster)
        .map_err(|e| RedisSettingsError::Url(e.to_string()))
}

/// The TLS files, read now. A client certificate comes with its key or not at all.
fn certificates(tls: &RedisTls) -> Result<redis::TlsCertificates, RedisSettingsError> {
    let client_tls = match (&tls.client_cert_file, &tls.client_key_file) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(RedisSettingsError::HalfClientCert(
                "redis_client_cert_file",
                "redis_client_key_file",
            ));
        }
        (None, Some(_)) => {
            return Err(RedisSettingsError::HalfClientCert(
                "redis_client_key_file",
                "redis_client_cert_file",
            ));
        }
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("redis_client_cert_file", cert)?,
            client_key: read("redis_client_key_file", key)?,
        }),
    };
    let root_cert = tls
        .ca_file
        .as_ref()
        .map(|p| read("redis_ca_file", p))
        .transpose()?;
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// Builds the single-server client. Nothing connects here; a bad URL or an unreadable file
/// is an error now.
pub fn client(url: &SecretString, tls: &RedisTls) -> Result<redis::Client, RedisSettingsError> {
    let raw = url.expose_secret();
    let secure = raw.starts_with("rediss://");
    if !(secure || raw.starts_with("redis://")) {
        return Err(RedisSettingsError::Scheme);
    }
    // The redis crate's parse errors do not include the URL's text, but its kind is enough.
    let info = redis::IntoConnectionInfo::into_connection_info(raw)
        .map_err(|e| RedisSettingsError::Url(e.to_string()))?;
    let certs = certificates(tls)?;
    if !secure {
        if certs.root_cert.is_some() {
            return Err(RedisSettingsError::TlsFileWithoutTls("redis_ca_file"));
        }
        if certs.client_tls.is_some() {
            return Err(RedisSettingsError::TlsFileWithoutTls(
                "redis_client_cert_file",
            ));
        }
        return redis::Client::open(info).map_err(|e| RedisSettingsError::Url(e.to_string()));
    }
    crate::install_crypto_provider();
    if certs.root_cert.is_none() && certs.client_tls.is_none() {
        return redis::Client::open(info).map_err(|e| RedisSettingsError::Url(e.to_string()));
    }
    redis::Client::build_with_tls(info, certs).map_err(|e| RedisSettingsError::Url(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    #[test]
    fn plaintext_and_tls_urls_build_without_connecting() {
        client(&secret("redis://127.0.0.1:1"), &RedisTls::default()).expect("plain");
        client(
            &secret("rediss://user:pw@127.0.0.1:1/0"),
            &RedisTls::default(),
        )
        .expect("tls");
    }

    #[test]
    fn mistakes_name_the_setting_and_never_the_password() {
        let err = client(&secret("http://u:hunter2@x"), &RedisTls::default())
            .expect_err("scheme")
            .to_string();
        assert!(!err.contains("hunter2"));
        let ca = RedisTls {
            ca_file: Some("/nope/ca.pem".into()),
            ..Default::default()
        };
        let err = client(&secret("rediss://u:hunter2@x:1"), &ca)
            .expect_err("missing CA")
            .to_string();
        assert!(
            err.contains("redis_ca_file") && err.contains("/nope/ca.pem"),
            "{err}"
        );
        assert!(!err.contains("hunter2"));
        let tmp = std::env::temp_dir().join("railhook-redis-ca.pem");
        std::fs::write(&tmp, "x").expect("write");
        let ca = RedisTls {
            ca_file: Some(tmp),
            ..Default::default()
        };
        let err = client(&secret("redis://x:1"), &ca).expect_err("CA without TLS");
        assert!(err.to_string().contains("rediss://"), "{err}");
    }
}
