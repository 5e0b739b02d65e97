//! Stored Events as the API reads them (`/v1/events`), and the payload expunge. Writing an
//! Event is the ingest transaction's (`accept.rs`, `group_commit.rs`).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// One stored Event; `payload` is its JSON text (`null` once expunged).
#[derive(Clone)]
pub struct EventRow {
    pub id: String,
    pub event_type: String,
    pub payload: String,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expunged_at: Option<DateTime<Utc>>,
    pub traceparent: Option<String>,
    pub application_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub event_uid: Option<String>,
}

/// One of an Event's Deliveries, as the Event's page lists it.
pub struct DeliveryRow {
    pub id: String,
    pub endpoint_id: String,
    pub status: String,
}

/// An Event in the list.
pub struct SummaryRow {
    pub id: String,
    pub event_type: String,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub application_id: Option<String>,
    pub channels: Option<Vec<String>>,
}

/// What the list may be narrowed to.
#[derive(Default)]
pub struct ListFilter<'a> {
    pub event_type: Option<&'a str>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only this application's Events.
    pub application_id: Option<&'a str>,
    /// Only Events sent on this channel.
    pub channel: Option<&'a str>,
}

/// The project's Event `id`, with its Deliveries.
/// The project's Events of `ids` (those that exist), by id: one statement for a page of
/// rows that each name an Event (the Svix attempt lists, issue #55), not one per row. The
/// ids carry their day, so the range bounds let Postgres open only the partitions they fall in.
pub async fn rows_by_id(
    pool: &PgPool,
    project_id: &str,
    ids: &[String],
) -> Result<std::collections::HashMap<String, EventRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    let (lowest, highest) = railhook_common::ids::id_range(ids);
    let rows = sqlx::query_as!(
        EventRow,
        r#"SELECT id, event_type, payload::text AS "payload!", idempotency_key, created_at,
                  expunged_at, traceparent, application_id, channels, event_uid
           FROM events
           WHERE id = ANY($1) AND id BETWEEN $2 AND $3 AND project_id = $4"#,
        ids,
        lowest,
        highest,
        project_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id.clone(), r)).collect())
}

pub async fn find(
    pool: &PgPool,
    id: &str,
    project_id: &str,
) -> Result<Option<(EventRow, Vec<DeliveryRow>)>, sqlx::Error> {
    let event = sqlx::query_as!(
        EventRow,
        r#"SELECT id, event_type, payload::text AS "payload!", idempotency_key, created_at,
                  expunged_at, traceparent, application_id, channels, event_uid
           FROM events WHERE id = $1 AND project_id = $2"#,
        id,
        project_id
    )
    .fetch_optional(pool)
    .await?;
    let Some(event) = event else {
        return Ok(None);
    };
    let deliveries = sqlx::query_as!(
        DeliveryRow,
        "SELECT id, endpoint_id, status FROM deliveries WHERE event_id = $1 ORDER BY id",
        id
    )
    .fetch_all(pool)
    .await?;
    Ok(Some((event, deliveries)))
}

