//! Roles, scoped keys and the audit log (issue #57, docs/ACCESS.md), against the real API.
//!
//! The table test walks every operation of the served OpenAPI document that a project key
//! may call, with a key of each role, and compares what happened with the table in
//! docs/ACCESS.md (read from the page, not copied here): refused means 403 `forbidden`,
//! anything else means the role got past the gate. The same walk counts the audit rows each
//! call wrote: one for each successful change, none for a refusal or a failure. Then the
//! whole audit table is searched for every secret value the walk used.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::redirect;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestApp, eventually, spawn_app};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ROLES: [&str; 4] = ["sender", "viewer", "operator", "admin"];
/// Secret values the walk hands the API; none may reach an audit row.
const ENDPOINT_SECRET: &str = "whsec_QWNjZXNzVGVzdFNlY3JldDAxMjM0NTY3ODlhYmNk";
const HEADER_VALUE: &str = "header-value-7c1f0e";
const SOURCE_SECRET: &str = "source-secret-4b9d2a";

/// The table of docs/ACCESS.md: (method, route template) → what it needs.
fn documented() -> BTreeMap<(String, String), String> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/ACCESS.md")).expect("docs/ACCESS.md");
    let mut table = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 {
            continue;
        }
        let (method, route, need) = (cells[1], cells[2].trim_matches('`'), cells[3]);
        if ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method)
            && ["send", "read", "operate", "admin"].contains(&need)
        {
            table.insert((method.to_owned(), route.to_owned()), need.to_owned());
        }
    }
    table
}

fn allows(role: &str, need: &str) -> bool {
    match role {
        "admin" => true,
        "operator" => need == "read" || need == "operate",
        "viewer" => need == "read",
        "sender" => need == "send",
        _ => false,
    }
}

/// Non-GET routes whose success is not a change (docs/ACCESS.md, "What is recorded").
fn records_nothing(method: &str, route: &str) -> bool {
    let sends = [
        "/v1/events",
        "/v1/events/batch",
        "/api/v1/app/{app_id}/msg",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/send-example",
        "/v1/endpoints/{id}/transformation/test",
        "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}/seek",
    ];
    method == "GET" || (method == "POST" && sends.contains(&route))
}

/// Routes whose path names an application: all an application-scoped key may call.
fn names_the_application(route: &str) -> bool {
    [
        "/api/v1/app/{app_id}",
        "/v1/applications/{id}",
        "/api/v1/auth/app-portal-access/{app_id}",
        "/api/v1/auth/app/{app_id}",
    ]
    .iter()
    .any(|p| route.starts_with(p))
}

/// GETs that are recorded: a secret shown is a reveal.
fn reveals(method: &str, route: &str) -> bool {
    method == "GET" && route.ends_with("/secret")
}

async fn key(app: &TestApp, project: &str, spec: Value) -> (String, String) {
    let r = app
        .admin(&format!("/v1/projects/{project}/api-keys"), spec)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    (
        r.body["api_key"].as_str().expect("key").to_owned(),
        r.body["id"].as_str().expect("id").to_owned(),
    )
}

async fn audit_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(&app.pool)
        .await
        .expect("count")
}

struct Fixture {
    params: BTreeMap<&'static str, String>,
}

