//! End to end through the `etlantic` CLI: a Kafka topic (librdkafka's mock cluster,
//! created in this test process and reached by the child process over TCP through its
//! bootstrap servers) → filter and projection → a file sink, killed at every step of the
//! batch protocol (`ETLANTIC_FAIL_POINT`), restarted, and compared with an uninterrupted
//! run: 0 lost, 0 duplicated. Offsets live in the query's checkpoint only.

mod common;
use common::crash::*;
use common::logged_offsets;

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: big_orders
assets:
  orders:
    contract: contracts/orders.yaml
  big:
    contract: contracts/big.yaml
sources:
  - id: orders
    asset: orders
transforms:
  - id: big_only
    inputs:
      o: orders
    steps:
      - filter: "amount >= 10"
      - select: [id, amount]
sinks:
  - id: write_big
    input: big_only
    asset: big
    output_mode: append
"#;

const ORDERS: &str = r#"version: "1.0.0"
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
        logicalTypeOptions: {format: "i64"}
        required: true
      - name: "amount"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
        required: true
      - name: "user"
        logicalType: "string"
"#;

const BIG: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "big"
name: "big"
status: "active"
schema:
  - name: "big"
    logicalType: "object"
    properties:
      - name: "id"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
      - name: "amount"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

/// 24 records over 2 partitions: ids 0..22 (amount = id), and 2 malformed values.
fn fill(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for i in 0..24i64 {
        let value = match i {
            5 => "{broken".to_string(),
            17 => r#"{"id":"seventeen","amount":1}"#.to_string(),
            _ => json!({"id": i, "amount": i, "user": format!("u{}", i % 3)}).to_string(),
        };
        p.send(
            BaseRecord::<str, str>::to("orders")
                .partition((i % 2) as i32)
                .payload(&value),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    }
    p.flush(Duration::from_secs(10)).unwrap();
}

struct Env {
    cluster: MockCluster<'static, DefaultProducerContext>,
    dir: tempfile::TempDir,
}

fn setup() -> Env {
    setup_with("file://out/big/?format=jsonl")
}

fn setup_with(sink_binding: &str) -> Env {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 2, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    fill(&bs);
    let dir = tempfile::tempdir().unwrap();
    let profile = format!(
        "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  orders: kafka://{bs}/orders?format=json&maxOffsetsPerTrigger=5\n  big: {sink}\nquarantine: file://out/quarantine.jsonl\n",
        sink = sink_binding.replace("{bs}", &bs)
    );
    for (path, text) in [
        ("pipeline.yaml", PIPELINE),
        ("profiles/local.yaml", profile.as_str()),
        ("contracts/orders.yaml", ORDERS),
        ("contracts/big.yaml", BIG),
    ] {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    Env { cluster, dir }
}

/// Committed output rows, sorted (a multiset: duplicates stay).
fn committed(dir: &Path) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed(dir.join("out/big")).unwrap();
    let mut rows = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            rows.push(etlantic_sources::decode::row_as_json(b, i));
        }
    }
    rows.sort();
    rows
}

fn offsets_log(dir: &Path) -> BTreeMap<u64, Value> {
    let mut out = BTreeMap::new();
    for n in 0..20u64 {
        if let Some(mut v) = logged_offsets(&dir.join("chk"), n) {
            v.as_object_mut().unwrap().remove("batchTimestampMs");
            // The plan fingerprint covers the binding, whose port differs per cluster.
            v["conf"].as_object_mut().unwrap().remove("planFingerprint");
            out.insert(n, v);
        }
    }
    out
}

