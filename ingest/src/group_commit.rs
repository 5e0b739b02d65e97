//! Group commit: single-Event requests that arrive while the ingest's writers are busy share
//! one ingest statement.
//!
//! At 1,000 Events/s the per-statement cost dominates what Postgres spends on an Event: the
//! executor's start (a lock on every partition and index the statement may touch, memory
//! contexts, expression set-up), the round trip and the commit's WAL flush, each paid once
//! per `POST /v1/events` (docs/BENCHMARKS.md, "Group commit"). `railhook_ingest()` already
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
//! - Idempotency-Keys keep their meaning: two requests in one group with the same key are
//!   ordered by the function (the first inserts, the second is skipped and answered with the
//!   first's Event), exactly as when they race on two connections.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::ingest::{DeliveryPlan, IDEMPOTENCY_WINDOW_HOURS};
use crate::metrics::IngestMetrics;

/// The most Events one group statement carries. Past a few dozen the statement's fixed cost
/// is already spread thin, and a larger group only makes its members wait for each other.
pub const MAX_GROUP_EVENTS: usize = 64;

/// Requests waiting for a writer; past this a request waits to enter the queue (the HTTP
/// layer's timeout bounds that wait).
const QUEUE: usize = 4_096;

/// Event ids with the time their Event committed, for the Events a statement inserted.
pub(crate) type Inserted = HashMap<String, DateTime<Utc>>;

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
        self.plan.append(&other.plan);
    }
}

/// The one ingest statement (migrations/…_ingest_function.sql, with the trace context:
/// …_trace_context.sql): it takes the keys' locks and then inserts the Events whose key
/// holds no Event of the window, their Deliveries and one Outbox row each, in one round
/// trip. A single statement is atomic on its own, so it needs no BEGIN/COMMIT.
pub(crate) async fn insert_rows(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    rows: &Rows,
) -> Result<Inserted, sqlx::Error> {
    let plan = &rows.plan;
    let found = sqlx::query!(
        r#"SELECT id AS "id!", created_at AS "created_at!"
           FROM railhook_ingest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"#,
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
        &rows.tracestates as &[Option<String>]
    )
    .fetch_all(db)
    .await?;
    Ok(found.into_iter().map(|r| (r.id, r.created_at)).collect())
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
            }),
        }
    }

    /// Writes `rows` for `project`, alone or with whatever else is waiting, and returns the
    /// Events it inserted once their statement committed.
    pub(crate) async fn insert(&self, project: &str, rows: Rows) -> Result<Inserted, sqlx::Error> {
        let inner = &self.inner;
        if inner.writers == 0 {
            inner.metrics.group_events.observe(rows.ids.len() as f64);
            return insert_rows(&inner.pool, project, &rows).await;
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
                insert_rows(&inner.pool, project, &job.rows).await
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
        }
    }
}

/// What the queue's task needs.
struct Parts {
    pool: PgPool,
    writers: Arc<Semaphore>,
    metrics: IngestMetrics,
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
        let pool = parts.pool.clone();
        let metrics = parts.metrics.clone();
        tokio::spawn(async move {
            write_groups(&pool, &metrics, jobs).await;
            drop(permit);
        });
    }
}

/// One statement per project among `jobs` (a project's Events are written under its id).
async fn write_groups(pool: &PgPool, metrics: &IngestMetrics, jobs: Vec<Job>) {
    let mut by_project: Vec<(String, Vec<Job>)> = Vec::new();
    for job in jobs {
        match by_project.iter_mut().find(|(p, _)| *p == job.project) {
            Some((_, group)) => group.push(job),
            None => by_project.push((job.project.clone(), vec![job])),
        }
    }
    for (project, group) in by_project {
        write_group(pool, metrics, &project, group).await;
    }
}

/// Each request in its own statement, with its own result.
async fn write_each(pool: &PgPool, metrics: &IngestMetrics, project: &str, jobs: Vec<Job>) {
    for job in jobs {
        metrics.group_events.observe(job.rows.ids.len() as f64);
        let result = insert_rows(pool, project, &job.rows).await;
        let _ = job.reply.send(result);
    }
}

async fn write_group(pool: &PgPool, metrics: &IngestMetrics, project: &str, group: Vec<Job>) {
    if group.len() == 1 {
        return write_each(pool, metrics, project, group).await;
    }
    let mut all = Rows::default();
    for job in &group {
        all.append(&job.rows);
    }
    metrics.group_events.observe(all.ids.len() as f64);
    match insert_rows(pool, project, &all).await {
        Ok(inserted) => {
            for job in group {
                let mine: Inserted = job
                    .rows
                    .ids
                    .iter()
                    .filter_map(|id| inserted.get(id).map(|at| (id.clone(), *at)))
                    .collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            // Not the group's error for anyone: each request is written on its own, with the
            // same ids, and gets its own result.
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
            metrics.group_retried.inc();
            write_each(pool, metrics, project, group).await;
        }
    }
}
