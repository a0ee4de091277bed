//! The `file://` sink: format round trips, atomic overwrite, the idempotent batch log,
//! complete mode.

mod common;

use common::*;
use etlantic_core::data::Offset;
use etlantic_core::plugin::{
    sink_provider, source_provider, ReadLimit, Sink, SourceContext, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_sinks::files::{committed_files, read_committed, read_log, LOG_DIR};
use std::path::Path;

fn file_sink(root: &Path, uri: &str, mode: ExecutionMode) -> Box<dyn Sink> {
    sink_provider("file")
        .expect("file sink registered")
        .create(sink_ctx(root, uri, mode, OutputMode::Append))
        .unwrap()
}

/// Reads a file back with the `file://` source of etlantic-sources.
async fn read_back(root: &Path, uri: &str) -> Vec<arrow::array::RecordBatch> {
    let c = contract();
    let mut src = source_provider("file")
        .expect("file source registered")
        .create(SourceContext {
            storage_options: Default::default(),
            asset: "orders".into(),
            uri: BindingUri::parse(uri).unwrap(),
            schema: c.arrow_schema(),
            contract: Some(c.clone()),
            root: root.to_path_buf(),
            mode: ExecutionMode::Batch,
            state: None,
        })
        .unwrap();
    let end: Offset = src
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    let out = src.read(None, &end).await.unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    out.batches
}

#[tokio::test]
async fn every_format_round_trips_through_the_file_source() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let data = table(vec![orders(0, 3), orders(3, 2)]);
    let expected = concat(&data.schema, &data.batches);
    for ext in ["jsonl", "csv", "parquet"] {
        let uri = format!("file://out/orders.{ext}");
        let mut sink = file_sink(root, &uri, ExecutionMode::Batch);
        let outcome = sink
            .write(batch("q1", 0, OutputMode::Append, &data))
            .await
            .unwrap();
        assert_eq!(outcome, WriteOutcome::Written { rows: 5 });
        let back = read_back(root, &uri).await;
        assert_eq!(concat(&data.schema, &back), expected, "{ext}");
    }
    // Parquet keeps sub-millisecond precision too.
    let mut precise = orders(0, 1);
    let ts = arrow::array::TimestampMicrosecondArray::from(vec![TS0 + 7]).with_timezone("UTC");
    precise = arrow::array::RecordBatch::try_new(precise.schema(), {
        let mut cols = precise.columns().to_vec();
        cols[3] = std::sync::Arc::new(ts);
        cols
    })
    .unwrap();
    let data = table(vec![precise.clone()]);
    let mut sink = file_sink(root, "file://out/precise.parquet", ExecutionMode::Batch);
    sink.write(batch("q1", 0, OutputMode::Append, &data))
        .await
        .unwrap();
    assert_eq!(
        concat(
            &data.schema,
            &read_back(root, "file://out/precise.parquet").await
        ),
        precise
    );
    assert_eq!(
        listing(&root.join("out")),
        vec![
            "orders.csv",
            "orders.jsonl",
            "orders.parquet",
            "precise.parquet"
        ],
        "no temporary files are left behind"
    );
}

