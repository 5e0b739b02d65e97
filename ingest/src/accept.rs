//! The Event ingest transaction: the start of Railhook's delivery guarantee.
//!
//! ```text
//!   client ──POST /v1/events──▶ ingest
//!     1. key → project and its live subscriptions (one query, `auth::Sender`)
//!     2. quota: reserve (one Redis script, fails open) ─over─▶ 429 unless every Event
//!        already exists
//!     3. one statement (atomic by itself, so no BEGIN/COMMIT round trips):
//!          INSERT events        … unless its Idempotency-Key holds an Event of the window
//!          INSERT deliveries    one per matching endpoint, for the Events inserted
//!          INSERT outbox        one per Delivery (reason CREATED)
//!        ─────────────────────▶ 201
//!        (railhook_ingest(): first a lock on each Idempotency-Key, then the inserts)
//!     4. Events skipped in 3 (their Idempotency-Key exists): looked up; the same request
//!        gets 200 + that Event, a different one 409
//!     5. after the commit: refund what was reserved and not created, Sequence Numbers
//!        (both may fail; neither loses data)
//! ```
//!
//! Invariant: the Event, its Deliveries and their Outbox rows commit together or not at all.
//! There is no state in which an Event is stored and its announcement is not, so a crash
//! anywhere — before the commit (nothing exists, the client got no 201) or after it (the
//! Outbox row is in the WAL, and the relay will read it) — loses nothing that was accepted.
//! This closes duplicate/loss window 3 of `docs/ARCHITECTURE.md`.
//!
//! Invariant: a retried request with the same Idempotency-Key returns the Event it already
//! created (window 1), for [`IDEMPOTENCY_WINDOW_HOURS`] after that Event was created. `events`
//! is partitioned by day, and Postgres allows a unique index on a partitioned table only if it
//! contains the partition key (the id), so no index can make a key unique. Instead every
//! request that carries keys first takes a transaction-scoped advisory lock per key (in one
//! order, so two batches cannot deadlock), and only then, in a new statement and so with a
//! new snapshot, inserts the Events whose key holds no Event of the window (both inside the
//! function `railhook_ingest`, migrations/…_ingest_function.sql: one round trip). Two concurrent
//! retries queue on the lock; the second sees the first's committed Event, inserts nothing
//! (nor that Event's Deliveries), and answers with the winner's Event. The window bounds the
//! lookup to the newest partitions (the id carries the time), whatever the retention is.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use railhook_common::EventType;
use railhook_common::ids::EventId;
use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::PgPool;

use crate::auth::Project;
use crate::group_commit::{Inserted, Rows, TableTexts, insert_rows};
use crate::plan::{Audience, DeliveryPlan, Planner, Written};
use crate::problem::{ApiError, InternalError};
use crate::quota::Reservation;
use crate::state::AppState;
pub(crate) use crate::store::subscriptions::{Subscriptions, candidates};

/// How long an Idempotency-Key keeps answering with its Event (docs/API.md). A request with
/// a key older than this creates a new Event. Retention is never shorter.
pub use railhook_common::retention::IDEMPOTENCY_WINDOW_HOURS;

/// One Event as the sender described it, already validated.
pub struct NewEvent {
    pub event_type: EventType,
    pub payload: Box<RawValue>,
    pub idempotency_key: Option<String>,
    /// The request span's W3C trace context, stored with the Event and its Outbox rows
    /// (`railhook_common::trace_context`).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Who the Event is for: an application's id (resolved from an id or uid), or `None`
    /// for the project's own endpoints, and the channels it is sent on.
    pub audience: Audience,
    /// The sender's own id for the Event (the Svix-compatible `eventId`): stored and shown,
    /// not a key.
    pub event_uid: Option<String>,
}

/// A Delivery as reported back to the sender.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DeliveryRef {
    pub id: String,
    pub endpoint_id: String,
}

