//! The worker's writes on a claimed Delivery row (finalise, re-stamp, Deferral, give-up,
//! all behind the Fence), and the scans of the retry scheduler and the sweeps. The Claim
//! itself is claim.rs.
//!
//! A Kafka message is a hint; these statements decide. Every write that matters is
//! conditional on still owning the row (`claim_token = $token`), so a duplicate hint, a
//! redelivered retry message, or a worker that stalled past the sweep changes nothing.

use std::time::Duration;

use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::attempt::{Outcome, Report};
use crate::schedule::Decision;

// The Claim statements and what they hand back have their own home, claim.rs; the writes
// behind the Fence that follow a Claim stay here.
pub use crate::claim::{Claimed, Target, claim_batch, swap_batch};

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Delivered => "SUCCEEDED",
        Outcome::Retry { .. } => "RETRY",
        Outcome::Failed { .. } => "FAILED",
    }
}

/// What [`finalise`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalised {
    /// The Fence let the write through.
    pub wrote: bool,
    /// This outcome disabled the endpoint (a 410, or a failure streak past the policy).
    pub disabled: bool,
}

/// Invariant 3 (the Fence): writes the Decision only where the row still carries our token,
/// and says whether it wrote. The caller queues no successor (next retry, ordering release)
/// unless it did. Invariant 6: an Attempt row is written for every request that was sent,
/// fenced or not, in the same statement.
pub async fn finalise(
    db: impl PgExecutor<'_>,
    claimed: &Claimed,
    report: &Report,
    decision: &Decision,
    streak: &StreakPolicy,
) -> Result<Finalised, sqlx::Error> {
    let (status, wait, reason, disable) = match decision {
        Decision::Succeeded => ("SUCCEEDED", None, None, false),
        Decision::RetryAfter(d) => ("PENDING", Some(d.as_secs_f64()), None, false),
        Decision::Failed {
            reason,
            disable_endpoint,
        } => ("FAILED", None, Some(reason.clone()), *disable_endpoint),
    };
    let finished_at =
        report.started_at + chrono::Duration::from_std(report.duration).unwrap_or_default();
    let delivered = matches!(decision, Decision::Succeeded);
    // One statement (one round trip, one commit): the fenced update; the endpoint's failure
    // streak and the disable that only a written 410 or a streak past the policy may cause;
    // and the Attempt row, marked fenced when the update matched nothing.
    //
    // The endpoint row is written only when something changes: on a failure, or on the
    // first success after failures. A healthy endpoint's Attempts never touch it, so
    // workers delivering to one busy endpoint do not queue on its row lock.
    let row = sqlx::query!(
        r#"WITH upd AS (
               UPDATE deliveries
               SET status = $3, claim_token = NULL, attempt_count = attempt_count + $4,
                   next_retry_at = CASE WHEN $5::float8 IS NULL THEN NULL
                                        ELSE now() + make_interval(secs => $5) END,
                   failure_reason = $6, last_status_code = coalesce($11, last_status_code),
                   updated_at = now(), version = version + 1
               WHERE id = $1 AND claim_token = $2
               RETURNING id, project_id, event_id, attempt_count
           ), streak AS (
               SELECT e.id,
                      e.enabled AS was_enabled,
                      $8::bool AS gone,
                      NOT $17 AND e.enabled
                          AND coalesce(e.failing_since, now()) <= now() - make_interval(secs => $18)
                          AND e.consecutive_failures + 1 >= $19 AS worn_out
               FROM endpoints e
               WHERE e.id = $7 AND $16 AND EXISTS (SELECT 1 FROM upd)
                 AND ($8 OR NOT $17 OR e.consecutive_failures > 0)
           ), health AS (
               UPDATE endpoints e
               SET consecutive_failures = CASE WHEN $17 THEN 0 ELSE e.consecutive_failures + 1 END,
                   failing_since = CASE WHEN $17 THEN NULL ELSE coalesce(e.failing_since, now()) END,
                   enabled = e.enabled AND NOT (s.gone OR s.worn_out),
                   disabled_at = CASE WHEN e.enabled AND (s.gone OR s.worn_out) THEN now()
                                      ELSE e.disabled_at END,
                   disabled_reason = CASE
                       WHEN NOT e.enabled THEN e.disabled_reason
                       WHEN s.gone THEN 'the endpoint answered 410 Gone'
                       WHEN s.worn_out THEN 'every Attempt failed since '
                            || to_char(coalesce(e.failing_since, now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')
                            || ' (' || (e.consecutive_failures + 1) || ' in a row)'
                       ELSE e.disabled_reason END,
                   updated_at = now()
               FROM streak s
               WHERE e.id = s.id
               RETURNING e.id, s.was_enabled AND (s.gone OR s.worn_out) AS disabled,
                         e.disabled_reason, e.disabled_at
           ), ops AS (
               -- Operational webhooks, in this same statement so they exist exactly when
               -- this outcome commits (never for an operational endpoint's own Deliveries).
               SELECT railhook_emit_operational(u.project_id, t.kind, t.data) AS n
               FROM upd u
               JOIN endpoints ep ON ep.id = $7 AND ep.kind = 'webhook'
               CROSS JOIN LATERAL (VALUES
                   ('message.attempt.exhausted', $3 = 'FAILED' AND $16),
                   ('message.attempt.failing',
                    $3 = 'PENDING' AND $16 AND NOT $17 AND u.attempt_count = $20),
                   ('message.attempt.recovered', $17 AND u.attempt_count > $20),
                   ('endpoint.disabled', EXISTS (SELECT 1 FROM health h WHERE h.disabled))
               ) AS t0(kind, fire)
               CROSS JOIN LATERAL (SELECT t0.kind, CASE
                   WHEN t0.kind = 'endpoint.disabled' THEN
                       (SELECT jsonb_build_object('endpoint_id', h.id, 'reason', h.disabled_reason,
                                                  'disabled_at', h.disabled_at)
                        FROM health h)
                   ELSE jsonb_build_object(
                       'endpoint_id', $7::text, 'event_id', u.event_id, 'delivery_id', u.id,
                       'attempt_count', u.attempt_count,
                       'last_attempt', jsonb_build_object('status_code', $11::int,
                           'finished_at', $10::timestamptz, 'duration_ms', $13::int,
                           'error', $14::text))
                   END AS data) AS t
               WHERE t0.fire
           ), attempt AS (
               INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at,
                                     status_code, outcome, duration_ms, error_class,
                                     response_excerpt, fenced)
               SELECT $1,
                      (SELECT coalesce(max(attempt_number), 0) + 1 FROM attempts WHERE delivery_id = $1),
                      $9, $10, $11, $12, $13, $14, $15, NOT EXISTS (SELECT 1 FROM upd)
               WHERE $16
               RETURNING id
           )
           SELECT EXISTS (SELECT 1 FROM upd) AS "wrote!",
                  EXISTS (SELECT 1 FROM health WHERE disabled) AS "disabled!",
                  (SELECT coalesce(sum(n), 0) FROM ops)::int AS "operational!""#,
        claimed.id,
        claimed.token,
        status,
        i32::from(report.sent),
        wait,
        reason,
        claimed.endpoint_id,
        disable,
        report.started_at,
        finished_at,
        report.status.map(i32::from),
        outcome_name(&report.outcome),
        report.duration.as_millis().min(i32::MAX as u128) as i32,
        report.error.map(|e| e.as_str()),
        report.excerpt,
        report.sent,
        delivered,
        streak.disable_after.as_secs_f64(),
        i32::try_from(streak.min_failures).unwrap_or(i32::MAX),
        i32::try_from(streak.failing_after).unwrap_or(i32::MAX)
    )
    .fetch_one(db)
    .await?;
    Ok(Finalised {
        wrote: row.wrote,
        disabled: row.disabled,
    })
}

/// When a failing endpoint is disabled: after `disable_after` of nothing but failed
/// Attempts, once at least `min_failures` of them were counted.
#[derive(Debug, Clone, Copy)]
pub struct StreakPolicy {
    pub disable_after: std::time::Duration,
    pub min_failures: u32,
    /// Failed Attempts in a row after which a Delivery is reported `message.attempt.failing`.
    pub failing_after: u32,
}

/// Re-stamps a Claim through the Fence right before its request starts, when it waited
/// long enough (an ordering gate, a rate hold) that the rest of its processing window might
/// not cover the request. `false`: the sweep took the row back meanwhile (or another worker
/// owns it now), and the request must not be sent.
pub async fn restamp(pool: &PgPool, claimed: &Claimed) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE deliveries SET last_attempt_at = now()
         WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING' AND hinted_at IS NULL",
        claimed.id,
        claimed.token
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends a claimed Delivery without an Attempt (its endpoint was disabled or deleted).
pub async fn fail_unsent(
    db: impl PgExecutor<'_>,
    claimed: &Claimed,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let wrote = sqlx::query!(
        "UPDATE deliveries SET status = 'FAILED', claim_token = NULL, failure_reason = $3,
                updated_at = now(), version = version + 1
         WHERE id = $1 AND claim_token = $2",
        claimed.id,
        claimed.token,
        reason
    )
    .execute(db)
    .await?;
    Ok(wrote.rows_affected() == 1)
}

/// A Deferral: the Claim is released and the Delivery waits `wait`; no Attempt is spent,
/// so `attempt_count` and the ladder's start stay as they were. Fenced like every write.
pub async fn defer(pool: &PgPool, claimed: &Claimed, wait: Duration) -> Result<bool, sqlx::Error> {
    let wrote = sqlx::query!(
        "UPDATE deliveries
         SET status = 'PENDING', claim_token = NULL,
             next_retry_at = now() + make_interval(secs => $3),
             deferral_count = deferral_count + 1, updated_at = now(), version = version + 1
         WHERE id = $1 AND claim_token = $2",
        claimed.id,
        claimed.token,
        wait.as_secs_f64()
    )
    .execute(pool)
    .await?;
    Ok(wrote.rows_affected() == 1)
}

/// Mirrors a breaker change (kept in Redis, see `limits`) onto the endpoint row, where the
/// API and the metrics read it.
pub async fn set_breaker(pool: &PgPool, endpoint_id: &str, state: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE endpoints SET breaker_state = $2, breaker_changed_at = now(),
                breaker_opened_at = CASE WHEN $2 = 'open' THEN now() ELSE breaker_opened_at END
         WHERE id = $1",
        endpoint_id,
        state
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Live endpoints per breaker state, for the `railhook_endpoint_breakers` gauge.
pub async fn breaker_counts(pool: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT breaker_state, count(*) AS "n!" FROM endpoints
           WHERE deleted_at IS NULL GROUP BY breaker_state"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.breaker_state, r.n)).collect())
}

/// The retry backlog: PENDING Deliveries with a retry scheduled, and how many of them are
/// already due (a due count that stays high means the scheduler or the workers fall behind).
/// Both counts come from the partial index `deliveries_due_idx`.
pub async fn retry_backlog(pool: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE next_retry_at <= now())
         FROM deliveries WHERE status = 'PENDING' AND next_retry_at IS NOT NULL",
    )
    .fetch_one(pool)
    .await
}

