//! Kafka as a transport: one idempotent `acks=all` producer per endpoint's settings; an
//! Attempt is delivered when the cluster acknowledged the record (its partition and offset
//! are the Attempt's evidence).
//!
//! The record's key is the endpoint's ordering key (mod.rs, `ordering_key`), so an ordered
//! endpoint's Deliveries, which the worker sends one at a time in Sequence Number order,
//! land in one partition in that order. The Standard Webhooks headers travel as record
//! headers.
//!
//! SSRF: librdkafka resolves and connects by itself, to the bootstrap brokers and then to
//! every broker the cluster's metadata names. Before a producer is used, the bootstrap
//! names and every broker of the cluster's metadata are resolved and checked by the guard
//! (mod.rs, `guard`); a cluster that names a refused address is refused. What this cannot
//! see: a broker name whose DNS answer changes after the check (docs/DESTINATIONS.md).

use std::sync::Arc;
use std::time::Duration;

use railhook_common::transport::KafkaTarget;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::{BrokerError, Pool, Stopwatch, guard, ordering_key, pool_key};
use crate::attempt::{Attempt, Report};
use crate::ssrf::Allowlist;

#[derive(Clone)]
pub struct Producers {
    pool: Arc<Pool<FutureProducer>>,
    allow: Allowlist,
}

impl Producers {
    pub fn new(allow: Allowlist) -> Self {
        Self {
            pool: Arc::new(Pool::default()),
            allow,
        }
    }

    pub async fn send(&self, a: &Attempt, k: &KafkaTarget) -> Report {
        let watch = Stopwatch::start();
        let key = pool_key(k, &a.timeout.as_millis().to_string());
        let answer = async {
            let producer = self.pool.get(&key, open(k, &self.allow, a.timeout)).await?;
            let answer = produce(&producer, a, k).await;
            if matches!(&answer, Err(e) if e.class != crate::attempt::ErrorClass::BrokerRefused) {
                self.pool.forget(&key);
            }
            answer
        }
        .await;
        watch.report(answer)
    }
}

async fn produce(
    producer: &FutureProducer,
    a: &Attempt,
    k: &KafkaTarget,
) -> Result<String, BrokerError> {
    let timestamp = chrono::Utc::now().timestamp();
    let pairs = a.signed_headers(timestamp);
    let mut headers = OwnedHeaders::new_with_capacity(pairs.len());
    for (name, value) in &pairs {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    let key = ordering_key(a, &k.key);
    let record = FutureRecord::to(&k.topic)
        .key(&key)
        .payload(a.body.as_ref())
        .headers(headers);
    // The producer's message.timeout.ms is the Attempt's timeout: librdkafka answers within
    // it, acknowledged or not.
    match producer.send(record, Duration::from_secs(0)).await {
        Ok(delivery) => Ok(format!(
            "kafka: acknowledged (acks=all) at partition {} offset {}",
            delivery.partition, delivery.offset
        )),
        Err((e, _)) => Err(classify(&e)),
    }
}

/// A produce error in Railhook's words: what no retry changes is refused, the rest is
/// unavailable (or throttled).
fn classify(e: &KafkaError) -> BrokerError {
    let message = format!("kafka: {e}");
    let Some(code) = e.rdkafka_error_code() else {
        return BrokerError::unavailable(message);
    };
    use RDKafkaErrorCode as C;
    match code {
        C::UnknownTopicOrPartition
        | C::UnknownTopic
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::MessageSizeTooLarge
        | C::InvalidTopic
        | C::InvalidRecord
        | C::SaslAuthenticationFailed
        | C::Authentication
        | C::InvalidRequiredAcks => BrokerError::refused(message),
        C::ThrottlingQuotaExceeded => BrokerError::throttled(message),
        _ => BrokerError::unavailable(message),
    }
}

/// A producer for `k`, its cluster checked by the SSRF guard first.
async fn open(
    k: &KafkaTarget,
    allow: &Allowlist,
    timeout: Duration,
) -> Result<FutureProducer, BrokerError> {
    for broker in &k.brokers {
        if let Some((host, port)) = railhook_common::transport::host_port(broker) {
            guard(allow, &host, port).await?;
        }
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", k.brokers.join(","))
        .set("client.id", "railhook-endpoint")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set(
            "message.timeout.ms",
            timeout.as_millis().max(1000).to_string(),
        )
        .set(
            "socket.timeout.ms",
            timeout.as_millis().max(1000).to_string(),
        )
        .set("linger.ms", "0")
        // Railhook never creates a receiver's topics: a missing one is refused (below).
        .set("allow.auto.create.topics", "false")
        .set("topic.metadata.refresh.interval.ms", "60000")
        .set("log_level", "3");
    if let Some(s) = &k.security {
        config.set("security.protocol", &s.protocol);
        if let Some(m) = &s.sasl_mechanism {
            config.set("sasl.mechanism", m);
        }
        if let Some(u) = &s.sasl_username {
            config.set("sasl.username", u);
        }
        if let Some(p) = &s.sasl_password {
            config.set("sasl.password", p);
        }
        if let Some(pem) = &s.ssl_ca_pem {
            config.set("ssl.ca.pem", pem);
        }
    }
    let producer: FutureProducer = config
        .create()
        .map_err(|e| BrokerError::refused(format!("kafka: cannot build a producer: {e}")))?;
    // The cluster's own brokers, as its metadata names them, through the guard too.
    let probe = producer.clone();
    let topic = k.topic.clone();
    let wait = timeout.max(Duration::from_secs(1));
    let (brokers, topic_error) = tokio::task::spawn_blocking(move || {
        probe.client().fetch_metadata(Some(&topic), wait).map(|m| {
            let brokers = m
                .brokers()
                .iter()
                .map(|b| (b.host().to_owned(), u16::try_from(b.port()).unwrap_or(0)))
                .collect::<Vec<_>>();
            let topic_error = m
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .and_then(|t| t.error())
                .map(RDKafkaErrorCode::from);
            (brokers, topic_error)
        })
    })
    .await
    .map_err(|_| BrokerError::unavailable("kafka: the metadata request did not finish"))?
    .map_err(|e| classify(&e))?;
    for (host, port) in brokers {
        guard(allow, &host, port).await?;
    }
    // A topic the cluster says it does not have (and does not create) is refused here: a
    // produce to it would wait out its timeout on every Attempt of the ladder instead.
    if let Some(code) = topic_error {
        return Err(classify(&KafkaError::MetadataFetch(code)));
    }
    Ok(producer)
}
