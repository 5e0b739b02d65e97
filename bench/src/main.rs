//! `railhook-bench`: load and latency harnesses. Each starts nothing by itself: it uses the
//! local infrastructure (`deploy/local/up.sh`, settings from the environment) and measures a
//! baseline in the same run, so the printed ratios compare like with like.

mod e2e;
mod isolation;
mod relay;
mod setup;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "railhook-bench")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Backlog drain (rows/s) against pg_recvlogical and a bare producer, then
    /// commit → Kafka-ack latency at a steady rate.
    Relay(relay::Args),
    /// POST → receiver latency at a steady rate, then deliveries/s for a burst.
    E2e(e2e::Args),
    /// Healthy endpoints' delivery latency with and without one failing endpoint beside
    /// them (500s and timeouts), same load, same run.
    Isolation(isolation::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().bench {
        Bench::Relay(args) => relay::run(args).await,
        Bench::E2e(args) => e2e::run(args).await,
        Bench::Isolation(args) => isolation::run(args).await,
    }
}
