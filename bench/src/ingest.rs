//! Ingest benchmark: events/s and latency of `POST /v1/events` (and `/v1/events/batch`) over
//! real HTTP, against `pgbench` running the same inserts in one transaction, in the same run.
//!
//! Railhook's API runs in this process on a fresh database (no relay or worker, so only
//! ingest is measured); the load comes from this process too, over loopback. The baseline is
//! a separate `pgbench` process with a script that writes the same rows a POST writes: the
//! Event (with an idempotency key), one Delivery per matching endpoint and one Outbox row per
//! Delivery, in one statement (one transaction, one WAL flush), prepared.
//!
//! Phases:
//! 1. for each endpoint count × concurrency: pgbench, then Railhook, closed loop for
//!    `--seconds`; events/s, p50/p90/p99/max, and the ratio;
//! 2. batches of `--batch-size` events: pgbench (the same rows for the whole batch in one
//!    statement) against `POST /v1/events/batch`;
//! 3. latency at half of the peak single-event rate (open loop, 1 endpoint);
//! 4. cost growth: the events table filled to each `--fill` size, then the same open-loop
//!    rate and a closed-loop peak again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use railhook_ingest::AppState;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::{Mutex, Semaphore, oneshot};

use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    /// Length of each measured phase.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Closed-loop concurrencies (comma-separated).
    #[arg(long, default_value = "16,64", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Matching endpoints per Event (comma-separated).
    #[arg(long, default_value = "1,5", value_delimiter = ',')]
    endpoints: Vec<usize>,
    /// Events per batch request in the batch phase.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch_size: usize,
    /// Events-table sizes for the cost-growth phase (comma-separated; 0 skips the fill).
    #[arg(long, default_value = "0,1000000,10000000", value_delimiter = ',')]
    fill: Vec<u64>,
    /// Skip phases 1–3 (only the cost-growth phase).
    #[arg(long)]
    growth_only: bool,
    /// Only phase 1 (for profiling and before/after comparisons).
    #[arg(long)]
    single_only: bool,
    /// Only the schema phase: the same load without and with a JSON Schema on the type.
    #[arg(long)]
    schema_only: bool,
    /// Only the filter phase: one plain endpoint, beside 0 and then each of `--filtered`
    /// endpoints whose payload filter declines the bench's Events.
    #[arg(long)]
    filters_only: bool,
    /// Filtered endpoints per project in the filter phase (comma-separated).
    #[arg(long, default_value = "10,100", value_delimiter = ',')]
    pub(crate) filtered: Vec<usize>,
}

pub(crate) const PAYLOAD: &str = r#"{"order_id": 1, "amount_cents": 4200, "currency": "EUR"}"#;

pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) key: String,
    pub(crate) project: String,
    pub(crate) pool: PgPool,
    pub(crate) url: String,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The API alone on a fresh database, with one project and `endpoints` endpoints, each
/// subscribed to every type.
pub(crate) async fn start_api(endpoints: usize) -> anyhow::Result<Api> {
    let bodies: Vec<Value> = (0..endpoints)
        .map(|n| json!({"url": format!("http://127.0.0.1:9/hook{n}")}))
        .collect();
    start_api_with(&bodies).await
}

/// The API alone on a fresh database, with one project and an endpoint made from each of
/// `bodies`, each subscribed to every type.
pub(crate) async fn start_api_with(bodies: &[Value]) -> anyhow::Result<Api> {
    let (mut s, url, pool) = crate::setup::fresh().await?;
    s.admin_token = Some(crate::setup::ADMIN_TOKEN.to_owned().into());
    s.db_max_connections = 40;
    pool.close().await;
    let pool = railhook_common::db::connect(&s)?;
    let state = AppState::new(pool.clone(), &s)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(railhook_ingest::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let (project, key) = crate::setup::tenant(&base, bodies).await?;
    Ok(Api {
        base,
        key,
        project,
        pool,
        url,
        stop: Some(stop),
    })
}

/// One measured run: completed operations, their latencies, and the wall time.
pub(crate) struct Run {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) events_per_op: usize,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Vec<Duration>,
}

impl Run {
    pub(crate) fn events_per_s(&self) -> f64 {
        (self.ok * self.events_per_op as u64) as f64 / self.elapsed.as_secs_f64()
    }

    /// Adds `other`, a later slice of the same load (an interleaved measurement's).
    pub(crate) fn merge(&mut self, other: Run) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }

    fn cells(&mut self) -> String {
        let p = percentiles(&mut self.latencies).unwrap_or([f64::NAN; 4]);
        format!(
            "{:>9.0} | {:>6.1} | {:>6.1} | {:>6.1} | {:>7.1}",
            self.events_per_s(),
            p[0],
            p[1],
            p[2],
            p[3]
        )
    }
}

