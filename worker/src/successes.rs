//! Group writes of successful outcomes: Attempts that delivered, finishing while the
//! worker's outcome writers are busy, are written by one statement.
//!
//! A success is the common outcome and the simplest one: the Delivery ends SUCCEEDED, its
//! Attempt row is written, the endpoint's failure streak (if it had one) resets, and
//! `message.attempt.recovered` is emitted where a failing Delivery recovered. Nothing else:
//! no retry, no disable, no ordering release (an ordered Delivery resolves under its
//! endpoint's lock, resolution.rs, and never comes here). At 1,000 Events/s the outcome's
//! statement was the worker's largest cost in Postgres, most of it the statement's fixed
//! start (docs/BENCHMARKS-HISTORY.md, "Group commit"), so successes that wait at the same moment
//! share it.
//!
//! - **No added wait before the receiver.** The receiver has its answer before any of this
//!   starts; a writer takes what is queued when it becomes free, without a timer.
//! - **The Fence is per row.** Each row is updated only where it still carries the token of
//!   the Claim that made its Attempt; each caller learns whether its own write landed.
//! - **Invariant 6 holds per row.** Every success in the group leaves its Attempt row in the
//!   same statement, `fenced` where its update matched nothing.
//! - **One row cannot fail another.** A group whose statement fails is written again one
//!   outcome at a time through `fence::finalise`, and each caller gets its own result.
//! - A Delivery appears at most once in a group (a second outcome for it waits for the
//!   next), so the Attempt numbers read from the snapshot cannot collide.

use std::sync::{Arc, OnceLock};

use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::attempt::Report;
use crate::claim::Claimed;
use crate::fence::{self, StreakPolicy};
use crate::metrics::WorkerMetrics;
use crate::retry_policy::Decision;

/// The most outcomes one statement writes.
pub const MAX_GROUP: usize = 64;

const QUEUE: usize = 4_096;

/// One success waiting for a writer, with what the fallback needs to write it alone.
struct Job {
    outcome: (Claimed, Report),
    reply: oneshot::Sender<Result<bool, sqlx::Error>>,
}

/// The worker's writers of successful outcomes.
#[derive(Clone)]
pub(crate) struct Successes {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    writers: usize,
    streak: StreakPolicy,
    metrics: WorkerMetrics,
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl Successes {
    /// `writers`: statements in flight at once; 0: every success is written on its own.
    pub(crate) fn new(
        pool: PgPool,
        writers: usize,
        streak: StreakPolicy,
        metrics: WorkerMetrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                writers,
                streak,
                metrics,
                queue: OnceLock::new(),
            }),
        }
    }

    /// Whether this outcome is one the group statement writes: a request that went out and
    /// delivered, on a Delivery that is not ordered.
    pub(crate) fn takes(&self, claimed: &Claimed, report: &Report, decision: &Decision) -> bool {
        self.inner.writers > 0
            && !claimed.ordered
            && report.sent
            && *decision == Decision::Succeeded
            && matches!(report.outcome, crate::attempt::Outcome::Delivered)
    }

    /// Writes the success behind the Fence, alone or with the others waiting; `true` if the
    /// Fence let it through.
    pub(crate) async fn write(&self, claimed: &Claimed, report: &Report) -> sqlx::Result<bool> {
        let inner = &self.inner;
        let queue = inner.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(drain(
                inner.pool.clone(),
                Arc::new(Semaphore::new(inner.writers)),
                inner.streak,
                inner.metrics.clone(),
                rx,
            ));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let job = Job {
            outcome: (claimed.clone(), report.clone()),
            reply,
        };
        match queue.send(job).await {
            Ok(()) => answer.await.unwrap_or(Err(sqlx::Error::WorkerCrashed)),
            Err(mpsc::error::SendError(job)) => {
                let (claimed, report) = &job.outcome;
                write_alone(&inner.pool, &inner.streak, claimed, report).await
            }
        }
    }
}

