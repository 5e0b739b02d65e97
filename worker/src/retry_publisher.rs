//! The retry publisher: takes due retries (PENDING with `next_retry_at` passed) under a
//! Claim of its own and publishes a RetryHint for each to the retry topic. It runs in its
//! own task on its own timer, never on the consumer's loop, as the sweeps do (sweeps.rs): a
//! round that waits on Kafka acks cannot hold the polling past `max.poll.interval.ms`
//! (review #19 item 2).

use std::time::Duration;

use futures::future::join_all;
use railhook_common::doorbell::Ringer;
use railhook_common::ids::{DeliveryId, EndpointId};
use railhook_common::kafka;
use railhook_common::kafka_producer::Producer;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::WorkerConfig;
use crate::runtime::Shared;
use crate::{claim, fence};
use railhook_common::retry_hint::RetryHint;

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
    let ringer = Ringer::spawn(railhook_common::doorbell::Dial::Pool(
        shared.pool.clone(),
        "railhook-scheduler-doorbell",
    ));
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
    // Each statement has a deadline (`db::answered`): a frozen primary ends the round.
    let due = match railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "the due retries",
        claim::claim_due(&shared.pool, ROUND),
    )
    .await
    {
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
        let unclaim = railhook_common::db::answered(
            railhook_common::db::ANSWER_WITHIN,
            "an unclaim",
            fence::unclaim(&shared.pool, &failed),
        );
        if let Err(e) = unclaim.await {
            tracing::warn!(error = %e, "unpublished deliveries not handed back; the sweep will");
        }
        return Round::PublishFailed;
    }
    if full { Round::Full } else { Round::Partial }
}

/// Best-effort: a row left unmarked is swept back after the unpublished window and hinted
/// again, which the Claim absorbs.
pub(crate) async fn mark_published(shared: &Shared, tokens: &[Uuid]) {
    let mark = railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "a published mark",
        fence::mark_published(&shared.pool, tokens),
    );
    if let Err(e) = mark.await {
        tracing::warn!(error = %e, hints = tokens.len(), "published hints not marked; the sweep will hint them again");
    }
}

/// How long a row the scheduler took may wait for its hint's acknowledgement before the
/// sweep takes it back: twice the producer's whole retry budget for one message (4 min by
/// default). Taking one back early costs only a second hint, which the Claim absorbs.
pub(crate) fn unpublished_window(config: &WorkerConfig) -> Duration {
    config.message_timeout * 2
}
