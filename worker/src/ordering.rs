//! The Ordering Buffer: ordered Deliveries reach an endpoint in Sequence Number order, with
//! a bounded wait.
//!
//! **Where the order comes from.** Ingest numbers ordered Deliveries per endpoint right
//! after its commit (a rolled-back ingest burns no number). If that step did not happen (the
//! process died between commit and numbering), the gate numbers the Delivery here, under
//! the same row lock discipline, so no Delivery is numbered twice and none goes unnumbered.
//!
//! **The gate** (run after the Claim, before anything is built, for a Delivery the Claim
//! statement did not decide itself; see below): a Delivery may go when no
//! ordered Delivery of the same endpoint with a smaller number is still unresolved
//! (`PENDING` or `PROCESSING`, and not skipped). Every statement that asks this reads the
//! one definition of that set, the SQL function `railhook_ordered_ahead` (migration
//! 20261205000016). Otherwise it is **parked**: a Deferral
//! (Claim released, token cleared, no Attempt spent) with `parked_at` set on the first
//! park, and a wake-up of its own (see "Wake-ups" below).
//!
//! **Release.** When an ordered Delivery resolves (SUCCEEDED or FAILED), the resolving
//! worker claims the next parked one on its endpoint in the same transaction, if nothing
//! else unresolved is ahead of it (`claim::hand_off_next`), and delivers it in the same task
//! without running the gate again. A draining worker announces it through the Outbox
//! instead (reason `RELEASED`, [`release_next`]). Without the hand-off every link of an
//! ordered line cost a full trip through the relay, the broker and the consumer (~30 ms
//! alone, ~240 ms on a busy 2-core machine: review #19 item 13); with the hand-off done
//! after the commit, a Claim and a gate transaction of its own (54 deliveries/s on one
//! endpoint, issue #21 item 5; 81/s with the claim in the resolution, 100/s with parks
//! committed asynchronously, docs/BENCHMARKS-HISTORY.md).
//!
//! **Parking in the Claim.** Most ordered Deliveries never reach the gate: the Claim
//! statement (`claim::claim_batch`) asks the gate's question from its own snapshot. Nothing
//! unresolved ahead: claimed and sent without the gate. Something ahead: parked by the Claim
//! statement itself (PENDING, `parked_at`, its wake-up), not claimed, gated and
//! parked in three transactions. A burst of N ordered Events costs N such parks, and the
//! gate's three transactions per park under the endpoint's lock were what held one line to
//! 100 deliveries/s (issue #21 item 5; 370/s since, docs/BENCHMARKS-HISTORY.md). Unnumbered
//! Deliveries, and those parked past their gap timeout, are still claimed and gated.
//!
//! **Lost wake-ups.** The gate's park (check + write) and a resolution (finalise + release)
//! each run in a transaction holding a per-endpoint advisory lock, so one of them always sees
//! the other. The Claim's park holds no lock; instead both sides look again after their own
//! commit: the parker re-reads its parked rows (`claim::take_parked`) and the resolver, if
//! its release found nothing, looks for a parked successor once more (`resolution::resolve`).
//! Whichever commits second then sees the other's commit, so one of the two looks releases
//! the Delivery; if both do, the conditional update lets one of them have it. The
//! park's own wake-up (at worst [`PARKED_FALLBACK`]) covers a release lost to a crash.
//!
//! **Wake-ups** (review #34 item 3). A parked Delivery is not polled. It is woken by what it
//! waits on: its predecessor's resolution hands the line on (above), and an ordered
//! Delivery's failed Attempt (a retry) sets the gap-timeout wake-up of its parked successor
//! in the same transaction ([`wake_successor`]), since from then on that predecessor is
//! stuck and the gap timeout is what gets past it. A park sets its own wake-up through
//! `railhook_park_wakeup` (migration 20261205000018): the gap timeout behind a stuck
//! predecessor (the head of the line; once passed and still held by moving predecessors,
//! a second from now), otherwise [`PARKED_FALLBACK`], which only a lost wake-up reaches.
//! Before this every parked Delivery past its gap timeout was hinted once a second while
//! its line was held, so an endpoint outage with N parked Deliveries cost N Claims a
//! second for as long as it lasted; now it costs the head's.
//!
//! **Gap timeout.** A Delivery parked for longer than the gap timeout (from its first park)
//! stops waiting for predecessors that are stuck: those that have failed at least once and
//! are not themselves parked (in their retry ladder, even while a retry is in flight: that
//! is exactly the Delivery the timeout exists to get past). They are marked
//! `ordering_skipped_at` and leave the line (they still deliver, just not in order), and
//! `railhook_ordering_gap_timeout_total` counts the Delivery that went without them.
//! Predecessors that have not failed (parked, not yet tried, or deferred by the endpoint's
//! breaker or limits) are still waited for: skipping them would only scramble the order,
//! since the endpoint is not taking anything anyway.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};

