//! The applications page: the project's customers, and for each a button that opens its
//! customer portal (docs/PORTAL.md) as that customer sees it — what support staff use to
//! look at a customer's endpoints and messages with them.

use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use maud::html;
use serde::Deserialize;

use super::pages::when;
use super::{PageResult, Session, layout};
use crate::routes::applications::resolve;
use crate::routes::portal::{PortalAccessIn, issue};
use crate::state::AppState;
use crate::store::applications;

pub async fn applications(State(state): State<AppState>, session: Session) -> PageResult {
    let rows = applications::of_project(&state.pool, session.project.id.as_str()).await?;
    let body = html! {
        p.muted { "Each application is one of your customers; its endpoints receive only its own Events. "
                  "“Open portal” starts a portal session for it (one hour), as the customer sees it." }
        table #applications {
            thead { tr { th { "Application" } th { "Rate limit" } th { "Created" } th { "Portal" } } }
            tbody {
                @for a in &rows {
                    tr {
                        td { (a.name) @if let Some(uid) = &a.uid { " " span.muted { "(" (uid) ")" } } br; code.muted { (a.id) } }
                        td { @match a.rate_limit_per_second { Some(r) => { (r) " / s" }, None => { "—" } } }
                        td { (when(a.created_at)) }
                        td {
                            form.inline method="post" action={ "/dashboard/applications/" (a.id) "/portal" } {
                                input type="hidden" name="csrf" value=(session.csrf);
                                label { input type="checkbox" name="read_only" value="true" checked; "read-only" }
                                button.secondary type="submit" { "Open portal" }
                            }
                        }
                    }
                }
                @if rows.is_empty() { tr { td colspan="4" .muted { "No applications yet (POST /v1/applications)." } } }
            }
        }
    };
    Ok(layout(&session, "applications", "Applications", body))
}

#[derive(Deserialize)]
pub struct PortalForm {
    csrf: String,
    /// A ticked checkbox sends `true`; an unticked one sends nothing.
    read_only: Option<String>,
}

/// Issues a one-time portal link for the application and goes to it.
pub async fn open_portal(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<PortalForm>,
) -> PageResult {
    session.check(&form.csrf)?;
    let app = resolve(&state, session.project.id.as_str(), &id).await?;
    let body = PortalAccessIn {
        read_only: form.read_only.is_some(),
        expiry: None,
    };
    let access = issue(&state, &session.project, &headers, &app.id, &body).await?;
    tracing::info!(application_id = %app.id, read_only = body.read_only, "portal opened from the dashboard");
    Ok(Redirect::to(&access.url).into_response())
}
