//! The integration tests that act on the whole shared Postgres server: they restart it
//! (`reliability`) or change a server-wide setting (`standby`). They are a binary of their
//! own because cargo runs test binaries one after another, so nothing in `tests/it` ever
//! runs while the server restarts; inside this binary, [`ONE_AT_A_TIME`] keeps them apart
//! from each other.
// Tests build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Test scenarios read top to bottom; the 100-line limit is for production code.
#![allow(clippy::too_many_lines)]

#[path = "../it/support/mod.rs"]
mod support;

mod reliability;
mod standby;

/// Held by every test here for its whole run.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
