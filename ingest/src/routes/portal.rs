//! The customer portal's API (docs/PORTAL.md): access links for one application, ending its
//! sessions, and the project's portal settings (who may frame it, how it looks). The pages
//! themselves are `crate::portal`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use chrono::{DateTime, Utc};
use railhook_common::keygen::hash_api_key;
use railhook_common::transport::TransportKind;
use railhook_common::vocabulary::{ColorScheme, Word};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::access::Role;
use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::extract::ApiJson;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::applications::resolve as resolve_application;
use crate::state::AppState;
use crate::store::portal::{self as store, NewLink, Settings};

/// How long an unredeemed link works: long enough to hand it over, short enough that a
/// link in a log or a history is useless soon after.
pub const LINK_SECONDS: f64 = 600.0;
/// A session's default and longest life.
pub const DEFAULT_SESSION_SECONDS: i64 = 3600;
pub const MAX_SESSION_SECONDS: i64 = 7 * 24 * 3600;
const MAX_ORIGINS: usize = 20;
const MAX_DISPLAY_NAME: usize = 100;

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortalAccessIn {
    /// The session can look but not change anything (nor read the signing secret).
    #[serde(default)]
    pub read_only: bool,
    /// How long the session lasts once the link is opened, in seconds (60 to 604800;
    /// default 3600).
    pub expiry: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PortalAccess {
    /// Open it (for example as an iframe's `src`) to start the session; it works once.
    pub url: String,
    /// The link's code: `POST /api/v1/auth/logout` with it as the bearer ends the link and
    /// the session it opened.
    pub token: String,
    /// Until when the link can be opened.
    pub expires_at: DateTime<Utc>,
    /// How long the session it opens lasts.
    pub session_seconds: i64,
    pub read_only: bool,
}

/// The base browsers reach this API at: `public_url`, or the request's `Host`.
fn public_base(state: &AppState, headers: &HeaderMap) -> ApiResult<String> {
    if let Some(url) = &state.dashboard.public_url {
        return Ok(url.clone());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                })
        })
        .ok_or_else(|| {
            ApiError::validation(
                "host",
                "the request has no usable Host header; set RAILHOOK_PUBLIC_URL",
            )
        })?;
    // How the request reached Railhook: the API serves plain HTTP itself, so `https` only
    // when a proxy in front says so (`X-Forwarded-Proto`). Issue #53: the scheme had followed
    // the dashboard's cookie setting (secure by default), so a default install's link
    // pointed at an `https://` nobody serves. Set RAILHOOK_PUBLIC_URL to choose it outright.
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("https") => "https",
        _ => "http",
    };
    Ok(format!("{scheme}://{host}"))
}

/// Makes a one-time link to the portal of `application_id` (checked to be the project's).
pub(crate) async fn issue(
    state: &AppState,
    project: &Project,
    headers: &HeaderMap,
    application_id: &str,
    body: &PortalAccessIn,
) -> ApiResult<PortalAccess> {
    let session_seconds = body.expiry.unwrap_or(DEFAULT_SESSION_SECONDS);
    if !(60..=MAX_SESSION_SECONDS).contains(&session_seconds) {
        return Err(ApiError::validation(
            "expiry",
            format!("expiry must be between 60 and {MAX_SESSION_SECONDS} seconds"),
        ));
    }
    // The one rule of crate::access that depends on the body: an operator opens a
    // customer's portal only to look.
    if !body.read_only && project.role != Role::Admin {
        return Err(ApiError::Forbidden(format!(
            "this key's role `{}` may open a portal only read-only (read_only: true)",
            project.role.as_str()
        )));
    }
    let base = public_base(state, headers)?;
    let code = format!("rhpl_{}", crate::dashboard::random_token());
    let hash = hash_api_key(&code);
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let expires_at = store::create_link(
        change.conn(),
        &NewLink {
            code_hash: &hash,
            project_id: project.id.as_str(),
            application_id,
            read_only: body.read_only,
            session_seconds: i32::try_from(session_seconds).unwrap_or(i32::MAX),
            link_seconds: LINK_SECONDS,
        },
    )
    .await?;
    change
        .commit(
            "portal_link",
            Some(application_id),
            "create",
            serde_json::json!({"read_only": body.read_only, "session_seconds": session_seconds,
                               "expires_at": expires_at}),
        )
        .await?;
    tracing::info!(
        application_id,
        read_only = body.read_only,
        "portal access link issued"
    );
    Ok(PortalAccess {
        url: format!("{base}/portal/access/{code}"),
        token: code,
        expires_at,
        session_seconds,
        read_only: body.read_only,
    })
}

