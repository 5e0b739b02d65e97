//! The customer portal's rows: one-time access links, the sessions they open, and each
//! project's portal settings (docs/PORTAL.md). Codes and tokens are kept only as their
//! SHA-256, like API keys.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

/// What a link is for, as the API stores it.
pub struct NewLink<'a> {
    pub code_hash: &'a [u8],
    pub project_id: &'a str,
    pub application_id: &'a str,
    pub read_only: bool,
    pub session_seconds: i32,
    pub link_seconds: f64,
}

/// Stores a link and returns when it expires; expired links go at the same time (nothing
/// needs them any more).
pub async fn create_link(
    conn: &mut PgConnection,
    link: &NewLink<'_>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let expires_at = sqlx::query_scalar!(
        "INSERT INTO portal_links (code_hash, project_id, application_id, read_only,
                                   session_seconds, expires_at)
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
         RETURNING expires_at",
        link.code_hash,
        link.project_id,
        link.application_id,
        link.read_only,
        link.session_seconds,
        link.link_seconds
    )
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query!("DELETE FROM portal_links WHERE expires_at < now() - interval '1 day'")
        .execute(&mut *conn)
        .await?;
    Ok(expires_at)
}

/// What redeeming a link came to.
pub enum Redeemed {
    /// A new session; its token's hash was given.
    Opened { project_id: String },
    /// The link worked before: a link works once.
    AlreadyUsed { project_id: String },
    /// No such link, it expired, or its application was deleted.
    Invalid,
}

/// The session a link opens, as the caller made it.
pub struct NewSession<'a> {
    pub id: &'a str,
    pub token_hash: &'a [u8],
    pub csrf_token: &'a str,
}

/// Redeems the link `code_hash` and opens `session` from it, in one transaction. The link is
/// taken by one conditional UPDATE (`redeemed_at IS NULL`), so of two requests racing on
/// one link exactly one opens a session; the other is told the link was used.
pub async fn redeem(
    pool: &PgPool,
    code_hash: &[u8],
    session: &NewSession<'_>,
) -> Result<Redeemed, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let taken = sqlx::query!(
        r#"UPDATE portal_links l SET redeemed_at = now()
           WHERE l.code_hash = $1 AND l.redeemed_at IS NULL AND l.expires_at > now()
             AND EXISTS (SELECT 1 FROM applications a
                         WHERE a.id = l.application_id AND a.deleted_at IS NULL)
           RETURNING l.project_id, l.application_id, l.read_only, l.session_seconds"#,
        code_hash
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(link) = taken else {
        drop(tx);
        let used = sqlx::query_scalar!(
            "SELECT project_id FROM portal_links
             WHERE code_hash = $1 AND redeemed_at IS NOT NULL",
            code_hash
        )
        .fetch_optional(pool)
        .await?;
        return Ok(match used {
            Some(project_id) => Redeemed::AlreadyUsed { project_id },
            None => Redeemed::Invalid,
        });
    };
    sqlx::query!(
        "INSERT INTO portal_sessions (id, token_hash, link_hash, project_id, application_id,
                                      read_only, csrf_token, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8::int))",
        session.id,
        session.token_hash,
        code_hash,
        link.project_id,
        link.application_id,
        link.read_only,
        session.csrf_token,
        link.session_seconds
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!("DELETE FROM portal_sessions WHERE expires_at < now() - interval '1 day'")
        .execute(&mut *tx)
        .await?;
    crate::audit::record(
        &mut tx,
        &crate::audit::Actor::Portal {
            session: session.id.to_owned(),
        },
        crate::audit::Change {
            project_id: &link.project_id,
            object_kind: "portal_session",
            object_id: Some(&link.application_id),
            action: "open",
            changes: serde_json::json!({"read_only": link.read_only,
                                        "session_seconds": link.session_seconds}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Redeemed::Opened {
        project_id: link.project_id,
    })
}

/// A session as every portal page reads it: who it is for, and the project's settings.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub id: String,
    pub project_id: String,
    pub organization_id: String,
    pub monthly_quota: i64,
    pub application_id: String,
    pub application_name: String,
    pub read_only: bool,
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
    /// Past its expiry (kept a day, so the page can still say so inside the frame).
    pub expired: bool,
    pub settings: Settings,
}

