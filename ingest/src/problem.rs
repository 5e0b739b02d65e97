//! The one mapping from API errors to HTTP: RFC 9457 `application/problem+json` with a stable
//! `code`. The body never carries a database message, a secret or a payload; the cause of an
//! internal error is logged by its kind only (SQLSTATE, constraint), never its text, since
//! Postgres error details may quote row values.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Every way a request can fail, with the HTTP status and stable code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid credentials")]
    Unauthorized,
    /// The caller is known and its role or scope does not allow this (`crate::access`).
    #[error("{0}")]
    Forbidden(String),
    #[error("the webhook signature is {0}")]
    InvalidSignature(&'static str),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{detail}")]
    Validation { field: String, detail: String },
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("request body must be sent with content-type: application/json")]
    UnsupportedMediaType,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("this Idempotency-Key was already used with a different request")]
    IdempotencyConflict,
    #[error("{0}")]
    InvalidState(&'static str),
    #[error("{0} already exists")]
    AlreadyExists(&'static str),
    /// A catalogue schema that is not valid draft 2020-12 or needs a fetch.
    #[error("{0}")]
    InvalidSchema(String),
    /// A payload that breaks its type's schema; `pointer` is the failing JSON Pointer.
    #[error("{detail}")]
    SchemaViolation {
        field: String,
        pointer: String,
        detail: String,
    },
    /// Checking a payload against its type's schema took longer than the API allows.
    #[error("checking this payload against its type's schema took too long; nothing was written")]
    SchemaTooSlow { field: String },
    #[error("the organization's monthly event quota is used up")]
    QuotaExceeded,
    #[error("invalid cursor")]
    InvalidCursor,
    #[error("the service is not ready")]
    Unavailable,
    /// The request ran past the API's time limit. Its outcome is unknown to the caller: an
    /// Event it carried may have been committed, so the answer says how to retry safely.
    #[error(
        "the request took too long and was abandoned; anything it created may exist: retry it with the same Idempotency-Key to get that instead of a duplicate"
    )]
    TimedOut,
    #[error("internal error")]
    Internal(#[source] InternalError),
}

/// The cause of a 500, kept for the log and never shown to the caller.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    #[error("database")]
    Database(#[from] sqlx::Error),
    #[error("injected fault: {0}")]
    Fault(&'static str),
    /// A sealed secret this process has no key for (or a damaged one): a configuration
    /// problem, logged with the key id, never with the value.
    #[error("sealed secret")]
    Sealed(#[from] railhook_common::sealing::OpenError),
}

impl From<railhook_common::sealing::OpenError> for ApiError {
    fn from(e: railhook_common::sealing::OpenError) -> Self {
        ApiError::Internal(InternalError::Sealed(e))
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::Internal(InternalError::Database(e))
    }
}

impl ApiError {
    pub fn validation(field: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError::Validation {
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::InvalidSignature(_) => (StatusCode::UNAUTHORIZED, "invalid_signature"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Validation { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            ApiError::MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::IdempotencyConflict => (StatusCode::CONFLICT, "idempotency_key_reused"),
            ApiError::InvalidState(_) => (StatusCode::CONFLICT, "invalid_state"),
            ApiError::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            ApiError::InvalidSchema(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_schema"),
            ApiError::SchemaViolation { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "schema_violation")
            }
            ApiError::SchemaTooSlow { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "schema_too_slow"),
            ApiError::QuotaExceeded => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            ApiError::InvalidCursor => (StatusCode::BAD_REQUEST, "invalid_cursor"),
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::TimedOut => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// The problem+json body (RFC 9457) plus our stable `code` and, for validation, the field.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    pub code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `schema_violation`: the JSON Pointer, inside the payload, of the failing value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pointer: Option<String>,
}

fn title(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("Error")
}

pub(crate) fn log_internal(e: &InternalError) {
    match e {
        InternalError::Database(sqlx::Error::Database(db)) => tracing::error!(
            sqlstate = db.code().as_deref().unwrap_or(""),
            constraint = db.constraint().unwrap_or(""),
            "database error"
        ),
        InternalError::Database(other) => {
            tracing::error!(kind = database_error_kind(other), "database error")
        }
        InternalError::Fault(point) => tracing::error!(point, "injected fault"),
        InternalError::Sealed(e) => tracing::error!(error = %e, "cannot open a sealed secret"),
    }
}

/// A short, value-free name for a non-server database error.
pub(crate) fn database_error_kind(e: &sqlx::Error) -> &'static str {
    match e {
        sqlx::Error::PoolTimedOut => "pool_timed_out",
        sqlx::Error::PoolClosed => "pool_closed",
        sqlx::Error::Io(_) => "io",
        sqlx::Error::Tls(_) => "tls",
        sqlx::Error::Protocol(_) => "protocol",
        sqlx::Error::RowNotFound => "row_not_found",
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => "decode",
        _ => "other",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Internal(e) = &self {
            log_internal(e);
        }
        let (field, pointer) = match &self {
            ApiError::Validation { field, .. } | ApiError::SchemaTooSlow { field } => {
                (Some(field.clone()), None)
            }
            ApiError::SchemaViolation { field, pointer, .. } => {
                (Some(field.clone()), Some(pointer.clone()))
            }
            ApiError::InvalidSchema(_) => (Some("schema".to_owned()), None),
            _ => (None, None),
        };
        let body = Problem {
            type_uri: format!("https://railhook.dev/problems/{code}"),
            title: title(status),
            status: status.as_u16(),
            detail: self.to_string(),
            code,
            field,
            pointer,
        };
        let mut response = (status, Json(body)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
