//! Subscriptions as ingest matches Events against them: a project's live subscriptions on
//! enabled endpoints, defined once in SQL (`railhook_live_subscriptions`, migration
//! 20261204000015) and read here for the key lookup of `POST /v1/events` (with the project,
//! in one round trip) and for the replay engine's planning.
//!
//! The subscription API's writes are in routes/subscriptions.rs.

use std::collections::HashMap;
use std::sync::Arc;

use railhook_common::EventTypePattern;
use sqlx::PgPool;

use crate::plan::Prepared;

/// A subscription that may match: its endpoint, its patterns, whether ordered.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub(crate) subscription_id: String,
    pub(crate) endpoint_id: String,
    pub(crate) patterns: Vec<EventTypePattern>,
    pub(crate) ordered: bool,
    /// The endpoint's application (`None`: a project endpoint) and channels.
    pub(crate) application_id: Option<String>,
    pub(crate) channels: Option<Vec<String>>,
    /// The endpoint's payload filter and the subscription's own (jsonpath text, each
    /// validated when stored: routes/filters.rs).
    pub(crate) endpoint_filter: Option<String>,
    pub(crate) subscription_filter: Option<String>,
}

impl Candidate {
    /// The filter a Delivery through this subscription must pass: the endpoint's and the
    /// subscription's together (`&&`), either alone, or none.
    pub(crate) fn filter(&self) -> Option<String> {
        match (&self.endpoint_filter, &self.subscription_filter) {
            (Some(e), Some(s)) => Some(format!("({e}) && ({s})")),
            (Some(one), None) | (None, Some(one)) => Some(one.clone()),
            (None, None) => None,
        }
    }
}

/// One snapshot of a project's live subscriptions, with what planning needs of it computed
/// once ([`Prepared`]): the sender cache keeps both for a second, so the requests of that
/// second share the work.
#[derive(Debug, Default)]
pub struct Subscriptions {
    candidates: Vec<Candidate>,
    prepared: Prepared,
}

impl Subscriptions {
    pub(crate) fn new(candidates: Vec<Candidate>) -> Self {
        let prepared = Prepared::new(&candidates);
        Self {
            candidates,
            prepared,
        }
    }

    /// The subscriptions `keep` keeps, prepared anew.
    pub(crate) fn only(&self, keep: impl Fn(&Candidate) -> bool) -> Self {
        Self::new(
            self.candidates
                .iter()
                .filter(|c| keep(c))
                .cloned()
                .collect(),
        )
    }

    pub(crate) fn prepared(&self) -> &Prepared {
        &self.prepared
    }
}

impl std::ops::Deref for Subscriptions {
    type Target = [Candidate];

    fn deref(&self) -> &[Candidate] {
        &self.candidates
    }
}

#[derive(serde::Deserialize)]
struct SubscriptionRow {
    id: String,
    endpoint_id: String,
    event_types: Vec<String>,
    ordered: bool,
    #[serde(default)]
    application_id: Option<String>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    endpoint_filter: Option<String>,
    #[serde(default)]
    filter: Option<String>,
}

/// Reads what `railhook_live_subscriptions` returns; `None` only if the database sent
/// something else.
fn parse(json: &str) -> Option<Subscriptions> {
    let rows: Vec<SubscriptionRow> = serde_json::from_str(json).ok()?;
    Some(Subscriptions::new(
        rows.into_iter()
            .map(|s| Candidate {
                subscription_id: s.id,
                endpoint_id: s.endpoint_id,
                // Patterns were validated when the subscription was stored.
                patterns: s
                    .event_types
                    .into_iter()
                    .map(EventTypePattern::from_trusted)
                    .collect(),
                ordered: s.ordered,
                application_id: s.application_id,
                channels: s.channels,
                endpoint_filter: s.endpoint_filter,
                subscription_filter: s.filter,
            })
            .collect(),
    ))
}

fn unreadable() -> sqlx::Error {
    sqlx::Error::Decode("unreadable subscriptions".into())
}

