//! The endpoint form of the portal: how it is drawn (URL, description, event types ticked
//! from the catalogue with their descriptions and examples, channels, custom headers, rate
//! limit) and how a submitted one is read, checked before anything is written.

use std::collections::BTreeMap;

use axum::body::Bytes;
use maud::{Markup, html};
use railhook_common::transport::TransportKind;
use railhook_common::vocabulary::Word;

use super::{PortalError, PortalSession};
use crate::endpoint::{Change, CreateEndpoint, UpdateEndpoint};
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
    // Broker kinds are offered when adding, as the project allows (editing keeps the kind).
    let offered: Vec<TransportKind> = if current.is_none() && !session.read_only {
        session
            .settings
            .endpoint_types
            .iter()
            .filter_map(|k| TransportKind::parse(k))
            .filter(|k| *k != TransportKind::Http)
            .collect()
    } else {
        Vec::new()
    };
    let description = current.map(|c| c.row.description.as_str());
    let channels = current
        .and_then(|c| c.row.channels.as_ref())
        .map(|c| c.join(", "));
    let rate = current.and_then(|c| c.row.rate_limit_per_second);
    let filter = current.and_then(|c| c.row.filter.as_deref());
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
            @if offered.is_empty() {
                label { "Endpoint URL" input #url type="url" name="url" required value=[url] placeholder="https://example.com/webhooks"; }
            } @else {
                fieldset #endpoint-type {
                    legend { "Where to deliver" }
                    label.check { input type="radio" name="type" value="http" checked; " an HTTPS endpoint (URL below)" }
                    @for kind in &offered {
                        label.check { input type="radio" name="type" value=(kind); " " (kind_label(*kind)) " (settings below)" }
                    }
                }
                label { "Endpoint URL (HTTP)" input #url type="url" name="url" value=[url] placeholder="https://example.com/webhooks"; }
                @for kind in &offered { (broker_fields(*kind)) }
            }
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
            label { "Payload filter (a SQL/JSON path predicate, e.g. " code { "$.amount_cents > 10000" } "; empty: every message)"
                input #filter name="filter" maxlength="1024" value=[filter]; }
            button #save type="submit" { @if current.is_some() { "Save" } @else { "Add endpoint" } }
        }
    }
}

/// Every kind has its own arm in this function and the two below (issue #55): a new kind
/// does not compile until the portal can draw and read it.
fn kind_label(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Http => "an HTTPS endpoint",
        TransportKind::Kafka => "a Kafka topic",
        TransportKind::Sqs => "an Amazon SQS queue",
        TransportKind::Rabbitmq => "a RabbitMQ exchange",
        TransportKind::Nats => "a NATS JetStream subject",
        TransportKind::Poller => "a polling endpoint (your service reads its messages)",
        TransportKind::Listen => "a railhook listen session",
    }
}

/// A broker kind's settings, named `kind.field` (docs/DESTINATIONS.md). Secrets are
/// write-only inputs: never drawn with a value.
fn broker_fields(kind: TransportKind) -> Markup {
    let fields: &[(&str, &str, &str)] = match kind {
        // The URL field above the kinds is HTTP's.
        TransportKind::Http => &[],
        TransportKind::Kafka => &[
            ("brokers", "Brokers (host:port, comma-separated)", "text"),
            ("topic", "Topic", "text"),
            (
                "key",
                "Record key: endpoint, event_id, application or /json/pointer",
                "text",
            ),
        ],
        TransportKind::Sqs => &[
            ("queue_url", "Queue URL", "url"),
            ("region", "Region", "text"),
            ("access_key_id", "Access key id", "text"),
            ("secret_access_key", "Secret access key", "password"),
        ],
        TransportKind::Rabbitmq => &[
            ("url", "URL (amqps://user:password@host/vhost)", "password"),
            ("exchange", "Exchange (empty: the default exchange)", "text"),
            ("routing_key", "Routing key", "text"),
        ],
        TransportKind::Nats => &[
            ("url", "URL (tls://user:password@host:4222)", "password"),
            (
                "subject",
                "Subject (a JetStream stream must capture it)",
                "text",
            ),
        ],
        // Nothing to set: the endpoint's page shows where to poll and issues the token.
        TransportKind::Poller => &[],
        // Never offered (the portal settings refuse it); made by sessions only.
        TransportKind::Listen => &[],
    };
    html! {
        fieldset id={ "settings-" (kind) } {
            legend { (kind_label(kind)) }
            @for (name, label, input_type) in fields {
                label { (label) input name={ (kind) "." (name) } type=(input_type) autocomplete="off"; }
            }
        }
    }
}

