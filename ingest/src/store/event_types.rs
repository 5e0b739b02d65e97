//! The event-type catalogue's rows (`/v1/event-types`, the dashboard's catalogue page reads
//! the same table through its own list).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

/// One catalogue entry as stored.
#[derive(Clone)]
pub struct EventTypeRow {
    pub name: String,
    pub description: String,
    pub schema: Option<Value>,
    pub schema_version: i32,
    pub deprecated_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A new type; `None` when the project has one of that name.
pub async fn create(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    name: &str,
    description: &str,
    schema: Option<&Value>,
) -> Result<Option<EventTypeRow>, sqlx::Error> {
    sqlx::query_as!(
        EventTypeRow,
        r#"INSERT INTO event_types (project_id, name, description, schema)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (project_id, name) DO NOTHING
           RETURNING name, description, schema, schema_version, deprecated_at,
                     created_at, updated_at"#,
        project_id,
        name,
        description,
        schema
    )
    .fetch_optional(db)
    .await
}

/// A page of the project's types by name, after `after`.
pub async fn list(
    pool: &PgPool,
    project_id: &str,
    include_deprecated: bool,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<EventTypeRow>, sqlx::Error> {
    sqlx::query_as!(
        EventTypeRow,
        r#"SELECT name, description, schema, schema_version, deprecated_at, created_at, updated_at
           FROM event_types
           WHERE project_id = $1 AND ($2 OR deprecated_at IS NULL)
             AND ($3::text IS NULL OR name > $3)
           ORDER BY name LIMIT $4"#,
        project_id,
        include_deprecated,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

pub async fn find(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    name: &str,
) -> Result<Option<EventTypeRow>, sqlx::Error> {
    sqlx::query_as!(
        EventTypeRow,
        r#"SELECT name, description, schema, schema_version, deprecated_at, created_at, updated_at
           FROM event_types WHERE project_id = $1 AND name = $2"#,
        project_id,
        name
    )
    .fetch_optional(db)
    .await
}

/// Changes the description (when given) and the schema (`Some(None)` removes it). A
/// schema change (set or removed) bumps the version and draws a new schema_id, so no
/// replica's cached validator can stand for the new schema.
pub async fn update(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    name: &str,
    description: Option<&str>,
    schema: Option<Option<&Value>>,
) -> Result<Option<EventTypeRow>, sqlx::Error> {
    sqlx::query_as!(
        EventTypeRow,
        r#"UPDATE event_types
           SET description = coalesce($3, description),
               schema = CASE WHEN $4 THEN $5 ELSE schema END,
               schema_version = schema_version + CASE WHEN $4 THEN 1 ELSE 0 END,
               schema_id = CASE WHEN $4 THEN nextval('event_type_schema_ids') ELSE schema_id END,
               updated_at = now()
           WHERE project_id = $1 AND name = $2
           RETURNING name, description, schema, schema_version, deprecated_at,
                     created_at, updated_at"#,
        project_id,
        name,
        description,
        schema.is_some(),
        schema.flatten()
    )
    .fetch_optional(db)
    .await
}

/// Deprecates the type (the first time stays), or with `false` takes the deprecation back
/// (the Svix-compatible `deprecated: false`).
pub async fn set_deprecated(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    name: &str,
    deprecated: bool,
) -> Result<Option<EventTypeRow>, sqlx::Error> {
    sqlx::query_as!(
        EventTypeRow,
        r#"UPDATE event_types
           SET deprecated_at = CASE WHEN $3 THEN coalesce(deprecated_at, now()) END,
               updated_at = now()
           WHERE project_id = $1 AND name = $2
           RETURNING name, description, schema, schema_version, deprecated_at,
                     created_at, updated_at"#,
        project_id,
        name,
        deprecated
    )
    .fetch_optional(db)
    .await
}

/// Whether a type of that name was there to delete.
pub async fn delete(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    name: &str,
) -> Result<bool, sqlx::Error> {
    let deleted = sqlx::query!(
        "DELETE FROM event_types WHERE project_id = $1 AND name = $2",
        project_id,
        name
    )
    .execute(db)
    .await?;
    Ok(deleted.rows_affected() > 0)
}

/// One line of the dashboard's catalogue page.
pub struct CatalogueRow {
    pub name: String,
    pub description: String,
    pub has_schema: bool,
    pub schema_version: i32,
    pub deprecated_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// The project's catalogue by name, up to 1,000 types (the page's whole view).
pub async fn catalogue(pool: &PgPool, project_id: &str) -> Result<Vec<CatalogueRow>, sqlx::Error> {
    sqlx::query_as!(
        CatalogueRow,
        r#"SELECT name, description, schema IS NOT NULL AS "has_schema!", schema_version,
                  deprecated_at, updated_at
           FROM event_types WHERE project_id = $1 ORDER BY name LIMIT 1000"#,
        project_id
    )
    .fetch_all(pool)
    .await
}