/// The project's live subscriptions on enabled endpoints.
pub(crate) async fn candidates(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
) -> Result<Subscriptions, sqlx::Error> {
    let json = sqlx::query_scalar!(
        r#"SELECT railhook_live_subscriptions($1) AS "json!""#,
        project_id
    )
    .fetch_one(db)
    .await?;
    parse(&json).ok_or_else(unreadable)
}

/// What `POST /v1/events` needs before it can write, for one API key (by its hash): the
/// project, its quota, its live subscriptions, and which of its event types have a schema
/// (name → schema id, `crate::schemas`). `None` for an unknown or revoked key.
#[derive(Clone)]
pub struct SenderRow {
    pub project_id: String,
    pub organization_id: String,
    pub monthly_quota: i64,
    pub key_id: String,
    pub prefix: String,
    pub role: String,
    pub application_id: Option<String>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub subscriptions: Arc<Subscriptions>,
    pub schemas: Arc<HashMap<String, i64>>,
}

/// Senders by key hash, for one second (docs/BENCHMARKS-HISTORY.md: with the lookup on every POST,
/// Postgres spent about a third of its time per Event on it).
///
/// What the second costs, on purpose: a key revoked, or a subscription or endpoint changed,
/// through another ingest replica is seen here up to one second later. On this replica a
/// change clears the cache at once (`invalidate`), so a client that changes a subscription
/// and then posts through the same process never sees the old one. Only `POST
/// /v1/events[/batch]` reads this cache (`auth::Sender`); every other route checks its key
/// in Postgres.
///
/// Beside the senders it keeps, for the same second, which application an Event's
/// `application` (an id or a uid) names in a project: found applications only, so a new
/// application is usable at once, and a deleted one's endpoints are gone from the senders'
/// subscriptions in the same write.
#[derive(Clone)]
pub struct SenderCache {
    senders: moka::sync::Cache<Vec<u8>, SenderRow>,
    applications: moka::sync::Cache<(String, String), String>,
}

impl Default for SenderCache {
    fn default() -> Self {
        let second = std::time::Duration::from_secs(1);
        Self {
            senders: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(second)
                .build(),
            applications: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(second)
                .build(),
        }
    }
}

impl SenderCache {
    pub(crate) fn get(&self, key_hash: &[u8]) -> Option<SenderRow> {
        self.senders.get(key_hash)
    }

    pub(crate) fn insert(&self, key_hash: Vec<u8>, row: SenderRow) {
        self.senders.insert(key_hash, row);
    }

    /// The id of the application `id_or_uid` names in `project`, if looked up this second.
    pub(crate) fn application(&self, project: &str, id_or_uid: &str) -> Option<String> {
        self.applications
            .get(&(project.to_owned(), id_or_uid.to_owned()))
    }

    pub(crate) fn remember_application(&self, project: &str, id_or_uid: &str, id: &str) {
        self.applications
            .insert((project.to_owned(), id_or_uid.to_owned()), id.to_owned());
    }

    /// Forgets every cached sender and application: called after any change to keys,
    /// applications, endpoints or subscriptions (rare next to Events, so clearing all is
    /// simpler than tracking which).
    pub fn invalidate(&self) {
        self.senders.invalidate_all();
        self.applications.invalidate_all();
    }
}

pub async fn sender(pool: &PgPool, key_hash: &[u8]) -> Result<Option<SenderRow>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT p.id AS project_id, p.organization_id, o.monthly_quota,
                  k.id AS key_id, k.prefix, k.role, k.application_id, k.expires_at,
                  railhook_live_subscriptions(p.id) AS "subscriptions!",
                  coalesce((SELECT json_object_agg(t.name, t.schema_id) FROM event_types t
                            WHERE t.project_id = p.id AND t.schema IS NOT NULL), '{}')::text
                      AS "schemas!"
           FROM api_keys k
           JOIN projects p ON p.id = k.project_id
           JOIN organizations o ON o.id = p.organization_id
           WHERE k.key_hash = $1 AND k.revoked_at IS NULL"#,
        key_hash
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(SenderRow {
        project_id: row.project_id,
        organization_id: row.organization_id,
        monthly_quota: row.monthly_quota,
        key_id: row.key_id,
        prefix: row.prefix,
        role: row.role,
        application_id: row.application_id,
        expires_at: row.expires_at,
        subscriptions: Arc::new(parse(&row.subscriptions).ok_or_else(unreadable)?),
        schemas: Arc::new(
            serde_json::from_str(&row.schemas)
                .map_err(|_| sqlx::Error::Decode("unreadable schemas".into()))?,
        ),
    }))
}

