//! The Postgres pool and the embedded migrations (`migrations/` is the only schema source).

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::Settings;

/// The schema, compiled into the binary so `railhook migrate` needs no files beside it.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The longest a migration statement waits for a lock in `railhook migrate`.
pub const MIGRATION_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Applies the pending migrations on one connection with `lock_timeout` set.
///
/// Why: a DDL statement waiting for its lock (an `ALTER TABLE` wants ACCESS EXCLUSIVE) queues
/// every later reader and writer of that table behind it, so a migration that meets one long
/// transaction would stall the whole API for as long as that transaction lives. With the
/// timeout it fails instead (SQLSTATE 55P03), its transaction rolls back and records nothing,
/// and `railhook migrate` tries again ([`is_lock_timeout`]); the Job's own retries come after.
pub async fn migrate(
    settings: &Settings,
    lock_timeout: Duration,
) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::Connection;
    let options = settings
        .postgres()
        .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?
        .sqlx_options()?
        .options([("lock_timeout", format!("{}ms", lock_timeout.as_millis()))]);
    let mut conn = sqlx::PgConnection::connect_with(&options).await?;
    let applied = MIGRATOR.run(&mut conn).await;
    let _ = conn.close().await;
    applied
}

/// Whether a migration failed because a lock was not granted within `lock_timeout`.
pub fn is_lock_timeout(e: &sqlx::migrate::MigrateError) -> bool {
    let db = match e {
        sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(db))
        | sqlx::migrate::MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) => db,
        _ => return false,
    };
    db.code().as_deref() == Some("55P03")
}

/// How a pool's prepared statements are planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// The server's choice (`plan_cache_mode`, `auto` unless a DBA changed it): a custom plan
    /// for each execution until a generic one looks no more expensive. Right for the API,
    /// whose filters and pages make some parameter values worth planning for.
    Server,
    /// One generic plan per statement and connection, pruned to the partitions a call needs
    /// when it starts (`plan_cache_mode = force_generic_plan`). For the worker, whose
    /// statements have a fixed shape and look rows up by id.
    ///
    /// Why: a generic plan of a statement on a partitioned table spans every partition, so
    /// Postgres's cost rule never prefers it to a custom plan that pruned at planning time,
    /// and it plans the statement again at every call. With 30 days of retention (38 day
    /// partitions) the outcome write (`fence::finalise`) was planned at each of its 18,001
    /// calls, 1.19 ms each, more than its 1.06 ms of execution (docs/BENCHMARKS-HISTORY.md,
    /// "Partitions and planning").
    Generic,
}

/// The session settings every pooled connection starts with, in one statement.
///
/// `jit = off`. Why: Postgres compiles a statement with LLVM when the planner's cost
/// estimate passes `jit_above_cost` (100,000 by default; JIT is on by default and in most
/// managed Postgres). The Claim statement's estimate grows with the PENDING rows the planner
/// thinks its join may touch, and once autovacuum's statistics showed a few thousand of them
/// it passed 900,000: every Claim then spent 3–5 s of CPU compiling itself to run for 5 ms.
/// Measured at 1,000 Events/s (docs/BENCHMARKS-HISTORY.md, "JIT"): 10,000 of 20,000 Events
/// delivered within the run, Postgres at 6.7 ms of CPU per message. Railhook's hot
/// statements each touch a handful of rows through indexes, where compiling can never pay
/// for itself.
///
/// `plan_cache_mode` as [`Planning`] says.
///
/// A `SET` after connecting rather than a startup option: PgBouncer (≥ 1.20) refuses a
/// startup `options` parameter it does not track. Behind a transaction-mode pooler the
/// settings reach one server connection only; docs/OPERATIONS.md says to set them on the role.
async fn start_session(
    conn: &mut sqlx::PgConnection,
    planning: Planning,
) -> Result<(), sqlx::Error> {
    let plan_cache_mode = match planning {
        Planning::Server => None,
        Planning::Generic => Some("force_generic_plan"),
    };
    sqlx::query!(
        r#"SELECT set_config('jit', 'off', false) AS "jit!",
                  set_config('plan_cache_mode',
                             coalesce($1, current_setting('plan_cache_mode')), false) AS "plans!""#,
        plan_cache_mode
    )
    .fetch_one(conn)
    .await
    .map(|_| ())
}

