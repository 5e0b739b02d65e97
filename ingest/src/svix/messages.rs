//! `/api/v1/app/{app_id}/msg`: a Svix message is a Railhook Event of the application,
//! accepted by the same ingest transaction as `POST /v1/events` (`accept::ingest`), with the
//! same checks (type, payload, schema, quota, the `idempotency-key` header) and the same
//! guarantee: the answer comes after the Event, its Deliveries and their Outbox rows
//! committed together. `eventId` is kept as the Event's uid (shown, and usable to fetch it).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::applications::{ApplicationIn, find as find_app, find_or_create};
use super::{ListResponse, Page, SvixJson, SvixQuery, SvixResult, comma_list};
use crate::auth::{Project, Sender};
use crate::problem::{ApiError, InternalError};
use crate::routes::events::{accept_one, audience, idempotency_key, validate_event};
use crate::state::AppState;
use crate::store::events::{self as store, EventRow, ListFilter};

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    pub id: String,
    pub event_id: Option<String>,
    pub event_type: String,
    /// The payload; `{}` when the list was asked without content, or once expunged.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    pub channels: Option<Vec<String>>,
    pub timestamp: DateTime<Utc>,
    pub tags: Option<Vec<String>>,
    pub deliver_at: Option<DateTime<Utc>>,
}

fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).unwrap_or_else(|_| unreachable!("{{}} is JSON"))
}

pub(crate) fn message_of(row: EventRow, with_content: bool) -> SvixResult<MessageOut> {
    let payload = if with_content && row.expunged_at.is_none() {
        RawValue::from_string(row.payload)
            .map_err(|_| ApiError::Internal(InternalError::Fault("stored payload")))?
    } else {
        empty_object()
    };
    Ok(MessageOut {
        id: row.id,
        event_id: row.event_uid,
        event_type: row.event_type,
        payload,
        channels: row.channels,
        timestamp: row.created_at,
        tags: None,
        deliver_at: None,
    })
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageIn {
    pub event_type: String,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    /// Your own id for the message (1–256 of `[A-Za-z0-9_.-]`): shown, and usable wherever
    /// the message id is.
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    /// Creates the application named by the path if it does not exist.
    pub application: Option<ApplicationIn>,
    /// Not supported (refused when not empty).
    pub tags: Option<Vec<String>>,
    /// Not supported (refused when given).
    pub deliver_at: Option<DateTime<Utc>>,
    pub transformations_params: Option<serde_json::Value>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreateQuery {
    /// Answer with the payload (default true).
    pub with_content: Option<bool>,
}

fn check_event_uid(uid: &str) -> SvixResult<()> {
    if crate::routes::is_plain_name(uid) {
        Ok(())
    } else {
        Err(ApiError::validation(
            "eventId",
            "eventId must be 1-256 characters of A-Z, a-z, 0-9, '_', '.' and '-'",
        )
        .into())
    }
}

/// Refuses what Svix's hosted service offers and this server does not do, rather than
/// accepting a message whose options would be silently dropped.
fn refuse_hosted_only(body: &MessageIn) -> SvixResult<()> {
    if body.deliver_at.is_some() {
        return Err(ApiError::validation(
            "deliverAt",
            "deliverAt (scheduled messages) is not supported by this server",
        )
        .into());
    }
    if body.tags.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::validation("tags", "tags are not supported by this server").into());
    }
    if body.transformations_params.is_some() {
        return Err(ApiError::validation(
            "transformationsParams",
            "transformations are not supported by this server",
        )
        .into());
    }
    Ok(())
}

/// Svix `message.create`: accepts a message (an Event for the application), with the same guarantee as `POST /v1/events`.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/msg", tag = "svix",
    params(("app_id" = String, Path), CreateQuery,
           ("idempotency-key" = Option<String>, Header)),
    request_body = MessageIn,
    responses((status = 202, body = MessageOut), (status = 404), (status = 409), (status = 422),
              (status = 429)),
    security(("api_key" = [])))]
