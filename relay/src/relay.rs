//! The relay's session loop: Slot → decode → produce → ack → confirm.
//!
//! ```text
//!  Postgres WAL ──pgoutput──▶ Begin ─ Relation/Insert(outbox)* ─ Commit
//!                                         │ produce (key = endpoint id)
//!                                         ▼
//!                            Kafka, acks=all, idempotent ──ack──▶ Window
//!                                                                  │ every message of this
//!                                                                  │ and earlier transactions
//!                                                                  ▼ acknowledged
//!                                       update_applied_lsn(Commit.end_lsn) ──▶ Slot
//! ```
//!
//! One session is one replication connection. Whatever ends a session (Kafka refused a
//! message, the stream broke, a fault was injected) drops the session with its window: the
//! next session starts where the Slot's `confirmed_flush_lsn` is, so everything not confirmed
//! is read and published again. Duplicates, never gaps; the worker's Claim absorbs the
//! duplicates (duplicate windows 4 and 5 in docs/ARCHITECTURE.md). A broken session never
//! confirms anything afterwards, because its client is dropped with it.
//!
//! Nothing that can come back stops the relay: Postgres or Kafka away, the Slot missing or
//! lost, the publication not created yet. It waits with a capped back-off, says why on
//! `/readyz` and in `railhook_dependency_up` / `railhook_relay_slot_unusable`, and starts a
//! session when it can. Only a configuration error (a certificate the URL's `sslmode`
//! refuses) ends `run` with an error.
//!
//! Told to stop (SIGTERM), the active relay drains: it reads on to the end of the
//! transaction it is in, then stops reading, waits for Kafka to acknowledge everything it
//! sent (at most `RELAY_DRAIN_SECONDS`), confirms it, waits until Postgres has been told, and
//! ends its replication connection cleanly. The standby then takes the Slot at once and
//! starts exactly where this relay's last acknowledged message ended: nothing is sent twice.
//! A relay killed outright, or one whose drain times out, leaves the usual duplicates.
//!
//! Two relays may run: the Slot is the lock. Postgres lets one connection stream a Slot; the
//! other gets SQLSTATE 55006 ("replication slot is active") and waits as a standby, trying
//! again every `STANDBY_RETRY` until the active one's connection is gone.

use railhook_common::db::{ANSWER_WITHIN, SWEEP_ANSWER_WITHIN};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::oneshot::Canceled;
use futures::stream::FuturesUnordered;
use pgwire_replication::{ReplicationClient, ReplicationConfig, ReplicationEvent};
use railhook_common::announcement::Announcement;
use railhook_common::doorbell::{Express, Ringer};
use railhook_common::health::{Backoff, Dependencies};
use railhook_common::kafka_producer::Producer;
use railhook_common::postgres_url::PostgresTarget;
use railhook_common::trace_context::{self, TraceParent};
use rdkafka::error::KafkaError;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use sqlx::PgConnection;
use tokio::sync::watch;

use crate::copy_watch::CopyWatch;
use crate::metrics::RelayMetrics;
use crate::pgoutput::{self, PgOutput};
use crate::prune::{AbortOnDrop, Pruner};
use crate::slot::{self, SlotError};
use crate::window::Committed;
use railhook_common::kafka as producer;

pub use crate::config::RelayConfig;
use crate::config::replication_tls;
pub use crate::error::RelayError;
use crate::error::stream_error;
use crate::outbox::announcement;

mod drain;
mod session;
mod status;

use session::{Current, Session, seconds_since_pg_micros};

/// How often a standby asks for the Slot again.
const STANDBY_RETRY: Duration = Duration::from_millis(500);
/// Back-off between sessions after a session that streamed; repeated failures to start one
/// back off further, up to `health::MAX_BACKOFF`.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The relay's Postgres in `/readyz`: the control connection and the replication stream,
/// which may go to another host than the pools (`RAILHOOK_REPLICATION_DATABASE_URL`).
pub const REPLICATION: &str = "postgres_replication";
/// How often a relay waiting for a missing or lost Slot looks again.
const SLOT_RETRY: Duration = Duration::from_secs(2);

