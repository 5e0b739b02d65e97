//! Stored filter tables (migration 20261206000028, docs/ROUTING.md, "How the ingest decides"):
//! a snapshot's filters kept parsed in Postgres under their digest decide exactly as their
//! texts do, a row that is gone is stored again without losing a request, and rows nobody
//! names go. Real Postgres, real HTTP.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::routing::{batch, endpoint, reached, subscription};
use crate::support::TestApp;
use crate::support::spawn_app;

/// Ten filtered endpoints (tables are named by digest from eight filters on) and one plain
/// one: the i-th filtered endpoint takes the Events of more than i × 100 cents.
struct Setup {
    plain: String,
    filtered: Vec<String>,
}

impl Setup {
    async fn new(app: &TestApp, key: &str) -> Self {
        let mut filtered = Vec::new();
        for i in 0..10 {
            let filter = format!("$.amount_cents > {}", i * 100);
            let e = endpoint(app, key, json!({ "filter": filter })).await;
            subscription(app, key, &e, None).await;
            filtered.push(e);
        }
        let plain = endpoint(app, key, json!({})).await;
        subscription(app, key, &plain, None).await;
        Self { plain, filtered }
    }

    fn expected(&self, amount: i64) -> BTreeSet<String> {
        let over = self
            .filtered
            .iter()
            .enumerate()
            .filter(|&(i, _)| amount > i as i64 * 100)
            .map(|(_, e)| e.clone());
        over.chain([self.plain.clone()]).collect()
    }
}

async fn post(app: &TestApp, key: &str, amount: i64) -> Value {
    let r = app
        .post_event(key, "order.paid", json!({ "amount_cents": amount }), None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body
}

/// The project's stored tables: how many filters each holds.
async fn stored(app: &TestApp, project: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT cardinality(paths) FROM filter_tables WHERE project_id = $1 ORDER BY 1",
    )
    .bind(project)
    .fetch_all(&app.pool)
    .await
    .expect("filter tables")
}

async fn resent(app: &TestApp) -> u64 {
    let page = app.metrics().await;
    page.lines()
        .find_map(|l| l.strip_prefix("railhook_ingest_filter_tables_resent_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_filter_tables_decide_as_texts_and_come_back_when_gone() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let setup = Setup::new(&app, &key).await;

    // The first statement stores the snapshot's tables; the next ones name them.
    for amount in [450, 50, 0, 1_000, 450] {
        let event = post(&app, &key, amount).await;
        assert_eq!(
            reached(&app, &event).await,
            setup.expected(amount),
            "{amount}"
        );
    }
    assert_eq!(
        stored(&app, &project).await,
        [10],
        "one row for the snapshot"
    );

    // Gone under the ingest (a restore, or deleted as unused while a snapshot still named
    // it): each request is still written, and decided the same. Within the sender cache's
    // second the ingest names the row without its texts, Postgres refuses (RH001, nothing
    // written) and the statement goes again with them; repeated until that happened.
    let before = resent(&app).await;
    let mut tries = 0;
    while resent(&app).await == before {
        tries += 1;
        assert!(tries <= 50, "the ingest never named a row that was gone");
        sqlx::query("DELETE FROM filter_tables WHERE project_id = $1")
            .bind(&project)
            .execute(&app.pool)
            .await
            .expect("delete");
        let event = post(&app, &key, 450).await;
        assert_eq!(reached(&app, &event).await, setup.expected(450));
        assert_eq!(stored(&app, &project).await, [10], "stored again");
    }

    // A batch, in its transaction, always sends the texts: the same decisions.
    sqlx::query("DELETE FROM filter_tables WHERE project_id = $1")
        .bind(&project)
        .execute(&app.pool)
        .await
        .expect("delete");
    let amounts = [50, 450, 950];
    let created = batch(&app, &key, amounts.map(|a| json!({ "amount_cents": a }))).await;
    for (event, amount) in created.iter().zip(amounts) {
        assert_eq!(
            reached(&app, event).await,
            setup.expected(amount),
            "batch {amount}"
        );
    }
    assert_eq!(stored(&app, &project).await, [10]);

    // A changed snapshot stores a row of its own; storing one deletes the project's rows no
    // statement named with their texts for an hour.
    sqlx::query(
        "UPDATE filter_tables SET used_at = now() - interval '2 hours' WHERE project_id = $1",
    )
    .bind(&project)
    .execute(&app.pool)
    .await
    .expect("age");
    let big = endpoint(&app, &key, json!({"filter": "$.amount_cents > 5000"})).await;
    subscription(&app, &key, &big, None).await;
    let event = post(&app, &key, 6_000).await;
    let mut want = setup.expected(6_000);
    want.insert(big);
    assert_eq!(reached(&app, &event).await, want);
    assert_eq!(stored(&app, &project).await, [11], "the old row went");
}

/// The statement itself: a digest Postgres does not have, without the texts, fails with
/// RH001 and writes nothing (the ingest's cue to send them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naming_tables_postgres_lacks_fails_and_writes_nothing() {
    let app = spawn_app().await;
    let (project, _key) = app.project().await;
    let id = railhook_common::ids::EventId::generate().into_string();
    let none: Vec<String> = Vec::new();
    let err = sqlx::query(
        "SELECT * FROM railhook_ingest($1, $2, $3, $4, $5, $6, $6, $6, $6, $7, 72, $5, $5, $5,
                                       $5, $5, $6, $6, $6, $7, $8, $8, $8, $9, NULL, NULL,
                                       NULL, NULL)",
    )
    .bind(&project)
    .bind(vec![id.clone()])
    .bind(vec!["order.paid"])
    .bind(vec![r#"{"amount_cents": 1}"#])
    .bind(vec![None::<String>])
    .bind(&none)
    .bind(Vec::<bool>::new())
    .bind(vec![1_i32])
    .bind(vec![7_u8; 32])
    .fetch_all(&app.pool)
    .await
    .expect_err("refused");
    let code = err
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("RH001"), "{err}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE id = $1")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(stored, 0);
}
