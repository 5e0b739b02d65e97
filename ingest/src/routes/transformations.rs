//! An endpoint's transformation (docs/ROUTING.md; the sandbox is
//! common/src/transformation.rs): set with the endpoint (`"transformation"` on create and
//! PATCH) or on its own route, read, removed, and tried on an example without sending.
//!
//! A program is checked before it is stored (it must load within the sandbox's limits and
//! declare `handler`), so a Delivery fails only for what its own Event makes the program do.

use std::time::Instant;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::transformation::{self as sandbox, Failure, Input, LIMITS, Outcome};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::ApiJson;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::endpoints::parse_id;
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointChange, EndpointRow, Kind};

/// A transformation as it is set: the program and whether it runs (default: it does).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformationIn {
    /// JavaScript declaring `function handler(webhook)` (at most 64 KiB).
    pub code: String,
    pub enabled: Option<bool>,
}

/// An endpoint's transformation as shown.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Transformation {
    pub code: String,
    pub enabled: bool,
    pub updated_at: Option<DateTime<Utc>>,
    /// The worker's last outcome for it: `{"outcome": "sent"|"skipped"|"failed", "at",
    /// "delivery_id", "error"}`, written when the outcome changes; absent until it ran.
    #[schema(value_type = Option<Object>)]
    pub last_result: Option<serde_json::Value>,
}

impl Transformation {
    pub(crate) fn of(row: &EndpointRow) -> Option<Transformation> {
        Some(Transformation {
            code: row.transformation_code.clone()?,
            enabled: row.transformation_enabled,
            updated_at: row.transformation_updated_at,
            last_result: row.transformation_last.clone(),
        })
    }
}

/// Checks a program in the sandbox (off the async threads: a check may run for the
/// sandbox's whole time limit, in one of `project`'s sandbox slots) and answers 422 naming
/// `field` when it cannot run.
pub(crate) async fn check_code(project: &str, field: &str, code: &str) -> ApiResult<()> {
    let owned = code.to_owned();
    let checked = match sandbox::run_in_slot(project, move || sandbox::check(&owned, &LIMITS)).await
    {
        Ok(checked) => checked,
        Err(sandbox::Unanswered::TooLong) => Err(Failure::time_limit()),
        Err(sandbox::Unanswered::Panicked) => {
            return Err(ApiError::validation(
                field,
                "the program could not be checked",
            ));
        }
    };
    checked.map_err(|f| ApiError::validation(field, format!("{field}: {f}")))
}

/// A request's transformation field: absent, `null` (remove) or a program (checked).
pub(crate) async fn check_change(
    project: &str,
    field: &str,
    change: Option<Option<&TransformationIn>>,
) -> ApiResult<(Option<Option<String>>, Option<bool>)> {
    match change {
        None => Ok((None, None)),
        Some(None) => Ok((Some(None), Some(false))),
        Some(Some(t)) => {
            check_code(project, &format!("{field}.code"), &t.code).await?;
            Ok((Some(Some(t.code.clone())), Some(t.enabled.unwrap_or(true))))
        }
    }
}

/// Returns the endpoint's transformation program and its last result.
#[utoipa::path(get, path = "/v1/endpoints/{id}/transformation", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = Transformation), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Transformation>> {
    let id = parse_id(&id)?;
    let row = store::find(&state.pool, project.id.as_str(), id.as_str(), Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    Transformation::of(&row)
        .map(Json)
        .ok_or(ApiError::NotFound("transformation"))
}

/// Sets the endpoint's transformation program (checked: it must load within the limits).
#[utoipa::path(put, path = "/v1/endpoints/{id}/transformation", tag = "endpoints",
    params(("id" = String, Path)), request_body = TransformationIn,
    responses((status = 200, body = Transformation), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn put(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<TransformationIn>,
) -> ApiResult<Json<Transformation>> {
    let (code, enabled) =
        check_change(project.id.as_str(), "transformation", Some(Some(&body))).await?;
    let row = set(&state, &project, &id, code, enabled).await?;
    Transformation::of(&row)
        .map(Json)
        .ok_or(ApiError::NotFound("transformation"))
}

/// Removes the endpoint's transformation.
#[utoipa::path(delete, path = "/v1/endpoints/{id}/transformation", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    set(&state, &project, &id, Some(None), Some(false)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stores a checked change of the endpoint's transformation.
pub(crate) async fn set(
    state: &AppState,
    project: &Project,
    id: &str,
    code: Option<Option<String>>,
    enabled: Option<bool>,
) -> ApiResult<EndpointRow> {
    let id = parse_id(id)?;
    let change = EndpointChange {
        transformation_code: code,
        transformation_enabled: enabled,
        ..EndpointChange::default()
    };
    let mut audited = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let before = store::find(
        audited.conn(),
        project.id.as_str(),
        id.as_str(),
        Kind::Webhook,
    )
    .await?
    .ok_or(ApiError::NotFound("endpoint"))?;
    let row = store::update(audited.conn(), id.as_str(), project.id.as_str(), change)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let shown = |r: &EndpointRow| serde_json::json!({"code": r.transformation_code, "enabled": r.transformation_enabled});
    audited
        .commit(
            "endpoint",
            Some(id.as_str()),
            "set_transformation",
            audit::diff(&shown(&before), &shown(&row)),
        )
        .await?;
    Ok(row)
}

/// An example to try a program on.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformationTest {
    /// The program to try; absent: the endpoint's stored one.
    pub code: Option<String>,
    /// The example Event's type and payload.
    pub event_type: String,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
}

