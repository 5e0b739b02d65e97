//! A polling endpoint's stream (docs/POLLING.md): its Deliveries in Sequence Number order,
//! the consumers' committed positions in it, and its poll token.
//!
//! Invariant (why a position is a plain number): a poller's Deliveries are ordered, and a
//! Sequence Number is handed out under the endpoint's counter row lock (`endpoint_sequences`,
//! held until the numbering commits), so number n+1 is assigned only after the transaction
//! that assigned n committed. A reader that has seen n therefore never meets a smaller
//! number later, and "everything after my position" never skips a Delivery.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// At most this many Deliveries are read by one poll that filters by event type or channel,
/// however few of them match: the cost of a poll is bounded by its scan, not by how rare the
/// wanted type is. The iterator then points past what was scanned (`done` is false).
pub const FILTERED_SCAN: i64 = 1_000;

/// One Delivery of the stream, with its Event (`None` fields: the Event was dropped by
/// retention before the Delivery was).
pub struct Polled {
    pub sequence_number: i64,
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub payload: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub channels: Option<Vec<String>>,
    pub event_uid: Option<String>,
    pub expunged: bool,
    /// Matches the poll's event type and channel (always, when it gave neither).
    pub wanted: bool,
}

/// What a poll narrows the stream to, beyond the endpoint's own subscription.
#[derive(Default)]
pub struct Narrowing<'a> {
    pub event_type: Option<&'a str>,
    pub channel: Option<&'a str>,
}

impl Narrowing<'_> {
    pub fn is_empty(&self) -> bool {
        self.event_type.is_none() && self.channel.is_none()
    }
}

/// Up to `scan` Deliveries after `position`, in order, each marked wanted or not: one
/// statement over the per-day `(endpoint_id, sequence_number)` indexes, merged in order, and
/// the Events by primary key.
pub async fn read(
    pool: &PgPool,
    endpoint_id: &str,
    position: i64,
    scan: i64,
    narrowing: &Narrowing<'_>,
) -> sqlx::Result<Vec<Polled>> {
    sqlx::query_as!(
        Polled,
        r#"WITH scanned AS (
               SELECT d.sequence_number AS seq, d.event_id
               FROM deliveries d
               WHERE d.endpoint_id = $1 AND d.sequence_number > $2
               ORDER BY d.sequence_number
               LIMIT $3
           ), joined AS (
               SELECT s.seq, e.id, e.event_type, e.payload, e.created_at, e.channels,
                      e.event_uid, e.expunged_at,
                      (e.id IS NOT NULL
                       AND ($4::text IS NULL OR e.event_type = $4)
                       AND ($5::text IS NULL OR $5 = ANY(e.channels))) AS wanted
               FROM scanned s LEFT JOIN events e ON e.id = s.event_id
           )
           SELECT seq AS "sequence_number!", id AS "event_id?", event_type AS "event_type?",
                  CASE WHEN wanted THEN payload::text END AS payload,
                  created_at AS "created_at?", channels, event_uid,
                  expunged_at IS NOT NULL AS "expunged!", wanted AS "wanted!"
           FROM joined ORDER BY seq"#,
        endpoint_id,
        position,
        scan,
        narrowing.event_type,
        narrowing.channel,
    )
    .fetch_all(pool)
    .await
}

/// The consumer's committed position; 0 (the stream's start) for one never seen.
pub async fn position(pool: &PgPool, endpoint_id: &str, consumer_id: &str) -> sqlx::Result<i64> {
    Ok(sqlx::query_scalar!(
        "SELECT position FROM poller_consumers WHERE endpoint_id = $1 AND consumer_id = $2",
        endpoint_id,
        consumer_id
    )
    .fetch_optional(pool)
    .await?
    .unwrap_or(0))
}