pub async fn create(
    sender: Sender,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixQuery(q): SvixQuery<CreateQuery>,
    headers: HeaderMap,
    SvixJson(body): SvixJson<MessageIn>,
) -> SvixResult<(StatusCode, Json<MessageOut>)> {
    refuse_hosted_only(&body)?;
    if let Some(uid) = &body.event_id {
        check_event_uid(uid)?;
    }
    let project = &sender.project;
    let app = find_or_create(&state, project, &app_id, body.application.as_ref()).await?;
    let key = idempotency_key(&headers)?;
    // The answer is built from the request, not read back: an Event answered under its
    // Idempotency-Key has this request's type, payload and application (else 409).
    let content = q.with_content.unwrap_or(true).then(|| body.payload.clone());
    let event_uid = body.event_id.clone();
    let mut event = validate_event(
        "",
        &body.event_type,
        body.payload,
        key,
        state.limits.max_payload_bytes,
    )?;
    event.audience = audience(
        &state,
        project.id.as_str(),
        "",
        Some(&app.id),
        body.channels.as_deref().filter(|c| !c.is_empty()),
    )
    .await?;
    event.event_uid = body.event_id;
    // The sender's subscriptions were read before a just-made application existed; its
    // endpoints cannot exist yet either, so the cached ones are complete.
    let accepted = accept_one(&state, &sender, &headers, event).await?;
    let out = MessageOut {
        id: accepted.id,
        event_id: event_uid,
        event_type: accepted.event_type,
        payload: content.unwrap_or_else(empty_object),
        channels: accepted.channels,
        timestamp: accepted.created_at,
        tags: None,
        deliver_at: None,
    };
    Ok((StatusCode::ACCEPTED, Json(out)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// Only messages on this channel.
    pub channel: Option<String>,
    /// Only messages created before this time.
    pub before: Option<DateTime<Utc>>,
    /// Only messages created after this time.
    pub after: Option<DateTime<Utc>>,
    /// Answer with payloads (default true; the v2 SDKs send false unless asked).
    pub with_content: Option<bool>,
    /// Comma-separated event types.
    pub event_types: Option<String>,
    /// Tags are not supported: a tag filter matches no message.
    pub tag: Option<String>,
}

/// Svix `message.list`: lists the application's messages.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg", tag = "svix",
    params(("app_id" = String, Path), ListQuery),
    responses((status = 200, body = ListResponse<MessageOut>), (status = 404)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    SvixQuery(q): SvixQuery<ListQuery>,
) -> SvixResult<Json<ListResponse<MessageOut>>> {
    let app = find_app(&state, &project, &app_id).await?;
    let page = Page::parse(q.limit, q.iterator.as_deref())?;
    if q.tag.is_some() {
        return Ok(Json(page.finish(Vec::new(), |m: &MessageOut| &m.id)));
    }
    let filter = ListFilter {
        created_after: q.after,
        created_before: q.before,
        channel: q.channel.as_deref(),
        ..ListFilter::default()
    };
    let types = comma_list(q.event_types.as_deref());
    let rows = store::of_application(
        &state.pool,
        project.id.as_str(),
        &app.id,
        &filter,
        types.as_deref(),
        page.after.as_deref(),
        page.fetch(),
    )
    .await?;
    let with_content = q.with_content.unwrap_or(true);
    let out = rows
        .into_iter()
        .map(|r| message_of(r, with_content))
        .collect::<SvixResult<Vec<_>>>()?;
    Ok(Json(page.finish(out, |m: &MessageOut| &m.id)))
}

/// The application's message a path names (its id or its `eventId`), or 404.
pub(crate) async fn find(
    state: &AppState,
    project: &Project,
    app_id: &str,
    msg_id: &str,
) -> SvixResult<EventRow> {
    let app = find_app(state, project, app_id).await?;
    Ok(
        store::find_in_application(&state.pool, project.id.as_str(), &app.id, msg_id)
            .await?
            .ok_or(ApiError::NotFound("message"))?,
    )
}

/// Svix `message.get`: returns a message by id or `eventId`.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}", tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path, description = "id or eventId")),
    responses((status = 200, body = MessageOut), (status = 404)), security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
) -> SvixResult<Json<MessageOut>> {
    let row = find(&state, &project, &app_id, &msg_id).await?;
    Ok(Json(message_of(row, true)?))
}

/// Removes the payload wherever Railhook keeps it (`DELETE /v1/events/{id}/payload`); the
/// message and its attempts stay, and Deliveries not sent yet end FAILED.
#[utoipa::path(delete, path = "/api/v1/app/{app_id}/msg/{msg_id}/content", tag = "svix",
    params(("app_id" = String, Path), ("msg_id" = String, Path)),
    responses((status = 204), (status = 404)), security(("api_key" = [])))]
pub async fn expunge_content(
    project: Project,
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
) -> SvixResult<StatusCode> {
    let row = find(&state, &project, &app_id, &msg_id).await?;
    let _ = crate::routes::events::expunge(project, State(state), Path(row.id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get))
        .routes(routes!(expunge_content))
}