async fn write_alone(
    pool: &PgPool,
    streak: &StreakPolicy,
    claimed: &Claimed,
    report: &Report,
) -> sqlx::Result<bool> {
    let write = fence::finalise(pool, claimed, report, &Decision::Succeeded, streak);
    railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "an outcome write",
        write,
    )
    .await
    .map(|done| done.wrote)
}

/// Each time a writer is free, takes what is queued (up to [`MAX_GROUP`], each Delivery at
/// most once) and writes it.
async fn drain(
    pool: PgPool,
    writers: Arc<Semaphore>,
    streak: StreakPolicy,
    metrics: WorkerMetrics,
    mut rx: mpsc::Receiver<Job>,
) {
    let mut carried: Option<Job> = None;
    loop {
        let Ok(permit) = writers.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) if group.iter().any(|j| j.outcome.0.id == job.outcome.0.id) => {
                    carried = Some(job);
                    break;
                }
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let (pool, metrics) = (pool.clone(), metrics.clone());
        tokio::spawn(async move {
            write_group(&pool, &streak, &metrics, group).await;
            drop(permit);
        });
    }
}

async fn write_group(
    pool: &PgPool,
    streak: &StreakPolicy,
    metrics: &WorkerMetrics,
    group: Vec<Job>,
) {
    metrics.success_group.observe(group.len() as f64);
    if group.len() == 1 {
        return write_each(pool, streak, group).await;
    }
    let outcomes = group.iter().map(|j| (&j.outcome.0, &j.outcome.1));
    let write = write_successes(pool, streak, outcomes);
    match railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "a group of outcomes",
        write,
    )
    .await
    {
        Ok(wrote) => {
            for job in group {
                let _ = job.reply.send(Ok(wrote.contains(&job.outcome.0.id)));
            }
        }
        Err(e) => {
            tracing::warn!(outcomes = group.len(), error = %e,
                "a group outcome statement failed; writing its outcomes one by one");
            metrics.success_group_retried.inc();
            write_each(pool, streak, group).await;
        }
    }
}

/// Each outcome through `fence::finalise` on its own, with its own result.
async fn write_each(pool: &PgPool, streak: &StreakPolicy, jobs: Vec<Job>) {
    for job in jobs {
        let (claimed, report) = &job.outcome;
        let result = write_alone(pool, streak, claimed, report).await;
        let _ = job.reply.send(result);
    }
}

