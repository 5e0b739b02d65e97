//! The Fence: every write on a claimed Delivery row, each conditional on the claim token
//! the Claim stamped (claim.rs), so only the current owner's write lands.
//!
//! Invariants kept here (numbers as in docs/ARCHITECTURE.md):
//! - **3, the Fence.** An outcome is written only where the row still carries the token of
//!   the Claim that made the Attempt (`WHERE id = $id AND claim_token = $token`). A worker
//!   that stalled past the processing sweep, a duplicate hint, a redelivered RetryHint:
//!   their writes match nothing, and the caller queues no successor (next retry, ordering
//!   release) unless its write landed.
//! - **6, every request leaves an Attempt.** [`finalise`] writes the Attempt row in the
//!   same statement as the fenced update, fenced or not (`attempts.fenced` says which).
//! - Releasing a Claim (a Deferral, a park, a drain's hand-back, the scheduler's failed
//!   publish) clears the token in the same statement, so a late write by the old owner
//!   finds no token to match.
//!
//! Every function returns whether its write landed (`true`) or the Fence refused it.
//!
//! A plain success of an unordered Delivery may instead be written with others in one
//! statement (successes.rs); that statement keeps invariants 3 and 6 per row, and a test
//! holds it to [`finalise`]'s rows.

use std::time::Duration;

