//! The walk-through of `examples/clicks-to-delta`, runnable on a fresh machine:
//!
//! ```text
//! cargo run -p etlantic --example clicks_to_delta
//! ```
//!
//! It starts librdkafka's in-process mock cluster (set `KAFKA_BOOTSTRAP=host:port` to use
//! a real broker that has a `clicks` topic instead), produces three hours of clicks for
//! three campaigns plus one click two hours late, and runs the example pipeline — Kafka
//! `clicks` → 1-hour tumbling count per campaign, 1-hour watermark → Delta table
//! `out/clicks_per_hour` — on a copy of the project under `scratch/clicks-to-delta`, with
//! the profile's 30 s trigger shortened to 1 s. It stops after the stream has caught up
//! and prints the Delta table. Run it again: the query resumes from its checkpoint and
//! the table does not change (exactly-once).

use etlantic::plan::{plan, Project};
use etlantic_core::streaming::{Duration as Every, Trigger};
use etlantic_runtime::progress::QueryProgress;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::path::Path;
use std::time::Duration;

fn iso(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .expect("in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

const START: i64 = 1_796_025_600; // 2026-11-30T08:00:00Z

fn producer(bootstrap: &str) -> anyhow::Result<BaseProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?)
}

/// Three hours of clicks, one per campaign every 5 minutes.
fn produce_on_time(bootstrap: &str) -> anyhow::Result<()> {
    let p = producer(bootstrap)?;
    let start = START;
    let mut id = 0;
    for slot in 0..36 {
        for campaign in ["spring", "summer", "winter"] {
            let v = serde_json::json!({"event_id": id, "ts": iso(start + slot * 300), "campaign_id": campaign, "user_id": id % 7});
            p.send(
                BaseRecord::<str, str>::to("clicks")
                    .key(campaign)
                    .payload(&v.to_string()),
            )
            .map_err(|(e, _)| e)?;
            id += 1;
        }
    }
    p.flush(Duration::from_secs(10))?;
    Ok(())
}

/// A click of 08:30, two hours behind the newest one: its window closed long ago.
fn produce_late(bootstrap: &str) -> anyhow::Result<()> {
    let p = producer(bootstrap)?;
    let start = START;
    let late = serde_json::json!({"event_id": 9999, "ts": iso(start + 1800), "campaign_id": "spring", "user_id": 0});
    p.send(
        BaseRecord::<str, str>::to("clicks")
            .key("spring")
            .payload(&late.to_string()),
    )
    .map_err(|(e, _)| e)?;
    p.flush(Duration::from_secs(10))?;
    Ok(())
}

fn copy_project(from: &Path, to: &Path) -> anyhow::Result<()> {
    for f in [
        "pipeline.yaml",
        "profiles/local.yaml",
        "contracts/clicks.yaml",
        "contracts/clicks_per_hour.yaml",
    ] {
        std::fs::create_dir_all(to.join(f).parent().expect("has a parent"))?;
        std::fs::copy(from.join(f), to.join(f))?;
    }
    Ok(())
}

fn run(
    rt: &tokio::runtime::Runtime,
    plan: &etlantic::plan::PipelinePlan,
    work: &Path,
    batches: u64,
) -> anyhow::Result<()> {
    let ctx = etlantic::run::RunContext::for_plan(plan, work);
    let report = rt.block_on(etlantic::run::run_streaming(
        plan,
        &ctx,
        etlantic::run::StreamingRun {
            on_progress: Some(std::sync::Arc::new(|p: &QueryProgress| {
                let dropped: u64 = p
                    .state_operators
                    .iter()
                    .map(|o| o.num_rows_dropped_by_watermark)
                    .sum();
                println!(
                    "  batch {:>2}: {} rows in, {} late rows dropped, watermark {}",
                    p.batch_id,
                    p.num_input_rows,
                    dropped,
                    p.event_time.watermark.as_deref().unwrap_or("-")
                )
            })),
            stop: Default::default(),
            max_batches: Some(batches),
            metrics_addr: None,
            progress: None,
        },
    ));
    println!("run {}: {}", report.run_id, report.status);
    if !report.errors.is_empty() {
        for e in &report.errors {
            println!("  {e}");
        }
        anyhow::bail!("the run failed");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let work = root.join("scratch/clicks-to-delta");
    // The cluster must outlive the run.
    let mut cluster = None;
    let bootstrap = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(b) => b,
        Err(_) => {
            let c = MockCluster::new(1)?;
            c.create_topic("clicks", 2, 1)?;
            let b = c.bootstrap_servers();
            cluster = Some(c);
            // A new cluster is empty: start the project afresh too.
            let _ = std::fs::remove_dir_all(&work);
            // SAFETY: set before any other thread of this program reads the environment.
            unsafe { std::env::set_var("KAFKA_BOOTSTRAP", &b) };
            b
        }
    };
    if cluster.is_some() {
        produce_on_time(&bootstrap)?;
    }
    copy_project(&root.join("examples/clicks-to-delta"), &work)?;

    let mut project = Project::load(
        &work.join("pipeline.yaml"),
        Some(&work.join("profiles/local.yaml")),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    project.profile.trigger = Some(Trigger::ProcessingTime(Every::from_secs(1)));
    let plan = plan(&project)
        .into_result()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("plan {}", plan.fingerprint);

    let rt = tokio::runtime::Runtime::new()?;
    // First run: the data batch, then the no-data batch that the advanced watermark owes
    // (it emits the closed windows); then stop, as Ctrl-C would.
    run(&rt, &plan, &work, 2)?;
    if cluster.is_some() {
        // The late click, read by a restarted query (it resumes from its checkpoint).
        produce_late(&bootstrap)?;
        run(&rt, &plan, &work, 1)?;
    }
    let rows = rt.block_on(etlantic_sinks::delta::read_table(
        &work.join("out/clicks_per_hour"),
    ))?;
    println!("Delta table out/clicks_per_hour:");
    println!(
        "{}",
        arrow::util::pretty::pretty_format_batches(&rows).map_err(|e| anyhow::anyhow!("{e}"))?
    );
    Ok(())
}
