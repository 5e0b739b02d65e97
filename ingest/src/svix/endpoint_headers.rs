//! `/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers`: an endpoint's custom headers on
//! the Svix surface (read, replace, patch), written by the endpoint module
//! (crate::endpoint), which checks and seals them.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::find;
use super::{SvixJson, SvixResult};
use crate::auth::Project;
use crate::endpoint::Change;
use crate::problem::ApiError;
use crate::state::AppState;
use crate::store::endpoints::EndpointRow;

#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointHeaders {
    pub headers: BTreeMap<String, String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointHeadersOut {
    pub headers: BTreeMap<String, String>,
    /// Railhook seals every header value at rest and shows them to the key's holder; none is
    /// hidden.
    pub sensitive: Vec<String>,
}

async fn headers_of(state: &AppState, row: &EndpointRow) -> SvixResult<BTreeMap<String, String>> {
    let opened = state
        .keyring
        .open_headers(&row.id, &row.headers)
        .map_err(ApiError::from)?;
    Ok(serde_json::from_value(opened).unwrap_or_default())
}

/// Svix `endpoint.getHeaders`: the endpoint's custom headers.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointHeadersOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get_headers(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<EndpointHeadersOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(EndpointHeadersOut {
        headers: headers_of(&state, &row).await?,
        sensitive: Vec::new(),
    }))
}

async fn set_headers_to(
    state: &AppState,
    project: &Project,
    row: &EndpointRow,
    headers: BTreeMap<String, String>,
) -> SvixResult<()> {
    super::endpoints::apply(state, project, row, Change::headers(headers)).await?;
    Ok(())
}

/// Svix `endpoint.updateHeaders`: replaces the endpoint's custom headers.
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = EndpointHeaders,
    responses((status = 204), (status = 404), (status = 422)), security(("api_key" = [])))]
pub async fn set_headers(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EndpointHeaders>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    set_headers_to(&state, &project, &row, body.headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHeadersPatchIn {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub delete_headers: Option<Vec<String>>,
}

/// Svix `endpoint.patchHeaders`: changes some of the endpoint's custom headers.
#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = EndpointHeadersPatchIn,
    responses((status = 204), (status = 404), (status = 422)), security(("api_key" = [])))]
pub async fn patch_headers(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EndpointHeadersPatchIn>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    let mut headers = headers_of(&state, &row).await?;
    for name in body.delete_headers.unwrap_or_default() {
        headers.retain(|k, _| !k.eq_ignore_ascii_case(&name));
    }
    headers.extend(body.headers);
    set_headers_to(&state, &project, &row, headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_headers, set_headers, patch_headers))
}
