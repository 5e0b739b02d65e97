//! How an HTTP endpoint authenticates Railhook beyond the signature (issue #40): the
//! endpoint's `authentication` object. This release has HTTP Basic; OAuth2 client
//! credentials will be another variant of [`Authentication`].
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
        }
    }

    /// Without its secret: what is stored in the clear and shown.
    pub fn shown(&self) -> serde_json::Value {
        let mut shown = self.clone();
        match &mut shown {
            Authentication::Basic { password, .. } => *password = None,
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
            _ => {}
        }
    }

    /// The `Authorization` header value an Attempt carries.
    pub fn header_value(&self) -> Option<String> {
        match self {
            Authentication::Basic { username, password } => {
                let pair = format!("{username}:{}", password.as_deref()?);
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
        }
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
            auth.header_value().as_deref(),
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
}
