//! The integration tests: one binary, one module per area, so that
//! `support` compiles once and the workspace links once. Every test gets its own database; see `support`.
// Tests build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Test scenarios read top to bottom; the 100-line limit is for production code.
#![allow(clippy::too_many_lines)]

mod support;

mod access;
mod api;
mod applications;
mod auth_isolation;
mod authentication;
mod claim_fence;
mod connectivity;
mod dashboard;
mod deferrals;
mod docs_reference;
mod doze;
mod egress;
mod egress_matrix;
mod endpoint_doors;
mod event_types;
mod failover;
mod filter_tables;
mod fuzz;
mod group_commit;
mod hostile;
mod incoming;
mod ingest;
mod listen;
mod migrations;
mod observability;
mod operational;
mod operator;
mod ordering;
mod poller;
mod portal;
mod privileges;
mod quota;
mod redis_cluster;
mod relay;
mod retention;
mod routing;
mod secrets;
mod sso;
mod svix_sdk;
mod transformations;
mod transports;
mod worker;