#[tokio::test]
async fn json_lines_have_iso_utc_millisecond_timestamps_and_explicit_nulls() {
    let tmp = tempfile::tempdir().unwrap();
    let data = table(vec![orders(0, 2)]);
    let mut sink = file_sink(tmp.path(), "file://o.json", ExecutionMode::Batch);
    sink.write(batch("q", 0, OutputMode::Append, &data))
        .await
        .unwrap();
    let text = std::fs::read_to_string(tmp.path().join("o.json")).unwrap();
    assert_eq!(
        text,
        concat!(
            r#"{"order_id":0,"customer":"Cust, \"0\"","amount":0.50,"ts":"2024-01-02T03:04:05.123Z","day":"2024-01-02","paid":true,"score":0.25}"#,
            "\n",
            r#"{"order_id":1,"customer":null,"amount":null,"ts":"2024-01-02T03:05:05.123Z","day":null,"paid":null,"score":null}"#,
            "\n"
        )
    );
    // A zone other than UTC is written as the UTC instant.
    let paris = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new(
                "t",
                arrow::datatypes::DataType::Timestamp(
                    arrow::datatypes::TimeUnit::Millisecond,
                    Some("+02:00".into()),
                ),
                true,
            ),
        ])),
        vec![std::sync::Arc::new(
            arrow::array::TimestampMillisecondArray::from(vec![Some(0), None])
                .with_timezone("+02:00"),
        )],
    )
    .unwrap();
    let t = etlantic_core::data::Table::new(paris.schema(), vec![paris]);
    let mut sink = file_sink(tmp.path(), "file://zoned.jsonl", ExecutionMode::Batch);
    sink.write(batch("q", 0, OutputMode::Append, &t))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("zoned.jsonl")).unwrap(),
        "{\"t\":\"1970-01-01T00:00:00.000Z\"}\n{\"t\":null}\n"
    );
    // CSV: the same timestamp format, empty cells for nulls, quoting where needed.
    let mut sink = file_sink(tmp.path(), "file://o.csv", ExecutionMode::Batch);
    sink.write(batch("q", 0, OutputMode::Append, &data))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("o.csv")).unwrap(),
        "order_id,customer,amount,ts,day,paid,score\n\
         0,\"Cust, \"\"0\"\"\",0.50,2024-01-02T03:04:05.123Z,2024-01-02,true,0.25\n\
         1,,,2024-01-02T03:05:05.123Z,,,\n"
    );
}

#[tokio::test]
async fn a_batch_run_replaces_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut sink = file_sink(root, "file://out.parquet", ExecutionMode::Batch);
    sink.write(batch(
        "q",
        0,
        OutputMode::Append,
        &table(vec![orders(0, 4)]),
    ))
    .await
    .unwrap();
    // A second run (even with the same batch id) overwrites.
    let mut sink = file_sink(root, "file://out.parquet", ExecutionMode::Batch);
    sink.write(batch(
        "q",
        0,
        OutputMode::Append,
        &table(vec![orders(10, 1)]),
    ))
    .await
    .unwrap();
    let back = read_back(root, "file://out.parquet").await;
    assert_eq!(concat(&contract().arrow_schema(), &back), orders(10, 1));
    assert_eq!(listing(root), vec!["out.parquet"]);
}

