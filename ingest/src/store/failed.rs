//! Failed Messages: the filter both the API and the dashboard apply, the list, and the
//! retry that sends them again (one Delivery, or every match in bounded statements). The
//! filter is composed into two statements, hence the unchecked SQL here.

use chrono::{DateTime, Utc};
use railhook_common::event_type::EventType;
use railhook_common::ids::EndpointId;
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, PgPool};

use crate::pagination::PageRequest;
use crate::problem::ApiError;

/// Deliveries one bulk-retry transaction moves back to PENDING.
const RETRY_BATCH: i64 = 1000;

/// Which Failed Messages: every field narrows, none means all of the project's.
#[derive(Debug, Default, Clone, Deserialize, utoipa::ToSchema)]
pub struct FailedFilter {
    pub endpoint_id: Option<String>,
    /// An exact event type.
    pub event_type: Option<String>,
    /// The status code of the last Attempt.
    pub status_code: Option<i32>,
    /// Failed at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Failed before this time.
    pub until: Option<DateTime<Utc>>,
    /// The application (its id or uid) whose endpoints' messages to take; the routes
    /// resolve a uid to the id before the store reads it.
    pub application: Option<String>,
}

impl FailedFilter {
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Some(ep) = &self.endpoint_id
            && EndpointId::parse(ep).is_err()
        {
            return Err(ApiError::validation("endpoint_id", "not an endpoint id"));
        }
        if let Some(t) = &self.event_type {
            EventType::parse(t)
                .map_err(|e| ApiError::validation("event_type", format!("'{t}': {e}")))?;
        }
        if let Some(code) = self.status_code
            && !(100..=599).contains(&code)
        {
            return Err(ApiError::validation(
                "status_code",
                "status_code must be between 100 and 599",
            ));
        }
        if let (Some(since), Some(until)) = (self.since, self.until)
            && since >= until
        {
            return Err(ApiError::validation("since", "since must be before until"));
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, FromRow, utoipa::ToSchema)]
pub struct FailedMessage {
    /// The Delivery id (its `webhook-id`).
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub endpoint_id: String,
    pub endpoint_url: String,
    pub attempt_count: i32,
    /// The status code of the last Attempt; absent when it got no answer.
    pub last_status_code: Option<i32>,
    pub failure_reason: Option<String>,
    /// `ingest` or `replay`.
    pub origin: String,
    pub created_at: DateTime<Utc>,
    pub failed_at: DateTime<Utc>,
}

/// The filter as SQL, shared by the list and the bulk retry (`$1` is the project; the
/// filter takes `$2`–`$7`). A Delivery's application is its endpoint's (docs/APPLICATIONS.md).
const FILTER_SQL: &str = "d.project_id = $1 AND d.status = 'FAILED'
    AND ($2::text IS NULL OR d.endpoint_id = $2)
    AND ($3::text IS NULL OR v.event_type = $3)
    AND ($4::int IS NULL OR d.last_status_code = $4)
    AND ($5::timestamptz IS NULL OR d.updated_at >= $5)
    AND ($6::timestamptz IS NULL OR d.updated_at < $6)
    AND ($7::text IS NULL OR d.endpoint_id IN (SELECT x.id FROM endpoints x
                                                WHERE x.application_id = $7))";

#[allow(clippy::disallowed_methods)] // composed: FILTER_SQL is shared by the list and the bulk retry
pub async fn list_failed(
    pool: &PgPool,
    project_id: &str,
    filter: &FailedFilter,
    page: &PageRequest,
) -> Result<Vec<FailedMessage>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT d.id, d.event_id, v.event_type, d.endpoint_id, e.url AS endpoint_url,
                d.attempt_count, d.last_status_code, d.failure_reason, d.origin,
                d.created_at, d.updated_at AS failed_at
         FROM deliveries d
         JOIN events v ON v.id = d.event_id
         JOIN endpoints e ON e.id = d.endpoint_id
         WHERE {FILTER_SQL} AND ($8::text IS NULL OR d.id < $8)
         ORDER BY d.id DESC LIMIT $9"
    ))
    .bind(project_id)
    .bind(&filter.endpoint_id)
    .bind(&filter.event_type)
    .bind(filter.status_code)
    .bind(filter.since)
    .bind(filter.until)
    .bind(&filter.application)
    .bind(&page.after)
    .bind(page.fetch())
    .fetch_all(pool)
    .await
}

