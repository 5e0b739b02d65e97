//! From a lane's taken hints to running turns, and back at the end: [`dispatch`] runs one
//! Claim statement for a batch (a fresh hint's Claim or a RetryHint's swap) and spawns a
//! turn with a permit for each won Claim; [`drain`] waits for the running turns on SIGTERM
//! and hands back the Claims still running at its timeout.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::config::WorkerConfig;
use crate::lanes::{Ask, Lane};
use crate::runtime::Shared;
use crate::turn::turns;
use crate::{claim, fence};
use railhook_common::Word;
use railhook_common::vocabulary::DeferralReason;

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
    // Invariant: no request starts after its Claim was handed back (review #34 item 10).
    // The turns still running are stopped first — a turn waiting in a rate hold, for Redis
    // or at the ordering gate would otherwise go on to send a Delivery another worker may
    // already own — and only then are their Claims released. A request cut off mid-way is
    // a request the receiver may have seen: at-least-once, like a worker killed there.
    let mut tasks = match shared.turn_tasks.lock() {
        Ok(mut set) => std::mem::take(&mut *set),
        Err(_) => tokio::task::JoinSet::new(),
    };
    tasks.abort_all();
    let stopped = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(TURNS_STOP_WAIT, stopped)
        .await
        .is_err()
    {
        tracing::warn!("drain: turns did not stop in time; handing their claims back anyway");
    }
    let left: Vec<(String, Uuid)> = shared
        .running
        .lock()
        .map(|r| r.iter().map(|(id, t)| (id.clone(), *t)).collect())
        .unwrap_or_default();
    let release = railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "the drain's release",
        fence::release(&shared.pool, &left),
    );
    match release.await {
        Ok(n) => tracing::warn!(
            released = n,
            "drain timed out; unfinished claims handed back"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "drain timed out and claims not handed back; the sweep will")
        }
    }
}

/// How long a timed-out drain waits for its aborted turns to stop (each stops at its next
/// await, so this is a bound, not a wait).
const TURNS_STOP_WAIT: Duration = Duration::from_secs(5);

