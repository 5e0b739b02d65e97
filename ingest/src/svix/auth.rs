//! `/api/v1/auth`: the customer portal's access (docs/PORTAL.md). An app-portal-access link
//! is a Railhook portal link (`routes::portal::issue`): it opens one session of the
//! application, once. Svix's `token` is the link's code; `logout` with it as the bearer ends
//! the link and the session it opened.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use railhook_common::keygen::hash_api_key;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::SvixResult;
use super::applications::{ApplicationIn, find as find_app, find_or_create};
use crate::auth::Project;
use crate::problem::ApiError;
use crate::routes::portal::{PortalAccessIn, issue};
use crate::state::AppState;
use crate::store::portal as store;

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessIn {
    /// How long the session lasts once the link is opened, in seconds (60 to 604800;
    /// default 3600).
    pub expiry: Option<i64>,
    /// The session can look but not change anything.
    pub read_only: Option<bool>,
    /// Creates the application named by the path if it does not exist.
    pub application: Option<ApplicationIn>,
    // Svix's `featureFlags`, `sessionId` and `capabilities` are accepted and ignored: every
    // portal feature is on, `expire-all` ends every session of the application, and the
    // portal's one capability switch is `readOnly`.
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AppPortalAccessOut {
    /// Open it (as an iframe's `src`) to start the session; it works once.
    pub url: String,
    /// The link's code; `POST /api/v1/auth/logout` with it as the bearer ends the session.
    pub token: String,
}

/// Svix `authentication.appPortalAccess`: a one-time link to the application's portal.
#[utoipa::path(post, path = "/api/v1/auth/app-portal-access/{app_id}", tag = "svix",
    params(("app_id" = String, Path)), request_body = AppPortalAccessIn,
    responses((status = 200, body = AppPortalAccessOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn app_portal_access(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> SvixResult<Json<AppPortalAccessOut>> {
    let body: AppPortalAccessIn = crate::extract::optional_json(&body)
        .map_err(|e| ApiError::validation("body", e.to_string()))?;
    let app = find_or_create(&state, &project, &app_id, body.application.as_ref()).await?;
    let access = issue(
        &state,
        &project,
        &headers,
        &app.id,
        &PortalAccessIn {
            read_only: body.read_only.unwrap_or(false),
            expiry: body.expiry,
        },
    )
    .await?;
    Ok(Json(AppPortalAccessOut {
        url: access.url,
        token: access.token,
    }))
}

/// Ends every portal session of the application and makes its unused links unusable. The
/// body (Svix's `sessionIds`, `expiry`) is accepted and ignored: all sessions end at once.
#[utoipa::path(post, path = "/api/v1/auth/app/{app_id}/expire-all", tag = "svix",
    params(("app_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn expire_all(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
) -> SvixResult<StatusCode> {
    let app = find_app(&state, &project, &app_id).await?;
    let ended = crate::routes::portal::expire_all(&state, &project, &app.id).await?;
    tracing::info!(application_id = %app.id, ended, "portal sessions expired");
    Ok(StatusCode::NO_CONTENT)
}

/// Ends the portal link named by the bearer (the `token` of app-portal-access) and the
/// session it opened. No API key is needed: the link's code is its own proof.
#[utoipa::path(post, path = "/api/v1/auth/logout", tag = "svix",
    responses((status = 204), (status = 401)), security(("portal_token" = [])))]
pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> SvixResult<StatusCode> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| t.starts_with("rhpl_"))
        .ok_or(ApiError::Unauthorized)?;
    let mut tx = state.pool.begin().await?;
    let Some((project_id, application_id)) =
        store::close_link(&mut tx, &hash_api_key(token)).await?
    else {
        return Err(ApiError::Unauthorized.into());
    };
    // The link's holder is the actor: named by the application, never by the token.
    crate::audit::record(
        &mut tx,
        &crate::audit::Actor::Portal {
            session: format!("portal link of {application_id}"),
        },
        crate::audit::Change {
            project_id: &project_id,
            object_kind: "portal_link",
            object_id: Some(&application_id),
            action: "logout",
            changes: serde_json::json!({}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(app_portal_access))
        .routes(routes!(expire_all))
        .routes(routes!(logout))
}
