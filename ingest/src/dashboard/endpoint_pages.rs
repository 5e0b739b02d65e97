//! The endpoints page: each endpoint's state, breaker and failure streak, and the disable
//! and enable actions.

use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect};
use chrono::Utc;
use maud::html;
use railhook_common::ids::EndpointId;
use serde::Deserialize;

use super::pages::{when, when_opt};
use super::{PageResult, Session, layout};
use crate::problem::ApiError;
use crate::routes::endpoint_state;
use crate::state::AppState;
use crate::store::endpoints::{self, Kind};

// ---------------------------------------------------------------------------------------
// Endpoints

pub async fn endpoints(State(state): State<AppState>, session: Session) -> PageResult {
    let rows = endpoints::of_project(
        &state.pool,
        session.project.id.as_str(),
        Some(Kind::Webhook),
    )
    .await?;
    // Each endpoint's application by name (and uid), read once for the page.
    let applications: std::collections::HashMap<String, String> =
        crate::store::applications::of_project(&state.pool, session.project.id.as_str())
            .await?
            .into_iter()
            .map(|a| {
                let label = match &a.uid {
                    Some(uid) => format!("{} ({uid})", a.name),
                    None => a.name.clone(),
                };
                (a.id, label)
            })
            .collect();
    let now = Utc::now();
    let body = html! {
        table #endpoints {
            thead { tr { th { "Endpoint" } th { "State" } th { "Breaker" } th { "Failure streak" } th { "Action" } } }
            tbody {
                @for e in &rows {
                    @let (health, disable_at) = endpoint_state::streak_state(e.enabled, e.failing_since, &state.streak, now);
                    tr {
                        td {
                            @if e.transport != "http" { span.status { (e.transport) } " " }
                            (e.url) br; code.muted { (e.id) }
                            @if e.source_id.is_some() { " " span.muted { "destination" } }
                            @if let Some(app) = &e.application_id { br; span.muted { "application: " (applications.get(app).map_or(app.as_str(), String::as_str)) } }
                            @if let Some(ch) = e.channels.as_ref().filter(|c| !c.is_empty()) { br; span.muted { "channels: " (ch.join(", ")) } }
                            @if let Some(auth) = authentication_label(e.authentication.as_ref()) { br; span.muted.authentication { (auth) } }
                            @if e.client_certificate.is_some() { br; span.muted.mtls { "mutual TLS: client certificate" } }
                            @if let Some(f) = &e.filter { br; span.muted.filter { "filter: " code { (f) } } }
                            @if e.transformation_code.is_some() {
                                br; span.muted.transformation {
                                    "transformation " (if e.transformation_enabled { "on" } else { "off" })
                                    " · last result: " (crate::portal::last_transformation_result(e.transformation_last.as_ref()))
                                }
                            }
                        }
                        td {
                            span.status class=(health) { (health) }
                            @if let Some(r) = &e.disabled_reason { br; span.muted { (r) } }
                            @if health == "warning" { @if let Some(at) = disable_at { br; span.warning { "will be disabled at " (when(at)) " unless an Attempt succeeds" } } }
                        }
                        td.status class=(e.breaker_state) { (e.breaker_state) }
                        td { @if e.consecutive_failures > 0 { (e.consecutive_failures) " failed since " (when_opt(e.failing_since)) } @else { "—" } }
                        td {
                            @if e.enabled {
                                form.inline method="post" action={ "/dashboard/endpoints/" (e.id) "/disable" } {
                                    input type="hidden" name="csrf" value=(session.csrf);
                                    input name="reason" placeholder="reason (optional)";
                                    button.secondary type="submit" { "Disable" }
                                }
                            } @else {
                                form.inline method="post" action={ "/dashboard/endpoints/" (e.id) "/enable" } {
                                    input type="hidden" name="csrf" value=(session.csrf);
                                    button type="submit" { "Enable" }
                                }
                            }
                        }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" .muted { "No endpoints yet." } } }
            }
        }
    };
    Ok(layout(&session, "endpoints", "Endpoints", body))
}

/// How the endpoint authenticates beyond the signature, in a few words (never a secret:
/// the shown form has none).
fn authentication_label(shown: Option<&serde_json::Value>) -> Option<String> {
    let shown = shown?;
    match shown["type"].as_str()? {
        "basic" => Some(format!(
            "HTTP Basic as {}",
            shown["username"].as_str().unwrap_or("?")
        )),
        "oauth2_client_credentials" => Some(format!(
            "OAuth2 client {} at {}",
            shown["client_id"].as_str().unwrap_or("?"),
            shown["token_url"].as_str().unwrap_or("?")
        )),
        other => Some(other.to_owned()),
    }
}

#[derive(Deserialize)]
pub struct EndpointForm {
    csrf: String,
    reason: Option<String>,
}

pub async fn endpoint_action(
    State(state): State<AppState>,
    session: Session,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<EndpointForm>,
) -> PageResult {
    session.check(&form.csrf)?;
    let id = EndpointId::parse(&id).map_err(|_| ApiError::NotFound("endpoint"))?;
    let _updated = match action.as_str() {
        "enable" => endpoint_state::set_enabled(&state, &session.project, &id, true, None).await?,
        "disable" => {
            let reason = endpoint_state::disabled_by_a_person(form.reason.as_deref())?;
            endpoint_state::set_enabled(&state, &session.project, &id, false, Some(reason)).await?
        }
        _ => return Err(ApiError::NotFound("route").into()),
    };
    Ok(Redirect::to("/dashboard/endpoints").into_response())
}
