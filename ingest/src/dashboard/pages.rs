//! The dashboard's pages. Each reads through the same scoped queries as the API (or the
//! API's own functions), so what a page shows is what the key could fetch itself.

use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{Markup, html};
use railhook_common::event_type::EventType;
use railhook_common::ids::EndpointId;
use railhook_common::vocabulary::{DeliveryOrigin, ReplayStatus, Word};
use serde::Deserialize;

use super::{CsrfForm, PageError, PageResult, Session, layout, layout_with};
use crate::pagination::PageRequest;
use crate::problem::ApiError;
use crate::routes::deliveries;
use crate::routes::replays::{self, NewReplay, Started};
use crate::state::AppState;
use crate::store::deliveries::{self as delivery_store, DeliveryFilter};
use crate::store::endpoints;
use crate::store::failed::{FailedFilter, list_failed, retry_matching};
use railhook_common::DeliveryStatus;
use railhook_common::headers::{self, Extra};

const PAGE: i64 = 50;

/// A form field: an empty input is no filter.
pub(crate) fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// A time from a form: RFC 3339, or a `datetime-local` value read as UTC.
pub(crate) fn parse_time(
    field: &'static str,
    v: &Option<String>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    let Some(raw) = given(v) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| {
            ApiError::validation(
                field,
                format!("{field} must be a time like 2026-12-03T07:00"),
            )
        })
}

fn parse_endpoint(v: &Option<String>) -> Result<Option<String>, ApiError> {
    given(v)
        .map(|raw| {
            EndpointId::parse(raw)
                .map(EndpointId::into_string)
                .map_err(|_| ApiError::validation("endpoint_id", "not an endpoint id"))
        })
        .transpose()
}

pub(crate) fn parse_type(v: &Option<String>) -> Result<Option<String>, ApiError> {
    given(v)
        .map(|raw| {
            EventType::parse(raw)
                .map(|t| t.as_str().to_owned())
                .map_err(|e| ApiError::validation("event_type", format!("'{raw}': {e}")))
        })
        .transpose()
}

fn parse_code(v: &Option<String>) -> Result<Option<i32>, ApiError> {
    given(v)
        .map(|raw| {
            raw.parse::<i32>()
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(|| ApiError::validation("status_code", "a status code, 100-599"))
        })
        .transpose()
}

pub(crate) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub(crate) fn when_opt(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "—".to_owned(), when)
}

/// `field=value&…` of the non-empty pairs, for links that keep the filters.
pub(crate) fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v {
            s.append_pair(k, v);
        }
    }
    s.finish()
}

/// The project's live endpoints, for the filters' drop-downs.
async fn endpoint_choices(
    state: &AppState,
    session: &Session,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    // Every live endpoint of the project, operational ones too: Deliveries go to both.
    let rows = endpoints::of_project(&state.pool, session.project.id.as_str(), None).await?;
    Ok(rows.into_iter().map(|r| (r.id, r.url)).collect())
}

