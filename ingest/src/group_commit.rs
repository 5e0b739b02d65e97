//! Group commit: single-Event requests that arrive while the ingest's writers are busy share
//! one ingest statement.
//!
//! At 1,000 Events/s the per-statement cost dominates what Postgres spends on an Event: the
//! executor's start (a lock on every partition and index the statement may touch, memory
//! contexts, expression set-up), the round trip and the commit's WAL flush, each paid once
//! per `POST /v1/events` (docs/BENCHMARKS-HISTORY.md, "Group commit"). `railhook_ingest()` already
//! takes arrays, so requests that wait at the same moment can be written by one call.
//!
//! ```text
//!   request ─▶ queue ─▶ [a free writer takes everything queued, up to MAX_GROUP_EVENTS]
//!                         one railhook_ingest() per project ─▶ commit ─▶ each request's answer
//! ```
//!
//! - **No added wait.** A writer never holds a group open for a timer: it takes what is
//!   queued when it becomes free. With a writer free, a request is written at once and
//!   alone, as before; groups form only when every writer is busy, so they grow with the
//!   load, and so does the saving. `RAILHOOK_INGEST_WRITERS` writers run at once (0: no
//!   group commit, every request writes on its own connection).
//! - **The guarantee is unchanged.** A request is answered only after the statement that
//!   holds its Event committed; an Event, its Deliveries and their Outbox rows are still in
//!   one statement, so they commit together. A request whose group failed never gets the
//!   group's error.
//! - **One request cannot fail another.** A group whose statement fails (a subscription
//!   deleted meanwhile, a lost connection) is written again one request at one statement,
//!   with the same ids: each request gets its own result, and a group that did commit before
//!   its answer was lost inserts nothing twice (the ids are the primary keys).
//! - **A lost answer is not a failure** (review #34 item 5). A statement whose connection
//!   died after it committed reports an error although its Events exist. Before any
//!   request is answered with an error, its own ids are looked up ([`committed`]): found,
//!   the statement committed (it is atomic) and the request is answered 201 with them. So
//!   the fallback above, which meets its own Events as duplicate keys, answers 201 too.
//! - **A request whose caller is gone is not written.** A request that timed out at the API
//!   (or whose client hung up) while it waited in the queue is dropped from its group before
//!   the statement, so no Event is created for an answer nobody will read. Once its
//!   statement has started it can no longer be taken out: then the caller was told 503
//!   (`ingest/src/lib.rs`, the request timeout), whose problem tells it to retry with its
//!   Idempotency-Key.
//! - Idempotency-Keys keep their meaning: two requests in one group with the same key are
//!   ordered by the function (the first inserts, the second is skipped and answered with the
//!   first's Event), exactly as when they race on two connections.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use railhook_common::db::{ANSWER_WITHIN, answered};
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::accept::IDEMPOTENCY_WINDOW_HOURS;
use crate::metrics::IngestMetrics;
use crate::plan::DeliveryPlan;
use crate::plan::filtered::{MAX_CANDIDATES, filtered_delivery_id};

/// The most Events one group statement carries. Past a few dozen the statement's fixed cost
/// is already spread thin, and a larger group only makes its members wait for each other.
pub const MAX_GROUP_EVENTS: usize = 64;

/// Requests waiting for a writer; past this a request waits to enter the queue (the HTTP
/// layer's timeout bounds that wait).
const QUEUE: usize = 4_096;

/// What a statement wrote: the Events it inserted, with the time each committed, and the
/// filtered candidates it wrote (by 0-based position in the plan) with their Delivery ids.
#[derive(Debug, Default, Clone)]
pub(crate) struct Inserted {
    pub events: HashMap<String, DateTime<Utc>>,
    pub passed: HashMap<usize, String>,
}

impl Inserted {
    pub(crate) fn contains_key(&self, event_id: &str) -> bool {
        self.events.contains_key(event_id)
    }

