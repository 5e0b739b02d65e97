//! An endpoint's signing secret: reading it, and rotating it with an overlap in which the
//! old and the new secret both sign (same scheme: HMAC or Ed25519).

use serde_json::json;

use crate::audit::Audited;
use railhook_common::keygen::generate_secret_like;

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::Serialize;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoints::parse_id;
use crate::state::AppState;
use crate::store::endpoints::{self as store, Kind};

/// The signing secret, and during a rotation's overlap the previous one, which still signs.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointSecret {
    pub key: String,
    pub previous_key: Option<String>,
    pub previous_key_expires_at: Option<DateTime<Utc>>,
}

/// Returns the endpoint's current signing secret (and the previous one during a rotation).
#[utoipa::path(get, path = "/v1/endpoints/{id}/secret", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = EndpointSecret), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointSecret>> {
    read(&state, &project, &id, Kind::Webhook).await
}

/// The secret of an endpoint of `kind` (`webhook`, or `operational` for
/// `/v1/operational-endpoints`): each route sees only its own kind.
pub(crate) async fn read(
    state: &AppState,
    project: &Project,
    id: &str,
    kind: Kind,
) -> ApiResult<Json<EndpointSecret>> {
    let id = parse_id(id)?;
    // A reveal is recorded like a change (the value never is): who saw which secret.
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let row = store::secrets(change.conn(), id.as_str(), project.id.as_str(), kind)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    change
        .commit(
            object_kind(kind),
            Some(id.as_str()),
            "reveal_secret",
            json!({}),
        )
        .await?;
    let (key, previous_key) =
        state
            .keyring
            .open_pair(id.as_str(), &row.secret, row.previous_secret.as_deref())?;
    Ok(Json(EndpointSecret {
        key,
        previous_key,
        previous_key_expires_at: row.previous_expires_at,
    }))
}

/// Rotation: a new secret signs from now on; the old one keeps signing alongside it for the
/// configured overlap, so a receiver can switch without rejecting a single webhook.
#[utoipa::path(post, path = "/v1/endpoints/{id}/secret/rotate", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = EndpointSecret), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn rotate_secret(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointSecret>> {
    rotate(&state, &project, &id, Kind::Webhook).await
}

/// Rotates the secret of an endpoint of `kind` (see [`read`]).
pub(crate) async fn rotate(
    state: &AppState,
    project: &Project,
    id: &str,
    kind: Kind,
) -> ApiResult<Json<EndpointSecret>> {
    rotate_to(state, project, id, kind, None, None).await
}

/// Rotates to `given` (an HMAC secret the caller chose, already checked) or to a fresh
/// secret of the same scheme, with the old one signing beside it for `overlap_seconds`
/// (default: the deployment's overlap).
pub(crate) async fn rotate_to(
    state: &AppState,
    project: &Project,
    id: &str,
    kind: Kind,
    given: Option<String>,
    overlap_seconds: Option<i64>,
) -> ApiResult<Json<EndpointSecret>> {
    let id = parse_id(id)?;
    #[allow(clippy::cast_precision_loss)] // at most seven days of seconds
    let overlap = overlap_seconds.map_or(state.limits.secret_rotation_overlap.as_secs_f64(), |s| {
        s as f64
    });
    // A rotation keeps the endpoint's scheme.
    let current = store::current_secret(&state.pool, id.as_str(), project.id.as_str(), kind)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let chosen = given.is_some();
    let fresh = match given {
        Some(g) => g,
        None => generate_secret_like(&state.keyring.open(id.as_str(), &current)?),
    };
    let sealed = state.keyring.seal(id.as_str(), &fresh);
    let (id_text, project_id) = (id.as_str(), project.id.as_str());
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let row = store::rotate_secret(change.conn(), id_text, project_id, overlap, &sealed)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    change
        .commit(
            object_kind(kind),
            Some(id_text),
            "rotate_secret",
            json!({"overlap_seconds": overlap, "chosen_by_caller": chosen}),
        )
        .await?;
    let (key, previous_key) =
        state
            .keyring
            .open_pair(id.as_str(), &row.secret, row.previous_secret.as_deref())?;
    Ok(Json(EndpointSecret {
        key,
        previous_key,
        previous_key_expires_at: row.previous_expires_at,
    }))
}

/// How the audit log names an endpoint of `kind`.
pub(crate) fn object_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Operational => "operational_endpoint",
        _ => "endpoint",
    }
}

/// `/v1/endpoints/{id}/secret`: read and rotate (part of [`super::endpoints::router`]).
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(secret))
        .routes(routes!(rotate_secret))
}
