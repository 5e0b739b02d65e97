//! What a roles run prints besides its latency table: the per-second timeline, and the
//! counters and stage histograms read from each role's `/metrics`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::stats::percentiles;

use super::Role;

/// Counters printed after the load.
const COUNTERS: [&str; 9] = [
    "railhook_worker_early_hints_total",
    "railhook_worker_bad_hints_total",
    "railhook_relay_published_total",
    "railhook_relay_sessions_total",
    "railhook_worker_attempts_total{outcome=\"succeeded\"}",
    "railhook_worker_claim_misses_total",
    "railhook_worker_wakes_total",
    "railhook_worker_express_hints_total",
    "railhook_worker_rebalances_total",
];

/// Histograms whose p50 and p99 are printed after the load: where along the way the time went.
const HISTOGRAMS: [&str; 4] = [
    "railhook_relay_commit_to_read_seconds",
    "railhook_relay_commit_to_ack_seconds",
    "railhook_worker_delivery_latency_seconds",
    "railhook_worker_attempt_duration_seconds",
];

/// The `q` quantile of a Prometheus histogram in `text` (every label set summed), as the
/// upper bound of the bucket it falls in; None when the histogram is absent or empty.
fn bucket_quantile(text: &str, name: &str, q: f64) -> Option<String> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, String, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let (labels, count) = line.rsplit_once(' ')?;
        let le = labels.split("le=\"").nth(1)?.split('"').next()?;
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let count: f64 = count.parse().ok()?;
        match buckets.iter_mut().find(|b| b.0 == bound) {
            Some(b) => b.2 += count,
            None => buckets.push((bound, le.to_owned(), count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.2;
    if total == 0.0 {
        return None;
    }
    let bucket = buckets.iter().find(|b| b.2 >= q * total)?;
    Some(format!("≤ {} s", bucket.1))
}

/// The counters in [`COUNTERS`] and the p50 and p99 of each of [`HISTOGRAMS`], read from
/// every role's `/metrics`.
pub(super) async fn role_metrics(http: &reqwest::Client, roles: &[Role]) {
    // Where the messages went, from the roles' own counters: a shortfall above shows here
    // as published < accepted, or hints read but not claimed.
    let mut counters = Vec::new();
    let mut stages = Vec::new();
    for role in roles {
        let Ok(r) = http
            .get(format!("http://{}/metrics", role.metrics))
            .send()
            .await
        else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        for name in HISTOGRAMS {
            if let (Some(p50), Some(p99)) = (
                bucket_quantile(&text, name, 0.5),
                bucket_quantile(&text, name, 0.99),
            ) {
                stages.push(format!("| {name} | {p50} | {p99} |"));
            }
        }
        counters.extend(
            text.lines()
                .filter(|l| COUNTERS.iter().any(|c| l.starts_with(c)))
                .map(str::to_owned),
        );
    }
    if !counters.is_empty() {
        println!("\n```\n{}\n```", counters.join("\n"));
    }
    if !stages.is_empty() {
        println!(
            "\n| the roles' histograms (warm-up included) | p50 | p99 |\n| --- | ---: | ---: |\n{}",
            stages.join("\n")
        );
    }
}

/// Per second of the load (by when an Event was sent): how many were sent, their p50 and
/// p99 POST → receiver and POST → 201 (the ingest's share), and how many were in flight
/// (sent, not arrived) at the second's end.
pub(super) fn timeline(
    started: Instant,
    sent: &HashMap<u64, Instant>,
    answered: &HashMap<u64, Instant>,
    arrived: &HashMap<u64, Instant>,
) {
    let second = |at: &Instant| at.saturating_duration_since(started).as_secs() as usize;
    let seconds = sent.values().map(second).max().map_or(0, |s| s + 1);
    let mut by_second: Vec<(Vec<Duration>, Vec<Duration>)> =
        vec![(Vec::new(), Vec::new()); seconds];
    for (seq, at) in sent {
        if let Some(got) = arrived.get(seq) {
            by_second[second(at)]
                .0
                .push(got.saturating_duration_since(*at));
        }
        if let Some(done) = answered.get(seq) {
            by_second[second(at)]
                .1
                .push(done.saturating_duration_since(*at));
        }
    }
    println!(
        "## Per second of the load\n\n| second | sent | p50 ms | p99 ms | POST → 201 p50 / p99 ms | in flight at its end |\n| ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (s, (mut latencies, mut posts)) in by_second.into_iter().enumerate() {
        let end = started + Duration::from_secs(s as u64 + 1);
        let in_flight = sent
            .iter()
            .filter(|(seq, at)| **at < end && arrived.get(seq).is_none_or(|got| *got >= end))
            .count();
        let n = latencies.len();
        let post = percentiles(&mut posts)
            .map(|[p50, _, p99, _]| format!("{p50:.1} / {p99:.1}"))
            .unwrap_or_default();
        match percentiles(&mut latencies) {
            Some([p50, _, p99, _]) => {
                println!("| {s} | {n} | {p50:.1} | {p99:.1} | {post} | {in_flight} |")
            }
            None => println!("| {s} | 0 | | | {post} | {in_flight} |"),
        }
    }
    println!();
}
