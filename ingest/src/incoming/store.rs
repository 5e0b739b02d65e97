//! What `POST /in/{source_id}` reads and writes: the Source, and a verified webhook's Event,
//! Deliveries and Outbox rows in one transaction (the module doc of `incoming` says why a
//! resend waits on the advisory lock and then finds the first Event).

use chrono::{DateTime, Utc};
use railhook_common::ids::{DeliveryId, EventId, SourceId};
use serde_json::Value;
use sqlx::PgPool;

use super::{DEDUPLICATION_WINDOW_HOURS, Identity};

/// A live Source: its project, provider name and sealed secret.
pub(super) struct Source {
    pub project_id: String,
    pub provider: String,
    pub secret: String,
}

pub(super) async fn find_source(
    pool: &PgPool,
    source_id: &SourceId,
) -> Result<Option<Source>, sqlx::Error> {
    sqlx::query_as!(
        Source,
        "SELECT project_id, provider, secret FROM sources WHERE id = $1 AND deleted_at IS NULL",
        source_id.as_str()
    )
    .fetch_optional(pool)
    .await
}

/// A verified webhook to store.
pub(super) struct Receipt<'a> {
    pub source_id: &'a SourceId,
    pub project_id: &'a str,
    pub identity: &'a Identity,
    /// The JSON body when it is JSON, else the body as a string (search and the API).
    pub payload: Value,
    /// What is forwarded, byte for byte.
    pub body: &'a [u8],
    pub forward: Value,
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// What [`store_receipt`] did.
pub(super) enum Stored {
    /// A new Event, with one Delivery per enabled Destination.
    Created {
        event_id: String,
        delivery_ids: Vec<String>,
    },
    /// A resend of a provider id seen within the window: nothing written; the first Event.
    Duplicate { first: String },
}

/// Stores `r`'s Event, Deliveries and Outbox rows in one transaction, or finds the Event a
/// resend of the same provider id already created.
pub(super) async fn store_receipt(pool: &PgPool, r: Receipt<'_>) -> Result<Stored, sqlx::Error> {
    let event_id = EventId::generate();
    let mut tx = pool.begin().await?;
    if let Some(provider_id) = &r.identity.provider_event_id {
        // Held until the commit: a concurrent resend of the same provider id waits here, then
        // finds this Event (module docs).
        sqlx::query!(
            r#"SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0)) AS "locked!: ()""#,
            r.source_id.as_str(),
            provider_id
        )
        .fetch_one(&mut *tx)
        .await?;
    }
    let inserted = sqlx::query_scalar!(
        r#"INSERT INTO events (id, project_id, event_type, payload, source_id, provider_event_id,
                               raw_body, forward_headers, traceparent, tracestate)
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, $10, $11
           WHERE $6::text IS NULL OR NOT EXISTS (
               SELECT 1 FROM events
               WHERE source_id = $5 AND provider_event_id = $6
                 AND id >= railhook_ulid_floor('evt_', now() - make_interval(hours => $9)))
           RETURNING id AS "id!""#,
        event_id.as_str(),
        r.project_id,
        r.identity.event_type,
        r.payload,
        r.source_id.as_str(),
        r.identity.provider_event_id,
        r.body,
        r.forward,
        DEDUPLICATION_WINDOW_HOURS,
        r.traceparent,
        r.tracestate
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(event_id) = inserted else {
        tx.rollback().await?;
        // The lookup's window is an hour wider than the insert's, so the Event the insert
        // found at the window's edge is still there; the first one answers.
        let first = sqlx::query_scalar!(
            r#"SELECT id AS "id!" FROM events
             WHERE source_id = $1 AND provider_event_id = $2
               AND id >= railhook_ulid_floor('evt_', now() - make_interval(hours => $3 + 1))
             ORDER BY id LIMIT 1"#,
            r.source_id.as_str(),
            r.identity.provider_event_id,
            DEDUPLICATION_WINDOW_HOURS
        )
        .fetch_one(pool)
        .await?;
        return Ok(Stored::Duplicate { first });
    };
    let destinations = sqlx::query_scalar!(
        "SELECT id FROM endpoints
         WHERE source_id = $1 AND deleted_at IS NULL AND enabled ORDER BY id",
        r.source_id.as_str()
    )
    .fetch_all(&mut *tx)
    .await?;
    let delivery_ids: Vec<String> = destinations
        .iter()
        .map(|_| DeliveryId::generate().into_string())
        .collect();
    if !destinations.is_empty() {
        sqlx::query!(
            r#"WITH d AS (
                   INSERT INTO deliveries (id, project_id, event_id, endpoint_id, direction)
                   SELECT x.id, $1, $2, x.endpoint_id, 'incoming'
                   FROM unnest($3::text[], $4::text[]) AS x(id, endpoint_id)
                   RETURNING id, endpoint_id
               )
               INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason, traceparent)
               SELECT id, endpoint_id, $1, 'CREATED', $5 FROM d"#,
            r.project_id,
            event_id,
            &delivery_ids,
            &destinations,
            r.traceparent
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Stored::Created {
        event_id,
        delivery_ids,
    })
}

/// A Source as the API shows it.
pub(crate) struct SourceRow {
    pub id: String,
    pub provider: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

pub(crate) async fn insert_source(
    db: impl sqlx::PgExecutor<'_>,
    id: &SourceId,
    project_id: &str,
    provider: &str,
    name: &str,
    sealed_secret: &str,
) -> Result<SourceRow, sqlx::Error> {
    sqlx::query_as!(
        SourceRow,
        r#"INSERT INTO sources (id, project_id, provider, name, secret)
           VALUES ($1, $2, $3, $4, $5)
           RETURNING id, provider, name, created_at"#,
        id.as_str(),
        project_id,
        provider,
        name,
        sealed_secret
    )
    .fetch_one(db)
    .await
}

/// A page of the project's live Sources, newest first, after `after`.
pub(crate) async fn list_sources(
    pool: &PgPool,
    project_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SourceRow>, sqlx::Error> {
    sqlx::query_as!(
        SourceRow,
        r#"SELECT id, provider, name, created_at FROM sources
           WHERE project_id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR id < $2)
           ORDER BY id DESC LIMIT $3"#,
        project_id,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The project's live Source `id`.
pub(crate) async fn project_source(
    pool: &PgPool,
    id: &SourceId,
    project_id: &str,
) -> Result<Option<SourceRow>, sqlx::Error> {
    sqlx::query_as!(
        SourceRow,
        r#"SELECT id, provider, name, created_at FROM sources
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL"#,
        id.as_str(),
        project_id
    )
    .fetch_optional(pool)
    .await
}

/// Deletes the Source and its Destinations in one transaction; stored Events and
/// Deliveries stay readable.
pub(crate) async fn delete_source(
    tx: &mut sqlx::PgConnection,
    id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE sources SET deleted_at = now(), updated_at = now() WHERE id = $1",
        id
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE endpoints SET deleted_at = now(), updated_at = now()
         WHERE source_id = $1 AND deleted_at IS NULL",
        id
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}
