//! The raw-Postgres baseline of the ingest benchmarks: a separate `pgbench` process writing
//! the rows a POST writes (the Event with an idempotency key, one Delivery per subscription,
//! one Outbox row each) in one prepared statement per transaction.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::ingest::{Api, PAYLOAD, Run};
use crate::setup::unique;

/// The baseline: pgbench writing the rows `events` Events make, in one prepared statement
/// per transaction, with `concurrency` clients.
pub(crate) async fn run(
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