/// Seconds the oldest due retry has waited past its time, and the age of the oldest
/// PENDING Delivery waiting for its first hint (no retry time: fresh, or handed back by a
/// sweep); 0 when there is none. Each is the first entry of a partial index
/// (`deliveries_due_idx`, `deliveries_stranded_idx`), so the sweep reads two index tuples
/// per partition, not the backlog.
pub async fn oldest_waiting(pool: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT
             coalesce(extract(epoch FROM now() - (SELECT min(next_retry_at) FROM deliveries
                 WHERE status = 'PENDING' AND next_retry_at <= now()))::bigint, 0) AS "due!",
             coalesce(extract(epoch FROM now() - (SELECT min(updated_at) FROM deliveries
                 WHERE status = 'PENDING' AND next_retry_at IS NULL))::bigint, 0) AS "unclaimed!""#
    )
    .fetch_one(pool)
    .await?;
    Ok((r.due.max(0), r.unclaimed.max(0)))
}

/// The retry scheduler's Claim: due rows, in batches, skipping rows another scheduler holds.
/// Returns (delivery id, endpoint id, scheduler token) per row.
pub async fn claim_due(
    pool: &PgPool,
    batch: i64,
) -> Result<Vec<(String, String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"UPDATE deliveries d
           SET status = 'PROCESSING', claim_token = gen_random_uuid(), last_attempt_at = now(),
               hinted_at = now(), updated_at = now(), version = version + 1
           FROM (SELECT id FROM deliveries
                 WHERE status = 'PENDING' AND next_retry_at <= now()
                 ORDER BY next_retry_at LIMIT $1
                 FOR UPDATE SKIP LOCKED) due
           WHERE d.id = due.id
           RETURNING d.id, d.endpoint_id, d.claim_token AS "token!""#,
        batch
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, r.endpoint_id, r.token))
        .collect())
}

