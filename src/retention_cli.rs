//! `railhook retention [--dry-run]`: the day partitions of events, deliveries and attempts,
//! with their size and what a retention pass does with each; without `--dry-run` it runs
//! that pass (the same code as the task in the ingest role, common/src/retention/).

use anyhow::Context;
use railhook_common::config::Settings;
use railhook_common::retention::{self, Partition, Verdict};

#[derive(clap::Args)]
pub struct RetentionArgs {
    /// List what would be dropped or held back, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(settings: &Settings, args: RetentionArgs) -> anyhow::Result<()> {
    let pool = railhook_common::db::connect(settings).context("configuration: database_url")?;
    // The database's clock, as the task's passes use (common/src/retention/mod.rs).
    let now = retention::database_now(&pool)
        .await
        .context("cannot read the database's clock")?;
    let days = settings.retention_days;
    let mut conn = pool.acquire().await.context("cannot connect to Postgres")?;
    let partitions = retention::plan(&mut conn, now, days)
        .await
        .context("reading the partitions")?;
    drop(conn);
    println!(
        "retention: {days} days (partitions whose day ended before {})",
        now - chrono::Duration::days(i64::from(days))
    );
    print_table(&partitions);
    if args.dry_run {
        return Ok(());
    }
    let report = retention::run(&pool, now, days, None)
        .await
        .context("retention pass")?;
    if report.skipped {
        println!("another process is running a pass now; nothing done");
        return Ok(());
    }
    println!(
        "created {} partitions ahead; dropped {}; held back {}",
        report.created,
        report.dropped.len(),
        report.held_back.len()
    );
    for name in &report.dropped {
        println!("  dropped    {name}");
    }
    for name in &report.held_back {
        println!("  held back  {name}");
    }
    Ok(())
}

fn print_table(partitions: &[Partition]) {
    println!(
        "{:<24} {:>12} {:>12}  action",
        "partition", "bytes", "rows~"
    );
    for p in partitions {
        let action = match &p.verdict {
            Verdict::Future => "future".to_owned(),
            Verdict::Keep => "keep".to_owned(),
            Verdict::Drop => "drop".to_owned(),
            Verdict::HeldBack { open } => format!("held back ({open} open deliveries)"),
        };
        let rows = if p.rows_estimate < 0 {
            "?".to_owned()
        } else {
            p.rows_estimate.to_string()
        };
        println!("{:<24} {:>12} {:>12}  {action}", p.name, p.bytes, rows);
    }
}
