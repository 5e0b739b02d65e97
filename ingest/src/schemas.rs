//! Payload contracts: the JSON Schemas of the event-type catalogue (`/v1/event-types`),
//! compiled once per schema and checked against every Event of that type at the door.
//!
//! Invariant: an Event whose type has a schema in its project is stored only if its payload
//! validates; a payload that does not is refused with 422 `schema_violation` before anything
//! is written (the check runs before the ingest transaction), naming the failing JSON
//! Pointer. Without this, a bad payload would be accepted with a 201 and delivered to every
//! subscriber, and the contract would only be a document.
//!
//! Which types have a schema comes with the sender (`auth::Sender`, one query with the key,
//! cached for a second and cleared by any write on this replica), as `name → schema_id`.
//! `schema_id` is never reused (a sequence, migration 20261204000012), so the compiled
//! validators are cached by it without expiry: a changed schema has a new id, and the old
//! entry simply ages out of the LRU.
//!
//! Schemas are draft 2020-12, compiled without any resolver that could fetch: a `$ref` to a
//! URL is refused when the schema is stored (the catalogue must not make the API an HTTP
//! client; see the SSRF guard in the worker).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use sqlx::PgPool;

use crate::problem::{ApiError, ApiResult};

/// Compiled validators by `schema_id`.
#[derive(Clone)]
pub struct SchemaCache(moka::sync::Cache<i64, Arc<jsonschema::Validator>>);

impl Default for SchemaCache {
    fn default() -> Self {
        Self(moka::sync::Cache::builder().max_capacity(10_000).build())
    }
}

/// Compiles a schema as the catalogue stores it: valid against the draft 2020-12
/// meta-schema, with no reference that would need a fetch. The error says why, in words
/// that quote only the schema.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    if !schema.is_object() {
        return Err("schema must be a JSON object".into());
    }
    jsonschema::draft202012::meta::validate(schema).map_err(|e| {
        format!(
            "schema is not valid draft 2020-12 at {}: {e}",
            place(&pointer(&e))
        )
    })?;
    jsonschema::draft202012::options()
        .build(schema)
        .map_err(|e| format!("schema cannot be used: {e}"))
}

/// The failing value's JSON Pointer (RFC 6901: `""` is the whole document).
fn pointer(e: &jsonschema::ValidationError<'_>) -> String {
    e.instance_path().to_string()
}

/// A pointer as words: the root has an empty pointer.
fn place(pointer: &str) -> &str {
    if pointer.is_empty() {
        "the top level"
    } else {
        pointer
    }
}

impl SchemaCache {
    async fn validator(
        &self,
        pool: &PgPool,
        schema_id: i64,
    ) -> ApiResult<Option<Arc<jsonschema::Validator>>> {
        if let Some(v) = self.0.get(&schema_id) {
            return Ok(Some(v));
        }
        let stored = sqlx::query_scalar!(
            "SELECT schema FROM event_types WHERE schema_id = $1",
            schema_id
        )
        .fetch_optional(pool)
        .await?
        .flatten();
        // Gone since the sender was read (deleted or changed within its second): the type
        // has no schema any more, or a newer one the next sender read will name.
        let Some(schema) = stored else {
            return Ok(None);
        };
        let validator = match compile(&schema) {
            Ok(v) => Arc::new(v),
            Err(e) => {
                // Stored schemas were compiled when written; one that no longer compiles
                // (a validator upgrade) must not block the type's Events.
                tracing::error!(schema_id, error = %e, "stored schema does not compile; not enforced");
                return Ok(None);
            }
        };
        self.0.insert(schema_id, validator.clone());
        Ok(Some(validator))
    }

    /// Checks each Event whose type has a schema (`schemas`: type name → schema id;
    /// `parts`: an Event's type and its payload as JSON text). The first failure is the answer; `prefix(i)` names item `i` in it (`events[3].`), and is
    /// only called for a failure, so a request whose types have no schema allocates nothing.
    pub async fn check<E>(
        &self,
        pool: &PgPool,
        schemas: &HashMap<String, i64>,
        events: &[E],
        parts: impl Fn(&E) -> (&str, &str),
        prefix: impl Fn(usize) -> String,
    ) -> ApiResult<()> {
        if schemas.is_empty() {
            return Ok(());
        }
        for (i, (event_type, raw)) in events.iter().map(parts).enumerate() {
            let Some(&id) = schemas.get(event_type) else {
                continue;
            };
            let Some(validator) = self.validator(pool, id).await? else {
                continue;
            };
            // Already parsed once as JSON by the request extractor; a second, typed parse
            // only for Events that have a schema.
            let payload: Value = serde_json::from_str(raw).map_err(|e| {
                ApiError::validation(format!("{}payload", prefix(i)), e.to_string())
            })?;
            if let Some(e) = validator.iter_errors(&payload).next() {
                let at = pointer(&e);
                return Err(ApiError::SchemaViolation {
                    field: format!("{}payload", prefix(i)),
                    detail: format!(
                        "payload does not match the schema of '{}' at {}: {}",
                        event_type,
                        place(&at),
                        keyword_message(&e)
                    ),
                    pointer: at,
                });
            }
        }
        Ok(())
    }
}

/// What failed, by the schema's rule, without quoting the payload's values (problem bodies
/// never carry payload content).
fn keyword_message(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.schema_path().to_string();
    let keyword = path.rsplit('/').next().unwrap_or_default();
    format!("the schema's \"{keyword}\" rule ({path}) is not met")
}
