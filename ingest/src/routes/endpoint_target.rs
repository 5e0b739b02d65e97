//! What an endpoint delivers to and how it proves itself, as the API checks them on create
//! and on a PATCH: a broker endpoint's transport settings (common/src/transport/,
//! docs/DESTINATIONS.md) and an HTTP endpoint's authentication
//! (common/src/endpoint_auth.rs), each sealed whole and shown without its secret.

use railhook_common::vocabulary::Word;
use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use railhook_common::endpoint_auth::{self, Authentication, ClientCertificate};
use railhook_common::transport::{PollerTarget, TransportKind, TransportSettings, sealing_id};

use super::endpoints::{CreateEndpoint, EndpointRow, UpdateEndpoint};
use super::validate_url;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::endpoints::Credentials;

/// Authentication applies to HTTP endpoints, and is refused beside a custom `Authorization`
/// header (two sources for one header).
pub(crate) fn check_authentication(
    state: &AppState,
    auth: &Authentication,
    http: bool,
    headers: &BTreeMap<String, String>,
) -> ApiResult<()> {
    if !http {
        return Err(ApiError::validation(
            "authentication",
            "authentication applies to http endpoints (a broker's credentials are in its settings)",
        ));
    }
    if headers
        .keys()
        .any(|h| h.eq_ignore_ascii_case("authorization"))
    {
        return Err(ApiError::validation(
            "authentication",
            "authentication and a custom Authorization header cannot both be set",
        ));
    }
    auth.validate()
        .map_err(|e| ApiError::validation(e.field, e.detail))?;
    if let Authentication::OAuth2ClientCredentials(client) = auth
        && !state.limits.plain_token_urls
        && !url::Url::parse(&client.token_url).is_ok_and(|u| u.scheme() == "https")
    {
        return Err(ApiError::validation(
            "authentication.token_url",
            "authentication.token_url must be https: the client secret is not sent in clear",
        ));
    }
    Ok(())
}

/// A setting sealed whole, its secrets included, under `name` (`<endpoint id>/transport`,
/// `…/authentication`, `…/client_certificate`), like the signing secret.
pub(crate) fn seal_whole(state: &AppState, name: &str, value: &impl Serialize) -> String {
    let whole = serde_json::to_string(value).unwrap_or_default();
    state.keyring.seal(name, &whole)
}

/// The stored whole value of [`seal_whole`]: what a PATCH completes its secrets from.
/// `field` names it in the 422 when it was written around the API and does not parse.
fn open_whole<T: DeserializeOwned>(
    state: &AppState,
    name: &str,
    sealed: &str,
    field: &str,
) -> ApiResult<T> {
    serde_json::from_str(&state.keyring.open(name, sealed)?)
        .map_err(|_| ApiError::validation(field, "the stored value does not parse"))
}

/// A new endpoint's authentication and client certificate, checked against its kind.
pub(crate) fn check_credentials(
    state: &AppState,
    body: &CreateEndpoint,
    http: bool,
) -> ApiResult<()> {
    if let Some(auth) = &body.authentication {
        check_authentication(state, auth, http, &body.headers)?;
    }
    if let Some(cert) = &body.client_certificate {
        check_client_certificate(cert, http)?;
    }
    Ok(())
}

/// A new endpoint's authentication and client certificate, as the store keeps them.
pub(crate) fn seal_credentials(
    state: &AppState,
    endpoint_id: &str,
    body: &CreateEndpoint,
) -> Credentials {
    let auth = body.authentication.as_ref();
    let cert = body.client_certificate.as_ref();
    Credentials {
        authentication: auth.map(Authentication::shown),
        authentication_secret: auth
            .map(|a| seal_whole(state, &endpoint_auth::sealing_id(endpoint_id), a)),
        client_certificate: cert.map(ClientCertificate::shown),
        client_certificate_secret: cert.map(|c| {
            seal_whole(
                state,
                &endpoint_auth::certificate_sealing_id(endpoint_id),
                c,
            )
        }),
    }
}

/// A client certificate applies to HTTP endpoints (mutual TLS); its key must be the leaf's.
pub(crate) fn check_client_certificate(cert: &ClientCertificate, http: bool) -> ApiResult<()> {
    if !http {
        return Err(ApiError::validation(
            "client_certificate",
            "client_certificate applies to http endpoints (a broker's TLS settings are in its settings)",
        ));
    }
    cert.validate()
        .map_err(|e| ApiError::validation(e.field, e.detail))
}

