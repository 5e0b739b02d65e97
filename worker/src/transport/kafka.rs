//! Kafka as a transport: one idempotent `acks=all` producer per endpoint's settings; an
//! Attempt is delivered when the cluster acknowledged the record (its partition and offset
//! are the Attempt's evidence).
//!
//! The record's key is the endpoint's ordering key (mod.rs, `ordering_key`), so an ordered
//! endpoint's Deliveries, which the worker sends one at a time in Sequence Number order,
//! land in one partition in that order. The Standard Webhooks headers travel as record
//! headers.
//!
//! Egress: librdkafka resolves and connects by itself, to the bootstrap brokers and then
//! to every broker the cluster's metadata names, now or after a leader move or a refresh.
//! So the rule (ssrf.rs) is librdkafka's `connect_cb` ([`connect_checked`]): it sees the
//! socket address of every broker connection the producer opens and refuses one outside
//! the allowlist before `connect(2)` (issue #53: the check had run once, when the producer
//! opened, and later metadata could name any address). The callback is installed before
//! the producer knows any broker: it is created without `bootstrap.servers`, and the
//! brokers are added (`rd_kafka_brokers_add`) once the callback is in place. The bootstrap
//! names are also checked with `guard` before the producer is built, so an Attempt towards a refused
//! bootstrap address says so at once; a broker the metadata names and the callback refuses
//! makes the produce fail at its timeout, reported as that refusal ([`refusal`]).

use std::ffi::{CString, c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use railhook_common::transport::KafkaTarget;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use tokio::sync::oneshot;

use super::{BrokerError, Pool, Stopwatch, guard, ordering_key, pool_key};
use crate::attempt::{Attempt, Report};
use crate::ssrf::Allowlist;

/// What a produce's delivery report answers: the partition and offset, or why not.
type Acknowledgement = Result<(i32, i64), KafkaError>;

/// An endpoint's producer. Its context is what `connect_cb` reads.
type EndpointProducer = ThreadedProducer<Guarded>;

/// The context of an endpoint's producer: the allowlist `connect_cb` applies, and the last
/// address it refused (for the Attempt's words).
struct Guarded {
    allow: Allowlist,
    refused: Mutex<Option<IpAddr>>,
}

impl ClientContext for Guarded {}

impl ProducerContext for Guarded {
    type DeliveryOpaque = Box<oneshot::Sender<Acknowledgement>>;

    fn delivery(&self, result: &DeliveryResult<'_>, reply: Self::DeliveryOpaque) {
        let answer = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.clone()),
        };
        let _ = reply.send(answer);
    }
}

/// librdkafka's socket connect callback: the egress rule on the address the broker socket
/// is about to connect to, then the `connect(2)` librdkafka would have made (non-blocking:
/// `EINPROGRESS` is a connection under way). Returns 0 or an errno, as librdkafka asks.
///
/// # Safety
/// librdkafka calls it with a valid socket, `addr` of `addrlen` bytes, and `opaque` set by
/// rdkafka to the producer's context (`Arc<Guarded>`), which outlives the client.
#[allow(unsafe_code)]
unsafe extern "C" fn connect_checked(
    sockfd: c_int,
    addr: *const libc::sockaddr,
    addrlen: c_int,
    _id: *const c_char,
    opaque: *mut c_void,
) -> c_int {
    // SAFETY: see above; rdkafka sets the opaque to the context before any broker exists.
    let context = unsafe { &*(opaque as *const Guarded) };
    // SAFETY: `addr` points at `addrlen` bytes of a socket address.
    let Some(ip) = (unsafe { ip_of(addr, addrlen) }) else {
        return libc::EAFNOSUPPORT;
    };
    if !context.allow.permits(ip) {
        if let Ok(mut last) = context.refused.lock() {
            *last = Some(ip);
        }
        return libc::EACCES;
    }
    // SAFETY: the arguments are librdkafka's own, passed on unchanged.
    let r = unsafe { libc::connect(sockfd, addr, addrlen as libc::socklen_t) };
    if r == 0 {
        return 0;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EINPROGRESS) => 0,
        Some(e) => e,
        None => libc::EIO,
    }
}

