//! Incoming webhooks: other companies' webhooks arrive at `POST /in/{source_id}`, are
//! verified with the provider's own scheme ([`verify`]), deduplicated on the provider's own
//! id, and forwarded to the Source's Destinations through the same Delivery / Claim /
//! Attempt machinery as outgoing Events, on the shorter incoming ladder.
//!
//! Invariants kept in [`receive`]:
//! - **Nothing is stored before the signature verified.** A bad, missing or stale signature
//!   is a `401` problem+json and `railhook_incoming_rejected_total{provider,reason}`; the
//!   body is never parsed, logged or kept.
//! - **One Event per provider id** (duplicate window 2), for [`DEDUPLICATION_WINDOW_HOURS`]:
//!   the transaction first takes an advisory lock on (Source, provider id), then inserts the
//!   Event only if no Event of the window carries that id; a resend finds the row and is
//!   answered `200` with the first Event's id, creating nothing. Two concurrent resends queue
//!   on the lock: the second sees the first's committed Event and inserts nothing. (No unique
//!   index can do this: `events` is partitioned by day, and a unique index there must
//!   include the id.)
//! - **Event, Deliveries and Outbox rows commit together** (the same transaction shape as
//!   outgoing ingest), then `202`. The provider's own retries are its business: we answer
//!   fast and never make it wait on a Destination.
//! - **The body is forwarded byte for byte** (`events.raw_body`), with a fixed safe subset
//!   of the provider's headers; the Destination gets our Standard Webhooks signature, not
//!   the provider's.

pub mod routes;
mod store;
pub mod verify;

/// How long a provider's event id is remembered (72 h: Stripe resends for up to three
/// days). Retention is never shorter, so the partitions this looks into still exist.
pub use railhook_common::retention::DEDUPLICATION_WINDOW_HOURS;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use railhook_common::ids::SourceId;
use serde::Serialize;
use serde_json::Value;

use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;
use verify::Refusal;

/// A provider whose signing scheme Railhook knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Github,
    Stripe,
    Shopify,
    Standard,
    Generic,
}

impl Provider {
    pub const ALL: [Provider; 5] = [
        Provider::Github,
        Provider::Stripe,
        Provider::Shopify,
        Provider::Standard,
        Provider::Generic,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Github => "github",
            Provider::Stripe => "stripe",
            Provider::Shopify => "shopify",
            Provider::Standard => "standard",
            Provider::Generic => "generic",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Provider headers forwarded to Destinations (lowercase). Signature headers are not
    /// among them: a Destination verifies Railhook's signature, with its own secret.
    fn forwarded_headers(self) -> &'static [&'static str] {
        match self {
            Provider::Github => &[
                "x-github-event",
                "x-github-delivery",
                "x-github-hook-id",
                "x-github-hook-installation-target-id",
                "x-github-hook-installation-target-type",
            ],
            Provider::Shopify => &[
                "x-shopify-topic",
                "x-shopify-shop-domain",
                "x-shopify-webhook-id",
                "x-shopify-event-id",
                "x-shopify-api-version",
                "x-shopify-triggered-at",
            ],
            Provider::Stripe | Provider::Standard | Provider::Generic => &[],
        }
    }
}

/// Most characters kept of a provider's event id or event type.
const MAX_ID_CHARS: usize = 255;

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// An id or type name as Postgres' text can hold it: trimmed, bounded, without NUL (a body
/// field may carry `\u0000`, which no text column stores).
fn bounded(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty() && s.chars().count() <= MAX_ID_CHARS && !s.contains('\0')).then(|| s.to_owned())
}

/// Verifies the signature on the raw body, exactly as the provider documents it.
fn verify_signature(
    provider: Provider,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Refusal> {
    let now = chrono::Utc::now().timestamp();
    match provider {
        Provider::Github => verify::github(secret, header(headers, "x-hub-signature-256"), body),
        Provider::Stripe => verify::stripe(secret, header(headers, "stripe-signature"), body, now),
        Provider::Shopify => {
            verify::shopify(secret, header(headers, "x-shopify-hmac-sha256"), body)
        }
        Provider::Standard => verify::standard(
            secret,
            header(headers, "webhook-id"),
            header(headers, "webhook-timestamp"),
            header(headers, "webhook-signature"),
            body,
            now,
        ),
        Provider::Generic => verify::generic(secret, header(headers, "x-signature"), body),
    }
}

/// What a verified request is: the provider's own id (the dedupe key) and event type.
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    pub provider_event_id: Option<String>,
    pub event_type: String,
}

/// The provider's id and type, from where each provider puts them. Railhook's event type
/// is `{provider}.{the provider's own type}`.
pub fn identify(provider: Provider, headers: &HeaderMap, json: Option<&Value>) -> Identity {
    let from_body = |key: &str| json.and_then(|j| j.get(key)).and_then(Value::as_str);
    let (id, native) = match provider {
        Provider::Github => (
            header(headers, "x-github-delivery"),
            header(headers, "x-github-event"),
        ),
        Provider::Stripe => (from_body("id"), from_body("type")),
        Provider::Shopify => (
            header(headers, "x-shopify-webhook-id").or(header(headers, "x-shopify-event-id")),
            header(headers, "x-shopify-topic"),
        ),
        Provider::Standard => (header(headers, "webhook-id"), from_body("type")),
        Provider::Generic => (
            header(headers, "idempotency-key").or(header(headers, "x-request-id")),
            from_body("type"),
        ),
    };
    let native = native.and_then(bounded).unwrap_or_else(|| "webhook".into());
    Identity {
        provider_event_id: id.and_then(bounded),
        event_type: format!("{}.{native}", provider.as_str()),
    }
}

