//! The file source on an object store (a real S3-compatible server, moto, on
//! 127.0.0.1): a prefix streamed object by object with its seen-files log on S3 too,
//! replays after a restart, an overwritten object rejected, and single JSON-lines, CSV
//! and Parquet objects read in batch runs (a large one by ranged reads).

mod common;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use common::*;
use etlantic_core::data::Offset;
use etlantic_core::plugin::{source_provider, ReadLimit, Source};
use etlantic_core::storage::{put_bytes, Storage, Sub};
use etlantic_core::streaming::ExecutionMode;
use etlantic_object_store::testing::S3TestServer;
use etlantic_object_store::ObjectStorage;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

// Links the crates so that their providers register themselves.
use etlantic_object_store as _;
use etlantic_sources as _;

fn events(ids: &[i64], note: &str) -> String {
    ids.iter()
        .map(|i| format!("{{\"id\":{i},\"note\":\"{note}\"}}\n"))
        .collect()
}

fn storage(server: &S3TestServer, url: &str) -> Arc<dyn Storage> {
    Arc::new(ObjectStorage::open(&url::Url::parse(url).unwrap(), &server.options()).unwrap())
}

fn source(
    server: &S3TestServer,
    root: &Path,
    uri: &str,
    mode: ExecutionMode,
    state: Option<Arc<dyn Storage>>,
) -> Box<dyn Source> {
    let c = contract(EVENTS);
    let mut context = ctx(root, "events", uri, &c, mode, None);
    context.storage_options = server.options();
    context.state = state;
    source_provider("s3")
        .expect("the file source serves s3://")
        .create(context)
        .unwrap()
}

fn index(n: u64) -> Offset {
    Offset(json!({ "index": n }))
}

const ONE: ReadLimit = ReadLimit {
    max_files: Some(1),
    max_records: None,
};

