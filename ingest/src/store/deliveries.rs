//! Deliveries as the API and the dashboard read them: one list with every filter either
//! offers, one lookup, the Attempts, and what a Delivery's requests are built from. Every
//! read is scoped to a project, so a page shows only what its key could fetch itself.
//!
//! The writes on a Delivery are elsewhere, each with its rule: the Claim and the Fence in the
//! worker, a manual or bulk retry in routes/failed.rs, expunge in routes/events.rs.

use chrono::{DateTime, Utc};
use railhook_common::DeliveryStatus;
use serde::Serialize;
use sqlx::PgPool;

/// Narrows a list; every field `None` lists all of the project's Deliveries.
#[derive(Debug, Default, Clone)]
pub struct DeliveryFilter {
    pub status: Option<DeliveryStatus>,
    pub endpoint_id: Option<String>,
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// The status code of the last Attempt.
    pub status_code: Option<i32>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// To the endpoints of this application (the customer portal's scope).
    pub application_id: Option<String>,
}

/// One Delivery as it is listed and shown.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryRow {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub endpoint_id: String,
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub sequence_number: Option<i64>,
    pub deferral_count: i32,
    pub failure_reason: Option<String>,
    pub last_status_code: Option<i32>,
    /// `ingest` or `replay`.
    pub origin: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Newest first, `limit` rows after the cursor `after` (an id; ids sort by time).
pub async fn list(
    pool: &PgPool,
    project_id: &str,
    filter: &DeliveryFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<DeliveryRow>, sqlx::Error> {
    // The event type is read per listed row (an index lookup each, at most a page of them)
    // rather than joined, so a list without a type filter never touches `events` beyond
    // the page it returns.
    sqlx::query_as!(
        DeliveryRow,
        r#"SELECT d.id, d.event_id,
                  coalesce((SELECT v.event_type FROM events v WHERE v.id = d.event_id), '') AS "event_type!",
                  d.endpoint_id, d.status AS "status: DeliveryStatus", d.attempt_count,
                  d.next_retry_at, d.last_attempt_at, d.sequence_number, d.deferral_count,
                  d.failure_reason, d.last_status_code, d.origin, d.created_at, d.updated_at
           FROM deliveries d
           WHERE d.project_id = $1
             AND ($2::text IS NULL OR d.status = $2)
             AND ($3::text IS NULL OR d.endpoint_id = $3)
             AND ($4::text IS NULL OR d.event_id = $4)
             AND ($5::text IS NULL OR EXISTS (SELECT 1 FROM events v
                                             WHERE v.id = d.event_id AND v.event_type = $5))
             AND ($6::int IS NULL OR d.last_status_code = $6)
             AND ($7::timestamptz IS NULL OR d.created_at >= $7)
             AND ($8::timestamptz IS NULL OR d.created_at < $8)
             AND ($9::text IS NULL OR d.id < $9)
             AND ($11::text IS NULL OR EXISTS (SELECT 1 FROM endpoints e
                                              WHERE e.id = d.endpoint_id
                                                AND e.application_id = $11))
           ORDER BY d.id DESC LIMIT $10"#,
        project_id,
        filter.status.map(DeliveryStatus::as_str),
        filter.endpoint_id,
        filter.event_id,
        filter.event_type,
        filter.status_code,
        filter.since,
        filter.until,
        after,
        limit,
        filter.application_id
    )
    .fetch_all(pool)
    .await
}

/// One of the project's Deliveries.
pub async fn find(
    pool: &PgPool,
    project_id: &str,
    id: &str,
) -> Result<Option<DeliveryRow>, sqlx::Error> {
    sqlx::query_as!(
        DeliveryRow,
        r#"SELECT d.id, d.event_id,
                  coalesce((SELECT v.event_type FROM events v WHERE v.id = d.event_id), '') AS "event_type!",
                  d.endpoint_id, d.status AS "status: DeliveryStatus", d.attempt_count,
                  d.next_retry_at, d.last_attempt_at, d.sequence_number, d.deferral_count,
                  d.failure_reason, d.last_status_code, d.origin, d.created_at, d.updated_at
           FROM deliveries d WHERE d.id = $1 AND d.project_id = $2"#,
        id,
        project_id
    )
    .fetch_optional(pool)
    .await
}

/// One Attempt, as recorded.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Attempt {
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    /// `SUCCEEDED`, `RETRY` or `FAILED`.
    pub outcome: String,
    pub duration_ms: i32,
    pub error_class: Option<String>,
    pub response_excerpt: Option<String>,
}

/// A Delivery's Attempts, oldest first (the caller has checked the project).
pub async fn attempts(pool: &PgPool, delivery_id: &str) -> Result<Vec<Attempt>, sqlx::Error> {
    sqlx::query_as!(
        Attempt,
        r#"SELECT attempt_number, started_at, finished_at, status_code, outcome, duration_ms,
                  error_class, response_excerpt
           FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number"#,
        delivery_id
    )
    .fetch_all(pool)
    .await
}

/// Whether the Delivery's Event can no longer be sent: its payload was expunged, or its
/// partition retired (a replay's Delivery can outlive its Event: docs/ARCHITECTURE.md,
/// "Storage").
pub async fn event_gone(pool: &PgPool, delivery_id: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT v.id IS NULL OR v.expunged_at IS NOT NULL AS "gone!"
           FROM deliveries d LEFT JOIN events v ON v.id = d.event_id
           WHERE d.id = $1"#,
        delivery_id
    )
    .fetch_one(pool)
    .await
}

