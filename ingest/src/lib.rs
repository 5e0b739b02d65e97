//! Railhook's REST API (SPEC §9): tenants, endpoints, subscriptions, and the Event ingest
//! transaction ([`accept`]) where the delivery guarantee begins.
//!
//! Entry points: [`router`] builds the whole API for a state (tests mount it on port 0);
//! [`serve`] runs it on a listener until `shutdown` resolves.

pub mod accept;
pub mod access;
pub mod audit;
pub mod auth;
pub mod dashboard;
pub mod endpoint;
pub mod extract;
pub mod group_commit;
pub mod incoming;
pub mod listen;
pub mod metrics;
pub mod openapi;
pub mod operational;
pub mod pagination;
pub mod plan;
pub mod portal;
pub mod problem;
pub mod quota;
pub mod replay;
pub mod routes;
pub mod schemas;
pub mod sso;
pub mod state;
pub mod storable;
pub mod store;
pub mod svix;

use std::future::Future;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use railhook_common::http_server;
use std::sync::Arc;
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::incoming::routes as sources;
use crate::problem::ApiError;
use crate::routes::{
    admin, applications, deliveries, endpoints, event_types, events, failed, health,
    operational_endpoints, portal as portal_api, replays, subscriptions,
};
pub use crate::state::AppState;

/// Room for the envelope (`{"type":…,"payload":…}`) around a payload at its size limit.
const ENVELOPE_BYTES: usize = 64 * 1024;
/// A request that takes longer than this is answered with 503 rather than held open.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The whole API for `state`: each resource's routes (with their OpenAPI operations, see
/// `routes`), the dashboard, the health and metrics routes and `/openapi.json`, built from
/// the same routers that serve.
pub fn router(state: AppState) -> Router {
    let single_limit = state.limits.max_payload_bytes + ENVELOPE_BYTES;
    let batch_limit = state.limits.max_batch_body_bytes();
    let (api, document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(admin::router())
        .merge(routes::access::router(&state))
        .merge(applications::router(&state))
        .merge(endpoints::router(&state))
        .merge(subscriptions::router(&state))
        .merge(event_types::router(&state))
        .merge(operational_endpoints::router(&state))
        .merge(events::router(single_limit, batch_limit))
        .merge(deliveries::router())
        .merge(failed::router())
        .merge(replays::router())
        .merge(portal_api::router())
        .merge(sources::router())
        .merge(svix::router(&state))
        .merge(listen::router())
        .layer(DefaultBodyLimit::max(ENVELOPE_BYTES))
        // A provider's body is taken as it came (no JSON envelope), up to the payload limit.
        .merge(
            OpenApiRouter::new()
                .routes(routes!(incoming::receive))
                .layer(DefaultBodyLimit::max(state.limits.max_payload_bytes)),
        )
        .split_for_parts();
    let document = Arc::new(openapi::finish(document));
    Router::new()
        .merge(api)
        .merge(dashboard::router())
        .merge(portal::router(&state))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route(
            "/openapi.json",
            get(move || openapi::serve(document.clone())),
        )
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