/// The success write, the one statement that spells it: for N claimed Deliveries whose
/// requests delivered (a group here, one from `fence::finalise`). Returns the ids whose
/// update the Fence let through; the others' Attempts are written `fenced`.
pub async fn write_successes<'a>(
    db: impl sqlx::PgExecutor<'_>,
    streak: &StreakPolicy,
    outcomes: impl IntoIterator<Item = (&'a Claimed, &'a Report)>,
) -> sqlx::Result<Vec<String>> {
    let (mut ids, mut tokens, mut endpoints) = (Vec::new(), Vec::new(), Vec::new());
    let mut requests: Vec<Option<String>> = Vec::new();
    let (mut started, mut finished, mut codes, mut millis, mut errors, mut excerpts) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for (c, r) in outcomes {
        ids.push(c.id.clone());
        tokens.push(c.token);
        endpoints.push(c.endpoint_id.clone());
        started.push(r.started_at);
        finished.push(r.started_at + chrono::Duration::from_std(r.duration).unwrap_or_default());
        codes.push(r.status.map(i32::from));
        millis.push(r.duration.as_millis().min(i32::MAX as u128) as i32);
        errors.push(r.error.map(|e| e.as_str().to_owned()));
        excerpts.push(r.excerpt.clone());
        requests.push(r.request.clone());
    }
    // The range lets the executor leave out the partitions no id of the group is in
    // (common/src/ids.rs, `id_range`).
    let (lowest, highest) = crate::claim::id_range(&ids);
    // The fenced update; the failure streak reset on endpoints that had one (a healthy
    // endpoint's row is never touched, so workers delivering to one busy endpoint do not
    // queue on its row lock); `message.attempt.recovered` for a Delivery that had been
    // reported failing; every Attempt row, fenced where its update matched nothing.
    let rows = sqlx::query_scalar!(
        r#"WITH w AS (
               SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::timestamptz[],
                                    $5::timestamptz[], $6::int4[], $7::int4[], $8::text[],
                                    $9::text[], $13::text[])
                   AS w(id, token, endpoint_id, started_at, finished_at, status_code,
                        duration_ms, error_class, excerpt, request)
           ), upd AS (
               UPDATE deliveries d
               SET status = 'SUCCEEDED', claim_token = NULL, attempt_count = d.attempt_count + 1,
                   next_retry_at = NULL, failure_reason = NULL,
                   last_status_code = coalesce(w.status_code, d.last_status_code),
                   updated_at = now(), version = d.version + 1
               FROM w
               WHERE d.id = w.id AND d.claim_token = w.token AND d.id BETWEEN $11 AND $12
               RETURNING d.id, d.project_id, d.event_id, d.endpoint_id, d.attempt_count
           ), health AS (
               UPDATE endpoints e
               SET consecutive_failures = 0, failing_since = NULL, updated_at = now()
               WHERE e.id IN (SELECT u.endpoint_id FROM upd u) AND e.consecutive_failures > 0
               RETURNING e.id
           ), ops AS (
               SELECT railhook_emit_operational(u.project_id, 'message.attempt.recovered',
                   jsonb_build_object(
                       'endpoint_id', u.endpoint_id, 'event_id', u.event_id, 'delivery_id', u.id,
                       'attempt_count', u.attempt_count,
                       'last_attempt', jsonb_build_object('status_code', w.status_code,
                           'finished_at', w.finished_at, 'duration_ms', w.duration_ms,
                           'error', w.error_class))) AS n
               FROM upd u
               JOIN w ON w.id = u.id
               JOIN endpoints ep ON ep.id = u.endpoint_id AND ep.kind = 'webhook'
               WHERE u.attempt_count > $10
           ), attempt AS (
               INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at,
                                     status_code, outcome, duration_ms, error_class,
                                     response_excerpt, fenced, request)
               SELECT w.id,
                      (SELECT coalesce(max(a.attempt_number), 0) + 1 FROM attempts a
                       WHERE a.delivery_id = w.id AND a.delivery_id BETWEEN $11 AND $12),
                      w.started_at, w.finished_at, w.status_code, 'SUCCEEDED', w.duration_ms,
                      w.error_class,
                      -- As finalise: an Attempt fenced out by an expunge keeps no excerpt.
                      CASE WHEN w.id NOT IN (SELECT u.id FROM upd u)
                                AND EXISTS (SELECT 1 FROM deliveries x
                                            WHERE x.id = w.id AND x.id BETWEEN $11 AND $12
                                              AND x.failure_reason = 'payload_expunged')
                           THEN NULL ELSE w.excerpt END,
                      w.id NOT IN (SELECT u.id FROM upd u),
                      w.request::jsonb
               FROM w
               RETURNING id
           )
           -- `ops` is a plain SELECT: it runs only if read (the two writes above always run).
           SELECT u.id AS "id!" FROM upd u CROSS JOIN (SELECT count(*) FROM ops) AS emitted"#,
        &ids,
        &tokens,
        &endpoints,
        &started,
        &finished,
        &codes as &[Option<i32>],
        &millis,
        &errors as &[Option<String>],
        &excerpts as &[Option<String>],
        i32::try_from(streak.failing_after).unwrap_or(i32::MAX),
        lowest,
        highest,
        &requests as &[Option<String>]
    )
    .fetch_all(db)
    .await?;
    Ok(rows)
}
