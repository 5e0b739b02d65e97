//! Kafka set-up shared by the relay and the worker: topic names, the idempotent `acks=all`
//! producer, and topic creation.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureProducer;

/// The deliveries topic (Announcements from the relay), under the configured prefix.
pub fn deliveries_topic(prefix: &str) -> String {
    format!("{prefix}deliveries")
}

/// The retry topic (hints from the retry scheduler), under the configured prefix.
pub fn retries_topic(prefix: &str) -> String {
    format!("{prefix}retries")
}

/// `enable.idempotence` makes librdkafka's own retries write each message once per
/// partition, in order; `acks=all` means an acknowledgement survives the loss of a broker.
/// Only such an acknowledgement lets the relay confirm an LSN.
pub fn producer(
    brokers: &str,
    message_timeout: Duration,
    queue_messages: usize,
) -> Result<FutureProducer, KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("compression.type", "none")
        .set(
            "message.timeout.ms",
            message_timeout.as_millis().to_string(),
        )
        // The window bounds what is in flight; librdkafka's own queue gets ample headroom so
        // it never refuses a message the window admitted.
        .set(
            "queue.buffering.max.messages",
            (queue_messages * 4 + 10_000).to_string(),
        )
        .set("reconnect.backoff.max.ms", "1000")
        .create()
}

/// Creates the topic with `partitions` if it does not exist yet.
pub async fn ensure_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}
