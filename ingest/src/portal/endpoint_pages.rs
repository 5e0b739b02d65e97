//! The portal's endpoint pages: the list with each endpoint's health, add and edit, disable,
//! enable and delete, the signing secret (reveal, rotate, the Ed25519 public key), "send an
//! example", and "recover failed messages since". Every read and write names the endpoint
//! through the session's application (`svix::endpoints::find`), so another application's
//! endpoint is a 404; every write is one change applied by the endpoint module
//! (crate::endpoint) in one transaction.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use chrono::{Duration, Utc};
use maud::{Markup, html};
use railhook_common::vocabulary::Word;
use serde::Deserialize;

use railhook_common::transport::TransportKind;

use super::endpoint_form::{Current, Fields, Submitted, broker_settings, endpoint_form, submitted};
use super::{PortalError, PortalResult, PortalSession, page};
use crate::dashboard::pages::{parse_time, when, when_opt};
use crate::endpoint::Change;
use crate::problem::ApiError;
use crate::routes::endpoint_state;
use crate::state::AppState;
use crate::store::deliveries::{self as delivery_store, DeliveryFilter};
use crate::store::endpoints::{self as store, EndpointRow, Kind};
use crate::store::event_types::{self as types_store, EventTypeRow};
use crate::svix::endpoints::{self as svix, EndpointIn};

/// The most endpoints the list shows (an application has a handful).
const MAX_LISTED: i64 = 100;

/// The endpoint `id` of the session's application, or 404.
async fn find(
    state: &AppState,
    session: &PortalSession,
    id: &str,
) -> Result<EndpointRow, PortalError> {
    Ok(svix::find(state, &session.project, &session.application_id, id).await?)
}

async fn catalogue(
    state: &AppState,
    session: &PortalSession,
) -> Result<Vec<EventTypeRow>, PortalError> {
    Ok(types_store::list(&state.pool, session.project.id.as_str(), false, None, 500).await?)
}

pub async fn list(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
) -> PortalResult {
    let rows = store::page(
        &state.pool,
        session.project.id.as_str(),
        Kind::Webhook,
        Some(&session.application_id),
        None,
        MAX_LISTED,
    )
    .await?;
    let now = Utc::now();
    let day_ago = now - Duration::hours(24);
    let mut health = Vec::with_capacity(rows.len());
    for e in &rows {
        let counts = delivery_store::status_counts(&state.pool, &e.id, Some(day_ago), None).await?;
        let last = delivery_store::last_failure(&state.pool, &e.id).await?;
        health.push((counts, last));
    }
    let body = html! {
        @if !session.read_only {
            p.actions { a #add-endpoint href=(session.href("endpoints/new")) { "Add an endpoint" } }
        }
        div.table { table #endpoints {
            thead { tr { th { "Endpoint" } th { "State" } th { "Success (24 h)" } th.wide { "Last failure" } } }
            tbody {
                @for (e, (counts, last)) in rows.iter().zip(&health) {
                    @let (state_label, _) = endpoint_state::streak_state(e.enabled, e.failing_since, &state.streak, now);
                    @let done = counts.succeeded + counts.failed;
                    tr {
                        td {
                            a href=(session.href(&format!("endpoints/{}", e.id))) { (e.url) }
                            @if !e.description.is_empty() { br; span.muted { (e.description) } }
                        }
                        td {
                            span class={ "status " (state_label) } { (state_label) }
                            @if let Some(r) = &e.disabled_reason { br; span.muted { (r) } }
                        }
                        td {
                            @if done > 0 { (counts.succeeded * 100 / done) "% of " (done) } @else { span.muted { "no messages" } }
                            @if counts.pending + counts.processing > 0 { br; span.muted { (counts.pending + counts.processing) " waiting" } }
                        }
                        td.wide {
                            @if let Some((at, code, class)) = last {
                                (when(*at)) br;
                                span.muted { (code.map_or_else(|| class.clone().unwrap_or_else(|| "no answer".into()), |c| format!("HTTP {c}"))) }
                            } @else { span.muted { "—" } }
                        }
                    }
                }
                @if rows.is_empty() { tr { td colspan="4" .muted { "No endpoints yet. Add one to start receiving webhooks." } } }
            }
        } }
    };
    Ok(page(&session, "endpoints", "Endpoints", None, body))
}

