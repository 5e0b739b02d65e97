//! Percentiles from samples and from a Prometheus histogram.

use std::time::Duration;

use prometheus::core::Metric;

/// p50, p90, p99 and max of samples, in milliseconds.
pub fn percentiles(samples: &mut [Duration]) -> Option<[f64; 4]> {
    if samples.is_empty() {
        return None;
    }
    samples.sort();
    let at = |q: f64| {
        let idx = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[idx].as_secs_f64() * 1e3
    };
    Some([at(0.5), at(0.9), at(0.99), at(1.0)])
}

/// A quantile of a histogram, interpolated linearly inside its bucket, in milliseconds.
pub fn histogram_quantile(h: &prometheus::Histogram, q: f64) -> f64 {
    let proto = h.metric();
    let hist = proto.get_histogram();
    let total = hist.get_sample_count() as f64;
    if total == 0.0 {
        return f64::NAN;
    }
    let rank = total * q;
    let (mut prev_bound, mut prev_count) = (0.0, 0.0);
    for bucket in hist.get_bucket() {
        let (bound, count) = (bucket.upper_bound(), bucket.cumulative_count() as f64);
        if count >= rank {
            let within = if count > prev_count {
                (rank - prev_count) / (count - prev_count)
            } else {
                0.0
            };
            return (prev_bound + (bound - prev_bound) * within) * 1e3;
        }
        (prev_bound, prev_count) = (bound, count);
    }
    prev_bound * 1e3
}

/// (CPU seconds so far, RSS MiB) of a process, from /proc.
pub fn process_usage(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // USER_HZ is 100 on Linux x86_64.
    Some((ticks / 100.0, kb / 1024.0))
}
