//! Every project route with missing, invalid, revoked and foreign credentials.

use crate::support::{ADMIN_TOKEN, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn no_project_can_read_or_change_another_projects_rows() {
    let app = spawn_app().await;
    let (_, key_a) = app.project().await;
    let (_, key_b) = app.project().await;
    let ep = app.endpoint(&key_a).await;
    let sub = app.subscribe(&key_a, &ep, &["*"], false).await;
    let evt = app
        .post_event(&key_a, "order.paid", json!({"secret": "a"}), None)
        .await;
    let evt_id = evt.body["id"].as_str().expect("event").to_owned();
    let dlv = evt.body["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();

    let replay = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key_a),
            Some(json!({"event_ids": [evt_id]})),
        )
        .await
        .body["id"]
        .as_str()
        .expect("replay")
        .to_owned();
    // The ingest's replay runner adds a second Delivery for the Event; wait for it, so the
    // counts below do not depend on when the runner's batch lands.
    crate::support::eventually(
        "the replay completes",
        std::time::Duration::from_secs(30),
        || {
            let app = &app;
            let (key_a, replay) = (&key_a, &replay);
            async move {
                let r = app
                    .call(
                        Method::GET,
                        &format!("/v1/replays/{replay}"),
                        Some(key_a),
                        None,
                    )
                    .await;
                (r.body["status"] == json!("COMPLETED")).then_some(())
            }
        },
    )
    .await;
    let by_id: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/v1/endpoints/{ep}"), None),
        (
            Method::PATCH,
            format!("/v1/endpoints/{ep}"),
            Some(json!({"url": "http://evil.example/"})),
        ),
        (Method::GET, format!("/v1/endpoints/{ep}/secret"), None),
        (
            Method::POST,
            format!("/v1/endpoints/{ep}/secret/rotate"),
            None,
        ),
        (Method::GET, format!("/v1/endpoints/{ep}/health"), None),
        (Method::DELETE, format!("/v1/endpoints/{ep}"), None),
        (Method::GET, format!("/v1/subscriptions/{sub}"), None),
        (
            Method::PATCH,
            format!("/v1/subscriptions/{sub}"),
            Some(json!({"ordered": true})),
        ),
        (Method::DELETE, format!("/v1/subscriptions/{sub}"), None),
        (Method::GET, format!("/v1/events/{evt_id}"), None),
        (Method::GET, format!("/v1/deliveries/{dlv}"), None),
        (Method::GET, format!("/v1/deliveries/{dlv}/attempts"), None),
        (Method::POST, format!("/v1/deliveries/{dlv}/retry"), None),
        (Method::POST, format!("/v1/endpoints/{ep}/disable"), None),
        (Method::POST, format!("/v1/endpoints/{ep}/enable"), None),
        (Method::GET, format!("/v1/replays/{replay}"), None),
        (Method::POST, format!("/v1/replays/{replay}/cancel"), None),
    ];
    for (method, path, body) in &by_id {
        let r = app
            .call(method.clone(), path, Some(&key_b), body.clone())
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{method} {path} as B");
        assert_eq!(r.code(), "not_found");
        // The owner still sees it (so 404 above was isolation, not a broken route).
        if *method == Method::GET {
            let own = app.call(method.clone(), path, Some(&key_a), None).await;
            assert_eq!(own.status, StatusCode::OK, "{method} {path} as A");
        }
    }

    // Lists with B's key show none of A's rows, even when filtered by A's ids.
    for path in [
        "/v1/endpoints".to_owned(),
        "/v1/subscriptions".to_owned(),
        format!("/v1/subscriptions?endpoint_id={ep}"),
        "/v1/events".to_owned(),
        "/v1/deliveries".to_owned(),
        format!("/v1/deliveries?endpoint_id={ep}"),
        format!("/v1/deliveries?event_id={evt_id}"),
        "/v1/replays".to_owned(),
    ] {
        let r = app.call(Method::GET, &path, Some(&key_b), None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.body["data"], json!([]), "{path} leaked rows");
        let own = app.call(Method::GET, &path, Some(&key_a), None).await;
        // The Event has its first Delivery and the replayed one.
        let owned = if path.starts_with("/v1/deliveries") {
            2
        } else {
            1
        };
        assert_eq!(
            own.body["data"].as_array().expect("data").len(),
            owned,
            "{path} as A"
        );
    }

    // B cannot subscribe its own project to A's endpoint.
    let r = app
        .call(
            Method::POST,
            "/v1/subscriptions",
            Some(&key_b),
            Some(json!({"endpoint_id": ep, "event_types": ["*"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Nothing B tried changed A's rows; B's events never reach A's endpoint.
    let own = app
        .call(
            Method::GET,
            &format!("/v1/endpoints/{ep}"),
            Some(&key_a),
            None,
        )
        .await;
    assert_eq!(own.body["url"], json!("http://127.0.0.1:9/hook"));
    let own = app
        .call(
            Method::GET,
            &format!("/v1/subscriptions/{sub}"),
            Some(&key_a),
            None,
        )
        .await;
    assert_eq!(own.body["ordered"], json!(false));
    let b_event = app.post_event(&key_b, "order.paid", json!({}), None).await;
    assert_eq!(b_event.body["deliveries"], json!([]));
    // B can neither replay A's Events nor retry A's failed messages in bulk.
    let r = app
        .call(
            Method::POST,
            "/v1/replays",
            Some(&key_b),
            Some(json!({"event_ids": [evt_id], "endpoint_id": ep})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = app
        .call(
            Method::GET,
            &format!("/v1/failed-messages?endpoint_id={ep}"),
            Some(&key_b),
            None,
        )
        .await;
    assert_eq!(r.body["data"], json!([]));
}

#[tokio::test]
async fn missing_invalid_and_revoked_keys_are_refused_everywhere() {
    let app = spawn_app().await;
    let (project, key) = app.project().await;
    let routes: Vec<(Method, &str)> = vec![
        (Method::POST, "/v1/endpoints"),
        (Method::GET, "/v1/endpoints"),
        (Method::GET, "/v1/endpoints/ep_01arz3ndektsv4rrffq69g5fav"),
        (Method::POST, "/v1/subscriptions"),
        (Method::GET, "/v1/subscriptions"),
        (Method::POST, "/v1/events"),
        (Method::POST, "/v1/events/batch"),
        (Method::GET, "/v1/events"),
        (Method::GET, "/v1/deliveries"),
    ];
    let extra = app
        .admin(&format!("/v1/projects/{project}/api-keys"), json!({}))
        .await;
    assert_eq!(extra.status, StatusCode::CREATED);
    let extra_key = extra.body["api_key"].as_str().expect("key").to_owned();
    let extra_id = extra.body["id"].as_str().expect("id").to_owned();
    assert!(extra_key.starts_with(extra.body["prefix"].as_str().expect("prefix")));
    let r = app
        .call(Method::GET, "/v1/endpoints", Some(&extra_key), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let revoke = app
        .call(
            Method::DELETE,
            &format!("/v1/api-keys/{extra_id}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(revoke.status, StatusCode::NO_CONTENT);

    // Every project route the OpenAPI document lists, not only the ones named above.
    let doc = app
        .call(Method::GET, "/openapi.json", None, None)
        .await
        .body;
    let mut documented: Vec<(Method, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (verb, op) in ops.as_object().expect("ops") {
            // Routes a project key may call (those the admin token may also call, such as
            // revoking a key, answer it otherwise).
            let by = |scheme: &str| {
                op["security"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|r| r.get(scheme).is_some()))
            };
            let project_route = by("api_key") && !by("admin_token");
            if !project_route {
                continue;
            }
            // Any well-formed id: the key is refused before the id is looked at.
            let concrete = path
                .replace("{id}", "ep_01arz3ndektsv4rrffq69g5fav")
                .replace("{source_id}", "src_01arz3ndektsv4rrffq69g5fav");
            let method = Method::from_bytes(verb.to_uppercase().as_bytes()).expect("verb");
            documented.push((method, concrete));
        }
    }
    assert!(
        documented.len() >= 30,
        "{} project routes",
        documented.len()
    );
    let named: Vec<(Method, String)> = routes
        .iter()
        .map(|(m, p)| (m.clone(), (*p).to_owned()))
        .chain(documented)
        .collect();
    for (method, path) in &named {
        for token in [
            None,
            Some("rh_nothing_real"),
            Some(extra_key.as_str()),
            Some(ADMIN_TOKEN),
        ] {
            let r = app.call(method.clone(), path, token, Some(json!({}))).await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {token:?}"
            );
            assert_eq!(r.code(), "unauthorized");
        }
    }
    // The unrevoked key still works; project keys cannot do admin work.
    let r = app
        .call(Method::GET, "/v1/endpoints", Some(&key), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    for path in [
        "/v1/organizations",
        "/v1/projects",
        &format!("/v1/projects/{project}/api-keys"),
    ] {
        let r = app
            .call(
                Method::POST,
                path,
                Some(&key),
                Some(json!({"name": "x", "monthly_quota": 1})),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    // A project's admin key revokes its own project's keys only: another project's key
    // answers 404, like one that does not exist.
    let (_, other) = app.project().await;
    let r = app
        .call(
            Method::DELETE,
            &format!("/v1/api-keys/{extra_id}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // The stored key is a hash, never the key.
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT key_hash FROM api_keys")
        .fetch_all(&app.pool)
        .await
        .expect("keys");
    assert!(
        stored
            .iter()
            .all(|h| h.len() == 32 && h.as_slice() != key.as_bytes())
    );
}
