//! `PATCH /v1/endpoints/{id}`: a change to an endpoint, in the native API's shape, applied
//! by the endpoint module (crate::endpoint), which checks every field and commits the change
//! with its operational webhooks.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use railhook_common::endpoint_auth::{Authentication, ClientCertificate};
use railhook_common::transport::{KafkaTarget, NatsTarget, RabbitmqTarget, SqsTarget};
use serde::Deserialize;

use crate::auth::Project;
use crate::extract::ApiJson;
use crate::problem::{ApiResult, Problem};
use crate::routes::double_option;
use crate::routes::endpoints::{Endpoint, parse_id};
use crate::routes::transformations::TransformationIn;
use crate::state::AppState;

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
    let row = crate::endpoint::update(&state, &project, &id, crate::endpoint::Change::native(body))
        .await?;
    Ok(Json(row.view(&state.keyring)))
}
