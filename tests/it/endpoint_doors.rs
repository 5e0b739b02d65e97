//! The endpoint's front doors share one change path (issue #55, crate::endpoint): a change
//! through the Svix surface or the portal commits the endpoint, its subscription and its
//! headers together or not at all, and the same change through the native API, the Svix
//! surface and the portal leaves the same endpoint behind.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::portal::{application, csrf_of, get, link, open, post};
use crate::support::{TestApp, spawn_app};

/// A trigger that fails any write of a subscription to the event type `boom.fail`: a
/// failure injected after the endpoint's own row was written in the same transaction.
async fn refuse_boom(app: &TestApp) {
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF 'boom.fail' = ANY(NEW.event_types) THEN RAISE EXCEPTION 'injected failure'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_boom BEFORE INSERT OR UPDATE ON subscriptions
             FOR EACH ROW EXECUTE FUNCTION refuse_boom();",
    )
    .execute(&app.pool)
    .await
    .expect("trigger");
}

async fn svix_endpoint(app: &TestApp, key: &str, a: &str, id: &str) -> Value {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/app/{a}/endpoint/{id}"),
            Some(key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    r.body
}

async fn svix_headers(app: &TestApp, key: &str, a: &str, id: &str) -> Value {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/app/{a}/endpoint/{id}/headers"),
            Some(key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    r.body["headers"].clone()
}

#[tokio::test]
async fn a_failure_between_the_endpoint_and_its_subscription_leaves_neither_changed() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/app/{a}/endpoint"),
            Some(&key),
            Some(
                json!({"url": "https://hooks.example.com/in", "description": "before",
                        "filterTypes": ["order.paid"], "headers": {"X-Team": "red"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let ep = r.body["id"].as_str().expect("id").to_owned();
    refuse_boom(&app).await;

    // The Svix PATCH: the endpoint's row is written, then its subscription fails.
    let r = app
        .call(
            Method::PATCH,
            &format!("/api/v1/app/{a}/endpoint/{ep}"),
            Some(&key),
            Some(json!({"description": "after", "throttleRate": 5, "filterTypes": ["boom.fail"]})),
        )
        .await;
    assert!(r.status.is_server_error(), "{} {:?}", r.status, r.body);
    assert!(
        !r.body.to_string().contains("injected"),
        "no database text in the answer: {:?}",
        r.body
    );
    let shown = svix_endpoint(&app, &key, &a, &ep).await;
    assert_eq!(shown["description"], "before", "{shown}");
    assert_eq!(shown["throttleRate"], Value::Null, "{shown}");
    assert_eq!(shown["filterTypes"], json!(["order.paid"]), "{shown}");

    // The Svix create: no endpoint without its subscription.
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/app/{a}/endpoint"),
            Some(&key),
            Some(json!({"url": "https://hooks.example.com/other", "filterTypes": ["boom.fail"]})),
        )
        .await;
    assert!(r.status.is_server_error(), "{} {:?}", r.status, r.body);
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/app/{a}/endpoint"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(
        r.body["data"].as_array().map(Vec::len),
        Some(1),
        "{:?}",
        r.body
    );

    // The portal's edit: its fields, its headers and its event types are one change.
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let edit = format!("{base}/endpoints/{ep}");
    let (_, page, _) = get(&app, &edit).await;
    let csrf = csrf_of(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("url", "https://hooks.example.com/in"),
        ("description", "after"),
        ("headers", "X-Team: blue"),
        ("event_types", "boom.fail"),
    ];
    let (status, body) = post(&app, &edit, &form).await;
    assert!(status.is_server_error(), "{status} {body}");
    let shown = svix_endpoint(&app, &key, &a, &ep).await;
    assert_eq!(shown["description"], "before", "{shown}");
    assert_eq!(shown["filterTypes"], json!(["order.paid"]), "{shown}");
    assert_eq!(
        svix_headers(&app, &key, &a, &ep).await,
        json!({"X-Team": "red"})
    );

    // Without the failure, the same edit lands whole.
    sqlx::raw_sql("DROP TRIGGER refuse_boom ON subscriptions")
        .execute(&app.pool)
        .await
        .expect("drop trigger");
    let form = [
        ("csrf", csrf.as_str()),
        ("url", "https://hooks.example.com/in"),
        ("description", "after"),
        ("headers", "X-Team: blue"),
        ("event_types", "order.shipped"),
    ];
    let (status, to) = post(&app, &edit, &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    let shown = svix_endpoint(&app, &key, &a, &ep).await;
    assert_eq!(shown["description"], "after", "{shown}");
    assert_eq!(shown["filterTypes"], json!(["order.shipped"]), "{shown}");
    assert_eq!(
        svix_headers(&app, &key, &a, &ep).await,
        json!({"X-Team": "blue"})
    );
}

/// The native view of an endpoint without what differs between two endpoints by nature.
async fn native_view(app: &TestApp, key: &str, id: &str) -> Value {
    let r = app
        .call(Method::GET, &format!("/v1/endpoints/{id}"), Some(key), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let mut v = r.body;
    let o = v.as_object_mut().expect("object");
    for k in ["id", "created_at", "updated_at", "public_key"] {
        o.remove(k);
    }
    v
}

#[tokio::test]
async fn the_same_change_through_each_door_leaves_the_same_endpoint() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let r = app
            .call(
                Method::POST,
                &format!("/api/v1/app/{a}/endpoint"),
                Some(&key),
                Some(json!({"url": format!("https://hooks.example.com/{n}")})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        ids.push(r.body["id"].as_str().expect("id").to_owned());
    }
    let url = "https://hooks.example.com/changed";
    let filter = "$.amount_cents > 100";

    // The native API: one PATCH.
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/endpoints/{}", ids[0]),
            Some(&key),
            Some(
                json!({"url": url, "description": "changed", "rate_limit_per_second": 7,
                        "channels": ["eu"], "filter": filter, "headers": {"X-Team": "blue"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

    // The Svix surface: the endpoint's PATCH and its headers' PUT.
    let r = app
        .call(
            Method::PATCH,
            &format!("/api/v1/app/{a}/endpoint/{}", ids[1]),
            Some(&key),
            Some(
                json!({"url": url, "description": "changed", "throttleRate": 7,
                        "channels": ["eu"], "filter": filter}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let r = app
        .call(
            Method::PUT,
            &format!("/api/v1/app/{a}/endpoint/{}/headers", ids[1]),
            Some(&key),
            Some(json!({"headers": {"X-Team": "blue"}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);

    // The portal: one form.
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let edit = format!("{base}/endpoints/{}", ids[2]);
    let (_, page, _) = get(&app, &edit).await;
    let csrf = csrf_of(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("url", url),
        ("description", "changed"),
        ("rate_limit", "7"),
        ("channels", "eu"),
        ("filter", filter),
        ("headers", "X-Team: blue"),
    ];
    let (status, to) = post(&app, &edit, &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");

    let native = native_view(&app, &key, &ids[0]).await;
    assert_eq!(native["description"], "changed", "{native}");
    assert_eq!(native_view(&app, &key, &ids[1]).await, native, "Svix");
    assert_eq!(native_view(&app, &key, &ids[2]).await, native, "portal");
    for id in &ids {
        assert_eq!(
            svix_headers(&app, &key, &a, id).await,
            json!({"X-Team": "blue"})
        );
    }
}

/// Scans of `table` and of its partitions in the test's database so far, every backend's
/// counters flushed: each backend of the database but `observer` is ended (a backend flushes
/// its counters as it exits; the app's pools reconnect on their next use). Only reads of the
/// table count, so the app's background loops (the Replay runner's polls) add nothing.
async fn table_scans(observer: &mut sqlx::PgConnection, table: &str) -> i64 {
    let ended: Vec<i32> = sqlx::query_scalar(
        "WITH others AS MATERIALIZED (
             SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid())
         SELECT pid FROM others WHERE pg_terminate_backend(pid)",
    )
    .fetch_all(&mut *observer)
    .await
    .expect("terminate");
    for _ in 0..500 {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&ended)
                .fetch_one(&mut *observer)
                .await
                .expect("activity");
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The app's pool pings a connection idle for over a second before handing it out, and
    // replaces the ones just ended; past that, the next request finds a live connection (the
    // scenario's length, not a wait for a condition).
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *observer)
        .await
        .expect("clear");
    sqlx::query_scalar(
        "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::int8
         FROM pg_stat_user_tables
         WHERE relid = $1::regclass
            OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)",
    )
    .bind(table)
    .fetch_one(&mut *observer)
    .await
    .expect("scans")
}

/// A connection to the test's database with index scans turned off for the database, so one
/// statement is one scan of each table (or partition) it reads (PostgreSQL 15 counts an index
/// scan of `= ANY(array)` once per element).
async fn observer_without_index_scans(app: &TestApp) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut observer = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("observer");
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET enable_indexscan = off', current_database());
                     EXECUTE format('ALTER DATABASE %I SET enable_bitmapscan = off', current_database()); END $$",
    )
    .execute(&mut observer)
    .await
    .expect("plans");
    observer
}

/// The `data` of a Svix list page. A request may meet a connection `table_scans` ended a
/// moment ago (a 500 the test itself caused): it is asked again, up to three times.
async fn svix_page(app: &TestApp, key: &str, path: &str) -> Vec<Value> {
    for _ in 0..3 {
        let r = app.call(Method::GET, path, Some(key), None).await;
        if r.status == StatusCode::INTERNAL_SERVER_ERROR {
            continue;
        }
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        return r.body["data"].as_array().cloned().unwrap_or_default();
    }
    panic!("{path}: three 500s in a row");
}

/// Issue #55 item 5: the Svix endpoint list reads its page's subscriptions in one statement,
/// however many endpoints the page holds. Counted as scans of `subscriptions` with the index
/// scans turned off for this database (so one statement is one scan; PostgreSQL 15 counts an
/// index scan of `= ANY(array)` once per element): a page of 61 endpoints costs one scan,
/// where one read per endpoint would cost 61.
#[tokio::test]
async fn the_svix_endpoint_list_reads_a_page_in_a_fixed_number_of_statements() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    for n in 0..61 {
        let r = app
            .call(
                Method::POST,
                &format!("/api/v1/app/{a}/endpoint"),
                Some(&key),
                Some(json!({"url": format!("https://hooks.example.com/{n}"),
                            "filterTypes": [format!("order.t{n}")]})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    let mut observer = observer_without_index_scans(&app).await;
    let before = table_scans(&mut observer, "subscriptions").await;
    let listed = svix_page(&app, &key, &format!("/api/v1/app/{a}/endpoint?limit=100")).await;
    assert_eq!(listed.len(), 61);
    let scans = table_scans(&mut observer, "subscriptions").await - before;
    println!("scans of subscriptions for a page of 61 endpoints: {scans}");
    assert!(
        (1..=2).contains(&scans),
        "a page of 61 endpoints read subscriptions {scans} times"
    );
}

/// Issue #55 item 5: the Svix attempt list with `with_msg` reads its page's messages in one
/// statement. Counted as scans of `events` and its day partitions with index scans off: one
/// statement scans each partition once at most, so a page of 40 attempts costs at most the
/// partition count (plus the endpoint's lookup), where one read per attempt would cost 40.
#[tokio::test]
async fn the_svix_attempt_list_reads_its_page_of_messages_in_one_statement() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/app/{a}/endpoint"),
            Some(&key),
            Some(json!({"url": "https://hooks.example.com/in", "filterTypes": ["order.paid"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let ep = r.body["id"].as_str().expect("id").to_owned();
    for n in 0..40 {
        let r = app
            .call(
                Method::POST,
                &format!("/api/v1/app/{a}/msg"),
                Some(&key),
                Some(json!({"eventType": "order.paid", "payload": {"n": n}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    }
    // One finished Attempt per Delivery, written as the worker would.
    let written = sqlx::query(
        "INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at,
                               status_code, outcome, duration_ms, fenced)
         SELECT d.id, 1, now(), now(), 200, 'SUCCEEDED', 3, false
         FROM deliveries d",
    )
    .execute(&app.pool)
    .await
    .expect("attempts")
    .rows_affected();
    assert_eq!(written, 40);
    let partitions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass")
            .fetch_one(&app.pool)
            .await
            .expect("partitions");
    let mut observer = observer_without_index_scans(&app).await;
    let before = table_scans(&mut observer, "events").await;
    let path = format!("/api/v1/app/{a}/attempt/endpoint/{ep}?limit=40&with_msg=true");
    let listed = svix_page(&app, &key, &path).await;
    assert_eq!(listed.len(), 40);
    assert!(
        listed
            .iter()
            .all(|at| at["msg"]["id"].is_string() && at["msg"]["id"] == at["msgId"]),
        "every attempt carries its message: {listed:?}"
    );
    let scans = table_scans(&mut observer, "events").await - before;
    println!("scans of events ({partitions} partitions) for a page of 40 attempts: {scans}");
    assert!(
        scans <= partitions + 2,
        "a page of 40 attempts read events {scans} times ({partitions} partitions)"
    );
}

/// The Svix view reads at most 100 subscriptions an endpoint (the newest): a tenant with
/// thousands on one endpoint does not make each page of endpoints cost thousands of rows.
#[tokio::test]
async fn the_svix_view_reads_at_most_a_hundred_subscriptions_an_endpoint() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/app/{a}/endpoint"),
            Some(&key),
            Some(json!({"url": "https://hooks.example.com/in", "filterTypes": ["t.first"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let ep = r.body["id"].as_str().expect("id").to_owned();
    for n in 0..100 {
        app.subscribe(&key, &ep, &[&format!("t.n{n:03}")], false)
            .await;
    }
    let shown = svix_endpoint(&app, &key, &a, &ep).await;
    let types: Vec<&str> = shown["filterTypes"]
        .as_array()
        .expect("filterTypes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(types.len(), 100, "{types:?}");
    assert!(!types.contains(&"t.first"), "the oldest is left out");
    assert!(types.contains(&"t.n099"), "the newest is read");
}

/// The Svix surface's operational-webhook endpoints go through the same checks and writes as
/// `/v1/operational-endpoints`: one made disabled is disabled from its first statement, a PUT
/// replaces its fields, a DELETE removes it.
#[tokio::test]
async fn svix_operational_endpoints_are_made_changed_and_deleted_in_one_write_each() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let base = "/api/v1/operational-webhook/endpoint";
    let r = app
        .call(
            Method::POST,
            base,
            Some(&key),
            Some(
                json!({"url": "https://ops.example.com/in", "disabled": true,
                        "filterTypes": ["endpoint.disabled"]}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body["disabled"], true, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let native = app
        .call(
            Method::GET,
            &format!("/v1/operational-endpoints/{id}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(native.body["enabled"], false, "{:?}", native.body);

    let r = app
        .call(
            Method::PUT,
            &format!("{base}/{id}"),
            Some(&key),
            Some(
                json!({"url": "https://ops.example.com/other", "description": "ops",
                        "disabled": false}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["disabled"], false, "{:?}", r.body);
    assert_eq!(
        r.body["url"], "https://ops.example.com/other",
        "{:?}",
        r.body
    );
    assert_eq!(
        r.body["filterTypes"],
        Value::Null,
        "every type: {:?}",
        r.body
    );

    // A bad URL is refused and changes nothing.
    let r = app
        .call(
            Method::PUT,
            &format!("{base}/{id}"),
            Some(&key),
            Some(json!({"url": "not a url"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);

    let r = app
        .call(Method::DELETE, &format!("{base}/{id}"), Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    let r = app
        .call(Method::GET, &format!("{base}/{id}"), Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.body);
}

/// Postgres's text holds no NUL character: a name or a description with one is refused
/// with a 422 naming the field, never a 500 from the write (found by the fuzz test).
#[tokio::test]
async fn a_nul_in_a_name_or_a_description_is_refused_by_field() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let r = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(&key),
            Some(json!({"name": "a\u{0}b"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert!(r.body.to_string().contains("name"), "{:?}", r.body);
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": "https://hooks.example.com/in", "description": "a\u{0}b"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert!(r.body.to_string().contains("description"), "{:?}", r.body);
}
