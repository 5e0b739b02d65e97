//! The endpoint, whichever of its four front doors a change comes through: the native API
//! (`/v1/endpoints`), the Svix-compatible surface (`/api/v1/app/{app}/endpoint`), the
//! customer portal and the dashboard. Each door translates its own shape into one of the
//! changes below and calls this module; none calls another's HTTP handler.
//!
//! ```text
//!  native JSON ─┐
//!  Svix JSON ───┼─▶ New / Change ─▶ create / update / delete ─▶ one transaction:
//!  portal form ─┘   (checked here)                               endpoint row, its one
//!                                                                subscription, operational
//!                                                                notices ─▶ commit
//! ```
//!
//! Invariants, and where they are kept:
//! - **One change, one commit.** An endpoint's fields, the subscription the Svix surface and
//!   the portal show as its event types, and the operational webhooks announcing the change
//!   commit together or not at all: a Svix PATCH with `filterTypes`, or a portal edit with
//!   its headers, never leaves half a change (issue #55; before, the endpoint and its
//!   subscription, or its headers, were two transactions). Tested by injecting a failure into
//!   the subscription's write (`tests/it/endpoint_doors.rs`).
//! - **Everything that needs no stored row is checked before the transaction opens** (URLs,
//!   limits, headers, the filter's cost, the transformation's program, the subscription's
//!   patterns), so a refused change holds no lock while a program is compiled; the target and
//!   the credentials, which a PATCH merges with the stored ones, are checked against the row
//!   it locked. A refusal at either point writes nothing.
//!
//! The dashboard's enable and disable (with a person's reason) go through
//! `routes::endpoint_state::set_enabled`, shared with the native `/disable` and `/enable`
//! routes: a state change of its own, not a field change.
//! - **The sender cache is cleared after every commit here**, whichever door: a change must
//!   reach fan-out at once.

mod shapes;

pub use shapes::{CreateEndpoint, CreatedEndpoint, Endpoint, UpdateEndpoint};

use std::collections::BTreeMap;

use railhook_common::endpoint_auth::{Authentication, ClientCertificate};
use railhook_common::ids::EndpointId;
use railhook_common::keygen::{generate_ed25519_secret, generate_signing_secret};
use railhook_common::transport::{TransportKind, TransportSettings, sealing_id};
use railhook_common::vocabulary::Word;

use crate::audit::{self, Audited};
use crate::auth::Project;
use crate::operational::{self, EndpointChanged, EndpointRef, Notice};
use crate::problem::{ApiError, ApiResult};
use crate::routes::applications::{
    check_channels, check_metadata, check_uid, resolve as resolve_application,
};
use crate::routes::endpoint_target as target;
use crate::routes::endpoints::{
    DEFAULT_TIMEOUT_MS, check_description, check_given_secret, check_max_attempts, check_positive,
    check_timeout, retry_delays, uid_conflict,
};
use crate::routes::filters::{self, check_filter};
use crate::routes::transformations;
use crate::routes::{validate_headers, validate_url};
use crate::state::AppState;
use crate::store::endpoints::{self as store, EndpointRow, Kind};
use crate::store::subscriptions;

/// A new endpoint: the native create's fields, and the patterns of the one subscription
/// the Svix surface and the portal make with it (`None`: none, as the native API does).
pub(crate) struct New<'a> {
    pub fields: CreateEndpoint,
    /// Checked patterns (`routes::subscriptions::parse_patterns`); `["*"]` for every type.
    pub subscription: Option<Vec<String>>,
    /// A Destination of this Source (`/v1/sources/{id}/destinations`).
    pub source_id: Option<&'a str>,
    /// A target Railhook itself sets, never one read from input: a `railhook listen`
    /// session's relay (`crate::listen`). `None`: the target is the fields' own.
    pub own_target: Option<TransportSettings>,
}

impl New<'_> {
    /// A create through the native API: no subscription, no Source.
    pub(crate) fn native(fields: CreateEndpoint) -> Self {
        Self {
            fields,
            subscription: None,
            source_id: None,
            own_target: None,
        }
    }
}