/// Retries `op` while Postgres is away, so no offset moves past an unanswered hint. Each
/// try has a deadline (`db::answered`): a primary that froze ends the try, and the next one
/// goes to whichever server the pool connects to then (after a failover, the promoted
/// standby). A Claim that committed without its answer is PROCESSING under a token nobody
/// holds; the processing sweep hands it back, as after a worker's crash.
async fn until_ok<T, F, Fut>(what: &'static str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    loop {
        match railhook_common::db::answered(railhook_common::db::ANSWER_WITHIN, what, op()).await {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// How long a worker keeps looking for the row of a hint that came ahead of it. Past it the
/// miss is left to the missed-hints sweep (sweeps.rs), which runs every sweep interval.
pub(crate) const VISIBILITY_WAIT: Duration = Duration::from_secs(120);
/// The first and the longest pause between two looks at a hint's missing row.
const LOOK_FIRST: Duration = Duration::from_millis(5);
const LOOK_MOST: Duration = Duration::from_secs(1);

/// The hints of a Claim statement that matched nothing: duplicates, or hints that came ahead
/// of their rows (`claim::invisible` says why that happens). The visibility check runs after
/// the Claim that missed, so a row it sees may have become visible in between: each such
/// row is claimed once more here, and only a row that was already visible when the Claim
/// missed it is a real duplicate, left alone.
///
/// A row still invisible may stay so for as long as its commit waits (review #34 item 1: a
/// synchronous standby that stalls keeps a locally committed row invisible for as long as
/// it stalls). Its id is recorded in `hint_misses` before this returns — so before the
/// hint's offset is stored — and a task of its own keeps looking, backing off from
/// [`LOOK_FIRST`] to [`LOOK_MOST`], for [`VISIBILITY_WAIT`]; when the row shows up it is
/// claimed and delivered with a permit of the fresh lane (such hints count in `answered`, with
/// the parked ones, not as misses). The consumer's loop does not wait
/// for any of it. If this worker dies meanwhile, or the row takes longer, the sweep finds the
/// record and hands the Delivery to the retry path within a sweep interval, not the
/// stranded sweep's hour.
async fn look_again(
    shared: &Shared,
    missed: Vec<String>,
    answered: &mut usize,
    lane: &Arc<Semaphore>,
) -> Vec<(claim::Claimed, claim::Target)> {
    let unseen = until_ok("visibility", || claim::invisible(&shared.pool, &missed)).await;
    let seen: Vec<String> = missed
        .iter()
        .filter(|id| !unseen.contains(id))
        .cloned()
        .collect();
    let mut won = Vec::new();
    if !seen.is_empty() {
        let got = claim(shared, &seen, answered).await;
        shared.metrics.early_hints.inc_by(got.len() as u64);
        won.extend(got);
    }
    if !unseen.is_empty() {
        shared.metrics.early_hints.inc_by(unseen.len() as u64);
        // Answered, not missed: the watcher below takes them over.
        *answered += unseen.len();
        until_ok("hint miss record", || {
            claim::record_misses(&shared.pool, &unseen)
        })
        .await;
        tokio::spawn(watch_for_rows(shared.clone(), unseen, lane.clone()));
    }
    won
}

/// Looks for the rows of `ids` until they show up, [`VISIBILITY_WAIT`] passes or the worker
/// drains, and delivers each one that does (see [`look_again`]).
async fn watch_for_rows(shared: Shared, mut ids: Vec<String>, lane: Arc<Semaphore>) {
    let started = Instant::now();
    let mut wait = LOOK_FIRST;
    while !ids.is_empty()
        && started.elapsed() < VISIBILITY_WAIT
        && !shared.draining.load(Ordering::SeqCst)
    {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LOOK_MOST);
        let look = railhook_common::db::answered(
            railhook_common::db::ANSWER_WITHIN,
            "a visibility look",
            claim::invisible(&shared.pool, &ids),
        );
        let Ok(unseen) = look.await else {
            continue;
        };
        let seen: Vec<String> = ids
            .iter()
            .filter(|id| !unseen.contains(id))
            .cloned()
            .collect();
        ids = unseen;
        if seen.is_empty() {
            continue;
        }
        let Ok(permits) = lane.clone().acquire_many_owned(seen.len() as u32).await else {
            return;
        };
        let mut parked = 0;
        let won = claim(&shared, &seen, &mut parked).await;
        let permits: Vec<OwnedSemaphorePermit> = split(permits, won.len());
        spawn_turns(&shared, won, permits);
    }
    if !ids.is_empty() {
        tracing::warn!(
            hints = ids.len(),
            "hints whose deliveries did not become visible in time; the missed-hints sweep hands them to the retry path"
        );
    }
}

/// `n` single permits out of `permits` (the rest go back when it is dropped).
fn split(mut permits: OwnedSemaphorePermit, n: usize) -> Vec<OwnedSemaphorePermit> {
    (0..n).filter_map(|_| permits.split(1)).collect()
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
        .with_label_values(&[DeferralReason::Ordering.as_str()])
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
pub(crate) async fn dispatch(
    shared: &Shared,
    lane: railhook_common::vocabulary::Lane,
    lane_permits: &Arc<Semaphore>,
    asks: Vec<Ask>,
    permits: Vec<OwnedSemaphorePermit>,
) {
    if asks.is_empty() {
        return;
    }
    // Ordered hints the Claim parked, and hints handed to the visibility watcher: answered,
    // not missed.
    let mut parked = 0;
    let won = if lane == railhook_common::vocabulary::Lane::Retry {
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
            won.extend(look_again(shared, missed, &mut parked, lane_permits).await);
        }
        won
    };
    let misses = asks.len().saturating_sub(won.len() + parked);
    shared.metrics.claim_misses.inc_by(misses as u64);
    spawn_turns(shared, won, permits);
}

/// Starts an Attempt task for each won Claim, each with one of `permits`.
fn spawn_turns(
    shared: &Shared,
    won: Vec<(claim::Claimed, claim::Target)>,
    mut permits: Vec<OwnedSemaphorePermit>,
) {
    for (claimed, target) in won {
        let Some(permit) = permits.pop() else {
            // More rows than hints cannot happen (one row per id); never send unpermitted.
            tracing::error!(delivery_id = %claimed.id, "claimed without a permit; the sweep will hand it back");
            continue;
        };
        let task_shared = shared.clone();
        let turn = async move {
            turns(&task_shared, claimed, target).await;
            drop(permit);
        };
        match shared.turn_tasks.lock() {
            Ok(mut set) => {
                // Reap what finished, so the set holds only running turns.
                while set.try_join_next().is_some() {}
                set.spawn(turn);
            }
            Err(_) => {
                tokio::spawn(turn);
            }
        }
    }
}
