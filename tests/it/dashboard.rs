//! The dashboard: over plain HTTP for its session and CSRF rules, and in a real headless
//! Chromium (tests/browser/dashboard.mjs) for the flows a person uses.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{TestApp, spawn_app};
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::{Method, StatusCode, redirect};
use serde_json::json;
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);

/// A second API server on the same database, for the browser: the Pipeline's Slot on the
/// relay page, and a session cookie without `Secure` (the test serves plain HTTP).
async fn dashboard_server(p: &Pipeline) -> String {
    let mut state = p.app.state.clone();
    state.slot = p.settings.slot.clone();
    state.dashboard.cookie_secure = false;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(railhook_ingest::serve(
        listener,
        state,
        std::future::pending(),
    ));
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_retries_a_failed_delivery_and_replays_in_chromium() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![Behaviour::Status(400)], Behaviour::Status(200)).await;
    p.endpoint(&receiver.url, 5_000).await;
    let from = chrono::Utc::now() - chrono::Duration::minutes(1);
    let (_, failed) = p.send(json!({"order": 1})).await;
    p.wait_status(&failed, "FAILED", WAIT).await;
    for n in 2..=3 {
        let (_, ok) = p.send(json!({"order": n})).await;
        p.wait_status(&ok, "SUCCEEDED", WAIT).await;
    }
    let to = chrono::Utc::now() + chrono::Duration::minutes(2);
    let base = dashboard_server(&p).await;
    // Whole minutes: Chromium rewrites a `datetime-local` value whose seconds are
    // zero to `HH:MM`, and Playwright's `fill` then fails with "Malformed value"
    // (a run in sixty flaked in CI). The window is widened so flooring loses nothing.
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M").to_string();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/dashboard.mjs");
    let out = tokio::process::Command::new("node")
        .arg(script)
        .env("BASE", &base)
        .env("API_KEY", &p.key)
        .env("FAILED_DELIVERY", &failed)
        .env("FROM", fmt(from))
        .env("TO", fmt(to))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .expect("the browser test finishes")
        .expect("node (deploy/local/test.sh installs it, with Chromium and playwright-core)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "browser test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("dashboard ok"), "{stdout}");
    // What the browser saw is what the database says.
    p.wait_status(&failed, "SUCCEEDED", WAIT).await;
    let replayed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE origin = 'replay'")
            .fetch_one(&p.app.pool)
            .await
            .expect("count");
    assert_eq!(replayed, 3);
    p.stop().await;
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("client")
}

/// The sign-in form as a browser gets it: the login cookie's `name=value` and the token in
/// the form.
async fn login_form(app: &TestApp) -> (String, String) {
    let r = no_redirects()
        .get(format!("{}/dashboard/login", app.base))
        .send()
        .await
        .expect("login form");
    assert_eq!(r.status(), StatusCode::OK);
    let set = r.headers()[SET_COOKIE].to_str().expect("cookie").to_owned();
    // Served as HTTPS (the default): `__Host-` names, which browsers keep only with
    // `Secure; Path=/` and no Domain (review #34 item 15).
    assert!(set.starts_with("__Host-railhook_login="), "{set}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/;", "Secure"] {
        assert!(set.contains(attr), "{attr} in {set}");
    }
    assert!(!set.contains("Domain"), "{set}");
    let pair = set.split(';').next().expect("pair").to_owned();
    (pair, csrf_of(&r.text().await.expect("form")))
}

/// Posts the sign-in form with `key`, the login cookie and the form's token.
async fn post_login(app: &TestApp, key: &str, cookie: &str, token: &str) -> reqwest::Response {
    no_redirects()
        .post(format!("{}/dashboard/login", app.base))
        .header("cookie", cookie)
        .form(&[("api_key", key), ("csrf", token)])
        .send()
        .await
        .expect("login")
}

/// Signs in and returns the `name=value` of the session cookie and the full Set-Cookie.
async fn sign_in(app: &TestApp, key: &str) -> (String, String) {
    let (cookie, token) = login_form(app).await;
    let r = post_login(app, key, &cookie, &token).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r.headers()[SET_COOKIE].to_str().expect("cookie").to_owned();
    (set.split(';').next().expect("pair").to_owned(), set)
}