/// An accepted Event: newly created, or found under its Idempotency-Key.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AcceptedEvent {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub idempotency_key: Option<String>,
    /// The application the Event is for; absent: the project's own endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    pub deliveries: Vec<DeliveryRef>,
    #[serde(skip)]
    pub created: bool,
}

/// An Event already stored under one of the request's Idempotency-Keys.
struct Existing {
    id: String,
    event_type: String,
    created_at: DateTime<Utc>,
    same_payload: bool,
    application_id: Option<String>,
}

/// Accepts `events` for `project` (whose live subscriptions are `subs`): everything new
/// commits in one statement.
///
/// There is no lookup of the Idempotency-Keys before the write: the write itself skips an
/// Event whose key exists, and only those are looked up afterwards. A retry therefore costs
/// what a new Event costs, and a key costs no extra round trip (the lock is taken inside
/// the statement's function). The
/// one place a lookup comes first is a request the quota would refuse: if every Event in it
/// already exists, it is a retry and gets its Events back rather than a 429.
#[tracing::instrument(level = "debug", name = "ingest", skip_all, fields(project = %project.id, events = events.len()))]
pub async fn ingest(
    state: &AppState,
    project: &Project,
    subs: &Subscriptions,
    events: Vec<NewEvent>,
) -> Result<Vec<AcceptedEvent>, ApiError> {
    let organization = project.organization_id.as_str();
    let reservation = state
        .quota
        .reserve(organization, project.monthly_quota, events.len())
        .await;
    let results = if reservation == Reservation::Exceeded {
        let existing = find_existing(&state.pool, project, &events, None).await?;
        let Some(found) = (0..events.len())
            .map(|i| existing.get(&i))
            .collect::<Option<Vec<_>>>()
        else {
            state.metrics.quota_rejected.inc();
            return Err(ApiError::QuotaExceeded);
        };
        found
            .into_iter()
            .zip(&events)
            .map(|(f, e)| replayed(f, e))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        let mut committed = 0;
        match write_events(state, project, subs, &events, &mut committed).await {
            Ok(created) => {
                let n = created.iter().filter(|e| e.created).count();
                state.quota.settle(organization, reservation, n).await;
                created
            }
            Err(e) => {
                // The charge follows what was written: a failure after the commit (reading
                // the answers) keeps the created Events charged, and only the rest of the
                // reservation goes back (review #34 item 5).
                state
                    .quota
                    .settle(organization, reservation, committed)
                    .await;
                return Err(e);
            }
        }
    };
    let mut results = results;
    fill_replayed_deliveries(&state.pool, &mut results).await?;
    let replays = results.iter().filter(|e| !e.created).count();
    state.metrics.idempotent_replays.inc_by(replays as u64);
    Ok(results)
}

/// A found Event answers the request only if it *is* this request; a key reused with another
/// type or payload is a client bug, refused with 409 rather than silently ignored.
fn replayed(found: &Existing, request: &NewEvent) -> Result<AcceptedEvent, ApiError> {
    if !found.same_payload
        || found.event_type != request.event_type.as_str()
        || found.application_id != request.audience.application_id
    {
        return Err(ApiError::IdempotencyConflict);
    }
    Ok(AcceptedEvent {
        id: found.id.clone(),
        event_type: found.event_type.clone(),
        idempotency_key: request.idempotency_key.clone(),
        application_id: request.audience.application_id.clone(),
        channels: request.audience.channels.clone(),
        created_at: found.created_at,
        deliveries: Vec::new(),
        created: false,
    })
}

