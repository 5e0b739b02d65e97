//! Failed Messages: Deliveries that ended FAILED (a 4xx that a retry will not change, a
//! ladder run out, a 410, a disabled endpoint), for a person to read and send again.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use railhook_common::event_type::EventType;
use railhook_common::ids::EndpointId;
use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;

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

/// The filter's fields again rather than `#[serde(flatten)]`: a flattened query string
/// reaches the inner struct as strings only, and `status_code=400` would not parse.
#[derive(Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub endpoint_id: Option<String>,
    pub event_type: Option<String>,
    pub status_code: Option<i32>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

impl ListQuery {
    pub fn filter(&self) -> FailedFilter {
        FailedFilter {
            endpoint_id: self.endpoint_id.clone(),
            event_type: self.event_type.clone(),
            status_code: self.status_code,
            since: self.since,
            until: self.until,
        }
    }
}

/// The filter as SQL, shared by the list and the bulk retry (`$1` is the project; the
/// filter takes `$2`–`$6`).
const FILTER_SQL: &str = "d.project_id = $1 AND d.status = 'FAILED'
    AND ($2::text IS NULL OR d.endpoint_id = $2)
    AND ($3::text IS NULL OR v.event_type = $3)
    AND ($4::int IS NULL OR d.last_status_code = $4)
    AND ($5::timestamptz IS NULL OR d.updated_at >= $5)
    AND ($6::timestamptz IS NULL OR d.updated_at < $6)";

#[allow(clippy::disallowed_methods)] // composed: FILTER_SQL is shared by the list and the bulk retry
pub async fn list_failed(
    state: &AppState,
    project: &Project,
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
         WHERE {FILTER_SQL} AND ($7::text IS NULL OR d.id < $7)
         ORDER BY d.id DESC LIMIT $8"
    ))
    .bind(project.id.as_str())
    .bind(&filter.endpoint_id)
    .bind(&filter.event_type)
    .bind(filter.status_code)
    .bind(filter.since)
    .bind(filter.until)
    .bind(&page.after)
    .bind(page.fetch())
    .fetch_all(&state.pool)
    .await
}

#[utoipa::path(get, path = "/v1/failed-messages", tag = "failed-messages", params(ListQuery),
    responses((status = 200, body = Listing<FailedMessage>), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<FailedMessage>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let filter = q.filter();
    filter.validate()?;
    let rows = list_failed(&state, &project, &filter, &page).await?;
    Ok(Json(page.finish(rows, |m: &FailedMessage| &m.id)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkRetry {
    /// Failed Messages sent back to PENDING, each with a new Outbox row.
    pub retried: i64,
}

/// Sends every Failed Message matching the filter again, like `POST /v1/deliveries/{id}/retry`
/// does for one, in statements of at most 1000 Deliveries (each with its Outbox rows; see `reset_failed`).
/// Only messages that had failed when the request began are taken: one that fails again
/// while this runs (its endpoint is still disabled, say) is not retried in a loop.
#[utoipa::path(post, path = "/v1/failed-messages/retry", tag = "failed-messages",
    request_body = FailedFilter,
    responses((status = 200, body = BulkRetry), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn retry(
    project: Project,
    State(state): State<AppState>,
    ApiJson(filter): ApiJson<FailedFilter>,
) -> ApiResult<Json<BulkRetry>> {
    filter.validate()?;
    Ok(Json(BulkRetry {
        retried: retry_matching(&state, &project, &filter).await?,
    }))
}

pub async fn retry_matching(
    state: &AppState,
    project: &Project,
    filter: &FailedFilter,
) -> Result<i64, sqlx::Error> {
    let started = sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(&state.pool)
        .await?;
    let mut retried = 0;
    loop {
        let n = reset_failed(&state.pool, project, filter, None, Some(started)).await?;
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
    project: &Project,
    filter: &FailedFilter,
    only: Option<&str>,
    failed_by: Option<DateTime<Utc>>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "WITH picked AS (
             SELECT d.id FROM deliveries d JOIN events v ON v.id = d.event_id
             WHERE {FILTER_SQL}
               AND ($8::timestamptz IS NULL OR d.updated_at <= $8)
               AND ($9::text IS NULL OR d.id = $9)
               AND v.expunged_at IS NULL
             ORDER BY d.id LIMIT $7
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
    .bind(project.id.as_str())
    .bind(&filter.endpoint_id)
    .bind(&filter.event_type)
    .bind(filter.status_code)
    .bind(filter.since)
    .bind(filter.until)
    .bind(RETRY_BATCH)
    .bind(failed_by)
    .bind(only)
    .fetch_one(db)
    .await
}

/// `/v1/failed-messages`: its routes with their OpenAPI operations.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(retry))
}
