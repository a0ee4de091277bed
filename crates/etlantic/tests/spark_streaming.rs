//! A streaming pipeline placed on Spark by the profile (`engines:` + `endpoints:`), run
//! end to end through the real `etlantic` binary against a local Spark Connect server:
//! it becomes one Structured Streaming query that reads the JSON-lines directory and
//! writes the file sink itself, and writes the same windows as the embedded runtime.
//! A malformed record stops it with `ETL705` (Spark's `FAILFAST`: nothing is silently
//! dropped), and the planner refuses what Spark cannot do (`ETL507`): part of the
//! query on Spark, `on_error: quarantine`, a late-event policy other than `drop`.

mod common;
use common::crash::{canonical_window as canonical, click, describe, window, CLICKS, COUNTS};

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: click_counts
assets:
  clicks:
    contract: contracts/clicks.yaml
  counts:
    contract: contracts/counts.yaml
sources:
  - id: clicks
    asset: clicks
    event_time: {column: ts}
    watermark: 10 seconds
    read_limit: {max_files: 1}
transforms:
  - id: per_minute
    inputs:
      clicks: clicks
    steps:
      - filter: "campaign != 'internal'"
      - window_aggregate:
          window: {type: tumbling, column: ts, size: 1 minute}
          group_by: [campaign]
          aggregates: {n: "count_all()"}
sinks:
  - id: write_counts
    input: per_minute
    asset: counts
    output_mode: append
"#;

const PROFILE: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: file://chk
on_error: fail
bindings:
  clicks: file://in?format=jsonl
  counts: file://out/counts/?format=jsonl
"#;

/// Six files, one per micro-batch; file 3's 00:30 click is behind the watermark and
/// dropped, and an `internal` click is filtered out.
fn input_files() -> Vec<Vec<String>> {
    vec![
        vec![
            click("00:10", "c1", "u1"),
            click("00:20", "c2", "u2"),
            click("00:50", "c1", "u3"),
        ],
        vec![click("01:05", "c1", "u1"), click("01:15", "c2", "u4")],
        vec![click("01:30", "c1", "u5"), click("01:40", "internal", "u9")],
        vec![
            click("02:20", "c2", "u1"),
            click("02:40", "c3", "u2"),
            click("00:30", "c1", "u6"),
        ],
        vec![click("03:10", "c3", "u3")],
        vec![click("05:00", "c1", "u4")],
    ]
}

fn project(dir: &Path, profile_extra: &str, files: &[Vec<String>]) {
    for (path, text) in [
        ("pipeline.yaml", PIPELINE.to_string()),
        ("profiles/local.yaml", format!("{PROFILE}{profile_extra}")),
        ("contracts/clicks.yaml", CLICKS.to_string()),
        ("contracts/counts.yaml", COUNTS.to_string()),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    std::fs::create_dir_all(dir.join("in")).unwrap();
    // Spark takes new files in modification-time order, ETLantic's file source in name
    // order: the files are written in order, a second apart, as a producer would.
    let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
    for (i, lines) in files.iter().enumerate() {
        let path = dir.join(format!("in/{i:03}.jsonl"));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t0 + std::time::Duration::from_secs(i as u64))
            .unwrap();
    }
}

fn etlantic(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

fn on_spark(url: &str) -> String {
    format!("engines:\n  per_minute: spark\nendpoints:\n  spark: {url}\n")
}

/// The rows the embedded runtime committed (its `_etlantic_sink` log).
fn embedded_rows(dir: &Path) -> Vec<String> {
    rows_of(&etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap())
}

/// Arrow batches as a sorted multiset of canonical rows.
fn rows_of(batches: &[arrow::array::RecordBatch]) -> Vec<String> {
    let mut rows: Vec<String> = common::json_rows(batches)
        .iter()
        .map(|v| canonical(&v.to_string()))
        .collect();
    rows.sort();
    rows
}

/// The rows Spark's file sink committed: the files its `_spark_metadata` log lists
/// (`v1`, then one JSON entry per file), never a file it did not commit.
fn spark_rows(dir: &Path) -> Vec<String> {
    let log = dir.join("out/counts/_spark_metadata");
    let mut rows = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&log)
        .unwrap_or_else(|e| panic!("no Spark sink log at {}: {e}", log.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".crc"))
        .collect();
    entries.sort();
    for entry in entries {
        let text = std::fs::read_to_string(&entry).unwrap();
        for line in text.lines().skip(1) {
            let e: Value = serde_json::from_str(line).unwrap();
            let path = e["path"].as_str().unwrap().trim_start_matches("file:");
            let data = std::fs::read_to_string(path).unwrap();
            rows.extend(data.lines().map(canonical));
        }
    }
    rows.sort();
    rows
}