/// Connections the ingest's and the worker's pools open at start (see [`open_ahead`]): at
/// 600 Events/s from a cold start, 8 left the first second's p99 at 213 ms (the pool grew
/// with cold connections in that second) and 16 brought it to 106 ms (one run each).
pub const OPEN_AHEAD: u32 = 16;

/// Opens up to [`OPEN_AHEAD`] of the pool's connections at once and runs `warm` on each
/// (the ingest's and the worker's hot statements, on input that writes nothing), so the
/// first traffic finds its connections open and its statements planned. Errors are left to
/// the statements' real runs, which report them. The pool keeps the connections as it keeps
/// any: an idle one is closed after sqlx's idle timeout (10 minutes), and traffic after a
/// longer quiet opens and plans new ones as it goes.
///
/// Why (issue #35): the pool is lazy, so a role's first traffic used to open its
/// connections itself — a TCP handshake, SCRAM authentication, the session settings — and
/// plan each statement on each of them for the first time, several times over while the
/// first burst grew the pool. A new backend plans its first statement on a partitioned
/// table with empty catalog caches: the first `bind` of the worker's re-stamp and Claim
/// took 25–58 ms on each new connection from a cold start at 300 Events/s (4.8 ms on an
/// idle machine), where later ones take well under 1.
pub async fn open_ahead<F, Fut>(pool: &PgPool, role: &str, warm: F)
where
    F: Fn(sqlx::pool::PoolConnection<sqlx::Postgres>) -> Fut,
    Fut: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    let n = OPEN_AHEAD.min(pool.options().get_max_connections());
    // Held together, so each acquire opens (or takes) a different connection.
    let conns = futures::future::join_all((0..n).map(|_| pool.acquire())).await;
    let warmed = futures::future::join_all(conns.into_iter().flatten().map(warm)).await;
    let ok = warmed.iter().filter(|w| w.is_ok()).count();
    tracing::debug!(
        role,
        warmed = ok,
        of = n,
        "pool connections opened and planned"
    );
}

/// A pooled connection idle for longer than this is pinged before it is handed out.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// How long a statement on Railhook's hot paths (an Event's insert, a Claim, a Fence write,
/// the relay's heartbeat) may go unanswered before Railhook gives up on its connection.
/// Those statements take milliseconds; ten seconds is far past any lock wait they meet.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// The same, for the periodic sweeps and the prune, which scan more.
pub const SWEEP_ANSWER_WITHIN: Duration = Duration::from_secs(60);
/// How long the ping before a connection is handed out may take (the pool's acquire time is
/// 5 s in all).
const PING_WITHIN: Duration = Duration::from_secs(5);
/// How long a connection given back with a statement outstanding may take to answer it
/// before it is closed. Most such connections come from a deadline that passed, so their
/// server is already late; waiting longer only keeps a frozen server's connections in the
/// pool. Measured with the frozen-primary test (tests/it/failover.rs, 2026-12-07, the
/// project's 2-core machine, one run each, separate runs): 3 s here, first delivery 15.5 s
/// after the freeze; 10 s, 45.8 s.
const RELEASE_WITHIN: Duration = Duration::from_secs(3);

/// A database wait with a deadline of Railhook's own.
///
/// Why this exists (issue #53, finding 11): a primary whose host froze, or whose network
/// drops packets, never answers and never resets the connection. The kernel keeps such a
/// socket open for ~15 minutes (unacknowledged data) or for ever (an idle socket, or a
/// proxy in front that froze and whose kernel keeps acknowledging), and neither sqlx nor
/// the replication client has a read timeout, so a task that waits on it waits that long —
/// a group-commit writer, the worker's Claim loop, the relay's control connection — and a
/// failover to a promoted standby never reaches it. TCP keepalive and `TCP_USER_TIMEOUT`
/// cannot help when a frozen proxy's kernel still acknowledges, so the deadline is kept
/// here, in the client, around each unit of work; a server-side `statement_timeout` cannot
/// fire on a server that is not running.
///
/// When the deadline passes the future is dropped: a transaction in it never committed (or
/// committed without its answer, which the caller treats as any lost answer: the Claim's
/// Fence, the insert's idempotency check), and its connection goes back to the pool, whose
/// release check (see [`connect`]) closes it when it does not answer either.
pub async fn answered<T>(
    within: Duration,
    what: &'static str,
    work: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    deadline(within, what, work).await?
}

