//! Safe migrations, tested on data: every migration is applied, in order, to a database that
//! holds the rows of every earlier release (tests/fixtures/migrations/, one file per
//! migration, loaded right after it), no table loses a row on the way, and the release then
//! serves the old rows — Idempotency-Keys written by the first release included. And a
//! migration that meets a long transaction gives up after its `lock_timeout` instead of
//! queueing every reader and writer behind its lock request, and applies once it is gone.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use crate::support::local_setting;
use railhook_common::db::{self, MIGRATOR};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::migrate::Migrator;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const KEY: &str = "rhk_fixture_migrations_key";

/// An empty database (no migration applied) and its URL.
async fn empty_database() -> (PgPool, String) {
    let server = local_setting("DATABASE_URL");
    let base = server.rsplit_once('/').expect("url").0.to_owned();
    let name = format!("rh_mig_{}", ulid::Ulid::new().to_string().to_lowercase());
    let admin = PgPool::connect(&format!("{base}/postgres"))
        .await
        .expect("admin");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create");
    admin.close().await;
    let url = format!("{base}/{name}");
    (PgPool::connect(&url).await.expect("connect"), url)
}

/// The first `n` migrations, as `railhook migrate` of the release that had only those would
/// apply them. (`Migrator`'s fields are public for `migrate!` and marked semver-exempt; a
/// test may lean on them.)
fn first(n: usize) -> Migrator {
    Migrator {
        migrations: Cow::Owned(MIGRATOR.migrations[..n].to_vec()),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    }
}

/// A fixture with its `{id:PREFIX:NAME:DAYS}` placeholders filled (README.md beside them).
fn fixture(version: i64, ids: &mut HashMap<String, String>) -> Option<String> {
    let path = format!("{ROOT}/tests/fixtures/migrations/{version}.sql");
    let mut text = std::fs::read_to_string(path).ok()?;
    while let Some(start) = text.find("{id:") {
        let end = start + text[start..].find('}').expect("closing brace");
        let spec = text[start + 4..end].to_owned();
        let id = ids
            .entry(spec.clone())
            .or_insert_with(|| {
                let mut parts = spec.split(':');
                let prefix = parts.next().expect("prefix");
                let _name = parts.next().expect("name");
                let days: u64 = parts.next().expect("days").parse().expect("days");
                let at = SystemTime::now() - Duration::from_secs(days * 86_400);
                format!(
                    "{prefix}{}",
                    ulid::Ulid::from_datetime(at).to_string().to_lowercase()
                )
            })
            .clone();
        text.replace_range(start..=end, &id);
    }
    Some(text)
}

