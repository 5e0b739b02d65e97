//! Scoped API keys a project's admins manage themselves, and the audit log they read
//! (docs/ACCESS.md). The operator's `POST /v1/projects/{id}/api-keys` takes the same scope.

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use railhook_common::ids::{ApiKeyId, ProjectId};
use railhook_common::keygen::generate_api_key;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::access::Role;
use crate::audit::{self, Actor, Change};
use crate::auth::{Admin, Project};
use crate::extract::ApiQuery;
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;
use crate::store::access::{self as store, AuditRow};

/// What a new key may do. Every field is optional: an empty body makes a key with today's
/// full rights (`admin`, every application, no expiry).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewApiKey {
    /// A name people recognise it by (up to 100 characters).
    pub name: Option<String>,
    /// `sender` (posts Events, nothing else), `viewer`, `operator` or `admin` (default).
    pub role: Option<Role>,
    /// Confine the key to one application (its id or uid): it may only call routes that
    /// name that application in their path.
    pub application_id: Option<String>,
    /// The key stops working at this time (in the future).
    pub expires_at: Option<DateTime<Utc>>,
}

/// A new API key. `api_key` is shown this once; only its hash is stored.
#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuedApiKey {
    pub id: String,
    pub prefix: String,
    pub api_key: String,
    pub name: String,
    pub role: Role,
    pub application_id: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// A key as listed: never the key itself.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ApiKeyOut {
    pub id: String,
    pub prefix: String,
    pub name: String,
    pub role: Role,
    pub application_id: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<store::KeyRow> for ApiKeyOut {
    fn from(r: store::KeyRow) -> Self {
        ApiKeyOut {
            id: r.id,
            prefix: r.prefix,
            name: r.name,
            role: Role::parse(&r.role).unwrap_or(Role::Viewer),
            application_id: r.application_id,
            expires_at: r.expires_at,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        }
    }
}

/// The optional body of a key's creation (an empty one makes a full-rights key).
pub(crate) fn key_spec(body: &[u8]) -> ApiResult<NewApiKey> {
    crate::extract::optional_json(body).map_err(|e| ApiError::MalformedJson(e.to_string()))
}

/// Checks `spec` and issues the key inside `conn`'s transaction, with its audit row.
pub(crate) async fn issue(
    conn: &mut PgConnection,
    project_id: &str,
    spec: &NewApiKey,
    actor: &Actor,
) -> ApiResult<IssuedApiKey> {
    let name = spec.name.as_deref().unwrap_or("").trim();
    if name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "name",
            "name must be at most 100 characters, without control characters",
        ));
    }
    if spec.expires_at.is_some_and(|at| at <= Utc::now()) {
        return Err(ApiError::validation(
            "expires_at",
            "expires_at must be in the future",
        ));
    }
    let application_id = match spec.application_id.as_deref() {
        None => None,
        Some(raw) => Some(
            store::application_of(&mut *conn, project_id, raw)
                .await?
                .ok_or_else(|| {
                    ApiError::validation("application_id", "no such application in this project")
                })?,
        ),
    };
    let role = spec.role.unwrap_or(Role::Admin);
    let key = generate_api_key();
    let id = ApiKeyId::generate();
    let created_at = store::insert_key(
        &mut *conn,
        &store::NewKey {
            id: id.as_str(),
            project_id,
            prefix: &key.prefix,
            hash: &key.hash,
            name,
            role: role.as_str(),
            application_id: application_id.as_deref(),
            expires_at: spec.expires_at,
        },
    )
    .await?;
    audit::record(
        &mut *conn,
        actor,
        Change {
            project_id,
            object_kind: "api_key",
            object_id: Some(id.as_str()),
            action: "create",
            changes: json!({"name": name, "role": role.as_str(), "prefix": key.prefix,
                            "application_id": application_id, "expires_at": spec.expires_at}),
        },
    )
    .await?;
    Ok(IssuedApiKey {
        id: id.into_string(),
        prefix: key.prefix,
        api_key: key.plaintext,
        name: name.to_owned(),
        role,
        application_id,
        expires_at: spec.expires_at,
        created_at,
    })
}

