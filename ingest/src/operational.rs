//! Operational webhooks: what tells a project's own systems that its endpoints changed state
//! or its messages are failing (`/v1/operational-endpoints`, routes/operational.rs).
//!
//! Invariant: an operational Event exists exactly when the change it reports committed. It
//! is written by `railhook_emit_operational` (migration 20261204000014) inside the
//! transaction, or the statement, of that change — here for changes made through the API,
//! in the worker's `fence::finalise` for Attempt outcomes — as an Event, one Delivery per
//! operational endpoint that asked for its type, and their Outbox rows. So it is never lost
//! (the Outbox guarantee) and never sent for a change that rolled back.
//!
//! Invariant: operational endpoints never cause operational webhooks about themselves. The
//! API routes that emit act only on endpoints of kind `webhook`, and `finalise` emits only
//! for Deliveries to them; an operational endpoint that fails just retries on its own
//! ladder and, past it, ends in Failed Messages like any Delivery.

use serde_json::{Value, json};

use railhook_common::Word;
/// The operational event types, in the names receivers of other services already parse.
pub use railhook_common::vocabulary::OperationalEvent;

/// Writes the operational Event `kind` of `project` with `data`, and its Deliveries, in the
/// caller's transaction; returns how many Deliveries (0 when no operational endpoint asked).
pub async fn emit(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    kind: OperationalEvent,
    data: Value,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT railhook_emit_operational($1, $2, $3) AS "n!""#,
        project,
        kind.as_str(),
        data
    )
    .fetch_one(db)
    .await
}

/// Locks a webhook endpoint's row for a change that may enable or disable it, and returns
/// whether it is enabled now (`None`: no such endpoint), so the change can tell whether it
/// flipped the state ([`emit_enabled_change`]).
pub(crate) async fn lock_enabled(
    tx: &mut sqlx::PgConnection,
    project: &str,
    id: &str,
) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT enabled FROM endpoints
         WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = 'webhook'
         FOR UPDATE",
        id,
        project
    )
    .fetch_optional(tx)
    .await
}

/// `endpoint.enabled` or `endpoint.disabled`, if the change moved `row` away from
/// `was_enabled`.
pub(crate) async fn emit_enabled_change(
    tx: &mut sqlx::PgConnection,
    project: &str,
    was_enabled: bool,
    row: &crate::store::endpoints::EndpointRow,
) -> Result<(), sqlx::Error> {
    if row.enabled == was_enabled {
        return Ok(());
    }
    let kind = if row.enabled {
        OperationalEvent::EndpointEnabled
    } else {
        OperationalEvent::EndpointDisabled
    };
    let data = json!({"endpoint_id": row.id, "reason": row.disabled_reason});
    emit(tx, project, kind, data).await.map(|_| ())
}

/// The `data` of `endpoint.created` and `endpoint.updated`.
pub fn endpoint_data(id: &str, url: &str, description: &str) -> Value {
    json!({"endpoint_id": id, "url": redacted_url(url), "description": description})
}

/// An endpoint URL as an operational webhook may carry it (review #34 item 4): the scheme,
/// host, port and path, with the query's values (where receivers put tokens: `?token=…`)
/// replaced by `REDACTED`. A URL never carries credentials in its userinfo: the API refuses
/// them (`routes::validate_url`). Operational webhooks go to another receiver than the
/// endpoint's, often a chat channel or a log: they say which endpoint, not how to call it.
pub fn redacted_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return String::new();
    };
    let _ = url.set_username("");
    let _ = url.set_password(None);
    if url.query().is_some() {
        let names: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        let mut pairs = url.query_pairs_mut();
        pairs.clear();
        for name in names {
            pairs.append_pair(&name, "REDACTED");
        }
    }
    url.into()
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn query_values_and_userinfo_leave_operational_bodies() {
        assert_eq!(
            redacted_url("https://hooks.example.com/in/abc?token=s3cret&team=x"),
            "https://hooks.example.com/in/abc?token=REDACTED&team=REDACTED"
        );
        assert_eq!(
            redacted_url("https://user:pw@example.com:8443/p"),
            "https://example.com:8443/p"
        );
        assert_eq!(redacted_url("http://127.0.0.1:9/x"), "http://127.0.0.1:9/x");
    }
}
