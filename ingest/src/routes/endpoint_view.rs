//! The API's view of an endpoint (`GET /v1/endpoints/{id}` and every answer that returns
//! one): the row with its secrets left out, the signing scheme and public key read from the
//! sealed secret, the custom headers opened, a broker endpoint's settings under its kind's
//! name.

use railhook_common::vocabulary::Word;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use railhook_common::retry::RetryDelays;
use railhook_common::sealing::Keyring;
use railhook_common::signing::SigningKey;
use railhook_common::transport::TransportKind;
use serde::Serialize;

use super::endpoints::EndpointRow;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Endpoint {
    pub id: String,
    /// What carries its Attempts: `http` (to `url`), `kafka`, `sqs`, `rabbitmq` or `nats`
    /// (docs/DESTINATIONS.md).
    #[serde(rename = "type")]
    pub transport: TransportKind,
    /// For `http`, where Attempts are POSTed; for a broker, its target as a URL-shaped
    /// name (`kafka://host:port/topic`), never with a credential.
    pub url: String,
    /// The broker's settings, credentials left out, under its kind's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sqs: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rabbitmq: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats: Option<serde_json::Value>,
    /// HTTP authentication beyond the signature (`{"type": "basic", "username"}`); its
    /// secret is never returned.
    pub authentication: Option<serde_json::Value>,
    /// The client certificate presented for mutual TLS (`{"certificate_pem"}`); its key is
    /// never returned.
    pub client_certificate: Option<serde_json::Value>,
    pub description: String,
    pub enabled: bool,
    /// Why the endpoint was disabled, when it was disabled by Railhook (e.g. after a `410`).
    pub disabled_reason: Option<String>,
    pub timeout_ms: i32,
    /// Requests per second across all workers (a token bucket); absent: unlimited.
    pub rate_limit_per_second: Option<i32>,
    /// Requests the bucket lets through at once; absent: one second's worth.
    pub rate_limit_burst: Option<i32>,
    /// Requests in flight at once across all workers; absent: unlimited.
    pub max_concurrency: Option<i32>,
    pub headers: BTreeMap<String, String>,
    /// This endpoint's own retry waits in seconds; absent: the default ladder.
    pub retry_delays_seconds: Option<Vec<f64>>,
    /// This endpoint's own number of Attempts; absent: the default (7 outgoing).
    pub max_attempts: Option<i32>,
    /// Set when this endpoint is a Destination of an incoming-webhook Source.
    pub source_id: Option<String>,
    /// `hmac-sha256` (Standard Webhooks v1) or `ed25519` (v1a).
    pub signing: &'static str,
    /// For `ed25519`: `whpk_…`, the public key receivers verify v1a signatures with.
    pub public_key: Option<String>,
    /// The application it belongs to (for life); absent: a project endpoint, which receives
    /// the Events sent without an application.
    pub application_id: Option<String>,
    /// It receives only Events sent on one of these channels; absent: every channel.
    pub channels: Option<Vec<String>>,
    pub uid: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// The payload filter, in the canonical form Postgres prints it (docs/ROUTING.md).
    pub filter: Option<String>,
    pub transformation: Option<super::transformations::Transformation>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl EndpointRow {
    /// The custom headers, opened. A value this process cannot open shows as empty (the
    /// worker defers such a Delivery and says why, as for the signing secret).
    pub(crate) fn opened_headers(&self, keyring: &Keyring) -> BTreeMap<String, String> {
        keyring
            .open_headers(&self.id, &self.headers)
            .ok()
            .and_then(|h| serde_json::from_value(h).ok())
            .unwrap_or_default()
    }

    /// The API's view. The scheme and the public key are read from the secret itself,
    /// opened with `keyring` (a secret it cannot open shows as HMAC without a public key;
    /// reading the secret itself fails loudly instead).
    pub(crate) fn view(self, keyring: &Keyring) -> Endpoint {
        let r = self;
        let key = keyring
            .open(&r.id, &r.secret)
            .ok()
            .and_then(|s| SigningKey::parse(&s).ok());
        let headers = r.opened_headers(keyring);
        let transport = TransportKind::parse(&r.transport).unwrap_or(TransportKind::Http);
        let shown = |kind: TransportKind| {
            (transport == kind)
                .then(|| r.transport_settings.clone())
                .flatten()
        };
        Endpoint {
            transformation: super::transformations::Transformation::of(&r),
            filter: r.filter.clone(),
            authentication: r.authentication.clone(),
            client_certificate: r.client_certificate.clone(),
            kafka: shown(TransportKind::Kafka),
            sqs: shown(TransportKind::Sqs),
            rabbitmq: shown(TransportKind::Rabbitmq),
            nats: shown(TransportKind::Nats),
            transport,
            signing: key.as_ref().map_or("hmac-sha256", SigningKey::scheme),
            public_key: key.as_ref().and_then(SigningKey::public_key),
            id: r.id,
            url: r.url,
            description: r.description,
            enabled: r.enabled,
            disabled_reason: r.disabled_reason,
            timeout_ms: r.timeout_ms,
            rate_limit_per_second: r.rate_limit_per_second,
            rate_limit_burst: r.rate_limit_burst,
            max_concurrency: r.max_concurrency,
            headers,
            retry_delays_seconds: r
                .retry_delays
                .and_then(|d| RetryDelays::parse(&d).ok())
                .map(|d| d.seconds()),
            max_attempts: r.max_attempts,
            source_id: r.source_id,
            application_id: r.application_id,
            channels: r.channels.filter(|c| !c.is_empty()),
            uid: r.uid,
            metadata: serde_json::from_value(r.metadata).unwrap_or_default(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}
