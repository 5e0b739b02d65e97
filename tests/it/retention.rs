//! Retention by day partitions, against real Postgres, travelling in time the honest way:
//! partitions are created with bounds in the past, rows are written into them with ids of
//! that time, and the real pass runs at the real "now" (common/src/retention/).

use std::time::{Duration, SystemTime};

use crate::support::{TestApp, spawn_app};
use chrono::{DateTime, Days, NaiveDate, Utc};
use railhook_common::ids::{DeliveryId, EventId};
use railhook_common::retention::{self, RetentionMetrics, Verdict};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

const RETENTION_DAYS: u32 = 30;

fn noon(day: NaiveDate) -> DateTime<Utc> {
    day.and_hms_opt(12, 0, 0).expect("noon").and_utc()
}

fn today() -> NaiveDate {
    Utc::now().date_naive()
}

async fn table_exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(pool)
        .await
        .expect("catalogue")
}

/// An Event created at `at` with one Delivery (in `status`) and one Attempt, written into the
/// day partitions of `at` (created here, in the same transaction, as the task would have
/// made them then). Returns the Event's and the Delivery's ids.
async fn seed(
    app: &TestApp,
    project: &str,
    endpoint: &str,
    at: DateTime<Utc>,
    status: &str,
) -> (String, String) {
    let day = at.date_naive();
    let when = SystemTime::from(at);
    let event = EventId::generate_at(when).into_string();
    let delivery = DeliveryId::generate_at(when).into_string();
    let mut tx = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT railhook_ensure_partitions($1, $1)")
        .bind(day)
        .execute(&mut *tx)
        .await
        .expect("partitions of the day");
    seed_rows(&mut tx, project, endpoint, &event, &delivery, at, status).await;
    tx.commit().await.expect("commit");
    (event, delivery)
}

async fn seed_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    project: &str,
    endpoint: &str,
    event: &str,
    delivery: &str,
    at: DateTime<Utc>,
    status: &str,
) {
    sqlx::query(
        "INSERT INTO events (id, project_id, event_type, payload, created_at)
         VALUES ($1, $2, 'order.paid', '{\"old\": true}', $3)
         ON CONFLICT DO NOTHING",
    )
    .bind(event)
    .bind(project)
    .bind(at)
    .execute(&mut **tx)
    .await
    .expect("event");
    sqlx::query(
        "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, created_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(delivery)
    .bind(project)
    .bind(event)
    .bind(endpoint)
    .bind(status)
    .bind(at)
    .execute(&mut **tx)
    .await
    .expect("delivery");
    sqlx::query(
        "INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at, status_code,
                               outcome, duration_ms)
         VALUES ($1, 1, $2, $2, 500, 'failed', 12)",
    )
    .bind(delivery)
    .bind(at)
    .execute(&mut **tx)
    .await
    .expect("attempt");
}

/// Runs a pass (again if another pass held the lock) and returns its report.
async fn pass(app: &TestApp, metrics: Option<&RetentionMetrics>) -> retention::Report {
    for _ in 0..100 {
        let report = retention::run(&app.pool, Utc::now(), RETENTION_DAYS, metrics)
            .await
            .expect("retention pass");
        if !report.skipped {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the retention pass lock stayed taken");
}

fn gauge(metrics: &RetentionMetrics, name: &str, table: &str) -> f64 {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().to_vec())
        .find(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "table" && l.value() == table)
        })
        .map_or(-1.0, |m| m.get_gauge().get_value())
}

