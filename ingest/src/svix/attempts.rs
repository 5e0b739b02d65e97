//! Message attempts, and what Svix does to an endpoint's messages: resend one, recover the
//! failed ones, replay the missing ones, send an example. Each is a Railhook operation with
//! its own rules: a resend of a FAILED Delivery is the manual retry (same `webhook-id`); any
//! other resend, and "replay missing", is a Replay (a new Delivery); recover is the Failed
//! Messages bulk retry for the endpoint. A Svix attempt id is `atmpt_` and the Attempt's
//! number in Railhook's `attempts` table.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::{EndpointOut, find as find_endpoint, views as endpoint_views};
use super::messages::{MessageOut, find as find_message, message_of};
use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult};
use crate::auth::{Project, Sender};
use crate::problem::{ApiError, InternalError};
use crate::routes::replays::{MAX_EVENT_IDS, NewReplay, Started, start as start_replay};
use crate::state::AppState;
use crate::store::deliveries::{self as store, AttemptRow, DeliveryFilter};
use crate::store::events as events_store;
use railhook_common::DeliveryStatus;

const ATTEMPT_PREFIX: &str = "atmpt_";

/// Svix's numeric message status of a Delivery: 0 success, 1 pending, 2 fail, 3 sending.
fn status_of(s: DeliveryStatus) -> (i32, &'static str) {
    match s {
        DeliveryStatus::Succeeded => (0, "success"),
        DeliveryStatus::Pending => (1, "pending"),
        DeliveryStatus::Failed => (2, "fail"),
        DeliveryStatus::Processing => (3, "sending"),
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageAttemptOut {
    pub id: String,
    pub msg_id: String,
    pub endpoint_id: String,
    pub url: String,
    /// The start of the receiver's answer (Railhook keeps an excerpt).
    pub response: String,
    /// 0 when no answer came (a timeout, a refused connection).
    pub response_status_code: i32,
    pub response_duration_ms: i32,
    pub status: i32,
    pub status_text: &'static str,
    /// 0: scheduled. Railhook records no trigger per Attempt.
    pub trigger_type: i32,
    pub timestamp: DateTime<Utc>,
    pub msg: Option<MessageOut>,
}

fn attempt_of(a: AttemptRow) -> MessageAttemptOut {
    let (status, status_text) = if a.outcome == "SUCCEEDED" {
        (0, "success")
    } else {
        (2, "fail")
    };
    MessageAttemptOut {
        id: format!("{ATTEMPT_PREFIX}{}", a.id),
        msg_id: a.event_id,
        endpoint_id: a.endpoint_id,
        url: a.url,
        response: a.response_excerpt.unwrap_or_default(),
        response_status_code: a.status_code.unwrap_or(0),
        response_duration_ms: a.duration_ms,
        status,
        status_text,
        trigger_type: 0,
        timestamp: a.started_at,
        msg: None,
    }
}

/// An attempt id (`atmpt_<n>`) as the number; anything else names no attempt.
fn attempt_number(raw: &str) -> Option<i64> {
    raw.strip_prefix(ATTEMPT_PREFIX)?.parse().ok()
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttemptListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// With the list by message: only the attempts to this endpoint (id or uid).
    pub endpoint_id: Option<String>,
    /// Include each attempt's message (by endpoint).
    pub with_msg: Option<bool>,
}

async fn attempt_page(
    state: &AppState,
    project: &Project,
    endpoint_id: Option<&str>,
    event_id: Option<&str>,
    q: &AttemptListQuery,
) -> SvixResult<ListResponse<MessageAttemptOut>> {
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let before = match page.after.as_deref() {
        None => None,
        Some(it) => {
            Some(attempt_number(it).ok_or(ApiError::validation("iterator", "invalid iterator"))?)
        }
    };
    let rows = store::attempt_rows(
        &state.pool,
        project.id.as_str(),
        endpoint_id,
        event_id,
        None,
        before,
        page.fetch(),
    )
    .await?;
    let mut out: Vec<MessageAttemptOut> = rows.into_iter().map(attempt_of).collect();
    if q.with_msg == Some(true) {
        // The page's messages in one statement (issue #55), not one per Attempt.
        let ids: Vec<String> = out.iter().map(|a| a.msg_id.clone()).collect();
        let events = events_store::rows_by_id(&state.pool, project.id.as_str(), &ids).await?;
        for a in &mut out {
            if let Some(row) = events.get(&a.msg_id) {
                a.msg = Some(message_of(row.clone(), true)?);
            }
        }
    }
    Ok(page.finish(out, |a: &MessageAttemptOut| &a.id))
}

/// Svix `messageAttempt.listByEndpoint`: an endpoint's Attempts.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/attempt/endpoint/{endpoint_id}", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path), AttemptListQuery),
    responses((status = 200, body = ListResponse<MessageAttemptOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn list_by_endpoint(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<AttemptListQuery>,
) -> SvixResult<Json<ListResponse<MessageAttemptOut>>> {
    let endpoint = find_endpoint(&state, &project, &app_id, &endpoint_id).await?;
    Ok(Json(
        attempt_page(&state, &project, Some(&endpoint.id), None, &q).await?,
    ))
}

/// Svix `messageAttempt.listByMsg`: a message's Attempts.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/attempt/msg/{msg_id}", tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path), AttemptListQuery),
    responses((status = 200, body = ListResponse<MessageAttemptOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn list_by_msg(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<AttemptListQuery>,
) -> SvixResult<Json<ListResponse<MessageAttemptOut>>> {
    let msg = find_message(&state, &project, &app_id, &msg_id).await?;
    let endpoint = match &q.endpoint_id {
        Some(e) => Some(find_endpoint(&state, &project, &app_id, e).await?.id),
        None => None,
    };
    Ok(Json(
        attempt_page(&state, &project, endpoint.as_deref(), Some(&msg.id), &q).await?,
    ))
}

/// Svix `messageAttempt.get`: one Attempt.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}",
    tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path), ("attempt_id" = String, Path)),
    responses((status = 200, body = MessageAttemptOut), (status = 404)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id, attempt_id)): Path<(String, String, String)>,
) -> SvixResult<Json<MessageAttemptOut>> {
    let msg = find_message(&state, &project, &app_id, &msg_id).await?;
    let number = attempt_number(&attempt_id).ok_or(ApiError::NotFound("attempt"))?;
    let row = store::attempt_rows(
        &state.pool,
        project.id.as_str(),
        None,
        Some(&msg.id),
        Some(number),
        None,
        1,
    )
    .await?
    .pop()
    .ok_or(ApiError::NotFound("attempt"))?;
    Ok(Json(attempt_of(row)))
}

/// A message as one endpoint sees it: its Delivery's status beside the message.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMessageOut {
    #[serde(flatten)]
    pub msg: MessageOut,
    pub status: i32,
    pub status_text: &'static str,
    pub next_attempt: Option<DateTime<Utc>>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// Answer with payloads (default true).
    pub with_content: Option<bool>,
}

/// A page of the project's Deliveries matching `filter`; the iterator is a Delivery's id.
async fn deliveries_page(
    state: &AppState,
    project: &Project,
    filter: &DeliveryFilter,
    q: &DeliveryListQuery,
) -> SvixResult<(Page, Vec<store::DeliveryRow>)> {
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    let rows = store::list(
        &state.pool,
        project.id.as_str(),
        filter,
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    Ok((page, rows))
}

/// The messages sent to an endpoint, newest first; the iterator is the Delivery's id.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/msg", tag = "svix",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path), DeliveryListQuery),
    responses((status = 200, body = ListResponse<EndpointMessageOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn attempted_messages(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<DeliveryListQuery>,
) -> SvixResult<Json<ListResponse<EndpointMessageOut>>> {
    let endpoint = find_endpoint(&state, &project, &app_id, &endpoint_id).await?;
    let filter = DeliveryFilter {
        endpoint_id: Some(endpoint.id),
        ..DeliveryFilter::default()
    };
    let (page, rows) = deliveries_page(&state, &project, &filter, &q).await?;
    // The page's messages in one statement (issue #55), not one per Delivery.
    let ids: Vec<String> = rows.iter().map(|d| d.event_id.clone()).collect();
    let events = events_store::rows_by_id(&state.pool, project.id.as_str(), &ids).await?;
    let mut out = Vec::with_capacity(rows.len());
    for d in rows {
        // Two Deliveries of one Event on one endpoint (a replay) each show the message.
        let Some(event) = events.get(&d.event_id).cloned() else {
            continue;
        };
        let (status, status_text) = status_of(d.status);
        let msg = message_of(event, q.with_content.unwrap_or(true))?;
        let next_attempt = d
            .next_retry_at
            .filter(|_| d.status == DeliveryStatus::Pending);
        out.push((
            d.id,
            EndpointMessageOut {
                msg,
                status,
                status_text,
                next_attempt,
            },
        ));
    }
    // The iterator is the Delivery's id; the items are the Svix shape alone.
    Ok(Json(page.finish(out, |(id, _)| id).map(|(_, item)| item)))
}

/// An endpoint a message was sent to, with that Delivery's status.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageEndpointOut {
    #[serde(flatten)]
    pub endpoint: EndpointOut,
    pub status: i32,
    pub status_text: &'static str,
    pub next_attempt: Option<DateTime<Utc>>,
}

/// Svix `messageAttempt.listAttemptedDestinations`: the endpoints a message went to.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}/endpoint", tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path), DeliveryListQuery),
    responses((status = 200, body = ListResponse<MessageEndpointOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn attempted_destinations(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<DeliveryListQuery>,
) -> SvixResult<Json<ListResponse<MessageEndpointOut>>> {
    let msg = find_message(&state, &project, &app_id, &msg_id).await?;
    let filter = DeliveryFilter {
        event_id: Some(msg.id),
        ..DeliveryFilter::default()
    };
    let (page, rows) = deliveries_page(&state, &project, &filter, &q).await?;
    // The page's endpoints, and their subscriptions, in one statement each (issue #55).
    let ids: Vec<String> = rows.iter().map(|d| d.endpoint_id.clone()).collect();
    let endpoints = crate::store::endpoints::rows_by_id(
        &state.pool,
        project.id.as_str(),
        &ids,
        crate::store::endpoints::Kind::Webhook,
    )
    .await?;
    let rows: Vec<_> = rows
        .into_iter()
        .filter_map(|d| Some((endpoints.get(&d.endpoint_id)?.clone(), d)))
        .collect();
    let views = endpoint_views(&state, rows.iter().map(|(e, _)| e.clone()).collect()).await?;
    let mut out = Vec::with_capacity(rows.len());
    for ((_, d), endpoint) in rows.into_iter().zip(views) {
        let (status, status_text) = status_of(d.status);
        let next_attempt = d
            .next_retry_at
            .filter(|_| d.status == DeliveryStatus::Pending);
        out.push((
            d.id,
            MessageEndpointOut {
                endpoint,
                status,
                status_text,
                next_attempt,
            },
        ));
    }
    // The iterator is the Delivery's id; the items are the Svix shape alone.
    Ok(Json(page.finish(out, |(id, _)| id).map(|(_, item)| item)))
}

/// Sends `event_id` to `endpoint_id` again as a Replay (a new Delivery); returns its id.
async fn replay_to(
    state: &AppState,
    project: &Project,
    event_ids: Vec<String>,
    endpoint_id: &str,
) -> SvixResult<String> {
    let body = NewReplay {
        event_ids: Some(event_ids),
        endpoint_id: Some(endpoint_id.to_owned()),
        ..NewReplay::default()
    };
    match start_replay(state, project, body).await? {
        Started::Replay(r) => Ok(r.id),
        Started::Preview(_) => {
            Err(ApiError::Internal(InternalError::Fault("replay preview")).into())
        }
    }
}

/// Svix `messageAttempt.resend`: sends a message to an endpoint again.
#[utoipa::path(post,
    path = "/api/v1/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend", tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 202, description = "`{}`"), (status = 404), (status = 409)),
    security(("api_key" = [])))]
pub async fn resend(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id, endpoint_id)): Path<(String, String, String)>,
) -> SvixResult<(StatusCode, Json<serde_json::Value>)> {
    let msg = find_message(&state, &project, &app_id, &msg_id).await?;
    let endpoint = find_endpoint(&state, &project, &app_id, &endpoint_id).await?;
    let filter = DeliveryFilter {
        event_id: Some(msg.id.clone()),
        endpoint_id: Some(endpoint.id.clone()),
        ..DeliveryFilter::default()
    };
    let newest = store::list(&state.pool, project.id.as_str(), &filter, None, 1)
        .await?
        .pop();
    match newest {
        Some(d) if d.status == DeliveryStatus::Failed => {
            crate::routes::deliveries::retry_one(&state, &project, &d.id).await?;
        }
        _ => {
            replay_to(&state, &project, vec![msg.id], &endpoint.id).await?;
        }
    }
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({}))))
}

