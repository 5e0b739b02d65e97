//! `/api/v1/app/{app_id}/poller/{sink_id}`: a polling endpoint's stream, in the shape the
//! official SDKs' `message.poller` reads (docs/POLLING.md). The sink is an endpoint of type
//! `poller` of the application; its stream is its Deliveries in Sequence Number order
//! (`store::poller`), and an iterator is a position in it.
//!
//! Three readers: `poll` (the caller keeps the iterator), `consumer_poll` (Railhook keeps it
//! per consumer id, moved forward by each poll) and `consumer_seek` (moves it to a time).
//! Each authenticates with the project's API key or with the endpoint's own poll token
//! (`rhpoll_…`, `POST /v1/endpoints/{id}/poll-token`), which opens this endpoint's stream and
//! nothing else: what a project gives its customer instead of its key.

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use railhook_common::keygen::hash_api_key;
use railhook_common::transport::TransportKind;
use railhook_common::vocabulary::Word;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::find as find_endpoint;
use super::{SvixJson, SvixQuery, SvixResult};
use crate::auth::Project;
use crate::problem::{ApiError, InternalError};
use crate::state::AppState;
use crate::store::poller::{self as store, FILTERED_SCAN, Narrowing, Polled};

/// What a poll token starts with (the rest: 32 random letters and digits).
pub const POLL_TOKEN_PREFIX: &str = "rhpoll_";

/// What an iterator starts with; the rest is the position (a Sequence Number).
const ITERATOR_PREFIX: &str = "itr_";

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 250;

/// Who is polling: a project (its API key), or one polling endpoint (its poll token).
pub enum Reader {
    Project(Project),
    Token { endpoint_id: String },
}

impl FromRequestParts<AppState> for Reader {
    type Rejection = super::SvixError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = crate::auth::bearer(parts).ok_or(ApiError::Unauthorized)?;
        if token.starts_with(POLL_TOKEN_PREFIX) {
            // By equality on a unique index, like an API key: no timing signal.
            let (endpoint_id, _) = store::by_token(&state.pool, &hash_api_key(token))
                .await?
                .ok_or(ApiError::Unauthorized)?;
            return Ok(Reader::Token { endpoint_id });
        }
        Ok(Reader::Project(
            Project::from_request_parts(parts, state).await?,
        ))
    }
}

/// The polling endpoint the path names, if the reader may read it: a project's own
/// application's poller, or the one endpoint a token opens (named by its id or uid, in its
/// own application). Anything else is 404, whether it exists or not.
async fn sink(
    state: &AppState,
    reader: &Reader,
    app_id: &str,
    sink_id: &str,
) -> SvixResult<String> {
    let not_found = ApiError::NotFound("polling endpoint");
    match reader {
        Reader::Project(project) => {
            let row = find_endpoint(state, project, app_id, sink_id).await?;
            if row.transport != TransportKind::Poller.as_str() {
                return Err(not_found.into());
            }
            Ok(row.id)
        }
        Reader::Token { endpoint_id } => {
            let named = sqlx::query_scalar!(
                r#"SELECT e.id FROM endpoints e JOIN applications a ON a.id = e.application_id
                   WHERE e.id = $1 AND e.deleted_at IS NULL
                     AND (a.id = $2 OR a.uid = $2) AND (e.id = $3 OR e.uid = $3)"#,
                endpoint_id,
                app_id,
                sink_id
            )
            .fetch_optional(&state.pool)
            .await?;
            named.ok_or_else(|| not_found.into())
        }
    }
}

/// A consumer id: 1–128 letters, digits, `.`, `_`, `-` (it is a key the caller chooses).
fn check_consumer(raw: &str) -> SvixResult<()> {
    if railhook_common::names::is_plain_name(raw, 128) {
        Ok(())
    } else {
        Err(ApiError::validation(
            "consumer_id",
            "a consumer id is 1 to 128 letters, digits, '.', '_' or '-'",
        )
        .into())
    }
}

fn check_limit(limit: Option<i64>) -> SvixResult<i64> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(
            ApiError::validation("limit", format!("limit must be between 1 and {MAX_LIMIT}"))
                .into(),
        )
    }
}

