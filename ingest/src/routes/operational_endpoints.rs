//! `/v1/operational-endpoints`: where a project's own systems receive operational webhooks
//! (`crate::operational`): create, list, get, update, delete, read and rotate the secret.
//!
//! An operational endpoint is an `endpoints` row of kind `operational` with the operational
//! event types it wants (`*` for all). It has no subscriptions, so the project's Events
//! never reach it; `/v1/endpoints` never shows it. It is signed like any endpoint (its own
//! secret) and retried on its own ladder, [`LADDER`].

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::ids::EndpointId;
use railhook_common::keygen::generate_signing_secret;
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::operational::OperationalEvent;
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoint_secret::{self, EndpointSecret};
use crate::routes::endpoints::parse_id;
use crate::routes::validate_url;
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointRow, Kind};
use crate::store::operational_endpoints as operational_store;
use railhook_common::Word;

/// The operational ladder: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h (8 Attempts over ~17.5 h).
/// Shorter than the message ladder: an operator's pager wants to know today.
pub const LADDER: &str = "5,300,1800,7200,18000,36000,36000";
pub const MAX_ATTEMPTS: i32 = 8;
const TIMEOUT_MS: i32 = 15_000;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationalEndpoint {
    pub id: String,
    pub url: String,
    pub description: String,
    /// Operational event types sent here (`*`: all of them).
    pub event_types: Vec<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedOperationalEndpoint {
    #[serde(flatten)]
    pub endpoint: OperationalEndpoint,
    /// `whsec_…`: verifies this endpoint's webhooks (Standard Webhooks). Shown once; read it
    /// again with `GET /v1/operational-endpoints/{id}/secret`.
    pub secret: String,
}

impl From<EndpointRow> for OperationalEndpoint {
    fn from(r: EndpointRow) -> Self {
        Self {
            id: r.id,
            url: r.url,
            description: r.description,
            event_types: r.operational_types.unwrap_or_default(),
            enabled: r.enabled,
            disabled_reason: r.disabled_reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

fn event_types(raw: Option<Vec<String>>) -> ApiResult<Vec<String>> {
    let mut types = raw.unwrap_or_else(|| vec!["*".to_owned()]);
    if types.is_empty() {
        return Err(ApiError::validation(
            "event_types",
            "event_types must name at least one type (or \"*\")",
        ));
    }
    if let Some(bad) = types
        .iter()
        .find(|t| *t != "*" && OperationalEvent::parse(t).is_none())
    {
        return Err(ApiError::validation(
            "event_types",
            format!(
                "'{}' is not an operational event type; use \"*\" or any of {}",
                bad.escape_debug(),
                OperationalEvent::ALL
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    types.sort();
    types.dedup();
    Ok(types)
}

fn description(d: Option<String>) -> ApiResult<Option<String>> {
    if let Some(d) = &d {
        crate::routes::endpoints::check_description(d)?;
    }
    Ok(d)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOperationalEndpoint {
    pub url: String,
    pub description: Option<String>,
    /// Default: `["*"]`.
    pub event_types: Option<Vec<String>>,
}

/// Creates an operational webhook endpoint: Railhook tells it about endpoints disabled, messages failed and the like.
#[utoipa::path(post, path = "/v1/operational-endpoints", tag = "operational-endpoints",
    request_body = CreateOperationalEndpoint,
    responses((status = 201, body = CreatedOperationalEndpoint), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateOperationalEndpoint>,
) -> ApiResult<(StatusCode, Json<CreatedOperationalEndpoint>)> {
    let created = insert(&state, &project, body, true).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Checks and stores an operational endpoint, enabled or not, in one statement: the native
/// create and the Svix surface's (which may make it disabled) both call it.
pub(crate) async fn insert(
    state: &AppState,
    project: &Project,
    body: CreateOperationalEndpoint,
    enabled: bool,
) -> ApiResult<CreatedOperationalEndpoint> {
    let url = validate_url(&body.url)?;
    let description = description(body.description)?.unwrap_or_default();
    let types = event_types(body.event_types)?;
    let secret = generate_signing_secret();
    let id = EndpointId::generate();
    let sealed_secret = state.keyring.seal(id.as_str(), &secret);
    let new = operational_store::NewOperational {
        id: id.as_str(),
        project_id: project.id.as_str(),
        url: &url,
        description: &description,
        sealed_secret: &sealed_secret,
        timeout_ms: TIMEOUT_MS.min(state.limits.endpoint_timeout_max_ms),
        retry_delays: LADDER,
        max_attempts: MAX_ATTEMPTS,
        types: &types,
        enabled,
    };
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let row = operational_store::insert_operational(change.conn(), new).await?;
    let endpoint: OperationalEndpoint = row.into();
    change
        .commit(
            "operational_endpoint",
            Some(id.as_str()),
            "create",
            audit::view(&endpoint),
        )
        .await?;
    Ok(CreatedOperationalEndpoint { endpoint, secret })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists the project's operational webhook endpoints.
#[utoipa::path(get, path = "/v1/operational-endpoints", tag = "operational-endpoints",
    params(ListQuery),
    responses((status = 200, body = Listing<OperationalEndpoint>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<OperationalEndpoint>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        Kind::Operational,
        None,
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let rows: Vec<OperationalEndpoint> = rows.into_iter().map(Into::into).collect();
    Ok(Json(page.finish(rows, |e: &OperationalEndpoint| &e.id)))
}

/// Returns one operational webhook endpoint.
#[utoipa::path(get, path = "/v1/operational-endpoints/{id}", tag = "operational-endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = OperationalEndpoint), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<OperationalEndpoint>> {
    let id = parse_id(&id)?;
    let row = store::find(
        &state.pool,
        project.id.as_str(),
        id.as_str(),
        Kind::Operational,
    )
    .await?
    .ok_or(ApiError::NotFound("operational endpoint"))?;
    Ok(Json(row.into()))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateOperationalEndpoint {
    pub url: Option<String>,
    pub description: Option<String>,
    pub event_types: Option<Vec<String>>,
    /// `true` re-enables it (after its own failures disabled it) and clears the reason.
    pub enabled: Option<bool>,
}

/// Changes an operational webhook endpoint.
#[utoipa::path(patch, path = "/v1/operational-endpoints/{id}", tag = "operational-endpoints",
    params(("id" = String, Path)), request_body = UpdateOperationalEndpoint,
    responses((status = 200, body = OperationalEndpoint), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateOperationalEndpoint>,
) -> ApiResult<Json<OperationalEndpoint>> {
    let row = apply(&state, &project, &parse_id(&id)?, body).await?;
    Ok(Json(row.into()))
}

/// Checks and applies a change to the project's operational endpoint `id` (the native PATCH
/// and the Svix surface's PUT).
pub(crate) async fn apply(
    state: &AppState,
    project: &Project,
    id: &EndpointId,
    body: UpdateOperationalEndpoint,
) -> ApiResult<EndpointRow> {
    let url = body.url.as_deref().map(validate_url).transpose()?;
    let description = description(body.description)?;
    let types = body.event_types.map(|t| event_types(Some(t))).transpose()?;
    let change = operational_store::OperationalChange {
        url: url.as_deref(),
        description: description.as_deref(),
        types: types.as_deref(),
        enabled: body.enabled,
    };
    let mut audited = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let before = store::find(
        audited.conn(),
        project.id.as_str(),
        id.as_str(),
        Kind::Operational,
    )
    .await?
    .ok_or(ApiError::NotFound("operational endpoint"))?;
    let row = operational_store::update_operational(
        audited.conn(),
        id.as_str(),
        project.id.as_str(),
        change,
    )
    .await?
    .ok_or(ApiError::NotFound("operational endpoint"))?;
    let changed = audit::diff(
        &audit::view(&OperationalEndpoint::from(before)),
        &audit::view(&OperationalEndpoint::from(row.clone())),
    );
    audited
        .commit("operational_endpoint", Some(id.as_str()), "update", changed)
        .await?;
    Ok(row)
}

/// Deletes an operational webhook endpoint.
#[utoipa::path(delete, path = "/v1/operational-endpoints/{id}", tag = "operational-endpoints",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    remove(&state, &project, &parse_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes the project's operational endpoint `id` (the native DELETE and the Svix one).
pub(crate) async fn remove(state: &AppState, project: &Project, id: &EndpointId) -> ApiResult<()> {
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !operational_store::delete_operational(change.conn(), id.as_str(), project.id.as_str())
        .await?
    {
        return Err(ApiError::NotFound("operational endpoint"));
    }
    change
        .commit(
            "operational_endpoint",
            Some(id.as_str()),
            "delete",
            serde_json::json!({}),
        )
        .await?;
    Ok(())
}

/// Returns an operational webhook endpoint's signing secret.
#[utoipa::path(get, path = "/v1/operational-endpoints/{id}/secret", tag = "operational-endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = EndpointSecret), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointSecret>> {
    endpoint_secret::read(&state, &project, &id, Kind::Operational).await
}

/// Rotates an operational webhook endpoint's signing secret (the old one signs too for the overlap).
#[utoipa::path(post, path = "/v1/operational-endpoints/{id}/secret/rotate",
    tag = "operational-endpoints", params(("id" = String, Path)),
    responses((status = 200, body = EndpointSecret), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn rotate_secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointSecret>> {
    endpoint_secret::rotate(&state, &project, &id, Kind::Operational).await
}

/// `/v1/operational-endpoints`: its routes with their OpenAPI operations; writes clear the
/// sender cache (the ingest plans operational Deliveries from it).
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let routes = OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, delete))
        .routes(routes!(secret))
        .routes(routes!(rotate_secret));
    crate::routes::clears_senders(routes, state)
}
