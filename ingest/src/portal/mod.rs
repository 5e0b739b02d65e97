//! The customer portal at `/portal/`: the pages a team embeds in its own product so that each
//! of its customers (an application) manages its endpoints and sees its messages
//! (docs/PORTAL.md). Server-rendered HTML (maud), no JavaScript, no third-party assets.
//!
//! Access: the team's backend asks the API for a one-time link (`routes::portal`); opening it
//! (`/portal/access/{code}`) redeems the code once and opens a session. The session's token
//! travels in the URL path (`/portal/s/{token}/…`), not in a cookie: the portal lives in a
//! cross-site iframe, where third-party cookies are blocked or partitioned differently by
//! every browser. Every answer says `Referrer-Policy: no-referrer` and links nowhere else, so
//! the token does not leave; logs name the route template and the session's id, never the
//! token.
//!
//! Isolation: a session stands for one application of one project. Every page reads and
//! writes through the application-scoped functions of the Svix-compatible surface
//! (`svix::endpoints::find`, `svix::messages::find`, …) or stores filtered by the session's
//! application, so an id of another application answers 404 exactly like one that does not
//! exist (tests/it/portal.rs walks every route to prove it).
//!
//! Framing: `Content-Security-Policy: frame-ancestors` lists the project's allowed origins
//! (none: the portal cannot be framed). Forms carry the session's CSRF token; a read-only
//! session gets no forms and every POST is refused.

mod endpoint_form;
mod endpoint_pages;
mod message_pages;
mod transformation_card;
pub(crate) use transformation_card::last_result as last_transformation_result;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};
use railhook_common::ids::{OrganizationId, PortalSessionId, ProjectId};
use railhook_common::keygen::hash_api_key;
use railhook_common::vocabulary::{ColorScheme, Word};
use subtle::ConstantTimeEq;

use crate::auth::Project;
use crate::problem::ApiError;
use crate::state::AppState;
use crate::store::portal::{self as store, NewSession, Redeemed, SessionRow, Settings};

const CSS: &str = include_str!("portal.css");
/// Where session pages live: `/portal/s/{token}/…`.
const SESSION_PREFIX: &str = "/portal/s/";

pub fn router(state: &AppState) -> Router<AppState> {
    let pages = Router::new()
        .route("/portal/s/{token}/", get(home))
        .route("/portal/s/{token}/theme.css", get(theme))
        .route("/portal/s/{token}/logout", post(logout))
        .route(
            "/portal/s/{token}/endpoints",
            get(endpoint_pages::list).post(endpoint_pages::create),
        )
        .route(
            "/portal/s/{token}/endpoints/new",
            get(endpoint_pages::new_form),
        )
        .route(
            "/portal/s/{token}/endpoints/{id}",
            get(endpoint_pages::show).post(endpoint_pages::update),
        )
        .route(
            "/portal/s/{token}/endpoints/{id}/{action}",
            post(endpoint_pages::action),
        )
        .route("/portal/s/{token}/messages", get(message_pages::list))
        .route("/portal/s/{token}/messages/{id}", get(message_pages::show))
        .route(
            "/portal/s/{token}/messages/{id}/resend/{endpoint_id}",
            post(message_pages::resend),
        )
        .route(
            "/portal/s/{token}/event-types",
            get(message_pages::catalogue),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), with_session));
    Router::new()
        .route("/portal/access/{code}", get(redeem))
        .route("/portal/assets/portal.css", get(style))
        .merge(pages)
        .layer(middleware::from_fn(harden))
}

/// A customer's session, as every portal page gets it (put in the request by
/// [`with_session`]).
#[derive(Clone)]
pub struct PortalSession {
    /// `psess_…`: names the session in logs.
    pub id: String,
    pub project: Project,
    pub application_id: String,
    pub application_name: String,
    pub read_only: bool,
    csrf: String,
    /// `/portal/s/{token}`: every link and form starts with it.
    pub base: String,
    pub settings: Arc<Settings>,
}

impl PortalSession {
    /// `{base}/{rest}`.
    pub fn href(&self, rest: &str) -> String {
        format!("{}/{rest}", self.base)
    }

    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Refuses a change from a read-only session or a form without this session's CSRF
    /// token (compared in constant time).
    pub fn check(&self, given: &str) -> Result<(), PortalError> {
        if self.read_only {
            return Err(PortalError::ReadOnly);
        }
        let same: bool = self.csrf.as_bytes().ct_eq(given.as_bytes()).into();
        if same { Ok(()) } else { Err(PortalError::Csrf) }
    }

