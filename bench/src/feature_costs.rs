//! What ingest features cost (`railhook-bench ingest --schema-only` / `--filters-only`):
//! the same load without and with an event-type schema, and with 0, 10 and 100 endpoints
//! whose payload filter declines every Event (docs/BENCHMARKS-HISTORY.md).

use serde_json::{Value, json};

use crate::ingest::{
    Args, HEADER, Run, Shape, checkpoint, closed_loop, row, start_api, start_api_with,
};

/// Slices of each configuration's time in the filter phase (interleaved).
const ROUNDS: u64 = 5;

/// One plain endpoint and `filtered` endpoints, each subscribed to every type, whose payload
/// filter declines the bench's Events (so every Event still makes one Delivery: the cost
/// measured is the filters' alone).
fn filtered_endpoints(filtered: usize) -> Vec<Value> {
    let mut bodies = vec![json!({"url": "http://127.0.0.1:9/plain"})];
    bodies.extend((0..filtered).map(|n| {
        json!({
            "url": format!("http://127.0.0.1:9/filtered{n}"),
            // The bench's payload has 4200 cents: declined by every one.
            "filter": format!("$.amount_cents > {} && $.currency == \"EUR\"", 10_000 + n),
        })
    }));
    bodies
}

/// Payload filters' cost (issue #42): single Events (c=16) and batches, from a project with
/// one plain endpoint and from projects with 10 and 100 filtered endpoints beside it, all on
/// one database (so each meets the same table, with statistics), after pgbench wrote the
/// first project's rows there: the raw-Postgres baseline of the same run. The
/// configurations' measurements are interleaved (`ROUNDS`).
pub(crate) async fn filter_phase(args: &Args) -> anyhow::Result<()> {
    let n = args.batch_size;
    println!(
        "## Payload filters: 1 plain endpoint + N filtered ones (each declines), {} s each\n\n{HEADER}",
        args.seconds
    );
    let plain = start_api_with(&filtered_endpoints(0)).await?;
    let mut projects = Vec::new();
    for &filtered in &args.filtered {
        let (project, key) =
            crate::setup::tenant(&plain.base, &filtered_endpoints(filtered)).await?;
        projects.push((filtered, project, key));
    }
    checkpoint(&plain.pool).await;
    let mut base = crate::pgbench::run(&plain, 1, 16, args.seconds).await?;
    row("pgbench, 1 Delivery per Event, c=16", &mut base);
    let mut runs = vec![(0, plain.project.clone(), plain.key.clone())];
    runs.extend(projects);
    // Interleaved: each configuration's time in ROUNDS slices, the order turned each round,
    // so a drift of the machine over the run (another tenant, the page cache, autovacuum)
    // falls on every configuration alike instead of on whichever ran at that moment.
    let slice = (args.seconds / ROUNDS).max(1);
    let mut measured: Vec<Option<(Run, Run)>> = runs.iter().map(|_| None).collect();
    for round in 0..ROUNDS as usize {
        for k in 0..runs.len() {
            // Each round starts one configuration later.
            let at = (round + k) % runs.len();
            let (_, project, key) = &runs[at];
            let api = plain.as_project(project.clone(), key.clone());
            checkpoint(&api.pool).await;
            let single = closed_loop(&api, Shape::Single, 16, slice).await;
            checkpoint(&api.pool).await;
            let batch = closed_loop(&api, Shape::Batch(n), 16, slice).await;
            match &mut measured[at] {
                Some((s, b)) => {
                    s.merge(single);
                    b.merge(batch);
                }
                none => *none = Some((single, batch)),
            }
        }
    }
    let results = runs
        .iter()
        .zip(measured)
        .filter_map(|((f, _, _), m)| m.map(|(s, b)| (*f, s, b)));
    let mut none = None;
    for (filtered, mut single, mut batch) in results {
        row(
            &format!("**single**, {filtered} filtered, c=16"),
            &mut single,
        );
        row(
            &format!("batch of {n}, {filtered} filtered, c=16"),
            &mut batch,
        );
        let (s1, b1) = (single.events_per_s(), batch.events_per_s());
        match none {
            None => none = Some((s1, b1)),
            Some((s0, b0)) => println!(
                "| cost of {filtered} filters: single **{:.0} %**, batch **{:.0} %** | | | | | |",
                (1.0 - s1 / s0) * 100.0,
                (1.0 - b1 / b0) * 100.0
            ),
        }
    }
    Ok(())
}

/// The event-type catalogue's cost: single Events (c=16) and batches of `batch_size`, one
/// endpoint, first with no schema on `order.paid`, then with one that the bench's payload
/// satisfies (so every Event is validated and accepted), on the same database.
pub(crate) async fn schema_phase(args: &Args) -> anyhow::Result<()> {
    let api = start_api(1).await?;
    let n = args.batch_size;
    println!(
        "## Event-type schema: without and with, 1 endpoint, {} s each\n\n{HEADER}",
        args.seconds
    );
    let mut runs = Vec::new();
    for with_schema in [false, true] {
        if with_schema {
            let schema = json!({
                "type": "object",
                "required": ["order_id", "amount_cents", "currency"],
                "properties": {
                    "order_id": {"type": "integer", "minimum": 1},
                    "amount_cents": {"type": "integer", "minimum": 0},
                    "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]}
                },
                "additionalProperties": false
            });
            let r = reqwest::Client::new()
                .post(format!("{}/v1/event-types", api.base))
                .bearer_auth(&api.key)
                .json(&json!({"name": "order.paid", "schema": schema}))
                .send()
                .await?;
            anyhow::ensure!(r.status() == 201, "event type: {}", r.status());
        }
        let label = if with_schema {
            "with schema"
        } else {
            "no schema"
        };
        checkpoint(&api.pool).await;
        let mut single = closed_loop(&api, Shape::Single, 16, args.seconds).await;
        checkpoint(&api.pool).await;
        let mut batch = closed_loop(&api, Shape::Batch(n), 16, args.seconds).await;
        row(&format!("single, c=16, {label}"), &mut single);
        row(&format!("batch of {n}, c=16, {label}"), &mut batch);
        runs.push((single.events_per_s(), batch.events_per_s()));
    }
    println!(
        "| ratio with ÷ without schema: single **{:.0} %**, batch **{:.0} %** | | | | | |",
        runs[1].0 / runs[0].0 * 100.0,
        runs[1].1 / runs[0].1 * 100.0
    );
    Ok(())
}
