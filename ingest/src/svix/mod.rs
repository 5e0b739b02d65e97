//! The Svix-compatible surface under `/api/v1/` (issue #37, docs/SVIX_COMPATIBILITY.md): the
//! API shape the official Svix SDKs speak, served over Railhook's own tables and its own
//! ingest transaction, so an Event accepted here is in the Outbox in the same commit as one
//! accepted on `/v1`.
//!
//! It is a translation, not a second product: every handler checks and writes through the
//! same functions as the native routes (`routes::*`, `store::*`, `accept::ingest`), and only
//! the shapes differ:
//!
//! - JSON in camelCase; ids and uids wherever Svix accepts either;
//! - lists as `{data, iterator, prevIterator, done}`, where `iterator` is the last id of the
//!   page (the next page reads after it);
//! - errors as `{"code", "detail"}`, and a refused field as 422 with `detail` a list of
//!   `{loc, msg, type}` ([`SvixError`]): what the SDKs turn into their own exception types;
//! - the token is a Railhook project API key (`auth::Project`).
//!
//! Routes that only Svix's hosted service has (streaming, connectors, ingest sources,
//! transformation templates, background tasks, environments) answer 501 `not_supported_by_this_server`
//! ([`unsupported`]).

mod applications;
pub(crate) mod attempts;
mod auth;
pub(crate) mod endpoint_credentials;
pub(crate) mod endpoint_headers;
pub(crate) mod endpoint_transformation;
pub(crate) mod endpoints;
mod event_types;
pub(crate) mod messages;
mod other;
pub(crate) mod poller;

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;

use crate::extract::{ApiJson, ApiQuery};
use crate::problem::ApiError;
use crate::state::AppState;

/// An error in the Svix SDKs' shape; the cause is Railhook's own [`ApiError`], so the
/// statuses and the checks are the native API's.
#[derive(Debug)]
pub struct SvixError(pub ApiError);

impl From<ApiError> for SvixError {
    fn from(e: ApiError) -> Self {
        SvixError(e)
    }
}

impl From<sqlx::Error> for SvixError {
    fn from(e: sqlx::Error) -> Self {
        SvixError(e.into())
    }
}

pub type SvixResult<T> = Result<T, SvixError>;

/// Where the surface is served.
pub const PREFIX: &str = "/api/v1/";

/// The status and code of a route Svix serves only from its hosted service.
pub const NOT_SUPPORTED: &str = "not_supported_by_this_server";

/// A field path as Svix reports it: `["body", "channels"]`, `["body", "events", "1"]`.
fn location(field: &str) -> Vec<String> {
    let mut loc = vec!["body".to_owned()];
    loc.extend(
        field
            .split(['.', '[', ']'])
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    loc
}

impl IntoResponse for SvixError {
    fn into_response(self) -> Response {
        let (status, code) = self.0.status_and_code();
        if let ApiError::Internal(e) = &self.0 {
            crate::problem::log_internal(e);
        }
        let detail = self.0.to_string();
        let invalid = |field: &str, kind: &str| {
            let item = json!({"loc": location(field), "msg": detail, "type": kind});
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"detail": [item]})),
            )
                .into_response()
        };
        match &self.0 {
            ApiError::Validation { field, .. } => invalid(field, "value_error"),
            ApiError::SchemaViolation { field, .. } => {
                invalid(&format!("{field}payload"), "value_error.schema")
            }
            ApiError::SchemaTooSlow { field } => invalid(field, "value_error.schema"),
            ApiError::InvalidSchema(_) => invalid("schemas", "value_error.schema"),
            _ => {
                let code = match code {
                    "already_exists" | "idempotency_key_reused" => "conflict",
                    other => other,
                };
                (status, Json(json!({"code": code, "detail": detail}))).into_response()
            }
        }
    }
}

/// `ApiJson` with the rejection in the Svix shape.
pub struct SvixJson<T>(pub T);

impl<S, T> FromRequest<S> for SvixJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = SvixError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(v)| SvixJson(v))
            .map_err(SvixError)
    }
}

