//! The dashboard at `/dashboard/`: server-rendered HTML (maud), no JavaScript, no CDN.
//!
//! Sign-in takes a project API key once and opens a session: the browser keeps only a random
//! token in an `HttpOnly; SameSite=Strict` cookie scoped to `/dashboard`, and the database
//! keeps only the token's SHA-256 next to the key it was opened with. Every page reads the
//! project from the session, and every query is scoped to it exactly like the API's, so a
//! session can see nothing of another project. Revoking the key ends its sessions.
//!
//! Actions are HTML form POSTs. Each carries the session's CSRF token (checked in constant
//! time) on top of the SameSite cookie; a POST without it changes nothing. Every response
//! carries a strict Content-Security-Policy (no scripts at all) and `Cache-Control: no-store`.

mod applications_page;
mod audit_page;
mod catalogue_page;
mod endpoint_pages;
pub(crate) mod pages;
mod relay_page;
mod sso_pages;

use axum::Router;
use axum::extract::{Form, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cookie::{Cookie, SameSite};
use maud::{DOCTYPE, Markup, html};
use railhook_common::ids::{OrganizationId, ProjectId};
use railhook_common::keygen::hash_api_key;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::access::Role;
use crate::audit::Actor;
use crate::auth::Project;
use crate::problem::ApiError;
use crate::state::AppState;
use crate::store::sessions;

/// The session cookie's name. Served over HTTPS (`dashboard_cookie_secure`, the default) the
/// cookies carry the `__Host-` prefix (review #34 item 15): a browser then keeps them only
/// if they are `Secure`, have `Path=/` and name no `Domain`, so a sibling subdomain or a
/// plain-HTTP page on the same host cannot plant or overwrite one (cookie tossing). A plain
/// HTTP deployment (a local demo) cannot use the prefix, and keeps the bare names scoped to
/// `/dashboard`.
const COOKIE: &str = "railhook_session";
/// The sign-in form's CSRF token, before there is a session: the same random value in this
/// cookie and in the form (double submit). A cross-site form cannot read the cookie nor, as
/// the cookie is `SameSite=Strict`, send it, so it cannot sign a victim's browser into the
/// attacker's project (login CSRF).
const LOGIN_COOKIE: &str = "railhook_login";
const CSS: &str = include_str!("style.css");

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dashboard", get(|| async { Redirect::to("/dashboard/") }))
        .route(
            "/dashboard/",
            get(|| async { Redirect::to("/dashboard/deliveries") }),
        )
        .route("/dashboard/assets/style.css", get(style))
        .route("/dashboard/login", get(login_form).post(login))
        .route("/dashboard/sso", get(sso_pages::start))
        .route("/dashboard/sso/callback", get(sso_pages::callback))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/deliveries", get(pages::deliveries))
        .route("/dashboard/deliveries/{id}", get(pages::delivery))
        .route(
            "/dashboard/deliveries/{id}/retry",
            post(pages::retry_delivery),
        )
        .route("/dashboard/failed", get(pages::failed))
        .route("/dashboard/failed/retry", post(pages::retry_failed))
        .route(
            "/dashboard/replays",
            get(pages::replays).post(pages::start_replay),
        )
        .route("/dashboard/replays/{id}", get(pages::replay))
        .route("/dashboard/endpoints", get(endpoint_pages::endpoints))
        .route(
            "/dashboard/endpoints/{id}/{action}",
            post(endpoint_pages::endpoint_action),
        )
        .route(
            "/dashboard/applications",
            get(applications_page::applications),
        )
        .route(
            "/dashboard/applications/{id}/portal",
            post(applications_page::open_portal),
        )
        .route("/dashboard/relay", get(relay_page::relay))
        .route("/dashboard/event-types", get(catalogue_page::event_types))
        .route("/dashboard/audit-log", get(audit_page::audit_log))
        .layer(middleware::from_fn(harden))
}

