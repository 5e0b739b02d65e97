//! `/api/v1/app/{app_id}/endpoint/{endpoint_id}/authentication` and `…/client-certificate`:
//! an endpoint's HTTP authentication (Basic, OAuth2 client credentials) and its client
//! certificate for mutual TLS on the Svix surface. Svix's own SDKs have no such calls;
//! these are Railhook's, in the native API's shapes (docs/SVIX_COMPATIBILITY.md), written
//! by the endpoint module (crate::endpoint), which checks and seals them. Secrets
//! are write-only here as there.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use railhook_common::endpoint_auth::{Authentication, ClientCertificate};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::find;
use super::{SvixJson, SvixResult};
use crate::auth::Project;
use crate::endpoint::Change;
use crate::state::AppState;

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuthenticationOut {
    /// Without its secret; `null` when the endpoint has none.
    pub authentication: Option<serde_json::Value>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ClientCertificateOut {
    /// The certificate chain without its key; `null` when the endpoint has none.
    pub client_certificate: Option<serde_json::Value>,
}

/// The application's endpoint, changed by the endpoint module (which checks and seals).
async fn apply(
    state: AppState,
    project: Project,
    (app_id, endpoint_id): (String, String),
    change: Change,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    super::endpoints::apply(&state, &project, &row, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The endpoint's HTTP authentication (Basic or OAuth2), secrets left out.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/authentication",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = AuthenticationOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get_authentication(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<AuthenticationOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(AuthenticationOut {
        authentication: row.authentication,
    }))
}

/// Sets the endpoint's HTTP authentication (Basic or OAuth2 client credentials).
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/authentication",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = Authentication,
    responses((status = 204), (status = 404), (status = 422)), security(("api_key" = [])))]
pub async fn set_authentication(
    project: Project,
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
    SvixJson(body): SvixJson<Authentication>,
) -> SvixResult<StatusCode> {
    apply(state, project, ids, Change::authentication(Some(body))).await
}

/// Removes the endpoint's HTTP authentication.
#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/authentication",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete_authentication(
    project: Project,
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
) -> SvixResult<StatusCode> {
    apply(state, project, ids, Change::authentication(None)).await
}

/// The endpoint's mutual-TLS client certificate (the key is never returned).
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/client-certificate",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = ClientCertificateOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get_client_certificate(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> SvixResult<Json<ClientCertificateOut>> {
    let row = find(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(ClientCertificateOut {
        client_certificate: row.client_certificate,
    }))
}

/// Sets the endpoint's mutual-TLS client certificate and key.
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/client-certificate",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = ClientCertificate,
    responses((status = 204), (status = 404), (status = 422)), security(("api_key" = [])))]
pub async fn set_client_certificate(
    project: Project,
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
    SvixJson(body): SvixJson<ClientCertificate>,
) -> SvixResult<StatusCode> {
    apply(state, project, ids, Change::client_certificate(Some(body))).await
}

/// Removes the endpoint's client certificate.
#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/client-certificate",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete_client_certificate(
    project: Project,
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
) -> SvixResult<StatusCode> {
    apply(state, project, ids, Change::client_certificate(None)).await
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(
            get_authentication,
            set_authentication,
            delete_authentication
        ))
        .routes(routes!(
            get_client_certificate,
            set_client_certificate,
            delete_client_certificate
        ))
}
