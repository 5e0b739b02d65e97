//! What every benchmark starts from: the local settings and a fresh, migrated database of
//! its own (with the outbox publication), so runs never share state.

use anyhow::Context;
use railhook_common::config::Settings;
use sqlx::PgPool;

pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// Settings from the environment, pointed at a new database `rh_bench_…`; returns them with
/// the database's URL and a pool on it.
pub async fn fresh() -> anyhow::Result<(Settings, String, PgPool)> {
    let mut settings =
        Settings::load().context("run `source .local/env` (deploy/local/up.sh) first")?;
    let server = settings.database_url_string();
    let base = server
        .rsplit_once('/')
        .context("DATABASE_URL")?
        .0
        .to_owned();
    let db = unique("rh_bench_");
    let admin = PgPool::connect(&format!("{base}/postgres")).await?;
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await?;
    let url = format!("{base}/{db}");
    settings.set_database_url(&url);
    let pool = PgPool::connect(&url).await?;
    railhook_common::db::MIGRATOR.run(&pool).await?;
    railhook_common::db::ensure_publication(&pool, &settings.publication).await?;
    Ok((settings, url, pool))
}