/// The answer to a provider.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Received {
    pub event_id: String,
    /// `false` when this was a resend of an Event already received (nothing was created).
    pub created: bool,
    pub deliveries: usize,
}

/// `POST /in/{source_id}`: verify, dedupe, store Event + Deliveries + Outbox in one
/// transaction, answer.
#[utoipa::path(post, path = "/in/{source_id}", tag = "incoming",
    params(("source_id" = String, Path)),
    request_body(content = String, description = "the provider's webhook, as the provider sent it"),
    responses((status = 202, body = Received, description = "stored; forwarding to the Destinations"),
              (status = 200, body = Received, description = "a resend: nothing created"),
              (status = 401, body = Problem), (status = 404, body = Problem),
              (status = 413, body = Problem)))]
pub async fn receive(
    State(state): State<AppState>,
    Path(source_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<Received>)> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!(
                "a webhook body may be at most {} bytes",
                state.limits.max_payload_bytes
            ))
        } else {
            ApiError::validation("body", "the request body could not be read")
        }
    })?;
    let source_id = SourceId::parse(&source_id).map_err(|_| ApiError::NotFound("source"))?;
    let source = store::find_source(&state.pool, &source_id)
        .await?
        .ok_or(ApiError::NotFound("source"))?;
    let provider = Provider::parse(&source.provider).ok_or(ApiError::NotFound("source"))?;
    let secret = state.keyring.open(source_id.as_str(), &source.secret)?;
    if let Err(refusal) = verify_signature(provider, &secret, &headers, &body) {
        state
            .metrics
            .incoming_rejected
            .with_label_values(&[provider.as_str(), refusal.as_str()])
            .inc();
        return Err(ApiError::InvalidSignature(match refusal {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Mismatch => "invalid",
            Refusal::Stale => "too old or too far in the future",
        }));
    }
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let identity = identify(provider, &headers, json.as_ref());
    let forward: serde_json::Map<String, Value> = provider
        .forwarded_headers()
        .iter()
        .chain(["content-type"].iter())
        .filter_map(|name| Some((name.to_string(), Value::from(header(&headers, name)?))))
        .collect();
    // The payload column is for search and the API: the JSON body when it is JSON that
    // jsonb can store, else the body as a string (lossy for non-UTF-8, a NUL shown as
    // U+FFFD). What is forwarded is `raw_body`, byte for byte. A provider's JSON holding
    // `\u0000` (or nesting or a number jsonb refuses) is accepted like any other body
    // (issue #53: it was a 500 on every resend, as /v1/events checks it and this did not).
    let storable =
        std::str::from_utf8(&body).is_ok_and(|text| crate::storable::check_storable(text).is_ok());
    let payload = match json {
        Some(value) if storable => value,
        _ => Value::from(String::from_utf8_lossy(&body).replace('\0', "\u{fffd}")),
    };

    let (traceparent, tracestate) = crate::extract::trace_of_request(&headers);
    let receipt = store::Receipt {
        source_id: &source_id,
        project_id: &source.project_id,
        identity: &identity,
        payload,
        body: &body,
        forward: Value::Object(forward),
        traceparent,
        tracestate,
    };
    let (event_id, delivery_ids) = match store::store_receipt(&state.pool, receipt).await? {
        store::Stored::Duplicate { first } => {
            state
                .metrics
                .incoming_received
                .with_label_values(&[provider.as_str(), "duplicate"])
                .inc();
            let received = Received {
                event_id: first,
                created: false,
                deliveries: 0,
            };
            return Ok((StatusCode::OK, Json(received)));
        }
        store::Stored::Created {
            event_id,
            delivery_ids,
        } => (event_id, delivery_ids),
    };
    state
        .metrics
        .incoming_received
        .with_label_values(&[provider.as_str(), "accepted"])
        .inc();
    state.metrics.events_created.inc();
    state
        .metrics
        .deliveries_created
        .inc_by(delivery_ids.len() as u64);
    Ok((
        StatusCode::ACCEPTED,
        Json(Received {
            event_id,
            created: true,
            deliveries: delivery_ids.len(),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn each_provider_names_its_id_and_type_where_it_documents_them() {
        let gh = identify(
            Provider::Github,
            &headers(&[
                ("x-github-delivery", "72d3162e"),
                ("x-github-event", "push"),
            ]),
            None,
        );
        assert_eq!(gh.provider_event_id.as_deref(), Some("72d3162e"));
        assert_eq!(gh.event_type, "github.push");
        let body = json!({"id": "evt_1", "type": "invoice.paid"});
        let st = identify(Provider::Stripe, &HeaderMap::new(), Some(&body));
        assert_eq!(st.provider_event_id.as_deref(), Some("evt_1"));
        assert_eq!(st.event_type, "stripe.invoice.paid");
        let sh = identify(
            Provider::Shopify,
            &headers(&[
                ("x-shopify-webhook-id", "b54557e4"),
                ("x-shopify-topic", "orders/create"),
            ]),
            None,
        );
        assert_eq!(sh.provider_event_id.as_deref(), Some("b54557e4"));
        assert_eq!(sh.event_type, "shopify.orders/create");
        let generic = identify(Provider::Generic, &HeaderMap::new(), None);
        assert_eq!(generic.provider_event_id, None);
        assert_eq!(generic.event_type, "generic.webhook");
        let long = "x".repeat(300);
        let too_long = identify(Provider::Standard, &headers(&[("webhook-id", &long)]), None);
        assert_eq!(too_long.provider_event_id, None);
    }
}
