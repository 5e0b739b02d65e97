//! The sweeps: their loop (every `sweep_interval`, in a task of its own, never on the
//! consumer's loop), their statements, and the reads behind the gauges each round refreshes.
//!
//! The sweeps are how a Claim that nobody will finish ends: a worker killed mid-Attempt, a
//! RetryHint lost with its broker, an Outbox row a lost Slot never carried. Both hand rows
//! back to PENDING with the token cleared, so the stalled owner's late write is refused by
//! the Fence (fence.rs).

use railhook_common::Word;
use railhook_common::vocabulary::BreakerState;
use sqlx::PgPool;
use tokio::sync::watch;

use crate::config::WorkerConfig;
use crate::metrics::{BacklogState, Sweep};
use crate::retry_publisher::unpublished_window;
use crate::runtime::Shared;

/// Runs the sweeps every `sweep_interval` until dropped.
pub(crate) async fn run_sweeps(
    shared: Shared,
    config: WorkerConfig,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        // A round has a deadline (`db::answered`): a primary that froze ends it, and the
        // next round runs on the primary in charge then.
        let within = railhook_common::db::SWEEP_ANSWER_WITHIN;
        let round = async {
            sweep_round(&shared, &config).await;
            Ok(())
        };
        if let Err(e) = railhook_common::db::answered(within, "a sweep round", round).await {
            tracing::warn!(error = %e, "sweep round abandoned");
        }
    }
}

/// Counts what one sweep moved under its `sweep` label, or says that it failed.
fn count_swept(shared: &Shared, sweep: Sweep, result: Result<u64, sqlx::Error>) {
    match result {
        Ok(n) => shared
            .metrics
            .swept
            .with_label_values(&[sweep.as_str()])
            .inc_by(n),
        Err(e) => tracing::warn!(error = %e, sweep = sweep.as_str(), "sweep failed"),
    }
}

#[tracing::instrument(level = "debug", skip_all)]
pub(crate) async fn sweep_round(shared: &Shared, config: &WorkerConfig) {
    let processing = sweep_processing(
        &shared.pool,
        config.processing_timeout.as_secs_f64(),
        config.stranded_after.as_secs_f64(),
        unpublished_window(config).as_secs_f64(),
    )
    .await;
    count_swept(shared, Sweep::Processing, processing);
    let stranded = sweep_stranded(&shared.pool, config.stranded_after.as_secs_f64()).await;
    count_swept(shared, Sweep::Stranded, stranded);
    let missed =
        sweep_missed_hints(&shared.pool, crate::dispatch::VISIBILITY_WAIT.as_secs_f64()).await;
    count_swept(shared, Sweep::MissedHint, missed);
    if let Ok((scheduled, due)) = retry_backlog(&shared.pool).await {
        let backlog = &shared.metrics.retry_backlog;
        backlog
            .with_label_values(&[BacklogState::Scheduled.as_str()])
            .set(scheduled);
        backlog
            .with_label_values(&[BacklogState::Due.as_str()])
            .set(due);
    }
    if let Ok((due, unclaimed)) = oldest_waiting(&shared.pool).await {
        shared.metrics.oldest_due_retry_age.set(due);
        shared.metrics.oldest_unclaimed_age.set(unclaimed);
    }
    if let Ok(counts) = breaker_counts(&shared.pool).await {
        for state in BreakerState::ALL {
            let n = counts
                .iter()
                .find(|(s, _)| s == state.as_str())
                .map_or(0, |(_, n)| *n);
            shared
                .metrics
                .endpoint_breakers
                .with_label_values(&[state.as_str()])
                .set(n);
        }
    }
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

/// Sweep 3: Deliveries whose hint a worker recorded as ahead of its row more than
/// `older_than_secs` ago (dispatch.rs, `look_again`) and that are still waiting for a first
/// hint go to the retry path; every such record older than that is then deleted. Runs every
/// sweep interval, so a hint given up on costs a sweep interval, not the stranded hour.
pub async fn sweep_missed_hints(pool: &PgPool, older_than_secs: f64) -> Result<u64, sqlx::Error> {
    let swept = sqlx::query!(
        "WITH old AS (
             DELETE FROM hint_misses WHERE missed_at < now() - make_interval(secs => $1)
             RETURNING delivery_id
         )
         UPDATE deliveries d SET next_retry_at = now(), updated_at = now()
         FROM old
         WHERE d.id = old.delivery_id AND d.status = 'PENDING' AND d.next_retry_at IS NULL",
        older_than_secs
    )
    .execute(pool)
    .await?;
    Ok(swept.rows_affected())
}

/// The retry backlog: PENDING Deliveries with a retry scheduled, and how many of them are
/// already due (a due count that stays high means the scheduler or the workers fall behind).
/// Both counts come from the partial index `deliveries_due_idx`.
pub async fn retry_backlog(pool: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "scheduled!", count(*) FILTER (WHERE next_retry_at <= now()) AS "due!"
           FROM deliveries WHERE status = 'PENDING' AND next_retry_at IS NOT NULL"#,
    )
    .fetch_one(pool)
    .await?;
    Ok((r.scheduled, r.due))
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
