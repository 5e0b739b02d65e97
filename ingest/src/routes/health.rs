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

/// Ready when every required dependency answers: Postgres is asked now (a real query), the
/// others as their last probe found them. 503 otherwise; either way the body names each
/// dependency, whether it is up, and its last error (`railhook_common::health`).
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let _ = health::probe_postgres(&state.deps, &state.pool).await;
    railhook_common::metrics_http::readiness(&state.deps, None)
}

/// `/metrics` on the API port: 404 when `RAILHOOK_API_METRICS` is off (the metrics port
/// serves it then), 401 without the bearer token when `RAILHOOK_METRICS_TOKEN` is set.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !state.api_metrics {
        return ApiError::NotFound("route").into_response();
    }
    let mut registries = vec![state.metrics.registry(), state.deps.registry()];
    registries.extend(state.other_registries.iter());
    state.metrics_access.respond(&headers, &registries)
}