/// Moves the consumer's position forward to `to` (never back: a poll with an older
/// iterator re-reads without undoing what the consumer committed). Creates the consumer.
pub async fn advance(
    pool: &PgPool,
    endpoint_id: &str,
    consumer_id: &str,
    to: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"INSERT INTO poller_consumers (endpoint_id, consumer_id, position)
           VALUES ($1, $2, $3)
           ON CONFLICT (endpoint_id, consumer_id) DO UPDATE
               SET position = EXCLUDED.position, updated_at = now()
               WHERE poller_consumers.position < EXCLUDED.position"#,
        endpoint_id,
        consumer_id,
        to
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets the consumer's position anywhere (a seek). Creates the consumer.
pub async fn set(
    db: impl sqlx::PgExecutor<'_>,
    endpoint_id: &str,
    consumer_id: &str,
    to: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"INSERT INTO poller_consumers (endpoint_id, consumer_id, position)
           VALUES ($1, $2, $3)
           ON CONFLICT (endpoint_id, consumer_id) DO UPDATE
               SET position = EXCLUDED.position, updated_at = now()"#,
        endpoint_id,
        consumer_id,
        to
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The position just before the first Delivery made at or after `after`, or the end of the
/// stream when there is none. Deliveries are numbered right after their commit, so the
/// numbers follow creation closely but not exactly: a Delivery made a moment before `after`
/// may be numbered after one made at it, and is then read again, never skipped. "Made" is
/// the Delivery's `created_at`, its Event's commit-time clock (the `timestamp` a poll shows).
/// The scan starts at `after`'s day partition (the ids carry their creation time).
pub async fn position_at(
    pool: &PgPool,
    endpoint_id: &str,
    after: DateTime<Utc>,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(
               (SELECT d.sequence_number - 1 FROM deliveries d
                WHERE d.endpoint_id = $1 AND d.sequence_number IS NOT NULL
                  AND d.created_at >= $2
                  -- Only the partitions that can hold such a row: an id's time is taken
                  -- from the ingest's clock before the commit, so a minute of slack.
                  AND d.id >= railhook_ulid_floor('dlv_', $2 - interval '1 minute') COLLATE "C"
                ORDER BY d.sequence_number LIMIT 1),
               (SELECT last_assigned FROM endpoint_sequences WHERE endpoint_id = $1),
               0) AS "position!""#,
        endpoint_id,
        after
    )
    .fetch_one(pool)
    .await
}

/// A consumer as the native API lists it.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Consumer {
    pub consumer_id: String,
    /// The Sequence Number of the last Delivery it has been given.
    pub position: i64,
    /// Deliveries numbered after its position.
    pub lag: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The endpoint's consumers, with their lag behind the stream's newest number.
pub async fn consumers(pool: &PgPool, endpoint_id: &str) -> sqlx::Result<Vec<Consumer>> {
    sqlx::query_as!(
        Consumer,
        r#"SELECT c.consumer_id, c.position,
                  greatest(coalesce(s.last_assigned, 0) - c.position, 0) AS "lag!",
                  c.created_at, c.updated_at
           FROM poller_consumers c
           LEFT JOIN endpoint_sequences s ON s.endpoint_id = c.endpoint_id
           WHERE c.endpoint_id = $1
           ORDER BY c.consumer_id
           LIMIT 1000"#,
        endpoint_id
    )
    .fetch_all(pool)
    .await
}

/// Forgets a consumer; false if it did not exist.
pub async fn forget(
    db: impl sqlx::PgExecutor<'_>,
    endpoint_id: &str,
    consumer_id: &str,
) -> sqlx::Result<bool> {
    Ok(sqlx::query!(
        "DELETE FROM poller_consumers WHERE endpoint_id = $1 AND consumer_id = $2",
        endpoint_id,
        consumer_id
    )
    .execute(db)
    .await?
    .rows_affected()
        > 0)
}

/// The live polling endpoint whose poll token hashes to `hash`, and its project.
pub async fn by_token(pool: &PgPool, hash: &[u8]) -> sqlx::Result<Option<(String, String)>> {
    Ok(sqlx::query!(
        r#"SELECT e.id, e.project_id FROM poll_tokens t JOIN endpoints e ON e.id = t.endpoint_id
           WHERE t.token_hash = $1 AND e.deleted_at IS NULL AND e.transport = 'poller'"#,
        hash
    )
    .fetch_optional(pool)
    .await?
    .map(|r| (r.id, r.project_id)))
}

/// Replaces the endpoint's poll token (the previous one stops working at once); false if
/// the project has no live polling endpoint `id`.
pub async fn set_token(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
    id: &str,
    hash: &[u8],
) -> sqlx::Result<bool> {
    Ok(sqlx::query!(
        r#"INSERT INTO poll_tokens (endpoint_id, token_hash)
           SELECT e.id, $3 FROM endpoints e
           WHERE e.id = $1 AND e.project_id = $2 AND e.deleted_at IS NULL
             AND e.transport = 'poller'
           ON CONFLICT (endpoint_id) DO UPDATE
               SET token_hash = EXCLUDED.token_hash, created_at = now()"#,
        id,
        project_id,
        hash
    )
    .execute(db)
    .await?
    .rows_affected()
        > 0)
}