/// What Svix calls a background task: Railhook's recover finishes before it answers, and a
/// replay runs in the ingest's Replay engine (its id is the Replay's).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskOut {
    pub id: String,
    /// `running` or `finished`.
    pub status: &'static str,
    /// `endpoint.recover` or `endpoint.replay`.
    pub task: &'static str,
    pub updated_at: DateTime<Utc>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct SinceIn {
    pub since: DateTime<Utc>,
    pub until: Option<DateTime<Utc>>,
}

/// Sends again every failed message of the endpoint that failed in `[since, until)` (the
/// Failed Messages bulk retry: same Deliveries, same `webhook-id`s).
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/recover",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = SinceIn,
    responses((status = 202, body = TaskOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn recover(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<SinceIn>,
) -> SvixResult<(StatusCode, Json<TaskOut>)> {
    let endpoint = find_endpoint(&state, &project, &app_id, &endpoint_id).await?;
    let filter = crate::store::failed::FailedFilter {
        endpoint_id: Some(endpoint.id),
        since: Some(body.since),
        until: body.until,
        ..Default::default()
    };
    filter.validate()?;
    let recovered = crate::store::failed::retry_matching(
        &state.pool,
        project.id.as_str(),
        &filter,
        &project.actor,
    )
    .await?;
    tracing::info!(recovered, "svix recover");
    Ok((
        StatusCode::ACCEPTED,
        Json(TaskOut {
            id: format!("qtask_{}", ulid::Ulid::new().to_string().to_lowercase()),
            status: "finished",
            task: "endpoint.recover",
            updated_at: Utc::now(),
        }),
    ))
}

/// Sends the endpoint the application's messages of `[since, until)` it never got (at most
/// 1000 per call), as a Replay.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/replay-missing",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = SinceIn,
    responses((status = 202, body = TaskOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn replay_missing(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<SinceIn>,
) -> SvixResult<(StatusCode, Json<TaskOut>)> {
    let endpoint = find_endpoint(&state, &project, &app_id, &endpoint_id).await?;
    let app_id = endpoint.application_id.clone().unwrap_or_default();
    let missing = store::missing_for_endpoint(
        &state.pool,
        project.id.as_str(),
        &app_id,
        &endpoint.id,
        body.since,
        body.until,
        MAX_EVENT_IDS as i64,
    )
    .await?;
    let task = if missing.is_empty() {
        TaskOut {
            id: format!("qtask_{}", ulid::Ulid::new().to_string().to_lowercase()),
            status: "finished",
            task: "endpoint.replay",
            updated_at: Utc::now(),
        }
    } else {
        TaskOut {
            id: replay_to(&state, &project, missing, &endpoint.id).await?,
            status: "running",
            task: "endpoint.replay",
            updated_at: Utc::now(),
        }
    };
    Ok((StatusCode::ACCEPTED, Json(task)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventExampleIn {
    pub event_type: String,
    /// Which of the schema's `examples` to send (default the first).
    pub example_index: Option<usize>,
    /// The payload to send instead of an example.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
}

/// Sends one example message of `eventType` to this endpoint alone: the given payload, or
/// the type's schema's example, or `{}`. It is a real message of the application (in its
/// list), delivered only to this endpoint, and only if the endpoint takes that type.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/send-example",
    tag = "svix", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    request_body = EventExampleIn,
    responses((status = 202, body = MessageOut), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn send_example(
    sender: Sender,
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    SvixJson(body): SvixJson<EventExampleIn>,
) -> SvixResult<(StatusCode, Json<MessageOut>)> {
    let project = &sender.project;
    let endpoint = find_endpoint(&state, project, &app_id, &endpoint_id).await?;
    let sent = example_to(&state, project, &sender.subscriptions, &endpoint, body).await?;
    Ok((StatusCode::ACCEPTED, Json(sent)))
}

/// Sends one example message to `endpoint` alone (the customer portal's "send an example"
/// too), through the same ingest transaction as every message.
pub(crate) async fn example_to(
    state: &AppState,
    project: &Project,
    subscriptions: &crate::store::subscriptions::Subscriptions,
    endpoint: &crate::store::endpoints::EndpointRow,
    body: EventExampleIn,
) -> SvixResult<MessageOut> {
    let name = crate::routes::event_types::parse_name(&body.event_type)?;
    let payload = match body.payload {
        Some(p) => p,
        None => {
            let found =
                crate::store::event_types::find(&state.pool, project.id.as_str(), &name).await?;
            let examples = found
                .and_then(|t| t.schema)
                .and_then(|s| s.get("examples").cloned())
                .and_then(|e| e.as_array().cloned())
                .unwrap_or_default();
            examples
                .get(body.example_index.unwrap_or(0))
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}))
        }
    };
    let raw = serde_json::value::to_raw_value(&payload)
        .map_err(|_| ApiError::validation("payload", "payload must be a JSON object"))?;
    let mut event = crate::routes::events::validate_event(
        "",
        &name,
        raw,
        None,
        state.limits.max_payload_bytes,
    )?;
    event.audience = crate::plan::Audience {
        application_id: endpoint.application_id.clone(),
        channels: None,
    };
    let only = subscriptions.only(|s| s.endpoint_id == endpoint.id);
    let accepted = crate::accept::ingest(state, project, &only, vec![event])
        .await?
        .pop()
        .ok_or(ApiError::Internal(InternalError::Fault(
            "empty ingest result",
        )))?;
    let row = events_store::find(&state.pool, &accepted.id, project.id.as_str())
        .await?
        .ok_or(ApiError::NotFound("message"))?
        .0;
    message_of(row, true)
}

/// The attempt routes under `/app/{app_id}/attempt` and `/msg`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_by_endpoint))
        .routes(routes!(list_by_msg))
        .routes(routes!(get))
        .routes(routes!(attempted_destinations))
        .routes(routes!(resend))
}

/// The routes under an endpoint (part of the endpoints' router).
pub fn endpoint_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(attempted_messages))
        .routes(routes!(recover))
        .routes(routes!(replay_missing))
        .routes(routes!(send_example))
}
