//! The least-privilege recipe of docs/operate/slot.md ("Roles and `pg_hba.conf`"), run as
//! written: its second SQL block creates the ingest and worker role (a unique name and the
//! test database put in), then the real binaries run against real Postgres, Kafka and
//! Redis — `railhook ingest` and `railhook worker` as that role, `railhook relay` as the
//! owner — and everything the product does on that path must work, while the role is
//! refused what it must not do.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{ADMIN_TOKEN, free_port, local_setting};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;

const WAIT: Duration = Duration::from_secs(90);
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The SQL block of docs/operate/slot.md that creates `railhook_app`.
fn app_role_recipe() -> String {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/operate/slot.md")).expect("doc");
    doc.split("```sql")
        .skip(1)
        .map(|b| b.split("```").next().expect("block"))
        .find(|b| b.contains("CREATE ROLE railhook_app"))
        .expect("the railhook_app block in docs/operate/slot.md")
        .to_owned()
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(role: &str, env: &[(String, String)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg(role)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("railhook")
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("request");
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_workers_run_on_the_documented_least_privilege_role() {
    // The owner: the local cluster's role (a superuser, standing in for the recipe's
    // `railhook` with REPLICATION) migrates a fresh database.
    let owner_url = crate::support::fresh_database().await;
    let (base, db) = owner_url.rsplit_once('/').expect("url");
    let owner = PgPoolOptions::new()
        .max_connections(2)
        .connect(&owner_url)
        .await
        .expect("owner");
    let owner_name: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&owner)
        .await
        .expect("user");
    let role = format!("rh_app_{}", ulid::Ulid::new().to_string().to_lowercase());
    let password = format!("pw{}", ulid::Ulid::new());
    let recipe = app_role_recipe()
        .replace("railhook_app", &role)
        .replace("'…'", &format!("'{password}'"))
        .replace("ON DATABASE railhook ", &format!("ON DATABASE {db} "))
        .replace("FOR ROLE railhook ", &format!("FOR ROLE {owner_name} "));
    sqlx::raw_sql(&recipe)
        .execute(&owner)
        .await
        .expect("the recipe runs");
    let (scheme_user, host) = base.split_once('@').expect("user@host");
    let scheme = scheme_user.split("//").next().expect("scheme");
    let app_url = format!("{scheme}//{role}:{password}@{host}/{db}");

    let slot = format!("rh_{}", ulid::Ulid::new().to_string().to_lowercase());
    let prefix = format!("t{}.", ulid::Ulid::new().to_string().to_lowercase());
    let api_port = free_port();
    let api = format!("http://127.0.0.1:{api_port}");
    let relay_metrics = format!("http://127.0.0.1:{}", free_port());
    let common = |url: &str, metrics: &str| -> Vec<(String, String)> {
        [
            ("DATABASE_URL", url.to_owned()),
            ("REDIS_URL", local_setting("REDIS_URL")),
            ("KAFKA_BROKERS", local_setting("KAFKA_BROKERS")),
            ("RAILHOOK_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
            ("RAILHOOK_SLOT", slot.clone()),
            ("RAILHOOK_TOPIC_PREFIX", prefix.clone()),
            ("RAILHOOK_WORKER_GROUP", format!("{prefix}g")),
            ("RAILHOOK_KAFKA_PARTITIONS", "3".to_owned()),
            ("RAILHOOK_ALLOW_PRIVATE_TARGETS", "127.0.0.0/8".to_owned()),
            ("RAILHOOK_RETRY_OUTGOING_DELAYS", "0.2".to_owned()),
            ("RAILHOOK_RETRY_OVERLOAD_FLOOR_MS", "0".to_owned()),
            ("RAILHOOK_RETRY_SCHEDULER_MS", "100".to_owned()),
            ("RAILHOOK_HTTP_ADDR", format!("127.0.0.1:{api_port}")),
            ("RAILHOOK_API_METRICS", "true".to_owned()),
            (
                "RAILHOOK_METRICS_TOKEN",
                crate::support::METRICS_TOKEN.to_owned(),
            ),
            (
                "RAILHOOK_METRICS_ADDR",
                metrics.trim_start_matches("http://").to_owned(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    // `railhook migrate` as the owner: the publication and the Slot.
    let migrate = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("migrate")
        .envs(common(&owner_url, &relay_metrics))
        .output()
        .expect("migrate");
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let worker_metrics = format!("http://127.0.0.1:{}", free_port());
    let _processes = Processes(vec![
        spawn("relay", &common(&owner_url, &relay_metrics)),
        spawn("ingest", &common(&app_url, &relay_metrics)),
        spawn("worker", &common(&app_url, &worker_metrics)),
    ]);
    let http = reqwest::Client::new();
    crate::support::eventually("ingest ready", WAIT, || async {
        http.get(format!("{api}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;

    use reqwest::Method;
    let (code, org) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/organizations"),
        ADMIN_TOKEN,
        Some(json!({"name": "least", "monthly_quota": 1000})),
    )
    .await;
    assert_eq!(code, 201, "{org}");
    let (code, project) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/projects"),
        ADMIN_TOKEN,
        Some(json!({"organization_id": org["id"], "name": "least"})),
    )
    .await;
    assert_eq!(code, 201, "{project}");
    let key = project["api_key"].as_str().expect("key").to_owned();
    // The first two Attempts fail: the retry path (the scheduler's Claim, the retry topic,
    // a second Claim) runs on the app role too, and the ordered successors wait behind it.
    let receiver = Receiver::start(
        vec![Behaviour::Status(500), Behaviour::Status(500)],
        Behaviour::Status(204),
    )
    .await;
    let (code, ep) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/endpoints"),
        &key,
        Some(json!({"url": receiver.url, "timeout_ms": 2000})),
    )
    .await;
    assert_eq!(code, 201, "{ep}");
    let (code, sub) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/subscriptions"),
        &key,
        Some(json!({"endpoint_id": ep["id"], "event_types": ["order.*"], "ordered": true})),
    )
    .await;
    assert_eq!(code, 201, "{sub}");
    let mut deliveries = Vec::new();
    for i in 0..4 {
        let post = || {
            http.post(format!("{api}/v1/events"))
                .bearer_auth(&key)
                .header("idempotency-key", format!("least-{i}"))
                .json(&json!({"type": "order.paid", "payload": {"n": i}}))
                .send()
        };
        let first = post().await.expect("post");
        assert_eq!(first.status(), 201);
        let first: Value = first.json().await.expect("json");
        // The same key again: the same Event (the ingest function's per-key lock).
        let again: Value = post().await.expect("post").json().await.expect("json");
        assert_eq!(first["id"], again["id"]);
        deliveries.push(
            first["deliveries"][0]["id"]
                .as_str()
                .expect("delivery")
                .to_owned(),
        );
    }
    for d in &deliveries {
        let url = format!("{api}/v1/deliveries/{d}");
        crate::support::eventually("delivered after a retry", WAIT, || async {
            let (_, body) = call(&http, Method::GET, &url, &key, None).await;
            (body["status"] == "SUCCEEDED").then_some(())
        })
        .await;
    }
    let sequence: Vec<String> = receiver
        .requests()
        .iter()
        .filter(|r| r.answered == Some(204))
        .map(|r| {
            r.headers
                .get("x-sequence-number")
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(sequence, ["1", "2", "3", "4"], "ordered Sequence Numbers");

    // A payload expunge, and a provider webhook forwarded to a destination.
    let (code, event) = call(
        &http,
        Method::GET,
        &format!("{api}/v1/deliveries/{}", deliveries[0]),
        &key,
        None,
    )
    .await;
    assert_eq!(code, 200);
    let (code, expunged) = call(
        &http,
        Method::DELETE,
        &format!(
            "{api}/v1/events/{}/payload",
            event["event_id"].as_str().expect("event")
        ),
        &key,
        None,
    )
    .await;
    assert_eq!(code, 200, "{expunged}");
    let secret = "least-privilege-source-secret";
    let (code, source) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/sources"),
        &key,
        Some(json!({"provider": "github", "secret": secret, "name": "gh"})),
    )
    .await;
    assert_eq!(code, 201, "{source}");
    let source = source["id"].as_str().expect("source").to_owned();
    let forwarded = Receiver::start(vec![], Behaviour::Status(200)).await;
    let (code, dest) = call(
        &http,
        Method::POST,
        &format!("{api}/v1/sources/{source}/destinations"),
        &key,
        Some(json!({"url": forwarded.url, "timeout_ms": 2000})),
    )
    .await;
    assert_eq!(code, 201, "{dest}");
    let body = r#"{"action":"opened"}"#;
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(body.as_bytes());
    let signature: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for _ in 0..2 {
        let r = http
            .post(format!("{api}/in/{source}"))
            .header("content-type", "application/json")
            .header("x-github-event", "issues")
            .header("x-github-delivery", "least-1")
            .header("x-hub-signature-256", format!("sha256={signature}"))
            .body(body)
            .send()
            .await
            .expect("in");
        assert!(r.status().is_success(), "{}", r.status());
    }
    crate::support::eventually("the provider webhook forwarded", WAIT, || async {
        (forwarded.count() >= 1).then_some(())
    })
    .await;

    // Retention: the relay (the owner) ran a pass; ingest, on the app role, left it alone
    // rather than failing.
    let page = |url: String| {
        let http = http.clone();
        async move {
            http.get(format!("{url}/metrics"))
                .bearer_auth(crate::support::METRICS_TOKEN)
                .send()
                .await
                .expect("metrics")
                .text()
                .await
                .expect("page")
        }
    };
    crate::support::eventually("the relay's retention pass", WAIT, || async {
        page(relay_metrics.clone())
            .await
            .contains("railhook_retention_runs_total{result=\"ok\"} 1")
            .then_some(())
    })
    .await;
    let ingest_page = page(api.clone()).await;
    assert!(
        !ingest_page.lines().any(|l| l
            .starts_with("railhook_retention_runs_total{result=\"error\"}")
            && !l.ends_with(" 0")),
        "ingest's retention failed on the app role"
    );

    // What the role must not do.
    let app = PgPoolOptions::new()
        .max_connections(1)
        .connect(&app_url)
        .await
        .expect("app role");
    let attributes: (bool, bool, bool, bool) = sqlx::query_as(
        "SELECT rolsuper, rolreplication, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&app)
    .await
    .expect("attributes");
    assert_eq!(attributes, (false, false, false, false));
    for ddl in [
        "DROP TABLE outbox",
        "ALTER TABLE events ADD COLUMN x int",
        "SELECT railhook_ensure_partitions(current_date + 30, current_date + 31)",
    ] {
        let err = sqlx::raw_sql(ddl)
            .execute(&app)
            .await
            .expect_err(ddl)
            .to_string();
        assert!(
            err.contains("must be owner") || err.contains("permission denied"),
            "{ddl}: {err}"
        );
    }
    app.close().await;
    // The role goes with the test.
    sqlx::raw_sql(&format!("DROP OWNED BY {role}; "))
        .execute(&owner)
        .await
        .expect("drop owned");
    owner.close().await;
}
