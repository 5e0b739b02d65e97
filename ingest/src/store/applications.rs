//! Applications: the sending team's customers (docs/APPLICATIONS.md). [`ApplicationRow`] is
//! the `applications` row, column for column, so every statement reads or returns `*`.
//!
//! An application is named by its id (`app_…`) or by the uid its sender chose; a uid never
//! starts with `app_` (checked by the API), so [`find`] tells them apart by the prefix and
//! reads one index either way.

use chrono::{DateTime, Utc};
use railhook_common::ids::ApplicationId;
use sqlx::{PgConnection, PgExecutor};

#[derive(Debug, Clone)]
pub struct ApplicationRow {
    pub id: String,
    pub project_id: String,
    pub uid: Option<String>,
    pub name: String,
    pub metadata: serde_json::Value,
    pub rate_limit_per_second: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

/// The project's live application named by `id_or_uid`.
pub async fn find(
    db: impl PgExecutor<'_>,
    project_id: &str,
    id_or_uid: &str,
) -> Result<Option<ApplicationRow>, sqlx::Error> {
    let by_id = id_or_uid.starts_with(ApplicationId::PREFIX);
    sqlx::query_as!(
        ApplicationRow,
        r#"SELECT * FROM applications
           WHERE project_id = $1 AND deleted_at IS NULL
             AND CASE WHEN $3 THEN id = $2 ELSE uid = $2 END"#,
        project_id,
        id_or_uid,
        by_id
    )
    .fetch_optional(db)
    .await
}

/// A page of the project's live applications after the cursor: newest first, or oldest
/// first with `ascending`.
pub async fn page(
    db: impl PgExecutor<'_>,
    project_id: &str,
    after: Option<&str>,
    ascending: bool,
    limit: i64,
) -> Result<Vec<ApplicationRow>, sqlx::Error> {
    sqlx::query_as!(
        ApplicationRow,
        r#"SELECT * FROM applications
           WHERE project_id = $1 AND deleted_at IS NULL
             AND ($2::text IS NULL OR CASE WHEN $3 THEN id > $2 ELSE id < $2 END)
           ORDER BY CASE WHEN $3 THEN id END ASC, CASE WHEN NOT $3 THEN id END DESC
           LIMIT $4"#,
        project_id,
        after,
        ascending,
        limit
    )
    .fetch_all(db)
    .await
}

pub struct NewApplication<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub uid: Option<&'a str>,
    pub name: &'a str,
    pub metadata: serde_json::Value,
    pub rate_limit_per_second: Option<i32>,
}

/// Stores a new application; a uid already live in the project fails on
/// `applications_uid_idx` ([`uid_taken`]).
pub async fn insert(
    db: impl PgExecutor<'_>,
    a: NewApplication<'_>,
) -> Result<ApplicationRow, sqlx::Error> {
    sqlx::query_as!(
        ApplicationRow,
        r#"INSERT INTO applications (id, project_id, uid, name, metadata, rate_limit_per_second)
           VALUES ($1, $2, $3, $4, $5, $6)
           RETURNING *"#,
        a.id,
        a.project_id,
        a.uid,
        a.name,
        a.metadata,
        a.rate_limit_per_second
    )
    .fetch_one(db)
    .await
}

/// What an update changes: `None` leaves a field; `Some(None)` clears an optional one.
#[derive(Default)]
pub struct ApplicationChange<'a> {
    pub uid: Option<Option<&'a str>>,
    pub name: Option<&'a str>,
    pub metadata: Option<serde_json::Value>,
    pub rate_limit_per_second: Option<Option<i32>>,
}

pub async fn update(
    db: impl PgExecutor<'_>,
    project_id: &str,
    id: &str,
    c: ApplicationChange<'_>,
) -> Result<Option<ApplicationRow>, sqlx::Error> {
    sqlx::query_as!(
        ApplicationRow,
        r#"UPDATE applications SET
               uid = CASE WHEN $3 THEN $4 ELSE uid END,
               name = coalesce($5, name),
               metadata = coalesce($6, metadata),
               rate_limit_per_second = CASE WHEN $7 THEN $8 ELSE rate_limit_per_second END,
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING *"#,
        id,
        project_id,
        c.uid.is_some(),
        c.uid.flatten(),
        c.name,
        c.metadata,
        c.rate_limit_per_second.is_some(),
        c.rate_limit_per_second.flatten()
    )
    .fetch_optional(db)
    .await
}

