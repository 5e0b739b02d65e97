//! Failed Messages: Deliveries that ended FAILED (a 4xx that a retry will not change, a
//! ladder run out, a 410, a disabled endpoint), for a person to read and send again.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;
use crate::store::failed::{FailedFilter, FailedMessage, list_failed, retry_matching};

/// The filter's fields again rather than `#[serde(flatten)]`: a flattened query string
/// reaches the inner struct as strings only, and `status_code=400` would not parse.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this endpoint's rows.
    pub endpoint_id: Option<String>,
    /// Only this exact event type.
    pub event_type: Option<String>,
    pub status_code: Option<i32>,
    /// From this time (RFC 3339), inclusive.
    pub since: Option<DateTime<Utc>>,
    /// Up to this time (RFC 3339), exclusive.
    pub until: Option<DateTime<Utc>>,
    /// Only the messages of this application's endpoints (its id or uid).
    pub application: Option<String>,
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
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
            application: self.application.clone(),
        }
    }
}

/// Checks the filter and names its application by id (a uid is resolved; one that names
/// no application of the project is 422, not an empty list, so a typo is not silent).
async fn checked(
    state: &AppState,
    project: &Project,
    mut f: FailedFilter,
) -> ApiResult<FailedFilter> {
    f.validate()?;
    if let Some(a) = f.application.take() {
        let found = crate::store::applications::find(&state.pool, project.id.as_str(), &a)
            .await?
            .ok_or_else(|| {
                ApiError::validation(
                    "application",
                    "application names no application of this project",
                )
            })?;
        f.application = Some(found.id);
    }
    Ok(f)
}

/// Lists Failed Messages (Deliveries that ended FAILED), newest first, with the reason.
#[utoipa::path(get, path = "/v1/failed-messages", tag = "failed-messages", params(ListQuery),
    responses((status = 200, body = Listing<FailedMessage>), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<FailedMessage>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let filter = checked(&state, &project, q.filter()).await?;
    let rows = list_failed(&state.pool, project.id.as_str(), &filter, &page).await?;
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
    let filter = checked(&state, &project, filter).await?;
    Ok(Json(BulkRetry {
        retried: retry_matching(&state.pool, project.id.as_str(), &filter, &project.actor).await?,
    }))
}

/// `/v1/failed-messages`: its routes with their OpenAPI operations.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(retry))
}
