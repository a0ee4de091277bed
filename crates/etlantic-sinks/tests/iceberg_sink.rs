//! The `iceberg://` sink against a real SQL catalog on SQLite and tables on disk:
//! table creation and type mapping, appends read back with iceberg's table scan,
//! idempotent replays, a second query, bad configuration.
#![cfg(feature = "iceberg")]

mod common;

use arrow::array::{
    Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
    TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use common::*;
use etlantic_core::data::Table;
use etlantic_core::guarantee::SinkCommitProtocol;
use etlantic_core::plugin::{sink_provider, Sink, SinkContext, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_sinks::iceberg::{IcebergTarget, BATCH_ID_PROPERTY, QUERY_ID_PROPERTY};
use std::path::Path;
use std::sync::Arc;

const URI: &str = "iceberg://shop/orders?catalog=sqlite://lake/catalog.db&warehouse=lake/wh";

fn ctx_with(root: &Path, uri: &str, schema: SchemaRef, output_mode: OutputMode) -> SinkContext {
    SinkContext {
        storage_options: Default::default(),
        asset: "orders_out".into(),
        uri: BindingUri::parse(uri).unwrap(),
        schema,
        contract: None,
        root: root.to_path_buf(),
        mode: ExecutionMode::Streaming,
        output_mode,
    }
}

fn iceberg_sink(root: &Path, uri: &str) -> Box<dyn Sink> {
    sink_provider("iceberg")
        .expect("iceberg sink registered")
        .create(sink_ctx(
            root,
            uri,
            ExecutionMode::Streaming,
            OutputMode::Append,
        ))
        .unwrap()
}

fn target(root: &Path, uri: &str) -> IcebergTarget {
    IcebergTarget::from_uri(&BindingUri::parse(uri).unwrap())
        .unwrap()
        .resolve(root)
}

/// The table's rows cast back to `schema`, sorted by the first (integer) column.
async fn rows(root: &Path, uri: &str, schema: &SchemaRef) -> RecordBatch {
    let batches = target(root, uri).read_rows().await.unwrap();
    let mut cast = Vec::new();
    for b in &batches {
        let cols: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| {
                arrow::compute::cast(b.column_by_name(f.name()).unwrap(), f.data_type()).unwrap()
            })
            .collect();
        cast.push(RecordBatch::try_new(schema.clone(), cols).unwrap());
    }
    let all = concat(schema, &cast);
    let order = arrow::compute::sort_to_indices(all.column(0), None, None).unwrap();
    arrow::compute::take_record_batch(&all, &order).unwrap()
}

fn data_files(root: &Path) -> Vec<String> {
    let dir = root.join("lake/wh/shop/orders/data");
    if !dir.exists() {
        return vec![];
    }
    listing(&dir)
}

#[tokio::test]
async fn creates_the_table_and_appends_batches_with_types_and_nulls() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let q = "4f3c9a1b-0000-4000-8000-000000000001";
    let caps = sink_provider("iceberg")
        .unwrap()
        .capabilities(&BindingUri::parse(URI).unwrap())
        .unwrap();
    assert_eq!(
        caps.guarantee.protocol,
        SinkCommitProtocol::IdempotentByBatch
    );
    assert_eq!(caps.output_modes, vec![OutputMode::Append]);
    assert!(caps.streaming && !caps.batch);

    let mut sink = iceberg_sink(root, URI);
    assert!(
        !root.join("lake").exists(),
        "creating the sink writes nothing"
    );
    assert_eq!(sink.last_committed_batch(q).await.unwrap(), None);
    let b0 = table(vec![orders(0, 3)]);
    let b1 = table(vec![orders(3, 2), orders(5, 1)]);
    assert_eq!(
        sink.write(batch(q, 0, OutputMode::Append, &b0))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert_eq!(
        sink.write(batch(q, 1, OutputMode::Append, &b1))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert!(root.join("lake/catalog.db").is_file());
    let schema = contract().arrow_schema();
    assert_eq!(rows(root, URI, &schema).await, orders(0, 6));
    assert_eq!(sink.last_committed_batch(q).await.unwrap(), Some(1));

    // The table: Iceberg types with field ids in order, required where the contract says so.
    let t = target(root, URI).load_table().await.unwrap();
    let s = t.metadata().current_schema();
    let types: Vec<(i32, String, bool, String)> = s
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.id, f.name.clone(), f.required, f.field_type.to_string()))
        .collect();
    let expect = |id, n: &str, r, ty: &str| (id, n.to_string(), r, ty.to_string());
    assert_eq!(
        types,
        vec![
            expect(1, "order_id", true, "long"),
            expect(2, "customer", false, "string"),
            expect(3, "amount", false, "decimal(10, 2)"),
            expect(4, "ts", true, "timestamptz"),
            expect(5, "day", false, "date"),
            expect(6, "paid", false, "boolean"),
            expect(7, "score", false, "double"),
        ]
    );
    assert!(t.metadata().location().ends_with("lake/wh/shop/orders"));
    // One snapshot per batch, each recording its query and batch id.
    assert_eq!(
        target(root, URI).committed_batches().await.unwrap(),
        vec![(q.to_string(), 1), (q.to_string(), 0)]
    );
    let head = t.metadata().current_snapshot().unwrap();
    let props = &head.summary().additional_properties;
    assert_eq!(props[QUERY_ID_PROPERTY], q);
    assert_eq!(props[BATCH_ID_PROPERTY], "1");
    assert_eq!(props["added-records"], "3");
    assert_eq!(t.metadata().snapshots().len(), 2);
    let files = data_files(root);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].starts_with("etl-4f3c9a1b-00000-"), "{files:?}");
    assert!(files[1].starts_with("etl-4f3c9a1b-00001-"), "{files:?}");
    assert!(files.iter().all(|f| f.ends_with(".parquet")));
}

