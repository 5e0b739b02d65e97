//! What every handler can reach.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use railhook_common::config::{ConfigError, Settings};
use railhook_common::health::Dependencies;
use secrecy::SecretString;
use sqlx::PgPool;

use crate::metrics::IngestMetrics;
use crate::quota::Quota;

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// The writers of single-Event requests (group_commit.rs).
    pub group_commit: crate::group_commit::GroupCommit,
    pub quota: Quota,
    pub metrics: IngestMetrics,
    pub limits: Limits,
    pub admin_token: Option<SecretString>,
    /// Also accepted while callers move to a new admin token.
    pub admin_token_previous: Option<SecretString>,
    /// Seals and opens signing and Source secrets (common/src/sealing.rs).
    pub keyring: railhook_common::sealing::Keyring,
    pub faults: Arc<Faults>,
    /// Metrics of other roles in the same process (`railhook all`), served by `/metrics` too.
    pub other_registries: Vec<prometheus::Registry>,
    pub streak: StreakWindows,
    pub dashboard: DashboardSettings,
    /// Dashboard single sign-on, when configured (crate::sso).
    pub sso: Option<Arc<crate::sso::Sso>>,
    /// The relay's replication Slot, shown on the dashboard's relay page.
    pub slot: String,
    /// Who posts Events, cached for a second (`store::subscriptions::SenderCache`).
    pub senders: crate::store::subscriptions::SenderCache,
    /// Compiled JSON Schemas of the event-type catalogue (`crate::schemas`).
    pub schemas: crate::schemas::SchemaCache,
    /// What `/readyz` reports; `railhook all` shares one with the other roles.
    pub deps: Dependencies,
    /// Whether the API port serves `/metrics` (`RAILHOOK_API_METRICS`).
    pub api_metrics: bool,
    /// The bearer token `/metrics` asks for, if any.
    pub metrics_access: railhook_common::metrics_http::MetricsAccess,
    /// When `/readyz` last asked Postgres itself (routes/health.rs): at most once a second,
    /// however many requests come.
    pub readiness_probed: Arc<tokio::sync::Mutex<Option<std::time::Instant>>>,
    /// The `railhook listen` sessions this instance holds (crate::listen).
    pub listen: crate::listen::Hub,
    /// Where workers reach this instance's listen relay (`RAILHOOK_LISTEN_RELAY_URL`).
    pub listen_relay_base: String,
}

/// The windows that turn an endpoint's failure streak into `warning` and then `disabled`
/// (the disabling itself is the worker's, in `fence::finalise`).
#[derive(Clone, Debug)]
pub struct StreakWindows {
    pub warn_after: chrono::Duration,
    pub disable_after: chrono::Duration,
}

#[derive(Clone, Debug)]
pub struct DashboardSettings {
    pub cookie_secure: bool,
    pub session_ttl: Duration,
    /// Where browsers reach this API, without a trailing `/` (`public_url`): the base of
    /// the customer portal's links.
    pub public_url: Option<String>,
}

/// The request limits the API enforces.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_batch_size: usize,
    pub secret_rotation_overlap: Duration,
    /// A connection that has not sent its request headers by then is closed.
    pub header_read_timeout: Duration,
    /// The largest endpoint `timeout_ms` (`endpoint_timeout_max_ms`): the processing timeout
    /// is checked against it, so the API may not accept more.
    pub endpoint_timeout_max_ms: i32,
    /// Whether an OAuth2 `token_url` may be plain `http://`: only where the deployment
    /// allows private targets (`allow_private_targets`, tests and internal networks), so a
    /// client secret never travels in clear to the internet (issue #53).
    pub plain_token_urls: bool,
}

impl Limits {
    /// The most bytes one batch request may carry: every event at its largest, plus framing.
    pub fn max_batch_body_bytes(&self) -> usize {
        self.max_payload_bytes.saturating_mul(16)
    }
}

/// Fault points for crash tests. Nothing in configuration or the API can set them; only code
/// holding the `AppState` (the tests) can, so production never trips one by accident.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail the ingest transaction after its Deliveries and Outbox rows are written, before
    /// the commit.
    pub fail_ingest_before_commit: AtomicBool,
}

impl Faults {
    pub fn trip_ingest_before_commit(&self) -> bool {
        self.fail_ingest_before_commit.load(Ordering::Relaxed)
    }
}

impl AppState {
    pub fn new(pool: PgPool, settings: &Settings) -> Result<Self, ConfigError> {
        let metrics = IngestMetrics::new();
        railhook_common::db::PoolCollector::register(metrics.registry(), "ingest", pool.clone());
        let quota = Quota::new(
            settings.redis_client()?,
            Duration::from_millis(settings.quota_timeout_ms),
            metrics.clone(),
        );
        let deps = Dependencies::new();
        deps.declare("postgres", true);
        deps.declare("redis", false);
        let group_commit = crate::group_commit::GroupCommit::new(
            pool.clone(),
            // Each writer holds a connection while its statement runs: never more writers
            // than the pool has connections.
            settings.ingest_writers.min(settings.db_max_connections) as usize,
            metrics.clone(),
        );
        Ok(Self {
            pool,
            group_commit,
            quota,
            metrics,
            limits: Limits {
                max_payload_bytes: settings.max_payload_bytes,
                max_batch_size: settings.max_batch_size,
                secret_rotation_overlap: Duration::from_secs(
                    settings.secret_rotation_overlap_seconds,
                ),
                header_read_timeout: Duration::from_secs(settings.http_header_timeout_seconds),
                endpoint_timeout_max_ms: i32::try_from(settings.endpoint_timeout_max_ms)
                    .unwrap_or(i32::MAX),
                // Read as the worker's allowlist reads it (comma-separated, blanks ignored).
                plain_token_urls: settings
                    .allow_private_targets
                    .split(',')
                    .any(|range| !range.trim().is_empty()),
            },
            admin_token: settings.admin_token.clone(),
            admin_token_previous: settings.admin_token_previous.clone(),
            keyring: settings.keyring(),
            faults: Arc::new(Faults::default()),
            other_registries: Vec::new(),
            streak: StreakWindows {
                warn_after: seconds(settings.endpoint_warn_after_seconds),
                disable_after: seconds(settings.endpoint_disable_after_seconds),
            },
            sso: crate::sso::Sso::from_settings(settings)?,
            dashboard: DashboardSettings {
                cookie_secure: settings.dashboard_cookie_secure,
                session_ttl: Duration::from_secs(settings.dashboard_session_seconds),
                public_url: settings
                    .public_url
                    .as_deref()
                    .map(|u| u.trim_end_matches('/').to_owned()),
            },
            slot: settings.slot.clone(),
            senders: crate::store::subscriptions::SenderCache::default(),
            schemas: crate::schemas::SchemaCache::default(),
            deps,
            api_metrics: settings.api_metrics(),
            metrics_access: railhook_common::metrics_http::MetricsAccess::from_settings(settings),
            readiness_probed: Arc::default(),
            listen: crate::listen::Hub::default(),
            listen_relay_base: crate::listen::relay_base(settings),
        })
    }
}

fn seconds(s: u64) -> chrono::Duration {
    chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX / 1000))
}
