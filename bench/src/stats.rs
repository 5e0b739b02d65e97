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
