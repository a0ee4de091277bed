//! The SQL source against the real PostgreSQL server on 127.0.0.1:5432 (database
//! `test`; `cargo xtask setup` starts it) and SQLite files: bounded reads of a table or a
//! query into the contract's schema, rows that do not fit quarantined with their row.
//! Each PostgreSQL test uses its own schema, dropped at the end.

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::RejectedRecord;
use etlantic_core::plugin::{self, SourceBatch, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use sqlx::Connection;
use std::path::Path;
use std::sync::Arc;

use etlantic_sources as _;

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

async fn pg_exec(sql: &str) {
    let mut c = sqlx::PgConnection::connect(PG)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run `cargo xtask setup`)");
    sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
}

async fn lite_exec(path: &Path, sql: &str) {
    let o = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
    c.close().await.unwrap();
}

async fn read(uri: &str, schema: SchemaRef, root: &Path) -> etlantic_core::Result<SourceBatch> {
    let uri = BindingUri::parse(uri).unwrap();
    let provider = plugin::source_provider(&uri.scheme).unwrap();
    let mut source = provider.create(SourceContext {
        storage_options: Default::default(),
        asset: "orders".into(),
        uri,
        schema,
        contract: None,
        root: root.to_path_buf(),
        mode: ExecutionMode::Batch,
        state: None,
    })?;
    let end = source
        .latest_offset(None, &Default::default())
        .await?
        .expect("a bounded source has a snapshot");
    let first = source.read(None, &end).await?;
    // Nothing after the one snapshot.
    assert_eq!(
        source
            .latest_offset(Some(&end), &Default::default())
            .await?,
        Some(end.clone())
    );
    assert_eq!(source.read(Some(&end), &end).await?.num_rows(), 0);
    Ok(first)
}

fn json_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(Vec::new());
        w.write(b).unwrap();
        w.finish().unwrap();
        out.extend(
            String::from_utf8(w.into_inner())
                .unwrap()
                .lines()
                .map(str::to_string),
        );
    }
    out.sort();
    out
}

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("amount", DataType::Decimal128(10, 2), true),
        Field::new("small", DataType::Int16, true),
        Field::new("paid", DataType::Boolean, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("day", DataType::Date32, true),
        Field::new("data", DataType::Binary, true),
        Field::new("ratio", DataType::Float64, true),
    ]))
}

fn rejected_summary(r: &[RejectedRecord]) -> Vec<(u64, String, Option<String>)> {
    let mut v: Vec<_> = r
        .iter()
        .map(|r| (r.position.row.unwrap(), r.code.clone(), r.field.clone()))
        .collect();
    v.sort();
    v
}

fn good_rows() -> Vec<String> {
    let mut v = vec![
        r#"{"id":1,"name":"a","amount":"12.50","small":7,"paid":true,"at":"2024-01-01T10:00:00.123Z","day":"2024-01-02","data":"00ff5c","ratio":0.1}"#.to_string(),
        r#"{"id":5,"name":"e","amount":null,"small":null,"paid":null,"at":null,"day":null,"data":null,"ratio":null}"#.to_string(),
    ];
    v.sort();
    v
}

/// What the good rows look like through the Arrow JSON writer (decimals as numbers,
/// binary as hex).
fn normalise(rows: Vec<String>) -> Vec<String> {
    rows.into_iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r).unwrap();
            serde_json::to_string(&v).unwrap()
        })
        .collect()
}

fn expected_good() -> Vec<String> {
    let mut want: Vec<String> = good_rows()
        .into_iter()
        .map(|r| {
            let mut v: serde_json::Value = serde_json::from_str(&r).unwrap();
            if let Some(a) = v["amount"].as_str() {
                v["amount"] = serde_json::json!(a.parse::<f64>().unwrap());
            }
            if v["at"].is_string() {
                v["at"] = serde_json::json!("2024-01-01T10:00:00.123Z");
            }
            serde_json::to_string(&v).unwrap()
        })
        .collect();
    want.sort();
    want
}

