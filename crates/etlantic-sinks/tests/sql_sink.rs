//! The SQL sink against the real PostgreSQL server on 127.0.0.1:5432 (database `test`,
//! trust authentication; `cargo xtask setup` starts it) and SQLite files.
//!
//! Every PostgreSQL test works in its own schema (dropped at the end), so the tests run
//! in parallel. A test that cannot reach PostgreSQL fails; none is skipped.

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
    Int16Array, Int32Array, Int64Array, RecordBatch, StringArray, Time64MicrosecondArray,
    TimestampMicrosecondArray, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_core::plugin::{self, Sink, SinkBatch, SinkContext, SourceContext, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use sqlx::{Connection, Row};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etlantic_sinks as _;
use etlantic_sources as _;

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Where a test writes: a PostgreSQL schema of its own or an SQLite file.
enum Db {
    Pg {
        schema: String,
    },
    Lite {
        _dir: tempfile::TempDir,
        root: PathBuf,
    },
}

impl Db {
    async fn pg(test: &str) -> Db {
        let schema = format!("etl_sink_{test}_{}", std::process::id());
        let mut c = sqlx::PgConnection::connect(PG)
            .await
            .expect("PostgreSQL on 127.0.0.1:5432 (run `cargo xtask setup`)");
        sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
            .execute(&mut c)
            .await
            .unwrap();
        Db::Pg { schema }
    }

    fn lite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        Db::Lite { _dir: dir, root }
    }

    fn all_pg_and_lite(pg: Db) -> Vec<Db> {
        vec![pg, Db::lite()]
    }

    fn name(&self) -> &'static str {
        match self {
            Db::Pg { .. } => "postgres",
            Db::Lite { .. } => "sqlite",
        }
    }

    /// The binding URI of `table` with extra parameters.
    fn uri(&self, table: &str, extra: &str) -> BindingUri {
        let text = match self {
            Db::Pg { schema } => format!("{PG}?table={schema}.{table}{extra}"),
            Db::Lite { .. } => format!("sqlite://out/db.sqlite?table={table}{extra}"),
        };
        BindingUri::parse(&text).unwrap()
    }

    fn root(&self) -> PathBuf {
        match self {
            Db::Pg { .. } => std::env::temp_dir(),
            Db::Lite { root, .. } => root.clone(),
        }
    }

    fn qualified(&self, table: &str) -> String {
        match self {
            Db::Pg { schema } => format!("\"{schema}\".\"{table}\""),
            Db::Lite { .. } => format!("\"{table}\""),
        }
    }

    /// Runs a query returning one integer.
    async fn scalar(&self, sql: &str) -> i64 {
        match self {
            Db::Pg { .. } => {
                let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
                sqlx::query(sql)
                    .fetch_one(&mut c)
                    .await
                    .unwrap()
                    .get::<i64, _>(0)
            }
            Db::Lite { root, .. } => {
                let o =
                    sqlx::sqlite::SqliteConnectOptions::new().filename(root.join("out/db.sqlite"));
                let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
                sqlx::query(sql)
                    .fetch_one(&mut c)
                    .await
                    .unwrap()
                    .get::<i64, _>(0)
            }
        }
    }

    async fn execute(&self, sql: &str) {
        match self {
            Db::Pg { .. } => {
                let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
            Db::Lite { root, .. } => {
                std::fs::create_dir_all(root.join("out")).unwrap();
                let o = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(root.join("out/db.sqlite"))
                    .create_if_missing(true);
                let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
        }
    }

    /// Reads the table back with the SQL source plugin, rows rendered as JSON and sorted.
    async fn rows(&self, table: &str, schema: &SchemaRef) -> Vec<String> {
        let uri = self.uri(table, "");
        let provider = plugin::source_provider(&uri.scheme).unwrap();
        let mut source = provider
            .create(SourceContext {
                storage_options: Default::default(),
                asset: table.into(),
                uri,
                schema: schema.clone(),
                contract: None,
                root: self.root(),
                mode: ExecutionMode::Batch,
                state: None,
            })
            .unwrap();
        let end = source
            .latest_offset(None, &Default::default())
            .await
            .unwrap()
            .unwrap();
        let read = source.read(None, &end).await.unwrap();
        assert!(read.rejected.is_empty(), "{:?}", read.rejected);
        let mut rows = json_rows(&read.batches);
        rows.sort();
        rows
    }

    async fn drop(self) {
        if let Db::Pg { schema } = &self {
            self.execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await;
        }
    }
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
    out
}

fn kv_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn kv(rows: &[(&str, Option<i64>)]) -> Table {
    let schema = kv_schema();
    let k: StringArray = rows.iter().map(|(k, _)| Some(*k)).collect();
    let v: Int64Array = rows.iter().map(|(_, v)| *v).collect();
    let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(k), Arc::new(v)]).unwrap();
    Table::new(schema, vec![b])
}