/// A change to an endpoint: the native PATCH's fields, and the patterns its one
/// subscription is to have (`None`: subscriptions left as they are).
pub(crate) struct Change {
    pub fields: UpdateEndpoint,
    /// Checked patterns; the endpoint's newest live subscription takes them, the others
    /// are deleted, and one is made if it has none (the Svix surface's single filter).
    pub subscription: Option<Vec<String>>,
}

impl Change {
    /// A change through the native API, which manages subscriptions on their own routes.
    pub(crate) fn native(fields: UpdateEndpoint) -> Self {
        Self {
            fields,
            subscription: None,
        }
    }

    /// The doors that change one thing only (the Svix headers, credentials and enable calls,
    /// the portal's buttons): that field, every other left as it is. Doors that translate a
    /// whole shape name every field instead (`svix::endpoints`, `portal::endpoint_pages`).
    fn only(fields: UpdateEndpoint) -> Self {
        Self::native(fields)
    }

    /// Replaces the custom headers (checked and sealed by [`update`]).
    pub(crate) fn headers(headers: BTreeMap<String, String>) -> Self {
        Self::only(UpdateEndpoint {
            headers: Some(headers),
            ..UpdateEndpoint::default()
        })
    }

    /// Enables (clearing the disabled reason) or disables the endpoint.
    pub(crate) fn enabled(enabled: bool) -> Self {
        Self::only(UpdateEndpoint {
            enabled: Some(enabled),
            ..UpdateEndpoint::default()
        })
    }

    /// Replaces (`Some`) or removes (`None`) the HTTP authentication.
    pub(crate) fn authentication(authentication: Option<Authentication>) -> Self {
        Self::only(UpdateEndpoint {
            authentication: Some(authentication),
            ..UpdateEndpoint::default()
        })
    }

    /// Replaces (`Some`) or removes (`None`) the client certificate.
    pub(crate) fn client_certificate(certificate: Option<ClientCertificate>) -> Self {
        Self::only(UpdateEndpoint {
            client_certificate: Some(certificate),
            ..UpdateEndpoint::default()
        })
    }
}

/// A new endpoint's payload filter and transformation, each checked.
async fn routing(
    state: &AppState,
    project: &Project,
    body: &CreateEndpoint,
) -> ApiResult<store::Routing> {
    let filter = match &body.filter {
        Some(f) => Some(check_filter(&state.pool, "filter", f).await?),
        None => None,
    };
    let (code, enabled) = transformations::check_change(
        project.id.as_str(),
        "transformation",
        body.transformation.as_ref().map(Some),
    )
    .await?;
    Ok(store::Routing {
        filter,
        transformation_code: code.flatten(),
        transformation_enabled: enabled.unwrap_or(false),
    })
}

/// Checks and stores a new endpoint with its subscription, in one transaction (see the
/// module's doc).
pub(crate) async fn create(
    state: &AppState,
    project: &Project,
    new: New<'_>,
) -> ApiResult<CreatedEndpoint> {
    let New {
        fields,
        subscription,
        source_id,
        own_target,
    } = new;
    let id = EndpointId::generate();
    let checked = check_new(state, project, &id, &fields, source_id, own_target).await?;
    let sealed_secret = state.keyring.seal(id.as_str(), &checked.secret);
    let mut audited = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let stored = checked.stored(project, &id, &fields, &sealed_secret, source_id);
    let row = store::insert(audited.conn(), stored)
        .await
        .map_err(uid_conflict)?;
    if let Some(patterns) = &subscription {
        subscriptions::set_only(audited.conn(), project.id.as_str(), &row.id, patterns).await?;
    }
    operational::emit(
        audited.conn(),
        project.id.as_str(),
        Notice::EndpointCreated(EndpointChanged::new(&row.id, &row.url, &row.description)),
    )
    .await?;
    let endpoint = row.view(&state.keyring);
    let mut created = audit::view(&endpoint);
    created["event_types"] = serde_json::json!(subscription);
    audited
        .commit("endpoint", Some(&endpoint.id), "create", created)
        .await?;
    state.senders.invalidate();
    Ok(CreatedEndpoint {
        endpoint,
        secret: checked.secret,
    })
}

