//! Railhook's shared domain: what every role (ingest, relay, worker) agrees on.
//!
//! Values are parsed at the edge into the newtypes defined here; inside the system a value
//! that exists is valid. Module names follow the product vocabulary (see
//! `docs/ARCHITECTURE.md`).

pub mod announcement;
pub mod config;
pub mod db;
pub mod event_type;
pub mod health;
pub mod http_server;
pub mod ids;
pub mod kafka;
pub mod metrics_http;
pub mod postgres_url;
pub mod redis_client;
pub mod retry;
pub mod secrets;
pub mod signing;
pub mod telemetry;

pub use event_type::{EventType, EventTypePattern};