/// After the retry scheduler's hints were acknowledged by Kafka: the rows are marked as
/// published (`next_retry_at` cleared; it was the due time, which a row in flight no longer
/// needs). A row the scheduler took but never got published (its worker was killed in the
/// middle of a round) keeps its due time, and the processing sweep hands it back after a few
/// minutes instead of the stranded window's hour. A row a consumer already swapped (another
/// token) is left alone.
pub async fn mark_published(pool: &PgPool, tokens: &[Uuid]) -> Result<u64, sqlx::Error> {
    if tokens.is_empty() {
        return Ok(0);
    }
    let marked = sqlx::query!(
        "UPDATE deliveries SET next_retry_at = NULL
         WHERE claim_token = ANY($1) AND status = 'PROCESSING' AND hinted_at IS NOT NULL",
        tokens
    )
    .execute(pool)
    .await?;
    Ok(marked.rows_affected())
}

/// A draining worker's Claims whose Attempts did not finish within the drain timeout go
/// back to PENDING at once, due now, instead of waiting for the processing sweep. A request
/// of theirs may already be on the wire: the next worker may send it again, as after the
/// sweep, only sooner.
pub async fn release(pool: &PgPool, claims: &[(String, Uuid)]) -> Result<u64, sqlx::Error> {
    if claims.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = claims.iter().map(|(id, _)| id.as_str()).collect();
    let tokens: Vec<Uuid> = claims.iter().map(|(_, t)| *t).collect();
    let released = sqlx::query!(
        "UPDATE deliveries d SET status = 'PENDING', claim_token = NULL, next_retry_at = now(),
                updated_at = now(), version = d.version + 1
         FROM unnest($1::text[], $2::uuid[]) AS w(id, token)
         WHERE d.id = w.id AND d.claim_token = w.token AND d.status = 'PROCESSING'",
        &ids as &[&str],
        &tokens
    )
    .execute(pool)
    .await?;
    Ok(released.rows_affected())
}

