//! The `delta://` sink on real Delta tables in temporary directories: idempotent appends
//! through Delta txn actions, merge (upsert by key), complete mode as an overwrite,
//! table creation from the Arrow schema (time zones), batch runs, bad configurations.
#![cfg(feature = "delta")]

use arrow::array::{
    Array, AsArray, BooleanArray, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray,
};
use arrow::datatypes::{
    DataType, Field, Int32Type, Int64Type, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
};
use etlantic_core::data::Table;
use etlantic_core::guarantee::SinkCommitProtocol;
use etlantic_core::plugin::{sink_provider, Sink, SinkBatch, SinkContext, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_sinks::delta::{app_transaction_version, read_table};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

fn kv_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn kv(rows: &[(&str, i64)]) -> Table {
    let batch = RecordBatch::try_new(
        kv_schema(),
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    Table::new(kv_schema(), vec![batch])
}

fn sink(dir: &Path, params: &str, mode: ExecutionMode, output_mode: OutputMode) -> Box<dyn Sink> {
    sink_with(dir, params, mode, output_mode, kv_schema()).unwrap()
}

fn sink_with(
    dir: &Path,
    params: &str,
    mode: ExecutionMode,
    output_mode: OutputMode,
    schema: SchemaRef,
) -> etlantic_core::Result<Box<dyn Sink>> {
    let uri = BindingUri::parse(&format!("delta://table{params}")).unwrap();
    let provider = sink_provider("delta").expect("the delta sink is registered");
    provider.create(SinkContext {
        storage_options: Default::default(),
        asset: "t".into(),
        uri,
        schema,
        contract: None,
        root: dir.to_path_buf(),
        mode,
        output_mode,
    })
}

async fn write(
    s: &mut dyn Sink,
    q: &str,
    batch_id: u64,
    mode: OutputMode,
    t: &Table,
) -> WriteOutcome {
    s.write(SinkBatch {
        query_id: q,
        batch_id,
        output_mode: mode,
        data: t,
    })
    .await
    .unwrap()
}

/// The table's rows as a sorted multiset.
async fn table_rows(dir: &Path) -> Vec<(String, Option<i64>)> {
    let mut out = Vec::new();
    for b in read_table(dir.join("table")).await.unwrap() {
        let k = b.column_by_name("k").unwrap().as_string::<i32>();
        let v = b.column_by_name("v").unwrap().as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((k.value(i).to_string(), v.is_valid(i).then(|| v.value(i))));
        }
    }
    out.sort();
    out
}

fn r(k: &str, v: i64) -> (String, Option<i64>) {
    (k.to_string(), Some(v))
}

/// The commits of the table's log, in version order, as JSON actions.
fn log(dir: &Path) -> Vec<Vec<Value>> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("table/_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .collect()
}

fn txns(commit: &[Value]) -> Vec<(String, i64)> {
    commit
        .iter()
        .filter_map(|a| a.get("txn"))
        .map(|t| {
            (
                t["appId"].as_str().unwrap().to_string(),
                t["version"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn appends_are_idempotent_per_query_and_batch_through_delta_txn() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let caps = sink_provider("delta")
        .unwrap()
        .capabilities(&BindingUri::parse("delta://table").unwrap())
        .unwrap();
    assert_eq!(
        caps.guarantee.protocol,
        SinkCommitProtocol::IdempotentByBatch
    );
    assert_eq!(
        caps.output_modes,
        vec![OutputMode::Append, OutputMode::Complete]
    );

    let (s, a) = (ExecutionMode::Streaming, OutputMode::Append);
    let mut sk = sink(dir, "", s, a);
    assert_eq!(sk.last_committed_batch("q1").await.unwrap(), None);
    let b0 = kv(&[("a", 1), ("b", 2)]);
    assert_eq!(
        write(sk.as_mut(), "q1", 0, a, &b0).await,
        WriteOutcome::Written { rows: 2 }
    );
    // The same batch again — same instance, then a restarted one — writes nothing.
    assert_eq!(
        write(sk.as_mut(), "q1", 0, a, &b0).await,
        WriteOutcome::AlreadyCommitted
    );
    let mut restarted = sink(dir, "", s, a);
    assert_eq!(restarted.last_committed_batch("q1").await.unwrap(), Some(0));
    assert_eq!(
        write(restarted.as_mut(), "q1", 0, a, &b0).await,
        WriteOutcome::AlreadyCommitted
    );
    let b1 = kv(&[("c", 3)]);
    assert_eq!(
        write(restarted.as_mut(), "q1", 1, a, &b1).await,
        WriteOutcome::Written { rows: 1 }
    );
    // An empty batch is committed too (the txn moves on), writing no rows.
    let empty = Table::empty(kv_schema());
    assert_eq!(
        write(restarted.as_mut(), "q1", 2, a, &empty).await,
        WriteOutcome::Written { rows: 0 }
    );
    assert_eq!(restarted.last_committed_batch("q1").await.unwrap(), Some(2));
    // Batch ids at or below the last one are all recognised.
    assert_eq!(
        write(restarted.as_mut(), "q1", 1, a, &b1).await,
        WriteOutcome::AlreadyCommitted
    );
    // Another query has its own txn app id.
    assert_eq!(restarted.last_committed_batch("q2").await.unwrap(), None);
    assert_eq!(
        write(restarted.as_mut(), "q2", 0, a, &kv(&[("z", 26)])).await,
        WriteOutcome::Written { rows: 1 }
    );
    assert_eq!(
        table_rows(dir).await,
        vec![r("a", 1), r("b", 2), r("c", 3), r("z", 26)]
    );
    assert_eq!(
        app_transaction_version(dir.join("table"), "q1")
            .await
            .unwrap(),
        Some(2)
    );
    // One commit per written batch, each with its txn (the first also creates the table).
    let commits = log(dir);
    assert_eq!(commits.len(), 4);
    let expected = [("q1", 0), ("q1", 1), ("q1", 2), ("q2", 0)];
    for (commit, (q, b)) in commits.iter().zip(expected) {
        assert_eq!(txns(commit), vec![(q.to_string(), b)]);
    }
    assert!(commits[0].iter().any(|a| a.get("metaData").is_some()));
    assert!(
        !commits[2].iter().any(|a| a.get("add").is_some()),
        "no file for an empty batch"
    );
}

#[tokio::test]
async fn merge_upserts_by_key_and_replays_are_no_ops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let params = "?mode=merge&keys=k";
    let caps = sink_provider("delta")
        .unwrap()
        .capabilities(&BindingUri::parse(&format!("delta://table{params}")).unwrap())
        .unwrap();
    assert!(caps.output_modes.contains(&OutputMode::Update));
    let (s, u) = (ExecutionMode::Streaming, OutputMode::Update);
    let mut sk = sink(dir, params, s, u);
    // The table does not exist: the first batch creates it.
    write(sk.as_mut(), "q", 0, u, &kv(&[("a", 1), ("b", 2)])).await;
    let b1 = kv(&[("b", 20), ("c", 3)]);
    assert_eq!(
        write(sk.as_mut(), "q", 1, u, &b1).await,
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(
        table_rows(dir).await,
        vec![r("a", 1), r("b", 20), r("c", 3)]
    );
    let mut restarted = sink(dir, params, s, u);
    assert_eq!(
        write(restarted.as_mut(), "q", 1, u, &b1).await,
        WriteOutcome::AlreadyCommitted
    );
    write(
        restarted.as_mut(),
        "q",
        2,
        u,
        &kv(&[("a", 10), ("c", 30), ("d", 4)]),
    )
    .await;
    write(restarted.as_mut(), "q", 3, u, &Table::empty(kv_schema())).await;
    assert_eq!(
        table_rows(dir).await,
        vec![r("a", 10), r("b", 20), r("c", 30), r("d", 4)]
    );
    assert_eq!(restarted.last_committed_batch("q").await.unwrap(), Some(3));
    let commits = log(dir);
    assert_eq!(commits.len(), 4);
    assert!(commits[1]
        .iter()
        .any(|a| a["commitInfo"]["operation"] == "MERGE"));
    assert_eq!(txns(&commits[2]), vec![("q".to_string(), 2)]);
}

#[tokio::test]
async fn complete_mode_overwrites_in_one_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s, c) = (ExecutionMode::Streaming, OutputMode::Complete);
    let mut sk = sink(dir, "", s, c);
    write(sk.as_mut(), "q", 0, c, &kv(&[("a", 1), ("b", 1)])).await;
    write(sk.as_mut(), "q", 1, c, &kv(&[("a", 2), ("b", 1), ("c", 1)])).await;
    assert_eq!(table_rows(dir).await, vec![r("a", 2), r("b", 1), r("c", 1)]);
    assert_eq!(
        write(sk.as_mut(), "q", 1, c, &kv(&[("x", 9)])).await,
        WriteOutcome::AlreadyCommitted
    );
    assert_eq!(table_rows(dir).await, vec![r("a", 2), r("b", 1), r("c", 1)]);
    let commits = log(dir);
    assert_eq!(commits.len(), 2);
    let overwrite = &commits[1];
    assert!(overwrite.iter().any(|a| a.get("remove").is_some()));
    assert!(overwrite.iter().any(|a| a.get("add").is_some()));
    assert_eq!(txns(overwrite), vec![("q".to_string(), 1)]);
}

#[tokio::test]
async fn the_table_is_created_from_the_arrow_schema_with_zoned_timestamps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("Europe/Paris".into())),
            false,
        ),
        Field::new(
            "utc",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new(
            "local",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("n", DataType::Int32, true),
        Field::new("d", DataType::Date32, true),
        Field::new("ok", DataType::Boolean, true),
    ]));
    // 2024-03-31T01:30:00Z = 03:30 in Paris (after the DST switch).
    let instant_ms = 1_711_848_600_000i64;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(
                TimestampMillisecondArray::from(vec![instant_ms]).with_timezone("Europe/Paris"),
            ),
            Arc::new(
                TimestampMicrosecondArray::from(vec![instant_ms * 1000]).with_timezone("+00:00"),
            ),
            Arc::new(TimestampMicrosecondArray::from(vec![instant_ms * 1000])),
            Arc::new(Int32Array::from(vec![7])),
            Arc::new(Date32Array::from(vec![19_813])),
            Arc::new(BooleanArray::from(vec![true])),
        ],
    )
    .unwrap();
    let table = Table::new(schema.clone(), vec![batch]);
    let mut sk = sink_with(
        dir,
        "",
        ExecutionMode::Streaming,
        OutputMode::Append,
        schema,
    )
    .unwrap();
    write(sk.as_mut(), "q", 0, OutputMode::Append, &table).await;
    let back = read_table(dir.join("table")).await.unwrap();
    let b = &back[0];
    let s = b.schema();
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    assert_eq!(s.field_with_name("at").unwrap().data_type(), &utc);
    assert_eq!(s.field_with_name("utc").unwrap().data_type(), &utc);
    assert_eq!(
        s.field_with_name("local").unwrap().data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    let at = b
        .column_by_name("at")
        .unwrap()
        .as_primitive::<TimestampMicrosecondType>();
    assert_eq!(at.value(0), instant_ms * 1000, "the instant is kept");
    let local = b
        .column_by_name("local")
        .unwrap()
        .as_primitive::<TimestampMicrosecondType>();
    assert_eq!(local.value(0), instant_ms * 1000);
    let n = b.column_by_name("n").unwrap().as_primitive::<Int32Type>();
    assert_eq!(n.value(0), 7);
    // Delta types in the log: timestamp and timestamp_ntz (with its table feature).
    let commits = log(dir);
    let meta = commits[0].iter().find_map(|a| a.get("metaData")).unwrap();
    let delta_schema: Value = serde_json::from_str(meta["schemaString"].as_str().unwrap()).unwrap();
    let types: Vec<(String, String)> = delta_schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().into(), f["type"].to_string()))
        .collect();
    assert_eq!(types[0], ("at".into(), "\"timestamp\"".into()));
    assert_eq!(types[2], ("local".into(), "\"timestamp_ntz\"".into()));
    let protocol = commits[0].iter().find_map(|a| a.get("protocol")).unwrap();
    assert!(protocol.to_string().contains("timestampNtz"), "{protocol}");
}

