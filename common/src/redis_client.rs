//! The one way a Railhook process builds its Redis client: `redis://` in plaintext,
//! `rediss://` over TLS (rustls) with the system's roots or a private CA, and optionally a
//! client certificate. A user and password travel in the URL, which is a secret: it is never
//! printed, and errors here name the setting, not the URL.

use std::path::PathBuf;

use secrecy::{ExposeSecret, SecretString};

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

/// Builds the client. Nothing connects here; a bad URL or an unreadable file is an error now.
pub fn client(url: &SecretString, tls: &RedisTls) -> Result<redis::Client, RedisSettingsError> {
    let raw = url.expose_secret();
    let secure = raw.starts_with("rediss://");
    if !(secure || raw.starts_with("redis://")) {
        return Err(RedisSettingsError::Scheme);
    }
    // The redis crate's parse errors do not include the URL's text, but its kind is enough.
    let info = redis::IntoConnectionInfo::into_connection_info(raw)
        .map_err(|e| RedisSettingsError::Url(e.to_string()))?;
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
    if !secure {
        if root_cert.is_some() {
            return Err(RedisSettingsError::TlsFileWithoutTls("redis_ca_file"));
        }
        if client_tls.is_some() {
            return Err(RedisSettingsError::TlsFileWithoutTls(
                "redis_client_cert_file",
            ));
        }
        return redis::Client::open(info).map_err(|e| RedisSettingsError::Url(e.to_string()));
    }
    crate::install_crypto_provider();
    if root_cert.is_none() && client_tls.is_none() {
        return redis::Client::open(info).map_err(|e| RedisSettingsError::Url(e.to_string()));
    }
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| RedisSettingsError::Url(e.to_string()))
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
