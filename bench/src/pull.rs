//! Receivers that pull (issue #56, docs/POLLING.md, docs/RECEIVERS.md), each against a
//! baseline in the same run:
//!
//! 1. Poll throughput: one consumer reads a poller's stream in pages of 100 through the
//!    Svix-shaped consumer route, against the same read statement run directly on Postgres
//!    (`store::poller::read`, no HTTP); then 100 consumers at once, p99 per poll.
//! 2. `railhook listen`: POST → local receiver latency through a `listen` process (the
//!    release binary beside this one), against a plain HTTP endpoint to the same receiver,
//!    interleaved at the same rate.
//! 3. Idle sessions: the API process's CPU with 1,000 connected, idle `listen` sessions
//!    (opened by a child process, `listen-clients`), against the same window with none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::routing::post;
use futures::StreamExt;
use railhook_ingest::store::poller::{Narrowing, read};
use serde_json::{Value, json};

use crate::e2e::{post_batches, stack_with};
use crate::stats::{percentiles, process_usage};

#[derive(clap::Args)]
pub struct Args {
    /// Messages in the poller's stream.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Events per line for the listen latency (at `--rate` each).
    #[arg(long, default_value_t = 500)]
    listen_events: u64,
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// Idle listen sessions.
    #[arg(long, default_value_t = 1_000)]
    sessions: u64,
    /// The idle window measured, seconds (once with the sessions, once without).
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
}

#[derive(clap::Args)]
pub struct ClientsArgs {
    #[arg(long)]
    api: String,
    #[arg(long)]
    key: String,
    #[arg(long)]
    count: u64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let st = stack_with(&[]).await?;
    let http = reqwest::Client::new();
    println!("## Receivers that pull (`railhook-bench pull`)\n");
    polls(&st, &http, &args).await?;
    listen_latency(&st, &http, &args).await?;
    idle_sessions(&st, &args).await?;
    st.stop().await;
    Ok(())
}

/// Makes an application and a poller subscribed to `poll.*`; returns (app, endpoint).
async fn poller(
    st: &crate::e2e::Stack,
    http: &reqwest::Client,
) -> anyhow::Result<(String, String)> {
    let app: Value = http
        .post(format!("{}/api/v1/app", st.api))
        .bearer_auth(&st.key)
        .json(&json!({"name": "pull"}))
        .send()
        .await?
        .json()
        .await?;
    let app = app["id"].as_str().context("app id")?.to_owned();
    let ep: Value = http
        .post(format!("{}/api/v1/app/{app}/endpoint", st.api))
        .bearer_auth(&st.key)
        .json(&json!({"type": "poller", "filterTypes": ["poll.*"]}))
        .send()
        .await?
        .json()
        .await?;
    Ok((app, ep["id"].as_str().context("endpoint id")?.to_owned()))
}

async fn consumer_page(
    http: &reqwest::Client,
    st: &crate::e2e::Stack,
    app: &str,
    ep: &str,
    consumer: &str,
) -> anyhow::Result<(usize, Duration)> {
    let t = Instant::now();
    let page: Value = http
        .get(format!(
            "{}/api/v1/app/{app}/poller/{ep}/consumer/{consumer}?limit=100",
            st.api
        ))
        .bearer_auth(&st.key)
        .send()
        .await?
        .json()
        .await?;
    Ok((page["data"].as_array().map_or(0, Vec::len), t.elapsed()))
}

