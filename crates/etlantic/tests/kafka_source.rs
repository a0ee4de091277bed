//! The `kafka://` source against librdkafka's in-process mock cluster (real Kafka
//! protocol over TCP, no hand-written mocks).

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Offset;
use etlantic_core::plugin::{self, ReadLimit, Source, SourceBatch, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_sources::decode::row_as_json;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etlantic_sources::kafka::{
    proportional_split, KafkaSourceOptions, KafkaSourceProvider, StartingOffsets, ValueFormat,
};

fn producer(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap()
}

/// Produces `(partition, key, value)` records and waits for them to be acknowledged.
fn produce(p: &BaseProducer, topic: &str, records: &[(i32, Option<&str>, &str)]) {
    for (part, key, value) in records {
        let mut r = BaseRecord::<str, str>::to(topic)
            .partition(*part)
            .payload(*value);
        if let Some(k) = key {
            r = r.key(*k);
        }
        p.send(r).map_err(|(e, _)| e).unwrap();
    }
    p.flush(Duration::from_secs(10)).unwrap();
}

/// `n` records `{"id":i}` spread round-robin over `parts` partitions.
fn produce_ids(p: &BaseProducer, topic: &str, parts: i32, ids: std::ops::Range<i64>) {
    let values: Vec<(i32, String)> = ids
        .map(|i| {
            (
                (i % parts as i64) as i32,
                json!({"id": i, "name": format!("n{i}")}).to_string(),
            )
        })
        .collect();
    let recs: Vec<(i32, Option<&str>, &str)> =
        values.iter().map(|(p, v)| (*p, None, v.as_str())).collect();
    produce(p, topic, &recs);
}

fn raw_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("headers", DataType::Utf8, true),
    ]))
}

fn json_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("kafka_partition", DataType::Int32, true),
        Field::new("kafka_offset", DataType::Int64, true),
    ]))
}

fn source(uri: &str, schema: SchemaRef, state: Option<&Path>) -> Box<dyn Source> {
    let uri = BindingUri::parse(uri).unwrap();
    std::hint::black_box(&KafkaSourceProvider); // keep the plugin's object linked
    let provider = plugin::source_provider("kafka").expect("kafka source registered");
    let caps = provider.capabilities(&uri).unwrap();
    assert!(caps.bounded && caps.unbounded);
    assert_eq!(
        caps.guarantee,
        etlantic_core::guarantee::SourceGuarantee::Replayable
    );
    provider
        .create(SourceContext {
            storage_options: Default::default(),
            asset: "events".into(),
            uri,
            schema,
            contract: None,
            root: std::env::temp_dir(),
            mode: if state.is_some() {
                ExecutionMode::Streaming
            } else {
                ExecutionMode::Batch
            },
            state: state.map(etlantic_core::storage::open),
        })
        .unwrap()
}

fn rows(b: &SourceBatch) -> Vec<Value> {
    b.batches
        .iter()
        .flat_map(|batch| {
            (0..batch.num_rows())
                .map(move |i| serde_json::from_str(&row_as_json(batch, i)).unwrap())
        })
        .collect()
}

