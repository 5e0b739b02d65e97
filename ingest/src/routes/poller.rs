//! A polling endpoint's own native routes (docs/POLLING.md): its poll token, and its
//! consumers with their positions. The stream itself is read through the Svix-shaped
//! poller routes (`svix::poller`), which the official SDKs call.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use railhook_common::keygen::hash_api_key;
use rand::distr::{Alphanumeric, SampleString};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::Audited;
use crate::auth::Project;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoints::parse_id;
use crate::state::AppState;
use crate::store::endpoints::{self as endpoints, Kind};
use crate::store::poller::{self as store, Consumer};
use crate::svix::poller::POLL_TOKEN_PREFIX;

#[derive(Serialize, utoipa::ToSchema)]
pub struct PollToken {
    /// Shown once: only its hash is kept. It opens this endpoint's poller routes and
    /// nothing else; issuing another ends it.
    pub token: String,
    /// Where to poll with it (the SDKs' `message.poller`), relative to the API's base URL.
    pub poll_path: String,
}

/// Issues the endpoint's poll token, replacing (and ending) the one it had.
#[utoipa::path(post, path = "/v1/endpoints/{id}/poll-token", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 201, body = PollToken), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn issue_token(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<PollToken>)> {
    Ok((
        StatusCode::CREATED,
        Json(issue(&state, &project, &id).await?),
    ))
}

/// Issues the project's polling endpoint `id` a new poll token (the API's route and the
/// portal's button).
pub(crate) async fn issue(state: &AppState, project: &Project, id: &str) -> ApiResult<PollToken> {
    let app = poller_application(state, project, id).await?;
    let token = format!(
        "{POLL_TOKEN_PREFIX}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 32)
    );
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::set_token(
        change.conn(),
        project.id.as_str(),
        id,
        &hash_api_key(&token),
    )
    .await?
    {
        return Err(ApiError::NotFound("endpoint"));
    }
    change
        .commit(
            "endpoint",
            Some(id),
            "issue_poll_token",
            serde_json::json!({}),
        )
        .await?;
    Ok(PollToken {
        token,
        poll_path: format!("/api/v1/app/{app}/poller/{id}"),
    })
}

/// The application of the project's polling endpoint `id`; 404 if there is no such
/// endpoint, 422 if it is not a poller.
async fn poller_application(state: &AppState, project: &Project, id: &str) -> ApiResult<String> {
    let id = parse_id(id)?;
    let row = endpoints::find(&state.pool, project.id.as_str(), id.as_str(), Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    match (row.transport.as_str(), row.application_id) {
        ("poller", Some(app)) => Ok(app),
        _ => Err(ApiError::validation(
            "type",
            "this endpoint is not of type poller: nothing polls it",
        )),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ConsumerList {
    pub data: Vec<Consumer>,
}

/// The endpoint's consumers (up to 1,000, by id), each with its position and lag.
#[utoipa::path(get, path = "/v1/endpoints/{id}/consumers", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = ConsumerList), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn consumers(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<ConsumerList>> {
    poller_application(&state, &project, &id).await?;
    Ok(Json(ConsumerList {
        data: store::consumers(&state.pool, &id).await?,
    }))
}

/// Forgets a consumer: its next poll starts at the stream's start.
#[utoipa::path(delete, path = "/v1/endpoints/{id}/consumers/{consumer_id}", tag = "endpoints",
    params(("id" = String, Path), ("consumer_id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn forget_consumer(
    project: Project,
    State(state): State<AppState>,
    Path((id, consumer_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    poller_application(&state, &project, &id).await?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::forget(change.conn(), &id, &consumer_id).await? {
        return Err(ApiError::NotFound("consumer"));
    }
    change
        .commit(
            "endpoint",
            Some(&id),
            "forget_consumer",
            serde_json::json!({"consumer_id": consumer_id}),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(issue_token))
        .routes(routes!(consumers))
        .routes(routes!(forget_consumer))
}
