//! Railhook beside a peer, in one run (issue #54): the same open-loop client, the same
//! receiver (a process of its own), the same Postgres and Redis, one target after the
//! other, each after the same idle pause, and one table with a row per target.
//!
//! Targets: `railhook` (the three release roles, each its own process, as `bench roles`
//! runs them) and `svix` (a `svix-server` binary built from Svix's source, its API and
//! worker in one process, queue and cache on the same Redis; docs/BENCHMARKS.md says how it
//! is built — no Svix code or build script is in this repository). Each message is counted
//! from just before its POST to its arrival at the receiver, on the wall clock both
//! processes share. CPU per delivered message is every process the target uses (its own,
//! Postgres's backends, Redis, and for Railhook the broker) over the load window.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::roles::cpu::{Groups, used};
use crate::roles::{free_port, role_env, spawn_roles, wait_ok, wait_ready};
use crate::setup::unique;
use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    /// Offered rates (messages/s), each a run of its own per target.
    #[arg(long, value_delimiter = ',', default_value = "300")]
    rates: Vec<u64>,
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds every process sits idle before each load: the load meets a cold path, as a
    /// user's first traffic after a quiet spell does.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    /// Which targets, in order: `railhook`, `svix`, or `railhook:K=V+K=V` (Railhook with
    /// those settings added to its environment, e.g. `railhook:RAILHOOK_WORKER_SYNCHRONOUS_COMMIT=false`).
    #[arg(long, value_delimiter = ',', default_value = "railhook,svix")]
    targets: Vec<String>,
    /// The `railhook` binary (built by deploy/local/bench.sh).
    #[arg(long, default_value = "target/release/railhook")]
    railhook: PathBuf,
    /// The `svix-server` binary (docs/BENCHMARKS.md, "Svix as a peer": how to build it).
    #[arg(long, env = "SVIX_SERVER_BIN")]
    svix_server: Option<PathBuf>,
    /// Concurrent client connections the open-loop client may use at once.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// The client: `rust` (reqwest, in this process), `python` (bench/clients/post.py:
    /// `requests` in 16 threads, what a typical client costs the box), or `closed` (a closed
    /// loop: `--connections` clients each POSTing the next message as soon as the last is
    /// answered, for `--seconds`; the rate is ignored: capacity at saturation).
    #[arg(long, default_value = "rust")]
    client: String,
}

