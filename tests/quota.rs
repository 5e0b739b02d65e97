//! The monthly quota in Redis: refused before any write when used up; never failing an
//! ingest when Redis is gone.

mod support;

use reqwest::StatusCode;
use serde_json::json;
use support::{PrivateRedis, spawn_app_with_redis};

#[tokio::test]
async fn an_exhausted_quota_refuses_with_429_and_writes_nothing() {
    let redis = PrivateRedis::start();
    let app = spawn_app_with_redis(&redis.url).await;
    let (_, key) = app.project_with_quota(3).await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    for n in 0..3 {
        let r = app
            .post_event(&key, "a.b", json!({"n": n}), Some(&format!("q{n}")))
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let r = app.post_event(&key, "a.b", json!({"n": 3}), None).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.code(), "quota_exceeded");
    assert_eq!(r.content_type, "application/problem+json");
    assert_eq!(app.counts().await, (3, 3, 3));
    // A retry of an already accepted event is not a new event: it is answered, not refused.
    let retry = app
        .post_event(&key, "a.b", json!({"n": 0}), Some("q0"))
        .await;
    assert_eq!(retry.status, StatusCode::OK);
    // The counter in Redis holds exactly what was charged.
    let client = redis::Client::open(redis.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("railhook:quota:*")
        .query_async(&mut conn)
        .await
        .expect("keys");
    assert_eq!(keys.len(), 1);
    let used: i64 = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .expect("get");
    assert_eq!(used, 3);
    assert!(
        app.metrics()
            .await
            .contains("railhook_quota_rejected_total 1")
    );
}

#[tokio::test]
async fn with_redis_dead_ingest_still_succeeds_and_says_the_charge_was_skipped() {
    let mut redis = PrivateRedis::start();
    let app = spawn_app_with_redis(&redis.url).await;
    let (_, key) = app.project_with_quota(1).await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let r = app.post_event(&key, "a.b", json!({"n": 0}), None).await;
    assert_eq!(r.status, StatusCode::CREATED);
    redis.kill();
    // Over quota by now, but Redis cannot say so: accepted events are never refused for it.
    for n in 1..4 {
        let started = std::time::Instant::now();
        let r = app.post_event(&key, "a.b", json!({"n": n}), None).await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
    assert_eq!(app.counts().await, (4, 4, 4));
    let metrics = app.metrics().await;
    let skipped: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("railhook_quota_charge_skipped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(skipped >= 3, "{metrics}");
}