pub async fn new_form(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
) -> PortalResult {
    if session.read_only {
        return Err(PortalError::ReadOnly);
    }
    let types = catalogue(&state, &session).await?;
    let body = endpoint_form(&session, &session.href("endpoints"), &types, None);
    Ok(page(&session, "endpoints", "Add an endpoint", None, body))
}

pub async fn create(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    body: Bytes,
) -> PortalResult {
    let f = Fields::parse(&body);
    session.check(f.csrf())?;
    let s = submitted(&f)?;
    if let Some(kind) = f.get("type").filter(|t| *t != "http") {
        return create_broker(&state, &session, &f, kind, s).await;
    }
    let input = EndpointIn {
        transport: None,
        url: s.url,
        description: Some(s.description),
        throttle_rate: s.rate,
        uid: None,
        disabled: None,
        filter_types: (!s.types.is_empty()).then_some(s.types),
        channels: s.channels,
        secret: None,
        metadata: None,
        headers: Some(s.headers),
        filter: s.filter,
    };
    let (fields, patterns) = input.into_new()?;
    let created = svix::create_in_application(
        &state,
        &session.project,
        session.application_id.clone(),
        fields,
        patterns,
    )
    .await?;
    session.log("endpoint.create", &created.id);
    Ok(
        Redirect::to(&session.href(&format!("endpoints/{}?notice=created", created.id)))
            .into_response(),
    )
}

/// The add form for a broker kind the project offers in its portal (docs/DESTINATIONS.md):
/// the same endpoint as the API makes, in the session's application.
async fn create_broker(
    state: &AppState,
    session: &PortalSession,
    f: &Fields,
    kind: &str,
    s: Submitted,
) -> PortalResult {
    let offered = session.settings.endpoint_types.iter().any(|k| k == kind);
    let Some(transport) = TransportKind::parse(kind).filter(|_| offered) else {
        return Err(
            ApiError::validation("type", "this kind of endpoint is not offered here").into(),
        );
    };
    let settings = broker_settings(f, transport);
    let (mut create, types) = s.into_broker_create(transport);
    let parsed = |field: &str| {
        ApiError::validation(
            field.to_owned(),
            format!("the {kind} settings are incomplete"),
        )
    };
    match transport {
        TransportKind::Kafka => {
            create.kafka = Some(serde_json::from_value(settings).map_err(|_| parsed("kafka"))?)
        }
        TransportKind::Sqs => {
            create.sqs = Some(serde_json::from_value(settings).map_err(|_| parsed("sqs"))?)
        }
        TransportKind::Rabbitmq => {
            create.rabbitmq =
                Some(serde_json::from_value(settings).map_err(|_| parsed("rabbitmq"))?)
        }
        TransportKind::Nats => {
            create.nats = Some(serde_json::from_value(settings).map_err(|_| parsed("nats"))?)
        }
        // A poller has no settings: its type is the whole of it. A listen endpoint is
        // refused by `transport_of` (never offered either).
        TransportKind::Http | TransportKind::Poller | TransportKind::Listen => {}
    }
    let created = svix::create_in_application(
        state,
        &session.project,
        session.application_id.clone(),
        create,
        svix::patterns(Some(&types))?,
    )
    .await?;
    session.log("endpoint.create", &created.id);
    Ok(
        Redirect::to(&session.href(&format!("endpoints/{}?notice=created", created.id)))
            .into_response(),
    )
}

#[derive(Deserialize, Default)]
pub struct ShowQuery {
    reveal: Option<String>,
    notice: Option<String>,
    recovered: Option<i64>,
}

fn notice_text(q: &ShowQuery) -> Option<String> {
    if let Some(n) = q.recovered {
        return Some(format!("Sent {n} failed message(s) again."));
    }
    match q.notice.as_deref() {
        Some("created") => Some("Endpoint added. Its signing secret is below.".into()),
        Some("saved") => Some("Saved.".into()),
        Some("rotated") => Some(
            "Secret rotated. The previous one keeps signing beside it for the overlap shown."
                .into(),
        ),
        Some("enabled") => Some("Endpoint enabled.".into()),
        Some("disabled") => Some("Endpoint disabled: it receives nothing until enabled.".into()),
        Some("transformation-saved") => Some("Transformation saved.".into()),
        _ => None,
    }
}

