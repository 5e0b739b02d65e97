//! Liveness, readiness, metrics and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// The process is up and answering.
pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready when Postgres answers a real query.
pub async fn readyz(State(state): State<AppState>) -> ApiResult<&'static str> {
    sqlx::query_scalar!("SELECT 1 AS one")
        .fetch_one(&state.pool)
        .await
        .map_err(|_| ApiError::Unavailable)?;
    Ok("ready")
}

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let mut registries = vec![state.metrics.registry()];
        registries.extend(state.other_registries.iter());
        crate::metrics::render(&registries)
    })
}

pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi::document())
}
