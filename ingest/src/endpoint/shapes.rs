//! The endpoint's shapes: what a create and a change carry (the native API's JSON, and what
//! every other front door translates into, crate::endpoint) and the view every answer
//! returns: the row with its secrets left out, the signing scheme and public key read from
//! the sealed secret, the custom headers opened, a broker endpoint's settings under its
//! kind's name. A field the API shows is added here, in the store's row
//! (`store::endpoints`) and where crate::endpoint checks and binds it; the Svix surface and
//! the portal then fail to compile until they place it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use railhook_common::endpoint_auth::{Authentication, ClientCertificate};
use railhook_common::retry::RetryDelays;
use railhook_common::sealing::Keyring;
use railhook_common::signing::SigningKey;
use railhook_common::transport::{
    KafkaTarget, NatsTarget, RabbitmqTarget, SqsTarget, TransportKind,
};
use railhook_common::vocabulary::Word;
use serde::{Deserialize, Serialize};

use crate::routes::double_option;
use crate::routes::transformations::TransformationIn;
use crate::store::endpoints::EndpointRow;

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// `http` (default), `kafka`, `sqs`, `rabbitmq` or `nats`; a broker kind takes its
    /// settings in the object of its name, and no `url` (docs/DESTINATIONS.md).
    #[serde(rename = "type")]
    pub transport: Option<TransportKind>,
    /// Where Attempts are POSTed: required for `http`, refused for the other kinds.
    #[serde(default)]
    pub url: String,
    pub kafka: Option<KafkaTarget>,
    pub sqs: Option<SqsTarget>,
    pub rabbitmq: Option<RabbitmqTarget>,
    pub nats: Option<NatsTarget>,
    /// HTTP authentication beyond the signature: `{"type": "basic", "username",
    /// "password"}` or `{"type": "oauth2_client_credentials", "token_url", "client_id",
    /// "client_secret", "scope", "audience"}` (docs/RECEIVERS.md); secrets are write-only.
    pub authentication: Option<Authentication>,
    /// A client certificate for receivers that require mutual TLS: `{"certificate_pem",
    /// "private_key_pem"}`; the key is write-only.
    pub client_certificate: Option<ClientCertificate>,
    #[serde(default)]
    pub description: String,
    pub enabled: Option<bool>,
    /// Per-Attempt timeout, 1000–300000 ms; default 30000.
    pub timeout_ms: Option<i32>,
    pub rate_limit_per_second: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub max_concurrency: Option<i32>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Overrides the retry waits (seconds), e.g. `[30, 120, 600]`.
    pub retry_delays_seconds: Option<Vec<f64>>,
    /// Overrides the number of Attempts (1–50).
    pub max_attempts: Option<i32>,
    /// `hmac-sha256` (default: Standard Webhooks v1) or `ed25519` (v1a: receivers verify
    /// with the public key alone).
    pub signing: Option<String>,
    /// Your own HMAC secret (`whsec_` + base64 of 24–64 bytes), e.g. a receiver's secret kept
    /// while moving from another service; absent: Railhook generates one.
    pub secret: Option<String>,
    /// The application (id or uid) this endpoint belongs to, for life; absent: a project
    /// endpoint.
    pub application: Option<String>,
    /// Receive only Events sent on one of these channels (1–10); absent: every channel.
    pub channels: Option<Vec<String>>,
    /// Your own name for it (1–256 of `[A-Za-z0-9_.-]`), unique in its application.
    pub uid: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// A SQL/JSON path predicate on the Event's payload, e.g. `$.amount_cents > 10000 &&
    /// $.currency == "EUR"` (at most 1024 characters): the endpoint receives only the Events
    /// it holds for (docs/ROUTING.md).
    pub filter: Option<String>,
    /// A program that reshapes what this endpoint receives, or skips it (docs/ROUTING.md).
    pub transformation: Option<TransformationIn>,
}

/// A new endpoint and its signing secret (also readable later via `/secret`).
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedEndpoint {
    #[serde(flatten)]
    pub endpoint: Endpoint,
    pub secret: String,
}

/// Fields to change; absent fields stay as they are, `null` clears an optional limit.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    /// An HTTP endpoint's new URL (a broker endpoint's own URL-shaped name may be sent back
    /// unchanged).
    pub url: Option<String>,
    /// A broker endpoint's new settings, whole, for its own kind (the type does not change).
    /// A credential left out is kept: `sasl_password`, `secret_access_key`, or the password
    /// of a URL whose user is unchanged.
    pub kafka: Option<KafkaTarget>,
    pub sqs: Option<SqsTarget>,
    pub rabbitmq: Option<RabbitmqTarget>,
    pub nats: Option<NatsTarget>,
    /// Replaces the endpoint's authentication (a password left out under the same username
    /// is kept); `null` removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Authentication>)]
    pub authentication: Option<Option<Authentication>>,
    /// Replaces the client certificate (the key left out with the same certificate is
    /// kept); `null` removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<ClientCertificate>)]
    pub client_certificate: Option<Option<ClientCertificate>>,
    pub description: Option<String>,
    /// `true` re-enables an endpoint and clears its `disabled_reason`.
    pub enabled: Option<bool>,
    pub timeout_ms: Option<i32>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>)]
    pub rate_limit_per_second: Option<Option<i32>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>)]
    pub rate_limit_burst: Option<Option<i32>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>)]
    pub max_concurrency: Option<Option<i32>>,
    pub headers: Option<BTreeMap<String, String>>,
    /// `null` returns to the default ladder.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<f64>>)]
    pub retry_delays_seconds: Option<Option<Vec<f64>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>)]
    pub max_attempts: Option<Option<i32>>,
    /// `null` or `[]`: every channel again.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub channels: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// `null` removes the payload filter.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
    /// `null` removes the transformation.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<TransformationIn>)]
    pub transformation: Option<Option<TransformationIn>>,
}

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