/// Events already stored under the keys of `events` (only those at `only`, if given), by
/// position in `events`. Payloads are compared as jsonb, so formatting does not matter.
async fn find_existing(
    conn: impl sqlx::PgExecutor<'_>,
    project: &Project,
    events: &[NewEvent],
    only: Option<&[usize]>,
) -> Result<HashMap<usize, Existing>, ApiError> {
    let mut positions = Vec::new();
    let mut keys = Vec::new();
    let mut payloads = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if let Some(key) = &e.idempotency_key
            && only.is_none_or(|o| o.contains(&i))
        {
            positions.push(i as i32);
            keys.push(key.clone());
            payloads.push(e.payload.get().to_owned());
        }
    }
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sqlx::query!(
        r#"SELECT x.pos AS "pos!", e.id, e.event_type, e.created_at,
                  e.payload = x.payload::jsonb AS "same_payload!", e.application_id
           FROM unnest($2::int4[], $3::text[], $4::text[]) AS x(pos, key, payload)
           JOIN events e ON e.project_id = $1 AND e.idempotency_key = x.key
           -- An hour wider than the insert's window, so an Event the insert saw at the
           -- window's edge a moment ago is still found; the newest one answers.
           WHERE e.id >= railhook_ulid_floor('evt_', now() - make_interval(hours => $5 + 1))
           ORDER BY e.id"#,
        project.id.as_str(),
        &positions,
        &keys,
        &payloads,
        IDEMPOTENCY_WINDOW_HOURS
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let found = Existing {
                id: r.id,
                event_type: r.event_type,
                created_at: r.created_at,
                same_payload: r.same_payload,
                application_id: r.application_id,
            };
            (r.pos as usize, found)
        })
        .collect())
}

/// What step 3 writes: a new id per Event and the Deliveries planned for every Event (the
/// plan's `spans[i]` are Event `i`'s). All are planned up front; the statement keeps those
/// of the Events it actually inserts (a concurrent request may hold an Idempotency-Key) and
/// of the filtered ones those whose filter holds.
struct Draft {
    ids: Vec<EventId>,
    plan: DeliveryPlan,
}

impl Draft {
    fn new(events: &[NewEvent], subs: &Subscriptions) -> Self {
        let ids: Vec<EventId> = events.iter().map(|_| EventId::generate()).collect();
        let mut planner = Planner::new(subs);
        for (event, id) in events.iter().zip(&ids) {
            planner.plan(id, &event.event_type, &event.audience);
        }
        Self {
            ids,
            plan: planner.finish(),
        }
    }
}

/// Step 3 and 4. Returns one result per Event; `committed` counts the Events created as
/// soon as their statement committed, so a caller that gets an error still knows.
async fn write_events(
    state: &AppState,
    project: &Project,
    subs: &Subscriptions,
    events: &[NewEvent],
    committed: &mut usize,
) -> Result<Vec<AcceptedEvent>, ApiError> {
    let draft = Draft::new(events, subs);
    // One Event: one statement, atomic by itself (its key's lock is held until it ends).
    // Several: the same statement in a transaction, because a batch is all or nothing and an
    // Idempotency-Key reused with another payload (found only once the statement skipped
    // it) must undo the rest.
    let (inserted, written, results) = if events.len() == 1
        && !state.faults.trip_ingest_before_commit()
    {
        // Written with whatever other single Events wait at the same moment (group_commit.rs).
        let inserted = state
            .group_commit
            .insert(project.id.as_str(), rows(events, &draft))
            .await?;
        *committed = inserted.len();
        let written = draft.plan.written(&inserted);
        let results = outcomes(&state.pool, project, events, &draft, &inserted, &written).await?;
        (inserted, written, results)
    } else {
        let mut tx = state.pool.begin().await?;
        // With the tables' texts: an error inside the transaction could not be retried alone.
        let rows = rows(events, &draft);
        let inserted =
            insert_rows(&mut *tx, project.id.as_str(), &rows, TableTexts::Always).await?;
        let written = draft.plan.written(&inserted);
        let results = outcomes(&mut *tx, project, events, &draft, &inserted, &written).await?;
        if state.faults.trip_ingest_before_commit() {
            // The crash test's fault point: everything written, never committed.
            return Err(ApiError::Internal(InternalError::Fault(
                "ingest_before_commit",
            )));
        }
        if let Err(e) = tx.commit().await {
            // The commit's answer may be lost after it took effect: the batch's own ids
            // say which (group_commit.rs, "A lost answer is not a failure").
            let ids: Vec<String> = draft.ids.iter().map(|id| id.as_str().to_owned()).collect();
            match crate::group_commit::committed(&state.pool, &ids, &draft.plan).await {
                Ok(found) if !found.is_empty() => {}
                _ => return Err(e.into()),
            }
        }
        *committed = inserted.len();
        (inserted, written, results)
    };
    state.metrics.events_created.inc_by(inserted.len() as u64);
    state
        .metrics
        .deliveries_created
        .inc_by(written.iter().map(Vec::len).sum::<usize>() as u64);
    assign_sequence_numbers(state, &written).await;
    Ok(results)
}

