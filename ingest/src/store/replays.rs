//! Which Events a Replay covers. The selection itself is one SQL function,
//! `railhook_replay_selection` (migration 20261204000015), read here twice: counted when the
//! Replay is made (routes/replays.rs), and in batches after the cursor by the engine
//! (replay.rs). Neither writes the filter out, so they cannot drift apart.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

/// A validated Replay request's Events: named ids, or a time range narrowed by types.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub event_ids: Option<Vec<String>>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub event_types: Option<Vec<String>>,
}

/// How many Events a selection finds, and how many of them can be replayed (an Event whose
/// payload was expunged cannot).
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    pub found: i64,
    pub replayable: i64,
}

pub async fn count(
    pool: &PgPool,
    project_id: &str,
    sel: &Selection,
) -> Result<Counted, sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "found!", count(*) FILTER (WHERE expunged_at IS NULL) AS "replayable!"
           FROM railhook_replay_selection($1, $2, $3, $4, $5)"#,
        project_id,
        sel.event_ids.as_deref(),
        sel.from,
        sel.to,
        sel.event_types.as_deref()
    )
    .fetch_one(pool)
    .await?;
    Ok(Counted {
        found: r.found,
        replayable: r.replayable,
    })
}

/// One Event of a Replay's batch.
#[derive(Debug, Clone)]
pub struct ReplayedEvent {
    pub id: String,
    pub event_type: String,
    pub source_id: Option<String>,
    pub application_id: Option<String>,
    pub channels: Option<Vec<String>>,
}

/// The next `limit` replayable Events after `after` (the Replay's cursor), in id order.
pub async fn batch(
    conn: &mut PgConnection,
    project_id: &str,
    sel: &Selection,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ReplayedEvent>, sqlx::Error> {
    sqlx::query_as!(
        ReplayedEvent,
        r#"SELECT id AS "id!", event_type AS "event_type!", source_id, application_id, channels
           FROM railhook_replay_selection($1, $2, $3, $4, $5)
           WHERE ($6::text IS NULL OR id > $6) AND expunged_at IS NULL
           ORDER BY id LIMIT $7"#,
        project_id,
        sel.event_ids.as_deref(),
        sel.from,
        sel.to,
        sel.event_types.as_deref(),
        after,
        limit
    )
    .fetch_all(conn)
    .await
}

/// The `replays` row, column for column: every statement reads or returns `*`, so no
/// column list is written out (a column added to the table is a compile error here).
pub struct ReplayRow {
    pub id: String,
    #[allow(dead_code)] // scoped by the statements' WHERE; not shown
    pub project_id: String,
    pub status: String,
    pub event_ids: Option<Vec<String>>,
    pub from_time: Option<DateTime<Utc>>,
    pub to_time: Option<DateTime<Utc>>,
    pub event_types: Option<Vec<String>>,
    pub endpoint_id: Option<String>,
    pub events_total: i64,
    pub events_done: i64,
    pub deliveries_created: i64,
    #[allow(dead_code)] // the engine's, read by crate::replay
    pub cursor: Option<String>,
    pub created_at: DateTime<Utc>,
    #[allow(dead_code)]
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// What a Replay covers and how many Events it will replay.
pub struct NewReplay<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub event_ids: Option<&'a [String]>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub event_types: Option<&'a [String]>,
    pub endpoint_id: Option<&'a str>,
    pub events_total: i64,
}

/// Whether the project has a live endpoint `id` (any kind).
pub async fn endpoint_exists(
    pool: &PgPool,
    id: &str,
    project_id: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM endpoints
                              WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL) AS "exists!""#,
        id,
        project_id
    )
    .fetch_one(pool)
    .await
}

/// A new Replay, RUNNING (COMPLETED at once when it covers no Event).
pub async fn insert(
    db: impl sqlx::PgExecutor<'_>,
    r: NewReplay<'_>,
) -> Result<ReplayRow, sqlx::Error> {
    sqlx::query_as!(
        ReplayRow,
        "INSERT INTO replays (id, project_id, event_ids, from_time, to_time, event_types,
                              endpoint_id, events_total, status, finished_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::bigint,
                 CASE WHEN $8::bigint = 0 THEN 'COMPLETED' ELSE 'RUNNING' END,
                 CASE WHEN $8::bigint = 0 THEN now() END)
         RETURNING *",
        r.id,
        r.project_id,
        r.event_ids,
        r.from,
        r.to,
        r.event_types,
        r.endpoint_id,
        r.events_total
    )
    .fetch_one(db)
    .await
}

/// The project's latest Replays.
pub async fn recent(
    pool: &PgPool,
    project_id: &str,
    limit: i64,
) -> Result<Vec<ReplayRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplayRow,
        "SELECT * FROM replays WHERE project_id = $1 ORDER BY id DESC LIMIT $2",
        project_id,
        limit
    )
    .fetch_all(pool)
    .await
}

/// A page of the project's Replays, newest first, after `after`.
pub async fn page(
    pool: &PgPool,
    project_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ReplayRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplayRow,
        "SELECT * FROM replays
         WHERE project_id = $1 AND ($2::text IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3",
        project_id,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

pub async fn find(
    pool: &PgPool,
    id: &str,
    project_id: &str,
) -> Result<Option<ReplayRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplayRow,
        "SELECT * FROM replays WHERE id = $1 AND project_id = $2",
        id,
        project_id
    )
    .fetch_optional(pool)
    .await
}

/// Cancels the project's Replay `id` if it is RUNNING; `None` otherwise.
pub async fn cancel(
    db: impl sqlx::PgExecutor<'_>,
    id: &str,
    project_id: &str,
) -> Result<Option<ReplayRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplayRow,
        "UPDATE replays SET status = 'CANCELLED', finished_at = now(), updated_at = now()
         WHERE id = $1 AND project_id = $2 AND status = 'RUNNING'
         RETURNING *",
        id,
        project_id
    )
    .fetch_optional(db)
    .await
}