/// Real objects for the walk's paths: an application, its HTTP endpoint (with a chosen
/// secret and a header), a project endpoint with a subscription, an event type, a source,
/// an operational endpoint, an Event and its Delivery, a Replay.
async fn fixture(app: &TestApp, key: &str) -> Fixture {
    let call = |m: Method, path: &str, body: Value| {
        let path = path.to_owned();
        async move {
            let r = app.call(m, &path, Some(key), Some(body)).await;
            assert!(r.status.is_success(), "{path}: {:?}", r.body);
            r.body
        }
    };
    let application = call(
        Method::POST,
        "/v1/applications",
        json!({"name": "Acme", "uid": "acme"}),
    )
    .await;
    let svix_ep = call(
        Method::POST,
        "/api/v1/app/acme/endpoint",
        json!({"url": "http://127.0.0.1:9/a", "secret": ENDPOINT_SECRET,
               "headers": {"X-Custom": HEADER_VALUE}}),
    )
    .await;
    let endpoint = call(
        Method::POST,
        "/v1/endpoints",
        json!({"url": "http://127.0.0.1:9/b"}),
    )
    .await;
    let endpoint_id = endpoint["id"].as_str().expect("id").to_owned();
    let sub = call(
        Method::POST,
        "/v1/subscriptions",
        json!({"endpoint_id": endpoint_id, "event_types": ["order.*"]}),
    )
    .await;
    call(
        Method::POST,
        "/v1/event-types",
        json!({"name": "order.paid", "description": "paid"}),
    )
    .await;
    let source = call(
        Method::POST,
        "/v1/sources",
        json!({"provider": "github", "secret": SOURCE_SECRET, "name": "gh"}),
    )
    .await;
    let ops = call(
        Method::POST,
        "/v1/operational-endpoints",
        json!({"url": "http://127.0.0.1:9/ops"}),
    )
    .await;
    let event = call(
        Method::POST,
        "/v1/events",
        json!({"type": "order.paid", "payload": {"n": 1}}),
    )
    .await;
    let replay = call(
        Method::POST,
        "/v1/replays",
        json!({"event_ids": [event["id"]]}),
    )
    .await;
    let s = |v: &Value| v.as_str().expect("id").to_owned();
    let mut params = BTreeMap::new();
    params.insert("app_id", "acme".to_owned());
    params.insert("application", s(&application["id"]));
    params.insert("endpoint_id", s(&svix_ep["id"]));
    params.insert("ops_endpoint", s(&ops["id"]));
    params.insert("endpoint", endpoint_id);
    params.insert("subscription", s(&sub["id"]));
    params.insert("source", s(&source["id"]));
    params.insert("event", s(&event["id"]));
    params.insert("delivery", s(&event["deliveries"][0]["id"]));
    params.insert("replay", s(&replay["id"]));
    Fixture { params }
}

impl Fixture {
    /// `route` with its parameters filled from the fixture (by the resource the route is
    /// under, for the plain `{id}`).
    fn path(&self, route: &str, throwaway_key: &str) -> String {
        let p = |k: &str| self.params[k].clone();
        let id = if route.starts_with("/v1/endpoints/") {
            p("endpoint")
        } else if route.starts_with("/v1/applications/") {
            p("application")
        } else if route.starts_with("/v1/subscriptions/") {
            p("subscription")
        } else if route.starts_with("/v1/sources/") {
            p("source")
        } else if route.starts_with("/v1/operational-endpoints/") {
            p("ops_endpoint")
        } else if route.starts_with("/v1/deliveries/") {
            p("delivery")
        } else if route.starts_with("/v1/events/") {
            p("event")
        } else if route.starts_with("/v1/replays/") {
            p("replay")
        } else if route.starts_with("/v1/api-keys/") {
            throwaway_key.to_owned()
        } else {
            "none".to_owned()
        };
        let endpoint_id = if route.starts_with("/api/v1/operational-webhook/") {
            p("ops_endpoint")
        } else {
            p("endpoint_id")
        };
        route
            .replace("{id}", &id)
            .replace("{source_id}", &p("source"))
            .replace("{name}", "order.paid")
            .replace("{event_type_name}", "order.paid")
            .replace("{app_id}", &p("app_id"))
            .replace("{endpoint_id}", &endpoint_id)
            .replace("{msg_id}", &p("event"))
            .replace("{sink_id}", &endpoint_id)
            .replace("{consumer_id}", "walker")
            .replace("{attempt_id}", "atmpt_none")
    }
}

