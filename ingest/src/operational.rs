//! Operational webhooks: what tells a project's own systems that its endpoints changed state
//! or its messages are failing (`/v1/operational-endpoints`, routes/operational.rs).
//!
//! Invariant: an operational Event exists exactly when the change it reports committed. It
//! is written by `railhook_emit_operational` (migration 20261204000014) inside the
//! transaction, or the statement, of that change — here for changes made through the API,
//! in the worker's `store::finalise` for Attempt outcomes — as an Event, one Delivery per
//! operational endpoint that asked for its type, and their Outbox rows. So it is never lost
//! (the Outbox guarantee) and never sent for a change that rolled back.
//!
//! Invariant: operational endpoints never cause operational webhooks about themselves. The
//! API routes that emit act only on endpoints of kind `webhook`, and `finalise` emits only
//! for Deliveries to them; an operational endpoint that fails just retries on its own
//! ladder and, past it, ends in Failed Messages like any Delivery.

use serde_json::{Value, json};

/// The operational event types, in the names receivers of other services already parse.
pub const TYPES: [&str; 8] = [
    "endpoint.created",
    "endpoint.updated",
    "endpoint.deleted",
    "endpoint.disabled",
    "endpoint.enabled",
    "message.attempt.failing",
    "message.attempt.exhausted",
    "message.attempt.recovered",
];

/// Writes the operational Event `kind` of `project` with `data`, and its Deliveries, in the
/// caller's transaction; returns how many Deliveries (0 when no operational endpoint asked).
pub async fn emit(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    kind: &str,
    data: Value,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT railhook_emit_operational($1, $2, $3) AS "n!""#,
        project,
        kind,
        data
    )
    .fetch_one(db)
    .await
}

/// The `data` of `endpoint.created` and `endpoint.updated`.
pub fn endpoint_data(id: &str, url: &str, description: &str) -> Value {
    json!({"endpoint_id": id, "url": url, "description": description})
}
