//! Tenants: organizations, projects and their API keys (the operator's routes,
//! `routes/admin.rs`).

use chrono::{DateTime, Utc};
use railhook_common::ids::{ApiKeyId, OrganizationId, ProjectId};
use railhook_common::keygen::NewApiKey;
use sqlx::{PgConnection, PgPool};

/// When the organization was created.
pub async fn insert_organization(
    pool: &PgPool,
    id: &OrganizationId,
    name: &str,
    monthly_quota: i64,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let row = sqlx::query!(
        "INSERT INTO organizations (id, name, monthly_quota) VALUES ($1, $2, $3) RETURNING created_at",
        id.as_str(),
        name,
        monthly_quota
    )
    .fetch_one(pool)
    .await?;
    Ok(row.created_at)
}

pub async fn organization_exists(
    conn: &mut PgConnection,
    id: &OrganizationId,
) -> Result<bool, sqlx::Error> {
    let exists = sqlx::query_scalar!(
        "SELECT 1 AS one FROM organizations WHERE id = $1",
        id.as_str()
    )
    .fetch_optional(conn)
    .await?;
    Ok(exists.is_some())
}

/// When the project was created.
pub async fn insert_project(
    conn: &mut PgConnection,
    id: &ProjectId,
    organization: &OrganizationId,
    name: &str,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let row = sqlx::query!(
        "INSERT INTO projects (id, organization_id, name) VALUES ($1, $2, $3) RETURNING created_at",
        id.as_str(),
        organization.as_str(),
        name
    )
    .fetch_one(conn)
    .await?;
    Ok(row.created_at)
}

pub async fn project_exists(conn: &mut PgConnection, id: &ProjectId) -> Result<bool, sqlx::Error> {
    let exists = sqlx::query_scalar!("SELECT 1 AS one FROM projects WHERE id = $1", id.as_str())
        .fetch_optional(conn)
        .await?;
    Ok(exists.is_some())
}

/// Stores `key`'s hash under `id`; returns when.
pub async fn insert_api_key(
    conn: &mut PgConnection,
    id: &ApiKeyId,
    project_id: &str,
    key: &NewApiKey,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let row = sqlx::query!(
        "INSERT INTO api_keys (id, project_id, prefix, key_hash) VALUES ($1, $2, $3, $4) RETURNING created_at",
        id.as_str(),
        project_id,
        key.prefix,
        key.hash
    )
    .fetch_one(conn)
    .await?;
    Ok(row.created_at)
}
