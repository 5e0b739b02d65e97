//! `railhook listen` sessions (issue #56, docs/RECEIVERS.md, "railhook listen"): a developer's
//! machine opens one outbound WebSocket to `GET /v1/listen`; this module makes (or finds
//! again) the session's endpoint of type `listen`, and each Attempt the worker makes for it
//! comes here as an HTTP request to `POST /v1/listen/relay/{token}`, travels down the
//! WebSocket, is forwarded by the CLI to the local receiver, and the local answer comes back
//! up to be this request's answer, and so the Attempt's result. Retries, the Fence, Failed
//! Messages and the portal see an ordinary HTTP endpoint.
//!
//! Invariants, and where they are kept:
//! - **A session's endpoint is Railhook's, not the tenant's.** Its target (the relay URL,
//!   with the session's token) is written here only (`endpoint::New::own_target`); the API
//!   refuses `type: listen` (`routes::endpoint_target::transport_of`), so the worker may send
//!   to it without the egress rule.
//! - **One endpoint per (project, session name)**, kept across reconnects (uid
//!   `listen-<name>`): Deliveries made while the connection was away are retried by the
//!   normal ladder against the same endpoint, and reach the machine once it is back.
//! - **A relay request without a live session is a 503**, never a success: the Attempt fails
//!   and is retried.
//! - **An endpoint without its connection for `RAILHOOK_LISTEN_IDLE_SECONDS` is deleted**
//!   ([`sweep`]); a live session marks its endpoint every [`HEARTBEAT`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::{SinkExt, StreamExt};
use railhook_common::transport::{ListenTarget, TransportSettings, sealing_id};
use rand::distr::{Alphanumeric, SampleString};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::auth::Project;
use crate::endpoint::{CreateEndpoint, New};
use crate::operational::{self, EndpointRef, Notice};
use crate::problem::{ApiError, ApiResult};
use crate::routes::endpoint_secret;
use crate::routes::subscriptions::parse_patterns;
use crate::state::AppState;
use crate::store::endpoints::{self as store, Kind};
use crate::store::subscriptions;

/// How often a live session marks its endpoint as in use.
pub const HEARTBEAT: Duration = Duration::from_secs(300);

/// How long a relayed Attempt waits for the machine's answer (the worker's own timeout,
/// the endpoint's, usually ends it first).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// At most this much of the local receiver's answer comes back (the Attempt keeps less).
const ANSWER_BYTES: usize = 64 * 1024;
/// The largest WebSocket message a `railhook listen` client may send (an answer with a
/// 64 KiB body, escaped, and its envelope fit well inside).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// What a relay request waits for: the local receiver's status and body, or why there is
/// none.
#[derive(Debug, Serialize, Deserialize)]
pub struct LocalAnswer {
    pub status: Option<u16>,
    #[serde(default)]
    pub body: String,
    /// Why the CLI got no answer from the local receiver (connection refused, timeout).
    pub error: Option<String>,
}

struct Relayed {
    headers: Vec<(String, String)>,
    body: Bytes,
    answer: oneshot::Sender<LocalAnswer>,
}

struct Session {
    /// Which connection holds the token now: a reconnect with the same name replaces the
    /// holder, and the old connection's cleanup must not remove the new one.
    generation: u64,
    relay: mpsc::Sender<Relayed>,
}

/// The sessions this instance holds, by token.
#[derive(Clone, Default)]
pub struct Hub {
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    generations: Arc<AtomicU64>,
}

