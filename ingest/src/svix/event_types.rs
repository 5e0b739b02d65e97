//! `/api/v1/event-type`: Svix event types are the project's catalogue (routes/event_types.rs
//! checks the names, descriptions and schemas). Svix keys schemas by version
//! (`{"1": {…}}`); Railhook keeps one schema per type and counts its versions, so the
//! schema given under the highest version is the type's schema, and it is shown under `"1"`.
//! `archived` is not kept: an archived type is a deprecated one (it is still accepted).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult};
use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::problem::ApiError;
use crate::routes::event_types::EventTypeBody;
use crate::routes::event_types::{check_description, check_schema, parse_name, path_name};
use crate::state::AppState;
use crate::store::event_types::{self as store, EventTypeRow};

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeOut {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<BTreeMap<String, Value>>,
    pub feature_flags: Option<Vec<String>>,
    pub group_name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<EventTypeRow> for EventTypeOut {
    fn from(r: EventTypeRow) -> Self {
        Self {
            name: r.name,
            description: r.description,
            archived: false,
            deprecated: r.deprecated_at.is_some(),
            schemas: r.schema.map(|s| BTreeMap::from([("1".to_owned(), s)])),
            feature_flags: None,
            group_name: None,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The schema of a Svix `schemas` object: the one under the highest version; `{}` has none.
fn schema_of(schemas: &BTreeMap<String, Value>) -> SvixResult<Option<Value>> {
    let mut best: Option<(u64, &Value)> = None;
    for (version, schema) in schemas {
        let v: u64 = version.parse().map_err(|_| {
            ApiError::validation("schemas", "schemas must be keyed by version numbers")
        })?;
        if best.is_none_or(|(b, _)| v > b) {
            best = Some((v, schema));
        }
    }
    let schema = best.map(|(_, s)| s.clone());
    if let Some(s) = &schema {
        check_schema(s)?;
    }
    Ok(schema)
}

fn refuse_hosted_only(
    feature_flags: Option<&Vec<String>>,
    group: Option<&String>,
) -> SvixResult<()> {
    if feature_flags.is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::validation(
            "featureFlags",
            "feature flags are not supported by this server",
        )
        .into());
    }
    if group.is_some() {
        return Err(ApiError::validation(
            "groupName",
            "event type groups are not supported by this server",
        )
        .into());
    }
    Ok(())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeIn {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<BTreeMap<String, Value>>,
    pub feature_flags: Option<Vec<String>>,
    pub group_name: Option<String>,
}

async fn set_deprecated(
    conn: &mut sqlx::PgConnection,
    project_id: &str,
    name: &str,
    deprecated: bool,
) -> SvixResult<EventTypeRow> {
    let row = store::set_deprecated(conn, project_id, name, deprecated).await?;
    Ok(row.ok_or(ApiError::NotFound("event type"))?)
}

/// Svix `eventType.create`: adds an event type to the catalogue.
#[utoipa::path(post, path = "/api/v1/event-type", tag = "svix", request_body = EventTypeIn,
    responses((status = 201, body = EventTypeOut), (status = 409), (status = 422)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    SvixJson(body): SvixJson<EventTypeIn>,
) -> SvixResult<(StatusCode, Json<EventTypeOut>)> {
    refuse_hosted_only(body.feature_flags.as_ref(), body.group_name.as_ref())?;
    let name = parse_name(&body.name)?;
    check_description(&body.description)?;
    let schema = body.schemas.as_ref().map(schema_of).transpose()?.flatten();
    let project_id = project.id.as_str();
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let mut row = store::create(
        change.conn(),
        project_id,
        &name,
        &body.description,
        schema.as_ref(),
    )
    .await?
    .ok_or(ApiError::AlreadyExists("event type"))?;
    if body.deprecated == Some(true) || body.archived == Some(true) {
        row = set_deprecated(change.conn(), project_id, &name, true).await?;
    }
    let view = audit::view(&EventTypeBody::from(row.clone()));
    change
        .commit("event_type", Some(&name), "create", view)
        .await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// Include the schemas (default true).
    pub with_content: Option<bool>,
    /// Archived types are deprecated ones: listed unless this is false.
    pub include_archived: Option<bool>,
}

/// Svix `eventType.list`: lists event types.
#[utoipa::path(get, path = "/api/v1/event-type", tag = "svix", params(ListQuery),
    responses((status = 200, body = ListResponse<EventTypeOut>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    SvixQuery(q): SvixQuery<ListQuery>,
) -> SvixResult<Json<ListResponse<EventTypeOut>>> {
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let rows = store::list(
        &state.pool,
        project.id.as_str(),
        q.include_archived.unwrap_or(true),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let with_content = q.with_content.unwrap_or(true);
    let out = rows
        .into_iter()
        .map(|r| {
            let mut t = EventTypeOut::from(r);
            if !with_content {
                t.schemas = None;
            }
            t
        })
        .collect();
    Ok(Json(page.finish(out, |t: &EventTypeOut| &t.name)))
}

/// Svix `eventType.get`: returns an event type.
#[utoipa::path(get, path = "/api/v1/event-type/{event_type_name}", tag = "svix",
    params(("event_type_name" = String, Path)),
    responses((status = 200, body = EventTypeOut), (status = 404)), security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> SvixResult<Json<EventTypeOut>> {
    let name = path_name(&name)?;
    let row = store::find(&state.pool, project.id.as_str(), &name)
        .await?
        .ok_or(ApiError::NotFound("event type"))?;
    Ok(Json(row.into()))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypePatch {
    pub description: Option<String>,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    /// `null` removes the schema.
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<Option<BTreeMap<String, Value>>>,
    pub feature_flags: Option<Vec<String>>,
    pub group_name: Option<String>,
}

async fn apply(
    state: &AppState,
    project: &Project,
    name: &str,
    p: EventTypePatch,
) -> SvixResult<EventTypeRow> {
    refuse_hosted_only(p.feature_flags.as_ref(), p.group_name.as_ref())?;
    if let Some(d) = &p.description {
        check_description(d)?;
    }
    let schema: Option<Option<Value>> = match &p.schemas {
        None => None,
        Some(None) => Some(None),
        Some(Some(s)) => Some(schema_of(s)?),
    };
    let project_id = project.id.as_str();
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let before = store::find(change.conn(), project_id, name)
        .await?
        .ok_or(ApiError::NotFound("event type"))?;
    let mut row = store::update(
        change.conn(),
        project_id,
        name,
        p.description.as_deref(),
        schema.as_ref().map(Option::as_ref),
    )
    .await?
    .ok_or(ApiError::NotFound("event type"))?;
    let deprecated = match (p.deprecated, p.archived) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), _) => Some(false),
        _ => None,
    };
    if let Some(d) = deprecated {
        row = set_deprecated(change.conn(), project_id, name, d).await?;
    }
    let changed = audit::diff(
        &audit::view(&EventTypeBody::from(before)),
        &audit::view(&EventTypeBody::from(row.clone())),
    );
    change
        .commit("event_type", Some(name), "update", changed)
        .await?;
    Ok(row)
}

/// Svix `eventType.patch`: changes an event type.
#[utoipa::path(patch, path = "/api/v1/event-type/{event_type_name}", tag = "svix",
    params(("event_type_name" = String, Path)), request_body = EventTypePatch,
    responses((status = 200, body = EventTypeOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn patch(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
    SvixJson(body): SvixJson<EventTypePatch>,
) -> SvixResult<Json<EventTypeOut>> {
    let name = path_name(&name)?;
    Ok(Json(apply(&state, &project, &name, body).await?.into()))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeUpdate {
    #[serde(default)]
    pub description: String,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<BTreeMap<String, Value>>,
    pub feature_flags: Option<Vec<String>>,
    pub group_name: Option<String>,
}

/// Replaces the type's description, schema and deprecation, or creates it.
#[utoipa::path(put, path = "/api/v1/event-type/{event_type_name}", tag = "svix",
    params(("event_type_name" = String, Path)), request_body = EventTypeUpdate,
    responses((status = 200, body = EventTypeOut), (status = 201, body = EventTypeOut),
              (status = 422)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
    SvixJson(body): SvixJson<EventTypeUpdate>,
) -> SvixResult<(StatusCode, Json<EventTypeOut>)> {
    let name = parse_name(&name)?;
    let exists = store::find(&state.pool, project.id.as_str(), &name)
        .await?
        .is_some();
    if !exists {
        let create_body = EventTypeIn {
            name,
            description: body.description,
            archived: body.archived,
            deprecated: body.deprecated,
            schemas: body.schemas,
            feature_flags: body.feature_flags,
            group_name: body.group_name,
        };
        return create(project, State(state), SvixJson(create_body)).await;
    }
    let p = EventTypePatch {
        description: Some(body.description),
        archived: body.archived,
        deprecated: Some(body.deprecated.unwrap_or(false) || body.archived == Some(true)),
        schemas: Some(body.schemas),
        feature_flags: body.feature_flags,
        group_name: body.group_name,
    };
    let row = apply(&state, &project, &name, p).await?;
    Ok((StatusCode::OK, Json(row.into())))
}

/// Svix `eventType.delete`: removes an event type from the catalogue.
#[utoipa::path(delete, path = "/api/v1/event-type/{event_type_name}", tag = "svix",
    params(("event_type_name" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> SvixResult<StatusCode> {
    let name = path_name(&name)?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::delete(change.conn(), project.id.as_str(), &name).await? {
        return Err(ApiError::NotFound("event type").into());
    }
    change
        .commit("event_type", Some(&name), "delete", serde_json::json!({}))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, patch, delete))
}
