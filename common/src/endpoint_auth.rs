//! How an HTTP endpoint authenticates Railhook beyond the signature (issue #40): the
//! endpoint's `authentication` object (HTTP Basic, or an OAuth2 client-credentials grant
//! whose tokens the worker fetches and caches: worker/src/transport/oauth.rs), and its
//! `client_certificate` for mutual TLS ([`ClientCertificate`]).
//!
//! Stored like a broker endpoint's settings (common/src/transport/): whole, with its
//! secret, sealed with the signing secrets' keyring (`endpoints.authentication_secret`,
//! bound to [`sealing_id`]), and without its secret (`endpoints.authentication`) for the
//! API, the dashboard and the portal. The password is write-only: never returned.

use base64::Engine;
use serde::{Deserialize, Serialize};

/// The name an endpoint's sealed authentication is bound to (distinct from its signing
/// secret's and its transport settings').
pub fn sealing_id(endpoint_id: &str) -> String {
    format!("{endpoint_id}/authentication")
}

/// An endpoint's authentication towards its receiver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Authentication {
    /// HTTP Basic: `Authorization: Basic base64(username:password)` on every Attempt.
    Basic {
        username: String,
        /// Write-only: sealed at rest, never returned. Left out of a PATCH with the same
        /// username: the stored one is kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        password: Option<String>,
    },
    /// OAuth2 client credentials (RFC 6749 section 4.4): the worker asks `token_url` for a
    /// token, keeps it until shortly before it expires, and sends `Authorization: Bearer`.
    #[serde(rename = "oauth2_client_credentials")]
    OAuth2ClientCredentials(OAuth2Client),
}

/// An OAuth2 client of the receiver's identity provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OAuth2Client {
    /// The provider's token endpoint (`https://`; `http://` only where the deployment
    /// allows private targets, as for tests).
    pub token_url: String,
    pub client_id: String,
    /// Write-only: sealed at rest, never returned. Left out of a PATCH with the same
    /// `token_url` and `client_id`: the stored one is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Sent as `audience` (Auth0, Okta and others want it for machine tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl OAuth2Client {
    fn validate(&self) -> Result<(), Invalid> {
        let url = url::Url::parse(&self.token_url).ok();
        if !url.is_some_and(|u| {
            matches!(u.scheme(), "https" | "http")
                && u.host().is_some()
                && u.username().is_empty()
                && u.password().is_none()
                && self.token_url.len() <= 2048
        }) {
            return Err(Invalid {
                field: "authentication.token_url",
                detail: "authentication.token_url must be an http(s) URL without credentials, at most 2048 characters",
            });
        }
        for (field, value, max) in [
            ("authentication.client_id", Some(&self.client_id), 512),
            ("authentication.scope", self.scope.as_ref(), 1024),
            ("authentication.audience", self.audience.as_ref(), 1024),
        ] {
            if value
                .is_some_and(|v| v.is_empty() || v.len() > max || v.chars().any(char::is_control))
            {
                return Err(Invalid {
                    field,
                    detail: "must be 1 to 512 (client_id) or 1024 characters, without control characters",
                });
            }
        }
        match &self.client_secret {
            Some(s) if !s.is_empty() && s.len() <= 1024 && !s.chars().any(char::is_control) => {
                Ok(())
            }
            _ => Err(Invalid {
                field: "authentication.client_secret",
                detail: "authentication.client_secret is required (at most 1024 characters, no control characters)",
            }),
        }
    }
}

/// A setting that does not hold, with the field it names (`authentication.username`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub detail: &'static str,
}

