//! The doorbell: a Postgres `NOTIFY` that tells dozing workers "Kafka has something for
//! you". It lets an idle worker stop fetching (issue #21): a Kafka consumer that fetches
//! costs the broker CPU per partition per fetch even when nothing arrives (about 70 % of a
//! core for 12 idle partitions at a 10 ms fetch wait, docs/BENCHMARKS-HISTORY.md), so a worker that
//! has heard nothing for `WORKER_DOZE_AFTER_MS` pauses its partitions, and the processes that
//! publish hints ring after Kafka acknowledged them.
//!
//! Since issue #35 the relay's rings also carry what Kafka acknowledged ([`Express`]): the
//! partition, offset and Delivery of each Announcement, so the worker that holds the
//! partition claims it without waiting for its fetch. Kafka stays the durable path: every
//! Announcement still reaches the worker through it, and its offset moves only then.
//!
//! ```text
//!  relay:     Kafka ack (Announcement) ── Ringer::express ─(next NOTIFY, no gap)──┐
//!  relay, scheduler: Kafka ack ────────── Ringer::ring ─(at most one per GAP)─────┴▶ Postgres
//!                                                                                      │
//!  worker: Hearing { listening, rings }, express hints ◀── LISTEN railhook_doorbell ◀──┘
//! ```
//!
//! The bell is a hint about hints, so losing a ring may cost latency, never a Delivery:
//! - A ring is never dropped by the ringer, only delayed: rings within [`GAP`] of the last
//!   NOTIFY are folded into one sent when the gap ends, so every acknowledged hint is
//!   followed by a NOTIFY at most `GAP` later (a failed NOTIFY is retried once on a new
//!   connection, then left to the fallback).
//! - A worker dozes only while its LISTEN connection is up ([`Hearing::listening`]); a
//!   listener that (re)connects counts as a ring, since it may have missed some.
//! - What is left (a NOTIFY that failed twice, a connection that died silently) is caught
//!   by the worker's fallback: its group watch reads committed offsets against the high
//!   watermarks every few seconds and wakes the worker if one of its partitions has messages
//!   waiting (worker/src/runtime.rs).
//!
//! The ringer and the listener each use a connection of their own, outside the pools, so
//! neither takes a connection the Claims need. LISTEN needs a session: behind a
//! transaction-pooling proxy, point the workers at Postgres itself (docs/CONFIGURATION.md).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::{mpsc, watch};

use crate::health::Backoff;

/// The channel every ringer notifies and every worker listens on.
pub const CHANNEL: &str = "railhook_doorbell";

/// The shortest time between two plain rings of one ringer. Rings in between are folded
/// into the next NOTIFY. A worker stays awake for `WORKER_DOZE_AFTER_MS` after a ring, which
/// the configuration keeps well above this. Express hints are not held back by it.
pub const GAP: Duration = Duration::from_millis(100);

/// The longest payload one NOTIFY carries (Postgres refuses 8,000 bytes and more).
const PAYLOAD_MAX: usize = 7_000;

/// Knocks waiting for the ringer's task; past this, an express hint is dropped (its
/// Announcement still reaches the worker through Kafka) and a ring is already due.
const QUEUE: usize = 8_192;

/// An Announcement Kafka acknowledged, carried by the doorbell straight to the worker that
/// holds its partition (issue #35): "the message at `offset` of `partition` of the
/// deliveries topic names `delivery_id`". It saves the hop through the broker's fetch, which
/// was most of the median's time on the local brokers. It is a hint about a hint: the worker
/// claims the Delivery at once, and when the same message arrives through Kafka, its offset
/// is stored without a second Claim (worker/src/lanes.rs). A lost express hint costs the
/// Kafka hop's latency, never a Delivery.
///
/// Since issue #54 the relay sends most express hints when it *reads* the Outbox row, before
/// the broker acknowledged it: the offset is not known yet ([`Express::AT_READ`]) and the
/// partition is the one the producer's partitioner will choose. The worker then matches the
/// Kafka copy by its Delivery id (worker/src/express.rs). A worker of an earlier release
/// ignores such a hint (its offset is behind anything read), so a mixed deployment only
/// loses the shortcut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Express {
    pub partition: i32,
    pub offset: i64,
    pub delivery_id: String,
    /// The Outbox row the Announcement was written from: what names one Announcement, as a
    /// Delivery may be announced more than once (a manual retry, a replay, an ordering
    /// release). `None` from a relay of an earlier release.
    pub outbox_id: Option<i64>,
}

