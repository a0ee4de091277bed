//! Unit tests of the SQL sink: binding options, connect options, statements and value
//! rendering.

use super::columns::{column_plan, columns_of, time_text, timestamp_text};
use super::connect::{describe_target, pg_options, sqlite_options};
use super::statements::Statements;
use super::*;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

fn opts(text: &str) -> Result<SqlSinkOptions> {
    SqlSinkOptions::from_uri(&BindingUri::parse(text).unwrap())
}

/// A committed batch must survive a power cut: SQLite syncs on every commit only with
/// `synchronous=FULL` (2), whichever journal mode the database is in.
#[tokio::test]
async fn sqlite_connections_sync_every_commit() {
    use sqlx::Connection;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.db");
    let mut c = SqliteConnection::connect_with(&sqlite_options(&path))
        .await
        .unwrap();
    let (level,): (i64,) = sqlx::query_as("PRAGMA synchronous")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(level, 2, "synchronous=FULL");
}

#[test]
fn options() {
    let o = opts("postgres://u@h:5432/db?table=s.t&mode=upsert&keys=a,b").unwrap();
    assert_eq!(o.dialect, Dialect::Postgres);
    assert_eq!(o.table.quoted(), "\"s\".\"t\"");
    assert_eq!(
        o.table.progress_table(),
        "\"s\".\"_etlantic_sink_progress\""
    );
    assert_eq!(o.keys, ["a", "b"]);
    assert_eq!(
        opts("sqlite://x.db?table=t").unwrap().mode,
        WriteMode::Append
    );
    for bad in [
        "sqlite://x.db",
        "sqlite://x.db?table=t&mode=upsert",
        "sqlite://x.db?table=t&mode=nope",
        "sqlite://x.db?table=t&colour=red",
        "sqlite://x.db?table=a.b.c",
        "postgres://h/db?table=t&sslmode=sometimes",
    ] {
        assert_eq!(opts(bad).unwrap_err().code(), "ETL007", "{bad}");
    }
    assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
}

#[test]
fn passwords_stay_out_of_descriptions() {
    let uri = BindingUri::parse("postgres://bob:p@ss:w/rd@db:5433/x?table=t").unwrap();
    assert_eq!(describe_target(&uri), "postgres://bob@db:5433/x");
    let o = pg_options(&uri, None).unwrap();
    assert_eq!(o.get_host(), "db");
    assert_eq!(o.get_port(), 5433);
    assert_eq!(o.get_username(), "bob");
    assert_eq!(o.get_database(), Some("x"));
    assert!(pg_options(&BindingUri::parse("postgres://db:5432").unwrap(), None).is_err());
}

#[test]
fn insert_statements_are_chunked_and_quoted() {
    let schema = Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("amount", DataType::Decimal128(10, 2), true),
    ]);
    let st = Statements {
        dialect: Dialect::Postgres,
        table: TableName::parse("s.t").unwrap(),
        columns: columns_of(Dialect::Postgres, &schema).unwrap(),
        keys: vec!["k".into()],
    };
    assert_eq!(
        st.insert(2, true),
        "INSERT INTO \"s\".\"t\" (\"k\", \"amount\") VALUES ($1,$2::numeric),($3,$4::numeric) ON CONFLICT (\"k\") DO UPDATE SET \"amount\" = excluded.\"amount\""
    );
    assert_eq!(st.rows_per_statement(), 32767);
    assert_eq!(
        st.create_table(true),
        "CREATE TABLE IF NOT EXISTS \"s\".\"t\" (\"k\" TEXT NOT NULL, \"amount\" NUMERIC(10,2), PRIMARY KEY (\"k\"))"
    );
    let lite = Statements {
        dialect: Dialect::Sqlite,
        ..st
    };
    assert_eq!(lite.rows_per_statement(), 16383);
    assert!(lite.insert(1, false).ends_with("VALUES (?,?)"));
}

#[test]
fn values_render_exactly() {
    assert_eq!(
        timestamp_text(1_704_067_200_123_456, TimeUnit::Microsecond, true).unwrap(),
        "2024-01-01T00:00:00.123456Z"
    );
    assert_eq!(
        timestamp_text(1_704_067_200, TimeUnit::Second, false).unwrap(),
        "2024-01-01T00:00:00"
    );
    assert_eq!(
        time_text(3_723_500_000_000, TimeUnit::Millisecond).unwrap(),
        "01:02:03.500"
    );
    let e = column_plan(
        Dialect::Sqlite,
        "x",
        &DataType::new_list(DataType::Int32, true),
        true,
    )
    .unwrap_err();
    assert_eq!(e.code(), "ETL304");
}
