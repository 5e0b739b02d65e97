//! How a claimed Delivery's turn ends: the outcome or a give-up written behind the Fence
//! (under the ordering lock for an ordered Delivery), retried while Postgres is away, or a
//! Deferral that hands the Claim back.

use std::time::{Duration, Instant};

use crate::claim::Claimed;
use crate::fence;
use crate::limits::{Reason, deferral_wait};
use crate::ordering::{self};
use crate::retry_policy::Decision;
use crate::runtime::Shared;
use railhook_common::Word;
use railhook_common::metrics_http::FinalOutcome;

/// Ends a claimed Delivery as FAILED without sending anything; counted only if it wrote.
/// Returns the ordered Delivery it released, if any.
pub(crate) async fn give_up(shared: &Shared, claimed: &Claimed, reason: &str) -> Option<Released> {
    match resolve(shared, claimed, Resolution::Unsent(reason)).await {
        Ok(Resolved {
            wrote: true,
            released,
        }) => {
            shared.metrics.failed_messages.inc();
            shared
                .metrics
                .deliveries_final
                .with_label_values(&[FinalOutcome::Failed.as_str()])
                .inc();
            released
        }
        _ => None,
    }
}

/// Ends a claimed Delivery without sending anything because the endpoint's own program
/// said so (a transformation's `cancel`): written like a give-up, but not counted as a
/// failure. Returns the ordered Delivery it released, if any.
pub(crate) async fn skip(shared: &Shared, claimed: &Claimed, reason: &str) -> Option<Released> {
    match resolve(shared, claimed, Resolution::Unsent(reason)).await {
        Ok(Resolved {
            wrote: true,
            released,
        }) => released,
        _ => None,
    }
}

/// What a resolution's write did.
pub(crate) struct Resolved {
    /// It landed (the Fence let it through).
    pub wrote: bool,
    /// The next parked ordered Delivery it released, if any.
    pub released: Option<Released>,
}

/// How a resolution released the next parked ordered Delivery.
pub(crate) enum Released {
    /// Claimed for this worker in the resolution's transaction: deliver it next.
    HandedOff(Box<(crate::claim::Claimed, crate::claim::Target)>),
    /// Announced through the Outbox (a draining worker starts nothing new).
    Announced,
}

/// A write that ends a claimed Delivery's turn.
pub(crate) enum Resolution<'a> {
    /// The Attempt's outcome, through `fence::finalise`.
    Outcome(&'a crate::attempt::Report, &'a Decision),
    /// FAILED without an Attempt.
    Unsent(&'a str),
}

pub(crate) async fn write_resolution(
    db: impl sqlx::PgExecutor<'_>,
    shared: &Shared,
    claimed: &Claimed,
    what: &Resolution<'_>,
) -> sqlx::Result<bool> {
    match what {
        Resolution::Outcome(report, decision) => {
            let done = fence::finalise(db, claimed, report, decision, &shared.streak).await?;
            if done.disabled {
                shared.metrics.endpoints_disabled.inc();
            }
            Ok(done.wrote)
        }
        Resolution::Unsent(reason) => fence::fail_unsent(db, claimed, reason).await,
    }
}

/// Writes a Resolution behind the Fence. For an ordered Delivery that resolves (SUCCEEDED
/// or FAILED, not a retry), the write runs under the endpoint's ordering lock and, if it
/// landed, releases the next parked Delivery in the same transaction (see `ordering`).
///
/// The write has a deadline (`db::answered`): a primary that froze fails it, and the
/// caller's retry (or the processing sweep) finds the primary in charge then.
pub(crate) async fn resolve(
    shared: &Shared,
    claimed: &Claimed,
    what: Resolution<'_>,
) -> sqlx::Result<Resolved> {
    railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "an outcome write",
        resolve_now(shared, claimed, what),
    )
    .await
}