#[tokio::test]
async fn streaming_batches_are_logged_and_replays_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dir = root.join("out/orders");
    let uri = "file://out/orders?format=jsonl";
    let qid = "7b0c61d2-4f27-4bd5-9d5e-1f6a55a1b2c3";
    let caps = sink_provider("file")
        .unwrap()
        .capabilities(&BindingUri::parse(uri).unwrap())
        .unwrap();
    assert_eq!(
        caps.guarantee.protocol,
        etlantic_core::guarantee::SinkCommitProtocol::IdempotentByBatch
    );
    assert_eq!(
        caps.output_modes,
        vec![OutputMode::Append, OutputMode::Complete]
    );

    let mut sink = file_sink(root, uri, ExecutionMode::Streaming);
    assert_eq!(sink.last_committed_batch(qid).await.unwrap(), None);
    let b0 = table(vec![orders(0, 2)]);
    let b1 = table(vec![orders(2, 3)]);
    let empty = table(vec![]);
    assert_eq!(
        sink.write(batch(qid, 0, OutputMode::Append, &b0))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 2 }
    );
    assert_eq!(
        sink.write(batch(qid, 1, OutputMode::Append, &b1))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert_eq!(
        sink.write(batch(qid, 2, OutputMode::Append, &empty))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 0 }
    );
    assert_eq!(
        listing(&dir),
        vec![
            LOG_DIR,
            "part-00000-7b0c61d2.jsonl",
            "part-00001-7b0c61d2.jsonl"
        ]
    );
    assert_eq!(listing(&dir.join(LOG_DIR)), vec!["0", "1", "2"]);
    let log = read_log(&dir).unwrap();
    assert_eq!(log[&1].files, vec!["part-00001-7b0c61d2.jsonl"]);
    assert_eq!(log[&1].rows, 3);
    assert_eq!(log[&1].query_id, qid);
    assert!(log[&2].files.is_empty());
    let before = std::fs::read(dir.join("part-00001-7b0c61d2.jsonl")).unwrap();

    // After a crash, a new instance is asked to write batch 1 again, with other rows
    // even: it is already committed, so nothing changes.
    let mut restarted = file_sink(root, uri, ExecutionMode::Streaming);
    assert_eq!(restarted.last_committed_batch(qid).await.unwrap(), Some(2));
    assert_eq!(
        restarted
            .write(batch(
                qid,
                1,
                OutputMode::Append,
                &table(vec![orders(50, 9)])
            ))
            .await
            .unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    assert_eq!(
        std::fs::read(dir.join("part-00001-7b0c61d2.jsonl")).unwrap(),
        before
    );

    // A data file no entry lists (a crash between the data and the log) is not trusted.
    std::fs::write(
        dir.join("part-00003-7b0c61d2.jsonl"),
        "{\"order_id\":999}\n",
    )
    .unwrap();
    let committed = read_committed(&dir).unwrap();
    assert_eq!(
        concat(&contract().arrow_schema(), &committed),
        concat(&contract().arrow_schema(), &[orders(0, 2), orders(2, 3)])
    );
    assert_eq!(
        committed_files(&dir).unwrap(),
        vec![
            dir.join("part-00000-7b0c61d2.jsonl"),
            dir.join("part-00001-7b0c61d2.jsonl")
        ]
    );
    // Replaying the crashed batch 3 writes it properly and the log then vouches for it.
    assert_eq!(
        restarted
            .write(batch(
                qid,
                3,
                OutputMode::Append,
                &table(vec![orders(5, 1)])
            ))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 1 }
    );
    assert_eq!(
        read_committed(&dir)
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        6
    );

    // Another query's batch 1 (a `dlq redrive` appending here) goes after the last entry,
    // once: its replay is skipped, and this query's batch 1 is still known as committed.
    let before = read_committed(&dir)
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum::<usize>();
    let other = restarted
        .write(batch("other-query", 1, OutputMode::Append, &b1))
        .await
        .unwrap();
    assert!(matches!(other, WriteOutcome::Written { .. }), "{other:?}");
    for (q, n) in [("other-query", 1), (qid, 1)] {
        assert_eq!(
            restarted
                .write(batch(q, n, OutputMode::Append, &b1))
                .await
                .unwrap(),
            WriteOutcome::AlreadyCommitted,
            "{q} batch {n}"
        );
    }
    assert_eq!(
        read_committed(&dir)
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        before + b1.num_rows()
    );
    // Update mode is not supported by files.
    let e = restarted
        .write(batch(qid, 9, OutputMode::Update, &b1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL504");
}

#[tokio::test]
async fn every_streaming_format_is_read_back_from_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    for format in ["jsonl", "csv", "parquet"] {
        let dir = tmp.path().join(format);
        let uri = format!("file://{format}?format={format}");
        let mut sink = file_sink(tmp.path(), &uri, ExecutionMode::Streaming);
        for (id, first) in [(0u64, 0i64), (1, 3)] {
            let t = table(vec![orders(first, 3)]);
            sink.write(batch("q", id, OutputMode::Append, &t))
                .await
                .unwrap();
        }
        let back = read_committed(&dir).unwrap();
        assert_eq!(
            concat(&contract().arrow_schema(), &back),
            orders(0, 6),
            "{format}"
        );
    }
}