fn endpoint_select(choices: &[(String, String)], selected: Option<&str>) -> Markup {
    html! {
        label { "Endpoint"
            select name="endpoint_id" {
                option value="" { "any" }
                @for (id, url) in choices {
                    option value=(id) selected[selected == Some(id.as_str())] { (url) " (" (id) ")" }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Deliveries

#[derive(Deserialize, Default)]
pub struct DeliveryQuery {
    status: Option<String>,
    endpoint_id: Option<String>,
    event_type: Option<String>,
    status_code: Option<String>,
    since: Option<String>,
    until: Option<String>,
    cursor: Option<String>,
}

pub async fn deliveries(
    State(state): State<AppState>,
    session: Session,
    Query(q): Query<DeliveryQuery>,
) -> PageResult {
    let status = deliveries::parse_status(given(&q.status))?;
    let endpoint_id = parse_endpoint(&q.endpoint_id)?;
    let event_type = parse_type(&q.event_type)?;
    let filter = DeliveryFilter {
        status,
        endpoint_id: endpoint_id.clone(),
        event_type: event_type.clone(),
        status_code: parse_code(&q.status_code)?,
        since: parse_time("since", &q.since)?,
        until: parse_time("until", &q.until)?,
        event_id: None,
        application_id: None,
    };
    let page = PageRequest::parse(Some(PAGE), given(&q.cursor))?;
    let rows = delivery_store::list(
        &state.pool,
        session.project.id.as_str(),
        &filter,
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let listing = page.finish(rows, |r: &delivery_store::DeliveryRow| &r.id);
    let choices = endpoint_choices(&state, &session).await?;
    let next = listing.next_cursor.as_deref().map(|c| {
        query_string(&[
            ("status", status.map(DeliveryStatus::as_str)),
            ("endpoint_id", endpoint_id.as_deref()),
            ("event_type", event_type.as_deref()),
            ("status_code", given(&q.status_code)),
            ("since", given(&q.since)),
            ("until", given(&q.until)),
            ("cursor", Some(c)),
        ])
    });
    let body = html! {
        form.filters method="get" action="/dashboard/deliveries" {
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in DeliveryStatus::ALL { option value=(s.as_str()) selected[status == Some(s)] { (s) } }
                }
            }
            (endpoint_select(&choices, endpoint_id.as_deref()))
            label { "Event type" input name="event_type" value=[given(&q.event_type)] placeholder="order.paid"; }
            label { "Last status code" input name="status_code" size="5" value=[given(&q.status_code)]; }
            label { "Created since (UTC)" input type="datetime-local" name="since" value=[given(&q.since)]; }
            label { "Created before (UTC)" input type="datetime-local" name="until" value=[given(&q.until)]; }
            button type="submit" { "Search" }
        }
        table #deliveries {
            thead { tr { th { "Delivery" } th { "Event" } th { "Endpoint" } th { "Status" } th { "Attempts" } th { "Last code" } th { "Created" } th { "Updated" } } }
            tbody {
                @for d in &listing.data {
                    tr {
                        td { a href={ "/dashboard/deliveries/" (d.id) } { code { (d.id) } } @if DeliveryOrigin::parse(&d.origin) == Some(DeliveryOrigin::Replay) { " " span.muted { "replay" } } }
                        td { (d.event_type) br; code.muted { (d.event_id) } }
                        td { code { (d.endpoint_id) } }
                        td.status class=(d.status.as_str()) { (d.status) }
                        td { (d.attempt_count) }
                        td { (d.last_status_code.map_or_else(|| "—".to_owned(), |c| c.to_string())) }
                        td { (when(d.created_at)) }
                        td { (when(d.updated_at)) }
                    }
                }
                @if listing.data.is_empty() { tr { td colspan="8" .muted { "No deliveries match." } } }
            }
        }
        @if let Some(next) = next { p.pager { a href={ "/dashboard/deliveries?" (next) } { "Older →" } } }
    };
    Ok(layout(&session, "deliveries", "Deliveries", body))
}

/// The headers of the Delivery's requests, as common/src/headers.rs lays them out for the
/// worker, with what changes per Attempt or is secret shown as a placeholder.
pub(crate) fn request_view(
    d: &delivery_store::DeliveryRow,
    parts: &delivery_store::RequestParts,
) -> Vec<(String, String)> {
    let mut extra = Extra::merge(parts.forward_headers.as_ref(), Some(&parts.headers));
    for (_, value) in &mut extra.headers {
        *value = "<custom value>".to_owned();
    }
    headers::request_headers(&headers::Request {
        delivery_id: &d.id,
        event_id: &d.event_id,
        event_type: &d.event_type,
        timestamp: "<the Attempt's start, in Unix seconds>",
        signature: "v1,<redacted>",
        sequence_number: d.sequence_number,
        traceparent: Some("<the Attempt's span in the Event's trace>"),
        tracestate: parts.tracestate.as_deref(),
        extra: &extra,
    })
}

pub async fn delivery(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
) -> PageResult {
    let d = deliveries::find_row(&state, &session.project, &id).await?;
    let attempts = deliveries::attempts_of(&state, &d.id).await?;
    let parts = delivery_store::request_parts(&state.pool, session.project.id.as_str(), &d.id)
        .await?
        .ok_or(ApiError::NotFound("delivery"))?;
    let sent = request_view(&d, &parts);
    let (event_type, url, expunged_at) = (&d.event_type, &parts.url, parts.expunged_at);
    let payload = &parts.payload_excerpt;
    let body = html! {
        table {
            tr { th { "Delivery (webhook-id)" } td { code { (d.id) } } }
            tr { th { "Event (X-Event-Id)" } td { code { (d.event_id) } " · " (event_type) } }
            tr { th { "Endpoint" } td { code { (d.endpoint_id) } " · " (url) } }
            tr { th { "Status" } td.status class=(d.status.as_str()) { (d.status) } }
            tr { th { "Attempts" } td { (d.attempt_count) " (deferred " (d.deferral_count) " times)" } }
            tr { th { "Next retry" } td { (when_opt(d.next_retry_at)) } }
            @if let Some(r) = &d.failure_reason { tr { th { "Failure" } td.error { (r) } } }
        }
        @if d.status == DeliveryStatus::Failed && expunged_at.is_none() {
            form.inline method="post" action={ "/dashboard/deliveries/" (d.id) "/retry" } {
                input type="hidden" name="csrf" value=(session.csrf);
                p { button #retry type="submit" { "Retry this delivery" } }
            }
        }
        h2 { "Request headers sent" }
        p.muted { "Laid out by the same code as the worker's requests: the signature, the trace context and custom header values are not shown." }
        pre #request-headers {
            @for (name, value) in &sent { (name) ": " (value) "\n" }
        }
        h2 { "Attempts" }
        table #attempts {
            thead { tr { th { "#" } th { "Started" } th { "Duration" } th { "Status" } th { "Outcome" } th { "Error" } th { "Response (excerpt)" } } }
            tbody {
                @for a in &attempts {
                    tr {
                        td { (a.attempt_number) }
                        td { (when(a.started_at)) }
                        td { (a.duration_ms) " ms" }
                        td { (a.status_code.map_or_else(|| "—".to_owned(), |c| c.to_string())) }
                        td { (a.outcome) }
                        td { (a.error_class.as_deref().unwrap_or("—")) }
                        td { @if let Some(x) = &a.response_excerpt { pre { (x) } } @else { "—" } }
                    }
                }
                @if attempts.is_empty() { tr { td colspan="7" .muted { "No Attempt yet." } } }
            }
        }
        h2 { "Payload" }
        @if let Some(at) = expunged_at {
            p #expunged .muted { "Expunged " (when(at)) ": the payload is no longer stored." }
        } @else {
            pre { (payload) }
        }
    };
    Ok(layout(&session, "deliveries", "Delivery", body))
}

pub async fn retry_delivery(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    session.check(&form.csrf)?;
    let d = deliveries::retry_one(&state, &session.project, &id).await?;
    Ok(Redirect::to(&format!("/dashboard/deliveries/{}", d.id)).into_response())
}

// ---------------------------------------------------------------------------------------
// Failed messages

#[derive(Deserialize, Default)]
pub struct FailedQuery {
    endpoint_id: Option<String>,
    /// An application's id (the form offers the project's applications).
    application: Option<String>,
    event_type: Option<String>,
    status_code: Option<String>,
    since: Option<String>,
    until: Option<String>,
    cursor: Option<String>,
    retried: Option<i64>,
}

impl FailedQuery {
    fn filter(&self) -> Result<FailedFilter, ApiError> {
        // The API's own validation checks the ids, type and code; only the form's text needs
        // reading here.
        let f = FailedFilter {
            endpoint_id: given(&self.endpoint_id).map(str::to_owned),
            event_type: given(&self.event_type).map(str::to_owned),
            status_code: parse_code(&self.status_code)?,
            since: parse_time("since", &self.since)?,
            until: parse_time("until", &self.until)?,
            // Scoped like every filter: the statement reads the project's Deliveries only,
            // so another project's application id matches nothing.
            application: given(&self.application).map(str::to_owned),
        };
        f.validate()?;
        Ok(f)
    }

    fn pairs(&self) -> Vec<(&'static str, Option<&str>)> {
        vec![
            ("endpoint_id", given(&self.endpoint_id)),
            ("application", given(&self.application)),
            ("event_type", given(&self.event_type)),
            ("status_code", given(&self.status_code)),
            ("since", given(&self.since)),
            ("until", given(&self.until)),
        ]
    }
}

pub async fn failed(
    State(state): State<AppState>,
    session: Session,
    Query(q): Query<FailedQuery>,
) -> PageResult {
    let filter = q.filter()?;
    let page = PageRequest::parse(Some(PAGE), given(&q.cursor))?;
    let rows = list_failed(&state.pool, session.project.id.as_str(), &filter, &page).await?;
    let listing = page.finish(rows, |m| &m.id);
    let choices = endpoint_choices(&state, &session).await?;
    let applications =
        crate::store::applications::of_project(&state.pool, session.project.id.as_str()).await?;
    let next = listing.next_cursor.as_deref().map(|c| {
        let mut pairs = q.pairs();
        pairs.push(("cursor", Some(c)));
        query_string(&pairs)
    });
    let body = html! {
        @if let Some(n) = q.retried { p.notice #notice { "Sent " (n) " failed message(s) again." } }
        form.filters method="get" action="/dashboard/failed" {
            (endpoint_select(&choices, filter.endpoint_id.as_deref()))
            @if !applications.is_empty() {
                label { "Application"
                    select name="application" {
                        option value="" { "any" }
                        @for a in &applications {
                            option value=(a.id) selected[filter.application.as_deref() == Some(a.id.as_str())] { (a.name) }
                        }
                    }
                }
            }
            label { "Event type" input name="event_type" value=[given(&q.event_type)]; }
            label { "Last status code" input name="status_code" size="5" value=[given(&q.status_code)]; }
            label { "Failed since (UTC)" input type="datetime-local" name="since" value=[given(&q.since)]; }
            label { "Failed before (UTC)" input type="datetime-local" name="until" value=[given(&q.until)]; }
            button type="submit" { "Filter" }
        }
        @if !listing.data.is_empty() {
            form.inline method="post" action="/dashboard/failed/retry" {
                input type="hidden" name="csrf" value=(session.csrf);
                @for (k, v) in q.pairs() { @if let Some(v) = v { input type="hidden" name=(k) value=(v); } }
                p { button #retry-all.secondary type="submit" { "Retry every message matching this filter" } }
            }
        }
        table #failed {
            thead { tr { th { "Delivery" } th { "Event type" } th { "Endpoint" } th { "Attempts" } th { "Last code" } th { "Reason" } th { "Failed at" } th {} } }
            tbody {
                @for m in &listing.data {
                    tr {
                        td { a href={ "/dashboard/deliveries/" (m.id) } { code { (m.id) } } }
                        td { (m.event_type) }
                        td { (m.endpoint_url) }
                        td { (m.attempt_count) }
                        td { (m.last_status_code.map_or_else(|| "—".to_owned(), |c| c.to_string())) }
                        td { (m.failure_reason.as_deref().unwrap_or("—")) }
                        td { (when(m.failed_at)) }
                        td {
                            form.inline method="post" action={ "/dashboard/deliveries/" (m.id) "/retry" } {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button.retry type="submit" { "Retry" }
                            }
                        }
                    }
                }
                @if listing.data.is_empty() { tr { td colspan="8" .muted { "No failed messages match." } } }
            }
        }
        @if let Some(next) = next { p.pager { a href={ "/dashboard/failed?" (next) } { "Older →" } } }
    };
    Ok(layout(&session, "failed", "Failed messages", body))
}

#[derive(Deserialize)]
pub struct FailedRetryForm {
    csrf: String,
    #[serde(flatten)]
    filter: FailedQuery,
}

pub async fn retry_failed(
    State(state): State<AppState>,
    session: Session,
    Form(form): Form<FailedRetryForm>,
) -> PageResult {
    session.check(&form.csrf)?;
    let filter = form.filter.filter()?;
    let n = retry_matching(
        &state.pool,
        session.project.id.as_str(),
        &filter,
        &session.project.actor,
    )
    .await?;
    let mut pairs = form.filter.pairs();
    let n = n.to_string();
    pairs.push(("retried", Some(&n)));
    Ok(Redirect::to(&format!("/dashboard/failed?{}", query_string(&pairs))).into_response())
}

// ---------------------------------------------------------------------------------------
// Time Machine

#[derive(Deserialize, Default)]
pub struct ReplayForm {
    csrf: Option<String>,
    from: Option<String>,
    to: Option<String>,
    event_types: Option<String>,
    endpoint_id: Option<String>,
}

impl ReplayForm {
    fn request(&self, dry_run: bool) -> Result<NewReplay, ApiError> {
        let types: Vec<String> = given(&self.event_types)
            .map(|t| {
                t.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Ok(NewReplay {
            event_ids: None,
            from: Some(
                parse_time("from", &self.from)?
                    .ok_or_else(|| ApiError::validation("from", "from is required"))?,
            ),
            to: Some(
                parse_time("to", &self.to)?
                    .ok_or_else(|| ApiError::validation("to", "to is required"))?,
            ),
            event_types: (!types.is_empty()).then_some(types),
            endpoint_id: given(&self.endpoint_id).map(str::to_owned),
            dry_run,
        })
    }
}

fn progress(r: &replays::Replay) -> Markup {
    html! {
        progress value=(r.events_done) max=(r.events_total.max(1)) {}
        " " (r.events_done) " / " (r.events_total) " events · " (r.deliveries_created) " deliveries"
    }
}

pub async fn replays(
    State(state): State<AppState>,
    session: Session,
    Query(q): Query<ReplayForm>,
) -> PageResult {
    // The preview button submits this form with GET; a first visit has no range yet.
    let preview = if given(&q.from).is_some() || given(&q.to).is_some() {
        match replays::start(&state, &session.project, q.request(true)?).await? {
            Started::Preview(p) => Some(p.events_total),
            Started::Replay(_) => None,
        }
    } else {
        None
    };
    let choices = endpoint_choices(&state, &session).await?;
    let recent = replays::recent(&state, &session.project, 20).await?;
    let body = html! {
        p.muted { "Replaying builds new Deliveries from stored Events: each gets a new webhook-id (so receivers process it again) and keeps its X-Event-Id. Times are UTC." }
        form.filters method="post" action="/dashboard/replays" {
            input type="hidden" name="csrf" value=(session.csrf);
            label { "From" input #from type="datetime-local" step="1" name="from" value=[given(&q.from)] required; }
            label { "To" input #to type="datetime-local" step="1" name="to" value=[given(&q.to)] required; }
            label { "Event types (comma-separated, exact)" input name="event_types" value=[given(&q.event_types)]; }
            (endpoint_select(&choices, given(&q.endpoint_id)))
            button #preview.secondary type="submit" formmethod="get" formaction="/dashboard/replays" { "Preview count" }
            button #replay type="submit" { "Replay" }
        }
        @if let Some(n) = preview { p.notice #preview-count { (n) " events in this range would be replayed." } }
        h2 { "Recent replays" }
        table #replays {
            thead { tr { th { "Replay" } th { "Status" } th { "Progress" } th { "Created" } } }
            tbody {
                @for r in &recent {
                    tr {
                        td { a href={ "/dashboard/replays/" (r.id) } { code { (r.id) } } }
                        td.status class=(r.status) { (r.status) }
                        td { (progress(r)) }
                        td { (when(r.created_at)) }
                    }
                }
                @if recent.is_empty() { tr { td colspan="4" .muted { "No replays yet." } } }
            }
        }
    };
    Ok(layout(&session, "replays", "Time Machine", body))
}

pub async fn start_replay(
    State(state): State<AppState>,
    session: Session,
    Form(form): Form<ReplayForm>,
) -> PageResult {
    session.check(form.csrf.as_deref().unwrap_or(""))?;
    match replays::start(&state, &session.project, form.request(false)?).await? {
        Started::Replay(r) => {
            Ok(Redirect::to(&format!("/dashboard/replays/{}", r.id)).into_response())
        }
        Started::Preview(_) => Err(PageError(ApiError::InvalidState("nothing was started"))),
    }
}

pub async fn replay(
    State(state): State<AppState>,
    session: Session,
    Path(id): Path<String>,
) -> PageResult {
    let r = replays::find(&state, &session.project, &id).await?;
    let running = ReplayStatus::parse(&r.status) == Some(ReplayStatus::Running);
    let body = html! {
        p { "Status: " span #replay-status.status class=(r.status) { (r.status) } }
        p #replay-progress { (progress(&r)) }
        table {
            @if let (Some(from), Some(to)) = (r.from, r.to) { tr { th { "Range" } td { (when(from)) " → " (when(to)) } } }
            @if let Some(ids) = &r.event_ids { tr { th { "Events" } td { (ids.len()) " named" } } }
            @if let Some(t) = &r.event_types { tr { th { "Event types" } td { (t.join(", ")) } } }
            @if let Some(ep) = &r.endpoint_id { tr { th { "Endpoint" } td { code { (ep) } } } }
            tr { th { "Created" } td { (when(r.created_at)) } }
            tr { th { "Finished" } td { (when_opt(r.finished_at)) } }
        }
        @if running { p.muted { "This page refreshes every second while the replay runs." } }
        p { a href="/dashboard/deliveries" { "See the deliveries →" } }
    };
    Ok(layout_with(
        &session,
        "replays",
        "Replay",
        running.then_some(1),
        body,
    ))
}
