//! `railhook migrate` and `railhook slot …`: what an operator runs around the roles to
//! give them a schema, a publication and a replication Slot (docs/OPERATIONS.md).

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use railhook_common::config::Settings;
use railhook_common::db;
use railhook_common::health::{self, Dependencies};
use railhook_relay::slot;

use crate::roles::connect;

/// How long `railhook migrate` waits for Postgres to answer.
const MIGRATE_WAIT: Duration = Duration::from_secs(60);

#[derive(Subcommand)]
pub enum SlotAction {
    /// Slot, holder, confirmed/restart LSN, lag, retained WAL, wal_status, safe_wal_size.
    Status,
    /// Create the Slot (pgoutput) if missing. A new Slot starts at "now".
    Create {
        /// A PostgreSQL 17 failover Slot, synchronised to the standbys named in
        /// `synchronized_standby_slots` (refused by older servers).
        #[arg(long)]
        failover: bool,
    },
    /// Drop the Slot. Postgres frees its WAL; the relay stops until it is created again.
    Drop,
}

pub async fn slot(settings: &Settings, action: SlotAction) -> anyhow::Result<()> {
    // A multi-host URL names the primary among its servers (libpq's rule).
    let primary = settings
        .replication_postgres()?
        .primary()
        .await
        .context("cannot connect to Postgres")?;
    let mut client = slot::connect(&primary)
        .await
        .context("cannot connect to Postgres")?;
    let name = &settings.slot;
    match action {
        SlotAction::Create { failover } => {
            let failover = failover || settings.slot_failover;
            let created = slot::create_with(&mut client, name, failover).await?;
            println!(
                "slot {name}: {}",
                if created { "created" } else { "already exists" }
            );
            if created {
                // Outbox rows written while no Slot existed were never announced.
                let moved = slot::reannounce_missed(&mut client).await?;
                println!("deliveries written without a slot, handed to the retry path: {moved}");
            }
        }
        SlotAction::Drop => {
            let dropped = slot::drop(&mut client, name).await?;
            println!(
                "slot {name}: {}",
                if dropped { "dropped" } else { "did not exist" }
            );
        }
        SlotAction::Status => match slot::status(&mut client, name).await? {
            None => {
                println!("slot {name}: missing (create it with `railhook slot create`)");
                std::process::exit(3);
            }
            Some(s) => {
                print_status(&s);
                print_failover(&primary, &mut client, name).await?;
                // Absent before the first migration that created it, or before any relay ran.
                let seen = slot::last_heartbeat_seen(&mut client, name)
                    .await
                    .ok()
                    .flatten();
                println!(
                    "last_heartbeat_seen  {}",
                    seen.unwrap_or_else(|| "-".into())
                );
            }
        },
    }
    Ok(())
}

fn print_status(s: &slot::SlotStatus) {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let num = |v: Option<i64>| v.map_or_else(|| "-".into(), |n| n.to_string());
    println!("slot                 {}", s.slot);
    println!("active               {}", s.active);
    println!(
        "active_pid           {}",
        s.active_pid.map_or_else(|| "-".into(), |p| p.to_string())
    );
    println!("confirmed_flush_lsn  {}", opt(&s.confirmed_flush_lsn));
    println!("restart_lsn          {}", opt(&s.restart_lsn));
    println!("lag_bytes            {}", num(s.lag_bytes));
    println!("retained_bytes       {}", num(s.retained_bytes));
    println!("wal_status           {}", opt(&s.wal_status));
    println!(
        "safe_wal_size        {}",
        s.safe_wal_size
            .map_or_else(|| "unlimited".into(), |n| n.to_string())
    );
}

/// Whether the Slot is a failover Slot, the standbys Postgres waits for before decoding
/// (`synchronized_standby_slots`), and, for each other server of a multi-host URL, whether
/// it holds a copy of the Slot ready for a promotion (docs/operate/failover.md, "Failover").
async fn print_failover(
    primary: &railhook_common::postgres_url::PostgresTarget,
    client: &mut sqlx::PgConnection,
    name: &str,
) -> anyhow::Result<()> {
    let failover = slot::is_failover(client, name).await?;
    println!(
        "failover             {}",
        failover.map_or_else(
            || "unsupported (PostgreSQL 16 or older)".into(),
            |f| f.to_string()
        )
    );
    for st in slot::standby_slots(client).await? {
        println!(
            "standby slot         {} ({}, {} bytes behind)",
            st.slot,
            if st.active {
                "streaming"
            } else {
                "NOT streaming: the relay is held back"
            },
            st.lag_bytes
        );
    }
    for (host, port) in &primary.hosts {
        if (host.as_str(), *port) == (primary.host.as_str(), primary.port) {
            continue;
        }
        let copy = standby_copy(&primary.at(host, *port), name).await;
        println!("copy on {host}:{port}  {copy}");
    }
    Ok(())
}

/// How another server holds the Slot: a ready synchronized copy, one not ready yet, none.
async fn standby_copy(
    server: &railhook_common::postgres_url::PostgresTarget,
    name: &str,
) -> String {
    let mut conn = match slot::connect(server).await {
        Ok(c) => c,
        Err(e) => return format!("unreachable ({e})"),
    };
    match slot::copy_on(&mut conn, name).await {
        Err(e) => format!("unreadable ({e})"),
        Ok(copy) => copy.to_string(),
    }
}

/// Times `railhook migrate` tries again after a lock timeout before it fails.
const MIGRATE_LOCK_RETRIES: u32 = 5;

pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let pool = connect(settings)?;
    // A migration is a one-shot job: it waits for Postgres a while (it may start alongside
    // it), then fails so the job runner's own retries and alerts take over.
    let deps = Dependencies::new();
    deps.declare("postgres", true);
    tokio::time::timeout(MIGRATE_WAIT, health::wait_for_postgres(&deps, &pool))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "Postgres did not answer within {} s",
                MIGRATE_WAIT.as_secs()
            )
        })?
        .context("cannot connect to Postgres (check DATABASE_URL)")?;
    // Each statement waits at most MIGRATION_LOCK_TIMEOUT for its lock (db::migrate says
    // why); a timed-out migration rolled back whole, so it is simply tried again.
    let mut tries = 0;
    loop {
        match db::migrate(settings, db::MIGRATION_LOCK_TIMEOUT).await {
            Ok(()) => break,
            Err(e) if db::is_lock_timeout(&e) && tries < MIGRATE_LOCK_RETRIES => {
                tries += 1;
                tracing::warn!(
                    attempt = tries,
                    "a migration waited too long for a lock (a long transaction holds it); trying again"
                );
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(e) => return Err(e).context("applying migrations"),
        }
    }
    db::ensure_publication(&pool, &settings.publication)
        .await
        .context("creating the outbox publication")?;
    let primary = settings.replication_postgres()?.primary().await?;
    let mut client = slot::connect(&primary).await?;
    let created = slot::create_with(&mut client, &settings.slot, settings.slot_failover).await?;
    tracing::info!(publication = %settings.publication, slot = %settings.slot, slot_created = created, "migrations applied");
    Ok(())
}
