//! Operational endpoints as stored: the writes with their own rules (their ladder and
//! timeout are the operational ones, routes/operational_endpoints.rs). They are rows of
//! `endpoints` of kind `operational`, read through store/endpoints.rs.

use sqlx::PgExecutor;

use super::endpoints::EndpointRow;

/// An operational endpoint to create (its ladder and timeout are the operational ones,
/// `routes/operational_endpoints.rs`).
pub struct NewOperational<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    pub sealed_secret: &'a str,
    pub timeout_ms: i32,
    pub retry_delays: &'a str,
    pub max_attempts: i32,
    pub types: &'a [String],
    /// Made disabled (the Svix surface's `disabled: true`), in the same statement.
    pub enabled: bool,
}

pub async fn insert_operational(
    db: impl PgExecutor<'_>,
    e: NewOperational<'_>,
) -> Result<EndpointRow, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"INSERT INTO endpoints (id, project_id, url, description, secret, timeout_ms,
                                  retry_delays, max_attempts, kind, operational_types, enabled)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'operational', $9, $10)
           RETURNING *"#,
        e.id,
        e.project_id,
        e.url,
        e.description,
        e.sealed_secret,
        e.timeout_ms,
        e.retry_delays,
        e.max_attempts,
        e.types,
        e.enabled
    )
    .fetch_one(db)
    .await
}

/// What a PATCH of an operational endpoint changes (`None` leaves a field; enabling clears
/// its failure streak).
pub struct OperationalChange<'a> {
    pub url: Option<&'a str>,
    pub description: Option<&'a str>,
    pub types: Option<&'a [String]>,
    pub enabled: Option<bool>,
}

pub async fn update_operational(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    c: OperationalChange<'_>,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"UPDATE endpoints SET
               url = coalesce($3, url),
               description = coalesce($4, description),
               operational_types = coalesce($5, operational_types),
               enabled = coalesce($6, enabled),
               disabled_reason = CASE WHEN $6 IS TRUE THEN NULL ELSE disabled_reason END,
               consecutive_failures = CASE WHEN $6 IS TRUE THEN 0 ELSE consecutive_failures END,
               failing_since = CASE WHEN $6 IS TRUE THEN NULL ELSE failing_since END,
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND kind = 'operational' AND deleted_at IS NULL
           RETURNING *"#,
        id,
        project_id,
        c.url,
        c.description,
        c.types,
        c.enabled
    )
    .fetch_optional(db)
    .await
}

/// Whether the project had a live operational endpoint `id` to delete.
pub async fn delete_operational(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
) -> Result<bool, sqlx::Error> {
    let deleted = sqlx::query!(
        "UPDATE endpoints SET deleted_at = now(), enabled = false, updated_at = now()
         WHERE id = $1 AND project_id = $2 AND kind = 'operational' AND deleted_at IS NULL",
        id,
        project_id
    )
    .execute(db)
    .await?;
    Ok(deleted.rows_affected() > 0)
}
