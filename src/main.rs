//! The one `railhook` binary: the command line and its dispatch. How each role is wired
//! (probes, metrics, drain) is `roles.rs`; the roles themselves live in the `ingest`,
//! `relay` and `worker` crates.

mod listen_cli;
mod replay_cli;
mod retention_cli;
mod roles;
mod schema_cli;
mod secrets_cli;

use clap::{Parser, Subcommand};
use railhook_common::config::Settings;

#[derive(Parser)]
#[command(
    name = "railhook",
    version,
    about = "Webhook delivery with a transactional outbox and a CDC relay"
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

/// Where the REST API is and the project key to call it with: the API clients' (`replay`,
/// `listen`) shared flags.
#[derive(clap::Args)]
pub(crate) struct ApiArgs {
    /// The API's base URL.
    #[arg(
        long,
        env = "RAILHOOK_API_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub(crate) api_url: String,
    /// A project API key (what the command makes belongs to its project).
    #[arg(long, env = "RAILHOOK_API_KEY", hide_env_values = true)]
    pub(crate) api_key: String,
}

#[derive(Subcommand)]
enum Role {
    /// Serve the REST API.
    Ingest,
    /// Stream Outbox inserts from the replication Slot to Kafka.
    Relay,
    /// Consume Kafka hints, Claim Deliveries and run Attempts.
    Worker,
    /// Every role in one process, for a single machine.
    All,
    /// Apply migrations and create the outbox publication and the Slot; safe to run twice.
    Migrate,
    /// Inspect or manage the logical replication Slot.
    Slot {
        #[command(subcommand)]
        action: schema_cli::SlotAction,
    },
    /// Replay stored Events through the REST API (by id, or by time range) and follow it.
    Replay(replay_cli::ReplayArgs),
    /// Receive webhooks on this machine: forward a session's Events to a local URL over one
    /// outbound connection (docs/RECEIVERS.md).
    Listen(listen_cli::ListenArgs),
    /// List the day partitions with sizes and what retention does with each; then run a
    /// retention pass (unless --dry-run).
    Retention(retention_cli::RetentionArgs),
    /// Manage the keys that seal signing and Source secrets at rest.
    Secrets {
        #[command(subcommand)]
        action: secrets_cli::SecretsAction,
    },
}

fn main() -> std::process::ExitCode {
    railhook_common::install_crypto_provider();
    let cli = Cli::parse();
    // API clients: no database, broker or telemetry settings needed.
    match cli.role {
        Role::Replay(args) => return client_main(replay_cli::run(args)),
        Role::Listen(args) => return client_main(listen_cli::run(args)),
        _ => {}
    }
    let settings = match Settings::load() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Before the runtime: the OTLP exporter's blocking HTTP client must not be built or
    // dropped on an async thread. `_telemetry` flushes batched spans when main returns.
    let _telemetry = railhook_common::telemetry::init(
        settings.log_format,
        settings.otlp_endpoint.as_deref(),
        &format!("railhook-{}", cli.role.name()),
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli, settings));
    drop(runtime);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the chain of causes on one line, without a backtrace.
            eprintln!("error: {e:#}");
            tracing::error!(error = format!("{e:#}"), "railhook stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

fn client_main(
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    let result = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(work));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

impl Role {
    /// The role's name, for the OTLP `service.name` (`railhook-ingest`, …).
    fn name(&self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Relay => "relay",
            Role::Worker => "worker",
            Role::All => "all",
            Role::Migrate => "migrate",
            Role::Slot { .. } => "slot",
            Role::Replay(_) => "replay",
            Role::Listen(_) => "listen",
            Role::Retention(_) => "retention",
            Role::Secrets { .. } => "secrets",
        }
    }
}

async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    if matches!(cli.role, Role::Ingest | Role::Worker | Role::All)
        && !settings.keyring().is_enabled()
    {
        tracing::warn!(
            "RAILHOOK_ENCRYPTION_KEYS is not set: endpoint signing secrets and Source secrets \
             are stored in plaintext, readable by anyone who can read the database or its \
             backups (docs/operate/security.md, Secrets at rest)"
        );
    }
    match cli.role {
        Role::Migrate => schema_cli::migrate(&settings).await,
        Role::Ingest => roles::ingest(&settings).await,
        Role::Relay => roles::relay(&settings).await,
        Role::Worker => roles::worker(&settings).await,
        Role::All => roles::all(&settings).await,
        Role::Slot { action } => schema_cli::slot(&settings, action).await,
        Role::Replay(args) => replay_cli::run(args).await,
        Role::Listen(args) => listen_cli::run(args).await,
        Role::Retention(args) => retention_cli::run(&settings, args).await,
        Role::Secrets { action } => secrets_cli::run(&settings, action).await,
    }
}