#[tokio::test]
async fn a_prefix_streams_object_by_object_and_replays_after_a_restart() {
    let server = S3TestServer::start();
    server.create_bucket("src");
    let input = storage(&server, "s3://src/events");
    let state: Arc<dyn Storage> = Arc::new(Sub::new(storage(&server, "s3://src/chk"), "sources/0"));
    put_bytes(input.as_ref(), "a.jsonl", events(&[1, 2], "a").as_bytes()).unwrap();
    put_bytes(input.as_ref(), "b.jsonl", events(&[3], "b").as_bytes()).unwrap();
    // Ignored as in a directory: staged names, other extensions, deeper prefixes.
    put_bytes(
        input.as_ref(),
        "_staging.jsonl",
        events(&[100], "x").as_bytes(),
    )
    .unwrap();
    put_bytes(input.as_ref(), "notes.txt", b"not data").unwrap();
    put_bytes(
        input.as_ref(),
        "deeper/c.jsonl",
        events(&[101], "x").as_bytes(),
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let uri = "s3://src/events/";

    let mut src = source(
        &server,
        tmp.path(),
        uri,
        ExecutionMode::Streaming,
        Some(state.clone()),
    );
    let o0 = src.latest_offset(None, &ONE).await.unwrap().unwrap();
    assert_eq!(o0, index(0));
    let b0 = src.read(None, &o0).await.unwrap();
    assert_eq!(ids(&b0), vec![1, 2]);
    let o1 = src.latest_offset(Some(&o0), &ONE).await.unwrap().unwrap();
    assert_eq!(o1, index(1));
    // Nothing new: the offset stays.
    assert_eq!(
        src.latest_offset(Some(&o1), &ONE).await.unwrap(),
        Some(o1.clone())
    );

    // A new object shows up; a restarted source (a new instance, the log on S3) replays
    // what was assigned and then picks the new object up.
    put_bytes(input.as_ref(), "c.jsonl", events(&[4, 5], "c").as_bytes()).unwrap();
    drop(src);
    let mut src = source(
        &server,
        tmp.path(),
        uri,
        ExecutionMode::Streaming,
        Some(state.clone()),
    );
    assert_eq!(ids(&src.read(None, &o0).await.unwrap()), vec![1, 2]);
    assert_eq!(ids(&src.read(Some(&o0), &o1).await.unwrap()), vec![3]);
    let o2 = src.latest_offset(Some(&o1), &ONE).await.unwrap().unwrap();
    assert_eq!(o2, index(2));

    // Overwritten after it was picked up: none of its records are read (a replay would
    // read other bytes), one ETL713 record names the object and its new ETag.
    put_bytes(
        input.as_ref(),
        "c.jsonl",
        events(&[4, 5, 6], "c").as_bytes(),
    )
    .unwrap();
    let b2 = src.read(Some(&o1), &o2).await.unwrap();
    assert!(ids(&b2).is_empty());
    assert_eq!(b2.rejected.len(), 1);
    assert_eq!(b2.rejected[0].code, "ETL713");
    assert_eq!(
        b2.rejected[0].position.file.as_deref(),
        Some("s3://src/events/c.jsonl")
    );
    // Same size, other bytes: only the ETag tells.
    put_bytes(input.as_ref(), "d.jsonl", events(&[7], "d").as_bytes()).unwrap();
    let o3 = src.latest_offset(Some(&o2), &ONE).await.unwrap().unwrap();
    put_bytes(input.as_ref(), "d.jsonl", events(&[8], "d").as_bytes()).unwrap();
    let b3 = src.read(Some(&o2), &o3).await.unwrap();
    assert_eq!(b3.rejected.len(), 1, "{:?}", b3.rejected);
    assert!(
        b3.rejected[0].reason.contains("ETag"),
        "{}",
        b3.rejected[0].reason
    );

    // The log is on S3 with each object's ETag.
    let log = etlantic_sources::files::SeenLog::open_in(state).unwrap();
    let logged = log.files(0).unwrap().unwrap();
    assert_eq!(logged[0].path, "a.jsonl");
    assert!(logged[0].version.is_some());
}

#[tokio::test]
async fn single_objects_are_read_in_batch_runs_in_every_format() {
    let server = S3TestServer::start();
    server.create_bucket("data");
    let bucket = storage(&server, "s3://data");
    let tmp = tempfile::tempdir().unwrap();

    // CSV, with a bad row rejected with its object and line.
    put_bytes(
        bucket.as_ref(),
        "in/events.csv",
        b"id,note\n1,one\nx,bad\n2,two\n",
    )
    .unwrap();
    let mut src = source(
        &server,
        tmp.path(),
        "s3://data/in/events.csv",
        ExecutionMode::Batch,
        None,
    );
    let out = read_all(&mut src).await;
    assert_eq!(ids(&out), vec![1, 2]);
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(
        out.rejected[0].position.file.as_deref(),
        Some("s3://data/in/events.csv")
    );
    assert_eq!(out.rejected[0].position.line, Some(3));

    // Parquet, read by ranges (footer, then column chunks).
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from(vec![10, 11, 12])) as Arc<dyn Array>,
        ),
        (
            "note",
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as Arc<dyn Array>,
        ),
    ])
    .unwrap();
    let mut bytes = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    put_bytes(bucket.as_ref(), "in/events.parquet", &bytes).unwrap();
    let mut src = source(
        &server,
        tmp.path(),
        "s3://data/in/events.parquet",
        ExecutionMode::Batch,
        None,
    );
    assert_eq!(ids(&read_all(&mut src).await), vec![10, 11, 12]);

    // JSON lines larger than a read block: read in ranged requests, every line once.
    let n = 200_000i64;
    let big = events(
        &(0..n).collect::<Vec<_>>(),
        "a note long enough to pass 4 MiB",
    );
    assert!(big.len() > 8 << 20, "{} bytes", big.len());
    put_bytes(bucket.as_ref(), "in/big.jsonl", big.as_bytes()).unwrap();
    let mut src = source(
        &server,
        tmp.path(),
        "s3://data/in/big.jsonl",
        ExecutionMode::Batch,
        None,
    );
    let out = read_all(&mut src).await;
    assert!(out.rejected.is_empty());
    assert_eq!(ids(&out), (0..n).collect::<Vec<_>>());

    // A missing object is an error naming it; a missing bucket is ETL714.
    let c = contract(EVENTS);
    let mut context = ctx(
        tmp.path(),
        "events",
        "s3://data/in/missing.jsonl",
        &c,
        ExecutionMode::Batch,
        None,
    );
    context.storage_options = server.options();
    let mut src = source_provider("s3").unwrap().create(context).unwrap();
    let limit = ReadLimit::unlimited();
    let e = src.latest_offset(None, &limit).await.unwrap_err();
    assert!(e.to_string().contains("s3://data/in/missing.jsonl"), "{e}");
    let mut src = source(
        &server,
        tmp.path(),
        "s3://nobucket/in/",
        ExecutionMode::Streaming,
        None,
    );
    let e = src.latest_offset(None, &limit).await.unwrap_err();
    assert_eq!(e.code(), "ETL714", "{e}");
}