async fn count(pool: &PgPool, sql: &str, id: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn expired_days_are_dropped_whole_and_future_days_exist() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let endpoint = app.endpoint(&key).await;
    let old = today() - Days::new(40);
    let recent = today() - Days::new(3);
    let (old_event, old_delivery) = seed(&app, &project, &endpoint, noon(old), "SUCCEEDED").await;
    let (recent_event, _) = seed(&app, &project, &endpoint, noon(recent), "FAILED").await;
    let day = old.format("%Y%m%d");
    for table in ["events", "deliveries", "attempts"] {
        assert!(table_exists(&app.pool, &format!("{table}_p{day}")).await);
    }

    let metrics = RetentionMetrics::new();
    let report = pass(&app, Some(&metrics)).await;

    for table in ["events", "deliveries", "attempts"] {
        let name = format!("{table}_p{day}");
        assert!(!table_exists(&app.pool, &name).await, "{name} still there");
        assert!(
            report.dropped.contains(&name),
            "{name} not reported: {report:?}"
        );
    }
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) FROM events WHERE id = $1",
            &old_event
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) FROM attempts WHERE delivery_id = $1",
            &old_delivery
        )
        .await,
        0
    );
    // Inside the retention: kept.
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) FROM events WHERE id = $1",
            &recent_event
        )
        .await,
        1
    );
    // Retiring is dropping: no row was deleted one by one, so the parents hold no dead rows.
    let dead: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(n_tup_del), 0)::bigint FROM pg_stat_user_tables
         WHERE relname ~ '^(events|deliveries|attempts)_p'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("stats");
    assert_eq!(dead, 0, "rows were deleted instead of partitions dropped");

    // At least three days ahead (the task keeps seven), for every table.
    for ahead in 1..=3 {
        let future = (today() + Days::new(ahead)).format("%Y%m%d");
        for table in ["events", "deliveries", "attempts"] {
            assert!(table_exists(&app.pool, &format!("{table}_p{future}")).await);
        }
    }
    for table in ["events", "deliveries", "attempts"] {
        assert!(gauge(&metrics, "railhook_partitions_ahead_days", table) >= 3.0);
        assert_eq!(gauge(&metrics, "railhook_partitions_held_back", table), 0.0);
        assert!(gauge(&metrics, "railhook_table_bytes", table) > 0.0);
    }
    // An Event written today lands in today's partition, so ingest still works.
    let reply = app
        .post_event(&key, "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_day_with_an_open_delivery_is_held_back_and_counted_until_it_ends() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let endpoint = app.endpoint(&key).await;
    let old = today() - Days::new(45);
    let (_, pending) = seed(&app, &project, &endpoint, noon(old), "PENDING").await;
    // A second, final Delivery on the same day does not make the day droppable.
    seed(
        &app,
        &project,
        &endpoint,
        noon(old) + chrono::Duration::hours(1),
        "SUCCEEDED",
    )
    .await;
    let day = old.format("%Y%m%d");

    let metrics = RetentionMetrics::new();
    let plan = {
        let mut conn = app.pool.acquire().await.expect("conn");
        retention::plan(&mut conn, Utc::now(), RETENTION_DAYS)
            .await
            .expect("plan")
    };
    let verdict = |name: String| {
        plan.iter()
            .find(|p| p.name == name)
            .map(|p| p.verdict.clone())
    };
    assert_eq!(
        verdict(format!("deliveries_p{day}")),
        Some(Verdict::HeldBack { open: 1 })
    );
    assert_eq!(
        verdict(format!("events_p{day}")),
        Some(Verdict::HeldBack { open: 1 })
    );

    let report = pass(&app, Some(&metrics)).await;
    for table in ["events", "deliveries", "attempts"] {
        let name = format!("{table}_p{day}");
        assert!(table_exists(&app.pool, &name).await, "{name} was dropped");
        assert!(report.held_back.contains(&name), "{name}: {report:?}");
        assert_eq!(gauge(&metrics, "railhook_partitions_held_back", table), 1.0);
    }
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) FROM deliveries WHERE id = $1",
            &pending
        )
        .await,
        1
    );

    // It ends: the next pass retires the day.
    sqlx::query("UPDATE deliveries SET status = 'FAILED' WHERE id = $1")
        .bind(&pending)
        .execute(&app.pool)
        .await
        .expect("fail it");
    let report = pass(&app, Some(&metrics)).await;
    for table in ["events", "deliveries", "attempts"] {
        assert!(!table_exists(&app.pool, &format!("{table}_p{day}")).await);
        assert_eq!(gauge(&metrics, "railhook_partitions_held_back", table), 0.0);
    }
    assert_eq!(report.held_back, Vec::<String>::new());
}