impl Hub {
    fn attach(&self, token: &str, relay: mpsc::Sender<Relayed>) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(token.to_owned(), Session { generation, relay });
        }
        generation
    }

    fn detach(&self, token: &str, generation: u64) {
        if let Ok(mut s) = self.sessions.lock()
            && s.get(token)
                .is_some_and(|held| held.generation == generation)
        {
            s.remove(token);
        }
    }

    fn relay_of(&self, token: &str) -> Option<mpsc::Sender<Relayed>> {
        self.sessions
            .lock()
            .ok()?
            .get(token)
            .map(|s| s.relay.clone())
    }

    /// Live sessions on this instance (the gauge).
    pub fn len(&self) -> usize {
        self.sessions.lock().map_or(0, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Frames the server sends down the WebSocket (JSON text).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Down {
    /// The session is open: its endpoint, and the secret its requests are signed with.
    Ready {
        endpoint_id: String,
        secret: String,
        event_types: Vec<String>,
    },
    /// One Attempt, to forward: its headers (signature included) and body, exactly.
    Request {
        id: u64,
        headers: Vec<(String, String)>,
        body_base64: String,
    },
}

/// Frames the CLI sends up.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Up {
    Response {
        id: u64,
        #[serde(flatten)]
        answer: LocalAnswer,
    },
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListenQuery {
    /// The session's name (1–64 letters, digits, `.`, `_`, `-`; default `default`): one
    /// endpoint per name, kept across reconnects.
    pub name: Option<String>,
    /// Comma-separated event type patterns (`order.*,user.created`); default every type.
    pub event_types: Option<String>,
    /// The application (id or uid) whose Events the session receives; default the
    /// project's own (no application).
    pub application: Option<String>,
}

fn check_name(raw: &str) -> ApiResult<()> {
    if railhook_common::names::is_plain_name(raw, 64) {
        Ok(())
    } else {
        Err(ApiError::validation(
            "name",
            "a session name is 1 to 64 letters, digits, '.', '_' or '-'",
        ))
    }
}

/// Opens a `railhook listen` session: a WebSocket (see the module's doc).
#[utoipa::path(get, path = "/v1/listen", tag = "listen", params(ListenQuery),
    responses((status = 101, description = "the session's WebSocket"),
              (status = 401, body = crate::problem::Problem),
              (status = 422, body = crate::problem::Problem,
               description = "a bad name or pattern, or not a WebSocket request")),
    security(("api_key" = [])))]
pub async fn open(
    project: Project,
    State(state): State<AppState>,
    Query(q): Query<ListenQuery>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    // A plain GET gets the API's problem, not the upgrade's own plain-text refusal.
    let ws = ws.map_err(|_| {
        ApiError::validation(
            "connection",
            "this route opens a WebSocket (railhook listen): send an Upgrade request",
        )
    })?;
    let name = q.name.unwrap_or_else(|| "default".to_owned());
    check_name(&name)?;
    let raw: Vec<String> = q
        .event_types
        .as_deref()
        .unwrap_or("*")
        .split(',')
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    let patterns = parse_patterns(&raw)?;
    let session = prepare(&state, &project, &name, q.application, &patterns).await?;
    // A session is a tenant's connection into the shared API process: no message it sends
    // may be larger than an answer needs (the relay keeps ANSWER_BYTES of a body; the
    // envelope around it is small). A larger one closes the connection.
    Ok(ws
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| run(state, socket, session))
        .into_response())
}

/// A session's endpoint, ready: where it is, its token and what to tell the CLI.
struct Prepared {
    endpoint_id: String,
    token: String,
    ready: Down,
}

/// Finds the session's endpoint (or makes it) and points it at this instance's relay with
/// the session's token; sets its subscription to `patterns`.
async fn prepare(
    state: &AppState,
    project: &Project,
    name: &str,
    application: Option<String>,
    patterns: &[String],
) -> ApiResult<Prepared> {
    let uid = format!("listen-{name}");
    let existing = sqlx::query!(
        r#"SELECT id, transport_secret FROM endpoints
           WHERE project_id = $1 AND uid = $2 AND transport = 'listen' AND deleted_at IS NULL
           ORDER BY created_at DESC LIMIT 1"#,
        project.id.as_str(),
        uid
    )
    .fetch_optional(&state.pool)
    .await?;
    let base = &state.listen_relay_base;
    let (endpoint_id, token) = match existing {
        Some(row) => {
            let id = row.id;
            // The token is kept while the session comes back to the same instance, so an
            // Attempt already on its way finds it.
            let kept = row
                .transport_secret
                .as_deref()
                .and_then(|sealed| state.keyring.open(&sealing_id(&id), sealed).ok())
                .and_then(|whole| serde_json::from_str::<TransportSettings>(&whole).ok())
                .and_then(|t| match t {
                    TransportSettings::Listen(l) => relay_token(base, &l.relay_url),
                    _ => None,
                });
            let token = match kept {
                Some(token) => token,
                None => {
                    let token = new_token();
                    repoint(state, &id, &token).await?;
                    token
                }
            };
            let mut tx = state.pool.begin().await?;
            subscriptions::set_only(&mut tx, project.id.as_str(), &id, patterns).await?;
            mark(&mut *tx, &id).await?;
            tx.commit().await?;
            state.senders.invalidate();
            (id, token)
        }
        None => {
            let token = new_token();
            let created = crate::endpoint::create(
                state,
                project,
                New {
                    fields: CreateEndpoint {
                        description: format!("railhook listen ({name})"),
                        uid: Some(uid),
                        application,
                        ..CreateEndpoint::default()
                    },
                    subscription: Some(patterns.to_vec()),
                    source_id: None,
                    own_target: Some(target(base, &token)),
                },
            )
            .await?;
            (created.endpoint.id, token)
        }
    };
    let secret = endpoint_secret::read(state, project, &endpoint_id, Kind::Webhook)
        .await?
        .0
        .key;
    Ok(Prepared {
        ready: Down::Ready {
            endpoint_id: endpoint_id.clone(),
            secret,
            event_types: patterns.to_vec(),
        },
        endpoint_id,
        token,
    })
}

