//! `/api/v1/app/{app_id}/endpoint`: Svix endpoints are Railhook endpoints of the application
//! (routes/endpoints.rs checks and writes them). Svix's event-type filter is the endpoint's
//! one subscription, made with it: `filterTypes` (`eventTypes` in the v2 SDKs) are its
//! patterns, and no filter is `*`. `throttleRate` is `rate_limit_per_second`, `disabled` is
//! `!enabled`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::ids::SubscriptionId;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::applications::find as find_app;
use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult};
use crate::auth::Project;
use crate::extract::ApiJson;
use crate::problem::ApiError;
use crate::routes::endpoints::{self as native, CreateEndpoint, UpdateEndpoint};
use crate::routes::subscriptions::parse_patterns;
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointRow, Kind};
use crate::store::subscriptions as subs;

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut {
    pub id: String,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    pub throttle_rate: Option<i32>,
    pub disabled: bool,
    /// The event types it receives; absent: all (the v1 SDKs' name).
    pub filter_types: Option<Vec<String>>,
    /// The same, under the v2 SDKs' name.
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub metadata: BTreeMap<String, String>,
    /// Railhook's payload filter (docs/ROUTING.md); the official SDKs ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The endpoint's patterns, from its live subscriptions (the Svix surface keeps one);
/// `None` when it receives every type.
/// Svix's `filterTypes` from an endpoint's subscriptions' patterns: `None` (every type)
/// when one of them is `*`.
fn filter_of(mut patterns: Vec<String>) -> Option<Vec<String>> {
    patterns.sort();
    patterns.dedup();
    (!patterns.iter().any(|p| p == "*")).then_some(patterns)
}

pub(crate) async fn view(state: &AppState, r: EndpointRow) -> SvixResult<EndpointOut> {
    let mut one = views(state, vec![r]).await?;
    Ok(one.pop().expect("one view per row"))
}

/// The Svix shape of a page of endpoint rows, in their order, with one read of their
/// subscriptions for the whole page (issue #55: not one query per endpoint).
pub(crate) async fn views(
    state: &AppState,
    rows: Vec<EndpointRow>,
) -> SvixResult<Vec<EndpointOut>> {
    let Some(project_id) = rows.first().map(|r| r.project_id.clone()) else {
        return Ok(Vec::new());
    };
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let mut types = subs::event_types_by_endpoint(&state.pool, &project_id, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let filter = filter_of(types.remove(&r.id).unwrap_or_default());
            out_of(r, filter)
        })
        .collect())
}