/// The answer for each Event: created, or (skipped by the statement because its
/// Idempotency-Key exists) the Event that holds the key — 409 if it is another request. The
/// statement waited for a concurrent holder to commit before skipping, so it is visible.
async fn outcomes(
    db: impl sqlx::PgExecutor<'_>,
    project: &Project,
    events: &[NewEvent],
    draft: &Draft,
    inserted: &Inserted,
    written: &[Vec<Written>],
) -> Result<Vec<AcceptedEvent>, ApiError> {
    let raced: Vec<usize> = (0..events.len())
        .filter(|&i| !inserted.contains_key(draft.ids[i].as_str()))
        .collect();
    let winners = find_existing(db, project, events, Some(&raced)).await?;
    let mut results = Vec::with_capacity(events.len());
    for (i, (event, id)) in events.iter().zip(&draft.ids).enumerate() {
        let accepted = match inserted.get(id.as_str()) {
            Some(&created_at) => created(id, event, created_at, &written[i]),
            None => {
                let winner = winners.get(&i).ok_or(ApiError::IdempotencyConflict)?;
                replayed(winner, event)?
            }
        };
        results.push(accepted);
    }
    Ok(results)
}

/// `written`: the Event's Deliveries as the statement wrote them (a payload filter may have
/// declined some of those planned).
fn created(
    id: &EventId,
    event: &NewEvent,
    created_at: DateTime<Utc>,
    written: &[Written],
) -> AcceptedEvent {
    let mut deliveries: Vec<DeliveryRef> = written
        .iter()
        .map(|d| DeliveryRef {
            id: d.id.clone(),
            endpoint_id: d.endpoint_id.clone(),
        })
        .collect();
    // Id order, as a replayed answer lists them, so both answers are the same body.
    deliveries.sort_by(|a, b| a.id.cmp(&b.id));
    AcceptedEvent {
        id: id.as_str().to_owned(),
        event_type: event.event_type.as_str().to_owned(),
        idempotency_key: event.idempotency_key.clone(),
        application_id: event.audience.application_id.clone(),
        channels: event.audience.channels.clone(),
        created_at,
        deliveries,
        created: true,
    }
}

/// Step 3's rows for `events`: the Events with the ids the draft gave them, and every
/// Delivery planned for them (the statement keeps those of the Events it inserts).
fn rows(events: &[NewEvent], draft: &Draft) -> Rows {
    Rows {
        ids: draft.ids.iter().map(|id| id.as_str().to_owned()).collect(),
        types: events
            .iter()
            .map(|e| e.event_type.as_str().to_owned())
            .collect(),
        payloads: events.iter().map(|e| e.payload.get().to_owned()).collect(),
        keys: events.iter().map(|e| e.idempotency_key.clone()).collect(),
        traceparents: events.iter().map(|e| e.traceparent.clone()).collect(),
        tracestates: events.iter().map(|e| e.tracestate.clone()).collect(),
        applications: events
            .iter()
            .map(|e| e.audience.application_id.clone())
            .collect(),
        channels: events
            .iter()
            .map(|e| e.audience.channels.as_ref().map(|c| c.join(",")))
            .collect(),
        event_uids: events.iter().map(|e| e.event_uid.clone()).collect(),
        plan: draft.plan.clone(),
    }
}

