//! The states a Delivery moves through, why an Outbox row was written, and how an Attempt
//! ended: one type each, stored as text in Postgres (`deliveries.status`, `outbox.reason`,
//! `attempts.outcome`, each with a CHECK constraint listing the same words).
//!
//! A Delivery's life:
//!
//! ```text
//!                 Claim (a hint, a RetryHint's swap)        2xx
//!   ┌─────────┐ ─────────────────────────────────▶ ┌────────────┐ ────▶ SUCCEEDED (final)
//!   │ PENDING │                                    │ PROCESSING │
//!   └─────────┘ ◀───────────────────────────────── └────────────┘ ────▶ FAILED (final)
//!     ▲   ▲       retry scheduled, Deferral, ordering       last rung, a 4xx the policy ends,
//!     │   │       park, drain hand-back, the sweep          endpoint gone, payload expunged
//!     │   └── the retry scheduler's own Claim (PROCESSING, hinted) given back unpublished
//!     └────── a manual retry or a replay of a FAILED Delivery (a new Outbox row)
//! ```
//!
//! PENDING and PROCESSING are the open states: retention never drops a partition that holds
//! one (common/src/retention), and expunging a payload ends them FAILED. Only SUCCEEDED and
//! FAILED are final.
//!
//! SQL keeps the words as literals where a partial index is keyed on them
//! (`WHERE status = 'PENDING'`): the planner can only use such an index when the
//! predicate is written out in the statement, not bound as a parameter. Rust code names the
//! states through these types.

use std::fmt;

/// Where a Delivery stands (see the module doc for its transitions).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type,
)]
#[serde(rename_all = "UPPERCASE")]
#[sqlx(type_name = "text", rename_all = "UPPERCASE")]
pub enum DeliveryStatus {
    /// Waiting for a Claim: fresh, retry scheduled, deferred or handed back.
    Pending,
    /// Claimed by a worker (or by the retry scheduler while its RetryHint is in flight).
    Processing,
    /// The receiver answered 2xx (final).
    Succeeded,
    /// No further Attempt will be made (final); `failure_reason` says why.
    Failed,
}

impl DeliveryStatus {
    pub const ALL: [DeliveryStatus; 4] = [
        DeliveryStatus::Pending,
        DeliveryStatus::Processing,
        DeliveryStatus::Succeeded,
        DeliveryStatus::Failed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "PENDING",
            DeliveryStatus::Processing => "PROCESSING",
            DeliveryStatus::Succeeded => "SUCCEEDED",
            DeliveryStatus::Failed => "FAILED",
        }
    }

    /// The word as the API and the database spell it; `None` for anything else.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    /// SUCCEEDED or FAILED: nothing will change the Delivery again except a manual retry
    /// or a replay of a FAILED one.
    pub const fn is_final(self) -> bool {
        matches!(self, DeliveryStatus::Succeeded | DeliveryStatus::Failed)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an Outbox row was written: each row becomes one Announcement.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboxReason {
    /// The Delivery was created with its Event (ingest, an incoming webhook).
    Created,
    /// A replay re-opened the Delivery.
    Replay,
    /// The Ordering Buffer released it: its predecessor resolved.
    Released,
    /// An operator retried a FAILED Delivery.
    ManualRetry,
}

impl OutboxReason {
    pub const ALL: [OutboxReason; 4] = [
        OutboxReason::Created,
        OutboxReason::Replay,
        OutboxReason::Released,
        OutboxReason::ManualRetry,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            OutboxReason::Created => "CREATED",
            OutboxReason::Replay => "REPLAY",
            OutboxReason::Released => "RELEASED",
            OutboxReason::ManualRetry => "MANUAL_RETRY",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == raw)
    }
}

impl fmt::Display for OutboxReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one Attempt ended, as `attempts.outcome` records it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type,
)]
#[serde(rename_all = "UPPERCASE")]
#[sqlx(type_name = "text", rename_all = "UPPERCASE")]
pub enum AttemptOutcome {
    /// 2xx.
    Succeeded,
    /// Worth another Attempt (5xx, 429, a timeout, a network error).
    Retry,
    /// Not worth another Attempt (most 4xx, a refused target).
    Failed,
}

impl AttemptOutcome {
    pub const ALL: [AttemptOutcome; 3] = [
        AttemptOutcome::Succeeded,
        AttemptOutcome::Retry,
        AttemptOutcome::Failed,
    ];

    /// The `outcome` label of `railhook_worker_attempts_total`.
    pub const fn label(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Failed => "failed",
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "SUCCEEDED",
            AttemptOutcome::Retry => "RETRY",
            AttemptOutcome::Failed => "FAILED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_match_serde() {
        for s in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).expect("json"),
                format!("\"{}\"", s.as_str())
            );
        }
        for r in OutboxReason::ALL {
            assert_eq!(OutboxReason::parse(r.as_str()), Some(r));
            assert_eq!(
                serde_json::to_string(&r).expect("json"),
                format!("\"{}\"", r.as_str())
            );
        }
        assert_eq!(DeliveryStatus::parse("pending"), None);
        assert!(DeliveryStatus::Failed.is_final() && !DeliveryStatus::Processing.is_final());
        assert_eq!(
            serde_json::to_string(&AttemptOutcome::Retry).expect("json"),
            "\"RETRY\""
        );
    }
}
