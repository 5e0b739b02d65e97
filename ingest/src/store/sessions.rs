//! Dashboard sessions: a signed-in browser's session, found by the hash of its cookie's
//! token, and the API key it was opened with (a revoked key ends every session it opened).

use sqlx::PgPool;

/// What a live session stands for: a key's session has the key's id, prefix and role as
/// they are now; a person's has the subject, email and role they signed in with.
pub struct SessionRow {
    pub csrf_token: String,
    pub project_id: String,
    pub organization_id: String,
    pub monthly_quota: i64,
    pub key_id: Option<String>,
    pub prefix: Option<String>,
    pub role: String,
    pub application_id: Option<String>,
    pub subject: Option<String>,
    pub email: Option<String>,
}

/// The live session whose token hashes to `token_hash`: a person's, or a key's while the
/// key is not revoked or expired.
pub async fn find(pool: &PgPool, token_hash: &[u8]) -> Result<Option<SessionRow>, sqlx::Error> {
    sqlx::query_as!(
        SessionRow,
        r#"SELECT s.csrf_token, p.id AS project_id, p.organization_id, o.monthly_quota,
                  k.id AS "key_id?", k.prefix AS "prefix?", coalesce(k.role, s.role) AS "role!",
                  k.application_id AS "application_id?", s.subject, s.email
               FROM dashboard_sessions s
               LEFT JOIN api_keys k ON k.id = s.api_key_id
               JOIN projects p ON p.id = s.project_id
               JOIN organizations o ON o.id = p.organization_id
               WHERE s.token_hash = $1 AND s.expires_at > now()
                 AND (s.api_key_id IS NULL
                      OR (k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())))"#,
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

/// A person's new session (signed in through the identity provider), with its role.
pub struct PersonSession<'a> {
    pub token_hash: &'a [u8],
    pub project_id: &'a str,
    pub csrf_token: &'a str,
    pub ttl_secs: f64,
    pub subject: &'a str,
    pub email: Option<&'a str>,
    pub role: &'a str,
}

pub async fn open_person(
    conn: &mut sqlx::PgConnection,
    s: &PersonSession<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO dashboard_sessions (token_hash, project_id, csrf_token, expires_at,
                                         subject, email, role)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5, $6, $7)",
        s.token_hash,
        s.project_id,
        s.csrf_token,
        s.ttl_secs,
        s.subject,
        s.email,
        s.role
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Stores a sign-in in progress (crate::sso); sign-ins older than ten minutes go.
pub async fn sso_begin(
    pool: &PgPool,
    state_hash: &[u8],
    nonce: &str,
    pkce_verifier: &str,
    project_id: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO sso_logins (state_hash, nonce, pkce_verifier, project_id)
         VALUES ($1, $2, $3, $4)",
        state_hash,
        nonce,
        pkce_verifier,
        project_id
    )
    .execute(pool)
    .await?;
    sqlx::query!("DELETE FROM sso_logins WHERE created_at < now() - interval '10 minutes'")
        .execute(pool)
        .await?;
    Ok(())
}

pub struct SsoLogin {
    pub nonce: String,
    pub pkce_verifier: String,
    pub project_id: Option<String>,
}

/// Takes the sign-in `state_hash` began, once: a second call, or one after ten minutes,
/// finds nothing.
pub async fn sso_take(pool: &PgPool, state_hash: &[u8]) -> Result<Option<SsoLogin>, sqlx::Error> {
    sqlx::query_as!(
        SsoLogin,
        "DELETE FROM sso_logins
         WHERE state_hash = $1 AND created_at > now() - interval '10 minutes'
         RETURNING nonce, pkce_verifier, project_id",
        state_hash
    )
    .fetch_optional(pool)
    .await
}

/// The project a person's grants open: `hint` if a grant covers it, else the first grant's
/// (an organization's first project). `None`: the grants name nothing that exists.
pub async fn project_for(
    pool: &PgPool,
    grants: &[crate::sso::Grant],
    hint: Option<&str>,
) -> Result<Option<(String, crate::access::Role)>, sqlx::Error> {
    use crate::sso::Grant;
    // With the hint first, then without it.
    for only in [hint, None]
        .into_iter()
        .take(if hint.is_some() { 2 } else { 1 })
    {
        for g in grants {
            let found =
                match g {
                    Grant::Project { id, .. } => sqlx::query_scalar!(
                        "SELECT id FROM projects WHERE id = $1 AND ($2::text IS NULL OR id = $2)",
                        id,
                        only
                    )
                    .fetch_optional(pool)
                    .await?,
                    Grant::Organization { id, .. } => {
                        sqlx::query_scalar!(
                            "SELECT id FROM projects WHERE organization_id = $1
                           AND ($2::text IS NULL OR id = $2) ORDER BY id LIMIT 1",
                            id,
                            only
                        )
                        .fetch_optional(pool)
                        .await?
                    }
                };
            if let Some(p) = found {
                let (Grant::Project { role, .. } | Grant::Organization { role, .. }) = g;
                return Ok(Some((p, *role)));
            }
        }
    }
    Ok(None)
}
