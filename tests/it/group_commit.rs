//! Group commit (ingest/src/group_commit.rs) against real Postgres over real HTTP: single
//! Events that wait for a busy writer share one statement, each still commits with its
//! Deliveries and Outbox rows, and one request the database refuses fails alone.
//!
//! The writer is made busy deterministically: with one writer, a first request carries an
//! Idempotency-Key whose advisory lock the test holds, so its statement waits inside
//! Postgres until the test lets go.

use std::time::Duration;

use crate::support::{TestApp, eventually, local_setting, spawn_app_tuned};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::{Postgres, Transaction};

async fn one_writer() -> TestApp {
    spawn_app_tuned(&local_setting("REDIS_URL"), |f| {
        f.merge(("ingest_writers", 1))
    })
    .await
}

/// Holds the advisory lock `railhook_ingest()` takes for `key` in `project`.
async fn hold_key(app: &TestApp, project: &str, key: &str) -> Transaction<'static, Postgres> {
    let mut tx = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
        .bind(project)
        .bind(key)
        .execute(&mut *tx)
        .await
        .expect("lock");
    tx
}

/// Makes the one writer busy: a request with an Idempotency-Key whose lock the test holds,
/// until the returned transaction ends. Returns once its statement waits on the lock.
async fn busy_writer(
    app: &TestApp,
    project: &str,
    key: &str,
) -> (
    Transaction<'static, Postgres>,
    tokio::task::JoinHandle<StatusCode>,
) {
    let held = hold_key(app, project, "first").await;
    let (base, client, key) = (app.base.clone(), app.client.clone(), key.to_owned());
    let first = tokio::spawn(async move {
        client
            .post(format!("{base}/v1/events"))
            .bearer_auth(key)
            .header("Idempotency-Key", "first")
            .json(&json!({"type": "order.paid", "payload": {"n": 0}}))
            .send()
            .await
            .expect("request")
            .status()
    });
    writer_blocked(app).await;
    (held, first)
}