#[test]
fn kafka_to_files_killed_at_every_step_loses_and_duplicates_nothing() {
    // The uninterrupted reference run.
    let env = setup();
    let dir = env.dir.path();
    run_ok(dir);
    let reference = committed(dir);
    let mut expected: Vec<String> = (10..24i64)
        .filter(|i| *i != 17)
        .map(|i| json!({"id": i, "amount": i}).to_string())
        .collect();
    expected.sort();
    assert_eq!(reference, expected, "the uninterrupted run is right");
    let ref_quarantine = quarantined(dir);
    let q: Vec<Value> = ref_quarantine
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    assert_eq!(q.len(), 2, "{q:?}");
    let positions: Vec<(Value, Value, Value)> = q
        .iter()
        .map(|l| {
            (
                l["position"]["topic"].clone(),
                l["position"]["partition"].clone(),
                l["position"]["offset"].clone(),
            )
        })
        .collect();
    // id 5 is partition 1 offset 2; id 17 partition 1 offset 8.
    assert!(
        positions.contains(&(json!("orders"), json!(1), json!(2))),
        "{q:?}"
    );
    assert!(
        positions.contains(&(json!("orders"), json!(1), json!(8))),
        "{q:?}"
    );
    let ref_offsets = offsets_log(dir);
    // 24 offsets, 12 per partition, at most 5 per micro-batch: 2 per partition (Spark's
    // proportional shares, rounded down), 6 batches.
    assert_eq!(ref_offsets.len(), 6, "{ref_offsets:?}");
    let last = serde_json::to_string(&ref_offsets[&5]).unwrap();
    assert!(
        last.contains(r#"{"orders":{"0":12,"1":12}}"#),
        "the last batch ends at the high watermarks: {last}"
    );
    // Restarting a finished query reads nothing new.
    run_ok(dir);
    assert_eq!(committed(dir), reference);
    drop(env);

    for point in FAIL_POINTS {
        for batch in [0u64, 2, 4] {
            let label = format!("{point}:{batch}");
            let env = setup();
            let dir = env.dir.path();
            let o = run(dir, Some(&label));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            let before = logged_offsets(&dir.join("chk"), batch);
            assert!(before.is_some(), "{label}: the range is logged");
            run_ok(dir);
            assert_eq!(
                logged_offsets(&dir.join("chk"), batch),
                before,
                "{label}: the logged range is replayed as is"
            );
            assert_eq!(
                committed(dir),
                reference,
                "{label}: output differs from the uninterrupted run (lost or duplicated rows)"
            );
            assert_eq!(quarantined(dir), ref_quarantine, "{label}: quarantine");
            assert_eq!(offsets_log(dir), ref_offsets, "{label}: offsets log");
        }
    }
}

/// Every record value of a topic (all partitions, low to high watermark), sorted.
fn topic_values(bootstrap: &str, topic: &str) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    let parts: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut out = Vec::new();
    for p in parts {
        let (lo, hi) = c
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .unwrap();
        if hi <= lo {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(lo))
            .unwrap();
        c.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut next = lo;
        while next < hi {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out reading {topic}"
            );
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                next = m.offset() + 1;
                let v: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
                out.push(v.to_string());
            }
        }
    }
    out.sort();
    out
}

/// Kafka to Kafka: the transactional sink's replay detection (progress markers) keeps the
/// output exactly once *as the mock cluster's consumers see it* after a kill at every
/// step. The mock shows aborted and unfinished transactions' records too (it does not
/// filter for read_committed), so this proves the replay detection, not the broker's
/// transaction isolation (see the sink's module docs).
#[test]
fn kafka_to_kafka_killed_at_every_step_shows_every_record_once() {
    let expected: Vec<String> = {
        let mut v: Vec<String> = (10..24i64)
            .filter(|i| *i != 17)
            .map(|i| json!({"id": i, "amount": i}).to_string())
            .collect();
        v.sort();
        v
    };
    let env = setup_with("kafka://{bs}/big");
    run_ok(env.dir.path());
    let bs = env.cluster.bootstrap_servers();
    assert_eq!(topic_values(&bs, "big"), expected, "uninterrupted run");
    let markers = topic_values(&bs, "big.etlantic-progress");
    // 6 micro-batches (2 offsets per partition each, see the file sink case).
    assert_eq!(
        markers.len(),
        6,
        "one transaction per micro-batch: {markers:?}"
    );
    drop(env);
    for point in ["after_offsets", "in_sink", "after_sink", "after_commit"] {
        for batch in [0u64, 2, 4] {
            let label = format!("{point}:{batch}");
            let env = setup_with("kafka://{bs}/big");
            let dir = env.dir.path();
            let o = run(dir, Some(&label));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            run_ok(dir);
            let bs = env.cluster.bootstrap_servers();
            assert_eq!(
                topic_values(&bs, "big"),
                expected,
                "{label}: lost or duplicated records"
            );
            let mut batches: Vec<u64> = topic_values(&bs, "big.etlantic-progress")
                .iter()
                .map(|m| {
                    serde_json::from_str::<Value>(m).unwrap()["batch_id"]
                        .as_u64()
                        .unwrap()
                })
                .collect();
            batches.sort();
            assert_eq!(
                batches,
                vec![0, 1, 2, 3, 4, 5],
                "{label}: one committed marker per batch"
            );
        }
    }
}