fn ids(b: &SourceBatch) -> Vec<i64> {
    rows(b).iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

/// Reads batches until nothing is new; returns every batch's rows and the last offset.
async fn drain(
    src: &mut dyn Source,
    mut pos: Option<Offset>,
    limit: &ReadLimit,
) -> (Vec<Vec<i64>>, Option<Offset>) {
    let mut out = Vec::new();
    loop {
        let end = src.latest_offset(pos.as_ref(), limit).await.unwrap();
        if end == pos {
            return (out, pos);
        }
        let end = end.unwrap();
        let b = src.read(pos.as_ref(), &end).await.unwrap();
        assert!(b.rejected.is_empty(), "{:?}", b.rejected);
        out.push(ids(&b));
        pos = Some(end);
    }
}

fn cluster_with(
    topic: &str,
    parts: i32,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    String,
) {
    let c = MockCluster::new(1).unwrap();
    c.create_topic(topic, parts, 1).unwrap();
    let b = c.bootstrap_servers();
    (c, b)
}

#[tokio::test]
async fn raw_columns_key_value_headers_timestamp_from_every_partition() {
    let (_c, bs) = cluster_with("clicks", 3);
    let p = producer(&bs);
    for i in 0..6i64 {
        let headers = OwnedHeaders::new().insert(Header {
            key: "h",
            value: Some(&format!("v{i}")),
        });
        p.send(
            BaseRecord::to("clicks")
                .partition((i % 3) as i32)
                .key(&format!("k{i}"))
                .payload(&format!("value {i}"))
                .timestamp(1_700_000_000_000 + i)
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    }
    p.flush(Duration::from_secs(10)).unwrap();

    let mut src = source(&format!("kafka://{bs}/clicks"), raw_schema(), None);
    let end = src
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.0, json!({"clicks": {"0": 2, "1": 2, "2": 2}}));
    let b = src.read(None, &end).await.unwrap();
    assert!(b.rejected.is_empty());
    let rows = rows(&b);
    assert_eq!(rows.len(), 6);
    // Ordered by (topic, partition, offset).
    let order: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(order, vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
    let r3 = rows.iter().find(|r| r["key"] == "k3").unwrap();
    assert_eq!(r3["value"], "value 3");
    assert_eq!(r3["topic"], "clicks");
    assert_eq!(r3["partition"], 0);
    assert_eq!(r3["offset"], 1);
    assert!(
        r3["timestamp"]
            .as_str()
            .unwrap()
            .starts_with("2023-11-14T22:13:20.003"),
        "{}",
        r3["timestamp"]
    );
    let headers: Value = serde_json::from_str(r3["headers"].as_str().unwrap()).unwrap();
    assert_eq!(headers, json!([{"key": "h", "value": "v3"}]));
    // Re-reading the same range returns the same records.
    let again = src.read(None, &end).await.unwrap();
    assert_eq!(rows, self::rows(&again));
}

#[tokio::test]
async fn starting_offsets_earliest_latest_and_specific() {
    let (_c, bs) = cluster_with("t", 3);
    let p = producer(&bs);
    produce_ids(&p, "t", 3, 0..9); // 3 per partition
    let unlimited = ReadLimit::unlimited();

    // earliest: everything.
    let mut src = source(&format!("kafka://{bs}/t?format=json"), json_schema(), None);
    let (batches, _) = drain(src.as_mut(), None, &unlimited).await;
    let mut all: Vec<i64> = batches.concat();
    all.sort();
    assert_eq!(all, (0..9).collect::<Vec<_>>());

    // latest: only what arrives after the query started; the start is persisted.
    let dir = tempfile::tempdir().unwrap();
    let mut src = source(
        &format!("kafka://{bs}/t?format=json&startingOffsets=latest"),
        json_schema(),
        Some(dir.path()),
    );
    assert_eq!(src.latest_offset(None, &unlimited).await.unwrap(), None);
    let initial: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("initial-offsets.json")).unwrap())
            .unwrap();
    assert_eq!(initial, json!({"t": {"0": 3, "1": 3, "2": 3}}));
    produce_ids(&p, "t", 3, 9..12);
    // A new instance (a restart) starts from the persisted positions, not from "latest now".
    let mut src = source(
        &format!("kafka://{bs}/t?format=json&startingOffsets=latest"),
        json_schema(),
        Some(dir.path()),
    );
    let (batches, _) = drain(src.as_mut(), None, &unlimited).await;
    let mut got = batches.concat();
    got.sort();
    assert_eq!(got, vec![9, 10, 11]);

    // specific: partition 0 from offset 2, partition 1 latest (-1), partition 2 unnamed
    // (earliest).
    let spec = r#"{"t":{"0":2,"1":-1}}"#;
    let mut src = source(
        &format!("kafka://{bs}/t?format=json&startingOffsets={spec}"),
        json_schema(),
        None,
    );
    let (batches, _) = drain(src.as_mut(), None, &unlimited).await;
    let mut got = batches.concat();
    got.sort();
    // partition 0 holds ids 0,3,6,9 (offset 2 = id 6); partition 2 holds 2,5,8,11.
    assert_eq!(got, vec![2, 5, 6, 8, 9, 11]);
}

#[tokio::test]
async fn max_offsets_per_trigger_splits_into_micro_batches() {
    let (_c, bs) = cluster_with("t", 3);
    let p = producer(&bs);
    produce_ids(&p, "t", 3, 0..30);
    let mut src = source(
        &format!("kafka://{bs}/t?format=json&maxOffsetsPerTrigger=7"),
        json_schema(),
        None,
    );
    let (batches, _) = drain(src.as_mut(), None, &ReadLimit::unlimited()).await;
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    // 7 over three backlogs of 10: 2 each (Spark rounds the proportional shares down).
    assert_eq!(sizes, vec![6, 6, 6, 6, 6], "{batches:?}");
    let mut all = batches.concat();
    all.sort();
    assert_eq!(all, (0..30).collect::<Vec<_>>());
    // The runtime's limit applies too (the smaller wins).
    let mut src = source(
        &format!("kafka://{bs}/t?format=json&maxOffsetsPerTrigger=7"),
        json_schema(),
        None,
    );
    let limit = ReadLimit {
        max_files: None,
        max_records: Some(4),
    };
    let end = src.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(end.0, json!({"t": {"0": 1, "1": 1, "2": 1}}));
}

