//! The `delta://` source on real Delta tables in temporary directories: bounded reads
//! (latest snapshot and time travel) and the change data feed as a stream (inserts,
//! updates, deletes across versions; version limits; replay; resume from a checkpointed
//! offset with a new instance).
#![cfg(feature = "delta")]

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use deltalake::logstore::{logstore_for, StorageConfig};
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableConfig};
use etlantic_core::data::Offset;
use etlantic_core::plugin::{source_provider, ReadLimit, Source, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

// Links the crate, whose providers register themselves through `inventory`.
use etlantic_sources as _;

fn data_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("value", DataType::Utf8, true),
    ]))
}

fn rows(ids: &[i64], values: &[&str]) -> RecordBatch {
    RecordBatch::try_new(
        data_schema(),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(StringArray::from(values.to_vec())),
        ],
    )
    .unwrap()
}

async fn open(dir: &Path) -> DeltaTable {
    let url = url::Url::from_directory_path(dir).unwrap();
    let store = logstore_for(&url, StorageConfig::default()).unwrap();
    let mut t = DeltaTable::new(store, DeltaTableConfig::default());
    let _ = t.load().await;
    t
}

/// v0: create with ids 1..3 (CDF on); v1: append 4, 5; v2: update id 2; v3: delete id 1.
async fn make_table(dir: &Path) {
    let t = open(dir).await;
    t.write(vec![rows(&[1, 2, 3], &["a", "b", "c"])])
        .with_save_mode(SaveMode::Append)
        .with_configuration([("delta.enableChangeDataFeed", Some("true"))])
        .await
        .unwrap();
    open(dir)
        .await
        .write(vec![rows(&[4, 5], &["d", "e"])])
        .with_save_mode(SaveMode::Append)
        .await
        .unwrap();
    open(dir)
        .await
        .update()
        .with_predicate("id = 2")
        .with_update("value", "'b2'")
        .await
        .unwrap();
    open(dir)
        .await
        .delete()
        .with_predicate("id = 1")
        .await
        .unwrap();
    assert_eq!(open(dir).await.version(), Some(3));
}

fn cdf_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("value", DataType::Utf8, true),
        Field::new("_change_type", DataType::Utf8, false),
        Field::new("_commit_version", DataType::Int64, false),
        Field::new(
            "_commit_timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ]))
}

fn source(dir: &Path, params: &str, schema: SchemaRef, mode: ExecutionMode) -> Box<dyn Source> {
    let uri = BindingUri::parse(&format!("delta://{}{params}", dir.display())).unwrap();
    let provider = source_provider("delta").expect("the delta source is registered");
    let caps = provider.capabilities(&uri).unwrap();
    assert!(caps.bounded && caps.unbounded);
    provider
        .create(SourceContext {
            storage_options: Default::default(),
            asset: "t".into(),
            uri,
            schema,
            contract: None,
            root: dir.to_path_buf(),
            mode,
            state: None,
        })
        .unwrap()
}

/// (change type, version, id, value) of every row, in the order returned.
fn changes(batches: &[RecordBatch]) -> Vec<(String, i64, i64, String)> {
    let mut out = Vec::new();
    for b in batches {
        assert_eq!(b.schema(), cdf_schema());
        let ty = b.column(2).as_string::<i32>();
        let ver = b.column(3).as_primitive::<Int64Type>();
        let id = b.column(0).as_primitive::<Int64Type>();
        let val = b.column(1).as_string::<i32>();
        let ts = b
            .column(4)
            .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            assert!(
                ts.is_valid(i) && ts.value(i) > 1_600_000_000_000_000,
                "commit timestamp in µs UTC"
            );
            out.push((
                ty.value(i).to_string(),
                ver.value(i),
                id.value(i),
                val.value(i).to_string(),
            ));
        }
    }
    out
}

fn c(t: &str, v: i64, id: i64, val: &str) -> (String, i64, i64, String) {
    (t.to_string(), v, id, val.to_string())
}

