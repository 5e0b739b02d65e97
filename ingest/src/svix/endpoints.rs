//! `/api/v1/app/{app_id}/endpoint`: Svix endpoints are Railhook endpoints of the application
//! (crate::endpoint checks and writes them, the endpoint and its subscription in one
//! transaction). Svix's event-type filter is the endpoint's
//! one subscription, made with it: `filterTypes` (`eventTypes` in the v2 SDKs) are its
//! patterns, and no filter is `*`. `throttleRate` is `rate_limit_per_second`, `disabled` is
//! `!enabled`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::applications::find as find_app;
use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult};
use crate::auth::Project;
use crate::endpoint::Change;
use crate::problem::ApiError;
use crate::routes::endpoints::{self as native, CreateEndpoint, UpdateEndpoint};
use crate::routes::subscriptions::parse_patterns;
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointRow, Kind};
use crate::store::subscriptions as subs;
use railhook_common::transport::TransportKind;
use railhook_common::vocabulary::Word;

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
    /// Railhook's extension: `poller` makes a polling endpoint (docs/POLLING.md), which
    /// takes no `url`; absent: an HTTP endpoint, as in Svix.
    #[serde(rename = "type")]
    pub transport: Option<TransportKind>,
    #[serde(default)]
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
pub(crate) fn patterns(filter: Option<&[String]>) -> SvixResult<Vec<String>> {
    match filter {
        Some(types) if !types.is_empty() => Ok(parse_patterns(types).map_err(|e| match e {
            ApiError::Validation { detail, .. } => ApiError::validation("filterTypes", detail),
            other => other,
        })?),
        _ => Ok(vec!["*".to_owned()]),
    }
}

impl EndpointIn {
    /// The native create this Svix endpoint is, and the patterns of its one subscription.
    /// Every field of both shapes is named: a field added to either is a compile error here
    /// until it is placed.
    pub(crate) fn into_new(self) -> SvixResult<(CreateEndpoint, Vec<String>)> {
        let EndpointIn {
            transport,
            url,
            description,
            throttle_rate,
            uid,
            disabled,
            filter_types,
            channels,
            secret,
            metadata,
            headers,
            filter,
        } = self;
        let fields = CreateEndpoint {
            transport,
            url,
            kafka: None,
            sqs: None,
            rabbitmq: None,
            nats: None,
            authentication: None,
            client_certificate: None,
            description: description.unwrap_or_default(),
            enabled: disabled.map(|d| !d),
            timeout_ms: None,
            rate_limit_per_second: throttle_rate,
            rate_limit_burst: None,
            max_concurrency: None,
            headers: headers.unwrap_or_default(),
            retry_delays_seconds: None,
            max_attempts: None,
            signing: None,
            secret,
            application: None,
            channels: channels.filter(|c| !c.is_empty()),
            uid,
            metadata: metadata.unwrap_or_default(),
            filter,
            transformation: None,
        };
        Ok((fields, patterns(filter_types.as_deref())?))
    }
}

/// Svix `endpoint.create`: creates an endpoint of the application.
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
    let (create, patterns) = body.into_new()?;
    let created = create_in_application(&state, &project, app.id, create, patterns).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Creates an endpoint of the application `app_id` from the native shape (any `type`) with
/// one subscription to `patterns` (checked; `["*"]`: every type), in one transaction
/// (crate::endpoint): Svix's create, and the portal's add form.
pub(crate) async fn create_in_application(
    state: &AppState,
    project: &Project,
    app_id: String,
    mut create: CreateEndpoint,
    patterns: Vec<String>,
) -> SvixResult<EndpointOut> {
    create.application = Some(app_id);
    let new = crate::endpoint::New {
        fields: create,
        subscription: Some(patterns),
        source_id: None,
        own_target: None,
    };
    let created = crate::endpoint::create(state, project, new).await?;
    let row = store::find(
        &state.pool,
        project.id.as_str(),
        &created.endpoint.id,
        Kind::Webhook,
    )
    .await?
    .ok_or(ApiError::NotFound("endpoint"))?;
    view(state, row).await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
}

