//! Request extractors whose rejections speak problem+json, and the trace context a request
//! hands to the Events it stores.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::ApiError;

/// A body that may be left out: nothing (or only whitespace) reads as `T::default()`,
/// anything else must be `T`'s JSON. Each route says how a bad body is answered.
pub fn optional_json<T: Default + DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        serde_json::from_slice(body)
    }
}

/// `Json<T>`, but a bad body becomes a 400/413/415/422 problem naming what is wrong.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(e) => ApiError::validation("body", e.body_text()),
        JsonRejection::JsonSyntaxError(e) => ApiError::MalformedJson(e.body_text()),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge("the request body is larger than this route accepts".into())
        }
        other => ApiError::MalformedJson(other.body_text()),
    }
}

/// `Query<T>`, with a bad query string reported as a validation problem.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // A NUL can only arrive percent-encoded (`%00`), and Postgres's text refuses it: let
        // through, it failed the filter's statement with a 500 (found by schemathesis once
        // the list routes' parameters were declared in the query; `fuzz.rs`).
        refuse_nul(&parts.uri)?;
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| ApiError::validation("query", e.body_text()))
    }
}

/// Refuses a request whose query holds a NUL (`422` naming `query`): no parameter accepts
/// one, and Postgres's text cannot store it. [`ApiQuery`] (and so `SvixQuery`) calls it for
/// the API; the dashboard's and the portal's `harden` layers for every page.
pub fn refuse_nul(uri: &axum::http::Uri) -> Result<(), ApiError> {
    if uri.query().is_some_and(holds_nul) {
        return Err(ApiError::validation(
            "query",
            "a query parameter holds a NUL character (%00), which no parameter accepts",
        ));
    }
    Ok(())
}

/// Whether a raw query string encodes a NUL byte. Percent-decoding yields byte 0 only from
/// `%00` (a raw NUL is not a valid URI character, and an overlong UTF-8 form decodes to the
/// replacement character), so this is exact.
fn holds_nul(query: &str) -> bool {
    query.contains("%00")
}

/// The trace context to store with the request's Events: the request span's own (its parent
/// is the caller's `traceparent`, set by the API's middleware), so the relay and the worker
/// continue the caller's trace; a new trace when the caller sent none. `tracestate` is kept
/// as sent (`railhook_common::trace_context`).
pub fn trace_of_request(headers: &axum::http::HeaderMap) -> (String, Option<String>) {
    use railhook_common::trace_context::{TraceParent, handed_on, tracestate};
    let incoming = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let state = incoming.and_then(|_| {
        headers
            .get("tracestate")
            .and_then(|v| v.to_str().ok())
            .and_then(tracestate)
    });
    let own = handed_on(&tracing::Span::current(), incoming.as_ref());
    (own.to_string(), state)
}

#[cfg(test)]
mod tests {
    use super::holds_nul;

    #[test]
    fn a_nul_is_found_only_where_it_is_encoded() {
        assert!(holds_nul("application=a%00b"));
        assert!(holds_nul("%00=x"));
        assert!(!holds_nul("application=acme&limit=10"));
        assert!(
            !holds_nul("channel=%2500"),
            "an encoded percent sign followed by 00 is text"
        );
        assert!(
            !holds_nul("a=%C0%80"),
            "an overlong NUL decodes to the replacement character"
        );
    }
}