impl Authentication {
    /// Checks every field, naming the first that does not hold.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            Authentication::Basic { username, password } => {
                // RFC 7617: the user-id cannot contain a colon; neither may carry controls.
                if username.is_empty()
                    || username.len() > 256
                    || username.contains(':')
                    || username.chars().any(char::is_control)
                {
                    return Err(Invalid {
                        field: "authentication.username",
                        detail: "authentication.username must be 1 to 256 characters, without ':' or control characters",
                    });
                }
                match password {
                    Some(p) if p.len() <= 1024 && !p.chars().any(char::is_control) => Ok(()),
                    _ => Err(Invalid {
                        field: "authentication.password",
                        detail: "authentication.password is required (at most 1024 characters, no control characters)",
                    }),
                }
            }
            Authentication::OAuth2ClientCredentials(client) => client.validate(),
        }
    }

    /// Without its secret: what is stored in the clear and shown.
    pub fn shown(&self) -> serde_json::Value {
        let mut shown = self.clone();
        match &mut shown {
            Authentication::Basic { password, .. } => *password = None,
            Authentication::OAuth2ClientCredentials(client) => client.client_secret = None,
        }
        serde_json::to_value(shown).unwrap_or_default()
    }

    /// Takes `old`'s secret where this one leaves it out under the same username (a PATCH
    /// cannot send back what the API never returns).
    pub fn keep_credentials_of(&mut self, old: &Authentication) {
        match (self, old) {
            (
                Authentication::Basic { username, password },
                Authentication::Basic {
                    username: old_user,
                    password: old_password,
                },
            ) if password.is_none() && username == old_user => {
                password.clone_from(old_password);
            }
            (
                Authentication::OAuth2ClientCredentials(new),
                Authentication::OAuth2ClientCredentials(old),
            ) if new.client_secret.is_none()
                && new.client_id == old.client_id
                && new.token_url == old.token_url =>
            {
                new.client_secret.clone_from(&old.client_secret);
            }
            _ => {}
        }
    }

    /// The `Authorization` header value an Attempt carries as it is (HTTP Basic); `None`
    /// for OAuth2, whose header is a token the worker fetches.
    pub fn basic_header(&self) -> Option<String> {
        match self {
            Authentication::Basic { username, password } => {
                let pair = format!("{username}:{}", password.as_deref()?);
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
            Authentication::OAuth2ClientCredentials(_) => None,
        }
    }
}

/// The name an endpoint's sealed client certificate is bound to.
pub fn certificate_sealing_id(endpoint_id: &str) -> String {
    format!("{endpoint_id}/client_certificate")
}

/// A client certificate and its key, for receivers that require mutual TLS. The certificate
/// (a PEM chain, the endpoint's own first) is shown; the key is write-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientCertificate {
    pub certificate_pem: String,
    /// PKCS#8, PKCS#1 or SEC1 PEM. Write-only: sealed at rest, never returned. Left out of a
    /// PATCH that sends the same certificate: the stored key is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_pem: Option<String>,
}