/// A create's fields, checked, in the form they are stored in (secrets and header values
/// sealed for the endpoint's id).
struct CheckedNew {
    url: String,
    timeout_ms: i32,
    delays: Option<String>,
    secret: String,
    channels: Option<Vec<String>>,
    metadata: serde_json::Value,
    routing: store::Routing,
    application: Option<String>,
    sealed_headers: serde_json::Value,
    transport: Option<TransportSettings>,
    sealed_transport: Option<String>,
    credentials: store::Credentials,
}

/// Every check of a create, before any transaction opens.
async fn check_new(
    state: &AppState,
    project: &Project,
    id: &EndpointId,
    body: &CreateEndpoint,
    source_id: Option<&str>,
    own_target: Option<TransportSettings>,
) -> ApiResult<CheckedNew> {
    let transport = match own_target {
        Some(own) => Some(own),
        None => target::transport_of(body)?,
    };
    target::check_credentials(state, body, transport.is_none())?;
    if matches!(transport, Some(TransportSettings::Poller(_))) {
        target::check_poller(body.application.is_some(), body.transformation.is_some())?;
    }
    let url = match &transport {
        None => validate_url(&body.url)?,
        Some(settings) => settings.display_url(),
    };
    check_description(&body.description)?;
    // The default, unless the deployment caps endpoints below it.
    let timeout_ms = body
        .timeout_ms
        .unwrap_or(DEFAULT_TIMEOUT_MS.min(state.limits.endpoint_timeout_max_ms));
    check_timeout(state, timeout_ms)?;
    check_positive("rate_limit_per_second", body.rate_limit_per_second)?;
    check_positive("rate_limit_burst", body.rate_limit_burst)?;
    check_positive("max_concurrency", body.max_concurrency)?;
    validate_headers(&body.headers)?;
    check_max_attempts(body.max_attempts)?;
    if let Some(uid) = &body.uid {
        check_uid("uid", uid, EndpointId::PREFIX)?;
    }
    let application = application_of(state, project, body, source_id).await?;
    Ok(CheckedNew {
        url,
        timeout_ms,
        delays: body
            .retry_delays_seconds
            .as_deref()
            .map(retry_delays)
            .transpose()?,
        secret: signing_secret(body)?,
        channels: body
            .channels
            .as_deref()
            .map(|c| check_channels("channels", c))
            .transpose()?,
        metadata: check_metadata(&body.metadata)?,
        routing: routing(state, project, body).await?,
        application,
        // Header values are where receivers' credentials go: sealed like the signing secret.
        sealed_headers: state.keyring.seal_headers(
            id.as_str(),
            &serde_json::to_value(&body.headers).unwrap_or_default(),
        ),
        // The whole settings, credentials included, sealed like the signing secret.
        sealed_transport: transport
            .as_ref()
            .map(|t| target::seal_whole(state, &sealing_id(id.as_str()), t)),
        transport,
        credentials: target::seal_credentials(state, id.as_str(), body),
    })
}

/// The application a new endpoint belongs to (its id, from an id or a uid), if any; a
/// Source's Destination belongs to none.
async fn application_of(
    state: &AppState,
    project: &Project,
    body: &CreateEndpoint,
    source_id: Option<&str>,
) -> ApiResult<Option<String>> {
    Ok(match &body.application {
        Some(_) if source_id.is_some() => {
            return Err(ApiError::validation(
                "application",
                "a Source's Destination cannot belong to an application",
            ));
        }
        Some(a) => Some(resolve_application(state, project.id.as_str(), a).await?.id),
        None => None,
    })
}

impl CheckedNew {
    /// The row to insert: each column named by the store's `NewEndpoint`.
    fn stored<'a>(
        &'a self,
        project: &'a Project,
        id: &'a EndpointId,
        body: &'a CreateEndpoint,
        sealed_secret: &'a str,
        source_id: Option<&'a str>,
    ) -> store::NewEndpoint<'a> {
        store::NewEndpoint {
            id: id.as_str(),
            project_id: project.id.as_str(),
            url: &self.url,
            description: &body.description,
            sealed_secret,
            enabled: body.enabled.unwrap_or(true),
            timeout_ms: self.timeout_ms,
            rate_limit_per_second: body.rate_limit_per_second,
            rate_limit_burst: body.rate_limit_burst,
            max_concurrency: body.max_concurrency,
            sealed_headers: self.sealed_headers.clone(),
            retry_delays: self.delays.clone(),
            max_attempts: body.max_attempts,
            source_id,
            application_id: self.application.as_deref(),
            channels: self.channels.as_deref(),
            uid: body.uid.as_deref(),
            metadata: self.metadata.clone(),
            transport: self
                .transport
                .as_ref()
                .map_or(TransportKind::Http, TransportSettings::kind)
                .as_str(),
            transport_settings: self.transport.as_ref().map(TransportSettings::shown),
            transport_secret: self.sealed_transport.clone(),
            credentials: self.credentials.clone(),
            routing: self.routing.clone(),
        }
    }
}

