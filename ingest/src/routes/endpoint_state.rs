//! An endpoint's state: its health (breaker, recent Attempts, failure streak) and disabling
//! or enabling it by hand.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Project;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoints::{Endpoint, parse_id};
use crate::state::AppState;
use crate::store::endpoints as store;
use railhook_common::ids::EndpointId;

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointHealth {
    pub endpoint_id: String,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// `closed`, `open` or `half_open` (shared by every worker; see docs/ARCHITECTURE.md).
    pub breaker_state: String,
    /// When the breaker last changed state.
    pub breaker_changed_at: Option<DateTime<Utc>>,
    pub attempts_24h: i64,
    pub succeeded_24h: i64,
    /// Share of the last 24 hours' Attempts that succeeded; absent when there were none.
    pub success_rate_24h: Option<f64>,
    /// `healthy`; `warning` when every Attempt has failed for longer than the warning
    /// window (it will be disabled at `disable_at` if nothing succeeds); or `disabled`.
    pub state: String,
    /// Attempts in a row that went out and failed (a success resets it).
    pub consecutive_failures: i32,
    /// When the current failure streak began.
    pub failing_since: Option<DateTime<Utc>>,
    /// When the streak will disable the endpoint, if nothing succeeds before.
    pub disable_at: Option<DateTime<Utc>>,
    pub disabled_at: Option<DateTime<Utc>>,
}

/// The endpoint's state as a person reads it, from its streak and the configured windows.
pub fn streak_state(
    enabled: bool,
    failing_since: Option<DateTime<Utc>>,
    policy: &crate::state::StreakWindows,
    now: DateTime<Utc>,
) -> (&'static str, Option<DateTime<Utc>>) {
    if !enabled {
        return ("disabled", None);
    }
    let Some(since) = failing_since else {
        return ("healthy", None);
    };
    let disable_at = since + policy.disable_after;
    if now - since >= policy.warn_after {
        ("warning", Some(disable_at))
    } else {
        ("healthy", Some(disable_at))
    }
}

/// Returns the endpoint's health: `healthy`, `warning` or `disabled`, its breaker and its last 24 hours.
#[utoipa::path(get, path = "/v1/endpoints/{id}/health", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = EndpointHealth), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn health(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointHealth>> {
    let id = parse_id(&id)?;
    let row = store::health(&state.pool, id.as_str(), project.id.as_str())
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let (health_state, disable_at) =
        streak_state(row.enabled, row.failing_since, &state.streak, Utc::now());
    Ok(Json(EndpointHealth {
        endpoint_id: id.into_string(),
        state: health_state.to_owned(),
        consecutive_failures: row.consecutive_failures,
        failing_since: row.failing_since,
        disable_at,
        disabled_at: row.disabled_at,
        enabled: row.enabled,
        disabled_reason: row.disabled_reason,
        breaker_state: row.breaker_state,
        breaker_changed_at: row.breaker_changed_at,
        attempts_24h: row.attempts,
        succeeded_24h: row.succeeded,
        success_rate_24h: (row.attempts > 0).then(|| row.succeeded as f64 / row.attempts as f64),
    }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct DisableEndpoint {
    /// Shown with the endpoint while it is disabled.
    pub reason: Option<String>,
}

/// Stops deliveries to an endpoint: from now on its Deliveries go to Failed Messages
/// (retryable once it is enabled again) instead of being sent.
#[utoipa::path(post, path = "/v1/endpoints/{id}/disable", tag = "endpoints",
    params(("id" = String, Path)), request_body = DisableEndpoint,
    responses((status = 200, body = Endpoint), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn disable(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Endpoint>> {
    let id = parse_id(&id)?;
    // The body is optional: an empty POST disables without a reason.
    let body: DisableEndpoint =
        crate::extract::optional_json(&body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    let reason = disabled_by_a_person(body.reason.as_deref())?;
    set_enabled(&state, &project, &id, false, Some(reason)).await
}

/// The reason shown for an endpoint a person disabled (API or dashboard), with theirs if
/// they gave one (at most 500 characters).
pub fn disabled_by_a_person(given: Option<&str>) -> ApiResult<String> {
    let given = given.unwrap_or_default().trim();
    if given.chars().count() > 500 {
        return Err(ApiError::validation(
            "reason",
            "reason must be at most 500 characters",
        ));
    }
    Ok(if given.is_empty() {
        "disabled by a person".to_owned()
    } else {
        format!("disabled by a person: {given}")
    })
}

/// Starts deliveries to an endpoint again and clears its reason and failure streak.
#[utoipa::path(post, path = "/v1/endpoints/{id}/enable", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn enable(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Endpoint>> {
    let id = parse_id(&id)?;
    set_enabled(&state, &project, &id, true, None).await
}

pub async fn set_enabled(
    state: &AppState,
    project: &Project,
    id: &EndpointId,
    enabled: bool,
    reason: Option<String>,
) -> ApiResult<Json<Endpoint>> {
    // The change, its operational webhook and its audit row commit together.
    let (id, project_id) = (id.as_str(), project.id.as_str());
    let mut audited = crate::audit::Audited::begin(&state.pool, &project.actor, project_id).await?;
    let was_enabled = crate::operational::lock_enabled(audited.conn(), project_id, id)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let row = store::set_enabled(audited.conn(), id, project_id, enabled, reason.as_deref())
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    crate::operational::emit_enabled_change(audited.conn(), project_id, was_enabled, &row).await?;
    let action = if enabled { "enable" } else { "disable" };
    audited
        .commit(
            "endpoint",
            Some(id),
            action,
            serde_json::json!({"reason": reason}),
        )
        .await?;
    // The dashboard comes here without the API's router layer.
    state.senders.invalidate();
    Ok(Json(row.view(&state.keyring)))
}

/// `/v1/endpoints/{id}/health`, `/disable` and `/enable` (part of [`super::endpoints::router`]).
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(disable))
        .routes(routes!(enable))
}
