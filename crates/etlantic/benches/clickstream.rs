//! Clickstream benchmark (issue 3): 1-minute tumbling count per campaign with a 1-minute
//! watermark over the click events of `shared/bench/gen_clicks.py` (Parquet), run
//!
//! - as an ETLantic stream: directory source, available-now trigger, one file per
//!   micro-batch (like the Spark baseline), Parquet file sink, checkpointed;
//! - as a DataFusion batch query on the same files (`date_bin` + `GROUP BY`, written to
//!   Parquet), with DataFusion's default parallelism.
//!
//! Each measurement runs in its own child process so that its peak resident memory is
//! its own. Run with `cargo xtask bench clicks` (which generates the data first) or
//! `cargo bench -p etlantic --bench clickstream -- --data <dir with parquet/>`.

use etlantic::plan::{plan, Project};
use etlantic_core::model::{Pipeline, SinkDef, SourceDef, TransformBuilder};
use etlantic_core::plugin::ReadLimit;
use etlantic_core::profile::Profile;
use etlantic_core::streaming::{
    Duration, EventTime, ExecutionMode, LatePolicy, OutputMode, Trigger,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn contract(id: &str, props: serde_json::Value) -> serde_json::Value {
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

fn count_events(data: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(data).expect("data dir") {
        let p = e.expect("entry").path();
        if p.extension().and_then(|x| x.to_str()) == Some("parquet") {
            let f = std::fs::File::open(&p).expect("open");
            let r = parquet::file::reader::SerializedFileReader::new(f).expect("parquet");
            use parquet::file::reader::FileReader;
            n += r.metadata().file_metadata().num_rows() as u64;
        }
    }
    n
}

/// Runs the stream; returns (output rows, input rows read and quarantined, seconds spent
/// planning: validating the contracts and the pipeline).
async fn stream(data: &Path, work: &Path, max_files: usize) -> (u64, u64, f64) {
    let planning = Instant::now();
    let pipeline = Pipeline::builder("clickstream")
        .asset_inline(
            "clicks",
            contract(
                "clicks",
                json!([
                    {"name": "event_id", "logicalType": "integer"},
                    {"name": "ts", "logicalType": "timestamp", "required": true},
                    {"name": "campaign_id", "logicalType": "string"},
                    {"name": "user_id", "logicalType": "integer"},
                    {"name": "price", "logicalType": "number"},
                ]),
            ),
        )
        .asset_inline(
            "counts",
            contract(
                "counts",
                json!([
                    {"name": "window_start", "logicalType": "timestamp"},
                    {"name": "window_end", "logicalType": "timestamp"},
                    {"name": "campaign_id", "logicalType": "string"},
                    {"name": "clicks", "logicalType": "integer"},
                ]),
            ),
        )
        .source_def(SourceDef {
            id: "clicks".into(),
            asset: "clicks".into(),
            event_time: Some(EventTime { column: "ts".into(), timezone: "UTC".into() }),
            watermark: Some(Duration::from_secs(60)),
            late_events: LatePolicy::Drop,
            read_limit: Some(ReadLimit { max_files: Some(max_files), max_records: None }),
            static_refresh: None,
        })
        .transform(
            TransformBuilder::new("per_minute")
                .input("clicks", "clicks")
                .step_yaml("window_aggregate: {window: {type: tumbling, column: ts, size: 1 minute}, group_by: [campaign_id], aggregates: {clicks: \"count_all()\"}}")
                .expect("step"),
        )
        .sink_def(SinkDef {
            id: "out".into(),
            input: "per_minute".into(),
            asset: "counts".into(),
            output_mode: Some(OutputMode::Append),
            write_mode: None,
            keys: vec![],
        })
        .build();
    let mut profile = Profile::new("bench");
    profile.mode = ExecutionMode::Streaming;
    profile.trigger = Some(Trigger::AvailableNow);
    profile.checkpoint = Some(format!("file://{}", work.join("checkpoint").display()));
    profile.quarantine = Some(format!(
        "file://{}",
        work.join("quarantine.jsonl").display()
    ));
    profile.bindings.insert(
        "clicks".into(),
        format!("file://{}?format=parquet", data.display()),
    );
    profile.bindings.insert(
        "counts".into(),
        format!("file://{}?format=parquet", work.join("out").display()),
    );
    let project = Project::from_parts(work, pipeline, profile);
    let p = plan(&project)
        .into_result()
        .expect("the benchmark pipeline plans");
    let plan_seconds = planning.elapsed().as_secs_f64();
    let ctx = etlantic::run::RunContext::for_plan(&p, work);
    let report = etlantic::run::run_streaming(
        &p,
        &ctx,
        etlantic::run::StreamingRun {
            // `--progress` prints each micro-batch's durations (where the time goes).
            on_progress: std::env::args().any(|a| a == "--progress").then(|| {
                let print: etlantic_datafusion::streaming::ProgressListener =
                    std::sync::Arc::new(|p: &serde_json::Value| {
                        eprintln!("batch {} {}", p["batchId"], p["durationMs"])
                    });
                print
            }),
            stop: Default::default(),
            max_batches: None,
        },
    )
    .await;
    assert_eq!(report.status, "succeeded", "{:?}", report.errors);
    let input = report.sources.iter().map(|s| s.rows + s.rejected).sum();
    let output = etlantic_sinks::files::read_committed(work.join("out"))
        .expect("output")
        .iter()
        .map(|b| b.num_rows() as u64)
        .sum();
    (output, input, plan_seconds)
}

/// Runs the batch query; returns (output rows, input rows).
async fn batch(data: &Path, work: &Path, events: u64) -> (u64, u64) {
    use datafusion::prelude::*;
    let ctx = SessionContext::new();
    ctx.register_parquet(
        "clicks",
        data.to_str().expect("utf-8 path"),
        ParquetReadOptions::default(),
    )
    .await
    .expect("register");
    let out = work.join("batch.parquet");
    let sql = format!(
        "COPY (SELECT date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS window_start, \
                      date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') + INTERVAL '1 minute' AS window_end, \
                      campaign_id, count(*) AS clicks \
               FROM clicks GROUP BY 1, 2, 3) TO '{}' STORED AS PARQUET",
        out.display()
    );
    let rows = ctx
        .sql(&sql)
        .await
        .expect("sql")
        .collect()
        .await
        .expect("copy");
    let written = rows[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .map(|a| a.value(0))
        .unwrap_or(0);
    (written, events)
}

fn child(mode: &str, data: &Path, max_files: usize) {
    let events = count_events(data);
    let work = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let (out_rows, in_rows, plan_seconds) = match mode {
        "stream" => rt.block_on(stream(data, work.path(), max_files)),
        "batch" => {
            let (out, input) = rt.block_on(batch(data, work.path(), events));
            (out, input, 0.0)
        }
        other => panic!("unknown mode {other}"),
    };
    let secs = started.elapsed().as_secs_f64();
    // A misconfigured run (e.g. a path that reads nothing) must not report a figure.
    assert_eq!(in_rows, events, "{mode}: read {in_rows} of {events} events");
    println!(
        "{}",
        json!({"mode": mode, "seconds": secs, "plan_seconds": plan_seconds, "output_rows": out_rows, "peak_rss_mb": peak_rss_mb()})
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let data = PathBuf::from(arg("--data").unwrap_or_else(|| "scratch/bench/parquet".into()));
    let data = if data.join("parquet").is_dir() {
        data.join("parquet")
    } else {
        data
    };
    // The stream's project root is a temporary directory: bind the data absolutely.
    let data = data.canonicalize().unwrap_or(data);
    let max_files: usize = arg("--max-files").and_then(|v| v.parse().ok()).unwrap_or(1);
    if let Some(mode) = arg("--child") {
        child(&mode, &data, max_files);
        return;
    }
    if !data.is_dir() {
        eprintln!(
            "no benchmark data at {} (run `cargo xtask bench clicks`)",
            data.display()
        );
        std::process::exit(2);
    }
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(3);
    let events = count_events(&data);
    let exe = std::env::current_exe().expect("exe");
    let mut results: Vec<serde_json::Value> = Vec::new();
    for _ in 0..runs {
        for mode in ["batch", "stream"] {
            let out = Command::new(&exe)
                .args([
                    "--child",
                    mode,
                    "--data",
                    data.to_str().expect("utf-8"),
                    "--max-files",
                    &max_files.to_string(),
                ])
                .output()
                .expect("child runs");
            assert!(
                out.status.success(),
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or("{}"))
                .expect("child prints JSON");
            results.push(v);
        }
    }
    let median = |mode: &str, key: &str| {
        let mut xs: Vec<f64> = results
            .iter()
            .filter(|r| r["mode"] == mode)
            .filter_map(|r| r[key].as_f64())
            .collect();
        xs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        xs[xs.len() / 2]
    };
    let (bs, ss) = (median("batch", "seconds"), median("stream", "seconds"));
    let (bm, sm) = (
        median("batch", "peak_rss_mb"),
        median("stream", "peak_rss_mb"),
    );
    let rows = |mode: &str| {
        results
            .iter()
            .find(|r| r["mode"] == mode)
            .and_then(|r| r["output_rows"].as_u64())
            .unwrap_or(0)
    };
    println!(
        "clickstream: {events} events, {} files per micro-batch, median of {runs} runs",
        max_files
    );
    println!(
        "  batch  (DataFusion SQL): {:>10.0} events/s  {:>7.3} s  peak {:>6.0} MB  {} windows",
        events as f64 / bs,
        bs,
        bm,
        rows("batch")
    );
    println!(
        "  stream (ETLantic):       {:>10.0} events/s  {:>7.3} s  peak {:>6.0} MB  {} windows",
        events as f64 / ss,
        ss,
        sm,
        rows("stream")
    );
    println!("  stream/batch throughput ratio: {:.2}", bs / ss);
    // Planning (contract and pipeline validation) is a fixed cost per query start, not a
    // cost per event: shown apart, never subtracted from the ratio above.
    let sp = median("stream", "plan_seconds");
    println!(
        "  of the stream's time, planning and contract validation: {:.3} s (ratio without it: {:.2})",
        sp,
        bs / (ss - sp)
    );
    println!(
        "{}",
        json!({"events": events, "batch": {"seconds": bs, "peak_rss_mb": bm}, "stream": {"seconds": ss, "peak_rss_mb": sm}, "ratio": bs / ss, "runs": results})
    );
}
