//! Nexmark join benchmark (issue 4): a time-bounded stream-stream join of bids and
//! auctions — every bid with the auction it is for, when the bid comes within 10 s of
//! the auction opening (`bid.date_time BETWEEN auction_time AND auction_time + 10 s`) —
//! on the embedded runtime, fed by the deterministic `nexmark://` generator (one shared
//! event sequence, 100 µs of event time per event: 46 bids and 3 auctions of every 50
//! events) with 2 s watermarks on both streams, available-now trigger, a foreach sink that
//! counts the rows.
//!
//! It reports throughput (input rows/s and generator events/s) and the join state over
//! time (rows and bytes per micro-batch, from the progress records). Once the watermarks
//! move, eviction keeps the state at about `(2 s + one batch of event time)` of bids and
//! `(12 s + one batch)` of auctions, so it must stay flat: the benchmark fails when the
//! state of the second half of the run grows by more than 10 %.
//!
//! Each run is a child process, so that its peak resident memory is its own. Run with
//! `cargo xtask bench join` or
//! `cargo bench -p etlantic --bench nexmark_join -- --events 20000000 --per-batch 200000`.

use etlantic::plan::{plan, Project};
use etlantic_core::ir::{Action, Expr, JoinTimeRange, JoinType, NamedExpr, TransformPlanBuilder};
use etlantic_core::model::{Pipeline, SinkDef, SourceDef, TransformBuilder};
use etlantic_core::profile::Profile;
use etlantic_core::streaming::{Duration, EventTime, ExecutionMode, OutputMode, Trigger};
use indexmap::IndexMap;
use serde_json::{json, Value};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn contract(id: &str, props: Value) -> Value {
    json!({"version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract", "id": id, "status": "active",
           "schema": [{"name": id, "logicalType": "object", "properties": props}]})
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn i64_col(name: &str) -> Value {
    json!({"name": name, "logicalType": "integer", "logicalTypeOptions": {"format": "i64"}})
}

fn ts_col(name: &str) -> Value {
    json!({"name": name, "logicalType": "timestamp"})
}

/// The pipeline: bids (left) join auctions (right, `date_time` renamed `auction_time`).
fn pipeline() -> Pipeline {
    let mut b = TransformPlanBuilder::new("bids_with_auctions")
        .input("bids", None)
        .input("auctions", None)
        .streaming_input("bids", Some("date_time"), Some("2 seconds"))
        .streaming_input("auctions", Some("date_time"), Some("2 seconds"))
        .from_input("auctions")
        .step(Action::RenameFields {
            mapping: IndexMap::from([("date_time".to_string(), "auction_time".to_string())]),
        });
    let renamed = b.current().expect("a step").to_string();
    b = b
        .from_input("bids")
        .step(Action::Join {
            right: renamed,
            join_type: JoinType::Inner,
            left_keys: vec!["auction".into()],
            right_keys: vec!["id".into()],
            predicate: None,
            null_safe: false,
            time_range: Some(JoinTimeRange {
                left: "date_time".into(),
                right: "auction_time".into(),
                lower: Duration::ZERO,
                upper: Duration::from_secs(10),
            }),
        })
        .step(Action::Project {
            fields: [
                "auction",
                "bidder",
                "price",
                "date_time",
                "seller",
                "category",
                "auction_time",
            ]
            .iter()
            .map(|c| NamedExpr {
                name: c.to_string(),
                expr: Expr::col(*c),
            })
            .collect(),
        })
        .output("result", None);
    let watermarked = |id: &str| SourceDef {
        event_time: Some(EventTime {
            column: "date_time".into(),
            timezone: "UTC".into(),
        }),
        watermark: Some(Duration::from_secs(2)),
        ..SourceDef::new(id, id)
    };
    Pipeline::builder("nexmark_join")
        .asset_inline(
            "bids",
            contract(
                "bids",
                json!([
                    i64_col("auction"),
                    i64_col("bidder"),
                    i64_col("price"),
                    ts_col("date_time")
                ]),
            ),
        )
        .asset_inline(
            "auctions",
            contract(
                "auctions",
                json!([
                    i64_col("id"),
                    i64_col("seller"),
                    i64_col("category"),
                    ts_col("date_time")
                ]),
            ),
        )
        .asset_inline(
            "joined",
            contract(
                "joined",
                json!([
                    i64_col("auction"),
                    i64_col("bidder"),
                    i64_col("price"),
                    ts_col("date_time"),
                    i64_col("seller"),
                    i64_col("category"),
                    ts_col("auction_time")
                ]),
            ),
        )
        .source_def(watermarked("bids"))
        .source_def(watermarked("auctions"))
        .transform(
            TransformBuilder::new("bids_with_auctions")
                .input("bids", "bids")
                .input("auctions", "auctions")
                .plan_inline(b.to_value()),
        )
        .sink_def(SinkDef {
            id: "out".into(),
            input: "bids_with_auctions".into(),
            asset: "joined".into(),
            output_mode: Some(OutputMode::Append),
            write_mode: None,
            keys: vec![],
        })
        .build()
}

/// One run: returns its summary and the per-micro-batch figures.
async fn stream(events: u64, per_batch: u64, work: &std::path::Path) -> Value {
    let sink_rows = Arc::new(AtomicU64::new(0));
    let counter = sink_rows.clone();
    etlantic_sinks::foreach::register(
        "nexmark_join_bench",
        Arc::new(move |b: etlantic_sinks::foreach::ForeachBatch<'_>| {
            counter.fetch_add(b.data.num_rows() as u64, Ordering::Relaxed);
            Ok(())
        }),
    );
    let mut profile = Profile::new("bench");
    profile.mode = ExecutionMode::Streaming;
    profile.trigger = Some(Trigger::AvailableNow);
    profile.checkpoint = Some(format!("file://{}", work.join("checkpoint").display()));
    profile.quarantine = Some(format!(
        "file://{}",
        work.join("quarantine.jsonl").display()
    ));
    for stream in ["bids", "auctions"] {
        profile.bindings.insert(
            stream.into(),
            format!("nexmark://{stream}?events_per_batch={per_batch}&max_events={events}"),
        );
    }
    profile
        .bindings
        .insert("joined".into(), "foreach://nexmark_join_bench".into());
    let project = Project::from_parts(work, pipeline(), profile);
    let p = plan(&project)
        .into_result()
        .expect("the benchmark pipeline plans");
    let records: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = records.clone();
    let ctx = etlantic::run::RunContext::for_plan(&p, work);
    let started = Instant::now();
    let report = etlantic::run::run_streaming(
        &p,
        &ctx,
        etlantic::run::StreamingRun {
            on_progress: Some(Arc::new(
                move |p: &etlantic_runtime::progress::QueryProgress| {
                    sink.lock().expect("progress").push(p.to_json())
                },
            )),
            stop: Default::default(),
            max_batches: None,
            metrics_addr: None,
            progress: None,
        },
    )
    .await;
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(report.status, "succeeded", "{:?}", report.errors);
    let records = records.lock().expect("progress").clone();
    let batches: Vec<Value> = records
        .iter()
        .map(|r| {
            let op = &r["stateOperators"][0];
            json!({
                "batch": r["batchId"], "kind": r["kind"], "input": r["numInputRows"],
                "output": r["sink"]["numOutputRows"], "ms": r["batchDuration"],
                "state_rows": op["numRowsTotal"], "state_bytes": op["memoryUsedBytes"],
                "removed": op["numRowsRemoved"], "watermark": r["eventTime"]["watermark"],
            })
        })
        .collect();
    let input: u64 = batches.iter().filter_map(|b| b["input"].as_u64()).sum();
    json!({
        "seconds": secs, "events": events, "input_rows": input,
        "output_rows": sink_rows.load(Ordering::Relaxed),
        "peak_rss_mb": peak_rss_mb(), "batches": batches,
    })
}

