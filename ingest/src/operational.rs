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

use serde_json::Value;

use railhook_common::Word;
/// The operational event types, in the names receivers of other services already parse.
pub use railhook_common::vocabulary::OperationalEvent;

/// An operational webhook the API emits, with its payload: a type and its data are one
/// value, so a type cannot go out with another type's data. (The Attempt-outcome types,
/// `message.attempt.*`, are built inside the worker's outcome statement, fence.rs.)
#[derive(Debug)]
pub enum Notice<'a> {
    EndpointCreated(EndpointChanged),
    EndpointUpdated(EndpointChanged),
    EndpointDeleted(EndpointRef<'a>),
    EndpointEnabled(EndpointState<'a>),
    EndpointDisabled(EndpointState<'a>),
    /// An audit-log row as `GET /v1/audit-log` shows it (crate::audit; already redacted).
    AuditEntry(Value),
}

/// The data of `endpoint.created` and `endpoint.updated`: the URL as [`redacted_url`]
/// leaves it.
#[derive(Debug, serde::Serialize)]
pub struct EndpointChanged {
    pub endpoint_id: String,
    pub url: String,
    pub description: String,
}

impl EndpointChanged {
    pub fn new(id: &str, url: &str, description: &str) -> Self {
        Self {
            endpoint_id: id.to_owned(),
            url: redacted_url(url),
            description: description.to_owned(),
        }
    }
}

/// The data of `endpoint.deleted`.
#[derive(Debug, serde::Serialize)]
pub struct EndpointRef<'a> {
    pub endpoint_id: &'a str,
}

/// The data of `endpoint.enabled` and `endpoint.disabled`.
#[derive(Debug, serde::Serialize)]
pub struct EndpointState<'a> {
    pub endpoint_id: &'a str,
    pub reason: Option<&'a str>,
}

impl Notice<'_> {
    pub fn kind(&self) -> OperationalEvent {
        match self {
            Notice::EndpointCreated(_) => OperationalEvent::EndpointCreated,
            Notice::EndpointUpdated(_) => OperationalEvent::EndpointUpdated,
            Notice::EndpointDeleted(_) => OperationalEvent::EndpointDeleted,
            Notice::EndpointEnabled(_) => OperationalEvent::EndpointEnabled,
            Notice::EndpointDisabled(_) => OperationalEvent::EndpointDisabled,
            Notice::AuditEntry(_) => OperationalEvent::AuditEntry,
        }
    }

    /// The `data` receivers see.
    pub fn data(&self) -> Value {
        let data = match self {
            Notice::EndpointCreated(d) | Notice::EndpointUpdated(d) => serde_json::to_value(d),
            Notice::EndpointDeleted(d) => serde_json::to_value(d),
            Notice::EndpointEnabled(d) | Notice::EndpointDisabled(d) => serde_json::to_value(d),
            Notice::AuditEntry(entry) => Ok(entry.clone()),
        };
        data.unwrap_or(Value::Null)
    }
}

/// Writes the operational Event `notice` of `project`, and its Deliveries, in the caller's
/// transaction; returns how many Deliveries (0 when no operational endpoint asked).
pub async fn emit(
    db: impl sqlx::PgExecutor<'_>,
    project: &str,
    notice: Notice<'_>,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT railhook_emit_operational($1, $2, $3) AS "n!""#,
        project,
        notice.kind().as_str(),
        notice.data()
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
    let state = EndpointState {
        endpoint_id: &row.id,
        reason: row.disabled_reason.as_deref(),
    };
    let notice = if row.enabled {
        Notice::EndpointEnabled(state)
    } else {
        Notice::EndpointDisabled(state)
    };
    emit(tx, project, notice).await.map(|_| ())
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