    pub(crate) fn get(&self, event_id: &str) -> Option<&DateTime<Utc>> {
        self.events.get(event_id)
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// What one ingest statement writes, as the parallel columns `railhook_ingest()` takes:
/// Events (id, type, payload, key, trace context) and the planned Deliveries.
#[derive(Default)]
pub(crate) struct Rows {
    pub ids: Vec<String>,
    pub types: Vec<String>,
    pub payloads: Vec<String>,
    pub keys: Vec<Option<String>>,
    pub traceparents: Vec<Option<String>>,
    pub tracestates: Vec<Option<String>>,
    pub applications: Vec<Option<String>>,
    /// Each Event's channels joined by commas (a channel holds none), as the function takes.
    pub channels: Vec<Option<String>>,
    pub event_uids: Vec<Option<String>>,
    pub plan: DeliveryPlan,
}

impl Rows {
    fn append(&mut self, other: &Rows) {
        self.ids.extend_from_slice(&other.ids);
        self.types.extend_from_slice(&other.types);
        self.payloads.extend_from_slice(&other.payloads);
        self.keys.extend_from_slice(&other.keys);
        self.traceparents.extend_from_slice(&other.traceparents);
        self.tracestates.extend_from_slice(&other.tracestates);
        self.applications.extend_from_slice(&other.applications);
        self.channels.extend_from_slice(&other.channels);
        self.event_uids.extend_from_slice(&other.event_uids);
        self.plan.append(&other.plan);
    }
}

/// Whether a statement that names its snapshot's stored filter tables sends their texts too
/// (migration 20261206000028).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableTexts {
    /// Only until a statement of the snapshot has found or stored the row.
    UntilStored,
    /// Always: for a statement that cannot be retried alone (a batch's, inside its
    /// transaction), and for the retry after Postgres did not find the row.
    Always,
}

/// The SQLSTATE of a statement that named stored filter tables without their texts and
/// found none (migration 20261206000028): it wrote nothing.
const TABLES_NOT_STORED: &str = "RH001";

fn tables_not_stored(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some(TABLES_NOT_STORED))
}

/// The one ingest statement (migrations/…_ingest_function.sql, with the trace context:
/// …_trace_context.sql, the audience: …_applications.sql, and the filters:
/// …_filter_tables.sql): it takes the keys' locks and then inserts the Events whose key
/// holds no Event of the window, their Deliveries and one Outbox row each, in one round
/// trip. A single statement is atomic on its own, so it needs no BEGIN/COMMIT. Rows with
/// neither an Idempotency-Key nor a filtered candidate (most requests) take the same
/// inserts without the function ([`insert_plain`]).
pub(crate) async fn insert_rows(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    rows: &Rows,
    texts: TableTexts,
) -> Result<Inserted, sqlx::Error> {
    let plan = &rows.plan;
    if plan.filtered.len() >= MAX_CANDIDATES {
        return Err(sqlx::Error::Protocol(
            "more filtered candidates than one statement numbers".into(),
        ));
    }
    if plan.filtered.len() == 0 && rows.keys.iter().all(Option::is_none) {
        insert_plain(db, project, rows).await
    } else {
        insert_through_function(db, project, rows, texts).await
    }
}

