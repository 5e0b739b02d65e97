//! The rest of the Svix surface: health, operational-webhook endpoints (Railhook's
//! operational endpoints, routes/operational_endpoints.rs), and the answer for every route of
//! Svix's hosted service alone (the portal's access routes are `auth.rs`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::any;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::EndpointSecretOut;
use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult, unsupported};
use crate::auth::Project;
use crate::problem::ApiError;
use crate::routes::operational_endpoints::{
    self as native, CreateOperationalEndpoint, UpdateOperationalEndpoint,
};
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointRow, Kind};

/// Liveness, as Svix's `GET /api/v1/health` (204). Readiness is `/readyz`.
#[utoipa::path(get, path = "/api/v1/health", tag = "svix", responses((status = 204)))]
pub async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationalEndpointOut {
    pub id: String,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    pub rate_limit: Option<i32>,
    pub disabled: bool,
    pub filter_types: Option<Vec<String>>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<EndpointRow> for OperationalEndpointOut {
    fn from(r: EndpointRow) -> Self {
        let types = r.operational_types.unwrap_or_default();
        Self {
            filter_types: (!types.iter().any(|t| t == "*")).then_some(types),
            id: r.id,
            uid: None,
            url: r.url,
            description: r.description,
            rate_limit: r.rate_limit_per_second,
            disabled: !r.enabled,
            metadata: BTreeMap::new(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationalEndpointIn {
    pub url: String,
    pub description: Option<String>,
    pub filter_types: Option<Vec<String>>,
    pub disabled: Option<bool>,
}

async fn find_operational(
    state: &AppState,
    project: &Project,
    id: &str,
) -> SvixResult<EndpointRow> {
    Ok(
        store::find(&state.pool, project.id.as_str(), id, Kind::Operational)
            .await?
            .ok_or(ApiError::NotFound("endpoint"))?,
    )
}

/// Svix `operationalWebhookEndpoint.create`.
#[utoipa::path(post, path = "/api/v1/operational-webhook/endpoint", tag = "svix",
    request_body = OperationalEndpointIn,
    responses((status = 201, body = OperationalEndpointOut), (status = 422)),
    security(("api_key" = [])))]
pub async fn create_operational(
    project: Project,
    State(state): State<AppState>,
    SvixJson(body): SvixJson<OperationalEndpointIn>,
) -> SvixResult<(StatusCode, Json<OperationalEndpointOut>)> {
    let create = CreateOperationalEndpoint {
        url: body.url,
        description: body.description,
        event_types: body.filter_types.filter(|t| !t.is_empty()),
    };
    // Made disabled in the same statement when asked (not created, then disabled).
    let enabled = body.disabled != Some(true);
    let created = native::insert(&state, &project, create, enabled).await?;
    let id = created.endpoint.id.clone();
    let row = find_operational(&state, &project, &id).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
}

/// Svix `operationalWebhookEndpoint.list`.
#[utoipa::path(get, path = "/api/v1/operational-webhook/endpoint", tag = "svix",
    params(ListQuery),
    responses((status = 200, body = ListResponse<OperationalEndpointOut>)),
    security(("api_key" = [])))]
pub async fn list_operational(
    project: Project,
    State(state): State<AppState>,
    SvixQuery(q): SvixQuery<ListQuery>,
) -> SvixResult<Json<ListResponse<OperationalEndpointOut>>> {
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        Kind::Operational,
        None,
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let out = rows.into_iter().map(OperationalEndpointOut::from).collect();
    Ok(Json(page.finish(out, |e: &OperationalEndpointOut| &e.id)))
}

/// Svix `operationalWebhookEndpoint.get`.
#[utoipa::path(get, path = "/api/v1/operational-webhook/endpoint/{endpoint_id}", tag = "svix",
    params(("endpoint_id" = String, Path)),
    responses((status = 200, body = OperationalEndpointOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get_operational(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> SvixResult<Json<OperationalEndpointOut>> {
    Ok(Json(find_operational(&state, &project, &id).await?.into()))
}

/// Svix `operationalWebhookEndpoint.update`.
#[utoipa::path(put, path = "/api/v1/operational-webhook/endpoint/{endpoint_id}", tag = "svix",
    params(("endpoint_id" = String, Path)), request_body = OperationalEndpointIn,
    responses((status = 200, body = OperationalEndpointOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn update_operational(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    SvixJson(body): SvixJson<OperationalEndpointIn>,
) -> SvixResult<Json<OperationalEndpointOut>> {
    let row = find_operational(&state, &project, &id).await?;
    let change = UpdateOperationalEndpoint {
        url: Some(body.url),
        description: Some(body.description.unwrap_or_default()),
        event_types: Some(
            body.filter_types
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| vec!["*".to_owned()]),
        ),
        enabled: Some(!body.disabled.unwrap_or(false)),
    };
    let id = crate::routes::endpoints::parse_id(&row.id)?;
    Ok(Json(
        native::apply(&state, &project, &id, change).await?.into(),
    ))
}

/// Svix `operationalWebhookEndpoint.delete`.
#[utoipa::path(delete, path = "/api/v1/operational-webhook/endpoint/{endpoint_id}",
    tag = "svix", params(("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete_operational(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> SvixResult<StatusCode> {
    let row = find_operational(&state, &project, &id).await?;
    let id = crate::routes::endpoints::parse_id(&row.id)?;
    native::remove(&state, &project, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Svix `operationalWebhookEndpoint.getSecret`.
#[utoipa::path(get, path = "/api/v1/operational-webhook/endpoint/{endpoint_id}/secret",
    tag = "svix", params(("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointSecretOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn operational_secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> SvixResult<Json<EndpointSecretOut>> {
    let row = find_operational(&state, &project, &id).await?;
    let read =
        crate::routes::endpoint_secret::read(&state, &project, &row.id, Kind::Operational).await?;
    Ok(Json(EndpointSecretOut { key: read.0.key }))
}

/// Svix `operationalWebhookEndpoint.rotateSecret`.
#[utoipa::path(post, path = "/api/v1/operational-webhook/endpoint/{endpoint_id}/secret/rotate",
    tag = "svix", params(("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointSecretOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn rotate_operational_secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> SvixResult<Json<EndpointSecretOut>> {
    let row = find_operational(&state, &project, &id).await?;
    let rotated =
        crate::routes::endpoint_secret::rotate(&state, &project, &row.id, Kind::Operational)
            .await?;
    Ok(Json(EndpointSecretOut { key: rotated.0.key }))
}

/// The operational-webhook endpoint routes (their writes clear the sender cache).
pub fn operational_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_operational, list_operational))
        .routes(routes!(
            get_operational,
            update_operational,
            delete_operational
        ))
        .routes(routes!(operational_secret))
        .routes(routes!(rotate_operational_secret))
}

/// Routes of Svix's hosted service alone: each answers 501 `not_supported_by_this_server`.
/// These prefixes cover every path below them…
const HOSTED_ONLY_TREES: &[&str] = &[
    "/api/v1/stream",
    "/api/v1/streaming",
    "/api/v1/connector",
    "/api/v1/ingest",
    "/ingest/api/v1",
    "/api/v1/transformation-template",
    "/api/v1/background-task",
    "/api/v1/environment",
    "/api/v1/stats",
    "/api/v1/integration",
    "/api/v1/app/{app_id}/integration",
    "/api/v1/app/{app_id}/destination",
    "/api/v1/app/{app_id}/autoconfig",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation",
];

/// …and these are single routes.
const HOSTED_ONLY_ROUTES: &[&str] = &[
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/bulk-replay",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/attempt-stats",
    "/api/v1/app/{app_id}/msg/bulk-expunge",
    "/api/v1/app/{app_id}/msg/expunge-all-contents",
    "/api/v1/app/{app_id}/msg/precheck/active",
    "/api/v1/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content",
    "/api/v1/event-type/import/openapi",
    "/api/v1/auth/stream-portal-access/{stream_id}",
    "/api/v1/auth/stream-logout",
    "/api/v1/auth/stream/{stream_id}/expire-all",
    "/api/v1/auth/stream/{stream_id}/sink/{sink_id}/poller/token",
    "/api/v1/auth/stream/{stream_id}/sink/{sink_id}/poller/token/rotate",
    "/api/v1/operational-webhook/endpoint/{endpoint_id}/headers",
];

pub fn router() -> OpenApiRouter<AppState> {
    let mut r = OpenApiRouter::new()
        .routes(routes!(health))
        .merge(super::auth::router());
    for path in HOSTED_ONLY_TREES {
        r = r
            .route(path, any(unsupported))
            .route(&format!("{path}/{{*rest}}"), any(unsupported));
    }
    for path in HOSTED_ONLY_ROUTES {
        r = r.route(path, any(unsupported));
    }
    r
}