fn child(events: u64, per_batch: u64) {
    let work = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let v = rt.block_on(stream(events, per_batch, work.path()));
    println!("{v}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let events: u64 = arg("--events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000_000);
    let per_batch: u64 = arg("--per-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    if args.iter().any(|a| a == "--child") {
        child(events, per_batch);
        return;
    }
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(1);
    let exe = std::env::current_exe().expect("exe");
    let mut results: Vec<Value> = Vec::new();
    for _ in 0..runs {
        let out = Command::new(&exe)
            .args([
                "--child",
                "--events",
                &events.to_string(),
                "--per-batch",
                &per_batch.to_string(),
            ])
            .output()
            .expect("child runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        results.push(
            serde_json::from_str(line.lines().last().unwrap_or("{}")).expect("child prints JSON"),
        );
    }
    let mut secs: Vec<f64> = results
        .iter()
        .filter_map(|r| r["seconds"].as_f64())
        .collect();
    secs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let median = secs[secs.len() / 2];
    let r = &results[0];
    let input = r["input_rows"].as_u64().unwrap_or(0);
    println!(
        "nexmark join: {events} generator events ({input} bids and auctions), {per_batch} events per micro-batch, median of {runs} run(s)"
    );
    println!(
        "  {:>10.0} input rows/s  {:>10.0} events/s  {:>7.3} s  peak {:>6.0} MB  {} joined rows",
        input as f64 / median,
        events as f64 / median,
        median,
        r["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
        r["output_rows"]
    );
    // State over time, after each no-data micro-batch (eviction by the watermark the
    // data micro-batch before it moved).
    let evicted: Vec<&Value> = r["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .filter(|b| b["kind"] == "no_data")
        .collect();
    println!("  state after each no-data micro-batch (eviction by the new watermark):");
    println!(
        "    {:>6} {:>26} {:>10} {:>12}",
        "batch", "watermark", "rows", "bytes"
    );
    let step = (evicted.len() / 12).max(1);
    for b in evicted.iter().step_by(step) {
        println!(
            "    {:>6} {:>26} {:>10} {:>12}",
            b["batch"],
            b["watermark"].as_str().unwrap_or("-"),
            b["state_rows"],
            b["state_bytes"]
        );
    }
    let half = &evicted[evicted.len() / 2..];
    let rows: Vec<f64> = half
        .iter()
        .filter_map(|b| b["state_rows"].as_f64())
        .collect();
    let (lo, hi) = rows
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    let growth = if lo > 0.0 { hi / lo - 1.0 } else { 0.0 };
    println!(
        "  second half: state rows between {lo:.0} and {hi:.0} ({:.1} % spread) — {}",
        growth * 100.0,
        if growth <= 0.10 { "flat" } else { "GROWING" }
    );
    println!(
        "{}",
        json!({"events": events, "per_batch": per_batch, "seconds": median, "input_rows_per_s": input as f64 / median,
               "events_per_s": events as f64 / median, "state_spread": growth, "runs": results})
    );
    assert!(
        growth <= 0.10,
        "the join state keeps growing once the watermarks move"
    );
}
