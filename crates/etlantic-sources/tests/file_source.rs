//! The `file://` source in batch runs: decoding, every kind of rejected record, positions.

mod common;

// Links the crate so that its providers register themselves.
use etlantic_sources as _;

use arrow::array::{
    Array, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array, StringArray,
    TimestampMicrosecondArray,
};
use arrow::compute::concat_batches;
use common::*;
use etlantic_core::plugin::source_provider;
use etlantic_core::streaming::ExecutionMode;

fn col<'a, T: 'static>(batch: &'a arrow::array::RecordBatch, name: &str) -> &'a T {
    batch
        .column_by_name(name)
        .unwrap()
        .as_any()
        .downcast_ref::<T>()
        .unwrap()
}

const BASE_US: i64 = 1_704_164_645_000_000; // 2024-01-02T03:04:05Z

#[tokio::test]
async fn jsonl_with_four_bad_lines_gives_six_rows_and_four_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        r#"{"order_id":1,"customer":"Alice","amount":12.5,"ts":"2024-01-02T03:04:05Z","day":"2024-01-02","paid":true,"score":50}"#,
        r#"{"order_id":2, "customer": "Bob","#,
        r#"{"order_id":3,"customer":"Carol","amount":"7.25","ts":1704164645000,"extra":"ignored"}"#,
        r#"{"order_id":4,"ts":"2024-01-02 03:04:05","day":null}"#,
        r#"{"order_id":"abc","ts":"2024-01-02T03:04:05Z"}"#,
        r#"{"order_id":6,"customer":"Dave","amount":0,"ts":"2024-01-02T04:04:05+01:00","score":99.5}"#,
        r#"{"customer":"Eve","ts":"2024-01-02T03:04:05Z"}"#,
        r#"{"order_id":8,"customer":"Frank","ts":"2024-01-02T03:04:05.123Z","paid":false}"#,
        r#"{"order_id":9,"customer":"Gina","amount":-1,"ts":"2024-01-02T03:04:05Z"}"#,
        r#"{"order_id":10,"customer":null,"ts":"2024-01-02T03:04:05Z","day":"2024-02-29"}"#,
    ];
    write(
        &dir.path().join("data/orders.jsonl"),
        &(lines.join("\n") + "\n"),
    );
    let c = contract(ORDERS);
    let provider = source_provider("file").expect("file source registered");
    let mut src = provider
        .create(ctx(
            dir.path(),
            "orders",
            "file://data/orders.jsonl",
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let out = read_all(&mut src).await;
    assert_eq!(out.num_rows(), 6);
    let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
    assert_eq!(b.schema(), c.arrow_schema());
    assert_eq!(
        col::<Int64Array>(&b, "order_id").values().to_vec(),
        vec![1, 3, 4, 6, 8, 10]
    );
    let customer = col::<StringArray>(&b, "customer");
    assert_eq!(
        (0..6)
            .map(|i| customer.is_valid(i).then(|| customer.value(i)))
            .collect::<Vec<_>>(),
        vec![
            Some("Alice"),
            Some("Carol"),
            None,
            Some("Dave"),
            Some("Frank"),
            None
        ]
    );
    let amount = col::<Decimal128Array>(&b, "amount");
    assert_eq!(
        (0..6)
            .map(|i| amount.is_valid(i).then(|| amount.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(1250), Some(725), None, Some(0), None, None]
    );
    let ts = col::<TimestampMicrosecondArray>(&b, "ts");
    assert_eq!(
        ts.values().to_vec(),
        vec![
            BASE_US,
            BASE_US,
            BASE_US,
            BASE_US,
            BASE_US + 123_000,
            BASE_US
        ]
    );
    let day = col::<Date32Array>(&b, "day");
    assert_eq!(
        (0..6)
            .map(|i| day.is_valid(i).then(|| day.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(19724), None, None, None, None, Some(19782)]
    );
    let paid = col::<BooleanArray>(&b, "paid");
    assert_eq!(
        (0..6)
            .map(|i| paid.is_valid(i).then(|| paid.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(true), None, None, None, Some(false), None]
    );
    let score = col::<Float64Array>(&b, "score");
    assert_eq!(score.null_count(), 4);
    assert_eq!((score.value(0), score.value(3)), (50.0, 99.5));

    assert_eq!(
        summary(&out.rejected),
        vec![
            ("ETL701".into(), None, Some(2), None),
            ("ETL702".into(), Some("order_id".into()), Some(5), None),
            ("ETL703".into(), Some("order_id".into()), Some(7), None),
            ("ETL704".into(), Some("amount".into()), Some(9), None),
        ]
    );
    for r in &out.rejected {
        assert_eq!(r.position.asset, "orders");
        assert_eq!(r.position.file.as_deref(), Some("data/orders.jsonl"));
    }
    assert_eq!(out.rejected[0].raw, lines[1]);
    assert_eq!(out.rejected[1].raw, lines[4]);
    assert_eq!(out.rejected[3].raw, lines[8]);
    assert!(out.rejected[0].reason.contains("line 2 is not valid JSON"));
    assert_eq!(
        out.rejected[1].reason,
        "field `order_id`: expected an integer (Int64), got a string \"abc\""
    );
    assert_eq!(
        out.rejected[2].reason,
        "required field `order_id` is missing"
    );
    assert_eq!(
        out.rejected[3].reason,
        "field `amount`: value -1 is below the minimum 0"
    );
}

#[tokio::test]
async fn every_kind_of_bad_json_value_is_rejected_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let ok = r#""ts":"2024-01-02T03:04:05Z""#;
    let cases: Vec<(String, &str, Option<&str>)> = vec![
        (
            format!(r#"{{"order_id":1,"customer":{{"a":1}},{ok}}}"#),
            "ETL702",
            Some("customer"),
        ),
        (
            format!(r#"{{"order_id":1,"paid":"yes",{ok}}}"#),
            "ETL702",
            Some("paid"),
        ),
        (
            format!(r#"{{"order_id":1,"amount":1.234,{ok}}}"#),
            "ETL702",
            Some("amount"),
        ),
        (
            format!(r#"{{"order_id":1,"day":"2024-02-30",{ok}}}"#),
            "ETL702",
            Some("day"),
        ),
        (
            r#"{"order_id":1,"ts":"yesterday"}"#.to_string(),
            "ETL702",
            Some("ts"),
        ),
        (
            r#"{"order_id":1,"ts":null}"#.to_string(),
            "ETL703",
            Some("ts"),
        ),
        (
            format!(r#"{{"order_id":null,{ok}}}"#),
            "ETL703",
            Some("order_id"),
        ),
        (
            format!(r#"{{"order_id":1,"customer":"alice",{ok}}}"#),
            "ETL704",
            Some("customer"),
        ),
        (
            format!(r#"{{"order_id":1,"customer":"Bartholomew",{ok}}}"#),
            "ETL704",
            Some("customer"),
        ),
        (
            format!(r#"{{"order_id":1,"score":100,{ok}}}"#),
            "ETL704",
            Some("score"),
        ),
        (
            format!(r#"{{"order_id":0,{ok}}}"#),
            "ETL704",
            Some("order_id"),
        ),
        ("[1,2,3]".to_string(), "ETL701", None),
        ("not json".to_string(), "ETL701", None),
        (
            format!(r#"{{"order_id":1.5,{ok}}}"#),
            "ETL702",
            Some("order_id"),
        ),
    ];
    let mut text = String::new();
    for (line, _, _) in &cases {
        text.push_str(line);
        text.push('\n');
        text.push('\n'); // blank lines are not records, but they are counted
    }
    write(&dir.path().join("bad.ndjson"), &text);
    let c = contract(ORDERS);
    let mut src = batch_file_source(dir.path(), "orders", "file://bad.ndjson", &c);
    let out = read_all(&mut src).await;
    assert_eq!(out.num_rows(), 0);
    let got = summary(&out.rejected);
    let want: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, code, field))| {
            (
                code.to_string(),
                field.map(String::from),
                Some(2 * i as u64 + 1),
                None,
            )
        })
        .collect();
    assert_eq!(got, want);
    let reasons: Vec<&str> = out.rejected.iter().map(|r| r.reason.as_str()).collect();
    assert!(
        reasons[2].contains("more than 2 decimal places"),
        "{}",
        reasons[2]
    );
    assert!(reasons[7].contains("does not match the pattern `[A-Z][a-z]+`"));
    assert!(reasons[8].contains("11 characters, more than the maximum length 10"));
    assert!(reasons[9].contains("not below the exclusive maximum 100"));
}

#[tokio::test]
async fn csv_counts_the_header_line_and_matches_columns_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let text = "id,note,ts,v\n\
                1,hello,2024-01-02T03:04:05Z,1.5\n\
                2,\"multi\nline note\",,2.5\n\
                x,bad,,1\n\
                4,short\n\
                5,\"quoted, comma\",1704164645000,\n\
                -1,neg,,\n";
    write(&dir.path().join("in/events.csv"), text);
    let c = contract(EVENTS);
    let mut src = batch_file_source(dir.path(), "events", "file://in/events.csv", &c);
    let out = read_all(&mut src).await;
    let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
    assert_eq!(col::<Int64Array>(&b, "id").values().to_vec(), vec![1, 2, 5]);
    let note = col::<StringArray>(&b, "note");
    assert_eq!(
        (0..3).map(|i| note.value(i)).collect::<Vec<_>>(),
        vec!["hello", "multi\nline note", "quoted, comma"]
    );
    let ts = col::<TimestampMicrosecondArray>(&b, "ts");
    assert_eq!(
        (0..3)
            .map(|i| ts.is_valid(i).then(|| ts.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(BASE_US), None, Some(BASE_US)]
    );
    let v = col::<Float64Array>(&b, "v");
    assert_eq!(
        (0..3)
            .map(|i| v.is_valid(i).then(|| v.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(1.5), Some(2.5), None]
    );
    assert_eq!(
        summary(&out.rejected),
        vec![
            ("ETL702".into(), Some("id".into()), Some(5), None),
            ("ETL701".into(), None, Some(6), None),
            ("ETL704".into(), Some("id".into()), Some(8), None),
        ]
    );
    assert_eq!(out.rejected[0].raw, "x,bad,,1");
    assert_eq!(out.rejected[1].raw, "4,short");
    assert_eq!(out.rejected[1].reason, "line 6 has 2 columns, expected 4");
    assert_eq!(out.rejected[2].raw, "-1,neg,,");
    assert_eq!(
        out.rejected[0].position.file.as_deref(),
        Some("in/events.csv")
    );

    // Columns in another order, an extra column, a custom delimiter.
    write(
        &dir.path().join("in/reordered.csv"),
        "v;extra;ID;note\n3.5;zzz;7;seven\n;;;x\n",
    );
    let mut src = batch_file_source(
        dir.path(),
        "events",
        "file://in/reordered.csv?delimiter=;",
        &c,
    );
    let out = read_all(&mut src).await;
    let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
    assert_eq!(col::<Int64Array>(&b, "id").values().to_vec(), vec![7]);
    assert_eq!(col::<Float64Array>(&b, "v").value(0), 3.5);
    assert_eq!(col::<StringArray>(&b, "note").value(0), "seven");
    assert!(col::<TimestampMicrosecondArray>(&b, "ts").is_null(0));
    assert_eq!(
        summary(&out.rejected),
        vec![("ETL703".into(), Some("id".into()), Some(3), None)]
    );
}

/// A CSV file larger than the 4 MiB blocks it is read in, with rejected records whose
/// quoted notes span lines: one of them across the first block boundary. Every good row is
/// read, and each rejected record keeps its exact text and first line.
#[tokio::test]
async fn csv_records_that_span_read_blocks_keep_their_text_and_lines() {
    const BLOCK: usize = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("id,note,ts,v\n");
    let mut line = 1u64;
    let mut good = 0i64;
    let mut bad: Vec<(u64, String)> = Vec::new();
    let bad_record = |n: u64| format!("x{n},\"spans\nlines {n}\",,1");
    let mut cut_placed = false;
    while text.len() < 2 * BLOCK + 1000 {
        // Just before the first block's end: a rejected record that the boundary cuts.
        if !cut_placed && text.len() > BLOCK - 20 {
            cut_placed = true;
            let r = bad_record(line + 1);
            assert!(text.len() < BLOCK && text.len() + r.len() > BLOCK);
            line += 1;
            bad.push((line, r.clone()));
            text.push_str(&r);
            text.push('\n');
            line += 1; // the note's second line
            continue;
        }
        line += 1;
        if line.is_multiple_of(5000) {
            let r = bad_record(line);
            bad.push((line, r.clone()));
            text.push_str(&r);
            text.push('\n');
            line += 1;
        } else {
            good += 1;
            text.push_str(&format!("{good},n,,1.5\n"));
        }
    }
    assert!(cut_placed);
    write(&dir.path().join("big.csv"), &text);
    let c = contract(EVENTS);
    let mut src = batch_file_source(dir.path(), "events", "file://big.csv", &c);
    let out = read_all(&mut src).await;
    let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
    assert_eq!(
        col::<Int64Array>(&b, "id").values().to_vec(),
        (1..=good).collect::<Vec<_>>()
    );
    let got: Vec<(u64, String)> = out
        .rejected
        .iter()
        .map(|r| (r.position.line.unwrap(), r.raw.clone()))
        .collect();
    assert_eq!(got, bad);
    assert!(out.rejected.iter().all(|r| r.code == "ETL702"));
}

#[tokio::test]
async fn csv_first_data_line_is_line_two_with_a_header_and_one_without() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("h.csv"), "id,note,ts,v\nbad,a,,\n");
    write(&dir.path().join("n.csv"), "bad,a,,\n");
    let c = contract(EVENTS);
    for (uri, line) in [("file://h.csv", 2), ("file://n.csv?header=false", 1)] {
        let mut src = batch_file_source(dir.path(), "events", uri, &c);
        let out = read_all(&mut src).await;
        assert_eq!(out.num_rows(), 0);
        assert_eq!(
            summary(&out.rejected),
            vec![("ETL702".into(), Some("id".into()), Some(line), None)],
            "{uri}"
        );
    }
}

#[tokio::test]
async fn csv_header_without_a_required_column_fails_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("x.csv"), "note,v\na,1\n");
    let c = contract(EVENTS);
    let mut src = batch_file_source(dir.path(), "events", "file://x.csv", &c);
    let end = src
        .latest_offset(None, &Default::default())
        .await
        .unwrap()
        .unwrap();
    let e = src.read(None, &end).await.unwrap_err();
    assert_eq!(e.code(), "ETL702");
    let d = e.diagnostics().iter().next().unwrap();
    assert_eq!(d.file.as_deref(), Some("x.csv"));
    assert!(d.message.contains("no column `id`"), "{}", d.message);
}

mod parquet_files {
    use super::*;
    use arrow::array::{ArrayRef, Int32Array, RecordBatch, TimestampMillisecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use std::sync::Arc;

    fn write_parquet(path: &std::path::Path, batch: &RecordBatch) {
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
    }

    #[tokio::test]
    async fn casts_losslessly_and_rejects_nulls_in_required_columns_per_row() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int32, true),
            Field::new("customer", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("unused", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![
                    Some(1),
                    None,
                    Some(3),
                    Some(0),
                    Some(5),
                ])) as ArrayRef,
                Arc::new(StringArray::from(vec![
                    Some("Ann"),
                    Some("Bob"),
                    None,
                    Some("Dan"),
                    Some("Eve"),
                ])),
                Arc::new(TimestampMillisecondArray::from(vec![
                    Some(1_704_164_645_000),
                    Some(1_704_164_645_000),
                    Some(1_704_164_645_001),
                    Some(1_704_164_645_000),
                    None,
                ])),
                Arc::new(StringArray::from(vec!["u"; 5])),
            ],
        )
        .unwrap();
        write_parquet(&dir.path().join("orders.parquet"), &batch);
        let c = contract(ORDERS);
        let mut src = batch_file_source(dir.path(), "orders", "file://orders.parquet", &c);
        let out = read_all(&mut src).await;
        let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
        assert_eq!(b.schema(), c.arrow_schema());
        assert_eq!(
            col::<Int64Array>(&b, "order_id").values().to_vec(),
            vec![1, 3]
        );
        assert_eq!(
            col::<TimestampMicrosecondArray>(&b, "ts").values().to_vec(),
            vec![BASE_US, BASE_US + 1000]
        );
        assert_eq!(col::<Decimal128Array>(&b, "amount").null_count(), 2);
        assert_eq!(
            summary(&out.rejected),
            vec![
                ("ETL703".into(), Some("order_id".into()), None, Some(1)),
                ("ETL704".into(), Some("order_id".into()), None, Some(3)),
                ("ETL703".into(), Some("ts".into()), None, Some(4)),
            ]
        );
        assert_eq!(
            out.rejected[0].raw,
            r#"{"order_id":null,"customer":"Bob","ts":"2024-01-02T03:04:05"}"#
        );
        assert_eq!(
            out.rejected[0].position.file.as_deref(),
            Some("orders.parquet")
        );
    }

    /// A customer name (as the contract's pattern wants) that spells `id`.
    fn name_of(id: i64) -> String {
        let digits: String = id
            .to_string()
            .bytes()
            .map(|d| (b'a' + d - b'0') as char)
            .collect();
        format!("C{digits}")
    }

    /// A large file's columns are decoded on two threads and put back side by side: the
    /// rows stay aligned across the columns, and rejected rows keep their positions.
    #[tokio::test]
    async fn a_large_file_decoded_on_two_threads_keeps_its_rows_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let n = 100_000usize;
        let schema = Arc::new(Schema::new(vec![
            Field::new("unused", DataType::Utf8, true),
            Field::new("order_id", DataType::Int32, true),
            Field::new("customer", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]));
        let ids: Int32Array = (0..n)
            .map(|i| match i {
                70_000 => None,
                99_999 => Some(0),
                _ => Some(i as i32 + 1),
            })
            .collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["u"; n])) as ArrayRef,
                Arc::new(ids),
                Arc::new(StringArray::from(
                    (0..n).map(|i| name_of(i as i64 + 1)).collect::<Vec<_>>(),
                )),
                Arc::new(TimestampMillisecondArray::from(
                    (0..n as i64)
                        .map(|i| 1_704_164_645_000 + i)
                        .collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap();
        write_parquet(&dir.path().join("big.parquet"), &batch);
        let c = contract(ORDERS);
        let mut src = batch_file_source(dir.path(), "orders", "file://big.parquet", &c);
        let out = read_all(&mut src).await;
        let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
        assert_eq!(b.schema(), c.arrow_schema());
        assert_eq!(b.num_rows(), n - 2);
        let ids = col::<Int64Array>(&b, "order_id");
        let customers = col::<StringArray>(&b, "customer");
        let ts = col::<TimestampMicrosecondArray>(&b, "ts");
        for r in 0..b.num_rows() {
            let id = ids.value(r);
            assert_eq!(customers.value(r), name_of(id), "row {r}");
            assert_eq!(ts.value(r), BASE_US + (id - 1) * 1000, "row {r}");
        }
        assert_eq!(
            summary(&out.rejected),
            vec![
                ("ETL703".into(), Some("order_id".into()), None, Some(70_000)),
                ("ETL704".into(), Some("order_id".into()), None, Some(99_999)),
            ]
        );
    }

    /// `read_only` lets the Parquet reader skip the columns the pipeline does not read —
    /// they come back as nulls — except where a record-level rule needs their values: a
    /// required column, a constrained one, one whose type needs a conversion.
    #[tokio::test]
    async fn columns_the_pipeline_does_not_read_are_skipped_unless_a_rule_needs_them() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("order_id", DataType::Int64, true),
            Field::new("customer", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("score", DataType::Float64, true),
            Field::new("paid", DataType::Boolean, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 0])) as ArrayRef,
                Arc::new(StringArray::from(vec!["Ann", "bob"])),
                Arc::new(TimestampMicrosecondArray::from(vec![BASE_US, BASE_US])),
                Arc::new(arrow::array::Float64Array::from(vec![1.5, 2.5])),
                Arc::new(arrow::array::BooleanArray::from(vec![true, false])),
            ],
        )
        .unwrap();
        write_parquet(&dir.path().join("o.parquet"), &batch);
        let c = contract(ORDERS);
        let mut src = batch_file_source(dir.path(), "orders", "file://o.parquet", &c);
        src.read_only(&["ts".to_string()]);
        let out = read_all(&mut src).await;
        let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
        assert_eq!(b.schema(), c.arrow_schema());
        // Row 1 breaks rules of columns the pipeline does not read (order_id >= 1,
        // customer's pattern): they were decoded and checked all the same.
        assert_eq!(
            summary(&out.rejected),
            vec![("ETL704".into(), Some("order_id".into()), None, Some(1))]
        );
        assert_eq!(col::<Int64Array>(&b, "order_id").values().to_vec(), vec![1]);
        assert_eq!(col::<StringArray>(&b, "customer").value(0), "Ann");
        assert_eq!(
            col::<TimestampMicrosecondArray>(&b, "ts").values().to_vec(),
            vec![BASE_US]
        );
        // `score` is constrained (`exclusiveMaximum`): decoded. `paid` is unread,
        // unconstrained and of the contract's type: skipped, read as nulls.
        assert_eq!(b.column_by_name("score").unwrap().null_count(), 0);
        assert_eq!(b.column_by_name("paid").unwrap().null_count(), 1);
        // Without the hint every column is decoded.
        let mut all = batch_file_source(dir.path(), "orders", "file://o.parquet", &c);
        let out = read_all(&mut all).await;
        let b = concat_batches(&c.arrow_schema(), &out.batches).unwrap();
        assert_eq!(b.column_by_name("score").unwrap().null_count(), 0);
        assert_eq!(b.column_by_name("paid").unwrap().null_count(), 0);
    }

    #[tokio::test]
    async fn missing_required_column_or_lossy_cast_fails_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let c = contract(ORDERS);
        let only_id = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "order_id",
                DataType::Int64,
                false,
            )])),
            vec![Arc::new(Int64Array::from(vec![1])) as ArrayRef],
        )
        .unwrap();
        write_parquet(&dir.path().join("no_ts.parquet"), &only_id);
        let string_id = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("order_id", DataType::Utf8, false),
                Field::new(
                    "ts",
                    DataType::Timestamp(TimeUnit::Microsecond, None),
                    false,
                ),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["1"])) as ArrayRef,
                Arc::new(TimestampMicrosecondArray::from(vec![0])),
            ],
        )
        .unwrap();
        write_parquet(&dir.path().join("string_id.parquet"), &string_id);
        for (name, needle) in [
            (
                "no_ts.parquet",
                "column `ts`, required by the contract, is missing",
            ),
            ("string_id.parquet", "column `order_id` has type Utf8"),
        ] {
            let mut src = batch_file_source(dir.path(), "orders", &format!("file://{name}"), &c);
            let end = src
                .latest_offset(None, &Default::default())
                .await
                .unwrap()
                .unwrap();
            let e = src.read(None, &end).await.unwrap_err();
            assert_eq!(e.code(), "ETL702", "{name}");
            let d = e.diagnostics().iter().next().unwrap();
            assert_eq!(d.file.as_deref(), Some(name));
            assert!(d.message.contains(needle), "{}", d.message);
        }
    }

    #[tokio::test]
    async fn a_file_that_is_not_parquet_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("fake.parquet"), "not parquet at all");
        let c = contract(ORDERS);
        let mut src = batch_file_source(dir.path(), "orders", "file://fake.parquet", &c);
        let end = src
            .latest_offset(None, &Default::default())
            .await
            .unwrap()
            .unwrap();
        let e = src.read(None, &end).await.unwrap_err();
        assert_eq!(e.code(), "ETL701");
        assert!(e.to_string().contains("fake.parquet"));
    }
}