fn new_token() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

fn target(base: &str, token: &str) -> TransportSettings {
    TransportSettings::Listen(ListenTarget {
        relay_url: format!("{base}/v1/listen/relay/{token}"),
    })
}

/// The token of `relay_url` if it points at this instance's relay.
fn relay_token(base: &str, relay_url: &str) -> Option<String> {
    relay_url
        .strip_prefix(base)?
        .strip_prefix("/v1/listen/relay/")
        .filter(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_alphanumeric()))
        .map(str::to_owned)
}

/// Points the endpoint at this instance's relay with a new token.
async fn repoint(state: &AppState, endpoint_id: &str, token: &str) -> ApiResult<()> {
    let settings = target(&state.listen_relay_base, token);
    let sealed =
        crate::routes::endpoint_target::seal_whole(state, &sealing_id(endpoint_id), &settings);
    sqlx::query!(
        r#"UPDATE endpoints SET transport_secret = $2, transport_settings = $3, updated_at = now()
           WHERE id = $1 AND transport = 'listen'"#,
        endpoint_id,
        sealed,
        settings.shown()
    )
    .execute(&state.pool)
    .await?;
    Ok(())
}

/// Marks the session's endpoint as in use (the idle sweep's clock).
async fn mark(db: impl sqlx::PgExecutor<'_>, endpoint_id: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE endpoints SET updated_at = now() WHERE id = $1 AND transport = 'listen'",
        endpoint_id
    )
    .execute(db)
    .await?;
    Ok(())
}

/// One session's connection: requests down, answers up, pings, until either side goes.
async fn run(state: AppState, socket: WebSocket, session: Prepared) {
    let (mut sink, mut stream) = socket.split();
    let (relay, mut relayed) = mpsc::channel::<Relayed>(64);
    let generation = state.listen.attach(&session.token, relay);
    state.metrics.listen_sessions.set(state.listen.len() as i64);
    let ready = serde_json::to_string(&session.ready).unwrap_or_default();
    let mut waiting: HashMap<u64, oneshot::Sender<LocalAnswer>> = HashMap::new();
    let mut next_id = 0_u64;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut ping = tokio::time::interval(Duration::from_secs(30));
    if sink.send(Message::Text(ready.into())).await.is_ok() {
        loop {
            tokio::select! {
                Some(r) = relayed.recv() => {
                    next_id += 1;
                    let frame = Down::Request {
                        id: next_id,
                        headers: r.headers,
                        body_base64: STANDARD.encode(&r.body),
                    };
                    let text = serde_json::to_string(&frame).unwrap_or_default();
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        let _ = r.answer.send(gone());
                        break;
                    }
                    waiting.insert(next_id, r.answer);
                }
                message = stream.next() => match message {
                    Some(Ok(Message::Text(text))) => {
                        if let Ok(Up::Response { id, answer }) = serde_json::from_str(&text)
                            && let Some(waiter) = waiting.remove(&id)
                        {
                            let _ = waiter.send(answer);
                        }
                    }
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
                _ = heartbeat.tick() => {
                    let _ = mark(&state.pool, &session.endpoint_id).await;
                }
                _ = ping.tick() => {
                    if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    state.listen.detach(&session.token, generation);
    state.metrics.listen_sessions.set(state.listen.len() as i64);
    for (_, waiter) in waiting {
        let _ = waiter.send(gone());
    }
    let _ = mark(&state.pool, &session.endpoint_id).await;
}

fn gone() -> LocalAnswer {
    LocalAnswer {
        status: None,
        body: String::new(),
        error: Some("the listen session closed before the local receiver answered".into()),
    }
}

/// Headers a relay does not pass on: the hop's own, and what the HTTP client sets again.
fn passed_on(name: &str) -> bool {
    !matches!(
        name,
        "host"
            | "content-length"
            | "connection"
            | "transfer-encoding"
            | "keep-alive"
            | "accept-encoding"
    )
}

/// One Attempt for a session's endpoint (the worker's request; the token is its
/// credential): down the session's connection, and the local receiver's answer back, with
/// the local status (any), `502` when the receiver did not answer, `504` after
/// [`ANSWER_WITHIN`], `503` when the session is not connected (so the Attempt fails and is
/// retried: a 4xx would end the Delivery). Workers' route, not the API's: it is left out of
/// the OpenAPI document.
pub async fn relay(
    State(state): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(session) = state.listen.relay_of(&token) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the listen session is not connected",
        )
            .into_response();
    };
    let headers = headers
        .iter()
        .filter(|(n, _)| passed_on(n.as_str()))
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let (answer, answered) = oneshot::channel();
    let sent = session.send(Relayed {
        headers,
        body,
        answer,
    });
    if sent.await.is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the listen session is not connected",
        )
            .into_response();
    }
    let local = tokio::time::timeout(ANSWER_WITHIN, answered).await;
    match local {
        Ok(Ok(LocalAnswer {
            status: Some(status),
            mut body,
            ..
        })) => {
            railhook_common::text::truncate_at_char(&mut body, ANSWER_BYTES);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, body).into_response()
        }
        Ok(Ok(LocalAnswer { error, .. })) => (
            StatusCode::BAD_GATEWAY,
            error.unwrap_or_else(|| "the local receiver did not answer".into()),
        )
            .into_response(),
        Ok(Err(_)) => (StatusCode::BAD_GATEWAY, gone().error.unwrap_or_default()).into_response(),
        Err(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            "the local receiver did not answer in time",
        )
            .into_response(),
    }
}

