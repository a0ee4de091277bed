//! `etlantic dlq redrive`: after a fix, the quarantined records of a stream are replayed
//! into the pipeline once — a second redrive replays nothing, and the sink holds every
//! record exactly once — and pipelines a replay would corrupt are refused (ETL224).

mod common;

use common::*;
use serde_json::Value;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: orders_stream
assets:
  orders:
    contract: contracts/orders.yaml
  paid:
    contract: contracts/orders.yaml
sources:
  - id: orders
    asset: orders
transforms:
  - id: pass
    inputs:
      orders: orders
    steps:
      - select: [id, status]
sinks:
  - id: out
    input: pass
    asset: paid
    output_mode: append
"#;

fn profile() -> String {
    available_now_profile(
        &[
            ("orders", "file://in?format=jsonl"),
            ("paid", "file://out/paid/?format=jsonl"),
        ],
        QUARANTINE,
    )
}

fn contract(valid: &str) -> String {
    format!(
        r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
name: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "id"
        logicalType: "integer"
        required: true
      - name: "status"
        logicalType: "string"
        quality:
          - id: known
            metric: invalidValues
            arguments: {{validValues: [{valid}]}}
            mustBe: 0
"#
    )
}

fn project() -> Project {
    let p = Project::empty();
    p.write("pipeline.yaml", PIPELINE);
    p.write("profiles/local.yaml", &profile());
    p.write("contracts/orders.yaml", &contract("new, paid"));
    p.write(
        "in/000.jsonl",
        r#"{"id": 1, "status": "new"}
{"id": 2, "status": "refunded"}
{"id": 3, "status": "paid"}
not json
{"id": 5, "status": "refunded"}
"#,
    );
    p
}

/// The ids in the sink, sorted (duplicates kept).
fn published(p: &Project) -> Vec<i64> {
    let mut ids: Vec<i64> = etlantic_sinks::files::read_committed(p.join("out/paid"))
        .unwrap()
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    ids.sort();
    ids
}

fn redrive(p: &Project) -> Value {
    let r = p.run(&["dlq", "redrive", "--format", "json"]);
    r.ok();
    r.stdout_json()
}

#[test]
fn a_redrive_after_a_fix_replays_each_quarantined_record_once() {
    let p = project();
    p.run(&["run", "--format", "json"]).ok();
    assert_eq!(published(&p), vec![1, 3]);
    let q = p.jsonl("out/quarantine.jsonl");
    assert_eq!(
        q.len(),
        3,
        "two unknown statuses and a line that is not JSON: {q:#?}"
    );

    // Nothing fixed yet: the records fail again and are quarantined again; the redrive
    // itself succeeds and the ledger records them (a redrive is a replay, not a retry loop).
    // So fix first: `refunded` becomes a known status.
    p.write("contracts/orders.yaml", &contract("new, paid, refunded"));
    let report = redrive(&p);
    assert_eq!(report["source"], "orders", "{report:#}");
    assert_eq!(report["replayed"], 2, "{report:#}");
    assert_eq!(
        report["not_replayable"], 1,
        "the line that is not JSON: {report:#}"
    );
    assert_eq!(report["already_redriven"], 0, "{report:#}");
    assert_eq!(report["run"]["status"], "succeeded", "{report:#}");
    assert_eq!(published(&p), vec![1, 2, 3, 5]);

    // Again: nothing is replayed twice.
    let again = redrive(&p);
    assert_eq!(again["replayed"], 0, "{again:#}");
    assert_eq!(again["already_redriven"], 2, "{again:#}");
    assert!(again["run"].is_null(), "{again:#}");
    assert_eq!(published(&p), vec![1, 2, 3, 5]);
    // The quarantine keeps its history; the ledger lists what was replayed.
    assert_eq!(p.jsonl("out/quarantine.jsonl").len(), 3);
    assert_eq!(p.read("out/quarantine.jsonl.redriven").lines().count(), 2);
}

