//! From a lane's taken hints to running turns, and back at the end: [`start`] runs one
//! Claim statement for a batch (a fresh hint's Claim or a RetryHint's swap) and spawns a
//! turn with a permit for each won Claim; [`drain`] waits for the running turns on SIGTERM
//! and hands back the Claims still running at its timeout.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use uuid::Uuid;

use crate::config::WorkerConfig;
use crate::lanes::{Ask, Lane};
use crate::turn::turns;
use crate::worker::Shared;
use crate::{claim, fence};

/// Graceful drain: no new hand-offs; the running Attempts finish (and write their outcomes
/// through the Fence) for up to `drain_timeout`, which the loop sees as every permit of
/// both lanes coming back; Claims still running after that go back to PENDING at once
/// rather than after the processing sweep.
pub(crate) async fn drain(shared: &Shared, config: &WorkerConfig, fresh: &Lane, retry: &Lane) {
    shared.draining.store(true, Ordering::SeqCst);
    let running = shared.running.lock().map(|r| r.len()).unwrap_or(0);
    tracing::info!(running, timeout = ?config.drain_timeout, "worker draining");
    let all_back = async {
        let _fresh = fresh.permits.acquire_many(fresh.capacity).await;
        let _retry = retry.permits.acquire_many(retry.capacity).await;
    };
    if tokio::time::timeout(config.drain_timeout, all_back)
        .await
        .is_ok()
    {
        tracing::info!("worker drained: every Attempt finished");
        return;
    }
    let left: Vec<(String, Uuid)> = shared
        .running
        .lock()
        .map(|r| r.iter().map(|(id, t)| (id.clone(), *t)).collect())
        .unwrap_or_default();
    match fence::release(&shared.pool, &left).await {
        Ok(n) => tracing::warn!(
            released = n,
            "drain timed out; unfinished claims handed back"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "drain timed out and claims not handed back; the sweep will")
        }
    }
}

/// Retries `op` while Postgres is away, so no offset moves past an unanswered hint.
async fn until_ok<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// How many times a hint ahead of its row is looked at again, waiting 5 ms, then twice as
/// long each time: about 1.3 s in all.
const VISIBILITY_TRIES: u32 = 8;

/// Claims the missed hints whose rows this worker cannot see yet, as they become visible
/// (`claim::invisible` says why that happens). The visibility check runs after the Claim
/// that missed, so a row it sees may have become visible in between: each such row is
/// claimed once more, and only a row that was already visible when a Claim missed it is a
/// real duplicate, left alone. A row that never shows up (its partition retired, say) is
/// given up after `VISIBILITY_TRIES`. The loop waits meanwhile: the hint's offset must not
/// be stored before its Claim, and the wait is rare and short.
///
/// Seen without the second Claim: 1 Delivery in 6,000 at 300 Events/s left PENDING for the
/// stranded sweep, its row committed between the missed Claim and the check.
async fn claim_when_visible(
    shared: &Shared,
    mut missed: Vec<String>,
    parked: &mut usize,
) -> Vec<(claim::Claimed, claim::Target)> {
    let mut won = Vec::new();
    let mut wait = Duration::from_millis(5);
    for _ in 0..VISIBILITY_TRIES {
        let unseen = until_ok("visibility", || claim::invisible(&shared.pool, &missed)).await;
        let seen: Vec<String> = missed
            .iter()
            .filter(|id| !unseen.contains(id))
            .cloned()
            .collect();
        if !seen.is_empty() {
            let got = claim(shared, &seen, parked).await;
            shared.metrics.early_hints.inc_by(got.len() as u64);
            won.extend(got);
        }
        missed = unseen;
        if missed.is_empty() {
            break;
        }
        shared.metrics.early_hints.inc_by(missed.len() as u64);
        tokio::time::sleep(wait).await;
        wait *= 2;
        let got = until_ok("claim", || {
            claim::claim_batch(&shared.pool, &missed, shared.gap_timeout)
        })
        .await;
        missed.retain(|id| !got.answered(id));
        won.extend(settle_parked(shared, got, parked).await);
    }
    if !missed.is_empty() {
        tracing::warn!(
            hints = missed.len(),
            "hints for deliveries that never became visible; the stranded sweep has them if they ever do"
        );
    }
    won
}