/// What a PATCH does to the client certificate, as [`changed_authentication`] does to the
/// authentication: a key left out with the same certificate is the stored one.
pub(crate) fn changed_client_certificate(
    state: &AppState,
    current: &EndpointRow,
    body: &UpdateEndpoint,
) -> ApiResult<Option<Option<(serde_json::Value, String)>>> {
    let Some(Some(given)) = &body.client_certificate else {
        return Ok(body.client_certificate.as_ref().map(|_| None));
    };
    let mut cert = given.clone();
    let name = endpoint_auth::certificate_sealing_id(&current.id);
    if let Some(sealed) = &current.client_certificate_secret {
        let old: ClientCertificate = open_whole(state, &name, sealed, "client_certificate")?;
        cert.keep_key_of(&old);
    }
    check_client_certificate(&cert, current.transport == TransportKind::Http.as_str())?;
    Ok(Some(Some((cert.shown(), seal_whole(state, &name, &cert)))))
}

/// The endpoint's transport from `type` and its kind's object: `None` for HTTP. Each
/// mismatch is a 422 naming the field; each setting is checked (common/src/transport/).
pub(crate) fn transport_of(body: &CreateEndpoint) -> ApiResult<Option<TransportSettings>> {
    let kind = body.transport.unwrap_or(TransportKind::Http);
    let given: Vec<(TransportKind, bool)> = vec![
        (TransportKind::Kafka, body.kafka.is_some()),
        (TransportKind::Sqs, body.sqs.is_some()),
        (TransportKind::Rabbitmq, body.rabbitmq.is_some()),
        (TransportKind::Nats, body.nats.is_some()),
    ];
    if let Some((other, _)) = given.iter().find(|(k, set)| *set && *k != kind) {
        return Err(ApiError::validation(
            other.as_str(),
            format!(
                "{} settings were given for an endpoint of type {}",
                other.as_str(),
                kind.as_str()
            ),
        ));
    }
    let settings = match kind {
        TransportKind::Http => return Ok(None),
        TransportKind::Kafka => body.kafka.clone().map(TransportSettings::Kafka),
        TransportKind::Sqs => body.sqs.clone().map(TransportSettings::Sqs),
        TransportKind::Rabbitmq => body.rabbitmq.clone().map(TransportSettings::Rabbitmq),
        TransportKind::Nats => body.nats.clone().map(TransportSettings::Nats),
        // Nothing to set: the receiver comes to read (docs/POLLING.md).
        TransportKind::Poller => Some(TransportSettings::Poller(PollerTarget::default())),
        TransportKind::Listen => {
            return Err(ApiError::validation(
                "type",
                "listen endpoints are made by `railhook listen` sessions (docs/RECEIVERS.md)",
            ));
        }
    };
    let Some(settings) = settings else {
        return Err(ApiError::validation(
            kind.as_str(),
            format!(
                "an endpoint of type {0} needs its settings in \"{0}\"",
                kind.as_str()
            ),
        ));
    };
    if !body.url.is_empty() {
        return Err(ApiError::validation(
            "url",
            format!(
                "url applies to http endpoints; a {} endpoint's target is in its settings",
                kind.as_str()
            ),
        ));
    }
    settings
        .validate()
        .map_err(|e| ApiError::validation(e.field, e.detail))?;
    Ok(Some(settings))
}

/// A polling endpoint belongs to an application (its routes are the application's:
/// `/api/v1/app/{app}/poller/{endpoint}`), and takes no transformation: its receiver reads
/// the Event's payload as it was sent, and a program that ran on every read would be a
/// tenant's code in the read path (docs/POLLING.md).
pub(crate) fn check_poller(has_application: bool, transformation: bool) -> ApiResult<()> {
    if !has_application {
        return Err(ApiError::validation(
            "application",
            "a poller endpoint belongs to an application: its consumers poll the application's stream",
        ));
    }
    if transformation {
        return Err(ApiError::validation(
            "transformation",
            "a poller endpoint takes no transformation: its consumers read the payload as sent",
        ));
    }
    Ok(())
}

/// What a PATCH changes of an endpoint's target: its URL, and a broker endpoint's settings.
#[derive(Default)]
pub(crate) struct TargetChange {
    pub(crate) url: Option<String>,
    pub(crate) shown: Option<serde_json::Value>,
    pub(crate) sealed: Option<String>,
}

