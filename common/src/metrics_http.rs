//! The metrics every role registers (Prometheus helpers, built from the vocabulary) and,
//! with the `http` feature, the server of `/metrics`, `/healthz` and `/readyz` for roles
//! without the REST API (`metrics_server.rs`, on `RAILHOOK_METRICS_ADDR`).

use crate::vocabulary::Word;
use prometheus::{Encoder, Registry, TextEncoder};

#[cfg(feature = "http")]
pub use crate::metrics_server::{MetricsAccess, ReadyQuery, readiness, serve};

/// Registers a collector and hands it back, for metrics structs built field by field.
/// Names are constants, so a failure here is a programming error caught by any test.
pub fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

/// The registries in Prometheus text format, one block per metric name: a name registered
/// in two registries (each role's Postgres pool gauges in `railhook all`) has its series
/// merged, since a page with the same family twice is refused by Prometheus.
pub fn render(registries: &[&Registry]) -> Vec<u8> {
    let mut families: Vec<prometheus::proto::MetricFamily> = Vec::new();
    let all = registries
        .iter()
        .copied()
        .chain(std::iter::once(process_registry()));
    for mut family in all.flat_map(|r| r.gather()) {
        match families.iter_mut().find(|f| f.name() == family.name()) {
            Some(seen) => {
                let more = std::mem::take(family.mut_metric());
                seen.mut_metric().extend(more);
            }
            None => families.push(family),
        }
    }
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut buf);
    buf
}

/// A counter registered in `registry`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> prometheus::IntCounter {
    register(
        registry,
        prometheus::IntCounter::new(name, help).expect("valid metric"),
    )
}

/// A gauge registered in `registry`.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::IntGauge {
    register(
        registry,
        prometheus::IntGauge::new(name, help).expect("valid metric"),
    )
}

/// A histogram registered in `registry`.
pub fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Histogram {
    let opts = prometheus::HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        registry,
        prometheus::Histogram::with_opts(opts).expect("valid metric"),
    )
}

/// Registers `family` and declares each of `values` for its one label at start, so a series
/// reads 0 rather than missing.
fn declared<T: prometheus::core::MetricVecBuilder + 'static>(
    registry: &Registry,
    family: prometheus::core::MetricVec<T>,
    values: impl IntoIterator<Item = &'static str>,
) -> prometheus::core::MetricVec<T> {
    let family = register(registry, family);
    for value in values {
        family.with_label_values(&[value]);
    }
    family
}

fn words<L: Word>() -> impl Iterator<Item = &'static str> {
    L::ALL.iter().map(|v| v.as_str())
}

/// A counter family with one `label`, its values the words of `L`.
pub fn counters<L: Word>(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> prometheus::IntCounterVec {
    counters_of(registry, name, help, label, words::<L>())
}

/// A counter family with one `label` whose values are given (a type's own label words
/// where they are not its [`Word`]s, as `AttemptOutcome::label`).
pub fn counters_of(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = &'static str>,
) -> prometheus::IntCounterVec {
    let opts = prometheus::Opts::new(name, help);
    let family = prometheus::IntCounterVec::new(opts, &[label]).expect("valid metric");
    declared(registry, family, values)
}

/// A gauge family with one `label`, its values the words of `L`.
pub fn gauges<L: Word>(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> prometheus::IntGaugeVec {
    let opts = prometheus::Opts::new(name, help);
    let family = prometheus::IntGaugeVec::new(opts, &[label]).expect("valid metric");
    declared(registry, family, words::<L>())
}

/// A histogram family with one `label`, its values the words of `L`.
pub fn histograms<L: Word>(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
    buckets: &[f64],
) -> prometheus::HistogramVec {
    let opts = prometheus::HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let family = prometheus::HistogramVec::new(opts, &[label]).expect("valid metric");
    declared(registry, family, words::<L>())
}

pub const BUILD_INFO: &str = "railhook_build_info";
pub const DELIVERIES_FINAL_TOTAL: &str = "railhook_deliveries_final_total";

crate::words! {
    /// `outcome` label values of [`DELIVERIES_FINAL_TOTAL`].
    FinalOutcome { Succeeded, Failed, Expunged }
}

/// Deliveries that reached a final state, by `outcome`: the worker counts `succeeded` and
/// `failed`, the ingest counts those its payload expunge ended (`expunged`). Each role
/// registers the same family in its own registry; [`render`] merges them in `railhook all`.
///
/// `outcomes` are the ones this role counts, declared at start: the two registries of
/// `railhook all` must not both declare a series, or the page would carry it twice.
pub fn deliveries_final(
    registry: &Registry,
    outcomes: &[FinalOutcome],
) -> prometheus::IntCounterVec {
    counters_of(
        registry,
        DELIVERIES_FINAL_TOTAL,
        "Deliveries that reached a final state, by outcome (succeeded, failed, expunged).",
        "outcome",
        outcomes.iter().map(|o| o.as_str()),
    )
}

/// What every `/metrics` page carries whatever the role: `railhook_build_info` (1, labelled
/// with the version and the commit it was built from) and the standard `process_*` series
/// (CPU seconds, resident memory, open file descriptors, start time), so dashboards can
/// show restarts and per-pod cost without a separate exporter.
pub fn process_registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Registry::new();
        let info = register(
            &r,
            prometheus::IntGaugeVec::new(
                prometheus::Opts::new(BUILD_INFO, "1, labelled with the running build."),
                &["version", "commit"],
            )
            .expect("valid metric"),
        );
        // RAILHOOK_GIT_SHA is set at build time by the Dockerfile's build argument.
        let commit = option_env!("RAILHOOK_GIT_SHA").unwrap_or("unknown");
        info.with_label_values(&[env!("CARGO_PKG_VERSION"), commit])
            .set(1);
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("unique metric");
        r
    })
}
