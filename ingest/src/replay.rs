//! The Time Machine's engine: works through RUNNING Replays one bounded batch at a time.
//!
//! Every ingest process runs [`run`]. A batch is one transaction that:
//! 1. locks one RUNNING Replay row (`FOR UPDATE SKIP LOCKED`, least recently advanced
//!    first), so two processes never work the same Replay at once and several Replays share
//!    the processes fairly;
//! 2. reads the next [`BATCH_EVENTS`] Events after the Replay's cursor;
//! 3. inserts a new Delivery (new id, so a new `webhook-id` that passes the receiver's dedupe;
//!    same Event, so the same `X-Event-Id`) per Event × current target, each with its Outbox
//!    row (reason `REPLAY`), in one statement;
//! 4. moves the cursor and the counters, and marks the Replay COMPLETED after the last batch.
//!
//! Invariant: the cursor moves in the same commit as the Deliveries it accounts for, so a
//! crash, a restart or a lost lock between batches neither skips nor repeats an Event. A
//! replay of 100k Events is 200 short transactions, never one long one.
//!
//! Targets are decided when the batch runs, from what exists then: an outgoing Event goes
//! to the endpoints whose live subscriptions match its type; an incoming Event to its
//! Source's destinations. Disabled and deleted endpoints are skipped. Replayed Deliveries
//! are never ordered (they have no place in the endpoint's Sequence), and they go through
//! the same workers, limits and Deferrals as any other Delivery.

use std::collections::HashSet;
use std::time::Duration;

use railhook_common::event_type::EventType;
use railhook_common::ids::{DeliveryId, EventId};
use railhook_common::vocabulary::{DeliveryOrigin, Word};
use sqlx::{PgConnection, PgPool};

use crate::accept::candidates;
use crate::plan::{Audience, Planner};
use crate::store::replays::{self, ReplayedEvent, Selection};

/// Events per batch transaction.
pub const BATCH_EVENTS: i64 = 500;
/// How long the runner sleeps when no Replay is running.
const IDLE: Duration = Duration::from_millis(300);

