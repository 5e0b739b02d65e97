//! Who is calling. Two kinds of caller exist: the operator with the admin token (tenant
//! management only) and a project, identified by one of its API keys. A project key decides
//! the project for every query it makes; there is no way to name another project's rows, and
//! a row of another project answers `404`, exactly like a row that does not exist.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use railhook_common::ids::{OrganizationId, ProjectId};
use railhook_common::keygen::hash_api_key;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

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

/// A project, proven by one of its unrevoked API keys.
#[derive(Debug, Clone)]
pub struct Project {
    pub id: ProjectId,
    pub organization_id: OrganizationId,
    pub monthly_quota: i64,
}

impl FromRequestParts<AppState> for Project {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or(ApiError::Unauthorized)?;
        // The hash is looked up by equality on a unique index: no timing signal about how
        // much of a key matched.
        let row = sqlx::query!(
            r#"SELECT p.id AS project_id, p.organization_id, o.monthly_quota
               FROM api_keys k
               JOIN projects p ON p.id = k.project_id
               JOIN organizations o ON o.id = p.organization_id
               WHERE k.key_hash = $1 AND k.revoked_at IS NULL"#,
            &hash_api_key(key)
        )
        .fetch_optional(&state.pool)
        .await?
        .ok_or(ApiError::Unauthorized)?;
        Ok(Project {
            id: ProjectId::from_trusted(row.project_id),
            organization_id: OrganizationId::from_trusted(row.organization_id),
            monthly_quota: row.monthly_quota,
        })
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
        let sender = Sender {
            project: Project {
                id: ProjectId::from_trusted(row.project_id),
                organization_id: OrganizationId::from_trusted(row.organization_id),
                monthly_quota: row.monthly_quota,
            },
            subscriptions: row.subscriptions,
            schemas: row.schemas,
        };
        Ok(sender)
    }
}
