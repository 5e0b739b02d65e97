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
//! SSRF: the broker's name is resolved and checked by the guard (mod.rs), and a plain
//! `amqp://` connection is opened to the checked address. An `amqps://` connection keeps
//! the name, for the certificate check (docs/DESTINATIONS.md).

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
        if let Err(e) = &answer
            && e.class != crate::attempt::ErrorClass::TargetRefused
        {
            // A channel that saw an error is closed by the broker: open a new one next time.
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
    let mut url = url::Url::parse(&r.url)
        .map_err(|_| BrokerError::refused("rabbitmq: the URL does not parse"))?;
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url
        .port()
        .unwrap_or(if url.scheme() == "amqps" { 5671 } else { 5672 });
    let addrs = guard(allow, &host, port).await?;
    if url.scheme() == "amqp"
        && let Some(first) = addrs.first()
    {
        let _ = url.set_ip_host(first.ip());
    }
    let connection = Connection::connect(url.as_str(), ConnectionProperties::default())
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
    match e.kind() {
        ErrorKind::ProtocolError(amqp) if matches!(amqp.get_id(), 403 | 404 | 406 | 530) => {
            BrokerError::refused(message)
        }
        _ => BrokerError::unavailable(message),
    }
}