impl Express {
    /// The offset of a hint sent before the broker acknowledged its Announcement.
    pub const AT_READ: i64 = -1;

    /// The Announcement's offset, when the hint was sent after the acknowledgement.
    pub fn known_offset(&self) -> Option<i64> {
        (self.offset >= 0).then_some(self.offset)
    }

    /// `partition:offset:delivery_id[:outbox_id]`, one per hint, separated by spaces in a
    /// payload. (A worker of an earlier release reads `delivery_id:outbox_id` as a malformed
    /// Delivery id and drops the hint: its Announcement takes the Kafka path.)
    fn encode(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = write!(
            out,
            "{}:{}:{}",
            self.partition, self.offset, self.delivery_id
        );
        if let Some(outbox_id) = self.outbox_id {
            let _ = write!(out, ":{outbox_id}");
        }
    }

    /// The hints of one payload; an empty payload (a plain ring) or one this release does
    /// not read carries none.
    pub fn decode_all(payload: &str) -> Vec<Express> {
        payload
            .split(' ')
            .filter_map(|entry| {
                let mut parts = entry.splitn(4, ':');
                let partition = parts.next()?.parse().ok()?;
                let offset = parts.next()?.parse().ok()?;
                let id = parts.next()?;
                let outbox_id = match parts.next() {
                    Some(raw) => Some(raw.parse().ok()?),
                    None => None,
                };
                // Only a well-formed Delivery id goes on to a Claim.
                crate::ids::DeliveryId::parse(id).is_ok().then(|| Express {
                    partition,
                    offset,
                    delivery_id: id.to_owned(),
                    outbox_id,
                })
            })
            .collect()
    }
}

/// Packs hints into as few payloads as fit under [`PAYLOAD_MAX`] each.
fn payloads(hints: &[Express]) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut entry = String::new();
    for h in hints {
        entry.clear();
        h.encode(&mut entry);
        let last = out.last_mut().expect("one payload at least");
        if !last.is_empty() && last.len() + 1 + entry.len() > PAYLOAD_MAX {
            out.push(entry.clone());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(&entry);
        }
    }
    out
}

#[derive(Debug)]
enum Knock {
    Ring,
    Express(Express),
}

/// Rings the doorbell; cheap to clone, never blocks. The NOTIFYs are sent by a task that
/// ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Ringer {
    tx: mpsc::Sender<Knock>,
}

impl Ringer {
    /// Starts the ringer's task, which connects at once (a first ring after a quiet start
    /// would otherwise wait for the connection: issue #35's cold start). Must run inside a
    /// runtime.
    ///
    /// The connection commits asynchronously: a NOTIFY is a transaction of its own, and
    /// waiting for its WAL flush (or for a synchronous standby) would add a disk write to
    /// every express hint for nothing — a NOTIFY lost in a crash is a hint lost, which
    /// Kafka makes good.
    pub fn spawn(dial: impl Into<Dial>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(ring_loop(rx, dial.into()));
        Self { tx }
    }

    /// Asks for a plain NOTIFY: now if none went out within `GAP`, else when the gap ends.
    pub fn ring(&self) {
        // Full: NOTIFYs are already due, and they cover this ring too.
        let _ = self.tx.try_send(Knock::Ring);
    }

    /// Sends `hint` to the workers with the next NOTIFY, which goes out as soon as the
    /// ringer's task is free (no gap): these are what the workers deliver from.
    pub fn express(&self, hint: Express) {
        let _ = self.tx.try_send(Knock::Express(hint));
    }
}

/// Adds the express hints of everything queued to `express` (a plain ring adds nothing: the
/// round's NOTIFY goes out either way).
fn take_queued(rx: &mut mpsc::Receiver<Knock>, express: &mut Vec<Express>) {
    while let Ok(k) = rx.try_recv() {
        if let Knock::Express(e) = k {
            express.push(e);
        }
    }
}

