//! The producer the relay and the retry scheduler publish with: rdkafka's `BaseProducer`
//! with an acknowledgement future per message, like rdkafka's `FutureProducer`, but served
//! by a thread that polls in one-second rounds instead of 100 ms ones.
//!
//! Why not `FutureProducer` (measured, issue #21): its thread calls `BaseProducer::poll`
//! with 100 ms, and that call loops until its deadline, handing librdkafka the remaining
//! time truncated to whole milliseconds. librdkafka's wait ends a little before the
//! deadline, so each round ends in a busy loop of `poll(0)` for up to a millisecond: about
//! 1 % of a core per idle producer (`perf` on an idle relay: 84 % of its samples in that
//! thread, mostly `clock_gettime`). One-second rounds cost a tenth of that. Acks are not
//! delayed: the call hands each delivery report to its future as it arrives, whatever the
//! round's length.
//!
//! Dropping the last clone tells the thread to stop; it ends within a round and then drops
//! the `BaseProducer`, which purges what is still queued (its futures resolve as failed)
//! without holding up the caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::channel::oneshot;
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};

/// How long one polling round lasts.
const ROUND: Duration = Duration::from_secs(1);

/// Resolves to the broker's answer for one message: `Ok(Ok(_))` once it is acknowledged,
/// `Ok(Err(_))` when it failed, `Err(Canceled)` if the producer went away first.
pub type Ack = oneshot::Receiver<OwnedDeliveryResult>;

/// Completes each message's [`Ack`] from its delivery report.
pub struct AckContext;

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let owned = match result {
            Ok(m) => Ok(Delivery {
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp(),
            }),
            Err((e, m)) => Err((e.clone(), m.detach())),
        };
        // The receiver gone means nobody waits for this ack any more.
        let _ = tx.send(owned);
    }
}

struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A producer whose messages each get an [`Ack`]; cheap to clone.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<BaseProducer<AckContext>>,
    _stop: Arc<Stop>,
}

impl Producer {
    /// Creates the producer and its polling thread.
    pub fn create(config: &ClientConfig) -> Result<Self, KafkaError> {
        let inner: Arc<BaseProducer<AckContext>> =
            Arc::new(config.create_with_context(AckContext)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopping) = (inner.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kafka-acks".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    polled.poll(ROUND);
                }
            })
            .map_err(|_| KafkaError::ClientCreation("polling thread not started".into()))?;
        Ok(Self {
            inner,
            _stop: Arc::new(Stop(stop)),
        })
    }

    /// How many partitions `topic` has, from the broker's metadata (`None` if it did not
    /// answer within `within`).
    pub async fn partition_count(&self, topic: &str, within: Duration) -> Option<i32> {
        let (inner, topic) = (self.inner.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let metadata = rdkafka::producer::Producer::client(&*inner)
                .fetch_metadata(Some(&topic), within)
                .ok()?;
            let partitions = metadata.topics().first()?.partitions().len();
            i32::try_from(partitions).ok().filter(|n| *n > 0)
        })
        .await
        .ok()
        .flatten()
    }

    /// Queues one message, without headers (relay.rs `produce` says why); its [`Ack`]
    /// resolves when the broker answered. An error here means librdkafka refused to queue
    /// it (its queue is full, the topic is unknown…).
    pub fn send(&self, topic: &str, key: &str, payload: &[u8]) -> Result<Ack, KafkaError> {
        let (tx, rx) = oneshot::channel();
        let record = BaseRecord::with_opaque_to(topic, Box::new(tx))
            .key(key)
            .payload(payload);
        self.inner.send(record).map_err(|(e, _)| e)?;
        Ok(rx)
    }
}

/// The partition librdkafka's default partitioner (`consistent_random`) gives a message
/// with a non-empty `key` on a topic of `partitions`: the key's CRC-32 (ISO-HDLC, zlib's)
/// modulo the count. The relay uses it to send an express hint before the broker
/// acknowledged (relay.rs, `produce`); the acknowledgement says where the message went, and
/// a wrong guess (another `partitioner` in `KAFKA_PROPERTIES`, a partition count changed
/// since the session began) is made good there.
pub fn predicted_partition(key: &str, partitions: i32) -> Option<i32> {
    const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    let count = u32::try_from(partitions).ok().filter(|n| *n > 0)?;
    if key.is_empty() {
        return None;
    }
    i32::try_from(CRC32.checksum(key.as_bytes()) % count).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_as_librdkafka_hashes_them() {
        // zlib's crc32("123456789") is 0xCBF43926, the check value of CRC-32/ISO-HDLC.
        assert_eq!(
            predicted_partition("123456789", i32::MAX),
            Some((0xCBF4_3926u32 % i32::MAX as u32) as i32)
        );
        assert_eq!(predicted_partition("", 12), None);
        assert_eq!(predicted_partition("ep_1", 0), None);
        let p = predicted_partition("ep_01m97wan5wc9ecxzpk4ccsb460", 12).expect("a partition");
        assert!((0..12).contains(&p));
    }
}
