//! End-to-end benchmark: POST /v1/events → ingest → Outbox → Slot → relay → Kafka → worker →
//! a fast local receiver, all real, in one process (release build).
//!
//! 1. Latency: `--rate` events/s for `--seconds`, each POSTed on its own schedule; per event,
//!    the time from just before the POST to the receiver's arrival.
//! 2. Throughput: `--burst` events through the batch endpoint as fast as they are accepted;
//!    deliveries/s from the first POST to the last arrival.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use axum::Router;
use axum::routing::post;
use railhook_ingest::AppState;
use railhook_relay::{Faults, RelayConfig, RelayMetrics};
use railhook_worker::{WorkerConfig, WorkerMetrics};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::setup::unique;
use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 20_000)]
    burst: u64,
}

pub(crate) type Arrivals = Arc<Mutex<HashMap<u64, Instant>>>;

/// The load's sequence number, `{"seq": n}` in the Event payload the receiver got.
pub(crate) fn seq_of(body: &str) -> Option<u64> {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["seq"].as_u64())
}

pub(crate) async fn receiver(arrivals: Arrivals) -> anyhow::Result<String> {
    let app = Router::new().route(
        "/hook",
        post(move |body: String| {
            let arrivals = arrivals.clone();
            async move {
                let at = Instant::now();
                if let (Some(seq), Ok(mut a)) = (seq_of(&body), arrivals.lock()) {
                    a.entry(seq).or_insert(at);
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

pub(crate) struct Stack {
    pub relay: RelayMetrics,
    pub worker: WorkerMetrics,
    pub api: String,
    pub key: String,
    pub stops: Vec<oneshot::Sender<()>>,
    pub pool: PgPool,
    pub slot: String,
}

impl Stack {
    /// Stops every role and drops the Slot.
    pub async fn stop(self) {
        drop(self.stops);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&self.slot)
            .execute(&self.pool)
            .await;
    }
}

async fn stack(receiver_url: &str) -> anyhow::Result<Stack> {
    stack_with(&[json!({"url": receiver_url})]).await
}

/// Ingest, relay and one worker on a fresh database, with one endpoint per body in
/// `endpoints`, each subscribed to every Event type.
pub(crate) async fn stack_with(endpoints: &[Value]) -> anyhow::Result<Stack> {
    let (mut s, _, pool) = crate::setup::fresh().await?;
    s.slot = unique("rh_bench_e2e_");
    s.topic_prefix = format!("{}.", unique("bench"));
    s.worker_group = unique("bench-");
    s.allow_private_targets = "127.0.0.0/8".into();
    s.worker_max_in_flight = 256;
    s.db_max_connections = 40;
    s.admin_token = Some(crate::setup::ADMIN_TOKEN.to_owned().into());
    pool.close().await;
    let pool = railhook_common::db::connect(&s)?;
    crate::setup::create_slot(&pool, &s.slot).await?;

    let mut stops = Vec::new();
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    let relay = RelayMetrics::new();
    let worker = WorkerMetrics::new();
    tokio::spawn(railhook_relay::run(
        RelayConfig::from_settings(&s)?,
        relay.clone(),
        Arc::new(Faults::default()),
        railhook_common::health::Dependencies::new(),
        async move {
            let _ = stopped.await;
        },
    ));
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    tokio::spawn(railhook_worker::run(
        WorkerConfig::from_settings(&s)?,
        pool.clone(),
        worker.clone(),
        railhook_common::health::Dependencies::new(),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut state = AppState::new(pool.clone(), &s)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = format!("http://{}", listener.local_addr()?);
    // `railhook listen` sessions are relayed to this listener, not RAILHOOK_HTTP_ADDR's.
    state.listen_relay_base.clone_from(&api);
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    tokio::spawn(railhook_ingest::serve(listener, state, async move {
        let _ = stopped.await;
    }));

    let (_, key) = crate::setup::tenant(&api, endpoints).await?;
    Ok(Stack {
        relay,
        worker,
        api,
        key,
        stops,
        pool,
        slot: s.slot.clone(),
    })
}

/// POSTs `count` Events, the i-th built by `event(i)`, through /v1/events/batch, 500 per
/// request, as fast as they are accepted.
pub(crate) async fn post_batches(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    count: u64,
    event: impl Fn(u64) -> Value,
) -> anyhow::Result<()> {
    let mut seq = 0;
    while seq < count {
        let n = 500.min(count - seq);
        let events: Vec<Value> = (seq..seq + n).map(&event).collect();
        let r = http
            .post(format!("{api}/v1/events/batch"))
            .bearer_auth(key)
            .json(&json!({"events": events}))
            .send()
            .await?;
        if r.status().as_u16() != 201 {
            bail!("batch refused: {}", r.status());
        }
        seq += n;
    }
    Ok(())
}

async fn wait_for(arrivals: &Arrivals, count: usize, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if arrivals.lock().map(|a| a.len()).unwrap_or(0) >= count {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let arrivals: Arrivals = Arc::default();
    let url = receiver(arrivals.clone()).await?;
    let st = stack(&url).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    // Warm-up: one event through the whole path.
    http.post(format!("{}/v1/events", st.api))
        .bearer_auth(&st.key)
        .json(&json!({"type": "bench.warmup", "payload": {"seq": u64::MAX}}))
        .send()
        .await?;
    if !wait_for(&arrivals, 1, Duration::from_secs(30)).await {
        bail!("the warm-up event never arrived");
    }
    arrivals.lock().map(|mut a| a.clear()).ok();

    eprintln!("e2e: {} events/s for {} s", args.rate, args.seconds);
    let total = args.rate * args.seconds;
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for seq in 0..total {
        tokio::time::sleep_until((started + period * seq as u32).into()).await;
        let (http, api, key, sent) = (http.clone(), st.api.clone(), st.key.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let at = Instant::now();
            sent.lock().map(|mut s| s.insert(seq, at)).ok();
            http.post(format!("{api}/v1/events"))
                .bearer_auth(&key)
                .json(&json!({"type": "order.paid", "payload": {"seq": seq}}))
                .send()
                .await
                .map(|r| (r.status().as_u16(), at.elapsed()))
        }));
    }
    let mut refused = 0;
    let mut post_latency = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok((201, took))) => post_latency.push(took),
            _ => refused += 1,
        }
    }
    wait_for(&arrivals, total as usize, Duration::from_secs(60)).await;
    let mut latencies: Vec<Duration> = {
        let (sent, arrived) = (
            sent.lock().map_err(|_| anyhow::anyhow!("lock"))?,
            arrivals.lock().map_err(|_| anyhow::anyhow!("lock"))?,
        );
        sent.iter()
            .filter_map(|(seq, at)| {
                arrived
                    .get(seq)
                    .map(|got| got.saturating_duration_since(*at))
            })
            .collect()
    };
    let delivered = latencies.len();
    println!();
    println!(
        "## POST /v1/events → receiver at {} events/s for {} s (1 endpoint)",
        args.rate, args.seconds
    );
    println!("| measure | p50 ms | p90 ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    if let Some([p50, p90, p99, max]) = percentiles(&mut latencies) {
        println!(
            "| POST → webhook at the receiver ({delivered} of {total}; {refused} not 201) | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} |"
        );
    }

    if let Some([p50, p90, p99, max]) = percentiles(&mut post_latency) {
        println!("| of which POST → 201 | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} |");
    }
    let (ack, claims) = (
        &st.relay.commit_to_ack_seconds,
        st.worker.claim_misses.get(),
    );
    println!(
        "| of which commit → Kafka ack (relay histogram) | {:.1} | {:.1} | {:.1} | — |",
        crate::stats::histogram_quantile(ack, 0.5),
        crate::stats::histogram_quantile(ack, 0.9),
        crate::stats::histogram_quantile(ack, 0.99)
    );
    let _ = claims;

    arrivals.lock().map(|mut a| a.clear()).ok();
    let started = Instant::now();
    post_batches(
        &http,
        &st.api,
        &st.key,
        args.burst,
        |i| json!({"type": "order.paid", "payload": {"seq": 1_000_000 + i}}),
    )
    .await?;
    let accepted = started.elapsed();
    let complete = wait_for(&arrivals, args.burst as usize, Duration::from_secs(300)).await;
    let elapsed = started.elapsed();
    let got = arrivals.lock().map(|a| a.len()).unwrap_or(0);
    println!();
    println!(
        "## burst: {} events via /v1/events/batch (500 per request), 1 endpoint",
        args.burst
    );
    println!("| measure | value |");
    println!("| --- | ---: |");
    println!(
        "| accepted (201) in | {:.2} s ({:.0} events/s) |",
        accepted.as_secs_f64(),
        args.burst as f64 / accepted.as_secs_f64()
    );
    println!(
        "| delivered {} of {} in | {:.2} s |",
        got,
        args.burst,
        elapsed.as_secs_f64()
    );
    println!(
        "| **deliveries/s** (first POST → last arrival) | **{:.0}** |",
        got as f64 / elapsed.as_secs_f64()
    );
    if !complete {
        println!("(not all arrived within the limit)");
    }
    st.stop().await;
    Ok(())
}
