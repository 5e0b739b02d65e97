//! The portal's message pages: the messages sent to the application's endpoints (filtered by
//! type, status and time), one message with its Attempts (the request's headers, the status,
//! the duration, the start of the answer), re-sending it, and the event catalogue. Reads are
//! filtered by the session's application; a message of another application is a 404.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use maud::html;
use railhook_common::DeliveryStatus;
use serde::Deserialize;

use super::endpoint_form::Fields;
use super::{PortalResult, PortalSession, page};
use crate::dashboard::pages::{given, parse_time, parse_type, query_string, request_view, when};
use crate::pagination::PageRequest;
use crate::routes::deliveries::parse_status;
use crate::state::AppState;
use crate::store::deliveries::{self as delivery_store, DeliveryFilter};
use crate::store::endpoints::{self as endpoint_store, Kind};

const PAGE: i64 = 50;

#[derive(Deserialize, Default)]
pub struct ListQuery {
    status: Option<String>,
    event_type: Option<String>,
    since: Option<String>,
    until: Option<String>,
    cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Query(q): Query<ListQuery>,
) -> PortalResult {
    let status = parse_status(given(&q.status))?;
    let event_type = parse_type(&q.event_type)?;
    let filter = DeliveryFilter {
        status,
        event_type: event_type.clone(),
        since: parse_time("since", &q.since)?,
        until: parse_time("until", &q.until)?,
        application_id: Some(session.application_id.clone()),
        ..DeliveryFilter::default()
    };
    let page_request = PageRequest::parse(Some(PAGE), given(&q.cursor))?;
    let rows = delivery_store::list(
        &state.pool,
        session.project.id.as_str(),
        &filter,
        page_request.after.as_deref(),
        page_request.fetch(),
    )
    .await?;
    let listing = page_request.finish(rows, |r: &delivery_store::DeliveryRow| &r.id);
    let urls = endpoint_urls(&state, &session).await?;
    let next = listing.next_cursor.as_deref().map(|c| {
        query_string(&[
            ("status", status.map(DeliveryStatus::as_str)),
            ("event_type", event_type.as_deref()),
            ("since", given(&q.since)),
            ("until", given(&q.until)),
            ("cursor", Some(c)),
        ])
    });
    let body = html! {
        form.filters method="get" action=(session.href("messages")) {
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in DeliveryStatus::ALL { option value=(s.as_str()) selected[status == Some(s)] { (s) } }
                }
            }
            label { "Event type" input name="event_type" value=[given(&q.event_type)] placeholder="order.paid"; }
            label { "Since (UTC)" input type="datetime-local" name="since" value=[given(&q.since)]; }
            label { "Before (UTC)" input type="datetime-local" name="until" value=[given(&q.until)]; }
            button type="submit" { "Search" }
        }
        div.table { table #messages {
            thead { tr { th { "Message" } th { "Type" } th.wide { "Endpoint" } th { "Status" } th.wide { "Attempts" } th { "Created" } } }
            tbody {
                @for d in &listing.data {
                    tr {
                        td { a href=(session.href(&format!("messages/{}", d.event_id))) { code { (d.event_id) } } }
                        td { (d.event_type) }
                        td.wide { (urls.iter().find(|(id, _)| *id == d.endpoint_id).map_or(d.endpoint_id.as_str(), |(_, u)| u.as_str())) }
                        td class={ "status " (d.status.as_str()) } { (d.status) }
                        td.wide { (d.attempt_count) @if let Some(c) = d.last_status_code { " · HTTP " (c) } }
                        td { (when(d.created_at)) }
                    }
                }
                @if listing.data.is_empty() { tr { td colspan="6" .muted { "No messages match." } } }
            }
        } }
        @if let Some(next) = next { p.pager { a href={ (session.href("messages")) "?" (next) } { "Older →" } } }
    };
    Ok(page(&session, "messages", "Messages", None, body))
}

