//! The `kafka://` sink against librdkafka's in-process mock cluster. The mock speaks the
//! transactional protocol (producer ids, epochs, fencing, EndTxn) but neither writes
//! transaction markers nor hides aborted records, so these tests show what it can: one
//! transaction (one progress marker) per batch, abort on failure, fencing of a zombie,
//! no second commit of a replayed batch.

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use etlantic_core::data::Table;
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{self, Sink, SinkBatch, SinkContext, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_sinks::kafka::{transactional_id, TRANSACTIONAL_CONDITION};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etlantic_sinks as _;

mod common;

const QUERY: &str = "q-7f3a";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("user", DataType::Utf8, true),
    ]))
}

fn table(ids: std::ops::Range<i64>) -> Table {
    let ids: Vec<i64> = ids.collect();
    let users: Vec<String> = ids.iter().map(|i| format!("u{}", i % 2)).collect();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(users)),
        ],
    )
    .unwrap();
    Table::new(schema(), vec![batch])
}

fn sink(uri: &str, mode: OutputMode) -> etlantic_core::Result<Box<dyn Sink>> {
    let uri = BindingUri::parse(uri).unwrap();
    plugin::sink_provider("kafka")
        .expect("kafka sink registered")
        .create(SinkContext {
            storage_options: Default::default(),
            asset: "alerts".into(),
            uri,
            schema: schema(),
            contract: None,
            root: std::env::temp_dir(),
            mode: ExecutionMode::Streaming,
            output_mode: mode,
        })
}

async fn write(s: &mut dyn Sink, batch_id: u64, t: &Table) -> etlantic_core::Result<WriteOutcome> {
    s.write(SinkBatch {
        query_id: QUERY,
        batch_id,
        output_mode: OutputMode::Append,
        data: t,
    })
    .await
}

/// Every (key, value) of a topic, partition by partition.
fn read_all(bootstrap: &str, topic: &str) -> Vec<(Option<String>, Value)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    let mut out = Vec::new();
    let parts: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
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
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut next = lo;
        while next < hi {
            assert!(Instant::now() < deadline, "timed out reading {topic}/{p}");
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                next = m.offset() + 1;
                out.push((
                    m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    serde_json::from_slice(m.payload().unwrap()).unwrap(),
                ));
            }
        }
    }
    out
}

fn ids(records: &[(Option<String>, Value)]) -> Vec<i64> {
    let mut v: Vec<i64> = records
        .iter()
        .map(|(_, v)| v["id"].as_i64().unwrap())
        .collect();
    v.sort();
    v
}

fn marker_batches(bootstrap: &str, topic: &str) -> Vec<u64> {
    read_all(bootstrap, &format!("{topic}.etlantic-progress"))
        .iter()
        .map(|(k, v)| {
            assert_eq!(
                k.as_deref(),
                Some(transactional_id(QUERY, "alerts").as_str())
            );
            assert_eq!(v["query_id"], QUERY);
            v["batch_id"].as_u64().unwrap()
        })
        .collect()
}

fn cluster(topic: &str, parts: i32) -> (MockCluster<'static, DefaultProducerContext>, String) {
    let c = MockCluster::new(1).unwrap();
    c.create_topic(topic, parts, 1).unwrap();
    let b = c.bootstrap_servers();
    (c, b)
}

#[tokio::test]
async fn declarations_are_honest() {
    let p = plugin::sink_provider("kafka").unwrap();
    let caps = p
        .capabilities(&BindingUri::parse("kafka://h:1/t").unwrap())
        .unwrap();
    assert_eq!(
        caps.guarantee,
        SinkGuarantee {
            protocol: SinkCommitProtocol::Transactional,
            condition: Some(TRANSACTIONAL_CONDITION.to_string()),
        }
    );
    assert!(!caps.output_modes.contains(&OutputMode::Complete));
    let plain = p
        .capabilities(&BindingUri::parse("kafka://h:1/t?transactions=false").unwrap())
        .unwrap();
    assert_eq!(
        plain.guarantee,
        SinkGuarantee::new(SinkCommitProtocol::PlainAppend)
    );
    for bad in [
        "kafka://h:1",
        "kafka://h:1/a,b",
        "kafka://h:1/t?transactions=maybe",
        "kafka://h:1/t?x=1",
    ] {
        assert_eq!(
            p.capabilities(&BindingUri::parse(bad).unwrap())
                .unwrap_err()
                .code(),
            "ETL007",
            "{bad}"
        );
    }
    assert_eq!(
        sink("kafka://h:1/t", OutputMode::Complete)
            .err()
            .unwrap()
            .code(),
        "ETL504"
    );
    assert_eq!(
        sink("kafka://h:1/t?key=nope", OutputMode::Append)
            .err()
            .unwrap()
            .code(),
        "ETL007"
    );
}

