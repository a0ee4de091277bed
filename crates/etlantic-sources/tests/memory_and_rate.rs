//! The `memory://` source and the `rate://` generator.

mod common;

use arrow::array::{
    Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use common::*;
use etlantic_core::data::Offset;
use etlantic_core::plugin::{source_provider, ReadLimit, SourceBatch, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_sources::memory::MemoryStream;
use etlantic_sources::rate::RateSource;
use serde_json::json;
use std::sync::Arc;

fn int_col(out: &SourceBatch, name: &str) -> Vec<i64> {
    out.batches
        .iter()
        .flat_map(|b| {
            let a = b
                .column_by_name(name)
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            a.values().to_vec()
        })
        .collect()
}

/// A batch with some of the `events` columns, `id` nullable (the contract requires it).
fn events_batch(ids: &[Option<i64>], notes: &[&str]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("note", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            Arc::new(StringArray::from(notes.to_vec())),
        ],
    )
    .unwrap()
}

#[tokio::test]
async fn memory_stream_offsets_count_pushed_batches_and_replay() {
    let c = contract(EVENTS);
    let first = events_batch(&[Some(1), Some(2)], &["a", "b"]);
    MemoryStream::register("mem-offsets", first.schema());
    let mut src = source_provider("memory")
        .expect("memory source registered")
        .create(ctx(
            std::path::Path::new("."),
            "events",
            "memory://mem-offsets",
            &c,
            ExecutionMode::Streaming,
            None,
        ))
        .unwrap();
    let unlimited = ReadLimit::unlimited();
    assert_eq!(src.latest_offset(None, &unlimited).await.unwrap(), None);
    assert_eq!(MemoryStream::push("mem-offsets", first).unwrap(), 1);
    assert_eq!(
        MemoryStream::push("mem-offsets", events_batch(&[Some(3)], &["c"])).unwrap(),
        2
    );
    let o2 = src.latest_offset(None, &unlimited).await.unwrap().unwrap();
    assert_eq!(o2, Offset(json!(2)));
    let out = src.read(None, &o2).await.unwrap();
    assert_eq!(int_col(&out, "id"), vec![1, 2, 3]);
    assert_eq!(out.batches[0].schema(), c.arrow_schema());
    // Replayable: the same range gives the same rows.
    assert_eq!(
        int_col(&src.read(None, &o2).await.unwrap(), "id"),
        vec![1, 2, 3]
    );
    assert_eq!(
        src.latest_offset(Some(&o2), &unlimited).await.unwrap(),
        Some(o2.clone())
    );

    MemoryStream::push(
        "mem-offsets",
        events_batch(&[Some(4), Some(5)], &["d", "e"]),
    )
    .unwrap();
    MemoryStream::push("mem-offsets", events_batch(&[Some(6)], &["f"])).unwrap();
    // max_records: whole batches within the budget, at least one.
    let one_row = ReadLimit {
        max_files: None,
        max_records: Some(1),
    };
    let o3 = src
        .latest_offset(Some(&o2), &one_row)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o3, Offset(json!(3)));
    assert_eq!(
        int_col(&src.read(Some(&o2), &o3).await.unwrap(), "id"),
        vec![4, 5]
    );
    let o4 = src
        .latest_offset(Some(&o3), &unlimited)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        int_col(&src.read(Some(&o3), &o4).await.unwrap(), "id"),
        vec![6]
    );
    assert_eq!(MemoryStream::len("mem-offsets"), Some(4));
    let e = src.read(None, &Offset(json!(9))).await.unwrap_err();
    assert_eq!(e.code(), "ETL801");
}

#[tokio::test]
async fn memory_stream_checks_the_contract_per_row() {
    let c = contract(EVENTS);
    let batch = events_batch(&[Some(1), None, Some(-3), Some(4)], &["a", "b", "c", "d"]);
    MemoryStream::register("mem-contract", batch.schema());
    MemoryStream::push("mem-contract", events_batch(&[Some(0)], &["z"])).unwrap();
    MemoryStream::push("mem-contract", batch).unwrap();
    let mut src = source_provider("memory")
        .unwrap()
        .create(ctx(
            std::path::Path::new("."),
            "events",
            "memory://mem-contract",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let out = read_all(&mut src).await;
    assert_eq!(int_col(&out, "id"), vec![0, 1, 4]);
    assert_eq!(
        summary(&out.rejected),
        vec![
            ("ETL703".into(), Some("id".into()), None, Some(2)),
            ("ETL704".into(), Some("id".into()), None, Some(3)),
        ]
    );
    assert_eq!(out.rejected[0].raw, r#"{"id":null,"note":"b"}"#);
    assert_eq!(out.rejected[1].position.asset, "events");

    // Pushing a batch of another schema, or to an unknown stream, fails.
    let other = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)])),
        vec![Arc::new(Int32Array::from(vec![1])) as ArrayRef],
    )
    .unwrap();
    assert_eq!(
        MemoryStream::push("mem-contract", other.clone())
            .unwrap_err()
            .code(),
        "ETL301"
    );
    assert_eq!(
        MemoryStream::push("mem-nope", other).unwrap_err().code(),
        "ETL706"
    );
}