#[tokio::test]
async fn create_checks_paths_and_formats() {
    let dir = tempfile::tempdir().unwrap();
    let c = contract(EVENTS);
    let p = source_provider("file").unwrap();
    let e = create_err(
        p,
        ctx(
            dir.path(),
            "e",
            "file://missing.jsonl",
            &c,
            ExecutionMode::Batch,
            None,
        ),
    );
    assert_eq!(e.code(), "ETL706");
    write(&dir.path().join("data.txt"), "x");
    let e = create_err(
        p,
        ctx(
            dir.path(),
            "e",
            "file://data.txt",
            &c,
            ExecutionMode::Batch,
            None,
        ),
    );
    assert_eq!(e.code(), "ETL505");
    write(&dir.path().join("e.jsonl"), "{}");
    let e = create_err(
        p,
        ctx(
            dir.path(),
            "e",
            "file://e.jsonl",
            &c,
            ExecutionMode::Streaming,
            None,
        ),
    );
    assert_eq!(e.code(), "ETL503");
    // An absolute path works too, and the position then names the absolute file.
    let abs = dir.path().join("e.jsonl");
    let mut src = p
        .create(ctx(
            std::path::Path::new("/nonexistent-root"),
            "e",
            &format!("file://{}", abs.display()),
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let out = read_all(&mut src).await;
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(
        out.rejected[0].position.file.as_deref(),
        Some(abs.to_str().unwrap())
    );
}