fn sink(db: &Db, uri: BindingUri, schema: SchemaRef, mode: ExecutionMode) -> Box<dyn Sink> {
    let provider = plugin::sink_provider(&uri.scheme).unwrap();
    provider
        .create(SinkContext {
            storage_options: Default::default(),
            asset: "out".into(),
            uri,
            schema,
            contract: None,
            root: db.root(),
            mode,
            output_mode: OutputMode::Append,
        })
        .unwrap()
}

async fn write(
    s: &mut Box<dyn Sink>,
    query: &str,
    batch_id: u64,
    mode: OutputMode,
    t: &Table,
) -> WriteOutcome {
    s.write(SinkBatch {
        query_id: query,
        batch_id,
        output_mode: mode,
        data: t,
    })
    .await
    .unwrap()
}

fn kv_json(rows: &[(&str, Option<i64>)]) -> Vec<String> {
    let mut v: Vec<String> = rows
        .iter()
        .map(|(k, v)| serde_json::json!({"k": k, "v": v}).to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn append_writes_each_batch_once_and_a_replay_is_a_no_op() {
    for db in Db::all_pg_and_lite(Db::pg("append").await) {
        let label = db.name();
        let mut s = sink(
            &db,
            db.uri("events", ""),
            kv_schema(),
            ExecutionMode::Streaming,
        );
        assert_eq!(s.last_committed_batch("q1").await.unwrap(), None, "{label}");
        let b0 = kv(&[("a", Some(1)), ("b", None)]);
        let b1 = kv(&[("c", Some(3))]);
        assert_eq!(
            write(&mut s, "q1", 0, OutputMode::Append, &b0).await,
            WriteOutcome::Written { rows: 2 }
        );
        assert_eq!(
            write(&mut s, "q1", 1, OutputMode::Append, &b1).await,
            WriteOutcome::Written { rows: 1 }
        );
        // A replay of batch 1 (and of an older batch) changes nothing, also from a new
        // sink instance (after a restart).
        let mut s2 = sink(
            &db,
            db.uri("events", ""),
            kv_schema(),
            ExecutionMode::Streaming,
        );
        assert_eq!(
            write(&mut s2, "q1", 1, OutputMode::Append, &b1).await,
            WriteOutcome::AlreadyCommitted,
            "{label}"
        );
        assert_eq!(
            write(&mut s2, "q1", 0, OutputMode::Append, &b0).await,
            WriteOutcome::AlreadyCommitted
        );
        assert_eq!(s2.last_committed_batch("q1").await.unwrap(), Some(1));
        // Another query writing the same table keeps its own progress row.
        assert_eq!(
            write(&mut s2, "q2", 0, OutputMode::Append, &kv(&[("d", Some(4))])).await,
            WriteOutcome::Written { rows: 1 }
        );
        assert_eq!(
            db.rows("events", &kv_schema()).await,
            kv_json(&[("a", Some(1)), ("b", None), ("c", Some(3)), ("d", Some(4))]),
            "{label}"
        );
        let progress = db
            .scalar(&format!(
                "SELECT count(*) FROM {} WHERE sink LIKE '%events'",
                db.qualified("_etlantic_sink_progress")
            ))
            .await;
        assert_eq!(progress, 2, "{label}: one progress row per query");
        s.close().await.unwrap();
        s2.close().await.unwrap();
        db.drop().await;
    }
}

#[tokio::test]
async fn upsert_updates_rows_by_key_in_update_mode() {
    for db in Db::all_pg_and_lite(Db::pg("upsert").await) {
        let label = db.name();
        let uri = db.uri("latest", "&mode=upsert&keys=k");
        let caps = plugin::sink_provider(&uri.scheme)
            .unwrap()
            .capabilities(&uri)
            .unwrap();
        assert!(caps.output_modes.contains(&OutputMode::Update));
        let mut s = sink(&db, uri, kv_schema(), ExecutionMode::Streaming);
        write(
            &mut s,
            "q",
            0,
            OutputMode::Update,
            &kv(&[("a", Some(1)), ("b", Some(2))]),
        )
        .await;
        // One key twice in a batch: the last row wins.
        let out = write(
            &mut s,
            "q",
            1,
            OutputMode::Update,
            &kv(&[("a", Some(10)), ("c", Some(3)), ("c", None)]),
        )
        .await;
        assert_eq!(out, WriteOutcome::Written { rows: 2 });
        assert_eq!(
            db.rows("latest", &kv_schema()).await,
            kv_json(&[("a", Some(10)), ("b", Some(2)), ("c", None)]),
            "{label}"
        );
        // Replayed: nothing changes even though the rows would update.
        assert_eq!(
            write(&mut s, "q", 1, OutputMode::Update, &kv(&[("a", Some(99))])).await,
            WriteOutcome::AlreadyCommitted
        );
        assert_eq!(
            db.scalar(&format!(
                "SELECT count(*) FROM {} WHERE v = 99",
                db.qualified("latest")
            ))
            .await,
            0
        );
        s.close().await.unwrap();
        db.drop().await;
    }
    // Without upsert the update mode is refused.
    let uri = BindingUri::parse("sqlite://x.db?table=t").unwrap();
    let caps = plugin::sink_provider("sqlite")
        .unwrap()
        .capabilities(&uri)
        .unwrap();
    assert!(!caps.output_modes.contains(&OutputMode::Update));
}

#[tokio::test]
async fn complete_mode_replaces_the_table_in_the_same_transaction() {
    for db in Db::all_pg_and_lite(Db::pg("complete").await) {
        let label = db.name();
        let mut s = sink(
            &db,
            db.uri("totals", ""),
            kv_schema(),
            ExecutionMode::Streaming,
        );
        write(
            &mut s,
            "q",
            0,
            OutputMode::Complete,
            &kv(&[("a", Some(1)), ("b", Some(1))]),
        )
        .await;
        write(
            &mut s,
            "q",
            1,
            OutputMode::Complete,
            &kv(&[("a", Some(2)), ("b", Some(1)), ("c", Some(1))]),
        )
        .await;
        assert_eq!(
            db.rows("totals", &kv_schema()).await,
            kv_json(&[("a", Some(2)), ("b", Some(1)), ("c", Some(1))]),
            "{label}"
        );
        // A replay of batch 1 does not delete anything.
        assert_eq!(
            write(&mut s, "q", 1, OutputMode::Complete, &kv(&[])).await,
            WriteOutcome::AlreadyCommitted
        );
        // An empty complete batch empties the table.
        write(&mut s, "q", 2, OutputMode::Complete, &kv(&[])).await;
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM {}", db.qualified("totals")))
                .await,
            0
        );
        assert_eq!(s.last_committed_batch("q").await.unwrap(), Some(2));
        db.drop().await;
    }
}

#[tokio::test]
async fn a_failure_inside_the_transaction_leaves_nothing() {
    for db in Db::all_pg_and_lite(Db::pg("failure").await) {
        let label = db.name();
        // A table whose CHECK constraint the last row of a large batch breaks: the
        // batch is written by several INSERT statements and the last one fails.
        db.execute(&format!(
            "CREATE TABLE {} (k TEXT NOT NULL, v BIGINT CHECK (v < 100000))",
            db.qualified("checked")
        ))
        .await;
        let mut s = sink(
            &db,
            db.uri("checked", ""),
            kv_schema(),
            ExecutionMode::Streaming,
        );
        write(
            &mut s,
            "q",
            0,
            OutputMode::Append,
            &kv(&[("first", Some(1))]),
        )
        .await;
        let keys: Vec<String> = (0..=100_000).map(|i| format!("k{i}")).collect();
        let rows: Vec<(&str, Option<i64>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), Some(i as i64)))
            .collect();
        let err = s
            .write(SinkBatch {
                query_id: "q",
                batch_id: 1,
                output_mode: OutputMode::Append,
                data: &kv(&rows),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), "ETL709", "{label}: {err}");
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM {}", db.qualified("checked")))
                .await,
            1,
            "{label}: none of the failed batch's rows is visible"
        );
        assert_eq!(
            s.last_committed_batch("q").await.unwrap(),
            Some(0),
            "{label}"
        );
        // The sink keeps working: the batch is retried with good rows.
        write(&mut s, "q", 1, OutputMode::Append, &kv(&rows[..50_000])).await;
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM {}", db.qualified("checked")))
                .await,
            50_001
        );
        db.drop().await;
    }
}