#[tokio::test]
async fn complete_mode_replaces_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dir = root.join("agg");
    let uri = "file://agg?format=parquet";
    let mut sink = sink_provider("file")
        .unwrap()
        .create(sink_ctx(
            root,
            uri,
            ExecutionMode::Streaming,
            OutputMode::Complete,
        ))
        .unwrap();
    sink.write(batch(
        "q",
        0,
        OutputMode::Complete,
        &table(vec![orders(0, 3)]),
    ))
    .await
    .unwrap();
    sink.write(batch(
        "q",
        1,
        OutputMode::Complete,
        &table(vec![orders(0, 2), orders(7, 1)]),
    ))
    .await
    .unwrap();
    assert_eq!(listing(&dir), vec![LOG_DIR, "part-00001-q.parquet"]);
    let back = read_committed(&dir).unwrap();
    assert_eq!(
        concat(&contract().arrow_schema(), &back),
        concat(&contract().arrow_schema(), &[orders(0, 2), orders(7, 1)])
    );
    // A replay of the latest batch changes nothing.
    assert_eq!(
        sink.write(batch(
            "q",
            1,
            OutputMode::Complete,
            &table(vec![orders(0, 1)])
        ))
        .await
        .unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    // An empty complete result replaces everything with an empty file.
    sink.write(batch("q", 2, OutputMode::Complete, &table(vec![])))
        .await
        .unwrap();
    assert_eq!(listing(&dir), vec![LOG_DIR, "part-00002-q.parquet"]);
    assert_eq!(
        read_committed(&dir)
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        0
    );
}

#[tokio::test]
async fn a_batch_run_into_a_directory_replaces_its_content() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dir = root.join("outdir");
    let mut sink = file_sink(root, "file://outdir/?format=csv", ExecutionMode::Batch);
    sink.write(batch(
        "run-1",
        0,
        OutputMode::Append,
        &table(vec![orders(0, 2)]),
    ))
    .await
    .unwrap();
    let mut sink = file_sink(root, "file://outdir/?format=csv", ExecutionMode::Batch);
    sink.write(batch(
        "run-2",
        0,
        OutputMode::Append,
        &table(vec![orders(4, 1)]),
    ))
    .await
    .unwrap();
    assert_eq!(listing(&dir), vec![LOG_DIR, "part-00001-run2.csv"]);
    assert_eq!(
        concat(&contract().arrow_schema(), &read_committed(&dir).unwrap()),
        orders(4, 1)
    );
}

#[tokio::test]
async fn bindings_are_checked_when_the_sink_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sink_provider("file").unwrap();
    let nested = etlantic_core::plugin::SinkContext {
        storage_options: Default::default(),
        schema: std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new(
                "tags",
                arrow::datatypes::DataType::List(std::sync::Arc::new(
                    arrow::datatypes::Field::new("item", arrow::datatypes::DataType::Utf8, true),
                )),
                true,
            ),
        ])),
        ..sink_ctx(
            tmp.path(),
            "file://x.csv",
            ExecutionMode::Batch,
            OutputMode::Append,
        )
    };
    let err = |r: etlantic_core::Result<Box<dyn Sink>>| match r {
        Ok(_) => panic!("create should fail"),
        Err(e) => e.code().to_string(),
    };
    assert_eq!(err(p.create(nested)), "ETL505");
    assert_eq!(
        err(p.create(sink_ctx(
            tmp.path(),
            "file://out",
            ExecutionMode::Batch,
            OutputMode::Append
        ))),
        "ETL505"
    );
    assert_eq!(
        err(p.create(sink_ctx(
            tmp.path(),
            "file://x.csv?compression=zstd",
            ExecutionMode::Batch,
            OutputMode::Append
        ))),
        "ETL007"
    );
    assert!(listing(tmp.path()).is_empty(), "create writes nothing");
}
