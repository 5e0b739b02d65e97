//! The audit log page (admins only, like `GET /v1/audit-log`): the project's latest
//! changes, who made them and what changed (secrets already redacted in the rows).

use axum::extract::{Query, State};
use maud::html;
use serde::Deserialize;

use super::pages::when;
use super::{PageResult, Session, layout};
use crate::state::AppState;
use crate::store::access::{AuditFilter, audit_page};

#[derive(Deserialize)]
pub struct AuditQuery {
    /// Only this object's changes.
    pub object_id: Option<String>,
}

pub async fn audit_log(
    State(state): State<AppState>,
    session: Session,
    Query(q): Query<AuditQuery>,
) -> PageResult {
    let object_id = q.object_id.as_deref().filter(|s| !s.is_empty());
    let rows = audit_page(
        &state.pool,
        &AuditFilter {
            project_id: session.project.id.as_str(),
            actor: None,
            object_id,
            since: None,
            until: None,
            before: None,
            limit: 100,
        },
    )
    .await?;
    let body = html! {
        p.muted { "Every change to this project, newest first (the latest 100; the API's "
                  code { "/v1/audit-log" } " pages through all of them and filters by actor "
                  "and time). Secret values are never recorded." }
        form method="get" {
            label { "Object id " input name="object_id" value=(object_id.unwrap_or("")); }
            " " button type="submit" { "Filter" }
        }
        table #audit-log {
            thead { tr { th { "When" } th { "Who" } th { "Object" } th { "Action" } th { "What changed" } } }
            tbody {
                @for e in &rows {
                    tr {
                        td.muted { (when(e.at)) }
                        td { span.muted { (e.actor_kind) } " " (e.actor) }
                        td { (e.object_kind) @if let Some(id) = &e.object_id { " " code { (id) } } }
                        td { code { (e.action) } }
                        td { code { (e.changes.to_string()) } }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" .muted { "Nothing recorded yet." } } }
            }
        }
    };
    Ok(layout(&session, "audit-log", "Audit log", body))
}