pub async fn show(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Path((_, id)): Path<(String, String)>,
    Query(q): Query<ShowQuery>,
) -> PortalResult {
    let e = find(&state, &session, &id).await?;
    let out = svix::view(&state, e.clone()).await?;
    let view = e.clone().view(&state.keyring);
    let types = catalogue(&state, &session).await?;
    let now = Utc::now();
    let (state_label, disable_at) =
        endpoint_state::streak_state(e.enabled, e.failing_since, &state.streak, now);
    let counts =
        delivery_store::status_counts(&state.pool, &e.id, Some(now - Duration::hours(24)), None)
            .await?;
    let recent = delivery_store::list(
        &state.pool,
        session.project.id.as_str(),
        &DeliveryFilter {
            endpoint_id: Some(e.id.clone()),
            application_id: Some(session.application_id.clone()),
            ..DeliveryFilter::default()
        },
        None,
        10,
    )
    .await?;
    // The secret is read only when asked for, and never by a read-only session.
    let secret = if q.reveal.is_some() && !session.read_only {
        Some(
            crate::routes::endpoint_secret::read(&state, &session.project, &e.id, Kind::Webhook)
                .await?
                .0,
        )
    } else {
        None
    };
    let base = session.href(&format!("endpoints/{}", e.id));
    let overlap = state.limits.secret_rotation_overlap.as_secs() / 3600;
    let done = counts.succeeded + counts.failed;
    let body = html! {
        @if let Some(n) = notice_text(&q) { p.notice #notice { (n) } }
        div.table { table #endpoint {
            tr { th { "URL" } td { (e.url) } }
            @if !e.description.is_empty() { tr { th { "Description" } td { (e.description) } } }
            tr { th { "State" } td {
                span #state class={ "status " (state_label) } { (state_label) }
                @if let Some(r) = &e.disabled_reason { " · " span.muted { (r) } }
                @if state_label == "warning" { @if let Some(at) = disable_at { br; span.warning { "Failing: will be disabled at " (when(at)) " unless a message gets through." } } }
            } }
            tr { th { "Last 24 h" } td {
                (counts.succeeded) " delivered, " (counts.failed) " failed, " (counts.pending + counts.processing) " waiting"
                @if done > 0 { " (" (counts.succeeded * 100 / done) "% success)" }
            } }
            tr { th { "Event types" } td { @match &out.filter_types { Some(t) => { (t.join(", ")) }, None => { "every type" } } } }
            tr { th { "Channels" } td { @match &out.channels { Some(c) => { (c.join(", ")) }, None => { "every channel" } } } }
            tr { th { "Rate limit" } td { @match e.rate_limit_per_second { Some(r) => { (r) " per second" }, None => { "none" } } } }
            tr { th { "Payload filter" } td #filter-shown { @match &e.filter { Some(f) => { code { (f) } }, None => { "none: every message" } } } }
            tr { th { "Endpoint id" } td { code { (e.id) } } }
        } }
        @if !session.read_only { (buttons(&session, &base, e.enabled)) }
        @if e.transport == "poller" { (polling_section(&session, &base, &e)) }
        (secret_section(&session, &base, &view, secret.as_ref(), overlap))
        @if !session.read_only { (tools(&session, &base, &types)) }
        (super::transformation_card::card(&session, &base, &e, &types, None))
        h2 { "Recent messages" }
        div.table { table #recent {
            thead { tr { th { "Message" } th { "Type" } th { "Status" } th.wide { "Attempts" } th { "Created" } } }
            tbody {
                @for d in &recent {
                    tr {
                        td { a href=(session.href(&format!("messages/{}", d.event_id))) { code { (d.event_id) } } }
                        td { (d.event_type) }
                        td class={ "status " (d.status.as_str()) } { (d.status) }
                        td.wide { (d.attempt_count) }
                        td { (when(d.created_at)) }
                    }
                }
                @if recent.is_empty() { tr { td colspan="5" .muted { "Nothing sent to this endpoint yet." } } }
            }
        } }

        @if !session.read_only {
            h2 { "Edit" }
            @let headers = view.headers.clone();
            (endpoint_form(&session, &base, &types, Some(&Current { row: &e, types: out.filter_types.as_deref(), headers: &headers })))
        }
        p.muted { "Created " (when(e.created_at)) " · updated " (when_opt(Some(e.updated_at))) }
    };
    Ok(page(&session, "endpoints", "Endpoint", None, body))
}