/// An endpoint with a payload filter, subscribed to every order Event.
async fn filtered_endpoint(app: &TestApp, key: &str, filter: &str) -> String {
    let r = app
        .call(
            reqwest::Method::POST,
            "/v1/endpoints",
            Some(key),
            Some(json!({"url": "http://127.0.0.1:9/filtered", "filter": filter})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    app.subscribe(key, &id, &["order.*"], false).await;
    id
}

/// Each answer names exactly the Deliveries stored for its Event, by id.
async fn answers_name_what_was_stored(app: &TestApp, bodies: &[&serde_json::Value]) {
    for body in bodies {
        let mut answered: Vec<String> = body["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|d| d["id"].as_str().expect("id").to_owned())
            .collect();
        answered.sort();
        let stored: Vec<String> =
            sqlx::query_scalar("SELECT id FROM deliveries WHERE event_id = $1 ORDER BY id")
                .bind(body["id"].as_str().expect("event"))
                .fetch_all(&app.pool)
                .await
                .expect("stored");
        assert_eq!(answered, stored, "{body}");
    }
}

/// The value of an unlabelled metric line.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// Waits until the one writer's statement is blocked on the held lock.
async fn writer_blocked(app: &TestApp) {
    eventually(
        "the writer waits on the key's lock",
        Duration::from_secs(30),
        || async {
            let waiting = crate::support::waiting_on_advisory_locks(&app.pool).await;
            (waiting == 1).then_some(())
        },
    )
    .await;
}

async fn queued(app: &TestApp, n: f64) {
    eventually(
        "requests queue for the writer",
        Duration::from_secs(30),
        || async {
            let text = app.metrics().await;
            (metric(&text, "railhook_ingest_group_commit_waiting") == n).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_events_waiting_for_a_writer_share_one_statement_and_each_commits_whole() {
    let app = one_writer().await;
    let (project, key) = app.project().await;
    let a = app.endpoint(&key).await;
    let b = app.endpoint(&key).await;
    app.subscribe(&key, &a, &["order.*"], false).await;
    app.subscribe(&key, &b, &["order.paid"], false).await;
    // And one behind a payload filter: its candidates are numbered across the group's
    // statement, and each answer must name the ids the statement wrote for it.
    let c = filtered_endpoint(&app, &key, "$.n > 4").await;

    let (held, first) = busy_writer(&app, &project, &key).await;
    // Ten more, two of them retries of one key: they queue behind the busy writer.
    let rest: Vec<_> =
        (1..=10)
            .map(|n| {
                let (base, client, key) = (app.base.clone(), app.client.clone(), key.clone());
                tokio::spawn(async move {
                    let mut req = client
                    .post(format!("{base}/v1/events"))
                    .bearer_auth(key)
                    .json(&json!({"type": if n % 2 == 0 { "order.paid" } else { "order.refunded" },
                                  "payload": {"n": if n >= 9 { 9 } else { n }}}));
                    if n >= 9 {
                        req = req.header("Idempotency-Key", "twice");
                    }
                    let resp = req.send().await.expect("request");
                    let status = resp.status();
                    let body: serde_json::Value = resp.json().await.expect("json");
                    (n, status, body)
                })
            })
            .collect();
    queued(&app, 10.0).await;
    held.rollback().await.expect("release");

    assert_eq!(first.await.expect("first"), StatusCode::CREATED);
    let mut replies = Vec::new();
    for r in rest {
        replies.push(r.await.expect("reply"));
    }
    // n = 9 and n = 10 carry one key with different types (order.refunded, order.paid):
    // whichever the statement takes first inserts, the other is a reused key (409).
    let statuses: Vec<(i32, StatusCode)> = replies.iter().map(|(n, s, _)| (*n, *s)).collect();
    for (n, status) in &statuses[..8] {
        assert_eq!(*status, StatusCode::CREATED, "request {n}");
    }
    let keyed: Vec<StatusCode> = statuses[8..].iter().map(|(_, s)| *s).collect();
    assert!(
        keyed == [StatusCode::CREATED, StatusCode::CONFLICT]
            || keyed == [StatusCode::CONFLICT, StatusCode::CREATED],
        "one keyed request wins, the other conflicts: {keyed:?}"
    );

    // 10 Events: each with a Delivery per matching endpoint and an Outbox row per Delivery,
    // and every Delivery the API reported is stored.
    let (events, deliveries, outbox) = app.counts().await;
    assert_eq!(events, 10);
    let created: Vec<&serde_json::Value> = replies
        .iter()
        .filter(|(_, s, _)| *s == StatusCode::CREATED)
        .map(|(_, _, body)| body)
        .collect();
    answers_name_what_was_stored(&app, &created).await;
    // Payload n is the request's n, 9 for both keyed ones (one of which conflicts).
    let filtered_written = replies
        .iter()
        .filter(|(n, s, _)| *s == StatusCode::CREATED && *n > 4)
        .count();
    assert_eq!(filtered_written, 5, "the filter let n = 5..=9 through");
    let through_c: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1")
            .bind(&c)
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(through_c as usize, filtered_written);
    let expected: usize = 2 + replies
        .iter()
        .filter(|(_, s, _)| *s == StatusCode::CREATED)
        .map(|(_, _, body)| body["deliveries"].as_array().expect("deliveries").len())
        .sum::<usize>();
    assert_eq!(deliveries as usize, expected);
    assert_eq!(outbox, deliveries);
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries d
         WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id)
            OR NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("orphans");
    assert_eq!(orphans, 0);

    // Two statements: the first request alone, then the ten that waited, together.
    let text = app.metrics().await;
    assert_eq!(
        metric(&text, "railhook_ingest_group_commit_events_count"),
        2.0
    );
    assert_eq!(
        metric(&text, "railhook_ingest_group_commit_events_sum"),
        11.0
    );
    assert_eq!(metric(&text, "railhook_ingest_group_commit_waiting"), 0.0);
    assert_eq!(
        metric(&text, "railhook_ingest_group_commit_retried_total"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_database_refuses_fails_alone_and_its_group_still_commits() {
    let app = one_writer().await;
    let (project, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    // A database that refuses one Event: what a constraint, a trigger or a corrupt row
    // would do to one request of a group.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.payload ? 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_poison BEFORE INSERT ON events
             FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
    )
    .execute(&app.pool)
    .await
    .expect("trigger");

    let (held, first) = busy_writer(&app, &project, &key).await;
    let rest: Vec<_> = (1..=5)
        .map(|n| {
            let (base, client, key) = (app.base.clone(), app.client.clone(), key.clone());
            let payload = if n == 3 {
                json!({"poison": true})
            } else {
                json!({"n": n})
            };
            tokio::spawn(async move {
                let resp = client
                    .post(format!("{base}/v1/events"))
                    .bearer_auth(key)
                    .json(&json!({"type": "order.paid", "payload": payload}))
                    .send()
                    .await
                    .expect("request");
                let status = resp.status();
                let content_type = resp
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap_or("").to_owned());
                let body = resp.text().await.expect("body");
                (n, status, content_type, body)
            })
        })
        .collect();
    queued(&app, 5.0).await;
    held.rollback().await.expect("release");

    assert_eq!(first.await.expect("first"), StatusCode::CREATED);
    for r in rest {
        let (n, status, content_type, body) = r.await.expect("reply");
        if n == 3 {
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
            assert_eq!(content_type.as_deref(), Some("application/problem+json"));
            assert!(
                !body.contains("poisoned"),
                "database text in the answer: {body}"
            );
        } else {
            assert_eq!(status, StatusCode::CREATED, "request {n}: {body}");
        }
    }
    // The first and the four good ones, each with its Delivery and Outbox row; nothing of
    // the refused one.
    assert_eq!(app.counts().await, (5, 5, 5));
    let text = app.metrics().await;
    assert_eq!(
        metric(&text, "railhook_ingest_group_commit_retried_total"),
        1.0
    );
    // The first alone, the group of five (refused), then each of the five on its own.
    assert_eq!(
        metric(&text, "railhook_ingest_group_commit_events_count"),
        7.0
    );
}

/// Review #34 item 5 (a): a statement that committed but whose answer was lost (its
/// connection ended right after COMMIT) is not a failure. Before, the group's requests were
/// written again one by one, met their own Events as duplicate keys, and answered 500 for
/// Events that exist, and each client retry then made a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_commit_answer_was_lost_answers_each_request_with_its_event() {
    let app = one_writer().await;
    let (project, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    // Behind a filter, n = 4..=6 pass: with the answer lost, which candidates were written is
    // found from the ids they would have been written with.
    filtered_endpoint(&app, &key, "$.n > 3").await;
    let (held, first) = busy_writer(&app, &project, &key).await;
    let rest: Vec<_> = (1..=6)
        .map(|n| {
            let (base, client, key) = (app.base.clone(), app.client.clone(), key.clone());
            tokio::spawn(async move {
                let resp = client
                    .post(format!("{base}/v1/events"))
                    .bearer_auth(key)
                    .json(&json!({"type": "order.paid", "payload": {"n": n}}))
                    .send()
                    .await
                    .expect("request");
                let status = resp.status();
                let body: serde_json::Value = resp.json().await.expect("json");
                (status, body)
            })
        })
        .collect();
    queued(&app, 6.0).await;
    // The next statement (the group of six) commits on a connection that then ends.
    app.state.group_commit.answer_fault().arm();
    held.rollback().await.expect("release");
    assert_eq!(first.await.expect("first"), StatusCode::CREATED);
    let mut ids = Vec::new();
    let mut bodies = Vec::new();
    for r in rest {
        let (status, body) = r.await.expect("reply");
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["id"].as_str().expect("id").to_owned());
        bodies.push(body);
    }
    answers_name_what_was_stored(&app, &bodies.iter().collect::<Vec<_>>()).await;
    // Each answer names an Event that exists, once, with its Delivery and Outbox row.
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_one(&app.pool)
        .await
        .expect("stored");
    assert_eq!(stored, 6);
    assert_eq!(app.counts().await, (7, 10, 10));
}

/// Review #34 item 5 (a) and (c) for a request written alone: its lost answer is a 201,
/// and the quota charges the Event it wrote (before: a 500, the charge refunded, so the
/// client's retry made a second Event past the quota).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_request_whose_commit_answer_was_lost_is_created_and_charged() {
    let app = one_writer().await;
    let (_, key) = app.project_with_quota(1).await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    app.state.group_commit.answer_fault().arm();
    let r = app
        .post_event(&key, "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(app.counts().await, (1, 1, 1));
    let over = app
        .post_event(&key, "order.paid", json!({"n": 2}), None)
        .await;
    assert_eq!(
        over.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        over.body
    );
    assert_eq!(app.counts().await, (1, 1, 1));
}

/// Review #34 item 5 (b): a request whose caller is gone (it hung up, or the API's time
/// limit answered it) while it waited for a writer is not written: no Event exists for an
/// answer nobody read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_caller_hung_up_is_not_written() {
    let app = one_writer().await;
    let (project, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["order.*"], false).await;
    let (held, first) = busy_writer(&app, &project, &key).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let gone = impatient
        .post(format!("{}/v1/events", app.base))
        .bearer_auth(&key)
        .json(&json!({"type": "order.paid", "payload": {"left": true}}))
        .send()
        .await;
    assert!(gone.is_err(), "the request timed out at the client");
    // The server drops the handler with the connection (hyper sees the client's FIN while
    // the handler waits); its job stays queued until the writer takes it.
    held.rollback().await.expect("release");
    assert_eq!(first.await.expect("first"), StatusCode::CREATED);
    eventually(
        "the abandoned request is counted",
        Duration::from_secs(30),
        || async {
            let text = app.metrics().await;
            (metric(&text, "railhook_ingest_group_commit_abandoned_total") == 1.0).then_some(())
        },
    )
    .await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE payload ? 'left'")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(left, 0, "the request nobody waits for was written");
    assert_eq!(app.counts().await, (1, 1, 1));
}

/// The start-up warm (issue #35) runs the ingest statement on each connection it opens with
/// nothing to write: it plans and writes no row, and the API works as before after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_warm_plans_on_each_connection_and_writes_nothing() {
    let app = spawn_app_tuned(&local_setting("REDIS_URL"), |f| f).await;
    railhook_ingest::group_commit::warm(&app.pool).await;
    let written: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM deliveries) \
              + (SELECT count(*) FROM outbox)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(written, 0);
    let ahead = railhook_common::db::OPEN_AHEAD.min(app.pool.options().get_max_connections());
    // A connection goes back to the pool by a task of its own after its holder drops it.
    eventually(
        "the warmed connections back in the pool",
        Duration::from_secs(10),
        || async { (app.pool.num_idle() >= ahead as usize).then_some(()) },
    )
    .await;
    let (_, key) = app.project().await;
    let r = app
        .client
        .post(format!("{}/v1/events", app.base))
        .bearer_auth(&key)
        .json(&json!({"type": "order.paid", "payload": {}}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::CREATED);
}
