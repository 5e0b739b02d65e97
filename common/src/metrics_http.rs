//! `/metrics`, `/healthz` and `/readyz` for roles without the REST API, on
//! `RAILHOOK_METRICS_ADDR`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::{Json, Router};

use crate::health::Dependencies;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

/// Registers a collector and hands it back, for metrics structs built field by field.
/// Names are constants, so a failure here is a programming error caught by any test.
pub fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

/// The registries in Prometheus text format, one block per metric name: a name registered
/// in two registries (each role's Postgres pool gauges in `railhook all`) has its series
/// merged, since a page with the same family twice is refused by Prometheus.
pub fn render(registries: &[&Registry]) -> Vec<u8> {
    let mut families: Vec<prometheus::proto::MetricFamily> = Vec::new();
    for mut family in registries.iter().flat_map(|r| r.gather()) {
        match families.iter_mut().find(|f| f.name() == family.name()) {
            Some(seen) => {
                let more = std::mem::take(family.mut_metric());
                seen.mut_metric().extend(more);
            }
            None => families.push(family),
        }
    }
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut buf);
    buf
}

/// How long a scraper has to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// `/readyz`'s answer: 200 when every required dependency is up, else 503; the body names
/// each dependency and its last error either way.
pub fn readiness(deps: &Dependencies) -> axum::response::Response {
    let readiness = deps.readiness();
    let status = if readiness.status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        Json(readiness),
    )
        .into_response()
}

/// Serves the registries (and the dependencies' gauge) until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    mut registries: Vec<Registry>,
    deps: Dependencies,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    registries.push(deps.registry().clone());
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(move || async move { readiness(&deps) }))
        .route(
            "/metrics",
            get(move || {
                let registries = registries.clone();
                async move {
                    let refs: Vec<&Registry> = registries.iter().collect();
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        render(&refs),
                    )
                }
            }),
        );
    crate::http_server::serve(listener, app, HEADER_TIMEOUT, shutdown).await
}