async fn resolve_now(
    shared: &Shared,
    claimed: &Claimed,
    what: Resolution<'_>,
) -> sqlx::Result<Resolved> {
    let resolves = !matches!(what, Resolution::Outcome(_, Decision::RetryAfter(_)));
    if let Resolution::Outcome(report, decision) = &what
        && shared.successes.takes(claimed, report, decision)
    {
        // A plain success: written with the others that wait at the same moment.
        let wrote = shared.successes.write(claimed, report).await?;
        return Ok(Resolved {
            wrote,
            released: None,
        });
    }
    if claimed.ordered
        && !resolves
        && let (Some(seq), Resolution::Outcome(report, _)) = (claimed.sequence_number, &what)
        && report.sent
    {
        // A failed Attempt of an ordered Delivery: it is now a stuck predecessor, and its
        // parked successor's gap-timeout wake-up is set with the failure (ordering.rs,
        // "Wake-ups"), in one transaction so neither is written without the other.
        let mut tx = shared.pool.begin().await?;
        let wrote = write_resolution(&mut *tx, shared, claimed, &what).await?;
        if wrote {
            ordering::wake_successor(&mut *tx, &claimed.endpoint_id, seq, shared.gap_timeout)
                .await?;
        }
        tx.commit().await?;
        return Ok(Resolved {
            wrote,
            released: None,
        });
    }
    if !(claimed.ordered && resolves) {
        let wrote = write_resolution(&shared.pool, shared, claimed, &what).await?;
        return Ok(Resolved {
            wrote,
            released: None,
        });
    }
    let mut tx = ordering::begin_resolve(&shared.pool, &claimed.endpoint_id).await?;
    let wrote = write_resolution(&mut *tx, shared, claimed, &what).await?;
    let mut released = None;
    if wrote && let Some(seq) = claimed.sequence_number {
        released = release(&mut *tx, shared, &claimed.endpoint_id, seq).await?;
    }
    tx.commit().await?;
    // The resolver's second look (ordering.rs, "Parking in the Claim"): a Claim statement
    // may have parked the successor, unlocked, after the look above and before this commit.
    // Either this look, taken after the commit, sees that park, or the parker's own second
    // look sees this resolution. Only when nothing was released, so at a line's end.
    if wrote
        && released.is_none()
        && let Some(seq) = claimed.sequence_number
    {
        match release(&shared.pool, shared, &claimed.endpoint_id, seq).await {
            Ok(r) => released = r,
            Err(e) => {
                tracing::warn!(error = %e, delivery_id = %claimed.id, "second look for a parked successor failed; its own wake-up stays set")
            }
        }
    }
    if released.is_some() {
        shared.metrics.ordering_released.inc();
    }
    Ok(Resolved { wrote, released })
}

/// Releases the next parked ordered Delivery after `seq` on the endpoint: handed off to this
/// worker, or, while it drains, announced through the Outbox.
async fn release(
    db: impl sqlx::PgExecutor<'_>,
    shared: &Shared,
    endpoint_id: &str,
    seq: i64,
) -> sqlx::Result<Option<Released>> {
    Ok(
        if shared.draining.load(std::sync::atomic::Ordering::SeqCst) {
            ordering::release_next(db, endpoint_id, seq)
                .await?
                .map(|_| Released::Announced)
        } else {
            crate::claim::hand_off_next(db, endpoint_id, seq)
                .await?
                .map(|taken| Released::HandedOff(Box::new(taken)))
        },
    )
}

/// A Deferral: the Claim goes back, no Attempt is spent.
pub(crate) async fn defer(shared: &Shared, claimed: &Claimed, reason: Reason, asked: Duration) {
    let wait = deferral_wait(
        reason,
        asked,
        claimed.deferral_count,
        shared.policy.deferral_max,
        rand::random::<f64>(),
    );
    let write = railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "a Deferral",
        fence::defer(&shared.pool, claimed, wait),
    );
    match write.await {
        Ok(true) => shared
            .metrics
            .deferrals
            .with_label_values(&[reason.as_str()])
            .inc(),
        Ok(false) => shared.metrics.fence_rejections.inc(),
        Err(e) => {
            tracing::warn!(error = %e, delivery_id = %claimed.id, "deferral not written; the sweep will hand the delivery back")
        }
    }
}

/// The longest pause between two tries of an outcome's write.
pub(crate) const FINALISE_MAX_PAUSE: Duration = Duration::from_secs(5);

/// Writes an Attempt's outcome behind the Fence, retrying while Postgres does not answer.
///
/// Invariant: one attempt row per request sent. A request that went out must leave its row
/// even when Postgres restarts under it, so the write is retried (backing off to
/// [`FINALISE_MAX_PAUSE`]) for as long as it could still matter: until it lands, is fenced
/// out (recorded as a fenced Attempt), or `finalise_for` (the stranded window) has passed.
/// Giving up after a few seconds, as this once did, lost the row of every request that
/// finished during a Postgres restart. Each try is one transaction; a try whose commit
/// succeeded but whose answer was lost with the connection is retried and then lands as a
/// fenced Attempt (the Claim is gone): a second row for that one request, never a lost one.
pub(crate) async fn finalise_with_retry(
    shared: &Shared,
    claimed: &Claimed,
    report: &crate::attempt::Report,
    decision: &Decision,
) -> Option<Resolved> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(200);
    loop {
        match resolve(shared, claimed, Resolution::Outcome(report, decision)).await {
            Ok(resolved) => return Some(resolved),
            Err(e) => {
                tracing::warn!(error = %e, delivery_id = %claimed.id, "finalise failed; retrying")
            }
        }
        if started.elapsed() >= shared.finalise_for {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(FINALISE_MAX_PAUSE);
    }
}