/// Where a doorbell's connection goes: fixed options, or those of a pool as they are at
/// each (re)connect. A pool on a multi-host URL follows the primary after a failover
/// (db.rs), and so does a doorbell dialled through it.
#[derive(Clone, Debug)]
pub enum Dial {
    Fixed(Box<PgConnectOptions>),
    Pool(sqlx::PgPool, &'static str),
}

impl Dial {
    fn options(&self) -> PgConnectOptions {
        match self {
            Dial::Fixed(o) => (**o).clone(),
            Dial::Pool(pool, name) => (*pool.connect_options()).clone().application_name(name),
        }
    }
}

impl From<PgConnectOptions> for Dial {
    fn from(options: PgConnectOptions) -> Self {
        Dial::Fixed(Box::new(options))
    }
}

async fn ring_loop(mut rx: mpsc::Receiver<Knock>, dial: Dial) {
    let ringing = || dial.options().options([("synchronous_commit", "off")]);
    // Connected ahead; a failure here is retried at the first ring.
    let mut conn: Option<PgConnection> = crate::db::answered(
        crate::db::ANSWER_WITHIN,
        "the doorbell's connect",
        PgConnection::connect_with(&ringing()),
    )
    .await
    .ok();
    let mut last: Option<tokio::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        let mut express = Vec::new();
        if let Knock::Express(e) = first {
            express.push(e);
        }
        take_queued(&mut rx, &mut express);
        // Plain rings wait out the gap, folding what comes meanwhile; express hints go now
        // (every express NOTIFY is a ring as well).
        if express.is_empty()
            && let Some(at) = last
        {
            tokio::time::sleep_until(at + GAP).await;
            take_queued(&mut rx, &mut express);
        }
        let payloads = payloads(&express);
        // A NOTIFY that failed is tried once more on a new connection: the old one may
        // have been closed by a Postgres restart since the last ring.
        for _ in 0..2 {
            // Bounded (db::answered): a NOTIFY to a frozen primary must not end the ringing.
            let within = crate::db::ANSWER_WITHIN;
            let options = ringing();
            let rung = notify(&mut conn, &options, &payloads);
            match crate::db::answered(within, "a doorbell NOTIFY", rung).await {
                Ok(()) => break,
                Err(e) => {
                    conn = None;
                    tracing::debug!(error = %e, "doorbell not rung");
                }
            }
        }
        last = Some(tokio::time::Instant::now());
    }
}

/// One transaction, one NOTIFY per payload.
async fn notify(
    conn: &mut Option<PgConnection>,
    options: &PgConnectOptions,
    payloads: &[String],
) -> Result<(), sqlx::Error> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(PgConnection::connect_with(options).await?),
    };
    sqlx::query!(
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        CHANNEL,
        payloads
    )
    .execute(c)
    .await?;
    Ok(())
}

/// What a worker's listener has heard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hearing {
    /// The LISTEN connection is up: a ring now would be heard. Only then may a worker doze.
    pub listening: bool,
    /// Rings heard so far, plus one each time the connection came up or went away (either
    /// may have hidden a ring).
    pub rings: u64,
}

/// Starts listening on [`CHANNEL`] over a connection of its own; the task reconnects with
/// a capped back-off and ends when the receiver is dropped. Must run inside a runtime.
pub fn listen(dial: impl Into<Dial>) -> watch::Receiver<Hearing> {
    listen_with_express(dial).0
}

/// [`listen`], and the express hints heard, one batch per NOTIFY. When the batches are not
/// taken fast enough, the newest are dropped: their Announcements come through Kafka.
pub fn listen_with_express(
    dial: impl Into<Dial>,
) -> (watch::Receiver<Hearing>, mpsc::Receiver<Vec<Express>>) {
    let dial = dial.into();
    let (tx, rx) = watch::channel(Hearing::default());
    let (express_tx, express_rx) = mpsc::channel(EXPRESS_BATCHES);
    tokio::spawn(async move {
        // It ends when nobody listens any more: neither to the rings nor to the hints.
        let unheard = async {
            tx.closed().await;
            express_tx.closed().await;
        };
        tokio::select! {
            _ = listen_loop(&tx, &express_tx, dial) => {}
            _ = unheard => {}
        }
    });
    (rx, express_rx)
}