/// The endpoint's signing secret: the caller's own HMAC secret, or a new one of the scheme
/// asked for.
fn signing_secret(body: &CreateEndpoint) -> ApiResult<String> {
    Ok(match (body.signing.as_deref(), body.secret.as_deref()) {
        (None | Some("hmac-sha256"), Some(given)) => check_given_secret(given)?,
        (None | Some("hmac-sha256"), None) => generate_signing_secret(),
        (Some("ed25519"), None) => generate_ed25519_secret(),
        (Some("ed25519"), Some(_)) => {
            return Err(ApiError::validation(
                "secret",
                "secret can be given only for hmac-sha256 signing",
            ));
        }
        (Some(_), _) => {
            return Err(ApiError::validation(
                "signing",
                "signing must be hmac-sha256 or ed25519",
            ));
        }
    })
}

/// Checks `change` and applies it to the project's webhook endpoint `id`, with its
/// subscription and its operational notices, in one transaction. Returns the row as
/// committed.
pub(crate) async fn update(
    state: &AppState,
    project: &Project,
    id: &EndpointId,
    change: Change,
) -> ApiResult<EndpointRow> {
    let Change {
        fields,
        subscription,
    } = change;
    let checked = check_change(state, project, id, &fields).await?;
    // The change, its subscription and its operational webhooks commit together.
    let mut audited = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    let was_enabled = operational::lock_enabled(audited.conn(), project.id.as_str(), id.as_str())
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    // Read once: what the type, the URL and the authentication are checked against.
    let current = store::find(
        audited.conn(),
        project.id.as_str(),
        id.as_str(),
        Kind::Webhook,
    )
    .await?
    .ok_or(ApiError::NotFound("endpoint"))?;
    let target = target::changed_target(state, &current, &fields)?;
    if current.transport == TransportKind::Poller.as_str() {
        target::check_poller(true, matches!(fields.transformation, Some(Some(_))))?;
    }
    let credentials = (
        target::changed_authentication(state, &current, &fields)?,
        target::changed_client_certificate(state, &current, &fields)?,
    );
    let stored = checked.stored(&fields, &target, credentials);
    let row = store::update(audited.conn(), id.as_str(), project.id.as_str(), stored)
        .await
        .map_err(uid_conflict)?
        .ok_or(ApiError::NotFound("endpoint"))?;
    if let Some(patterns) = &subscription {
        subscriptions::set_only(audited.conn(), project.id.as_str(), &row.id, patterns).await?;
    }
    operational::emit(
        audited.conn(),
        project.id.as_str(),
        Notice::EndpointUpdated(EndpointChanged::new(&row.id, &row.url, &row.description)),
    )
    .await?;
    operational::emit_enabled_change(audited.conn(), project.id.as_str(), was_enabled, &row)
        .await?;
    let mut changed = audit::diff(
        &audit::view(&current.view(&state.keyring)),
        &audit::view(&row.clone().view(&state.keyring)),
    );
    if let Some(patterns) = &subscription {
        changed["event_types"] = serde_json::json!({"to": patterns});
    }
    audited
        .commit("endpoint", Some(id.as_str()), "update", changed)
        .await?;
    state.senders.invalidate();
    Ok(row)
}

/// A change's fields that are checked without the stored row, in their stored form.
struct CheckedChange {
    sealed_headers: Option<serde_json::Value>,
    delays: Option<Option<String>>,
    channels: Option<Option<Vec<String>>>,
    metadata: Option<serde_json::Value>,
    filter: Option<Option<String>>,
    transformation_code: Option<Option<String>>,
    transformation_enabled: Option<bool>,
}