/// Rows per table (partitioned parents counted whole, their partitions not listed).
async fn row_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
           AND NOT c.relispartition AND c.relname <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .expect("tables");
    let mut counts = BTreeMap::new();
    for t in tables {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{t}\""))
            .fetch_one(pool)
            .await
            .expect("count");
        counts.insert(t, n);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_migration_runs_on_the_data_of_every_earlier_release() {
    let (pool, url) = empty_database().await;
    let mut ids = HashMap::new();
    for (k, m) in MIGRATOR.migrations.iter().enumerate() {
        let before = row_counts(&pool).await;
        first(k + 1)
            .run(&pool)
            .await
            .unwrap_or_else(|e| panic!("{} on the earlier releases' data: {e}", m.version));
        let after = row_counts(&pool).await;
        for (table, n) in &before {
            let kept = after.get(table).copied().unwrap_or(-1);
            assert!(
                kept >= *n,
                "{} left {table} with {kept} rows of {n}",
                m.version
            );
        }
        let data = fixture(m.version, &mut ids).unwrap_or_else(|| {
            panic!(
                "migration {} has no tests/fixtures/migrations/{}.sql: write the rows its release stores",
                m.version, m.version
            )
        });
        sqlx::raw_sql(&data)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("fixture {}: {e}", m.version));
    }
    let id = |spec: &str| ids.get(spec).cloned().expect(spec);

    // The release serves what every earlier one stored.
    let settings = crate::support::settings(&url, &local_setting("REDIS_URL"));
    let app_pool = db::connect(&settings).expect("pool");
    let state = railhook_ingest::AppState::new(app_pool, &settings).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(
        async move { railhook_ingest::serve(listener, state, std::future::pending()).await },
    );
    let http = reqwest::Client::new();
    let get = |path: String| {
        let (http, api) = (http.clone(), api.clone());
        async move {
            let r = http
                .get(format!("{api}{path}"))
                .bearer_auth(KEY)
                .send()
                .await
                .expect("get");
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (code, old) = get(format!("/v1/events/{}", id("evt_:old:3"))).await;
    assert_eq!(code, 200, "{old}");
    assert_eq!(old["payload"], json!({"n": 1}));
    let (code, attempts) = get(format!("/v1/deliveries/{}/attempts", id("dlv_:w3:2"))).await;
    assert_eq!(code, 200, "{attempts}");
    assert_eq!(attempts.as_array().map(Vec::len), Some(2), "{attempts}");
    let (code, incoming) = get(format!("/v1/events/{}", id("evt_:in:1"))).await;
    assert_eq!(code, 200, "{incoming}");

    // Idempotency-Keys stored by the first release and by the latest still answer with
    // their Event; the first one's key with another payload is a conflict.
    let post = |key: &'static str, payload: Value| {
        let (http, api) = (http.clone(), api.clone());
        async move {
            let r = http
                .post(format!("{api}/v1/events"))
                .bearer_auth(KEY)
                .header("idempotency-key", key)
                .json(&json!({"type": "order.paid", "payload": payload}))
                .send()
                .await
                .expect("post");
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (code, again) = post("fixture-key-1", json!({"n": 2})).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["id"], json!(id("evt_:recent:0")));
    let (code, again) = post("fixture-key-11", json!({"n": 11})).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["id"], json!(id("evt_:f11:0")));
    let (code, conflict) = post("fixture-key-1", json!({"n": 99})).await;
    assert_eq!(code, 409, "{conflict}");
    // A new Event on the ordered endpoint continues its Sequence Numbers.
    let (code, fresh) = post("fixture-new", json!({"n": 100})).await;
    assert_eq!(code, 201, "{fresh}");
    let delivery = fresh["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    let seq = crate::support::eventually("a Sequence Number", Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, Option<i64>>("SELECT sequence_number FROM deliveries WHERE id = $1")
            .bind(&delivery)
            .fetch_one(&pool)
            .await
            .ok()
            .flatten()
    })
    .await;
    // The fixtures numbered 1 and 2 (the first release) and 3 (20261205000016).
    assert_eq!(seq, 4);
    // And a retention pass runs on it (nothing is old enough to go).
    let report = railhook_common::retention::run(&pool, chrono::Utc::now(), 30, None)
        .await
        .expect("retention pass");
    assert!(report.dropped.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_meets_a_long_transaction_gives_up_then_applies() {
    let (pool, url) = empty_database().await;
    // The release before the partitioning migration, with a transaction that read `events`
    // and stays open (its ACCESS SHARE lock blocks the migration's ALTER TABLE).
    let before = MIGRATOR
        .migrations
        .iter()
        .position(|m| m.version == 20261204000010)
        .expect("the partitions migration");
    first(before).run(&pool).await.expect("earlier migrations");
    let mut long = pool.begin().await.expect("begin");
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&mut *long)
        .await
        .expect("read");
    let settings = crate::support::settings(&url, &local_setting("REDIS_URL"));
    let started = Instant::now();
    let err = db::migrate(&settings, Duration::from_millis(300))
        .await
        .expect_err("the lock is held");
    assert!(db::is_lock_timeout(&err), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // Rolled back whole: `events` is still a plain table and the version is not recorded.
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'events'")
            .fetch_one(&pool)
            .await
            .expect("relkind");
    assert_eq!(kind, "r");
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version = 20261204000010")
            .fetch_one(&pool)
            .await
            .expect("recorded");
    assert_eq!(recorded, 0);
    long.rollback().await.expect("end the long transaction");
    db::migrate(&settings, Duration::from_millis(300))
        .await
        .expect("applies once the transaction is gone");
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'events'")
            .fetch_one(&pool)
            .await
            .expect("relkind");
    assert_eq!(kind, "p");
}

/// Issue #55: every fixed set of words the database CHECKs is the word set of one type in
/// the code, word for word, so a kind or status added on one side and not the other fails
/// here instead of at the first insert in production. (CHECKs with no type yet, named
/// below, are listed so that a new one has to be placed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_word_set_the_database_checks_is_a_type_of_the_code() {
    use railhook_common::status::{DeliveryStatus, OutboxReason};
    use railhook_common::vocabulary::{
        ColorScheme, DeliveryOrigin, Direction, EndpointKind, ReplayStatus, TransportKind, Word,
    };
    use railhook_ingest::incoming::Provider;
    let url = crate::support::fresh_database().await;
    let pool = PgPool::connect(&url).await.expect("connect");
    let checks = sqlx::query!(
        r#"SELECT c.conrelid::regclass::text AS "table!", pg_get_constraintdef(c.oid) AS "def!"
           FROM pg_constraint c
           JOIN pg_class r ON r.oid = c.conrelid
           WHERE c.contype = 'c' AND r.relnamespace = 'public'::regnamespace
             AND NOT r.relispartition
             AND pg_get_constraintdef(c.oid) ~ '= ANY \(ARRAY\['"#
    )
    .fetch_all(&pool)
    .await
    .expect("constraints");
    let words = |def: &str| -> (String, Vec<String>) {
        let column = def
            .trim_start_matches("CHECK ((")
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_owned();
        let mut listed: Vec<String> = def
            .split('\'')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        listed.sort();
        (column, listed)
    };
    let sorted = |mut v: Vec<&str>| {
        v.sort_unstable();
        v.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let typed: HashMap<(&str, &str), Vec<String>> = HashMap::from([
        (
            ("endpoints", "transport"),
            sorted(TransportKind::ALL.iter().map(|k| k.as_str()).collect()),
        ),
        (
            ("endpoints", "kind"),
            sorted(EndpointKind::ALL.iter().map(|k| k.as_str()).collect()),
        ),
        (
            ("deliveries", "direction"),
            sorted(Direction::ALL.iter().map(|k| k.as_str()).collect()),
        ),
        (
            ("deliveries", "status"),
            sorted(DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect()),
        ),
        (
            ("outbox", "reason"),
            sorted(OutboxReason::ALL.iter().map(|r| r.as_str()).collect()),
        ),
        (
            ("sources", "provider"),
            sorted(Provider::ALL.iter().map(|p| p.as_str()).collect()),
        ),
        (
            ("deliveries", "origin"),
            sorted(DeliveryOrigin::ALL.iter().map(|o| o.as_str()).collect()),
        ),
        (
            ("replays", "status"),
            sorted(ReplayStatus::ALL.iter().map(|s| s.as_str()).collect()),
        ),
        (
            ("portal_settings", "color_scheme"),
            sorted(ColorScheme::ALL.iter().map(|c| c.as_str()).collect()),
        ),
        (
            ("api_keys", "role"),
            sorted(
                railhook_ingest::access::Role::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect(),
            ),
        ),
        (
            ("audit_log", "actor_kind"),
            sorted(railhook_ingest::audit::ACTOR_KINDS.to_vec()),
        ),
    ]);
    let mut seen = Vec::new();
    for c in &checks {
        let (column, listed) = words(&c.def);
        let key = (c.table.as_str(), column.as_str());
        let expected = typed.get(&key).unwrap_or_else(|| {
            panic!(
                "{}.{column} checks {listed:?}: which type of the code is it?",
                c.table
            )
        });
        assert_eq!(&listed, expected, "{}.{column}", c.table);
        seen.push((c.table.clone(), column.clone()));
    }
    for (table, column) in typed.keys() {
        assert!(
            seen.iter().any(|(t, c)| t == table && c == column),
            "{table}.{column} has no CHECK in the database"
        );
    }
}
