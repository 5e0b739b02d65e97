//! Endpoints as every reader and writer sees them: [`EndpointRow`] is the `endpoints` row,
//! column for column, so each statement reads or returns `*` and no column list is written
//! anywhere (a column added to the table is a compile error here until the row has it).
//! The API's view of a row is `routes::endpoints::Endpoint` (with the signing scheme read
//! from the sealed secret); the operational endpoints' view is in
//! routes/operational_endpoints.rs; the dashboard lists what [`of_project`] returns.
//!
//! Writes with their own rules stay with their handlers (create and update in
//! routes/endpoints.rs, enable and disable in routes/endpoint_state.rs, the worker's streak
//! and breaker in the Fence); each returns the row through `RETURNING *`.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

/// The `endpoints` row (see the module doc).
#[derive(Debug, Clone)]
pub struct EndpointRow {
    pub id: String,
    pub project_id: String,
    pub url: String,
    pub description: String,
    /// Sealed (common/src/sealing.rs); never shown.
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub timeout_ms: i32,
    pub rate_limit_per_second: Option<i32>,
    pub max_concurrency: Option<i32>,
    pub headers: serde_json::Value,
    pub breaker_state: String,
    pub breaker_opened_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
    pub retry_delays: Option<String>,
    pub max_attempts: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub breaker_changed_at: Option<DateTime<Utc>>,
    pub source_id: Option<String>,
    pub consecutive_failures: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub disabled_at: Option<DateTime<Utc>>,
    /// `webhook` (the API's endpoints and Destinations) or `operational`.
    pub kind: String,
    pub operational_types: Option<Vec<String>>,
    /// The application the endpoint belongs to, for life; `None`: a project endpoint.
    pub application_id: Option<String>,
    /// Channels it listens on; `None` or empty: every channel (docs/APPLICATIONS.md).
    pub channels: Option<Vec<String>>,
    /// The sender's own name for it, unique in its scope.
    pub uid: Option<String>,
    /// A JSON object of strings, the sender's.
    pub metadata: serde_json::Value,
    /// What carries its Attempts (common/src/transport/): `http`, `kafka`, `sqs`,
    /// `rabbitmq` or `nats`.
    pub transport: String,
    /// The transport's settings without credentials (shown); `None` for `http`.
    pub transport_settings: Option<serde_json::Value>,
    /// The transport's whole settings, sealed; never shown.
    pub transport_secret: Option<String>,
    /// HTTP authentication beyond the signature, without its secret (shown).
    pub authentication: Option<serde_json::Value>,
    /// The same, whole, sealed; never shown.
    pub authentication_secret: Option<String>,
    /// The client certificate for mutual TLS, without its key (shown).
    pub client_certificate: Option<serde_json::Value>,
    /// Certificate and key, sealed; never shown.
    pub client_certificate_secret: Option<String>,
    /// The payload filter (canonical SQL/JSON path text: routes/filters.rs).
    pub filter: Option<String>,
    /// The transformation (common/src/transformation.rs), whether it runs, when it last
    /// changed, and its last outcome in the worker (written when the outcome changes).
    pub transformation_code: Option<String>,
    pub transformation_enabled: bool,
    pub transformation_updated_at: Option<DateTime<Utc>>,
    pub transformation_last: Option<serde_json::Value>,
}

use railhook_common::Word;
/// Which endpoints a read covers: the API's (`webhook`, Destinations included) or the
/// operational ones (common/src/vocabulary.rs).
pub use railhook_common::vocabulary::EndpointKind as Kind;

/// One live endpoint of the project.
pub async fn find(
    db: impl PgExecutor<'_>,
    project_id: &str,
    id: &str,
    kind: Kind,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = $3"#,
        id,
        project_id,
        kind.as_str()
    )
    .fetch_optional(db)
    .await
}