/// Run as a child process by the next test: writes batch 0, then batch 1 with the
/// `in_sink` fail point armed, which aborts the process inside the transaction.
#[tokio::test]
async fn child_killed_in_sink() {
    let Ok(target) = std::env::var("ETLANTIC_SQL_CHILD") else {
        return;
    };
    let (kind, rest) = target.split_once('|').unwrap();
    let db = if kind == "pg" {
        Db::Pg {
            schema: rest.to_string(),
        }
    } else {
        Db::Lite {
            _dir: tempfile::tempdir().unwrap(),
            root: PathBuf::from(rest),
        }
    };
    let mut s = sink(
        &db,
        db.uri("killed", ""),
        kv_schema(),
        ExecutionMode::Streaming,
    );
    // ETLANTIC_FAIL_POINT=in_sink:1 is set by the parent.
    write(&mut s, "q", 0, OutputMode::Append, &kv(&[("a", Some(1))])).await;
    write(
        &mut s,
        "q",
        1,
        OutputMode::Append,
        &kv(&[("b", Some(2)), ("c", Some(3))]),
    )
    .await;
    unreachable!("the fail point aborts the process");
}

#[tokio::test]
async fn a_process_killed_in_the_middle_of_the_write_commits_nothing() {
    use std::os::unix::process::ExitStatusExt;
    for db in Db::all_pg_and_lite(Db::pg("killed").await) {
        let label = db.name();
        let target = match &db {
            Db::Pg { schema } => format!("pg|{schema}"),
            Db::Lite { root, .. } => format!("lite|{}", root.display()),
        };
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_killed_in_sink",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ETLANTIC_SQL_CHILD", target)
            .env("ETLANTIC_FAIL_POINT", "in_sink:1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(6),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr)
            .contains("ETLANTIC_FAIL_POINT reached: in_sink of batch 1"));
        // After the crash: batch 0 only; the replay of batch 1 writes it once.
        assert_eq!(
            db.rows("killed", &kv_schema()).await,
            kv_json(&[("a", Some(1))]),
            "{label}"
        );
        let mut s = sink(
            &db,
            db.uri("killed", ""),
            kv_schema(),
            ExecutionMode::Streaming,
        );
        assert_eq!(s.last_committed_batch("q").await.unwrap(), Some(0));
        write(
            &mut s,
            "q",
            1,
            OutputMode::Append,
            &kv(&[("b", Some(2)), ("c", Some(3))]),
        )
        .await;
        assert_eq!(
            write(
                &mut s,
                "q",
                1,
                OutputMode::Append,
                &kv(&[("b", Some(2)), ("c", Some(3))])
            )
            .await,
            WriteOutcome::AlreadyCommitted
        );
        assert_eq!(
            db.rows("killed", &kv_schema()).await,
            kv_json(&[("a", Some(1)), ("b", Some(2)), ("c", Some(3))]),
            "{label}"
        );
        db.drop().await;
    }
}

