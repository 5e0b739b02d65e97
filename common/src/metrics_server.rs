//! `/metrics`, `/healthz` and `/readyz` for roles without the REST API, on
//! `RAILHOOK_METRICS_ADDR` (the `http` feature: the relay's own crate has no HTTP server;
//! the `railhook` binary serves every role's).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::health::Dependencies;
use crate::metrics_http::render;
use prometheus::Registry;

/// How long a scraper has to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// `/readyz`'s answer: 200 when every required dependency is up, else 503; the body names
/// each dependency and its last error either way, and the role where the process has one.
///
/// A relay standing by is ready: it is healthy and will take the Slot within a second of the
/// active one leaving, so rollouts and disruption budgets must count it. `?role=active`
/// asks the stricter question (503 on a standby), for a check or Service that must find
/// the one relay streaming.
pub fn readiness(deps: &Dependencies, wanted_role: Option<&str>) -> axum::response::Response {
    let readiness = deps.readiness();
    let role_ok = wanted_role.is_none_or(|w| readiness.role == Some(w));
    let status = if readiness.status == "ready" && role_ok {
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

/// The query of `/readyz`.
#[derive(serde::Deserialize)]
pub struct ReadyQuery {
    pub role: Option<String>,
}

/// Who may read `/metrics`: anyone (`None`), or a scraper sending
/// `Authorization: Bearer <RAILHOOK_METRICS_TOKEN>`. Series carry no ids or payloads, but
/// volumes and endpoint health are still a tenant's business on a public API port.
#[derive(Clone, Default)]
pub struct MetricsAccess {
    pub token: Option<secrecy::SecretString>,
}

impl MetricsAccess {
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        Self {
            token: settings.metrics_token.clone(),
        }
    }

    fn allows(&self, headers: &axum::http::HeaderMap) -> bool {
        use secrecy::ExposeSecret;
        use subtle::ConstantTimeEq;
        let Some(token) = &self.token else {
            return true;
        };
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| {
                token
                    .expose_secret()
                    .as_bytes()
                    .ct_eq(given.as_bytes())
                    .into()
            })
    }

    /// The `/metrics` answer: the page, or 401 without the token.
    pub fn respond(
        &self,
        headers: &axum::http::HeaderMap,
        registries: &[&Registry],
    ) -> axum::response::Response {
        if !self.allows(headers) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "metrics need the bearer token (RAILHOOK_METRICS_TOKEN)\n",
            )
                .into_response();
        }
        (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(registries),
        )
            .into_response()
    }
}

/// Serves the registries (and the dependencies' gauge) until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    mut registries: Vec<Registry>,
    deps: Dependencies,
    access: MetricsAccess,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    registries.push(deps.registry().clone());
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move |q: axum::extract::Query<ReadyQuery>| async move {
                readiness(&deps, q.role.as_deref())
            }),
        )
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let registries = registries.clone();
                let access = access.clone();
                async move {
                    let refs: Vec<&Registry> = registries.iter().collect();
                    access.respond(&headers, &refs)
                }
            }),
        );
    crate::http_server::serve(listener, app, HEADER_TIMEOUT, shutdown).await
}
