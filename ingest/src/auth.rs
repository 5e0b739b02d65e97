//! Who is calling. Two kinds of caller exist: the operator with the admin token (tenant
//! management only) and a project, identified by one of its API keys. A project key decides
//! the project for every query it makes; there is no way to name another project's rows, and
//! a row of another project answers `404`, exactly like a row that does not exist.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use railhook_common::ids::{OrganizationId, ProjectId};
use railhook_common::secrets::hash_api_key;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

use crate::ingest::{LIVE_SUBSCRIPTIONS_JSON, parse_candidates};
use crate::problem::ApiError;
use crate::schemas::SCHEMA_IDS_JSON;
use crate::state::AppState;

fn bearer(parts: &Parts) -> Option<&str> {
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
/// (docs/BENCHMARKS.md, ingest profile). The subscriptions are as current as a separate read
/// would have been: both happen before the write.
#[derive(Clone)]
pub struct Sender {
    pub project: Project,
    pub subscriptions: std::sync::Arc<Vec<crate::ingest::Candidate>>,
    /// Event types of the project that have a schema: name → schema id (`crate::schemas`).
    pub schemas: std::sync::Arc<std::collections::HashMap<String, i64>>,
}

/// Senders by key hash, for one second (docs/BENCHMARKS.md: with the lookup on every POST,
/// Postgres spent about a third of its time per Event on it).
///
/// What the second costs, on purpose: a key revoked, or a subscription or endpoint changed,
/// through another ingest replica is seen here up to one second later. On this replica a
/// change clears the cache at once (`invalidate`), so a client that changes a subscription
/// and then posts through the same process never sees the old one. Only `POST
/// /v1/events[/batch]` reads this cache; every other route checks its key in Postgres.
#[derive(Clone)]
pub struct SenderCache(moka::sync::Cache<Vec<u8>, Sender>);

impl Default for SenderCache {
    fn default() -> Self {
        Self(
            moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(std::time::Duration::from_secs(1))
                .build(),
        )
    }
}

impl SenderCache {
    /// Forgets every cached sender: called after any change to keys, endpoints or
    /// subscriptions (rare next to Events, so clearing all is simpler than tracking which).
    pub fn invalidate(&self) {
        self.0.invalidate_all();
    }
}

impl FromRequestParts<AppState> for Sender {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        use sqlx::Row;
        let key = bearer(parts).ok_or(ApiError::Unauthorized)?;
        let hash = hash_api_key(key);
        if let Some(sender) = state.senders.0.get(&hash) {
            return Ok(sender);
        }
        let row = sqlx::query(&format!(
            "SELECT p.id AS project_id, p.organization_id, o.monthly_quota,
                    {LIVE_SUBSCRIPTIONS_JSON} AS subscriptions,
                    {SCHEMA_IDS_JSON} AS schemas
             FROM api_keys k
             JOIN projects p ON p.id = k.project_id
             JOIN organizations o ON o.id = p.organization_id
             WHERE k.key_hash = $1 AND k.revoked_at IS NULL"
        ))
        .bind(&hash)
        .fetch_optional(&state.pool)
        .await?
        .ok_or(ApiError::Unauthorized)?;
        let subscriptions =
            parse_candidates(row.get("subscriptions")).ok_or(ApiError::Internal(
                crate::problem::InternalError::Fault("unreadable subscriptions"),
            ))?;
        let schemas: std::collections::HashMap<String, i64> =
            serde_json::from_str(row.get("schemas")).map_err(|_| {
                ApiError::Internal(crate::problem::InternalError::Fault("unreadable schemas"))
            })?;
        let sender = Sender {
            project: Project {
                id: ProjectId::from_trusted(row.get("project_id")),
                organization_id: OrganizationId::from_trusted(row.get("organization_id")),
                monthly_quota: row.get("monthly_quota"),
            },
            subscriptions: std::sync::Arc::new(subscriptions),
            schemas: std::sync::Arc::new(schemas),
        };
        state.senders.0.insert(hash, sender.clone());
        Ok(sender)
    }
}