/// Fault points for crash tests. Nothing in configuration can set them.
#[derive(Debug, Default)]
pub struct Faults {
    /// End the session abruptly after Kafka acknowledged a transaction, before its LSN is
    /// confirmed ("acked, then crashed").
    pub crash_after_ack_before_confirm: AtomicBool,
    /// End the session abruptly when an Outbox row was read, before it is produced.
    pub crash_before_produce: AtomicBool,
}

/// A message's transaction, size, Delivery and Outbox row, the partition its express hint
/// went to at read time (if it did), and Kafka's answer.
type Ack = (
    u64,
    usize,
    (String, i64),
    Option<i32>,
    Result<OwnedDeliveryResult, Canceled>,
);
type AckFuture = Pin<Box<dyn Future<Output = Ack> + Send>>;

pub struct Relay {
    config: RelayConfig,
    metrics: RelayMetrics,
    faults: Arc<Faults>,
    deps: Dependencies,
    /// Set once the topic exists; until then every session first tries to create it.
    topic_ready: AtomicBool,
}

/// Runs the relay until `shutdown` resolves or a configuration error: waits as a standby
/// while another relay holds the Slot, waits for a missing Slot, restarts sessions after
/// transient failures.
pub async fn run(
    config: RelayConfig,
    metrics: RelayMetrics,
    faults: Arc<Faults>,
    deps: Dependencies,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RelayError> {
    Relay::new(config, metrics, faults, deps)
        .run(shutdown)
        .await
}

impl Relay {
    pub fn new(
        config: RelayConfig,
        metrics: RelayMetrics,
        faults: Arc<Faults>,
        deps: Dependencies,
    ) -> Self {
        deps.declare(REPLICATION, true);
        deps.declare("kafka", true);
        deps.declare("slot", true);
        deps.set_role("standby");
        Self {
            config,
            metrics,
            faults,
            deps,
            topic_ready: AtomicBool::new(false),
        }
    }

    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
        tokio::pin!(shutdown);
        let (stop, stopping) = watch::channel(false);
        let mut backoff = Backoff::default();
        loop {
            let sessions_before = self.metrics.sessions.get();
            let session = self.session(stopping.clone());
            tokio::pin!(session);
            let outcome = tokio::select! {
                outcome = &mut session => outcome,
                _ = &mut shutdown => {
                    let _ = stop.send(true);
                    self.drain(session).await;
                    return Ok(());
                }
            };
            self.metrics.active.set(0);
            self.deps.set_role("standby");
            self.metrics.in_flight_messages.set(0);
            self.metrics.in_flight_bytes.set(0);
            // A session that streamed resets the back-off: the next failure is a new one.
            if self.metrics.sessions.get() > sessions_before {
                backoff.reset();
            }
            let pause = match outcome {
                Ok(()) => RESTART_BACKOFF,
                Err(RelayError::SlotBusy) => {
                    tracing::debug!(slot = %self.config.slot, "slot held by another relay; standing by");
                    self.deps.up("slot");
                    STANDBY_RETRY
                }
                Err(e) if e.is_configuration() => {
                    tracing::error!(error = %e, cause = ?std::error::Error::source(&e).map(ToString::to_string), "relay stopped: configuration");
                    return Err(e);
                }
                Err(e) if e.is_slot_unusable() => {
                    self.metrics.slot_unusable.set(1);
                    self.deps.down("slot", e.to_string());
                    SLOT_RETRY
                }
                Err(e) => {
                    if e.is_undecodable() {
                        tracing::error!(error = %e, "relay cannot read the stream; retrying from the confirmed LSN");
                    } else {
                        tracing::warn!(error = %e, cause = ?std::error::Error::source(&e).map(ToString::to_string), "relay session ended; restarting from the confirmed LSN");
                    }
                    match &e {
                        RelayError::Kafka(_) | RelayError::Publish(_) => {
                            self.deps.down_keep_reason("kafka", e.reason())
                        }
                        RelayError::Slot(SlotError::Postgres(_)) | RelayError::Stream(_) => {
                            self.deps.down(REPLICATION, e.reason())
                        }
                        _ => {}
                    }
                    backoff.next_wait().max(RESTART_BACKOFF)
                }
            };
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// The replication stream's settings towards `pg` (the primary this session found).
    fn replication_config(&self, pg: &PostgresTarget) -> ReplicationConfig {
        ReplicationConfig::new(
            pg.host.clone(),
            pg.user.clone(),
            pg.password().unwrap_or_default().to_owned(),
            pg.dbname.clone(),
            self.config.slot.clone(),
            self.config.publication.clone(),
        )
        .with_port(pg.port)
        .with_tls(replication_tls(pg))
        .with_status_interval(Duration::from_millis(200))
        .with_wakeup_interval(Duration::from_secs(1))
        .with_buffer_size(1024)
        .with_application_name("railhook-relay")
    }

    /// One replication session, from connect to whatever ends it (a stop ends it `Ok`).
    #[tracing::instrument(level = "info", name = "relay_session", skip_all)]
    async fn session(&self, stopping: watch::Receiver<bool>) -> Result<(), RelayError> {
        // A multi-host URL (`…@h1,h2/db?target_session_attrs=read-write`): the first server
        // that is a primary, found again by every session, so after a failover the relay
        // follows the promoted standby and its synchronized Slot (docs/OPERATIONS.md,
        // "Failover").
        let primary = self
            .config
            .postgres
            .primary()
            .await
            .map_err(|e| RelayError::Slot(SlotError::Postgres(e)))?;
        if primary.chooses_server() {
            tracing::info!(host = %primary.host, port = primary.port, "replicating from this primary");
        }
        // Every wait on Postgres below has a deadline (`db::answered`, issue #53 finding 11):
        // a primary that froze never answers and never closes the connection, and without
        // one the relay would wait on it past the failover for as long as the kernel keeps
        // the socket. A session that ends this way starts again from `primary()`.
        let mut control = self.take_slot(&primary).await?;
        let mut stream = self.open_stream(&primary).await?;
        self.metrics.active.set(1);
        self.deps.set_role("active");
        self.metrics.sessions.inc();
        tracing::info!(slot = %self.config.slot, "relay holds the slot; streaming");
        // A fresh producer (a fresh producer id) per session. A session ends when an ack
        // fails, typically messages that timed out while the broker was away; librdkafka's
        // idempotent producer then bumps its epoch, which tansu 0.6.0 cannot handle (its
        // storage task panics and the broker answers nothing until restarted;
        // docs/RELIABILITY.md). A new producer starts at epoch 0 and never needs the bump.
        let producer = producer::producer(
            &self.config.kafka,
            self.config.message_timeout,
            self.config.max_in_flight,
        )?;
        let (prune_up_to, confirmed) = watch::channel(None);
        let _helpers = self.spawn_helpers(&primary, confirmed);
        // The doorbell (common/src/doorbell.rs), on a connection of its own.
        let ringer = Ringer::spawn(
            primary
                .sqlx_options()
                .map_err(SlotError::from)?
                .application_name("railhook-relay-doorbell"),
        );
        // Express hints at read time need the partition count the producer hashes keys
        // onto; without an answer they go out at the acknowledgement, as before.
        let partitions = if self.config.express_at_read {
            producer
                .partition_count(&self.config.topic, Duration::from_secs(5))
                .await
        } else {
            None
        };
        let mut s = Session::new(&self.config, producer, prune_up_to, ringer, partitions);
        let result = self
            .stream(&mut stream, &mut control, &mut s, stopping)
            .await;
        // Dropping the client ends the connection; an aborted session never confirms more.
        stream.abort();
        result
    }

    /// The control connection, once the Slot is known usable (and what was written while it
    /// was not is handed over) and the topic exists.
    async fn take_slot(&self, primary: &PostgresTarget) -> Result<PgConnection, RelayError> {
        let connect = slot::connect(primary);
        let mut control = within(ANSWER_WITHIN, "the relay's control connect", connect).await??;
        self.deps.up(REPLICATION);
        let usable = slot::ensure_usable(&mut control, &self.config.slot, &self.config.publication);
        within(ANSWER_WITHIN, "the Slot's check", usable).await??;
        if self.metrics.slot_unusable.get() == 1 {
            // The Slot is back after being missing or lost: what was written meanwhile was
            // never in any Slot. `railhook slot create` does the same; whichever runs first
            // hands the rows over, the second finds nothing left to move.
            let reannounce = slot::reannounce_missed(&mut control);
            let moved = within(SWEEP_ANSWER_WITHIN, "the re-announcement", reannounce).await??;
            tracing::info!(slot = %self.config.slot, deliveries = moved, "slot usable again; deliveries written without it handed to the retry path");
        }
        self.metrics.slot_unusable.set(0);
        self.deps.up("slot");
        if !self.topic_ready.load(Ordering::Relaxed) {
            producer::ensure_topic(
                &self.config.kafka,
                &self.config.topic,
                self.config.partitions,
                self.config.replication_factor,
            )
            .await?;
            self.topic_ready.store(true, Ordering::Relaxed);
        }
        self.deps.up("kafka");
        Ok(control)
    }

    /// The replication stream from the Slot, started.
    async fn open_stream(&self, primary: &PostgresTarget) -> Result<ReplicationClient, RelayError> {
        let mut stream = within(
            ANSWER_WITHIN,
            "the replication connect",
            ReplicationClient::connect(self.replication_config(primary)),
        )
        .await?
        .map_err(stream_error)?;
        within(
            ANSWER_WITHIN,
            "the replication start",
            stream.wait_started(),
        )
        .await?
        .map_err(stream_error)?;
        Ok(stream)
    }

    /// The session's companions, ended with it: the Outbox pruner (which follows the
    /// confirmed LSN) and the watch on a failover Slot's standby copies.
    fn spawn_helpers(
        &self,
        primary: &PostgresTarget,
        confirmed: watch::Receiver<Option<i64>>,
    ) -> (AbortOnDrop, AbortOnDrop) {
        let pruner = Pruner {
            postgres: primary.clone(),
            retention: self.config.outbox_retention,
            every: self.config.status_interval,
            metrics: self.metrics.clone(),
        };
        let prune = AbortOnDrop(tokio::spawn(pruner.run(confirmed)));
        // A failover Slot's standby copies, asked about while this session streams.
        let copies = CopyWatch {
            primary: primary.clone(),
            slot: self.config.slot.clone(),
            metrics: self.metrics.clone(),
            deps: self.deps.clone(),
        };
        let copies_task = AbortOnDrop(tokio::spawn(copies.run()));
        (prune, copies_task)
    }

    async fn stream(
        &self,
        stream: &mut ReplicationClient,
        control: &mut PgConnection,
        s: &mut Session,
        mut stopping: watch::Receiver<bool>,
    ) -> Result<(), RelayError> {
        let mut acks: FuturesUnordered<AckFuture> = FuturesUnordered::new();
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_interval);
        let mut status = tokio::time::interval(self.config.status_interval);
        let mut draining = *stopping.borrow();
        loop {
            // Drained: nothing half read, nothing unacknowledged, so everything read is
            // confirmed (each ack confirmed what it completed).
            if draining && s.current.is_none() && s.window.messages() == 0 {
                return self.end_drained(stream, s).await;
            }
            // A drain still reads to the end of the transaction it is in: stopping inside
            // one would leave its published part unconfirmed, to be sent again.
            let read = s.window.has_room() && (!draining || s.current.is_some());
            tokio::select! {
                Some((seq, bytes, delivery_id, hinted, delivered)) = acks.next() => {
                    self.on_ack(stream, s, (seq, bytes, delivery_id, hinted), delivered)?;
                }
                event = stream.recv(), if read => {
                    match event.map_err(stream_error)? {
                        Some(event) => self.on_event(stream, s, &mut acks, event)?,
                        None => return Err(RelayError::StreamEnded),
                    }
                }
                changed = stopping.changed(), if !draining => {
                    draining = changed.is_err() || *stopping.borrow();
                    if draining {
                        tracing::info!(slot = %self.config.slot, in_flight = s.window.messages(), "relay draining");
                    }
                }
                _ = heartbeat.tick(), if !draining => {
                    match within(ANSWER_WITHIN, "a heartbeat", slot::heartbeat(&mut *control)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat not written"),
                        // The control connection's server stopped answering: this session's
                        // primary is gone (or frozen); start again from `primary()`.
                        Err(e) => return Err(e),
                    }
                }
                _ = status.tick() => {
                    within(ANSWER_WITHIN, "the Slot's status", self.report_status(&mut *control, s)).await??;
                }
            }
            self.metrics
                .in_flight_messages
                .set(s.window.messages() as i64);
            self.metrics.in_flight_bytes.set(s.window.bytes() as i64);
        }
    }

    fn on_event(
        &self,
        stream: &ReplicationClient,
        s: &mut Session,
        acks: &mut FuturesUnordered<AckFuture>,
        event: ReplicationEvent,
    ) -> Result<(), RelayError> {
        match event {
            ReplicationEvent::Begin { final_lsn, .. } => {
                s.current = Some(Current {
                    seq: s.window.begin(),
                    commit_lsn: final_lsn,
                    heartbeat: false,
                });
            }
            ReplicationEvent::XLogData { data, .. } => match pgoutput::decode(&data)? {
                PgOutput::Relation(r) => {
                    s.relations.insert(r.id, r);
                }
                PgOutput::Insert { relation_id, tuple } => {
                    let relation = s
                        .relations
                        .get(&relation_id)
                        .ok_or(RelayError::UnknownRelation(relation_id))?;
                    if relation.name == "outbox" {
                        let current = s.current.as_ref().ok_or(RelayError::StreamEnded)?;
                        let (announcement, trace) =
                            announcement(relation, &tuple, current.commit_lsn)?;
                        if self.faults.crash_before_produce.load(Ordering::SeqCst) {
                            return Err(RelayError::InjectedCrash("before produce"));
                        }
                        // The express hint now, to the partition the producer will choose
                        // (the acknowledgement corrects a wrong guess, `on_ack`): the worker
                        // holding it claims while the broker is still writing.
                        let hinted = s.partitions.and_then(|n| {
                            railhook_common::kafka_producer::predicted_partition(
                                announcement.key(),
                                n,
                            )
                        });
                        let (ack, bytes) =
                            self.produce(&s.producer, &announcement, trace, current.seq, hinted)?;
                        if let Some(partition) = hinted {
                            s.ringer.express(Express {
                                partition,
                                offset: Express::AT_READ,
                                delivery_id: announcement.delivery_id.to_string(),
                                outbox_id: Some(announcement.outbox_id),
                            });
                        }
                        acks.push(ack);
                        s.window.sent(current.seq, bytes);
                    }
                }
                PgOutput::Other(_) => {}
            },
            ReplicationEvent::Message { prefix, .. } => {
                if let Some(current) = s.current.as_mut() {
                    current.heartbeat |= prefix == slot::HEARTBEAT_PREFIX;
                }
            }
            ReplicationEvent::Commit {
                end_lsn,
                commit_time_micros,
                ..
            } => {
                if let Some(current) = s.current.take() {
                    let committed = Committed {
                        end_lsn,
                        commit_time_micros,
                    };
                    s.window.commit(current.seq, committed);
                    if current.heartbeat {
                        s.last_heartbeat_micros = Some(commit_time_micros);
                    }
                }
                self.metrics.received_lsn.set(end_lsn.as_u64() as i64);
                self.metrics
                    .commit_to_read_seconds
                    .observe(seconds_since_pg_micros(commit_time_micros));
                self.confirm_ready(stream, s)?;
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                // Nothing is waiting: every transaction before wal_end that touched the
                // Outbox was already read and confirmed, so confirming wal_end only releases
                // WAL of other tables, which would otherwise stay pinned by the Slot.
                if s.window.is_idle() {
                    s.confirm(stream, &self.metrics, wal_end);
                }
            }
            ReplicationEvent::StoppedAt { .. } => return Err(RelayError::StreamEnded),
        }
        Ok(())
    }

    /// Hands one Announcement to the producer; returns its ack future and its size. A row
    /// with a trace context is published in a `publish` span of that trace.
    ///
    /// The message carries no headers, the trace context included: no consumer reads them
    /// (the worker takes the context from the Delivery row, docs/ARCHITECTURE.md "Trace
    /// context"), and the local brokers (tansu 0.6.0, nisshi 0.7.0-pre.2) keep headers in an
    /// unindexed sqlite table that every fetched record scans, so a header per message made
    /// each fetch cost as much as every header ever stored (docs/BENCHMARKS-HISTORY.md, "Kafka
    /// headers").
    fn produce(
        &self,
        producer: &Producer,
        announcement: &Announcement,
        trace: Option<TraceParent>,
        seq: u64,
        hinted: Option<i32>,
    ) -> Result<(AckFuture, usize), RelayError> {
        let payload = announcement.encode();
        let bytes = payload.len();
        let span = match &trace {
            Some(parent) => {
                let span = tracing::info_span!(
                    "publish",
                    delivery_id = %announcement.delivery_id,
                    endpoint_id = %announcement.endpoint_id,
                    reason = %announcement.reason,
                );
                trace_context::adopt(&span, parent, None);
                span
            }
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        match producer.send(&self.config.topic, announcement.key(), &payload) {
            Ok(delivery) => {
                let id = (announcement.delivery_id.to_string(), announcement.outbox_id);
                Ok((
                    Box::pin(async move { (seq, bytes, id, hinted, delivery.await) }),
                    bytes,
                ))
            }
            Err(e) => {
                self.metrics.publish_errors.inc();
                Err(RelayError::Publish(e))
            }
        }
    }

    fn on_ack(
        &self,
        stream: &ReplicationClient,
        s: &mut Session,
        (seq, bytes, (delivery_id, outbox_id), hinted): (u64, usize, (String, i64), Option<i32>),
        delivered: Result<OwnedDeliveryResult, Canceled>,
    ) -> Result<(), RelayError> {
        match delivered {
            Ok(Ok(at)) => {
                self.metrics.published.inc();
                // The worker holding the partition claims the Delivery from this, without
                // waiting for its fetch; a dozing worker wakes on it (common/src/doorbell.rs).
                // Sent at read time to the right partition already: nothing more to say.
                if hinted != Some(at.partition) {
                    if hinted.is_some() {
                        self.metrics.express_mispredicted.inc();
                    }
                    s.ringer.express(Express {
                        partition: at.partition,
                        offset: at.offset,
                        delivery_id,
                        outbox_id: Some(outbox_id),
                    });
                }
                s.window.acked(seq, bytes);
                self.confirm_ready(stream, s)
            }
            Ok(Err((e, _))) => {
                self.metrics.publish_errors.inc();
                Err(RelayError::Publish(e))
            }
            Err(Canceled) => {
                self.metrics.publish_errors.inc();
                Err(RelayError::Publish(KafkaError::Canceled))
            }
        }
    }

    /// Confirms the newest transaction whose messages, and all earlier ones, Kafka acked.
    fn confirm_ready(&self, stream: &ReplicationClient, s: &mut Session) -> Result<(), RelayError> {
        let ack_latency = &self.metrics.commit_to_ack_seconds;
        let Some(committed) = s.window.drain_confirmable(|c, messages| {
            if messages > 0 {
                ack_latency.observe(seconds_since_pg_micros(c.commit_time_micros));
            }
        }) else {
            return Ok(());
        };
        if self
            .faults
            .crash_after_ack_before_confirm
            .load(Ordering::SeqCst)
        {
            return Err(RelayError::InjectedCrash("after ack, before confirm"));
        }
        s.confirm(stream, &self.metrics, committed.end_lsn);
        s.last_confirmed_commit_micros = Some(committed.commit_time_micros);
        self.metrics
            .lag_seconds
            .set(seconds_since_pg_micros(committed.commit_time_micros));
        Ok(())
    }
}

/// `work` with a deadline (`db::deadline`), its passing a Postgres error of the session.
async fn within<T>(
    deadline: Duration,
    what: &'static str,
    work: impl Future<Output = T>,
) -> Result<T, RelayError> {
    railhook_common::db::deadline(deadline, what, work)
        .await
        .map_err(|e| RelayError::Slot(SlotError::Postgres(e)))
}