/// The application's endpoints (deleted ones too are named by id only), for labels.
async fn endpoint_urls(
    state: &AppState,
    session: &PortalSession,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = endpoint_store::page(
        &state.pool,
        session.project.id.as_str(),
        Kind::Webhook,
        Some(&session.application_id),
        None,
        500,
    )
    .await?;
    Ok(rows.into_iter().map(|e| (e.id, e.url)).collect())
}

#[derive(Deserialize, Default)]
pub struct ShowQuery {
    /// The endpoint an example was just sent to.
    endpoint: Option<String>,
    resent: Option<String>,
}

pub async fn show(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Path((_, id)): Path<(String, String)>,
    Query(q): Query<ShowQuery>,
) -> PortalResult {
    let event =
        crate::svix::messages::find(&state, &session.project, &session.application_id, &id).await?;
    let deliveries = delivery_store::list(
        &state.pool,
        session.project.id.as_str(),
        &DeliveryFilter {
            event_id: Some(event.id.clone()),
            application_id: Some(session.application_id.clone()),
            ..DeliveryFilter::default()
        },
        None,
        100,
    )
    .await?;
    let urls = endpoint_urls(&state, &session).await?;
    let mut shown = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let attempts = delivery_store::attempts(&state.pool, &d.id).await?;
        let parts =
            delivery_store::request_parts(&state.pool, session.project.id.as_str(), &d.id).await?;
        let headers = parts
            .as_ref()
            .map(|p| request_view(&d, p))
            .unwrap_or_default();
        shown.push((d, attempts, headers));
    }
    // While a Delivery waits for its first Attempt the page refreshes itself (no
    // JavaScript). Deliveries are planned in the Event's own transaction, so a message with
    // none now will never have one.
    let waiting = shown.iter().any(|(d, _, _)| {
        matches!(
            d.status,
            DeliveryStatus::Pending | DeliveryStatus::Processing
        ) && d.attempt_count == 0
    });
    let payload = if event.expunged_at.is_some() {
        None
    } else {
        serde_json::from_str::<serde_json::Value>(&event.payload)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
    };
    let body = html! {
        @if q.endpoint.is_some() {
            p.notice #notice {
                @if shown.is_empty() { "The endpoint does not take this event type (or channel), so the example was not sent to it; tick the type in its event types to receive it." }
                @else { "Example sent. Below: the request and the receiver's answer." }
            }
        }
        @if q.resent.is_some() { p.notice #notice { "Sent again." } }
        div.table { table #message {
            tr { th { "Message" } td { code { (event.id) } } }
            @if let Some(uid) = &event.event_uid { tr { th { "Your id" } td { code { (uid) } } } }
            tr { th { "Event type" } td { (event.event_type) } }
            @if let Some(c) = event.channels.as_ref().filter(|c| !c.is_empty()) { tr { th { "Channels" } td { (c.join(", ")) } } }
            tr { th { "Created" } td { (when(event.created_at)) } }
        } }
        @for (d, attempts, headers) in &shown { (delivery_section(&session, &event, &urls, d, attempts, headers)) }
        @if shown.is_empty() && q.endpoint.is_none() { p.muted { "This message went to none of your endpoints (none took its type or channel)." } }
        h2 { "Payload" }
        @match &payload { Some(p) => { pre #payload { (p) } }, None => { p.muted { "The payload is no longer stored." } } }
    };
    Ok(page(
        &session,
        "messages",
        "Message",
        waiting.then_some(2),
        body,
    ))
}

