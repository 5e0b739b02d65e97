//! Events per second and CPU per message to each kind of endpoint (docs/DESTINATIONS.md),
//! with HTTP, measured in the same run, as the baseline: for each kind, the three roles
//! start as their own release processes on a fresh database, one endpoint of that kind is
//! created, a warm-up opens its connection, then an open-loop load of `--rate` Events/s for
//! `--seconds`. Measured: Deliveries SUCCEEDED per second over the window from the first
//! POST to the last success, the commit → acknowledgement latency of each (the Event row's
//! `created_at` to its Attempt's `finished_at`, both in Postgres), and the CPU of every
//! process (the three roles, the broker, Postgres, Redis, and the receiver's server) per
//! delivered message.
//!
//! The receivers: HTTP, the bench's own server; Kafka, a topic on the local broker (the
//! same tansu that carries Railhook's hints, so its CPU shows in the broker's row); SQS,
//! moto's server (spawned here); RabbitMQ, the node of deploy/local/rabbitmq.sh; NATS,
//! `nats-server -js` (spawned here). Topics, queues and streams are made by each broker's
//! own client (tests/transports/broker.py).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::e2e::{Arrivals, receiver};
use crate::roles::cpu::{Groups, used};
use crate::roles::{free_port, role_env, spawn_roles};
use crate::setup::unique;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 300)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Kinds to measure, in order (`http` first: the baseline).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http,kafka,sqs,rabbitmq,nats"
    )]
    kinds: Vec<String>,
    #[arg(long, default_value = "target/release/railhook")]
    railhook: std::path::PathBuf,
}

const SCRIPT: &str = "tests/transports/broker.py";
const WARM_UP: u64 = 20;

/// A receiver's server the bench started, stopped when dropped.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("a receiver's server did not start on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn setup(kind: &str, target: &Value) -> anyhow::Result<()> {
    let ok = Command::new("python3")
        .args([SCRIPT, "setup", kind, &target.to_string()])
        .status()
        .context("python3")?
        .success();
    if !ok {
        bail!("{SCRIPT} setup {kind} failed (deploy/local/lib.sh ensure_transport_brokers)");
    }
    Ok(())
}

/// The endpoint to create for `kind`, its receiver's server, and the process names of that
/// server (for its CPU).
async fn receiver_of(
    kind: &str,
    brokers: &str,
    arrivals: &Arrivals,
) -> anyhow::Result<(Value, Server, &'static [&'static str])> {
    let name = unique("bench-");
    Ok(match kind {
        "http" => {
            let hook = receiver(arrivals.clone()).await?;
            (json!({"url": hook}), Server(None), &[])
        }
        "kafka" => {
            let target = json!({"brokers": [brokers], "topic": name, "partitions": 3});
            setup("kafka", &target)?;
            let settings = json!({"brokers": [brokers], "topic": name, "key": "event_id"});
            (
                json!({"type": "kafka", "kafka": settings}),
                Server(None),
                &[],
            )
        }
        "sqs" => {
            let port = free_port()?;
            let child = Command::new("moto_server")
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("moto_server")?;
            let server = Server(Some(child));
            wait_port(port)?;
            let settings = json!({
                "queue_url": format!("http://127.0.0.1:{port}/123456789012/{name}"),
                "region": "us-east-1", "access_key_id": "AKIDBENCH",
                "secret_access_key": "bench", "endpoint_url": format!("http://127.0.0.1:{port}")});
            setup("sqs", &settings)?;
            (
                json!({"type": "sqs", "sqs": settings}),
                server,
                &["moto_server"],
            )
        }
        "rabbitmq" => {
            let url = std::env::var("RABBITMQ_URL")
                .context("RABBITMQ_URL (deploy/local/rabbitmq.sh up)")?;
            setup("rabbitmq", &json!({"url": url, "queue": name}))?;
            let settings = json!({"url": url, "exchange": "", "routing_key": name});
            (
                json!({"type": "rabbitmq", "rabbitmq": settings}),
                Server(None),
                &["beam.smp"],
            )
        }
        "nats" => {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(&name);
            let child = Command::new("nats-server")
                .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("nats-server")?;
            let server = Server(Some(child));
            wait_port(port)?;
            let url = format!("nats://127.0.0.1:{port}");
            let subject = format!("hooks.{name}");
            setup(
                "nats",
                &json!({"url": url, "subject": subject, "stream": name}),
            )?;
            let settings = json!({"url": url, "subject": subject, "jetstream": true});
            (
                json!({"type": "nats", "nats": settings}),
                server,
                &["nats-server"],
            )
        }
        other => bail!("unknown kind {other}"),
    })
}