/// Sequence Numbers for ordered Deliveries, assigned after the ingest committed so that a
/// rolled-back ingest burns none. The counter and the stamp move in one statement, so this
/// step either numbers every ordered Delivery of the request or none; if it fails (the
/// process dies, Postgres restarts), the Deliveries stay unnumbered and the worker numbers
/// them before it lets them through the ordering gate. Endpoints are locked in id order so
/// concurrent requests cannot deadlock on each other's counters.
async fn assign_sequence_numbers(state: &AppState, written: &[Vec<Written>]) {
    let (deliveries, endpoints): (Vec<String>, Vec<String>) = written
        .iter()
        .flatten()
        .filter(|d| d.ordered)
        .map(|d| (d.id.clone(), d.endpoint_id.clone()))
        .unzip();
    if deliveries.is_empty() {
        return;
    }
    let assigned = sqlx::query!(
        r#"WITH input AS (
               SELECT x.delivery_id, x.endpoint_id, x.n
               FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(delivery_id, endpoint_id, n)
           ), unnumbered AS (
               -- Locked, and only those still without a number: a worker's ordering gate
               -- may have numbered one already (then the counter must not move for it).
               SELECT i.delivery_id, i.endpoint_id, i.n
               FROM input i JOIN deliveries d ON d.id = i.delivery_id
               WHERE d.sequence_number IS NULL
               FOR UPDATE OF d
           ), wanted AS (
               SELECT endpoint_id, count(*) AS how_many FROM unnumbered GROUP BY endpoint_id
           ), bumped AS (
               INSERT INTO endpoint_sequences (endpoint_id, last_assigned)
               SELECT endpoint_id, how_many FROM wanted ORDER BY endpoint_id
               ON CONFLICT (endpoint_id)
               DO UPDATE SET last_assigned = endpoint_sequences.last_assigned + EXCLUDED.last_assigned
               RETURNING endpoint_id, last_assigned
           ), numbered AS (
               SELECT u.delivery_id,
                      b.last_assigned - w.how_many
                        + row_number() OVER (PARTITION BY u.endpoint_id ORDER BY u.n) AS seq
               FROM unnumbered u JOIN wanted w USING (endpoint_id) JOIN bumped b USING (endpoint_id)
           )
           UPDATE deliveries d SET sequence_number = numbered.seq
           FROM numbered WHERE d.id = numbered.delivery_id"#,
        &deliveries,
        &endpoints
    )
    .execute(&state.pool)
    .await;
    if assigned.is_err() {
        state.metrics.sequence_assignment_failed.inc();
        tracing::warn!(
            count = deliveries.len(),
            "sequence number assignment deferred to the worker"
        );
    }
}

/// Replayed answers carry the Deliveries created with the original Event.
async fn fill_replayed_deliveries(
    pool: &PgPool,
    results: &mut [AcceptedEvent],
) -> Result<(), sqlx::Error> {
    let ids: Vec<String> = results
        .iter()
        .filter(|e| !e.created)
        .map(|e| e.id.clone())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let rows = sqlx::query!(
        r#"SELECT id, event_id, endpoint_id FROM deliveries
           WHERE event_id = ANY($1) AND origin = 'ingest' ORDER BY id"#,
        &ids
    )
    .fetch_all(pool)
    .await?;
    let mut by_event: HashMap<String, Vec<DeliveryRef>> = HashMap::new();
    for r in rows {
        by_event.entry(r.event_id).or_default().push(DeliveryRef {
            id: r.id,
            endpoint_id: r.endpoint_id,
        });
    }
    for e in results.iter_mut().filter(|e| !e.created) {
        e.deliveries = by_event.remove(&e.id).unwrap_or_default();
    }
    Ok(())
}