use crate::claim::Claimed;

/// The wake-up of a parked Delivery that waits behind a parked or not yet failed
/// predecessor: never reached unless a wake-up was lost, and then the cost of the loss.
pub const PARKED_FALLBACK: Duration = Duration::from_secs(15 * 60);

/// Sets the gap-timeout wake-up of the parked successor of number `seq` on the endpoint
/// (unless an earlier one is set): the Delivery numbered `seq` has just failed an Attempt
/// and is now a stuck predecessor. Runs in the transaction that writes that failure.
pub async fn wake_successor(
    db: impl sqlx::PgExecutor<'_>,
    endpoint_id: &str,
    seq: i64,
    gap_timeout: Duration,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE deliveries d
         SET next_retry_at = least(d.next_retry_at,
                                   greatest(d.parked_at + make_interval(secs => $3),
                                            now() + interval '1 second')),
             updated_at = now()
         FROM railhook_parked_successor($1, $2) s
         WHERE d.id = s.id AND d.status = 'PENDING' AND d.parked_at IS NOT NULL",
        endpoint_id,
        seq,
        gap_timeout.as_secs_f64()
    )
    .execute(db)
    .await?;
    Ok(())
}

/// What the gate decided for one claimed Delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing unresolved ahead of it.
    Go { sequence_number: i64 },
    /// Went after its gap timeout, leaving stuck predecessors behind.
    GoAfterGap { sequence_number: i64 },
    /// Parked (the Claim is released); or the Claim was lost meanwhile.
    Parked,
}

async fn lock_endpoint(tx: &mut Transaction<'_, Postgres>, endpoint_id: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('railhook.ordering:' || $1, 0))",
        endpoint_id
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(())
}

/// Numbers a claimed ordered Delivery that ingest left unnumbered. The row is locked first
/// and the counter moves only if the row still has no number, so racing ingest's own
/// numbering neither double-numbers it nor burns a number.
async fn number(
    tx: &mut Transaction<'_, Postgres>,
    claimed: &Claimed,
) -> sqlx::Result<Option<i64>> {
    let current = sqlx::query_scalar!(
        "SELECT sequence_number FROM deliveries WHERE id = $1 AND claim_token = $2 FOR UPDATE",
        claimed.id,
        claimed.token
    )
    .fetch_optional(&mut **tx)
    .await?;
    let Some(current) = current else {
        return Ok(None);
    };
    if let Some(n) = current {
        return Ok(Some(n));
    }
    let n = sqlx::query_scalar!(
        r#"WITH bumped AS (
               INSERT INTO endpoint_sequences (endpoint_id, last_assigned) VALUES ($2, 1)
               ON CONFLICT (endpoint_id)
               DO UPDATE SET last_assigned = endpoint_sequences.last_assigned + 1
               RETURNING last_assigned
           )
           UPDATE deliveries SET sequence_number = (SELECT last_assigned FROM bumped)
           WHERE id = $1
           RETURNING sequence_number AS "n!""#,
        claimed.id,
        claimed.endpoint_id
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(Some(n))
}

