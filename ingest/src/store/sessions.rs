//! Dashboard sessions: a signed-in browser's session, found by the hash of its cookie's
//! token, and the API key it was opened with (a revoked key ends every session it opened).

use sqlx::PgPool;

/// What a live session stands for.
pub struct SessionRow {
    pub csrf_token: String,
    pub project_id: String,
    pub organization_id: String,
    pub monthly_quota: i64,
    pub key_id: String,
    pub prefix: String,
    pub role: String,
    pub application_id: Option<String>,
}

/// The live session whose token hashes to `token_hash`, while its key is not revoked or
/// expired; the session has the key's role and scope as they are now.
pub async fn find(pool: &PgPool, token_hash: &[u8]) -> Result<Option<SessionRow>, sqlx::Error> {
    sqlx::query_as!(
        SessionRow,
        r#"SELECT s.csrf_token, p.id AS project_id, p.organization_id, o.monthly_quota,
                  k.id AS key_id, k.prefix, k.role, k.application_id
               FROM dashboard_sessions s
               JOIN api_keys k ON k.id = s.api_key_id AND k.revoked_at IS NULL
                              AND (k.expires_at IS NULL OR k.expires_at > now())
               JOIN projects p ON p.id = s.project_id
               JOIN organizations o ON o.id = p.organization_id
               WHERE s.token_hash = $1 AND s.expires_at > now()"#,
        token_hash
    )
    .fetch_optional(pool)
    .await
}

/// An unrevoked, unexpired API key, as sign-in needs it.
pub struct SignInKey {
    pub id: String,
    pub project_id: String,
    pub prefix: String,
    pub role: String,
}

/// The unrevoked, unexpired API key whose hash is `key_hash`.
pub async fn key(pool: &PgPool, key_hash: &[u8]) -> Result<Option<SignInKey>, sqlx::Error> {
    sqlx::query_as!(
        SignInKey,
        "SELECT id, project_id, prefix, role FROM api_keys WHERE key_hash = $1
           AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())",
        key_hash
    )
    .fetch_optional(pool)
    .await
}

/// A new session for `ttl_secs`, and the expired ones go (nothing else needs them).
pub async fn open(
    conn: &mut sqlx::PgConnection,
    token_hash: &[u8],
    key_id: &str,
    project_id: &str,
    csrf_token: &str,
    ttl_secs: f64,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO dashboard_sessions (token_hash, api_key_id, project_id, csrf_token, expires_at)
         VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
        token_hash,
        key_id,
        project_id,
        csrf_token,
        ttl_secs
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!("DELETE FROM dashboard_sessions WHERE expires_at < now()")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub async fn close(db: impl sqlx::PgExecutor<'_>, token_hash: &[u8]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM dashboard_sessions WHERE token_hash = $1",
        token_hash
    )
    .execute(db)
    .await?;
    Ok(())
}