#[tokio::test]
async fn an_old_event_stays_while_a_replayed_delivery_of_it_is_open() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let endpoint = app.endpoint(&key).await;
    let old = today() - Days::new(50);
    let (event, _) = seed(&app, &project, &endpoint, noon(old), "SUCCEEDED").await;
    // A replay made a new Delivery of that Event today (today's partition), still PENDING.
    let mut tx = app.pool.begin().await.expect("begin");
    let replayed = DeliveryId::generate().into_string();
    seed_rows(
        &mut tx,
        &project,
        &endpoint,
        &event,
        &replayed,
        Utc::now(),
        "PENDING",
    )
    .await;
    tx.commit().await.expect("commit");
    let day = old.format("%Y%m%d");

    let report = pass(&app, None).await;
    // The old day's Deliveries and Attempts go; its Events stay for the open replay.
    assert!(!table_exists(&app.pool, &format!("deliveries_p{day}")).await);
    assert!(!table_exists(&app.pool, &format!("attempts_p{day}")).await);
    assert!(table_exists(&app.pool, &format!("events_p{day}")).await);
    assert!(report.held_back.contains(&format!("events_p{day}")));
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) FROM events WHERE id = $1",
            &event
        )
        .await,
        1
    );

    sqlx::query("UPDATE deliveries SET status = 'SUCCEEDED' WHERE id = $1")
        .bind(&replayed)
        .execute(&app.pool)
        .await
        .expect("deliver it");
    pass(&app, None).await;
    assert!(!table_exists(&app.pool, &format!("events_p{day}")).await);
}

#[tokio::test]
async fn a_pass_killed_after_a_detach_is_finished_by_the_next_one() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let endpoint = app.endpoint(&key).await;
    let open_day = today() - Days::new(60);
    let done_day = today() - Days::new(61);
    seed(&app, &project, &endpoint, noon(open_day), "PROCESSING").await;
    seed(&app, &project, &endpoint, noon(done_day), "SUCCEEDED").await;
    // What a pass leaves if it dies between its detach and its second check: two standalone
    // day tables (one holds an open Delivery, which must go back).
    for day in [open_day, done_day] {
        let name = format!("deliveries_p{}", day.format("%Y%m%d"));
        sqlx::query(&format!("ALTER TABLE deliveries DETACH PARTITION {name}"))
            .execute(&app.pool)
            .await
            .expect("detach");
    }

    pass(&app, None).await;

    let open = format!("deliveries_p{}", open_day.format("%Y%m%d"));
    let attached: bool =
        sqlx::query_scalar("SELECT relispartition FROM pg_class WHERE relname = $1")
            .bind(&open)
            .fetch_one(&app.pool)
            .await
            .expect("catalogue");
    assert!(attached, "{open} should be back in deliveries");
    let visible: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(visible, 1, "the open Delivery must be reachable again");
    for table in ["deliveries", "attempts", "events"] {
        let name = format!("{table}_p{}", done_day.format("%Y%m%d"));
        assert!(!table_exists(&app.pool, &name).await, "{name} still there");
    }
}

