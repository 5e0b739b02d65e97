//! What an idle consumer costs the broker, one client setting at a time: a librdkafka
//! consumer (a group member through `subscribe`, or `assign` without a group) on
//! `--topics` empty topics of `--partitions` each, with any properties given by `--set`,
//! polled like the worker polls (a `StreamConsumer`'s stream). After a warm-up that covers
//! the group join, the broker's CPU (from /proc, `--broker-pid`) and this process's own are
//! read over `--seconds`; the time until the member held every partition is printed too. Used to find by elimination what makes an idle worker expensive
//! (#21); every run creates fresh topics, so runs do not see each other's state.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};

use crate::setup::unique;

#[derive(clap::Args)]
pub struct Args {
    /// The broker (default: KAFKA_BROKERS).
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: String,
    /// The broker's process id, whose CPU is read from /proc.
    #[arg(long)]
    broker_pid: u32,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Seconds polled before the measurement starts (the group join).
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    #[arg(long, default_value_t = 2)]
    topics: usize,
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// `assign` every partition instead of joining a group with `subscribe`.
    #[arg(long)]
    no_group: bool,
    /// A consumer property, `key=value`; repeat for more.
    #[arg(long = "set")]
    set: Vec<String>,
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it are space-separated.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .create()?;
    let names: Vec<String> = (0..args.topics).map(|_| unique("idle.")).collect();
    let new: Vec<NewTopic> = names
        .iter()
        .map(|n| NewTopic::new(n, args.partitions, TopicReplication::Fixed(1)))
        .collect();
    for r in admin.create_topics(&new, &AdminOptions::new()).await? {
        if let Err((topic, e)) = r {
            bail!("topic {topic}: {e}");
        }
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", unique("idle-"))
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    for kv in &args.set {
        let (k, v) = kv.split_once('=').context("--set key=value")?;
        config.set(k, v);
    }
    let consumer: StreamConsumer = config.create()?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    if args.no_group {
        let mut tpl = TopicPartitionList::new();
        for t in &refs {
            for p in 0..args.partitions {
                tpl.add_partition_offset(t, p, rdkafka::Offset::Beginning)?;
            }
        }
        consumer.assign(&tpl)?;
    } else {
        consumer.subscribe(&refs)?;
    }
    let poll_for = |d: Duration| {
        let consumer = &consumer;
        async move {
            let stream = consumer.stream();
            tokio::pin!(stream);
            let end = tokio::time::Instant::now() + d;
            loop {
                tokio::select! {
                    m = stream.next() => { let _ = m; }
                    _ = tokio::time::sleep_until(end) => break,
                }
            }
        }
    };
    // The group join: poll until the member holds every partition (or the warm-up ends).
    let joining = Instant::now();
    let want = args.topics * args.partitions as usize;
    let mut joined = None;
    while joining.elapsed() < Duration::from_secs(args.warmup) {
        poll_for(Duration::from_millis(100)).await;
        if joined.is_none() && consumer.assignment().map(|a| a.count()).unwrap_or(0) >= want {
            joined = Some(joining.elapsed());
        }
    }
    let joined = joined.map_or_else(
        || format!("not within {} s", args.warmup),
        |d| format!("{:.1} s", d.as_secs_f64()),
    );
    let broker = args.broker_pid.to_string();
    let (b0, s0, t0) = (cpu_seconds(&broker)?, cpu_seconds("self")?, Instant::now());
    poll_for(Duration::from_secs(args.seconds)).await;
    let wall = t0.elapsed().as_secs_f64();
    let (b1, s1) = (cpu_seconds(&broker)?, cpu_seconds("self")?);
    println!(
        "| {} | {} × {} | {} | {:.1} % | {:.1} % | {joined} |",
        if args.no_group { "assign" } else { "group" },
        args.topics,
        args.partitions,
        if args.set.is_empty() {
            "(defaults)".to_owned()
        } else {
            args.set.join(" ")
        },
        100.0 * (b1 - b0) / wall,
        100.0 * (s1 - s0) / wall
    );
    drop(consumer);
    let _ = admin.delete_topics(&refs, &AdminOptions::new()).await;
    Ok(())
}
