//! Deliveries (one per Event × endpoint; the id is the `webhook-id`) and their Attempts.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use railhook_common::DeliveryStatus;
use railhook_common::ids::DeliveryId;
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::extract::ApiQuery;
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;
pub use crate::store::deliveries::Attempt;
use crate::store::deliveries::{self as store, DeliveryFilter, DeliveryRow};

#[derive(Serialize, utoipa::ToSchema)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub endpoint_id: String,
    /// `PENDING`, `PROCESSING`, `SUCCEEDED` or `FAILED`.
    #[schema(value_type = String)]
    pub status: DeliveryStatus,
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

impl From<DeliveryRow> for Delivery {
    fn from(r: DeliveryRow) -> Self {
        Self {
            id: r.id,
            event_id: r.event_id,
            endpoint_id: r.endpoint_id,
            status: r.status,
            attempt_count: r.attempt_count,
            next_retry_at: r.next_retry_at,
            last_attempt_at: r.last_attempt_at,
            sequence_number: r.sequence_number,
            deferral_count: r.deferral_count,
            failure_reason: r.failure_reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The `status` filter of the API and the dashboard: one of the four words, or a 422.
pub fn parse_status(raw: Option<&str>) -> ApiResult<Option<DeliveryStatus>> {
    raw.map(|s| {
        DeliveryStatus::parse(s).ok_or_else(|| {
            ApiError::validation(
                "status",
                format!(
                    "status must be one of {:?}",
                    DeliveryStatus::ALL.map(DeliveryStatus::as_str)
                ),
            )
        })
    })
    .transpose()
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: Delivery,
    /// Every Attempt so far, oldest first.
    pub attempts: Vec<Attempt>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only Deliveries in this status (`PENDING`, `PROCESSING`, `SUCCEEDED`, `FAILED`).
    pub status: Option<String>,
    /// Only this endpoint's rows.
    pub endpoint_id: Option<String>,
    /// Only this Event's Deliveries.
    pub event_id: Option<String>,
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists Deliveries, newest first, filtered by endpoint, Event or status.
#[utoipa::path(get, path = "/v1/deliveries", tag = "deliveries", params(ListQuery),
    responses((status = 200, body = Listing<Delivery>), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Delivery>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let filter = DeliveryFilter {
        status: parse_status(q.status.as_deref())?,
        endpoint_id: q.endpoint_id,
        event_id: q.event_id,
        ..DeliveryFilter::default()
    };
    let rows: Vec<Delivery> = store::list(
        &state.pool,
        project.id.as_str(),
        &filter,
        page.after.as_deref(),
        page.fetch(),
    )
    .await?
    .into_iter()
    .map(Delivery::from)
    .collect();
    Ok(Json(page.finish(rows, |d: &Delivery| &d.id)))
}

pub async fn attempts_of(state: &AppState, id: &str) -> Result<Vec<Attempt>, sqlx::Error> {
    store::attempts(&state.pool, id).await
}

/// One of the project's Deliveries, or 404 (for an id of another project too).
pub async fn find_row(state: &AppState, project: &Project, raw: &str) -> ApiResult<DeliveryRow> {
    let id = DeliveryId::parse(raw).map_err(|_| ApiError::NotFound("delivery"))?;
    store::find(&state.pool, project.id.as_str(), id.as_str())
        .await?
        .ok_or(ApiError::NotFound("delivery"))
}

pub async fn find(state: &AppState, project: &Project, raw: &str) -> ApiResult<Delivery> {
    find_row(state, project, raw).await.map(Delivery::from)
}

/// Returns one Delivery with its status, attempt count and schedule.
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

/// Lists a Delivery's Attempts: status code, duration, error class, response excerpt.
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
    if store::event_gone(&state.pool, &current.id).await? {
        return Err(ApiError::InvalidState(
            "the Event's payload was expunged or retired; its deliveries cannot be sent again",
        ));
    }
    let filter = crate::store::failed::FailedFilter::default();
    let mut change =
        crate::audit::Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let reset = crate::store::failed::reset_failed(
        change.conn(),
        project.id.as_str(),
        &filter,
        Some(&current.id),
        None,
    )
    .await?;
    if reset == 0 {
        return Err(ApiError::InvalidState(
            "only a FAILED delivery can be retried",
        ));
    }
    change
        .commit(
            "delivery",
            Some(&current.id),
            "retry",
            serde_json::json!({}),
        )
        .await?;
    find(state, project, &current.id).await
}

/// `/v1/deliveries`: its routes with their OpenAPI operations.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get))
        .routes(routes!(attempts))
        .routes(routes!(retry))
}