/// The project's live endpoints of `kind` among `ids`, by id: one statement for a page of
/// rows that each name an endpoint (issue #55).
pub async fn rows_by_id(
    db: impl PgExecutor<'_>,
    project_id: &str,
    ids: &[String],
    kind: Kind,
) -> Result<std::collections::HashMap<String, EndpointRow>, sqlx::Error> {
    let rows = sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE id = ANY($1) AND project_id = $2 AND deleted_at IS NULL AND kind = $3"#,
        ids,
        project_id,
        kind.as_str()
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id.clone(), r)).collect())
}

/// One live webhook endpoint of an application, by its id or its uid.
pub async fn find_in_application(
    db: impl PgExecutor<'_>,
    project_id: &str,
    application_id: &str,
    id_or_uid: &str,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE project_id = $1 AND application_id = $2 AND deleted_at IS NULL
             AND kind = 'webhook' AND (id = $3 OR uid = $3)"#,
        project_id,
        application_id,
        id_or_uid
    )
    .fetch_optional(db)
    .await
}

/// A page of the project's live endpoints (of one application, if given), after the cursor
/// `after`: newest first, or oldest first with `ascending` (the cursor then reads forwards).
pub async fn page(
    db: impl PgExecutor<'_>,
    project_id: &str,
    kind: Kind,
    application_id: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE project_id = $1 AND deleted_at IS NULL AND kind = $2
             AND ($5::text IS NULL OR application_id = $5)
             AND ($3::text IS NULL OR id < $3)
           ORDER BY id DESC LIMIT $4"#,
        project_id,
        kind.as_str(),
        after,
        limit,
        application_id
    )
    .fetch_all(db)
    .await
}

/// Every live endpoint of the project, of one kind or (`None`) of both, oldest first (the
/// dashboard's list and its filters' choices; a project has tens of endpoints, not
/// thousands).
pub async fn of_project(
    db: impl PgExecutor<'_>,
    project_id: &str,
    kind: Option<Kind>,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints
           WHERE project_id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR kind = $2)
           ORDER BY id"#,
        project_id,
        kind.map(Kind::as_str)
    )
    .fetch_all(db)
    .await
}

/// A Source's live Destinations, oldest first.
pub async fn of_source(
    db: impl PgExecutor<'_>,
    source_id: &str,
) -> Result<Vec<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT * FROM endpoints WHERE source_id = $1 AND deleted_at IS NULL ORDER BY id"#,
        source_id
    )
    .fetch_all(db)
    .await
}

/// A webhook endpoint (or a Source's Destination) to create; secrets and header values
/// arrive sealed.
pub struct NewEndpoint<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    pub sealed_secret: &'a str,
    pub enabled: bool,
    pub timeout_ms: i32,
    pub rate_limit_per_second: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub max_concurrency: Option<i32>,
    pub sealed_headers: serde_json::Value,
    /// The stored form of the endpoint's own retry waits (common/src/retry.rs).
    pub retry_delays: Option<String>,
    pub max_attempts: Option<i32>,
    pub source_id: Option<&'a str>,
    pub application_id: Option<&'a str>,
    pub channels: Option<&'a [String]>,
    pub uid: Option<&'a str>,
    pub metadata: serde_json::Value,
    /// `http`, or a broker kind with its settings shown and sealed.
    pub transport: &'a str,
    pub transport_settings: Option<serde_json::Value>,
    pub transport_secret: Option<String>,
    pub credentials: Credentials,
    pub routing: Routing,
}

/// A new endpoint's payload filter and transformation (both checked).
#[derive(Default, Clone)]
pub struct Routing {
    pub filter: Option<String>,
    pub transformation_code: Option<String>,
    pub transformation_enabled: bool,
}

/// A new endpoint's HTTP authentication and client certificate (mutual TLS): each shown
/// without its secret, and whole, sealed.
#[derive(Default, Clone)]
pub struct Credentials {
    pub authentication: Option<serde_json::Value>,
    pub authentication_secret: Option<String>,
    pub client_certificate: Option<serde_json::Value>,
    pub client_certificate_secret: Option<String>,
}