/// Every Failed Message matching `filter` that had failed when this began, sent again in
/// statements of at most [`RETRY_BATCH`]; returns how many.
///
/// The audit row (`actor`'s bulk retry, with the filter) is written in the first batch's
/// transaction: the request's first change commits with it, and the batches after it are
/// the same request's.
pub async fn retry_matching(
    pool: &PgPool,
    project_id: &str,
    filter: &FailedFilter,
    actor: &crate::audit::Actor,
) -> Result<i64, sqlx::Error> {
    let started = sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(pool)
        .await?;
    let mut first = pool.begin().await?;
    let mut retried = reset_failed(&mut *first, project_id, filter, None, Some(started)).await?;
    crate::audit::record(
        &mut first,
        actor,
        crate::audit::Change {
            project_id,
            object_kind: "failed_messages",
            object_id: filter.endpoint_id.as_deref(),
            action: "bulk_retry",
            changes: serde_json::json!({
                "endpoint_id": filter.endpoint_id, "event_type": filter.event_type,
                "status_code": filter.status_code, "since": filter.since, "until": filter.until,
                "application": filter.application, "failed_by": started,
            }),
        },
    )
    .await?;
    first.commit().await?;
    if retried < RETRY_BATCH {
        return Ok(retried);
    }
    loop {
        let n = reset_failed(pool, project_id, filter, None, Some(started)).await?;
        retried += n;
        if n < RETRY_BATCH {
            return Ok(retried);
        }
    }
}

/// Sends up to `RETRY_BATCH` FAILED Deliveries matching `filter` (and `only`, one id, if
/// given; and failed no later than `failed_by`) again: a fresh ladder, the Claim cleared,
/// an ordered Delivery out of the ordering line (the ones numbered after it went on without
/// it), and an Outbox row (`MANUAL_RETRY`) each, all in one statement so the relay announces
/// exactly what was reset. The one reset used by the single and the bulk retry. Returns how
/// many it reset.
#[allow(clippy::disallowed_methods)] // composed: FILTER_SQL is shared by the list and the bulk retry
pub async fn reset_failed(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    filter: &FailedFilter,
    only: Option<&str>,
    failed_by: Option<DateTime<Utc>>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "WITH picked AS (
             SELECT d.id FROM deliveries d JOIN events v ON v.id = d.event_id
             WHERE {FILTER_SQL}
               AND ($9::timestamptz IS NULL OR d.updated_at <= $9)
               AND ($10::text IS NULL OR d.id = $10)
               AND v.expunged_at IS NULL
             ORDER BY d.id LIMIT $8
             FOR UPDATE OF d SKIP LOCKED
         ), upd AS (
             UPDATE deliveries d
             SET status = 'PENDING', attempt_count = 0, next_retry_at = NULL,
                 failure_reason = NULL, claim_token = NULL, ladder_started_at = now(),
                 updated_at = now(), version = d.version + 1,
                 ordering_skipped_at = CASE WHEN d.ordered
                                            THEN coalesce(d.ordering_skipped_at, now()) END
             FROM picked WHERE d.id = picked.id AND d.status = 'FAILED'
             RETURNING d.id, d.endpoint_id
         ), announced AS (
             INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
             SELECT upd.id, upd.endpoint_id, $1, 'MANUAL_RETRY' FROM upd ORDER BY upd.id
             RETURNING 1
         )
         SELECT count(*) FROM announced"
    ))
    .bind(project_id)
    .bind(&filter.endpoint_id)
    .bind(&filter.event_type)
    .bind(filter.status_code)
    .bind(filter.since)
    .bind(filter.until)
    .bind(&filter.application)
    .bind(RETRY_BATCH)
    .bind(failed_by)
    .bind(only)
    .fetch_one(db)
    .await
}
