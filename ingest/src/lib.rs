//! Railhook's REST API (SPEC §9): tenants, endpoints, subscriptions, and the Event ingest
//! transaction ([`ingest`]) where the delivery guarantee begins.
//!
//! Entry points: [`router`] builds the whole API for a state (tests mount it on port 0);
//! [`serve`] runs it on a listener until `shutdown` resolves.

pub mod accept;
pub mod auth;
pub mod dashboard;
pub mod extract;
pub mod group_commit;
pub mod incoming;
pub mod metrics;
pub mod openapi;
pub mod operational;
pub mod pagination;
pub mod problem;
pub mod quota;
pub mod replay;
pub mod routes;
pub mod schemas;
pub mod state;
pub mod store;

use std::future::Future;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use railhook_common::http_server;
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tracing::Instrument;

use crate::incoming::routes as sources;
use crate::problem::ApiError;
use crate::routes::{
    admin, deliveries, endpoint_secret, endpoint_state, endpoints, event_types, events, failed,
    health, operational_endpoints, replays, subscriptions,
};
pub use crate::state::AppState;

/// Room for the envelope (`{"type":…,"payload":…}`) around a payload at its size limit.
const ENVELOPE_BYTES: usize = 64 * 1024;
/// A request that takes longer than this is answered with 503 rather than held open.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[allow(
    clippy::too_many_lines,
    reason = "a declarative table: one line per route"
)]
pub fn router(state: AppState) -> Router {
    let single_limit = state.limits.max_payload_bytes + ENVELOPE_BYTES;
    let batch_limit = state.limits.max_batch_body_bytes();
    // Changes to keys, endpoints, subscriptions and event types: each successful one clears
    // the cache of senders (`store::subscriptions::SenderCache`), after it committed.
    let management = Router::new()
        .route(
            "/v1/api-keys/{id}",
            axum::routing::delete(admin::revoke_api_key),
        )
        .route(
            "/v1/endpoints",
            post(endpoints::create).get(endpoints::list),
        )
        .route(
            "/v1/endpoints/{id}",
            get(endpoints::get)
                .patch(endpoints::update)
                .delete(endpoints::delete),
        )
        .route("/v1/endpoints/{id}/secret", get(endpoint_secret::secret))
        .route(
            "/v1/endpoints/{id}/secret/rotate",
            post(endpoint_secret::rotate_secret),
        )
        .route("/v1/endpoints/{id}/health", get(endpoint_state::health))
        .route("/v1/endpoints/{id}/disable", post(endpoint_state::disable))
        .route("/v1/endpoints/{id}/enable", post(endpoint_state::enable))
        .route(
            "/v1/subscriptions",
            post(subscriptions::create).get(subscriptions::list),
        )
        .route(
            "/v1/subscriptions/{id}",
            get(subscriptions::get)
                .patch(subscriptions::update)
                .delete(subscriptions::delete),
        )
        // The catalogue's schemas travel with the sender, so its changes clear the cache too.
        .route(
            "/v1/event-types",
            post(event_types::create).get(event_types::list),
        )
        .route(
            "/v1/event-types/{name}",
            get(event_types::get)
                .patch(event_types::update)
                .delete(event_types::delete),
        )
        .route(
            "/v1/event-types/{name}/deprecate",
            post(event_types::deprecate),
        )
        .route(
            "/v1/operational-endpoints",
            post(operational_endpoints::create).get(operational_endpoints::list),
        )
        .route(
            "/v1/operational-endpoints/{id}",
            get(operational_endpoints::get)
                .patch(operational_endpoints::update)
                .delete(operational_endpoints::delete),
        )
        .route(
            "/v1/operational-endpoints/{id}/secret",
            get(operational_endpoints::secret),
        )
        .route(
            "/v1/operational-endpoints/{id}/secret/rotate",
            post(operational_endpoints::rotate_secret),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            forget_senders_after_writes,
        ));
    let api = Router::new()
        .route("/v1/organizations", post(admin::create_organization))
        .route("/v1/projects", post(admin::create_project))
        .route("/v1/projects/{id}/api-keys", post(admin::create_api_key))
        .merge(management)
        .route(
            "/v1/events",
            post(events::create)
                .get(events::list)
                .layer(DefaultBodyLimit::max(single_limit)),
        )
        .route(
            "/v1/events/batch",
            post(events::create_batch).layer(DefaultBodyLimit::max(batch_limit)),
        )
        .route("/v1/events/{id}", get(events::get))
        .route("/v1/events/{id}/payload", delete(events::expunge))
        .route("/v1/deliveries", get(deliveries::list))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/attempts", get(deliveries::attempts))
        .route("/v1/deliveries/{id}/retry", post(deliveries::retry))
        .route("/v1/failed-messages", get(failed::list))
        .route("/v1/failed-messages/retry", post(failed::retry))
        .route("/v1/replays", post(replays::create).get(replays::list))
        .route("/v1/replays/{id}", get(replays::get))
        .route("/v1/replays/{id}/cancel", post(replays::cancel))
        .route("/v1/sources", post(sources::create).get(sources::list))
        .route(
            "/v1/sources/{id}",
            get(sources::get).delete(sources::delete),
        )
        .route(
            "/v1/sources/{id}/destinations",
            post(sources::create_destination).get(sources::list_destinations),
        )
        .layer(DefaultBodyLimit::max(ENVELOPE_BYTES))
        // A provider's body is taken as it came (no JSON envelope), up to the payload limit.
        .route(
            "/in/{source_id}",
            post(incoming::receive).layer(DefaultBodyLimit::max(state.limits.max_payload_bytes)),
        );
    Router::new()
        .merge(api)
        .merge(dashboard::router())
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::serve))
        .fallback(|| async { ApiError::NotFound("route") })
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(middleware::from_fn(time_limit))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::Internal(problem::InternalError::Fault("handler panicked")).into_response()
        }))
        .with_state(state)
}

