//! Isolation: does one failing endpoint slow everyone else down?
//!
//! Two runs on fresh stacks, same load: every Event fans out to ten endpoints.
//! 1. Baseline: all ten answer 204 at once.
//! 2. One of the ten fails: every other request gets a 500, the rest hang past the
//!    endpoint's 1 s timeout; its ladder retries every second (50 Attempts), so it keeps
//!    producing failing work for the whole run.
//!
//! For the nine healthy endpoints it prints POST → arrival latency (p50/p90/p99/max) in both
//! runs and the ratio, plus what the breaker and the Deferrals did. Target: healthy p99
//! within 2× of the baseline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use serde_json::{Value, json};

use crate::e2e::{seq_of, stack_with};
use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    /// Events per second (each goes to ten endpoints).
    #[arg(long, default_value_t = 50)]
    rate: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

const HEALTHY: usize = 9;

/// (endpoint index, seq) → first arrival.
type Arrivals = Arc<Mutex<HashMap<(usize, u64), Instant>>>;

async fn receivers(arrivals: Arrivals) -> anyhow::Result<String> {
    let failures = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/ok/{n}",
            post(move |Path(n): Path<usize>, body: String| {
                let arrivals = arrivals.clone();
                async move {
                    let at = Instant::now();
                    if let (Some(seq), Ok(mut a)) = (seq_of(&body), arrivals.lock()) {
                        a.entry((n, seq)).or_insert(at);
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        )
        .route(
            "/fail",
            post(move || {
                let k = failures.fetch_add(1, Ordering::Relaxed);
                async move {
                    if k % 2 == 1 {
                        // Past the endpoint's 1 s timeout.
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

struct Outcome {
    healthy: [f64; 4],
    delivered: usize,
    expected: usize,
    breaker_deferrals: u64,
    opened: u64,
    failing_attempts: u64,
}

async fn one_run(args: &Args, with_failing: bool) -> anyhow::Result<Outcome> {
    let arrivals: Arrivals = Arc::default();
    let base = receivers(arrivals.clone()).await?;
    let mut endpoints: Vec<Value> = (0..HEALTHY)
        .map(|n| json!({"url": format!("{base}/ok/{n}"), "timeout_ms": 5000}))
        .collect();
    endpoints.push(if with_failing {
        json!({"url": format!("{base}/fail"), "timeout_ms": 1000,
               "retry_delays_seconds": [1], "max_attempts": 50})
    } else {
        json!({"url": format!("{base}/ok/{HEALTHY}"), "timeout_ms": 5000})
    });
    let st = stack_with(&endpoints).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let total = args.rate * args.seconds;
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for seq in 0..total {
        tokio::time::sleep_until((started + period * seq as u32).into()).await;
        let (http, api, key, sent) = (http.clone(), st.api.clone(), st.key.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            sent.lock().map(|mut s| s.insert(seq, Instant::now())).ok();
            let _ = http
                .post(format!("{api}/v1/events"))
                .bearer_auth(&key)
                .json(&json!({"type": "order.paid", "payload": {"seq": seq}}))
                .send()
                .await;
        }));
        if seq % args.rate == 0 {
            eprint!(
                "\r  {} {seq}/{total}",
                if with_failing {
                    "with a failing endpoint"
                } else {
                    "all healthy"
                }
            );
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    eprintln!();
    let expected = total as usize * HEALTHY;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let healthy = arrivals
            .lock()
            .map(|a| a.keys().filter(|(n, _)| *n < HEALTHY).count())
            .unwrap_or(0);
        if healthy >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut latencies: Vec<Duration> = {
        let sent = sent.lock().map_err(|_| anyhow::anyhow!("lock"))?;
        let arrived = arrivals.lock().map_err(|_| anyhow::anyhow!("lock"))?;
        arrived
            .iter()
            .filter(|((n, _), _)| *n < HEALTHY)
            .filter_map(|((_, seq), at)| Some(at.saturating_duration_since(*sent.get(seq)?)))
            .collect()
    };
    let delivered = latencies.len();
    let healthy = percentiles(&mut latencies).unwrap_or([f64::NAN; 4]);
    let w = &st.worker;
    let outcome = Outcome {
        healthy,
        delivered,
        expected,
        breaker_deferrals: w.deferrals.with_label_values(&["breaker"]).get(),
        opened: w.breaker_transitions.with_label_values(&["open"]).get(),
        failing_attempts: w.attempts.with_label_values(&["retry"]).get(),
    };
    st.stop().await;
    Ok(outcome)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!(
        "isolation: {} events/s × 10 endpoints for {} s, twice",
        args.rate, args.seconds
    );
    let base = one_run(&args, false).await?;
    let hit = one_run(&args, true).await?;
    println!();
    println!(
        "## isolation: {} events/s to 10 endpoints for {} s; healthy endpoints' POST → arrival",
        args.rate, args.seconds
    );
    println!("| run | delivered (healthy) | p50 ms | p90 ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, o) in [
        ("all ten healthy (baseline)", &base),
        ("one failing (500s + timeouts)", &hit),
    ] {
        let [p50, p90, p99, max] = o.healthy;
        println!(
            "| {name} | {} of {} | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} |",
            o.delivered, o.expected
        );
    }
    println!(
        "| **ratio** (failing / baseline) | | **{:.2}×** | {:.2}× | **{:.2}×** | {:.2}× |",
        hit.healthy[0] / base.healthy[0],
        hit.healthy[1] / base.healthy[1],
        hit.healthy[2] / base.healthy[2],
        hit.healthy[3] / base.healthy[3]
    );
    println!();
    println!(
        "failing endpoint: {} failed Attempts, breaker opened {} time(s), {} breaker Deferrals",
        hit.failing_attempts, hit.opened, hit.breaker_deferrals
    );
    Ok(())
}