/// Express batches a listener holds for its worker.
const EXPRESS_BATCHES: usize = 256;

async fn listen_loop(
    tx: &watch::Sender<Hearing>,
    express: &mpsc::Sender<Vec<Express>>,
    dial: Dial,
) {
    let mut backoff = Backoff::default();
    loop {
        // A pool of one, made for the listener alone: PgListener holds a pool connection.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(dial.options());
        match crate::db::answered(
            crate::db::ANSWER_WITHIN,
            "the doorbell's LISTEN",
            subscribe(&pool),
        )
        .await
        {
            Ok(mut listener) => {
                backoff.reset();
                tx.send_modify(|h| {
                    h.listening = true;
                    h.rings += 1;
                });
                // Ok(None) is a connection lost, Err anything else (a Postgres that is
                // shutting down says so before it closes): either way, start again.
                loop {
                    // A connection that has said nothing for LISTENER_CHECK_EVERY is asked
                    // to answer a query: a primary that froze never closes it, and a worker
                    // that believes it is listening may doze through every later ring.
                    let heard = match tokio::time::timeout(
                        LISTENER_CHECK_EVERY,
                        listener.try_recv(),
                    )
                    .await
                    {
                        Ok(heard) => heard,
                        Err(_) => {
                            let probe = sqlx::query_scalar!(r#"SELECT 1 AS "one!""#)
                                .fetch_one(&mut listener);
                            let answer = crate::db::answered(
                                crate::db::ANSWER_WITHIN,
                                "the doorbell listener's check",
                                probe,
                            );
                            match answer.await {
                                Ok(_) => continue,
                                Err(e) => {
                                    tracing::warn!(error = %e, "doorbell listener's connection stopped answering");
                                    break;
                                }
                            }
                        }
                    };
                    match heard {
                        Ok(Some(n)) => {
                            let hints = Express::decode_all(n.payload());
                            if !hints.is_empty() {
                                let _ = express.try_send(hints);
                            }
                            tx.send_modify(|h| h.rings += 1);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "doorbell listener lost");
                            break;
                        }
                    }
                }
                tx.send_modify(|h| {
                    h.listening = false;
                    h.rings += 1;
                });
            }
            Err(e) => tracing::debug!(error = %e, "doorbell listener not connected"),
        }
        pool.close().await;
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// How long a silent LISTEN connection goes before it is checked.
const LISTENER_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

async fn subscribe(pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Every failure surfaces from try_recv, which the loop above answers by reconnecting
    // from scratch; PgListener's own reconnect would hide the gap.
    listener.ignore_pool_close_event(true);
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(partition: i32, offset: i64) -> Express {
        Express {
            partition,
            offset,
            delivery_id: crate::ids::DeliveryId::generate().into_string(),
            outbox_id: (offset % 2 == 0).then_some(offset * 3),
        }
    }

    #[test]
    fn hints_round_trip_through_payloads_that_fit_a_notify() {
        let hints: Vec<Express> = (0..1_000).map(|i| hint(i % 12, i64::from(i) * 7)).collect();
        let packed = payloads(&hints);
        assert!(packed.len() > 1, "1,000 hints need several payloads");
        assert!(packed.iter().all(|p| p.len() <= PAYLOAD_MAX));
        let back: Vec<Express> = packed.iter().flat_map(|p| Express::decode_all(p)).collect();
        assert_eq!(back, hints);
    }

    #[test]
    fn a_plain_ring_or_a_payload_this_release_cannot_read_carries_no_hint() {
        assert_eq!(payloads(&[]), vec![String::new()]);
        assert!(Express::decode_all("").is_empty());
        assert!(Express::decode_all("v2|something else").is_empty());
        assert!(Express::decode_all("1:2:not-a-delivery").is_empty());
        let good = hint(1, 2);
        let mut one = String::new();
        good.encode(&mut one);
        assert_eq!(
            Express::decode_all(&format!("x:y:z {one}")),
            vec![good],
            "a bad entry does not spoil the good ones"
        );
    }
}