/// What a Delivery's requests are made of, besides the Delivery itself: for the dashboard's
/// view of the request (built by common/src/headers.rs, as the worker builds it).
#[derive(Debug, Clone)]
pub struct RequestParts {
    pub payload_excerpt: String,
    pub url: String,
    /// The endpoint's custom headers (JSON object).
    pub headers: serde_json::Value,
    /// An incoming webhook's forwarded provider headers (JSON object).
    pub forward_headers: Option<serde_json::Value>,
    pub tracestate: Option<String>,
    pub expunged_at: Option<DateTime<Utc>>,
}

pub async fn request_parts(
    pool: &PgPool,
    project_id: &str,
    delivery_id: &str,
) -> Result<Option<RequestParts>, sqlx::Error> {
    sqlx::query_as!(
        RequestParts,
        r#"SELECT left(v.payload::text, 4000) AS "payload_excerpt!", e.url, e.headers,
                  v.forward_headers, v.tracestate, v.expunged_at
           FROM deliveries x JOIN events v ON v.id = x.event_id
           JOIN endpoints e ON e.id = x.endpoint_id
           WHERE x.id = $1 AND x.project_id = $2"#,
        delivery_id,
        project_id
    )
    .fetch_optional(pool)
    .await
}

/// How many of an endpoint's Deliveries (created in `[since, until)`, if given) are in each
/// status.
#[derive(Debug, Default, Clone, Copy)]
pub struct StatusCounts {
    pub pending: i64,
    pub processing: i64,
    pub succeeded: i64,
    pub failed: i64,
}

pub async fn status_counts(
    pool: &PgPool,
    endpoint_id: &str,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
) -> Result<StatusCounts, sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE status = 'PENDING') AS "pending!",
                  count(*) FILTER (WHERE status = 'PROCESSING') AS "processing!",
                  count(*) FILTER (WHERE status = 'SUCCEEDED') AS "succeeded!",
                  count(*) FILTER (WHERE status = 'FAILED') AS "failed!"
           FROM deliveries
           WHERE endpoint_id = $1
             AND ($2::timestamptz IS NULL OR created_at >= $2)
             AND ($3::timestamptz IS NULL OR created_at < $3)"#,
        endpoint_id,
        since,
        until
    )
    .fetch_one(pool)
    .await?;
    Ok(StatusCounts {
        pending: r.pending,
        processing: r.processing,
        succeeded: r.succeeded,
        failed: r.failed,
    })
}

/// An Attempt with what a list across Deliveries shows beside it.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub id: i64,
    pub delivery_id: String,
    pub event_id: String,
    pub endpoint_id: String,
    pub url: String,
    pub started_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub outcome: String,
    pub duration_ms: i32,
    pub response_excerpt: Option<String>,
}

/// The project's Attempts (of one endpoint, one Event, or one Attempt id, where given),
/// newest first, before the Attempt id `before`.
pub async fn attempt_rows(
    pool: &PgPool,
    project_id: &str,
    endpoint_id: Option<&str>,
    event_id: Option<&str>,
    attempt_id: Option<i64>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<AttemptRow>, sqlx::Error> {
    sqlx::query_as!(
        AttemptRow,
        r#"SELECT a.id, a.delivery_id, d.event_id, d.endpoint_id, e.url, a.started_at,
                  a.status_code, a.outcome, a.duration_ms, a.response_excerpt
           FROM attempts a
           JOIN deliveries d ON d.id = a.delivery_id
           JOIN endpoints e ON e.id = d.endpoint_id
           WHERE d.project_id = $1
             AND ($2::text IS NULL OR d.endpoint_id = $2)
             AND ($3::text IS NULL OR d.event_id = $3)
             AND ($4::bigint IS NULL OR a.id = $4)
             AND ($5::bigint IS NULL OR a.id < $5)
           ORDER BY a.id DESC LIMIT $6"#,
        project_id,
        endpoint_id,
        event_id,
        attempt_id,
        before,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Event ids of one application created in `[since, until)` that have no Delivery to
/// `endpoint_id` (what "replay missing" sends), oldest first, at most `limit`.
pub async fn missing_for_endpoint(
    pool: &PgPool,
    project_id: &str,
    application_id: &str,
    endpoint_id: &str,
    since: DateTime<Utc>,
    until: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT v.id FROM events v
           WHERE v.project_id = $1 AND v.application_id = $2
             AND v.created_at >= $4 AND ($5::timestamptz IS NULL OR v.created_at < $5)
             AND v.expunged_at IS NULL
             AND NOT EXISTS (SELECT 1 FROM deliveries d
                             WHERE d.event_id = v.id AND d.endpoint_id = $3)
           ORDER BY v.id LIMIT $6"#,
        project_id,
        application_id,
        endpoint_id,
        since,
        until,
        limit
    )
    .fetch_all(pool)
    .await
}

/// An endpoint's most recent failed Attempt of a Delivery made in the last 7 days: when, its
/// status code (none: no answer came) and its error class. For the portal's health column;
/// the caller checked the endpoint.
pub async fn last_failure(
    pool: &PgPool,
    endpoint_id: &str,
) -> Result<Option<(DateTime<Utc>, Option<i32>, Option<String>)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT a.started_at, a.status_code, a.error_class
           FROM deliveries d
           JOIN attempts a ON a.delivery_id = d.id
           WHERE d.endpoint_id = $1 AND a.outcome <> 'SUCCEEDED'
             AND d.created_at > now() - interval '7 days'
           ORDER BY a.started_at DESC LIMIT 1"#,
        endpoint_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.started_at, r.status_code, r.error_class)))
}