/// Hands rows back when the scheduler could not publish their hints (only then may it
/// write them again): (delivery id, scheduler token) pairs, in one statement.
pub async fn unclaim(pool: &PgPool, rows: &[(String, Uuid)]) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    let tokens: Vec<Uuid> = rows.iter().map(|(_, t)| *t).collect();
    sqlx::query!(
        "UPDATE deliveries d SET status = 'PENDING', claim_token = NULL, hinted_at = NULL,
                updated_at = now()
         FROM unnest($1::text[], $2::uuid[]) AS w(id, token)
         WHERE d.id = w.id AND d.claim_token = w.token",
        &ids as &[&str],
        &tokens
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sweep 1: PROCESSING for longer than `older_than_secs` goes back to PENDING with its token
/// cleared. The stalled worker's late `finalise` then lands on nothing (duplicate window 7).
pub async fn sweep_processing(
    pool: &PgPool,
    older_than_secs: f64,
    hint_lost_after_secs: f64,
    unpublished_after_secs: f64,
) -> Result<u64, sqlx::Error> {
    // A worker's Claim (hinted_at NULL) is stale after the processing timeout. A row whose
    // RetryHint is still queued (hinted_at set) is not held by anyone yet: only after the
    // stranded window is its hint taken as lost. A row the scheduler took whose hint was
    // never acknowledged (next_retry_at still set, see `mark_published`) is taken back after
    // `unpublished_after_secs`, longer than a publish may take.
    let swept = sqlx::query!(
        "UPDATE deliveries SET status = 'PENDING', claim_token = NULL, next_retry_at = now(),
                hinted_at = NULL, updated_at = now(), version = version + 1
         WHERE status = 'PROCESSING'
           AND ((hinted_at IS NULL AND last_attempt_at < now() - make_interval(secs => $1))
             OR hinted_at < now() - make_interval(secs => $2)
             OR (next_retry_at IS NOT NULL
                 AND hinted_at < now() - make_interval(secs => $3)))",
        older_than_secs,
        hint_lost_after_secs,
        unpublished_after_secs
    )
    .execute(pool)
    .await?;
    Ok(swept.rows_affected())
}

/// Sweep 2: PENDING with nothing scheduled for longer than `older_than_secs` goes to the
/// retry path. This also re-announces anything a lost Slot never carried.
pub async fn sweep_stranded(pool: &PgPool, older_than_secs: f64) -> Result<u64, sqlx::Error> {
    let swept = sqlx::query!(
        "UPDATE deliveries SET next_retry_at = now(), updated_at = now()
         WHERE status = 'PENDING' AND next_retry_at IS NULL
           AND updated_at < now() - make_interval(secs => $1)",
        older_than_secs
    )
    .execute(pool)
    .await?;
    Ok(swept.rows_affected())
}
