//! The crash-and-restart fixtures shared by the `*_recovery` tests: the click-events
//! input (one JSON-lines file per micro-batch), its contracts, and running the real
//! `etlantic` binary with or without a fail point (`ETLANTIC_FAIL_POINT=<point>:<batch>`
//! makes it `abort()` there).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

pub const CLICKS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "clicks"
name: "clicks"
status: "active"
schema:
  - name: "clicks"
    logicalType: "object"
    properties:
      - name: "ts"
        logicalType: "timestamp"
        required: true
      - name: "campaign"
        logicalType: "string"
        required: true
      - name: "user"
        logicalType: "string"
"#;

pub const COUNTS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "counts"
name: "counts"
status: "active"
schema:
  - name: "counts"
    logicalType: "object"
    properties:
      - name: "window_start"
        logicalType: "timestamp"
      - name: "window_end"
        logicalType: "timestamp"
      - name: "campaign"
        logicalType: "string"
      - name: "n"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

/// The pipeline of the click-count recovery tests: the clicks of [`input_files`] (one
/// file per micro-batch), a 10 s watermark, late clicks quarantined, a 1-minute tumbling
/// count per campaign in append mode into the asset `counts`.
pub const CLICK_COUNTS_PIPELINE: &str = r#"apiVersion: etlantic/v1
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
    late_events: {policy: quarantine}
    read_limit: {max_files: 1}
transforms:
  - id: per_minute
    inputs:
      clicks: clicks
    steps:
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

/// A batch pipeline over the click counts: the total count per campaign into `totals`.
#[allow(dead_code)]
pub const TOTALS_PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: totals
assets:
  counts:
    contract: contracts/counts.yaml
  totals:
    contract: contracts/totals.yaml
sources:
  - id: counts
    asset: counts
transforms:
  - id: per_campaign
    inputs:
      counts: counts
    steps:
      - aggregate:
          group_by: [campaign]
          aggregates: {total: "sum(n)"}
sinks:
  - id: write_totals
    input: per_campaign
    asset: totals
"#;

/// The contract of [`TOTALS_PIPELINE`]'s output.
#[allow(dead_code)]
pub const TOTALS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "totals"
name: "totals"
status: "active"
schema:
  - name: "totals"
    logicalType: "object"
    properties:
      - name: "campaign"
        logicalType: "string"
      - name: "total"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

/// Writes [`TOTALS_PIPELINE`] into the click-count project at `dir` with a batch profile
/// reading `counts` and overwriting `totals` (two bindings), and runs it twice with `env`
/// (a second run must replace the totals, not add to them).
#[allow(dead_code)]
pub fn run_totals_twice(dir: &Path, counts: &str, totals: &str, env: &[(&str, String)]) {
    let profile = format!(
        "apiVersion: etlantic/v1\nkind: Profile\nname: batch\nmode: batch\nbindings:\n  counts: {counts}\n  totals: {totals}\n"
    );
    std::fs::write(dir.join("totals.yaml"), TOTALS_PIPELINE).unwrap();
    std::fs::write(dir.join("contracts/totals.yaml"), TOTALS).unwrap();
    std::fs::write(dir.join("profiles/batch.yaml"), profile).unwrap();
    for _ in 0..2 {
        let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
            .current_dir(dir)
            .args([
                "run",
                "totals.yaml",
                "--profile",
                "profiles/batch.yaml",
                "--format",
                "json",
            ])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", describe(&o));
    }
}

/// A profile of the click counts: streaming, available-now, checkpoint `chk`, the
/// quarantine in `out/`, then `extra` (YAML lines).
#[allow(dead_code)]
pub fn click_counts_profile(extra: &str) -> String {
    click_counts_profile_into("file://out/counts/?format=jsonl", extra)
}

/// [`click_counts_profile`] with the counts bound to `counts` (a URL, as YAML).
#[allow(dead_code)]
pub fn click_counts_profile_into(counts: &str, extra: &str) -> String {
    super::available_now_profile(
        &[("clicks", "file://in?format=jsonl"), ("counts", counts)],
        &format!("{}{extra}", super::QUARANTINE),
    )
}

/// `profile` (a [`click_counts_profile`]) as a batch run: no trigger, no checkpoint.
#[allow(dead_code)]
pub fn as_batch(profile: &str) -> String {
    profile
        .replace("mode: streaming", "mode: batch")
        .replace("trigger: available_now\n", "")
        .replace("checkpoint: file://chk\n", "")
}