/// The body each route is walked with: `{}`, except where `{}` would ask for more than an
/// operator's read-only portal.
fn body_for(route: &str) -> Value {
    if route.ends_with("/portal-access") {
        json!({"read_only": true})
    } else if route.starts_with("/api/v1/auth/app-portal-access/") {
        json!({"readOnly": true})
    } else {
        json!({})
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_allows_exactly_the_roles_the_table_names_and_records_each_change_once() {
    let app = spawn_app().await;
    let (project, owner) = app.project().await;
    let fixture = fixture(&app, &owner).await;
    let doc = app
        .call(Method::GET, "/openapi.json", None, None)
        .await
        .body;
    let table = documented();

    // Every project route of the document is in the table, and nothing else is.
    let mut routes: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (verb, op) in ops.as_object().expect("ops") {
            let by_key = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("api_key").is_some()));
            if by_key && path != "/v1/listen" {
                routes.push((verb.to_uppercase(), path.clone()));
            }
        }
    }
    let missing: Vec<String> = routes
        .iter()
        .filter(|r| !table.contains_key(*r))
        .map(|(m, p)| {
            let need = match railhook_ingest::access::need(
                &Method::from_bytes(m.as_bytes()).expect("method"),
                p,
            ) {
                railhook_ingest::access::Need::Send => "send",
                railhook_ingest::access::Need::Read => "read",
                railhook_ingest::access::Need::Operate => "operate",
                railhook_ingest::access::Need::Admin => "admin",
            };
            format!("| {m} | `{p}` | {need} |")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/ACCESS.md:\n{}",
        missing.join("\n")
    );

    // Deletes last, so the objects stay for the other calls; the admin last of all.
    // Deleting an application itself comes last of all: its endpoints and an
    // application-scoped key (refused everything once its application is gone) need it.
    routes.sort_by_key(|(m, p)| {
        let whole_application = p == "/api/v1/app/{app_id}" || p == "/v1/applications/{id}";
        (m == "DELETE", whole_application, p.clone())
    });
    let (mut walked, mut refusals, mut changes) = (0, 0, 0);
    // Each role, then an admin key confined to the fixture's application: it may call only
    // the routes whose path names that application (by uid or id).
    let callers: Vec<(&str, Option<&str>)> = ROLES
        .iter()
        .map(|r| (*r, None))
        .chain([("admin", Some("acme"))])
        .collect();
    // Every key made first: the admin's walk deletes the application.
    let mut keys = Vec::new();
    for (role, scope) in &callers {
        let spec = json!({"role": role, "name": role, "application_id": scope});
        let (role_key, _) = key(&app, &project, spec).await;
        let (_, throwaway) = key(&app, &project, json!({"name": "to revoke"})).await;
        keys.push((role_key, throwaway));
    }
    // The scoped key walks before the unscoped admin, whose deletes would leave it nothing.
    let order = [0, 1, 2, 4, 3];
    for i in order {
        let (role, scope) = callers[i];
        let (role_key, throwaway) = &keys[i];
        for (method, route) in &routes {
            let need = &table[&(method.clone(), route.clone())];
            let in_scope = scope.is_none() || names_the_application(route);
            let path = fixture.path(route, throwaway);
            let before = audit_rows(&app).await;
            let m = Method::from_bytes(method.as_bytes()).expect("method");
            let r = app
                .call(m, &path, Some(role_key), Some(body_for(route)))
                .await;
            let after = audit_rows(&app).await;
            let refused = r.status == StatusCode::FORBIDDEN && r.code() == "forbidden";
            assert_eq!(
                refused,
                !(allows(role, need) && in_scope),
                "{role} {scope:?} {method} {path} (needs {need}): {} {:?}",
                r.status,
                r.body
            );
            assert!(
                !r.status.is_server_error(),
                "{role} {method} {path}: {} {:?}",
                r.status,
                r.body
            );
            let recorded = r.status.is_success()
                && (!records_nothing(method, route) || reveals(method, route));
            assert_eq!(
                after - before,
                i64::from(recorded),
                "audit rows for {role} {method} {path}: {} {:?}",
                r.status,
                r.body
            );
            walked += 1;
            refusals += i32::from(refused);
            changes += i32::from(recorded);
        }
    }
    // The walk did something of each: calls, refusals and recorded changes.
    eprintln!("{walked} calls, {refusals} refused, {changes} changes recorded");
    assert!(
        walked > 500 && refusals > 200 && changes > 30,
        "{walked} calls, {refusals} refused, {changes} changes"
    );

    // No secret value the walk used is in any audit row, nor any key.
    let texts: Vec<String> = sqlx::query_scalar("SELECT a::text FROM audit_log a")
        .fetch_all(&app.pool)
        .await
        .expect("rows");
    let keys: Vec<String> = vec![owner.clone()];
    for secret in [ENDPOINT_SECRET, HEADER_VALUE, SOURCE_SECRET]
        .into_iter()
        .map(str::to_owned)
        .chain(keys)
    {
        assert!(
            texts.iter().all(|t| !t.contains(&secret)),
            "{secret} in the audit log"
        );
    }
    // What the walk recorded is readable by an admin, with the actor named.
    let log = app
        .call(Method::GET, "/v1/audit-log?limit=500", Some(&owner), None)
        .await;
    assert_eq!(log.status, StatusCode::OK, "{:?}", log.body);
    let entries = log.body["data"].as_array().expect("data");
    assert!(entries.iter().any(|e| e["action"] == "reveal_secret"));
    assert!(entries.iter().any(|e| e["object_kind"] == "endpoint"
        && e["action"] == "create"
        && e["actor_kind"] == "key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_only_key_posts_events_and_nothing_else_and_cannot_sign_in() {
    let app = spawn_app().await;
    let (project, owner) = app.project().await;
    app.endpoint(&owner).await;
    let (sender, _) = key(&app, &project, json!({"role": "sender"})).await;
    let sent = app
        .post_event(&sender, "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(sent.status, StatusCode::CREATED, "{:?}", sent.body);
    for (m, path) in [
        (Method::GET, "/v1/events"),
        (Method::GET, "/v1/endpoints"),
        (Method::POST, "/v1/endpoints"),
        (Method::POST, "/v1/api-keys"),
    ] {
        let r = app.call(m, path, Some(&sender), Some(json!({}))).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(r.code(), "forbidden");
        assert!(
            r.body["detail"]
                .as_str()
                .expect("detail")
                .contains("sender")
        );
    }
    // The dashboard refuses it with a page that says why, and records the refusal.
    let (status, page) = dashboard_session(&app, &sender)
        .await
        .expect_err("a sender key cannot sign in");
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("send-only key"), "{page}");
    let refused: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'sign_in_refused'")
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(refused, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_key_touches_only_its_application_and_an_expired_key_nothing() {
    let app = spawn_app().await;
    let (project, owner) = app.project().await;
    for uid in ["mine", "theirs"] {
        let r = app
            .call(
                Method::POST,
                "/api/v1/app",
                Some(&owner),
                Some(json!({"name": uid, "uid": uid})),
            )
            .await;
        assert!(r.status.is_success(), "{:?}", r.body);
    }
    let (scoped, _) = key(
        &app,
        &project,
        json!({"role": "admin", "application_id": "mine"}),
    )
    .await;
    let ok = app
        .call(
            Method::POST,
            "/api/v1/app/mine/endpoint",
            Some(&scoped),
            Some(json!({"url": "http://127.0.0.1:9/x"})),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{:?}", ok.body);
    let sent = app
        .call(
            Method::POST,
            "/api/v1/app/mine/msg",
            Some(&scoped),
            Some(json!({"eventType": "order.paid", "payload": {}})),
        )
        .await;
    assert!(sent.status.is_success(), "{:?}", sent.body);
    for (m, path) in [
        (Method::GET, "/api/v1/app/theirs/endpoint"),
        (Method::POST, "/api/v1/app/theirs/msg"),
        (Method::GET, "/v1/endpoints"),
        (Method::POST, "/v1/events"),
        (Method::GET, "/api/v1/app"),
    ] {
        let r = app.call(m, path, Some(&scoped), Some(json!({}))).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {:?}", r.body);
    }
    // A key for an application of another project, or one that does not exist, is refused.
    let (_, other_key) = app.project().await;
    let other_app = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(&other_key),
            Some(json!({"name": "x"})),
        )
        .await;
    let r = app
        .admin(
            &format!("/v1/projects/{project}/api-keys"),
            json!({"application_id": other_app.body["id"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "application_id");
    // Expiry: a past date is refused; a key stops at its date, for every route.
    let r = app
        .admin(
            &format!("/v1/projects/{project}/api-keys"),
            json!({"expires_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let soon = chrono::Utc::now() + chrono::Duration::seconds(2);
    let (brief, _) = key(&app, &project, json!({"expires_at": soon})).await;
    let r = app
        .call(Method::GET, "/v1/endpoints", Some(&brief), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    eventually("the key expires", Duration::from_secs(30), || async {
        let sent = app.post_event(&brief, "order.paid", json!({}), None).await;
        let read = app
            .call(Method::GET, "/v1/endpoints", Some(&brief), None)
            .await;
        (sent.status == StatusCode::UNAUTHORIZED && read.status == StatusCode::UNAUTHORIZED)
            .then_some(())
    })
    .await;
    // Keys are listed without the key itself; the admin token sees a project's revoke.
    let list = app
        .call(Method::GET, "/v1/api-keys", Some(&owner), None)
        .await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(!list.body.to_string().contains(&scoped));
    assert!(
        list.body["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|k| k["application_id"].is_string())
    );
}

/// A dashboard session of `key`: (cookie, CSRF token of its pages), or the sign-in's status
/// and page.
async fn dashboard_session(
    app: &TestApp,
    key: &str,
) -> Result<(String, String), (StatusCode, String)> {
    let client = reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("client");
    let form = client
        .get(format!("{}/dashboard/login", app.base))
        .send()
        .await
        .expect("form");
    let login_cookie = form.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let html = form.text().await.expect("html");
    let r = client
        .post(format!("{}/dashboard/login", app.base))
        .header("cookie", &login_cookie)
        .form(&[("api_key", key), ("csrf", csrf_in(&html).as_str())])
        .send()
        .await
        .expect("login");
    if r.status() != StatusCode::SEE_OTHER {
        return Err((r.status(), r.text().await.expect("page")));
    }
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let page = client
        .get(format!("{}/dashboard/deliveries", app.base))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    Ok((cookie, csrf_in(&page)))
}

fn csrf_in(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("csrf") + 19;
    html[at..].split('"').next().expect("value").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_form_and_page_allows_exactly_the_roles_the_table_names() {
    let app = spawn_app().await;
    let (project, owner) = app.project().await;
    let fixture = fixture(&app, &owner).await;
    let p = |k: &str| fixture.params[k].clone();
    let client = reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("client");
    // (method, path, form fields besides csrf, needs)
    type Action = (
        &'static str,
        String,
        Vec<(&'static str, String)>,
        &'static str,
    );
    let actions: Vec<Action> = vec![
        ("GET", "/dashboard/deliveries".into(), vec![], "read"),
        ("GET", "/dashboard/endpoints".into(), vec![], "read"),
        ("GET", "/dashboard/applications".into(), vec![], "read"),
        ("GET", "/dashboard/event-types".into(), vec![], "read"),
        ("GET", "/dashboard/replays".into(), vec![], "read"),
        ("GET", "/dashboard/audit-log".into(), vec![], "admin"),
        (
            "POST",
            format!("/dashboard/deliveries/{}/retry", p("delivery")),
            vec![],
            "operate",
        ),
        ("POST", "/dashboard/failed/retry".into(), vec![], "operate"),
        (
            "POST",
            format!("/dashboard/endpoints/{}/disable", p("endpoint")),
            vec![("reason", "walk".to_owned())],
            "operate",
        ),
        (
            "POST",
            format!("/dashboard/endpoints/{}/enable", p("endpoint")),
            vec![],
            "operate",
        ),
        (
            "POST",
            format!("/dashboard/applications/{}/portal", p("application")),
            vec![("read_only", "on".to_owned())],
            "operate",
        ),
    ];
    for role in ["viewer", "operator", "admin"] {
        let (role_key, _) = key(&app, &project, json!({"role": role})).await;
        let (cookie, csrf) = dashboard_session(&app, &role_key).await.expect("signed in");
        for (method, path, fields, need) in &actions {
            let url = format!("{}{path}", app.base);
            let before = audit_rows(&app).await;
            let r = if *method == "GET" {
                client.get(url).header("cookie", &cookie).send().await
            } else {
                let mut form: Vec<(&str, String)> = vec![("csrf", csrf.clone())];
                form.extend(fields.iter().cloned());
                client
                    .post(url)
                    .header("cookie", &cookie)
                    .form(&form)
                    .send()
                    .await
            }
            .expect("dashboard");
            let status = r.status();
            let refused = status == StatusCode::FORBIDDEN;
            assert_eq!(
                refused,
                !allows(role, need),
                "{role} {method} {path}: {status}"
            );
            assert!(
                !status.is_server_error(),
                "{role} {method} {path}: {status}"
            );
            if refused {
                let page = r.text().await.expect("page");
                assert!(page.contains(role), "the refusal names the role: {page}");
                assert_eq!(audit_rows(&app).await, before, "{role} {method} {path}");
            }
        }
        // A viewer's page shows no link to the audit log; an admin's does.
        let page = client
            .get(format!("{}/dashboard/deliveries", app.base))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("html");
        assert_eq!(
            page.contains("/dashboard/audit-log"),
            role == "admin",
            "{role}"
        );
    }
    // The admin's audit page lists what the operator did, by key.
    let (admin_key, _) = key(&app, &project, json!({})).await;
    let (cookie, _) = dashboard_session(&app, &admin_key)
        .await
        .expect("signed in");
    let page = client
        .get(format!("{}/dashboard/audit-log", app.base))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    for action in ["disable", "enable", "sign_in", "bulk_retry"] {
        assert!(page.contains(action), "{action} on the audit page");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_go_to_an_operational_endpoint_that_asks_for_them_and_to_no_other() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let mut ids = Vec::new();
    for types in [json!(["audit.entry"]), json!(["*"])] {
        let r = app
            .call(
                Method::POST,
                "/v1/operational-endpoints",
                Some(&key),
                Some(json!({"url": "http://127.0.0.1:9/ops", "event_types": types})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        ids.push(r.body["id"].as_str().expect("id").to_owned());
    }
    let r = app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&key),
            Some(json!({"name": "invoice.sent", "description": "sent"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    // The change's audit row went out as one operational Event, to the endpoint that named
    // `audit.entry` only (the `*` endpoint keeps what it had before this type existed).
    let sent: Vec<(String, Value)> = sqlx::query_as(
        "SELECT d.endpoint_id, e.payload FROM events e JOIN deliveries d ON d.event_id = e.id
         WHERE e.event_type = 'audit.entry' AND e.payload->'data'->>'object_id' = 'invoice.sent'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("events");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, ids[0]);
    let data = &sent[0].1["data"];
    assert_eq!(data["action"], "create");
    assert_eq!(data["object_kind"], "event_type");
    assert_eq!(data["actor_kind"], "key");
    assert!(!sent[0].1.to_string().contains(&key));
}