fn explain(dir: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["explain", "pipeline.yaml"])
        .output()
        .unwrap();
    assert!(o.status.success(), "explain failed: {}", describe(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The plan states each pair's end-to-end guarantee and its condition.
#[test]
fn the_plan_shows_the_kafka_guarantees_with_their_condition() {
    let env = setup_with("kafka://{bs}/big");
    let text = explain(env.dir.path());
    assert!(
        text.contains(
            "orders → write_big: exactly_once (with a transactional Kafka broker (read_committed consumers))"
        ),
        "{text}"
    );
    let env = setup_with("kafka://{bs}/big?transactions=false");
    let text = explain(env.dir.path());
    assert!(text.contains("orders → write_big: at_least_once"), "{text}");
    let env = setup();
    let text = explain(env.dir.path());
    assert!(
        text.contains("orders → write_big: exactly_once\n"),
        "{text}"
    );
}

/// Offsets deleted by retention before the query read them: by default the run fails
/// with ETL712 naming topic, partition and range (it used to skip them silently); with
/// `failOnDataLoss=false` it goes on, and the loss is in the progress record and the run
/// report.
#[test]
fn offsets_lost_to_retention_fail_the_run_unless_allowed_and_then_are_reported() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 1, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("batch.num.messages", "1")
        .set("message.max.bytes", "2000000")
        .create()
        .unwrap();
    let send = |i: i64, pad: &str| {
        let v = json!({"id": i, "amount": 10 + i, "user": pad}).to_string();
        p.send(
            BaseRecord::<str, str>::to("orders")
                .partition(0)
                .payload(&v),
        )
        .map_err(|(e, _)| e)
        .unwrap();
        p.flush(Duration::from_secs(10)).unwrap();
    };
    for i in 0..3 {
        send(i, "u");
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let profile = |extra: &str| {
        format!(
            "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  orders: kafka://{bs}/orders?format=json&maxOffsetsPerTrigger=1{extra}\n  big: file://out/big/?format=jsonl\nquarantine: file://out/quarantine.jsonl\n"
        )
    };
    for (path, text) in [
        ("pipeline.yaml", PIPELINE.to_string()),
        ("profiles/local.yaml", profile("")),
        ("contracts/orders.yaml", ORDERS.to_string()),
        ("contracts/big.yaml", BIG.to_string()),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let run_args = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_etlantic"))
            .current_dir(dir)
            .args(["run", "pipeline.yaml", "--format", "json"])
            .args(extra)
            .env_remove("ETLANTIC_FAIL_POINT")
            .output()
            .unwrap()
    };
    // One micro-batch reads offset 0.
    let o = run_args(&["--max-batches", "1"]);
    assert!(o.status.success(), "{}", describe(&o));
    // Retention (the mock keeps 5 MB a partition) deletes offsets 1.. before they are read.
    let pad = "x".repeat(300_000);
    for i in 3..33 {
        send(i, &pad);
    }
    let c: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    let (lo, hi) =
        rdkafka::consumer::Consumer::fetch_watermarks(&c, "orders", 0, Duration::from_secs(5))
            .unwrap();
    assert!(lo > 3, "retention deleted the unread offsets: {lo}..{hi}");

    let o = run_args(&[]);
    assert_eq!(o.status.code(), Some(4), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let err = &report["errors"][0];
    assert_eq!(err["code"], "ETL712", "{report:#}");
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains("topic `orders` partition 0") && msg.contains("offsets 1..2"),
        "{msg}"
    );

    std::fs::write(
        dir.join("profiles/local.yaml"),
        profile("&failOnDataLoss=false"),
    )
    .unwrap();
    let o = run_args(&[]);
    assert!(o.status.success(), "{}", describe(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let losses = report["sources"][0]["data_loss"].as_array().unwrap();
    // One offset per micro-batch (maxOffsetsPerTrigger=1): each deleted offset is a loss.
    let lost: u64 = losses.iter().map(|l| l["records"].as_u64().unwrap()).sum();
    assert_eq!(lost, lo as u64 - 1, "{report:#}");
    assert_eq!(losses[0]["from"]["topic"], "orders");
    assert_eq!(losses[0]["from"]["offset"], 1);
    let progress = std::fs::read_to_string(dir.join("chk/progress.jsonl")).unwrap();
    let recorded: u64 = progress
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .flat_map(|p| {
            p["sources"][0]["dataLoss"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|l| l["records"].as_u64().unwrap())
        .sum();
    assert_eq!(recorded, lo as u64 - 1, "each loss is in a progress record");
    // Every record that was still there was read.
    let rows = committed(dir);
    assert_eq!(rows.len() as i64, 1 + (hi - lo), "{rows:?}");
}