pub async fn insert(
    db: impl PgExecutor<'_>,
    e: NewEndpoint<'_>,
) -> Result<EndpointRow, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"INSERT INTO endpoints (id, project_id, url, description, secret, enabled, timeout_ms,
                                  rate_limit_per_second, max_concurrency, headers, retry_delays,
                                  max_attempts, rate_limit_burst, source_id, application_id,
                                  channels, uid, metadata, transport, transport_settings,
                                  transport_secret, authentication, authentication_secret,
                                  client_certificate, client_certificate_secret, filter,
                                  transformation_code, transformation_enabled,
                                  transformation_updated_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                   $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28,
                   CASE WHEN $27::text IS NULL THEN NULL ELSE now() END)
           RETURNING *"#,
        e.id,
        e.project_id,
        e.url,
        e.description,
        e.sealed_secret,
        e.enabled,
        e.timeout_ms,
        e.rate_limit_per_second,
        e.max_concurrency,
        e.sealed_headers,
        e.retry_delays,
        e.max_attempts,
        e.rate_limit_burst,
        e.source_id,
        e.application_id,
        e.channels,
        e.uid,
        e.metadata,
        e.transport,
        e.transport_settings,
        e.transport_secret,
        e.credentials.authentication,
        e.credentials.authentication_secret,
        e.credentials.client_certificate,
        e.credentials.client_certificate_secret,
        e.routing.filter,
        e.routing.transformation_code,
        e.routing.transformation_enabled
    )
    .fetch_one(db)
    .await
}

/// What a PATCH changes: `None` leaves a field; for the optional limits and the ladder,
/// `Some(None)` clears it.
#[derive(Default)]
pub struct EndpointChange<'a> {
    pub url: Option<&'a str>,
    pub description: Option<&'a str>,
    pub enabled: Option<bool>,
    pub timeout_ms: Option<i32>,
    pub rate_limit_per_second: Option<Option<i32>>,
    pub rate_limit_burst: Option<Option<i32>>,
    pub max_concurrency: Option<Option<i32>>,
    pub sealed_headers: Option<serde_json::Value>,
    pub retry_delays: Option<Option<String>>,
    pub max_attempts: Option<Option<i32>>,
    /// `Some(None)` clears the channels (the endpoint then hears every channel).
    pub channels: Option<Option<Vec<String>>>,
    pub uid: Option<Option<String>>,
    pub metadata: Option<serde_json::Value>,
    /// A broker endpoint's new settings: shown, and whole sealed (same kind).
    pub transport_settings: Option<serde_json::Value>,
    pub transport_secret: Option<String>,
    /// `Some(None)` removes the endpoint's authentication; `Some(Some((shown, sealed)))`
    /// replaces it.
    pub authentication: Option<Option<(serde_json::Value, String)>>,
    /// The same for the client certificate.
    pub client_certificate: Option<Option<(serde_json::Value, String)>>,
    /// `Some(None)` removes the payload filter; `Some(Some(f))` sets it (checked).
    pub filter: Option<Option<String>>,
    /// `Some(None)` removes the transformation; `Some(Some(code))` replaces its program.
    pub transformation_code: Option<Option<String>>,
    pub transformation_enabled: Option<bool>,
}