/// A page of the project's Events (operational ones left out), newest first, after `after`.
pub async fn list(
    pool: &PgPool,
    project_id: &str,
    filter: &ListFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SummaryRow>, sqlx::Error> {
    sqlx::query_as!(
        SummaryRow,
        r#"SELECT id, event_type, idempotency_key, created_at, application_id, channels
           FROM events
           WHERE project_id = $1 AND NOT operational
             AND ($2::text IS NULL OR event_type = $2)
             AND ($3::timestamptz IS NULL OR created_at >= $3)
             AND ($4::timestamptz IS NULL OR created_at < $4)
             AND ($5::text IS NULL OR id < $5)
             AND ($7::text IS NULL OR application_id = $7)
             AND ($8::text IS NULL OR $8 = ANY (channels))
           ORDER BY id DESC LIMIT $6"#,
        project_id,
        filter.event_type,
        filter.created_after,
        filter.created_before,
        after,
        limit,
        filter.application_id,
        filter.channel
    )
    .fetch_all(pool)
    .await
}

/// A page of one application's Events with their payloads (the Svix-compatible message
/// list), newest first after `after`; `event_types` narrows to any of those types.
pub async fn of_application(
    pool: &PgPool,
    project_id: &str,
    application_id: &str,
    filter: &ListFilter<'_>,
    event_types: Option<&[String]>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<EventRow>, sqlx::Error> {
    sqlx::query_as!(
        EventRow,
        r#"SELECT id, event_type, payload::text AS "payload!", idempotency_key, created_at,
                  expunged_at, traceparent, application_id, channels, event_uid
           FROM events
           WHERE project_id = $1 AND application_id = $2
             AND ($3::text[] IS NULL OR event_type = ANY ($3))
             AND ($4::timestamptz IS NULL OR created_at >= $4)
             AND ($5::timestamptz IS NULL OR created_at < $5)
             AND ($6::text IS NULL OR $6 = ANY (channels))
             AND ($7::text IS NULL OR id < $7)
           ORDER BY id DESC LIMIT $8"#,
        project_id,
        application_id,
        event_types,
        filter.created_after,
        filter.created_before,
        filter.channel,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// One application's Event by its id or by the sender's `event_uid` (the newest, if the
/// sender reused one).
pub async fn find_in_application(
    pool: &PgPool,
    project_id: &str,
    application_id: &str,
    id_or_uid: &str,
) -> Result<Option<EventRow>, sqlx::Error> {
    sqlx::query_as!(
        EventRow,
        r#"SELECT id, event_type, payload::text AS "payload!", idempotency_key, created_at,
                  expunged_at, traceparent, application_id, channels, event_uid
           FROM events
           WHERE project_id = $1 AND application_id = $2 AND (id = $3 OR event_uid = $3)
           ORDER BY id DESC LIMIT 1"#,
        project_id,
        application_id,
        id_or_uid
    )
    .fetch_optional(pool)
    .await
}

/// What an expunge did: when (the first time stays) and how many Deliveries it ended.
pub struct Expunge {
    pub expunged_at: DateTime<Utc>,
    pub deliveries_failed: i64,
}

/// Removes the project's Event `id`'s payload from every place it is stored, in one
/// transaction (the route's doc says what stays): the payload, the raw body and forwarded
/// headers; Deliveries not sent yet end FAILED (`payload_expunged`) with their token
/// cleared, so an Attempt in flight is fenced out; and the excerpts of every Attempt,
/// which may quote the payload (review #34 item 6), with the request a transformation
/// made, whose body is often the payload itself (issue #53). `None`: no such Event.
pub async fn expunge(
    tx: &mut sqlx::PgConnection,
    id: &str,
    project_id: &str,
) -> Result<Option<Expunge>, sqlx::Error> {
    let expunged_at = sqlx::query_scalar!(
        r#"UPDATE events
           SET payload = 'null'::jsonb, raw_body = NULL, forward_headers = NULL,
               expunged_at = coalesce(expunged_at, now())
           WHERE id = $1 AND project_id = $2
           RETURNING expunged_at AS "expunged_at!""#,
        id,
        project_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(expunged_at) = expunged_at else {
        return Ok(None);
    };
    // An ordered successor parked behind one of these wakes at its gap timeout and finds
    // it resolved (FAILED).
    let deliveries_failed = sqlx::query_scalar!(
        r#"WITH failed AS (
               UPDATE deliveries
               SET status = 'FAILED', failure_reason = 'payload_expunged', claim_token = NULL,
                   next_retry_at = NULL, hinted_at = NULL, parked_at = NULL,
                   updated_at = now(), version = version + 1
               WHERE event_id = $1 AND status IN ('PENDING', 'PROCESSING')
               RETURNING 1
           )
           SELECT count(*) AS "n!" FROM failed"#,
        id
    )
    .fetch_one(&mut *tx)
    .await?;
    // An Attempt in flight now is fenced out above, and its row is written without an
    // excerpt or request (worker/src/fence.rs, `finalise`).
    sqlx::query!(
        "UPDATE attempts a SET response_excerpt = NULL, request = NULL
         FROM deliveries d
         WHERE d.event_id = $1 AND a.delivery_id = d.id
           AND (a.response_excerpt IS NOT NULL OR a.request IS NOT NULL)",
        id
    )
    .execute(&mut *tx)
    .await?;
    Ok(Some(Expunge {
        expunged_at,
        deliveries_failed,
    }))
}
