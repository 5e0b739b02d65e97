//! `railhook replay …`: starts a Replay through the REST API and follows its progress. It is
//! an API client like any other (it needs an API key, not the database), so an operator can
//! run it from anywhere that reaches the API.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

#[derive(clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    api: crate::ApiArgs,
    /// Replay these Events (repeat the flag); or give --from and --to.
    #[arg(long = "event-id", conflicts_with_all = ["from", "to"])]
    event_ids: Vec<String>,
    /// Start of the range (RFC 3339, inclusive).
    #[arg(long, requires = "to")]
    from: Option<DateTime<Utc>>,
    /// End of the range (RFC 3339, exclusive).
    #[arg(long, requires = "from")]
    to: Option<DateTime<Utc>>,
    /// Only Events of this exact type (repeat the flag); needs a range.
    #[arg(long = "event-type", requires = "from")]
    event_types: Vec<String>,
    /// Only to this endpoint.
    #[arg(long)]
    endpoint: Option<String>,
    /// Print how many Events would be replayed and create nothing.
    #[arg(long)]
    dry_run: bool,
    /// Start the Replay and return without following it.
    #[arg(long)]
    no_wait: bool,
}

impl ReplayArgs {
    fn body(&self) -> Value {
        let mut body = json!({"dry_run": self.dry_run});
        if !self.event_ids.is_empty() {
            body["event_ids"] = json!(self.event_ids);
        }
        if let (Some(from), Some(to)) = (self.from, self.to) {
            body["from"] = json!(from);
            body["to"] = json!(to);
        }
        if !self.event_types.is_empty() {
            body["event_types"] = json!(self.event_types);
        }
        if let Some(ep) = &self.endpoint {
            body["endpoint_id"] = json!(ep);
        }
        body
    }
}

async fn call(req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let resp = req.send().await.context("the API did not answer")?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        // A problem+json body names the field and the reason.
        let detail = body["detail"].as_str().unwrap_or("no detail");
        let code = body["code"].as_str().unwrap_or("unknown");
        bail!("the API answered {status} ({code}): {detail}");
    }
    Ok(body)
}

pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    if args.event_ids.is_empty() && args.from.is_none() {
        bail!("give --event-id (one or more), or --from and --to");
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let base = args.api.api_url.trim_end_matches('/');
    let created = call(
        client
            .post(format!("{base}/v1/replays"))
            .bearer_auth(&args.api.api_key)
            .json(&args.body()),
    )
    .await?;
    if args.dry_run {
        println!("{} events would be replayed", created["events_total"]);
        return Ok(());
    }
    let id = created["id"].as_str().context("no replay id")?.to_owned();
    let total = created["events_total"].as_u64().unwrap_or(0);
    println!("replay {id}: {total} events");
    if args.no_wait {
        return Ok(());
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} events ({per_sec}, eta {eta}) {msg}",
        )?
        .progress_chars("=> "),
    );
    loop {
        let r = call(
            client
                .get(format!("{base}/v1/replays/{id}"))
                .bearer_auth(&args.api.api_key),
        )
        .await?;
        bar.set_position(r["events_done"].as_u64().unwrap_or(0));
        bar.set_message(format!("{} deliveries", r["deliveries_created"]));
        match r["status"].as_str() {
            Some("RUNNING") => tokio::time::sleep(Duration::from_millis(500)).await,
            Some(status) => {
                bar.finish();
                println!(
                    "replay {id} {}: {} events, {} deliveries created",
                    status.to_lowercase(),
                    r["events_done"],
                    r["deliveries_created"]
                );
                return Ok(());
            }
            None => bail!("the API returned a replay without a status"),
        }
    }
}
