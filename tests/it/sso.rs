//! Dashboard single sign-on against a real OpenID Connect provider (node-oidc-provider,
//! pinned in tests/sso/package.json) with Chromium driving the browser side
//! (tests/browser/sso.mjs): a mapped person signs in with the role their claims give; a
//! replayed callback is refused; a person no rule maps is refused; an ID token for another
//! audience, expired, for another nonce or tampered with (the provider made hostile on
//! purpose, tests/sso/provider.mjs) is refused; key sign-in is off. The same checks are also
//! unit tests in ingest/src/sso.rs.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

use crate::support::{TestApp, free_port, local_setting, spawn_app_at};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The provider, started for one test; killed when dropped.
async fn provider(port: u16, redirect: &str) -> tokio::process::Child {
    let mut child = tokio::process::Command::new("node")
        .arg(format!("{ROOT}/tests/sso/provider.mjs"))
        .env("PORT", port.to_string())
        .env("CLIENT_ID", "railhook-dashboard")
        .env("CLIENT_SECRET", "sso-test-client-secret")
        .env("REDIRECT_URI", redirect)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node (deploy/local/test.sh installs it and tests/sso's oidc-provider)");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("ready") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "the provider started");
    // Keep reading: a provider writing to a closed pipe would die of EPIPE mid-test.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

async fn browser(base: &str, account: &str, expect: &str, replay: bool) -> String {
    let out = tokio::process::Command::new("node")
        .arg(format!("{ROOT}/tests/browser/sso.mjs"))
        .env("BASE", base)
        .env("ACCOUNT", account)
        .env("EXPECT", expect)
        .env("REPLAY", if replay { "1" } else { "" })
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the browser finishes")
        .expect("node with playwright-core (tests/browser)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("sso ok"),
        "{account}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_in_through_a_real_provider_with_the_role_their_claims_give() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let redirect = format!("{base}/dashboard/sso/callback");
    let idp_port = free_port();
    let _idp = provider(idp_port, &redirect).await;
    // The rules name a project by id; its rows are written once the database exists.
    let project = railhook_common::ids::ProjectId::generate().into_string();
    let org = railhook_common::ids::OrganizationId::generate().into_string();
    let rules = json!([
        {"role": "admin", "project": project, "group": "platform"},
        {"role": "operator", "project": project, "email_domain": "example.com"},
    ])
    .to_string();
    let app: TestApp = spawn_app_at(listener, &local_setting("REDIS_URL"), |f| {
        f.merge(("dashboard_cookie_secure", false))
            .merge(("oidc_issuer_url", format!("http://127.0.0.1:{idp_port}")))
            .merge(("oidc_client_id", "railhook-dashboard"))
            .merge(("oidc_client_secret", "sso-test-client-secret"))
            .merge(("oidc_redirect_url", redirect.clone()))
            .merge(("oidc_roles", rules))
            .merge(("dashboard_key_sign_in", false))
    })
    .await;
    sqlx::query("INSERT INTO organizations (id, name, monthly_quota) VALUES ($1, 'Acme', 1000)")
        .bind(&org)
        .execute(&app.pool)
        .await
        .expect("organization");
    sqlx::query("INSERT INTO projects (id, organization_id, name) VALUES ($1, $2, 'Checkout')")
        .bind(&project)
        .bind(&org)
        .execute(&app.pool)
        .await
        .expect("project");

    // alice (group platform) is an admin; her callback, opened again, is refused.
    let seen = browser(&base, "alice", "signed-in", true).await;
    assert!(
        seen.contains("signed in: admin") && seen.contains("replay refused"),
        "{seen}"
    );
    // olga (example.com, not platform) is an operator.
    let seen = browser(&base, "olga", "signed-in", false).await;
    assert!(seen.contains("signed in: operator"), "{seen}");
    // bob matches no rule.
    browser(&base, "bob", "refused", false).await;
    // The provider turns hostile: an ID token for another audience, one already expired,
    // one for another sign-in's nonce (each signed with the provider's published key), and
    // one changed after signing are each refused with a page that says so.
    let http = reqwest::Client::new();
    for (mode, why) in [
        ("audience", "Invalid audiences"),
        ("expired", "ID token expired"),
        ("nonce", "nonce mismatch"),
        ("tampered", "Signature verification failed"),
    ] {
        let set = http
            .get(format!("http://127.0.0.1:{idp_port}/test-mode/{mode}"))
            .send()
            .await
            .expect("mode");
        assert!(set.status().is_success(), "{mode}");
        let seen = browser(&base, "alice", "unverified", false).await;
        assert!(
            seen.contains("could not be verified") && seen.contains(why),
            "{mode}: {seen}"
        );
    }
    let honest = http
        .get(format!("http://127.0.0.1:{idp_port}/test-mode/honest"))
        .send()
        .await
        .expect("mode");
    assert!(honest.status().is_success());

    // Each sign-in is one audit row naming the person; the refusals wrote nothing.
    let rows: Vec<(String, String, Option<String>, serde_json::Value)> = sqlx::query_as(
        "SELECT actor_kind, actor, actor_email, changes FROM audit_log
         WHERE action = 'sign_in' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, "person");
    assert_eq!(rows[0].1, "alice");
    assert_eq!(rows[0].2.as_deref(), Some("alice@example.com"));
    assert_eq!(rows[0].3["role"], "admin");
    assert_eq!(rows[1].3["role"], "operator");
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dashboard_sessions WHERE subject IS NOT NULL")
            .fetch_one(&app.pool)
            .await
            .expect("sessions");
    assert_eq!(sessions, 2);

    // Key sign-in is off: the form is gone and a posted key is refused.
    let (_, key) = app.project().await;
    let r = reqwest::Client::new()
        .post(format!("{base}/dashboard/login"))
        .form(&[("api_key", key.as_str()), ("csrf", "x")])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);
}