/// Applies `c` to the project's live webhook endpoint `id` (enabling it clears its disabled
/// reason); `None`: no such endpoint.
pub async fn update(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    c: EndpointChange<'_>,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    let channels = c.channels.clone().flatten();
    let (auth_shown, auth_sealed) = c.authentication.clone().flatten().unzip();
    let (cert_shown, cert_sealed) = c.client_certificate.clone().flatten().unzip();
    sqlx::query_as!(
        EndpointRow,
        r#"UPDATE endpoints SET
               url = coalesce($3, url),
               description = coalesce($4, description),
               enabled = coalesce($5, enabled),
               disabled_reason = CASE WHEN $5 IS TRUE THEN NULL ELSE disabled_reason END,
               timeout_ms = coalesce($6, timeout_ms),
               rate_limit_per_second = CASE WHEN $7 THEN $8 ELSE rate_limit_per_second END,
               max_concurrency = CASE WHEN $9 THEN $10 ELSE max_concurrency END,
               headers = coalesce($11, headers),
               retry_delays = CASE WHEN $12 THEN $13 ELSE retry_delays END,
               max_attempts = CASE WHEN $14 THEN $15 ELSE max_attempts END,
               rate_limit_burst = CASE WHEN $16 THEN $17 ELSE rate_limit_burst END,
               channels = CASE WHEN $18 THEN $19 ELSE channels END,
               uid = CASE WHEN $20 THEN $21 ELSE uid END,
               metadata = coalesce($22, metadata),
               transport_settings = coalesce($23, transport_settings),
               transport_secret = coalesce($24, transport_secret),
               authentication = CASE WHEN $25 THEN $26 ELSE authentication END,
               authentication_secret = CASE WHEN $25 THEN $27 ELSE authentication_secret END,
               client_certificate = CASE WHEN $28 THEN $29 ELSE client_certificate END,
               client_certificate_secret =
                   CASE WHEN $28 THEN $30 ELSE client_certificate_secret END,
               filter = CASE WHEN $31 THEN $32 ELSE filter END,
               transformation_code = CASE WHEN $33 THEN $34 ELSE transformation_code END,
               -- Removing the program turns it off; a new one keeps the switch as it was
               -- unless the change says otherwise.
               transformation_enabled = CASE WHEN $33 AND $34::text IS NULL THEN false
                                             ELSE coalesce($35, transformation_enabled) END,
               transformation_updated_at = CASE WHEN $33 OR $35 IS NOT NULL THEN now()
                                                ELSE transformation_updated_at END,
               transformation_last = CASE WHEN $33 THEN NULL ELSE transformation_last END,
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = 'webhook'
           RETURNING *"#,
        id,
        project_id,
        c.url,
        c.description,
        c.enabled,
        c.timeout_ms,
        c.rate_limit_per_second.is_some(),
        c.rate_limit_per_second.flatten(),
        c.max_concurrency.is_some(),
        c.max_concurrency.flatten(),
        c.sealed_headers,
        c.retry_delays.is_some(),
        c.retry_delays.flatten(),
        c.max_attempts.is_some(),
        c.max_attempts.flatten(),
        c.rate_limit_burst.is_some(),
        c.rate_limit_burst.flatten(),
        c.channels.is_some(),
        channels.as_deref(),
        c.uid.is_some(),
        c.uid.flatten(),
        c.metadata,
        c.transport_settings,
        c.transport_secret,
        c.authentication.is_some(),
        auth_shown,
        auth_sealed,
        c.client_certificate.is_some(),
        cert_shown,
        cert_sealed,
        c.filter.is_some(),
        c.filter.clone().flatten(),
        c.transformation_code.is_some(),
        c.transformation_code.clone().flatten(),
        c.transformation_enabled
    )
    .fetch_optional(db)
    .await
}

/// Deletes the project's live webhook endpoint `id` and its subscriptions, keeping the row
/// (its Deliveries and Attempts stay readable); false when there was none.
pub async fn delete(
    tx: &mut sqlx::PgConnection,
    id: &str,
    project_id: &str,
) -> Result<bool, sqlx::Error> {
    let deleted = sqlx::query!(
        "UPDATE endpoints SET deleted_at = now(), enabled = false, updated_at = now()
         WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = 'webhook'",
        id,
        project_id
    )
    .execute(&mut *tx)
    .await?;
    if deleted.rows_affected() == 0 {
        return Ok(false);
    }
    sqlx::query!(
        "UPDATE subscriptions SET deleted_at = now(), updated_at = now()
         WHERE endpoint_id = $1 AND deleted_at IS NULL",
        id
    )
    .execute(&mut *tx)
    .await?;
    Ok(true)
}