/// Writes the click-count project into `dir`: [`CLICK_COUNTS_PIPELINE`], `profile` as
/// `profiles/local.yaml`, the contracts and [`input_files`] under `in/`.
pub fn write_click_counts(dir: &Path, profile: &str) {
    for (path, text) in [
        ("pipeline.yaml", CLICK_COUNTS_PIPELINE),
        ("profiles/local.yaml", profile),
        ("contracts/clicks.yaml", CLICKS),
        ("contracts/counts.yaml", COUNTS),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    for (name, text) in input_files() {
        let p = dir.join("in").join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

pub fn click(mmss: &str, campaign: &str, user: &str) -> String {
    format!(r#"{{"ts": "2024-01-01T00:{mmss}Z", "campaign": "{campaign}", "user": "{user}"}}"#)
}

/// The input files, one per data micro-batch (batches 0–5; batch 6 is the last no-data
/// batch). File 0 line 4 does not parse; file 2 line 2 has a bad timestamp; file 3 line 3
/// is late: batch 3 judges lateness by the watermark of batch 2 (01:05), and the row's
/// window [00:00, 01:00) ends before it. The first window closes in batch 2, whose
/// watermark is 01:05.
pub fn input_files() -> Vec<(String, String)> {
    let files = [
        vec![
            click("00:10", "c1", "u1"),
            click("00:20", "c2", "u2"),
            click("00:50", "c1", "u3"),
            "{not json".to_string(),
        ],
        vec![click("01:05", "c1", "u1"), click("01:15", "c2", "u4")],
        vec![
            click("01:30", "c1", "u5"),
            r#"{"ts": "yesterday", "campaign": "c1", "user": "u7"}"#.to_string(),
        ],
        vec![
            click("02:20", "c2", "u1"),
            click("02:40", "c3", "u2"),
            click("00:30", "c1", "u6"),
        ],
        vec![click("03:10", "c3", "u3")],
        vec![click("05:00", "c1", "u4")],
    ];
    files
        .iter()
        .enumerate()
        .map(|(i, lines)| (format!("{i:03}.jsonl"), lines.join("\n") + "\n"))
        .collect()
}

/// The steps of the batch protocol a test kills the query at
/// (`ETLANTIC_FAIL_POINT=<point>:<batch>`), in protocol order.
#[allow(dead_code)]
pub const FAIL_POINTS: [&str; 5] = [
    "after_offsets",
    "in_sink",
    "after_sink",
    "after_state",
    "after_commit",
];

/// What a run printed, stdout then stderr.
#[allow(dead_code)]
pub fn output_text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

pub fn run(dir: &Path, fail_point: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env_remove("ETLANTIC_FAIL_POINT");
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd.output().expect("the etlantic binary runs")
}

pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn run_ok(dir: &Path) {
    let o = run(dir, None);
    assert!(o.status.success(), "run failed: {}", describe(&o));
}

pub fn window(start: &str, end: &str, campaign: &str, n: i64) -> String {
    let v: BTreeMap<&str, Value> = BTreeMap::from([
        ("campaign", json!(campaign)),
        ("n", json!(n)),
        ("window_end", json!(format!("2024-01-01T00:{end}.000Z"))),
        ("window_start", json!(format!("2024-01-01T00:{start}.000Z"))),
    ]);
    serde_json::to_string(&v).unwrap()
}

/// A window row (a JSON object) as [`window`] spells it: its timestamps in UTC with
/// milliseconds, keys sorted.
pub fn canonical_window(line: &str) -> String {
    let mut v: BTreeMap<String, Value> = serde_json::from_str(line).unwrap();
    for k in ["window_start", "window_end"] {
        let t = chrono::DateTime::parse_from_rfc3339(v[k].as_str().unwrap()).unwrap();
        v.insert(
            k.into(),
            json!(t
                .with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
    }
    serde_json::to_string(&v).unwrap()
}

/// Window rows of Arrow batches as a sorted multiset of [`canonical_window`] strings.
pub fn canonical_window_rows(batches: &[arrow::array::RecordBatch]) -> Vec<String> {
    let mut rows: Vec<String> = super::json_rows(batches)
        .iter()
        .map(|v| canonical_window(&v.to_string()))
        .collect();
    rows.sort();
    rows
}

/// The quarantine file `out/quarantine.jsonl` of a project as a sorted multiset of
/// (code, position, raw text, batch id) JSON strings, without run ids: what two runs of
/// the same input must agree on.
#[allow(dead_code)]
pub fn quarantined(dir: &Path) -> Vec<String> {
    let path = dir.join("out/quarantine.jsonl");
    if !path.exists() {
        return vec![];
    }
    let mut v: Vec<String> = etlantic_runtime::quarantine::read_quarantine(path)
        .unwrap()
        .iter()
        .map(|l| {
            json!({"code": l["code"], "position": l["position"], "raw": l["raw"], "batch": l["batch_id"]})
                .to_string()
        })
        .collect();
    v.sort();
    v
}