/// The IP address of an IPv4 or IPv6 socket address.
///
/// # Safety
/// `addr` points at `len` readable bytes.
#[allow(unsafe_code)]
unsafe fn ip_of(addr: *const libc::sockaddr, len: c_int) -> Option<IpAddr> {
    if addr.is_null() {
        return None;
    }
    let len = usize::try_from(len).ok()?;
    // SAFETY: a sockaddr starts with its family; the casts below are checked by length.
    match c_int::from(unsafe { (*addr).sa_family }) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            let v4 = unsafe { &*(addr as *const libc::sockaddr_in) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let v6 = unsafe { &*(addr as *const libc::sockaddr_in6) };
            Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

#[derive(Clone)]
pub struct Producers {
    pool: Arc<Pool<EndpointProducer>>,
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
    producer: &EndpointProducer,
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
    let (reply, acknowledged) = oneshot::channel();
    let record = BaseRecord::with_opaque_to(&k.topic, Box::new(reply))
        .key(&key)
        .payload(a.body.as_ref())
        .headers(headers);
    producer.send(record).map_err(|(e, _)| classify(&e))?;
    // The producer's message.timeout.ms is the Attempt's timeout: librdkafka answers within
    // it, acknowledged or not.
    let answer = acknowledged
        .await
        .unwrap_or_else(|_| Err(KafkaError::Canceled));
    match answer {
        Ok((partition, offset)) => Ok(format!(
            "kafka: acknowledged (acks=all) at partition {partition} offset {offset}"
        )),
        Err(e) => Err(refusal(producer).unwrap_or_else(|| classify(&e))),
    }
}

/// The address `connect_cb` last refused for this producer, as the Attempt's answer: a
/// produce that fails because every broker it may reach is refused says so.
fn refusal(producer: &EndpointProducer) -> Option<BrokerError> {
    let ip = producer.context().refused.lock().ok()?.take()?;
    Some(BrokerError::target_refused(format!(
        "kafka: broker address {ip} is not allowed (private, loopback or otherwise non-global)"
    )))
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

/// A producer for `k`, every connection it opens under the egress rule.
async fn open(
    k: &KafkaTarget,
    allow: &Allowlist,
    timeout: Duration,
) -> Result<EndpointProducer, BrokerError> {
    for broker in &k.brokers {
        if let Some((host, port)) = railhook_common::transport::host_port(broker) {
            guard(allow, &host, port).await?;
        }
    }
    let mut config = ClientConfig::new();
    // No bootstrap.servers: the brokers are added below, once connect_cb is installed.
    config
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
    let producer: EndpointProducer = config
        .create_with_context(Guarded {
            allow: allow.clone(),
            refused: Mutex::new(None),
        })
        .map_err(|e| BrokerError::refused(format!("kafka: cannot build a producer: {e}")))?;
    let brokers = CString::new(k.brokers.join(","))
        .map_err(|_| BrokerError::refused("kafka: a broker address holds a NUL"))?;
    let rk = producer.client().native_ptr();
    // SAFETY: `rk` is the live client. Its configuration is read by broker threads when
    // they connect, and no broker thread exists yet (no bootstrap.servers), so setting the
    // callback races with nothing; the callback's opaque is the context rdkafka set.
    #[allow(unsafe_code)]
    let added = unsafe {
        let conf = rdkafka::bindings::rd_kafka_conf(rk).cast_mut();
        rdkafka::bindings::rd_kafka_conf_set_connect_cb(conf, Some(connect_checked));
        rdkafka::bindings::rd_kafka_brokers_add(rk, brokers.as_ptr())
    };
    if added == 0 {
        return Err(BrokerError::refused(
            "kafka: no broker address could be added",
        ));
    }
    let probe = producer.clone();
    let topic = k.topic.clone();
    let wait = timeout.max(Duration::from_secs(1));
    // The cluster's metadata: whether it has the topic. The brokers it names are not
    // checked here: connect_cb checks each connection to them, now and after any later
    // metadata, against the address actually connected to.
    let topic_error = tokio::task::spawn_blocking(move || {
        probe.client().fetch_metadata(Some(&topic), wait).map(|m| {
            m.topics()
                .iter()
                .find(|t| t.name() == topic)
                .and_then(|t| t.error())
                .map(RDKafkaErrorCode::from)
        })
    })
    .await
    .map_err(|_| BrokerError::unavailable("kafka: the metadata request did not finish"))?
    .map_err(|e| classify(&e))?;
    // A topic the cluster says it does not have (and does not create) is refused here: a
    // produce to it would wait out its timeout on every Attempt of the ladder instead.
    if let Some(code) = topic_error {
        return Err(classify(&KafkaError::MetadataFetch(code)));
    }
    Ok(producer)
}