#[tokio::test]
async fn idempotency_holds_across_the_boundary_of_two_day_partitions() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let endpoint = app.endpoint(&key).await;
    app.subscribe(&key, &endpoint, &["order.paid"], false).await;
    // The first request was accepted a moment before midnight: its Event is in yesterday's
    // partition. Its retries arrive today and land (if anywhere) in today's.
    let before_midnight = today().and_hms_opt(0, 0, 0).expect("midnight").and_utc()
        - chrono::Duration::milliseconds(200);
    let first = EventId::generate_at(SystemTime::from(before_midnight)).into_string();
    let payload = json!({"order": 7});
    // The first request is still being written when its retries arrive: its statement —
    // the one production runs, `railhook_ingest` with 28 arguments — holds the key's lock
    // in a transaction left open, so the retries must wait for it and then find its Event
    // in yesterday's partition. Without the lock they would see nothing (it is not
    // committed) and each insert an Event today (review #34 item 16: before, the first
    // Event was committed up front and the test passed with the lock removed).
    let mut writing = app.pool.begin().await.expect("begin");
    let created: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM railhook_ingest($1, ARRAY[$2], ARRAY['order.paid'], ARRAY[$3],
                                        ARRAY['key-at-midnight'], '{}', '{}', '{}', '{}', '{}',
                                        24, ARRAY[NULL]::text[], ARRAY[NULL]::text[],
                                        ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[],
                                        '{}', '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL, NULL, NULL, NULL)",
    )
    .bind(&project)
    .bind(&first)
    .bind(payload.to_string())
    .fetch_all(&mut *writing)
    .await
    .expect("the first write");
    assert_eq!(created, vec![first.clone()]);
    let partition: String =
        sqlx::query_scalar("SELECT tableoid::regclass::text FROM events WHERE id = $1")
            .bind(&first)
            .fetch_one(&mut *writing)
            .await
            .expect("where");
    assert_eq!(
        partition,
        format!("events_p{}", (today() - Days::new(1)).format("%Y%m%d"))
    );

    // Twenty concurrent retries: each gets yesterday's Event, none creates one today.
    let retries = futures::future::join_all(
        (0..20)
            .map(|_| app.post_event(&key, "order.paid", payload.clone(), Some("key-at-midnight"))),
    );
    let release = async {
        crate::support::eventually(
            "the retries wait for the first writer's key lock",
            Duration::from_secs(30),
            || async {
                let waiting = crate::support::waiting_on_advisory_locks(&app.pool).await;
                (waiting >= 1).then_some(())
            },
        )
        .await;
        writing.commit().await.expect("commit");
    };
    let (replies, ()) = tokio::join!(retries, release);
    for reply in replies {
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.body["id"], first.as_str());
    }
    // The same key with another payload is still a conflict across the boundary.
    let conflict = app
        .post_event(
            &key,
            "order.paid",
            json!({"order": 8}),
            Some("key-at-midnight"),
        )
        .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE idempotency_key = 'key-at-midnight'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(events, 1);

    // Past the documented window (24 h) a key is free again: a new Event.
    let stale_at = Utc::now() - chrono::Duration::hours(30);
    let mut tx = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT railhook_ensure_partitions($1, $1)")
        .bind(stale_at.date_naive())
        .execute(&mut *tx)
        .await
        .expect("partition");
    sqlx::query(
        "INSERT INTO events (id, project_id, event_type, payload, idempotency_key, created_at)
         VALUES ($1, $2, 'order.paid', '{}', 'old-key', $3)",
    )
    .bind(EventId::generate_at(SystemTime::from(stale_at)).into_string())
    .bind(&project)
    .bind(stale_at)
    .execute(&mut *tx)
    .await
    .expect("stale Event");
    tx.commit().await.expect("commit");
    let fresh = app
        .post_event(&key, "order.paid", json!({"other": true}), Some("old-key"))
        .await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{:?}", fresh.body);
}

