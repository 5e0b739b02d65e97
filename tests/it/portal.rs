//! The customer portal (issue #38, docs/PORTAL.md): one-time links, sessions scoped to one
//! application (every route walked with another application's ids), read-only sessions,
//! CSRF, the framing policy, and — in a real headless Chromium, the portal framed by a page
//! of another origin — what a customer does in it (tests/browser/portal.mjs).

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::receiver::{Behaviour, Receiver};
use crate::support::{TestApp, spawn_app};
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION};
use reqwest::{Method, StatusCode, redirect};
use serde_json::{Value, json};
use tokio::net::TcpListener;

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .expect("client")
}

pub(crate) async fn application(app: &TestApp, key: &str, name: &str) -> String {
    let r = app
        .call(
            Method::POST,
            "/v1/applications",
            Some(key),
            Some(json!({"name": name})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

/// An endpoint of `application` (or of the project), subscribed to everything.
async fn endpoint(app: &TestApp, key: &str, application: Option<&str>) -> String {
    let mut body = json!({"url": "http://127.0.0.1:9/hook"});
    if let Some(a) = application {
        body["application"] = json!(a);
    }
    let r = app
        .call(Method::POST, "/v1/endpoints", Some(key), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["id"].as_str().expect("id").to_owned();
    app.subscribe(key, &id, &["*"], false).await;
    id
}

async fn event_for(app: &TestApp, key: &str, application: &str) -> String {
    let r = app
        .call(
            Method::POST,
            "/v1/events",
            Some(key),
            Some(json!({"type": "order.paid", "payload": {"n": 1}, "application": application})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    r.body["id"].as_str().expect("id").to_owned()
}

/// A portal link for `application`: the path of its URL (the test serves plain HTTP on its
/// own address) and its token.
pub(crate) async fn link(
    app: &TestApp,
    key: &str,
    application: &str,
    body: Value,
) -> (String, String) {
    let r = app
        .call(
            Method::POST,
            &format!("/v1/applications/{application}/portal-access"),
            Some(key),
            Some(body),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let url = r.body["url"].as_str().expect("url");
    let token = r.body["token"].as_str().expect("token").to_owned();
    assert!(url.ends_with(&format!("/portal/access/{token}")), "{url}");
    let path = reqwest::Url::parse(url).expect("url").path().to_owned();
    (path, token)
}

/// Opens a link; returns the session's base path (`/portal/s/{token}`).
pub(crate) async fn open(app: &TestApp, path: &str) -> String {
    let r = no_redirects()
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("open");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let to = r.headers()[LOCATION].to_str().expect("location").to_owned();
    to.strip_suffix("/endpoints")
        .expect("to the endpoints")
        .to_owned()
}

pub(crate) async fn get(
    app: &TestApp,
    path: &str,
) -> (StatusCode, String, reqwest::header::HeaderMap) {
    let r = no_redirects()
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("get");
    let (status, headers) = (r.status(), r.headers().clone());
    (status, r.text().await.expect("body"), headers)
}

pub(crate) async fn post(app: &TestApp, path: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
    let r = no_redirects()
        .post(format!("{}{path}", app.base))
        .form(form)
        .send()
        .await
        .expect("post");
    let status = r.status();
    let to = r
        .headers()
        .get(LOCATION)
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = r.text().await.expect("body");
    (status, if to.is_empty() { body } else { to })
}

pub(crate) fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("csrf field") + 19;
    html[at..].split('"').next().expect("value").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_opens_one_session_once_and_sessions_end_when_told() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;

    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (status, body, _) = get(&app, &format!("{base}/endpoints")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("Acme"), "the page names the application");
    // The second opening is refused, and says why.
    let (status, body, _) = get(&app, &path).await;
    assert_eq!(status, StatusCode::GONE);
    assert!(body.contains("already used"), "{body}");
    // Unknown or malformed codes open nothing.
    for bad in ["/portal/access/rhpl_nope", "/portal/access/%27%3B--"] {
        assert_eq!(get(&app, bad).await.0, StatusCode::NOT_FOUND, "{bad}");
    }

    // Two tabs racing on one link: one session.
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let url = format!("{}{path}", app.base);
    let client = no_redirects();
    let (x, y) = tokio::join!(client.get(&url).send(), client.get(&url).send());
    let mut codes = [x.expect("x").status(), y.expect("y").status()];
    codes.sort();
    assert_eq!(codes, [StatusCode::SEE_OTHER, StatusCode::GONE]);

    // A link past its ten minutes opens nothing.
    let (path, token) = link(&app, &key, &a, json!({})).await;
    sqlx::query("UPDATE portal_links SET expires_at = now() - interval '1 second' WHERE code_hash = sha256($1::text::bytea)")
        .bind(&token)
        .execute(&app.pool)
        .await
        .expect("age the link");
    assert_eq!(get(&app, &path).await.0, StatusCode::NOT_FOUND);

    // Bad bodies are named.
    for (body, field) in [
        (json!({"expiry": 10}), "expiry"),
        (json!({"expiry": 8 * 24 * 3600}), "expiry"),
        (json!({"read_only": "yes"}), "body"),
    ] {
        let r = app
            .call(
                Method::POST,
                &format!("/v1/applications/{a}/portal-access"),
                Some(&key),
                Some(body),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
        assert_eq!(r.body["field"], json!(field));
    }
    let r = app
        .call(
            Method::POST,
            "/v1/applications/app_01jnothere0000000000000000/portal-access",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // A session ends at its expiry…
    let (path, _) = link(&app, &key, &a, json!({"expiry": 60})).await;
    let short = open(&app, &path).await;
    sqlx::query("UPDATE portal_sessions SET expires_at = now() WHERE expires_at < now() + interval '2 minutes'")
        .execute(&app.pool)
        .await
        .expect("expire");
    let (status, body, headers) = get(&app, &format!("{short}/endpoints")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("ended"), "{body}");
    assert!(
        headers[CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("csp")
            .contains("frame-ancestors")
    );
    // …when its customer signs out (with the form's token)…
    let (_, page, _) = get(&app, &format!("{base}/endpoints")).await;
    let (status, _) = post(&app, &format!("{base}/logout"), &[("csrf", "wrong")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(
        &app,
        &format!("{base}/logout"),
        &[("csrf", &csrf_of(&page))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        get(&app, &format!("{base}/endpoints")).await.0,
        StatusCode::UNAUTHORIZED
    );
    // …when the team expires them all (unused links die with them)…
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let live = open(&app, &path).await;
    let (unused, _) = link(&app, &key, &a, json!({})).await;
    let r = app
        .call(
            Method::POST,
            &format!("/v1/applications/{a}/portal-sessions/expire"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    // The one above and the racing tabs' one; ended and expired ones are not counted.
    assert_eq!(r.body["sessions_ended"], json!(2));
    assert_eq!(
        get(&app, &format!("{live}/endpoints")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(get(&app, &unused).await.0, StatusCode::NOT_FOUND);
    // …through the Svix-compatible routes too: app-portal-access, logout with its token.
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/auth/app-portal-access/{a}"),
            Some(&key),
            Some(json!({"expiry": 600, "featureFlags": []})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let svix_url = r.body["url"].as_str().expect("url");
    let svix_token = r.body["token"].as_str().expect("token").to_owned();
    let svix_base = open(&app, reqwest::Url::parse(svix_url).expect("url").path()).await;
    let r = app
        .call(Method::POST, "/api/v1/auth/logout", Some(&key), None)
        .await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "an API key is not a portal token"
    );
    let r = app
        .call(Method::POST, "/api/v1/auth/logout", Some(&svix_token), None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        get(&app, &format!("{svix_base}/endpoints")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/auth/app/{a}/expire-all"),
            Some(&key),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    // Another project's key cannot issue links for this application.
    let (_, other) = app.project().await;
    let r = app
        .call(
            Method::POST,
            &format!("/v1/applications/{a}/portal-access"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

/// Every portal route, walked with a session of application A and the ids of application B
/// (and of the project's own endpoint): each answers 404, and nothing of B changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reaches_nothing_outside_its_application() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let b = application(&app, &key, "Globex").await;
    let ep_a = endpoint(&app, &key, Some(&a)).await;
    let ep_b = endpoint(&app, &key, Some(&b)).await;
    let ep_project = endpoint(&app, &key, None).await;
    let msg_a = event_for(&app, &key, &a).await;
    let msg_b = event_for(&app, &key, &b).await;
    let before: (String, bool, String) =
        sqlx::query_as("SELECT url, enabled, secret FROM endpoints WHERE id = $1")
            .bind(&ep_b)
            .fetch_one(&app.pool)
            .await
            .expect("B's endpoint");

    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (_, list, _) = get(&app, &format!("{base}/endpoints")).await;
    assert!(list.contains(&ep_a) && !list.contains(&ep_b) && !list.contains(&ep_project));
    let (_, messages, _) = get(&app, &format!("{base}/messages")).await;
    assert!(
        messages.contains(&msg_a) && !messages.contains(&msg_b),
        "{messages}"
    );
    let csrf = csrf_of(&list);

    for foreign in [&ep_b, &ep_project] {
        for path in [
            format!("{base}/endpoints/{foreign}"),
            format!("{base}/endpoints/{foreign}?reveal=1"),
        ] {
            let (status, body, _) = get(&app, &path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "GET {path}");
            assert!(!body.contains("whsec_"), "{path}");
        }
        let update = [("csrf", csrf.as_str()), ("url", "http://127.0.0.1:9/taken")];
        assert_eq!(
            post(&app, &format!("{base}/endpoints/{foreign}"), &update)
                .await
                .0,
            StatusCode::NOT_FOUND
        );
        for action in [
            "enable",
            "disable",
            "delete",
            "rotate",
            "send-example",
            "recover",
        ] {
            let form = [
                ("csrf", csrf.as_str()),
                ("event_type", "order.paid"),
                ("since", "2026-01-01T00:00"),
            ];
            let (status, _) =
                post(&app, &format!("{base}/endpoints/{foreign}/{action}"), &form).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "POST {action} on {foreign}");
        }
    }
    assert_eq!(
        get(&app, &format!("{base}/messages/{msg_b}")).await.0,
        StatusCode::NOT_FOUND
    );
    for path in [
        format!("{base}/messages/{msg_b}/resend/{ep_b}"),
        format!("{base}/messages/{msg_a}/resend/{ep_b}"),
        format!("{base}/messages/{msg_b}/resend/{ep_a}"),
    ] {
        assert_eq!(
            post(&app, &path, &[("csrf", csrf.as_str())]).await.0,
            StatusCode::NOT_FOUND,
            "POST {path}"
        );
    }
    // A message filter cannot widen the scope either.
    let (_, filtered, _) = get(&app, &format!("{base}/messages?event_type=order.paid")).await;
    assert!(!filtered.contains(&msg_b));
    let after: (String, bool, String) = sqlx::query_as(
        "SELECT url, enabled, secret FROM endpoints WHERE id = $1 AND deleted_at IS NULL",
    )
    .bind(&ep_b)
    .fetch_one(&app.pool)
    .await
    .expect("B's endpoint is still there");
    assert_eq!(before, after, "nothing of B changed");
    let b_deliveries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1")
            .bind(&ep_b)
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(b_deliveries, 1, "no example or resend reached B");
    // A session of a deleted application ends with it.
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/applications/{a}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    assert_eq!(
        get(&app, &format!("{base}/endpoints")).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_sessions_and_forms_without_the_token_change_nothing() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let ep = endpoint(&app, &key, Some(&a)).await;

    let (path, _) = link(&app, &key, &a, json!({"read_only": true})).await;
    let ro = open(&app, &path).await;
    let (status, page, _) = get(&app, &format!("{ro}/endpoints/{ep}?reveal=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("read-only"), "the page says so");
    assert!(
        !page.contains("whsec_"),
        "a read-only session does not see the secret"
    );
    assert!(
        !page.contains("/disable") && !page.contains("/rotate"),
        "no action forms"
    );
    let csrf = csrf_of(&page);
    for (path, form) in [
        (
            format!("{ro}/endpoints"),
            vec![("csrf", csrf.as_str()), ("url", "http://127.0.0.1:9/x")],
        ),
        (
            format!("{ro}/endpoints/{ep}/disable"),
            vec![("csrf", csrf.as_str())],
        ),
        (
            format!("{ro}/endpoints/{ep}/rotate"),
            vec![("csrf", csrf.as_str())],
        ),
    ] {
        let (status, body) = post(&app, &path, &form).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert!(body.contains("read-only"), "{body}");
    }
    assert_eq!(
        get(&app, &format!("{ro}/endpoints/new")).await.0,
        StatusCode::FORBIDDEN
    );

    let (path, _) = link(&app, &key, &a, json!({})).await;
    let rw = open(&app, &path).await;
    let (status, _) = post(
        &app,
        &format!("{rw}/endpoints"),
        &[("url", "http://127.0.0.1:9/forged")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a form without the token");
    let (status, _) = post(
        &app,
        &format!("{rw}/endpoints/{ep}/disable"),
        &[("csrf", "x")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (enabled, endpoints): (bool, i64) = sqlx::query_as(
        "SELECT bool_and(enabled), count(*) FROM endpoints WHERE application_id = $1 AND deleted_at IS NULL",
    )
    .bind(&a)
    .fetch_one(&app.pool)
    .await
    .expect("endpoints");
    assert!(enabled);
    assert_eq!(endpoints, 1);

    // With the token: a bad form is a clear error that names what is wrong and stores nothing.
    let (_, page, _) = get(&app, &format!("{rw}/endpoints/new")).await;
    let csrf = csrf_of(&page);
    for (form, says) in [
        (
            vec![("csrf", csrf.as_str()), ("url", "ftp://x")],
            "url must use http or https",
        ),
        (
            vec![
                ("csrf", csrf.as_str()),
                ("url", "http://127.0.0.1:9/x"),
                ("headers", "no colon"),
            ],
            "Name: value",
        ),
        (
            vec![
                ("csrf", csrf.as_str()),
                ("url", "http://127.0.0.1:9/x"),
                ("event_types", "Bad Type!"),
            ],
            "event",
        ),
        (
            vec![
                ("csrf", csrf.as_str()),
                ("url", "http://127.0.0.1:9/x"),
                ("rate_limit", "-3"),
            ],
            "rate limit",
        ),
    ] {
        let (status, body) = post(&app, &format!("{rw}/endpoints"), &form).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{form:?}: {body}");
        assert!(body.contains(says), "{says} in {body}");
        assert!(
            body.contains("Back to your endpoints"),
            "shown inside the portal"
        );
    }
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM endpoints WHERE application_id = $1 AND deleted_at IS NULL",
    )
    .bind(&a)
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(count, 1, "no partial endpoint");
    // A good form makes the endpoint, in the application, with what was asked.
    let form = [
        ("csrf", csrf.as_str()),
        ("url", "http://127.0.0.1:9/new"),
        ("description", "orders"),
        ("channels", "eu, us"),
        ("headers", "X-Team: billing"),
        ("rate_limit", "5"),
    ];
    let (status, to) = post(&app, &format!("{rw}/endpoints"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    let (_, shown, _) = get(&app, &to).await;
    assert!(
        shown.contains("http://127.0.0.1:9/new") && shown.contains("eu, us"),
        "{shown}"
    );
    let row: (Option<String>, Option<i32>, Vec<String>) = sqlx::query_as(
        "SELECT application_id, rate_limit_per_second, channels FROM endpoints WHERE url = 'http://127.0.0.1:9/new'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("made");
    assert_eq!(
        row,
        (
            Some(a.clone()),
            Some(5),
            vec!["eu".to_owned(), "us".to_owned()]
        )
    );

    // An edit with a bad header changes nothing, not even its other fields.
    let (_, page, _) = get(&app, &format!("{rw}/endpoints/{ep}")).await;
    let (status, body) = post(
        &app,
        &format!("{rw}/endpoints/{ep}"),
        &[
            ("csrf", csrf_of(&page).as_str()),
            ("url", "http://127.0.0.1:9/moved"),
            ("headers", "webhook-id: forged"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let url: String = sqlx::query_scalar("SELECT url FROM endpoints WHERE id = $1")
        .bind(&ep)
        .fetch_one(&app.pool)
        .await
        .expect("url");
    assert_eq!(url, "http://127.0.0.1:9/hook", "no partial edit");

    // An example of a type the endpoint does not take is accepted but sent nowhere, and
    // the page says so rather than waiting for a delivery that will never exist.
    let narrow = endpoint(&app, &key, Some(&a)).await;
    sqlx::query(
        "UPDATE subscriptions SET event_types = ARRAY['user.created'] WHERE endpoint_id = $1",
    )
    .bind(&narrow)
    .execute(&app.pool)
    .await
    .expect("narrow the subscription");
    app.state.senders.invalidate();
    let (status, to) = post(
        &app,
        &format!("{rw}/endpoints/{narrow}/send-example"),
        &[("csrf", csrf.as_str()), ("event_type", "order.paid")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    let (status, shown, _) = get(&app, &to).await;
    assert_eq!(status, StatusCode::OK);
    assert!(shown.contains("does not take this event type"), "{shown}");
    assert!(
        !shown.contains("http-equiv=\"refresh\""),
        "no endless refresh"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_projects_origins_may_frame_the_portal() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (_, _, headers) = get(&app, &format!("{base}/endpoints")).await;
    let csp = headers[CONTENT_SECURITY_POLICY].to_str().expect("csp");
    assert!(
        csp.contains("frame-ancestors 'none'"),
        "no origins: no framing: {csp}"
    );
    assert!(!csp.contains("script-src"), "{csp}");
    assert_eq!(headers["referrer-policy"], "no-referrer");

    for (body, field) in [
        (
            json!({"allowed_origins": ["https://a.example/path"]}),
            "allowed_origins",
        ),
        (
            json!({"allowed_origins": ["https://*.example"]}),
            "allowed_origins",
        ),
        (
            json!({"allowed_origins": ["https://a.example; script-src *"]}),
            "allowed_origins",
        ),
        (
            json!({"theme": {"primary_color": "red;}"}}),
            "theme.primary_color",
        ),
        (
            json!({"theme": {"color_scheme": "blue"}}),
            "theme.color_scheme",
        ),
        (
            json!({"theme": {"logo_url": "javascript:x"}}),
            "theme.logo_url",
        ),
    ] {
        let r = app
            .call(Method::PUT, "/v1/portal/settings", Some(&key), Some(body))
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
        assert_eq!(r.body["field"], json!(field));
    }
    let r = app
        .call(
            Method::PUT,
            "/v1/portal/settings",
            Some(&key),
            Some(
                json!({"allowed_origins": ["https://App.Example.com", "http://127.0.0.1:8080"],
                        "theme": {"display_name": "Acme Hooks", "primary_color": "#AA3300",
                                  "logo_url": "https://cdn.example.com/logo.svg",
                                  "color_scheme": "dark"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        r.body["allowed_origins"],
        json!(["http://127.0.0.1:8080", "https://app.example.com"])
    );
    let r = app
        .call(Method::GET, "/v1/portal/settings", Some(&key), None)
        .await;
    assert_eq!(r.body["theme"]["primary_color"], json!("#aa3300"));
    let (_, page, headers) = get(&app, &format!("{base}/endpoints")).await;
    let csp = headers[CONTENT_SECURITY_POLICY].to_str().expect("csp");
    assert!(
        csp.contains("frame-ancestors http://127.0.0.1:8080 https://app.example.com;"),
        "{csp}"
    );
    assert!(
        csp.contains("img-src 'self' https://cdn.example.com;"),
        "{csp}"
    );
    assert!(page.contains("Acme Hooks"));
    let (_, css, _) = get(&app, &format!("{base}/theme.css")).await;
    assert!(
        css.contains("--accent: #aa3300") && css.contains("color-scheme: dark"),
        "{css}"
    );
    // Errors inside a session are framed by the same policy, so they show in the frame.
    let (status, _, headers) = get(&app, &format!("{base}/endpoints/ep_nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        headers[CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("csp")
            .contains("https://app.example.com")
    );
    // Another project's settings are its own.
    let (_, other) = app.project().await;
    let r = app
        .call(Method::GET, "/v1/portal/settings", Some(&other), None)
        .await;
    assert_eq!(r.body["allowed_origins"], json!([]));
}

/// Serves `page` at `/` on its own loopback address: the team's site that embeds the portal.
async fn site(page: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    origin
}

fn embedding(src: &str) -> String {
    format!(
        "<!doctype html><html><head><title>Acme settings</title></head><body>\
         <h1>Your webhooks</h1>\
         <iframe id=\"portal\" src=\"{src}\" style=\"width:100%;height:1400px;border:0\"></iframe>\
         </body></html>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_uses_the_portal_framed_by_another_origin_in_chromium() {
    let p = Pipeline::start(|_| {}).await;
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    // The catalogue, with a schema and its example.
    let r = p
        .app
        .call(
            Method::POST,
            "/v1/event-types",
            Some(&p.key),
            Some(
                json!({"name": "invoice.paid", "description": "An invoice was paid in full.",
                        "schema": {"type": "object", "required": ["invoice"],
                                   "properties": {"invoice": {"type": "string"}},
                                   "examples": [{"invoice": "inv_1001", "amount_cents": 4200}]}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let a = application(&p.app, &p.key, "Acme").await;
    // The portal on `localhost`, the team's site on `127.0.0.1`: different sites to the
    // browser, so the portal is a cross-site frame.
    let mut state = p.app.state.clone();
    state.dashboard.cookie_secure = false;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(railhook_ingest::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let portal = format!("http://localhost:{port}");
    let new_link = || async {
        let r = no_redirects()
            .post(format!("{portal}/v1/applications/{a}/portal-access"))
            .bearer_auth(&p.key)
            .json(&json!({}))
            .send()
            .await
            .expect("link");
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.expect("json");
        body["url"].as_str().expect("url").to_owned()
    };
    let allowed_link = new_link().await;
    assert!(allowed_link.starts_with(&portal), "{allowed_link}");
    let allowed = site(embedding(&allowed_link)).await;
    let refused = site(embedding(&new_link().await)).await;
    let r = p
        .app
        .call(
            Method::PUT,
            "/v1/portal/settings",
            Some(&p.key),
            Some(
                json!({"allowed_origins": [allowed], "theme": {"display_name": "Acme Hooks",
                        "primary_color": "#0b6e4f"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

    let shots = std::env::var("PORTAL_SCREENSHOTS").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/portal-screenshots").to_owned()
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/portal.mjs");
    let out = tokio::process::Command::new("node")
        .arg(script)
        .env("ALLOWED", &allowed)
        .env("REFUSED", &refused)
        .env("LINK", &allowed_link)
        .env("RECEIVER", &receiver.url)
        .env("SCREENSHOTS", &shots)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), out)
        .await
        .expect("the browser test finishes")
        .expect("node (deploy/local/test.sh installs it, with Chromium and playwright-core)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "browser test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("portal ok"), "{stdout}");

    // What the browser saw is what happened: the example reached the receiver signed with
    // the secret the customer revealed, and was sent again.
    let secret = stdout
        .lines()
        .find_map(|l| l.strip_prefix("secret-before "))
        .expect("the revealed secret")
        .trim()
        .to_owned();
    let rotated = stdout
        .lines()
        .find_map(|l| l.strip_prefix("secret-after "))
        .expect("the rotated secret")
        .trim()
        .to_owned();
    assert_ne!(secret, rotated, "rotation made a new secret");
    let requests = receiver.requests();
    assert!(requests.len() >= 2, "the example and its re-send arrived");
    let key = railhook_common::signing::SigningKey::parse(&secret).expect("secret");
    for got in &requests[..2] {
        let id = &got.headers["webhook-id"];
        let ts: i64 = got.headers["webhook-timestamp"].parse().expect("ts");
        let expected = key.sign(id, ts, got.body.as_bytes());
        assert!(
            got.headers["webhook-signature"]
                .split(' ')
                .any(|s| s == expected),
            "verified with the revealed secret"
        );
        assert!(
            got.body.contains("inv_1001"),
            "the type's example: {}",
            got.body
        );
    }
    // A delivered message sent again is a new Delivery of the same Event (a Replay).
    assert_ne!(
        requests[0].headers["webhook-id"],
        requests[1].headers["webhook-id"]
    );
    p.stop().await;
}

/// The add form offers the broker kinds the project chose (docs/DESTINATIONS.md), and only
/// those: a kind it does not offer is refused even from a forged form, and a broker
/// endpoint's credentials never show on a page or in the API afterwards.
#[tokio::test]
async fn the_portal_adds_the_broker_kinds_its_project_offers() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    assert!(
        !page.contains("name=\"type\""),
        "nothing offered by default"
    );
    let csrf = csrf_of(&page);
    let sqs = |csrf: &str| {
        vec![
            ("csrf", csrf.to_owned()),
            ("type", "sqs".to_owned()),
            (
                "sqs.queue_url",
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders".to_owned(),
            ),
            ("sqs.region", "eu-west-1".to_owned()),
            ("sqs.access_key_id", "AKIAEXAMPLE".to_owned()),
            ("sqs.secret_access_key", "hunter2".to_owned()),
            ("description", "orders queue".to_owned()),
        ]
    };
    let form = sqs(&csrf);
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, _) = post(&app, &format!("{base}/endpoints"), &form).await;
    assert!(status.is_client_error(), "{status}");
    assert!(
        listed(&app, &key, &a).await.is_empty(),
        "a kind not offered made nothing"
    );

    let r = app
        .call(
            Method::PUT,
            "/v1/portal/settings",
            Some(&key),
            Some(json!({"endpoint_types": ["sqs", "http", "sqs"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["endpoint_types"], json!(["sqs"]));
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    assert!(page.contains("value=\"sqs\""), "{page}");
    assert!(page.contains("name=\"sqs.secret_access_key\""));
    assert!(!page.contains("value=\"kafka\""));
    let form = sqs(&csrf_of(&page));
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, to) = post(&app, &format!("{base}/endpoints"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    assert!(to.ends_with("?notice=created"), "{to}");
    let endpoints = listed(&app, &key, &a).await;
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    let e = &endpoints[0];
    assert_eq!(e["type"], "sqs");
    assert_eq!(e["sqs"]["region"], "eu-west-1");
    assert_eq!(e["description"], "orders queue");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let (_, shown, _) = get(&app, to.split('?').next().expect("path")).await;
    assert!(shown.contains("sqs.eu-west-1.amazonaws.com"), "{shown}");
    assert!(!shown.contains("hunter2"));
    // A kind the project does not offer, from a forged form: refused, nothing made.
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    let csrf = csrf_of(&page);
    let kafka = [
        ("csrf", csrf.as_str()),
        ("type", "kafka"),
        ("kafka.brokers", "127.0.0.1:9092"),
        ("kafka.topic", "orders"),
    ];
    let (status, _) = post(&app, &format!("{base}/endpoints"), &kafka).await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!(listed(&app, &key, &a).await.len(), 1);
}

/// A poller offered by the project (docs/POLLING.md) is added from the portal's form like a
/// broker kind, with no settings; a listen session's kind cannot be offered at all.
#[tokio::test]
async fn the_portal_adds_a_poller_when_offered_and_never_offers_listen() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let r = app
        .call(
            Method::PUT,
            "/v1/portal/settings",
            Some(&key),
            Some(json!({"endpoint_types": ["listen"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "endpoint_types", "{:?}", r.body);
    let r = app
        .call(
            Method::PUT,
            "/v1/portal/settings",
            Some(&key),
            Some(json!({"endpoint_types": ["poller"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["endpoint_types"], json!(["poller"]));
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    assert!(page.contains("value=\"poller\""), "{page}");
    let csrf = csrf_of(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("type", "poller"),
        ("description", "nightly export"),
    ];
    let (status, to) = post(&app, &format!("{base}/endpoints"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    let endpoints = listed(&app, &key, &a).await;
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    assert_eq!(endpoints[0]["type"], "poller");
    assert_eq!(endpoints[0]["url"], "poller:");
    // Its page says where to poll and issues the customer's poll token, shown once.
    let id = endpoints[0]["id"].as_str().expect("id").to_owned();
    let (_, shown, _) = get(&app, to.split('?').next().expect("path")).await;
    assert!(
        shown.contains(&format!("/api/v1/app/{a}/poller/{id}")),
        "{shown}"
    );
    let csrf = csrf_of(&shown);
    let (status, issued) = post(
        &app,
        &format!("{base}/endpoints/{id}/poll-token"),
        &[("csrf", csrf.as_str())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{issued}");
    let token = issued
        .split("rhpoll_")
        .nth(1)
        .map(|rest| format!("rhpoll_{}", &rest[..32]))
        .expect("a token on the page");
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/app/{a}/poller/{id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["data"], json!([]));
    // A forged form for a listen endpoint: refused, nothing made.
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    let csrf = csrf_of(&page);
    let form = [("csrf", csrf.as_str()), ("type", "listen")];
    let (status, _) = post(&app, &format!("{base}/endpoints"), &form).await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!(listed(&app, &key, &a).await.len(), 1);
}

/// An application's endpoints, as the API lists them.
async fn listed(app: &TestApp, key: &str, application: &str) -> Vec<Value> {
    app.call(
        Method::GET,
        &format!("/v1/endpoints?application={application}"),
        Some(key),
        None,
    )
    .await
    .body["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The portal's endpoint page: a payload filter in the form, and the transformation card
/// (save, try on an example, the last result); a bad filter or program changes nothing.
#[tokio::test]
async fn the_portal_sets_filters_and_tries_transformations() {
    let app = spawn_app().await;
    let (_, key) = app.project().await;
    let a = application(&app, &key, "Acme").await;
    let (path, _) = link(&app, &key, &a, json!({})).await;
    let base = open(&app, &path).await;
    let (_, page, _) = get(&app, &format!("{base}/endpoints/new")).await;
    let csrf = csrf_of(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("url", "https://hooks.example.com/in"),
        ("filter", "$.amount_cents > 10000"),
    ];
    let (status, to) = post(&app, &format!("{base}/endpoints"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    let shown_path = to.split('?').next().expect("path").to_owned();
    let endpoint = listed(&app, &key, &a).await[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let (_, shown, _) = get(&app, &shown_path).await;
    let cell = shown
        .split("id=\"filter-shown\"")
        .nth(1)
        .and_then(|rest| rest.split("</td>").next())
        .expect("the filter's cell");
    assert!(
        cell.contains("amount_cents") && cell.contains("10000"),
        "{cell}"
    );
    assert!(shown.contains("id=\"transformation\""), "the card is there");
    assert!(shown.contains("not run yet"), "{shown}");

    // A filter that does not parse: refused, the stored one stays.
    let form = [
        ("csrf", csrf.as_str()),
        ("url", "https://hooks.example.com/in"),
        ("filter", "$.amount_cents >> 1"),
    ];
    let (status, body) = post(&app, &shown_path, &form).await;
    assert!(status.is_client_error(), "{status}");
    assert!(body.contains("character"), "{body}");
    let r = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{endpoint}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["filter"], json!(r#"($."amount_cents" > 10000)"#));

    // Try a program on an example: the page shows what would be sent; nothing is stored.
    let program = "function handler(w) { w.payload = {text: 'paid ' + w.payload.n}; return w; }";
    let form = [
        ("csrf", csrf.as_str()),
        ("code", program),
        ("enabled", "1"),
        ("event_type", "order.paid"),
        ("payload", r#"{"n": 7}"#),
    ];
    let (status, tried) = post(&app, &format!("{shown_path}/transformation-test"), &form).await;
    assert_eq!(status, StatusCode::OK, "{tried}");
    assert!(tried.contains("id=\"transformation-result\""), "{tried}");
    assert!(tried.contains("paid 7"), "{tried}");
    let r = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{endpoint}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(
        r.body["transformation"],
        Value::Null,
        "a try stores nothing"
    );
    let looping = [
        ("csrf", csrf.as_str()),
        ("code", "function handler(w) { for (;;) {} }"),
        ("event_type", "order.paid"),
        ("payload", "{}"),
    ];
    let (_, tried) = post(&app, &format!("{shown_path}/transformation-test"), &looping).await;
    assert!(tried.contains("time_limit"), "{tried}");

    // Save it; a program that does not compile is refused and the saved one stays.
    let (status, to) = post(&app, &format!("{shown_path}/transformation"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
    assert!(to.ends_with("?notice=transformation-saved"), "{to}");
    let bad = [
        ("csrf", csrf.as_str()),
        ("code", "function handler("),
        ("enabled", "1"),
    ];
    let (status, _) = post(&app, &format!("{shown_path}/transformation"), &bad).await;
    assert!(status.is_client_error(), "{status}");
    let r = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{endpoint}/transformation"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(r.body["code"], json!(program), "{:?}", r.body);
    assert_eq!(r.body["enabled"], json!(true));
    let (_, shown, _) = get(&app, &shown_path).await;
    assert!(shown.contains("id=\"transformation-state\">on"), "{shown}");
}

/// Issue #53 finding 16: without `RAILHOOK_PUBLIC_URL`, a link's scheme is how the request
/// arrived (`http`, or `https` when a proxy says `X-Forwarded-Proto: https`), not the
/// dashboard's cookie setting, which is secure by default and made a default install's link
/// point at an `https://` that nothing served.
#[tokio::test]
async fn a_link_without_a_public_url_uses_the_scheme_the_request_arrived_with() {
    let app = spawn_app().await;
    assert!(app.state.dashboard.cookie_secure, "the default setting");
    let (_, key) = app.project().await;
    let a = application(&app, &key, "scheme").await;
    let issue = |proto: Option<&'static str>| {
        let mut req = app
            .client
            .post(format!("{}/v1/applications/{a}/portal-access", app.base))
            .bearer_auth(&key)
            .json(&json!({}));
        if let Some(p) = proto {
            req = req.header("x-forwarded-proto", p);
        }
        async move { TestApp::reply(req.send().await.expect("request")).await }
    };
    let plain = issue(None).await;
    assert_eq!(plain.status, StatusCode::CREATED, "{:?}", plain.body);
    let url = plain.body["url"].as_str().expect("url");
    assert!(
        url.starts_with(&format!("{}/portal/access/", app.base)),
        "{url}"
    );
    let proxied = issue(Some("https")).await;
    let url = proxied.body["url"].as_str().expect("url");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
}
