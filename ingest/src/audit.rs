//! The audit log (docs/ACCESS.md): one append-only row per change, with who made it.
//!
//! Invariant: the row is written by the change's own transaction ([`record`] takes the
//! transaction's connection), so a change that commits has its row and a change that rolls
//! back (or is refused) has none. Nothing updates or deletes a row; retention drops whole
//! days (`audit_log` is day-partitioned on its id like the Events).
//!
//! Secrets never reach a row: [`redact`] replaces the value of every key whose name says
//! secret, and callers describe a secret's rotation or reveal by the action, not the value.

use railhook_common::ids::AuditEntryId;
use serde_json::Value;
use sqlx::PgConnection;

/// Who made a change.
#[derive(Debug, Clone)]
pub enum Actor {
    /// A project API key, named by its id and its visible prefix.
    Key { id: String, prefix: String },
    /// A person signed in to the dashboard with a key: the key, and that it was a person.
    DashboardKey { id: String, prefix: String },
    /// A person signed in through the identity provider (crate::sso).
    Person {
        subject: String,
        email: Option<String>,
    },
    /// The operator, with the admin token.
    Operator,
    /// A customer in the portal, named by the portal session id.
    Portal { session: String },
}

/// Every `actor_kind` a row can have (the table's CHECK lists the same words).
pub const ACTOR_KINDS: [&str; 4] = ["key", "person", "operator", "portal"];

impl Actor {
    fn kind(&self) -> &'static str {
        match self {
            Actor::Key { .. } => "key",
            Actor::DashboardKey { .. } | Actor::Person { .. } => "person",
            Actor::Operator => "operator",
            Actor::Portal { .. } => "portal",
        }
    }

    /// The name stored for the actor: never a secret (a key's prefix is what the API shows
    /// for it anyway).
    fn name(&self) -> String {
        match self {
            Actor::Key { id, prefix } => format!("{id} ({prefix}…)"),
            Actor::DashboardKey { id, prefix } => format!("dashboard via {id} ({prefix}…)"),
            Actor::Operator => "admin token".to_owned(),
            Actor::Portal { session } => session.clone(),
            Actor::Person { subject, .. } => subject.clone(),
        }
    }

    fn email(&self) -> Option<&str> {
        match self {
            Actor::Person { email, .. } => email.as_deref(),
            _ => None,
        }
    }
}

/// One change to write down.
pub struct Change<'a> {
    pub project_id: &'a str,
    /// `endpoint`, `subscription`, `event_type`, `api_key`, …
    pub object_kind: &'static str,
    pub object_id: Option<&'a str>,
    /// `create`, `update`, `delete`, `rotate_secret`, `reveal_secret`, `retry`, …
    pub action: &'static str,
    /// What changed; secrets are redacted before the write.
    pub changes: Value,
}

/// Writes `change` by `actor` on `conn`, which must be the change's own transaction.
pub async fn record(
    conn: &mut PgConnection,
    actor: &Actor,
    change: Change<'_>,
) -> Result<(), sqlx::Error> {
    let mut changes = change.changes;
    redact(&mut changes);
    let id = AuditEntryId::generate();
    let at = sqlx::query_scalar!(
        "INSERT INTO audit_log (id, project_id, actor_kind, actor, object_kind, object_id,
                                action, changes, actor_email)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING at",
        id.as_str(),
        change.project_id,
        actor.kind(),
        actor.name(),
        change.object_kind,
        change.object_id,
        change.action,
        changes,
        actor.email()
    )
    .fetch_one(&mut *conn)
    .await?;
    // And to an operational endpoint that asked for `audit.entry` (none by default: `*`
    // does not include it), in the same transaction: sent exactly when the change commits.
    let entry = serde_json::json!({
        "id": id.as_str(), "at": at, "actor_kind": actor.kind(), "actor": actor.name(),
        "actor_email": actor.email(), "object_kind": change.object_kind,
        "object_id": change.object_id, "action": change.action, "changes": changes,
    });
    crate::operational::emit(
        &mut *conn,
        change.project_id,
        crate::operational::Notice::AuditEntry(entry),
    )
    .await?;
    Ok(())
}

/// What changed between two views of an object (the API's own output shapes): each
/// top-level field whose value differs, as `{"field": {"from": …, "to": …}}`.
pub fn diff(before: &Value, after: &Value) -> Value {
    let (Some(b), Some(a)) = (before.as_object(), after.as_object()) else {
        return serde_json::json!({"from": before, "to": after});
    };
    let mut out = serde_json::Map::new();
    for (k, to) in a {
        let from = b.get(k).unwrap_or(&Value::Null);
        if from != to && k != "updated_at" {
            out.insert(k.clone(), serde_json::json!({"from": from, "to": to}));
        }
    }
    for (k, from) in b {
        if !a.contains_key(k) {
            out.insert(k.clone(), serde_json::json!({"from": from, "to": null}));
        }
    }
    Value::Object(out)
}

/// A view of `value` for a change record (serialisation of the API's own types cannot fail;
/// if one did, the record says so rather than losing the change).
pub fn view<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|_| serde_json::json!({"unrecorded": true}))
}

/// A change's transaction with its actor: the store writes go through [`Audited::conn`],
/// and [`Audited::commit`] writes the audit row and commits both. Dropped without a commit
/// (a refusal, an error), it rolls back and leaves no row.
pub struct Audited<'a> {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    actor: &'a Actor,
    project_id: &'a str,
}

impl<'a> Audited<'a> {
    pub async fn begin(
        pool: &sqlx::PgPool,
        actor: &'a Actor,
        project_id: &'a str,
    ) -> Result<Audited<'a>, sqlx::Error> {
        Ok(Audited {
            tx: pool.begin().await?,
            actor,
            project_id,
        })
    }

    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Records the change and commits it with the writes made through [`Audited::conn`].
    pub async fn commit(
        mut self,
        object_kind: &'static str,
        object_id: Option<&str>,
        action: &'static str,
        changes: Value,
    ) -> Result<(), sqlx::Error> {
        record(
            &mut self.tx,
            self.actor,
            Change {
                project_id: self.project_id,
                object_kind,
                object_id,
                action,
                changes,
            },
        )
        .await?;
        self.tx.commit().await
    }
}

/// Key names whose values are secrets wherever they appear in a change.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "secret",
        "password",
        "token",
        "key",
        "authorization",
        "credential",
        "private",
        "certificate",
        "headers",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Replaces every secret-named value (at any depth) with `"[redacted]"`.
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_secret_key(k) && !v.is_null() {
                    *v = Value::String("[redacted]".to_owned());
                } else {
                    redact(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_diff_names_only_what_changed() {
        let d = diff(
            &json!({"url": "a", "description": "x", "updated_at": 1}),
            &json!({"url": "b", "description": "x", "updated_at": 2}),
        );
        assert_eq!(d, json!({"url": {"from": "a", "to": "b"}}));
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let mut v = json!({
            "url": "https://example.com/hook",
            "secret": "whsec_abc",
            "authentication": {"type": "basic", "password": "hunter2"},
            "transport": [{"access_key_id": "AKIA", "region": "eu"}],
            "headers": {"X-Api-Key": "k"},
        });
        redact(&mut v);
        let text = v.to_string();
        for secret in ["whsec_abc", "hunter2", "AKIA", "\"k\""] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(v["url"], "https://example.com/hook");
        assert_eq!(v["transport"][0]["region"], "eu");
    }
}
