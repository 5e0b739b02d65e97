//! The event-type catalogue page: each type, its description, whether it has a schema (and
//! which version), and whether it is deprecated. Read-only; changes go through the API.

use axum::extract::State;
use maud::html;

use super::pages::when;
use super::{PageResult, Session, layout};
use crate::state::AppState;
use crate::store::event_types;

pub async fn event_types(State(state): State<AppState>, session: Session) -> PageResult {
    let rows = event_types::catalogue(&state.pool, session.project.id.as_str()).await?;
    let body = html! {
        p.muted { "Types your project sends. A type with a schema has its payloads checked at "
                  "the door (422 " code { "schema_violation" } "). Manage them with "
                  code { "/v1/event-types" } "." }
        table #event-types {
            thead { tr { th { "Type" } th { "Description" } th { "Schema" } th { "State" } th { "Changed" } } }
            tbody {
                @for t in &rows {
                    tr {
                        td { code { (t.name) } }
                        td { (t.description) }
                        td { @if t.has_schema { "version " (t.schema_version) } @else { span.muted { "none" } } }
                        td { @if let Some(at) = t.deprecated_at { span.status.warning { "deprecated" } " " span.muted { (when(at)) } } @else { "active" } }
                        td.muted { (when(t.updated_at)) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" .muted { "No event types in the catalogue yet." } } }
            }
        }
    };
    Ok(layout(&session, "event-types", "Event types", body))
}
