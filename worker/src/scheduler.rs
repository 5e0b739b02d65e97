//! The retry scheduler and the sweeps. Each runs in its own task on its own timer, never on
//! the consumer's loop: a round that waits on Kafka acks or on a slow scan cannot hold the
//! polling past `max.poll.interval.ms` (review #19 item 2).

use std::time::Duration;

use futures::future::join_all;
use railhook_common::doorbell::Ringer;
use railhook_common::ids::{DeliveryId, EndpointId};
use railhook_common::kafka;
use railhook_common::kafka_producer::Producer;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::WorkerConfig;
use crate::metrics::{BacklogState, Sweep};
use crate::worker::Shared;
use crate::{claim, fence, sweeps};
use railhook_common::Word;
use railhook_common::retry_hint::RetryHint;
use railhook_common::vocabulary::BreakerState;

/// Most due rows one round takes.
const ROUND: i64 = 500;

/// Runs the retry scheduler every `scheduler_interval` until dropped (its task is aborted
/// with the worker). A round that could not publish everything gets a new producer.
pub(crate) async fn run_scheduler(
    shared: Shared,
    config: WorkerConfig,
    mut stop: watch::Receiver<bool>,
) {
    let new_producer = || kafka::producer(&config.kafka, config.message_timeout, 10_000);
    let mut producer = match new_producer() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "retry producer not created; retries are not scheduled");
            return;
        }
    };
    // Dozing workers hear about published RetryHints through the doorbell.
    let ringer = Ringer::spawn(
        (*shared.pool.connect_options())
            .clone()
            .application_name("railhook-scheduler-doorbell"),
    );
    let mut tick = tokio::time::interval(config.scheduler_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A stop lets the round in progress finish (its rows are published or handed back).
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        // A full round is followed at once by the next: a backlog of due retries drains at
        // the broker's pace, not one round per interval.
        loop {
            match schedule_retries(&shared, &config, &producer, &ringer).await {
                Round::Full if !*stop.borrow() => continue,
                Round::Full => break,
                Round::Partial => break,
                Round::PublishFailed => {
                    // A new producer id rather than librdkafka's epoch bump after the
                    // timeout, which tansu 0.6.0 cannot handle (relay.rs, `session`).
                    match new_producer() {
                        Ok(p) => producer = p,
                        Err(e) => tracing::warn!(error = %e, "retry producer not recreated"),
                    }
                    break;
                }
            }
        }
    }
}

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
        sweeps(&shared, &config).await;
    }
}

/// How a scheduler round ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Round {
    /// Took a whole batch: more may be due.
    Full,
    /// Took less than a batch (or could not read): wait for the next tick.
    Partial,
    /// Some hints were not acknowledged; their rows were handed back.
    PublishFailed,
}

/// One round of the retry scheduler: claims due rows and publishes a hint for each, all
/// queued at once and their acknowledgements awaited together. Once a hint is acknowledged
/// by Kafka the scheduler never writes that row again (the consumer owns it); only a row
/// whose hint failed is handed back.
#[tracing::instrument(level = "debug", skip_all)]
pub(crate) async fn schedule_retries(
    shared: &Shared,
    config: &WorkerConfig,
    producer: &Producer,
    ringer: &Ringer,
) -> Round {
    let due = match claim::claim_due(&shared.pool, ROUND).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "retry scheduler could not read due deliveries");
            return Round::Partial;
        }
    };
    let full = due.len() as i64 == ROUND;
    let hints: Vec<RetryHint> = due
        .into_iter()
        .map(|(delivery_id, endpoint_id, token)| RetryHint {
            delivery_id: DeliveryId::from_trusted(delivery_id),
            endpoint_id: EndpointId::from_trusted(endpoint_id),
            token,
        })
        .collect();
    let sends = hints.iter().map(|hint| {
        let payload = hint.encode();
        let queued = producer.send(&config.retries_topic, hint.endpoint_id.as_str(), &payload);
        async move {
            match queued {
                Ok(ack) => match ack.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("producer dropped".to_owned()),
                },
                Err(e) => Err(e.to_string()),
            }
        }
    });
    let results = join_all(sends).await;
    let mut published = Vec::new();
    let mut failed = Vec::new();
    let mut first_error = None;
    for (hint, result) in hints.iter().zip(results) {
        match result {
            Ok(()) => published.push(hint.token),
            Err(e) => {
                first_error.get_or_insert(e);
                failed.push((hint.delivery_id.to_string(), hint.token));
            }
        }
    }
    if !published.is_empty() {
        ringer.ring();
    }
    shared
        .metrics
        .retries_published
        .inc_by(published.len() as u64);
    mark_published(shared, &published).await;
    if let Some(error) = first_error {
        tracing::warn!(
            error,
            failed = failed.len(),
            "retry hints not published; handing their deliveries back"
        );
        if let Err(e) = fence::unclaim(&shared.pool, &failed).await {
            tracing::warn!(error = %e, "unpublished deliveries not handed back; the sweep will");
        }
        return Round::PublishFailed;
    }
    if full { Round::Full } else { Round::Partial }
}

/// Best-effort: a row left unmarked is swept back after the unpublished window and hinted
/// again, which the Claim absorbs.
pub(crate) async fn mark_published(shared: &Shared, tokens: &[Uuid]) {
    if let Err(e) = fence::mark_published(&shared.pool, tokens).await {
        tracing::warn!(error = %e, hints = tokens.len(), "published hints not marked; the sweep will hint them again");
    }
}

/// How long a row the scheduler took may wait for its hint's acknowledgement before the
/// sweep takes it back: twice the producer's whole retry budget for one message (4 min by
/// default). Taking one back early costs only a second hint, which the Claim absorbs.
pub(crate) fn unpublished_window(config: &WorkerConfig) -> Duration {
    config.message_timeout * 2
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
pub(crate) async fn sweeps(shared: &Shared, config: &WorkerConfig) {
    let processing = sweeps::sweep_processing(
        &shared.pool,
        config.processing_timeout.as_secs_f64(),
        config.stranded_after.as_secs_f64(),
        unpublished_window(config).as_secs_f64(),
    )
    .await;
    count_swept(shared, Sweep::Processing, processing);
    let stranded = sweeps::sweep_stranded(&shared.pool, config.stranded_after.as_secs_f64()).await;
    count_swept(shared, Sweep::Stranded, stranded);
    let missed =
        sweeps::sweep_missed_hints(&shared.pool, crate::handoff::VISIBILITY_WAIT.as_secs_f64())
            .await;
    count_swept(shared, Sweep::MissedHint, missed);
    if let Ok((scheduled, due)) = sweeps::retry_backlog(&shared.pool).await {
        let backlog = &shared.metrics.retry_backlog;
        backlog
            .with_label_values(&[BacklogState::Scheduled.as_str()])
            .set(scheduled);
        backlog
            .with_label_values(&[BacklogState::Due.as_str()])
            .set(due);
    }
    if let Ok((due, unclaimed)) = sweeps::oldest_waiting(&shared.pool).await {
        shared.metrics.oldest_due_retry_age.set(due);
        shared.metrics.oldest_unclaimed_age.set(unclaimed);
    }
    if let Ok(counts) = sweeps::breaker_counts(&shared.pool).await {
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
