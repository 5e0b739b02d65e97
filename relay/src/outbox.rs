//! An Outbox row as the relay reads it from the stream, turned into the Announcement it
//! publishes.

use std::collections::HashMap;

use pgwire_replication::Lsn;
use railhook_common::announcement::{ANNOUNCEMENT_VERSION, Announcement};
use railhook_common::ids::{DeliveryId, EndpointId, ProjectId};
use railhook_common::status::OutboxReason;
use railhook_common::trace_context::TraceParent;

use crate::error::RelayError;
use crate::pgoutput::{self, Column, Relation};

fn text<'a>(row: &HashMap<&str, &'a Column>, column: &'static str) -> Result<&'a str, RelayError> {
    match row.get(column) {
        Some(Column::Text(v)) => Ok(v.as_str()),
        _ => Err(RelayError::OutboxRow(column)),
    }
}

/// The row's reason. The CHECK constraint on `outbox.reason` admits only the words
/// [`OutboxReason`] knows, but a newer release that adds one may write rows while this relay
/// still runs (a rolling deploy). The reason is informational (the worker claims by the
/// Delivery id alone), so such a row is announced as CREATED with a warning rather than
/// stopping the relay on it.
fn reason(raw: &str) -> OutboxReason {
    OutboxReason::parse(raw).unwrap_or_else(|| {
        tracing::warn!(
            reason = raw,
            "outbox reason unknown to this release; announced as CREATED"
        );
        OutboxReason::Created
    })
}

/// The Announcement for one decoded Outbox row, and the trace context the row carries (rows
/// written before migration 20261204000013, and rows of other reasons, carry none).
pub(crate) fn announcement(
    relation: &Relation,
    tuple: &[Column],
    commit_lsn: Lsn,
) -> Result<(Announcement, Option<TraceParent>), RelayError> {
    let row = pgoutput::named(relation, tuple);
    let trace = match row.get("traceparent") {
        Some(Column::Text(v)) => TraceParent::parse(v),
        _ => None,
    };
    let announcement = Announcement {
        v: ANNOUNCEMENT_VERSION,
        delivery_id: DeliveryId::from_trusted(text(&row, "delivery_id")?.to_owned()),
        endpoint_id: EndpointId::from_trusted(text(&row, "endpoint_id")?.to_owned()),
        project_id: ProjectId::from_trusted(text(&row, "project_id")?.to_owned()),
        reason: reason(text(&row, "reason")?),
        outbox_id: text(&row, "id")?
            .parse()
            .map_err(|_| RelayError::OutboxRow("id"))?,
        commit_lsn: commit_lsn.to_pg_string(),
    };
    Ok((announcement, trace))
}
