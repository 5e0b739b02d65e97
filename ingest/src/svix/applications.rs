//! `/api/v1/app`: Svix applications are Railhook applications (routes/applications.rs
//! checks and writes them); `throttleRate` is `rate_limit_per_second`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ListResponse, Page, SvixError, SvixJson, SvixQuery, SvixResult};
use crate::auth::Project;
use crate::problem::ApiError;
use crate::routes::applications::{self as native, CreateApplication, UpdateApplication};
use crate::state::AppState;
use crate::store::applications::{self as store, ApplicationRow};

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationOut {
    pub id: String,
    pub uid: Option<String>,
    pub name: String,
    pub throttle_rate: Option<i32>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<ApplicationRow> for ApplicationOut {
    fn from(r: ApplicationRow) -> Self {
        Self {
            id: r.id,
            uid: r.uid,
            name: r.name,
            throttle_rate: r.rate_limit_per_second,
            metadata: serde_json::from_value(r.metadata).unwrap_or_default(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationIn {
    pub name: String,
    pub uid: Option<String>,
    pub throttle_rate: Option<i32>,
    pub metadata: Option<BTreeMap<String, String>>,
}

impl ApplicationIn {
    pub(crate) fn native(&self) -> CreateApplication {
        CreateApplication {
            name: self.name.clone(),
            uid: self.uid.clone(),
            metadata: self.metadata.clone().unwrap_or_default(),
            rate_limit_per_second: self.throttle_rate,
        }
    }
}

/// The application a path names (an id or a uid), or Svix's 404.
pub(crate) async fn find(
    state: &AppState,
    project: &Project,
    app_id: &str,
) -> SvixResult<ApplicationRow> {
    Ok(native::resolve(state, project.id.as_str(), app_id).await?)
}

/// The application a path names, or, when there is none and the body carries an
/// `application`, that application made on the fly (the path's name becomes its uid unless
/// it is an id): what Svix's message create and portal access do.
pub(crate) async fn find_or_create(
    state: &AppState,
    project: &Project,
    app_id: &str,
    given: Option<&ApplicationIn>,
) -> SvixResult<ApplicationRow> {
    match find(state, project, app_id).await {
        Err(SvixError(ApiError::NotFound(_))) if given.is_some() => {
            let mut create = given.map(ApplicationIn::native).unwrap_or_default();
            if create.uid.is_none() && !app_id.starts_with("app_") {
                create.uid = Some(app_id.to_owned());
            }
            native::insert(state, project, &create).await?;
            state.senders.invalidate();
            find(state, project, app_id).await
        }
        found => found,
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreateQuery {
    /// Answer with the application of the same uid instead of 409, if there is one.
    pub get_if_exists: Option<bool>,
}

/// Svix `application.create`: creates an application.
#[utoipa::path(post, path = "/api/v1/app", tag = "svix", params(CreateQuery),
    request_body = ApplicationIn,
    responses((status = 201, body = ApplicationOut), (status = 200, body = ApplicationOut),
              (status = 409), (status = 422)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    SvixQuery(q): SvixQuery<CreateQuery>,
    SvixJson(body): SvixJson<ApplicationIn>,
) -> SvixResult<(StatusCode, Json<ApplicationOut>)> {
    if q.get_if_exists == Some(true)
        && let Some(uid) = &body.uid
        && let Some(found) = store::find(&state.pool, project.id.as_str(), uid).await?
    {
        return Ok((StatusCode::OK, Json(found.into())));
    }
    let row = native::insert(&state, &project, &body.native()).await;
    match row {
        Ok(row) => Ok((StatusCode::CREATED, Json(row.into()))),
        // Two get-or-create calls racing on one uid: the loser answers with the winner's.
        Err(ApiError::AlreadyExists(_)) if q.get_if_exists == Some(true) => {
            let uid = body.uid.as_deref().unwrap_or_default();
            let found = store::find(&state.pool, project.id.as_str(), uid)
                .await?
                .ok_or(ApiError::AlreadyExists("an application with this uid"))?;
            Ok((StatusCode::OK, Json(found.into())))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// `ascending` or `descending` (the default).
    pub order: Option<String>,
}

/// Svix `application.list`: lists applications.
#[utoipa::path(get, path = "/api/v1/app", tag = "svix", params(ListQuery),
    responses((status = 200, body = ListResponse<ApplicationOut>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    SvixQuery(q): SvixQuery<ListQuery>,
) -> SvixResult<Json<ListResponse<ApplicationOut>>> {
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let ascending = match q.order.as_deref() {
        None | Some("descending") => false,
        Some("ascending") => true,
        Some(_) => {
            return Err(
                ApiError::validation("order", "order must be ascending or descending").into(),
            );
        }
    };
    let rows = store::page(
        &state.pool,
        project.id.as_str(),
        page.after.as_deref(),
        ascending,
        page.fetch(),
    )
    .await?;
    let rows = rows.into_iter().map(ApplicationOut::from).collect();
    Ok(Json(page.finish(rows, |a: &ApplicationOut| &a.id)))
}

/// Svix `application.get`: returns an application by id or uid.
#[utoipa::path(get, path = "/api/v1/app/{app_id}", tag = "svix",
    params(("app_id" = String, Path, description = "id or uid")),
    responses((status = 200, body = ApplicationOut), (status = 404)), security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
) -> SvixResult<Json<ApplicationOut>> {
    Ok(Json(find(&state, &project, &app_id).await?.into()))
}

/// Create or update: an application the path names is replaced by the body; otherwise one is
/// created, with the path as its uid when the body gives none.
#[utoipa::path(put, path = "/api/v1/app/{app_id}", tag = "svix",
    params(("app_id" = String, Path, description = "id or uid")), request_body = ApplicationIn,
    responses((status = 200, body = ApplicationOut), (status = 201, body = ApplicationOut),
              (status = 422)),
    security(("api_key" = [])))]
pub async fn upsert(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixJson(body): SvixJson<ApplicationIn>,
) -> SvixResult<(StatusCode, Json<ApplicationOut>)> {
    let project_id = project.id.as_str();
    if let Some(found) = store::find(&state.pool, project_id, &app_id).await? {
        let change = UpdateApplication {
            name: Some(body.name),
            uid: Some(body.uid),
            metadata: Some(body.metadata.unwrap_or_default()),
            rate_limit_per_second: Some(body.throttle_rate),
        };
        let row = native::change(&state, &project, &found.id, &change).await?;
        return Ok((StatusCode::OK, Json(row.into())));
    }
    let mut create = body.native();
    if create.uid.is_none() {
        create.uid = Some(app_id);
    }
    let row = native::insert(&state, &project, &create).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationPatch {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    #[serde(default, deserialize_with = "crate::routes::double_option")]
    #[schema(value_type = Option<i32>)]
    pub throttle_rate: Option<Option<i32>>,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Svix `application.patch`: changes an application.
#[utoipa::path(patch, path = "/api/v1/app/{app_id}", tag = "svix",
    params(("app_id" = String, Path, description = "id or uid")), request_body = ApplicationPatch,
    responses((status = 200, body = ApplicationOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn patch(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixJson(body): SvixJson<ApplicationPatch>,
) -> SvixResult<Json<ApplicationOut>> {
    let app = find(&state, &project, &app_id).await?;
    let change = UpdateApplication {
        name: body.name,
        uid: body.uid,
        metadata: body.metadata,
        rate_limit_per_second: body.throttle_rate,
    };
    let row = native::change(&state, &project, &app.id, &change).await?;
    Ok(Json(row.into()))
}

/// Svix `application.delete`: deletes an application and its endpoints.
#[utoipa::path(delete, path = "/api/v1/app/{app_id}", tag = "svix",
    params(("app_id" = String, Path, description = "id or uid")),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn delete(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
) -> SvixResult<StatusCode> {
    let app = find(&state, &project, &app_id).await?;
    if !native::remove(&state, &project, &app.id).await? {
        return Err(SvixError(ApiError::NotFound("application")));
    }
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get, upsert, patch, delete))
}
