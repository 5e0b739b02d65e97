//! The event-type catalogue: `/v1/event-types` (create, list, get, update, deprecate,
//! delete). A type may carry a JSON Schema (draft 2020-12) that `POST /v1/events` and the
//! batch route enforce (`crate::schemas`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::EventType;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::schemas;
use crate::state::AppState;
use crate::store::event_types::{self as store, EventTypeRow};

const MAX_DESCRIPTION: usize = 1_000;
/// A schema is a contract, not a payload: 64 KiB is plenty and bounds compile time.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventTypeBody {
    /// The exact type Events carry, e.g. `order.paid`.
    pub name: String,
    pub description: String,
    /// The JSON Schema (draft 2020-12) payloads of this type must match, if any.
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    /// 1 when created, plus one per schema change.
    pub schema_version: i32,
    /// Deprecated types are still accepted; the flag is for senders and the dashboard.
    pub deprecated: bool,
    pub deprecated_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<EventTypeRow> for EventTypeBody {
    fn from(r: EventTypeRow) -> Self {
        Self {
            name: r.name,
            description: r.description,
            schema: r.schema,
            schema_version: r.schema_version,
            deprecated: r.deprecated_at.is_some(),
            deprecated_at: r.deprecated_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

pub(crate) fn parse_name(raw: &str) -> ApiResult<String> {
    EventType::parse(raw)
        .map(|t| t.as_str().to_owned())
        .map_err(|e| ApiError::validation("name", format!("name {e}")))
}

/// A name in a path: one that cannot be a type is simply not in the catalogue.
pub(crate) fn path_name(raw: &str) -> ApiResult<String> {
    parse_name(raw).map_err(|_| ApiError::NotFound("event type"))
}

pub(crate) fn check_description(d: &str) -> ApiResult<()> {
    if d.chars().count() > MAX_DESCRIPTION {
        return Err(ApiError::validation(
            "description",
            format!("description must be at most {MAX_DESCRIPTION} characters"),
        ));
    }
    Ok(())
}

/// Refuses a schema that is too large, not valid draft 2020-12, or not usable offline.
pub(crate) fn check_schema(schema: &Value) -> ApiResult<()> {
    let text = serde_json::to_string(schema).unwrap_or_default();
    let size = text.len();
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::validation(
            "schema",
            format!("schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}"),
        ));
    }
    // What jsonb cannot hold (a \u0000, a number past its range) is refused here, not
    // left to fail the INSERT as a 500 (found by tests/it/fuzz.rs).
    crate::storable::check_storable(&text)
        .map_err(|why| ApiError::validation("schema", format!("schema {why}")))?;
    schemas::compile(schema)
        .map(|_| ())
        .map_err(ApiError::InvalidSchema)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEventType {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
}

/// Adds an event type to the catalogue, optionally with a JSON Schema every payload must match.
#[utoipa::path(post, path = "/v1/event-types", tag = "event-types",
    request_body = CreateEventType,
    responses((status = 201, body = EventTypeBody),
              (status = 409, description = "a type of that name exists", body = Problem),
              (status = 422, description = "a bad name, description or schema (`invalid_schema`)", body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateEventType>,
) -> ApiResult<(StatusCode, Json<EventTypeBody>)> {
    let name = parse_name(&body.name)?;
    check_description(&body.description)?;
    if let Some(s) = &body.schema {
        check_schema(s)?;
    }
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let row = store::create(
        change.conn(),
        project.id.as_str(),
        &name,
        &body.description,
        body.schema.as_ref(),
    )
    .await?
    .ok_or(ApiError::AlreadyExists("event type"))?;
    let out = EventTypeBody::from(row);
    change
        .commit("event_type", Some(&name), "create", audit::view(&out))
        .await?;
    Ok((StatusCode::CREATED, Json(out)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Include deprecated types (default true).
    pub include_deprecated: Option<bool>,
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists the catalogue's event types by name.
#[utoipa::path(get, path = "/v1/event-types", tag = "event-types", params(ListQuery),
    responses((status = 200, body = Listing<EventTypeBody>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<EventTypeBody>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = store::list(
        &state.pool,
        project.id.as_str(),
        q.include_deprecated.unwrap_or(true),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let rows: Vec<EventTypeBody> = rows.into_iter().map(Into::into).collect();
    Ok(Json(page.finish(rows, |t: &EventTypeBody| &t.name)))
}

/// Returns one event type with its schema.
#[utoipa::path(get, path = "/v1/event-types/{name}", tag = "event-types",
    params(("name" = String, Path)),
    responses((status = 200, body = EventTypeBody), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<EventTypeBody>> {
    let name = path_name(&name)?;
    let row = store::find(&state.pool, project.id.as_str(), &name)
        .await?
        .ok_or(ApiError::NotFound("event type"))?;
    Ok(Json(row.into()))
}

/// Absent: unchanged; `null`: removed; a value: set. (serde folds absent and `null` into
/// `None` for a plain `Option`; this keeps them apart.)
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Value>>, D::Error> {
    Option::<Value>::deserialize(d).map(Some)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEventType {
    pub description: Option<String>,
    /// A new schema (its version goes up by one), or `null` to remove it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Option<Value>>,
}

/// Changes an event type's description or schema (each schema change is a new version).
#[utoipa::path(patch, path = "/v1/event-types/{name}", tag = "event-types",
    params(("name" = String, Path)), request_body = UpdateEventType,
    responses((status = 200, body = EventTypeBody), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<UpdateEventType>,
) -> ApiResult<Json<EventTypeBody>> {
    let name = path_name(&name)?;
    if let Some(d) = &body.description {
        check_description(d)?;
    }
    if let Some(Some(s)) = &body.schema {
        check_schema(s)?;
    }
    let schema = body.schema.as_ref().map(Option::as_ref);
    let description = body.description.as_deref();
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let before = store::find(change.conn(), project.id.as_str(), &name)
        .await?
        .ok_or(ApiError::NotFound("event type"))?;
    let row = store::update(
        change.conn(),
        project.id.as_str(),
        &name,
        description,
        schema,
    )
    .await?
    .ok_or(ApiError::NotFound("event type"))?;
    let out = EventTypeBody::from(row);
    let changed = audit::diff(
        &audit::view(&EventTypeBody::from(before)),
        &audit::view(&out),
    );
    change
        .commit("event_type", Some(&name), "update", changed)
        .await?;
    Ok(Json(out))
}

/// Marks an event type deprecated (it is still accepted).
#[utoipa::path(post, path = "/v1/event-types/{name}/deprecate", tag = "event-types",
    params(("name" = String, Path)),
    responses((status = 200, body = EventTypeBody), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn deprecate(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<EventTypeBody>> {
    let name = path_name(&name)?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let row = store::set_deprecated(change.conn(), project.id.as_str(), &name, true)
        .await?
        .ok_or(ApiError::NotFound("event type"))?;
    change
        .commit(
            "event_type",
            Some(&name),
            "deprecate",
            serde_json::json!({}),
        )
        .await?;
    Ok(Json(row.into()))
}

/// Removes an event type from the catalogue.
#[utoipa::path(delete, path = "/v1/event-types/{name}", tag = "event-types",
    params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let name = path_name(&name)?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::delete(change.conn(), project.id.as_str(), &name).await? {
        return Err(ApiError::NotFound("event type"));
    }
    change
        .commit("event_type", Some(&name), "delete", serde_json::json!({}))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `/v1/event-types`: its routes with their OpenAPI operations. The catalogue's schemas
/// travel with the sender, so its writes clear the sender cache too.
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let routes = OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, delete))
        .routes(routes!(deprecate));
    crate::routes::clears_senders(routes, state)
}