fn typed_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("i16", DataType::Int16, true),
        Field::new("i32", DataType::Int32, true),
        Field::new("i64", DataType::Int64, false),
        Field::new("u64", DataType::UInt64, true),
        Field::new("f32", DataType::Float32, true),
        Field::new("f64", DataType::Float64, true),
        Field::new("dec", DataType::Decimal128(18, 4), true),
        Field::new("txt", DataType::Utf8, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("day", DataType::Date32, true),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new(
            "at_tz",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("tod", DataType::Time64(TimeUnit::Microsecond), true),
        Field::new("bin", DataType::Binary, true),
    ]))
}

fn typed_rows() -> Table {
    let schema = typed_schema();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int16Array::from(vec![Some(-32768), None, Some(7)])),
        Arc::new(Int32Array::from(vec![Some(i32::MAX), None, Some(-1)])),
        Arc::new(Int64Array::from(vec![i64::MIN, 0, i64::MAX])),
        Arc::new(UInt64Array::from(vec![
            Some(5),
            None,
            Some(9_000_000_000_000_000_000),
        ])),
        Arc::new(Float32Array::from(vec![Some(1.5), None, Some(-0.25)])),
        Arc::new(Float64Array::from(vec![Some(1e300), None, Some(0.1)])),
        Arc::new(
            Decimal128Array::from(vec![Some(123_456_789_012_345_678), None, Some(-1)])
                .with_precision_and_scale(18, 4)
                .unwrap(),
        ),
        Arc::new(StringArray::from(vec![
            Some("héllo, \"world\"\n'"),
            None,
            Some(""),
        ])),
        Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
        Arc::new(Date32Array::from(vec![Some(19_723), None, Some(-1)])),
        Arc::new(TimestampMicrosecondArray::from(vec![
            Some(1_704_067_200_123_456),
            None,
            Some(-1),
        ])),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_704_067_200_000_001), None, Some(0)])
                .with_timezone("UTC"),
        ),
        Arc::new(Time64MicrosecondArray::from(vec![
            Some(3_723_000_001),
            None,
            Some(0),
        ])),
        Arc::new(BinaryArray::from(vec![
            Some(&[0u8, 255, 10, 92][..]),
            None,
            Some(&b""[..]),
        ])),
    ];
    Table::new(
        schema.clone(),
        vec![RecordBatch::try_new(schema, cols).unwrap()],
    )
}