#[test]
fn a_streaming_pipeline_on_spark_writes_what_the_embedded_runtime_writes() {
    let server = etlantic_spark_compat::local::LocalSparkConnect::start()
        .expect("a local Spark Connect server (`cargo xtask setup` installs pyspark)");
    let files = input_files();

    let embedded = tempfile::tempdir().unwrap();
    project(embedded.path(), "", &files);
    let o = etlantic(
        embedded.path(),
        &["run", "pipeline.yaml", "--format", "json"],
    );
    assert!(o.status.success(), "{}", describe(&o));
    let expected = embedded_rows(embedded.path());
    let mut windows = vec![
        window("00:00", "01:00", "c1", 2),
        window("00:00", "01:00", "c2", 1),
        window("01:00", "02:00", "c1", 2),
        window("01:00", "02:00", "c2", 1),
        window("02:00", "03:00", "c2", 1),
        window("02:00", "03:00", "c3", 1),
        window("03:00", "04:00", "c3", 1),
    ];
    windows.sort();
    assert_eq!(expected, windows, "the embedded run itself is right");

    let spark = tempfile::tempdir().unwrap();
    project(spark.path(), &on_spark(&server.url()), &files);
    let o = etlantic(spark.path(), &["explain", "pipeline.yaml"]);
    assert!(o.status.success(), "{}", describe(&o));
    let explain = String::from_utf8_lossy(&o.stdout);
    let region = format!(
        "r0 (Streaming on spark in {}): reads [clicks], hands on [per_minute]",
        server.url()
    );
    assert!(explain.contains(&region), "{explain}");

    let o = etlantic(spark.path(), &["run", "pipeline.yaml", "--format", "json"]);
    assert!(o.status.success(), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["status"], "succeeded", "{report}");
    // Spark's count, by the pipeline's source id: it pushes the filter into its JSON
    // reader, so the `internal` click is not counted as input (12 clicks, 11 rows).
    assert_eq!(
        report["sources"][0],
        json!({"id": "clicks", "rows": 11, "rejected": 0}),
        "{report}"
    );
    // Spark's file sink does not count what it writes; the report says so.
    assert_eq!(report["sinks"][0]["rows_unknown"], true, "{report}");
    assert_eq!(spark_rows(spark.path()), expected);
    // Read back through Spark, as Arrow.
    let utc = || {
        arrow::datatypes::DataType::Timestamp(
            arrow::datatypes::TimeUnit::Microsecond,
            Some("UTC".into()),
        )
    };
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("window_start", utc(), true),
        arrow::datatypes::Field::new("window_end", utc(), true),
        arrow::datatypes::Field::new("campaign", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("n", arrow::datatypes::DataType::Int64, true),
    ]));
    let read = etlantic_spark_compat::streaming::read_file_sink(
        &server.url(),
        "file://out/counts/?format=jsonl",
        spark.path(),
        &schema,
    )
    .unwrap();
    assert_eq!(rows_of(&read), expected);
    assert!(
        spark.path().join("chk/offsets").is_dir(),
        "Spark's checkpoint is where the profile says"
    );
    // Spark's progress, as ETLantic's records, next to it.
    let progress = std::fs::read_to_string(spark.path().join("chk/progress.jsonl")).unwrap();
    let records: Vec<Value> = progress
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        records.iter().all(|r| r["backend"] == "spark"),
        "{progress}"
    );
    let data = records.iter().filter(|r| r["kind"] == "data").count();
    assert_eq!(data, 6, "one data micro-batch per file: {progress}");
    // `etlantic status` knows a query Spark ran, as one the runtime drives.
    let o = etlantic(spark.path(), &["status", "chk", "--format", "json"]);
    assert!(o.status.success(), "{}", describe(&o));
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(status["state"], "stopped", "{status}");
    assert_eq!(status["reason"], "the spark query finished", "{status}");
    assert_eq!(status["runId"], report["run_id"], "{status}");
    assert_eq!(status["queryId"], records.last().unwrap()["id"], "{status}");
    let last = records.last().unwrap();
    assert_eq!(
        last["eventTime"]["watermark"], "2024-01-01T00:04:50.000Z",
        "the last watermark: the latest click (05:00) minus 10 s: {progress}"
    );

    // A second run of the finished query reads nothing new and writes nothing twice.
    let o = etlantic(spark.path(), &["run", "pipeline.yaml", "--format", "json"]);
    assert!(o.status.success(), "{}", describe(&o));
    assert_eq!(spark_rows(spark.path()), expected);

    // A processing-time trigger stopped after two micro-batches (`--max-batches`), then
    // resumed from Spark's checkpoint to the end: the same output.
    let paced = tempfile::tempdir().unwrap();
    project(paced.path(), &on_spark(&server.url()), &files);
    let profile = std::fs::read_to_string(paced.path().join("profiles/local.yaml")).unwrap();
    std::fs::write(
        paced.path().join("profiles/local.yaml"),
        profile.replace(
            "trigger: available_now",
            "trigger: processing_time 3 seconds",
        ),
    )
    .unwrap();
    let o = etlantic(
        paced.path(),
        &[
            "run",
            "pipeline.yaml",
            "--format",
            "json",
            "--max-batches",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["sources"][0]["rows"], 5, "files 0 and 1: {report}");
    assert!(
        !paced.path().join("out/counts/_spark_metadata/2").exists(),
        "the query stopped after two micro-batches"
    );
    std::fs::write(paced.path().join("profiles/local.yaml"), profile).unwrap();
    let o = etlantic(paced.path(), &["run", "pipeline.yaml", "--format", "json"]);
    assert!(o.status.success(), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        report["sources"][0]["rows"], 6,
        "the other four files: {report}"
    );
    assert_eq!(spark_rows(paced.path()), expected);
}

