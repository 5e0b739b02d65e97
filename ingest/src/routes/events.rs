//! Events: `POST /v1/events` (one), `POST /v1/events/batch` (many, one transaction), reads.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use railhook_common::ids::EventId;
use railhook_common::metrics_http::FinalOutcome;
use railhook_common::{EventType, Word};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accept::{AcceptedEvent, NewEvent, ingest};
use crate::auth::{Project, Sender};
use crate::extract::{ApiJson, ApiQuery, trace_of_request};
use crate::pagination::{Listing, PageRequest};
use crate::plan::Audience;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::applications::{check_channels, resolve_for_ingest};
use crate::state::AppState;
use crate::store::events as store;

pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEvent {
    /// Dot-separated segments of `[A-Za-z0-9_-]`, e.g. `order.paid`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// A JSON object, at most `max_payload_bytes` (1 MiB by default) as sent.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    /// The application (id or uid) the Event is for: it reaches only that application's
    /// endpoints. Absent: the project's own endpoints.
    pub application: Option<String>,
    /// Sent on these channels (1–10): endpoints that list channels receive it only if they
    /// share one.
    pub channels: Option<Vec<String>>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    #[serde(rename = "type")]
    pub event_type: String,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    pub idempotency_key: Option<String>,
    pub application: Option<String>,
    pub channels: Option<Vec<String>>,
}

/// An Event's audience from the request (`field` prefixes the names in errors): the
/// application resolved from its id or uid, and its channels checked.
pub(crate) async fn audience(
    state: &AppState,
    project_id: &str,
    field: &str,
    application: Option<&str>,
    channels: Option<&[String]>,
) -> ApiResult<Audience> {
    let channels = channels
        .map(|c| check_channels(&format!("{field}channels"), c))
        .transpose()?;
    let application_id = match application {
        Some(a) => {
            Some(resolve_for_ingest(state, project_id, &format!("{field}application"), a).await?)
        }
        None => None,
    };
    Ok(Audience {
        application_id,
        channels,
    })
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub events: Vec<BatchItem>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct BatchResult {
    /// One entry per request item, in order. `created` is false where an Idempotency-Key
    /// matched an Event accepted earlier.
    pub data: Vec<BatchEntry>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct BatchEntry {
    pub created: bool,
    #[serde(flatten)]
    pub event: AcceptedEvent,
}

fn validate_key(field: &str, raw: &str) -> ApiResult<String> {
    let ok = !raw.is_empty()
        && raw.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && raw.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if ok {
        Ok(raw.to_owned())
    } else {
        Err(ApiError::validation(
            field,
            format!("{field} must be 1-{MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
        ))
    }
}

pub(crate) fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    match headers.get(IDEMPOTENCY_KEY_HEADER) {
        None => Ok(None),
        Some(v) => {
            let raw = v.to_str().map_err(|_| {
                ApiError::validation("Idempotency-Key", "Idempotency-Key must be visible ASCII")
            })?;
            validate_key("Idempotency-Key", raw).map(Some)
        }
    }
}

pub(crate) fn validate_event(
    field: &str,
    event_type: &str,
    payload: Box<RawValue>,
    idempotency_key: Option<String>,
    max_payload_bytes: usize,
) -> ApiResult<NewEvent> {
    let event_type = EventType::parse(event_type)
        .map_err(|e| ApiError::validation(format!("{field}type"), format!("type {e}")))?;
    let raw = payload.get();
    if raw.len() > max_payload_bytes {
        return Err(ApiError::PayloadTooLarge(format!(
            "{field}payload is {} bytes; the limit is {max_payload_bytes}",
            raw.len()
        )));
    }
    if !raw.starts_with('{') {
        return Err(ApiError::validation(
            format!("{field}payload"),
            "payload must be a JSON object",
        ));
    }
    crate::storable::check_storable(raw)
        .map_err(|why| ApiError::validation(format!("{field}payload"), format!("payload {why}")))?;
    Ok(NewEvent {
        event_type,
        payload,
        idempotency_key,
        traceparent: None,
        tracestate: None,
        audience: Audience::default(),
        event_uid: None,
    })
}

/// Accepts an Event: the Event, one Delivery per subscribed endpoint and their Outbox rows in one transaction.
///
/// Send an `Idempotency-Key`: the same key and body answer `200` with the Event first created.
#[utoipa::path(post, path = "/v1/events", tag = "events", request_body = CreateEvent,
    params(("Idempotency-Key" = Option<String>, Header,
            description = "Retries with the same key return the Event already created")),
    responses(
        (status = 201, description = "Event accepted with its Deliveries", body = AcceptedEvent),
        (status = 200, description = "Same Idempotency-Key and request: the Event created before", body = AcceptedEvent),
        (status = 409, description = "Idempotency-Key reused with a different request", body = Problem),
        (status = 413, body = Problem), (status = 422, body = Problem), (status = 429, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    sender: Sender,
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateEvent>,
) -> ApiResult<(StatusCode, Json<AcceptedEvent>)> {
    let key = idempotency_key(&headers)?;
    let mut event = validate_event(
        "",
        &body.event_type,
        body.payload,
        key,
        state.limits.max_payload_bytes,
    )?;
    event.audience = audience(
        &state,
        sender.project.id.as_str(),
        "",
        body.application.as_deref(),
        body.channels.as_deref(),
    )
    .await?;
    let accepted = accept_one(&state, &sender, &headers, event).await?;
    let status = if accepted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(accepted)))
}

/// One checked Event through the ingest transaction, as `POST /v1/events` and the
/// Svix-compatible message create take it: the request's trace context, the type's schema,
/// then [`ingest`].
pub(crate) async fn accept_one(
    state: &AppState,
    sender: &Sender,
    headers: &HeaderMap,
    mut event: NewEvent,
) -> ApiResult<AcceptedEvent> {
    (event.traceparent, event.tracestate) = {
        let (tp, ts) = trace_of_request(headers);
        (Some(tp), ts)
    };
    state
        .schemas
        .check(
            &state.pool,
            sender.project.id.as_str(),
            &sender.schemas,
            std::slice::from_ref(&event),
            |e| (e.event_type.as_str(), e.payload.get()),
            |_| String::new(),
        )
        .await?;
    ingest(state, &sender.project, &sender.subscriptions, vec![event])
        .await?
        .pop()
        .ok_or(ApiError::Internal(crate::problem::InternalError::Fault(
            "empty ingest result",
        )))
}

/// Accepts up to `MAX_BATCH_SIZE` Events in one transaction: all or none.
#[utoipa::path(post, path = "/v1/events/batch", tag = "events", request_body = CreateBatch,
    responses((status = 201, body = BatchResult), (status = 409, body = Problem),
              (status = 413, body = Problem), (status = 422, body = Problem),
              (status = 429, body = Problem)),
    security(("api_key" = [])))]
