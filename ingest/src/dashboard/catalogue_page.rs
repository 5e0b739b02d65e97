//! The event-type catalogue page: each type, its description, whether it has a schema (and
//! which version), and whether it is deprecated. Read-only; changes go through the API.

use axum::extract::State;
use chrono::{DateTime, Utc};
use maud::html;

use super::pages::when;
use super::{PageResult, Session, layout};
use crate::state::AppState;

struct TypeRow {
    name: String,
    description: String,
    has_schema: bool,
    schema_version: i32,
    deprecated_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
}

pub async fn event_types(State(state): State<AppState>, session: Session) -> PageResult {
    let rows = sqlx::query_as!(
        TypeRow,
        r#"SELECT name, description, schema IS NOT NULL AS "has_schema!", schema_version,
                  deprecated_at, updated_at
           FROM event_types WHERE project_id = $1 ORDER BY name LIMIT 1000"#,
        session.project.id.as_str()
    )
    .fetch_all(&state.pool)
    .await?;
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
