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

/// A subscription that may match: its endpoint, its patterns, whether ordered.
pub struct Candidate {
    pub(crate) subscription_id: String,
    pub(crate) endpoint_id: String,
    pub(crate) patterns: Vec<EventTypePattern>,
    pub(crate) ordered: bool,
}

#[derive(serde::Deserialize)]
struct SubscriptionRow {
    id: String,
    endpoint_id: String,
    event_types: Vec<String>,
    ordered: bool,
}

/// Reads what `railhook_live_subscriptions` returns; `None` only if the database sent
/// something else.
fn parse(json: &str) -> Option<Vec<Candidate>> {
    let rows: Vec<SubscriptionRow> = serde_json::from_str(json).ok()?;
    Some(
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
            })
            .collect(),
    )
}

fn unreadable() -> sqlx::Error {
    sqlx::Error::Decode("unreadable subscriptions".into())
}

/// The project's live subscriptions on enabled endpoints.
pub(crate) async fn candidates(
    db: impl sqlx::PgExecutor<'_>,
    project_id: &str,
) -> Result<Vec<Candidate>, sqlx::Error> {
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
    pub subscriptions: Arc<Vec<Candidate>>,
    pub schemas: Arc<HashMap<String, i64>>,
}

/// Senders by key hash, for one second (docs/BENCHMARKS.md: with the lookup on every POST,
/// Postgres spent about a third of its time per Event on it).
///
/// What the second costs, on purpose: a key revoked, or a subscription or endpoint changed,
/// through another ingest replica is seen here up to one second later. On this replica a
/// change clears the cache at once (`invalidate`), so a client that changes a subscription
/// and then posts through the same process never sees the old one. Only `POST
/// /v1/events[/batch]` reads this cache (`auth::Sender`); every other route checks its key
/// in Postgres.
#[derive(Clone)]
pub struct SenderCache(moka::sync::Cache<Vec<u8>, SenderRow>);

impl Default for SenderCache {
    fn default() -> Self {
        Self(
            moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(std::time::Duration::from_secs(1))
                .build(),
        )
    }
}

impl SenderCache {
    pub(crate) fn get(&self, key_hash: &[u8]) -> Option<SenderRow> {
        self.0.get(key_hash)
    }

    pub(crate) fn insert(&self, key_hash: Vec<u8>, row: SenderRow) {
        self.0.insert(key_hash, row);
    }

    /// Forgets every cached sender: called after any change to keys, endpoints or
    /// subscriptions (rare next to Events, so clearing all is simpler than tracking which).
    pub fn invalidate(&self) {
        self.0.invalidate_all();
    }
}

pub async fn sender(pool: &PgPool, key_hash: &[u8]) -> Result<Option<SenderRow>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT p.id AS project_id, p.organization_id, o.monthly_quota,
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
        subscriptions: Arc::new(parse(&row.subscriptions).ok_or_else(unreadable)?),
        schemas: Arc::new(
            serde_json::from_str(&row.schemas)
                .map_err(|_| sqlx::Error::Decode("unreadable schemas".into()))?,
        ),
    }))
}