#[tokio::test]
async fn a_postgres_table_is_read_into_the_contract_and_bad_rows_are_quarantined() {
    let schema_name = format!("etl_src_pg_{}", std::process::id());
    pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema_name} CASCADE; CREATE SCHEMA {schema_name};
         CREATE TABLE {schema_name}.orders (id INTEGER, name TEXT, amount NUMERIC(12,3), small INTEGER,
            paid BOOLEAN, at TIMESTAMPTZ, day DATE, data BYTEA, ratio DOUBLE PRECISION, extra TEXT);
         INSERT INTO {schema_name}.orders VALUES
            (1, 'a', 12.5, 7, true, '2024-01-01 11:00:00.123+01', '2024-01-02', '\\x00ff5c', 0.1, 'ignored'),
            (2, 'b', 1.234, 1, false, NULL, NULL, NULL, NULL, NULL),
            (3, NULL, 1, 1, false, NULL, NULL, NULL, NULL, NULL),
            (4, 'd', 1, 40000, false, NULL, NULL, NULL, NULL, NULL),
            (5, 'e', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);"
    ))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let got = read(
        &format!("{PG}?table={schema_name}.orders"),
        orders_schema(),
        tmp.path(),
    )
    .await
    .unwrap();
    let rows = normalise(json_rows(&got.batches));
    assert_eq!(rows, expected_good());
    assert_eq!(
        rejected_summary(&got.rejected),
        vec![
            (1, "ETL702".into(), Some("amount".into())),
            (2, "ETL703".into(), Some("name".into())),
            (3, "ETL702".into(), Some("small".into())),
        ]
    );
    let r = got
        .rejected
        .iter()
        .find(|r| r.position.row == Some(3))
        .unwrap();
    assert_eq!(r.position.asset, "orders");
    let raw: serde_json::Value = serde_json::from_str(&r.raw).unwrap();
    assert_eq!(raw["small"], 40000);
    assert_eq!(raw["extra"], serde_json::Value::Null);
    assert!(r.reason.contains("40000"), "{}", r.reason);

    // A query instead of a table (percent-encoded in the URI).
    let q = format!("SELECT id, name FROM {schema_name}.orders WHERE id >= 4 ORDER BY id")
        .replace(' ', "%20")
        .replace('>', "%3E")
        .replace('=', "%3D");
    let ids = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let got = read(&format!("{PG}?query={q}"), ids.clone(), tmp.path())
        .await
        .unwrap();
    assert_eq!(
        json_rows(&got.batches),
        [r#"{"id":4,"name":"d"}"#, r#"{"id":5,"name":"e"}"#]
    );
    // A required field the result does not have fails the read.
    let missing = Arc::new(Schema::new(vec![Field::new(
        "nope",
        DataType::Int64,
        false,
    )]));
    let e = read(
        &format!("{PG}?table={schema_name}.orders"),
        missing,
        tmp.path(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), "ETL702");
    // A missing table is an I/O error naming the target without a password.
    let e = read(
        &format!(
            "postgres://postgres:pw-not-shown@127.0.0.1:5432/test?table={schema_name}.nothing"
        ),
        ids,
        tmp.path(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), "ETL706");
    assert!(!e.to_string().contains("pw-not-shown"), "{e}");
    assert!(
        e.to_string().contains("postgres@127.0.0.1:5432/test"),
        "{e}"
    );
    pg_exec(&format!("DROP SCHEMA {schema_name} CASCADE")).await;
}

#[tokio::test]
async fn an_sqlite_table_is_read_with_its_dynamic_types() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("shop.db");
    lite_exec(
        &db,
        "CREATE TABLE orders (id INTEGER, name TEXT, amount TEXT, small INTEGER, paid BOOLEAN,
            at TEXT, day TEXT, data BLOB, ratio REAL);
         INSERT INTO orders VALUES
            (1, 'a', '12.50', 7, 1, '2024-01-01T10:00:00.123Z', '2024-01-02', x'00ff5c', 0.1),
            (2, 'b', '1.234', 1, 0, NULL, NULL, NULL, NULL),
            (3, NULL, '1', 1, 0, NULL, NULL, NULL, NULL),
            ('four', 'd', '1', 1, 0, NULL, NULL, NULL, NULL),
            (5, 'e', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
            (6, 'f', NULL, NULL, 2, NULL, 'not a day', NULL, NULL);",
    )
    .await;
    let got = read("sqlite://shop.db?table=orders", orders_schema(), tmp.path())
        .await
        .unwrap();
    assert_eq!(normalise(json_rows(&got.batches)), expected_good());
    assert_eq!(
        rejected_summary(&got.rejected),
        vec![
            (1, "ETL702".into(), Some("amount".into())),
            (2, "ETL703".into(), Some("name".into())),
            (3, "ETL702".into(), Some("id".into())),
            (5, "ETL702".into(), Some("paid".into())),
        ]
    );
    // A missing database file is an error (the source never creates one).
    let e = read("sqlite://nope.db?table=orders", orders_schema(), tmp.path())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ETL706");
    assert!(!tmp.path().join("nope.db").exists());
}

#[test]
fn the_source_is_bounded_only() {
    for text in [
        "postgres://u@h/db?table=t",
        "postgresql://u@h/db?query=SELECT%201",
        "sqlite://x.db?table=t",
    ] {
        let uri = BindingUri::parse(text).unwrap();
        let c = plugin::source_provider(&uri.scheme)
            .unwrap()
            .capabilities(&uri)
            .unwrap();
        assert!(c.bounded && !c.unbounded, "{text}");
    }
    let uri = BindingUri::parse("sqlite://x.db").unwrap();
    let e = plugin::source_provider("sqlite")
        .unwrap()
        .capabilities(&uri)
        .unwrap_err();
    assert_eq!(e.code(), "ETL007");
}
