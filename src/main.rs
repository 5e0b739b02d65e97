//! The one `railhook` binary. It parses configuration and wires roles together; the roles
//! themselves live in the `ingest`, `relay` and `worker` crates.

mod replay_cli;
mod retention_cli;
mod schema_cli;
mod secrets_cli;

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Parser, Subcommand};
use railhook_common::config::Settings;
use railhook_common::health::{self, Dependencies, KafkaProbe};
use railhook_common::{db, metrics_http, retention};
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use railhook_worker::{WorkerConfig, WorkerMetrics};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
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
    /// Apply migrations and create the outbox publication and the Slot; safe to run twice.
    Migrate,
    /// Inspect or manage the logical replication Slot.
    Slot {
        #[command(subcommand)]
        action: schema_cli::SlotAction,
    },
    /// Replay stored Events through the REST API (by id, or by time range) and follow it.
    Replay(replay_cli::ReplayArgs),
    /// List the day partitions with sizes and what retention does with each; then run a
    /// retention pass (unless --dry-run).
    Retention(retention_cli::RetentionArgs),
    /// Manage the keys that seal signing and Source secrets at rest.
    Secrets {
        #[command(subcommand)]
        action: secrets_cli::SecretsAction,
    },
}

fn main() -> std::process::ExitCode {
    railhook_common::install_crypto_provider();
    let cli = Cli::parse();
    if let Role::Replay(args) = cli.role {
        // An API client: no database, broker or telemetry settings needed.
        return client_main(replay_cli::run(args));
    }
    let settings = match Settings::load() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Before the runtime: the OTLP exporter's blocking HTTP client must not be built or
    // dropped on an async thread. `_telemetry` flushes batched spans when main returns.
    let _telemetry = railhook_common::telemetry::init(
        settings.log_format,
        settings.otlp_endpoint.as_deref(),
        &format!("railhook-{}", cli.role.name()),
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli, settings));
    drop(runtime);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the chain of causes on one line, without a backtrace.
            eprintln!("error: {e:#}");
            tracing::error!(error = format!("{e:#}"), "railhook stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

fn client_main(
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    let result = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(work));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

impl Role {
    /// The role's name, for the OTLP `service.name` (`railhook-ingest`, …).
    fn name(&self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Relay => "relay",
            Role::Worker => "worker",
            Role::All => "all",
            Role::Migrate => "migrate",
            Role::Slot { .. } => "slot",
            Role::Replay(_) => "replay",
            Role::Retention(_) => "retention",
            Role::Secrets { .. } => "secrets",
        }
    }
}

async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    if matches!(cli.role, Role::Ingest | Role::Worker | Role::All)
        && !settings.keyring().is_enabled()
    {
        tracing::warn!(
            "RAILHOOK_ENCRYPTION_KEYS is not set: endpoint signing secrets and Source secrets \
             are stored in plaintext, readable by anyone who can read the database or its \
             backups (docs/OPERATIONS.md, Secrets at rest)"
        );
    }
    match cli.role {
        Role::Migrate => schema_cli::migrate(&settings).await,
        Role::Ingest => ingest(&settings).await,
        Role::Relay => relay(&settings).await,
        Role::Worker => worker(&settings).await,
        Role::All => all(&settings).await,
        Role::Slot { action } => schema_cli::slot(&settings, action).await,
        Role::Replay(args) => replay_cli::run(args).await,
        Role::Retention(args) => retention_cli::run(&settings, args).await,
        Role::Secrets { action } => secrets_cli::run(&settings, action).await,
    }
}

/// How often a process asks its dependencies whether they answer (`/readyz`,
/// `railhook_dependency_up`). One metadata request, one `SELECT 1` and one `PING` per
/// interval: nothing a broker or a database notices.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// What a role's probes look at.
#[derive(Default)]
struct Probes {
    postgres: Option<PgPool>,
    kafka: bool,
    redis: bool,
}

/// Probes the role's dependencies every [`PROBE_INTERVAL`] until the process ends. Kafka's
/// probe blocks (librdkafka), so it runs off the async threads.
fn spawn_probes(settings: &Settings, deps: &Dependencies, probes: Probes) -> anyhow::Result<()> {
    let kafka = if probes.kafka {
        deps.declare("kafka", true);
        Some(Arc::new(
            KafkaProbe::new(&settings.kafka()).context("configuration: kafka")?,
        ))
    } else {
        None
    };
    let redis = if probes.redis {
        deps.declare("redis", false);
        Some(settings.redis_client()?)
    } else {
        None
    };
    if probes.postgres.is_some() {
        deps.declare("postgres", true);
    }
    let deps = deps.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        loop {
            tick.tick().await;
            if let Some(pool) = &probes.postgres {
                let _ = health::probe_postgres(&deps, pool).await;
            }
            if let Some(client) = &redis {
                health::probe_redis(&deps, client).await;
            }
            if let Some(probe) = &kafka {
                let (probe, deps) = (probe.clone(), deps.clone());
                let _ = tokio::task::spawn_blocking(move || probe.probe(&deps)).await;
            }
        }
    });
    Ok(())
}