/// One Delivery of the message: where it went, its status, re-send, the request's headers
/// and its Attempts.
fn delivery_section(
    session: &PortalSession,
    event: &crate::store::events::EventRow,
    urls: &[(String, String)],
    d: &delivery_store::DeliveryRow,
    attempts: &[delivery_store::Attempt],
    headers: &[(String, String)],
) -> maud::Markup {
    html! {
    @let url = urls.iter().find(|(id, _)| *id == d.endpoint_id).map_or(d.endpoint_id.as_str(), |(_, u)| u.as_str());
    section.card.delivery data-endpoint=(d.endpoint_id) {
        h2 { "To " (url) }
        p { "Status: " span class={ "status " (d.status.as_str()) } { (d.status) }
            " · " (d.attempt_count) " attempt(s)"
            @if let (DeliveryStatus::Pending, Some(at)) = (d.status, d.next_retry_at) { " · next " (when(at)) }
            @if let Some(r) = &d.failure_reason { " · " span.error { (r) } } }
        @if !session.read_only && event.expunged_at.is_none() && matches!(d.status, DeliveryStatus::Failed | DeliveryStatus::Succeeded) {
            form.inline method="post" action=(session.href(&format!("messages/{}/resend/{}", event.id, d.endpoint_id))) {
                input type="hidden" name="csrf" value=(session.csrf());
                button.secondary.resend type="submit" { "Re-send" }
            }
        }
        details {
            summary { "Request headers" }
            pre.request-headers { @for (name, value) in headers { (name) ": " (value) "\n" } }
        }
        div.table { table.attempts {
            thead { tr { th { "#" } th { "When" } th { "Status" } th { "Duration" } th { "Answer (start)" } } }
            tbody {
                @for a in attempts {
                    tr {
                        td { (a.attempt_number) }
                        td { (when(a.started_at)) }
                        td class=(if a.outcome == "SUCCEEDED" { "SUCCEEDED" } else { "FAILED" }) {
                            (a.status_code.map_or_else(|| a.error_class.clone().unwrap_or_else(|| "no answer".into()), |c| format!("HTTP {c}")))
                        }
                        td { (a.duration_ms) " ms" }
                        td { @if let Some(x) = &a.response_excerpt { pre.answer { (x) } } @else { "—" } }
                    }
                }
                @if attempts.is_empty() { tr { td colspan="5" .muted { "No attempt yet." } } }
            }
        } }
    }
    }
}

pub async fn resend(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Path((_, id, endpoint_id)): Path<(String, String, String)>,
    body: Bytes,
) -> PortalResult {
    let f = Fields::parse(&body);
    session.check(f.csrf())?;
    let event =
        crate::svix::messages::find(&state, &session.project, &session.application_id, &id).await?;
    let _ = crate::svix::attempts::resend(
        session.project.clone(),
        State(state.clone()),
        Path((
            session.application_id.clone(),
            event.id.clone(),
            endpoint_id.clone(),
        )),
    )
    .await?;
    session.log("message.resend", &event.id);
    Ok(Redirect::to(&session.href(&format!("messages/{}?resent=1", event.id))).into_response())
}

/// The project's event types, read-only: what each means, its schema and its examples.
pub async fn catalogue(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
) -> PortalResult {
    let types =
        crate::store::event_types::list(&state.pool, session.project.id.as_str(), false, None, 500)
            .await?;
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let body = html! {
        p.muted { "The events you can subscribe an endpoint to." }
        @for t in &types {
            section.card.event-type id=(t.name) {
                h2 { code { (t.name) } }
                @if !t.description.is_empty() { p { (t.description) } }
                @if let Some(schema) = &t.schema {
                    @let examples = schema.get("examples").and_then(|e| e.as_array()).cloned().unwrap_or_default();
                    @for (n, ex) in examples.iter().enumerate() {
                        p.muted { "Example " (n + 1) }
                        pre.example { (pretty(ex)) }
                    }
                    details {
                        summary { "Schema (version " (t.schema_version) ")" }
                        pre.schema { (pretty(schema)) }
                    }
                } @else {
                    p.muted { "No schema." }
                }
            }
        }
        @if types.is_empty() { p.muted { "No event types yet." } }
    };
    Ok(page(&session, "event-types", "Event catalogue", None, body))
}