impl ClientCertificate {
    /// The certificate chain parses, the key parses, and the key is the leaf's.
    pub fn validate(&self) -> Result<(), Invalid> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad_certificate = Invalid {
            field: "client_certificate.certificate_pem",
            detail: "client_certificate.certificate_pem must hold one or more PEM certificates (at most 64 KiB), the endpoint's own first",
        };
        if self.certificate_pem.len() > 65_536 {
            return Err(bad_certificate);
        }
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.certificate_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|_| bad_certificate.clone())?;
        if chain.is_empty() {
            return Err(bad_certificate);
        }
        let bad_key = Invalid {
            field: "client_certificate.private_key_pem",
            detail: "client_certificate.private_key_pem must be the certificate's private key (PKCS#8, PKCS#1 or SEC1 PEM)",
        };
        let key = self
            .private_key_pem
            .as_deref()
            .filter(|k| k.len() <= 65_536)
            .and_then(|k| PrivateKeyDer::from_pem_slice(k.as_bytes()).ok())
            .ok_or_else(|| bad_key.clone())?;
        let provider = rustls::crypto::ring::default_provider();
        match rustls::sign::CertifiedKey::from_der(chain, key, &provider)
            .and_then(|certified| certified.keys_match())
        {
            Ok(()) => Ok(()),
            Err(rustls::Error::InvalidCertificate(_)) => Err(bad_certificate),
            Err(_) => Err(bad_key),
        }
    }

    /// Without the key: what is stored in the clear and shown.
    pub fn shown(&self) -> serde_json::Value {
        serde_json::json!({ "certificate_pem": self.certificate_pem })
    }

    /// Takes `old`'s key when this one leaves it out and sends the same certificate.
    pub fn keep_key_of(&mut self, old: &ClientCertificate) {
        if self.private_key_pem.is_none()
            && self.certificate_pem.trim() == old.certificate_pem.trim()
        {
            self.private_key_pem.clone_from(&old.private_key_pem);
        }
    }

    /// The certificate chain and key as one PEM bundle (what TLS clients load).
    pub fn identity_pem(&self) -> Option<String> {
        Some(format!(
            "{}\n{}\n",
            self.certificate_pem.trim(),
            self.private_key_pem.as_deref()?.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_is_rfc_7617_and_its_password_is_never_shown() {
        let auth: Authentication = serde_json::from_str(
            r#"{"type": "basic", "username": "Aladdin", "password": "open sesame"}"#,
        )
        .expect("parse");
        assert!(auth.validate().is_ok());
        assert_eq!(
            auth.basic_header().as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
        assert!(!auth.shown().to_string().contains("sesame"));
        assert_eq!(auth.shown()["type"], "basic");
        let mut patched = Authentication::Basic {
            username: "Aladdin".into(),
            password: None,
        };
        patched.keep_credentials_of(&auth);
        assert_eq!(patched, auth);
        let mut other = Authentication::Basic {
            username: "Jafar".into(),
            password: None,
        };
        other.keep_credentials_of(&auth);
        assert_eq!(
            other.validate().expect_err("no password").field,
            "authentication.password"
        );
        let colon = Authentication::Basic {
            username: "a:b".into(),
            password: Some("p".into()),
        };
        assert_eq!(
            colon.validate().expect_err("colon").field,
            "authentication.username"
        );
        assert!(
            serde_json::from_str::<Authentication>(r#"{"type": "digest", "username": "a"}"#)
                .is_err()
        );
    }

    #[test]
    fn oauth2_keeps_its_secret_only_for_the_same_client() {
        let auth: Authentication = serde_json::from_str(
            r#"{"type": "oauth2_client_credentials", "token_url": "https://idp.example/token",
                "client_id": "railhook", "client_secret": "s3cret", "scope": "hooks"}"#,
        )
        .expect("parse");
        assert!(auth.validate().is_ok());
        assert_eq!(auth.basic_header(), None);
        let shown = auth.shown();
        assert_eq!(shown["type"], "oauth2_client_credentials");
        assert_eq!(shown["scope"], "hooks");
        assert!(!shown.to_string().contains("s3cret"));
        let mut same: Authentication = serde_json::from_value(shown.clone()).expect("shown");
        same.keep_credentials_of(&auth);
        assert_eq!(same, auth);
        let mut moved = shown;
        moved["token_url"] = "https://other.example/token".into();
        let mut moved: Authentication = serde_json::from_value(moved).expect("moved");
        moved.keep_credentials_of(&auth);
        assert_eq!(
            moved.validate().expect_err("no secret").field,
            "authentication.client_secret"
        );
        for (field, patch) in [
            ("authentication.token_url", r#""token_url": "ftp://x/t""#),
            (
                "authentication.token_url",
                r#""token_url": "https://u:p@x/t""#,
            ),
            ("authentication.client_id", r#""client_id": """#),
            ("authentication.scope", r#""scope": "a\u0007b""#),
        ] {
            let mut base = serde_json::json!({"type": "oauth2_client_credentials",
                "token_url": "https://idp.example/token", "client_id": "c", "client_secret": "s"});
            let extra: serde_json::Value =
                serde_json::from_str(&format!("{{{patch}}}")).expect("patch");
            for (k, v) in extra.as_object().expect("object") {
                base[k] = v.clone();
            }
            let auth: Authentication = serde_json::from_value(base).expect("parse");
            assert_eq!(auth.validate().expect_err(patch).field, field);
        }
    }

    #[test]
    fn a_client_certificate_must_parse_and_match_its_key() {
        let missing = ClientCertificate {
            certificate_pem: "not pem".into(),
            private_key_pem: Some("not pem".into()),
        };
        assert_eq!(
            missing.validate().expect_err("no certificate").field,
            "client_certificate.certificate_pem"
        );
        let junk = ClientCertificate {
            certificate_pem: "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
                .into(),
            private_key_pem: None,
        };
        assert_eq!(
            junk.validate().expect_err("no key").field,
            "client_certificate.private_key_pem"
        );
        let mut kept = ClientCertificate {
            private_key_pem: None,
            ..junk.clone()
        };
        let stored = ClientCertificate {
            private_key_pem: Some("stored".into()),
            ..junk
        };
        kept.keep_key_of(&stored);
        assert_eq!(kept.private_key_pem.as_deref(), Some("stored"));
        assert!(!kept.shown().to_string().contains("stored"));
    }
}
