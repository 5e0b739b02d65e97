//! The doorbell: a Postgres `NOTIFY` that tells dozing workers "Kafka has something for
//! you". It lets an idle worker stop fetching (issue #21): a Kafka consumer that fetches
//! costs the broker CPU per partition per fetch even when nothing arrives (about 70 % of a
//! core for 12 idle partitions at a 10 ms fetch wait, docs/BENCHMARKS.md), so a worker that
//! has heard nothing for `WORKER_DOZE_AFTER_MS` pauses its partitions, and the processes that
//! publish hints ring after Kafka acknowledged them.
//!
//! ```text
//!  relay:     Kafka ack (Announcement) ─┐
//!  scheduler: Kafka ack (RetryHint)   ──┴▶ Ringer::ring ─(at most one NOTIFY per GAP)─▶ Postgres
//!                                                                                         │
//!  worker: Hearing { listening, rings } ◀── LISTEN railhook_doorbell (own connection) ◀──┘
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
//!   waiting (worker/src/worker.rs).
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

/// The shortest time between two NOTIFYs of one ringer. Rings in between are folded into
/// the next NOTIFY. A worker stays awake for `WORKER_DOZE_AFTER_MS` after a ring, which
/// the configuration keeps well above this.
pub const GAP: Duration = Duration::from_millis(100);

/// Rings the doorbell; cheap to clone, never blocks. The NOTIFYs are sent by a task that
/// ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Ringer {
    tx: mpsc::Sender<()>,
}

impl Ringer {
    /// Starts the ringer's task; it connects on the first ring. Must run inside a runtime.
    pub fn spawn(options: PgConnectOptions) -> Self {
        // One slot: a ring while a NOTIFY is pending is already covered by it.
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(ring_loop(rx, options));
        Self { tx }
    }

    /// Asks for a NOTIFY: now if none went out within `GAP`, else when the gap ends.
    pub fn ring(&self) {
        // Full: a NOTIFY is already due, and it covers this ring too.
        let _ = self.tx.try_send(());
    }
}

async fn ring_loop(mut rx: mpsc::Receiver<()>, options: PgConnectOptions) {
    let mut conn: Option<PgConnection> = None;
    while rx.recv().await.is_some() {
        // A NOTIFY that failed is tried once more on a new connection: the old one may
        // have been closed by a Postgres restart since the last ring.
        for _ in 0..2 {
            match notify(&mut conn, &options).await {
                Ok(()) => break,
                Err(e) => {
                    conn = None;
                    tracing::debug!(error = %e, "doorbell not rung");
                }
            }
        }
        tokio::time::sleep(GAP).await;
    }
}

async fn notify(
    conn: &mut Option<PgConnection>,
    options: &PgConnectOptions,
) -> Result<(), sqlx::Error> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(PgConnection::connect_with(options).await?),
    };
    sqlx::query!("SELECT pg_notify($1, '')", CHANNEL)
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
pub fn listen(options: PgConnectOptions) -> watch::Receiver<Hearing> {
    let (tx, rx) = watch::channel(Hearing::default());
    tokio::spawn(async move {
        tokio::select! {
            _ = listen_loop(&tx, options) => {}
            _ = tx.closed() => {}
        }
    });
    rx
}

async fn listen_loop(tx: &watch::Sender<Hearing>, options: PgConnectOptions) {
    let mut backoff = Backoff::default();
    loop {
        // A pool of one, made for the listener alone: PgListener holds a pool connection.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(options.clone());
        match subscribe(&pool).await {
            Ok(mut listener) => {
                backoff.reset();
                tx.send_modify(|h| {
                    h.listening = true;
                    h.rings += 1;
                });
                // Ok(None) is a connection lost, Err anything else (a Postgres that is
                // shutting down says so before it closes): either way, start again.
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => tx.send_modify(|h| h.rings += 1),
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

async fn subscribe(pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Every failure surfaces from try_recv, which the loop above answers by reconnecting
    // from scratch; PgListener's own reconnect would hide the gap.
    listener.ignore_pool_close_event(true);
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}