/// The policy of a page that loads nothing but its own stylesheet and cannot be framed.
pub(crate) const STRICT_CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The headers every dashboard and portal answer carries besides its framing policy: no
/// sniffing, no referrer (a portal URL holds its session token), no caching.
pub(crate) fn no_leaks(h: &mut axum::http::HeaderMap) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Headers on every dashboard response: no scripts, no framing, no caching, no referrer.
async fn harden(request: Request, next: Next) -> Response {
    // The pages read their query with axum's `Query`, which lets a `%00` through to the
    // statements (the audit page's object filter answered 500): refused here for every page.
    let mut response = match crate::extract::refuse_nul(request.uri()) {
        Err(refused) => PageError(refused).into_response(),
        Ok(()) => next.run(request).await,
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(STRICT_CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    no_leaks(h);
    response
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

/// A signed-in dashboard user: the project, and the session's CSRF token for its forms.
pub struct Session {
    pub project: Project,
    pub csrf: String,
}

fn session_token(state: &AppState, headers: &axum::http::HeaderMap) -> Option<String> {
    cookie_value(headers, &cookie_name(state, COOKIE))
}

/// A cookie's name as this deployment sets it: `__Host-` prefixed when it is `Secure`.
fn cookie_name(state: &AppState, bare: &str) -> String {
    if state.dashboard.cookie_secure {
        format!("__Host-{bare}")
    } else {
        bare.to_owned()
    }
}

/// One of the dashboard's cookies: `HttpOnly`, `SameSite=Strict`, and either `__Host-`
/// prefixed with `Secure; Path=/`, or (plain HTTP) bare and scoped to `/dashboard`.
fn dashboard_cookie(
    state: &AppState,
    bare: &str,
    value: String,
    max_age: cookie::time::Duration,
) -> Cookie<'static> {
    let secure = state.dashboard.cookie_secure;
    Cookie::build((cookie_name(state, bare), value))
        .path(if secure { "/" } else { "/dashboard" })
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(max_age)
        .build()
}

/// The session cookie of a new sign-in (a key's or a person's), for the session's lifetime.
fn session_cookie(state: &AppState, token: String) -> Cookie<'static> {
    let ttl = state.dashboard.session_ttl;
    let max_age = cookie::time::Duration::seconds(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX));
    dashboard_cookie(state, COOKIE, token, max_age)
}

fn cookie_value(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_owned())
}

impl FromRequestParts<AppState> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let to_login = || Redirect::to("/dashboard/login").into_response();
        let token = session_token(state, &parts.headers).ok_or_else(to_login)?;
        let row = sessions::find(&state.pool, &hash_api_key(&token))
            .await
            .map_err(|e| PageError(e.into()).into_response())?
            .ok_or_else(to_login)?;
        let project = Project {
            id: ProjectId::from_trusted(row.project_id),
            organization_id: OrganizationId::from_trusted(row.organization_id),
            monthly_quota: row.monthly_quota,
            role: Role::parse(&row.role).ok_or_else(to_login)?,
            application: row.application_id,
            actor: match (row.key_id, row.prefix, row.subject) {
                (Some(id), Some(prefix), _) => Actor::DashboardKey { id, prefix },
                (_, _, Some(subject)) => Actor::Person {
                    subject,
                    email: row.email,
                },
                _ => return Err(to_login()),
            },
        };
        // The same gate as the API's (crate::access): a viewer sees the pages and cannot
        // post their forms.
        crate::auth::authorize(parts, state, &project)
            .await
            .map_err(|e| PageError(e).into_response())?;
        Ok(Session {
            project,
            csrf: row.csrf_token,
        })
    }
}

impl Session {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn check(&self, given: &str) -> Result<(), PageError> {
        let same: bool = self.csrf.as_bytes().ct_eq(given.as_bytes()).into();
        if same {
            Ok(())
        } else {
            Err(PageError(ApiError::validation(
                "csrf",
                "the form is stale or was not sent by this dashboard; reload the page",
            )))
        }
    }
}

