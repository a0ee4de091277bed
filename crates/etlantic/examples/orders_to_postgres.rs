//! The hybrid walk-through of `examples/orders-to-postgres-hybrid`, runnable on a machine
//! with the PostgreSQL server the profile names (`cargo xtask setup` starts one):
//!
//! ```text
//! cargo run -p etlantic --example orders_to_postgres
//! ```
//!
//! It starts librdkafka's in-process mock cluster (set `KAFKA_BOOTSTRAP=host:port` to use
//! a real broker that has an `orders` topic instead), produces six minutes of orders for
//! three regions plus a few bad ones, and runs the example pipeline — Kafka `orders` →
//! revenue per region in 1-minute windows on the streaming runtime → report columns
//! computed inside PostgreSQL → upsert into `public.revenue_report` — on a copy of the
//! project under `scratch/orders-to-postgres-hybrid`, with the trigger set to
//! `available_now`. Then it produces an order whose window has closed and runs the query
//! again: it resumes from its checkpoint, quarantines the late order and leaves the
//! table as it was. It prints the plan's regions, the table and the quarantine.

use etlantic::plan::{plan, Project};
use etlantic_core::streaming::Trigger;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sqlx::Connection;
use std::path::Path;
use std::time::Duration;

const START: i64 = 1_796_025_600; // 2026-11-30T08:00:00Z

fn iso(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .expect("in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One order per region every 10 s for 6 minutes (every 11th cancelled), an order with
/// a negative amount, one with an unknown status and one that is not JSON.
fn produce(bootstrap: &str) -> anyhow::Result<()> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let send = |payload: String, key: &str| {
        p.send(
            BaseRecord::<str, str>::to("orders")
                .key(key)
                .payload(&payload),
        )
        .map_err(|(e, _)| e)
    };
    let mut id = 0;
    for slot in 0..36 {
        for region in ["eu", "us", "apac"] {
            let amount = 5.0 + (id % 8) as f64 * 2.5;
            let status = if id % 11 == 10 { "cancelled" } else { "paid" };
            send(serde_json::json!({"order_id": id, "ts": iso(START + slot * 10), "region": region, "amount": amount, "status": status}).to_string(), region)?;
            id += 1;
        }
    }
    send(serde_json::json!({"order_id": 9001, "ts": iso(START + 200), "region": "eu", "amount": -3.0, "status": "paid"}).to_string(), "eu")?;
    send(serde_json::json!({"order_id": 9002, "ts": iso(START + 210), "region": "us", "amount": 7.5, "status": "lost"}).to_string(), "us")?;
    send(r#"{"order_id": 9003, "ts": "#.to_string(), "eu")?;
    p.flush(Duration::from_secs(10))?;
    Ok(())
}

/// An order of 08:00:05, produced after the first run: the watermark is 08:05:20 by
/// then, so its window [08:00, 08:01) has closed.
fn produce_late(bootstrap: &str) -> anyhow::Result<()> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let late = serde_json::json!({"order_id": 9004, "ts": iso(START + 5), "region": "eu", "amount": 12.5, "status": "paid"});
    p.send(
        BaseRecord::<str, str>::to("orders")
            .key("eu")
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
        "contracts/orders.yaml",
        "contracts/minute_revenue.yaml",
        "contracts/revenue_report.yaml",
    ] {
        std::fs::create_dir_all(to.join(f).parent().expect("has a parent"))?;
        std::fs::copy(from.join(f), to.join(f))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let work = root.join("scratch/orders-to-postgres-hybrid");
    let rt = tokio::runtime::Runtime::new()?;
    // The cluster must outlive the run.
    let mut cluster = None;
    if std::env::var("KAFKA_BOOTSTRAP").is_err() {
        let c = MockCluster::new(1)?;
        c.create_topic("orders", 2, 1)?;
        let b = c.bootstrap_servers();
        // A new cluster is empty: start the project and its table afresh too.
        let _ = std::fs::remove_dir_all(&work);
        rt.block_on(async {
            let mut pg =
                sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test").await?;
            sqlx::raw_sql("DROP TABLE IF EXISTS public.revenue_report; DROP TABLE IF EXISTS public._etlantic_sink_progress")
                .execute(&mut pg)
                .await
        })?;
        produce(&b)?;
        // SAFETY: set before any other thread of this program reads the environment.
        unsafe { std::env::set_var("KAFKA_BOOTSTRAP", &b) };
        cluster = Some(c);
    }
    copy_project(&root.join("examples/orders-to-postgres-hybrid"), &work)?;

    let mut project = Project::load(
        &work.join("pipeline.yaml"),
        Some(&work.join("profiles/local.yaml")),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    project.profile.trigger = Some(Trigger::AvailableNow);
    let plan = plan(&project)
        .into_result()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("plan {}", plan.fingerprint);
    for r in &plan.regions {
        println!(
            "  region {} ({:?} on {}{}): {}",
            r.id,
            r.kind,
            r.backend,
            r.location
                .as_deref()
                .map(|l| format!(" in {l}"))
                .unwrap_or_default(),
            r.steps.join(", ")
        );
    }
    for t in &plan.transitions {
        println!(
            "  {} → {}: {} ({})",
            t.from, t.to, t.relation, t.materialization
        );
    }

    let ctx = etlantic::run::RunContext::for_plan(&plan, &work);
    let run = || -> anyhow::Result<()> {
        let report = rt.block_on(etlantic::run::run_streaming(
            &plan,
            &ctx,
            etlantic::run::StreamingRun::default(),
        ));
        println!(
            "run {}: {}, {} quarantined",
            report.run_id, report.status, report.quarantined
        );
        for e in &report.errors {
            println!("  {e}");
        }
        if !report.errors.is_empty() {
            anyhow::bail!("the run failed");
        }
        Ok(())
    };
    run()?;
    if cluster.is_some() {
        // A late order, read by a restarted query (it resumes from its checkpoint).
        produce_late(&std::env::var("KAFKA_BOOTSTRAP")?)?;
        run()?;
    }
    let rows: Vec<(String, String, i64, f64, f64, String)> = rt.block_on(async {
        let mut pg = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test").await?;
        sqlx::query_as("SELECT CAST(window_start AS TEXT), region, orders, revenue, avg_order, tier FROM public.revenue_report ORDER BY 1, 2")
            .fetch_all(&mut pg)
            .await
    })?;
    println!("public.revenue_report:");
    println!("  window_start                 region  orders  revenue  avg_order  tier");
    for (start, region, n, revenue, avg, tier) in rows {
        println!("  {start:<28} {region:<7} {n:>6} {revenue:>8.2} {avg:>10.3}  {tier}");
    }
    println!("quarantine (out/quarantine.jsonl):");
    for q in etlantic_runtime::quarantine::read_quarantine(work.join("out/quarantine.jsonl"))
        .unwrap_or_default()
    {
        println!("  {} {} at {}", q["code"], q["reason"], q["position"]);
    }
    drop(cluster);
    Ok(())
}
