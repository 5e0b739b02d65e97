//! End to end with every role in its own process (the release `railhook ingest`, `relay`
//! and `worker`), so each role's CPU and memory can be read from /proc: POST → receiver
//! latency at `--rate` events/s for `--seconds`, then, per role, CPU seconds used during
//! the load and resident memory at the start and at its peak.

use secrecy::ExposeSecret;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::e2e::{Arrivals, receiver};
use crate::setup::unique;
use crate::stats::percentiles;

pub(crate) mod cpu;
mod report;

use cpu::{Groups, idle, used};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 500)]
    rate: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The `railhook` binary (built by deploy/local/bench.sh).
    #[arg(long, default_value = "target/release/railhook")]
    railhook: PathBuf,
    /// Seconds of idle (after the warm-up, before the load) over which every process's CPU
    /// is measured: the three roles, the broker, Postgres and Redis. 0 skips it.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Seconds waited after the warm-up before the idle window opens, so a worker that
    /// dozes after `WORKER_DOZE_AFTER_MS` (2 s) is measured dozing, not on its way there.
    #[arg(long, default_value_t = 5)]
    idle_settle_seconds: u64,
    /// The workers' `RAILHOOK_KAFKA_FETCH_WAIT_MS` (unset: the default).
    #[arg(long)]
    fetch_wait_ms: Option<u64>,
    /// The workers' `RAILHOOK_WORKER_DOZE_AFTER_MS` (unset: the default; 0: never doze).
    #[arg(long)]
    doze_after_ms: Option<u64>,
    /// Write each role's log (stdout, at `RUST_LOG`, default warn) to `<dir>/<role>.log`
    /// instead of discarding it.
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Send one Event through the whole path and wait for it before the idle window and the
    /// load. `--warm-up false` measures as a user's first traffic meets Railhook: nothing
    /// has been sent since the processes started (issue #35).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    warm_up: bool,
    /// Events the warm-up sends, all at once (with `--warm-up true`): 1 exercises the path,
    /// a burst also opens and warms the pools' connections.
    #[arg(long, default_value_t = 1)]
    warm_up_events: u64,
    /// Print, for each second of the load, the p50 and p99 of the Events sent in it and how
    /// many were in flight (sent, not yet arrived) at its end: where a stall happens.
    #[arg(long, default_value_t = false)]
    timeline: bool,
    /// Day partitions of `events`, `deliveries` and `attempts` to create before today, empty,
    /// as a database under `RAILHOOK_RETENTION_DAYS` carries (30 by default): every
    /// statement that cannot prune at plan time plans over all of them.
    #[arg(long, default_value_t = 0)]
    history_days: u32,
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) struct Role {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    /// Its `RAILHOOK_METRICS_ADDR`.
    metrics: String,
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (settings, url, pool) = crate::setup::fresh().await?;
    if args.history_days > 0 {
        sqlx::query("SELECT railhook_ensure_partitions(current_date - $1, current_date)")
            .bind(args.history_days as i32)
            .execute(&pool)
            .await?;
    }
    let slot = unique("rh_bench_roles_");
    crate::setup::create_slot(&pool, &slot).await?;
    let arrivals: Arrivals = Arc::default();
    let hook = receiver(arrivals.clone()).await?;
    let http_addr = format!("127.0.0.1:{}", free_port()?);
    let api = format!("http://{http_addr}");
    let mut env = role_env(&settings, &url, &slot, &http_addr);
    if let Some(ms) = args.fetch_wait_ms {
        env.push(("RAILHOOK_KAFKA_FETCH_WAIT_MS".into(), ms.to_string()));
    }
    if let Some(ms) = args.doze_after_ms {
        env.push(("RAILHOOK_WORKER_DOZE_AFTER_MS".into(), ms.to_string()));
    }
    let roles = spawn_roles(&args.railhook, &env, args.logs.as_deref())?;
    let result = measure(&args, &api, &hook, &arrivals, &roles).await;
    drop(roles);
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&pool)
        .await;
    result
}

/// Waits up to 30 s for the API at `api` to answer `/readyz`.
pub(crate) async fn wait_ready(http: &reqwest::Client, api: &str) -> anyhow::Result<()> {
    wait_ok(
        http,
        &format!("{api}/readyz"),
        Duration::from_secs(30),
        "ingest",
    )
    .await
}

