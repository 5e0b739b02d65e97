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
//!
//! **One tenant's schema cannot stop the API** (review #34 item 2). A schema is a program a
//! tenant hands us to run on every Event of its type, so its cost is bounded three ways:
//! - `pattern` and `patternProperties` run on the `regex` crate's engine, whose matching time
//!   is linear in the input, never on a backtracking one (a pattern that needs backtracking —
//!   look-around, back-references — is refused when the schema is stored, with the compiled
//!   size capped at [`PATTERN_SIZE_LIMIT`]), and a schema has at most [`MAX_PATTERNS`];
//! - validation runs on the blocking pool, never on the runtime's threads that serve every
//!   other request and (under `railhook all`) the relay and the worker, at most
//!   [`VALIDATION_SLOTS`] at once, and a request whose validation has not answered within
//!   [`VALIDATION_DEADLINE`] is refused with 422 `schema_too_slow` (nothing written);
//! - the compiled validators are cached by their schema's size in bytes, up to
//!   [`CACHE_BYTES`], not by count.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use railhook_common::fair_slots::FairSlots;
use serde_json::Value;
use sqlx::PgPool;

use crate::problem::{ApiError, ApiResult};

/// The most `pattern` and `patternProperties` entries a schema may hold.
pub const MAX_PATTERNS: usize = 64;
/// The most bytes one compiled pattern may take (the `regex` crate's size limit); a pattern
/// that compiles larger (`(a{1000}){1000}`) is refused when its schema is stored.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// How long one validation may run once it has its slot (issue #53: the deadline had
/// included the wait for a slot, so another tenant's heavy schema turned this tenant's
/// Events into a non-retryable `schema_too_slow`).
pub const VALIDATION_DEADLINE: Duration = Duration::from_millis(500);
/// How long a validation may wait for its slots: past it the request is a `503` to retry
/// (the service is busy), never a verdict on the payload.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Validations running at once on the blocking pool, across every tenant.
pub const VALIDATION_SLOTS: usize = 4;
/// Validations one project may run at once: half the slots, so however costly one project's
/// schemas and payloads are, another project always finds a slot free of them.
pub const PROJECT_SLOTS: usize = VALIDATION_SLOTS / 2;
/// The compiled validators kept, weighed by the size of their schemas' JSON text.
pub const CACHE_BYTES: u64 = 64 << 20;

/// One slot per running validation, at most [`PROJECT_SLOTS`] to one project
/// (common/src/fair_slots.rs): a flood of costly payloads queues behind its own project's
/// validations (and meets its deadline) instead of taking every thread of the blocking pool.
static SLOTS: LazyLock<FairSlots> =
    LazyLock::new(|| FairSlots::new(VALIDATION_SLOTS, PROJECT_SLOTS));

/// A compiled schema and the bytes it is weighed by in the cache.
struct Compiled {
    validator: jsonschema::Validator,
    bytes: u32,
}

/// Compiled validators by `schema_id`.
#[derive(Clone)]
pub struct SchemaCache(moka::sync::Cache<i64, Arc<Compiled>>);

impl Default for SchemaCache {
    fn default() -> Self {
        Self(
            moka::sync::Cache::builder()
                .max_capacity(CACHE_BYTES)
                .weigher(|_, c: &Arc<Compiled>| c.bytes)
                .build(),
        )
    }
}

/// How many `pattern` and `patternProperties` entries a schema holds, anywhere in it.
fn patterns(schema: &Value) -> usize {
    match schema {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                let own = match (k.as_str(), v) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(p)) => p.len(),
                    _ => 0,
                };
                own + patterns(v)
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns).sum(),
        _ => 0,
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
    let n = patterns(schema);
    if n > MAX_PATTERNS {
        return Err(format!(
            "schema has {n} patterns; the limit is {MAX_PATTERNS}"
        ));
    }
    jsonschema::draft202012::options()
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(PATTERN_SIZE_LIMIT)
                .dfa_size_limit(PATTERN_SIZE_LIMIT),
        )
        .build(schema)
        .map_err(|e| {
            format!(
                "schema cannot be used: {e} (patterns run on a linear-time engine: look-around and back-references are not supported)"
            )
        })
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
    async fn validator(&self, pool: &PgPool, schema_id: i64) -> ApiResult<Option<Arc<Compiled>>> {
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
        let bytes = u32::try_from(schema.to_string().len()).unwrap_or(u32::MAX);
        let validator = match compile(&schema) {
            Ok(validator) => Arc::new(Compiled { validator, bytes }),
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
        project: &str,
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
            let field = format!("{}payload", prefix(i));
            if let Some((at, rule)) = validate(validator, project, raw.to_owned(), &field).await? {
                return Err(ApiError::SchemaViolation {
                    field,
                    detail: format!(
                        "payload does not match the schema of '{}' at {}: {}",
                        event_type,
                        place(&at),
                        rule
                    ),
                    pointer: at,
                });
            }
        }
        Ok(())
    }
}

/// Validates one payload (JSON text) on the blocking pool, within [`VALIDATION_DEADLINE`]
/// from the moment it holds a slot of its project's and one of the pool's. Returns the first
/// failure's pointer and rule. A validation past its deadline is answered `schema_too_slow`
/// at once; its thread finishes on its own (the engine is linear-time, so it does) and then
/// gives its slots back. No slot within [`SLOT_WAIT`]: `503`, to retry.
async fn validate(
    compiled: Arc<Compiled>,
    project: &str,
    raw: String,
    field: &str,
) -> ApiResult<Option<(String, String)>> {
    let Ok(slot) = tokio::time::timeout(SLOT_WAIT, SLOTS.acquire(project)).await else {
        return Err(ApiError::TimedOut);
    };
    let run = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        // Already parsed once as JSON by the request extractor; a second, typed parse
        // only for Events that have a schema.
        let payload: Value = serde_json::from_str(&raw).map_err(|e| e.to_string())?;
        Ok::<_, String>(
            compiled
                .validator
                .iter_errors(&payload)
                .next()
                .map(|e| (pointer(&e), keyword_message(&e))),
        )
    });
    match tokio::time::timeout(VALIDATION_DEADLINE, run).await {
        Ok(Ok(Ok(failure))) => Ok(failure),
        Ok(Ok(Err(parse))) => Err(ApiError::validation(field, parse)),
        // The validation thread panicked: the catalogue's engine failed, not the sender.
        Ok(Err(_)) => Err(ApiError::Internal(crate::problem::InternalError::Fault(
            "schema validation panicked",
        ))),
        Err(_) => Err(ApiError::SchemaTooSlow {
            field: field.to_owned(),
        }),
    }
}

/// What failed, by the schema's rule, without quoting the payload's values (problem bodies
/// never carry payload content).
fn keyword_message(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.schema_path().to_string();
    let keyword = path.rsplit('/').next().unwrap_or_default();
    format!("the schema's \"{keyword}\" rule ({path}) is not met")
}