/// `work` within `within`, for a database wait whose own error is not sqlx's (the
/// replication stream's): past it, the I/O timeout [`answered`] gives.
pub async fn deadline<T>(
    within: Duration,
    what: &'static str,
    work: impl std::future::Future<Output = T>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(within, work).await.map_err(|_| {
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the database did not answer {what} within {} s",
                within.as_secs()
            ),
        ))
    })
}

/// `options` committing as `synchronous` says: off, `synchronous_commit = off` as a startup
/// parameter of every connection (see [`connect_committing`]).
fn committing(options: PgConnectOptions, synchronous: bool) -> PgConnectOptions {
    if synchronous {
        options
    } else {
        options.options([("synchronous_commit", "off")])
    }
}

/// A ping bounded by [`PING_WITHIN`]: a connection to a server that stopped answering fails
/// it instead of holding its caller.
async fn ping_within(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    answered(PING_WITHIN, "a ping", sqlx::Connection::ping(conn)).await
}

/// The pool every role uses.
///
/// sqlx pings every connection before handing it out by default: one extra round trip per
/// acquire, and an API request acquires several times. Measured in the ingest benchmark
/// (docs/BENCHMARKS-HISTORY.md), those pings were a large share of Postgres's work per request. A
/// connection that was in use within the last second has just proven itself, so only one
/// that sat idle longer is pinged (and replaced if the ping fails). What this gives up: a
/// connection broken in that last second (Postgres restarted under load) fails the one
/// statement that finds it broken; sqlx then closes it, and that request's transaction never
/// committed, so nothing is half-written — the client retries, as after any 5xx.
///
/// The pool is lazy: it connects on first use, so a role starts (and answers `/readyz` with
/// 503) while Postgres is away, and reconnects by itself when it is back. TLS comes from the
/// URL's libpq parameters ([`crate::postgres_url`]). Callers that must not start without
/// Postgres wait with [`crate::health::wait_for_postgres`].
///
/// Every new connection runs [`start_session`] before its first use: JIT off, prepared
/// statements planned as the server chooses ([`Planning::Server`]).
pub fn connect(settings: &Settings) -> Result<PgPool, sqlx::Error> {
    connect_planned(settings, Planning::Server)
}

/// [`connect`], with the statements planned as `planning` says.
pub fn connect_planned(settings: &Settings, planning: Planning) -> Result<PgPool, sqlx::Error> {
    connect_committing(settings, planning, true)
}

/// [`connect_planned`]; with `synchronous: false` the pool's commits return before their
/// WAL is flushed (`synchronous_commit = off`, a startup parameter of every connection):
/// the worker's, when `worker_synchronous_commit` is off (docs/CONFIGURATION.md).
pub fn connect_committing(
    settings: &Settings,
    planning: Planning,
    synchronous: bool,
) -> Result<PgPool, sqlx::Error> {
    let target = settings
        .postgres()
        .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?;
    let options = committing(target.sqlx_options()?, synchronous);
    let pool = PgPoolOptions::new()
        .max_connections(settings.db_max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .after_connect(move |conn, _meta| Box::pin(start_session(conn, planning)))
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_IF_IDLE_FOR {
                    ping_within(conn).await?;
                }
                Ok(true)
            })
        })
        // A connection given back is checked by sqlx with a ping that has no deadline. A
        // query future dropped mid-statement (by [`answered`] or a request's timeout) leaves
        // its answer, or its transaction's rollback, outstanding, and on a frozen server
        // that ping would wait for it for ever, holding the connection's place in the pool.
        // This runs first and waits only for what is outstanding (`flush`: no I/O at all on
        // a clean connection, so no extra round trip), within [`RELEASE_WITHIN`]; an error
        // closes the connection without further I/O. `flush` is sqlx 0.8's hidden trait
        // method for exactly this wait (pinned by Cargo.lock).
        .after_release(|conn, _meta| {
            Box::pin(async move {
                answered(
                    RELEASE_WITHIN,
                    "a released connection's last statement",
                    async { sqlx::Connection::flush(conn).await },
                )
                .await
                .map(|()| true)
            })
        })
        .connect_lazy_with(options);
    if target.chooses_server() {
        follow_primary(pool.clone(), target, synchronous);
    }
    Ok(pool)
}