/// One Claim statement for `ids`, with its parked rows settled (see [`settle_parked`]).
async fn claim(
    shared: &Shared,
    ids: &[String],
    parked: &mut usize,
) -> Vec<(claim::Claimed, claim::Target)> {
    let got = until_ok("claim", || {
        claim::claim_batch(&shared.pool, ids, shared.gap_timeout)
    })
    .await;
    settle_parked(shared, got, parked).await
}

/// Counts the ordered Deliveries a Claim statement parked and takes a second look at them
/// (`claim::take_parked`): the statement's park and a predecessor's resolution may have
/// missed each other, and whichever looks after the other's commit must release the
/// Delivery (ordering.rs, "Parking in the Claim"). Returns the won Claims with any parked
/// Delivery taken back.
async fn settle_parked(
    shared: &Shared,
    got: claim::Claims,
    parked: &mut usize,
) -> Vec<(claim::Claimed, claim::Target)> {
    let mut won = got.won;
    if got.parked.is_empty() {
        return won;
    }
    shared
        .metrics
        .deferrals
        .with_label_values(&[crate::limits::Reason::Ordering.as_str()])
        .inc_by(got.parked.len() as u64);
    let taken = until_ok("parked look", || {
        claim::take_parked(&shared.pool, &got.parked)
    })
    .await;
    if !taken.is_empty() {
        shared.metrics.ordering_released.inc_by(taken.len() as u64);
    }
    *parked += got.parked.len() - taken.len();
    won.extend(taken);
    won
}

/// Claims (fresh lane) or swaps (retry lane) what a lane took, in one statement, and starts
/// an Attempt task for each won Claim with one of the permits taken for it. Returns once the
/// statement committed (or matched nothing): only then are the hints' offsets stored.
pub(crate) async fn start(
    shared: &Shared,
    lane: &str,
    asks: Vec<Ask>,
    mut permits: Vec<OwnedSemaphorePermit>,
) {
    if asks.is_empty() {
        return;
    }
    // Before the statement: the Claim's stamp is no earlier than this, so the age measured
    // from here is never less than the Claim's own (see `deliver`).
    let stamped = Instant::now();
    // Ordered hints the Claim parked: answered, not missed.
    let mut parked = 0;
    let won = if lane == "retry" {
        let hints: Vec<(String, Uuid)> = asks
            .iter()
            .filter_map(|a| match a {
                Ask::Swap(id, token) => Some((id.clone(), *token)),
                _ => None,
            })
            .collect();
        until_ok("swap", || claim::swap_batch(&shared.pool, &hints)).await
    } else {
        let ids: Vec<String> = asks
            .iter()
            .filter_map(|a| match a {
                Ask::Claim(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let got = until_ok("claim", || {
            claim::claim_batch(&shared.pool, &ids, shared.gap_timeout)
        })
        .await;
        // Every hint answered (the usual case): no per-id search.
        let missed: Vec<String> = if got.won.len() + got.parked.len() < ids.len() {
            ids.iter().filter(|id| !got.answered(id)).cloned().collect()
        } else {
            Vec::new()
        };
        let mut won = settle_parked(shared, got, &mut parked).await;
        if !missed.is_empty() {
            won.extend(claim_when_visible(shared, missed, &mut parked).await);
        }
        won
    };
    let misses = asks.len().saturating_sub(won.len() + parked);
    shared.metrics.claim_misses.inc_by(misses as u64);
    for (claimed, target) in won {
        let Some(permit) = permits.pop() else {
            // More rows than hints cannot happen (one row per id); never send unpermitted.
            tracing::error!(delivery_id = %claimed.id, "claimed without a permit; the sweep will hand it back");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            turns(&shared, claimed, target, stamped).await;
            drop(permit);
        });
    }
}
