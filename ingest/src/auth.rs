//! Who is calling. Two kinds of caller exist: the operator with the admin token (tenant
//! management only) and a project, identified by one of its API keys. A project key decides
//! the project for every query it makes; there is no way to name another project's rows, and
//! a row of another project answers `404`, exactly like a row that does not exist.

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use railhook_common::ids::{OrganizationId, ProjectId};
use railhook_common::keygen::hash_api_key;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

use crate::access::{self, Role};
use crate::audit::Actor;
use crate::problem::ApiError;
use crate::state::AppState;
use crate::store::subscriptions;

pub(crate) fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The operator, proven by the admin token.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(given) = bearer(parts) else {
            return Err(ApiError::Unauthorized);
        };
        // The current token, or the previous one during a rotation; both are compared (in
        // constant time), so timing tells nothing about which one, if any, matched.
        let matches = |t: &Option<secrecy::SecretString>| -> bool {
            t.as_ref()
                .is_some_and(|t| t.expose_secret().as_bytes().ct_eq(given.as_bytes()).into())
        };
        let (current, previous) = (
            matches(&state.admin_token),
            matches(&state.admin_token_previous),
        );
        if state.admin_token.is_some() && (current | previous) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// A project, proven by one of its unrevoked, unexpired API keys (or a dashboard session
/// opened with one, or a portal session), with what the caller may do in it.
#[derive(Debug, Clone)]
pub struct Project {
    pub id: ProjectId,
    pub organization_id: OrganizationId,
    pub monthly_quota: i64,
    /// The caller's role (`crate::access`); already checked against the route.
    pub role: Role,
    /// The one application an application-scoped key may touch (its id).
    pub application: Option<String>,
    /// Who is calling, for the audit log.
    pub actor: Actor,
}

impl FromRequestParts<AppState> for Project {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or(ApiError::Unauthorized)?;
        // The hash is looked up by equality on a unique index: no timing signal about how
        // much of a key matched.
        let row = sqlx::query!(
            r#"SELECT p.id AS project_id, p.organization_id, o.monthly_quota,
                      k.id AS key_id, k.prefix, k.role, k.application_id
               FROM api_keys k
               JOIN projects p ON p.id = k.project_id
               JOIN organizations o ON o.id = p.organization_id
               WHERE k.key_hash = $1 AND k.revoked_at IS NULL
                 AND (k.expires_at IS NULL OR k.expires_at > now())"#,
            &hash_api_key(key)
        )
        .fetch_optional(&state.pool)
        .await?
        .ok_or(ApiError::Unauthorized)?;
        let project = Project {
            id: ProjectId::from_trusted(row.project_id),
            organization_id: OrganizationId::from_trusted(row.organization_id),
            monthly_quota: row.monthly_quota,
            role: Role::parse(&row.role).ok_or(ApiError::Unauthorized)?,
            application: row.application_id,
            actor: Actor::Key {
                id: row.key_id,
                prefix: row.prefix,
            },
        };
        authorize(parts, state, &project).await?;
        Ok(project)
    }
}

/// The gate (docs/ACCESS.md): the caller's role against the route's need, then an
/// application-scoped caller against the application the route names. Every extractor
/// that yields a project caller ends here.
pub(crate) async fn authorize(
    parts: &mut Parts,
    state: &AppState,
    project: &Project,
) -> Result<(), ApiError> {
    let Some(route) = parts.extensions.get::<MatchedPath>() else {
        // Not reached through the router's table: nothing lesser than admin passes.
        return match project.role {
            Role::Admin if project.application.is_none() => Ok(()),
            _ => Err(ApiError::Forbidden("this route is for admin keys".into())),
        };
    };
    access::check(project.role, &parts.method, route.as_str())?;
    let Some(scope) = &project.application else {
        return Ok(());
    };
    // Only an application-scoped caller reads the path's parameters (and owns the route).
    let route = route.as_str().to_owned();
    let params = match RawPathParams::from_request_parts(parts, state).await {
        Ok(p) => p
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<Vec<_>>(),
        Err(_) => Vec::new(),
    };
    let refused = || {
        ApiError::Forbidden(
            "this key is limited to one application; name it in the path (/api/v1/app/{app_id}/… or /v1/applications/{id}/…)"
                .into(),
        )
    };
    let named = access::named_application(&route, &params).ok_or_else(refused)?;
    if named == scope {
        return Ok(());
    }
    // Svix's routes may name the application by its uid.
    let same = sqlx::query_scalar!(
        r#"SELECT id FROM applications
           WHERE project_id = $1 AND uid = $2 AND deleted_at IS NULL"#,
        project.id.as_str(),
        named
    )
    .fetch_optional(&state.pool)
    .await?;
    if same.as_deref() == Some(scope.as_str()) {
        Ok(())
    } else {
        Err(refused())
    }
}

/// A project proven by its key, with its live subscriptions read in the same round trip:
/// what `POST /v1/events` needs before it can write. One query instead of two per request
/// (docs/BENCHMARKS-HISTORY.md, ingest profile). The subscriptions are as current as a separate read
/// would have been: both happen before the write.
#[derive(Clone)]
pub struct Sender {
    pub project: Project,
    pub subscriptions: std::sync::Arc<subscriptions::Subscriptions>,
    /// Event types of the project that have a schema: name → schema id (`crate::schemas`).
    pub schemas: std::sync::Arc<std::collections::HashMap<String, i64>>,
}

impl FromRequestParts<AppState> for Sender {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or(ApiError::Unauthorized)?;
        let hash = hash_api_key(key);
        let row = match state.senders.get(&hash) {
            Some(row) => row,
            None => {
                let row = subscriptions::sender(&state.pool, &hash)
                    .await?
                    .ok_or(ApiError::Unauthorized)?;
                state.senders.insert(hash, row.clone());
                row
            }
        };
        // A cached row outlives nothing: the expiry is checked at each use.
        if row.expires_at.is_some_and(|at| at <= chrono::Utc::now()) {
            return Err(ApiError::Unauthorized);
        }
        let sender = Sender {
            project: Project {
                id: ProjectId::from_trusted(row.project_id),
                organization_id: OrganizationId::from_trusted(row.organization_id),
                monthly_quota: row.monthly_quota,
                role: Role::parse(&row.role).ok_or(ApiError::Unauthorized)?,
                application: row.application_id,
                actor: Actor::Key {
                    id: row.key_id,
                    prefix: row.prefix,
                },
            },
            subscriptions: row.subscriptions,
            schemas: row.schemas,
        };
        authorize(parts, state, &sender.project).await?;
        Ok(sender)
    }
}