/// [`insert_rows`] through `railhook_ingest()`: Idempotency-Keys, payload filters.
async fn insert_through_function(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    rows: &Rows,
    texts: TableTexts,
) -> Result<Inserted, sqlx::Error> {
    let plan = &rows.plan;
    let filtered = plan.filtered.columns();
    let seal = filtered.tables.and_then(|t| t.sealed());
    let with_texts = filtered
        .tables
        .filter(|_| texts == TableTexts::Always || seal.is_some_and(|s| !s.is_stored()));
    let found = sqlx::query!(
        r#"SELECT id AS "id!", created_at AS "created_at!", passed
           FROM railhook_ingest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                $14, $15, $16, $17, $18, $19, $20, $21, $22, $23,
                                $24, $25, $26, $27, $28)"#,
        project,
        &rows.ids,
        &rows.types,
        &rows.payloads,
        &rows.keys as &[Option<String>],
        &plan.ids,
        &plan.event_ids,
        &plan.endpoint_ids,
        &plan.subscription_ids,
        &plan.ordered,
        IDEMPOTENCY_WINDOW_HOURS,
        &rows.traceparents as &[Option<String>],
        &rows.tracestates as &[Option<String>],
        &rows.applications as &[Option<String>],
        &rows.channels as &[Option<String>],
        &rows.event_uids as &[Option<String>],
        &filtered.filters as &[&str],
        &filtered.route_endpoints as &[&str],
        &filtered.route_subscriptions as &[&str],
        &filtered.route_ordered,
        &plan.filtered.events,
        &filtered.filter_of,
        &filtered.route_of,
        seal.map(|s| &s.digest[..]),
        with_texts.map(|t| &t.filters[..]),
        with_texts.map(|t| &t.route_endpoints[..]),
        with_texts.map(|t| &t.route_subscriptions[..]),
        with_texts.map(|t| &t.route_ordered[..])
    )
    .fetch_all(db)
    .await?;
    // Found or stored: the snapshot's later statements send the digest alone. (A row gone
    // after this is met by RH001, and `insert_or_find` sends that statement's texts.)
    if let Some(seal) = seal {
        seal.mark_stored();
    }
    let mut inserted = Inserted::default();
    for r in found {
        for n in r.passed.unwrap_or_default() {
            let n = n as usize;
            inserted
                .passed
                .insert(n - 1, filtered_delivery_id(&r.id, n));
        }
        inserted.events.insert(r.id, r.created_at);
    }
    Ok(inserted)
}

/// The ingest statement of the common case, sent as it is: no Idempotency-Key (so no lock
/// to take first, and no Event of the window to look for) and no payload filter (so every
/// planned Delivery is written). What `railhook_ingest()` does for such rows, without the
/// function: its call (a PL/pgSQL frame, and an inner statement whose filter and key parts
/// the executor sets up even when they have nothing to do) cost 0.58 ms a statement against
/// 0.36 ms for this one, single-Event, measured with pgbench (docs/BENCHMARKS.md, issue #54).
/// Still one statement: the Events, their Deliveries and one Outbox row each commit together
/// or not at all. A repeated id (a group written again after its answer was lost) fails on
/// the primary key, as the function's insert does, and `insert_or_find` looks the ids up.
async fn insert_plain(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    rows: &Rows,
) -> Result<Inserted, sqlx::Error> {
    let plan = &rows.plan;
    let found = sqlx::query!(
        r#"WITH ev AS (
               INSERT INTO events (id, project_id, event_type, payload, traceparent,
                                   tracestate, application_id, channels, event_uid)
               SELECT x.id, $1, x.event_type, x.payload::jsonb, x.tp, x.ts, x.app,
                      string_to_array(x.ch, ','), x.uid
               FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                           $7::text[], $8::text[], $9::text[])
                    WITH ORDINALITY AS x(id, event_type, payload, tp, ts, app, ch, uid, n)
               ORDER BY x.n
               RETURNING events.id, events.created_at, events.traceparent
           ), d AS (
               INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id,
                                       ordered)
               SELECT u.id, $1, u.event_id, u.endpoint_id, u.subscription_id, u.ordered
               FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::boolean[])
                    WITH ORDINALITY AS u(id, event_id, endpoint_id, subscription_id, ordered, n)
               ORDER BY u.n
               RETURNING deliveries.id, deliveries.endpoint_id, deliveries.event_id
           ), announced AS (
               INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason, traceparent)
               SELECT d.id, d.endpoint_id, $1, 'CREATED', ev.traceparent
               FROM d JOIN ev ON ev.id = d.event_id ORDER BY d.id
           )
           SELECT ev.id AS "id!", ev.created_at AS "created_at!" FROM ev"#,
        project,
        &rows.ids,
        &rows.types,
        &rows.payloads,
        &rows.traceparents as &[Option<String>],
        &rows.tracestates as &[Option<String>],
        &rows.applications as &[Option<String>],
        &rows.channels as &[Option<String>],
        &rows.event_uids as &[Option<String>],
        &plan.ids,
        &plan.event_ids,
        &plan.endpoint_ids,
        &plan.subscription_ids,
        &plan.ordered
    )
    .fetch_all(db)
    .await?;
    Ok(Inserted {
        events: found.into_iter().map(|r| (r.id, r.created_at)).collect(),
        passed: HashMap::new(),
    })
}