/// Out of the buffer: a later park (after a retry) starts its own clock, and a Delivery
/// that is no longer waiting must not look like one to those behind it.
async fn leave_buffer(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
    parked: bool,
) -> sqlx::Result<()> {
    if parked {
        sqlx::query!("UPDATE deliveries SET parked_at = NULL WHERE id = $1", id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// The ordering gate for one claimed ordered Delivery.
pub async fn gate(pool: &PgPool, claimed: &Claimed, gap_timeout: Duration) -> sqlx::Result<Gate> {
    let mut tx = pool.begin().await?;
    lock_endpoint(&mut tx, &claimed.endpoint_id).await?;
    let Some(seq) = number(&mut tx, claimed).await? else {
        return Ok(Gate::Parked);
    };
    let row = sqlx::query!(
        r#"SELECT
             count(*) AS "ahead!",
             count(*) FILTER (WHERE p.parked_at IS NOT NULL OR p.attempt_count = 0) AS "moving!",
             (SELECT parked_at IS NOT NULL FROM deliveries WHERE id = $1) AS "parked!",
             coalesce((SELECT parked_at + make_interval(secs => $4) <= now()
                       FROM deliveries WHERE id = $1), false) AS "timed_out!"
           FROM railhook_ordered_ahead($2, $3) p"#,
        claimed.id,
        claimed.endpoint_id,
        seq,
        gap_timeout.as_secs_f64()
    )
    .fetch_one(&mut *tx)
    .await?;
    if row.ahead == 0 {
        leave_buffer(&mut tx, &claimed.id, row.parked).await?;
        tx.commit().await?;
        return Ok(Gate::Go {
            sequence_number: seq,
        });
    }
    if row.timed_out && row.moving == 0 {
        sqlx::query!(
            "UPDATE deliveries SET ordering_skipped_at = now(), updated_at = now()
             WHERE id IN (SELECT id FROM railhook_ordered_ahead($1, $2))",
            claimed.endpoint_id,
            seq
        )
        .execute(&mut *tx)
        .await?;
        leave_buffer(&mut tx, &claimed.id, row.parked).await?;
        tx.commit().await?;
        return Ok(Gate::GoAfterGap {
            sequence_number: seq,
        });
    }
    // Park, with the wake-up `railhook_park_wakeup` chooses ("Wake-ups" above); once that has
    // passed (it is waiting only for moving predecessors), look again shortly.
    crate::fence::park(&mut tx, claimed, gap_timeout).await?;
    // A park need not wait for the WAL's flush (issue #21 item 5: a burst of ordered
    // Events parks every one of them, each under the endpoint's lock). If Postgres crashes
    // before the flush, the park is undone: the row is again PROCESSING under this Claim,
    // nothing was sent, and the processing sweep hands it back. Any later durable commit
    // (the predecessor's resolution) flushes the park with it, so a release never misses
    // a parked row it saw. Go and numbering stay synchronous: a number is sent to the
    // receiver and must never be given out twice.
    sqlx::query_scalar!("SELECT set_config('synchronous_commit', 'off', true)")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Gate::Parked)
}

/// Opens the transaction a resolving ordered Delivery's finalise runs in: the endpoint's
/// lock is held until `claim::hand_off_next` (or [`release_next`]) and the commit.
pub async fn begin_resolve(
    pool: &PgPool,
    endpoint_id: &str,
) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    lock_endpoint(&mut tx, endpoint_id).await?;
    Ok(tx)
}

/// Announces the next parked Delivery of the endpoint (the smallest number above
/// `sequence_number`) through the Outbox. Returns the one released, if any: the resolving
/// worker hands off to it at once (`worker::deliver`), and the Outbox row is the durable
/// hint should that worker die first.
pub async fn release_next(
    db: impl sqlx::PgExecutor<'_>,
    endpoint_id: &str,
    sequence_number: i64,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"WITH next AS (
               SELECT id FROM railhook_parked_successor($1, $2)
           ), woken AS (
               UPDATE deliveries d SET next_retry_at = NULL, updated_at = now()
               FROM next WHERE d.id = next.id
               RETURNING d.id, d.endpoint_id, d.project_id
           )
           INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
           SELECT id, endpoint_id, project_id, 'RELEASED' FROM woken
           RETURNING delivery_id"#,
        endpoint_id,
        sequence_number
    )
    .fetch_optional(db)
    .await
}