fn out_of(r: EndpointRow, filter: Option<Vec<String>>) -> EndpointOut {
    EndpointOut {
        filter_types: filter.clone(),
        event_types: filter,
        id: r.id,
        uid: r.uid,
        url: r.url,
        description: r.description,
        throttle_rate: r.rate_limit_per_second,
        disabled: !r.enabled,
        channels: r.channels.filter(|c| !c.is_empty()),
        metadata: serde_json::from_value(r.metadata).unwrap_or_default(),
        filter: r.filter,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

/// The application's endpoint a path names (an id or a uid), or 404.
pub(crate) async fn find(
    state: &AppState,
    project: &Project,
    app_id: &str,
    endpoint_id: &str,
) -> SvixResult<EndpointRow> {
    let app = find_app(state, project, app_id).await?;
    Ok(
        store::find_in_application(&state.pool, project.id.as_str(), &app.id, endpoint_id)
            .await?
            .ok_or(ApiError::NotFound("endpoint"))?,
    )
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointIn {
    pub url: String,
    pub description: Option<String>,
    pub throttle_rate: Option<i32>,
    pub uid: Option<String>,
    pub disabled: Option<bool>,
    #[serde(alias = "eventTypes")]
    pub filter_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    /// `whsec_` and base64; absent: one is generated.
    pub secret: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub headers: Option<BTreeMap<String, String>>,
    /// Railhook's payload filter (docs/ROUTING.md): a SQL/JSON path predicate.
    pub filter: Option<String>,
}

/// The patterns of a Svix filter: the given types, or every type.
fn patterns(filter: Option<&[String]>) -> SvixResult<Vec<String>> {
    match filter {
        Some(types) if !types.is_empty() => Ok(parse_patterns(types).map_err(|e| match e {
            ApiError::Validation { detail, .. } => ApiError::validation("filterTypes", detail),
            other => other,
        })?),
        _ => Ok(vec!["*".to_owned()]),
    }
}

/// Sets the endpoint's one subscription to `patterns` (made if it has none).
async fn subscribe(
    state: &AppState,
    project_id: &str,
    endpoint_id: &str,
    patterns: &[String],
) -> SvixResult<()> {
    let existing = subs::page(&state.pool, project_id, Some(endpoint_id), None, 100).await?;
    let mut existing = existing.into_iter();
    match existing.next() {
        Some(first) => {
            subs::update(
                &state.pool,
                &first.id,
                project_id,
                Some(patterns),
                None,
                None,
            )
            .await?;
            for extra in existing {
                subs::delete(&state.pool, &extra.id, project_id).await?;
            }
        }
        None => {
            let id = SubscriptionId::generate();
            subs::insert(
                &state.pool,
                id.as_str(),
                project_id,
                endpoint_id,
                patterns,
                false,
                None,
            )
            .await?
            .ok_or(ApiError::NotFound("endpoint"))?;
        }
    }
    Ok(())
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint", tag = "svix",
    params(("app_id" = String, Path)), request_body = EndpointIn,
    responses((status = 201, body = EndpointOut), (status = 404), (status = 409), (status = 422)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixJson(body): SvixJson<EndpointIn>,
) -> SvixResult<(StatusCode, Json<EndpointOut>)> {
    let app = find_app(&state, &project, &app_id).await?;
    let create = CreateEndpoint {
        url: body.url,
        description: body.description.unwrap_or_default(),
        enabled: body.disabled.map(|d| !d),
        rate_limit_per_second: body.throttle_rate,
        headers: body.headers.unwrap_or_default(),
        secret: body.secret,
        channels: body.channels.filter(|c| !c.is_empty()),
        uid: body.uid,
        metadata: body.metadata.unwrap_or_default(),
        filter: body.filter,
        ..CreateEndpoint::default()
    };
    let created =
        create_in_application(&state, &project, app.id, create, body.filter_types).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Creates an endpoint of the application `app_id` from the native shape (any `type`) with
/// one subscription to `filter_types` (none: every type), as this surface does: Svix's
/// create, and the portal's add form.
pub(crate) async fn create_in_application(
    state: &AppState,
    project: &Project,
    app_id: String,
    mut create: CreateEndpoint,
    filter_types: Option<Vec<String>>,
) -> SvixResult<EndpointOut> {
    // Checked before anything is written, so a bad filter leaves no endpoint behind.
    let patterns = patterns(filter_types.as_deref())?;
    create.application = Some(app_id);
    let created = native::insert(state, project, create, None).await?;
    let id = created.endpoint.id;
    subscribe(state, project.id.as_str(), &id, &patterns).await?;
    let row = store::find(&state.pool, project.id.as_str(), &id, Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    view(state, row).await
}

#[derive(Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub limit: Option<i64>,
    pub iterator: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint", tag = "svix",
    params(("app_id" = String, Path), ListQuery),
    responses((status = 200, body = ListResponse<EndpointOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixQuery(q): SvixQuery<ListQuery>,
) -> SvixResult<Json<ListResponse<EndpointOut>>> {
    let app = find_app(&state, &project, &app_id).await?;
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        Kind::Webhook,
        Some(&app.id),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let out = views(&state, rows).await?;
    Ok(Json(page.finish(out, |e: &EndpointOut| &e.id)))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointOut), (status = 404)), security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<EndpointOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(view(&state, row).await?))
}

/// The fields of a PUT or a PATCH (`double` fields: absent, `null`, or a value).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPatch {
    pub url: Option<String>,
    pub description: Option<String>,
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<i32>)]
    pub throttle_rate: Option<Option<i32>>,
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub disabled: Option<bool>,
    #[serde(
        default,
        alias = "eventTypes",
        deserialize_with = "crate::routes::double_option"
    )]
    #[schema(value_type = Option<Vec<String>>)]
    pub filter_types: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub channels: Option<Option<Vec<String>>>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// Railhook's payload filter; `null` removes it.
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
}

