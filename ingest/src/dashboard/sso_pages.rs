//! `/dashboard/sso` and its callback: single sign-on through the configured OpenID Connect
//! provider (crate::sso has the invariants). A refusal is a page that says why, with a
//! link to start again; nothing is written for it but the log line (and, when the person's
//! project is known, an audit row).

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use railhook_common::keygen::hash_api_key;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::{
    PageError, bare, cookie_value, dashboard_cookie, random_token, session_cookie, with_cookie,
};
use crate::audit::{Actor, Audited};
use crate::sso::Refusal;
use crate::state::AppState;
use crate::store::sessions;

/// The cookie that binds a sign-in's state to the browser that started it.
const SSO_COOKIE: &str = "railhook_sso";

#[derive(Deserialize)]
pub struct StartQuery {
    /// The project to open, when the person has a role in several.
    pub project: Option<String>,
}

fn refused(status: StatusCode, why: &str) -> Response {
    let page = bare(
        "Sign-in refused",
        html! {
            p.error #refused { (why) }
            p { a href="/dashboard/login" { "Back to sign-in" } }
        },
    );
    (status, Html(page)).into_response()
}

pub async fn start(
    State(state): State<AppState>,
    Query(q): Query<StartQuery>,
) -> Result<Response, PageError> {
    let Some(sso) = state.sso.clone() else {
        return Ok(refused(
            StatusCode::NOT_FOUND,
            "Single sign-on is not configured here.",
        ));
    };
    let started = match sso.start().await {
        Ok(s) => s,
        Err(e) => return Ok(refused(StatusCode::BAD_GATEWAY, &e.to_string())),
    };
    let project = q
        .project
        .as_deref()
        .filter(|p| railhook_common::names::is_plain_name(p, 64));
    sessions::sso_begin(
        &state.pool,
        &hash_api_key(&started.state),
        &started.nonce,
        &started.pkce_verifier,
        project,
    )
    .await?;
    let cookie = dashboard_cookie(
        &state,
        SSO_COOKIE,
        started.state,
        cookie::time::Duration::minutes(10),
    );
    Ok(with_cookie(Redirect::to(&started.url), &cookie))
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    pub code: Option<String>,
    pub state: Option<String>,
    /// The provider's own refusal (`access_denied`, …).
    pub error: Option<String>,
}

pub async fn callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, PageError> {
    let Some(sso) = state.sso.clone() else {
        return Ok(refused(
            StatusCode::NOT_FOUND,
            "Single sign-on is not configured here.",
        ));
    };
    if let Some(error) = q.error.as_deref() {
        let error: String = error.chars().take(64).collect();
        tracing::info!(error, "sso: the provider refused the sign-in");
        return Ok(refused(
            StatusCode::FORBIDDEN,
            &format!("The identity provider did not sign you in ({error})."),
        ));
    }
    let (Some(code), Some(given)) = (q.code.as_deref(), q.state.as_deref()) else {
        return Ok(refused(
            StatusCode::BAD_REQUEST,
            &Refusal::Replayed.to_string(),
        ));
    };
    let cookie_name = super::cookie_name(&state, SSO_COOKIE);
    let bound = cookie_value(&headers, &cookie_name).unwrap_or_default();
    let same: bool = bound.as_bytes().ct_eq(given.as_bytes()).into();
    // Taken (deleted) before anything else: whatever happens next, this state is spent.
    let login = sessions::sso_take(&state.pool, &hash_api_key(given)).await?;
    let (Some(login), true) = (login, same && !bound.is_empty()) else {
        tracing::info!("sso: refused a replayed, expired or foreign sign-in state");
        return Ok(refused(
            StatusCode::FORBIDDEN,
            &Refusal::Replayed.to_string(),
        ));
    };
    let person = match sso.finish(code, &login.nonce, &login.pkce_verifier).await {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(refusal = %e, "sso: sign-in refused");
            return Ok(refused(StatusCode::FORBIDDEN, &e.to_string()));
        }
    };
    let Some((project_id, role)) =
        sessions::project_for(&state.pool, &person.grants, login.project_id.as_deref()).await?
    else {
        return Ok(refused(
            StatusCode::FORBIDDEN,
            &Refusal::Unmapped(person.email.clone().unwrap_or(person.subject.clone())).to_string(),
        ));
    };
    let token = random_token();
    let csrf = random_token();
    let actor = Actor::Person {
        subject: person.subject.clone(),
        email: person.email.clone(),
    };
    let mut change = Audited::begin(&state.pool, &actor, &project_id).await?;
    sessions::open_person(
        change.conn(),
        &sessions::PersonSession {
            token_hash: &hash_api_key(&token),
            project_id: &project_id,
            csrf_token: &csrf,
            ttl_secs: state.dashboard.session_ttl.as_secs_f64(),
            subject: &person.subject,
            email: person.email.as_deref(),
            role: role.as_str(),
        },
    )
    .await?;
    change
        .commit(
            "dashboard_session",
            None,
            "sign_in",
            serde_json::json!({"role": role.as_str(), "via": "sso"}),
        )
        .await?;
    let session = session_cookie(&state, token);
    let spent = dashboard_cookie(
        &state,
        SSO_COOKIE,
        String::new(),
        cookie::time::Duration::ZERO,
    );
    let response = with_cookie(Redirect::to("/dashboard/deliveries"), &session);
    Ok(with_cookie(response, &spent))
}