/// Opens the pool's connections ahead and runs the ingest statement once on each with
/// nothing to write (common/src/db.rs, `open_ahead`): the first call of `railhook_ingest()`
/// in a backend compiles the function and plans each of its statements, which a cold ingest
/// otherwise paid inside its first second of traffic (issue #35: the first second's
/// POST → 201 p99 at 600/s was 50–70 ms, against 15 later).
pub async fn warm(pool: &PgPool) {
    railhook_common::db::open_ahead(pool, "ingest", |mut c| async move {
        insert_rows(&mut *c, "", &Rows::default(), TableTexts::Always)
            .await
            .map(|_| ())
    })
    .await;
}

/// Writes `rows` as [`insert_rows`] does, and tells a statement that committed from one
/// that did not when its answer is lost: on an error, the rows' own Event ids are looked up,
/// and any found means the statement committed (it is one atomic statement, and the ids are
/// this request's own, fresh ULIDs). A lookup that fails too leaves the first error.
async fn insert_or_find(
    pool: &PgPool,
    faults: &AnswerFault,
    metrics: &IngestMetrics,
    project: &str,
    rows: &Rows,
) -> Result<Inserted, sqlx::Error> {
    // Each wait has its deadline (db::answered): a primary that froze must not hold this
    // writer, and every request queued behind it, past the failover.
    let written = if faults.take() {
        insert_and_lose_answer(pool, project, rows).await
    } else {
        let insert = |texts| {
            answered(
                ANSWER_WITHIN,
                "an Event insert",
                insert_rows(pool, project, rows, texts),
            )
        };
        match insert(TableTexts::UntilStored).await {
            // The row was gone (written nothing): again, with the texts to store it.
            Err(e) if tables_not_stored(&e) => {
                metrics.filter_tables_resent.inc();
                insert(TableTexts::Always).await
            }
            other => other,
        }
    };
    match written {
        Ok(inserted) => Ok(inserted),
        Err(e) => match answered(
            ANSWER_WITHIN,
            "an Event lookup",
            committed(pool, &rows.ids, &rows.plan),
        )
        .await
        {
            Ok(found) if !found.is_empty() => {
                tracing::warn!(
                    events = found.len(),
                    kind = crate::problem::database_error_kind(&e),
                    "an ingest statement's answer was lost after it committed; its Events were found"
                );
                Ok(found)
            }
            _ => Err(e),
        },
    }
}

/// Which of `ids` are stored, with their commit times, and which of the filtered candidates
/// of `plan` (the statement's own) were written. The ids carry their day, so the range
/// bounds let Postgres open only the day partitions they fall in.
pub(crate) async fn committed(
    pool: &PgPool,
    ids: &[String],
    plan: &DeliveryPlan,
) -> Result<Inserted, sqlx::Error> {
    let (lowest, highest) = railhook_common::ids::id_range(ids);
    let rows = sqlx::query!(
        r#"SELECT id, created_at FROM events
           WHERE id = ANY($1) AND id BETWEEN $2 AND $3"#,
        ids,
        lowest,
        highest
    )
    .fetch_all(pool)
    .await?;
    let mut inserted = Inserted {
        events: rows.into_iter().map(|r| (r.id, r.created_at)).collect(),
        passed: HashMap::new(),
    };
    // The id each candidate of an inserted Event would have been written with.
    let candidates: HashMap<String, usize> = plan
        .spans
        .iter()
        .filter(|span| inserted.contains_key(&span.event_id))
        .flat_map(|span| {
            span.filtered
                .clone()
                .map(|c| (filtered_delivery_id(&span.event_id, c + 1), c))
        })
        .collect();
    if !candidates.is_empty() {
        let wanted: Vec<String> = candidates.keys().cloned().collect();
        let (lowest, highest) = railhook_common::ids::id_range(&wanted);
        let stored = sqlx::query_scalar!(
            "SELECT id FROM deliveries WHERE id = ANY($1) AND id BETWEEN $2 AND $3",
            &wanted,
            lowest,
            highest
        )
        .fetch_all(pool)
        .await?;
        inserted.passed = stored
            .into_iter()
            .filter_map(|id| Some((*candidates.get(&id)?, id)))
            .collect();
    }
    Ok(inserted)
}

