//! `/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation`: an endpoint's
//! transformation on the Svix surface, in Svix's shapes (`{code, enabled}`; the official
//! SDKs' `endpoint.transformationGet` / `transformationPartialUpdate`). Programs written for
//! Svix run unchanged: the handler gets the same object (docs/ROUTING.md). Svix's
//! `variables` are not offered (docs/SVIX_COMPATIBILITY.md).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::find;
use super::{SvixJson, SvixResult};
use crate::auth::Project;
use crate::problem::ApiError;
use crate::routes::transformations::{self, TransformationIn};
use crate::state::AppState;

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointTransformationOut {
    pub code: Option<String>,
    pub enabled: bool,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointTransformationIn {
    /// `null` removes the program.
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<String>)]
    pub code: Option<Option<String>>,
    pub enabled: Option<bool>,
}

/// Svix `endpoint.transformationGet`: the endpoint's transformation.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointTransformationOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<EndpointTransformationOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(EndpointTransformationOut {
        enabled: row.transformation_enabled,
        updated_at: row.transformation_updated_at,
        code: row.transformation_code,
    }))
}

/// Svix `endpoint.transformationPartialUpdate`: changes the endpoint's transformation.
#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = EndpointTransformationIn,
    responses((status = 204), (status = 404), (status = 422)), security(("api_key" = [])))]
pub async fn patch(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EndpointTransformationIn>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    let (code, enabled) = match body.code {
        Some(Some(code)) => {
            let program = TransformationIn {
                code,
                enabled: body.enabled.or(Some(row.transformation_enabled)),
            };
            transformations::check_change(project.id.as_str(), "code", Some(Some(&program))).await?
        }
        Some(None) => (Some(None), Some(false)),
        None => {
            if body.enabled == Some(true) && row.transformation_code.is_none() {
                return Err(ApiError::validation(
                    "enabled",
                    "the endpoint has no transformation to enable: send `code`",
                )
                .into());
            }
            (None, body.enabled)
        }
    };
    transformations::set(&state, &project, &row.id, code, enabled).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get, patch))
}
