//! Records that break their contract: every one of them (not only the first) goes to the
//! quarantine with its reason and source position, the good ones go on, and the run
//! report counts both. With `on_error: fail` the run fails instead (ETL705, exit 4) and
//! writes no sink output.

mod common;

use common::*;
use serde_json::Value;

/// JSON lines with good and bad records interleaved. Good rows (not cancelled):
/// acme 10 + 20, globex 5; bad rows on lines 2, 4, 5, 7, 8, 10.
const JSONL: &str = r#"{"order_id": 1, "customer": "acme", "amount": 10.0, "status": "paid"}
{"order_id": 2, "customer": "acme", "amount": "ten", "status": "paid"}
{"order_id": 3, "customer": "globex", "amount": 5.0, "status": "paid"}
{"order_id": 4, "amount": 1.0, "status": "paid"}
{"order_id": 5, "customer": "acme", "amount": 1.0, "status": "paid"
{"order_id": 6, "customer": "acme", "amount": 20.0, "status": "shipped"}
{"order_id": 0, "customer": "acme", "amount": 1.0, "status": "paid"}
not json at all
{"order_id": 9, "customer": "initech", "amount": 3.0, "status": "cancelled"}
{"order_id": 10, "customer": "acme", "amount": null, "status": "paid"}
"#;

const EXPECTED: &str = "customer,orders,revenue\nacme,2,30.0\nglobex,1,5.0\n";

fn project_with(data_rel: &str, data: &str, binding: &str) -> Project {
    let p = Project::init();
    p.write(data_rel, data);
    p.edit("profiles/local.yaml", "file://data/orders.jsonl", binding);
    p
}

#[track_caller]
fn quarantined(p: &Project) -> Vec<Value> {
    p.jsonl("out/quarantine.jsonl")
}

#[track_caller]
fn check_report(r: &Run, read: u64, rejected: u64, written: u64) -> Value {
    r.ok();
    let report = r.stdout_json();
    assert_eq!(report["status"], "succeeded", "{report:#}");
    assert_eq!(report["sources"][0]["rows"], read, "{report:#}");
    assert_eq!(report["sources"][0]["rejected"], rejected, "{report:#}");
    assert_eq!(report["quarantined"], rejected, "{report:#}");
    assert_eq!(report["sinks"][0]["rows"], written, "{report:#}");
    report
}

#[test]
fn every_bad_json_line_is_quarantined_with_reason_and_line() {
    let p = project_with("data/orders.jsonl", JSONL, "file://data/orders.jsonl");
    let r = p.run(&["run", "--format", "json"]);
    check_report(&r, 4, 6, 2);
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED);

    let q = quarantined(&p);
    let got: Vec<(u64, &str)> = q
        .iter()
        .map(|r| {
            (
                r["position"]["line"].as_u64().unwrap(),
                r["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (2, "ETL702"),  // wrong type
            (4, "ETL703"),  // missing required field
            (5, "ETL701"),  // unparsable (truncated) line
            (7, "ETL704"),  // breaks `minimum: 1`
            (8, "ETL701"),  // not JSON
            (10, "ETL703"), // required field is null
        ],
        "{q:#?}"
    );
    for r in &q {
        assert_eq!(r["position"]["file"], "data/orders.jsonl", "{r:#}");
        assert_eq!(r["position"]["asset"], "orders");
        assert!(!r["reason"].as_str().unwrap().is_empty(), "{r:#}");
        assert!(r["raw"].is_string());
    }
    assert_eq!(q[0]["field"], "amount");
    assert!(q[0]["reason"].as_str().unwrap().contains("ten"));
    assert_eq!(q[1]["field"], "customer");
    assert_eq!(q[3]["field"], "order_id");
    assert_eq!(q[5]["field"], "amount");
    assert!(q[2]["field"].is_null());
}

#[test]
fn every_bad_csv_line_is_quarantined_with_its_line_counting_the_header() {
    let csv = "order_id,customer,amount,status\n\
               1,acme,10.0,paid\n\
               2,acme,ten,paid\n\
               3,globex,5.0,paid\n\
               4,,1.0,paid\n\
               5,acme,1.0\n\
               6,acme,20.0,shipped\n\
               x,acme,1.0,paid\n";
    let p = project_with("data/orders.csv", csv, "file://data/orders.csv");
    let r = p.run(&["run", "--format", "json"]);
    check_report(&r, 3, 4, 2);
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED);
    let q = quarantined(&p);
    let lines: Vec<u64> = q
        .iter()
        .map(|r| r["position"]["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, vec![3, 5, 6, 8], "{q:#?}");
    assert_eq!(q[0]["code"], "ETL702");
    assert_eq!(q[0]["field"], "amount");
    assert_eq!(q[1]["code"], "ETL703");
    assert_eq!(q[1]["field"], "customer");
    assert_eq!(q[3]["code"], "ETL702");
    assert_eq!(q[3]["field"], "order_id");
    for r in &q {
        assert_eq!(r["position"]["file"], "data/orders.csv");
        assert!(!r["reason"].as_str().unwrap().is_empty());
    }
}

/// A loose contract (nothing required, no bounds) to stage data into Parquet.
const LOOSE: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders_loose"
name: "orders_loose"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - {name: "order_id", logicalType: "integer"}
      - {name: "customer", logicalType: "string"}
      - {name: "amount", logicalType: "number"}
      - {name: "status", logicalType: "string"}
      - {name: "ordered_at", logicalType: "timestamp"}
"#;

#[test]
fn every_bad_parquet_row_is_quarantined_with_its_row() {
    let p = Project::init();
    // Stage 1: write a Parquet file with `etlantic` itself, through a loose contract.
    p.write("contracts/loose.odcs.yaml", LOOSE);
    p.write(
        "stage/pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: stage\nassets:\n  raw: {contract: ../contracts/loose.odcs.yaml}\n  staged: {contract: ../contracts/loose.odcs.yaml}\nsources:\n  - {id: raw, asset: raw}\nsinks:\n  - {id: write, input: raw, asset: staged}\n",
    );
    p.write(
        "stage/profiles/local.yaml",
        "apiVersion: etlantic/v1\nkind: Profile\nname: stage\nbindings:\n  raw: file://raw.jsonl\n  staged: file://../data/orders.parquet\nquarantine: file://stage-quarantine.jsonl\n",
    );
    p.write(
        "stage/raw.jsonl",
        r#"{"order_id": 1, "customer": "acme", "amount": 10.0, "status": "paid"}
{"order_id": 2, "customer": "acme", "amount": null, "status": "paid"}
{"order_id": 3, "customer": "globex", "amount": 5.0, "status": "paid"}
{"order_id": 0, "customer": "acme", "amount": 1.0, "status": "paid"}
{"order_id": 6, "customer": "acme", "amount": 20.0, "status": "shipped"}
{"order_id": 7, "customer": null, "amount": 1.0, "status": "paid"}
"#,
    );
    let r = p.run(&["run", "stage/pipeline.yaml", "--format", "json"]);
    r.ok();
    assert_eq!(r.stdout_json()["sinks"][0]["rows"], 6);
    assert!(p.exists("data/orders.parquet"));
    assert!(!p.exists("stage/stage-quarantine.jsonl"));

    // Stage 2: the example pipeline reads it with the strict contract.
    p.edit(
        "profiles/local.yaml",
        "file://data/orders.jsonl",
        "file://data/orders.parquet",
    );
    let r = p.run(&["run", "--format", "json"]);
    check_report(&r, 3, 3, 2);
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED);
    let q = quarantined(&p);
    let got: Vec<(u64, &str, &str)> = q
        .iter()
        .map(|r| {
            (
                r["position"]["row"].as_u64().unwrap(),
                r["code"].as_str().unwrap(),
                r["field"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "ETL703", "amount"),
            (3, "ETL704", "order_id"),
            (5, "ETL703", "customer"),
        ],
        "0-based rows: {q:#?}"
    );
    for r in &q {
        assert_eq!(r["position"]["file"], "data/orders.parquet");
        assert!(
            r["position"]["line"].is_null(),
            "Parquet has rows, not lines"
        );
        assert!(!r["reason"].as_str().unwrap().is_empty());
    }
}

#[test]
fn on_error_fail_stops_the_run_with_etl705_and_writes_nothing() {
    let p = project_with("data/orders.jsonl", JSONL, "file://data/orders.jsonl");
    p.edit(
        "profiles/local.yaml",
        "on_error: quarantine",
        "on_error: fail",
    );
    p.run(&["validate"]).ok();
    let r = p.run(&["run"]);
    r.expect_code(exit::EXECUTION_FAILED);
    assert!(r.stdout.contains("failed"), "{}", r.stdout);
    assert!(r.stderr.contains("error[ETL705]"), "{}", r.stderr);
    // Each bad record is named with its position.
    for line in [":2", ":4", ":5", ":7", ":8", ":10"] {
        assert!(
            r.stderr.contains(&format!("data/orders.jsonl{line}")),
            "{line} in {}",
            r.stderr
        );
    }
    assert!(!p.exists("out/customer_revenue.csv"), "no sink output");
    assert!(!p.exists("out/quarantine.jsonl"), "nothing quarantined");

    let r = p.run(&["run", "--format", "json"]);
    r.expect_code(exit::EXECUTION_FAILED);
    let report = r.stdout_json();
    assert_eq!(report["status"], "failed");
    assert_eq!(report["errors"][0]["code"], "ETL705");
    assert_eq!(report["errors"][0]["phase"], "execution");
    let codes: Vec<&str> = report["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        vec!["ETL705", "ETL702", "ETL703", "ETL701", "ETL704", "ETL701", "ETL703"]
    );
    assert_eq!(report["errors"][1]["line"], 2);
    assert_eq!(report["errors"][1]["file"], "data/orders.jsonl");
    assert!(report["sinks"].as_array().unwrap().is_empty(), "{report:#}");
    assert!(!p.exists("out/customer_revenue.csv"));

    // The same data with on_error: fail but no bad record runs fine.
    p.write(
        "data/orders.jsonl",
        "{\"order_id\": 1, \"customer\": \"acme\", \"amount\": 10.0, \"status\": \"paid\"}\n",
    );
    p.run(&["run"]).ok();
    assert_eq!(
        p.read("out/customer_revenue.csv"),
        "customer,orders,revenue\nacme,1,10.0\n"
    );
}

#[test]
fn a_file_of_only_bad_records_writes_an_empty_result() {
    let p = project_with(
        "data/orders.jsonl",
        "nope\n{\"order_id\": \"x\"}\n",
        "file://data/orders.jsonl",
    );
    let r = p.run(&["run", "--format", "json"]);
    check_report(&r, 0, 2, 0);
    assert_eq!(
        p.read("out/customer_revenue.csv"),
        "customer,orders,revenue\n"
    );
    assert_eq!(quarantined(&p).len(), 2);
}

#[test]
fn dlq_list_counts_and_dlq_show_filters_the_quarantine() {
    let p = project_with("data/orders.jsonl", JSONL, "file://data/orders.jsonl");
    // Before any run the quarantine is empty, not an error.
    let r = p.run(&["dlq", "list"]);
    r.ok();
    assert!(r.stdout.ends_with("0 record(s)\n"), "{}", r.stdout);
    p.run(&["run", "--format", "json"]).ok();
    let r = p.run(&["dlq", "list", "--format", "json"]);
    r.ok();
    let groups = r.stdout_json();
    let by_code: Vec<(String, u64)> = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["code"].as_str().unwrap().to_string(),
                g["records"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_code,
        [("ETL701", 2), ("ETL702", 1), ("ETL703", 2), ("ETL704", 1)]
            .map(|(c, n)| (c.to_string(), n))
    );
    let r = p.run(&["dlq", "show", "--code", "ETL701"]);
    r.ok();
    let shown: Vec<Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(shown.len(), 2);
    assert!(shown.iter().all(|l| l["code"] == "ETL701"));
    assert_eq!(shown[0]["position"]["line"], 5);
}

/// A batch run applies the contracts' quality rules like a stream does: the source's
/// rules on the whole input after decoding (a repeated key and an unknown status are
/// quarantined with their rule), the sink's before it writes (warned here, by the
/// profile), every rule counted in the run report; `explain` lists each rule with where it
/// is evaluated and its policy.
#[test]
fn batch_runs_apply_quality_rules_and_explain_lists_them() {
    let p = Project::init();
    p.edit(
        "contracts/orders.odcs.yaml",
        "      - name: \"status\"\n        logicalType: \"string\"\n        required: true\n",
        "      - name: \"status\"\n        logicalType: \"string\"\n        required: true\n        quality:\n          - id: known\n            metric: invalidValues\n            arguments: {validValues: [paid, shipped, cancelled]}\n            mustBe: 0\n",
    );
    p.edit(
        "contracts/customer_revenue.odcs.yaml",
        "      - name: \"revenue\"\n        logicalType: \"number\"\n",
        "      - name: \"revenue\"\n        logicalType: \"number\"\n        logicalTypeOptions: {maximum: 25}\n",
    );
    p.edit(
        "profiles/local.yaml",
        "on_error: quarantine\n",
        "on_error: quarantine\nquality_policies:\n  customer_revenue.revenue.range: warn\n",
    );
    p.write(
        "data/orders.jsonl",
        r#"{"order_id": 1, "customer": "acme", "amount": 10.0, "status": "paid"}
{"order_id": 2, "customer": "acme", "amount": 20.0, "status": "lost"}
{"order_id": 3, "customer": "globex", "amount": 30.0, "status": "paid"}
{"order_id": 3, "customer": "globex", "amount": 5.0, "status": "paid"}
"#,
    );
    let r = p.run(&["run", "--format", "json"]);
    let report = check_report(&r, 2, 2, 2);
    // acme 10 (order 2 quarantined), globex 30 (the repeated order 3 quarantined): 30
    // breaks the sink's maximum and is published with a warning.
    assert_eq!(
        p.read("out/customer_revenue.csv"),
        "customer,orders,revenue\nacme,1,10.0\nglobex,1,30.0\n"
    );
    let mut quality: Vec<(String, String, u64, u64, u64)> = report["quality"]
        .as_array()
        .expect("a quality member")
        .iter()
        .map(|q| {
            (
                q["id"].as_str().unwrap().to_string(),
                q["policy"].as_str().unwrap().to_string(),
                q["violations"].as_u64().unwrap(),
                q["failed"].as_u64().unwrap(),
                q["removed"].as_u64().unwrap(),
            )
        })
        .collect();
    quality.sort();
    assert_eq!(
        quality,
        vec![
            (
                "customer_revenue.revenue.range".into(),
                "warn".into(),
                1,
                1,
                0
            ),
            (
                "orders.order_id.unique".into(),
                "quarantine".into(),
                1,
                1,
                1
            ),
            ("orders.status.known".into(), "quarantine".into(), 1, 1, 1),
        ],
        "{report:#}"
    );
    let q = quarantined(&p);
    assert_eq!(q.len(), 2, "{q:#?}");
    let reasons: Vec<&str> = q.iter().map(|l| l["reason"].as_str().unwrap()).collect();
    assert!(
        reasons.iter().any(|r| r.contains("orders.status.known")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("orders.order_id.unique")),
        "{reasons:?}"
    );
    for l in &q {
        assert_eq!(l["code"], "ETL704");
        assert!(l["raw"].as_str().unwrap().contains("order_id"), "{l}");
        assert_eq!(l["position"]["file"], "data/orders.jsonl", "{l}");
    }
    // The source positions of the rows the rules took out, not their index after decoding.
    let mut lines: Vec<u64> = q
        .iter()
        .map(|l| l["position"]["line"].as_u64().expect("a line"))
        .collect();
    lines.sort();
    assert_eq!(lines, vec![2, 4]);

    let explain = p.run(&["explain"]);
    explain.ok();
    let text = explain.all_output();
    assert!(text.contains("Quality rules"), "{text}");
    assert!(
        text.contains("orders.status.known (invalid_values) → quarantine: on the whole input"),
        "{text}"
    );
    assert!(
        text.contains("customer_revenue.revenue.range (range) → warn: on each record, before the sink publishes it"),
        "{text}"
    );
    assert!(text.contains("orders.order_id.range (range) → quarantine: on each record, while the source decodes it"), "{text}");
}

/// Hostile bytes in a timestamp of a column with a zone other than UTC: multi-byte
/// characters across the tenth byte used to panic the decoder (and every restart after
/// it). Each such record is quarantined like any unparsable timestamp; the rest go on.
#[test]
fn multi_byte_characters_in_a_zoned_timestamp_are_quarantined_not_a_panic() {
    let p = Project::init();
    p.edit(
        "contracts/orders.odcs.yaml",
        "      - name: \"ordered_at\"\n        logicalType: \"timestamp\"\n",
        "      - name: \"ordered_at\"\n        logicalType: \"timestamp\"\n        logicalTypeOptions: {defaultTimezone: Europe/Paris}\n",
    );
    let data = [
        r#"{"order_id": 1, "customer": "acme", "amount": 10.0, "status": "paid", "ordered_at": "2024-01-01T10:00:00"}"#,
        r#"{"order_id": 2, "customer": "acme", "amount": 20.0, "status": "paid", "ordered_at": "2024-01-0é:00:00"}"#,
        r#"{"order_id": 3, "customer": "globex", "amount": 5.0, "status": "paid", "ordered_at": "2024-01-01\u00e9\u00e9\u00e9"}"#,
        r#"{"order_id": 4, "customer": "globex", "amount": 1.0, "status": "paid", "ordered_at": "日本語の時刻です"}"#,
    ]
    .join("\n");
    p.write("data/orders.jsonl", &format!("{data}\n"));
    let r = p.run(&["run", "--format", "json"]);
    check_report(&r, 1, 3, 1);
    let q = quarantined(&p);
    let lines: Vec<(u64, &str)> = q
        .iter()
        .map(|l| {
            (
                l["position"]["line"].as_u64().unwrap(),
                l["field"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        lines,
        vec![(2, "ordered_at"), (3, "ordered_at"), (4, "ordered_at")],
        "{q:#?}"
    );
}