/// An iterator this surface gave out (`None`: none was given).
fn parse_iterator(raw: Option<&str>) -> SvixResult<Option<i64>> {
    match raw {
        None | Some("") => Ok(None),
        Some(it) => it
            .strip_prefix(ITERATOR_PREFIX)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<i64>().ok())
            .map(Some)
            .ok_or_else(|| ApiError::validation("iterator", "invalid iterator").into()),
    }
}

fn iterator_of(position: i64) -> String {
    format!("{ITERATOR_PREFIX}{position}")
}

/// One message of the stream, as the SDKs' `PollingEndpointMessageOut`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollingEndpointMessageOut {
    /// The message's id (the Event's).
    pub id: String,
    /// The sender's own id for it (`eventId` on create), if it gave one.
    pub event_id: Option<String>,
    pub event_type: String,
    /// As sent; `{}` once expunged.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    pub channels: Option<Vec<String>>,
    pub timestamp: DateTime<Utc>,
    pub tags: Option<Vec<String>>,
    pub deliver_at: Option<DateTime<Utc>>,
    pub headers: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PollingEndpointOut {
    pub data: Vec<PollingEndpointMessageOut>,
    /// Pass it back to read on from here.
    pub iterator: String,
    /// Nothing more to read right now.
    pub done: bool,
}

/// A page read from `position`: the wanted messages (at most `limit`), the position after
/// them (also returned as a number, for a consumer's commit), and whether the stream was read
/// to its end.
fn page(
    rows: Vec<Polled>,
    position: i64,
    limit: i64,
    scan: i64,
) -> SvixResult<(PollingEndpointOut, i64)> {
    let scanned = rows.len() as i64;
    let mut last = position;
    let mut data = Vec::new();
    for row in rows {
        if data.len() as i64 == limit {
            break;
        }
        last = row.sequence_number;
        if let Some(message) = message_of(row)? {
            data.push(message);
        }
    }
    // A full page stops at its last message; otherwise everything scanned was passed.
    let done = (data.len() as i64) < limit && scanned < scan;
    let out = PollingEndpointOut {
        data,
        iterator: iterator_of(last),
        done,
    };
    Ok((out, last))
}

