//! Replays (the Time Machine): new Deliveries built from stored Events. The request only
//! records what to replay; `crate::replay` does the work in bounded batches.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use railhook_common::event_type::EventType;
use railhook_common::ids::{EndpointId, EventId, ReplayId};
use serde::{Deserialize, Serialize};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::{ApiJson, ApiQuery};
use crate::pagination::{Listing, PageRequest};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;
use crate::store::replays::{self, Counted, Selection};

/// Most Event ids one by-id Replay may name.
pub const MAX_EVENT_IDS: usize = 1000;
const MAX_EVENT_TYPES: usize = 100;

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewReplay {
    /// Replay exactly these Events (at most 1000) …
    pub event_ids: Option<Vec<String>>,
    /// … or every Event created in `[from, to)`.
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// With a range: only these exact event types.
    pub event_types: Option<Vec<String>>,
    /// Only to this endpoint (it must still match the Event: a subscription, or a
    /// destination of the Event's Source).
    pub endpoint_id: Option<String>,
    /// Count the Events that would be replayed and create nothing.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Replay {
    pub id: String,
    /// `RUNNING`, `COMPLETED` or `CANCELLED`.
    pub status: String,
    pub event_ids: Option<Vec<String>>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub event_types: Option<Vec<String>>,
    pub endpoint_id: Option<String>,
    /// Events the Replay covers, counted when it was created.
    pub events_total: i64,
    pub events_done: i64,
    pub deliveries_created: i64,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReplayPreview {
    /// Events the Replay would cover now.
    pub events_total: i64,
}

impl From<replays::ReplayRow> for Replay {
    fn from(r: replays::ReplayRow) -> Self {
        Self {
            id: r.id,
            status: r.status,
            event_ids: r.event_ids,
            from: r.from_time,
            to: r.to_time,
            event_types: r.event_types,
            endpoint_id: r.endpoint_id,
            events_total: r.events_total,
            events_done: r.events_done,
            deliveries_created: r.deliveries_created,
            created_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}

/// A validated request: which Events, and to where.
struct Validated {
    event_ids: Option<Vec<String>>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    event_types: Option<Vec<String>>,
    endpoint_id: Option<String>,
}

fn validate(body: NewReplay) -> Result<Validated, ApiError> {
    let endpoint_id = body
        .endpoint_id
        .map(|raw| {
            EndpointId::parse(&raw)
                .map(EndpointId::into_string)
                .map_err(|_| ApiError::validation("endpoint_id", "not an endpoint id"))
        })
        .transpose()?;
    match (body.event_ids, body.from, body.to) {
        (Some(ids), None, None) => {
            if body.event_types.is_some() {
                return Err(ApiError::validation(
                    "event_types",
                    "event_types narrows a time range; with event_ids, name the Events",
                ));
            }
            if ids.is_empty() || ids.len() > MAX_EVENT_IDS {
                return Err(ApiError::validation(
                    "event_ids",
                    format!("event_ids must hold 1 to {MAX_EVENT_IDS} ids"),
                ));
            }
            let mut unique = BTreeSet::new();
            for raw in ids {
                let id = EventId::parse(&raw).map_err(|_| {
                    ApiError::validation("event_ids", "every entry must be an event id (evt_…)")
                })?;
                unique.insert(id.into_string());
            }
            Ok(Validated {
                event_ids: Some(unique.into_iter().collect()),
                from: None,
                to: None,
                event_types: None,
                endpoint_id,
            })
        }
        (None, Some(from), Some(to)) => {
            // Events are only ever created up to now; a range reaching into the future is
            // cut there, so the Replay's count is final when it is made.
            let to = to.min(Utc::now());
            if from >= to {
                return Err(ApiError::validation(
                    "from",
                    "from must be earlier than to (and than now)",
                ));
            }
            let event_types = body
                .event_types
                .map(|types| {
                    if types.is_empty() || types.len() > MAX_EVENT_TYPES {
                        return Err(ApiError::validation(
                            "event_types",
                            format!("event_types must hold 1 to {MAX_EVENT_TYPES} types"),
                        ));
                    }
                    types
                        .iter()
                        .map(|t| {
                            EventType::parse(t)
                                .map(|t| t.as_str().to_owned())
                                .map_err(|e| {
                                    ApiError::validation("event_types", format!("'{t}': {e}"))
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()?;
            Ok(Validated {
                event_ids: None,
                from: Some(from),
                to: Some(to),
                event_types,
                endpoint_id,
            })
        }
        _ => Err(ApiError::validation(
            "body",
            "give either event_ids, or both from and to",
        )),
    }
}

/// Starts a Replay of stored Events (by id or by time range), or counts it with `dry_run`.
#[utoipa::path(post, path = "/v1/replays", tag = "replays", request_body = NewReplay,
    responses((status = 202, body = Replay), (status = 200, description = "dry run", body = ReplayPreview),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn create(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<NewReplay>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    Ok(match start(&state, &project, body).await? {
        Started::Preview(p) => Json(p).into_response(),
        Started::Replay(r) => (StatusCode::ACCEPTED, Json(r)).into_response(),
    })
}

/// What a Replay request produced: a count (dry run) or a new Replay.
pub enum Started {
    Preview(ReplayPreview),
    Replay(Replay),
}

/// Validates a Replay request, counts its Events and, unless it is a dry run, records it
/// for the engine (`crate::replay`). Shared by the API and the dashboard.
pub async fn start(state: &AppState, project: &Project, body: NewReplay) -> ApiResult<Started> {
    let dry_run = body.dry_run;
    let sel = validate(body)?;
    if let Some(endpoint) = &sel.endpoint_id {
        let exists = replays::endpoint_exists(&state.pool, endpoint, project.id.as_str()).await?;
        if !exists {
            return Err(ApiError::validation("endpoint_id", "no such endpoint"));
        }
    }
    // An Event whose payload was expunged cannot be replayed: a range skips it, a list that
    // names it is refused.
    let Counted {
        found,
        replayable: total,
    } = replays::count(
        &state.pool,
        project.id.as_str(),
        &Selection {
            event_ids: sel.event_ids.clone(),
            from: sel.from,
            to: sel.to,
            event_types: sel.event_types.clone(),
        },
    )
    .await?;
    if let Some(ids) = &sel.event_ids {
        if found < ids.len() as i64 {
            // Another project's Event answers exactly like one that does not exist.
            return Err(ApiError::validation(
                "event_ids",
                format!(
                    "{} of the {} event ids were not found",
                    ids.len() as i64 - found,
                    ids.len()
                ),
            ));
        }
        if total < found {
            return Err(ApiError::validation(
                "event_ids",
                format!(
                    "{} of the {} events had their payload expunged and cannot be replayed",
                    found - total,
                    ids.len()
                ),
            ));
        }
    }
    if dry_run {
        return Ok(Started::Preview(ReplayPreview {
            events_total: total,
        }));
    }
    let replay_id = ReplayId::generate();
    let new = replays::NewReplay {
        id: replay_id.as_str(),
        project_id: project.id.as_str(),
        event_ids: sel.event_ids.as_deref(),
        from: sel.from,
        to: sel.to,
        event_types: sel.event_types.as_deref(),
        endpoint_id: sel.endpoint_id.as_deref(),
        events_total: total,
    };
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let replay: Replay = replays::insert(change.conn(), new).await?.into();
    change
        .commit("replay", Some(&replay.id), "create", audit::view(&replay))
        .await?;
    Ok(Started::Replay(replay))
}

pub async fn recent(state: &AppState, project: &Project, limit: i64) -> ApiResult<Vec<Replay>> {
    let rows = replays::recent(&state.pool, project.id.as_str(), limit).await?;
    Ok(rows.into_iter().map(Replay::from).collect())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Rows in the page: 1–500, default 50.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent: the first page.
    pub cursor: Option<String>,
}

/// Lists Replays, newest first.
#[utoipa::path(get, path = "/v1/replays", tag = "replays", params(ListQuery),
    responses((status = 200, body = Listing<Replay>), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn list(
    project: Project,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Listing<Replay>>> {
    let page = PageRequest::parse(q.limit, q.cursor.as_deref())?;
    let after = page.after.as_deref();
    let rows = replays::page(&state.pool, project.id.as_str(), after, page.fetch()).await?;
    let rows: Vec<Replay> = rows.into_iter().map(Replay::from).collect();
    Ok(Json(page.finish(rows, |r: &Replay| &r.id)))
}

pub async fn find(state: &AppState, project: &Project, raw: &str) -> ApiResult<Replay> {
    let id = ReplayId::parse(raw).map_err(|_| ApiError::NotFound("replay"))?;
    replays::find(&state.pool, id.as_str(), project.id.as_str())
        .await?
        .map(Replay::from)
        .ok_or(ApiError::NotFound("replay"))
}

/// Returns a Replay's progress.
#[utoipa::path(get, path = "/v1/replays/{id}", tag = "replays", params(("id" = String, Path)),
    responses((status = 200, body = Replay), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn get(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Replay>> {
    Ok(Json(find(&state, &project, &id).await?))
}

/// Stops a RUNNING Replay after the batch in progress; Deliveries already created stay.
#[utoipa::path(post, path = "/v1/replays/{id}/cancel", tag = "replays", params(("id" = String, Path)),
    responses((status = 200, body = Replay), (status = 404, body = Problem),
              (status = 409, description = "the Replay is not RUNNING", body = Problem)),
    security(("api_key" = [])))]
pub async fn cancel(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Replay>> {
    let current = find(&state, &project, &id).await?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let cancelled = replays::cancel(change.conn(), &current.id, project.id.as_str())
        .await?
        .map(Replay::from)
        .ok_or(ApiError::InvalidState(
            "only a RUNNING replay can be cancelled",
        ))?;
    change
        .commit("replay", Some(&current.id), "cancel", serde_json::json!({}))
        .await?;
    Ok(Json(cancelled))
}

/// `/v1/replays`: its routes with their OpenAPI operations.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get))
        .routes(routes!(cancel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_ids_or_a_range_not_both_nor_neither() {
        assert!(validate(NewReplay::default()).is_err());
        let now = Utc::now();
        let both = NewReplay {
            event_ids: Some(vec![EventId::generate().into_string()]),
            from: Some(now - chrono::Duration::hours(1)),
            to: Some(now),
            ..NewReplay::default()
        };
        assert!(validate(both).is_err());
        let backwards = NewReplay {
            from: Some(now),
            to: Some(now - chrono::Duration::hours(1)),
            ..NewReplay::default()
        };
        assert!(validate(backwards).is_err());
        let too_many = NewReplay {
            event_ids: Some(
                (0..=MAX_EVENT_IDS)
                    .map(|_| EventId::generate().into_string())
                    .collect(),
            ),
            ..NewReplay::default()
        };
        assert!(validate(too_many).is_err());
        let range = NewReplay {
            from: Some(now - chrono::Duration::hours(1)),
            to: Some(now + chrono::Duration::hours(1)),
            event_types: Some(vec!["order.paid".into()]),
            ..NewReplay::default()
        };
        let sel = validate(range).expect("valid range");
        assert!(sel.to.expect("to") <= Utc::now(), "the future is cut off");
        let bad_type = NewReplay {
            from: Some(now - chrono::Duration::hours(1)),
            to: Some(now),
            event_types: Some(vec!["order.*".into()]),
            ..NewReplay::default()
        };
        assert!(validate(bad_type).is_err());
    }
}