#[tokio::test]
async fn a_replayed_batch_writes_nothing_and_a_second_query_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let q1 = "query-one";
    let q2 = "query-two";
    let mut sink = iceberg_sink(root, URI);
    for (id, data) in [(0, orders(0, 2)), (1, orders(2, 2))] {
        sink.write(batch(q1, id, OutputMode::Append, &table(vec![data])))
            .await
            .unwrap();
    }
    let files_before = data_files(root);
    let snapshots_before = target(root, URI).committed_batches().await.unwrap();

    // After a crash a new instance is asked to write batch 1 again (even with other
    // rows), and an older batch: both are already committed.
    let mut restarted = iceberg_sink(root, URI);
    assert_eq!(restarted.last_committed_batch(q1).await.unwrap(), Some(1));
    assert_eq!(restarted.last_committed_batch(q2).await.unwrap(), None);
    for id in [1, 0] {
        assert_eq!(
            restarted
                .write(batch(
                    q1,
                    id,
                    OutputMode::Append,
                    &table(vec![orders(100, 5)])
                ))
                .await
                .unwrap(),
            WriteOutcome::AlreadyCommitted,
            "batch {id}"
        );
    }
    assert_eq!(data_files(root), files_before, "no data file written");
    assert_eq!(
        target(root, URI).committed_batches().await.unwrap(),
        snapshots_before,
        "no snapshot committed"
    );
    let schema = contract().arrow_schema();
    assert_eq!(rows(root, URI, &schema).await, orders(0, 4));

    // Another query with the same batch ids appends.
    assert_eq!(
        restarted
            .write(batch(q2, 0, OutputMode::Append, &table(vec![orders(4, 3)])))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 3 }
    );
    assert_eq!(rows(root, URI, &schema).await, orders(0, 7));
    assert_eq!(restarted.last_committed_batch(q2).await.unwrap(), Some(0));
    assert_eq!(restarted.last_committed_batch(q1).await.unwrap(), Some(1));

    // An empty batch records its id without a data file.
    let files = data_files(root);
    assert_eq!(
        restarted
            .write(batch(q1, 2, OutputMode::Append, &table(vec![])))
            .await
            .unwrap(),
        WriteOutcome::Written { rows: 0 }
    );
    assert_eq!(data_files(root), files);
    assert_eq!(restarted.last_committed_batch(q1).await.unwrap(), Some(2));
    assert_eq!(
        restarted
            .write(batch(
                q1,
                2,
                OutputMode::Append,
                &table(vec![orders(50, 1)])
            ))
            .await
            .unwrap(),
        WriteOutcome::AlreadyCommitted
    );
    assert_eq!(rows(root, URI, &schema).await, orders(0, 7));
}