fn event_body() -> Value {
    json!({"type": "order.paid", "payload": serde_json::from_str::<Value>(PAYLOAD).unwrap_or_default()})
}

/// What one request sends: a single Event, or a batch of `n`.
#[derive(Clone, Copy)]
pub(crate) enum Shape {
    Single,
    Batch(usize),
}

/// Where the load goes: cheap to clone into each client task.
#[derive(Clone)]
pub(crate) struct Target {
    base: String,
    key: String,
}

impl Api {
    /// The same API and database, as another of its projects (`key` is that project's).
    pub(crate) fn as_project(&self, project: String, key: String) -> Api {
        Api {
            base: self.base.clone(),
            key,
            project,
            pool: self.pool.clone(),
            url: self.url.clone(),
            stop: None,
        }
    }

    pub(crate) fn target(&self) -> Target {
        Target {
            base: self.base.clone(),
            key: self.key.clone(),
        }
    }
}

pub(crate) async fn post(http: &reqwest::Client, api: &Target, shape: Shape) -> bool {
    let req = match shape {
        Shape::Single => http
            .post(format!("{}/v1/events", api.base))
            .header("Idempotency-Key", ulid::Ulid::new().to_string())
            .json(&event_body()),
        Shape::Batch(n) => {
            let events: Vec<Value> = (0..n)
                .map(|_| {
                    let mut e = event_body();
                    e["idempotency_key"] = json!(ulid::Ulid::new().to_string());
                    e
                })
                .collect();
            http.post(format!("{}/v1/events/batch", api.base))
                .json(&json!({"events": events}))
        }
    };
    matches!(req.bearer_auth(&api.key).send().await, Ok(r) if r.status() == 201)
}