/// The source keeps its consumer's assignment from one read to the next and reads ahead
/// meanwhile; a read that starts elsewhere (a replay) assigns anew. Either way a range
/// gives the same records, in (partition, offset) order.
#[tokio::test]
async fn reads_that_go_on_and_reads_that_go_back_give_the_same_records() {
    let (_c, bs) = cluster_with("t", 3);
    let p = producer(&bs);
    produce_ids(&p, "t", 3, 0..3000);
    let uri = format!("kafka://{bs}/t?format=json&maxOffsetsPerTrigger=500");
    let limit = ReadLimit::unlimited();
    let mut src = source(&uri, json_schema(), None);
    let mut ends = vec![None];
    let mut batches = Vec::new();
    loop {
        let start = ends.last().cloned().flatten();
        let end = src.latest_offset(start.as_ref(), &limit).await.unwrap();
        if end == start {
            break;
        }
        let end = end.unwrap();
        batches.push(ids(&src.read(start.as_ref(), &end).await.unwrap()));
        ends.push(Some(end));
    }
    assert!(
        batches.len() >= 6,
        "{:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for b in &batches {
        // Partition by partition (ids are spread round-robin), each in offset order.
        let mut expected = b.clone();
        expected.sort_by_key(|id| (id % 3, *id));
        assert_eq!(b, &expected);
    }
    let mut all = batches.concat();
    all.sort();
    assert_eq!(all, (0..3000).collect::<Vec<_>>());
    // Back to the second batch, then on to the third, then the first again: the same.
    for i in [1usize, 2, 0, 1] {
        let b = src
            .read(ends[i].as_ref(), ends[i + 1].as_ref().unwrap())
            .await
            .unwrap();
        assert_eq!(ids(&b), batches[i], "batch {i} read again");
    }
}

#[tokio::test]
async fn offsets_survive_a_restart_nothing_reread_or_lost() {
    let (_c, bs) = cluster_with("t", 2);
    let p = producer(&bs);
    produce_ids(&p, "t", 2, 0..20);
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("kafka://{bs}/t?format=json&maxOffsetsPerTrigger=6");
    let limit = ReadLimit::unlimited();

    // First run: two micro-batches, then "crash" (the checkpoint keeps the offsets).
    let mut src = source(&uri, json_schema(), Some(dir.path()));
    let e1 = src.latest_offset(None, &limit).await.unwrap().unwrap();
    let b1 = ids(&src.read(None, &e1).await.unwrap());
    let e2 = src.latest_offset(Some(&e1), &limit).await.unwrap().unwrap();
    let b2 = ids(&src.read(Some(&e1), &e2).await.unwrap());
    let checkpointed = serde_json::to_string(&e2.0).unwrap();
    drop(src);

    // Restart: a new instance replays batch 2 from the checkpointed range (same rows),
    // then continues.
    produce_ids(&p, "t", 2, 20..25);
    let e2: Offset = Offset(serde_json::from_str(&checkpointed).unwrap());
    let mut src = source(&uri, json_schema(), Some(dir.path()));
    assert_eq!(ids(&src.read(Some(&e1), &e2).await.unwrap()), b2);
    let (rest, _) = drain(src.as_mut(), Some(e2), &limit).await;
    let mut all: Vec<i64> = b1.into_iter().chain(b2).chain(rest.concat()).collect();
    let n = all.len();
    all.sort();
    assert_eq!(all, (0..25).collect::<Vec<_>>(), "nothing lost");
    assert_eq!(n, 25, "nothing read twice");
    assert_eq!(
        all.iter().collect::<BTreeSet<_>>().len(),
        25,
        "nothing read twice"
    );
}