async fn apply(
    state: &AppState,
    project: &Project,
    row: EndpointRow,
    p: EndpointPatch,
) -> SvixResult<EndpointOut> {
    let patterns = p
        .filter_types
        .as_ref()
        .map(|f| patterns(f.as_deref()))
        .transpose()?;
    let change = UpdateEndpoint {
        url: p.url,
        description: p.description,
        enabled: p.disabled.map(|d| !d),
        rate_limit_per_second: p.throttle_rate,
        channels: p.channels,
        uid: p.uid,
        metadata: p.metadata,
        filter: p.filter,
        ..UpdateEndpoint::default()
    };
    let id = row.id.clone();
    let _ = native::update(
        project.clone(),
        State(state.clone()),
        Path(id.clone()),
        ApiJson(change),
    )
    .await?;
    if let Some(patterns) = patterns {
        subscribe(state, project.id.as_str(), &id, &patterns).await?;
    }
    let row = store::find(&state.pool, project.id.as_str(), &id, Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    view(state, row).await
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), request_body = EndpointPatch,
    responses((status = 200, body = EndpointOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn patch(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EndpointPatch>,
) -> SvixResult<Json<EndpointOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(apply(&state, &project, row, body).await?))
}

/// Replaces the endpoint's fields with the body's (absent optional fields are cleared), or
/// creates it when the path names none.
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), request_body = EndpointIn,
    responses((status = 200, body = EndpointOut), (status = 201, body = EndpointOut),
              (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn upsert(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EndpointIn>,
) -> SvixResult<(StatusCode, Json<EndpointOut>)> {
    match find(&state, &project, &app_id, &endpoint_id).await {
        Ok(row) => {
            let p = EndpointPatch {
                url: Some(body.url),
                description: Some(body.description.unwrap_or_default()),
                throttle_rate: Some(body.throttle_rate),
                uid: Some(body.uid),
                disabled: Some(body.disabled.unwrap_or(false)),
                filter_types: Some(body.filter_types),
                channels: Some(body.channels),
                metadata: Some(body.metadata.unwrap_or_default()),
                filter: Some(body.filter),
            };
            Ok((StatusCode::OK, Json(apply(&state, &project, row, p).await?)))
        }
        Err(super::SvixError(ApiError::NotFound("endpoint"))) => {
            let mut body = body;
            if body.uid.is_none() && !endpoint_id.starts_with("ep_") {
                body.uid = Some(endpoint_id);
            }
            create(project, State(state), Path(app_id), SvixJson(body)).await
        }
        Err(e) => Err(e),
    }
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(native::delete(project, State(state), Path(row.id)).await?)
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointSecretOut {
    /// `whsec_…` (or `whsk_…` for an Ed25519 endpoint made on `/v1`).
    pub key: String,
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointSecretOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn secret(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<EndpointSecretOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    let read =
        crate::routes::endpoint_secret::read(&state, &project, &row.id, Kind::Webhook).await?;
    Ok(Json(EndpointSecretOut { key: read.0.key }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSecretRotateIn {
    /// The new secret; absent: one is generated.
    pub key: Option<String>,
    /// How long the old secret keeps signing beside the new one (0 to 7 days); absent: the
    /// deployment's overlap.
    pub grace_period_seconds: Option<i64>,
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret/rotate",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = EndpointSecretRotateIn,
    responses((status = 200, body = EndpointSecretOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn rotate_secret(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> SvixResult<Json<EndpointSecretOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    // The body is optional: none, or `{}`, rotates to a generated secret.
    let body: EndpointSecretRotateIn = if body.iter().all(u8::is_ascii_whitespace) {
        EndpointSecretRotateIn::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::validation("body", e.to_string()))?
    };
    let given = body
        .key
        .as_deref()
        .map(native::check_given_secret)
        .transpose()?;
    let overlap = match body.grace_period_seconds {
        None => None,
        Some(s) if (0..=7 * 24 * 3600).contains(&s) => Some(s),
        Some(_) => {
            return Err(ApiError::validation(
                "gracePeriodSeconds",
                "gracePeriodSeconds must be between 0 and 604800",
            )
            .into());
        }
    };
    let rotated = crate::routes::endpoint_secret::rotate_to(
        &state,
        &project,
        &row.id,
        Kind::Webhook,
        given,
        overlap,
    )
    .await?;
    Ok(Json(EndpointSecretOut { key: rotated.0.key }))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointStats {
    pub success: i64,
    pub pending: i64,
    pub sending: i64,
    pub fail: i64,
    pub canceled: i64,
}

#[derive(Deserialize, utoipa::IntoParams)]
pub struct StatsQuery {
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/stats", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path), StatsQuery),
    responses((status = 200, body = EndpointStats), (status = 404)), security(("api_key" = [])))]
pub async fn stats(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<StatsQuery>,
) -> SvixResult<Json<EndpointStats>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    let counts =
        crate::store::deliveries::status_counts(&state.pool, &row.id, q.since, q.until).await?;
    Ok(Json(EndpointStats {
        success: counts.succeeded,
        pending: counts.pending,
        sending: counts.processing,
        fail: counts.failed,
        canceled: 0,
    }))
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, upsert, patch, delete))
        .routes(routes!(secret))
        .routes(routes!(rotate_secret))
        .routes(routes!(stats))
        .merge(super::endpoint_headers::router())
        .merge(super::endpoint_credentials::router())
        .merge(super::endpoint_transformation::router())
        .merge(super::attempts::endpoint_router())
}