#[tokio::test]
async fn one_transaction_and_one_marker_per_batch_and_keys_from_a_column() {
    let (_c, bs) = cluster("alerts", 3);
    let mut s = sink(&format!("kafka://{bs}/alerts?key=user"), OutputMode::Append).unwrap();
    assert_eq!(s.last_committed_batch(QUERY).await.unwrap(), None);
    assert_eq!(
        write(s.as_mut(), 0, &table(0..2)).await.unwrap(),
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(
        write(s.as_mut(), 1, &table(2..5)).await.unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert_eq!(
        write(s.as_mut(), 2, &table(5..6)).await.unwrap(),
        WriteOutcome::Written { rows: 1 }
    );
    s.close().await.unwrap();
    let data = read_all(&bs, "alerts");
    assert_eq!(ids(&data), (0..6).collect::<Vec<_>>());
    for (k, v) in &data {
        assert_eq!(k.as_deref(), v["user"].as_str(), "keyed by the user column");
        assert_eq!(v.as_object().unwrap().len(), 2, "the row as JSON: {v}");
    }
    let markers = read_all(&bs, "alerts.etlantic-progress");
    let rows: Vec<(u64, u64)> = markers
        .iter()
        .map(|(_, v)| (v["batch_id"].as_u64().unwrap(), v["rows"].as_u64().unwrap()))
        .collect();
    assert_eq!(rows, vec![(0, 2), (1, 3), (2, 1)], "one marker per batch");
    assert_eq!(markers[0].1["topic"], "alerts");
    assert_eq!(markers[0].1["sink"], "alerts");
    // A new instance (a restart) reads the last committed batch back from the markers.
    let mut again = sink(&format!("kafka://{bs}/alerts?key=user"), OutputMode::Append).unwrap();
    assert_eq!(again.last_committed_batch(QUERY).await.unwrap(), Some(2));
    assert_eq!(
        again.last_committed_batch("another-query").await.unwrap(),
        None
    );
}

#[tokio::test]
async fn a_replayed_batch_is_not_committed_twice() {
    let (_c, bs) = cluster("alerts", 2);
    let uri = format!("kafka://{bs}/alerts");
    let mut s = sink(&uri, OutputMode::Append).unwrap();
    write(s.as_mut(), 0, &table(0..3)).await.unwrap();
    write(s.as_mut(), 1, &table(3..5)).await.unwrap();
    // Same instance, same batch again.
    assert_eq!(
        write(s.as_mut(), 1, &table(3..5)).await.unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    drop(s);
    // After a restart: batch 1 is replayed (the commit log missed it), then batch 2.
    let mut s = sink(&uri, OutputMode::Append).unwrap();
    assert_eq!(
        write(s.as_mut(), 1, &table(3..5)).await.unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    assert_eq!(
        write(s.as_mut(), 2, &table(5..7)).await.unwrap(),
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(ids(&read_all(&bs, "alerts")), (0..7).collect::<Vec<_>>());
    assert_eq!(marker_batches(&bs, "alerts"), vec![0, 1, 2]);
}

#[tokio::test]
async fn a_failed_produce_aborts_the_transaction_and_the_batch_can_be_retried() {
    let (c, bs) = cluster("alerts", 1);
    let uri = format!("kafka://{bs}/alerts");
    let mut s = sink(&uri, OutputMode::Append).unwrap();
    write(s.as_mut(), 0, &table(0..2)).await.unwrap();
    // The broker rejects the next Produce request (non-retriable).
    c.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let err = write(s.as_mut(), 1, &table(2..5)).await.unwrap_err();
    assert_eq!(err.code(), "ETL709", "{err}");
    // Nothing of batch 1 reached the log, and no marker: it is not committed.
    assert_eq!(ids(&read_all(&bs, "alerts")), vec![0, 1]);
    assert_eq!(marker_batches(&bs, "alerts"), vec![0]);
    assert_eq!(s.last_committed_batch(QUERY).await.unwrap(), Some(0));
    // The runtime retries the batch (here: in the same process) and it commits once.
    assert_eq!(
        write(s.as_mut(), 1, &table(2..5)).await.unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert_eq!(ids(&read_all(&bs, "alerts")), (0..5).collect::<Vec<_>>());
    assert_eq!(marker_batches(&bs, "alerts"), vec![0, 1]);
}

/// Fencing a zombie is the broker's job: `init_transactions` with the same transactional
/// id bumps the id's epoch and the broker rejects the older epoch. The sink's part is to
/// derive the same transactional id after every restart and to call `init_transactions`
/// when it opens, which is what this test shows. The mock cluster cannot show the
/// fencing itself: its InitProducerId gives every new producer instance a fresh producer
/// id and keeps the old one valid (librdkafka 2.12 `rdkafka_mock_handlers.c`), so a
/// zombie's commit succeeds there; on a real broker it fails with PRODUCER_FENCED.
#[tokio::test]
async fn a_restarted_sink_reuses_its_transactional_id_and_reinitialises_transactions() {
    let (_c, bs) = cluster("alerts", 2);
    let uri = format!("kafka://{bs}/alerts");
    let mut first = sink(&uri, OutputMode::Append).unwrap();
    write(first.as_mut(), 0, &table(0..2)).await.unwrap();
    drop(first);
    let mut second = sink(&uri, OutputMode::Append).unwrap();
    assert_eq!(second.last_committed_batch(QUERY).await.unwrap(), Some(0));
    write(second.as_mut(), 1, &table(2..4)).await.unwrap();
    // Both runs' transactions carry the same transactional id (the marker key).
    let keys: Vec<Option<String>> = read_all(&bs, "alerts.etlantic-progress")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let id = transactional_id(QUERY, "alerts");
    assert_eq!(keys, vec![Some(id.clone()), Some(id.clone())]);
    assert_eq!(id, "etlantic-q-7f3a-alerts");
    // A transactionalId in the binding overrides the derived one.
    let mut custom = sink(
        &format!("{uri}?transactionalId=fixed-id"),
        OutputMode::Append,
    )
    .unwrap();
    assert_eq!(custom.last_committed_batch(QUERY).await.unwrap(), None);
    write(custom.as_mut(), 0, &table(4..5)).await.unwrap();
    let keys: Vec<Option<String>> = read_all(&bs, "alerts.etlantic-progress")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(keys.contains(&Some("fixed-id".to_string())));
    assert_eq!(ids(&read_all(&bs, "alerts")), (0..5).collect::<Vec<_>>());
}

#[tokio::test]
async fn without_transactions_the_sink_is_plain_at_least_once() {
    let (_c, bs) = cluster("alerts", 1);
    let mut s = sink(
        &format!("kafka://{bs}/alerts?transactions=false"),
        OutputMode::Append,
    )
    .unwrap();
    write(s.as_mut(), 0, &table(0..2)).await.unwrap();
    // A replay appends again: this is what PlainAppend declares.
    write(s.as_mut(), 0, &table(0..2)).await.unwrap();
    assert_eq!(s.last_committed_batch(QUERY).await.unwrap(), None);
    assert_eq!(ids(&read_all(&bs, "alerts")), vec![0, 0, 1, 1]);
    assert_eq!(read_all(&bs, "alerts.etlantic-progress"), vec![]);
}

/// A batch run has no checkpoint: every run of the same plan (same fingerprint, batch 0)
/// is a new write. The sink used to find the first run's progress marker and skip the
/// second run's rows while the run reported success.
#[test]
fn every_batch_run_into_kafka_writes_its_rows() {
    let (_c, bs) = cluster("revenue", 1);
    let p = common::Project::init();
    p.edit(
        "profiles/local.yaml",
        "customer_revenue: file://out/customer_revenue.csv",
        &format!("customer_revenue: kafka://{bs}/revenue"),
    );
    for run in 1..=2u64 {
        let r = p.run(&["run", "--format", "json"]);
        r.ok();
        let report = r.stdout_json();
        assert_eq!(report["sinks"][0]["rows"], 3, "run {run}: {report:#}");
        let customers: Vec<String> = read_all(&bs, "revenue")
            .into_iter()
            .map(|(_, v)| v["customer"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(customers.len() as u64, 3 * run, "run {run}: {customers:?}");
    }
    // Batch runs keep no progress markers.
    assert_eq!(read_all(&bs, "revenue.etlantic-progress"), vec![]);
}
