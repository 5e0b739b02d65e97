//! The endpoint page's transformation card (docs/ROUTING.md): the program, whether it runs,
//! the worker's last result for it, and one form that saves it or tries it on an example
//! (two buttons, no JavaScript). A read-only session sees the program and its last result.

use maud::{Markup, html};
use serde_json::value::RawValue;

use super::endpoint_form::Fields;
use super::{PortalError, PortalResult, PortalSession, page};
use crate::dashboard::pages::when_opt;
use crate::problem::ApiError;
use crate::routes::transformations::{self, TransformationIn, TransformationResult};
use crate::state::AppState;
use crate::store::endpoints::EndpointRow;
use crate::store::event_types::EventTypeRow;

/// What a new program starts from: Svix's shape, unchanged.
const STARTER: &str = "function handler(webhook) {\n  // webhook: {method, url, eventType, payload, headers}; set webhook.cancel = true to skip\n  return webhook;\n}\n";

/// The last result the worker wrote, in words.
pub(crate) fn last_result(last: Option<&serde_json::Value>) -> String {
    let Some(last) = last else {
        return "not run yet".to_owned();
    };
    let word = |k: &str| last.get(k).and_then(serde_json::Value::as_str);
    let mut text = word("outcome").unwrap_or("unknown").to_owned();
    if let Some(at) = word("at") {
        text.push_str(&format!(" since {at}"));
    }
    if let Some(error) = word("error") {
        text.push_str(&format!(": {error}"));
    }
    text
}

pub(super) fn card(
    session: &PortalSession,
    base: &str,
    e: &EndpointRow,
    types: &[EventTypeRow],
    tried: Option<(&str, &TransformationResult)>,
) -> Markup {
    let code = tried
        .map(|(c, _)| c)
        .or(e.transformation_code.as_deref())
        .unwrap_or(STARTER);
    html! {
        h2 { "Transformation" }
        section.card #transformation {
            p.muted { "A JavaScript " code { "handler(webhook)" } " that reshapes what this endpoint receives "
                      "(body, path and query, method, extra headers) or skips a message. It runs for at most "
                      "100 ms with 32 MiB, without network, files or clock." }
            p { "State: " span #transformation-state {
                @if e.transformation_code.is_none() { "none" }
                @else if e.transformation_enabled { "on" } @else { "off" }
            }
                @if e.transformation_code.is_some() { " · changed " (when_opt(e.transformation_updated_at)) } }
            p { "Last result: " span #transformation-last { (last_result(e.transformation_last.as_ref())) } }
            @if let Some((_, r)) = tried { (result(r)) }
            @if session.read_only {
                @if let Some(c) = &e.transformation_code { pre #transformation-code { (c) } }
            } @else {
                form #transformation-form method="post" action={ (base) "/transformation" } {
                    input type="hidden" name="csrf" value=(session.csrf());
                    label { "Program (empty: no transformation)"
                        textarea #code name="code" rows="10" spellcheck="false" { (code) } }
                    label.check { input type="checkbox" name="enabled" value="1" checked[e.transformation_enabled || e.transformation_code.is_none()]; " run it for every message" }
                    label { "Example event type"
                        select name="event_type" {
                            @for t in types { option value=(t.name) { (t.name) } }
                            @if types.is_empty() { option value="example.event" { "example.event" } }
                        }
                    }
                    label { "Example payload (JSON; empty: the type's first example)"
                        textarea #example name="payload" rows="4" spellcheck="false" {} }
                    div.actions {
                        button #transformation-save type="submit" { "Save" }
                        button.secondary #transformation-test type="submit" formaction={ (base) "/transformation-test" } { "Try on the example" }
                    }
                }
            }
        }
    }
}

fn result(r: &TransformationResult) -> Markup {
    html! {
        div #transformation-result {
            p { "Tried on the example: " strong { (r.outcome) } " in " (format!("{:.1}", r.duration_ms)) " ms" }
            @if let Some(req) = &r.request {
                p { code { (req.method) " " (req.url) } }
                @for (k, v) in &req.headers { p { code { (k) ": " (v) } } }
                pre { (req.body) }
            }
            @if let Some(e) = &r.error { p.warning { code { (e.code) } " " (e.detail) } }
        }
    }
}

/// Saves the form's program (checked first; empty removes it) and switch.
pub(super) async fn save(
    state: &AppState,
    session: &PortalSession,
    e: &EndpointRow,
    f: &Fields,
) -> Result<(), PortalError> {
    if session.read_only {
        return Err(PortalError::ReadOnly);
    }
    let code = f.get("code").map(str::trim).filter(|c| !c.is_empty());
    let program = code.map(|c| TransformationIn {
        code: c.to_owned(),
        enabled: Some(f.get("enabled").is_some()),
    });
    let (code, enabled) = transformations::check_change(
        session.project.id.as_str(),
        "transformation",
        Some(program.as_ref()),
    )
    .await?;
    transformations::set(state, &session.project, &e.id, code, enabled).await?;
    session.log("endpoint.transformation", &e.id);
    Ok(())
}

/// Runs the form's program on its example and shows the result under the card; nothing is
/// saved or sent.
pub(super) async fn test(
    state: &AppState,
    session: &PortalSession,
    e: &EndpointRow,
    f: &Fields,
) -> PortalResult {
    let code = f.get("code").unwrap_or_default().to_owned();
    let event_type = f.get("event_type").unwrap_or("example.event").to_owned();
    let types =
        crate::store::event_types::list(&state.pool, session.project.id.as_str(), false, None, 500)
            .await?;
    let payload = match f.get("payload").map(str::trim).filter(|p| !p.is_empty()) {
        Some(p) => p.to_owned(),
        None => types
            .iter()
            .find(|t| t.name == event_type)
            .and_then(|t| {
                t.schema
                    .as_ref()?
                    .get("examples")?
                    .as_array()?
                    .first()
                    .cloned()
            })
            .map_or_else(|| "{}".to_owned(), |v| v.to_string()),
    };
    let payload = RawValue::from_string(payload)
        .map_err(|_| ApiError::validation("payload", "the example payload is not valid JSON"))?;
    let headers = e.opened_headers(&state.keyring);
    let r = transformations::try_program(
        session.project.id.as_str(),
        code.clone(),
        e.url.clone(),
        headers,
        event_type,
        payload,
    )
    .await?;
    let base = session.href(&format!("endpoints/{}", e.id));
    let body = html! {
        p { a href=(base) { "← back to the endpoint" } }
        (card(session, &base, e, &types, Some((&code, &r))))
    };
    Ok(page(
        session,
        "endpoints",
        "Try a transformation",
        None,
        body,
    ))
}