/// A PATCH's `url` and broker settings, checked against the endpoint's type: an HTTP
/// endpoint takes a new URL and no broker settings; a broker endpoint takes new settings of
/// its own kind (credentials left out are kept) and its own URL-shaped name back unchanged
/// (what a form or a Svix `PUT` sends), nothing else as `url`. The type never changes.
pub(crate) fn changed_target(
    state: &AppState,
    current: &EndpointRow,
    body: &UpdateEndpoint,
) -> ApiResult<TargetChange> {
    let given = patched_settings(body)?;
    if given.is_none() && body.url.is_none() {
        return Ok(TargetChange::default());
    }
    let kind = TransportKind::parse(&current.transport).unwrap_or(TransportKind::Http);
    if kind == TransportKind::Http {
        if let Some(new) = &given {
            return Err(ApiError::validation(
                new.kind().as_str(),
                "an http endpoint's type does not change; create a new endpoint",
            ));
        }
        let url = body.url.as_deref().map(validate_url).transpose()?;
        return Ok(TargetChange {
            url,
            ..TargetChange::default()
        });
    }
    if body.url.as_deref().is_some_and(|raw| raw != current.url) {
        return Err(ApiError::validation(
            "url",
            format!(
                "url applies to http endpoints; a {} endpoint's target is in its settings",
                kind.as_str()
            ),
        ));
    }
    let Some(mut new) = given else {
        return Ok(TargetChange::default());
    };
    if new.kind() != kind {
        return Err(ApiError::validation(
            new.kind().as_str(),
            format!(
                "this endpoint's type is {}; it does not change",
                kind.as_str()
            ),
        ));
    }
    let sealing = sealing_id(&current.id);
    if let Some(sealed) = &current.transport_secret {
        let old: TransportSettings = open_whole(state, &sealing, sealed, kind.as_str())?;
        new.keep_credentials_of(&old);
    }
    new.validate()
        .map_err(|e| ApiError::validation(e.field, e.detail))?;
    Ok(TargetChange {
        url: Some(new.display_url()),
        shown: Some(new.shown()),
        sealed: Some(seal_whole(state, &sealing, &new)),
    })
}

/// What a PATCH does to the endpoint's authentication: `None` leaves it, `Some(None)`
/// removes it, `Some(Some((shown, sealed)))` replaces it. A new one is checked against the
/// endpoint (HTTP only; no custom `Authorization` header, the PATCH's own if it sets
/// headers) and completed with the stored password when left out under the same username;
/// a custom `Authorization` header is refused while the endpoint keeps one.
pub(crate) fn changed_authentication(
    state: &AppState,
    current: &EndpointRow,
    body: &UpdateEndpoint,
) -> ApiResult<Option<Option<(serde_json::Value, String)>>> {
    let moves = origin_changes(current, body);
    if moves && current.authentication_secret.is_some() && body.authentication.is_none() {
        return Err(ApiError::validation(
            "authentication",
            "the url moves to another origin: send the authentication again with its password \
             or client_secret, or remove it (\"authentication\": null)",
        ));
    }
    let Some(Some(given)) = &body.authentication else {
        let adds_authorization = body.headers.as_ref().is_some_and(has_authorization);
        if adds_authorization && body.authentication.is_none() && current.authentication.is_some() {
            return Err(ApiError::validation(
                "headers",
                "the endpoint has authentication: remove it (\"authentication\": null) before \
                 setting a custom Authorization header",
            ));
        }
        return Ok(body.authentication.as_ref().map(|_| None));
    };
    let headers = match &body.headers {
        Some(h) => h.clone(),
        None => current.opened_headers(&state.keyring),
    };
    let mut auth = given.clone();
    let name = endpoint_auth::sealing_id(&current.id);
    // A stored secret stays with the origin it was given for: a PATCH that moves the URL
    // elsewhere must send it again (issue #53: anyone allowed to change the URL, a portal
    // session included, could otherwise point it at a host of theirs and collect it).
    if let Some(sealed) = current.authentication_secret.as_ref().filter(|_| !moves) {
        let old: Authentication = open_whole(state, &name, sealed, "authentication")?;
        auth.keep_credentials_of(&old);
    }
    check_authentication(
        state,
        &auth,
        current.transport == TransportKind::Http.as_str(),
        &headers,
    )?;
    Ok(Some(Some((auth.shown(), seal_whole(state, &name, &auth)))))
}

/// Whether a PATCH's `url` names another origin (scheme, host, port) than the endpoint's.
fn origin_changes(current: &EndpointRow, body: &UpdateEndpoint) -> bool {
    let Some(new) = body.url.as_deref() else {
        return false;
    };
    let origin = |raw: &str| url::Url::parse(raw).ok().map(|u| u.origin());
    origin(new) != origin(&current.url)
}

fn has_authorization(headers: &BTreeMap<String, String>) -> bool {
    headers
        .keys()
        .any(|h| h.eq_ignore_ascii_case("authorization"))
}

/// The broker settings a PATCH carries (at most one kind).
fn patched_settings(body: &UpdateEndpoint) -> ApiResult<Option<TransportSettings>> {
    let all = [
        body.kafka.clone().map(TransportSettings::Kafka),
        body.sqs.clone().map(TransportSettings::Sqs),
        body.rabbitmq.clone().map(TransportSettings::Rabbitmq),
        body.nats.clone().map(TransportSettings::Nats),
    ];
    let mut given = all.into_iter().flatten();
    let first = given.next();
    if let Some(second) = given.next() {
        return Err(ApiError::validation(
            second.kind().as_str(),
            "settings of one kind only: the endpoint's own",
        ));
    }
    Ok(first)
}