use railhook_common::{AttemptOutcome, DeliveryStatus};
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::attempt::Report;
use crate::claim::Claimed;
use crate::retry_policy::Decision;

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
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %claimed.id))]
#[allow(
    clippy::too_many_lines,
    reason = "one SQL statement and its parameters; splitting it would cost a round trip"
)]
pub async fn finalise(
    db: impl PgExecutor<'_>,
    claimed: &Claimed,
    report: &Report,
    decision: &Decision,
    streak: &StreakPolicy,
) -> Result<Finalised, sqlx::Error> {
    let (status, wait, reason, disable) = match decision {
        // A success is written by the one statement that spells it (successes.rs), for one
        // outcome here as for a group there; it never disables an endpoint.
        Decision::Succeeded => {
            let one = [(claimed, report)];
            let wrote = crate::successes::write_successes(db, streak, one).await?;
            return Ok(Finalised {
                wrote: !wrote.is_empty(),
                disabled: false,
            });
        }
        Decision::RetryAfter(d) => (DeliveryStatus::Pending, Some(d.as_secs_f64()), None, false),
        Decision::Failed {
            reason,
            disable_endpoint,
        } => (
            DeliveryStatus::Failed,
            None,
            Some(reason.clone()),
            *disable_endpoint,
        ),
    };
    let finished_at =
        report.started_at + chrono::Duration::from_std(report.duration).unwrap_or_default();
    // The statement's parameters, each named once (an Attempt was sent when $4 = 1; $3 is
    // never SUCCEEDED here):
    //   $1 delivery id, $2 claim token (the Fence), $3 new status, $4 Attempts spent (0 or 1),
    //   $5 retry wait in seconds (NULL: none), $6 failure reason, $7 endpoint id,
    //   $8 the endpoint answered 410 and is disabled, $9..$15 the Attempt row (started,
    //   finished, status code, outcome, duration ms, error class, response excerpt),
    //   $16..$18 the StreakPolicy (disable after seconds, min failures, failing after),
    //   $19 what a transformed Attempt sent (JSON; NULL: untransformed).
    //
    // One statement (one round trip, one commit): the fenced update; the endpoint's failure
    // streak and the disable that only a written 410 or a streak past the policy may cause;
    // and the Attempt row, marked fenced when the update matched nothing.
    //
    // The endpoint row is written only when an Attempt was sent (a failure adds to the
    // streak) or a 410 disables it; a success's reset is the success statement's.
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
                      e.enabled
                          AND coalesce(e.failing_since, now()) <= now() - make_interval(secs => $16)
                          AND e.consecutive_failures + 1 >= $17 AS worn_out
               FROM endpoints e
               WHERE e.id = $7 AND ($4 = 1) AND EXISTS (SELECT 1 FROM upd)
           ), health AS (
               UPDATE endpoints e
               SET consecutive_failures = e.consecutive_failures + 1,
                   failing_since = coalesce(e.failing_since, now()),
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
                   ('message.attempt.exhausted', $3 = 'FAILED' AND ($4 = 1)),
                   ('message.attempt.failing', $3 = 'PENDING' AND ($4 = 1) AND u.attempt_count = $18),
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
                                     response_excerpt, fenced, request)
               SELECT $1,
                      (SELECT coalesce(max(attempt_number), 0) + 1 FROM attempts WHERE delivery_id = $1),
                      $9, $10, $11, $12, $13, $14,
                      -- Fenced out by an expunge: what the receiver answered may quote the
                      -- payload that is gone, so it is not kept (review #34 item 6).
                      CASE WHEN NOT EXISTS (SELECT 1 FROM upd)
                                AND EXISTS (SELECT 1 FROM deliveries x WHERE x.id = $1
                                            AND x.failure_reason = 'payload_expunged')
                           THEN NULL ELSE $15 END,
                      NOT EXISTS (SELECT 1 FROM upd),
                      -- Nor the request a transformation made: its body is often the
                      -- payload itself (issue #53).
                      CASE WHEN NOT EXISTS (SELECT 1 FROM upd)
                                AND EXISTS (SELECT 1 FROM deliveries x WHERE x.id = $1
                                            AND x.failure_reason = 'payload_expunged')
                           THEN NULL ELSE $19::text::jsonb END
               WHERE ($4 = 1)
               RETURNING id
           )
           SELECT EXISTS (SELECT 1 FROM upd) AS "wrote!",
                  EXISTS (SELECT 1 FROM health WHERE disabled) AS "disabled!",
                  (SELECT coalesce(sum(n), 0) FROM ops)::int AS "operational!""#,
        claimed.id,
        claimed.token,
        status as DeliveryStatus,
        i32::from(report.sent),
        wait,
        reason,
        claimed.endpoint_id,
        disable,
        report.started_at,
        finished_at,
        report.status.map(i32::from),
        report.outcome.recorded() as AttemptOutcome,
        report.duration.as_millis().min(i32::MAX as u128) as i32,
        report.error.map(|e| e.as_str()),
        report.excerpt,
        streak.disable_after.as_secs_f64(),
        i32::try_from(streak.min_failures).unwrap_or(i32::MAX),
        i32::try_from(streak.failing_after).unwrap_or(i32::MAX),
        report.request
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
pub async fn restamp(db: impl PgExecutor<'_>, claimed: &Claimed) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE deliveries SET last_attempt_at = now()
         WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING' AND hinted_at IS NULL",
        claimed.id,
        claimed.token
    )
    .execute(db)
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

/// Parks an ordered Delivery (ordering.rs): a Deferral that also stamps `parked_at` on the
/// first park, and sets its own wake-up (`railhook_park_wakeup`: the gap timeout from that
/// first park behind a stuck predecessor, else the long fallback; ordering.rs, "Wake-ups").
/// Runs inside the gate's transaction.
pub async fn park(
    tx: &mut Transaction<'_, Postgres>,
    claimed: &Claimed,
    gap_timeout: Duration,
) -> Result<bool, sqlx::Error> {
    let wrote = sqlx::query!(
        "UPDATE deliveries
         SET status = 'PENDING', claim_token = NULL, parked_at = coalesce(parked_at, now()),
             next_retry_at = railhook_park_wakeup(endpoint_id, sequence_number, parked_at, $3, $4),
             deferral_count = deferral_count + 1, updated_at = now(), version = version + 1
         WHERE id = $1 AND claim_token = $2",
        claimed.id,
        claimed.token,
        gap_timeout.as_secs_f64(),
        crate::ordering::PARKED_FALLBACK.as_secs_f64()
    )
    .execute(&mut **tx)
    .await?;
    Ok(wrote.rows_affected() == 1)
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