/// Svix `endpoint.list`: lists the application's endpoints.
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

/// Svix `endpoint.get`: returns an endpoint by id or uid.
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
#[derive(Debug, Deserialize, utoipa::ToSchema)]
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

impl EndpointPatch {
    /// The native change this Svix PATCH (or PUT) is, with its subscription's patterns when
    /// it names `filterTypes`. Every field of both shapes is named, as in
    /// [`EndpointIn::into_new`].
    pub(crate) fn into_change(self) -> SvixResult<Change> {
        let EndpointPatch {
            url,
            description,
            throttle_rate,
            uid,
            disabled,
            filter_types,
            channels,
            metadata,
            filter,
        } = self;
        let fields = UpdateEndpoint {
            url,
            kafka: None,
            sqs: None,
            rabbitmq: None,
            nats: None,
            authentication: None,
            client_certificate: None,
            description,
            enabled: disabled.map(|d| !d),
            timeout_ms: None,
            rate_limit_per_second: throttle_rate,
            rate_limit_burst: None,
            max_concurrency: None,
            headers: None,
            retry_delays_seconds: None,
            max_attempts: None,
            channels,
            uid,
            metadata,
            filter,
            transformation: None,
        };
        let subscription = filter_types
            .as_ref()
            .map(|f| patterns(f.as_deref()))
            .transpose()?;
        Ok(Change {
            fields,
            subscription,
        })
    }
}

/// Applies `change` to the endpoint `row` in one transaction (crate::endpoint) and shows it
/// as this surface does.
pub(crate) async fn apply(
    state: &AppState,
    project: &Project,
    row: &EndpointRow,
    change: Change,
) -> SvixResult<EndpointOut> {
    let id = crate::routes::endpoints::parse_id(&row.id)?;
    let row = crate::endpoint::update(state, project, &id, change).await?;
    view(state, row).await
}

/// Svix `endpoint.patch`: changes an endpoint.
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
    Ok(Json(
        apply(&state, &project, &row, body.into_change()?).await?,
    ))
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
            // A poller has no URL to send back (its `url` is its URL-shaped name).
            let poller = row.transport == TransportKind::Poller.as_str();
            let p = EndpointPatch {
                url: (!(poller && body.url.is_empty())).then_some(body.url),
                description: Some(body.description.unwrap_or_default()),
                throttle_rate: Some(body.throttle_rate),
                uid: Some(body.uid),
                disabled: Some(body.disabled.unwrap_or(false)),
                filter_types: Some(body.filter_types),
                channels: Some(body.channels),
                metadata: Some(body.metadata.unwrap_or_default()),
                filter: Some(body.filter),
            };
            let change = p.into_change()?;
            Ok((
                StatusCode::OK,
                Json(apply(&state, &project, &row, change).await?),
            ))
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

/// Svix `endpoint.delete`: deletes an endpoint.
#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    let id = crate::routes::endpoints::parse_id(&row.id)?;
    crate::endpoint::delete(&state, &project, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointSecretOut {
    /// `whsec_…` (or `whsk_…` for an Ed25519 endpoint made on `/v1`).
    pub key: String,
}

/// Svix `endpoint.getSecret`: the endpoint's signing secret.
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

/// Svix `endpoint.rotateSecret`: rotates the endpoint's signing secret.
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
    let body: EndpointSecretRotateIn = crate::extract::optional_json(&body)
        .map_err(|e| ApiError::validation("body", e.to_string()))?;
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
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// From this time (RFC 3339), inclusive.
    pub since: Option<DateTime<Utc>>,
    /// Up to this time (RFC 3339), exclusive.
    pub until: Option<DateTime<Utc>>,
}

/// Svix `endpoint.getStats`: the endpoint's Deliveries by status.
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