/// An error shown as an HTML page with the same status and wording as the API's problem.
pub struct PageError(pub ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<sqlx::Error> for PageError {
    fn from(e: sqlx::Error) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        // The API's mapping decides the status (and logs an internal cause by kind only).
        let status = self.0.status_and_code().0;
        if let ApiError::Internal(_) = &self.0 {
            let _ = self.0.into_response();
            return (
                status,
                Html(bare(
                    "Error",
                    html! { p { "Something went wrong on our side." } },
                )),
            )
                .into_response();
        }
        let message = self.0.to_string();
        (
            status,
            Html(bare(
                "Error",
                html! { p.error { (message) } a href="/dashboard/" { "Back to the dashboard" } },
            )),
        )
            .into_response()
    }
}

pub type PageResult = Result<Response, PageError>;

fn bare(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Railhook" }
                link rel="stylesheet" href="/dashboard/assets/style.css";
            }
            body { main.narrow { h1 { "Railhook" } (body) } }
        }
    }
    .into_string()
}

/// The page frame: navigation, the sign-out form, and the content.
pub fn layout(session: &Session, active: &str, title: &str, body: Markup) -> Response {
    layout_with(session, active, title, None, body)
}

/// As [`layout`], refreshing itself every `refresh` seconds (a Replay in progress).
pub fn layout_with(
    session: &Session,
    active: &str,
    title: &str,
    refresh: Option<u32>,
    body: Markup,
) -> Response {
    let nav = [
        ("deliveries", "/dashboard/deliveries", "Deliveries"),
        ("failed", "/dashboard/failed", "Failed messages"),
        ("replays", "/dashboard/replays", "Time Machine"),
        ("endpoints", "/dashboard/endpoints", "Endpoints"),
        ("applications", "/dashboard/applications", "Applications"),
        ("event-types", "/dashboard/event-types", "Event types"),
        ("relay", "/dashboard/relay", "Relay"),
        ("audit-log", "/dashboard/audit-log", "Audit log"),
    ];
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(secs) = refresh { meta http-equiv="refresh" content=(secs); }
                title { (title) " · Railhook" }
                link rel="stylesheet" href="/dashboard/assets/style.css";
            }
            body {
                header {
                    span.brand { "Railhook" }
                    nav {
                        @for (key, href, label) in nav.iter().filter(|(_, href, _)| {
                            crate::access::check(session.project.role, &axum::http::Method::GET, href).is_ok()
                        }) {
                            a href=(href) class=[(*key == active).then_some("active")] { (label) }
                        }
                    }
                    span.project { "project " code { (session.project.id.as_str()) } " · " (session.project.role.as_str()) }
                    form method="post" action="/dashboard/logout" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button type="submit" { "Sign out" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    Html(page.into_string()).into_response()
}

#[derive(Deserialize)]
pub struct CsrfForm {
    pub csrf: String,
}

async fn login_form(State(state): State<AppState>) -> Response {
    login_response(&state, StatusCode::OK, None)
}

/// The sign-in page with a fresh login token, in the form and in its cookie.
fn login_response(state: &AppState, status: StatusCode, error: Option<&str>) -> Response {
    let token = random_token();
    let cookie = dashboard_cookie(
        state,
        LOGIN_COOKIE,
        token.clone(),
        cookie::time::Duration::hours(1),
    );
    let sso = state.sso.is_some();
    let keys = state.sso.as_ref().is_none_or(|s| s.key_sign_in);
    with_cookie(
        (status, Html(login_page(&token, error, sso, keys))),
        &cookie,
    )
}

fn login_page(login_token: &str, error: Option<&str>, sso: bool, keys: bool) -> String {
    bare(
        "Sign in",
        html! {
            @if let Some(e) = error { p.error { (e) } }
            @if sso {
                p { a #sso.button href="/dashboard/sso" { "Sign in with single sign-on" } }
            }
            @if keys {
                form.card method="post" action="/dashboard/login" {
                    input type="hidden" name="csrf" value=(login_token);
                    label for="api_key" { "Project API key" }
                    input id="api_key" type="password" name="api_key" autocomplete="off" required;
                    button type="submit" { "Sign in" }
                }
                p.muted { "The key is checked once; the browser then keeps only a session cookie." }
            }
        },
    )
}

#[derive(Deserialize)]
struct LoginForm {
    api_key: String,
    /// Missing from a forged form: the check below then refuses it like a wrong token.
    #[serde(default)]
    csrf: String,
}

async fn login(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Form(form): Form<LoginForm>,
) -> PageResult {
    let expected = cookie_value(&headers, &cookie_name(&state, LOGIN_COOKIE)).unwrap_or_default();
    let same: bool = expected.as_bytes().ct_eq(form.csrf.as_bytes()).into();
    if expected.is_empty() || !same {
        return Ok(login_response(
            &state,
            StatusCode::FORBIDDEN,
            Some("The sign-in form expired or did not come from this site; try again."),
        ));
    }
    if state.sso.as_ref().is_some_and(|s| !s.key_sign_in) {
        return Ok(login_response(
            &state,
            StatusCode::FORBIDDEN,
            Some("Signing in with an API key is turned off here: use single sign-on."),
        ));
    }
    let key = sessions::key(&state.pool, &hash_api_key(form.api_key.trim())).await?;
    let Some(key) = key else {
        // No project to write it to: a refused unknown key is only logged (without it).
        tracing::warn!("dashboard sign-in refused: unknown, revoked or expired key");
        return Ok(login_response(
            &state,
            StatusCode::UNAUTHORIZED,
            Some("That key is not valid (or was revoked, or has expired)."),
        ));
    };
    let actor = Actor::DashboardKey {
        id: key.id.clone(),
        prefix: key.prefix.clone(),
    };
    if key.role == Role::Sender.as_str() {
        let why = serde_json::json!({"reason": "a sender key cannot sign in"});
        crate::audit::Audited::begin(&state.pool, &actor, &key.project_id)
            .await?
            .commit("dashboard_session", None, "sign_in_refused", why)
            .await?;
        return Ok(login_response(
            &state,
            StatusCode::FORBIDDEN,
            Some("A send-only key cannot sign in: it can do nothing the dashboard shows."),
        ));
    }
    let (key_id, project_id) = (key.id, key.project_id);
    let token = random_token();
    let csrf = random_token();
    let ttl = state.dashboard.session_ttl;
    let token_hash = hash_api_key(&token);
    let ttl_secs = ttl.as_secs_f64();
    let mut change = crate::audit::Audited::begin(&state.pool, &actor, &project_id).await?;
    sessions::open(
        change.conn(),
        &token_hash,
        &key_id,
        &project_id,
        &csrf,
        ttl_secs,
    )
    .await?;
    change
        .commit(
            "dashboard_session",
            None,
            "sign_in",
            serde_json::json!({"role": key.role}),
        )
        .await?;
    let cookie = session_cookie(&state, token);
    Ok(with_cookie(Redirect::to("/dashboard/deliveries"), &cookie))
}

async fn logout(
    State(state): State<AppState>,
    session: Session,
    headers: axum::http::HeaderMap,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    session.check(&form.csrf)?;
    if let Some(token) = session_token(&state, &headers) {
        let project_id = session.project.id.as_str();
        let mut change =
            crate::audit::Audited::begin(&state.pool, &session.project.actor, project_id).await?;
        sessions::close(change.conn(), &hash_api_key(&token)).await?;
        change
            .commit("dashboard_session", None, "sign_out", serde_json::json!({}))
            .await?;
    }
    let cookie = dashboard_cookie(&state, COOKIE, String::new(), cookie::time::Duration::ZERO);
    Ok(with_cookie(Redirect::to("/dashboard/login"), &cookie))
}

fn with_cookie(response: impl IntoResponse, cookie: &Cookie<'_>) -> Response {
    let mut response = response.into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie.to_string()) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

pub(crate) fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}