/// The test seam for a lost answer: armed, the next statement runs and commits on a
/// connection of its own, which then ends itself (`pg_terminate_backend`) before the answer
/// is used, so the writer sees the error a client sees when the connection dies right after
/// COMMIT. Off unless a test arms it.
#[derive(Default)]
pub struct AnswerFault(std::sync::atomic::AtomicBool);

impl AnswerFault {
    pub fn arm(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

async fn insert_and_lose_answer(
    pool: &PgPool,
    project: &str,
    rows: &Rows,
) -> Result<Inserted, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    insert_rows(&mut *conn, project, rows, TableTexts::Always).await?;
    // Ends this very connection: the statement fails (or, in a race, answers) here.
    let _ = sqlx::query_scalar!(r#"SELECT pg_terminate_backend(pg_backend_pid()) AS "ended!""#)
        .fetch_one(&mut *conn)
        .await;
    conn.close_on_drop();
    Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()))
}

/// One request waiting for a writer.
struct Job {
    project: String,
    rows: Rows,
    reply: oneshot::Sender<Result<Inserted, sqlx::Error>>,
}

/// The ingest's writers for single-Event requests. Cloned into every handler's state; the
/// queue's task starts with the first request (inside the runtime).
#[derive(Clone)]
pub struct GroupCommit {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    writers: usize,
    metrics: IngestMetrics,
    queue: OnceLock<mpsc::Sender<Job>>,
    faults: Arc<AnswerFault>,
}

