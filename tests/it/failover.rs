//! Postgres failover without losing an Event (issue #41; docs/OPERATIONS.md, "Failover"):
//! a primary and a synchronous physical standby of their own (deploy/local/pg-pair.sh),
//! `railhook all` on a multi-host URL (`…@primary,standby/railhook?target_session_attrs=
//! read-write`), Events posted at a steady rate; the primary is killed with SIGKILL and the
//! standby promoted mid-stream. Every Event answered 201 must reach the receiver.
//!
//! - On PostgreSQL 18 with a failover Slot (`railhook slot create --failover`, the standby
//!   running `sync_replication_slots`): the relay resumes from the standby's synchronized
//!   copy of the Slot, with no operator action.
//! - On PostgreSQL 15 (no failover Slots): the runbook's path, `railhook slot create` on the
//!   promoted standby, which hands the Outbox rows the lost Slot never delivered to the retry
//!   path.
// Tests build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sqlx::postgres::PgPoolOptions;

use crate::support::eventually;
use crate::support::local_setting;
use crate::support::process::{
    Process, base_env, post_event, project_with_endpoint, run_once, unique,
};
use crate::support::receiver::{Behaviour, Receiver};

/// Events posted per second, and for how long.
const RATE: u64 = 40;
const STREAM: Duration = Duration::from_secs(14);
/// When, into the stream, the primary is killed.
const KILL_AT: Duration = Duration::from_secs(4);

/// A primary and a standby (deploy/local/pg-pair.sh), removed on drop.
struct Pair {
    dir: PathBuf,
    version: &'static str,
    primary: u16,
    standby: u16,
}

fn pair_script(version: &str, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/local/pg-pair.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .env("RAILHOOK_PG_VERSION", version)
        .output()
        .expect("pg-pair.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pg-pair.sh {args:?}: {text}");
    text
}

impl Pair {
    fn up(version: &'static str, failover: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("rh-pair-{}", unique()));
        let d = dir.to_str().expect("dir").to_owned();
        let mut args = vec!["up", d.as_str()];
        if failover {
            args.push("failover");
        }
        let out = pair_script(version, &args);
        let port = |name: &str| -> u16 {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} in {out}"))
        };
        Self {
            primary: port("PRIMARY_PORT="),
            standby: port("STANDBY_PORT="),
            dir,
            version,
        }
    }

    fn url(&self) -> String {
        format!(
            "postgres://railhook@127.0.0.1:{},127.0.0.1:{}/railhook?target_session_attrs=read-write",
            self.primary, self.standby
        )
    }

    fn server(&self, port: u16) -> String {
        format!("postgres://railhook@127.0.0.1:{port}/railhook")
    }

    fn run(&self, action: &str) {
        pair_script(self.version, &[action, self.dir.to_str().expect("dir")]);
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/deploy/local/pg-pair.sh"
            ))
            .args(["down", self.dir.to_str().unwrap_or("")])
            .env("RAILHOOK_PG_VERSION", self.version)
            .output();
    }
}

/// Whether the standby holds a synchronized copy of `slot` (PostgreSQL 17+).
async fn synced_on_standby(pair: &Pair, slot: &str) -> bool {
    let Ok(pool) = PgPoolOptions::new()
        .max_connections(1)
        .connect(&pair.server(pair.standby))
        .await
    else {
        return false;
    };
    // A synchronized copy stays temporary (and is dropped at promotion) until the relay
    // has confirmed a position the standby can serve; only then is it ready.
    let synced: Option<bool> = sqlx::query_scalar(
        "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&pool)
    .await
    .ok()
    .flatten();
    pool.close().await;
    synced == Some(true)
}

/// What the stream saw: the Events answered 201, and when the primary was killed.
struct Stream {
    accepted: Vec<usize>,
    refused: usize,
    killed_at: Instant,
}

/// Posts Events at [`RATE`] for [`STREAM`]; at [`KILL_AT`] kills the primary and, after
/// `promote_after`, promotes the standby and runs `after_promotion`.
async fn stream_through_a_failover(
    api: &str,
    key: &str,
    pair: &Pair,
    promote_after: Duration,
    after_promotion: impl FnOnce() + Send + 'static,
) -> Stream {
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(0usize));
    let started = Instant::now();
    let total = usize::try_from(RATE * STREAM.as_secs()).unwrap_or(usize::MAX);
    let mut posts = Vec::new();
    let mut killed_at = None;
    let mut after = Some(after_promotion);
    for n in 0..total {
        // Open loop: each Event at its time, whatever the earlier ones are waiting for.
        let due = started + Duration::from_millis(n as u64 * 1000 / RATE);
        tokio::time::sleep_until(due.into()).await;
        if killed_at.is_none() && started.elapsed() >= KILL_AT {
            pair.run("kill-primary");
            killed_at = Some(Instant::now());
        }
        if let Some(at) = killed_at
            && at.elapsed() >= promote_after
            && let Some(f) = after.take()
        {
            pair.run("promote");
            f();
        }
        let (api, key) = (api.to_owned(), key.to_owned());
        let (accepted, refused) = (accepted.clone(), refused.clone());
        posts.push(tokio::spawn(async move {
            let answered = tokio::time::timeout(Duration::from_secs(20), post_event(&api, &key, n))
                .await
                .ok();
            if answered == Some(StatusCode::CREATED) {
                accepted.lock().expect("accepted").push(n);
            } else {
                *refused.lock().expect("refused") += 1;
            }
        }));
    }
    for p in posts {
        let _ = p.await;
    }
    let accepted = accepted.lock().expect("accepted").clone();
    let refused = *refused.lock().expect("refused");
    Stream {
        accepted,
        refused,
        killed_at: killed_at.expect("the primary was killed"),
    }
}

