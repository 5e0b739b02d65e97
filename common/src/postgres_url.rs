//! One reading of a libpq-style Postgres URL for every connection Railhook makes: the sqlx
//! pools, the relay's control connection (also sqlx) and the relay's replication stream
//! (pgwire-replication, which has its own TLS client).
//!
//! The TLS parameters follow libpq, so a `DATABASE_URL` written for `psql` means the same
//! thing here:
//!
//! | `sslmode` | encrypted | server certificate checked | host name checked | plaintext fallback |
//! | --- | --- | --- | --- | --- |
//! | `disable` | no | – | – | – |
//! | `prefer` (default, as in libpq) | if the server offers it | no | no | yes |
//! | `require` | yes | no (yes, as `verify-ca`, when `sslrootcert` is given) | no | never |
//! | `verify-ca` | yes | against `sslrootcert` | no | never |
//! | `verify-full` | yes | against `sslrootcert` | yes | never |
//!
//! `sslrootcert=system` trusts the operating system's roots (and, as in libpq, makes the
//! default mode `verify-full`); without `sslrootcert` the verify modes use them too.
//! `sslcert` and `sslkey` present a client certificate (both or neither).
//!
//! Invariant: the parsed mode is the one every connection uses. The pools and the replication
//! stream cannot disagree on whether a certificate is checked, because both are built from
//! this value, never from the URL text separately.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// How a connection negotiates TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// True when a server without TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(self, Self::Require | Self::VerifyCa | Self::VerifyFull)
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The operating system's (or, for the replication stream, Mozilla's) roots.
    System,
    /// A PEM file (`sslrootcert=/path`).
    File(PathBuf),
}

/// Which server of a multi-host URL a connection may use (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// The first that accepts the connection (libpq's default).
    Any,
    /// The first that is not in recovery: the primary.
    ReadWrite,
}

/// A parsed Postgres URL. The password is kept secret; `Debug` never prints it.
#[derive(Debug, Clone)]
pub struct PostgresTarget {
    url: SecretString,
    /// The server this target connects to: the first of [`Self::hosts`] until
    /// [`Self::primary`] picked another.
    pub host: String,
    pub port: u16,
    /// Every `host:port` the URL names, in order (libpq's multi-host form,
    /// `postgres://u@h1:5432,h2:5432/db`): after a failover, the promoted standby is found
    /// among them ([`Self::primary`]).
    pub hosts: Vec<(String, u16)>,
    pub target_session_attrs: SessionAttrs,
    pub user: String,
    password: Option<SecretString>,
    pub dbname: String,
    /// The effective mode (`require` with a root certificate is already `verify-ca`).
    pub ssl_mode: SslMode,
    pub root_certs: RootCerts,
    /// Client certificate and key (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PostgresUrlError {
    #[error("must be a postgres:// or postgresql:// URL")]
    Scheme,
    #[error("is not a valid URL ({0})")]
    Syntax(String),
    #[error("names no host (Unix sockets are not supported: use host:port)")]
    NoHost,
    #[error("has sslmode={0}; expected one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    #[error("has {0} without {1}: a client certificate needs both")]
    HalfClientCert(&'static str, &'static str),
    #[error("has target_session_attrs={0}; expected any or read-write")]
    SessionAttrs(String),
    #[error("has {param}={path}, which cannot be read ({problem})")]
    Unreadable {
        param: &'static str,
        path: String,
        problem: String,
    },
}

fn readable(param: &'static str, path: &str) -> Result<PathBuf, PostgresUrlError> {
    std::fs::File::open(Path::new(path))
        .map(|_| PathBuf::from(path))
        .map_err(|e| PostgresUrlError::Unreadable {
            param,
            path: path.to_owned(),
            problem: e.kind().to_string(),
        })
}