/// The broker settings a submitted add form carries for `kind`, in the API's shape.
pub(super) fn broker_settings(f: &Fields, kind: TransportKind) -> serde_json::Value {
    let get = |name: &str| f.get(&format!("{kind}.{name}")).map(str::to_owned);
    match kind {
        // An HTTP endpoint's settings are its URL, read with the form's other fields.
        TransportKind::Http => serde_json::json!({}),
        TransportKind::Kafka => serde_json::json!({
            "brokers": get("brokers").unwrap_or_default().split(',')
                .map(str::trim).filter(|b| !b.is_empty()).collect::<Vec<_>>(),
            "topic": get("topic").unwrap_or_default(),
            "key": get("key").unwrap_or_else(|| "endpoint".to_owned()),
        }),
        TransportKind::Sqs => serde_json::json!({
            "queue_url": get("queue_url").unwrap_or_default(),
            "region": get("region").unwrap_or_default(),
            "access_key_id": get("access_key_id").unwrap_or_default(),
            "secret_access_key": get("secret_access_key"),
        }),
        TransportKind::Rabbitmq => serde_json::json!({
            "url": get("url").unwrap_or_default(),
            "exchange": get("exchange").unwrap_or_default(),
            "routing_key": get("routing_key").unwrap_or_default(),
        }),
        TransportKind::Nats => serde_json::json!({
            "url": get("url").unwrap_or_default(),
            "subject": get("subject").unwrap_or_default(),
            "jetstream": true,
        }),
        TransportKind::Poller | TransportKind::Listen => serde_json::json!({}),
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
    pub(super) filter: Option<String>,
}

impl Submitted {
    /// The edit form as one change: its fields, the headers and the event types (`*` when
    /// none is ticked). Every field of both shapes is named, so a field added to either is a
    /// compile error here until it is placed.
    pub(super) fn into_change(self) -> Result<Change, PortalError> {
        let Submitted {
            url,
            description,
            types,
            channels,
            headers,
            rate,
            filter,
        } = self;
        let fields = UpdateEndpoint {
            url: Some(url),
            kafka: None,
            sqs: None,
            rabbitmq: None,
            nats: None,
            authentication: None,
            client_certificate: None,
            description: Some(description),
            enabled: None,
            timeout_ms: None,
            rate_limit_per_second: Some(rate),
            rate_limit_burst: None,
            max_concurrency: None,
            headers: Some(headers),
            retry_delays_seconds: None,
            max_attempts: None,
            channels: Some(channels),
            uid: None,
            metadata: None,
            filter: Some(filter),
            transformation: None,
        };
        Ok(Change {
            fields,
            subscription: Some(crate::svix::endpoints::patterns(Some(&types))?),
        })
    }

    /// The add form of a broker kind as the native create (its settings are placed by the
    /// caller, which parses them by kind), and the event types ticked.
    pub(super) fn into_broker_create(
        self,
        transport: TransportKind,
    ) -> (CreateEndpoint, Vec<String>) {
        let Submitted {
            url: _,
            description,
            types,
            channels,
            headers,
            rate,
            filter,
        } = self;
        let create = CreateEndpoint {
            transport: Some(transport),
            url: String::new(),
            kafka: None,
            sqs: None,
            rabbitmq: None,
            nats: None,
            authentication: None,
            client_certificate: None,
            description,
            enabled: None,
            timeout_ms: None,
            rate_limit_per_second: rate,
            rate_limit_burst: None,
            max_concurrency: None,
            headers,
            retry_delays_seconds: None,
            max_attempts: None,
            signing: None,
            secret: None,
            application: None,
            channels,
            uid: None,
            metadata: BTreeMap::new(),
            filter,
            transformation: None,
        };
        (create, types)
    }
}

pub(super) fn submitted(f: &Fields) -> Result<Submitted, PortalError> {
    let broker = f.get("type").is_some_and(|t| t != "http");
    let url = match f.get("url") {
        Some(url) => url.to_owned(),
        None if broker => String::new(),
        None => return Err(ApiError::validation("url", "the endpoint needs a URL").into()),
    };
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
    // Checked here too, so a bad line is named as the form's (crate::endpoint checks again
    // before its one transaction).
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
        filter: f
            .get("filter")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    })
}