#[test]
fn records_that_fail_again_are_quarantined_again_and_can_be_redriven_later() {
    let p = project();
    p.run(&["run", "--format", "json"]).ok();
    // A fix that covers only part of the problem is not a fix for the rest.
    let report = redrive(&p);
    assert_eq!(report["run"]["status"], "succeeded", "{report:#}");
    assert_eq!(report["run"]["quarantined"], 2, "{report:#}");
    // The streaming run's report sums the rule over its micro-batches.
    let rule = &report["run"]["quality"][0];
    assert_eq!(rule["id"], "orders.status.known", "{report:#}");
    assert_eq!(
        (rule["violations"].as_u64(), rule["removed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(published(&p), vec![1, 3]);
    let q = p.jsonl("out/quarantine.jsonl");
    assert_eq!(q.len(), 5, "{q:#?}");
    let again: Vec<&Value> = q
        .iter()
        .filter(|l| {
            l["position"]["file"]
                .as_str()
                .is_some_and(|f| f.contains("redrive"))
        })
        .collect();
    assert_eq!(
        again.len(),
        2,
        "re-quarantined with the redrive file as position"
    );
    // Now the fix: the two records quarantined by the redrive replay; the originals are in
    // the ledger already.
    p.write("contracts/orders.yaml", &contract("new, paid, refunded"));
    let fixed = redrive(&p);
    assert_eq!(
        (
            fixed["replayed"].as_u64(),
            fixed["already_redriven"].as_u64()
        ),
        (Some(2), Some(2)),
        "{fixed:#}"
    );
    assert_eq!(published(&p), vec![1, 2, 3, 5]);
}

#[test]
fn redrive_refuses_batch_and_stateful_pipelines() {
    let batch = Project::init();
    let r = batch.run(&["dlq", "redrive", "--format", "json"]);
    assert_ne!(r.code, 0);
    assert!(r.all_output().contains("ETL224"), "{}", r.all_output());

    let p = project();
    p.edit(
        "pipeline.yaml",
        "      - select: [id, status]\n",
        "      - select: [id, status]\n      - deduplicate: [id]\n",
    );
    let r = p.run(&["dlq", "redrive", "--format", "json"]);
    assert_ne!(r.code, 0);
    assert!(r.all_output().contains("ETL224"), "{}", r.all_output());
    assert!(r.all_output().contains("keeps state"), "{}", r.all_output());
}

#[test]
fn a_redrive_killed_after_its_sink_wrote_resumes_without_duplicates() {
    let p = project();
    p.run(&["run", "--format", "json"]).ok();
    p.write("contracts/orders.yaml", &contract("new, paid, refunded"));
    // The process aborts after the sink wrote the replayed rows, before the batch commits
    // and before the ledger lists them.
    let killed = p.run_env(
        &["dlq", "redrive", "--format", "json"],
        &[("ETLANTIC_FAIL_POINT", "after_sink:0")],
    );
    assert_ne!(killed.code, 0, "the fail point fired");
    assert!(!p.exists("out/quarantine.jsonl.redriven"));
    // The same records make the same redrive, which resumes from its checkpoint: the sink
    // skips the batch it already has.
    let resumed = redrive(&p);
    assert_eq!(resumed["replayed"], 2, "{resumed:#}");
    assert_eq!(published(&p), vec![1, 2, 3, 5]);
    assert_eq!(redrive(&p)["replayed"], 0);
    assert_eq!(published(&p), vec![1, 2, 3, 5]);
}

/// The same with the quarantine and the checkpoint on S3 (moto on 127.0.0.1): the
/// replayed records, the replay's checkpoint and the ledger go beside the quarantine, on
/// the store.
#[cfg(feature = "object-store")]
#[test]
fn a_quarantine_on_s3_is_redriven_once() {
    use etlantic::object_store::testing::S3TestServer;
    use etlantic_core::storage::Storage;
    let server = S3TestServer::start();
    server.create_bucket("dlq");
    let env: Vec<(&str, String)> = server.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let p = project();
    p.write(
        "profiles/local.yaml",
        &profile()
            .replace("file://chk", "s3://dlq/chk")
            .replace("file://out/quarantine.jsonl", "s3://dlq/q/quarantine.jsonl"),
    );
    p.run_env(&["run", "--format", "json"], &env).ok();
    assert_eq!(published(&p), vec![1, 3]);
    let list = p.run_env(&["dlq", "list", "--format", "json"], &env);
    list.ok();
    let groups = list.stdout_json();
    assert_eq!(dlq_records(&groups), 3, "{groups:#}");

    p.write("contracts/orders.yaml", &contract("new, paid, refunded"));
    let r = p.run_env(&["dlq", "redrive", "--format", "json"], &env);
    r.ok();
    let report = r.stdout_json();
    assert_eq!(report["replayed"], 2, "{report:#}");
    assert_eq!(report["run"]["status"], "succeeded", "{report:#}");
    assert_eq!(published(&p), vec![1, 2, 3, 5]);
    let r = p.run_env(&["dlq", "redrive", "--format", "json"], &env);
    r.ok();
    let again = r.stdout_json();
    assert_eq!(again["replayed"], 0, "{again:#}");
    assert_eq!(again["already_redriven"], 2, "{again:#}");
    assert_eq!(published(&p), vec![1, 2, 3, 5]);

    // Nothing of it on the local disk; the ledger and the replay on S3.
    assert!(!p.join("out/quarantine.jsonl.redriven").exists());
    assert!(!p.join("out/redrive").exists());
    let store = etlantic::object_store::ObjectStorage::open(
        &url::Url::parse("s3://dlq/q").unwrap(),
        &server.options(),
    )
    .unwrap();
    let ledger = store.read("quarantine.jsonl.redriven").unwrap().unwrap();
    assert_eq!(String::from_utf8(ledger).unwrap().lines().count(), 2);
    let id = report["redrive_id"].as_str().unwrap();
    assert!(store
        .list(&format!("redrive/{id}"))
        .unwrap()
        .contains(&"checkpoint/".to_string()));
}