/// The `n` of every Event the receiver got, and how many arrivals repeated one.
fn arrivals(receiver: &Receiver) -> (HashSet<usize>, usize) {
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    for r in receiver.requests() {
        let n = serde_json::from_str::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["n"].as_u64());
        if let Some(n) = n
            && !seen.insert(n as usize)
        {
            duplicates += 1;
        }
    }
    (seen, duplicates)
}

async fn failover_scenario(version: &'static str, failover_slot: bool) {
    let pair = Pair::up(version, failover_slot);
    let slot = format!("rh_fo_{}", unique());
    let env = base_env(&[
        ("DATABASE_URL".into(), pair.url()),
        ("REDIS_URL".into(), local_setting("REDIS_URL")),
        ("KAFKA_BROKERS".into(), local_setting("KAFKA_BROKERS")),
        ("RAILHOOK_SLOT".into(), slot.clone()),
        ("RAILHOOK_SLOT_FAILOVER".into(), failover_slot.to_string()),
        // A Claim taken on the old primary right before the kill, whose re-stamp then failed,
        // is PROCESSING on the new one until the processing sweep hands it back: a window
        // shorter than the test's wait (the endpoints' timeout capped to fit it) lets the
        // test see that hand-back instead of waiting out the default window.
        ("RAILHOOK_ENDPOINT_TIMEOUT_MAX_MS".into(), "5000".into()),
        ("RAILHOOK_PROCESSING_TIMEOUT_SECONDS".into(), "15".into()),
    ]);
    // `migrate` creates the Slot, as a failover Slot with RAILHOOK_SLOT_FAILOVER.
    let (ok, out) = run_once(&["migrate"], &env);
    assert!(ok, "migrate: {out}");
    let (ok, out) = run_once(&["slot", "status"], &env);
    assert!(ok, "slot status: {out}");
    let mut all = Process::start("all", &env);
    all.wait_ready(false).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let key = project_with_endpoint(&all.api, &receiver.url).await;
    if failover_slot {
        // The relay's confirmations make the standby's copy ready.
        eventually(
            "the Slot synchronized to the standby",
            Duration::from_secs(90),
            || async { synced_on_standby(&pair, &slot).await.then_some(()) },
        )
        .await;
        let (ok, out) = run_once(&["slot", "status"], &env);
        assert!(ok, "{out}");
        assert!(out.contains("failover             true"), "{out}");
        assert!(
            out.contains(&format!("copy on 127.0.0.1:{}  ready", pair.standby)),
            "{out}"
        );
        // A standby that stops holds the relay back (synchronized_standby_slots): /readyz
        // names it, the metric says 0; back, both recover.
        pair.run("stop-standby");
        let said = all.wait_down(false, "standby", &["railhook_standby"]).await;
        assert!(said.contains("holds the relay back"), "{said}");
        assert!(
            all.metrics_page()
                .await
                .contains("railhook_relay_standby_slot_active{slot=\"railhook_standby\"} 0"),
        );
        pair.run("start-standby");
        all.wait_ready(false).await;
    }

    // Without failover Slots the promoted standby has no Slot: the runbook's command.
    let runbook = (!failover_slot).then(|| env.clone());
    let stream =
        stream_through_a_failover(&all.api, &key, &pair, Duration::from_secs(1), move || {
            if let Some(env) = runbook {
                let (ok, out) = run_once(&["slot", "create"], &env);
                assert!(
                    ok && out.contains("created"),
                    "slot create after promotion: {out}"
                );
            }
        })
        .await;
    let promoted_at = stream.killed_at + Duration::from_secs(1);
    let accepted: HashSet<usize> = stream.accepted.iter().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (seen, _) = arrivals(&receiver);
        let mut missing: Vec<usize> = accepted.difference(&seen).copied().collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            missing.sort_unstable();
            let statuses: Vec<(String, i64)> = match PgPoolOptions::new()
                .max_connections(1)
                .connect(&pair.server(pair.standby))
                .await
            {
                Ok(pool) => sqlx::query_as(
                    "SELECT status::text, count(*) FROM deliveries GROUP BY 1 ORDER BY 1",
                )
                .fetch_all(&pool)
                .await
                .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            panic!(
                "{} of {} accepted Events never arrived (first: {:?}); deliveries on the new \
                 primary: {statuses:?}",
                missing.len(),
                accepted.len(),
                &missing[..missing.len().min(20)]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (seen, duplicates) = arrivals(&receiver);
    let first_after = receiver
        .requests()
        .iter()
        .map(|r| r.at)
        .filter(|at| *at > stream.killed_at)
        .min()
        .expect("a delivery after the kill");
    println!(
        "failover on PostgreSQL {version} ({}): {} accepted, {} refused during the failover, \
         {} delivered, {duplicates} duplicate arrivals; kill to first delivery after it: \
         {:.2} s (the standby promoted 1 s after the kill)",
        if failover_slot {
            "failover Slot"
        } else {
            "slot create after promotion"
        },
        accepted.len(),
        stream.refused,
        seen.len(),
        first_after.duration_since(stream.killed_at).as_secs_f64(),
    );
    assert!(first_after > promoted_at - Duration::from_secs(1));
    assert!(
        accepted.len() as u64 > RATE * (STREAM.as_secs() - 4),
        "most Events were accepted: {} of {}",
        accepted.len(),
        RATE * STREAM.as_secs()
    );
    let _ = all.child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_slot_carries_the_relay_onto_the_promoted_standby() {
    failover_scenario("18", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_failover_slots_slot_create_after_promotion_loses_nothing() {
    failover_scenario("15", false).await;
}