/// The first look at Postgres: a certificate the URL's `sslmode` refuses (or TLS settings
/// the driver cannot use) stops the process now, saying what is wrong; Postgres merely away
/// is left to the probes and the roles' own retries.
async fn first_contact(deps: &Dependencies, pool: &PgPool) -> anyhow::Result<()> {
    match health::probe_postgres(deps, pool).await {
        Err(e) if health::postgres_is_configuration(&e) => {
            Err(anyhow::Error::new(e).context("cannot connect to Postgres (check DATABASE_URL)"))
        }
        Err(e) => {
            tracing::warn!(error = %health::postgres_reason(&e), "Postgres not answering yet; waiting");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

fn relay_parts(settings: &Settings) -> anyhow::Result<(RelayConfig, RelayMetrics)> {
    Ok((RelayConfig::from_settings(settings)?, RelayMetrics::new()))
}

async fn relay(settings: &Settings) -> anyhow::Result<()> {
    let (config, metrics) = relay_parts(settings)?;
    let deps = Dependencies::new();
    spawn_probes(
        settings,
        &deps,
        Probes {
            kafka: true,
            ..Probes::default()
        },
    )?;
    // The relay connects as the tables' owner (it needs REPLICATION; docs/OPERATIONS.md,
    // Roles), so it also runs the retention task: with ingest and workers on a
    // least-privilege role, it is the long-lived process that can. Its pool is lazy and
    // the pass uses two connections at most; the advisory lock keeps one pass at a time
    // across ingest and relay processes.
    let retention_metrics = retention::RetentionMetrics::new();
    tokio::spawn(retention::task(
        connect(settings)?,
        settings.retention_days,
        Duration::from_secs(settings.retention_interval_seconds),
        retention_metrics.clone(),
        shutdown_signal(),
    ));
    let metrics_server = metrics_http::serve(
        settings.metrics_addr,
        vec![metrics.registry.clone(), retention_metrics.registry.clone()],
        deps.clone(),
        metrics_http::MetricsAccess::from_settings(settings),
        shutdown_signal(),
    );
    let relay = railhook_relay::run(
        config,
        metrics,
        Arc::new(Faults::default()),
        deps,
        shutdown_signal(),
    );
    tracing::info!(metrics = %settings.metrics_addr, "relay starting");
    // Both end on SIGTERM; the relay only after its drain, so the metrics server ending first
    // must not end the process under it (an error in either still ends it at once).
    tokio::try_join!(async { relay.await.context("relay") }, async {
        metrics_server
            .await
            .with_context(|| format!("metrics on {}", settings.metrics_addr))
    })?;
    Ok(())
}

async fn worker(settings: &Settings) -> anyhow::Result<()> {
    let pool = connect(settings)?;
    let deps = Dependencies::new();
    let metrics = WorkerMetrics::new();
    // Registered here, once per process: tests run several workers on one registry.
    db::PoolCollector::register(&metrics.registry, "worker", pool.clone());
    spawn_probes(
        settings,
        &deps,
        Probes {
            postgres: Some(pool.clone()),
            kafka: true,
            redis: true,
        },
    )?;
    let metrics_server = metrics_http::serve(
        settings.metrics_addr,
        vec![metrics.registry.clone()],
        deps.clone(),
        metrics_http::MetricsAccess::from_settings(settings),
        shutdown_signal(),
    );
    let config = WorkerConfig::from_settings(settings)?;
    let worker = async {
        first_contact(&deps, &pool).await?;
        // Claims need Postgres: hints are not consumed before it answers.
        tokio::select! {
            r = health::wait_for_postgres(&deps, &pool) => r.context("cannot connect to Postgres (check DATABASE_URL)")?,
            _ = shutdown_signal() => return Ok(()),
        }
        railhook_worker::run(
            config,
            pool.clone(),
            metrics,
            deps.clone(),
            shutdown_signal(),
        )
        .await
        .context("worker")
    };
    // Both end on SIGTERM; the worker only after its drain, so neither may cut the other
    // short (an error in either still ends the process at once).
    tokio::try_join!(worker, async {
        metrics_server
            .await
            .with_context(|| format!("metrics on {}", settings.metrics_addr))
    })?;
    Ok(())
}

/// Every role in one process. A role waits for what it lacks instead of failing, so a
/// missing Slot or a broker not up yet never stops the API; only a configuration error
/// (which would stop a single role too) ends the process.
async fn all(settings: &Settings) -> anyhow::Result<()> {
    let (config, metrics) = relay_parts(settings)?;
    let deps = Dependencies::new();
    let worker_metrics = WorkerMetrics::new();
    let registries = vec![metrics.registry.clone(), worker_metrics.registry.clone()];
    let relay = railhook_relay::run(
        config,
        metrics,
        Arc::new(Faults::default()),
        deps.clone(),
        shutdown_signal(),
    );
    let pool = connect(settings)?;
    db::PoolCollector::register(&registries[1], "worker", pool.clone());
    // Postgres is probed by `ingest_with`, through the API's pool.
    spawn_probes(
        settings,
        &deps,
        Probes {
            kafka: true,
            redis: true,
            ..Probes::default()
        },
    )?;
    let worker_config = WorkerConfig::from_settings(settings)?;
    let worker = async {
        tokio::select! {
            r = health::wait_for_postgres(&deps, &pool) => r.context("cannot connect to Postgres (check DATABASE_URL)")?,
            _ = shutdown_signal() => return Ok(()),
        }
        railhook_worker::run(
            worker_config,
            pool.clone(),
            worker_metrics,
            deps.clone(),
            shutdown_signal(),
        )
        .await
        .context("worker")
    };
    // Every role ends on SIGTERM after its own drain; the process waits for all of them (an
    // error in one still ends it at once).
    tokio::try_join!(
        async { relay.await.context("relay") },
        worker,
        ingest_with(settings, registries, deps.clone()),
    )?;
    Ok(())
}

/// A lazy pool: nothing connects yet (see `db::connect`).
fn connect(settings: &Settings) -> anyhow::Result<PgPool> {
    db::connect(settings).context("configuration: database_url")
}

async fn ingest(settings: &Settings) -> anyhow::Result<()> {
    let deps = Dependencies::new();
    spawn_probes(
        settings,
        &deps,
        Probes {
            redis: true,
            ..Probes::default()
        },
    )?;
    ingest_with(settings, Vec::new(), deps).await
}

async fn ingest_with(
    settings: &Settings,
    other_registries: Vec<prometheus::Registry>,
    deps: Dependencies,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        settings.admin_token.is_some(),
        "configuration: admin_token (RAILHOOK_ADMIN_TOKEN) is required by the ingest role"
    );
    let pool = connect(settings)?;
    spawn_probes(
        settings,
        &deps,
        Probes {
            postgres: Some(pool.clone()),
            ..Probes::default()
        },
    )?;
    first_contact(&deps, &pool).await?;
    // Partitions ahead and retention: every ingest (and relay) process runs the task, and a
    // session advisory lock lets one pass run at a time; a process whose role does not own
    // the tables leaves it to one that does (common/src/retention/).
    let retention_metrics = retention::RetentionMetrics::new();
    let mut other_registries = other_registries;
    other_registries.push(retention_metrics.registry.clone());
    tokio::spawn(retention::task(
        pool.clone(),
        settings.retention_days,
        Duration::from_secs(settings.retention_interval_seconds),
        retention_metrics,
        shutdown_signal(),
    ));
    let mut state = railhook_ingest::AppState::new(pool, settings)?;
    state.other_registries = other_registries;
    state.deps = deps;
    let addr: SocketAddr = settings.http_addr;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "ingest listening");
    // With /metrics off the API port, the metrics port serves it (and the probes) instead.
    let metrics_port = async {
        if settings.api_metrics {
            return Ok(());
        }
        let mut registries = vec![state.metrics.registry().clone()];
        registries.extend(state.other_registries.iter().cloned());
        metrics_http::serve(
            settings.metrics_addr,
            registries,
            state.deps.clone(),
            state.metrics_access.clone(),
            shutdown_signal(),
        )
        .await
        .with_context(|| format!("metrics on {}", settings.metrics_addr))
    };
    tokio::try_join!(
        async {
            railhook_ingest::serve(listener, state.clone(), shutdown_signal())
                .await
                .context("ingest")
        },
        metrics_port,
    )?;
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
