//! Scoped API keys and the audit log's reads (writes: `crate::audit::record`).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

pub struct NewKey<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub prefix: &'a str,
    pub hash: &'a [u8],
    pub name: &'a str,
    pub role: &'a str,
    pub application_id: Option<&'a str>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Stores a key's hash and scope; returns when.
pub async fn insert_key(
    conn: &mut PgConnection,
    k: &NewKey<'_>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO api_keys (id, project_id, prefix, key_hash, name, role, application_id, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING created_at",
        k.id,
        k.project_id,
        k.prefix,
        k.hash,
        k.name,
        k.role,
        k.application_id,
        k.expires_at
    )
    .fetch_one(conn)
    .await
}

/// The id of the project's live application named `raw` (its id or its uid).
pub async fn application_of(
    conn: &mut PgConnection,
    project_id: &str,
    raw: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM applications
         WHERE project_id = $1 AND (id = $2 OR uid = $2) AND deleted_at IS NULL",
        project_id,
        raw
    )
    .fetch_optional(conn)
    .await
}

pub struct KeyRow {
    pub id: String,
    pub prefix: String,
    pub name: String,
    pub role: String,
    pub application_id: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The project's keys, newest first, below `before`.
pub async fn keys(
    pool: &PgPool,
    project_id: &str,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<KeyRow>, sqlx::Error> {
    sqlx::query_as!(
        KeyRow,
        "SELECT id, prefix, name, role, application_id, expires_at, created_at, revoked_at
         FROM api_keys WHERE project_id = $1 AND ($2::text IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3",
        project_id,
        before,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Revokes a key (of `only_project`, when given); the key's project, if there was one to
/// revoke. Revoking twice keeps the first time.
pub async fn revoke(
    conn: &mut PgConnection,
    id: &str,
    only_project: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
         WHERE id = $1 AND ($2::text IS NULL OR project_id = $2)
         RETURNING project_id",
        id,
        only_project
    )
    .fetch_optional(conn)
    .await
}

pub struct AuditFilter<'a> {
    pub project_id: &'a str,
    pub actor: Option<&'a str>,
    pub object_id: Option<&'a str>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub before: Option<&'a str>,
    pub limit: i64,
}

/// One change, as the audit log shows it (`GET /v1/audit-log`, the dashboard page).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = AuditEntry)]
pub struct AuditRow {
    pub id: String,
    pub at: DateTime<Utc>,
    /// `key` (an API key), `person` (someone signed in to the dashboard), `operator` (the
    /// admin token) or `portal` (a customer in the portal).
    pub actor_kind: String,
    /// Who: a key's id and prefix, a person's subject, a portal session id; never a secret.
    pub actor: String,
    pub actor_email: Option<String>,
    pub object_kind: String,
    pub object_id: Option<String>,
    pub action: String,
    /// What changed, with every secret value replaced by `[redacted]`.
    #[schema(value_type = Object)]
    pub changes: serde_json::Value,
}

/// A page of the project's audit log, newest first. The time bounds become id bounds
/// (ids carry their time), so a filtered read touches only the days it asks for.
pub async fn audit_page(pool: &PgPool, f: &AuditFilter<'_>) -> Result<Vec<AuditRow>, sqlx::Error> {
    sqlx::query_as!(
        AuditRow,
        r#"SELECT id, at, actor_kind, actor, actor_email, object_kind, object_id, action, changes
           FROM audit_log
           WHERE project_id = $1
             AND ($2::text IS NULL OR actor = $2)
             AND ($3::text IS NULL OR object_id = $3)
             AND ($4::timestamptz IS NULL OR id >= railhook_ulid_floor('aud_', $4) COLLATE "C")
             AND ($5::timestamptz IS NULL OR id < railhook_ulid_floor('aud_', $5) COLLATE "C")
             AND ($6::text IS NULL OR id < $6 COLLATE "C")
           ORDER BY id DESC LIMIT $7"#,
        f.project_id,
        f.actor,
        f.object_id,
        f.since,
        f.until,
        f.before,
        f.limit
    )
    .fetch_all(pool)
    .await
}
