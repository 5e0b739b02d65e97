//! `railhook listen`: webhooks on a developer's machine without a public URL (issue #56,
//! docs/RECEIVERS.md). One outbound WebSocket to the API (`GET /v1/listen`, ingest/src/
//! listen.rs); each request that comes down it is forwarded to `--forward-to` with its
//! headers and body exactly as signed, and the local answer (status, body, time) goes back
//! up to become the Attempt's result. A lost connection is opened again; Deliveries made
//! while it was away are retried by the normal ladder against the same endpoint.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::{SinkExt, StreamExt};
use railhook_ingest::listen::{Down, LocalAnswer, Up};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest, http};

#[derive(clap::Args)]
pub struct ListenArgs {
    #[command(flatten)]
    api: crate::ApiArgs,
    /// Where to forward each webhook: your receiver (`http://localhost:3000/webhooks`).
    #[arg(long)]
    forward_to: String,
    /// Event type patterns to receive (`order.*`; repeat the flag or separate by commas);
    /// default every type.
    #[arg(long = "event-types", value_delimiter = ',')]
    event_types: Vec<String>,
    /// Receive the Events of this application (id or uid) instead of the project's own.
    #[arg(long)]
    application: Option<String>,
    /// The session's name: one endpoint per name, kept across reconnects and restarts.
    #[arg(long, default_value = "default")]
    name: String,
}

/// Why a session cannot go on: said once, and the command ends.
struct Refused(String);

pub async fn run(args: ListenArgs) -> anyhow::Result<()> {
    let forward = url::Url::parse(&args.forward_to).context("--forward-to is not a URL")?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the HTTP client")?;
    let mut wait = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        match session(&args, &client, &forward).await {
            Ok(()) => eprintln!("the connection closed; opening it again"),
            Err(Ok(Refused(why))) => bail!("{why}"),
            Err(Err(e)) => eprintln!("the connection failed ({e:#}); opening it again"),
        }
        // A session that lived a while starts the backoff over.
        if started.elapsed() > Duration::from_secs(30) {
            wait = Duration::from_secs(1);
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(10));
    }
}

fn listen_url(args: &ListenArgs) -> anyhow::Result<url::Url> {
    let mut url = url::Url::parse(&args.api.api_url).context("--api-url is not a URL")?;
    let scheme = match url.scheme() {
        "http" => "ws",
        "https" => "wss",
        other => bail!("--api-url must be http or https, not {other}"),
    };
    let _ = url.set_scheme(scheme);
    url.set_path(&format!("{}/v1/listen", url.path().trim_end_matches('/')));
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("name", &args.name);
        if !args.event_types.is_empty() {
            q.append_pair("event_types", &args.event_types.join(","));
        }
        if let Some(app) = &args.application {
            q.append_pair("application", app);
        }
    }
    Ok(url)
}

/// One connection, until it closes. `Err(Ok(_))`: the API refused the session (a wrong
/// key, a bad pattern): reconnecting would not help.
async fn session(
    args: &ListenArgs,
    client: &reqwest::Client,
    forward: &url::Url,
) -> Result<(), Result<Refused, anyhow::Error>> {
    let url = listen_url(args).map_err(Err)?;
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| Err(e.into()))?;
    let bearer = http::HeaderValue::from_str(&format!("Bearer {}", args.api.api_key))
        .map_err(|_| Ok(Refused("the API key is not a valid header value".into())))?;
    request
        .headers_mut()
        .insert(http::header::AUTHORIZATION, bearer);
    let (socket, _) = match tokio_tungstenite::connect_async(request).await {
        Ok(pair) => pair,
        Err(tungstenite::Error::Http(response)) if response.status().is_client_error() => {
            let detail = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            return Err(Ok(Refused(format!(
                "the API refused the session ({}): {detail}",
                response.status()
            ))));
        }
        Err(e) => return Err(Err(e.into())),
    };
    let (mut sink, mut stream) = socket.split();
    let (answers, mut to_send) = mpsc::channel::<Up>(64);
    let writer = tokio::spawn(async move {
        while let Some(up) = to_send.recv().await {
            let text = serde_json::to_string(&up).unwrap_or_default();
            if sink.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
    });
    while let Some(message) = stream.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        match serde_json::from_str::<Down>(&text) {
            Ok(Down::Ready {
                endpoint_id,
                secret,
                event_types,
            }) => {
                println!(
                    "Ready: forwarding {} to {forward} (endpoint {endpoint_id}, signing secret {secret})",
                    event_types.join(", ")
                );
            }
            Ok(Down::Request {
                id,
                headers,
                body_base64,
            }) => {
                let (client, forward, answers) = (client.clone(), forward.clone(), answers.clone());
                tokio::spawn(async move {
                    let answer = forward_one(&client, &forward, &headers, &body_base64).await;
                    let _ = answers.send(Up::Response { id, answer }).await;
                });
            }
            Err(_) => {}
        }
    }
    writer.abort();
    Ok(())
}

/// Forwards one request and prints its line: time, event type, webhook-id, status, ms.
async fn forward_one(
    client: &reqwest::Client,
    forward: &url::Url,
    headers: &[(String, String)],
    body_base64: &str,
) -> LocalAnswer {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or("-", |(_, v)| v.as_str())
    };
    let body = STANDARD.decode(body_base64).unwrap_or_default();
    let mut request = client.post(forward.clone()).body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let clock = Instant::now();
    let answer = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let mut body = response.text().await.unwrap_or_default();
            // The API keeps 64 KiB of an answer and refuses messages over 1 MiB: only what
            // it keeps goes up.
            railhook_common::text::truncate_at_char(&mut body, 64 * 1024);
            LocalAnswer {
                status: Some(status),
                body,
                error: None,
            }
        }
        Err(e) => LocalAnswer {
            status: None,
            body: String::new(),
            error: Some(format!("the local receiver did not answer: {e}")),
        },
    };
    let shown = answer
        .status
        .map_or_else(|| "error".to_owned(), |s| s.to_string());
    println!(
        "{}  {}  {}  {}  {} ms",
        chrono::Utc::now().format("%H:%M:%S"),
        header("x-event-type"),
        header("webhook-id"),
        shown,
        clock.elapsed().as_millis()
    );
    answer
}