/// `bench receiver`: the receiver, in a process of its own. Prints `seq micros` (the wall
/// clock's microseconds since the epoch) for each first arrival, one line each.
#[derive(clap::Args)]
pub struct ReceiverArgs {
    #[arg(long)]
    addr: String,
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

pub async fn receiver(args: ReceiverArgs) -> anyhow::Result<()> {
    use axum::routing::post;
    use std::io::Write;
    let seen: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let seen = seen.clone();
            async move {
                let at = now_micros();
                if let Some(seq) = crate::e2e::seq_of(&body)
                    && seen.lock().is_ok_and(|mut s| s.insert(seq))
                {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{seq} {at}");
                    let _ = out.flush();
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(&args.addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// The receiver process and the arrivals it reports.
struct Receiver {
    child: Child,
    url: String,
    arrivals: Arc<Mutex<HashMap<u64, u64>>>,
}

impl Receiver {
    fn start() -> anyhow::Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let mut child = Command::new(std::env::current_exe()?)
            .args(["receiver", "--addr", &addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("receiver stdout")?;
        let arrivals: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
        let sink = arrivals.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let mut parts = line.split(' ');
                if let (Some(Ok(seq)), Some(Ok(at))) = (
                    parts.next().map(str::parse::<u64>),
                    parts.next().map(str::parse::<u64>),
                ) && let Ok(mut a) = sink.lock()
                {
                    a.insert(seq, at);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            if Instant::now() > deadline {
                bail!("the receiver did not listen");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            child,
            url: format!("http://{addr}/hook"),
            arrivals,
        })
    }

    fn count(&self) -> usize {
        self.arrivals.lock().map(|a| a.len()).unwrap_or(0)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process started for a target, killed when dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A target ready for load: where to POST, how, and the processes to account for.
struct Target {
    name: String,
    /// (url, bearer token, body for message `seq`) of one POST.
    post: Box<dyn Fn(u64) -> (String, String, Value) + Send + Sync>,
    accepted: fn(u16) -> bool,
    pids: Vec<(&'static str, u32)>,
    /// Whether the Kafka broker is part of the target (its CPU counted in the target's).
    uses_broker: bool,
    /// Held until the target's run ends.
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

/// One row of the table.
struct Row {
    target: String,
    rate: u64,
    offered: u64,
    accepted: u64,
    delivered: usize,
    whole: Option<[f64; 4]>,
    second_half: Option<[f64; 4]>,
    post_p50: Option<f64>,
    window: f64,
    cpu: Vec<(String, f64)>,
    /// CPU seconds per second of each group over the idle pause's second half: the fixed
    /// cost of standing by (polling, heartbeats), which a low rate divides by few messages.
    idle: Vec<(String, f64)>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &rate in &args.rates {
        for name in &args.targets {
            let receiver = Receiver::start()?;
            let (kind, extra) = name.split_once(':').unwrap_or((name.as_str(), ""));
            let target = match kind {
                "railhook" => railhook(&args, &receiver.url, extra).await?,
                "svix" => match &args.svix_server {
                    Some(bin) => svix(bin, &receiver.url).await?,
                    None => {
                        eprintln!("peers: no --svix-server (SVIX_SERVER_BIN): Svix skipped");
                        continue;
                    }
                },
                other => bail!("unknown target {other} (railhook, svix)"),
            };
            rows.push(load(&args, rate, &target, &receiver).await?);
        }
    }
    print_rows(&args, &rows);
    Ok(())
}

async fn railhook(args: &Args, hook: &str, extra: &str) -> anyhow::Result<Target> {
    let (settings, url, pool) = crate::setup::fresh().await?;
    let slot = unique("rh_bench_peer_");
    crate::setup::create_slot(&pool, &slot).await?;
    let http_addr = format!("127.0.0.1:{}", free_port()?);
    let api = format!("http://{http_addr}");
    let mut env = role_env(&settings, &url, &slot, &http_addr);
    for pair in extra.split('+').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').context("railhook:K=V")?;
        env.push((k.to_owned(), v.to_owned()));
    }
    let roles = spawn_roles(&args.railhook, &env, None)?;
    wait_ready(&reqwest::Client::new(), &api).await?;
    let (_, key) = crate::setup::tenant(&api, &[json!({"url": hook})]).await?;
    let pids = roles.iter().map(|r| (r.name, r.child.id())).collect();
    let name = if extra.is_empty() {
        "Railhook".to_owned()
    } else {
        format!("Railhook ({extra})")
    };
    Ok(Target {
        name,
        post: Box::new(move |seq| {
            (
                format!("{api}/v1/events"),
                key.clone(),
                json!({"type": "order.paid", "payload": {"seq": seq}}),
            )
        }),
        accepted: |s| s == 201,
        pids,
        uses_broker: true,
        _keep: vec![Box::new(roles), Box::new(SlotDrop(pool, slot))],
    })
}

/// Drops the bench's Slot when the run ends.
struct SlotDrop(sqlx::PgPool, String);

impl Drop for SlotDrop {
    fn drop(&mut self) {
        let (pool, slot) = (self.0.clone(), self.1.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
                    .bind(&slot)
                    .execute(&pool)
                    .await;
            });
        }
    }
}

/// `svix-server` on a fresh database of the same Postgres, its queue and cache on the same
/// Redis, private targets allowed for the loopback receiver.
async fn svix(bin: &std::path::Path, hook: &str) -> anyhow::Result<Target> {
    let (settings, db_url) = crate::setup::database("svix_bench_").await?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let redis = secrecy::ExposeSecret::expose_secret(&settings.redis_url).to_owned();
    let secret = "bench-svix-jwt-secret-0123456789abcdef";
    let env: Vec<(&str, String)> = vec![
        ("SVIX_DB_DSN", db_url),
        ("SVIX_REDIS_DSN", redis),
        ("SVIX_QUEUE_TYPE", "redis".into()),
        ("SVIX_CACHE_TYPE", "redis".into()),
        ("SVIX_JWT_SECRET", secret.into()),
        ("SVIX_LISTEN_ADDRESS", addr.clone()),
        ("SVIX_WHITELIST_SUBNETS", "[127.0.0.0/8]".into()),
        ("SVIX_LOG_LEVEL", "info".into()),
        ("RUST_LOG", "warn".into()),
    ];
    let token_out = Command::new(bin)
        .args(["jwt", "generate"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .with_context(|| format!("{} jwt generate", bin.display()))?;
    let printed = String::from_utf8_lossy(&token_out.stdout).to_string();
    let token = printed
        .split_whitespace()
        .find(|w| w.matches('.').count() == 2 && w.len() > 40)
        .with_context(|| format!("no token in: {printed}"))?
        .to_owned();
    let child = Command::new(bin)
        .arg("--run-migrations")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| bin.display().to_string())?;
    let owned = Owned(child);
    let api = format!("http://{addr}");
    let http = reqwest::Client::new();
    let health = format!("{api}/api/v1/health/");
    wait_ok(&http, &health, Duration::from_secs(60), "svix-server").await?;
    let app: Value = http
        .post(format!("{api}/api/v1/app/"))
        .bearer_auth(&token)
        .json(&json!({"name": "bench"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let app_id = app["id"].as_str().context("app id")?.to_owned();
    http.post(format!("{api}/api/v1/app/{app_id}/endpoint/"))
        .bearer_auth(&token)
        .json(&json!({"url": hook, "version": 1}))
        .send()
        .await?
        .error_for_status()?;
    let pid = owned.0.id();
    Ok(Target {
        name: "Svix".to_owned(),
        post: Box::new(move |seq| {
            (
                format!("{api}/api/v1/app/{app_id}/msg/"),
                token.clone(),
                json!({"eventType": "order.paid", "payload": {"seq": seq}}),
            )
        }),
        accepted: |s| s == 202 || s == 201,
        pids: vec![("svix-server", pid)],
        uses_broker: false,
        _keep: vec![Box::new(owned)],
    })
}

async fn load(args: &Args, rate: u64, target: &Target, receiver: &Receiver) -> anyhow::Result<Row> {
    let groups = Groups::new(&target.pids);
    eprintln!("peers: {} idle for {} s", target.name, args.idle_seconds);
    let half = Duration::from_secs(args.idle_seconds) / 2;
    tokio::time::sleep(half).await;
    let idle_from = groups.read();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds) - half).await;
    let idle_seconds = (Duration::from_secs(args.idle_seconds) - half)
        .as_secs_f64()
        .max(0.001);
    let idle: Vec<(String, f64)> = used(&idle_from, &groups.read())
        .into_iter()
        .filter(|(name, _)| target.uses_broker || !name.starts_with("broker"))
        .map(|(name, c)| (name, c / idle_seconds))
        .collect();
    eprintln!("peers: {} at {rate}/s for {} s", target.name, args.seconds);
    let before = groups.read();
    let total = rate * args.seconds;
    let started = Instant::now();
    let (sent, answered, accepted) = match args.client.as_str() {
        "python" => python_client(rate, total, target)?,
        "closed" => closed_client(args, target).await,
        _ => rust_client(args, rate, total, target).await,
    };
    let (rate, total) = if args.client == "closed" {
        (0, sent.len() as u64)
    } else {
        (rate, total)
    };
    let wait = Instant::now() + Duration::from_secs(120);
    while (receiver.count() as u64) < accepted && Instant::now() < wait {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let window = started.elapsed().as_secs_f64();
    let cpu = used(&before, &groups.read())
        .into_iter()
        .filter(|(name, _)| target.uses_broker || !name.starts_with("broker"))
        .collect();
    let mut row = finish(
        rate, total, target, receiver, sent, answered, accepted, window, cpu,
    )?;
    row.idle = idle;
    Ok(row)
}

/// When each message was due or sent (wall-clock microseconds), how long each POST took,
/// and how many the target accepted.
type Sent = (HashMap<u64, u64>, Vec<Duration>, u64);

/// The load through `bench/clients/post.py` (Python `requests`, 16 threads).
fn python_client(rate: u64, total: u64, target: &Target) -> anyhow::Result<Sent> {
    use std::io::Write;
    let (url, token, body) = (target.post)(CLOSED_MARK);
    let template: Value = serde_json::from_str(
        &body
            .to_string()
            .replace(&CLOSED_MARK.to_string(), "\"SEQ\""),
    )?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/post.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("python3 bench/clients/post.py (pip install requests)")?;
    let config = json!({"rate": rate, "total": total, "threads": 16, "url": url,
                        "token": token, "body": template});
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(config.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let mut sent = HashMap::new();
    let mut answered = Vec::new();
    let mut accepted = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
        if let [seq, at, done, status] = f[..] {
            sent.insert(seq, at);
            answered.push(Duration::from_micros(done.saturating_sub(at)));
            accepted += u64::from((target.accepted)(status as u16));
        }
    }
    Ok((sent, answered, accepted))
}

/// `--connections` clients, each sending its next message when the last was answered, for
/// `--seconds`: what the target accepts at saturation.
async fn closed_client(args: &Args, target: &Target) -> Sent {
    let Ok(http) = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .build()
    else {
        return (HashMap::new(), Vec::new(), 0);
    };
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let post = &target.post;
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        let (http, next, accepted) = (http.clone(), next.clone(), target.accepted);
        // The target's request with a marker for the sequence number, filled in per
        // message (the target's closure stays in this task).
        let (url, token, body) = (post)(CLOSED_MARK);
        let template = body.to_string();
        clients.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < until {
                let seq = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let body = template.replace(&CLOSED_MARK.to_string(), &seq.to_string());
                let sent = now_micros();
                let status = http
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                mine.push((seq, sent, now_micros(), accepted(status)));
            }
            mine
        }));
    }
    let mut sent = HashMap::new();
    let mut answered = Vec::new();
    let mut accepted = 0;
    for c in clients {
        for (seq, at, done, ok) in c.await.unwrap_or_default() {
            sent.insert(seq, at);
            answered.push(Duration::from_micros(done.saturating_sub(at)));
            accepted += u64::from(ok);
        }
    }
    (sent, answered, accepted)
}

/// A sequence number no run reaches, replaced in a message's text by the real one.
const CLOSED_MARK: u64 = 987_654_321_987;

async fn rust_client(args: &Args, rate: u64, total: u64, target: &Target) -> Sent {
    let Ok(http) = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .build()
    else {
        return (HashMap::new(), Vec::new(), 0);
    };
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let limit = Arc::new(tokio::sync::Semaphore::new(args.connections));
    let started = Instant::now();
    let post = &target.post;
    let mut tasks = Vec::with_capacity(total as usize);
    for seq in 0..total {
        // Open loop: each message at its time, whatever earlier ones wait for (a message
        // that finds every connection busy waits for one, counted in its latency).
        tokio::time::sleep_until((started + period * seq as u32).into()).await;
        let (url, token, body) = (post)(seq);
        let (http, limit, accepted) = (http.clone(), limit.clone(), target.accepted);
        tasks.push(tokio::spawn(async move {
            let sent = now_micros();
            let _permit = limit.acquire_owned().await;
            let status = http
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            (seq, sent, now_micros(), accepted(status))
        }));
    }
    let mut sent = HashMap::new();
    let mut answered = Vec::new();
    let mut accepted = 0;
    for t in tasks {
        if let Ok((seq, at, done, ok)) = t.await {
            sent.insert(seq, at);
            answered.push(Duration::from_micros(done.saturating_sub(at)));
            accepted += u64::from(ok);
        }
    }
    (sent, answered, accepted)
}

#[allow(clippy::too_many_arguments)]
fn finish(
    rate: u64,
    total: u64,
    target: &Target,
    receiver: &Receiver,
    sent: HashMap<u64, u64>,
    mut answered: Vec<Duration>,
    accepted: u64,
    window: f64,
    cpu: Vec<(String, f64)>,
) -> anyhow::Result<Row> {
    let arrivals = receiver
        .arrivals
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    let first = sent.values().copied().min().unwrap_or(0);
    let last = sent.values().copied().max().unwrap_or(0);
    let middle = first + (last - first) / 2;
    let mut whole = Vec::new();
    let mut late = Vec::new();
    for (seq, at) in &sent {
        if let Some(got) = arrivals.get(seq) {
            let d = Duration::from_micros(got.saturating_sub(*at));
            whole.push(d);
            if *at >= middle {
                late.push(d);
            }
        }
    }
    let delivered = whole.len();
    Ok(Row {
        target: target.name.clone(),
        rate,
        offered: total,
        accepted,
        delivered,
        whole: percentiles(&mut whole),
        second_half: percentiles(&mut late),
        post_p50: percentiles(&mut answered).map(|p| p[0]),
        window,
        cpu,
        idle: Vec::new(),
    })
}

fn print_rows(args: &Args, rows: &[Row]) {
    println!(
        "## Railhook beside its peers: {} s per rate, {} s idle before each, open loop, the receiver in its own process\n",
        args.seconds, args.idle_seconds
    );
    println!(
        "| target | offered/s | accepted | delivered | held/s | p50 ms | p99 ms | 2nd half p50 / p99 ms | POST p50 ms | CPU ms/msg all-in | of which Postgres |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let total: f64 = r.cpu.iter().map(|(_, c)| c).sum();
        let pg: f64 = r
            .cpu
            .iter()
            .filter(|(n, _)| n.starts_with("Postgres"))
            .map(|(_, c)| c)
            .sum();
        let per = |c: f64| {
            if r.delivered > 0 {
                format!("{:.2}", 1000.0 * c / r.delivered as f64)
            } else {
                "-".into()
            }
        };
        let p = |v: Option<[f64; 4]>, i: usize| {
            v.map_or_else(|| "-".into(), |p| format!("{:.1}", p[i]))
        };
        println!(
            "| {} | {} | {} of {} | {} | {:.0} | {} | {} | {} / {} | {} | {} | {} |",
            r.target,
            if r.rate == 0 {
                format!("closed loop, {} clients", args.connections)
            } else {
                r.rate.to_string()
            },
            r.accepted,
            r.offered,
            r.delivered,
            r.delivered as f64 / r.window,
            p(r.whole, 0),
            p(r.whole, 2),
            p(r.second_half, 0),
            p(r.second_half, 2),
            r.post_p50.map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            per(total),
            per(pg),
        );
    }
    println!("\nCPU per process group (ms per delivered message):\n");
    for r in rows {
        let parts: Vec<String> = r
            .cpu
            .iter()
            .filter(|(_, c)| *c > 0.0)
            .map(|(n, c)| format!("{n} {:.2}", 1000.0 * c / r.delivered.max(1) as f64))
            .collect();
        println!("- {} at {}/s: {}", r.target, r.rate, parts.join(", "));
        let idle: Vec<String> = r
            .idle
            .iter()
            .filter(|(_, c)| *c > 0.0)
            .map(|(n, c)| format!("{n} {:.1} %", 100.0 * c))
            .collect();
        if !idle.is_empty() {
            println!("  idle, % of one core: {}", idle.join(", "));
        }
        if r.rate == 0 {
            println!(
                "  (closed loop: {:.0} accepted/s over the load, {:.0} delivered/s to the last arrival)",
                r.accepted as f64 / args.seconds as f64,
                r.delivered as f64 / r.window
            );
        }
    }
}