#[tokio::test]
async fn every_type_survives_a_round_trip() {
    for db in Db::all_pg_and_lite(Db::pg("types").await) {
        let label = db.name();
        let t = typed_rows();
        let mut s = sink(
            &db,
            db.uri("typed", ""),
            typed_schema(),
            ExecutionMode::Batch,
        );
        assert_eq!(
            write(&mut s, "plan", 0, OutputMode::Append, &t).await,
            WriteOutcome::Written { rows: 3 }
        );
        let mut want = json_rows(&t.batches);
        want.sort();
        assert_eq!(db.rows("typed", &typed_schema()).await, want, "{label}");
        if let Db::Pg { schema } = &db {
            let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
            let types: Vec<(String, String)> = sqlx::query_as(
                "SELECT column_name::text, data_type::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'typed' ORDER BY ordinal_position",
            )
            .bind(schema)
            .fetch_all(&mut c)
            .await
            .unwrap();
            let types: Vec<String> = types.into_iter().map(|(c, t)| format!("{c} {t}")).collect();
            assert_eq!(
                types,
                [
                    "i16 smallint",
                    "i32 integer",
                    "i64 bigint",
                    "u64 numeric",
                    "f32 real",
                    "f64 double precision",
                    "dec numeric",
                    "txt text",
                    "flag boolean",
                    "day date",
                    "at timestamp without time zone",
                    "at_tz timestamp with time zone",
                    "tod time without time zone",
                    "bin bytea",
                ]
            );
            // The instant is stored, not a local rendering.
            let micros: i64 = sqlx::query(&format!(
                "SELECT (extract(epoch FROM at_tz) * 1000000)::bigint FROM \"{schema}\".typed WHERE i64 = $1"
            ))
            .bind(i64::MIN)
            .fetch_one(&mut c)
            .await
            .unwrap()
            .get(0);
            assert_eq!(micros, 1_704_067_200_000_001);
        }
        // A batch run writes again (no progress row): append appends.
        write(&mut s, "plan", 0, OutputMode::Append, &t).await;
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM {}", db.qualified("typed")))
                .await,
            6,
            "{label}"
        );
        // overwrite replaces.
        let mut o = sink(
            &db,
            db.uri("typed", "&mode=overwrite"),
            typed_schema(),
            ExecutionMode::Batch,
        );
        write(&mut o, "plan", 0, OutputMode::Append, &t).await;
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM {}", db.qualified("typed")))
                .await,
            3,
            "{label}"
        );
        db.drop().await;
    }
}