#[tokio::test]
async fn the_migration_converts_a_filled_database_of_the_previous_schema() {
    let server = crate::support::local_setting("DATABASE_URL");
    let base = server.rsplit_once('/').expect("url").0.to_owned();
    let name = format!(
        "rh_migrate_{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    let admin = PgPool::connect(&format!("{base}/postgres"))
        .await
        .expect("admin");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create");
    let pool = PgPool::connect(&format!("{base}/{name}"))
        .await
        .expect("connect");
    let mut files: Vec<_> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("migrations")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let (before, after): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|p| p.file_name().expect("name").to_string_lossy().as_ref() < "20261204000010");
    for file in &before {
        let sql = std::fs::read_to_string(file).expect("read");
        sqlx::raw_sql(&sql)
            .execute(&pool)
            .await
            .expect("old migration");
    }
    // A database of the previous schema, filled over 20 past days: 2,000 Events, each with
    // two Deliveries (ordered ones numbered) and an Attempt each.
    sqlx::raw_sql(
        "INSERT INTO organizations VALUES ('org_m', 'm', 1000000);
         INSERT INTO projects VALUES ('proj_m', 'org_m', 'm');
         INSERT INTO endpoints (id, project_id, url, secret)
             VALUES ('ep_a', 'proj_m', 'http://127.0.0.1:9/a', 's'), ('ep_b', 'proj_m', 'http://127.0.0.1:9/b', 's');",
    )
    .execute(&pool)
    .await
    .expect("tenants");
    let mut events = Vec::new();
    let mut deliveries = Vec::new();
    for n in 0..2000u64 {
        let at = Utc::now() - chrono::Duration::minutes((n * 14) as i64);
        let when = SystemTime::from(at);
        let event = EventId::generate_at(when).into_string();
        deliveries.push((
            DeliveryId::generate_at(when).into_string(),
            event.clone(),
            "ep_a",
            n as i64 + 1,
        ));
        deliveries.push((
            DeliveryId::generate_at(when).into_string(),
            event.clone(),
            "ep_b",
            -1,
        ));
        events.push((event, at, format!("key-{n}")));
    }
    for (id, at, key) in &events {
        sqlx::query(
            "INSERT INTO events (id, project_id, event_type, payload, idempotency_key, created_at)
             VALUES ($1, 'proj_m', 'order.paid', '{\"a\": 1}', $2, $3)",
        )
        .bind(id)
        .bind(key)
        .bind(at)
        .execute(&pool)
        .await
        .expect("event");
    }
    for (id, event, endpoint, seq) in &deliveries {
        sqlx::query(
            "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, ordered, sequence_number)
             VALUES ($1, 'proj_m', $2, $3, 'SUCCEEDED', $4 > 0, nullif($4, -1))",
        )
        .bind(id)
        .bind(event)
        .bind(endpoint)
        .bind(seq)
        .execute(&pool)
        .await
        .expect("delivery");
        sqlx::query(
            "INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at, status_code, outcome, duration_ms)
             VALUES ($1, 1, now(), now(), 200, 'succeeded', 5)",
        )
        .bind(id)
        .execute(&pool)
        .await
        .expect("attempt");
    }
    let last_attempt: i64 = sqlx::query_scalar("SELECT max(id) FROM attempts")
        .fetch_one(&pool)
        .await
        .expect("max");

    let started = std::time::Instant::now();
    for file in &after {
        let sql = std::fs::read_to_string(file).expect("read");
        sqlx::raw_sql(&sql)
            .execute(&pool)
            .await
            .expect("partitioning migration");
    }
    println!(
        "migrated 2,000 Events, 4,000 Deliveries and 4,000 Attempts in {:?}",
        started.elapsed()
    );

    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT relname::text, relkind::text FROM pg_class
         WHERE relname IN ('events', 'deliveries', 'attempts') ORDER BY relname",
    )
    .fetch_all(&pool)
    .await
    .expect("kinds");
    assert!(kinds.iter().all(|(_, k)| k == "p"), "{kinds:?}");
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries),
                (SELECT count(*) FROM attempts)",
    )
    .fetch_one(&pool)
    .await
    .expect("counts");
    assert_eq!(counts, (2000, 4000, 4000));
    // Every row sits in the partition of its id's day.
    let misplaced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events
         WHERE tableoid::regclass::text <> 'events_p' || to_char(railhook_ulid_time(id) AT TIME ZONE 'UTC', 'YYYYMMDD')",
    )
    .fetch_one(&pool)
    .await
    .expect("placement");
    assert_eq!(misplaced, 0);
    let days: i64 = sqlx::query_scalar("SELECT count(DISTINCT tableoid) FROM deliveries")
        .fetch_one(&pool)
        .await
        .expect("days");
    assert!(days >= 19, "{days} day partitions hold the deliveries");
    // Attempts keep their numbering; new ones continue it.
    let next: i64 = sqlx::query_scalar(
        "INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at, outcome, duration_ms)
         SELECT id, 2, now(), now(), 'failed', 1 FROM deliveries ORDER BY id DESC LIMIT 1 RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("new attempt");
    assert!(next > last_attempt);
    // The per-day Sequence Number backstop exists on the converted days.
    let (dup_event, dup_day): (String, String) = sqlx::query_as(
        "SELECT event_id, tableoid::regclass::text FROM deliveries WHERE sequence_number = 5",
    )
    .fetch_one(&pool)
    .await
    .expect("numbered");
    let clash = sqlx::query(&format!(
        "INSERT INTO {dup_day} (id, project_id, event_id, endpoint_id, sequence_number)
         SELECT replace(id, right(id, 4), 'zzzz'), project_id, event_id, endpoint_id, 5
         FROM deliveries WHERE sequence_number = 5"
    ))
    .execute(&pool)
    .await;
    assert!(
        clash.is_err(),
        "a second Sequence Number 5 on {dup_day} for {dup_event}"
    );
    pool.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE {name}"))
        .execute(&admin)
        .await;
}