/// `concurrency` clients, each posting as soon as its previous request was answered.
pub(crate) async fn closed_loop(api: &Api, shape: Shape, concurrency: usize, seconds: u64) -> Run {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (http, errors, latencies) = (http.clone(), errors.clone(), latencies.clone());
        let api = api.target();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                if post(&http, &api, shape).await {
                    mine.push(t0.elapsed());
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies.lock().await.extend(mine);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed();
    let latencies = std::mem::take(&mut *latencies.lock().await);
    Run {
        ok: latencies.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        events_per_op: match shape {
            Shape::Single => 1,
            Shape::Batch(n) => n,
        },
        elapsed,
        latencies,
    }
}

/// Single Events at `rate` per second on a fixed schedule, whatever the answers' speed.
async fn open_loop(api: &Api, rate: f64, seconds: u64) -> Run {
    let http = reqwest::Client::new();
    let total = (rate * seconds as f64) as u64;
    let gap = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let in_flight = Arc::new(Semaphore::new(512));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until((started + gap * i as u32).into()).await;
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (http, errors, latencies) = (http.clone(), errors.clone(), latencies.clone());
        let api = api.target();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            if post(&http, &api, Shape::Single).await {
                latencies.lock().await.push(t0.elapsed());
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed();
    let latencies = std::mem::take(&mut *latencies.lock().await);
    Run {
        ok: latencies.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        events_per_op: 1,
        elapsed,
        latencies,
    }
}

pub(crate) async fn checkpoint(pool: &PgPool) {
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
}

pub(crate) const HEADER: &str = "| case | events/s | p50 ms | p90 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: | ---: | ---: |";

pub(crate) fn row(name: &str, run: &mut Run) {
    let errors = if run.errors > 0 {
        format!(" ({} errors)", run.errors)
    } else {
        String::new()
    };
    println!("| {name}{errors} | {} |", run.cells());
}

/// Fills `events` up to `target` rows in transactions of 100,000 (no Deliveries: the cost
/// that grows is the events table and its indexes). Ids ascend with age, as ULIDs do;
/// Idempotency-Keys are random, as clients' keys are.
async fn fill(api: &Api, target: u64) -> anyhow::Result<()> {
    let mut have: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&api.pool)
        .await?;
    let started = Instant::now();
    // One Event a second back from now: the day partitions they fall in must exist.
    sqlx::query(
        "SELECT railhook_ensure_partitions((now() - make_interval(secs => $1))::date, current_date)",
    )
    .bind(target as f64)
    .execute(&api.pool)
    .await?;
    while (have as u64) < target {
        let n = (target - have as u64).min(100_000) as i64;
        sqlx::query(
            "INSERT INTO events (id, project_id, event_type, payload, idempotency_key, created_at)
             SELECT left(railhook_ulid_floor('evt_', at), 14) || lpad(($4 + g)::text, 16, '0'),
                    $1, 'order.paid', $2::jsonb, md5(random()::text || g), at
             FROM generate_series(1, $3) g,
                  LATERAL (SELECT now() - make_interval(secs => $5 - $4 - g) AS at) t",
        )
        .bind(&api.project)
        .bind(PAYLOAD)
        .bind(n)
        .bind(have)
        .bind(target as i64)
        .execute(&api.pool)
        .await?;
        have += n;
        eprint!(
            "\r  filling events: {have} / {target} ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!();
    let _ = sqlx::query("VACUUM ANALYZE events")
        .execute(&api.pool)
        .await;
    checkpoint(&api.pool).await;
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.schema_only {
        return crate::feature_costs::schema_phase(&args).await;
    }
    if args.filters_only {
        return crate::feature_costs::filter_phase(&args).await;
    }
    let mut peak_single = 0.0f64;
    if !args.growth_only {
        println!(
            "## Single events, closed loop, {} s each\n\n{HEADER}",
            args.seconds
        );
        for &endpoints in &args.endpoints {
            let api = start_api(endpoints).await?;
            for &c in &args.concurrency {
                eprintln!("  {endpoints} endpoint(s), concurrency {c}: pgbench …");
                checkpoint(&api.pool).await;
                let mut base = crate::pgbench::run(&api, 1, c, args.seconds).await?;
                eprintln!("  {endpoints} endpoint(s), concurrency {c}: railhook …");
                checkpoint(&api.pool).await;
                let mut ours = closed_loop(&api, Shape::Single, c, args.seconds).await;
                let ratio = ours.events_per_s() / base.events_per_s();
                if endpoints == 1 {
                    peak_single = peak_single.max(ours.events_per_s());
                }
                row(
                    &format!("pgbench, {endpoints} endpoint(s), c={c}"),
                    &mut base,
                );
                row(
                    &format!("**railhook**, {endpoints} endpoint(s), c={c}"),
                    &mut ours,
                );
                println!(
                    "| ratio railhook ÷ pgbench | **{:.0} %** | | | | |",
                    ratio * 100.0
                );
            }
        }

        if args.single_only {
            return Ok(());
        }
        let n = args.batch_size;
        println!("\n## Batches of {n} events, 1 endpoint, concurrency 16\n\n{HEADER}");
        let api = start_api(1).await?;
        checkpoint(&api.pool).await;
        let mut base = crate::pgbench::run(&api, n, 16, args.seconds).await?;
        checkpoint(&api.pool).await;
        let mut ours = closed_loop(&api, Shape::Batch(n), 16, args.seconds).await;
        let ratio = ours.events_per_s() / base.events_per_s();
        row(&format!("pgbench, {n} events per transaction"), &mut base);
        row(
            &format!("**railhook** `POST /v1/events/batch` × {n}"),
            &mut ours,
        );
        println!(
            "| ratio railhook ÷ pgbench | **{:.0} %** | | | | |",
            ratio * 100.0
        );

        let half = (peak_single / 2.0).max(1.0);
        println!(
            "\n## Half of the peak single-event rate ({half:.0}/s), open loop, 1 endpoint\n\n{HEADER}"
        );
        let api = start_api(1).await?;
        checkpoint(&api.pool).await;
        let mut ours = open_loop(&api, half, args.seconds).await;
        row("**railhook** at half of peak", &mut ours);
    }

    println!("\n## Cost growth: the events table at each size, 1 endpoint\n");
    println!(
        "| events rows | open loop 200/s p50 ms | p99 ms | closed loop c=16 events/s | p99 ms |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: |");
    let api = start_api(1).await?;
    for &size in &args.fill {
        fill(&api, size).await?;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&api.pool)
            .await?;
        let mut open = open_loop(&api, 200.0, args.seconds).await;
        checkpoint(&api.pool).await;
        let mut closed = closed_loop(&api, Shape::Single, 16, args.seconds).await;
        let o = percentiles(&mut open.latencies).unwrap_or([f64::NAN; 4]);
        let c = percentiles(&mut closed.latencies).unwrap_or([f64::NAN; 4]);
        println!(
            "| {rows} | {:.1} | {:.1} | {:.0} | {:.1} |",
            o[0],
            o[2],
            closed.events_per_s(),
            c[2]
        );
    }
    Ok(())
}
