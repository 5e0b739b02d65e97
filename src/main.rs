//! The one `railhook` binary. It parses configuration and wires roles together; the roles
//! themselves live in the `ingest`, `relay` and `worker` crates.

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Parser, Subcommand};
use railhook_common::config::Settings;
use railhook_common::db;
use sqlx::PgPool;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "railhook",
    version,
    about = "Webhook delivery with a transactional outbox and a CDC relay"
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Serve the REST API.
    Ingest,
    /// Stream Outbox inserts from the replication Slot to Kafka.
    Relay,
    /// Consume Kafka hints, Claim Deliveries and run Attempts.
    Worker,
    /// Every role in one process, for a single machine.
    All,
    /// Apply migrations and create the outbox publication; safe to run twice.
    Migrate,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the chain of causes on one line, without a backtrace.
            eprintln!("error: {e:#}");
            tracing::error!(error = format!("{e:#}"), "railhook stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::load()?;
    railhook_common::telemetry::init_logging(settings.log_format);
    match cli.role {
        Role::Migrate => migrate(&settings).await,
        Role::Ingest => ingest(&settings).await,
        Role::Relay => Ok(railhook_relay::run()?),
        Role::Worker => Ok(railhook_worker::run()?),
        Role::All => {
            tracing::warn!("relay and worker are not part of this build yet; running ingest only");
            ingest(&settings).await
        }
    }
}

async fn connect(settings: &Settings) -> anyhow::Result<PgPool> {
    db::connect(settings)
        .await
        .context("cannot connect to Postgres (check DATABASE_URL)")
}

async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let pool = connect(settings).await?;
    db::MIGRATOR
        .run(&pool)
        .await
        .context("applying migrations")?;
    db::ensure_publication(&pool, &settings.publication)
        .await
        .context("creating the outbox publication")?;
    tracing::info!(publication = %settings.publication, "migrations applied");
    Ok(())
}

async fn ingest(settings: &Settings) -> anyhow::Result<()> {
    anyhow::ensure!(
        settings.admin_token.is_some(),
        "configuration: admin_token (RAILHOOK_ADMIN_TOKEN) is required by the ingest role"
    );
    let pool = connect(settings).await?;
    let state = railhook_ingest::AppState::new(pool, settings).context("REDIS_URL")?;
    let addr: SocketAddr = settings.http_addr;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "ingest listening");
    railhook_ingest::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
