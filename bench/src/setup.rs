//! What every benchmark starts from: the local settings and a fresh, migrated database of
//! its own (with the outbox publication), so runs never share state.

use anyhow::Context;
use railhook_common::config::Settings;
use serde_json::{Value, json};
use sqlx::PgPool;

pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// Settings from the environment, pointed at a new database `rh_bench_…`; returns them with
/// the database's URL and a pool on it.
pub async fn fresh() -> anyhow::Result<(Settings, String, PgPool)> {
    let (mut settings, url) = database("rh_bench_").await?;
    settings.set_database_url(&url);
    let pool = PgPool::connect(&url).await?;
    railhook_common::db::MIGRATOR.run(&pool).await?;
    railhook_common::db::ensure_publication(&pool, &settings.publication).await?;
    Ok((settings, url, pool))
}

/// The local settings and the URL of a new, empty database `<prefix><ulid>` on their
/// Postgres server (a peer's, or one [`fresh`] migrates).
pub async fn database(prefix: &str) -> anyhow::Result<(Settings, String)> {
    let settings =
        Settings::load().context("run `source .local/env` (deploy/local/up.sh) first")?;
    let server = settings.database_url_string();
    let base = server
        .rsplit_once('/')
        .context("DATABASE_URL")?
        .0
        .to_owned();
    let db = unique(prefix);
    let admin = PgPool::connect(&format!("{base}/postgres")).await?;
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await?;
    Ok((settings, format!("{base}/{db}")))
}

/// Creates the logical replication Slot `name` (pgoutput) a run's relay reads.
pub async fn create_slot(pool: &PgPool, name: &str) -> anyhow::Result<()> {
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(name)
        .execute(pool)
        .await?;
    Ok(())
}

/// The admin token every benchmark's API is started with.
pub const ADMIN_TOKEN: &str = "bench-admin-token-0123456789";

/// An organization (with a quota no benchmark reaches) and a project through the admin API
/// at `api`, and one endpoint per body in `endpoints`, each subscribed to every Event type.
/// Returns (project id, API key).
pub async fn tenant(api: &str, endpoints: &[Value]) -> anyhow::Result<(String, String)> {
    let http = reqwest::Client::new();
    let post = |path: &str, token: &str, body: Value| {
        http.post(format!("{api}{path}"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let org: Value = post(
        "/v1/organizations",
        ADMIN_TOKEN,
        json!({"name": "bench", "monthly_quota": 1_000_000_000_000i64}),
    )
    .await?
    .json()
    .await?;
    let project: Value = post(
        "/v1/projects",
        ADMIN_TOKEN,
        json!({"organization_id": org["id"], "name": "bench"}),
    )
    .await?
    .json()
    .await?;
    let key = project["api_key"].as_str().context("api key")?.to_owned();
    for body in endpoints {
        let endpoint: Value = post("/v1/endpoints", &key, body.clone())
            .await?
            .json()
            .await?;
        post(
            "/v1/subscriptions",
            &key,
            json!({"endpoint_id": endpoint["id"], "event_types": ["*"]}),
        )
        .await?;
    }
    let project_id = project["id"].as_str().context("project id")?.to_owned();
    Ok((project_id, key))
}
