//! Tenant management with the admin token: organizations, projects, API keys.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::ids::{ApiKeyId, OrganizationId, ProjectId};
use railhook_common::keygen::generate_api_key;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Admin;
use crate::extract::ApiJson;
use crate::problem::{ApiError, ApiResult};
use crate::routes::validate_name;
use crate::state::AppState;
use crate::store::tenants as store;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrganization {
    pub name: String,
    /// Events the organization may send per calendar month (UTC).
    pub monthly_quota: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Organization {
    pub id: String,
    pub name: String,
    pub monthly_quota: i64,
    pub created_at: DateTime<Utc>,
}

/// Creates an organization (admin token).
#[utoipa::path(post, path = "/v1/organizations", tag = "admin",
    request_body = CreateOrganization,
    responses((status = 201, body = Organization), (status = 401, body = crate::problem::Problem),
              (status = 422, body = crate::problem::Problem)),
    security(("admin_token" = [])))]
pub async fn create_organization(
    _: Admin,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateOrganization>,
) -> ApiResult<(StatusCode, Json<Organization>)> {
    let name = validate_name("name", &body.name)?;
    if body.monthly_quota < 0 {
        return Err(ApiError::validation(
            "monthly_quota",
            "monthly_quota must be 0 or more",
        ));
    }
    let id = OrganizationId::generate();
    let created_at = store::insert_organization(&state.pool, &id, name, body.monthly_quota).await?;
    let org = Organization {
        id: id.into_string(),
        name: name.to_owned(),
        monthly_quota: body.monthly_quota,
        created_at,
    };
    Ok((StatusCode::CREATED, Json(org)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    pub organization_id: String,
    pub name: String,
}

/// A new API key. `api_key` is shown this once; only its hash is stored.
#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuedApiKey {
    pub id: String,
    pub prefix: String,
    pub api_key: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedProject {
    pub id: String,
    pub organization_id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The project's first API key, shown once.
    pub api_key: String,
    pub api_key_id: String,
}

async fn issue_key(conn: &mut PgConnection, project_id: &str) -> ApiResult<IssuedApiKey> {
    let key = generate_api_key();
    let id = ApiKeyId::generate();
    let created_at = store::insert_api_key(conn, &id, project_id, &key).await?;
    Ok(IssuedApiKey {
        id: id.into_string(),
        prefix: key.prefix,
        api_key: key.plaintext,
        created_at,
    })
}

/// Creates a project in an organization, with its first API key (admin token).
#[utoipa::path(post, path = "/v1/projects", tag = "admin",
    request_body = CreateProject,
    responses((status = 201, body = CreatedProject), (status = 401, body = crate::problem::Problem),
              (status = 422, body = crate::problem::Problem)),
    security(("admin_token" = [])))]
pub async fn create_project(
    _: Admin,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateProject>,
) -> ApiResult<(StatusCode, Json<CreatedProject>)> {
    let name = validate_name("name", &body.name)?;
    let org = OrganizationId::parse(&body.organization_id)
        .map_err(|e| ApiError::validation("organization_id", e.to_string()))?;
    let mut tx = state.pool.begin().await?;
    if !store::organization_exists(&mut tx, &org).await? {
        return Err(ApiError::validation(
            "organization_id",
            "no such organization",
        ));
    }
    let id = ProjectId::generate();
    let created_at = store::insert_project(&mut tx, &id, &org, name).await?;
    let key = issue_key(&mut tx, id.as_str()).await?;
    crate::audit::record(
        &mut tx,
        &crate::audit::Actor::Operator,
        crate::audit::Change {
            project_id: id.as_str(),
            object_kind: "project",
            object_id: Some(id.as_str()),
            action: "create",
            changes: serde_json::json!({"name": name, "first_key_prefix": key.prefix}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedProject {
            id: id.into_string(),
            organization_id: org.into_string(),
            name: name.to_owned(),
            created_at,
            api_key: key.api_key,
            api_key_id: key.id,
        }),
    ))
}

/// Issues an API key for a project (admin token).
#[utoipa::path(post, path = "/v1/projects/{id}/api-keys", tag = "admin",
    params(("id" = String, Path, description = "Project id")),
    request_body(content = crate::routes::access::NewApiKey,
                 description = "optional: an empty body is a full-rights key"),
    responses((status = 201, body = crate::routes::access::IssuedApiKey),
              (status = 401, body = crate::problem::Problem),
              (status = 404, body = crate::problem::Problem),
              (status = 422, body = crate::problem::Problem)),
    security(("admin_token" = [])))]
pub async fn create_api_key(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<crate::routes::access::IssuedApiKey>)> {
    let project = ProjectId::parse(&id).map_err(|_| ApiError::NotFound("project"))?;
    let spec = crate::routes::access::key_spec(&body)?;
    let key = crate::routes::access::issue_for_operator(&state, &project, &spec).await?;
    Ok((StatusCode::CREATED, Json(key)))
}

/// The operator's routes (admin token): organizations, projects and their keys (revoking a
/// key is `routes::access::revoke`, shared with a project's admins).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_organization))
        .routes(routes!(create_project))
        .routes(routes!(create_api_key))
}
