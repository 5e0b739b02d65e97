//! Endpoints: where webhooks go, how they are signed, and how hard they may be pushed.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use railhook_common::ids::EndpointId;
use railhook_common::signing::SigningKey;
use serde::Deserialize;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::applications::resolve as resolve_application;
use crate::state::AppState;
pub(crate) use crate::store::endpoints::EndpointRow;
use crate::store::endpoints::{self as store, Kind};
use railhook_common::retry::RetryDelays;

pub const DEFAULT_TIMEOUT_MS: i32 = 30_000;

pub use super::endpoint_update::{__path_update, update};
pub use crate::endpoint::{CreateEndpoint, CreatedEndpoint, Endpoint, UpdateEndpoint};

pub(crate) fn parse_id(raw: &str) -> ApiResult<EndpointId> {
    EndpointId::parse(raw).map_err(|_| ApiError::NotFound("endpoint"))
}

pub(crate) fn check_timeout(state: &AppState, ms: i32) -> ApiResult<()> {
    let max = state.limits.endpoint_timeout_max_ms;
    if (1_000..=max).contains(&ms) {
        Ok(())
    } else {
        Err(ApiError::validation(
            "timeout_ms",
            format!("timeout_ms must be between 1000 and {max}"),
        ))
    }
}

pub(crate) fn check_positive(field: &'static str, value: Option<i32>) -> ApiResult<()> {
    match value {
        Some(v) if v <= 0 => Err(ApiError::validation(
            field,
            format!("{field} must be positive"),
        )),
        _ => Ok(()),
    }
}

/// A retry ladder override in its stored form (common/src/retry.rs, `RetryDelays`).
pub(crate) fn retry_delays(raw: &[f64]) -> ApiResult<String> {
    RetryDelays::from_seconds(raw)
        .map(|d| d.to_string())
        .map_err(|e| {
            ApiError::validation("retry_delays_seconds", format!("retry_delays_seconds {e}"))
        })
}

pub(crate) fn check_max_attempts(value: Option<i32>) -> ApiResult<()> {
    match value {
        Some(v) if !(1..=50).contains(&v) => Err(ApiError::validation(
            "max_attempts",
            "max_attempts must be between 1 and 50",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_description(d: &str) -> ApiResult<()> {
    if d.chars().count() > 1000 {
        return Err(ApiError::validation(
            "description",
            "description must be at most 1000 characters",
        ));
    }
    // Postgres's text holds no NUL character: refused here, not a 500 from the write.
    if d.contains('\0') {
        return Err(ApiError::validation(
            "description",
            "description must not contain NUL",
        ));
    }
    Ok(())
}

/// Creates an endpoint (HTTP, a broker, a poller); the answer carries its signing secret.
#[utoipa::path(post, path = "/v1/endpoints", tag = "endpoints", request_body = CreateEndpoint,
    responses((status = 201, body = CreatedEndpoint), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateEndpoint>,
) -> ApiResult<(StatusCode, Json<CreatedEndpoint>)> {
    let created =
        crate::endpoint::create(&state, &project, crate::endpoint::New::native(body)).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// A secret the caller chose: `whsec_` (optional, as Standard Webhooks libraries accept)
/// and base64 of 24–64 bytes. Stored with the prefix.
pub(crate) fn check_given_secret(given: &str) -> ApiResult<String> {
    let raw = given.strip_prefix("whsec_").unwrap_or(given);
    match SigningKey::parse(given) {
        Ok(SigningKey::Hmac(bytes)) if (24..=64).contains(&bytes.len()) => {
            Ok(format!("whsec_{raw}"))
        }
        _ => Err(ApiError::validation(
            "secret",
            "secret must be whsec_ followed by base64 of 24 to 64 bytes",
        )),
    }
}

/// A uid already used in the endpoint's scope is 409, not a 500.
pub(crate) fn uid_conflict(e: sqlx::Error) -> ApiError {
    if crate::store::applications::uid_taken(&e) {
        ApiError::AlreadyExists("an endpoint with this uid")
    } else {
        e.into()
    }
}

/// A Source's live Destinations, oldest first.
pub(crate) async fn of_source(state: &AppState, source_id: &str) -> ApiResult<Vec<Endpoint>> {
    let rows = store::of_source(&state.pool, source_id).await?;
    Ok(rows.into_iter().map(|r| r.view(&state.keyring)).collect())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
    /// Only this application's endpoints (its id or uid).
    pub application: Option<String>,
}

/// Lists the project's endpoints, filtered by application.
#[utoipa::path(get, path = "/v1/endpoints", tag = "endpoints", params(ListQuery),
    responses((status = 200, body = Listing<Endpoint>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Endpoint>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let application = match &q.application {
        Some(a) => Some(
            resolve_application(&state, project.id.as_str(), a)
                .await?
                .id,
        ),
        None => None,
    };
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        Kind::Webhook,
        application.as_deref(),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let rows = rows.into_iter().map(|r| r.view(&state.keyring)).collect();
    Ok(Json(page.finish(rows, |e: &Endpoint| &e.id)))
}

/// Returns one endpoint (credentials left out).
#[utoipa::path(get, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Endpoint>> {
    let id = parse_id(&id)?;
    let row = store::find(&state.pool, project.id.as_str(), id.as_str(), Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    Ok(Json(row.view(&state.keyring)))
}

/// Deleting keeps the row (its Deliveries and Attempts stay readable) but removes it and its
/// subscriptions from every list and from matching; it receives nothing new.
#[utoipa::path(delete, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    crate::endpoint::delete(&state, &project, &parse_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `/v1/endpoints`: its routes with their OpenAPI operations. A write changes what senders
/// fan out to, so it clears the sender cache (`routes::clears_senders`).
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let routes = OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, delete))
        .merge(crate::routes::endpoint_secret::router())
        .merge(crate::routes::poller::router())
        .merge(crate::routes::transformations::router())
        .merge(crate::routes::endpoint_state::router());
    crate::routes::clears_senders(routes, state)
}