/// Ends a request that runs past [`REQUEST_TIMEOUT`] with a problem (`timeout`) that tells
/// the caller its outcome is unknown and how to retry it safely. Dropping the handler drops
/// a single Event still queued for a writer, which is then not written (group_commit.rs).
async fn time_limit(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::TimedOut.into_response(),
    }
}

/// Clears the sender cache after a successful write (the write has committed by then).
async fn forget_senders_after_writes(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let write = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let response = next.run(request).await;
    if write && response.status().is_success() {
        state.senders.invalidate();
    }
    response
}

const REQUEST_ID: &str = "x-request-id";

/// Counts and times every request by its route template (never by raw path: ids would make
/// label values unbounded).
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let method = request.method().as_str().to_owned();
    // A caller's X-Request-Id (if short and printable) or a new one; echoed back and carried
    // as a field of the request's span, so a support ticket can be matched to log lines.
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| ulid::Ulid::new().to_string(), str::to_owned);
    let span = tracing::info_span!("request", %method, %route, %request_id);
    // A caller's W3C `traceparent` makes this request a span of the caller's trace (what
    // Events store and pass on: routes/events.rs, `trace_of_request`).
    if let Some(parent) = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(railhook_common::trace_context::TraceParent::parse)
    {
        let state = request
            .headers()
            .get("tracestate")
            .and_then(|v| v.to_str().ok());
        railhook_common::trace_context::adopt(&span, &parent, state);
    }
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Ok(v) = axum::http::HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, v);
    }
    span.in_scope(|| {
        tracing::debug!(
            status = response.status().as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "answered"
        );
    });
    let status = format!("{}xx", response.status().as_u16() / 100);
    state
        .metrics
        .http_requests
        .with_label_values(&[route.as_str(), method.as_str(), status.as_str()])
        .inc();
    state
        .metrics
        .http_duration
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Serves the API until `shutdown` resolves, then drains in-flight requests. Each
/// connection has `HTTP_HEADER_TIMEOUT_SECONDS` to finish its headers (see
/// [`railhook_common::http_server`]); the body and the handler are then bounded by
/// [`REQUEST_TIMEOUT`].
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The Replay engine runs beside the API in every ingest process; dropping its task
    // mid-batch only rolls that batch back (see `replay`).
    let replays = tokio::spawn(replay::run(state.pool.clone()));
    let header_timeout = state.limits.header_read_timeout;
    let served = http_server::serve(listener, router(state), header_timeout, shutdown).await;
    replays.abort();
    served
}
