//! Applications: the sending team's customers (docs/APPLICATIONS.md). An Event sent with
//! `application` reaches only that application's endpoints; an endpoint created with one
//! belongs to it for life.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::ids::ApplicationId;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::operational::{self, EndpointRef, Notice};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::double_option;
use crate::state::AppState;
use crate::store::applications::{self as store, ApplicationRow};

/// The longest uid, name or metadata value, and the most metadata entries.
const MAX_UID: usize = 256;
const MAX_NAME: usize = 256;
const MAX_METADATA_ENTRIES: usize = 50;
const MAX_METADATA_VALUE: usize = 1_000;
/// The most channels an Event or an endpoint carries, and a channel's longest name.
pub const MAX_CHANNELS: usize = 10;
const MAX_CHANNEL: usize = 128;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Application {
    pub id: String,
    pub uid: Option<String>,
    pub name: String,
    pub metadata: BTreeMap<String, String>,
    /// Attempts per second to all of its endpoints together; absent: unlimited.
    pub rate_limit_per_second: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<ApplicationRow> for Application {
    fn from(r: ApplicationRow) -> Self {
        Application {
            id: r.id,
            uid: r.uid,
            name: r.name,
            metadata: serde_json::from_value(r.metadata).unwrap_or_default(),
            rate_limit_per_second: r.rate_limit_per_second,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// A uid: 1–256 of `[A-Za-z0-9_.-]`, and not starting with the id prefix `reserved` (so an
/// id and a uid can never be confused where either is accepted).
pub(crate) fn check_uid(field: &str, uid: &str, reserved: &str) -> ApiResult<()> {
    if !crate::routes::is_plain_name(uid) {
        return Err(ApiError::validation(
            field,
            format!("{field} must be 1-{MAX_UID} characters of A-Z, a-z, 0-9, '_', '.' and '-'"),
        ));
    }
    if uid.starts_with(reserved) {
        return Err(ApiError::validation(
            field,
            format!("{field} must not start with '{reserved}', which ids start with"),
        ));
    }
    Ok(())
}

pub(crate) fn check_name(name: &str) -> ApiResult<()> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME {
        return Err(ApiError::validation(
            "name",
            format!("name must be 1-{MAX_NAME} characters"),
        ));
    }
    // Postgres's text holds no NUL character: refused here, not a 500 from the insert
    // (found by the schemathesis fuzz test).
    if name.contains('\0') {
        return Err(ApiError::validation("name", "name must not contain NUL"));
    }
    Ok(())
}

/// Metadata: at most 50 entries, keys 1–256 characters, values at most 1000.
pub(crate) fn check_metadata(m: &BTreeMap<String, String>) -> ApiResult<serde_json::Value> {
    let bad = |d: String| ApiError::validation("metadata", d);
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(bad(format!(
            "metadata holds at most {MAX_METADATA_ENTRIES} entries"
        )));
    }
    for (k, v) in m {
        if k.is_empty() || k.chars().count() > MAX_UID {
            return Err(bad(format!("metadata keys must be 1-{MAX_UID} characters")));
        }
        if v.chars().count() > MAX_METADATA_VALUE || v.contains('\0') || k.contains('\0') {
            return Err(bad(format!(
                "metadata values must be at most {MAX_METADATA_VALUE} characters, without NUL"
            )));
        }
    }
    Ok(serde_json::to_value(m).unwrap_or_default())
}

/// Channels: 1–10 distinct names of 1–128 characters from `[A-Za-z0-9_.:-]` (no comma, which
/// the ingest statement joins them with).
pub(crate) fn check_channels(field: &str, channels: &[String]) -> ApiResult<Vec<String>> {
    let bad = |d: String| ApiError::validation(field, d);
    if channels.is_empty() || channels.len() > MAX_CHANNELS {
        return Err(bad(format!("{field} must hold 1-{MAX_CHANNELS} channels")));
    }
    let mut out: Vec<String> = Vec::with_capacity(channels.len());
    for c in channels {
        let ok = (1..=MAX_CHANNEL).contains(&c.len())
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if !ok {
            return Err(bad(format!(
                "each channel must be 1-{MAX_CHANNEL} characters of A-Z, a-z, 0-9, '_', '.', ':' and '-'"
            )));
        }
        if !out.contains(c) {
            out.push(c.clone());
        }
    }
    Ok(out)
}

fn check_rate(rate: Option<i32>) -> ApiResult<()> {
    match rate {
        Some(r) if r <= 0 => Err(ApiError::validation(
            "rate_limit_per_second",
            "rate_limit_per_second must be positive",
        )),
        _ => Ok(()),
    }
}

/// The project's live application named by an id or a uid, or 404.
pub(crate) async fn resolve(
    state: &AppState,
    project_id: &str,
    id_or_uid: &str,
) -> ApiResult<ApplicationRow> {
    store::find(&state.pool, project_id, id_or_uid)
        .await?
        .ok_or(ApiError::NotFound("application"))
}

/// The id of the application an Event names, for the ingest's hot path: cached per
/// project for a second, like the sender (store::subscriptions::SenderCache), and cleared
/// by every application write on this replica.
pub(crate) async fn resolve_for_ingest(
    state: &AppState,
    project_id: &str,
    field: &str,
    id_or_uid: &str,
) -> ApiResult<String> {
    if let Some(id) = state.senders.application(project_id, id_or_uid) {
        return Ok(id);
    }
    let row = store::find(&state.pool, project_id, id_or_uid)
        .await?
        .ok_or_else(|| {
            ApiError::validation(
                field,
                format!("{field} names no application of this project"),
            )
        })?;
    state
        .senders
        .remember_application(project_id, id_or_uid, &row.id);
    Ok(row.id)
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApplication {
    pub name: String,
    /// Your own unique name for it (1–256 of `[A-Za-z0-9_.-]`, not starting with `app_`),
    /// accepted wherever the id is.
    pub uid: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub rate_limit_per_second: Option<i32>,
}

/// Checks and stores a new application; a uid already in use is 409 `already_exists`.
pub(crate) async fn insert(
    state: &AppState,
    project: &Project,
    body: &CreateApplication,
) -> ApiResult<ApplicationRow> {
    let project_id = project.id.as_str();
    check_name(&body.name)?;
    if let Some(uid) = &body.uid {
        check_uid("uid", uid, ApplicationId::PREFIX)?;
    }
    let metadata = check_metadata(&body.metadata)?;
    check_rate(body.rate_limit_per_second)?;
    let id = ApplicationId::generate();
    let new = store::NewApplication {
        id: id.as_str(),
        project_id,
        uid: body.uid.as_deref(),
        name: &body.name,
        metadata,
        rate_limit_per_second: body.rate_limit_per_second,
    };
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let row = store::insert(change.conn(), new).await.map_err(|e| {
        if store::uid_taken(&e) {
            ApiError::AlreadyExists("an application with this uid")
        } else {
            e.into()
        }
    })?;
    let view = audit::view(&Application::from(row.clone()));
    change
        .commit("application", Some(&row.id), "create", view)
        .await?;
    Ok(row)
}

/// Creates an application: one customer of yours, with endpoints of its own.
#[utoipa::path(post, path = "/v1/applications", tag = "applications",
    request_body = CreateApplication,
    responses((status = 201, body = Application), (status = 409, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateApplication>,
) -> ApiResult<(StatusCode, Json<Application>)> {
    let row = insert(&state, &project, &body).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists the project's applications, newest first.
#[utoipa::path(get, path = "/v1/applications", tag = "applications", params(ListQuery),
    responses((status = 200, body = Listing<Application>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Application>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        page.after.as_deref(),
        false,
        page.fetch(),
    )
    .await?;
    let rows = rows.into_iter().map(Application::from).collect();
    Ok(Json(page.finish(rows, |a: &Application| &a.id)))
}

/// Returns one application, by id or uid.
#[utoipa::path(get, path = "/v1/applications/{id}", tag = "applications",
    params(("id" = String, Path, description = "The application's id or uid")),
    responses((status = 200, body = Application), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Application>> {
    Ok(Json(
        resolve(&state, project.id.as_str(), &id).await?.into(),
    ))
}

/// Fields to change; absent fields stay, `null` clears the uid or the rate limit.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateApplication {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>)]
    pub rate_limit_per_second: Option<Option<i32>>,
}

/// Checks and applies a change to the live application `id`.
pub(crate) async fn change(
    state: &AppState,
    project: &Project,
    id: &str,
    body: &UpdateApplication,
) -> ApiResult<ApplicationRow> {
    let project_id = project.id.as_str();
    if let Some(name) = &body.name {
        check_name(name)?;
    }
    if let Some(Some(uid)) = &body.uid {
        check_uid("uid", uid, ApplicationId::PREFIX)?;
    }
    let metadata = body.metadata.as_ref().map(check_metadata).transpose()?;
    check_rate(body.rate_limit_per_second.flatten())?;
    let c = store::ApplicationChange {
        uid: body.uid.as_ref().map(Option::as_deref),
        name: body.name.as_deref(),
        metadata,
        rate_limit_per_second: body.rate_limit_per_second,
    };
    let mut change = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let before = store::find(change.conn(), project_id, id)
        .await?
        .ok_or(ApiError::NotFound("application"))?;
    let row = store::update(change.conn(), project_id, id, c)
        .await
        .map_err(|e| {
            if store::uid_taken(&e) {
                ApiError::AlreadyExists("an application with this uid")
            } else {
                e.into()
            }
        })?
        .ok_or(ApiError::NotFound("application"))?;
    let changed = audit::diff(
        &audit::view(&Application::from(before)),
        &audit::view(&Application::from(row.clone())),
    );
    change
        .commit("application", Some(id), "update", changed)
        .await?;
    Ok(row)
}

/// Changes an application's name, uid, metadata or rate limit.
#[utoipa::path(patch, path = "/v1/applications/{id}", tag = "applications",
    params(("id" = String, Path, description = "The application's id or uid")),
    request_body = UpdateApplication,
    responses((status = 200, body = Application), (status = 404, body = Problem),
              (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateApplication>,
) -> ApiResult<Json<Application>> {
    let app = resolve(&state, project.id.as_str(), &id).await?;
    let row = change(&state, &project, &app.id, &body).await?;
    Ok(Json(row.into()))
}

/// Deletes the application and its endpoints in one transaction (with an
/// `endpoint.deleted` operational webhook for each); `false` if there was none.
pub(crate) async fn remove(state: &AppState, project: &Project, id: &str) -> ApiResult<bool> {
    let project_id = project.id.as_str();
    let mut audited = Audited::begin(&state.pool, &project.actor, project_id).await?;
    let Some(ended) = store::delete(audited.conn(), project_id, id).await? else {
        return Ok(false);
    };
    for endpoint_id in &ended {
        operational::emit(
            audited.conn(),
            project_id,
            Notice::EndpointDeleted(EndpointRef { endpoint_id }),
        )
        .await?;
    }
    let changed = serde_json::json!({"endpoints_deleted": ended});
    audited
        .commit("application", Some(id), "delete", changed)
        .await?;
    Ok(true)
}

/// Deleting disables and deletes the application's endpoints at once; its Events,
/// Deliveries and Attempts stay readable until retention drops them, and its uid is free.
#[utoipa::path(delete, path = "/v1/applications/{id}", tag = "applications",
    params(("id" = String, Path, description = "The application's id or uid")),
    responses((status = 204), (status = 404, body = Problem)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let app = resolve(&state, project.id.as_str(), &id).await?;
    if !remove(&state, &project, &app.id).await? {
        return Err(ApiError::NotFound("application"));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// RFC 3339; default: 24 hours before `until`.
    pub since: Option<DateTime<Utc>>,
    /// RFC 3339; default: now.
    pub until: Option<DateTime<Utc>>,
}

/// An application's figures over a time range: its live endpoints, its Events, and their
/// Deliveries by status. Per-application figures come from here, not from metrics labels.
#[utoipa::path(get, path = "/v1/applications/{id}/stats", tag = "applications",
    params(("id" = String, Path, description = "The application's id or uid"), StatsQuery),
    responses((status = 200, body = store::ApplicationStats), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn stats(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<StatsQuery>,
) -> ApiResult<Json<store::ApplicationStats>> {
    let app = resolve(&state, project.id.as_str(), &id).await?;
    let until = q.until.unwrap_or_else(Utc::now);
    let since = q.since.unwrap_or(until - chrono::Duration::hours(24));
    if since >= until {
        return Err(ApiError::validation("since", "since must be before until"));
    }
    let figures = store::stats(&state.pool, project.id.as_str(), &app.id, since, until).await?;
    Ok(Json(figures))
}

/// `/v1/applications`. Writes change what senders fan out to (an application's uid, its
/// endpoints on delete), so they clear the sender cache.
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let routes = OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, update, delete))
        .routes(routes!(stats));
    crate::routes::clears_senders(routes, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_checked_and_never_look_like_ids() {
        assert!(check_uid("uid", "customer-42.eu_1", "app_").is_ok());
        for bad in ["", "has space", "app_01h", "é", &"x".repeat(257)] {
            assert!(check_uid("uid", bad, "app_").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn channels_are_checked_and_deduplicated() {
        let ok = check_channels("channels", &["eu".into(), "project:1".into(), "eu".into()]);
        assert_eq!(
            ok.expect("valid"),
            vec!["eu".to_owned(), "project:1".to_owned()]
        );
        assert!(check_channels("channels", &[]).is_err());
        assert!(check_channels("channels", &["a,b".into()]).is_err());
        let eleven: Vec<String> = (0..11).map(|n| format!("c{n}")).collect();
        assert!(check_channels("channels", &eleven).is_err());
    }
}
