//! `/metrics`, `/healthz` for roles without the REST API, on `RAILHOOK_METRICS_ADDR`.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::http::header;
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

/// Serves the registries until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    registries: Vec<Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || {
                let registries = registries.clone();
                async move {
                    let families: Vec<_> = registries.iter().flat_map(Registry::gather).collect();
                    let mut buf = Vec::new();
                    let _ = TextEncoder::new().encode(&families, &mut buf);
                    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], buf)
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