    /// Logs a change the customer made, with the application and the session (never the
    /// token).
    pub fn log(&self, action: &str, object: &str) {
        tracing::info!(
            application_id = %self.application_id,
            project_id = %self.project.id.as_str(),
            session_id = %self.id,
            action,
            object,
            "portal action"
        );
    }
}

fn session_of(row: SessionRow, base: String) -> PortalSession {
    PortalSession {
        id: row.id.clone(),
        project: Project {
            id: ProjectId::from_trusted(row.project_id),
            organization_id: OrganizationId::from_trusted(row.organization_id),
            monthly_quota: row.monthly_quota,
            // The portal keeps its own rules (one application, `read_only`); the role only
            // says the session is not limited further by crate::access.
            role: crate::access::Role::Admin,
            application: Some(row.application_id.clone()),
            actor: crate::audit::Actor::Portal {
                session: row.id.clone(),
            },
        },
        application_id: row.application_id,
        application_name: row.application_name,
        read_only: row.read_only,
        csrf: row.csrf_token,
        base,
        settings: Arc::new(row.settings),
    }
}

/// The token of a session path, if the path is one.
fn token_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(SESSION_PREFIX)?;
    let token = rest.split('/').next()?;
    (!token.is_empty() && token.len() <= 128).then_some(token)
}

/// Finds the session the path names and hands it to the page; answers the page's outcome
/// with the project's framing policy (also for its errors, so they show inside the frame).
async fn with_session(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(token) = token_of(request.uri().path()).map(str::to_owned) else {
        return ended(StatusCode::NOT_FOUND, None);
    };
    let row = match store::find_session(&state.pool, &hash_api_key(&token)).await {
        Ok(row) => row,
        Err(e) => return PortalError::Api(e.into()).into_response(),
    };
    let Some(row) = row else {
        return ended(StatusCode::UNAUTHORIZED, None);
    };
    if row.expired {
        let settings = row.settings.clone();
        return ended(StatusCode::UNAUTHORIZED, Some(&settings));
    }
    let session = session_of(row, format!("{SESSION_PREFIX}{token}"));
    request.extensions_mut().insert(session.clone());
    let mut response = next.run(request).await;
    if let Some(Failure(message)) = response.extensions_mut().remove::<Failure>() {
        let status = response.status();
        let body = html! { p.error #failure { (message) } p { a href=(session.href("endpoints")) { "Back to your endpoints" } } };
        response = (
            status,
            page(&session, "", "Something is not right", None, body),
        )
            .into_response();
    }
    frame_policy(&mut response, Some(&session.settings));
    response
}

/// The page for a session that is over (signed out, expired, or unknown).
fn ended(status: StatusCode, settings: Option<&Settings>) -> Response {
    let body = bare(
        "Session ended",
        html! {
            p #ended { "This session has ended. Open the portal again from the site you came from." }
        },
    );
    let mut response = (status, Html(body)).into_response();
    frame_policy(&mut response, settings);
    response
}

/// Headers on every portal answer: no scripts, no referrer, no caching, no sniffing.
/// `frame-ancestors` is set per project by [`frame_policy`]; an answer without it (the
/// stylesheet, a redirect) gets `'none'`.
async fn harden(request: Request, next: Next) -> Response {
    // As the dashboard's: a query holding a NUL is refused before any page reads it.
    let mut response = match crate::extract::refuse_nul(request.uri()) {
        Err(refused) => PortalError::Api(refused).into_response(),
        Ok(()) => next.run(request).await,
    };
    let h = response.headers_mut();
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(crate::dashboard::STRICT_CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    crate::dashboard::no_leaks(h);
    response
}

/// The Content-Security-Policy of a project's portal pages: its allowed origins may frame
/// them, its logo's origin may be shown, nothing else comes from anywhere but the portal.
pub(crate) fn content_security_policy(settings: Option<&Settings>) -> String {
    let origins = settings
        .map(|s| s.allowed_origins.join(" "))
        .filter(|o| !o.is_empty())
        .unwrap_or_else(|| "'none'".to_owned());
    let logo = settings
        .and_then(|s| s.logo_url.as_deref())
        .and_then(|u| url::Url::parse(u).ok())
        .map(|u| format!(" {}", u.origin().ascii_serialization()))
        .unwrap_or_default();
    format!(
        "default-src 'none'; style-src 'self'; img-src 'self'{logo}; form-action 'self'; \
         frame-ancestors {origins}; base-uri 'none'"
    )
}

fn frame_policy(response: &mut Response, settings: Option<&Settings>) {
    let csp = content_security_policy(settings);
    if let Ok(v) = HeaderValue::from_str(&csp) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, v);
    }
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

/// The project's theme as CSS variables over the portal's own stylesheet. Colours were
/// checked to be `#rrggbb` when stored, so they cannot break out of the declaration.
async fn theme(axum::Extension(session): axum::Extension<PortalSession>) -> Response {
    let s = &session.settings;
    let mut css = String::new();
    // Stored through the settings' check, so another word is never read; `auto` if it were.
    let scheme = ColorScheme::parse(&s.color_scheme).unwrap_or(ColorScheme::Auto);
    match scheme {
        ColorScheme::Dark => css.push_str(
            ":root { --fg: #e6e8ef; --muted: #9aa2b5; --line: #343a4a; --bg: #151821; \
             --card: #1d212c; --accent: #8ea6ff; --on-accent: #10131a; --ok: #5cc98a; \
             --warn: #e0a84a; --bad: #ff8a80; color-scheme: dark; }\n",
        ),
        ColorScheme::Light => css.push_str(
            ":root { --fg: #1d2330; --muted: #6b7385; --line: #dde1ea; --bg: #f6f7fb; \
             --card: #fff; --accent: #3451b2; --on-accent: #fff; --ok: #1f7a3f; \
             --warn: #a36300; --bad: #b3261e; color-scheme: light; }\n",
        ),
        ColorScheme::Auto => {}
    }
    let is_hex = |c: &&String| c.len() == 7 && c[1..].bytes().all(|b| b.is_ascii_hexdigit());
    if let Some(c) = s.primary_color.as_ref().filter(is_hex) {
        css.push_str(&format!(":root {{ --accent: {c}; }}\n"));
    }
    // A background is a light-scheme choice; a dark scheme keeps its own.
    if let Some(c) = s.background_color.as_ref().filter(is_hex) {
        match scheme {
            ColorScheme::Dark => {}
            ColorScheme::Light => css.push_str(&format!(":root {{ --bg: {c}; }}\n")),
            ColorScheme::Auto => css.push_str(&format!(
                "@media (prefers-color-scheme: light) {{ :root {{ --bg: {c}; }} }}\n"
            )),
        }
    }
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], css).into_response()
}