#[tokio::test]
async fn the_change_data_feed_streams_inserts_updates_and_deletes_by_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_table(dir).await;
    let limit = ReadLimit::unlimited();

    // Two versions per trigger: (∅, 1], then (1, 3].
    let mut s = source(
        dir,
        "?maxVersionsPerTrigger=2",
        cdf_schema(),
        ExecutionMode::Streaming,
    );
    let o1 = s.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(o1, Offset(json!({"version": 1})));
    let b1 = s.read(None, &o1).await.unwrap();
    assert!(b1.rejected.is_empty());
    assert_eq!(
        changes(&b1.batches),
        vec![
            c("insert", 0, 1, "a"),
            c("insert", 0, 2, "b"),
            c("insert", 0, 3, "c"),
            c("insert", 1, 4, "d"),
            c("insert", 1, 5, "e"),
        ]
    );
    let o2 = s.latest_offset(Some(&o1), &limit).await.unwrap().unwrap();
    assert_eq!(o2, Offset(json!({"version": 3})));
    let b2 = s.read(Some(&o1), &o2).await.unwrap();
    let expected2 = vec![
        c("update_preimage", 2, 2, "b"),
        c("update_postimage", 2, 2, "b2"),
        c("delete", 3, 1, "a"),
    ];
    assert_eq!(changes(&b2.batches), expected2);
    // Nothing new: the start comes back.
    assert_eq!(
        s.latest_offset(Some(&o2), &limit).await.unwrap(),
        Some(o2.clone())
    );

    // Replayable: the same range reads the same rows in the same order, also from a new
    // instance (a restart), and the new instance resumes after the checkpointed offset.
    let mut restarted = source(
        dir,
        "?maxVersionsPerTrigger=2",
        cdf_schema(),
        ExecutionMode::Streaming,
    );
    assert_eq!(
        changes(&restarted.read(Some(&o1), &o2).await.unwrap().batches),
        expected2
    );
    assert_eq!(
        restarted.latest_offset(Some(&o2), &limit).await.unwrap(),
        Some(o2.clone())
    );
    open(dir)
        .await
        .write(vec![rows(&[6], &["f"])])
        .with_save_mode(SaveMode::Append)
        .await
        .unwrap();
    let o3 = restarted
        .latest_offset(Some(&o2), &limit)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o3, Offset(json!({"version": 4})));
    assert_eq!(
        changes(&restarted.read(Some(&o2), &o3).await.unwrap().batches),
        vec![c("insert", 4, 6, "f")]
    );

    // startingVersion: the feed from version 2 on, all at once.
    let mut from2 = source(
        dir,
        "?startingVersion=2",
        cdf_schema(),
        ExecutionMode::Streaming,
    );
    let end = from2.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(end, Offset(json!({"version": 4})));
    let mut all = expected2.clone();
    all.push(c("insert", 4, 6, "f"));
    assert_eq!(changes(&from2.read(None, &end).await.unwrap().batches), all);
}

#[tokio::test]
async fn a_contract_selects_columns_and_rejects_bad_rows_with_their_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_table(dir).await;
    // Only the id and the change type; `id` required: no row breaks it. Then a column
    // the table lacks, required: the whole read fails with a code.
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("_change_type", DataType::Utf8, false),
    ]));
    let mut s = source(dir, "", schema.clone(), ExecutionMode::Streaming);
    let end = s
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    let b = s.read(None, &end).await.unwrap();
    assert_eq!(b.num_rows(), 8);
    assert!(b.batches.iter().all(|x| x.schema() == schema));

    let missing = Arc::new(Schema::new(vec![Field::new(
        "nope",
        DataType::Int64,
        false,
    )]));
    let mut s = source(dir, "", missing, ExecutionMode::Streaming);
    let e = s.read(None, &end).await.unwrap_err();
    assert_eq!(e.code(), "ETL702");
}

#[tokio::test]
async fn bounded_reads_the_latest_snapshot_or_a_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_table(dir).await;
    let snapshot = |batches: &[RecordBatch]| {
        let mut v: Vec<(i64, String)> = Vec::new();
        for b in batches {
            assert_eq!(b.schema(), data_schema());
            let id = b.column(0).as_primitive::<Int64Type>();
            let val = b.column(1).as_string::<i32>();
            for i in 0..b.num_rows() {
                v.push((id.value(i), val.value(i).to_string()));
            }
        }
        v.sort();
        v
    };
    let limit = ReadLimit::unlimited();
    let mut s = source(dir, "", data_schema(), ExecutionMode::Batch);
    let end = s.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(end, Offset(json!({"version": 3})));
    let got = snapshot(&s.read(None, &end).await.unwrap().batches);
    assert_eq!(
        got,
        vec![
            (2, "b2".into()),
            (3, "c".into()),
            (4, "d".into()),
            (5, "e".into())
        ]
    );
    let mut v1 = source(dir, "?version=1", data_schema(), ExecutionMode::Batch);
    let end = v1.latest_offset(None, &limit).await.unwrap().unwrap();
    assert_eq!(end, Offset(json!({"version": 1})));
    assert_eq!(
        snapshot(&v1.read(None, &end).await.unwrap().batches).len(),
        5
    );

    // Not a table: bounded reads fail with a code, streaming sees no data yet.
    let empty = tempfile::tempdir().unwrap();
    let mut b = source(empty.path(), "", data_schema(), ExecutionMode::Batch);
    assert_eq!(
        b.latest_offset(None, &limit).await.unwrap_err().code(),
        "ETL706"
    );
    let mut st = source(empty.path(), "", cdf_schema(), ExecutionMode::Streaming);
    assert_eq!(st.latest_offset(None, &limit).await.unwrap(), None);
}

#[tokio::test]
async fn a_table_without_change_data_feed_is_an_error_with_a_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    open(dir)
        .await
        .write(vec![rows(&[1], &["a"])])
        .with_save_mode(SaveMode::Append)
        .await
        .unwrap();
    let mut s = source(dir, "", cdf_schema(), ExecutionMode::Streaming);
    let end = s
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    let e = s.read(None, &end).await.unwrap_err();
    assert_eq!(e.code(), "ETL706");
    assert!(e.to_string().to_lowercase().contains("change data"), "{e}");
}
