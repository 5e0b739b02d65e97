//! OAuth2 client credentials towards a receiver (issue #40; the endpoint's
//! `authentication`, common/src/endpoint_auth.rs): the worker asks the receiver's token
//! endpoint for an access token, keeps it per endpoint until shortly before it expires,
//! and sends it as `Authorization: Bearer`.
//!
//! - One fetch at a time per endpoint: Attempts that find no valid token wait for the one
//!   fetch under way instead of each asking the provider.
//! - The token request goes out like an Attempt (the SSRF guard, the egress proxy, the
//!   endpoint's client certificate), authenticated with `client_secret_basic` (RFC 6749
//!   section 2.3.1, which every provider must accept).
//! - A provider that cannot be reached, times out or answers 5xx/429 is
//!   `oauth_token_unavailable`; one that refuses the client (4xx: `invalid_client`, a
//!   revoked or wrong secret) is `oauth_token_refused`. Both are retried on the ladder, so
//!   a receiver that fixes its provider gets every Delivery; the provider's own words are
//!   the Attempt's excerpt.
//! - A receiver's `401` drops the token (http.rs fetches one new token and sends once more).

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use railhook_common::endpoint_auth::OAuth2Client;
use serde::Deserialize;

use super::Pool;
use super::http::{Exchange, Way};
use crate::attempt::ErrorClass;

/// A token is renewed this long before it expires (or at 90 % of its life when that is
/// shorter), so it does not expire between being read and being checked.
const RENEW_BEFORE: Duration = Duration::from_secs(30);
/// The life of a token whose response gave no `expires_in`.
const DEFAULT_LIFE: Duration = Duration::from_secs(300);
/// How much of the provider's answer is read.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;

#[derive(Clone)]
struct Token {
    value: Arc<str>,
    renew_at: Instant,
}

type Slot = Arc<tokio::sync::Mutex<Option<Token>>>;

/// Tokens per endpoint (and per settings: a PATCH that changes the client starts afresh),
/// kept in the connection [`Pool`]: an endpoint's token is forgotten after
/// [`super::IDLE`] without an Attempt.
#[derive(Clone, Default)]
pub struct Tokens {
    slots: Arc<Pool<Slot>>,
}

/// Why no token could be had.
#[derive(Debug, Clone)]
pub struct TokenError {
    pub class: ErrorClass,
    pub message: String,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<f64>,
}

/// The cache key of an endpoint's token: every setting of the client, its secret included
/// (issue #53: a rotated secret kept the token the old one had fetched), and the origin the
/// token is sent to, so a token never follows the endpoint's URL to another host. As the
/// broker pools key their connections (mod.rs, `pool_key`); held in memory only.
fn key(endpoint_id: &str, target: &url::Url, c: &OAuth2Client) -> String {
    let origin = target.origin().ascii_serialization();
    super::pool_key(c, &format!("{endpoint_id}|{origin}"))
}

impl Tokens {
    async fn slot(&self, key: &str) -> Slot {
        let empty = async { Ok(Slot::default()) };
        self.slots.get(key, empty).await.unwrap_or_default()
    }

    /// A valid token for the endpoint: the cached one, or one fetched now through `way`.
    pub async fn get(
        &self,
        endpoint_id: &str,
        target: &url::Url,
        client: &OAuth2Client,
        way: &Way,
        timeout: Duration,
    ) -> Result<Arc<str>, TokenError> {
        let slot = self.slot(&key(endpoint_id, target, client)).await;
        let mut held = slot.lock().await;
        if let Some(t) = held.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(t.value.clone());
        }
        let fetched = fetch(client, way, timeout).await?;
        let value = fetched.value.clone();
        *held = Some(fetched);
        Ok(value)
    }

    /// Drops `token` if it is still the endpoint's (a receiver answered 401 to it).
    pub async fn reject(
        &self,
        endpoint_id: &str,
        target: &url::Url,
        client: &OAuth2Client,
        token: &str,
    ) {
        let slot = self.slot(&key(endpoint_id, target, client)).await;
        let mut held = slot.lock().await;
        if held.as_ref().is_some_and(|t| &*t.value == token) {
            *held = None;
        }
    }
}

