//! `PATCH /v1/endpoints/{id}`: a change to an endpoint. Every field is checked as at create
//! (routes/endpoints.rs), the target, credentials, filter and transformation by their own
//! modules; the change and its operational webhooks commit together.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use railhook_common::endpoint_auth::{Authentication, ClientCertificate};
use railhook_common::ids::EndpointId;
use railhook_common::transport::{KafkaTarget, NatsTarget, RabbitmqTarget, SqsTarget};
use serde::Deserialize;

use crate::auth::Project;
use crate::extract::ApiJson;
use crate::operational::{self, EndpointChanged, Notice};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::routes::applications::{check_channels, check_metadata, check_uid};
use crate::routes::endpoint_target as target;
use crate::routes::endpoints::{
    Endpoint, check_description, check_max_attempts, check_positive, check_timeout, parse_id,
    retry_delays, uid_conflict,
};
use crate::routes::transformations::{self, TransformationIn};
use crate::routes::{double_option, filters, validate_headers};
use crate::state::AppState;
use crate::store::endpoints::{self as store, Kind};

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

#[utoipa::path(patch, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)), request_body = UpdateEndpoint,
    responses((status = 200, body = Endpoint), (status = 404, body = Problem),
              (status = 422, body = Problem)),
    security(("api_key" = [])))]
pub async fn update(
    project: Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateEndpoint>,
) -> ApiResult<Json<Endpoint>> {
    let id = parse_id(&id)?;
    if let Some(d) = &body.description {
        check_description(d)?;
    }
    if let Some(ms) = body.timeout_ms {
        check_timeout(&state, ms)?;
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
    let headers = body.headers.as_ref().map(|h| {
        state
            .keyring
            .seal_headers(id.as_str(), &serde_json::to_value(h).unwrap_or_default())
    });
    let delays = body
        .retry_delays_seconds
        .as_ref()
        .map(|d| d.as_deref().map(retry_delays).transpose())
        .transpose()?;
    check_max_attempts(body.max_attempts.flatten())?;
    let channels = match &body.channels {
        Some(Some(c)) if !c.is_empty() => Some(Some(check_channels("channels", c)?)),
        Some(_) => Some(None),
        None => None,
    };
    if let Some(Some(uid)) = &body.uid {
        check_uid("uid", uid, EndpointId::PREFIX)?;
    }
    let metadata = body.metadata.as_ref().map(check_metadata).transpose()?;
    let filter = filters::check_change(
        &state.pool,
        "filter",
        body.filter.as_ref().map(Option::as_deref),
    )
    .await?;
    let (transformation_code, transformation_enabled) = transformations::check_change(
        project.id.as_str(),
        "transformation",
        body.transformation.as_ref().map(Option::as_ref),
    )
    .await?;
    // The change and its operational webhooks commit together (crate::operational).
    let mut tx = state.pool.begin().await?;
    let was_enabled = crate::operational::lock_enabled(&mut tx, project.id.as_str(), id.as_str())
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    // Read once: what the type, the URL and the authentication are checked against.
    let current = store::find(&mut *tx, project.id.as_str(), id.as_str(), Kind::Webhook)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let target = target::changed_target(&state, &current, &body)?;
    let authentication = target::changed_authentication(&state, &current, &body)?;
    let client_certificate = target::changed_client_certificate(&state, &current, &body)?;
    let change = store::EndpointChange {
        client_certificate,
        url: target.url.as_deref(),
        transport_settings: target.shown,
        transport_secret: target.sealed,
        authentication,
        description: body.description.as_deref(),
        enabled: body.enabled,
        timeout_ms: body.timeout_ms,
        rate_limit_per_second: body.rate_limit_per_second,
        rate_limit_burst: body.rate_limit_burst,
        max_concurrency: body.max_concurrency,
        sealed_headers: headers,
        retry_delays: delays,
        max_attempts: body.max_attempts,
        channels,
        uid: body.uid.clone(),
        metadata,
        filter,
        transformation_code,
        transformation_enabled,
    };
    let row = store::update(&mut *tx, id.as_str(), project.id.as_str(), change)
        .await
        .map_err(uid_conflict)?
        .ok_or(ApiError::NotFound("endpoint"))?;
    operational::emit(
        &mut *tx,
        project.id.as_str(),
        Notice::EndpointUpdated(EndpointChanged::new(&row.id, &row.url, &row.description)),
    )
    .await?;
    operational::emit_enabled_change(&mut tx, project.id.as_str(), was_enabled, &row).await?;
    tx.commit().await?;
    Ok(Json(row.view(&state.keyring)))
}