/// A session found by its token's hash, live or recently expired, while its application is
/// not deleted.
pub async fn find_session(
    pool: &PgPool,
    token_hash: &[u8],
) -> Result<Option<SessionRow>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT s.id, s.project_id, p.organization_id, o.monthly_quota, s.application_id,
                  a.name AS application_name, s.read_only, s.csrf_token, s.expires_at,
                  s.expires_at <= now() AS "expired!",
                  coalesce(t.allowed_origins, '{}') AS "allowed_origins!",
                  t.display_name AS "display_name?", t.logo_url AS "logo_url?",
                  t.primary_color AS "primary_color?",
                  t.background_color AS "background_color?",
                  coalesce(t.color_scheme, 'auto') AS "color_scheme!",
                  t.updated_at AS "updated_at?",
                  coalesce(t.endpoint_types, '{}') AS "endpoint_types!"
           FROM portal_sessions s
           JOIN applications a ON a.id = s.application_id AND a.deleted_at IS NULL
           JOIN projects p ON p.id = s.project_id
           JOIN organizations o ON o.id = p.organization_id
           LEFT JOIN portal_settings t ON t.project_id = s.project_id
           WHERE s.token_hash = $1"#,
        token_hash
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| SessionRow {
        id: r.id,
        project_id: r.project_id,
        organization_id: r.organization_id,
        monthly_quota: r.monthly_quota,
        application_id: r.application_id,
        application_name: r.application_name,
        read_only: r.read_only,
        csrf_token: r.csrf_token,
        expires_at: r.expires_at,
        expired: r.expired,
        settings: Settings {
            allowed_origins: r.allowed_origins,
            display_name: r.display_name,
            logo_url: r.logo_url,
            primary_color: r.primary_color,
            background_color: r.background_color,
            color_scheme: r.color_scheme,
            updated_at: r.updated_at,
            endpoint_types: r.endpoint_types,
        },
    }))
}

/// Ends one session (the portal's sign-out).
pub async fn close(db: impl sqlx::PgExecutor<'_>, token_hash: &[u8]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM portal_sessions WHERE token_hash = $1",
        token_hash
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Ends a link and every session it opened (Svix's `logout`, which names the link's
/// token), inside the caller's transaction; the link's project and application, `None`
/// when there was no such link.
pub async fn close_link(
    tx: &mut PgConnection,
    code_hash: &[u8],
) -> Result<Option<(String, String)>, sqlx::Error> {
    sqlx::query!(
        "DELETE FROM portal_sessions WHERE link_hash = $1",
        code_hash
    )
    .execute(&mut *tx)
    .await?;
    // The link row stays (redeemed, so it cannot open another session); an unredeemed one
    // is made unusable the same way.
    let link = sqlx::query!(
        "UPDATE portal_links SET redeemed_at = coalesce(redeemed_at, now()),
                                 expires_at = least(expires_at, now())
         WHERE code_hash = $1 RETURNING project_id, application_id",
        code_hash
    )
    .fetch_optional(&mut *tx)
    .await?;
    Ok(link.map(|l| (l.project_id, l.application_id)))
}

/// Ends every session of the application and makes its unredeemed links unusable; returns
/// how many sessions ended.
pub async fn expire_all(
    tx: &mut PgConnection,
    project_id: &str,
    application_id: &str,
) -> Result<u64, sqlx::Error> {
    let ended = sqlx::query_scalar!(
        r#"WITH gone AS (
               DELETE FROM portal_sessions WHERE project_id = $1 AND application_id = $2
               RETURNING expires_at)
           SELECT count(*) FILTER (WHERE expires_at > now()) AS "ended!" FROM gone"#,
        project_id,
        application_id
    )
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE portal_links SET expires_at = now()
         WHERE project_id = $1 AND application_id = $2 AND redeemed_at IS NULL
           AND expires_at > now()",
        project_id,
        application_id
    )
    .execute(&mut *tx)
    .await?;
    Ok(u64::try_from(ended).unwrap_or(0))
}

/// A project's portal settings; the defaults when it has none.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub allowed_origins: Vec<String>,
    pub display_name: Option<String>,
    pub logo_url: Option<String>,
    pub primary_color: Option<String>,
    pub background_color: Option<String>,
    /// `light`, `dark` or `auto`.
    pub color_scheme: String,
    pub updated_at: Option<DateTime<Utc>>,
    /// The broker kinds (common/src/transport/) the portal offers beside HTTP.
    pub endpoint_types: Vec<String>,
}

pub async fn settings(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
) -> Result<Settings, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT allowed_origins, display_name, logo_url, primary_color, background_color,
                color_scheme, updated_at, endpoint_types
         FROM portal_settings WHERE project_id = $1",
        project_id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map_or_else(
        || Settings {
            color_scheme: "auto".to_owned(),
            ..Settings::default()
        },
        |r| Settings {
            allowed_origins: r.allowed_origins,
            display_name: r.display_name,
            logo_url: r.logo_url,
            primary_color: r.primary_color,
            background_color: r.background_color,
            color_scheme: r.color_scheme,
            updated_at: Some(r.updated_at),
            endpoint_types: r.endpoint_types,
        },
    ))
}

/// Replaces the project's settings (the caller checked every field).
pub async fn put_settings(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    s: &Settings,
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO portal_settings (project_id, allowed_origins, display_name, logo_url,
                                      primary_color, background_color, color_scheme,
                                      endpoint_types)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (project_id) DO UPDATE SET
             allowed_origins = EXCLUDED.allowed_origins, display_name = EXCLUDED.display_name,
             logo_url = EXCLUDED.logo_url, primary_color = EXCLUDED.primary_color,
             background_color = EXCLUDED.background_color,
             color_scheme = EXCLUDED.color_scheme, endpoint_types = EXCLUDED.endpoint_types,
             updated_at = now()
         RETURNING updated_at",
        project_id,
        &s.allowed_origins,
        s.display_name,
        s.logo_url,
        s.primary_color,
        s.background_color,
        s.color_scheme,
        &s.endpoint_types
    )
    .fetch_one(db)
    .await
}