async fn polls(st: &crate::e2e::Stack, http: &reqwest::Client, args: &Args) -> anyhow::Result<()> {
    let (app, ep) = poller(st, http).await?;
    let events = args.messages;
    post_batches(http, &st.api, &st.key, events, |i| {
        json!({"type": "poll.event", "application": app, "payload": {"i": i, "pad": "x".repeat(200)}})
    })
    .await?;
    // Readable once numbered (right after each batch commits); measured once the worker
    // has also taken every Delivery through its Attempt, so the reads are not competing
    // with the burst's pipeline for the two cores.
    let numbered = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND sequence_number IS NOT NULL \
             AND status = 'SUCCEEDED'",
        )
        .bind(&ep)
        .fetch_one(&st.pool)
        .await
        .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while numbered().await < events as i64 {
        if Instant::now() > deadline {
            bail!("the stream was not numbered and delivered in time");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Raw Postgres: the poll's own statement, pages of 100, one connection, no HTTP.
    let (mut raw, mut position, mut raw_pages) = (0_usize, 0_i64, Vec::new());
    let started = Instant::now();
    while raw < events as usize {
        let t = Instant::now();
        let rows = read(&st.pool, &ep, position, 100, &Narrowing::default()).await?;
        raw_pages.push(t.elapsed());
        let Some(last) = rows.last() else { break };
        position = last.sequence_number;
        raw += rows.len();
    }
    let raw_rate = raw as f64 / started.elapsed().as_secs_f64();
    // One consumer through the API.
    let (mut got, mut pages) = (0_usize, Vec::new());
    let started = Instant::now();
    while got < events as usize {
        let (n, took) = consumer_page(http, st, &app, &ep, "one").await?;
        pages.push(took);
        if n == 0 {
            break;
        }
        got += n;
    }
    let api_rate = got as f64 / started.elapsed().as_secs_f64();
    // 100 consumers at once, each reading the first 20 pages (2,000 messages).
    let started = Instant::now();
    let many: Vec<anyhow::Result<Vec<Duration>>> = futures::stream::iter(0..100)
        .map(|c| {
            let (http, app, ep) = (http.clone(), app.clone(), ep.clone());
            async move {
                let mut took = Vec::new();
                for _ in 0..20 {
                    took.push(
                        consumer_page(&http, st, &app, &ep, &format!("c{c}"))
                            .await?
                            .1,
                    );
                }
                Ok(took)
            }
        })
        .buffer_unordered(100)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut all = Vec::new();
    for r in many {
        all.extend(r?);
    }
    let many_rate = all.len() as f64 * 100.0 / elapsed.as_secs_f64();
    let (r, a, m) = (
        percentiles(&mut raw_pages).unwrap_or_default(),
        percentiles(&mut pages).unwrap_or_default(),
        percentiles(&mut all).unwrap_or_default(),
    );
    println!("### Polling: a stream of {events} messages, pages of 100\n");
    println!("| reader | messages read | messages/s | per page p50 / p99 ms |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| raw Postgres: the poll's statement, one connection (baseline) | {raw} | {raw_rate:.0} | {:.2} / {:.2} |",
        r[0], r[2]
    );
    println!(
        "| one consumer, `consumer_poll` over HTTP | {got} | {api_rate:.0} | {:.2} / {:.2} |",
        a[0], a[2]
    );
    println!(
        "| 100 consumers at once (20 pages each) | {} | {many_rate:.0} (all together) | {:.2} / {:.2} |",
        all.len() * 100,
        m[0],
        m[2]
    );
    println!(
        "\none consumer / raw Postgres: **{:.2}×** the messages/s\n",
        api_rate / raw_rate
    );
    Ok(())
}

type Sent = Arc<Mutex<HashMap<String, Instant>>>;
type Seen = Arc<Mutex<Vec<(String, Duration)>>>;

/// A receiver in this process: each arrival's latency from its POST, by line.
async fn receiver(sent: Sent, seen: Seen) -> anyhow::Result<String> {
    let app = Router::new().route(
        "/{line}",
        post(
            move |axum::extract::Path(line): axum::extract::Path<String>,
                  body: axum::body::Bytes| {
                let (sent, seen) = (sent.clone(), seen.clone());
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let key = format!("{line}/{}", v["i"]);
                    if let Some(at) = sent.lock().ok().and_then(|s| s.get(&key).copied())
                        && let Ok(mut l) = seen.lock()
                    {
                        l.push((line, at.elapsed()));
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

fn railhook_binary() -> anyhow::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("railhook");
    if !bin.exists() {
        bail!(
            "{} not found: cargo build --release -p railhook first",
            bin.display()
        );
    }
    Ok(bin)
}

async fn listen_latency(
    st: &crate::e2e::Stack,
    http: &reqwest::Client,
    args: &Args,
) -> anyhow::Result<()> {
    let (sent, seen): (Sent, Seen) = (Arc::default(), Arc::default());
    let base = receiver(sent.clone(), seen.clone()).await?;
    let direct: Value = http
        .post(format!("{}/v1/endpoints", st.api))
        .bearer_auth(&st.key)
        .json(&json!({"url": format!("{base}/direct")}))
        .send()
        .await?
        .json()
        .await?;
    http.post(format!("{}/v1/subscriptions", st.api))
        .bearer_auth(&st.key)
        .json(&json!({"endpoint_id": direct["id"], "event_types": ["direct.*"]}))
        .send()
        .await?;
    let mut child = tokio::process::Command::new(railhook_binary()?)
        .args(["listen", "--api-url", &st.api, "--api-key", &st.key])
        .args([
            "--forward-to",
            &format!("{base}/listen"),
            "--event-types",
            "listen.*",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("railhook listen")?;
    // Ready once a warm-up Event of each line has arrived.
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in ["direct", "listen"] {
        sent.lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .insert(format!("{line}/-1"), Instant::now());
        loop {
            http.post(format!("{}/v1/events", st.api))
                .bearer_auth(&st.key)
                .json(&json!({"type": format!("{line}.warm"), "payload": {"i": -1}}))
                .send()
                .await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            if seen
                .lock()
                .map(|s| s.iter().any(|(l, _)| l == line))
                .unwrap_or(false)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the {line} warm-up never arrived");
            }
        }
    }
    seen.lock().map(|mut s| s.clear()).ok();
    // Open loop: one Event every 1/rate s per line, interleaved.
    let gap = Duration::from_secs_f64(1.0 / args.rate as f64 / 2.0);
    let mut tick = tokio::time::interval(gap);
    for i in 0..args.listen_events * 2 {
        tick.tick().await;
        let line = if i % 2 == 0 { "direct" } else { "listen" };
        let n = i / 2;
        sent.lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .insert(format!("{line}/{n}"), Instant::now());
        let (http, api, key) = (http.clone(), st.api.clone(), st.key.clone());
        tokio::spawn(async move {
            let _ = http
                .post(format!("{api}/v1/events"))
                .bearer_auth(key)
                .json(&json!({"type": format!("{line}.event"), "payload": {"i": n}}))
                .send()
                .await;
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().map(|s| s.len()).unwrap_or(0) < (args.listen_events * 2) as usize
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill().await;
    let of = |line: &str| -> Vec<Duration> {
        seen.lock()
            .map(|s| {
                s.iter()
                    .filter(|(l, _)| l == line)
                    .map(|(_, d)| *d)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (mut d, mut l) = (of("direct"), of("listen"));
    let (dn, ln) = (d.len(), l.len());
    let (dp, lp) = (
        percentiles(&mut d).unwrap_or_default(),
        percentiles(&mut l).unwrap_or_default(),
    );
    println!(
        "### `railhook listen`: POST → local receiver, {} Events per line at {}/s each, interleaved\n",
        args.listen_events, args.rate
    );
    println!("| line | arrived | p50 / p90 / p99 / max ms |");
    println!("| --- | ---: | ---: |");
    println!(
        "| HTTP endpoint to the receiver (baseline) | {dn} | {:.1} / {:.1} / {:.1} / {:.1} |",
        dp[0], dp[1], dp[2], dp[3]
    );
    println!(
        "| through `railhook listen` (relay, WebSocket, the CLI's forward) | {ln} | {:.1} / {:.1} / {:.1} / {:.1} |",
        lp[0], lp[1], lp[2], lp[3]
    );
    println!(
        "\nlisten / HTTP p50: **{:.2}×**, p99: **{:.2}×**\n",
        lp[0] / dp[0],
        lp[2] / dp[2]
    );
    Ok(())
}

async fn idle_sessions(st: &crate::e2e::Stack, args: &Args) -> anyhow::Result<()> {
    let me = std::process::id();
    let window = Duration::from_secs(args.idle_seconds);
    let cpu_over = |w: Duration| async move {
        let (before, _) = process_usage(me).unwrap_or_default();
        tokio::time::sleep(w).await;
        let (after, rss) = process_usage(me).unwrap_or_default();
        (after - before, rss)
    };
    let (base_cpu, base_rss) = cpu_over(window).await;
    let mut clients = tokio::process::Command::new(std::env::current_exe()?)
        .args(["listen-clients", "--api", &st.api, "--key", &st.key])
        .args(["--count", &args.sessions.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = tokio::io::BufReader::new(clients.stdout.take().context("stdout")?);
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
    if line.trim() != "connected" {
        bail!("listen-clients: {line}");
    }
    let live = st_sessions(st).await;
    let (idle_cpu, idle_rss) = cpu_over(window).await;
    let client_pid = clients.id().unwrap_or(0);
    let (client_cpu, _) = process_usage(client_pid).unwrap_or_default();
    let _ = clients.kill().await;
    println!(
        "### Idle `railhook listen` sessions: the API process's CPU over {} s\n",
        args.idle_seconds
    );
    println!("| sessions connected | API process CPU s (% of one core) | RSS MiB |");
    println!("| ---: | ---: | ---: |");
    println!(
        "| 0 (baseline, same process, just before) | {base_cpu:.2} ({:.2} %) | {base_rss:.0} |",
        base_cpu / window.as_secs_f64() * 100.0
    );
    println!(
        "| {live} | {idle_cpu:.2} ({:.2} %) | {idle_rss:.0} |",
        idle_cpu / window.as_secs_f64() * 100.0
    );
    println!(
        "\n(the {} clients' own process: {client_cpu:.2} CPU s in all, connecting included)",
        args.sessions
    );
    Ok(())
}

/// Sessions opened: their endpoints (one per session name).
async fn st_sessions(st: &crate::e2e::Stack) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM endpoints WHERE transport = 'listen' AND deleted_at IS NULL \
         AND description LIKE 'railhook listen (c%'",
    )
    .fetch_one(&st.pool)
    .await
    .unwrap_or(-1)
}

/// `listen-clients`: opens `count` sessions (names c0…), prints "connected", and holds them
/// (answering pings) until killed.
pub async fn clients(args: ClientsArgs) -> anyhow::Result<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let ws = args.api.replacen("http://", "ws://", 1);
    let mut sockets = Vec::new();
    for i in 0..args.count {
        let mut req = format!("{ws}/v1/listen?name=c{i}").into_client_request()?;
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", args.key).parse().context("header")?,
        );
        let (socket, _) = tokio_tungstenite::connect_async(req).await?;
        sockets.push(socket);
    }
    println!("connected");
    let mut all = futures::stream::select_all(sockets.into_iter().map(|s| s.boxed()));
    while all.next().await.is_some() {}
    Ok(())
}
