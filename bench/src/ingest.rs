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

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use railhook_ingest::AppState;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::{Mutex, Semaphore, oneshot};

use crate::setup::unique;
use crate::stats::percentiles;

#[derive(clap::Args)]
pub struct Args {
    /// Length of each measured phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Closed-loop concurrencies (comma-separated).
    #[arg(long, default_value = "16,64", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Matching endpoints per Event (comma-separated).
    #[arg(long, default_value = "1,5", value_delimiter = ',')]
    endpoints: Vec<usize>,
    /// Events per batch request in the batch phase.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
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
    filtered: Vec<usize>,
}

const PAYLOAD: &str = r#"{"order_id": 1, "amount_cents": 4200, "currency": "EUR"}"#;

pub(crate) struct Api {
    base: String,
    key: String,
    pub(crate) project: String,
    pub(crate) pool: PgPool,
    url: String,
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
async fn start_api_with(bodies: &[Value]) -> anyhow::Result<Api> {
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

/// One plain endpoint and `filtered` endpoints, each subscribed to every type, whose payload
/// filter declines the bench's Events (so every Event still makes one Delivery: the cost
/// measured is the filters' alone).
fn filtered_endpoints(filtered: usize) -> Vec<Value> {
    let mut bodies = vec![json!({"url": "http://127.0.0.1:9/plain"})];
    bodies.extend((0..filtered).map(|n| {
        json!({
            "url": format!("http://127.0.0.1:9/filtered{n}"),
            // The bench's payload has 4200 cents: declined by every one.
            "filter": format!("$.amount_cents > {} && $.currency == \"EUR\"", 10_000 + n),
        })
    }));
    bodies
}

/// Payload filters' cost (issue #42): single Events (c=16) and batches, from a project with
/// one plain endpoint and from projects with 10 and 100 filtered endpoints beside it, all on
/// one database (so each meets the same table, with statistics), after pgbench wrote the
/// first project's rows there: the raw-Postgres baseline of the same run.
async fn filter_phase(args: &Args) -> anyhow::Result<()> {
    let n = args.batch_size;
    println!(
        "## Payload filters: 1 plain endpoint + N filtered ones (each declines), {} s each\n\n{HEADER}",
        args.seconds
    );
    let plain = start_api_with(&filtered_endpoints(0)).await?;
    let mut projects = Vec::new();
    for &filtered in &args.filtered {
        let (project, key) =
            crate::setup::tenant(&plain.base, &filtered_endpoints(filtered)).await?;
        projects.push((filtered, project, key));
    }
    checkpoint(&plain.pool).await;
    let mut base = pgbench(&plain, 1, 16, args.seconds).await?;
    row("pgbench, 1 Delivery per Event, c=16", &mut base);
    let mut none = None;
    let mut runs = vec![(0, plain.project.clone(), plain.key.clone())];
    runs.extend(projects);
    for (filtered, project, key) in runs {
        let api = Api {
            base: plain.base.clone(),
            key,
            project,
            pool: plain.pool.clone(),
            url: plain.url.clone(),
            stop: None,
        };
        checkpoint(&api.pool).await;
        let mut single = closed_loop(&api, Shape::Single, 16, args.seconds).await;
        checkpoint(&api.pool).await;
        let mut batch = closed_loop(&api, Shape::Batch(n), 16, args.seconds).await;
        row(
            &format!("**single**, {filtered} filtered, c=16"),
            &mut single,
        );
        row(
            &format!("batch of {n}, {filtered} filtered, c=16"),
            &mut batch,
        );
        let (s1, b1) = (single.events_per_s(), batch.events_per_s());
        match none {
            None => none = Some((s1, b1)),
            Some((s0, b0)) => println!(
                "| cost of {filtered} filters: single **{:.0} %**, batch **{:.0} %** | | | | | |",
                (1.0 - s1 / s0) * 100.0,
                (1.0 - b1 / b0) * 100.0
            ),
        }
    }
    Ok(())
}

/// One measured run: completed operations, their latencies, and the wall time.
struct Run {
    ok: u64,
    errors: u64,
    events_per_op: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn events_per_s(&self) -> f64 {
        (self.ok * self.events_per_op as u64) as f64 / self.elapsed.as_secs_f64()
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
async fn closed_loop(api: &Api, shape: Shape, concurrency: usize, seconds: u64) -> Run {
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

/// The baseline: pgbench writing the rows `events` Events make, in one prepared statement
/// per transaction, with `concurrency` clients.
async fn pgbench(
    api: &Api,
    events: usize,
    concurrency: usize,
    seconds: u64,
) -> anyhow::Result<Run> {
    let dir = std::env::temp_dir().join(unique("rh_pgbench_"));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("ingest.sql");
    let project = &api.project;
    // Ids carry the time like Railhook's ULIDs (the day partitions are keyed by it) and are
    // unique by their random tail; the idempotency key is set, so its index is maintained
    // exactly as for an API request with the header (the baseline takes no key lock).
    let sql = format!(
        "WITH e AS (INSERT INTO events (id, project_id, event_type, payload, idempotency_key) \
           SELECT left(railhook_ulid_floor('evt_', clock_timestamp()), 14) || substr(md5(random()::text), 1, 16), \
                  '{project}', 'order.paid', \
                  '{PAYLOAD}'::jsonb, md5(random()::text) FROM generate_series(1, {events}) RETURNING id), \
         d AS (INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id) \
           SELECT 'dlv_' || substr(e.id, 5, 10) || substr(md5(random()::text || e.id), 1, 16), \
                  '{project}', e.id, s.endpoint_id, s.id \
           FROM e CROSS JOIN subscriptions s WHERE s.project_id = '{project}' RETURNING id, endpoint_id) \
         INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason) \
           SELECT id, endpoint_id, '{project}', 'CREATED' FROM d;\n"
    );
    std::fs::write(&script, sql)?;
    let prefix = dir.join("log");
    let out = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-l"])
        .arg(format!("--log-prefix={}", prefix.display()))
        .args(["-c", &concurrency.to_string(), "-j", "2"])
        .args(["-T", &seconds.to_string()])
        .arg("-f")
        .arg(&script)
        .arg(&api.url)
        .output()
        .await
        .context("pgbench (apt-get install postgresql-contrib or postgresql-client)")?;
    if !out.status.success() {
        bail!("pgbench failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let latencies = read_pgbench_logs(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Ok(Run {
        ok: latencies.len() as u64,
        errors: failed,
        events_per_op: events,
        elapsed: Duration::from_secs(seconds),
        latencies,
    })
}

/// pgbench's per-transaction log: `client tx latency_us script epoch us`.
fn read_pgbench_logs(dir: &Path) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("log"))
        {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            if let Some(us) = line
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
            {
                out.push(Duration::from_micros(us));
            }
        }
    }
    Ok(out)
}

async fn checkpoint(pool: &PgPool) {
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
}

const HEADER: &str = "| case | events/s | p50 ms | p90 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: | ---: | ---: |";

fn row(name: &str, run: &mut Run) {
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

/// The event-type catalogue's cost: single Events (c=16) and batches of `batch_size`, one
/// endpoint, first with no schema on `order.paid`, then with one that the bench's payload
/// satisfies (so every Event is validated and accepted), on the same database.
async fn schema_phase(args: &Args) -> anyhow::Result<()> {
    let api = start_api(1).await?;
    let n = args.batch_size;
    println!(
        "## Event-type schema: without and with, 1 endpoint, {} s each\n\n{HEADER}",
        args.seconds
    );
    let mut runs = Vec::new();
    for with_schema in [false, true] {
        if with_schema {
            let schema = json!({
                "type": "object",
                "required": ["order_id", "amount_cents", "currency"],
                "properties": {
                    "order_id": {"type": "integer", "minimum": 1},
                    "amount_cents": {"type": "integer", "minimum": 0},
                    "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]}
                },
                "additionalProperties": false
            });
            let r = reqwest::Client::new()
                .post(format!("{}/v1/event-types", api.base))
                .bearer_auth(&api.key)
                .json(&json!({"name": "order.paid", "schema": schema}))
                .send()
                .await?;
            anyhow::ensure!(r.status() == 201, "event type: {}", r.status());
        }
        let label = if with_schema {
            "with schema"
        } else {
            "no schema"
        };
        checkpoint(&api.pool).await;
        let mut single = closed_loop(&api, Shape::Single, 16, args.seconds).await;
        checkpoint(&api.pool).await;
        let mut batch = closed_loop(&api, Shape::Batch(n), 16, args.seconds).await;
        row(&format!("single, c=16, {label}"), &mut single);
        row(&format!("batch of {n}, c=16, {label}"), &mut batch);
        runs.push((single.events_per_s(), batch.events_per_s()));
    }
    println!(
        "| ratio with ÷ without schema: single **{:.0} %**, batch **{:.0} %** | | | | | |",
        runs[1].0 / runs[0].0 * 100.0,
        runs[1].1 / runs[0].1 * 100.0
    );
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.schema_only {
        return schema_phase(&args).await;
    }
    if args.filters_only {
        return filter_phase(&args).await;
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
                let mut base = pgbench(&api, 1, c, args.seconds).await?;
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
        let mut base = pgbench(&api, n, 16, args.seconds).await?;
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