#[test]
fn a_malformed_record_stops_a_spark_streaming_query() {
    let server = etlantic_spark_compat::local::LocalSparkConnect::start()
        .expect("a local Spark Connect server (`cargo xtask setup` installs pyspark)");
    let mut files = input_files();
    files[1].push("{not json".into());
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), &on_spark(&server.url()), &files);
    let o = etlantic(dir.path(), &["run", "pipeline.yaml", "--format", "json"]);
    assert!(!o.status.success(), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["status"], "failed", "{report}");
    assert_eq!(report["errors"][0]["code"], "ETL705", "{report}");
    let message = report["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("in/001.jsonl"),
        "names the file: {message}"
    );
    assert!(
        !dir.path().join("out/counts/_spark_metadata/1").exists(),
        "nothing of the bad file's batch is committed"
    );
    let o = etlantic(dir.path(), &["status", "chk", "--format", "json"]);
    assert_eq!(o.status.code(), Some(4), "{}", describe(&o));
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
}

/// Planning only: the endpoint is never contacted.
fn plan_errors(profile_extra: &str, pipeline: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), profile_extra, &[]);
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    let o = etlantic(dir.path(), &["plan", "pipeline.yaml", "--format", "json"]);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn the_planner_refuses_what_a_streaming_query_on_spark_cannot_do() {
    let spark = on_spark("sc://127.0.0.1:1");
    // Part of the query on Spark, part on the embedded runtime.
    let two_steps = PIPELINE.replace(
        "sinks:",
        "  - id: big\n    inputs: {counts: per_minute}\n    steps:\n      - filter: \"n > 1\"\nsinks:",
    )
    .replace("    input: per_minute", "    input: big");
    let text = plan_errors(&spark, &two_steps);
    assert!(text.contains("ETL507"), "{text}");
    assert!(text.contains("`big` runs on `datafusion`"), "{text}");

    // Quarantine of bad records.
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), &spark, &[]);
    let o = etlantic(dir.path(), &["plan", "pipeline.yaml", "--format", "json"]);
    assert!(
        o.status.success(),
        "the whole query on Spark with on_error: fail plans: {}",
        describe(&o)
    );
    let quarantine = format!("{spark}quarantine: file://out/q.jsonl\n");
    let profile = PROFILE.replace("on_error: fail\n", "");
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), &quarantine, &[]);
    std::fs::write(
        dir.path().join("profiles/local.yaml"),
        format!("{profile}{quarantine}"),
    )
    .unwrap();
    let o = etlantic(dir.path(), &["plan", "pipeline.yaml", "--format", "json"]);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains("ETL507") && text.contains("on_error: fail"),
        "{text}"
    );

    // A late-event policy Spark does not apply.
    let late = PIPELINE.replace(
        "    read_limit: {max_files: 1}",
        "    read_limit: {max_files: 1}\n    late_events: {policy: accept}",
    );
    let text = plan_errors(&spark, &late);
    assert!(
        text.contains("ETL507") && text.contains("`accept`"),
        "{text}"
    );

    // Allowed lateness: Spark closes a window when the watermark passes its end.
    let lateness = PIPELINE.replace(
        "size: 1 minute}",
        "size: 1 minute, allowed_lateness: 30 seconds}",
    );
    let text = plan_errors(&spark, &lateness);
    assert!(
        text.contains("ETL501") && text.contains("allows 30 seconds of lateness"),
        "{text}"
    );
}
