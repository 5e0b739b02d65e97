//! Ordered deliveries per endpoint (issue #21 item 5): `--events` Events to one endpoint
//! with an ordered subscription, POSTed in batches as fast as they are accepted; deliveries/s
//! from the first POST to the last arrival, and whether they arrived in Sequence Number
//! order. The baseline, in the same run and stack: the same number of Events to a second
//! endpoint whose subscription is not ordered.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

use crate::e2e::{post_batches, stack_with};

#[derive(clap::Args)]
pub struct Args {
    /// Events per endpoint.
    #[arg(long, default_value_t = 3_000)]
    events: u64,
    /// Give up waiting for the arrivals after this many seconds.
    #[arg(long, default_value_t = 120)]
    limit_seconds: u64,
}

/// (Sequence Number or 0, arrival) per request, in arrival order.
type Log = Arc<Mutex<Vec<(i64, Instant)>>>;

async fn receiver(log: Log) -> anyhow::Result<String> {
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| {
            let log = log.clone();
            async move {
                let number = headers
                    .get("x-sequence-number")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0);
                if let Ok(mut l) = log.lock() {
                    l.push((number, Instant::now()));
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// One line's result: arrivals, deliveries/s from the first POST, and whether the
/// Sequence Numbers arrived strictly increasing.
struct Line {
    got: usize,
    per_second: f64,
    /// Deliveries/s over the second half of the arrivals: the line's own pace once the
    /// burst's ingest and hints are behind it.
    tail_per_second: f64,
    in_order: bool,
}

/// POSTs `events` Events of `event_type` in batches of 500, then waits for `events`
/// arrivals in `log`.
async fn run_line(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    event_type: &str,
    events: u64,
    log: &Log,
    limit: Duration,
) -> anyhow::Result<Line> {
    let started = Instant::now();
    post_batches(
        http,
        api,
        key,
        events,
        |i| json!({"type": event_type, "payload": {"seq": i}}),
    )
    .await?;
    let count = || log.lock().map(|l| l.len()).unwrap_or(0);
    while count() < events as usize && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let l = log.lock().map_err(|_| anyhow::anyhow!("lock"))?;
    let last = l.last().map(|(_, at)| *at).unwrap_or_else(Instant::now);
    let half = l.len() / 2;
    let tail_per_second = match l.get(half) {
        Some((_, mid)) if l.len() > half + 1 => {
            (l.len() - half - 1) as f64 / last.duration_since(*mid).as_secs_f64().max(1e-6)
        }
        _ => 0.0,
    };
    Ok(Line {
        got: l.len(),
        per_second: l.len() as f64 / last.duration_since(started).as_secs_f64(),
        tail_per_second,
        in_order: l.windows(2).all(|w| w[0].0 < w[1].0),
    })
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (ordered_log, plain_log): (Log, Log) = (Arc::default(), Arc::default());
    let ordered_url = receiver(ordered_log.clone()).await?;
    let plain_url = receiver(plain_log.clone()).await?;
    // No endpoints from the stack: each gets its own subscription below.
    let st = stack_with(&[]).await?;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{}{path}", st.api))
            .bearer_auth(&st.key)
            .json(&body)
            .send()
    };
    for (url, pattern, ordered) in [
        (&ordered_url, "ordered.*", true),
        (&plain_url, "plain.*", false),
    ] {
        let endpoint: Value = post("/v1/endpoints", json!({"url": url}))
            .await?
            .json()
            .await?;
        let id = endpoint["id"].as_str().context("endpoint id")?;
        let r = post(
            "/v1/subscriptions",
            json!({"endpoint_id": id, "event_types": [pattern], "ordered": ordered}),
        )
        .await?;
        if r.status().as_u16() != 201 {
            bail!("subscription refused: {}", r.status());
        }
    }
    // Warm-up through the whole path, on both lines.
    for (t, log) in [
        ("ordered.warmup", &ordered_log),
        ("plain.warmup", &plain_log),
    ] {
        post("/v1/events", json!({"type": t, "payload": {}})).await?;
        let warm = Instant::now() + Duration::from_secs(60);
        while log.lock().map(|l| l.is_empty()).unwrap_or(true) {
            if Instant::now() > warm {
                bail!("the warm-up event never arrived");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        log.lock().map(|mut l| l.clear()).ok();
    }
    let limit = Duration::from_secs(args.limit_seconds);
    let mut lines = Vec::new();
    for (event_type, log) in [("plain.event", &plain_log), ("ordered.event", &ordered_log)] {
        eprintln!("ordered: {} {event_type} events", args.events);
        lines.push(run_line(&http, &st.api, &st.key, event_type, args.events, log, limit).await?);
    }
    let (plain, ordered) = (&lines[0], &lines[1]);
    let handoffs = st.worker.ordering_handoffs.get();
    let parks = st.worker.deferrals.with_label_values(&["ordering"]).get();
    println!(
        "## One endpoint, {} Events via /v1/events/batch (500 per request)\n",
        args.events
    );
    println!(
        "| subscription | delivered | deliveries/s (first POST → last arrival) | second half of the arrivals | in order |"
    );
    println!("| --- | ---: | ---: | ---: | --- |");
    println!(
        "| not ordered (baseline) | {} | {:.0} | {:.0} | — |",
        plain.got, plain.per_second, plain.tail_per_second
    );
    println!(
        "| **ordered** | {} | **{:.0}** | {:.0} | {} |",
        ordered.got,
        ordered.per_second,
        ordered.tail_per_second,
        if ordered.in_order { "yes" } else { "**no**" }
    );
    println!(
        "\nordered / not ordered: **{:.2}×**; hand-offs {handoffs}, parks {parks}",
        ordered.per_second / plain.per_second
    );
    st.stop().await;
    if ordered.got < args.events as usize || !ordered.in_order {
        bail!("the ordered line did not arrive complete and in order");
    }
    Ok(())
}