/// Every check of a change that needs no stored row, before any transaction opens (the
/// target and the credentials are checked against the row, inside it).
async fn check_change(
    state: &AppState,
    project: &Project,
    id: &EndpointId,
    body: &UpdateEndpoint,
) -> ApiResult<CheckedChange> {
    if let Some(d) = &body.description {
        check_description(d)?;
    }
    if let Some(ms) = body.timeout_ms {
        check_timeout(state, ms)?;
    }
    check_positive(
        "rate_limit_per_second",
        body.rate_limit_per_second.flatten(),
    )?;
    check_positive("rate_limit_burst", body.rate_limit_burst.flatten())?;
    check_positive("max_concurrency", body.max_concurrency.flatten())?;
    if let Some(h) = &body.headers {
        validate_headers(h)?;
    }
    check_max_attempts(body.max_attempts.flatten())?;
    if let Some(Some(uid)) = &body.uid {
        check_uid("uid", uid, EndpointId::PREFIX)?;
    }
    let channels = match &body.channels {
        Some(Some(c)) if !c.is_empty() => Some(Some(check_channels("channels", c)?)),
        Some(_) => Some(None),
        None => None,
    };
    let filter_change = body.filter.as_ref().map(Option::as_deref);
    let transformation_change = body.transformation.as_ref().map(Option::as_ref);
    let (transformation_code, transformation_enabled) =
        transformations::check_change(project.id.as_str(), "transformation", transformation_change)
            .await?;
    Ok(CheckedChange {
        sealed_headers: body.headers.as_ref().map(|h| {
            state
                .keyring
                .seal_headers(id.as_str(), &serde_json::to_value(h).unwrap_or_default())
        }),
        delays: body
            .retry_delays_seconds
            .as_ref()
            .map(|d| d.as_deref().map(retry_delays).transpose())
            .transpose()?,
        channels,
        metadata: body.metadata.as_ref().map(check_metadata).transpose()?,
        filter: filters::check_change(&state.pool, "filter", filter_change).await?,
        transformation_code,
        transformation_enabled,
    })
}

/// A new authentication and client certificate, each shown and sealed (`None`: unchanged).
type CredentialChanges = (
    Option<Option<(serde_json::Value, String)>>,
    Option<Option<(serde_json::Value, String)>>,
);

impl CheckedChange {
    /// The columns to change: each named by the store's `EndpointChange`.
    fn stored<'a>(
        self,
        body: &'a UpdateEndpoint,
        target: &'a target::TargetChange,
        (authentication, client_certificate): CredentialChanges,
    ) -> store::EndpointChange<'a> {
        store::EndpointChange {
            client_certificate,
            url: target.url.as_deref(),
            transport_settings: target.shown.clone(),
            transport_secret: target.sealed.clone(),
            authentication,
            description: body.description.as_deref(),
            enabled: body.enabled,
            timeout_ms: body.timeout_ms,
            rate_limit_per_second: body.rate_limit_per_second,
            rate_limit_burst: body.rate_limit_burst,
            max_concurrency: body.max_concurrency,
            sealed_headers: self.sealed_headers,
            retry_delays: self.delays,
            max_attempts: body.max_attempts,
            channels: self.channels,
            uid: body.uid.clone(),
            metadata: self.metadata,
            filter: self.filter,
            transformation_code: self.transformation_code,
            transformation_enabled: self.transformation_enabled,
        }
    }
}

/// Deletes the project's webhook endpoint `id` and its subscriptions (the row stays, so its
/// Deliveries and Attempts stay readable), with its operational notice, in one transaction.
pub(crate) async fn delete(state: &AppState, project: &Project, id: &EndpointId) -> ApiResult<()> {
    let mut audited = Audited::begin(&state.pool, &project.actor, project.id.as_str()).await?;
    if !store::delete(audited.conn(), id.as_str(), project.id.as_str()).await? {
        return Err(ApiError::NotFound("endpoint"));
    }
    operational::emit(
        audited.conn(),
        project.id.as_str(),
        Notice::EndpointDeleted(EndpointRef {
            endpoint_id: id.as_str(),
        }),
    )
    .await?;
    audited
        .commit(
            "endpoint",
            Some(id.as_str()),
            "delete",
            serde_json::json!({}),
        )
        .await?;
    state.senders.invalidate();
    Ok(())
}