async fn home(axum::Extension(session): axum::Extension<PortalSession>) -> Redirect {
    Redirect::to(&session.href("endpoints"))
}

/// Opens a session from a one-time link and goes to the first page. A link opened twice is
/// refused with a page that says so (inside the frame, for the project's origins).
async fn redeem(State(state): State<AppState>, Path(code): Path<String>) -> Response {
    let token = format!("rhps_{}", crate::dashboard::random_token());
    let id = PortalSessionId::generate();
    let csrf = crate::dashboard::random_token();
    let session = NewSession {
        id: id.as_str(),
        token_hash: &hash_api_key(&token),
        csrf_token: &csrf,
    };
    let outcome = if crate::routes::is_plain_name(&code) {
        store::redeem(&state.pool, &hash_api_key(&code), &session).await
    } else {
        Ok(Redeemed::Invalid)
    };
    let refused = |status: StatusCode, message: &str, settings: Option<&Settings>| {
        let body = bare("Link not valid", html! { p.error #refused { (message) } });
        let mut response = (status, Html(body)).into_response();
        frame_policy(&mut response, settings);
        response
    };
    match outcome {
        Ok(Redeemed::Opened { project_id }) => {
            tracing::info!(session_id = %id.as_str(), "portal session opened");
            let settings = store::settings(&state.pool, &project_id).await.ok();
            let mut response =
                Redirect::to(&format!("{SESSION_PREFIX}{token}/endpoints")).into_response();
            frame_policy(&mut response, settings.as_ref());
            response
        }
        Ok(Redeemed::AlreadyUsed { project_id }) => {
            let settings = store::settings(&state.pool, &project_id).await.ok();
            refused(
                StatusCode::GONE,
                "This link was already used. A portal link works once; ask for a new one.",
                settings.as_ref(),
            )
        }
        Ok(Redeemed::Invalid) => refused(
            StatusCode::NOT_FOUND,
            "This link is not valid or has expired; ask for a new one.",
            None,
        ),
        Err(e) => PortalError::Api(e.into()).into_response(),
    }
}

#[derive(serde::Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

/// Ends the session (allowed to read-only sessions too: leaving changes nothing).
async fn logout(
    State(state): State<AppState>,
    axum::Extension(session): axum::Extension<PortalSession>,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Result<Response, PortalError> {
    let same: bool = session.csrf.as_bytes().ct_eq(form.csrf.as_bytes()).into();
    if !same {
        return Err(PortalError::Csrf);
    }
    let token = session
        .base
        .strip_prefix(SESSION_PREFIX)
        .unwrap_or_default();
    let project_id = session.project.id.as_str();
    let mut change =
        crate::audit::Audited::begin(&state.pool, &session.project.actor, project_id).await?;
    store::close(change.conn(), &hash_api_key(token)).await?;
    change
        .commit(
            "portal_session",
            Some(&session.application_id),
            "close",
            serde_json::json!({}),
        )
        .await?;
    session.log("logout", &session.id);
    let body = bare(
        "Signed out",
        html! { p #signed-out { "You are signed out of this portal." } },
    );
    Ok((StatusCode::OK, Html(body)).into_response())
}

/// Why a portal page could not do what was asked, shown as a page inside the portal.
pub enum PortalError {
    Api(ApiError),
    /// A change from a read-only session.
    ReadOnly,
    /// A form without this session's CSRF token.
    Csrf,
}

impl From<ApiError> for PortalError {
    fn from(e: ApiError) -> Self {
        PortalError::Api(e)
    }
}

impl From<sqlx::Error> for PortalError {
    fn from(e: sqlx::Error) -> Self {
        PortalError::Api(e.into())
    }
}

impl From<crate::svix::SvixError> for PortalError {
    fn from(e: crate::svix::SvixError) -> Self {
        PortalError::Api(e.0)
    }
}

/// The message a failed page shows, carried to [`with_session`], which lays it out.
#[derive(Clone)]
struct Failure(String);

impl IntoResponse for PortalError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            PortalError::ReadOnly => (
                StatusCode::FORBIDDEN,
                "This portal session is read-only.".to_owned(),
            ),
            PortalError::Csrf => (
                StatusCode::FORBIDDEN,
                "The form is stale or was not sent by this portal; reload the page.".to_owned(),
            ),
            PortalError::Api(e) => {
                let status = e.status_and_code().0;
                if let ApiError::Internal(_) = &e {
                    // The API's mapping logs the cause by kind; the page says nothing more.
                    let _ = e.into_response();
                    (status, "Something went wrong on our side.".to_owned())
                } else {
                    (status, e.to_string())
                }
            }
        };
        let mut response =
            (status, Html(bare("Error", html! { p.error { (message) } }))).into_response();
        response.extensions_mut().insert(Failure(message));
        response
    }
}

pub type PortalResult = Result<Response, PortalError>;

/// A page outside a session (a refused link, an ended session).
fn bare(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                link rel="stylesheet" href="/portal/assets/portal.css";
            }
            body { main { h1 { (title) } (body) } }
        }
    }
    .into_string()
}