/// Deletes the session endpoints left without a connection for `idle` (with their
/// operational notices); returns how many.
pub async fn sweep(state: &AppState, idle: Duration) -> ApiResult<usize> {
    let seconds = i64::try_from(idle.as_secs()).unwrap_or(i64::MAX);
    let stale = sqlx::query!(
        r#"SELECT id, project_id FROM endpoints
           WHERE transport = 'listen' AND deleted_at IS NULL
             AND updated_at < now() - make_interval(secs => $1::bigint)
           LIMIT 100"#,
        seconds
    )
    .fetch_all(&state.pool)
    .await?;
    let mut deleted = 0;
    for row in stale {
        let mut tx = state.pool.begin().await?;
        if store::delete(&mut tx, &row.id, &row.project_id).await? {
            operational::emit(
                &mut *tx,
                &row.project_id,
                Notice::EndpointDeleted(EndpointRef {
                    endpoint_id: &row.id,
                }),
            )
            .await?;
            deleted += 1;
        }
        tx.commit().await?;
    }
    if deleted > 0 {
        state.senders.invalidate();
    }
    Ok(deleted)
}

/// Runs [`sweep`] every minute until the process ends.
pub async fn sweeper(state: AppState, idle: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        match sweep(&state, idle).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "idle listen sessions' endpoints deleted"),
            Err(e) => tracing::warn!(error = %e, "the listen sweep failed; next minute"),
        }
    }
}

/// The base URL workers reach this instance at (`RAILHOOK_LISTEN_RELAY_URL`, or the HTTP
/// address with an unspecified IP read as loopback).
pub fn relay_base(settings: &railhook_common::config::Settings) -> String {
    if let Some(url) = &settings.listen_relay_url {
        return url.trim_end_matches('/').to_owned();
    }
    let mut addr = settings.http_addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{addr}")
}

/// The listen routes. The relay route has no API-key check: its token is its credential.
pub fn router() -> utoipa_axum::router::OpenApiRouter<AppState> {
    use utoipa_axum::routes;
    utoipa_axum::router::OpenApiRouter::new()
        .routes(routes!(open))
        .route("/v1/listen/relay/{token}", axum::routing::post(relay))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_token_is_read_back_only_from_this_instances_relay() {
        let base = "http://127.0.0.1:8080";
        let token = "a".repeat(32);
        let url = format!("{base}/v1/listen/relay/{token}");
        assert_eq!(relay_token(base, &url), Some(token.clone()));
        assert_eq!(relay_token("http://10.0.0.2:8080", &url), None);
        assert_eq!(
            relay_token(base, &format!("{base}/v1/listen/relay/short")),
            None
        );
    }

    #[test]
    fn session_names_are_plain_keys() {
        assert!(check_name("laptop-1.dev_x").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn frames_read_as_the_cli_writes_them() {
        let up = r#"{"type":"response","id":7,"status":500,"body":"nope","error":null}"#;
        let Ok(Up::Response { id, answer }) = serde_json::from_str::<Up>(up) else {
            panic!("the response frame does not parse");
        };
        assert_eq!(
            (id, answer.status, answer.body.as_str()),
            (7, Some(500), "nope")
        );
    }
}