async fn fetch(client: &OAuth2Client, way: &Way, timeout: Duration) -> Result<Token, TokenError> {
    let unavailable = |message: String| TokenError {
        class: ErrorClass::OAuthTokenUnavailable,
        message,
    };
    let url = url::Url::parse(&client.token_url)
        .map_err(|_| unavailable("the token URL does not parse".into()))?;
    let form = {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(scope) = &client.scope {
            form.append_pair("scope", scope);
        }
        if let Some(audience) = &client.audience {
            form.append_pair("audience", audience);
        }
        form.finish()
    };
    // RFC 6749 2.3.1: the id and secret are form-encoded before they are joined.
    let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            encode(&client.client_id),
            encode(client.client_secret.as_deref().unwrap_or(""))
        ))
    );
    let headers = vec![
        ("authorization".into(), basic),
        (
            "content-type".into(),
            "application/x-www-form-urlencoded".into(),
        ),
        ("accept".into(), "application/json".into()),
    ];
    let exchange = Exchange::post(url, headers, bytes::Bytes::from(form));
    let started = Instant::now();
    let answer = match tokio::time::timeout(timeout, way.send(exchange)).await {
        Err(_) => return Err(unavailable("the token endpoint timed out".into())),
        Ok(Err(class)) => {
            return Err(TokenError {
                class: if class == ErrorClass::TargetRefused {
                    ErrorClass::TargetRefused
                } else {
                    ErrorClass::OAuthTokenUnavailable
                },
                message: format!(
                    "the token endpoint could not be reached ({})",
                    class.as_str()
                ),
            });
        }
        Ok(Ok(answer)) => answer,
    };
    let status = answer.status;
    let body = answer
        .read_body(
            MAX_TOKEN_RESPONSE,
            timeout.saturating_sub(started.elapsed()),
        )
        .await;
    let words = String::from_utf8_lossy(&body).into_owned();
    if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
        return Err(unavailable(format!(
            "the token endpoint answered {status}: {words}"
        )));
    }
    if !status.is_success() {
        return Err(TokenError {
            class: ErrorClass::OAuthTokenRefused,
            message: format!("the token endpoint answered {status}: {words}"),
        });
    }
    let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|_| TokenError {
        class: ErrorClass::OAuthTokenRefused,
        message: "the token endpoint's answer has no access_token".into(),
    })?;
    if parsed
        .token_type
        .as_deref()
        .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
        || parsed.access_token.is_empty()
        || parsed
            .access_token
            .chars()
            .any(|c| c.is_control() || c == ' ')
    {
        return Err(TokenError {
            class: ErrorClass::OAuthTokenRefused,
            message: "the token endpoint's answer is not a bearer token".into(),
        });
    }
    Ok(Token {
        value: parsed.access_token.into(),
        renew_at: started + renew_after(parsed.expires_in),
    })
}

/// How long a token is used: until [`RENEW_BEFORE`] its expiry, or 90 % of its life when
/// that is shorter.
fn renew_after(expires_in: Option<f64>) -> Duration {
    let life = expires_in
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(DEFAULT_LIFE, |s| {
            Duration::from_secs_f64(s.min(86_400.0 * 365.0))
        });
    life.saturating_sub(RENEW_BEFORE.min(life / 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_shortly_before_they_expire() {
        assert_eq!(renew_after(Some(3600.0)), Duration::from_secs(3570));
        assert_eq!(renew_after(Some(10.0)), Duration::from_secs(9));
        assert_eq!(renew_after(None), Duration::from_secs(270));
        assert_eq!(renew_after(Some(-5.0)), Duration::from_secs(270));
        assert_eq!(renew_after(Some(f64::NAN)), Duration::from_secs(270));
    }
}
