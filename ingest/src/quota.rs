//! The monthly event quota per organization, counted in Redis.
//!
//! Before the transaction, one Lua script checks and reserves in a single step: it adds the
//! request's Events to the counter only if they fit, so concurrent requests cannot all pass
//! a check that reads before anyone writes (review #19 item 10: with a read-then-charge, 64
//! concurrent clients overshot a quota by tens of Events). After the commit, the Events that
//! were not created (idempotent replays, a failed transaction) are refunded; a request that
//! created everything it reserved costs no second round trip.
//!
//! Invariant: the quota never fails an ingest that Postgres accepted. If Redis is down or slow
//! the reservation fails open, the Events are charged after the commit instead, best-effort,
//! and `railhook_quota_charge_skipped_total` counts what could not be charged or refunded.
//! Failing to count is better than failing (or double-answering) an accepted event. A
//! process that dies between the reservation and the commit leaves its reservation charged:
//! the error is on the side of the quota, at most one request's Events per crash.
//!
//! Every Redis round trip is bounded by `quota_timeout_ms`, and after a failure the next
//! connection attempt waits a second, so a dead Redis costs ingest almost nothing.

use std::sync::Arc;
use std::time::Duration;

use chrono::{Datelike, Utc};
use railhook_common::redis_client::{Lazy, RedisClient};

use crate::metrics::IngestMetrics;

/// Counters live ~5 weeks: long enough to cover their month, then Redis drops them.
const COUNTER_TTL_SECONDS: i64 = 35 * 24 * 3600;

#[derive(Clone)]
pub struct Quota {
    /// Each command's deadline (the connect's too): past it, the quota fails open.
    timeout: Duration,
    reserve: Arc<redis::Script>,
    redis: Lazy,
    metrics: IngestMetrics,
}

/// What the reservation before the transaction decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Reservation {
    /// `count` Events were added to the counter under `key` (the month they were counted in).
    Reserved { key: String, count: usize },
    /// They would not fit: nothing was added.
    Exceeded,
    /// Redis did not answer: allowed, to be charged after the commit.
    Skipped,
}

/// Adds ARGV[1] to KEYS[1] only if the sum stays within ARGV[2]; -1 if it would not.
const RESERVE: &str = r#"
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local n = tonumber(ARGV[1])
if used + n > tonumber(ARGV[2]) then
  return -1
end
local now = redis.call('INCRBY', KEYS[1], n)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return now
"#;

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
            timeout,
            reserve: Arc::new(redis::Script::new(RESERVE)),
            redis: Lazy::new(client, timeout),
            metrics,
        }
    }

    /// Reserves `count` Events of this month's quota, if they fit. Fails open.
    pub async fn reserve(
        &self,
        organization_id: &str,
        monthly_quota: i64,
        count: usize,
    ) -> Reservation {
        if count == 0 {
            return Reservation::Skipped;
        }
        let Some(mut conn) = self.redis.get().await else {
            self.metrics
                .quota_charge_skipped
                .with_label_values(&["check"])
                .inc();
            return Reservation::Skipped;
        };
        let key = counter_key(organization_id);
        let mut call = self.reserve.key(&key);
        call.arg(count as i64)
            .arg(monthly_quota)
            .arg(COUNTER_TTL_SECONDS);
        match tokio::time::timeout(self.timeout, call.invoke_async::<i64>(&mut conn)).await {
            // Counted by the caller when it does refuse (a retry of accepted Events over the
            // quota is answered, not refused).
            Ok(Ok(-1)) => Reservation::Exceeded,
            Ok(Ok(_)) => Reservation::Reserved { key, count },
            _ => {
                self.redis.forget().await;
                self.metrics
                    .quota_charge_skipped
                    .with_label_values(&["check"])
                    .inc();
                tracing::warn!("quota check skipped: Redis did not answer");
                Reservation::Skipped
            }
        }
    }

    /// After the transaction: refunds what was reserved and not created, or charges what was
    /// created without a reservation. Best-effort: never fails, only counts a skip.
    pub async fn settle(&self, organization_id: &str, reservation: Reservation, created: usize) {
        match reservation {
            Reservation::Reserved { key, count } if count > created => {
                self.add(&key, -((count - created) as i64), "refund").await;
            }
            Reservation::Reserved { .. } | Reservation::Exceeded => {}
            Reservation::Skipped if created > 0 => {
                self.add(&counter_key(organization_id), created as i64, "charge")
                    .await;
            }
            Reservation::Skipped => {}
        }
    }

    async fn add(&self, key: &str, n: i64, phase: &'static str) {
        let Some(mut conn) = self.redis.get().await else {
            self.metrics
                .quota_charge_skipped
                .with_label_values(&[phase])
                .inc();
            tracing::warn!(phase, "quota {phase} skipped: Redis unavailable");
            return;
        };
        let mut pipe = redis::pipe();
        pipe.incr(key, n)
            .ignore()
            .expire(key, COUNTER_TTL_SECONDS)
            .ignore();
        let done: Result<Result<(), redis::RedisError>, _> =
            tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await;
        if !matches!(done, Ok(Ok(()))) {
            self.redis.forget().await;
            self.metrics
                .quota_charge_skipped
                .with_label_values(&[phase])
                .inc();
            tracing::warn!(phase, "quota {phase} skipped: Redis did not answer");
        }
    }
}
