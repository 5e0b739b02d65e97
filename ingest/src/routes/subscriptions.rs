//! Subscriptions: which Event types an endpoint receives, and whether in order.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::EventTypePattern;
use railhook_common::ids::{EndpointId, SubscriptionId};
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;

const MAX_PATTERNS: usize = 100;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Subscription {
    pub id: String,
    pub endpoint_id: String,
    /// Patterns such as `order.paid`, `order.*` (one segment) or `*` (everything).
    pub event_types: Vec<String>,
    /// Deliver in Sequence Number order (outgoing only).
    pub ordered: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn parse_id(raw: &str) -> ApiResult<SubscriptionId> {
    SubscriptionId::parse(raw).map_err(|_| ApiError::NotFound("subscription"))
}

fn parse_patterns(raw: &[String]) -> ApiResult<Vec<String>> {
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
}

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
    let id = SubscriptionId::generate();
    // The endpoint must be this project's, and not a Destination of an incoming Source
    // (those receive only their Source's webhooks): the INSERT … SELECT finds nothing
    // otherwise.
    let row = sqlx::query_as!(
        Subscription,
        r#"INSERT INTO subscriptions (id, project_id, endpoint_id, event_types, ordered)
           SELECT $1, $2, e.id, $4, $5 FROM endpoints e
           WHERE e.id = $3 AND e.project_id = $2 AND e.deleted_at IS NULL AND e.kind = 'webhook'
             AND e.source_id IS NULL
           RETURNING id, endpoint_id, event_types, ordered, created_at, updated_at"#,
        id.as_str(),
        project.id.as_str(),
        endpoint.as_str(),
        &patterns,
        body.ordered
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or_else(|| ApiError::validation("endpoint_id", "no such endpoint"))?;
    Ok((StatusCode::CREATED, Json(row)))
}

#[derive(Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub endpoint_id: Option<String>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/subscriptions", tag = "subscriptions", params(ListQuery),
    responses((status = 200, body = Listing<Subscription>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Subscription>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = sqlx::query_as!(
        Subscription,
        r#"SELECT id, endpoint_id, event_types, ordered, created_at, updated_at
           FROM subscriptions
           WHERE project_id = $1 AND deleted_at IS NULL
             AND ($2::text IS NULL OR endpoint_id = $2)
             AND ($3::text IS NULL OR id < $3)
           ORDER BY id DESC LIMIT $4"#,
        project.id.as_str(),
        q.endpoint_id,
        page.after,
        page.fetch()
    )
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(page.finish(rows, |s: &Subscription| &s.id)))
}

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
    let row = sqlx::query_as!(
        Subscription,
        r#"SELECT id, endpoint_id, event_types, ordered, created_at, updated_at
           FROM subscriptions WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL"#,
        id.as_str(),
        project.id.as_str()
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or(ApiError::NotFound("subscription"))?;
    Ok(Json(row))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSubscription {
    pub event_types: Option<Vec<String>>,
    pub ordered: Option<bool>,
}

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
    let row = sqlx::query_as!(
        Subscription,
        r#"UPDATE subscriptions
           SET event_types = coalesce($3, event_types), ordered = coalesce($4, ordered),
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING id, endpoint_id, event_types, ordered, created_at, updated_at"#,
        id.as_str(),
        project.id.as_str(),
        patterns.as_deref(),
        body.ordered
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or(ApiError::NotFound("subscription"))?;
    Ok(Json(row))
}

#[utoipa::path(delete, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = parse_id(&id)?;
    let deleted = sqlx::query!(
        "UPDATE subscriptions SET deleted_at = now(), updated_at = now()
         WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL",
        id.as_str(),
        project.id.as_str()
    )
    .execute(&state.pool)
    .await?;
    if deleted.rows_affected() == 0 {
        return Err(ApiError::NotFound("subscription"));
    }
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