/// Works on Replays until the task is dropped. Errors are logged and retried after a pause;
/// a batch that failed rolled back whole, so it is simply done again.
pub async fn run(pool: PgPool) {
    loop {
        // A batch is bounded like a sweep (db::answered): a frozen primary ends it, and the
        // next one runs on whichever server is the primary then.
        let batch = railhook_common::db::answered(
            railhook_common::db::SWEEP_ANSWER_WITHIN,
            "a Replay batch",
            step(&pool),
        );
        match batch.await {
            Ok(true) => {}
            Ok(false) => tokio::time::sleep(IDLE).await,
            Err(e) => {
                tracing::warn!(error = %e, "replay batch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// One batch of one Replay; `Ok(false)` when no Replay was waiting.
#[tracing::instrument(level = "debug", name = "replay_batch", skip_all)]
pub async fn step(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let Some(replay) = sqlx::query!(
        "SELECT id, project_id, event_ids, from_time, to_time, event_types, endpoint_id, cursor
         FROM replays WHERE status = 'RUNNING'
         ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(false);
    };
    let (id, project_id, endpoint_id) = (replay.id, replay.project_id, replay.endpoint_id);
    let selection = Selection {
        event_ids: replay.event_ids,
        from: replay.from_time,
        to: replay.to_time,
        event_types: replay.event_types,
    };
    let cursor = replay.cursor;
    let events = replays::batch(
        &mut tx,
        &project_id,
        &selection,
        cursor.as_deref(),
        BATCH_EVENTS,
    )
    .await?;
    let plan = plan(&mut tx, &project_id, endpoint_id.as_deref(), &events).await?;
    let created = insert(&mut tx, &project_id, &id, &plan).await?;
    let last = events.last().map(|e| e.id.clone());
    let finished = (events.len() as i64) < BATCH_EVENTS;
    sqlx::query!(
        "UPDATE replays
         SET cursor = coalesce($2, cursor), events_done = events_done + $3,
             deliveries_created = deliveries_created + $4, updated_at = now(),
             status = CASE WHEN $5 THEN 'COMPLETED' ELSE status END,
             finished_at = CASE WHEN $5 THEN now() END
         WHERE id = $1",
        id,
        last,
        events.len() as i64,
        created,
        finished
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// The new Deliveries of one batch, as parallel columns for one `unnest` insert.
#[derive(Default)]
struct Plan {
    ids: Vec<String>,
    event_ids: Vec<String>,
    endpoint_ids: Vec<String>,
    subscription_ids: Vec<Option<String>>,
    directions: Vec<&'static str>,
    /// The payload filter of today for each (docs/ROUTING.md: a Replay applies the filters
    /// the endpoints and subscriptions have now, not those they had when the Event came).
    filters: Vec<Option<String>>,
}

async fn plan(
    tx: &mut PgConnection,
    project_id: &str,
    only_endpoint: Option<&str>,
    events: &[ReplayedEvent],
) -> Result<Plan, sqlx::Error> {
    let sources: Vec<String> = events
        .iter()
        .filter_map(|e| e.source_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let destinations: Vec<(String, String)> = if sources.is_empty() {
        Vec::new()
    } else {
        sqlx::query!(
            r#"SELECT id, source_id AS "source_id!" FROM endpoints
               WHERE project_id = $1 AND source_id = ANY($2) AND enabled AND deleted_at IS NULL
               ORDER BY id"#,
            project_id,
            &sources
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|r| (r.id, r.source_id))
        .collect()
    };
    let wanted = |endpoint: &str| only_endpoint.is_none_or(|only| only == endpoint);
    let subs = candidates(&mut *tx, project_id)
        .await?
        .only(|s| wanted(&s.endpoint_id));
    // Outgoing Events match like at ingest (one Delivery per endpoint, however many of its
    // subscriptions match); a replayed Delivery is never ordered.
    let mut outgoing = Planner::new(&subs);
    let mut plan = Plan::default();
    for event in events {
        let Some(source) = &event.source_id else {
            // Stored types were valid when accepted; one that no longer parses is skipped.
            if let Ok(event_type) = EventType::parse(&event.event_type) {
                let id = EventId::from_trusted(event.id.clone());
                // The Event's own audience, as at ingest: a replay never widens it.
                let audience = Audience {
                    application_id: event.application_id.clone(),
                    channels: event.channels.clone(),
                };
                outgoing.plan(&id, &event_type, &audience);
            }
            continue;
        };
        for (endpoint, _) in destinations
            .iter()
            .filter(|(ep, src)| src == source && wanted(ep))
        {
            plan.push(&event.id, endpoint, None, "incoming", None);
        }
    }
    let outgoing = outgoing.finish();
    for n in 0..outgoing.ids.len() {
        plan.push(
            &outgoing.event_ids[n],
            &outgoing.endpoint_ids[n],
            Some(&outgoing.subscription_ids[n]),
            "outgoing",
            None,
        );
    }
    let filtered = &outgoing.filtered;
    for c in 0..filtered.len() {
        let event = &outgoing.spans[filtered.events[c] as usize - 1].event_id;
        let (endpoint, subscription, _) = filtered.route_of_candidate(c);
        let filter = filtered.filter_text(c).to_owned();
        plan.push(
            event,
            endpoint,
            Some(subscription),
            "outgoing",
            Some(filter),
        );
    }
    Ok(plan)
}

impl Plan {
    fn push(
        &mut self,
        event: &str,
        endpoint: &str,
        subscription: Option<&str>,
        direction: &'static str,
        filter: Option<String>,
    ) {
        self.ids.push(DeliveryId::generate().into_string());
        self.event_ids.push(event.to_owned());
        self.endpoint_ids.push(endpoint.to_owned());
        self.subscription_ids.push(subscription.map(str::to_owned));
        self.directions.push(direction);
        self.filters.push(filter);
    }
}

/// The batch's Deliveries and their Outbox rows, in one statement so neither exists alone;
/// a filtered Delivery is written only if its filter holds for the Event's payload (as the
/// ingest statement decides it). Returns how many Deliveries were written.
async fn insert(
    tx: &mut PgConnection,
    project_id: &str,
    replay_id: &str,
    plan: &Plan,
) -> Result<i64, sqlx::Error> {
    if plan.ids.is_empty() {
        return Ok(0);
    }
    let written = sqlx::query_scalar!(
        r#"WITH d AS (
             INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id,
                                     direction, origin, replay_id, ordered)
             -- A polling endpoint's Deliveries are ordered (numbered by the worker's gate),
             -- so a replayed one takes its place in the stream (docs/POLLING.md).
             SELECT x.id, $1, x.event_id, x.endpoint_id, x.subscription_id, x.direction,
                    $9, $2,
                    coalesce((SELECT e.transport = 'poller' FROM endpoints e
                              WHERE e.id = x.endpoint_id), false)
             FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
                  WITH ORDINALITY AS x(id, event_id, endpoint_id, subscription_id, direction,
                                       filter, n)
             WHERE x.filter IS NULL
                OR coalesce((SELECT v.payload @@ x.filter::jsonpath FROM events v
                             WHERE v.id = x.event_id LIMIT 1), false)
             ORDER BY x.n
             RETURNING id, endpoint_id
         ), announced AS (
             INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
             SELECT d.id, d.endpoint_id, $1, 'REPLAY' FROM d ORDER BY d.id
         )
         SELECT count(*) AS "written!" FROM d"#,
        project_id,
        replay_id,
        &plan.ids,
        &plan.event_ids,
        &plan.endpoint_ids,
        &plan.subscription_ids as &[Option<String>],
        &plan.directions as &[&str],
        &plan.filters as &[Option<String>],
        DeliveryOrigin::Replay.as_str()
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(written)
}