#[tokio::test]
async fn batch_runs_append_or_overwrite_once_without_txn() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (b, a) = (ExecutionMode::Batch, OutputMode::Append);
    let mut sk = sink(dir, "", b, a);
    write(sk.as_mut(), "fp", 0, a, &kv(&[("a", 1)])).await;
    // A second run appends again: a batch run has no batch identity to replay.
    write(sink(dir, "", b, a).as_mut(), "fp", 0, a, &kv(&[("a", 1)])).await;
    assert_eq!(table_rows(dir).await, vec![r("a", 1), r("a", 1)]);
    assert!(log(dir).iter().all(|c| txns(c).is_empty()));
    assert_eq!(sk.last_committed_batch("fp").await.unwrap(), None);
    write(
        sink(dir, "?mode=overwrite", b, a).as_mut(),
        "fp",
        0,
        a,
        &kv(&[("b", 2)]),
    )
    .await;
    assert_eq!(table_rows(dir).await, vec![r("b", 2)]);
    write(
        sink(dir, "?mode=merge&keys=k", b, a).as_mut(),
        "fp",
        0,
        a,
        &kv(&[("b", 3), ("c", 4)]),
    )
    .await;
    assert_eq!(table_rows(dir).await, vec![r("b", 3), r("c", 4)]);
}

