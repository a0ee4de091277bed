//! Nothing is lost: a stream of 1,000,000 JSON-lines records of which 1% are malformed
//! (bad JSON, a wrong type, a missing required field, an out-of-range value), read as ten
//! files, one per micro-batch. Every good record is published exactly once and every bad
//! one is quarantined exactly once with its code, file and line — in an uninterrupted run
//! and in runs killed in the middle of the protocol and restarted.

mod common;
use common::crash::{describe, run};

use arrow::array::{Array, Int64Array};
use std::collections::BTreeMap;
use std::path::Path;

const FILES: u64 = 10;
const PER_FILE: u64 = 100_000;
const TOTAL: u64 = FILES * PER_FILE;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: lossless
assets:
  records:
    contract: contracts/records.yaml
  published:
    contract: contracts/records.yaml
sources:
  - id: records
    asset: records
    read_limit: {max_files: 1}
sinks:
  - id: good
    input: records
    asset: published
    output_mode: append
"#;

fn profile() -> String {
    common::available_now_profile(
        &[
            ("records", "file://in?format=jsonl"),
            ("published", "file://out/good/?format=parquet"),
        ],
        common::QUARANTINE,
    )
}

const RECORDS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "records"
name: "records"
status: "active"
schema:
  - name: "records"
    logicalType: "object"
    properties:
      - name: "id"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
        required: true
      - name: "user"
        logicalType: "string"
        required: true
      - name: "amount"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64", minimum: 0, maximum: 1000}
"#;

/// How record `i` is broken, if it is: one in a hundred, the four kinds in turn.
fn defect(i: u64) -> Option<(&'static str, &'static str)> {
    if i % 100 != 37 {
        return None;
    }
    Some(match (i / 100) % 4 {
        0 => ("bad json", "ETL701"),
        1 => ("wrong type", "ETL702"),
        2 => ("missing field", "ETL703"),
        _ => ("out of range", "ETL704"),
    })
}

fn line(i: u64) -> String {
    match defect(i) {
        None => format!(
            r#"{{"id": {i}, "user": "u{}", "amount": {}}}"#,
            i % 7,
            i % 1000
        ),
        Some(("bad json", _)) => format!(r#"{{"id": {i}, "user": "u", "amount": 5"#),
        Some(("wrong type", _)) => format!(r#"{{"id": {i}, "user": "u", "amount": "five"}}"#),
        Some(("missing field", _)) => format!(r#"{{"id": {i}, "amount": 5}}"#),
        Some(_) => format!(r#"{{"id": {i}, "user": "u", "amount": 5000}}"#),
    }
}

fn project(dir: &Path) {
    for (path, text) in [
        ("pipeline.yaml", PIPELINE),
        ("profiles/local.yaml", profile().as_str()),
        ("contracts/records.yaml", RECORDS),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    std::fs::create_dir_all(dir.join("in")).unwrap();
    for f in 0..FILES {
        let mut text = String::with_capacity(PER_FILE as usize * 48);
        for i in f * PER_FILE..(f + 1) * PER_FILE {
            text.push_str(&line(i));
            text.push('\n');
        }
        std::fs::write(dir.join("in").join(format!("{f:02}.jsonl")), text).unwrap();
    }
}

/// Checks that the published ids are exactly the good records, each once, and that the
/// quarantine holds exactly the bad ones, each once, with its code and position.
fn check_lossless(dir: &Path, label: &str) {
    let mut published = vec![0u8; TOTAL as usize];
    for batch in etlantic_sinks::files::read_committed(dir.join("out/good")).unwrap() {
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone();
        for k in 0..ids.len() {
            published[ids.value(k) as usize] += 1;
        }
    }
    let mut quarantined = vec![0u8; TOTAL as usize];
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    let q =
        etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl")).unwrap();
    for entry in &q {
        let file = entry["position"]["file"].as_str().unwrap();
        let line_no = entry["position"]["line"].as_u64().unwrap();
        let f: u64 = file
            .trim_start_matches("in/")
            .trim_end_matches(".jsonl")
            .parse()
            .unwrap_or_else(|_| panic!("{label}: position {file}"));
        let i = f * PER_FILE + line_no - 1;
        let code = entry["code"].as_str().unwrap();
        assert_eq!(
            defect(i).map(|d| d.1),
            Some(code),
            "{label}: {file}:{line_no} quarantined as {code}: {entry}"
        );
        assert_eq!(
            entry["raw"].as_str().unwrap(),
            line(i),
            "{label}: the raw record"
        );
        quarantined[i as usize] += 1;
        *by_code.entry(code.to_string()).or_default() += 1;
    }
    let mut good = 0u64;
    for i in 0..TOTAL {
        let (p, q) = (published[i as usize], quarantined[i as usize]);
        match defect(i) {
            None => {
                assert_eq!((p, q), (1, 0), "{label}: record {i} published {p}×")
            }
            Some((what, _)) => {
                assert_eq!(
                    (p, q),
                    (0, 1),
                    "{label}: {what} record {i} quarantined {q}×"
                )
            }
        }
        good += u64::from(p);
    }
    let bad: u64 = by_code.values().sum();
    assert_eq!(good + bad, TOTAL, "{label}: good + quarantined = input");
    assert_eq!(good, 990_000, "{label}");
    let expected: BTreeMap<String, u64> = ["ETL701", "ETL702", "ETL703", "ETL704"]
        .iter()
        .map(|c| (c.to_string(), 2_500))
        .collect();
    assert_eq!(by_code, expected, "{label}: quarantined by code");
}

#[test]
fn a_million_records_with_one_percent_malformed_lose_nothing_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path());
    let o = run(tmp.path(), None);
    assert!(o.status.success(), "{}", describe(&o));
    check_lossless(tmp.path(), "uninterrupted");

    // Killed while the sink writes batch 3, and after the sink of batch 6 before its
    // commit: the restart re-runs that batch with the same offsets.
    for point in ["in_sink:3", "after_sink:6"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        project(dir);
        let o = run(dir, Some(point));
        assert!(!o.status.success(), "{point}: the fail point fired");
        let o = run(dir, None);
        assert!(o.status.success(), "{point}: restart: {}", describe(&o));
        check_lossless(dir, point);
    }
}
