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
        r#"SELECT id AS "id!", event_type AS "event_type!", source_id
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