/// What the program did with the example: what would be sent, a skip, or why it failed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TransformationResult {
    /// `send`, `skip` or `failed`.
    pub outcome: &'static str,
    #[schema(value_type = Option<Object>)]
    pub request: Option<sandbox::Request>,
    /// A stable code (`syntax`, `no_handler`, `threw`, `time_limit`, `memory_limit`,
    /// `output_too_large`, `invalid_result`) and the reason.
    pub error: Option<TransformationError>,
    pub duration_ms: f64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TransformationError {
    pub code: &'static str,
    pub detail: String,
}

/// Runs a program on an example under the worker's limits; nothing is sent or stored.
pub(crate) async fn try_program(
    project: &str,
    code: String,
    url: String,
    headers: std::collections::BTreeMap<String, String>,
    event_type: String,
    payload: Box<RawValue>,
) -> ApiResult<TransformationResult> {
    let ran = sandbox::run_in_slot(project, move || {
        let started = Instant::now();
        let input = Input::new("POST", &url, &event_type, &payload, headers.into_keys());
        (sandbox::run(&code, &input, &LIMITS), started.elapsed())
    })
    .await;
    let (result, took) = match ran {
        Ok(ran) => ran,
        Err(sandbox::Unanswered::TooLong) => (Err(Failure::time_limit()), LIMITS.wall * 2),
        Err(sandbox::Unanswered::Panicked) => {
            return Err(ApiError::validation("code", "the program could not be run"));
        }
    };
    let duration_ms = took.as_secs_f64() * 1000.0;
    Ok(match result {
        Ok(Outcome::Send(request)) => TransformationResult {
            outcome: "send",
            request: Some(request),
            error: None,
            duration_ms,
        },
        Ok(Outcome::Skip) => TransformationResult {
            outcome: "skip",
            request: None,
            error: None,
            duration_ms,
        },
        Err(f) => TransformationResult {
            outcome: "failed",
            request: None,
            error: Some(failure(&f)),
            duration_ms,
        },
    })
}

fn failure(f: &Failure) -> TransformationError {
    TransformationError {
        code: f.code(),
        detail: f.to_string(),
    }
}

/// Runs a transformation on an example Event under the same limits; nothing is sent or stored.
#[utoipa::path(post, path = "/v1/endpoints/{id}/transformation/test", tag = "endpoints",
    params(("id" = String, Path)), request_body = TransformationTest,
    responses((status = 200, body = TransformationResult), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn test(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<TransformationTest>,
) -> ApiResult<Json<TransformationResult>> {
    let id = parse_id(&id)?;
    let row = store::find(&state.pool, project.id.as_str(), id.as_str(), Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let code = match body.code.or_else(|| row.transformation_code.clone()) {
        Some(c) if c.len() <= sandbox::MAX_CODE_BYTES => c,
        Some(_) => {
            return Err(ApiError::validation(
                "code",
                format!("code is longer than {} bytes", sandbox::MAX_CODE_BYTES),
            ));
        }
        None => {
            return Err(ApiError::validation(
                "code",
                "the endpoint has no transformation: send `code` to try one",
            ));
        }
    };
    let headers = row.opened_headers(&state.keyring);
    let result = try_program(
        project.id.as_str(),
        code,
        row.url,
        headers,
        body.event_type,
        body.payload,
    )
    .await?;
    Ok(Json(result))
}

/// `/v1/endpoints/{id}/transformation` and its test route.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get, put, delete))
        .routes(routes!(test))
}
