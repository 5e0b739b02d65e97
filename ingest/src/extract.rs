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
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| ApiError::validation("query", e.body_text()))
    }
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