impl PostgresTarget {
    /// Parses and checks the URL: the mode is known, and every certificate file it names can
    /// be opened now, so a typo is a configuration error at start rather than a TLS failure
    /// later.
    pub fn parse(url: &SecretString) -> Result<Self, PostgresUrlError> {
        let raw = url.expose_secret();
        if !(raw.starts_with("postgres://") || raw.starts_with("postgresql://")) {
            return Err(PostgresUrlError::Scheme);
        }
        // The URL's own text never goes into an error: it may hold the password.
        let (single, listed) = split_hosts(raw)?;
        let parsed =
            url::Url::parse(&single).map_err(|e| PostgresUrlError::Syntax(e.to_string()))?;
        let mut host = parsed
            .host_str()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .filter(|h| !h.is_empty());
        let mut port = parsed.port().unwrap_or(5432);
        let decode = |s: &str| {
            percent_decode(s).map_err(|_| PostgresUrlError::Syntax("bad percent-encoding".into()))
        };
        let mut user = decode(parsed.username())?;
        let mut password = parsed.password().map(decode).transpose()?;
        let mut dbname = decode(parsed.path().trim_start_matches('/'))?;
        let (mut mode, mut root, mut cert, mut key) = (None, None, None, None);
        let mut attrs = SessionAttrs::Any;
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "sslmode" => {
                    mode = Some(
                        SslMode::parse(&v)
                            .ok_or_else(|| PostgresUrlError::SslMode(v.to_string()))?,
                    )
                }
                "sslrootcert" => root = Some(v.to_string()),
                "sslcert" => cert = Some(v.to_string()),
                "sslkey" => key = Some(v.to_string()),
                "host" if !v.starts_with('/') => host = Some(v.to_string()),
                "port" => {
                    port = v
                        .parse()
                        .map_err(|_| PostgresUrlError::Syntax("port is not a number".into()))?
                }
                "user" => user = v.to_string(),
                "password" => password = Some(v.to_string()),
                "dbname" => dbname = v.to_string(),
                "target_session_attrs" => {
                    attrs = match v.as_ref() {
                        "any" => SessionAttrs::Any,
                        "read-write" | "primary" => SessionAttrs::ReadWrite,
                        other => return Err(PostgresUrlError::SessionAttrs(other.to_owned())),
                    }
                }
                _ => {}
            }
        }
        let host = host.ok_or(PostgresUrlError::NoHost)?;
        let hosts = match listed {
            Some(listed) => listed
                .into_iter()
                .map(|(h, p)| (h, p.unwrap_or(port)))
                .collect(),
            None => vec![(host.clone(), port)],
        };
        let root_certs = match root.as_deref() {
            None | Some("system") => RootCerts::System,
            Some(path) => RootCerts::File(readable("sslrootcert", path)?),
        };
        let ssl_mode = match (mode, root.as_deref()) {
            // libpq: sslrootcert=system without a mode means verify-full.
            (None, Some("system")) => SslMode::VerifyFull,
            (None, _) => SslMode::Prefer,
            // libpq: require with a root certificate verifies the chain, as verify-ca.
            (Some(SslMode::Require), Some(_)) => SslMode::VerifyCa,
            (Some(m), _) => m,
        };
        let client_cert = match (cert, key) {
            (None, None) => None,
            (Some(_), None) => return Err(PostgresUrlError::HalfClientCert("sslcert", "sslkey")),
            (None, Some(_)) => return Err(PostgresUrlError::HalfClientCert("sslkey", "sslcert")),
            (Some(c), Some(k)) => Some((readable("sslcert", &c)?, readable("sslkey", &k)?)),
        };
        if user.is_empty() {
            user = "postgres".into();
        }
        if dbname.is_empty() {
            dbname = user.clone();
        }
        Ok(Self {
            url: SecretString::from(for_sqlx(&parsed)),
            host: hosts[0].0.clone(),
            port: hosts[0].1,
            hosts,
            target_session_attrs: attrs,
            user,
            password: password.map(SecretString::from),
            dbname,
            ssl_mode,
            root_certs,
            client_cert,
        })
    }

    /// True when the URL names more than one server or asks for the primary: connections
    /// then pick their server with [`Self::primary`].
    pub fn chooses_server(&self) -> bool {
        self.hosts.len() > 1 || self.target_session_attrs == SessionAttrs::ReadWrite
    }

    /// This target, connecting to `host:port`.
    pub fn at(&self, host: &str, port: u16) -> Self {
        let mut t = self.clone();
        t.host = host.to_owned();
        t.port = port;
        t
    }

    /// The first of [`Self::hosts`] that accepts a connection and, with
    /// `target_session_attrs=read-write`, is not in recovery: libpq's rule, so a
    /// multi-host URL finds the promoted standby after a failover.
    pub async fn primary(&self) -> Result<Self, sqlx::Error> {
        if !self.chooses_server() {
            return Ok(self.clone());
        }
        // Every host is asked at once (each check is bounded): a host that froze costs its
        // check's deadline once, not once per host ahead of the one that answers. The first
        // in the URL's order that qualifies is still the one chosen, as in libpq.
        let candidates: Vec<Self> = self.hosts.iter().map(|(h, p)| self.at(h, *p)).collect();
        let checks = futures::future::join_all(candidates.iter().map(Self::check)).await;
        let mut last = None;
        for (candidate, checked) in candidates.into_iter().zip(checks) {
            let (host, port) = (&candidate.host, candidate.port);
            match checked {
                Ok(true) => return Ok(candidate),
                Ok(false) => {
                    // Transient, like a refused connection: a standby is promoted in seconds.
                    last = Some(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("{host}:{port} is in recovery (a standby), not the primary"),
                    )));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(sqlx::Error::PoolTimedOut))
    }

    /// Whether this server may be used: it accepts a connection within a few seconds and,
    /// when a primary is asked for, is not in recovery.
    pub async fn check(&self) -> Result<bool, sqlx::Error> {
        use sqlx::Connection;
        let options = self.sqlx_options()?;
        let probe = async {
            let mut conn = sqlx::PgConnection::connect_with(&options).await?;
            let recovering = sqlx::query_scalar!(r#"SELECT pg_is_in_recovery() AS "recovering!""#)
                .fetch_one(&mut conn)
                .await?;
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>(recovering)
        };
        let within = std::time::Duration::from_secs(5);
        let recovering = crate::db::answered(within, "the primary's check", probe).await?;
        Ok(self.target_session_attrs == SessionAttrs::Any || !recovering)
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(|p| p.expose_secret())
    }

    /// Options for sqlx: everything sqlx reads from the URL (application name, options, …)
    /// with the TLS settings replaced by the parsed ones, so sqlx and the replication stream
    /// apply one rule.
    pub fn sqlx_options(&self) -> Result<PgConnectOptions, sqlx::Error> {
        crate::install_crypto_provider();
        let mut options = PgConnectOptions::from_str(self.url.expose_secret())?
            .host(&self.host)
            .port(self.port)
            .username(&self.user)
            .database(&self.dbname)
            .ssl_mode(match self.ssl_mode {
                SslMode::Disable => PgSslMode::Disable,
                SslMode::Prefer => PgSslMode::Prefer,
                SslMode::Require => PgSslMode::Require,
                SslMode::VerifyCa => PgSslMode::VerifyCa,
                SslMode::VerifyFull => PgSslMode::VerifyFull,
            });
        if let Some(p) = self.password() {
            options = options.password(p);
        }
        if let RootCerts::File(path) = &self.root_certs {
            options = options.ssl_root_cert(path);
        }
        if let Some((cert, key)) = &self.client_cert {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        Ok(options)
    }
}

/// What sqlx parses: the URL with its first host only (see [`split_hosts`]) and without
/// `target_session_attrs`, which sqlx does not know.
fn for_sqlx(parsed: &url::Url) -> String {
    let mut url = parsed.clone();
    let kept: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| k != "target_session_attrs")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(kept);
    }
    url.to_string()
}

