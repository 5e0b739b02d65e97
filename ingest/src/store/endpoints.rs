//! Endpoints as every reader and writer sees them: [`EndpointRow`] is the `endpoints` row,
//! column for column, so each statement reads or returns `*` and no column list is written
//! anywhere (a column added to the table is a compile error here until the row has it).
//! The API's view of a row is `routes::endpoints::Endpoint` (with the signing scheme read
//! from the sealed secret); the operational endpoints' view is in
//! routes/operational_endpoints.rs; the dashboard lists what [`of_project`] returns.
//!
//! Writes with their own rules stay with their handlers (create and update in
//! routes/endpoints.rs, enable and disable in routes/endpoint_state.rs, the worker's streak
//! and breaker in the Fence); each returns the row through `RETURNING *`.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

/// The `endpoints` row (see the module doc).
#[derive(Debug, Clone)]
pub struct EndpointRow {
    pub id: String,
    pub project_id: String,
    pub url: String,
    pub description: String,
    /// Sealed (common/src/sealing.rs); never shown.
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub timeout_ms: i32,
    pub rate_limit_per_second: Option<i32>,
    pub max_concurrency: Option<i32>,
    pub headers: serde_json::Value,
    pub breaker_state: String,
    pub breaker_opened_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
    pub retry_delays: Option<String>,
    pub max_attempts: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub breaker_changed_at: Option<DateTime<Utc>>,
    pub source_id: Option<String>,
    pub consecutive_failures: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub disabled_at: Option<DateTime<Utc>>,
    /// `webhook` (the API's endpoints and Destinations) or `operational`.
    pub kind: String,
    pub operational_types: Option<Vec<String>>,
}

use railhook_common::Word;
/// Which endpoints a read covers: the API's (`webhook`, Destinations included) or the
/// operational ones (common/src/vocabulary.rs).
pub use railhook_common::vocabulary::EndpointKind as Kind;

/// One live endpoint of the project.
pub async fn find(
    db: impl PgExecutor<'_>,
    project_id: &str,
    id: &str,
    kind: Kind,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = $3"#,
        id,
        project_id,
        kind.as_str()
    )
    .fetch_optional(db)
    .await
}

/// A page of the project's live endpoints, newest first, after the cursor `after`.
pub async fn page(
    db: impl PgExecutor<'_>,
    project_id: &str,
    kind: Kind,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE project_id = $1 AND deleted_at IS NULL AND kind = $2
             AND ($3::text IS NULL OR id < $3)
           ORDER BY id DESC LIMIT $4"#,
        project_id,
        kind.as_str(),
        after,
        limit
    )
    .fetch_all(db)
    .await
}

/// Every live endpoint of the project, of one kind or (`None`) of both, oldest first (the
/// dashboard's list and its filters' choices; a project has tens of endpoints, not
/// thousands).
pub async fn of_project(
    db: impl PgExecutor<'_>,
    project_id: &str,
    kind: Option<Kind>,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE project_id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR kind = $2)
           ORDER BY id"#,
        project_id,
        kind.map(Kind::as_str)
    )
    .fetch_all(db)
    .await
}

/// A Source's live Destinations, oldest first.
pub async fn of_source(
    db: impl PgExecutor<'_>,
    source_id: &str,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints WHERE source_id = $1 AND deleted_at IS NULL ORDER BY id"#,
        source_id
    )
    .fetch_all(db)
    .await
}
