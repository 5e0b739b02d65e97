//! Endpoints as every reader and writer sees them: [`EndpointRow`] is the `endpoints` row,
//! column for column, so each statement reads or returns `*` and no column list is written
//! anywhere (a column added to the table is a compile error here until the row has it).
//! The API's view of a row is `routes::endpoints::Endpoint` (with the signing scheme read
//! from the sealed secret); the operational endpoints' view is in
//! routes/operational_endpoints.rs; the dashboard lists what [`of_project`] returns.
//!
//! The endpoint's own create and change ([`insert`], [`update`]) bind their values by column
//! name, as one record (issue #55 item 2: a column added to the table is added to the
//! record's struct and to the statement's list, both by name, in this file). Writes with
//! rules of their own stay with their callers (crate::endpoint checks and calls these;
//! enable and disable with a reason in routes/endpoint_state.rs; the worker's streak and
//! breaker in the Fence); each returns the row through `RETURNING *`.

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
    /// `rabbitmq`, `nats` or `poller`.
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
/// arrive sealed. Each field is named as its column (serde's name where the Rust name says
/// more), and [`insert`] binds the whole value as one record by those names: no column is
/// matched to a position.
#[derive(serde::Serialize)]
pub struct NewEndpoint<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    #[serde(rename = "secret")]
    pub sealed_secret: &'a str,
    pub enabled: bool,
    pub timeout_ms: i32,
    pub rate_limit_per_second: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub max_concurrency: Option<i32>,
    #[serde(rename = "headers")]
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
    #[serde(flatten)]
    pub credentials: Credentials,
    #[serde(flatten)]
    pub routing: Routing,
}

/// A new endpoint's payload filter and transformation (both checked).
#[derive(Default, Clone, serde::Serialize)]
pub struct Routing {
    pub filter: Option<String>,
    pub transformation_code: Option<String>,
    pub transformation_enabled: bool,
}

/// A new endpoint's HTTP authentication and client certificate (mutual TLS): each shown
/// without its secret, and whole, sealed.
#[derive(Default, Clone, serde::Serialize)]
pub struct Credentials {
    pub authentication: Option<serde_json::Value>,
    pub authentication_secret: Option<String>,
    pub client_certificate: Option<serde_json::Value>,
    pub client_certificate_secret: Option<String>,
}

/// Inserts `e`. The record `n` is `e` read by column name into the table's own row type
/// (`jsonb_populate_record`); a column `e` does not name keeps its default.
pub async fn insert(
    db: impl PgExecutor<'_>,
    e: NewEndpoint<'_>,
) -> Result<EndpointRow, sqlx::Error> {
    let record = serde_json::to_value(&e).map_err(|err| sqlx::Error::Encode(Box::new(err)))?;
    sqlx::query_as!(
        EndpointRow,
        r#"INSERT INTO endpoints (id, project_id, url, description, secret, enabled, timeout_ms,
                                  rate_limit_per_second, rate_limit_burst, max_concurrency,
                                  headers, retry_delays, max_attempts, source_id,
                                  application_id, channels, uid, metadata, transport,
                                  transport_settings, transport_secret, authentication,
                                  authentication_secret, client_certificate,
                                  client_certificate_secret, filter, transformation_code,
                                  transformation_enabled, transformation_updated_at)
           SELECT n.id, n.project_id, n.url, n.description, n.secret, n.enabled, n.timeout_ms,
                  n.rate_limit_per_second, n.rate_limit_burst, n.max_concurrency,
                  n.headers, n.retry_delays, n.max_attempts, n.source_id,
                  n.application_id, n.channels, n.uid, n.metadata, n.transport,
                  n.transport_settings, n.transport_secret, n.authentication,
                  n.authentication_secret, n.client_certificate,
                  n.client_certificate_secret, n.filter, n.transformation_code,
                  n.transformation_enabled,
                  CASE WHEN n.transformation_code IS NULL THEN NULL ELSE now() END
           FROM jsonb_populate_record(NULL::endpoints, $1) AS n
           RETURNING *"#,
        record
    )
    .fetch_one(db)
    .await
}