fn rate_ctx(uri: &str, schema: Arc<Schema>, state: Option<std::path::PathBuf>) -> SourceContext {
    SourceContext {
        storage_options: Default::default(),
        asset: "ticks".into(),
        uri: BindingUri::parse(uri).unwrap(),
        schema,
        contract: None,
        root: ".".into(),
        mode: ExecutionMode::Streaming,
        state: state.map(|d| etlantic_core::storage::open(&d)),
    }
}

fn rate_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("value", DataType::Int64, false),
    ]))
}

fn ts_ms(out: &SourceBatch) -> Vec<i64> {
    out.batches
        .iter()
        .flat_map(|b| {
            let a = b
                .column_by_name("timestamp")
                .unwrap()
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap();
            a.values().iter().map(|v| v / 1000).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn rate_rows_are_deterministic() {
    let provider = source_provider("rate").expect("rate source registered");
    let caps = provider
        .capabilities(&BindingUri::parse("rate://?rows_per_second=10").unwrap())
        .unwrap();
    assert!(!caps.bounded && caps.unbounded);
    let mut src = provider
        .create(rate_ctx(
            "rate://?rows_per_second=10&start_ms=1000",
            rate_schema(),
            None,
        ))
        .unwrap();
    let out = src.read(None, &Offset(json!(25))).await.unwrap();
    assert_eq!(out.batches[0].schema(), rate_schema());
    assert_eq!(int_col(&out, "value"), (0..25).collect::<Vec<_>>());
    assert_eq!(
        ts_ms(&out),
        (0..25).map(|i| 1000 + i * 100).collect::<Vec<_>>()
    );
    let part = src
        .read(Some(&Offset(json!(10))), &Offset(json!(12)))
        .await
        .unwrap();
    assert_eq!(int_col(&part, "value"), vec![10, 11]);
    assert_eq!(ts_ms(&part), vec![2000, 2100]);

    // Another instance gives the same rows; 3 rows per second spreads them over 1000 ms.
    let mut other = provider
        .create(rate_ctx(
            "rate://?rowsPerSecond=3&start_ms=0",
            rate_schema(),
            None,
        ))
        .unwrap();
    let out = other.read(None, &Offset(json!(4))).await.unwrap();
    assert_eq!(ts_ms(&out), vec![0, 333, 666, 1000]);

    // Another unit and only one of the columns.
    let ms_only = Arc::new(Schema::new(vec![Field::new(
        "timestamp",
        DataType::Timestamp(TimeUnit::Millisecond, None),
        true,
    )]));
    let mut src = provider
        .create(rate_ctx("rate://?start_ms=5", ms_only.clone(), None))
        .unwrap();
    let out = src
        .read(Some(&Offset(json!(1))), &Offset(json!(3)))
        .await
        .unwrap();
    let t = out.batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .unwrap();
    assert_eq!(t.values().to_vec(), vec![1005, 2005]);

    let bad = Arc::new(Schema::new(vec![Field::new("value", DataType::Utf8, true)]));
    let e = match provider.create(rate_ctx("rate://", bad, None)) {
        Ok(_) => panic!("a string `value` must be refused"),
        Err(e) => e,
    };
    assert_eq!(e.code(), "ETL301");
    assert_eq!(
        provider
            .capabilities(&BindingUri::parse("rate://?rows_per_second=0").unwrap())
            .unwrap_err()
            .code(),
        "ETL007"
    );
}

#[tokio::test]
async fn rate_latest_offset_follows_wall_time_and_survives_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("sources/0");
    let first = RateSource::new(rate_ctx(
        "rate://?rows_per_second=1000",
        rate_schema(),
        Some(state.clone()),
    ))
    .unwrap();
    let started = first.wall_start_ms();
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("rate.json")).unwrap()).unwrap();
    assert_eq!(stored["wall_start_ms"], json!(started));
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;

    let mut src: Box<dyn etlantic_core::plugin::Source> = Box::new(
        RateSource::new(rate_ctx(
            "rate://?rows_per_second=1000",
            rate_schema(),
            Some(state.clone()),
        ))
        .unwrap(),
    );
    // At 1000 rows/s, 30 ms after the first start at least 30 rows are available.
    let latest = src
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    assert!(latest.0.as_u64().unwrap() >= 30, "{latest:?}");
    // The limit caps the range; a start beyond the clock comes back unchanged.
    let five = ReadLimit {
        max_files: None,
        max_records: Some(5),
    };
    assert_eq!(
        src.latest_offset(Some(&Offset(json!(7))), &five)
            .await
            .unwrap(),
        Some(Offset(json!(12)))
    );
    let far = Offset(json!(1u64 << 40));
    assert_eq!(
        src.latest_offset(Some(&far), &ReadLimit::unlimited())
            .await
            .unwrap(),
        Some(far.clone())
    );
    // Timestamps start at the stored start time.
    let out = src.read(None, &Offset(json!(2))).await.unwrap();
    assert_eq!(ts_ms(&out), vec![started, started + 1]);
}