/// A host list as parsed: each name with its own port, when it has one.
type HostList = Vec<(String, Option<u16>)>;

/// libpq's multi-host form (`postgres://u@h1:5432,h2/db`) is not a URL the `url` crate
/// reads: returns the URL with only the first host, and every listed host when there are
/// several.
fn split_hosts(raw: &str) -> Result<(String, Option<HostList>), PostgresUrlError> {
    let scheme_end = raw.find("://").map_or(0, |i| i + 3);
    let rest = &raw[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let hosts_start = authority.rfind('@').map_or(0, |i| i + 1);
    let hosts = &authority[hosts_start..];
    if !hosts.contains(',') {
        return Ok((raw.to_owned(), None));
    }
    let mut listed = Vec::new();
    for entry in hosts.split(',') {
        let (host, port) = match entry.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || entry.starts_with('[') => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| PostgresUrlError::Syntax("port is not a number".into()))?,
                ),
            ),
            _ => (entry, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(PostgresUrlError::NoHost);
        }
        listed.push((host.to_owned(), port));
    }
    let first = hosts.split(',').next().unwrap_or_default();
    let single = format!(
        "{}{}{}{}",
        &raw[..scheme_end],
        &authority[..hosts_start],
        first,
        &rest[authority_end..]
    );
    Ok((single, Some(listed)))
}