/// How often a pool on a multi-host URL checks that its server is still the primary.
const PRIMARY_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Keeps a pool on a multi-host `DATABASE_URL` (`postgres://u@h1,h2/db?
/// target_session_attrs=read-write`, libpq's form) connecting to the primary: every
/// [`PRIMARY_CHECK_EVERY`] its server is checked with a fresh connection, and when it is
/// gone or in recovery (a failover: the old primary died, a standby was promoted) the first
/// server that is a primary becomes the one new connections go to. Connections to the old
/// server fail their next statement and are closed (see [`connect`]); a transaction in
/// flight at the failover never committed, so its client retries as after any 5xx.
fn follow_primary(pool: PgPool, target: crate::postgres_url::PostgresTarget, synchronous: bool) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut current = (target.host.clone(), target.port);
        while !pool.is_closed() {
            let on = target.at(&current.0, current.1);
            if !matches!(on.check().await, Ok(true)) {
                match target.primary().await {
                    Ok(found) if (found.host.as_str(), found.port) != (&*current.0, current.1) => {
                        match found.sqlx_options() {
                            Ok(options) => {
                                let options = committing(options, synchronous);
                                tracing::warn!(from = %format!("{}:{}", current.0, current.1),
                                    to = %format!("{}:{}", found.host, found.port),
                                    "the database's primary moved; new connections go to it");
                                pool.set_connect_options(options);
                                current = (found.host.clone(), found.port);
                            }
                            Err(e) => tracing::error!(error = %e, "cannot use the new primary"),
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "no primary among the database's hosts yet")
                    }
                }
            }
            tokio::time::sleep(PRIMARY_CHECK_EVERY).await;
        }
    });
}

/// Creates the publication the relay reads, if missing. Inserts only: the prune job's
/// DELETEs on `outbox` are not decoded or sent. `name` was validated by [`Settings`] to be
/// `[a-z0-9_]{1,63}`, which is why it may be spliced into the statement.
#[allow(clippy::disallowed_methods)] // DDL names the publication: composed.
pub async fn ensure_publication(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    let exists = sqlx::query_scalar!(
        "SELECT 1 AS one FROM pg_publication WHERE pubname = $1",
        name
    )
    .fetch_optional(pool)
    .await?;
    if exists.is_none() {
        let ddl = format!("CREATE PUBLICATION {name} FOR TABLE outbox WITH (publish = 'insert')");
        sqlx::query(&ddl).execute(pool).await?;
    }
    Ok(())
}

pub const POOL_CONNECTIONS: &str = "railhook_db_pool_connections";
pub const POOL_MAX_CONNECTIONS: &str = "railhook_db_pool_max_connections";

/// The pool's connections by state (`idle`, `in_use`) and its ceiling, labelled with the
/// role that owns the pool (`ingest`, `worker`: `railhook all` has one of each), read from the pool
/// at scrape time (a collector, not a refresher task: the numbers are never stale and cost
/// nothing between scrapes). A pool pinned at its ceiling with requests waiting shows up as
/// `in_use == max` before it shows up as acquire timeouts.
#[derive(Clone)]
pub struct PoolCollector {
    pool: PgPool,
    role: &'static str,
    connections: prometheus::IntGaugeVec,
    max: prometheus::IntGaugeVec,
}

impl PoolCollector {
    /// Registers the pool's gauges in `registry`.
    #[allow(clippy::expect_used)] // names are constants: a failure is a programming error
    pub fn register(registry: &prometheus::Registry, role: &'static str, pool: PgPool) {
        let connections = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                POOL_CONNECTIONS,
                "Postgres pool connections, by owning role and state.",
            ),
            &["pool", "state"],
        )
        .expect("valid metric");
        let max = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                POOL_MAX_CONNECTIONS,
                "The Postgres pool's maximum size (DB_MAX_CONNECTIONS), by owning role.",
            ),
            &["pool"],
        )
        .expect("valid metric");
        let collector = Self {
            pool,
            role,
            connections,
            max,
        };
        crate::metrics_http::register(registry, collector);
    }
}

impl prometheus::core::Collector for PoolCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.connections.desc();
        d.extend(self.max.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let size = i64::from(self.pool.size());
        let idle = i64::try_from(self.pool.num_idle()).unwrap_or(i64::MAX);
        let role = self.role;
        self.connections
            .with_label_values(&[role, "idle"])
            .set(idle);
        self.connections
            .with_label_values(&[role, "in_use"])
            .set((size - idle).max(0));
        self.max
            .with_label_values(&[role])
            .set(i64::from(self.pool.options().get_max_connections()));
        let mut families = self.connections.collect();
        families.extend(self.max.collect());
        families
    }
}