/// Issues an API key for the caller's project, with a role, an application or an expiry.
///
/// The key is shown once; only its hash is kept. Needs an admin key.
#[utoipa::path(post, path = "/v1/api-keys", tag = "access",
    request_body(content = NewApiKey, description = "optional: an empty body is a full-rights key"),
    responses((status = 201, body = IssuedApiKey), (status = 401, body = Problem),
              (status = 403, body = Problem), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<IssuedApiKey>)> {
    let spec = key_spec(&body)?;
    let mut tx = state.pool.begin().await?;
    let key = issue(&mut tx, project.id.as_str(), &spec, &project.actor).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(key)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KeysQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists the project's API keys (prefixes, roles, scopes; never the keys).
#[utoipa::path(get, path = "/v1/api-keys", tag = "access", params(KeysQuery),
    responses((status = 200, body = Listing<ApiKeyOut>), (status = 401, body = Problem),
              (status = 403, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<KeysQuery>,
) -> ApiResult<Json<Listing<ApiKeyOut>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = store::keys(
        &state.pool,
        project.id.as_str(),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let rows: Vec<ApiKeyOut> = rows.into_iter().map(ApiKeyOut::from).collect();
    Ok(Json(page.finish(rows, |k: &ApiKeyOut| &k.id)))
}

/// The operator (admin token, any project's key) or a project's admin key (its own
/// project's keys).
pub enum KeyManager {
    Operator,
    Project(Project),
}

impl FromRequestParts<AppState> for KeyManager {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if Admin::from_request_parts(parts, state).await.is_ok() {
            return Ok(KeyManager::Operator);
        }
        Project::from_request_parts(parts, state)
            .await
            .map(KeyManager::Project)
    }
}

/// Revokes an API key at once.
#[utoipa::path(delete, path = "/v1/api-keys/{id}", tag = "admin",
    params(("id" = String, Path, description = "API key id")),
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem)),
    security(("admin_token" = []), ("api_key" = [])))]
pub async fn revoke(
    caller: KeyManager,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let key = ApiKeyId::parse(&id).map_err(|_| ApiError::NotFound("api key"))?;
    let (only_project, actor) = match &caller {
        KeyManager::Operator => (None, Actor::Operator),
        KeyManager::Project(p) => (Some(p.id.as_str()), p.actor.clone()),
    };
    let mut tx = state.pool.begin().await?;
    let project_id = store::revoke(&mut tx, key.as_str(), only_project)
        .await?
        .ok_or(ApiError::NotFound("api key"))?;
    audit::record(
        &mut tx,
        &actor,
        Change {
            project_id: &project_id,
            object_kind: "api_key",
            object_id: Some(key.as_str()),
            action: "revoke",
            changes: json!({}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
    /// Only changes by this actor (as the entries show it).
    pub actor: Option<String>,
    /// Only changes of this object (its id).
    pub object_id: Option<String>,
    /// Only changes at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only changes before this time.
    pub until: Option<DateTime<Utc>>,
}

/// Lists the audit log: one entry per change, who made it and what changed, newest first.
#[utoipa::path(get, path = "/v1/audit-log", tag = "access", params(AuditQuery),
    responses((status = 200, body = Listing<AuditRow>), (status = 400, body = Problem),
              (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn audit_log(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> ApiResult<Json<Listing<AuditRow>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let rows = store::audit_page(
        &state.pool,
        &store::AuditFilter {
            project_id: project.id.as_str(),
            actor: q.actor.as_deref(),
            object_id: q.object_id.as_deref(),
            since: q.since,
            until: q.until,
            before: page.after.as_deref(),
            limit: page.fetch(),
        },
    )
    .await?;
    Ok(Json(page.finish(rows, |e: &AuditRow| &e.id)))
}

/// The operator's key issue with a scope (`POST /v1/projects/{id}/api-keys`).
pub(crate) async fn issue_for_operator(
    state: &AppState,
    project: &ProjectId,
    spec: &NewApiKey,
) -> ApiResult<IssuedApiKey> {
    let mut tx = state.pool.begin().await?;
    if !crate::store::tenants::project_exists(&mut tx, project).await? {
        return Err(ApiError::NotFound("project"));
    }
    let key = issue(&mut tx, project.as_str(), spec, &Actor::Operator).await?;
    tx.commit().await?;
    Ok(key)
}

/// Keys and the audit log; a revoked key stops sending at once (the sender cache is
/// cleared after the revoke).
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let revoke = OpenApiRouter::new().routes(routes!(revoke));
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(audit_log))
        .merge(crate::routes::clears_senders(revoke, state))
}