fn percent_decode(s: &str) -> Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<PostgresTarget, PostgresUrlError> {
        PostgresTarget::parse(&SecretString::from(url.to_owned()))
    }

    #[test]
    fn multi_host_urls_list_every_server_like_libpq() {
        let t = parse(
            "postgres://rh:pw@db1:5433,db2,[::1]:5434/app?target_session_attrs=read-write&port=6000",
        )
        .expect("valid");
        assert_eq!(
            t.hosts,
            vec![
                ("db1".to_owned(), 5433),
                ("db2".to_owned(), 6000),
                ("::1".to_owned(), 5434)
            ]
        );
        assert_eq!((t.host.as_str(), t.port), ("db1", 5433));
        assert_eq!(t.target_session_attrs, SessionAttrs::ReadWrite);
        assert_eq!((t.user.as_str(), t.dbname.as_str()), ("rh", "app"));
        assert!(t.chooses_server());
        let one = parse("postgres://u@h/d").expect("valid");
        assert_eq!(one.hosts, vec![("h".to_owned(), 5432)]);
        assert!(!one.chooses_server());
        assert!(parse("postgres://u@h1,h2/d?target_session_attrs=standby").is_err());
        assert!(parse("postgres://u@h1,:x/d").is_err());
    }

    #[test]
    fn plain_url_defaults_to_prefer_like_libpq() {
        let t = parse("postgres://rh:p%40ss@db.example:6543/app").expect("valid");
        assert_eq!(
            (t.host.as_str(), t.port, t.user.as_str(), t.dbname.as_str()),
            ("db.example", 6543, "rh", "app")
        );
        assert_eq!(t.password(), Some("p@ss"));
        assert_eq!(t.ssl_mode, SslMode::Prefer);
        assert_eq!(t.root_certs, RootCerts::System);
    }

    #[test]
    fn modes_follow_libpq() {
        let ca = std::env::temp_dir().join("railhook-test-ca.pem");
        std::fs::write(&ca, "x").expect("write");
        let ca = ca.display();
        for (query, want) in [
            ("sslmode=disable", SslMode::Disable),
            ("sslmode=require", SslMode::Require),
            (
                &format!("sslmode=require&sslrootcert={ca}"),
                SslMode::VerifyCa,
            ),
            (
                &format!("sslmode=verify-full&sslrootcert={ca}"),
                SslMode::VerifyFull,
            ),
            ("sslrootcert=system", SslMode::VerifyFull),
            ("sslmode=verify-ca&sslrootcert=system", SslMode::VerifyCa),
        ] {
            let t = parse(&format!("postgres://u@h/d?{query}")).expect(query);
            assert_eq!(t.ssl_mode, want, "{query}");
        }
    }

    #[test]
    fn mistakes_are_named_and_never_echo_the_password() {
        let err = parse("postgres://u:hunter2@h/d?sslmode=verify_full").expect_err("bad mode");
        assert!(err.to_string().contains("verify_full"));
        let err = parse("postgres://u:hunter2@h/d?sslmode=verify-full&sslrootcert=/nope/ca.pem")
            .expect_err("missing file")
            .to_string();
        assert!(
            err.contains("sslrootcert") && err.contains("/nope/ca.pem"),
            "{err}"
        );
        assert!(!err.contains("hunter2"));
        let err = parse("postgres://u@h/d?sslcert=/a").expect_err("half");
        assert_eq!(err, PostgresUrlError::HalfClientCert("sslcert", "sslkey"));
        assert_eq!(
            parse("mysql://h/d").expect_err("scheme"),
            PostgresUrlError::Scheme
        );
    }

    #[test]
    fn sqlx_gets_the_parsed_mode() {
        let t = parse("postgres://u:pw@h:1/d?sslmode=require&application_name=x").expect("valid");
        let o = t.sqlx_options().expect("options");
        assert!(matches!(o.get_ssl_mode(), PgSslMode::Require));
        assert_eq!(o.get_application_name(), Some("x"));
        assert_eq!((o.get_host(), o.get_port()), ("h", 1));
    }
}