#[tokio::test]
async fn malformed_json_values_are_quarantined_with_topic_partition_offset() {
    let (_c, bs) = cluster_with("t", 1);
    let p = producer(&bs);
    produce(
        &p,
        "t",
        &[
            (0, None, r#"{"id":1,"name":"a"}"#),
            (0, None, "not json"),
            (0, None, r#"[1,2]"#),
            (0, None, r#"{"id":"x"}"#),
            (0, None, r#"{"name":"no id"}"#),
            (0, None, r#"{"id":2}"#),
        ],
    );
    let mut src = source(&format!("kafka://{bs}/t?format=json"), json_schema(), None);
    let end = src
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    let b = src.read(None, &end).await.unwrap();
    let good = rows(&b);
    assert_eq!(
        good,
        vec![
            json!({"id": 1, "name": "a", "kafka_partition": 0, "kafka_offset": 0}),
            json!({"id": 2, "name": null, "kafka_partition": 0, "kafka_offset": 5}),
        ]
    );
    let rej: Vec<String> = b
        .rejected
        .iter()
        .map(|r| {
            format!(
                "{} {:?}/{:?}/{:?} {}",
                r.code, r.position.topic, r.position.partition, r.position.offset, r.raw
            )
        })
        .collect();
    assert_eq!(
        rej,
        vec![
            r#"ETL701 Some("t")/Some(0)/Some(1) not json"#,
            r#"ETL701 Some("t")/Some(0)/Some(2) [1,2]"#,
            r#"ETL702 Some("t")/Some(0)/Some(3) {"id":"x"}"#,
            r#"ETL703 Some("t")/Some(0)/Some(4) {"name":"no id"}"#,
        ]
    );
    assert!(b.rejected[0]
        .position
        .to_string()
        .contains("topic t partition 0 offset 1"));
}

#[tokio::test]
async fn partitions_that_appear_mid_stream_are_discovered_and_read_from_earliest() {
    // The mock cluster cannot add partitions to an existing topic (no CreatePartitions),
    // so the new partitions are those of a listed topic that is created mid-stream: the
    // same discovery path (metadata fetch at every micro-batch).
    let (c, bs) = cluster_with("a", 1);
    let p = producer(&bs);
    produce_ids(&p, "a", 1, 0..3);
    let mut src = source(
        &format!("kafka://{bs}/a,b?format=json"),
        json_schema(),
        None,
    );
    let limit = ReadLimit::unlimited();
    let e1 = src.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(e1.0, json!({"a": {"0": 3}}));
    assert_eq!(ids(&src.read(None, &e1).await.unwrap()), vec![0, 1, 2]);

    c.create_topic("b", 2, 1).unwrap();
    produce_ids(&p, "b", 2, 10..14);
    produce_ids(&p, "a", 1, 3..4);
    let e2 = src.latest_offset(Some(&e1), &limit).await.unwrap().unwrap();
    assert_eq!(e2.0, json!({"a": {"0": 4}, "b": {"0": 2, "1": 2}}));
    let mut got = ids(&src.read(Some(&e1), &e2).await.unwrap());
    got.sort();
    assert_eq!(got, vec![3, 10, 11, 12, 13]);
    // Nothing new: the same offset comes back.
    assert_eq!(
        src.latest_offset(Some(&e2), &limit).await.unwrap(),
        Some(e2)
    );
}

#[test]
fn the_budget_is_split_in_proportion_to_the_backlogs_like_spark() {
    assert_eq!(proportional_split(&[10, 10, 10], 9), vec![3, 3, 3]);
    assert_eq!(proportional_split(&[1, 10, 10], 9), vec![1, 4, 4]);
    // A skewed topic: the big partition gets the big share.
    assert_eq!(proportional_split(&[121, 60], 20), vec![13, 6]);
    assert_eq!(proportional_split(&[10, 10], 3), vec![1, 1]);
    assert_eq!(proportional_split(&[0, 5], 100), vec![0, 5]);
    // A share below one offset is rounded up: no partition starves.
    assert_eq!(proportional_split(&[3, 3, 3], 1), vec![1, 1, 1]);
    assert_eq!(proportional_split(&[1000, 1], 10), vec![9, 1]);
}

#[test]
fn options_are_checked() {
    let ok = BindingUri::parse(
        "kafka://127.0.0.1:9092,127.0.0.1:9093/a,b?startingOffsets=%7B%22a%22%3A%7B%220%22%3A5%7D%7D&maxOffsetsPerTrigger=10&format=json&kafka.client.id=x",
    )
    .unwrap();
    let o = KafkaSourceOptions::from_uri(&ok).unwrap();
    assert_eq!(o.bootstrap, "127.0.0.1:9092,127.0.0.1:9093");
    assert_eq!(o.topics, vec!["a", "b"]);
    assert_eq!(o.max_offsets_per_trigger, Some(10));
    assert_eq!(o.format, ValueFormat::Json);
    let StartingOffsets::Specific(m) = o.starting else {
        panic!("specific offsets expected")
    };
    assert_eq!(m["a"][&0], 5);
    assert_eq!(o.client["client.id"], "x");
    assert!(o.fail_on_data_loss, "Spark's default");
    let lenient = BindingUri::parse("kafka://h:1/t?failOnDataLoss=false").unwrap();
    assert!(
        !KafkaSourceOptions::from_uri(&lenient)
            .unwrap()
            .fail_on_data_loss
    );
    for bad in [
        "kafka://host:1",
        "kafka:///t",
        "kafka://h:1/t?format=avro",
        "kafka://h:1/t?maxOffsetsPerTrigger=0",
        "kafka://h:1/t?startingOffsets=middle",
        "kafka://h:1/t?what=1",
        "kafka://h:1/t?failOnDataLoss=maybe",
    ] {
        let u = BindingUri::parse(bad).unwrap();
        assert_eq!(
            KafkaSourceOptions::from_uri(&u).unwrap_err().code(),
            "ETL007",
            "{bad}"
        );
    }
}

/// Produces `n` records of about 300 KB, one produce request each, so that the mock
/// cluster (which keeps at most 5 MB per partition, dropping its oldest message sets)
/// deletes the oldest records as retention would.
fn produce_until_retention_deletes(bootstrap: &str, topic: &str, n: usize) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("batch.num.messages", "1")
        .set("message.max.bytes", "2000000")
        .create()
        .unwrap();
    let pad = "x".repeat(300_000);
    for i in 0..n {
        let v = json!({"id": 1000 + i as i64, "name": pad}).to_string();
        p.send(BaseRecord::<str, str>::to(topic).partition(0).payload(&v))
            .map_err(|(e, _)| e)
            .unwrap();
        p.flush(Duration::from_secs(10)).unwrap();
    }
}

/// Offsets retention deleted before the query read them fail the read with ETL712,
/// naming the topic, the partition and the lost offsets (Spark's failOnDataLoss, the
/// default); they used to be skipped silently. With `failOnDataLoss=false` the read goes
/// on from the earliest offset left and reports the gap.
#[tokio::test]
async fn offsets_lost_to_retention_fail_the_read_or_are_reported() {
    let (_c, bs) = cluster_with("t", 1);
    produce_ids(&producer(&bs), "t", 1, 0..3);
    let dir = tempfile::tempdir().unwrap();
    let limit = ReadLimit::unlimited();
    let strict = format!("kafka://{bs}/t?format=json&maxOffsetsPerTrigger=1");
    let mut src = source(&strict, json_schema(), Some(dir.path()));
    let e0 = src.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(ids(&src.read(None, &e0).await.unwrap()), vec![0]);
    drop(src);

    produce_until_retention_deletes(&bs, "t", 30);
    let probe: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    let (lo, hi) =
        rdkafka::consumer::Consumer::fetch_watermarks(&probe, "t", 0, Duration::from_secs(5))
            .unwrap();
    assert!(
        lo > 3,
        "the mock's retention deleted the first records: {lo}..{hi}"
    );

    // The query goes on from offset 1: its next range starts in the deleted part.
    let mut src = source(
        &format!("kafka://{bs}/t?format=json"),
        json_schema(),
        Some(dir.path()),
    );
    let end = src.latest_offset(Some(&e0), &limit).await.unwrap().unwrap();
    let err = src.read(Some(&e0), &end).await.unwrap_err();
    assert_eq!(err.code(), "ETL712", "{err}");
    let text = err.to_string();
    assert!(
        text.contains("topic `t` partition 0") && text.contains(&format!("offsets 1..{lo}")),
        "{text}"
    );

    let mut lenient = source(
        &format!("kafka://{bs}/t?format=json&failOnDataLoss=false"),
        json_schema(),
        Some(dir.path()),
    );
    let b = lenient.read(Some(&e0), &end).await.unwrap();
    let got = ids(&b);
    assert_eq!(
        got.len() as i64,
        hi - lo,
        "every record still there is read"
    );
    assert_eq!(b.lost.len(), 1, "{:?}", b.lost);
    assert_eq!(b.lost[0].from.topic.as_deref(), Some("t"));
    assert_eq!(b.lost[0].from.partition, Some(0));
    assert_eq!(b.lost[0].from.offset, Some(1));
    assert_eq!(b.lost[0].records, Some(lo as u64 - 1));
    assert!(b.lost[0].reason.contains("failOnDataLoss=false"));

    // A new query asking to start at an offset retention deleted is a loss too.
    let specific =
        format!("kafka://{bs}/t?format=json&startingOffsets=%7B%22t%22%3A%7B%220%22%3A2%7D%7D");
    let fresh = tempfile::tempdir().unwrap();
    let mut src = source(&specific, json_schema(), Some(fresh.path()));
    let end = src.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(src.read(None, &end).await.unwrap_err().code(), "ETL712");
}