/// Deletes an application and, in the same transaction, disables and deletes its endpoints
/// (so no Claim delivers to them again: a Delivery still waiting ends at its next Claim, as
/// for any deleted endpoint). The history stays until retention drops it; the uid is free
/// at once. Returns the ids of the endpoints it ended, or `None` if there was no such
/// live application.
pub async fn delete(
    tx: &mut PgConnection,
    project_id: &str,
    id: &str,
) -> Result<Option<Vec<String>>, sqlx::Error> {
    let found = sqlx::query_scalar!(
        r#"UPDATE applications SET deleted_at = now(), updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING id"#,
        id,
        project_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    if found.is_none() {
        return Ok(None);
    }
    let ended = sqlx::query_scalar!(
        r#"UPDATE endpoints
           SET enabled = false, disabled_reason = 'the application was deleted',
               disabled_at = now(), deleted_at = now(), updated_at = now()
           WHERE application_id = $1 AND deleted_at IS NULL
           RETURNING id"#,
        id
    )
    .fetch_all(&mut *tx)
    .await?;
    Ok(Some(ended))
}

/// Whether `e` is a uid already live in its scope (an application's, or an endpoint's).
pub fn uid_taken(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.constraint(), Some("applications_uid_idx" | "endpoints_uid_idx")))
}

/// Every live application of the project (the dashboard names them beside their endpoints;
/// a project has as many as its customers, read once per page).
pub async fn of_project(
    db: impl PgExecutor<'_>,
    project_id: &str,
) -> Result<Vec<ApplicationRow>, sqlx::Error> {
    sqlx::query_as!(
        ApplicationRow,
        r#"SELECT * FROM applications WHERE project_id = $1 AND deleted_at IS NULL ORDER BY id"#,
        project_id
    )
    .fetch_all(db)
    .await
}

/// What one application's endpoints received in `[since, until)`.
#[derive(Debug, Clone, Copy, serde::Serialize, utoipa::ToSchema)]
pub struct ApplicationStats {
    /// Its live endpoints now.
    pub endpoints: i64,
    /// Its Events created in the range.
    pub events: i64,
    /// Their Deliveries by status (created in the range).
    pub pending: i64,
    pub processing: i64,
    pub succeeded: i64,
    pub failed: i64,
}

/// One application's figures, read from Postgres (metrics carry no application label:
/// docs/APPLICATIONS.md). The ids carry their day, so the lower bounds let Postgres open only
/// the day partitions of the range.
pub async fn stats(
    db: impl PgExecutor<'_>,
    project_id: &str,
    application_id: &str,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<ApplicationStats, sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT
             (SELECT count(*) FROM endpoints
              WHERE application_id = $2 AND deleted_at IS NULL) AS "endpoints!",
             (SELECT count(*) FROM events
              WHERE project_id = $1 AND application_id = $2
                AND id >= railhook_ulid_floor('evt_', $3)
                AND created_at >= $3 AND created_at < $4) AS "events!",
             count(*) FILTER (WHERE d.status = 'PENDING') AS "pending!",
             count(*) FILTER (WHERE d.status = 'PROCESSING') AS "processing!",
             count(*) FILTER (WHERE d.status = 'SUCCEEDED') AS "succeeded!",
             count(*) FILTER (WHERE d.status = 'FAILED') AS "failed!"
           FROM deliveries d
           WHERE d.project_id = $1
             AND d.endpoint_id IN (SELECT e.id FROM endpoints e WHERE e.application_id = $2)
             AND d.id >= railhook_ulid_floor('dlv_', $3)
             AND d.created_at >= $3 AND d.created_at < $4"#,
        project_id,
        application_id,
        since,
        until
    )
    .fetch_one(db)
    .await?;
    Ok(ApplicationStats {
        endpoints: r.endpoints,
        events: r.events,
        pending: r.pending,
        processing: r.processing,
        succeeded: r.succeeded,
        failed: r.failed,
    })
}
