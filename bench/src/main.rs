//! `railhook-bench`: load and latency harnesses. Each starts nothing by itself: it uses the
//! local infrastructure (`deploy/local/up.sh`, settings from the environment) and measures a
//! baseline in the same run, so the printed ratios compare like with like.
// Tests and benchmarks build their own fixtures with unchecked SQL (clippy.toml).
// Benchmark scenarios read top to bottom; the 100-line limit (clippy.toml) is for
// production code.
#![allow(clippy::too_many_lines)]
#![allow(clippy::disallowed_methods)]

mod e2e;
mod feature_costs;
mod idle_consumer;
mod ingest;
mod isolation;
mod memory;
mod ordered;
mod peers;
mod pgbench;
mod pull;
mod relay;
mod retention;
mod roles;
mod setup;
mod stats;
mod transports;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "railhook-bench")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Events/s and latency of POST /v1/events (and batches) against pgbench doing the same
    /// inserts, then cost growth with the events table at 0, 1 M and 10 M rows.
    Ingest(ingest::Args),
    /// Relay RSS while the broker is down and a backlog of Outbox rows accumulates, then
    /// while it drains.
    RelayMemory(memory::Args),
    /// Backlog drain (rows/s) against pg_recvlogical and a bare producer, then
    /// commit → Kafka-ack latency at a steady rate.
    Relay(relay::Args),
    /// POST → receiver latency at a steady rate, then deliveries/s for a burst.
    E2e(e2e::Args),
    /// POST → receiver latency with ingest, relay and worker as separate processes, and
    /// each role's CPU and memory.
    Roles(roles::Args),
    /// Events/s and CPU per message to each kind of endpoint (HTTP, Kafka, SQS, RabbitMQ,
    /// NATS), HTTP as the baseline in the same run.
    Transports(transports::Args),
    /// Simulated months: database size, ingest and the cost of retiring a day by dropping
    /// partitions, against batched DELETEs in the same run.
    Retention(retention::Args),
    /// Healthy endpoints' delivery latency with and without one failing endpoint beside
    /// them (500s and timeouts), same load, same run.
    Isolation(isolation::Args),
    /// The broker's CPU for an idle consumer, with the given client properties: finds by
    /// elimination what an idle worker asks of the broker.
    IdleConsumer(idle_consumer::Args),
    /// Ordered deliveries/s on one endpoint against an unordered one in the same run, and
    /// whether they arrived in Sequence Number order.
    Ordered(ordered::Args),
    /// Railhook and a peer (Svix, built from source) under the same open-loop client, the
    /// same receiver process and the same Postgres and Redis, one row each (issue #54).
    Peers(peers::Args),
    /// Receivers that pull: poll throughput and latency against the raw statement, POST →
    /// local receiver through `railhook listen` against plain HTTP, idle sessions' CPU.
    Pull(pull::Args),
    /// `pull`'s idle listen sessions, in a process of their own.
    #[command(hide = true)]
    ListenClients(pull::ClientsArgs),
    /// The peers benchmark's receiver, in a process of its own (started by `peers`).
    #[command(hide = true)]
    Receiver(peers::ReceiverArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().bench {
        Bench::Ingest(args) => ingest::run(args).await,
        Bench::Ordered(args) => ordered::run(args).await,
        Bench::Peers(args) => peers::run(args).await,
        Bench::Receiver(args) => peers::receiver(args).await,
        Bench::Pull(args) => pull::run(args).await,
        Bench::ListenClients(args) => pull::clients(args).await,
        Bench::Relay(args) => relay::run(args).await,
        Bench::RelayMemory(args) => memory::run(args).await,
        Bench::E2e(args) => e2e::run(args).await,
        Bench::Isolation(args) => isolation::run(args).await,
        Bench::Roles(args) => roles::run(args).await,
        Bench::Transports(args) => transports::run(args).await,
        Bench::Retention(args) => retention::run(args).await,
        Bench::IdleConsumer(args) => idle_consumer::run(args).await,
    }
}