/// An endpoint's signing secrets as stored (sealed): the current one, and the previous one
/// while its rotation overlap lasts.
pub struct SealedSecrets {
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_expires_at: Option<DateTime<Utc>>,
}

/// The secrets of the project's live endpoint `id` of `kind`.
pub async fn secrets(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    kind: Kind,
) -> Result<Option<SealedSecrets>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT secret,
                  CASE WHEN previous_secret_expires_at > now() THEN previous_secret END AS previous_secret,
                  CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END AS previous_expires
           FROM endpoints WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = $3"#,
        id,
        project_id,
        kind.as_str()
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| SealedSecrets {
        secret: r.secret,
        previous_secret: r.previous_secret,
        previous_expires_at: r.previous_expires,
    }))
}

/// The current (sealed) secret of the project's live endpoint `id` of `kind`.
pub async fn current_secret(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    kind: Kind,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT secret FROM endpoints
         WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL AND kind = $3",
        id,
        project_id,
        kind.as_str()
    )
    .fetch_optional(db)
    .await
}

/// Rotation: `sealed_new` signs from now on and the current secret keeps signing beside it
/// for `overlap_secs`.
pub async fn rotate_secret(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    overlap_secs: f64,
    sealed_new: &str,
) -> Result<Option<SealedSecrets>, sqlx::Error> {
    let row = sqlx::query!(
        r#"UPDATE endpoints
           SET previous_secret = secret,
               previous_secret_expires_at = now() + make_interval(secs => $3),
               secret = $4, updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING secret, previous_secret, previous_secret_expires_at"#,
        id,
        project_id,
        overlap_secs,
        sealed_new
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| SealedSecrets {
        secret: r.secret,
        previous_secret: r.previous_secret,
        previous_expires_at: r.previous_secret_expires_at,
    }))
}

/// A webhook endpoint's state and its last 24 hours of Attempts.
pub struct HealthRow {
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub breaker_state: String,
    pub breaker_changed_at: Option<DateTime<Utc>>,
    pub consecutive_failures: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub disabled_at: Option<DateTime<Utc>>,
    pub attempts: i64,
    pub succeeded: i64,
}

pub async fn health(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
) -> Result<Option<HealthRow>, sqlx::Error> {
    sqlx::query_as!(
        HealthRow,
        r#"SELECT e.enabled, e.disabled_reason, e.breaker_state, e.breaker_changed_at,
                  e.consecutive_failures, e.failing_since, e.disabled_at,
                  count(a.id) AS "attempts!",
                  count(a.id) FILTER (WHERE a.outcome = 'SUCCEEDED') AS "succeeded!"
           FROM endpoints e
           LEFT JOIN deliveries d ON d.endpoint_id = e.id
           LEFT JOIN attempts a ON a.delivery_id = d.id AND a.started_at > now() - interval '24 hours'
           WHERE e.id = $1 AND e.project_id = $2 AND e.deleted_at IS NULL AND e.kind = 'webhook'
           GROUP BY e.id"#,
        id,
        project_id
    )
    .fetch_optional(db)
    .await
}

/// Enables or disables the project's live endpoint `id` (enabling clears its failure
/// streak; disabling keeps the first `disabled_at`).
pub async fn set_enabled(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    enabled: bool,
    reason: Option<&str>,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    sqlx::query_as!(
        EndpointRow,
        r#"UPDATE endpoints
           SET enabled = $3, disabled_reason = $4,
               disabled_at = CASE WHEN $3 THEN NULL ELSE coalesce(disabled_at, now()) END,
               consecutive_failures = CASE WHEN $3 THEN 0 ELSE consecutive_failures END,
               failing_since = CASE WHEN $3 THEN NULL ELSE failing_since END,
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING *"#,
        id,
        project_id,
        enabled,
        reason
    )
    .fetch_optional(db)
    .await
}