#[tokio::test]
async fn naive_zoned_nanosecond_and_small_integer_columns_map_and_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let uri = "iceberg://raw/events?catalog=sqlite://cat.db&warehouse=file://wh";
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new(
            "local_ts",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            true,
        ),
        Field::new(
            "paris_ts",
            DataType::Timestamp(TimeUnit::Millisecond, Some("Europe/Paris".into())),
            true,
        ),
        Field::new("note", DataType::Utf8, true),
    ]));
    let data = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![1, 2, 3])),
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(1_700_000_000_123_456_789),
                None,
                Some(-1_000),
            ])),
            Arc::new(
                TimestampMillisecondArray::from(vec![None, Some(1_700_000_000_123), Some(0)])
                    .with_timezone("Europe/Paris"),
            ),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("")])),
        ],
    )
    .unwrap();
    let mut sink = sink_provider("iceberg")
        .unwrap()
        .create(ctx_with(root, uri, schema.clone(), OutputMode::Append))
        .unwrap();
    sink.write(batch(
        "q",
        0,
        OutputMode::Append,
        &Table::new(schema.clone(), vec![data.clone()]),
    ))
    .await
    .unwrap();
    let t = target(root, uri).load_table().await.unwrap();
    let s = t.metadata().current_schema();
    let ty = |n: &str| s.field_by_name(n).unwrap().field_type.to_string();
    assert_eq!(ty("id"), "int");
    assert_eq!(ty("local_ts"), "timestamp");
    assert_eq!(ty("paris_ts"), "timestamptz");
    assert!(s.field_by_name("id").unwrap().required);
    assert!(root.join("wh/raw/events/metadata").is_dir());

    let back = target(root, uri).read_rows().await.unwrap();
    let back = concat(&back[0].schema(), &back);
    assert_eq!(back.num_rows(), 3);
    assert_eq!(
        back.schema()
            .field_with_name("paris_ts")
            .unwrap()
            .data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    );
    let local = back
        .column_by_name("local_ts")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
        .unwrap();
    // Nanoseconds are truncated to microseconds; nulls stay null.
    assert_eq!(local.value(0), 1_700_000_000_123_456);
    assert!(local.is_null(1));
    assert_eq!(local.value(2), -1);
    let paris = back
        .column_by_name("paris_ts")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
        .unwrap();
    assert!(paris.is_null(0));
    assert_eq!(paris.value(1), 1_700_000_000_123_000, "the same instant");
    assert_eq!(paris.value(2), 0);
    let note = back
        .column_by_name("note")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(
        (0..3)
            .map(|i| (!note.is_null(i)).then(|| note.value(i)))
            .collect::<Vec<_>>(),
        vec![Some("a"), None, Some("")]
    );
}