/// Makes a one-time link to an application's customer portal (valid ten minutes, opens one session).
#[utoipa::path(post, path = "/v1/applications/{id}/portal-access", tag = "portal",
    params(("id" = String, Path, description = "the application's id or uid")),
    request_body = PortalAccessIn,
    responses((status = 201, body = PortalAccess), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn portal_access(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<PortalAccess>)> {
    let app = resolve_application(&state, project.id.as_str(), &id).await?;
    // The body is optional: none reads as every default.
    let body: PortalAccessIn = crate::extract::optional_json(&body)
        .map_err(|e| ApiError::validation("body", e.to_string()))?;
    let access = issue(&state, &project, &headers, &app.id, &body).await?;
    Ok((StatusCode::CREATED, Json(access)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionsExpired {
    /// How many live sessions ended.
    pub sessions_ended: u64,
}

/// Ends every portal session of the application and makes its unused links unusable.
#[utoipa::path(post, path = "/v1/applications/{id}/portal-sessions/expire", tag = "portal",
    params(("id" = String, Path, description = "the application's id or uid")),
    responses((status = 200, body = SessionsExpired), (status = 404, body = Problem)),
    security(("api_key" = [])))]
pub async fn expire_sessions(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionsExpired>> {
    let app = resolve_application(&state, project.id.as_str(), &id).await?;
    let ended = expire_all(&state, &project, &app.id).await?;
    tracing::info!(application_id = %app.id, ended, "portal sessions expired");
    Ok(Json(SessionsExpired {
        sessions_ended: ended,
    }))
}

/// Ends the application's portal sessions and unused links, with the audit row.
pub(crate) async fn expire_all(
    state: &AppState,
    project: &Project,
    application_id: &str,
) -> ApiResult<u64> {
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let ended = store::expire_all(change.conn(), project.id.as_str(), application_id).await?;
    change
        .commit(
            "portal_sessions",
            Some(application_id),
            "expire_all",
            serde_json::json!({"sessions_ended": ended}),
        )
        .await?;
    Ok(ended)
}

/// The project's portal settings.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortalSettings {
    /// Origins allowed to frame the portal (`https://app.example.com`), answered as CSP
    /// `frame-ancestors`; none: the portal cannot be framed at all.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    #[serde(default)]
    pub theme: Theme,
    /// The kinds (`kafka`, `sqs`, `rabbitmq`, `nats`, `poller`) a customer may add in the
    /// portal beside HTTP endpoints; none by default (docs/DESTINATIONS.md, POLLING.md).
    #[serde(default)]
    pub endpoint_types: Vec<TransportKind>,
    #[serde(default, skip_deserializing)]
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Theme {
    /// Shown at the top of every page (default: "Webhooks").
    pub display_name: Option<String>,
    /// An absolute http(s) URL of your logo; its origin is the one image source the portal's
    /// CSP allows besides itself.
    pub logo_url: Option<String>,
    /// `#rrggbb`: links, buttons, the active tab.
    pub primary_color: Option<String>,
    /// `#rrggbb`: the page's background (light scheme).
    pub background_color: Option<String>,
    /// `light`, `dark`, or `auto` (the customer's own preference; the default).
    pub color_scheme: Option<String>,
}

fn check_color(field: &'static str, v: Option<&String>) -> ApiResult<Option<String>> {
    match v {
        None => Ok(None),
        Some(c)
            if c.len() == 7
                && c.starts_with('#')
                && c[1..].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            Ok(Some(c.to_ascii_lowercase()))
        }
        Some(_) => Err(ApiError::validation(
            field,
            format!("{field} must be a colour like #3451b2"),
        )),
    }
}

/// An origin as CSP and browsers write it: `scheme://host[:port]`, nothing else.
pub(crate) fn check_origin(raw: &str) -> ApiResult<String> {
    let bad = || {
        ApiError::validation(
            "allowed_origins",
            format!("'{raw}' is not an origin like https://app.example.com (no path, no wildcard)"),
        )
    };
    let url = url::Url::parse(raw).map_err(|_| bad())?;
    let plain = matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some_and(|h| !h.contains('*'))
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && !raw.trim_end_matches('/').ends_with(':');
    if !plain {
        return Err(bad());
    }
    Ok(url.origin().ascii_serialization())
}

fn check_settings(given: &PortalSettings) -> ApiResult<Settings> {
    if given.allowed_origins.len() > MAX_ORIGINS {
        return Err(ApiError::validation(
            "allowed_origins",
            format!("at most {MAX_ORIGINS} origins"),
        ));
    }
    let mut origins = given
        .allowed_origins
        .iter()
        .map(|o| check_origin(o))
        .collect::<ApiResult<Vec<_>>>()?;
    origins.sort();
    origins.dedup();
    let t = &given.theme;
    let display_name = match t.display_name.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(n) if n.chars().count() <= MAX_DISPLAY_NAME => Some(n.to_owned()),
        Some(_) => {
            return Err(ApiError::validation(
                "theme.display_name",
                format!("display_name must be at most {MAX_DISPLAY_NAME} characters"),
            ));
        }
    };
    let logo_url = match t.logo_url.as_deref() {
        None | Some("") => None,
        Some(raw) => Some(crate::routes::validate_url(raw).map_err(|_| {
            ApiError::validation("theme.logo_url", "logo_url must be an absolute http(s) URL")
        })?),
    };
    if given.endpoint_types.contains(&TransportKind::Listen) {
        return Err(ApiError::validation(
            "endpoint_types",
            "listen endpoints are made by `railhook listen` sessions, not offered in the portal",
        ));
    }
    let color_scheme = match t.color_scheme.as_deref() {
        None => ColorScheme::Auto,
        Some(raw) => ColorScheme::parse(raw).ok_or_else(|| {
            ApiError::validation(
                "theme.color_scheme",
                "color_scheme must be light, dark or auto",
            )
        })?,
    }
    .as_str();
    Ok(Settings {
        allowed_origins: origins,
        display_name,
        logo_url,
        primary_color: check_color("theme.primary_color", t.primary_color.as_ref())?,
        background_color: check_color("theme.background_color", t.background_color.as_ref())?,
        color_scheme: color_scheme.to_owned(),
        updated_at: None,
        endpoint_types: offered_types(&given.endpoint_types),
    })
}

/// The broker kinds offered, each once, in a fixed order (HTTP is always offered).
fn offered_types(given: &[TransportKind]) -> Vec<String> {
    TransportKind::ALL
        .iter()
        .filter(|k| **k != TransportKind::Http && given.contains(k))
        .map(|k| k.as_str().to_owned())
        .collect()
}

fn view(s: Settings) -> PortalSettings {
    PortalSettings {
        allowed_origins: s.allowed_origins,
        theme: Theme {
            display_name: s.display_name,
            logo_url: s.logo_url,
            primary_color: s.primary_color,
            background_color: s.background_color,
            color_scheme: Some(s.color_scheme),
        },
        endpoint_types: s
            .endpoint_types
            .iter()
            .filter_map(|k| TransportKind::parse(k))
            .collect(),
        updated_at: s.updated_at,
    }
}

/// Returns the portal's settings: the origins that may frame it, its theme, the endpoint kinds offered.
#[utoipa::path(get, path = "/v1/portal/settings", tag = "portal",
    responses((status = 200, body = PortalSettings)), security(("api_key" = [])))]
