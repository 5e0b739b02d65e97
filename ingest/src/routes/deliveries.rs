//! Deliveries (one per Event × endpoint; the id is the `webhook-id`) and their Attempts.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use railhook_common::ids::DeliveryId;
use serde::{Deserialize, Serialize};

use crate::auth::Project;
use crate::extract::ApiQuery;
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;

const STATUSES: [&str; 4] = ["PENDING", "PROCESSING", "SUCCEEDED", "FAILED"];

#[derive(Serialize, utoipa::ToSchema)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub endpoint_id: String,
    /// `PENDING`, `PROCESSING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    pub attempt_count: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// Set for ordered subscriptions: the endpoint-scoped `X-Sequence-Number`.
    pub sequence_number: Option<i64>,
    /// Times this Delivery was put back without an Attempt (breaker open, concurrency or
    /// rate limit, ordering gate). Deferrals never use up the retry ladder.
    pub deferral_count: i32,
    pub failure_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Attempt {
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub outcome: String,
    pub duration_ms: i32,
    pub error_class: Option<String>,
    pub response_excerpt: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: Delivery,
    /// Every Attempt so far, oldest first.
    pub attempts: Vec<Attempt>,
}

#[derive(Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub status: Option<String>,
    pub endpoint_id: Option<String>,
    pub event_id: Option<String>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/deliveries", tag = "deliveries", params(ListQuery),
    responses((status = 200, body = Listing<Delivery>), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Delivery>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    if let Some(s) = &q.status
        && !STATUSES.contains(&s.as_str())
    {
        return Err(ApiError::validation(
            "status",
            format!("status must be one of {STATUSES:?}"),
        ));
    }
    let rows = sqlx::query_as!(
        Delivery,
        r#"SELECT id, event_id, endpoint_id, status, attempt_count, next_retry_at,
                  last_attempt_at, sequence_number, deferral_count, failure_reason, created_at, updated_at
           FROM deliveries
           WHERE project_id = $1
             AND ($2::text IS NULL OR status = $2)
             AND ($3::text IS NULL OR endpoint_id = $3)
             AND ($4::text IS NULL OR event_id = $4)
             AND ($5::text IS NULL OR id < $5)
           ORDER BY id DESC LIMIT $6"#,
        project.id.as_str(),
        q.status,
        q.endpoint_id,
        q.event_id,
        page.after,
        page.fetch()
    )
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(page.finish(rows, |d: &Delivery| &d.id)))
}

pub async fn attempts_of(state: &AppState, id: &str) -> Result<Vec<Attempt>, sqlx::Error> {
    sqlx::query_as!(
        Attempt,
        r#"SELECT attempt_number, started_at, finished_at, status_code, outcome, duration_ms,
                  error_class, response_excerpt
           FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number"#,
        id
    )
    .fetch_all(&state.pool)
    .await
}

pub async fn find(state: &AppState, project: &Project, raw: &str) -> ApiResult<Delivery> {
    let id = DeliveryId::parse(raw).map_err(|_| ApiError::NotFound("delivery"))?;
    sqlx::query_as!(
        Delivery,
        r#"SELECT id, event_id, endpoint_id, status, attempt_count, next_retry_at,
                  last_attempt_at, sequence_number, deferral_count, failure_reason, created_at, updated_at
           FROM deliveries WHERE id = $1 AND project_id = $2"#,
        id.as_str(),
        project.id.as_str()
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or(ApiError::NotFound("delivery"))
}

#[utoipa::path(get, path = "/v1/deliveries/{id}", tag = "deliveries",
    params(("id" = String, Path)),
    responses((status = 200, body = DeliveryDetail), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<DeliveryDetail>> {
    let delivery = find(&state, &project, &id).await?;
    let attempts = attempts_of(&state, &delivery.id).await?;
    Ok(Json(DeliveryDetail { delivery, attempts }))
}

#[utoipa::path(get, path = "/v1/deliveries/{id}/attempts", tag = "deliveries",
    params(("id" = String, Path)),
    responses((status = 200, body = Vec<Attempt>), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn attempts(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<Attempt>>> {
    let delivery = find(&state, &project, &id).await?;
    Ok(Json(attempts_of(&state, &delivery.id).await?))
}

/// Sends a FAILED Delivery again with a fresh ladder: back to PENDING, attempt count and
/// hard cap restarted, and a new Outbox row (reason `MANUAL_RETRY`) in the same transaction,
/// so the relay announces it like any new Delivery. The `webhook-id` stays the same: it is
/// the same Delivery, and a receiver that already processed it will recognise it.
#[utoipa::path(post, path = "/v1/deliveries/{id}/retry", tag = "deliveries",
    params(("id" = String, Path)),
    responses((status = 202, body = Delivery), (status = 404, body = Problem),
              (status = 409, description = "the Delivery is not FAILED", body = Problem)),
    security(("api_key" = [])))]
pub async fn retry(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<(axum::http::StatusCode, Json<Delivery>)> {
    let delivery = retry_one(&state, &project, &id).await?;
    Ok((axum::http::StatusCode::ACCEPTED, Json(delivery)))
}

/// The single retry, shared by the API and the dashboard.
pub async fn retry_one(state: &AppState, project: &Project, id: &str) -> ApiResult<Delivery> {
    let current = find(state, project, id).await?;
    // A Delivery made by a replay can outlive its Event by up to the retention: the Event's
    // partition goes with its own day (docs/ARCHITECTURE.md, "Storage").
    let expunged: bool = sqlx::query_scalar(
        "SELECT v.id IS NULL OR v.expunged_at IS NOT NULL
         FROM deliveries d LEFT JOIN events v ON v.id = d.event_id
         WHERE d.id = $1",
    )
    .bind(&current.id)
    .fetch_one(&state.pool)
    .await?;
    if expunged {
        return Err(ApiError::InvalidState(
            "the Event's payload was expunged or retired; its deliveries cannot be sent again",
        ));
    }
    let filter = crate::routes::failed::FailedFilter::default();
    let reset =
        crate::routes::failed::reset_failed(&state.pool, project, &filter, Some(&current.id), None)
            .await?;
    if reset == 0 {
        return Err(ApiError::InvalidState(
            "only a FAILED delivery can be retried",
        ));
    }
    find(state, project, &current.id).await
}
