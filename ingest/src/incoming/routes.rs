//! Sources (where a provider's webhooks arrive) and their Destinations (where Railhook
//! forwards them). A Destination is an endpoint row with `source_id` set, so everything an
//! endpoint has (signing secret, timeout, rate and concurrency limits, breaker, health,
//! ladder override) a Destination has too, through the same `/v1/endpoints/{id}` routes.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::ids::SourceId;
use serde::{Deserialize, Serialize};

use super::Provider;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::store::{self, SourceRow};
use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoints::{self, CreateEndpoint, CreatedEndpoint, Endpoint};
use crate::state::AppState;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Source {
    pub id: String,
    /// `github`, `stripe`, `shopify`, `standard` or `generic`.
    pub provider: String,
    pub name: String,
    /// Where the provider must send its webhooks (relative to the API's public address).
    pub ingest_path: String,
    pub created_at: DateTime<Utc>,
}

impl From<SourceRow> for Source {
    fn from(r: SourceRow) -> Self {
        Source {
            ingest_path: format!("/in/{}", r.id),
            id: r.id,
            provider: r.provider,
            name: r.name,
            created_at: r.created_at,
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSource {
    pub provider: String,
    #[serde(default)]
    pub name: String,
    /// The provider's verification secret: GitHub's webhook secret, Stripe's endpoint
    /// `whsec_…`, Shopify's app client secret, a Standard Webhooks `whsec_…`, or the shared
    /// key of a `generic` sender. Stored, never returned.
    pub secret: String,
}

fn parse_id(raw: &str) -> ApiResult<SourceId> {
    SourceId::parse(raw).map_err(|_| ApiError::NotFound("source"))
}

/// Creates a Source for a provider's incoming webhooks.
///
/// The answer names its `ingest_path`; the verification secret is sealed and never returned.
#[utoipa::path(post, path = "/v1/sources", tag = "incoming", request_body = CreateSource,
    responses((status = 201, body = Source), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateSource>,
) -> ApiResult<(StatusCode, Json<Source>)> {
    let provider = Provider::parse(&body.provider).ok_or_else(|| {
        ApiError::validation(
            "provider",
            "provider must be one of github, stripe, shopify, standard, generic",
        )
    })?;
    if body.name.chars().count() > 200 {
        return Err(ApiError::validation(
            "name",
            "name must be at most 200 characters",
        ));
    }
    let secret = body.secret.trim();
    if secret.len() < 8 || secret.len() > 512 {
        return Err(ApiError::validation(
            "secret",
            "secret must be 8-512 characters",
        ));
    }
    // A Source verifies v1 (HMAC) only: a sender's whsk_ secret key has no place here.
    if provider == Provider::Standard
        && (secret.starts_with(railhook_common::keygen::ED25519_SECRET_PREFIX)
            || railhook_common::signing::SigningKey::parse(secret).is_err())
    {
        return Err(ApiError::validation(
            "secret",
            "a Standard Webhooks secret is whsec_ followed by base64",
        ));
    }
    let id = SourceId::generate();
    let sealed = state.keyring.seal(id.as_str(), secret);
    let (project_id, provider) = (project.id.as_str(), provider.as_str());
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let row = store::insert_source(
        change.conn(),
        &id,
        project_id,
        provider,
        &body.name,
        &sealed,
    )
    .await?;
    let view: Source = row.into();
    change
        .commit("source", Some(id.as_str()), "create", audit::view(&view))
        .await?;
    Ok((StatusCode::CREATED, Json(view)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists the project's Sources, newest first.
#[utoipa::path(get, path = "/v1/sources", tag = "incoming", params(ListQuery),
    responses((status = 200, body = Listing<Source>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Source>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let after = page.after.as_deref();
    let rows = store::list_sources(&state.pool, project.id.as_str(), after, page.fetch()).await?;
    let rows = rows.into_iter().map(Source::from).collect();
    Ok(Json(page.finish(rows, |s: &Source| &s.id)))
}

async fn find(state: &AppState, project: &Project, raw: &str) -> ApiResult<SourceRow> {
    let id = parse_id(raw)?;
    store::project_source(&state.pool, &id, project.id.as_str())
        .await?
        .ok_or(ApiError::NotFound("source"))
}

/// Returns one Source (without its secret).
#[utoipa::path(get, path = "/v1/sources/{id}", tag = "incoming",
    params(("id" = String, Path)),
    responses((status = 200, body = Source), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Source>> {
    Ok(Json(find(&state, &project, &id).await?.into()))
}

/// Deleting a Source stops it receiving (`/in/{id}` answers 404) and removes its
/// Destinations; stored Events and Deliveries stay readable.
#[utoipa::path(delete, path = "/v1/sources/{id}", tag = "incoming",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let source = find(&state, &project, &id).await?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    store::delete_source(change.conn(), &source.id).await?;
    change
        .commit("source", Some(&source.id), "delete", serde_json::json!({}))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Adds a Destination to a Source: an endpoint its webhooks are forwarded to.
///
/// The answer carries the Destination's own signing secret.
#[utoipa::path(post, path = "/v1/sources/{id}/destinations", tag = "incoming",
    params(("id" = String, Path)), request_body = CreateEndpoint,
    responses((status = 201, body = CreatedEndpoint), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create_destination(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<CreateEndpoint>,
) -> ApiResult<(StatusCode, Json<CreatedEndpoint>)> {
    let source = find(&state, &project, &id).await?;
    let new = crate::endpoint::New {
        fields: body,
        subscription: None,
        source_id: Some(&source.id),
        own_target: None,
    };
    let created = crate::endpoint::create(&state, &project, new).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists a Source's Destinations.
#[utoipa::path(get, path = "/v1/sources/{id}/destinations", tag = "incoming",
    params(("id" = String, Path)),
    responses((status = 200, body = Vec<Endpoint>), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn list_destinations(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<Endpoint>>> {
    let source = find(&state, &project, &id).await?;
    Ok(Json(endpoints::of_source(&state, &source.id).await?))
}

/// `/v1/sources`: its routes with their OpenAPI operations.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, delete))
        .routes(routes!(create_destination, list_destinations))
}