pub async fn get_settings(
    project: Project,
    State(state): State<AppState>,
) -> ApiResult<Json<PortalSettings>> {
    Ok(Json(view(
        store::settings(&state.pool, project.id.as_str()).await?,
    )))
}

/// Replaces the portal settings; they apply to every open session at its next page.
#[utoipa::path(put, path = "/v1/portal/settings", tag = "portal",
    request_body = PortalSettings,
    responses((status = 200, body = PortalSettings), (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn put_settings(
    project: Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<PortalSettings>,
) -> ApiResult<Json<PortalSettings>> {
    let mut settings = check_settings(&body)?;
    let mut change = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let before = view(store::settings(change.conn(), project.id.as_str()).await?);
    settings.updated_at =
        Some(store::put_settings(change.conn(), project.id.as_str(), &settings).await?);
    let after = view(settings);
    change
        .commit(
            "portal_settings",
            None,
            "update",
            audit::diff(&audit::view(&before), &audit::view(&after)),
        )
        .await?;
    Ok(Json(after))
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(portal_access))
        .routes(routes!(expire_sessions))
        .routes(routes!(get_settings, put_settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_plain() {
        assert_eq!(
            check_origin("https://App.Example.com").ok().as_deref(),
            Some("https://app.example.com")
        );
        assert_eq!(
            check_origin("http://127.0.0.1:8080/").ok().as_deref(),
            Some("http://127.0.0.1:8080")
        );
        for bad in [
            "app.example.com",
            "https://app.example.com/path",
            "https://*.example.com",
            "https://a.com?x=1",
            "https://u:p@a.com",
            "javascript:alert(1)",
            "https://a.com; script-src *",
            "'self'",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn colours_are_hex() {
        let c = |s: &str| check_color("c", Some(&s.to_owned()));
        assert_eq!(c("#ABCDEF").ok().flatten().as_deref(), Some("#abcdef"));
        for bad in ["red", "#abc", "#abcdefg", "#ab;de}", "#abcdeg"] {
            assert!(c(bad).is_err(), "{bad}");
        }
    }
}