fn message_of(row: Polled) -> SvixResult<Option<PollingEndpointMessageOut>> {
    let (true, Some(id), Some(event_type), Some(timestamp)) =
        (row.wanted, row.event_id, row.event_type, row.created_at)
    else {
        return Ok(None);
    };
    let text = match row.payload {
        Some(p) if !row.expunged => p,
        _ => "{}".to_owned(),
    };
    let payload = RawValue::from_string(text)
        .map_err(|_| ApiError::Internal(InternalError::Fault("stored payload")))?;
    Ok(Some(PollingEndpointMessageOut {
        id,
        event_id: row.event_uid,
        event_type,
        payload,
        channels: row.channels.filter(|c| !c.is_empty()),
        timestamp,
        tags: None,
        deliver_at: None,
        headers: None,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PollQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// The `iterator` of the previous page; absent: the first page.
    pub iterator: Option<String>,
    /// Only this exact event type.
    pub event_type: Option<String>,
    /// Only messages on this channel.
    pub channel: Option<String>,
    /// Start after this time (without an iterator).
    pub after: Option<DateTime<Utc>>,
}

/// Reads the stream from the caller's iterator (or from `after`, or from the start).
#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{sink_id}", tag = "svix",
    params(("app_id" = String, Path), ("sink_id" = String, Path), PollQuery),
    responses((status = 200, body = PollingEndpointOut), (status = 401), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn poll(
    reader: Reader,
    State(state): State<AppState>,
    Path((app_id, sink_id)): Path<(String, String)>,
    SvixQuery(q): SvixQuery<PollQuery>,
) -> SvixResult<Json<PollingEndpointOut>> {
    let limit = check_limit(q.limit)?;
    let iterator = parse_iterator(q.iterator.as_deref())?;
    let endpoint = sink(&state, &reader, &app_id, &sink_id).await?;
    let position = match (iterator, q.after) {
        (Some(p), _) => p,
        (None, Some(after)) => store::position_at(&state.pool, &endpoint, after).await?,
        (None, None) => 0,
    };
    let narrowing = Narrowing {
        event_type: q.event_type.as_deref().filter(|t| !t.is_empty()),
        channel: q.channel.as_deref().filter(|c| !c.is_empty()),
    };
    let scan = if narrowing.is_empty() {
        limit
    } else {
        FILTERED_SCAN.max(limit)
    };
    let rows = store::read(&state.pool, &endpoint, position, scan, &narrowing).await?;
    Ok(Json(page(rows, position, limit, scan)?.0))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConsumerPollQuery {
    /// Items in the page: 1–250, default 50.
    pub limit: Option<i64>,
    /// Read from here instead of the consumer's committed position.
    pub iterator: Option<String>,
}

/// Reads the stream from the consumer's committed position (or the iterator given), and
/// commits the position after the page: the next poll without an iterator reads on from
/// there. A consumer id is created by its first poll or seek, at the stream's start.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}",
    tag = "svix",
    params(("app_id" = String, Path), ("sink_id" = String, Path), ("consumer_id" = String, Path),
           ConsumerPollQuery),
    responses((status = 200, body = PollingEndpointOut), (status = 401), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn consumer_poll(
    reader: Reader,
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer_id)): Path<(String, String, String)>,
    SvixQuery(q): SvixQuery<ConsumerPollQuery>,
) -> SvixResult<Json<PollingEndpointOut>> {
    let limit = check_limit(q.limit)?;
    let iterator = parse_iterator(q.iterator.as_deref())?;
    check_consumer(&consumer_id)?;
    let endpoint = sink(&state, &reader, &app_id, &sink_id).await?;
    let position = match iterator {
        Some(p) => p,
        None => store::position(&state.pool, &endpoint, &consumer_id).await?,
    };
    let rows = store::read(
        &state.pool,
        &endpoint,
        position,
        limit,
        &Narrowing::default(),
    )
    .await?;
    let (out, reached) = page(rows, position, limit, limit)?;
    // Only a move forward writes: an idle consumer's polls read and nothing else.
    if reached > position {
        store::advance(&state.pool, &endpoint, &consumer_id, reached).await?;
    }
    Ok(Json(out))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct PollingEndpointConsumerSeekIn {
    pub after: DateTime<Utc>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PollingEndpointConsumerSeekOut {
    pub iterator: String,
}

/// Moves the consumer to just before the first message made at or after `after` (back or
/// forward): its next poll reads from there.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}/seek",
    tag = "svix",
    params(("app_id" = String, Path), ("sink_id" = String, Path), ("consumer_id" = String, Path)),
    request_body = PollingEndpointConsumerSeekIn,
    responses((status = 200, body = PollingEndpointConsumerSeekOut), (status = 401), (status = 404), (status = 422)),
    security(("api_key" = [])))]
pub async fn consumer_seek(
    reader: Reader,
    State(state): State<AppState>,
    Path((app_id, sink_id, consumer_id)): Path<(String, String, String)>,
    SvixJson(body): SvixJson<PollingEndpointConsumerSeekIn>,
) -> SvixResult<Json<PollingEndpointConsumerSeekOut>> {
    check_consumer(&consumer_id)?;
    let endpoint = sink(&state, &reader, &app_id, &sink_id).await?;
    let position = store::position_at(&state.pool, &endpoint, body.after).await?;
    store::set(&state.pool, &endpoint, &consumer_id, position).await?;
    Ok(Json(PollingEndpointConsumerSeekOut {
        iterator: iterator_of(position),
    }))
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(poll))
        .routes(routes!(consumer_poll))
        .routes(routes!(consumer_seek))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterators_round_trip_and_refuse_anything_else() {
        assert_eq!(parse_iterator(Some(&iterator_of(42))).ok(), Some(Some(42)));
        assert_eq!(parse_iterator(None).ok(), Some(None));
        for bad in [
            "42",
            "itr_",
            "itr_-1",
            "itr_1e3",
            "itr_99999999999999999999",
            "pi_1",
        ] {
            assert!(parse_iterator(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn consumer_ids_are_plain_keys() {
        assert!(check_consumer("nightly-export_1.a").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(129), "é"] {
            assert!(check_consumer(bad).is_err(), "{bad:?}");
        }
    }
}