#[tokio::test]
async fn bad_configurations_have_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let e = sink_with(
        dir,
        "?mode=merge&keys=nope",
        ExecutionMode::Streaming,
        OutputMode::Update,
        kv_schema(),
    )
    .err()
    .expect("an unknown merge key is refused");
    assert_eq!(e.code(), "ETL007");
    let mut sk = sink(dir, "", ExecutionMode::Streaming, OutputMode::Update);
    let e = sk
        .write(SinkBatch {
            query_id: "q",
            batch_id: 0,
            output_mode: OutputMode::Update,
            data: &kv(&[("a", 1)]),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL504");
    assert!(!dir.join("table/_delta_log").exists(), "nothing written");
    // A batch whose schema differs from the table's is refused, not half-written.
    let mut sk = sink(dir, "", ExecutionMode::Streaming, OutputMode::Append);
    write(sk.as_mut(), "q", 0, OutputMode::Append, &kv(&[("a", 1)])).await;
    let other = Arc::new(Schema::new(vec![Field::new("x", DataType::Utf8, true)]));
    let t = Table::new(
        other.clone(),
        vec![RecordBatch::try_new(other, vec![Arc::new(StringArray::from(vec!["y"]))]).unwrap()],
    );
    let e = sk
        .write(SinkBatch {
            query_id: "q",
            batch_id: 1,
            output_mode: OutputMode::Append,
            data: &t,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL709");
    assert_eq!(table_rows(dir).await, vec![r("a", 1)]);
    assert_eq!(sk.last_committed_batch("q").await.unwrap(), Some(0));
}
