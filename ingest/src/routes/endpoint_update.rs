//! `PATCH /v1/endpoints/{id}`: a change to an endpoint, in the native API's shape, applied
//! by the endpoint module (crate::endpoint), which checks every field and commits the change
//! with its operational webhooks.

use axum::Json;
use axum::extract::{Path, State};

use crate::auth::Project;
use crate::extract::ApiJson;
use crate::problem::{ApiResult, Problem};
use crate::routes::endpoints::{Endpoint, UpdateEndpoint, parse_id};
use crate::state::AppState;

/// Changes an endpoint; fields left out are kept.
#[utoipa::path(patch, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)), request_body = UpdateEndpoint,
    responses((status = 200, body = Endpoint), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateEndpoint>,
) -> ApiResult<Json<Endpoint>> {
    let id = parse_id(&id)?;
    let row = crate::endpoint::update(&state, &project, &id, crate::endpoint::Change::native(body))
        .await?;
    Ok(Json(row.view(&state.keyring)))
}
