//! The retry scheduler and the sweeps: what runs on the worker loop's timers.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use crate::config::WorkerConfig;
use crate::hint::RetryHint;
use crate::store::{self};
use crate::worker::Shared;

/// The retry scheduler: claims due rows and publishes a hint for each. Once a hint is
/// acknowledged by Kafka the scheduler never writes that row again (the consumer owns it);
/// only a failed publish hands the row back. The first failed publish ends the round and
/// hands back the rest too: the broker is away, and trying each hint would hold the loop for
/// a message timeout apiece.
pub(crate) async fn schedule_retries(
    shared: &Shared,
    config: &WorkerConfig,
    producer: &FutureProducer,
) -> Result<(), KafkaError> {
    let due = match store::claim_due(&shared.pool, 500).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "retry scheduler could not read due deliveries");
            return Ok(());
        }
    };
    let mut due = due.into_iter();
    let mut published = Vec::new();
    while let Some((delivery_id, endpoint_id, token)) = due.next() {
        let hint = RetryHint {
            delivery_id,
            endpoint_id,
            token,
        };
        let payload = hint.encode();
        let record = FutureRecord::to(&config.retries_topic)
            .key(&hint.endpoint_id)
            .payload(&payload);
        match producer.send(record, Duration::from_secs(5)).await {
            Ok(_) => {
                shared.metrics.retries_published.inc();
                published.push(hint.token);
            }
            Err((e, _)) => {
                mark_published(shared, &published).await;
                tracing::warn!(error = %e, "retry hint not published; handing the round's deliveries back");
                let _ = store::unclaim(&shared.pool, &hint.delivery_id, hint.token).await;
                for (id, _, token) in due {
                    let _ = store::unclaim(&shared.pool, &id, token).await;
                }
                return Err(e);
            }
        }
    }
    mark_published(shared, &published).await;
    Ok(())
}

/// Best-effort: a row left unmarked is swept back after the unpublished window and hinted
/// again, which the Claim absorbs.
pub(crate) async fn mark_published(shared: &Shared, tokens: &[Uuid]) {
    if let Err(e) = store::mark_published(&shared.pool, tokens).await {
        tracing::warn!(error = %e, hints = tokens.len(), "published hints not marked; the sweep will hint them again");
    }
}

/// How long a row the scheduler took may wait for its hint's acknowledgement before the
/// sweep takes it back: twice the producer's whole retry budget for one message (4 min by
/// default). Taking one back early costs only a second hint, which the Claim absorbs.
pub(crate) fn unpublished_window(config: &WorkerConfig) -> Duration {
    config.message_timeout * 2
}

pub(crate) async fn sweeps(shared: &Shared, config: &WorkerConfig) {
    match store::sweep_processing(
        &shared.pool,
        config.processing_timeout.as_secs_f64(),
        config.stranded_after.as_secs_f64(),
        unpublished_window(config).as_secs_f64(),
    )
    .await
    {
        Ok(n) => shared
            .metrics
            .swept
            .with_label_values(&["processing"])
            .inc_by(n),
        Err(e) => tracing::warn!(error = %e, "processing sweep failed"),
    }
    match store::sweep_stranded(&shared.pool, config.stranded_after.as_secs_f64()).await {
        Ok(n) => shared
            .metrics
            .swept
            .with_label_values(&["stranded"])
            .inc_by(n),
        Err(e) => tracing::warn!(error = %e, "stranded sweep failed"),
    }
    if let Ok((scheduled, due)) = store::retry_backlog(&shared.pool).await {
        let backlog = &shared.metrics.retry_backlog;
        backlog.with_label_values(&["scheduled"]).set(scheduled);
        backlog.with_label_values(&["due"]).set(due);
    }
    if let Ok(counts) = store::breaker_counts(&shared.pool).await {
        for state in crate::metrics::BREAKER_STATES {
            let n = counts
                .iter()
                .find(|(s, _)| s == state)
                .map_or(0, |(_, n)| *n);
            shared
                .metrics
                .endpoint_breakers
                .with_label_values(&[state])
                .set(n);
        }
    }
}
