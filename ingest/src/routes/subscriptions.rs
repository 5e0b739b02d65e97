//! Subscriptions: which Event types an endpoint receives, and whether in order.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use railhook_common::EventTypePattern;
use railhook_common::ids::{EndpointId, SubscriptionId};
use serde::Deserialize;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::filters::{check_change, check_filter};
use crate::state::AppState;
use crate::store::subscriptions as store;

const MAX_PATTERNS: usize = 100;

pub use crate::store::subscriptions::Subscription;

fn parse_id(raw: &str) -> ApiResult<SubscriptionId> {
    SubscriptionId::parse(raw).map_err(|_| ApiError::NotFound("subscription"))
}

pub(crate) fn parse_patterns(raw: &[String]) -> ApiResult<Vec<String>> {
    if raw.is_empty() || raw.len() > MAX_PATTERNS {
        return Err(ApiError::validation(
            "event_types",
            format!("event_types must hold 1-{MAX_PATTERNS} patterns"),
        ));
    }
    let mut patterns = Vec::with_capacity(raw.len());
    for p in raw {
        let parsed = EventTypePattern::parse(p).map_err(|e| {
            ApiError::validation("event_types", format!("'{}': {e}", p.escape_debug()))
        })?;
        patterns.push(parsed.as_str().to_owned());
    }
    patterns.sort();
    patterns.dedup();
    Ok(patterns)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    pub endpoint_id: String,
    pub event_types: Vec<String>,
    #[serde(default)]
    pub ordered: bool,
    /// A SQL/JSON path predicate on the payload (docs/ROUTING.md): this subscription matches
    /// only Events it holds for.
    pub filter: Option<String>,
}

/// Subscribes an endpoint to event types (patterns with `*`), optionally ordered or filtered.
#[utoipa::path(post, path = "/v1/subscriptions", tag = "subscriptions",
    request_body = CreateSubscription,
    responses((status = 201, body = Subscription), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateSubscription>,
) -> ApiResult<(StatusCode, Json<Subscription>)> {
    let endpoint = EndpointId::parse(&body.endpoint_id)
        .map_err(|e| ApiError::validation("endpoint_id", e.to_string()))?;
    let patterns = parse_patterns(&body.event_types)?;
    let filter = match &body.filter {
        Some(f) => Some(check_filter(&state.pool, "filter", f).await?),
        None => None,
    };
    let id = SubscriptionId::generate();
    let (project_id, endpoint_id) = (project.id.as_str(), endpoint.as_str());
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let row = store::insert(
        change.conn(),
        id.as_str(),
        project_id,
        endpoint_id,
        &patterns,
        body.ordered,
        filter.as_deref(),
    )
    .await?
    .ok_or_else(|| ApiError::validation("endpoint_id", "no such endpoint"))?;
    change
        .commit("subscription", Some(&row.id), "create", audit::view(&row))
        .await?;
    Ok((StatusCode::CREATED, Json(row)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this endpoint's rows.
    pub endpoint_id: Option<String>,
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists subscriptions, filtered by endpoint.
#[utoipa::path(get, path = "/v1/subscriptions", tag = "subscriptions", params(ListQuery),
    responses((status = 200, body = Listing<Subscription>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Subscription>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let (endpoint_id, after) = (q.endpoint_id.as_deref(), page.after.as_deref());
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        endpoint_id,
        after,
        page.fetch(),
    )
    .await?;
    Ok(Json(page.finish(rows, |s: &Subscription| &s.id)))
}

/// Returns one subscription.
#[utoipa::path(get, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    responses((status = 200, body = Subscription), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Subscription>> {
    let id = parse_id(&id)?;
    let row = store::find(&state.pool, id.as_str(), project.id.as_str())
        .await?
        .ok_or(ApiError::NotFound("subscription"))?;
    Ok(Json(row))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSubscription {
    pub event_types: Option<Vec<String>>,
    pub ordered: Option<bool>,
    /// `null` removes the filter.
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
}

/// Changes a subscription's event types, ordering or filter.
#[utoipa::path(patch, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)), request_body = UpdateSubscription,
    responses((status = 200, body = Subscription), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateSubscription>,
) -> ApiResult<Json<Subscription>> {
    let id = parse_id(&id)?;
    let patterns = body
        .event_types
        .as_deref()
        .map(parse_patterns)
        .transpose()?;
    let filter = check_change(
        &state.pool,
        "filter",
        body.filter.as_ref().map(Option::as_deref),
    )
    .await?;
    let (id, project_id) = (id.as_str(), project.id.as_str());
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let before = store::find(change.conn(), id, project_id)
        .await?
        .ok_or(ApiError::NotFound("subscription"))?;
    let row = store::update(
        change.conn(),
        id,
        project_id,
        patterns.as_deref(),
        body.ordered,
        filter.as_ref().map(Option::as_deref),
    )
    .await?
    .ok_or(ApiError::NotFound("subscription"))?;
    let changed = audit::diff(&audit::view(&before), &audit::view(&row));
    change
        .commit("subscription", Some(id), "update", changed)
        .await?;
    Ok(Json(row))
}

/// Deletes a subscription.
#[utoipa::path(delete, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = parse_id(&id)?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::delete(change.conn(), id.as_str(), project.id.as_str()).await? {
        return Err(ApiError::NotFound("subscription"));
    }
    change
        .commit(
            "subscription",
            Some(id.as_str()),
            "delete",
            serde_json::json!({}),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `/v1/subscriptions`: its routes with their OpenAPI operations; writes clear the sender
/// cache (`routes::clears_senders`).
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let routes = OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, delete));
    crate::routes::clears_senders(routes, state)
}