/// `ApiQuery` with the rejection in the Svix shape.
pub struct SvixQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for SvixQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = SvixError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        ApiQuery::<T>::from_request_parts(parts, state)
            .await
            .map(|ApiQuery(v)| SvixQuery(v))
            .map_err(SvixError)
    }
}

/// A page of a list, as every Svix list answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse<T> {
    pub data: Vec<T>,
    /// Pass as `iterator` for the next page; absent on an empty page.
    pub iterator: Option<String>,
    pub prev_iterator: Option<String>,
    pub done: bool,
}

impl<T> ListResponse<T> {
    /// The same page with each item made into another shape.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> ListResponse<U> {
        ListResponse {
            data: self.data.into_iter().map(f).collect(),
            iterator: self.iterator,
            prev_iterator: self.prev_iterator,
            done: self.done,
        }
    }
}

/// The default and the largest page.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 250;

/// A list request: `limit`, and `iterator`, the last id of the previous page.
pub struct Page {
    pub limit: i64,
    pub after: Option<String>,
}

impl Page {
    pub fn parse(limit: Option<i64>, iterator: Option<&str>) -> SvixResult<Self> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::validation(
                "limit",
                format!("limit must be between 1 and {MAX_LIMIT}"),
            )
            .into());
        }
        let after = match iterator {
            None | Some("") => None,
            Some(it) if crate::routes::is_plain_name(it) => Some(it.to_owned()),
            Some(_) => return Err(ApiError::validation("iterator", "invalid iterator").into()),
        };
        Ok(Self { limit, after })
    }

    /// One more than the page, to know whether another follows.
    pub fn fetch(&self) -> i64 {
        self.limit + 1
    }

    pub fn finish<T>(&self, mut rows: Vec<T>, id_of: impl Fn(&T) -> &str) -> ListResponse<T> {
        let more = rows.len() as i64 > self.limit;
        rows.truncate(usize::try_from(self.limit).unwrap_or(0));
        ListResponse {
            iterator: rows.last().map(|r| id_of(r).to_owned()),
            prev_iterator: None,
            done: !more,
            data: rows,
        }
    }
}

/// A comma-separated query value (`event_types=a,b`), as the SDKs send lists.
pub fn comma_list(raw: Option<&str>) -> Option<Vec<String>> {
    raw.map(|r| {
        r.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// Answers a route Svix serves only from its hosted service.
pub async fn unsupported() -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({
            "code": NOT_SUPPORTED,
            "detail": "this route belongs to Svix's hosted service and is not supported by \
                       this server (docs/SVIX_COMPATIBILITY.md)",
        })),
    )
        .into_response()
}

/// Turns a problem+json answer (from the extractors shared with `/v1`: the API key, a path,
/// the request's timeout) into the Svix shape, so every error of this surface is one.
async fn svix_errors(request: Request, next: axum::middleware::Next) -> Response {
    let response = next.run(request).await;
    let problem = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !problem {
        return response;
    }
    let status = response.status();
    let Ok(bytes) = axum::body::to_bytes(response.into_body(), 64 * 1024).await else {
        return (
            status,
            Json(json!({"code": "internal", "detail": "internal error"})),
        )
            .into_response();
    };
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let detail = body["detail"].as_str().unwrap_or("").to_owned();
    let code = body["code"].as_str().unwrap_or("error").to_owned();
    match body["field"].as_str() {
        Some(field) if status == StatusCode::UNPROCESSABLE_ENTITY => {
            let item = json!({"loc": location(field), "msg": detail, "type": "value_error"});
            (status, Json(json!({"detail": [item]}))).into_response()
        }
        _ => (status, Json(json!({"code": code, "detail": detail}))).into_response(),
    }
}

/// `/api/v1/`: every supported route with its OpenAPI operation, and the hosted-only ones
/// answering [`unsupported`]. Writes that change what senders fan out to clear the sender
/// cache, as on `/v1`.
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let writes = OpenApiRouter::new()
        .merge(applications::router())
        .merge(endpoints::router())
        .merge(event_types::router())
        .merge(other::operational_router());
    crate::routes::clears_senders(writes, state)
        .merge(messages::router())
        .merge(attempts::router())
        .merge(poller::router())
        .merge(other::router())
        .layer(axum::middleware::from_fn(svix_errors))
}
