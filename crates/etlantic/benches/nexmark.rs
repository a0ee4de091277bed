//! Nexmark on the streaming runtime against the same queries as DataFusion batch queries.
//!
//! For every query of `etlantic_testkit::nexmark::QUERIES`: the pipeline runs on the
//! streaming runtime (`available_now`, `--per-batch` generator events per micro-batch)
//! over `--events` generator events, its sink counting rows; then the query's reference
//! SQL runs in DataFusion over the same events, generated into memory first (generation
//! is timed on both sides). Throughput is generator events per CPU-second of this
//! process (`/proc/self/stat`: user + system time of every thread), so it reads as
//! events/s per core on a shared machine; the stream/batch ratio compares the two in
//! one run.
//!
//! `cargo xtask bench nexmark --events N` runs it; `--markdown FILE` writes the table.

use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use etlantic_core::plugin::{ReadLimit, Source, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_plan::Project;
use etlantic_sources::nexmark::NexmarkSource;
use etlantic_testkit::nexmark::{profile, Query, QUERIES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line: 12 and 13 after `) state`.
    (ticks(11) + ticks(12)) / 100.0
}

struct Measure {
    rows: u64,
    wall: f64,
    cpu: f64,
}

fn measure<T>(f: impl FnOnce() -> (u64, T)) -> Measure {
    let (c0, w0) = (cpu_seconds(), Instant::now());
    let (rows, _) = f();
    Measure {
        rows,
        wall: w0.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - c0,
    }
}

fn stream(rt: &tokio::runtime::Runtime, q: &Query, events: u64, per_batch: u64) -> Measure {
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = format!("nexmark_bench_{}", q.name);
    let rows = Arc::new(AtomicU64::new(0));
    let counter = rows.clone();
    etlantic_sinks::foreach::register(
        &name,
        Arc::new(move |b: etlantic_sinks::foreach::ForeachBatch<'_>| {
            counter.fetch_add(b.data.num_rows() as u64, Ordering::Relaxed);
            Ok(())
        }),
    );
    std::fs::write(dir.path().join("pipeline.yaml"), q.pipeline).expect("write");
    std::fs::write(
        dir.path().join("profile.yaml"),
        profile(q, events, per_batch, &format!("foreach://{name}")),
    )
    .expect("write");
    let project = Project::load(
        &dir.path().join("pipeline.yaml"),
        Some(&dir.path().join("profile.yaml")),
    )
    .expect("the query loads");
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the query plans");
    let ctx = etlantic::run::RunContext::for_plan(&plan, dir.path());
    measure(|| {
        let report = rt.block_on(etlantic::run::run_streaming(
            &plan,
            &ctx,
            etlantic::run::StreamingRun::default(),
        ));
        assert_eq!(report.status, "succeeded", "{:?}", report.errors);
        (rows.load(Ordering::Relaxed), ())
    })
}

fn batch(rt: &tokio::runtime::Runtime, q: &Query, events: u64) -> Measure {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("pipeline.yaml"), q.pipeline).expect("write");
    std::fs::write(
        dir.path().join("profile.yaml"),
        profile(q, events, events, "memory://unused"),
    )
    .expect("write");
    let project = Project::load(
        &dir.path().join("pipeline.yaml"),
        Some(&dir.path().join("profile.yaml")),
    )
    .expect("the query loads");
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the query plans");
    measure(|| {
        rt.block_on(async {
            let ctx = SessionContext::new();
            for s in &plan.sources {
                let schema = plan
                    .asset_contract(&s.asset)
                    .expect("a contract")
                    .arrow_schema();
                let uri = format!(
                    "nexmark://{}?events_per_batch={events}&max_events={events}&start_ms=0",
                    s.asset
                );
                let mut src = NexmarkSource::new(SourceContext {
                    asset: s.asset.clone(),
                    uri: BindingUri::parse(&uri).expect("a URI"),
                    schema: schema.clone(),
                    contract: None,
                    root: dir.path().into(),
                    mode: ExecutionMode::Streaming,
                    state_dir: None,
                })
                .expect("the generator");
                let end = src
                    .latest_offset(None, &ReadLimit::unlimited())
                    .await
                    .expect("an offset")
                    .expect("events");
                let batches = src.read(None, &end).await.expect("events").batches;
                let table = datafusion::datasource::MemTable::try_new(schema, vec![batches])
                    .expect("a table");
                ctx.register_table(s.asset.as_str(), Arc::new(table))
                    .expect("registered");
            }
            let out: Vec<RecordBatch> = ctx
                .sql(q.reference_sql)
                .await
                .expect("the reference SQL")
                .collect()
                .await
                .expect("runs");
            (out.iter().map(|b| b.num_rows() as u64).sum(), ())
        })
    })
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let events: u64 = arg(&args, "--events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let per_batch: u64 = arg(&args, "--per-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut table = format!(
        "Nexmark, {events} generator events, {per_batch} per micro-batch; events per CPU-second of the process (≈ per core), one run.\n\n| query | output rows | stream events/s/core | batch events/s/core | stream/batch | stream wall s |\n|---|---|---|---|---|---|\n"
    );
    for q in QUERIES {
        let s = stream(&rt, q, events, per_batch);
        let b = batch(&rt, q, events);
        assert_eq!(s.rows, b.rows, "{}: stream and batch disagree", q.name);
        let rate = |m: &Measure| events as f64 / m.cpu.max(1e-3);
        let line = format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
            q.name,
            s.rows,
            rate(&s),
            rate(&b),
            rate(&s) / rate(&b),
            s.wall
        );
        print!("{line}");
        table.push_str(&line);
    }
    println!("\n{table}");
    if let Some(path) = arg(&args, "--markdown") {
        std::fs::write(
            &path,
            format!("# Nexmark results\n\nProduced by `cargo xtask bench nexmark`.\n\n{table}"),
        )
        .expect("the results file is writable");
    }
}
