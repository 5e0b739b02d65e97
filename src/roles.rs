//! How each role is wired in a process: its pool, its dependency probes, its metrics
//! server, and its drain on SIGTERM. `railhook all` runs the same role futures as the
//! single-role commands, side by side, so a role behaves the same either way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use railhook_common::config::Settings;
use railhook_common::health::{self, Dependencies, KafkaProbe};
use railhook_common::{db, metrics_http, retention};
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use railhook_worker::{WorkerConfig, WorkerMetrics};
use sqlx::PgPool;
use tokio::net::TcpListener;

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

pub async fn relay(settings: &Settings) -> anyhow::Result<()> {
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

pub async fn worker(settings: &Settings) -> anyhow::Result<()> {
    let pools = connect_worker(settings)?;
    let pool = pools.claims.clone();
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
        run_worker(config, pools, metrics, deps.clone()).await
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

/// The worker role once its pool exists: it waits for Postgres to answer (Claims need it,
/// so no hint is consumed before), then runs until SIGTERM and its drain.
async fn run_worker(
    config: WorkerConfig,
    pools: railhook_worker::Pools,
    metrics: WorkerMetrics,
    deps: Dependencies,
) -> anyhow::Result<()> {
    tokio::select! {
        r = health::wait_for_postgres(&deps, &pools.claims) => r.context("cannot connect to Postgres (check DATABASE_URL)")?,
        _ = shutdown_signal() => return Ok(()),
    }
    railhook_worker::run(config, pools, metrics, deps, shutdown_signal())
        .await
        .context("worker")
}

/// Every role in one process. A role waits for what it lacks instead of failing, so a
/// missing Slot or a broker not up yet never stops the API; only a configuration error
/// (which would stop a single role too) ends the process.
pub async fn all(settings: &Settings) -> anyhow::Result<()> {
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
    let pools = connect_worker(settings)?;
    db::PoolCollector::register(&registries[1], "worker", pools.claims.clone());
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
    let worker = run_worker(
        WorkerConfig::from_settings(settings)?,
        pools,
        worker_metrics,
        deps.clone(),
    );
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
pub(crate) fn connect(settings: &Settings) -> anyhow::Result<PgPool> {
    db::connect(settings).context("configuration: database_url")
}

/// The worker's lazy pools: its statements keep one generic plan each (`db::Planning`), and
/// its success writes commit on connections of their own (worker/src/pools.rs).
fn connect_worker(settings: &Settings) -> anyhow::Result<railhook_worker::Pools> {
    railhook_worker::Pools::connect(settings).context("configuration: database_url")
}

pub async fn ingest(settings: &Settings) -> anyhow::Result<()> {
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
    // The first requests find their connections open and the ingest statement planned.
    tokio::spawn({
        let pool = pool.clone();
        async move { railhook_ingest::group_commit::warm(&pool).await }
    });
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
    // `railhook listen` endpoints left without their session are removed (ingest/src/listen.rs).
    tokio::spawn(railhook_ingest::listen::sweeper(
        state.clone(),
        Duration::from_secs(settings.listen_idle_seconds),
    ));
    let addr: SocketAddr = settings.http_addr;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "ingest listening");
    // With /metrics off the API port, the metrics port serves it (and the probes) instead.
    let metrics_port = async {
        if settings.api_metrics() {
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
