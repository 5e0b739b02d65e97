//! The monthly event quota per organization, counted in Redis.
//!
//! Invariant: the quota never fails an ingest that Postgres accepted. The counter is charged
//! *after* the commit and best-effort: if Redis is down or slow, the charge is skipped and
//! `railhook_quota_charge_skipped_total` says so. Failing to charge is better than failing
//! (or double-answering) an accepted event. The check before the transaction fails open for
//! the same reason: an unreachable Redis must not turn into refused events.
//!
//! Every Redis round trip is bounded by `quota_timeout_ms`, and after a failure the next
//! connection attempt waits a second, so a dead Redis costs ingest almost nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Datelike, Utc};
use railhook_common::redis_client::{RedisClient, RedisConnection};
use redis::AsyncTypedCommands;
use tokio::sync::Mutex;

use crate::metrics::IngestMetrics;

/// Counters live ~5 weeks: long enough to cover their month, then Redis drops them.
const COUNTER_TTL_SECONDS: i64 = 35 * 24 * 3600;
const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Quota {
    client: RedisClient,
    timeout: Duration,
    conn: Arc<Mutex<ConnState>>,
    metrics: IngestMetrics,
}

#[derive(Default)]
struct ConnState {
    conn: Option<RedisConnection>,
    last_failure: Option<Instant>,
}

/// What the pre-transaction check decided.
#[derive(Debug, PartialEq, Eq)]
pub enum QuotaCheck {
    Allowed,
    Exceeded,
}

fn counter_key(organization_id: &str) -> String {
    let now = Utc::now();
    format!(
        "railhook:quota:{organization_id}:{:04}{:02}",
        now.year(),
        now.month()
    )
}

impl Quota {
    /// Counters kept in Redis through `client` (built by `Settings::redis_client`: TLS and
    /// credentials come from there).
    pub fn new(client: RedisClient, timeout: Duration, metrics: IngestMetrics) -> Self {
        Self {
            client,
            timeout,
            conn: Arc::new(Mutex::new(ConnState::default())),
            metrics,
        }
    }

    async fn connection(&self) -> Option<RedisConnection> {
        let mut state = self.conn.lock().await;
        if let Some(conn) = &state.conn {
            return Some(conn.clone());
        }
        if state
            .last_failure
            .is_some_and(|t| t.elapsed() < RECONNECT_BACKOFF)
        {
            return None;
        }
        match self.client.connect(self.timeout).await {
            Ok(conn) => {
                state.conn = Some(conn.clone());
                Some(conn)
            }
            Err(_) => {
                state.last_failure = Some(Instant::now());
                None
            }
        }
    }

    async fn forget_connection(&self) {
        let mut state = self.conn.lock().await;
        state.conn = None;
        state.last_failure = Some(Instant::now());
    }

    /// Would `count` more events fit in this month's quota? Fails open.
    pub async fn check(
        &self,
        organization_id: &str,
        monthly_quota: i64,
        count: usize,
    ) -> QuotaCheck {
        let Some(mut conn) = self.connection().await else {
            self.metrics
                .quota_charge_skipped
                .with_label_values(&["check"])
                .inc();
            return QuotaCheck::Allowed;
        };
        let key = counter_key(organization_id);
        match tokio::time::timeout(self.timeout, conn.get_int(&key)).await {
            Ok(Ok(used)) => {
                let used = used.unwrap_or(0) as i64;
                if used.saturating_add(count as i64) > monthly_quota {
                    // Counted by the caller when it does refuse (a retry of accepted Events
                    // over the quota is answered, not refused).
                    QuotaCheck::Exceeded
                } else {
                    QuotaCheck::Allowed
                }
            }
            _ => {
                self.forget_connection().await;
                self.metrics
                    .quota_charge_skipped
                    .with_label_values(&["check"])
                    .inc();
                tracing::warn!("quota check skipped: Redis did not answer");
                QuotaCheck::Allowed
            }
        }
    }

    /// Charges `count` committed events. Best-effort: never fails, only counts a skip.
    pub async fn charge(&self, organization_id: &str, count: usize) {
        if count == 0 {
            return;
        }
        let Some(mut conn) = self.connection().await else {
            self.metrics
                .quota_charge_skipped
                .with_label_values(&["charge"])
                .inc();
            tracing::warn!("quota charge skipped: Redis unavailable");
            return;
        };
        let key = counter_key(organization_id);
        let mut pipe = redis::pipe();
        pipe.incr(&key, count as i64)
            .ignore()
            .expire(&key, COUNTER_TTL_SECONDS)
            .ignore();
        let charged: Result<Result<(), redis::RedisError>, _> =
            tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await;
        if !matches!(charged, Ok(Ok(()))) {
            self.forget_connection().await;
            self.metrics
                .quota_charge_skipped
                .with_label_values(&["charge"])
                .inc();
            tracing::warn!("quota charge skipped: Redis did not answer");
        }
    }
}