impl GroupCommit {
    /// `writers`: statements in flight at once; 0 turns group commit off.
    pub fn new(pool: PgPool, writers: usize, metrics: IngestMetrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                writers,
                metrics,
                queue: OnceLock::new(),
                faults: Arc::default(),
            }),
        }
    }

    /// The lost-answer test seam ([`AnswerFault`]).
    pub fn answer_fault(&self) -> &AnswerFault {
        &self.inner.faults
    }

    /// Writes `rows` for `project`, alone or with whatever else is waiting, and returns the
    /// Events it inserted once their statement committed.
    pub(crate) async fn insert(&self, project: &str, rows: Rows) -> Result<Inserted, sqlx::Error> {
        let inner = &self.inner;
        if inner.writers == 0 {
            inner.metrics.group_events.observe(rows.ids.len() as f64);
            return insert_or_find(&inner.pool, &inner.faults, &inner.metrics, project, &rows)
                .await;
        }
        let queue = inner.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(drain(inner.clone_parts(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let job = Job {
            project: project.to_owned(),
            rows,
            reply,
        };
        inner.metrics.group_waiting.inc();
        match queue.send(job).await {
            Ok(()) => match answer.await {
                Ok(result) => result,
                // The writer's task ended without answering (it cannot, short of a panic):
                // nothing is known to be written, and the client may retry.
                Err(_) => Err(sqlx::Error::WorkerCrashed),
            },
            // The queue's task is gone: write this request on its own.
            Err(mpsc::error::SendError(job)) => {
                inner.metrics.group_waiting.dec();
                insert_or_find(
                    &inner.pool,
                    &inner.faults,
                    &inner.metrics,
                    project,
                    &job.rows,
                )
                .await
            }
        }
    }
}

impl Inner {
    fn clone_parts(&self) -> Parts {
        Parts {
            pool: self.pool.clone(),
            writers: Arc::new(Semaphore::new(self.writers)),
            metrics: self.metrics.clone(),
            faults: self.faults.clone(),
        }
    }
}

/// What the queue's task needs.
struct Parts {
    pool: PgPool,
    writers: Arc<Semaphore>,
    metrics: IngestMetrics,
    faults: Arc<AnswerFault>,
}

/// The queue's task: each time a writer is free, takes everything queued (up to
/// [`MAX_GROUP_EVENTS`]) and writes it.
async fn drain(parts: Parts, mut rx: mpsc::Receiver<Job>) {
    loop {
        let Ok(permit) = parts.writers.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut events = first.rows.ids.len();
        let mut jobs = vec![first];
        while events < MAX_GROUP_EVENTS {
            match rx.try_recv() {
                Ok(job) => {
                    events += job.rows.ids.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        parts.metrics.group_waiting.sub(jobs.len() as i64);
        let writer = Writer {
            pool: parts.pool.clone(),
            metrics: parts.metrics.clone(),
            faults: parts.faults.clone(),
        };
        tokio::spawn(async move {
            writer.write_groups(jobs).await;
            drop(permit);
        });
    }
}

/// What a writer task writes with.
struct Writer {
    pool: PgPool,
    metrics: IngestMetrics,
    faults: Arc<AnswerFault>,
}

impl Writer {
    /// One statement per project among `jobs` (a project's Events are written under its
    /// id). Requests whose caller has gone (timed out at the API, or hung up) are left out.
    async fn write_groups(&self, jobs: Vec<Job>) {
        let mut by_project: Vec<(String, Vec<Job>)> = Vec::new();
        for job in jobs {
            if job.reply.is_closed() {
                self.metrics.group_abandoned.inc();
                continue;
            }
            match by_project.iter_mut().find(|(p, _)| *p == job.project) {
                Some((_, group)) => group.push(job),
                None => by_project.push((job.project.clone(), vec![job])),
            }
        }
        for (project, group) in by_project {
            self.write_group(&project, group).await;
        }
    }

    /// Each request in its own statement, with its own result.
    async fn write_each(&self, project: &str, jobs: Vec<Job>) {
        for job in jobs {
            if job.reply.is_closed() {
                self.metrics.group_abandoned.inc();
                continue;
            }
            self.metrics.group_events.observe(job.rows.ids.len() as f64);
            let result =
                insert_or_find(&self.pool, &self.faults, &self.metrics, project, &job.rows).await;
            let _ = job.reply.send(result);
        }
    }

    async fn write_group(&self, project: &str, group: Vec<Job>) {
        if group.len() == 1 {
            return self.write_each(project, group).await;
        }
        let mut all = Rows::default();
        let mut offsets = Vec::with_capacity(group.len());
        for job in &group {
            offsets.push(all.plan.filtered.len());
            all.append(&job.rows);
        }
        self.metrics.group_events.observe(all.ids.len() as f64);
        match insert_or_find(&self.pool, &self.faults, &self.metrics, project, &all).await {
            Ok(inserted) => {
                for (job, offset) in group.into_iter().zip(offsets) {
                    let candidates = offset..offset + job.rows.plan.filtered.len();
                    let mine = Inserted {
                        events: job
                            .rows
                            .ids
                            .iter()
                            .filter_map(|id| inserted.get(id).map(|at| (id.clone(), *at)))
                            .collect(),
                        passed: inserted
                            .passed
                            .iter()
                            .filter(|(c, _)| candidates.contains(*c))
                            .map(|(c, id)| (c - offset, id.clone()))
                            .collect(),
                    };
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                // Not the group's error for anyone: each request is written on its own, with
                // the same ids, and gets its own result.
                // No database text in the log: the SQLSTATE or the kind of failure only.
                let sqlstate = match &e {
                    sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
                    _ => None,
                };
                tracing::warn!(
                    requests = group.len(),
                    sqlstate = sqlstate.as_deref().unwrap_or(""),
                    kind = crate::problem::database_error_kind(&e),
                    "a group ingest statement failed; writing its requests one by one"
                );
                self.metrics.group_retried.inc();
                self.write_each(project, group).await;
            }
        }
    }
}
