//! HTTP handlers, one module per resource, and the validators they share.
//!
//! Each resource owns its routes: `router()` lists them with `utoipa_axum::routes!`, which
//! takes each handler's path and method from its `#[utoipa::path]`, so a route is written
//! once and documented where it is served. A resource whose writes change what a sender fans
//! out to (keys, endpoints, subscriptions, event types, operational endpoints) says so by
//! wrapping its router in [`clears_senders`].

pub mod access;
pub mod admin;
pub mod applications;
pub mod deliveries;
pub mod endpoint_secret;
pub mod endpoint_state;
pub mod endpoint_target;
pub mod endpoint_update;
pub mod endpoints;
pub mod event_types;
pub mod events;
pub mod failed;
pub(crate) mod filter_cost;
pub mod filters;
pub mod health;
pub mod operational_endpoints;
pub mod poller;
pub mod portal;
pub mod replays;
pub mod subscriptions;
pub mod transformations;

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use serde::{Deserialize, Deserializer};
use utoipa_axum::router::OpenApiRouter;

use crate::problem::ApiError;
use crate::state::AppState;

/// Declares that `routes`' successful writes change what senders fan out to: each clears
/// the cache of senders (`store::subscriptions::SenderCache`) after it committed.
pub fn clears_senders(
    routes: OpenApiRouter<AppState>,
    state: &AppState,
) -> OpenApiRouter<AppState> {
    routes.route_layer(middleware::from_fn_with_state(
        state.clone(),
        forget_senders_after_writes,
    ))
}

/// Clears the sender cache after a successful write (the write has committed by then).
async fn forget_senders_after_writes(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let write = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let response = next.run(request).await;
    if write && response.status().is_success() {
        state.senders.invalidate();
    }
    response
}

/// A display name: trimmed, 1–200 characters.
pub fn validate_name<'a>(field: &'static str, raw: &'a str) -> Result<&'a str, ApiError> {
    let name = raw.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(ApiError::validation(
            field,
            format!("{field} must be 1-200 characters"),
        ));
    }
    Ok(name)
}

/// A plain name: 1–256 of `[A-Za-z0-9_.-]`. What an id, a uid, an `eventId` and a list's
/// position (a cursor's id, a Svix `iterator`) may hold: bound as parameters, never spliced,
/// but kept to what a real one can be.
pub fn is_plain_name(raw: &str) -> bool {
    railhook_common::names::is_plain_name(raw, 256)
}

/// An endpoint URL: absolute http(s), with a host, no credentials, at most 2048 bytes.
/// Whether the host may be reached (SSRF) is decided at send time against the resolved
/// address, since DNS can change between now and then.
pub fn validate_url(raw: &str) -> Result<String, ApiError> {
    let bad = |detail: &str| ApiError::validation("url", detail);
    if raw.len() > 2048 {
        return Err(bad("url must be at most 2048 bytes"));
    }
    let url = url::Url::parse(raw).map_err(|_| bad("url is not a valid absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("url must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("url must have a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "url must not contain credentials; use custom headers instead",
        ));
    }
    Ok(url.into())
}

pub const MAX_CUSTOM_HEADERS: usize = 20;

/// Custom headers sent with every Attempt to an endpoint.
pub fn validate_headers(headers: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |detail: String| ApiError::validation("headers", detail);
    if headers.len() > MAX_CUSTOM_HEADERS {
        return Err(bad(format!("at most {MAX_CUSTOM_HEADERS} custom headers")));
    }
    for (name, value) in headers {
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(format!("'{name}' is not a valid header name")))?;
        if railhook_common::headers::is_reserved(parsed.as_str()) {
            return Err(bad(format!(
                "'{name}' is set by Railhook and cannot be overridden"
            )));
        }
        if value.len() > 4096 || HeaderValue::from_str(value).is_err() {
            return Err(bad(format!(
                "the value of '{name}' is not a valid header value"
            )));
        }
    }
    Ok(())
}

/// Tells `"field": null` (clear it) apart from an absent field (leave it) in a PATCH body.
pub fn double_option<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(validate_url("https://example.com/hook").is_ok());
        assert!(validate_url("http://127.0.0.1:8080/x").is_ok());
        assert!(validate_url("ftp://example.com").is_err());
        assert!(validate_url("https://user:pw@example.com").is_err());
        assert!(validate_url("/relative").is_err());
        assert!(validate_url(&format!("https://e.com/{}", "a".repeat(2048))).is_err());
    }

    #[test]
    fn headers() {
        let ok = BTreeMap::from([("X-Team".to_owned(), "payments".to_owned())]);
        assert!(validate_headers(&ok).is_ok());
        for (k, v) in [
            ("webhook-id", "x"),
            ("bad name", "x"),
            ("X-Ok", "bad\nvalue"),
        ] {
            let h = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(validate_headers(&h).is_err(), "{k}");
        }
    }
}