/// Waits up to `within` for a GET of `url` to answer 2xx (`what` names the server).
pub(crate) async fn wait_ok(
    http: &reqwest::Client,
    url: &str,
    within: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !http
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        if Instant::now() > deadline {
            bail!("{what} did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The environment of the three roles on one bench database and Slot, the API on
/// `http_addr`.
pub(crate) fn role_env(
    settings: &railhook_common::config::Settings,
    url: &str,
    slot: &str,
    http_addr: &str,
) -> Vec<(String, String)> {
    vec![
        ("DATABASE_URL".into(), url.to_owned()),
        ("KAFKA_BROKERS".into(), settings.kafka_brokers.clone()),
        (
            "REDIS_URL".into(),
            settings.redis_url.expose_secret().to_owned(),
        ),
        ("RAILHOOK_SLOT".into(), slot.to_owned()),
        ("RAILHOOK_PUBLICATION".into(), settings.publication.clone()),
        (
            "RAILHOOK_TOPIC_PREFIX".into(),
            format!("{}.", unique("roles")),
        ),
        ("RAILHOOK_WORKER_GROUP".into(), unique("roles-")),
        (
            "RAILHOOK_ALLOW_PRIVATE_TARGETS".into(),
            "127.0.0.0/8".into(),
        ),
        (
            "RAILHOOK_ADMIN_TOKEN".into(),
            crate::setup::ADMIN_TOKEN.into(),
        ),
        ("RAILHOOK_HTTP_ADDR".into(), http_addr.to_owned()),
        ("RAILHOOK_WORKER_MAX_IN_FLIGHT".into(), "256".into()),
        (
            "RUST_LOG".into(),
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        ),
    ]
}

/// `railhook ingest`, `relay` and `worker`, each its own process with `env`; each role's
/// log goes to `<logs>/<role>.log` when given.
pub(crate) fn spawn_roles(
    railhook: &std::path::Path,
    env: &[(String, String)],
    logs: Option<&std::path::Path>,
) -> anyhow::Result<Vec<Role>> {
    let mut roles = Vec::new();
    for name in ["ingest", "relay", "worker"] {
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let child = Command::new(railhook)
            .arg(name)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RAILHOOK_METRICS_ADDR", &metrics)
            .stdout(match logs {
                Some(dir) => Stdio::from(std::fs::File::create(dir.join(format!("{name}.log")))?),
                None => Stdio::null(),
            })
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("{} (cargo build --release)", railhook.display()))?;
        roles.push(Role {
            name,
            child,
            metrics,
        });
    }
    Ok(roles)
}

async fn measure(
    args: &Args,
    api: &str,
    hook: &str,
    arrivals: &Arrivals,
    roles: &[Role],
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    wait_ready(&http, api).await?;
    let post = |path: &str, token: &str, body: Value| {
        http.post(format!("{api}{path}"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let (_, key) = crate::setup::tenant(api, &[json!({"url": hook})]).await?;
    if args.warm_up {
        // Warm-up through the whole path.
        let burst = (0..args.warm_up_events.max(1)).map(|i| {
            post(
                "/v1/events",
                &key,
                json!({"type": "bench.warmup", "payload": {"seq": u64::MAX - i}}),
            )
        });
        for r in futures::future::join_all(burst).await {
            r?;
        }
        let warm = Instant::now() + Duration::from_secs(60);
        while arrivals
            .lock()
            .map(|a| (a.len() as u64) < args.warm_up_events.max(1))
            .unwrap_or(true)
        {
            if Instant::now() > warm {
                bail!("the warm-up event never arrived");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        arrivals.lock().map(|mut a| a.clear()).ok();
    }

    let pids: Vec<(&'static str, u32)> = roles.iter().map(|r| (r.name, r.child.id())).collect();
    let groups = Groups::new(&pids);
    if args.idle_seconds > 0 {
        tokio::time::sleep(Duration::from_secs(args.idle_settle_seconds)).await;
        idle(
            &groups,
            Duration::from_secs(args.idle_settle_seconds),
            Duration::from_secs(args.idle_seconds),
        )
        .await;
    }
    let all_before = groups.read();
    let before: HashMap<&str, (f64, f64)> = pids
        .iter()
        .filter_map(|(n, p)| crate::stats::process_usage(*p).map(|u| (*n, u)))
        .collect();
    let peaks: Arc<Mutex<HashMap<&'static str, f64>>> = Arc::default();
    let sampling = {
        let (pids, peaks) = (pids.clone(), peaks.clone());
        tokio::spawn(async move {
            loop {
                for (name, pid) in &pids {
                    if let (Some((_, rss)), Ok(mut p)) =
                        (crate::stats::process_usage(*pid), peaks.lock())
                    {
                        let e = p.entry(name).or_insert(0.0);
                        *e = e.max(rss);
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    eprintln!("roles: {} events/s for {} s", args.rate, args.seconds);
    let total = args.rate * args.seconds;
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    // When each POST was answered: the ingest's share of the latency.
    let answered: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for seq in 0..total {
        tokio::time::sleep_until((started + period * seq as u32).into()).await;
        let (http, api, key, sent, answered) = (
            http.clone(),
            api.to_owned(),
            key.clone(),
            sent.clone(),
            answered.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let at = Instant::now();
            sent.lock().map(|mut s| s.insert(seq, at)).ok();
            let created = http
                .post(format!("{api}/v1/events"))
                .bearer_auth(&key)
                .json(&json!({"type": "order.paid", "payload": {"seq": seq}}))
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 201);
            answered
                .lock()
                .map(|mut a| a.insert(seq, Instant::now()))
                .ok();
            created
        }));
    }
    let mut refused = 0;
    for t in tasks {
        if !t.await.unwrap_or(false) {
            refused += 1;
        }
    }
    let limit = Instant::now() + Duration::from_secs(60);
    while arrivals.lock().map(|a| a.len()).unwrap_or(0) < total as usize && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let window = started.elapsed().as_secs_f64();
    let all_used = used(&all_before, &groups.read());
    sampling.abort();
    let after: HashMap<&str, (f64, f64)> = pids
        .iter()
        .filter_map(|(n, p)| crate::stats::process_usage(*p).map(|u| (*n, u)))
        .collect();

    // Each delivered Event's latency, and whether it was sent in the second half of the
    // load: a queue the run's start built (connections opening and planning their first
    // statements) shows in the whole run's tail but not in the second half's.
    let timed: Vec<(Duration, bool)> = {
        let (sent, arrived) = (
            sent.lock().map_err(|_| anyhow::anyhow!("lock"))?,
            arrivals.lock().map_err(|_| anyhow::anyhow!("lock"))?,
        );
        let first = sent.values().copied().min();
        let last = sent.values().copied().max();
        let middle = first.zip(last).map(|(f, l)| f + (l - f) / 2);
        sent.iter()
            .filter_map(|(seq, at)| {
                arrived.get(seq).map(|got| {
                    let late = middle.is_some_and(|m| *at >= m);
                    (got.saturating_duration_since(*at), late)
                })
            })
            .collect()
    };
    if args.timeline {
        let sent = sent.lock().map_err(|_| anyhow::anyhow!("lock"))?.clone();
        let arrived = arrivals
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .clone();
        let answered = answered
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .clone();
        report::timeline(started, &sent, &answered, &arrived);
    }
    let mut latencies: Vec<Duration> = timed.iter().map(|(d, _)| *d).collect();
    let mut second_half: Vec<Duration> = timed
        .iter()
        .filter(|(_, late)| *late)
        .map(|(d, _)| *d)
        .collect();
    let delivered = latencies.len();
    println!(
        "## Every role in its own process: {} events/s for {} s, 1 endpoint\n",
        args.rate, args.seconds
    );
    println!(
        "| measure | p50 ms | p90 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: | ---: |"
    );
    if let Some([p50, p90, p99, max]) = percentiles(&mut latencies) {
        println!(
            "| POST → receiver ({delivered} of {total} delivered; {refused} not 201) | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} |"
        );
    }
    let late = second_half.len();
    if let Some([p50, p90, p99, max]) = percentiles(&mut second_half) {
        println!(
            "| … sent in the second half of the load ({late}) | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} |"
        );
    }
    println!(
        "\n| role | CPU s during the load | % of one core | RSS at start MiB | RSS peak MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    let peaks = peaks.lock().map_err(|_| anyhow::anyhow!("lock"))?.clone();
    for (name, _) in &pids {
        if let (Some(b), Some(a)) = (before.get(name), after.get(name)) {
            let cpu = a.0 - b.0;
            println!(
                "| {name} | {cpu:.1} | {:.0} % | {:.1} | {:.1} |",
                100.0 * cpu / window,
                b.1,
                peaks.get(name).copied().unwrap_or(a.1)
            );
        }
    }
    println!("\n(window: {window:.1} s from the first POST to the last arrival)");
    report::role_metrics(&http, roles).await;
    if delivered > 0 {
        println!(
            "\n## All-in CPU per delivered message (load window)\n\n| process | CPU s | ms per message |\n| --- | ---: | ---: |"
        );
        let mut total = 0.0;
        for (name, cpu) in &all_used {
            total += cpu;
            println!(
                "| {name} | {cpu:.1} | {:.2} |",
                1000.0 * cpu / delivered as f64
            );
        }
        println!(
            "| **all** | {total:.1} | **{:.2}** |",
            1000.0 * total / delivered as f64
        );
    }
    Ok(())
}