#[tokio::test]
async fn configuration_refuses_a_retention_shorter_than_the_retry_horizon() {
    let url = "postgres://railhook@127.0.0.1:1/none";
    let figment = railhook_common::config::Settings::defaults()
        .merge(("database_url", url))
        .merge(("redis_url", "redis://127.0.0.1:1"))
        .merge(("retention_days", 4));
    let err = railhook_common::config::Settings::from_figment(figment)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("retention_days"), "{err}");
    let figment = railhook_common::config::Settings::defaults()
        .merge(("database_url", url))
        .merge(("redis_url", "redis://127.0.0.1:1"))
        .merge(("retention_days", 5));
    assert!(railhook_common::config::Settings::from_figment(figment).is_ok());
}

/// Review #34 item 13: a pass that cannot finish an interrupted retirement still makes the
/// days ahead. Here a detached day's table (what a pass killed between its detach and its
/// drop leaves) is locked by another session, so the pass's drop gives up at its lock
/// timeout and the pass fails; the partition for six days ahead, missing, is made anyway.
/// Before, the pass failed before it made any, and ingest would fail once the days ahead ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_cannot_finish_an_interrupted_retirement_still_makes_the_days_ahead() {
    let app = spawn_app().await;
    let ahead = format!("events_p{}", (today() + Days::new(6)).format("%Y%m%d"));
    pass(&app, None).await;
    assert!(table_exists(&app.pool, &ahead).await);
    sqlx::raw_sql(&format!("DROP TABLE {ahead}"))
        .execute(&app.pool)
        .await
        .expect("drop a day ahead");
    let loose = format!("events_p{}", (today() - Days::new(60)).format("%Y%m%d"));
    sqlx::raw_sql(&format!("CREATE TABLE {loose} (LIKE events)"))
        .execute(&app.pool)
        .await
        .expect("a detached day");
    let mut holder = app.pool.begin().await.expect("begin");
    sqlx::raw_sql(&format!("LOCK TABLE {loose} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *holder)
        .await
        .expect("lock");
    let failed = retention::run(&app.pool, Utc::now(), RETENTION_DAYS, None).await;
    assert!(failed.is_err(), "the drop waited past its lock timeout");
    assert!(
        table_exists(&app.pool, &ahead).await,
        "the days ahead were made first"
    );
    holder.rollback().await.expect("release");
    pass(&app, None).await;
    assert!(!table_exists(&app.pool, &loose).await, "finished next time");
}