/// Disable or enable, and delete (behind a disclosure: a second click, without JavaScript).
fn buttons(session: &PortalSession, base: &str, enabled: bool) -> Markup {
    html! {
    div.actions {
        @if enabled {
            form.inline method="post" action={ (base) "/disable" } {
                input type="hidden" name="csrf" value=(session.csrf());
                button.secondary #disable type="submit" { "Disable" }
            }
        } @else {
            form.inline method="post" action={ (base) "/enable" } {
                input type="hidden" name="csrf" value=(session.csrf());
                button #enable type="submit" { "Enable" }
            }
        }
        details {
            summary { "Delete…" }
            form.inline method="post" action={ (base) "/delete" } {
                input type="hidden" name="csrf" value=(session.csrf());
                p { "The endpoint stops receiving messages at once. This cannot be undone." }
                button.danger #delete type="submit" { "Delete this endpoint" }
            }
        }
    }
    }
}

/// A poller's stream (docs/POLLING.md): where to poll, and a button that issues the token a
/// customer's service polls with (shown once, on the page the button opens).
fn polling_section(session: &PortalSession, base: &str, e: &EndpointRow) -> Markup {
    let path = format!(
        "/api/v1/app/{}/poller/{}",
        e.application_id.as_deref().unwrap_or_default(),
        e.id
    );
    html! {
        h2 { "Polling" }
        section.card #polling {
            p { "Your service reads this endpoint's messages, in order, at " code #poll-path { (path) }
                " (the Svix SDKs' " code { "message.poller" } "), with a poll token as its bearer." }
            @if !session.read_only {
                form.inline method="post" action={ (base) "/poll-token" } {
                    input type="hidden" name="csrf" value=(session.csrf());
                    button.secondary #poll-token type="submit" { "Issue a poll token" }
                    span.muted { " A new token ends the previous one." }
                }
            }
        }
    }
}

