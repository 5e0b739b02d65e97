//! Railhook's shared domain: what every role (ingest, relay, worker) agrees on.
//!
//! Values are parsed at the edge into the newtypes defined here; inside the system a value
//! that exists is valid. Module names follow the product vocabulary (see
//! `docs/ARCHITECTURE.md`).

pub mod announcement;
pub mod config;
pub mod db;
pub mod doorbell;
pub mod endpoint_auth;
pub mod event_type;
pub mod fair_slots;
pub mod headers;
pub mod health;
#[cfg(feature = "http")]
pub mod http_server;
pub mod ids;
pub mod kafka;
pub mod kafka_producer;
pub mod keygen;
pub mod metrics_http;
#[cfg(feature = "http")]
mod metrics_server;
pub mod names;
pub mod postgres_url;
#[cfg(feature = "redis")]
pub mod redis_client;
pub mod retention;
pub mod retry;
pub mod retry_hint;
pub mod sealing;
pub mod signing;
pub mod slot_status;
pub mod status;
pub mod telemetry;
pub mod text;
pub mod trace_context;
#[cfg(feature = "transformation")]
pub mod transformation;
pub mod transport;
pub mod vocabulary;

pub use event_type::{EventType, EventTypePattern};
pub use status::{AttemptOutcome, DeliveryStatus, OutboxReason};
pub use vocabulary::Word;

/// Installs the process's rustls crypto provider (ring), once; later calls do nothing.
///
/// Three crates in the tree build rustls configurations from the process default rather
/// than naming a provider: the Redis client (`rediss://`), sqlx's `verify-ca` verifier and
/// pgwire-replication. Two providers are compiled in (ring, and aws-lc-rs for the Attempt
/// client), so without an installed default rustls cannot choose and panics on the first
/// such connection. `main` calls this first; every builder of those connections calls it
/// too, so library users (tests, benchmarks) are covered.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
