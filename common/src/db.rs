//! The Postgres pool and the embedded migrations (`migrations/` is the only schema source).

use std::time::Duration;

use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::config::Settings;

/// The schema, compiled into the binary so `railhook migrate` needs no files beside it.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

pub async fn connect(settings: &Settings) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(settings.db_max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect(settings.database_url.expose_secret())
        .await
}

/// Creates the publication the relay reads, if missing. Inserts only: the prune job's
/// DELETEs on `outbox` are not decoded or sent. `name` was validated by [`Settings`] to be
/// `[a-z0-9_]{1,63}`, which is why it may be spliced into the statement.
pub async fn ensure_publication(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_publication WHERE pubname = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?;
    if exists.is_none() {
        let ddl = format!("CREATE PUBLICATION {name} FOR TABLE outbox WITH (publish = 'insert')");
        sqlx::query(&ddl).execute(pool).await?;
    }
    Ok(())
}