#[tokio::test]
async fn bad_configuration_gets_diagnostics_with_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let provider = sink_provider("iceberg").unwrap();
    let create = |uri: &str, mode: ExecutionMode, out: OutputMode| {
        provider
            .create(sink_ctx(root, uri, mode, out))
            .err()
            .map(|e| e.code().to_string())
    };
    // Bad bindings.
    for uri in [
        "iceberg://orders",
        "iceberg://shop/orders?catalog=postgres://localhost/cat",
        "iceberg://shop/orders?format=parquet",
        "iceberg://shop/or$ders",
    ] {
        assert_eq!(
            create(uri, ExecutionMode::Streaming, OutputMode::Append).as_deref(),
            Some("ETL007"),
            "{uri}"
        );
        assert_eq!(
            provider
                .capabilities(&BindingUri::parse(uri).unwrap())
                .unwrap_err()
                .code(),
            "ETL007"
        );
    }
    // Unsupported modes.
    assert_eq!(
        create(URI, ExecutionMode::Streaming, OutputMode::Complete).as_deref(),
        Some("ETL504")
    );
    assert_eq!(
        create(URI, ExecutionMode::Streaming, OutputMode::Update).as_deref(),
        Some("ETL504")
    );
    assert_eq!(
        create(URI, ExecutionMode::Batch, OutputMode::Append).as_deref(),
        Some("ETL504")
    );
    let mut sink = iceberg_sink(root, URI);
    let e = sink
        .write(batch(
            "q",
            0,
            OutputMode::Complete,
            &table(vec![orders(0, 1)]),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL504");
    // A type Iceberg cannot hold.
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("n", DataType::UInt64, true)]));
    let e = provider
        .create(ctx_with(root, URI, schema.clone(), OutputMode::Append))
        .err()
        .expect("UInt64 refused");
    assert_eq!(e.code(), "ETL505");
    assert!(e.to_string().contains("`n`"), "{e}");

    // A catalog that cannot be opened: its directory is a file, or it is a directory.
    std::fs::write(root.join("not_a_dir"), "x").unwrap();
    for uri in [
        "iceberg://shop/orders?catalog=sqlite://not_a_dir/catalog.db",
        "iceberg://shop/orders?catalog=sqlite://.",
    ] {
        let mut sink = iceberg_sink(root, uri);
        let e = sink
            .write(batch(
                "q",
                0,
                OutputMode::Append,
                &table(vec![orders(0, 1)]),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "ETL706", "{uri}: {e}");
        let e = sink.last_committed_batch("q").await.unwrap_err();
        assert_eq!(e.code(), "ETL706", "{uri}: {e}");
    }
    assert_eq!(listing(root), vec!["not_a_dir"], "nothing else written");
}

#[tokio::test]
async fn an_existing_table_with_another_schema_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut sink = iceberg_sink(root, URI);
    sink.write(batch(
        "q",
        0,
        OutputMode::Append,
        &table(vec![orders(0, 2)]),
    ))
    .await
    .unwrap();
    // A column the table lacks, and a type that does not match.
    for schema in [
        Schema::new(vec![
            Field::new("order_id", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("extra", DataType::Utf8, true),
        ]),
        Schema::new(vec![
            Field::new("order_id", DataType::Utf8, false),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
        ]),
        // The table's required `ts` is missing.
        Schema::new(vec![Field::new("order_id", DataType::Int64, false)]),
    ] {
        let schema = Arc::new(schema);
        let mut other = sink_provider("iceberg")
            .unwrap()
            .create(ctx_with(root, URI, schema.clone(), OutputMode::Append))
            .unwrap();
        let e = other
            .write(batch(
                "q2",
                0,
                OutputMode::Append,
                &Table::new(schema.clone(), vec![]),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "ETL305", "{schema:?}: {e}");
    }
    // A compatible subset (optional columns left out, int promoted to long) appends.
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int32, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
    ]));
    let mut narrow = sink_provider("iceberg")
        .unwrap()
        .create(ctx_with(root, URI, schema.clone(), OutputMode::Append))
        .unwrap();
    let data = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![10])),
            Arc::new(TimestampMillisecondArray::from(vec![TS0 / 1000]).with_timezone("UTC")),
        ],
    )
    .unwrap();
    narrow
        .write(batch(
            "q3",
            0,
            OutputMode::Append,
            &Table::new(schema, vec![data]),
        ))
        .await
        .unwrap();
    let all = rows(root, URI, &contract().arrow_schema()).await;
    assert_eq!(all.num_rows(), 3);
    let ids = all.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(ids.values().to_vec(), vec![0, 1, 10]);
    assert!(all.column(1).is_null(2), "left-out optional column is null");
}