pub async fn create_batch(
    sender: Sender,
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateBatch>,
) -> ApiResult<(StatusCode, Json<BatchResult>)> {
    let (traceparent, tracestate) = trace_of_request(&headers);
    let max = state.limits.max_batch_size;
    if body.events.is_empty() || body.events.len() > max {
        return Err(ApiError::validation(
            "events",
            format!("events must hold 1-{max} items"),
        ));
    }
    let mut events = Vec::with_capacity(body.events.len());
    let mut keys = std::collections::HashSet::new();
    for (i, item) in body.events.into_iter().enumerate() {
        let field = format!("events[{i}].");
        let key = item
            .idempotency_key
            .as_deref()
            .map(|k| validate_key(&format!("{field}idempotency_key"), k))
            .transpose()?;
        if let Some(k) = &key
            && !keys.insert(k.clone())
        {
            return Err(ApiError::validation(
                format!("{field}idempotency_key"),
                "idempotency_key appears twice in this batch",
            ));
        }
        let max_payload = state.limits.max_payload_bytes;
        let mut event = validate_event(&field, &item.event_type, item.payload, key, max_payload)?;
        event.audience = audience(
            &state,
            sender.project.id.as_str(),
            &field,
            item.application.as_deref(),
            item.channels.as_deref(),
        )
        .await?;
        event.traceparent = Some(traceparent.clone());
        event.tracestate.clone_from(&tracestate);
        events.push(event);
    }
    state
        .schemas
        .check(
            &state.pool,
            sender.project.id.as_str(),
            &sender.schemas,
            &events,
            |e| (e.event_type.as_str(), e.payload.get()),
            |i| format!("events[{i}]."),
        )
        .await?;
    let accepted = ingest(&state, &sender.project, &sender.subscriptions, events).await?;
    let data = accepted
        .into_iter()
        .map(|event| BatchEntry {
            created: event.created,
            event,
        })
        .collect();
    Ok((StatusCode::CREATED, Json(BatchResult { data })))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliverySummary {
    pub id: String,
    pub endpoint_id: String,
    pub status: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// `null` once the payload was expunged.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Box<RawValue>>,
    pub idempotency_key: Option<String>,
    pub application_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    /// When the payload was expunged (`DELETE /v1/events/{id}/payload`), if it was.
    pub expunged_at: Option<DateTime<Utc>>,
    /// The W3C trace id this Event's deliveries continue (the caller's, or one Railhook
    /// started); absent for Events stored before trace context was kept.
    pub trace_id: Option<String>,
    pub deliveries: Vec<DeliverySummary>,
}

/// Returns one Event with its payload and its Deliveries' statuses.
#[utoipa::path(get, path = "/v1/events/{id}", tag = "events", params(("id" = String, Path)),
    responses((status = 200, body = Event), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Event>> {
    let id = EventId::parse(&id).map_err(|_| ApiError::NotFound("event"))?;
    let (row, deliveries) = store::find(&state.pool, id.as_str(), project.id.as_str())
        .await?
        .ok_or(ApiError::NotFound("event"))?;
    let deliveries = deliveries
        .into_iter()
        .map(|d| DeliverySummary {
            id: d.id,
            endpoint_id: d.endpoint_id,
            status: d.status,
        })
        .collect();
    let payload = match row.expunged_at {
        Some(_) => None,
        None => Some(RawValue::from_string(row.payload).map_err(|_| {
            ApiError::Internal(crate::problem::InternalError::Fault("stored payload"))
        })?),
    };
    Ok(Json(Event {
        id: row.id,
        event_type: row.event_type,
        payload,
        idempotency_key: row.idempotency_key,
        application_id: row.application_id,
        channels: row.channels,
        created_at: row.created_at,
        expunged_at: row.expunged_at,
        trace_id: row
            .traceparent
            .as_deref()
            .and_then(railhook_common::trace_context::TraceParent::parse)
            .map(|t| t.trace_id_hex()),
        deliveries,
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Expunged {
    pub id: String,
    pub expunged_at: DateTime<Utc>,
    /// Deliveries that had not been sent yet (PENDING or PROCESSING) and were ended FAILED
    /// with reason `payload_expunged` by this call.
    pub deliveries_failed: i64,
}

/// Removes an Event's payload from every place Railhook stores it: the payload, and for an
/// incoming webhook the provider's raw body and the headers kept to forward. The Event's
/// metadata, its Deliveries and their Attempts stay. Deliveries not sent yet end FAILED
/// (`payload_expunged`) in the same transaction, so nothing is sent without its payload; a
/// request already in flight may still arrive, and its outcome is fenced out. Calling it
/// again is harmless (the first `expunged_at` stays). Copies outside Postgres' live tables
/// (WAL not yet recycled, backups) are the operator's retention (docs/OPERATIONS.md).
#[utoipa::path(delete, path = "/v1/events/{id}/payload", tag = "events",
    params(("id" = String, Path)),
    responses((status = 200, body = Expunged), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn expunge(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Expunged>> {
    let id = EventId::parse(&id).map_err(|_| ApiError::NotFound("event"))?;
    let store::Expunge {
        expunged_at,
        deliveries_failed,
    } = {
        let mut change =
            crate::audit::Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
        let expunged = store::expunge(change.conn(), id.as_str(), project.id.as_str())
            .await?
            .ok_or(ApiError::NotFound("event"))?;
        let changed = serde_json::json!({"deliveries_failed": expunged.deliveries_failed});
        change
            .commit("event", Some(id.as_str()), "expunge_payload", changed)
            .await?;
        expunged
    };
    state.metrics.payloads_expunged.inc();
    state
        .metrics
        .deliveries_final
        .with_label_values(&[FinalOutcome::Expunged.as_str()])
        .inc_by(u64::try_from(deliveries_failed).unwrap_or(0));
    Ok(Json(Expunged {
        id: id.as_str().to_owned(),
        expunged_at,
        deliveries_failed,
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Exact event type.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// RFC 3339; only Events created at or after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// RFC 3339; only Events created before this instant.
    pub created_before: Option<DateTime<Utc>>,
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
    /// Only this application's Events (its id or uid).
    pub application: Option<String>,
    /// Only Events sent on this channel.
    pub channel: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EventSummary {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub idempotency_key: Option<String>,
    pub application_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
}

/// Lists Events, newest first, filtered by type, application or channel.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(ListQuery),
    responses((status = 200, body = Listing<EventSummary>)), security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<EventSummary>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let application = match &q.application {
        Some(a) => Some(
            crate::routes::applications::resolve(&state, project.id.as_str(), a)
                .await?
                .id,
        ),
        None => None,
    };
    let filter = store::ListFilter {
        event_type: q.event_type.as_deref(),
        created_after: q.created_after,
        created_before: q.created_before,
        application_id: application.as_deref(),
        channel: q.channel.as_deref(),
    };
    let after = page.after.as_deref();
    let rows = store::list(
        &state.pool,
        project.id.as_str(),
        &filter,
        after,
        page.fetch(),
    )
    .await?;
    let rows: Vec<EventSummary> = rows
        .into_iter()
        .map(|r| EventSummary {
            id: r.id,
            event_type: r.event_type,
            idempotency_key: r.idempotency_key,
            application_id: r.application_id,
            channels: r.channels,
            created_at: r.created_at,
        })
        .collect();
    Ok(Json(page.finish(rows, |e: &EventSummary| &e.id)))
}

/// `/v1/events`: its routes with their OpenAPI operations, each body limit on the routes
/// that take one (a single Event's payload plus its envelope; a batch's own limit).
pub fn router(single_limit: usize, batch_limit: usize) -> OpenApiRouter<AppState> {
    use axum::extract::DefaultBodyLimit;
    let single = OpenApiRouter::new()
        .routes(routes!(create, list))
        .layer(DefaultBodyLimit::max(single_limit));
    let batch = OpenApiRouter::new()
        .routes(routes!(create_batch))
        .layer(DefaultBodyLimit::max(batch_limit));
    OpenApiRouter::new()
        .routes(routes!(get))
        .routes(routes!(expunge))
        .merge(single)
        .merge(batch)
}