async fn page(cookie: &str, url: String) -> (StatusCode, String, reqwest::header::HeaderMap) {
    let r = no_redirects()
        .get(url)
        .header("cookie", cookie)
        .send()
        .await
        .expect("page");
    let (status, headers) = (r.status(), r.headers().clone());
    (status, r.text().await.expect("body"), headers)
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("csrf field") + 19;
    html[at..].split('"').next().expect("value").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_scoped_to_one_project_and_actions_need_the_csrf_token() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let ep = app.endpoint(&key).await;
    app.subscribe(&key, &ep, &["*"], false).await;
    let created = app.post_event(&key, "order.paid", json!({}), None).await;
    let delivery = created.body["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    sqlx::query("UPDATE deliveries SET status = 'FAILED', failure_reason = 'test' WHERE id = $1")
        .bind(&delivery)
        .execute(&app.pool)
        .await
        .expect("fail it");

    // Signed out: a redirect to the sign-in page, never data.
    let (status, _, headers) = page("", format!("{}/dashboard/deliveries", app.base)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[LOCATION], "/dashboard/login");
    let (login_cookie, token) = login_form(&app).await;
    let r = post_login(&app, "rh_not_a_key", &login_cookie, &token).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let no_session = |r: &reqwest::Response| {
        r.headers().get_all(SET_COOKIE).iter().all(|c| {
            !c.to_str()
                .unwrap_or_default()
                .starts_with("__Host-railhook_session=")
        })
    };
    assert!(no_session(&r));
    // Login CSRF: a form posted from another site carries no login cookie (SameSite=Strict)
    // or a token of its own; either way no session is made, even with a valid key.
    for (cookie, form_token) in [
        ("", token.as_str()),
        (login_cookie.as_str(), ""),
        (login_cookie.as_str(), "attacker-token"),
    ] {
        let r = post_login(&app, &key, cookie, form_token).await;
        assert_eq!(
            r.status(),
            StatusCode::FORBIDDEN,
            "cookie {cookie:?} token {form_token:?}"
        );
        assert!(no_session(&r), "a forged sign-in made a session");
    }

    let (cookie, set_cookie) = sign_in(&app, &key).await;
    assert!(
        set_cookie.starts_with("__Host-railhook_session="),
        "{set_cookie}"
    );
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/;", "Secure"] {
        assert!(set_cookie.contains(attr), "{attr} in {set_cookie}");
    }
    assert!(
        !set_cookie.contains(&key),
        "the key itself is never the cookie"
    );
    let (status, html, headers) = page(&cookie, format!("{}/dashboard/deliveries", app.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains(&delivery));
    let csp = headers[CONTENT_SECURITY_POLICY].to_str().expect("csp");
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    let csrf = csrf_of(&html);

    // A form without the session's CSRF token changes nothing.
    let retry = format!("{}/dashboard/deliveries/{delivery}/retry", app.base);
    for token in ["", "forged"] {
        let r = no_redirects()
            .post(&retry)
            .header("cookie", &cookie)
            .form(&[("csrf", token)])
            .send()
            .await
            .expect("retry");
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    let status: String = sqlx::query_scalar("SELECT status FROM deliveries WHERE id = $1")
        .bind(&delivery)
        .fetch_one(&app.pool)
        .await
        .expect("status");
    assert_eq!(status, "FAILED");
    let r = no_redirects()
        .post(&retry)
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("retry");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let status: String = sqlx::query_scalar("SELECT status FROM deliveries WHERE id = $1")
        .bind(&delivery)
        .fetch_one(&app.pool)
        .await
        .expect("status");
    assert_eq!(status, "PENDING");

    // Another project's session sees none of it, on any page.
    let (other_id, other_key) = app.project().await;
    let (other_cookie, _) = sign_in(&app, &other_key).await;
    let (status, _, _) = page(
        &other_cookie,
        format!("{}/dashboard/deliveries/{delivery}", app.base),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in ["deliveries", "failed", "endpoints", "replays"] {
        let (status, html, _) = page(&other_cookie, format!("{}/dashboard/{path}", app.base)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            !html.contains(&delivery) && !html.contains(&ep),
            "{path} leaks"
        );
    }
    let other_csrf = csrf_of(
        &page(&other_cookie, format!("{}/dashboard/endpoints", app.base))
            .await
            .1,
    );
    let r = no_redirects()
        .post(format!("{}/dashboard/endpoints/{ep}/disable", app.base))
        .header("cookie", &other_cookie)
        .form(&[("csrf", other_csrf.as_str())])
        .send()
        .await
        .expect("disable");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Revoking the key ends the sessions opened with it.
    app.revoke_key_of(&other_id).await;
    let (status, _, _) = page(&other_cookie, format!("{}/dashboard/deliveries", app.base)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);

    // Signing out ends this one.
    let r = no_redirects()
        .post(format!("{}/dashboard/logout", app.base))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("logout");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let (status, _, _) = page(&cookie, format!("{}/dashboard/deliveries", app.base)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn the_event_type_catalogue_page_lists_only_the_projects_types() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (_, other_key) = app.project().await;
    for body in [
        json!({"name": "order.paid", "description": "Paid orders", "schema": {"type": "object"}}),
        json!({"name": "order.legacy", "description": "Old orders"}),
    ] {
        let r = app
            .call(Method::POST, "/v1/event-types", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    app.call(
        Method::POST,
        "/v1/event-types/order.legacy/deprecate",
        Some(&key),
        None,
    )
    .await;
    let (cookie, _) = sign_in(&app, &key).await;
    let (status, html, _) = page(&cookie, format!("{}/dashboard/event-types", app.base)).await;
    assert_eq!(status, StatusCode::OK);
    for text in [
        "order.paid",
        "Paid orders",
        "version 1",
        "order.legacy",
        "deprecated",
    ] {
        assert!(html.contains(text), "{text} missing");
    }
    let (other_cookie, _) = sign_in(&app, &other_key).await;
    let (_, html, _) = page(&other_cookie, format!("{}/dashboard/event-types", app.base)).await;
    assert!(
        !html.contains("order.paid"),
        "another project's catalogue leaks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_page_shows_the_headers_the_receiver_got() {
    // #22: the page's header list is laid out by the same code as the worker's requests
    // (common/src/headers.rs); it used to be written out by hand and had drifted.
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(204)).await;
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&p.key),
            Some(json!({"url": receiver.url, "headers": {"x-team": "billing"}})),
        )
        .await;
    let ep = r.body["id"].as_str().expect("id").to_owned();
    p.app.subscribe(&p.key, &ep, &["*"], false).await;
    let (_, delivery) = p.send(json!({"n": 1})).await;
    p.wait_status(&delivery, "SUCCEEDED", WAIT).await;
    let got = receiver.requests().pop().expect("a request");

    let (cookie, _) = sign_in(&p.app, &p.key).await;
    let (status, html, _) = page(
        &cookie,
        format!("{}/dashboard/deliveries/{delivery}", p.app.base),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let start = html
        .find("<pre id=\"request-headers\">")
        .expect("header list")
        + 26;
    let shown: Vec<(String, String)> = html
        [start..html[start..].find("</pre>").expect("end") + start]
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.replace("&lt;", "<").replace("&gt;", ">")))
        .collect();
    let transport = [
        "host",
        "content-length",
        "accept",
        "accept-encoding",
        "connection",
    ];
    let mut wire: Vec<&str> = got
        .headers
        .keys()
        .map(String::as_str)
        .filter(|k| !transport.contains(k))
        .collect();
    let mut names: Vec<&str> = shown.iter().map(|(k, _)| k.as_str()).collect();
    wire.sort_unstable();
    names.sort_unstable();
    assert_eq!(
        names, wire,
        "the page lists what was sent, no more and no less"
    );
    for (name, value) in &shown {
        if value.starts_with('<') || value.ends_with('>') || name == "webhook-signature" {
            continue; // per Attempt, or secret
        }
        assert_eq!(got.headers.get(name), Some(value), "{name}");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_page_names_each_endpoints_application_and_channels() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let r = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(&key),
            Some(json!({"name": "Globex", "uid": "globex"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let r = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(
                json!({"url": "https://globex.example/hooks", "application": "globex",
                        "channels": ["eu", "billing"]}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    // An endpoint with OAuth2 client credentials and a client certificate (issue #40).
    let tls = std::path::PathBuf::from(crate::support::local_setting("RAILHOOK_TLS_DIR"));
    let read = |name: &str| std::fs::read_to_string(tls.join(name)).expect("tls file");
    let secured = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": "https://secured.example/hooks",
                "authentication": {"type": "oauth2_client_credentials",
                    "token_url": "https://idp.example/token", "client_id": "railhook-dash",
                    "client_secret": "dash-s3cret"},
                "client_certificate": {"certificate_pem": read("client.pem"),
                    "private_key_pem": read("client.key")}})),
        )
        .await;
    assert_eq!(secured.status, StatusCode::CREATED, "{:?}", secured.body);
    // A payload filter and a transformation whose last result the worker wrote (issue #42).
    let shaped = app
        .call(
            Method::POST,
            "/v1/endpoints",
            Some(&key),
            Some(json!({"url": "https://shaped.example/hooks",
                "filter": "$.amount_cents > 10000",
                "transformation": {"code": "function handler(w) { return w; }"}})),
        )
        .await;
    assert_eq!(shaped.status, StatusCode::CREATED, "{:?}", shaped.body);
    sqlx::query(
        "UPDATE endpoints SET transformation_last = '{\"outcome\": \"failed\", \"at\": \"2026-12-06T10:00:00Z\", \"error\": \"the handler threw: boom (threw)\"}'
         WHERE id = $1",
    )
    .bind(shaped.body["id"].as_str().expect("id"))
    .execute(&app.pool)
    .await
    .expect("last result");
    let (cookie, _) = sign_in(&app, &key).await;
    let (status, html, _) = page(&cookie, format!("{}/dashboard/endpoints", app.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("application: Globex (globex)"), "{html}");
    assert!(html.contains("channels: eu, billing"), "{html}");
    assert!(
        html.contains("OAuth2 client railhook-dash at https://idp.example/token"),
        "{html}"
    );
    assert!(html.contains("mutual TLS: client certificate"), "{html}");
    assert!(!html.contains("dash-s3cret") && !html.contains("PRIVATE KEY"));
    assert!(
        html.contains("filter: <code>($.&quot;amount_cents&quot; &gt; 10000)</code>"),
        "{html}"
    );
    assert!(
        html.contains("transformation on · last result: failed since 2026-12-06T10:00:00Z: the handler threw: boom (threw)"),
        "{html}"
    );

    // Failed Messages filter by application: one failed message in each scope.
    let app_id =
        sqlx::query_scalar::<_, String>("SELECT id FROM applications WHERE uid = 'globex'")
            .fetch_one(&app.pool)
            .await
            .expect("application");
    let own = app.endpoint(&key).await;
    app.subscribe(&key, &own, &["*"], false).await;
    let globex_ep = r.body["id"].as_str().expect("id").to_owned();
    app.subscribe(&key, &globex_ep, &["*"], false).await;
    for body in [
        json!({"type": "order.paid", "payload": {}, "application": "globex", "channels": ["eu"]}),
        json!({"type": "order.paid", "payload": {}}),
    ] {
        let r = app
            .call(Method::POST, "/v1/events", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    sqlx::query("UPDATE deliveries SET status = 'FAILED', failure_reason = 'test'")
        .execute(&app.pool)
        .await
        .expect("fail them");
    let (_, all, _) = page(&cookie, format!("{}/dashboard/failed", app.base)).await;
    let table = &all[all.find("<table id=\"failed\">").expect("table")..];
    assert!(
        table.contains("globex.example") && table.contains("127.0.0.1:9/hook"),
        "{table}"
    );
    let (status, only, _) = page(
        &cookie,
        format!("{}/dashboard/failed?application={app_id}", app.base),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // The table, not the filter form (whose endpoint choices list every endpoint).
    let table = &only[only.find("<table id=\"failed\">").expect("table")..];
    assert!(table.contains("globex.example"), "{table}");
    assert!(!table.contains("127.0.0.1:9/hook"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_page_opens_a_customers_portal() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let r = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(&key),
            Some(json!({"name": "Initech", "uid": "initech"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    let (cookie, _) = sign_in(&app, &key).await;
    let (status, html, _) = page(&cookie, format!("{}/dashboard/applications", app.base)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Initech") && html.contains(&id), "{html}");
    let action = format!("{}/dashboard/applications/{id}/portal", app.base);
    // Without the session's CSRF token nothing is issued.
    let r = no_redirects()
        .post(&action)
        .header("cookie", &cookie)
        .form(&[("csrf", "forged"), ("read_only", "true")])
        .send()
        .await
        .expect("post");
    assert_ne!(r.status(), StatusCode::SEE_OTHER);
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM portal_links")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(links, 0);
    // With it: a one-time link, which opens a read-only session of that application.
    let r = no_redirects()
        .post(&action)
        .header("cookie", &cookie)
        .form(&[("csrf", csrf_of(&html).as_str()), ("read_only", "true")])
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let link = r.headers()[LOCATION].to_str().expect("location").to_owned();
    let path = reqwest::Url::parse(&link).expect("url").path().to_owned();
    assert!(path.starts_with("/portal/access/rhpl_"), "{link}");
    let r = no_redirects()
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("open");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let session = r.headers()[LOCATION].to_str().expect("location").to_owned();
    let r = no_redirects()
        .get(format!("{}{session}", app.base))
        .send()
        .await
        .expect("portal");
    assert_eq!(r.status(), StatusCode::OK);
    let portal = r.text().await.expect("body");
    assert!(
        portal.contains("Initech") && portal.contains("read-only"),
        "{portal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_page_query_is_refused_not_a_server_error() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let (cookie, _) = sign_in(&app, &key).await;
    // The audit page passed its object filter to Postgres, whose text refuses a NUL: 500.
    for path in [
        "/dashboard/audit-log?object_id=a%00",
        "/dashboard/deliveries?endpoint_id=a%00b",
        "/dashboard/failed?event_type=a%00",
    ] {
        let (status, html, _) = page(&cookie, format!("{}{path}", app.base)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {html}");
    }
    let (status, _, _) = page(&cookie, format!("{}/dashboard/audit-log", app.base)).await;
    assert_eq!(status, StatusCode::OK);
}
