//! RabbitMQ (AMQP 0-9-1) as a transport: one connection and one confirm-mode channel per
//! endpoint's settings; each Attempt is a persistent, `mandatory` publish, delivered when
//! the broker's publisher confirm (`basic.ack`) arrives for it and it was not returned as
//! unroutable. A `basic.nack` or a lost connection is worth another Attempt; a missing
//! exchange (404), a refused login or permission (403) and an unroutable message are not.
//!
//! One channel per endpoint publishes in the order the worker sends, so an ordered
//! endpoint's Deliveries reach the queue in Sequence Number order. The Standard Webhooks
//! headers travel as the message's `headers` table, `message_id` is the Delivery id.
//!
//! Egress: lapin's connector is ours ([`open`]): every connection it makes, the first and
//! each reconnection, resolves the broker's name through the egress rule (ssrf.rs) and
//! connects the socket to a checked address; `amqps://` then verifies the certificate
//! against the name. lapin never resolves or parses the host itself (issue #53: an IPv6
//! address written back into the URL string was re-parsed by lapin as `localhost`).

use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use railhook_common::transport::RabbitmqTarget;

use super::{BrokerError, Pool, Stopwatch, guard, pool_key};
use crate::attempt::{Attempt, Report};
use crate::ssrf::Allowlist;

/// An open connection and its confirm-mode channel.
type Link = Arc<(Connection, Channel)>;

#[derive(Clone)]
pub struct Channels {
    pool: Arc<Pool<Link>>,
    allow: Allowlist,
}

impl Channels {
    pub fn new(allow: Allowlist) -> Self {
        Self {
            pool: Arc::new(Pool::default()),
            allow,
        }
    }

    pub async fn send(&self, a: &Attempt, r: &RabbitmqTarget) -> Report {
        let watch = Stopwatch::start();
        let key = pool_key(r, "");
        let answer = tokio::time::timeout(a.timeout, async {
            let link = self.pool.get(&key, open(r, &self.allow)).await?;
            publish(&link.1, a, r).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(BrokerError::unavailable(
                "rabbitmq: no publisher confirm within the timeout",
            ))
        });
        if answer.is_err() {
            // A channel that saw an error is closed by the broker, a refusal included: a
            // publish to a missing exchange (404), a denied one (403) or a bad frame (406) is
            // a channel exception in AMQP 0-9-1. Kept, the closed channel would fail the next
            // Attempt too, even after the cause was fixed (the likely cause of a test flake:
            // Failed Messages retried after the exchange was made, not delivered in 120 s).
            // Open a new one next time; an unroutable message (which leaves the channel open)
            // costs one reconnect.
            if let Some(link) = self.pool.take(&key) {
                tokio::spawn(async move {
                    let _ = link.0.close(200, "railhook: reopening".into()).await;
                });
            }
        }
        watch.report(answer)
    }
}

async fn open(r: &RabbitmqTarget, allow: &Allowlist) -> Result<Link, BrokerError> {
    let url = url::Url::parse(&r.url)
        .map_err(|_| BrokerError::refused("rabbitmq: the URL does not parse"))?;
    let tls = url.scheme() == "amqps";
    let host = crate::ssrf::host_of(&url)
        .ok_or_else(|| BrokerError::refused("rabbitmq: the URL has no host"))?;
    let port = url.port().unwrap_or(if tls { 5671 } else { 5672 });
    // Checked once here for an Attempt's clear answer; the connector checks again on every
    // connection it opens, and connects only to what it checked.
    guard(allow, &host, port).await?;
    let uri: lapin::uri::AMQPUri = r
        .url
        .parse()
        .map_err(|_| BrokerError::refused("rabbitmq: the URL does not parse"))?;
    let runtime = lapin::runtime::default_runtime().map_err(|e| classify(&e))?;
    let allow = allow.clone();
    let connect = async move |_uri: lapin::uri::AMQPUri, runtime| {
        let addrs = crate::ssrf::addresses(&allow, &host, port)
            .await
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        let stream = lapin::AsyncTcpStream::connect(&runtime, addrs[0]).await?;
        if tls {
            let config = lapin::tcp::OwnedTLSConfig::default();
            Ok(stream.into_tls(&host, config.as_ref()).await?)
        } else {
            Ok(stream)
        }
    };
    let connection = Connection::connector(uri, runtime, connect, ConnectionProperties::default())
        .await
        .map_err(|e| classify(&e))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| classify(&e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| classify(&e))?;
    Ok(Arc::new((connection, channel)))
}

async fn publish(
    channel: &Channel,
    a: &Attempt,
    r: &RabbitmqTarget,
) -> Result<String, BrokerError> {
    let mut headers = FieldTable::default();
    let mut content_type = "application/json".to_owned();
    for (name, value) in a.signed_headers(chrono::Utc::now().timestamp()) {
        if name.eq_ignore_ascii_case("content-type") {
            content_type.clone_from(&value);
        }
        headers.insert(
            ShortString::from(name.to_ascii_lowercase()),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    let properties = BasicProperties::default()
        .with_headers(headers)
        .with_message_id(ShortString::from(a.delivery_id.clone()))
        .with_content_type(ShortString::from(content_type))
        // Persistent: a durable queue keeps it across a broker restart.
        .with_delivery_mode(2);
    let confirm = channel
        .basic_publish(
            ShortString::from(r.exchange.clone()),
            ShortString::from(r.routing_key.clone()),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &a.body,
            properties,
        )
        .await
        .map_err(|e| classify(&e))?
        .await
        .map_err(|e| classify(&e))?;
    match confirm {
        Confirmation::Ack(None) => Ok("rabbitmq: publisher confirm (basic.ack)".to_owned()),
        Confirmation::Ack(Some(returned)) => Err(BrokerError::refused(format!(
            "rabbitmq: returned as unroutable ({} {}): no queue is bound for routing key '{}'",
            returned.reply_code, returned.reply_text, r.routing_key
        ))),
        Confirmation::Nack(_) => Err(BrokerError::unavailable(
            "rabbitmq: the broker did not take the message (basic.nack)",
        )),
        Confirmation::NotRequested => Err(BrokerError::unavailable(
            "rabbitmq: the channel is not in confirm mode",
        )),
    }
}

/// A lapin error in Railhook's words: a broker's 403/404/406/530 no retry changes.
fn classify(e: &lapin::Error) -> BrokerError {
    let message = format!("rabbitmq: {e}");
    if let ErrorKind::IOError(io) = e.kind()
        && let Some(crate::ssrf::Unreachable::Refused(r)) = io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<crate::ssrf::Unreachable>())
    {
        return BrokerError::target_refused(r.to_string());
    }
    match e.kind() {
        ErrorKind::ProtocolError(amqp) if matches!(amqp.get_id(), 403 | 404 | 406 | 530) => {
            BrokerError::refused(message)
        }
        _ => BrokerError::unavailable(message),
    }
}