/// One kind's figures.
struct Figures {
    kind: String,
    delivered: i64,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    railhook_cpu_ms: f64,
    all_cpu_ms: f64,
    receiver_cpu_ms: f64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for kind in &args.kinds {
        eprintln!(
            "transports: {kind}, {} events/s for {} s",
            args.rate, args.seconds
        );
        rows.push(one(&args, kind).await?);
    }
    println!(
        "## Events/s and CPU per message by endpoint type: {} Events/s offered for {} s\n",
        args.rate, args.seconds
    );
    println!(
        "| type | delivered | Deliveries/s | commit → ack p50 / p99 ms | Railhook CPU ms/msg | receiver's server CPU ms/msg | all-in CPU ms/msg | vs HTTP: Deliveries/s, Railhook CPU |"
    );
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |");
    let base = rows.iter().find(|r| r.kind == "http");
    for r in &rows {
        let ratio = base.map_or("n/a".to_owned(), |b| {
            format!(
                "{:.2}×, {:.2}×",
                r.per_second / b.per_second,
                r.railhook_cpu_ms / b.railhook_cpu_ms
            )
        });
        println!(
            "| {} | {} | {:.0} | {:.1} / {:.1} | {:.2} | {:.2} | {:.2} | {ratio} |",
            r.kind,
            r.delivered,
            r.per_second,
            r.p50_ms,
            r.p99_ms,
            r.railhook_cpu_ms,
            r.receiver_cpu_ms,
            r.all_cpu_ms
        );
    }
    Ok(())
}

async fn succeeded(pool: &sqlx::PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'SUCCEEDED'")
            .fetch_one(pool)
            .await?,
    )
}

async fn until_succeeded(pool: &sqlx::PgPool, n: i64, within: Duration) -> anyhow::Result<i64> {
    let deadline = Instant::now() + within;
    loop {
        let done = succeeded(pool).await?;
        if done >= n || Instant::now() > deadline {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn one(args: &Args, kind: &str) -> anyhow::Result<Figures> {
    let (settings, url, pool) = crate::setup::fresh().await?;
    let slot = unique("rh_bench_tr_");
    crate::setup::create_slot(&pool, &slot).await?;
    let arrivals: Arrivals = std::sync::Arc::default();
    let (endpoint, _server, receiver_names) =
        receiver_of(kind, &settings.kafka_brokers, &arrivals).await?;
    let http_addr = format!("127.0.0.1:{}", free_port()?);
    let api = format!("http://{http_addr}");
    let roles = spawn_roles(
        &args.railhook,
        &role_env(&settings, &url, &slot, &http_addr),
        None,
    )?;
    let result = load(args, kind, &api, &pool, endpoint, &roles, receiver_names).await;
    drop(roles);
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&pool)
        .await;
    result
}

async fn load(
    args: &Args,
    kind: &str,
    api: &str,
    pool: &sqlx::PgPool,
    endpoint: Value,
    roles: &[crate::roles::Role],
    receiver_names: &'static [&'static str],
) -> anyhow::Result<Figures> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    crate::roles::wait_ready(&http, api).await?;
    let (_, key) = crate::setup::tenant(api, &[endpoint]).await?;
    let post = |seq: u64| {
        http.post(format!("{api}/v1/events"))
            .bearer_auth(&key)
            .json(&json!({"type": "order.paid", "payload": {"seq": seq}}))
            .send()
    };
    for seq in 0..WARM_UP {
        post(u64::MAX - seq).await?;
    }
    let warm = WARM_UP as i64;
    if until_succeeded(pool, warm, Duration::from_secs(60)).await? < warm {
        bail!("{kind}: the warm-up was not delivered");
    }
    let pids: Vec<(&'static str, u32)> = roles.iter().map(|r| (r.name, r.child.id())).collect();
    let groups = Groups::new(&pids).with_named("receiver", receiver_names);
    let before = groups.read();
    let total = args.rate * args.seconds;
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for seq in 0..total {
        tokio::time::sleep_until((started + period * seq as u32).into()).await;
        let request = post(seq);
        tasks.push(tokio::spawn(async move {
            request.await.is_ok_and(|r| r.status().as_u16() == 201)
        }));
    }
    for t in tasks {
        t.await?;
    }
    let all = warm + total as i64;
    let done = until_succeeded(pool, all, Duration::from_secs(120)).await? - warm;
    let window = started.elapsed().as_secs_f64();
    let spent = used(&before, &groups.read());
    let latency: (Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
         FROM (SELECT extract(epoch FROM a.finished_at - e.created_at) * 1000 AS ms
               FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
               JOIN events e ON e.id = d.event_id
               WHERE a.outcome = 'SUCCEEDED' AND e.event_type = 'order.paid'
                 AND (e.payload->>'seq')::numeric < $1) t",
    )
    .bind(total as i64)
    .fetch_one(pool)
    .await?;
    let per = |cpu: f64| 1000.0 * cpu / done.max(1) as f64;
    let railhook: f64 = spent
        .iter()
        .filter(|(n, _)| matches!(n.as_str(), "ingest" | "relay" | "worker"))
        .map(|(_, c)| c)
        .sum();
    let receiver: f64 = spent
        .iter()
        .filter(|(n, _)| n == "receiver")
        .map(|(_, c)| c)
        .sum();
    let all_cpu: f64 = spent.iter().map(|(_, c)| c).sum();
    Ok(Figures {
        kind: kind.to_owned(),
        delivered: done,
        per_second: done as f64 / window,
        p50_ms: latency.0.unwrap_or(f64::NAN),
        p99_ms: latency.1.unwrap_or(f64::NAN),
        railhook_cpu_ms: per(railhook),
        receiver_cpu_ms: per(receiver),
        all_cpu_ms: per(all_cpu),
    })
}
