//! Crash and fault scenarios with real processes: `railhook ingest`, two relays, two workers
//! (each its own OS process), a private Kafka-protocol broker, the local Postgres and Redis,
//! and three HTTP receivers. Each scenario streams Events to three endpoints, breaks
//! something mid-stream (kill -9 a relay or a worker, stop the broker, crash-restart
//! Postgres, pause a worker, make the receivers misbehave, cut the network to them — they
//! then live on a far host behind a router, support/netns.rs), then checks that every
//! accepted Event's Deliveries reached their receivers, counting duplicate arrivals (each
//! must carry a `webhook-id` already seen) and printing one table row per scenario.
//!
//! `RAILHOOK_RELIABILITY_EVENTS` sets the stream length (default 2,000 per scenario, the
//! short suite that runs in CI); the long run (10,000) and its table are in
//! docs/RELIABILITY.md.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::netns::FarHost;
use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::relay::PrivateBroker;
use crate::support::{ADMIN_TOKEN, free_port, fresh_database, local_setting};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    RelayKilledWithStandby,
    RelayKilledAlone,
    WorkerKilledMidAttempt,
    BrokerStopped,
    PostgresRestarted,
    PostgresFastRestart,
    WorkerPausedPastTheSweep,
    FlakyReceivers,
    ReceiversPartitioned,
}

impl Scenario {
    const ALL: [Scenario; 9] = [
        Scenario::RelayKilledWithStandby,
        Scenario::RelayKilledAlone,
        Scenario::WorkerKilledMidAttempt,
        Scenario::BrokerStopped,
        Scenario::PostgresRestarted,
        Scenario::PostgresFastRestart,
        Scenario::WorkerPausedPastTheSweep,
        Scenario::FlakyReceivers,
        Scenario::ReceiversPartitioned,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::RelayKilledWithStandby => "kill -9 the active relay (standby running)",
            Scenario::RelayKilledAlone => "kill -9 the only relay, restarted after 3 s",
            Scenario::WorkerKilledMidAttempt => "kill -9 a worker mid-stream, restarted after 3 s",
            Scenario::BrokerStopped => "broker killed for 60 s, then restarted",
            Scenario::PostgresRestarted => "Postgres crash-restart (pg_ctl -m immediate)",
            Scenario::PostgresFastRestart => "Postgres fast restart (pg_ctl -m fast)",
            Scenario::WorkerPausedPastTheSweep => {
                "SIGSTOP a worker past the processing sweep, then SIGCONT"
            }
            Scenario::FlakyReceivers => {
                "receivers answer 500s, resets, hang past the timeout, stall after the status line"
            }
            Scenario::ReceiversPartitioned => {
                "network partition: every packet to and from the receivers dropped for 20 s"
            }
        }
    }
}

/// One `railhook <role>` process.
struct Proc {
    role: &'static str,
    child: Child,
    metrics: String,
}

impl Proc {
    fn kill9(&mut self) {
        // std's kill is SIGKILL on Unix: no shutdown path runs.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Stack {
    env: Vec<(String, String)>,
    api: String,
    procs: Vec<Proc>,
}

impl Stack {
    fn spawn(&mut self, role: &'static str) {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_railhook"));
        cmd.arg(role)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RAILHOOK_METRICS_ADDR", &addr)
            .stdout(log_file(&format!("{role}-{port}")))
            .stderr(Stdio::null());
        // Every role's /metrics on its metrics port (the API port serves none without a
        // metrics token).
        if role == "ingest" {
            let http = self.api.trim_start_matches("http://").to_owned();
            cmd.env("RAILHOOK_HTTP_ADDR", &http);
        }
        let metrics = format!("http://{addr}/metrics");
        let child = cmd.spawn().expect("railhook");
        self.procs.push(Proc {
            role,
            child,
            metrics,
        });
    }