/// A subscription as stored and as the API shows it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Subscription {
    pub id: String,
    pub endpoint_id: String,
    /// Patterns such as `order.paid`, `order.*` (one segment) or `*` (everything).
    pub event_types: Vec<String>,
    /// Deliver in Sequence Number order (outgoing only).
    pub ordered: bool,
    /// A SQL/JSON path predicate on the payload, beside the endpoint's own (docs/ROUTING.md).
    pub filter: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// A new subscription of the project's endpoint `endpoint_id` to `patterns`. The endpoint
/// must be the project's live webhook endpoint and not a Source's Destination (those
/// receive only their Source's webhooks): `None` otherwise.
pub async fn insert(
    db: impl sqlx::PgExecutor<'_>,
    id: &str,
    project_id: &str,
    endpoint_id: &str,
    patterns: &[String],
    ordered: bool,
    filter: Option<&str>,
) -> Result<Option<Subscription>, sqlx::Error> {
    sqlx::query_as!(
        Subscription,
        r#"INSERT INTO subscriptions (id, project_id, endpoint_id, event_types, ordered, filter)
           SELECT $1, $2, e.id, $4, $5, $6 FROM endpoints e
           WHERE e.id = $3 AND e.project_id = $2 AND e.deleted_at IS NULL AND e.kind = 'webhook'
             AND e.source_id IS NULL
           RETURNING id, endpoint_id, event_types, ordered, filter, created_at, updated_at"#,
        id,
        project_id,
        endpoint_id,
        patterns,
        ordered,
        filter
    )
    .fetch_optional(db)
    .await
}