/// The poller's "Issue a poll token": a new token, shown once on the page it answers with.
async fn poll_token(state: &AppState, session: &PortalSession, e: &EndpointRow) -> PortalResult {
    let issued = crate::routes::poller::issue(state, &session.project, &e.id).await?;
    session.log("endpoint.poll_token", &e.id);
    let body = html! {
        p.notice #notice { "Poll token issued. It is shown once: copy it now." }
        p { code.secret #poll-token-value { (issued.token) } }
        p { "Poll at " code { (issued.poll_path) } " with it as the bearer." }
        p { a href=(session.href(&format!("endpoints/{}", e.id))) { "Back to the endpoint" } }
    };
    Ok(page(session, "endpoints", "Poll token", None, body))
}

/// The signing secret: its scheme, the Ed25519 public key, reveal and rotate.
fn secret_section(
    session: &PortalSession,
    base: &str,
    view: &crate::routes::endpoints::Endpoint,
    secret: Option<&crate::routes::endpoint_secret::EndpointSecret>,
    overlap: u64,
) -> Markup {
    html! {
        h2 { "Signing secret" }
        section.card #secret {
            p.muted { "Every message carries " code { "webhook-id" } ", " code { "webhook-timestamp" } " and "
                      code { "webhook-signature" } " (Standard Webhooks). Verify the signature with this secret "
                      "before trusting a message." }
            p { "Scheme: " code { (view.signing) } }
            @if let Some(pk) = &view.public_key { p { "Public key (verify " code { "v1a" } " signatures with it): " code #public-key { (pk) } } }
            @if session.read_only {
                p.muted { "A read-only session cannot see the secret." }
            } @else if let Some(s) = &secret {
                p { code.secret #secret-value { (s.key) } }
                @if let Some(until) = s.previous_key_expires_at { p.muted { "The previous secret also signs until " (when(until)) "." } }
            } @else {
                p { a #reveal href={ (base) "?reveal=1" } { "Reveal the secret" } }
            }
            @if !session.read_only {
                form.inline method="post" action={ (base) "/rotate" } {
                    input type="hidden" name="csrf" value=(session.csrf());
                    button.secondary #rotate type="submit" { "Rotate the secret" }
                    span.muted { " The old secret keeps signing beside the new one for " (overlap) " h." }
                }
            }
        }

    }
}

/// "Send an example" and "recover failed messages since".
fn tools(session: &PortalSession, base: &str, types: &[EventTypeRow]) -> Markup {
    html! {
    h2 { "Send an example" }
    form.filters #send-example method="post" action={ (base) "/send-example" } {
        input type="hidden" name="csrf" value=(session.csrf());
        label { "Event type"
            select name="event_type" required {
                @for t in types { option value=(t.name) { (t.name) } }
            }
        }
        button type="submit" disabled[types.is_empty()] { "Send example" }
        @if types.is_empty() { span.muted { "The catalogue has no event types yet." } }
    }

    h2 { "Recover failed messages" }
    form.filters #recover method="post" action={ (base) "/recover" } {
        input type="hidden" name="csrf" value=(session.csrf());
        label { "Failed since (UTC)" input type="datetime-local" name="since" required; }
        button.secondary type="submit" { "Send them again" }
    }
    }
}

pub async fn update(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Path((_, id)): Path<(String, String)>,
    body: Bytes,
) -> PortalResult {
    let f = Fields::parse(&body);
    session.check(f.csrf())?;
    let e = find(&state, &session, &id).await?;
    // The form's every field, the endpoint's headers and its event types: one change, one
    // transaction (crate::endpoint).
    let change = submitted(&f)?.into_change()?;
    svix::apply(&state, &session.project, &e, change).await?;
    session.log("endpoint.update", &e.id);
    Ok(Redirect::to(&session.href(&format!("endpoints/{}?notice=saved", e.id))).into_response())
}

/// The endpoint's buttons: enable, disable, delete, rotate, send-example, recover.
pub async fn action(
    State(state): State<AppState>,
    Extension(session): Extension<PortalSession>,
    Path((_, id, action)): Path<(String, String, String)>,
    body: Bytes,
) -> PortalResult {
    let f = Fields::parse(&body);
    session.check(f.csrf())?;
    let e = find(&state, &session, &id).await?;
    let back = |notice: &str| session.href(&format!("endpoints/{}?notice={notice}", e.id));
    let to = match action.as_str() {
        "enable" | "disable" => {
            let change = Change::enabled(action != "disable");
            svix::apply(&state, &session.project, &e, change).await?;
            back(if action == "disable" {
                "disabled"
            } else {
                "enabled"
            })
        }
        "delete" => {
            let id = crate::routes::endpoints::parse_id(&e.id)?;
            crate::endpoint::delete(&state, &session.project, &id).await?;
            session.href("endpoints")
        }
        "rotate" => {
            // A generated secret, the previous one kept for the default overlap.
            let _rotated = crate::routes::endpoint_secret::rotate_to(
                &state,
                &session.project,
                &e.id,
                Kind::Webhook,
                None,
                None,
            )
            .await?;
            back("rotated")
        }
        "send-example" => {
            let event_type = f
                .get("event_type")
                .ok_or_else(|| ApiError::validation("event_type", "pick the event type to send"))?;
            let subscriptions =
                crate::store::subscriptions::candidates(&state.pool, session.project.id.as_str())
                    .await?;
            let body = crate::svix::attempts::EventExampleIn {
                event_type: event_type.to_owned(),
                example_index: None,
                payload: None,
            };
            let sent = crate::svix::attempts::example_to(
                &state,
                &session.project,
                &subscriptions,
                &e,
                body,
            )
            .await?;
            session.log("endpoint.send_example", &sent.id);
            return Ok(Redirect::to(
                &session.href(&format!("messages/{}?endpoint={}", sent.id, e.id)),
            )
            .into_response());
        }
        "poll-token" => return poll_token(&state, &session, &e).await,
        "transformation" => {
            super::transformation_card::save(&state, &session, &e, &f).await?;
            back("transformation-saved")
        }
        "transformation-test" => {
            return super::transformation_card::test(&state, &session, &e, &f).await;
        }
        "recover" => {
            let since = parse_time("since", &f.get("since").map(str::to_owned))?
                .ok_or_else(|| ApiError::validation("since", "give the time to recover from"))?;
            let filter = crate::store::failed::FailedFilter {
                endpoint_id: Some(e.id.clone()),
                since: Some(since),
                ..Default::default()
            };
            filter.validate()?;
            let n = crate::store::failed::retry_matching(
                &state.pool,
                session.project.id.as_str(),
                &filter,
                &session.project.actor,
            )
            .await?;
            session.log("endpoint.recover", &e.id);
            return Ok(
                Redirect::to(&session.href(&format!("endpoints/{}?recovered={n}", e.id)))
                    .into_response(),
            );
        }
        _ => return Err(ApiError::NotFound("route").into()),
    };
    state.senders.invalidate();
    session.log(&format!("endpoint.{action}"), &e.id);
    Ok(Redirect::to(&to).into_response())
}
