//! Liveness, readiness, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use railhook_common::health;

use crate::problem::ApiError;
use crate::state::AppState;

/// The process is up and answering.
pub async fn healthz() -> &'static str {
    "ok"
}

/// How old the last Postgres probe may be before `/readyz` asks again.
const READINESS_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Ready when every required dependency answers, as its last probe found it. 503 otherwise;
/// either way the body names each dependency, whether it is up, and its last error
/// (`railhook_common::health`).
///
/// `/readyz` takes no credentials, so it must not cost a query per request (review #34 item
/// 14): Postgres is asked again only when its last probe here is older than
/// [`READINESS_REFRESH`], by one request at a time; every other request reads the recorded
/// state (the role's probe task refreshes it too).
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if let Ok(mut last) = state.readiness_probed.try_lock()
        && last.is_none_or(|at| at.elapsed() >= READINESS_REFRESH)
    {
        let _ = health::probe_postgres(&state.deps, &state.pool).await;
        *last = Some(std::time::Instant::now());
    }
    railhook_common::metrics_http::readiness(&state.deps, None)
}

/// `/metrics` on the API port: 404 when `RAILHOOK_API_METRICS` is off — the default without
/// a metrics token; the metrics port serves it then — and 401 without the bearer token.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !state.api_metrics {
        return ApiError::NotFound("route").into_response();
    }
    let mut registries = vec![state.metrics.registry(), state.deps.registry()];
    registries.extend(state.other_registries.iter());
    state.metrics_access.respond(&headers, &registries)
}