/// A page of the project's live subscriptions (of one endpoint, if given), newest first.
pub async fn page(
    pool: &PgPool,
    project_id: &str,
    endpoint_id: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Subscription>, sqlx::Error> {
    sqlx::query_as!(
        Subscription,
        r#"SELECT id, endpoint_id, event_types, ordered, filter, created_at, updated_at
           FROM subscriptions
           WHERE project_id = $1 AND deleted_at IS NULL
             AND ($2::text IS NULL OR endpoint_id = $2)
             AND ($3::text IS NULL OR id < $3)
           ORDER BY id DESC LIMIT $4"#,
        project_id,
        endpoint_id,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The event-type patterns of the live subscriptions of each of `endpoint_ids`, one
/// statement for a page of endpoints (issue #55: the Svix endpoint views read a page's
/// subscriptions at once, not one query per endpoint). An endpoint with none is absent. At
/// most [`PATTERNS_PER_ENDPOINT`] subscriptions an endpoint, the newest, as the one-endpoint
/// read before it took: a tenant with thousands of subscriptions on one endpoint does not
/// make a page of them cost thousands of rows each.
/// The subscriptions [`event_types_by_endpoint`] reads per endpoint.
pub const PATTERNS_PER_ENDPOINT: i64 = 100;

pub async fn event_types_by_endpoint(
    pool: &PgPool,
    project_id: &str,
    endpoint_ids: &[String],
) -> Result<HashMap<String, Vec<String>>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT s.endpoint_id AS "endpoint_id!", s.event_types AS "event_types!"
           FROM (SELECT endpoint_id, event_types,
                        row_number() OVER (PARTITION BY endpoint_id ORDER BY id DESC) AS nth
                 FROM subscriptions
                 WHERE project_id = $1 AND deleted_at IS NULL AND endpoint_id = ANY($2)) AS s
           WHERE s.nth <= $3"#,
        project_id,
        endpoint_ids,
        PATTERNS_PER_ENDPOINT
    )
    .fetch_all(pool)
    .await?;
    let mut by_endpoint: HashMap<String, Vec<String>> = HashMap::new();
    for r in rows {
        by_endpoint
            .entry(r.endpoint_id)
            .or_default()
            .extend(r.event_types);
    }
    Ok(by_endpoint)
}

pub async fn find(
    db: impl sqlx::PgExecutor<'_>,
    id: &str,
    project_id: &str,
) -> Result<Option<Subscription>, sqlx::Error> {
    sqlx::query_as!(
        Subscription,
        r#"SELECT id, endpoint_id, event_types, ordered, filter, created_at, updated_at
           FROM subscriptions WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL"#,
        id,
        project_id
    )
    .fetch_optional(db)
    .await
}

/// Changes the patterns, the ordering flag and the filter (`Some(None)`: removed) where
/// given.
pub async fn update(
    db: impl sqlx::PgExecutor<'_>,
    id: &str,
    project_id: &str,
    patterns: Option<&[String]>,
    ordered: Option<bool>,
    filter: Option<Option<&str>>,
) -> Result<Option<Subscription>, sqlx::Error> {
    sqlx::query_as!(
        Subscription,
        r#"UPDATE subscriptions
           SET event_types = coalesce($3, event_types), ordered = coalesce($4, ordered),
               filter = CASE WHEN $5 THEN $6 ELSE filter END,
               updated_at = now()
           WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
           RETURNING id, endpoint_id, event_types, ordered, filter, created_at, updated_at"#,
        id,
        project_id,
        patterns,
        ordered,
        filter.is_some(),
        filter.flatten()
    )
    .fetch_optional(db)
    .await
}

/// Whether the project had a live subscription `id` to delete.
pub async fn delete(
    db: impl sqlx::PgExecutor<'_>,
    id: &str,
    project_id: &str,
) -> Result<bool, sqlx::Error> {
    let deleted = sqlx::query!(
        "UPDATE subscriptions SET deleted_at = now(), updated_at = now()
         WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL",
        id,
        project_id
    )
    .execute(db)
    .await?;
    Ok(deleted.rows_affected() > 0)
}

/// Gives the endpoint's newest live subscription the event types `patterns`, deletes its
/// other live ones, and makes one if it has none: the single filter the Svix surface and
/// the portal show as an endpoint's event types. One statement, inside the caller's
/// transaction (crate::endpoint: the endpoint's change and its subscription commit
/// together). The endpoint must be a live webhook endpoint and not a Source's Destination;
/// the caller has already written or locked it.
pub async fn set_only(
    tx: &mut sqlx::PgConnection,
    project_id: &str,
    endpoint_id: &str,
    patterns: &[String],
) -> Result<(), sqlx::Error> {
    let id = railhook_common::ids::SubscriptionId::generate();
    sqlx::query!(
        r#"WITH live AS (
               SELECT id FROM subscriptions
               WHERE project_id = $1 AND endpoint_id = $2 AND deleted_at IS NULL
           ), kept AS (
               SELECT max(id) AS id FROM live HAVING count(*) > 0
           ), changed AS (
               UPDATE subscriptions s SET event_types = $4, updated_at = now()
               FROM kept WHERE s.id = kept.id
               RETURNING s.id
           ), dropped AS (
               UPDATE subscriptions s SET deleted_at = now(), updated_at = now()
               FROM live WHERE s.id = live.id AND s.id <> (SELECT id FROM kept)
               RETURNING s.id
           )
           INSERT INTO subscriptions (id, project_id, endpoint_id, event_types, ordered, filter)
           SELECT $3, e.project_id, e.id, $4, false, NULL FROM endpoints e
           WHERE e.id = $2 AND e.project_id = $1 AND e.deleted_at IS NULL AND e.kind = 'webhook'
             AND e.source_id IS NULL AND NOT EXISTS (SELECT 1 FROM kept)"#,
        project_id,
        endpoint_id,
        id.as_str(),
        patterns
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}
