//! The endpoint form of the portal: how it is drawn (URL, description, event types ticked
//! from the catalogue with their descriptions and examples, channels, custom headers, rate
//! limit) and how a submitted one is read, checked before anything is written.

use std::collections::BTreeMap;

use axum::body::Bytes;
use maud::{Markup, html};

use super::{PortalError, PortalSession};
use crate::problem::ApiError;
use crate::store::endpoints::EndpointRow;
use crate::store::event_types::EventTypeRow;

/// A submitted form's fields, repeated names kept (the event-type checkboxes).
pub(super) struct Fields(Vec<(String, String)>);

impl Fields {
    pub(super) fn parse(body: &Bytes) -> Self {
        Fields(url::form_urlencoded::parse(body).into_owned().collect())
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| k == name && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }

    pub(super) fn csrf(&self) -> &str {
        self.get("csrf").unwrap_or_default()
    }
}

/// An endpoint as its edit form starts: the row, its event types (none: every type) and its
/// custom headers.
pub(super) struct Current<'a> {
    pub(super) row: &'a EndpointRow,
    pub(super) types: Option<&'a [String]>,
    pub(super) headers: &'a BTreeMap<String, String>,
}

/// The add and edit form: URL, description, event types from the catalogue, channels,
/// custom headers and the rate limit.
pub(super) fn endpoint_form(
    session: &PortalSession,
    action: &str,
    types: &[EventTypeRow],
    current: Option<&Current<'_>>,
) -> Markup {
    let chosen: Vec<String> = current
        .and_then(|c| c.types.map(<[String]>::to_vec))
        .unwrap_or_default();
    let url = current.map(|c| c.row.url.as_str());
    let description = current.map(|c| c.row.description.as_str());
    let channels = current
        .and_then(|c| c.row.channels.as_ref())
        .map(|c| c.join(", "));
    let rate = current.and_then(|c| c.row.rate_limit_per_second);
    let headers: String = current
        .map(|c| {
            c.headers
                .iter()
                .map(|(k, v)| format!("{k}: {v}\n"))
                .collect()
        })
        .unwrap_or_default();
    html! {
        form.card #endpoint-form method="post" action=(action) {
            input type="hidden" name="csrf" value=(session.csrf());
            label { "Endpoint URL" input #url type="url" name="url" required value=[url] placeholder="https://example.com/webhooks"; }
            label { "Description" input #description name="description" value=[description]; }
            fieldset #event-types {
                legend { "Event types (none ticked: every type)" }
                @for t in types {
                    label.check {
                        input type="checkbox" name="event_types" value=(t.name) checked[chosen.contains(&t.name)];
                        code { (t.name) }
                        @if !t.description.is_empty() { span.muted { " — " (t.description) } }
                    }
                    @if let Some(example) = first_example(t) {
                        details.example { summary { "example of " (t.name) } pre { (example) } }
                    }
                }
                @if types.is_empty() { span.muted { "The catalogue is empty: the endpoint receives every type." } }
            }
            label { "Channels (comma-separated; empty: every channel)" input #channels name="channels" value=[channels]; }
            label { "Custom headers (one “Name: value” per line)" textarea #headers name="headers" rows="3" { (headers) } }
            label { "Rate limit (requests per second; empty: unlimited)" input #rate type="number" min="1" name="rate_limit" value=[rate]; }
            button #save type="submit" { @if current.is_some() { "Save" } @else { "Add endpoint" } }
        }
    }
}

/// The first example of a type's schema, pretty-printed.
fn first_example(t: &EventTypeRow) -> Option<String> {
    let example = t.schema.as_ref()?.get("examples")?.as_array()?.first()?;
    serde_json::to_string_pretty(example).ok()
}

/// What the form says, in the Svix surface's words.
pub(super) struct Submitted {
    pub(super) url: String,
    pub(super) description: String,
    pub(super) types: Vec<String>,
    pub(super) channels: Option<Vec<String>>,
    pub(super) headers: BTreeMap<String, String>,
    pub(super) rate: Option<i32>,
}

pub(super) fn submitted(f: &Fields) -> Result<Submitted, PortalError> {
    let url = f
        .get("url")
        .ok_or_else(|| ApiError::validation("url", "the endpoint needs a URL"))?
        .to_owned();
    let channels: Vec<String> = f
        .get("channels")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect();
    let mut headers = BTreeMap::new();
    for line in f.get("headers").unwrap_or_default().lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| {
            ApiError::validation("headers", format!("'{line}' is not a “Name: value” line"))
        })?;
        headers.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    // Checked here, before anything is written: an edit stores its fields and its headers
    // in two steps, and a bad header must not leave the first one done.
    crate::routes::validate_headers(&headers)?;
    let rate = f
        .get("rate_limit")
        .map(|r| {
            r.parse::<i32>().ok().filter(|r| *r > 0).ok_or_else(|| {
                ApiError::validation("rate_limit", "the rate limit must be a positive number")
            })
        })
        .transpose()?;
    Ok(Submitted {
        url,
        description: f.get("description").unwrap_or_default().to_owned(),
        types: f.all("event_types"),
        channels: (!channels.is_empty()).then_some(channels),
        headers,
        rate,
    })
}