/// A portal page: the project's name and logo, the application, the tabs, sign-out.
pub fn page(
    session: &PortalSession,
    active: &str,
    title: &str,
    refresh: Option<u32>,
    body: Markup,
) -> Response {
    let s = &session.settings;
    let nav = [
        ("endpoints", "Endpoints"),
        ("messages", "Messages"),
        ("event-types", "Event catalogue"),
    ];
    let brand = s.display_name.as_deref().unwrap_or("Webhooks");
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(secs) = refresh { meta http-equiv="refresh" content=(secs); }
                title { (title) " · " (brand) }
                link rel="stylesheet" href="/portal/assets/portal.css";
                link rel="stylesheet" href=(session.href("theme.css"));
            }
            body {
                header {
                    @if let Some(logo) = &s.logo_url { img src=(logo) alt=""; }
                    span.brand { (brand) }
                    span.app { (session.application_name) }
                    @if session.read_only { span.badge #read-only { "read-only" } }
                    nav {
                        @for (key, label) in nav {
                            a href=(session.href(key)) class=[(key == active).then_some("active")] { (label) }
                        }
                    }
                    form.inline method="post" action=(session.href("logout")) {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button.secondary type="submit" { "Sign out" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    Html(markup.into_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_session_paths_only() {
        assert_eq!(token_of("/portal/s/abc/endpoints"), Some("abc"));
        assert_eq!(token_of("/portal/s/abc/"), Some("abc"));
        assert_eq!(token_of("/portal/s//endpoints"), None);
        assert_eq!(token_of("/portal/access/abc"), None);
    }

    #[test]
    fn the_policy_frames_only_allowed_origins() {
        assert!(content_security_policy(None).contains("frame-ancestors 'none'"));
        let s = Settings {
            allowed_origins: vec!["https://a.example".into(), "https://b.example".into()],
            logo_url: Some("https://cdn.example/logo.png".into()),
            ..Settings::default()
        };
        let csp = content_security_policy(Some(&s));
        assert!(
            csp.contains("frame-ancestors https://a.example https://b.example;"),
            "{csp}"
        );
        assert!(csp.contains("img-src 'self' https://cdn.example;"), "{csp}");
        assert!(!csp.contains("script"), "{csp}");
    }
}