    /// Each process: alive or not, and its gauges that tell where a stream stopped.
    async fn diagnose(&mut self) -> String {
        let mut out = String::new();
        for p in &mut self.procs {
            let alive = matches!(p.child.try_wait(), Ok(None));
            out.push_str(&format!("{} (alive: {alive})\n", p.role));
            let page = match reqwest::get(&p.metrics).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => format!("metrics unreachable: {e}"),
            };
            for line in page.lines().filter(|l| {
                !l.starts_with('#')
                    && [
                        "active",
                        "lag",
                        "rejoin",
                        "published",
                        "claimed",
                        "attempts_total",
                    ]
                    .iter()
                    .any(|k| l.contains(k))
            }) {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }

    /// Index of the relay whose `railhook_relay_active` is 1.
    async fn active_relay(&self) -> Option<usize> {
        for (i, p) in self.procs.iter().enumerate() {
            if p.role != "relay" {
                continue;
            }
            let Ok(r) = reqwest::get(&p.metrics).await else {
                continue;
            };
            let page = r.text().await.unwrap_or_default();
            if page.lines().any(|l| l.trim() == "railhook_relay_active 1") {
                return Some(i);
            }
        }
        None
    }

    fn kill_and_forget(&mut self, index: usize) {
        let mut p = self.procs.remove(index);
        p.kill9();
    }
}

/// Where a process's log goes: nowhere, or `$RAILHOOK_RELIABILITY_LOGS/<name>.log` when
/// that is set (for diagnosing a failed run).
fn log_file(name: &str) -> Stdio {
    match std::env::var("RAILHOOK_RELIABILITY_LOGS") {
        Ok(dir) => {
            std::fs::create_dir_all(&dir).expect("log dir");
            let path = std::path::Path::new(&dir).join(format!("{name}.log"));
            std::fs::File::create(path).expect("log file").into()
        }
        Err(_) => Stdio::null(),
    }
}

struct Row {
    scenario: Scenario,
    accepted: usize,
    delivered: usize,
    lost: usize,
    duplicates: usize,
    unknown_duplicates: usize,
    max_delay: Duration,
    /// Attempts whose outcome the Fence refused (the worker had lost its Claim).
    fenced: i64,
}

const ENDPOINTS: usize = 3;

async fn call(http: &reqwest::Client, api: &str, token: &str, path: &str, body: Value) -> Value {
    let r = http
        .post(format!("{api}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("setup call");
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.expect("json")
}

/// How long a SIGSTOPped worker stays stopped: past the processing timeout (and the
/// consumer session), so its Claims are swept and taken over while it sleeps.
const PAUSE: Duration = Duration::from_secs(20);
const PROCESSING_TIMEOUT_SECONDS: &str = "12";
/// How long the receivers are cut off: several Attempt timeouts (2 s here), enough for the
/// circuit breaker to open and defer.
const PARTITION: Duration = Duration::from_secs(20);
/// How long the broker stays down: longer than the relay's message timeout (15 s here) and
/// the consumers' session timeout (10 s), so both give up on it and must recover.
const BROKER_DOWN: Duration = Duration::from_secs(60);

fn restart_postgres(mode: &str) {
    pg_ctl(mode, "restart");
}

/// `pg_ctl ACTION` on the local cluster, as its owner.
fn pg_ctl(mode: &str, action: &str) {
    let data = local_setting("RAILHOOK_PG_DATA");
    let status = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(format!(
            "{}/pg_ctl",
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned())
        ))
        // A stop waits for the shutdown checkpoint, which fsyncs every file the suite's
        // test databases made (about 70,000 by this binary's turn): seen past 60 s on a
        // machine also running a release build.
        .args(["-D", &data, "-m", mode, "-w", "-t", "300", action])
        .args(["-l", &format!("{data}/../server.log")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("pg_ctl");
    assert!(status.success(), "pg_ctl {action}");
}

/// Starts the local cluster again when dropped, so a failed assertion never leaves the
/// other tests without Postgres.
struct PostgresDown;

impl PostgresDown {
    fn stop() -> Self {
        pg_ctl("fast", "stop");
        PostgresDown
    }
}

impl Drop for PostgresDown {
    fn drop(&mut self) {
        pg_ctl("fast", "start");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_finishes_while_postgres_is_down_keeps_its_row() {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let p = Pipeline::start(|_| {}).await;
    // The receiver answers 4 s after the request arrives; Postgres is down from just after
    // it arrived until 35 s later, past the four tries the outcome's write used to get (each
    // waits out the pool's 5 s acquire time-out: about 26 s in all).
    let receiver = Receiver::start(vec![], Behaviour::Delay(Duration::from_secs(4), 200)).await;
    let (_, _) = p.endpoint(&receiver.url, 30_000).await;
    let (_, delivery) = p.send(serde_json::json!({"n": 1})).await;
    crate::support::eventually(
        "the request at the receiver",
        Duration::from_secs(60),
        || async { (receiver.count() == 1).then_some(()) },
    )
    .await;
    {
        let _down = PostgresDown::stop();
        tokio::time::sleep(Duration::from_secs(35)).await;
    }
    p.wait_status(&delivery, "SUCCEEDED", Duration::from_secs(60))
        .await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE delivery_id = $1")
        .bind(&delivery)
        .fetch_one(&p.app.pool)
        .await
        .expect("attempts");
    assert_eq!(rows, 1, "one request sent, one attempt row");
    assert_eq!(receiver.count(), 1, "the request was not sent again");
    p.stop().await;
}

async fn run(scenario: Scenario, events: usize) -> Row {
    let database_url = fresh_database().await;
    let mut broker = PrivateBroker::start();
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let slot = format!("rh_rel_{id}");
    let env: Vec<(String, String)> = [
        ("DATABASE_URL", database_url.clone()),
        ("REDIS_URL", local_setting("REDIS_URL")),
        ("KAFKA_BROKERS", broker.brokers.clone()),
        ("RAILHOOK_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
        ("RAILHOOK_SLOT", slot.clone()),
        ("RAILHOOK_PUBLICATION", slot.clone()),
        ("RAILHOOK_TOPIC_PREFIX", format!("rel{id}.")),
        ("RAILHOOK_WORKER_GROUP", format!("g{id}")),
        ("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8".to_owned()),
        ("RAILHOOK_KAFKA_PARTITIONS", "3".to_owned()),
        ("RAILHOOK_KAFKA_MESSAGE_TIMEOUT_MS", "15000".to_owned()),
        ("RAILHOOK_RETRY_OUTGOING_DELAYS", "1,1,2,2,5,5".to_owned()),
        ("RAILHOOK_RETRY_OVERLOAD_FLOOR_MS", "0".to_owned()),
        // The flaky receivers fail about half of their first 3,000 requests: seven Attempts
        // in a row can all land on failures (seen once: 1 Delivery of 6,000 FAILED with its
        // ladder used up, which this harness counts as lost). Twenty make that about 1e-6.
        ("RAILHOOK_RETRY_OUTGOING_MAX_ATTEMPTS", "20".to_owned()),
        ("RAILHOOK_RETRY_SCHEDULER_MS", "500".to_owned()),
        ("RAILHOOK_SWEEP_MS", "2000".to_owned()),
        // Short, so a paused worker's Claims are swept within the test. Since RetryHints
        // waiting in Kafka are no longer swept on this timeout (hinted_at), a short one no
        // longer makes the scheduler churn under a backlog (docs/RELIABILITY.md).
        (
            "RAILHOOK_PROCESSING_TIMEOUT_SECONDS",
            PROCESSING_TIMEOUT_SECONDS.to_owned(),
        ),
        // The processing timeout must exceed the largest endpoint timeout by 5 s.
        ("RAILHOOK_ENDPOINT_TIMEOUT_MAX_MS", "5000".to_owned()),
        ("RAILHOOK_STRANDED_AFTER_SECONDS", "120".to_owned()),
        ("RAILHOOK_DB_MAX_CONNECTIONS", "10".to_owned()),
        // The flaky receivers fail about half their requests on purpose; a breaker opening on
        // them would only stretch the run (the breaker has its own tests).
        ("RAILHOOK_BREAKER_CONSECUTIVE_FAILURES", "100000".to_owned()),
        ("RAILHOOK_BREAKER_FAILURE_RATE", "1.0".to_owned()),
        ("RAILHOOK_DEFERRAL_MAX_SECONDS", "5".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    // The partitioned receivers sit on a far host (support/netns.rs), and there the breaker
    // works as in production (its defaults, with a short cooldown): a partition is what it
    // is for, and its Deferrals keep Deliveries from spending their Attempts on a dead link.
    let far = (scenario == Scenario::ReceiversPartitioned).then(FarHost::new);
    let mut env = env;
    if far.is_some() {
        for (k, v) in [
            (
                "RAILHOOK_ALLOW_PRIVATE_TARGETS",
                "127.0.0.0/8,10.231.0.0/16",
            ),
            ("RAILHOOK_BREAKER_CONSECUTIVE_FAILURES", "5"),
            ("RAILHOOK_BREAKER_FAILURE_RATE", "0.5"),
            ("RAILHOOK_BREAKER_COOLDOWN_SECONDS", "5"),
        ] {
            env.retain(|(key, _)| key != k);
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("migrate")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut stack = Stack {
        env,
        api: format!("http://127.0.0.1:{}", free_port()),
        procs: Vec::new(),
    };
    stack.spawn("ingest");
    stack.spawn("relay");
    if scenario != Scenario::RelayKilledAlone {
        stack.spawn("relay");
    }
    stack.spawn("worker");
    // The first worker joins the group alone and leads it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.spawn("worker");

    let http = reqwest::Client::new();
    crate::support::eventually("ingest ready", Duration::from_secs(30), || async {
        http.get(format!("{}/readyz", stack.api))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let api = stack.api.clone();
    let org = call(
        &http,
        &api,
        ADMIN_TOKEN,
        "/v1/organizations",
        json!({"name": "rel", "monthly_quota": 10_000_000}),
    )
    .await;
    let project = call(
        &http,
        &api,
        ADMIN_TOKEN,
        "/v1/projects",
        json!({"organization_id": org["id"], "name": "rel"}),
    )
    .await;
    let key = project["api_key"].as_str().expect("key").to_owned();
    let mut receivers = Vec::new();
    for _ in 0..ENDPOINTS {
        // A few ms per request, so Attempts are in flight when something dies; 150 ms when
        // a worker is paused, so it is surely paused mid-Attempt.
        let rx = match scenario {
            Scenario::FlakyReceivers => {
                Receiver::start(flaky_script(), Behaviour::Status(204)).await
            }
            Scenario::WorkerPausedPastTheSweep => {
                Receiver::start(vec![], Behaviour::Delay(Duration::from_millis(150), 204)).await
            }
            _ => match &far {
                Some(far) => Receiver::start_on(
                    far.bind(),
                    vec![],
                    Behaviour::Delay(Duration::from_millis(5), 204),
                ),
                None => {
                    Receiver::start(vec![], Behaviour::Delay(Duration::from_millis(5), 204)).await
                }
            },
        };
        let ep = call(
            &http,
            &api,
            &key,
            "/v1/endpoints",
            json!({"url": rx.url, "timeout_ms": 2000}),
        )
        .await;
        call(
            &http,
            &api,
            &key,
            "/v1/subscriptions",
            json!({"endpoint_id": ep["id"], "event_types": ["order.*"]}),
        )
        .await;
        receivers.push(rx);
    }

    // The stream: batches of 20, four at a time; a failed POST is retried with the same
    // Idempotency-Keys (as a careful client would), so "accepted" is every 2xx answer.
    let posted = Arc::new(AtomicUsize::new(0));
    let accepted: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut tasks = Vec::new();
    let batches: Vec<usize> = (0..events).step_by(20).collect();
    let chunks: Vec<Vec<usize>> = batches
        .chunks(batches.len().div_ceil(4))
        .map(<[usize]>::to_vec)
        .collect();
    for chunk in chunks {
        let (http, api, key, posted, accepted) = (
            http.clone(),
            api.clone(),
            key.clone(),
            posted.clone(),
            accepted.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for start in chunk {
                let items: Vec<Value> = (start..(start + 20).min(events))
                    .map(|i| json!({"type": "order.paid", "payload": {"i": i}, "idempotency_key": format!("k{i}")}))
                    .collect();
                let n = items.len();
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    let r = http
                        .post(format!("{api}/v1/events/batch"))
                        .bearer_auth(&key)
                        .json(&json!({ "events": items }))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    if let Ok(r) = r
                        && r.status().is_success()
                    {
                        let body: Value = r.json().await.expect("json");
                        let now = Instant::now();
                        let mut a = accepted.lock().expect("lock");
                        for e in body["data"].as_array().expect("data") {
                            for d in e["deliveries"].as_array().expect("deliveries") {
                                a.entry(d["id"].as_str().expect("id").to_owned()).or_insert(now);
                            }
                        }
                        break;
                    }
                    assert!(Instant::now() < deadline, "ingest never accepted a batch");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                posted.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    // Mid-stream: break something.
    crate::support::eventually(
        "a third of the stream",
        Duration::from_secs(120),
        || async { (posted.load(Ordering::Relaxed) >= events / 3).then_some(()) },
    )
    .await;
    match scenario {
        Scenario::RelayKilledWithStandby | Scenario::RelayKilledAlone => {
            let i = crate::support::eventually("an active relay", Duration::from_secs(30), || {
                stack.active_relay()
            })
            .await;
            stack.kill_and_forget(i);
            if scenario == Scenario::RelayKilledAlone {
                tokio::time::sleep(Duration::from_secs(3)).await;
                stack.spawn("relay");
            }
        }
        Scenario::WorkerKilledMidAttempt => {
            // The worker that joined the group last: the survivor is then the group's
            // leader, the case in which tansu 0.6.0 kept the dead member's partitions
            // assigned to it (docs/RELIABILITY.md).
            let i = stack
                .procs
                .iter()
                .rposition(|p| p.role == "worker")
                .expect("worker");
            // Only once it holds partitions (its lag gauge lists what it fetches).
            let metrics = stack.procs[i].metrics.clone();
            crate::support::eventually(
                "the second worker holds partitions",
                Duration::from_secs(60),
                || holds_partitions(&metrics),
            )
            .await;
            stack.kill_and_forget(i);
            tokio::time::sleep(Duration::from_secs(3)).await;
            stack.spawn("worker");
        }
        Scenario::BrokerStopped => {
            broker.kill();
            tokio::time::sleep(BROKER_DOWN).await;
            broker.restart();
        }
        Scenario::PostgresRestarted => {
            tokio::task::spawn_blocking(|| restart_postgres("immediate"))
                .await
                .expect("restart");
        }
        Scenario::PostgresFastRestart => {
            tokio::task::spawn_blocking(|| restart_postgres("fast"))
                .await
                .expect("restart");
        }
        Scenario::WorkerPausedPastTheSweep => {
            // Only once deliveries are flowing, so Attempts are surely in flight.
            crate::support::eventually("deliveries flowing", Duration::from_secs(60), || async {
                (receivers.iter().map(Receiver::count).sum::<usize>() >= 300).then_some(())
            })
            .await;
            // The worker sending the most right now, so the pause lands mid-Attempt. A pause
            // that caught no Claim tests nothing (seen once in a 10,000-Event run): then the
            // busiest worker is paused again, at most three times in all.
            let pool = sqlx::PgPool::connect(&database_url).await.expect("pool");
            for _ in 0..3 {
                let pid = busiest_worker(&stack).await.to_string();
                let signal = |sig: &str| {
                    let ok = Command::new("kill")
                        .args([sig, &pid])
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(ok, "kill {sig} {pid}");
                };
                signal("-STOP");
                tokio::time::sleep(PAUSE).await;
                // It wakes holding Claims that were swept and taken over: the Fence must
                // make its late outcomes land on nothing.
                signal("-CONT");
                tokio::time::sleep(Duration::from_secs(3)).await;
                let fenced: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE fenced")
                    .fetch_one(&pool)
                    .await
                    .expect("fenced");
                if fenced > 0 {
                    break;
                }
            }
        }
        Scenario::FlakyReceivers => {}
        Scenario::ReceiversPartitioned => {
            crate::support::eventually("deliveries flowing", Duration::from_secs(60), || async {
                (receivers.iter().map(Receiver::count).sum::<usize>() >= 300).then_some(())
            })
            .await;
            let far = far.as_ref().expect("far host");
            far.cut();
            tokio::time::sleep(PARTITION).await;
            far.heal();
        }
    }
    for t in tasks {
        t.await.expect("stream task");
    }
    let expected: HashMap<String, Instant> = accepted.lock().expect("lock").clone();
    // Everything accepted must arrive; the sweeps bound how long a lost hint can delay it.
    // The wait ends when all arrived, or when nothing new arrived for 150 s (a backlog that
    // still drains is slow, not lost), and in any case after 15 minutes.
    let cap = Instant::now() + Duration::from_secs(900);
    let (mut last_count, mut last_progress) = (0, Instant::now());
    let mut broker_restarts = 0;
    loop {
        // Arrivals only grow: the id set is rebuilt only when there are new ones, so the
        // harness does not compete with the stack for the CPU while it waits.
        let arrivals: usize = receivers.iter().map(Receiver::count).sum();
        if arrivals > last_count {
            (last_count, last_progress) = (arrivals, Instant::now());
            let seen: HashSet<String> = receivers
                .iter()
                .flat_map(|r| r.requests())
                .filter(accepted_by_receiver)
                .filter_map(|r| r.headers.get("webhook-id").cloned())
                .collect();
            if expected.keys().all(|k| seen.contains(k)) {
                break;
            }
        }
        if scenario == Scenario::BrokerStopped
            && broker_restarts < 5
            && tokio::task::block_in_place(|| broker.storage_panicked())
        {
            // tansu's storage died after the restart (a broker bug, not ours): restart it
            // as an operator would, and say so. Everything accepted must still arrive.
            broker_restarts += 1;
            eprintln!(
                "broker storage panicked after its restart; restarting it ({broker_restarts})"
            );
            tokio::task::block_in_place(|| {
                broker.kill();
                broker.restart();
            });
            last_progress = Instant::now();
        }
        if last_progress.elapsed() > Duration::from_secs(150) || Instant::now() > cap {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Late duplicates (a fenced-out Attempt, a republished Announcement) get a named window
    // to arrive before counting: they are counted, not forbidden, so this is a wait, not an
    // assertion; 2 s covers a poll and an Attempt at the receivers' 150 ms.
    const LATE_DUPLICATES: Duration = Duration::from_secs(2);
    tokio::time::sleep(LATE_DUPLICATES).await;
    let mut first: HashMap<String, Instant> = HashMap::new();
    let mut arrivals = 0;
    // Delivered means the receiver accepted it (2xx). A request answered 500, reset or
    // left hanging is an Attempt, not a delivery; the retry that follows is not a duplicate.
    for r in receivers
        .iter()
        .flat_map(|r| r.requests())
        .filter(accepted_by_receiver)
    {
        let Some(id) = r.headers.get("webhook-id").cloned() else {
            continue;
        };
        arrivals += 1;
        first
            .entry(id)
            .and_modify(|t| *t = (*t).min(r.at))
            .or_insert(r.at);
    }
    let delivered = expected.keys().filter(|k| first.contains_key(*k)).count();
    let max_delay = expected
        .iter()
        .filter_map(|(k, at)| Some(first.get(k)?.saturating_duration_since(*at)))
        .max()
        .unwrap_or_default();
    let row = Row {
        scenario,
        accepted: expected.len(),
        delivered,
        lost: expected.len() - delivered,
        duplicates: arrivals - first.len(),
        unknown_duplicates: first.keys().filter(|k| !expected.contains_key(*k)).count(),
        max_delay,
        fenced: 0,
    };
    let pool = sqlx::PgPool::connect(&database_url).await.expect("pool");
    if row.lost > 0 {
        // Where the missing ones are, for a failure that happened once and not again.
        let missing: Vec<String> = expected
            .keys()
            .filter(|k| !first.contains_key(*k))
            .cloned()
            .collect();
        let states: Vec<(String, bool, bool, i64)> = sqlx::query_as(
            "SELECT status, next_retry_at IS NOT NULL, hinted_at IS NOT NULL, count(*)
             FROM deliveries WHERE id = ANY($1) GROUP BY 1, 2, 3",
        )
        .bind(&missing)
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
        eprintln!(
            "{}: {} missing; (status, retry scheduled, hinted, count): {states:?}\n{}\n{}",
            scenario.name(),
            missing.len(),
            stack.diagnose().await,
            broker.diagnose()
        );
    }
    drop(stack);
    // The Slot is cluster-wide: drop it once its relay is gone.
    let fenced: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE fenced")
        .fetch_one(&pool)
        .await
        .expect("fenced");
    let row = Row { fenced, ..row };
    for _ in 0..50 {
        let dropped = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&slot)
            .execute(&pool)
            .await;
        if dropped.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    row
}

fn events() -> usize {
    std::env::var("RAILHOOK_RELIABILITY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Runs `scenarios` one at a time (the Postgres restart would otherwise hit the others
/// too), prints the table, then asserts nothing was lost.
async fn check(scenarios: &[Scenario]) {
    let _turn = crate::ONE_AT_A_TIME.lock().await;
    let events = events();
    let mut rows = Vec::new();
    // `RAILHOOK_RELIABILITY_ONLY=broker` runs only the scenarios whose name contains it
    // (for diagnosing one scenario with `RAILHOOK_RELIABILITY_LOGS`).
    let only = std::env::var("RAILHOOK_RELIABILITY_ONLY").unwrap_or_default();
    // A filter that matches no scenario at all is a typo, not a pass: every test function
    // would run nothing and report green.
    assert!(
        Scenario::ALL
            .iter()
            .any(|s| s.name().contains(only.as_str())),
        "RAILHOOK_RELIABILITY_ONLY={only:?} matches no scenario; names: {:?}",
        Scenario::ALL.map(Scenario::name)
    );
    for &s in scenarios
        .iter()
        .filter(|s| s.name().contains(only.as_str()))
    {
        let row = run(s, events).await;
        eprintln!(
            "done: {} lost {} dup {}",
            s.name(),
            row.lost,
            row.duplicates
        );
        rows.push(row);
    }
    println!(
        "\n| scenario | events | accepted deliveries | delivered | lost | duplicate arrivals | fenced Attempts | max accept → arrival |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {events} | {} | {} | **{}** | {} | {} | {:.1} s |",
            r.scenario.name(),
            r.accepted,
            r.delivered,
            r.lost,
            r.duplicates,
            r.fenced,
            r.max_delay.as_secs_f64()
        );
    }
    for r in &rows {
        assert_eq!(
            r.accepted,
            events * ENDPOINTS,
            "{}: every batch was accepted",
            r.scenario.name()
        );
        assert_eq!(r.lost, 0, "{}: accepted deliveries lost", r.scenario.name());
        assert_eq!(
            r.unknown_duplicates,
            0,
            "{}: arrivals with an unknown webhook-id",
            r.scenario.name()
        );
        if r.scenario == Scenario::WorkerPausedPastTheSweep {
            // Otherwise the pause caught no Attempt and tested nothing.
            assert!(r.fenced > 0, "the paused worker woke with no Claim to lose");
        }
    }
}

/// Attempts a process has made, from its `/metrics`.
async fn attempts_made(metrics: &str) -> f64 {
    let Ok(r) = reqwest::get(metrics).await else {
        return 0.0;
    };
    r.text()
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("railhook_worker_attempts_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `Some` once a worker's `/metrics` lists a partition it fetches.
async fn holds_partitions(metrics: &str) -> Option<()> {
    let page = reqwest::get(metrics).await.ok()?.text().await.ok()?;
    page.lines()
        .any(|l| l.starts_with("railhook_worker_consumer_lag{"))
        .then_some(())
}

/// The pid of the worker that made the most Attempts over the last half second.
async fn busiest_worker(stack: &Stack) -> u32 {
    let workers: Vec<&Proc> = stack.procs.iter().filter(|p| p.role == "worker").collect();
    let mut before = Vec::new();
    for w in &workers {
        before.push(attempts_made(&w.metrics).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut best = (f64::MIN, workers[0].child.id());
    for (w, b) in workers.iter().zip(before) {
        let grew = attempts_made(&w.metrics).await - b;
        if grew > best.0 {
            best = (grew, w.child.id());
        }
    }
    best.1
}

fn accepted_by_receiver(r: &crate::support::receiver::Received) -> bool {
    r.answered.is_some_and(|s| (200..300).contains(&s))
}

/// What a flaky receiver answers, in order, before it settles on 204: a 500 every third
/// request, a reset every seventh, a hang past the 2 s timeout every thirteenth, and a
/// status line whose body never comes every eleventh (a 200 there is a delivery: the
/// status line is the receiver's answer) and every seventeenth (a 503: retried).
fn flaky_script() -> Vec<Behaviour> {
    (0..3000)
        .map(|n| match n {
            n if n % 17 == 0 => Behaviour::StallAfterStatus(503),
            n if n % 13 == 0 => Behaviour::Delay(Duration::from_secs(3), 204),
            n if n % 11 == 0 => Behaviour::StallAfterStatus(200),
            n if n % 7 == 0 => Behaviour::Reset,
            n if n % 3 == 0 => Behaviour::Status(500),
            _ => Behaviour::Status(204),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_accepted_is_lost_when_processes_crash() {
    check(&[
        Scenario::RelayKilledWithStandby,
        Scenario::RelayKilledAlone,
        Scenario::PostgresRestarted,
        Scenario::PostgresFastRestart,
    ])
    .await;
}

/// These disturb the workers' consumer group. The worker kill is the case that once
/// stalled: tansu 0.6.0 keeps a dead member's partitions assigned after it drops the member,
/// and the workers' group watch (worker/src/group_watch.rs) now rejoins the group when that
/// happens (docs/RELIABILITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_accepted_is_lost_when_a_worker_is_killed_or_the_broker_stops() {
    check(&[Scenario::WorkerKilledMidAttempt, Scenario::BrokerStopped]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_worker_is_fenced_and_flaky_receivers_get_everything() {
    check(&[Scenario::WorkerPausedPastTheSweep, Scenario::FlakyReceivers]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_accepted_is_lost_across_a_network_partition() {
    check(&[Scenario::ReceiversPartitioned]).await;
}