#[tokio::test]
async fn a_large_batch_is_chunked_under_the_bind_limits() {
    for db in Db::all_pg_and_lite(Db::pg("large").await) {
        let label = db.name();
        let keys: Vec<String> = (0..100_000).map(|i| format!("key-{i}")).collect();
        let rows: Vec<(&str, Option<i64>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), (i % 7 != 0).then_some(i as i64)))
            .collect();
        let t = kv(&rows);
        for (table, extra) in [("big", ""), ("big_upsert", "&mode=upsert&keys=k")] {
            let mut s = sink(
                &db,
                db.uri(table, extra),
                kv_schema(),
                ExecutionMode::Streaming,
            );
            let started = std::time::Instant::now();
            assert_eq!(
                write(&mut s, "q", 0, OutputMode::Append, &t).await,
                WriteOutcome::Written { rows: 100_000 }
            );
            eprintln!(
                "{label} {table}: 100000 rows in {} ms",
                started.elapsed().as_millis()
            );
            let q = db.qualified(table);
            assert_eq!(
                db.scalar(&format!("SELECT count(*) FROM {q}")).await,
                100_000
            );
            assert_eq!(
                db.scalar(&format!("SELECT count(*) FROM {q} WHERE v IS NULL"))
                    .await,
                14_286
            );
            assert_eq!(
                db.scalar(&format!("SELECT CAST(sum(v) AS BIGINT) FROM {q}"))
                    .await,
                (0..100_000i64).filter(|i| i % 7 != 0).sum::<i64>()
            );
        }
        db.drop().await;
    }
}

#[tokio::test]
async fn connection_errors_never_show_the_password() {
    let db = Db::lite();
    let uri = BindingUri::parse("postgres://etl:s3cr3t-p4ss@127.0.0.1:1/test?table=t").unwrap();
    let mut s = sink(&db, uri, kv_schema(), ExecutionMode::Streaming);
    let e = s
        .write(SinkBatch {
            query_id: "q",
            batch_id: 0,
            output_mode: OutputMode::Append,
            data: &kv(&[("a", Some(1))]),
        })
        .await
        .unwrap_err();
    let text = format!("{e} {e:?}");
    assert_eq!(e.code(), "ETL706");
    assert!(text.contains("etl@127.0.0.1:1/test"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    // Bad bindings are diagnostics, not panics.
    for bad in [
        "postgres://127.0.0.1/test?table=t&mode=upsert",
        "postgres://127.0.0.1?table=t",
        "sqlite://x.db?table=t&mode=upsert&keys=nope",
    ] {
        let uri = BindingUri::parse(bad).unwrap();
        let e = plugin::sink_provider(&uri.scheme)
            .unwrap()
            .create(SinkContext {
                storage_options: Default::default(),
                asset: "out".into(),
                uri,
                schema: kv_schema(),
                contract: None,
                root: Path::new("/tmp").to_path_buf(),
                mode: ExecutionMode::Streaming,
                output_mode: OutputMode::Append,
            })
            .err()
            .expect("a bad binding");
        assert_eq!(e.code(), "ETL007", "{bad}");
    }
}