/// What a PATCH changes: `None` leaves a field; for the optional ones, `Some(None)` clears
/// it. Fields are named as their columns; [`update`] sends the change as one record whose
/// absent keys leave their columns as they are (no column is matched to a position).
#[derive(Default, serde::Serialize)]
pub struct EndpointChange<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_second: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_burst: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "headers")]
    pub sealed_headers: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_delays: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<Option<i32>>,
    /// `Some(None)` clears the channels (the endpoint then hears every channel).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<Option<Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// A broker endpoint's new settings: shown, and whole sealed (same kind).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_settings: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_secret: Option<String>,
    /// `Some(None)` removes the endpoint's authentication; `Some(Some((shown, sealed)))`
    /// replaces it (the columns `authentication` and `authentication_secret`).
    #[serde(skip)]
    pub authentication: Option<Option<(serde_json::Value, String)>>,
    /// The same for the client certificate.
    #[serde(skip)]
    pub client_certificate: Option<Option<(serde_json::Value, String)>>,
    /// `Some(None)` removes the payload filter; `Some(Some(f))` sets it (checked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Option<String>>,
    /// `Some(None)` removes the transformation; `Some(Some(code))` replaces its program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transformation_code: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transformation_enabled: Option<bool>,
}

/// The record [`update`] sends: the change, and the columns its rules derive.
#[derive(serde::Serialize)]
struct Patch<'a> {
    #[serde(flatten)]
    change: EndpointChange<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    authentication_secret: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_certificate_secret: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "authentication")]
    authentication_shown: Option<Option<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "client_certificate")]
    client_certificate_shown: Option<Option<serde_json::Value>>,
    /// Enabling clears the disabled reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transformation_updated_at: Option<DateTime<Utc>>,
    /// A new program (or none) forgets the last run of the old one.
    #[serde(skip_serializing_if = "Option::is_none")]
    transformation_last: Option<Option<serde_json::Value>>,
}

impl<'a> Patch<'a> {
    fn of(mut change: EndpointChange<'a>) -> Self {
        let (authentication_shown, authentication_secret) = split(change.authentication.take());
        let (client_certificate_shown, client_certificate_secret) =
            split(change.client_certificate.take());
        let code_changed = change.transformation_code.is_some();
        // Removing the program turns it off; a new one keeps the switch as it was unless
        // the change says otherwise.
        if matches!(change.transformation_code, Some(None)) {
            change.transformation_enabled = Some(false);
        }
        let transformation_touched = code_changed || change.transformation_enabled.is_some();
        Self {
            disabled_reason: (change.enabled == Some(true)).then_some(None),
            transformation_updated_at: transformation_touched.then(Utc::now),
            transformation_last: code_changed.then_some(None),
            authentication_shown,
            authentication_secret,
            client_certificate_shown,
            client_certificate_secret,
            change,
        }
    }
}

/// A credential change as its two columns' changes.
type ColumnChange<T> = Option<Option<T>>;
fn split(
    c: Option<Option<(serde_json::Value, String)>>,
) -> (ColumnChange<serde_json::Value>, ColumnChange<String>) {
    match c {
        None => (None, None),
        Some(None) => (Some(None), Some(None)),
        Some(Some((shown, sealed))) => (Some(Some(shown)), Some(Some(sealed))),
    }
}

/// Applies `c` to the project's live webhook endpoint `id` (enabling it clears its disabled
/// reason); `None`: no such endpoint. `p` is the stored row with the change's keys laid
/// over it (`jsonb_populate_record`: a key the change does not name keeps its column), so
/// each column below is set to itself unless the change names it.
pub async fn update(
    db: impl PgExecutor<'_>,
    id: &str,
    project_id: &str,
    c: EndpointChange<'_>,
) -> Result<Option<EndpointRow>, sqlx::Error> {
    let patch =
        serde_json::to_value(Patch::of(c)).map_err(|err| sqlx::Error::Encode(Box::new(err)))?;
    sqlx::query_as!(
        EndpointRow,
        r#"UPDATE endpoints e SET
               url = p.url,
               description = p.description,
               enabled = p.enabled,
               disabled_reason = p.disabled_reason,
               timeout_ms = p.timeout_ms,
               rate_limit_per_second = p.rate_limit_per_second,
               rate_limit_burst = p.rate_limit_burst,
               max_concurrency = p.max_concurrency,
               headers = p.headers,
               retry_delays = p.retry_delays,
               max_attempts = p.max_attempts,
               channels = p.channels,
               uid = p.uid,
               metadata = p.metadata,
               transport_settings = p.transport_settings,
               transport_secret = p.transport_secret,
               authentication = p.authentication,
               authentication_secret = p.authentication_secret,
               client_certificate = p.client_certificate,
               client_certificate_secret = p.client_certificate_secret,
               filter = p.filter,
               transformation_code = p.transformation_code,
               transformation_enabled = p.transformation_enabled,
               transformation_updated_at = p.transformation_updated_at,
               transformation_last = p.transformation_last,
               updated_at = now()
           FROM endpoints cur, jsonb_populate_record(cur, $3) AS p
           WHERE e.id = $1 AND e.project_id = $2 AND e.deleted_at IS NULL AND e.kind = 'webhook'
             AND cur.id = e.id
           RETURNING e.*"#,
        id,
        project_id,
        patch
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
