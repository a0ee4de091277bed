//! The SQL sink: PostgreSQL (`postgres://`, `postgresql://`) and SQLite (`sqlite://`)
//! tables, written through `sqlx`.
//!
//! # Binding
//!
//! ```text
//! postgres://[user[:password]@]host[:port]/database?table=[schema.]name&mode=append|upsert|overwrite&keys=a,b
//! sqlite://<path>?table=name&mode=append|upsert|overwrite&keys=a,b
//! ```
//!
//! - `table` (required): the target table, optionally schema-qualified (PostgreSQL).
//!   Names are quoted, so they are case-sensitive and may hold any character.
//! - `mode`: `append` (default) inserts the rows; `upsert` inserts or, when a row with
//!   the same `keys` exists, updates its other columns (`INSERT ... ON CONFLICT (keys)
//!   DO UPDATE`); `overwrite` deletes every row of the table before inserting (each
//!   write replaces the table).
//! - `keys` (required with `upsert`): comma-separated key columns.
//! - `sslmode` (PostgreSQL only): `disable`, `prefer`, `require`, ...
//!
//! A password never belongs in a profile in plain text (the profile check refuses it,
//! `ETL602`): write `postgres://etl:${secret:pg}@db:5432/warehouse` and declare
//! `secrets: {pg: "${env:PG_PASSWORD}"}`; the value is resolved at run time and taken
//! literally (no percent-decoding). The sink never prints it: messages name the target
//! as `postgres://user@host:port/database` and the table.
//!
//! An SQLite `<path>` is relative to the project root unless absolute
//! (`sqlite:///var/db/x.sqlite`); the file is created when missing.
//!
//! # Table creation and types
//!
//! A missing table is created from the Arrow schema in the batch's transaction (with
//! `PRIMARY KEY (keys)` in upsert mode; required fields are `NOT NULL`):
//!
//! | Arrow | PostgreSQL | SQLite (declared type, storage) |
//! |---|---|---|
//! | Int8, Int16, UInt8 | `SMALLINT` | `INTEGER` |
//! | Int32, UInt16 | `INTEGER` | `INTEGER` |
//! | Int64, UInt32 | `BIGINT` | `INTEGER` |
//! | UInt64 | `NUMERIC(20,0)` | `INTEGER` (values above `i64::MAX` fail the batch) |
//! | Float32 / Float64 | `REAL` / `DOUBLE PRECISION` | `REAL` |
//! | Decimal128(p, s) | `NUMERIC(p,s)` | `TEXT` (the exact decimal text) |
//! | Utf8, LargeUtf8 | `TEXT` | `TEXT` |
//! | Boolean | `BOOLEAN` | `BOOLEAN` (integers 0/1) |
//! | Date32, Date64 | `DATE` | `TEXT` `YYYY-MM-DD` |
//! | Timestamp without zone | `TIMESTAMP` | `TEXT` `YYYY-MM-DDTHH:MM:SS[.f]` |
//! | Timestamp with a zone | `TIMESTAMPTZ` (the instant) | `TEXT` `YYYY-MM-DDTHH:MM:SS[.f]Z` (the instant in UTC) |
//! | Time32, Time64 | `TIME` | `TEXT` `HH:MM:SS[.f]` |
//! | Binary, LargeBinary | `BYTEA` | `BLOB` |
//!
//! SQLite timestamps keep the column's unit as a fixed number of fractional digits, so
//! they sort as text; PostgreSQL keeps microseconds (nanoseconds are rounded by the
//! server). Nested types are refused (`ETL304`). An existing table is used as it is;
//! values are bound with their Arrow type (PostgreSQL applies its assignment casts).
//!
//! # Exactly-once: one transaction per batch with a progress row
//!
//! Next to the target table (in its schema on PostgreSQL) the sink keeps
//! `_etlantic_sink_progress(query_id, sink, batch_id, committed_at)` with primary key
//! `(query_id, sink)`, where `sink` is the `table` parameter as written (the progress
//! table itself is created, when missing, before the first batch's transaction). A
//! streaming micro-batch is written in ONE transaction:
//!
//! 1. `BEGIN` (SQLite: `BEGIN IMMEDIATE`, which takes the write lock at once);
//! 2. create the target table if it is missing;
//! 3. lock the progress row: PostgreSQL inserts a placeholder row (`ON CONFLICT DO
//!    NOTHING`) and reads it `FOR UPDATE`, so a concurrent writer of the same query waits;
//! 4. if the recorded batch id is at or after this batch's id, roll back and return
//!    [`WriteOutcome::AlreadyCommitted`] — a replay after a crash changes nothing;
//! 5. complete output mode or `mode=overwrite`: `DELETE FROM` the table;
//! 6. insert (or upsert) the rows: multi-row `INSERT`s with bound parameters, chunked
//!    under the bind-parameter limits (65535 on PostgreSQL, 32766 on SQLite); in upsert
//!    mode a batch holding one key several times keeps its last row;
//! 7. the `in_sink` fail point ([`etlantic_core::faults::IN_SINK`]);
//! 8. set the progress row to this batch id;
//! 9. `COMMIT`.
//!
//! The data and the record of the batch become visible together or not at all, so with a
//! replayable source the sink declares [`SinkCommitProtocol::Transactional`] (exactly
//! once end to end). [`Sink::last_committed_batch`] reads the progress row.
//!
//! Batch runs write the whole table in one transaction and keep no progress row: running
//! a batch pipeline again writes again (append appends, upsert updates, overwrite
//! replaces).
//!
//! Output modes: append and complete always (complete = delete + insert in the batch's
//! transaction); update only with `mode=upsert` (the changed rows replace the rows with
//! their keys).

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Float32Type, Float64Type, Int64Type, Schema, SchemaRef,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt64Type,
};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names_except, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgSslMode};
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteSynchronous};
use sqlx::{Arguments, Connection, Row};
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

/// The name of the progress table kept next to every target table.
pub const PROGRESS_TABLE: &str = "_etlantic_sink_progress";

/// The most bind parameters one PostgreSQL statement may carry.
pub const PG_MAX_BINDS: usize = 65535;
/// The most bind parameters one SQLite statement may carry (`SQLITE_MAX_VARIABLE_NUMBER`).
pub const SQLITE_MAX_BINDS: usize = 32766;

/// The SQL dialect of a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// SQLite (`sqlite://`).
    Sqlite,
}

impl Dialect {
    /// The dialect of a URI scheme.
    pub fn from_scheme(scheme: &str) -> Option<Self> {
        match scheme {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    fn max_binds(self) -> usize {
        match self {
            Dialect::Postgres => PG_MAX_BINDS,
            Dialect::Sqlite => SQLITE_MAX_BINDS,
        }
    }
}

/// How rows are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Insert every row.
    Append,
    /// Insert, or update the row with the same keys.
    Upsert,
    /// Delete every row of the table, then insert.
    Overwrite,
}

/// A possibly schema-qualified table name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    /// The schema (PostgreSQL), when given.
    pub schema: Option<String>,
    /// The table.
    pub name: String,
}

impl TableName {
    /// Parses `name` or `schema.name`.
    pub fn parse(text: &str) -> Option<Self> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (Some(s.to_string()), n.to_string()),
            None => (None, text.to_string()),
        };
        if name.is_empty() || schema.as_deref() == Some("") || name.contains('.') {
            return None;
        }
        Some(TableName { schema, name })
    }

    /// The quoted, qualified name.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(&self.name)),
            None => quote(&self.name),
        }
    }

    /// The quoted progress table in the same schema.
    pub fn progress_table(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(PROGRESS_TABLE)),
            None => quote(PROGRESS_TABLE),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Quotes an SQL identifier (`"` doubled inside).
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The options of an SQL sink binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlSinkOptions {
    /// The dialect.
    pub dialect: Dialect,
    /// The target table.
    pub table: TableName,
    /// The write mode.
    pub mode: WriteMode,
    /// Key columns (upsert).
    pub keys: Vec<String>,
    /// PostgreSQL `sslmode`.
    pub ssl_mode: Option<String>,
}

fn bad_uri(uri: &BindingUri, why: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::BAD_URI,
        format!("binding `{}`: {why}", uri.redacted()),
    )
}

impl SqlSinkOptions {
    /// Parses the URI's parameters (`ETL007` for a missing table, an unknown mode or
    /// parameter, upsert without keys).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let dialect = Dialect::from_scheme(&uri.scheme)
            .ok_or_else(|| bad_uri(uri, "not a postgres:// or sqlite:// binding"))?;
        let mut table = None;
        let mut mode = WriteMode::Append;
        let mut keys = Vec::new();
        let mut ssl_mode = None;
        for (k, v) in &uri.params {
            match k.as_str() {
                "table" => {
                    table = Some(TableName::parse(v).ok_or_else(|| {
                        bad_uri(uri, format!("`table={v}` is not `name` or `schema.name`"))
                    })?)
                }
                "mode" => {
                    mode = match v.to_ascii_lowercase().as_str() {
                        "append" => WriteMode::Append,
                        "upsert" => WriteMode::Upsert,
                        "overwrite" => WriteMode::Overwrite,
                        _ => {
                            return Err(bad_uri(
                                uri,
                                format!("`mode={v}`: expected append, upsert or overwrite"),
                            ))
                        }
                    }
                }
                "keys" | "key" => {
                    keys = v
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                }
                "sslmode" if dialect == Dialect::Postgres => {
                    PgSslMode::from_str(v).map_err(|_| {
                        bad_uri(uri, format!("`sslmode={v}` is not a PostgreSQL sslmode"))
                    })?;
                    ssl_mode = Some(v.clone());
                }
                other => {
                    return Err(bad_uri(
                        uri,
                        format!(
                            "unknown parameter `{other}` for the SQL sink (known: {})",
                            known_options(dialect)
                        ),
                    ))
                }
            }
        }
        let table = table.ok_or_else(|| {
            bad_uri(
                uri,
                "the SQL sink needs `?table=<name>` (e.g. ?table=public.counts)",
            )
        })?;
        if dialect == Dialect::Sqlite
            && table.schema.is_some()
            && table.schema.as_deref() != Some("main")
        {
            return Err(bad_uri(
                uri,
                "SQLite tables are not schema-qualified (write ?table=name)",
            ));
        }
        if mode == WriteMode::Upsert && keys.is_empty() {
            return Err(bad_uri(
                uri,
                "`mode=upsert` needs `keys=<column>[,<column>...]`",
            ));
        }
        Ok(SqlSinkOptions {
            dialect,
            table,
            mode,
            keys,
            ssl_mode,
        })
    }
}

/// Where to connect, parsed from the binding's location.
#[derive(Clone)]
pub(crate) enum Target {
    Postgres(Box<PgConnectOptions>),
    Sqlite(Box<SqliteConnectOptions>),
}

/// Parses `[user[:password]@]host[:port]/database`. The password is taken literally (a
/// resolved secret); the last `@` ends the user info, so the password may hold `@`.
pub(crate) fn pg_options(uri: &BindingUri, ssl_mode: Option<&str>) -> Result<PgConnectOptions> {
    let loc = uri.location.as_str();
    let (userinfo, rest) = match loc.rfind('@') {
        Some(at) => (Some(&loc[..at]), &loc[at + 1..]),
        None => (None, loc),
    };
    let (hostport, database) = rest.split_once('/').unwrap_or((rest, ""));
    if hostport.is_empty() {
        return Err(bad_uri(uri, "a PostgreSQL binding needs a host"));
    }
    let database = database.trim_end_matches('/');
    if database.is_empty() || database.contains('/') {
        return Err(bad_uri(
            uri,
            "a PostgreSQL binding needs a database: postgres://user@host:port/database",
        ));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| bad_uri(uri, format!("port `{p}` is not a number")))?,
        ),
        None => (hostport, 5432),
    };
    let mut o = PgConnectOptions::new_without_pgpass()
        .host(host)
        .port(port)
        .database(database)
        .application_name("etlantic")
        .options([("TimeZone", "UTC")]);
    if let Some(info) = userinfo {
        let (user, password) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        if !user.is_empty() {
            o = o.username(user);
        }
        if let Some(p) = password {
            o = o.password(p);
        }
    }
    if let Some(m) = ssl_mode {
        o = o.ssl_mode(PgSslMode::from_str(m).map_err(|_| bad_uri(uri, "bad sslmode"))?);
    }
    Ok(o)
}

/// How messages name a target: never with its password.
pub(crate) fn describe_target(uri: &BindingUri) -> String {
    let loc = match uri.location.rfind('@') {
        Some(at) => {
            let user = uri.location[..at].split(':').next().unwrap_or("");
            format!("{user}@{}", &uri.location[at + 1..])
        }
        None => uri.location.clone(),
    };
    format!("{}://{loc}", uri.scheme)
}

fn sqlite_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(std::time::Duration::from_secs(30))
}

/// The provider of `postgres://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostgresSinkProvider;
/// The provider of `postgresql://` sinks (the same sink as `postgres://`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PostgresqlSinkProvider;
/// The provider of `sqlite://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteSinkProvider;

inventory::submit! { SinkRegistration(&PostgresSinkProvider) }
inventory::submit! { SinkRegistration(&PostgresqlSinkProvider) }
inventory::submit! { SinkRegistration(&SqliteSinkProvider) }

fn capabilities(uri: &BindingUri) -> Result<SinkCapabilities> {
    let o = SqlSinkOptions::from_uri(uri)?;
    let mut output_modes = vec![OutputMode::Append, OutputMode::Complete];
    if o.mode == WriteMode::Upsert {
        output_modes.push(OutputMode::Update);
    }
    Ok(SinkCapabilities {
        batch: true,
        streaming: true,
        output_modes,
        guarantee: SinkGuarantee::new(SinkCommitProtocol::Transactional),
    })
}

const PG_DESCRIPTION: &str =
    "PostgreSQL tables (append, upsert by key, overwrite); one transaction per batch with a progress row";

/// The query parameters of a `postgres://`, `postgresql://` or `sqlite://` sink binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "table",
        default: "required",
        meaning: "The target table, `name` or `schema.name` (SQLite: only `main`); created when missing.",
    },
    BindingOption {
        name: "mode",
        default: "append",
        meaning: "`append` inserts rows; `upsert` inserts or updates by `keys`; `overwrite` deletes every row before inserting.",
    },
    BindingOption {
        name: "keys",
        default: "none (required with `upsert`)",
        meaning: "Comma-separated key columns of an upsert (also `key`).",
    },
    BindingOption {
        name: "sslmode",
        default: "prefer (or `$PGSSLMODE`)",
        meaning: "PostgreSQL only: the TLS mode (`disable`, `prefer`, `require`, ...).",
    },
];

/// The options of a binding of `dialect` (`sslmode` is PostgreSQL's only).
fn known_options(dialect: Dialect) -> String {
    let except: &[&str] = if dialect == Dialect::Postgres {
        &[]
    } else {
        &["sslmode"]
    };
    option_names_except(OPTIONS, except)
}

impl SinkProvider for PostgresSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "postgres"
    }
    fn description(&self) -> &'static str {
        PG_DESCRIPTION
    }
    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        capabilities(uri)
    }
    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(SqlSink::new(ctx)?))
    }
}

impl SinkProvider for PostgresqlSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "postgresql"
    }
    fn description(&self) -> &'static str {
        PG_DESCRIPTION
    }
    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        capabilities(uri)
    }
    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(SqlSink::new(ctx)?))
    }
}

impl SinkProvider for SqliteSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "sqlite"
    }
    fn description(&self) -> &'static str {
        "SQLite tables (append, upsert by key, overwrite); one transaction per batch with a progress row"
    }
    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        capabilities(uri)
    }
    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(SqlSink::new(ctx)?))
    }
}

// ---------------------------------------------------------------------------------------
// Column plans: SQL types, how values are rendered and bound

/// How one column's values are bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bind {
    I16,
    I32,
    I64,
    F32,
    F64,
    Bool,
    Text,
    Bytes,
}

#[derive(Clone, Debug)]
struct ColumnPlan {
    name: String,
    sql_type: String,
    not_null: bool,
    bind: Bind,
    /// PostgreSQL: a cast applied to the bound text (`numeric`, `timestamptz`, ...).
    cast: Option<&'static str>,
}

fn column_plan(dialect: Dialect, name: &str, dt: &DataType, nullable: bool) -> Result<ColumnPlan> {
    use DataType::*;
    let pg = dialect == Dialect::Postgres;
    let (sql_type, bind, cast): (String, Bind, Option<&'static str>) = match dt {
        Int8 | Int16 | UInt8 if pg => ("SMALLINT".into(), Bind::I16, None),
        Int32 | UInt16 if pg => ("INTEGER".into(), Bind::I32, None),
        Int64 | UInt32 if pg => ("BIGINT".into(), Bind::I64, None),
        UInt64 if pg => ("NUMERIC(20,0)".into(), Bind::Text, Some("numeric")),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            ("INTEGER".into(), Bind::I64, None)
        }
        Float16 | Float32 if pg => ("REAL".into(), Bind::F32, None),
        Float64 if pg => ("DOUBLE PRECISION".into(), Bind::F64, None),
        Float16 | Float32 | Float64 => ("REAL".into(), Bind::F64, None),
        Decimal128(p, s) | Decimal256(p, s) if pg => {
            (format!("NUMERIC({p},{s})"), Bind::Text, Some("numeric"))
        }
        Decimal128(_, _) | Decimal256(_, _) => ("TEXT".into(), Bind::Text, None),
        Utf8 | LargeUtf8 | Utf8View => ("TEXT".into(), Bind::Text, None),
        Boolean => ("BOOLEAN".into(), Bind::Bool, None),
        Date32 | Date64 if pg => ("DATE".into(), Bind::Text, Some("date")),
        Timestamp(_, None) if pg => ("TIMESTAMP".into(), Bind::Text, Some("timestamp")),
        Timestamp(_, Some(_)) if pg => ("TIMESTAMPTZ".into(), Bind::Text, Some("timestamptz")),
        Time32(_) | Time64(_) if pg => ("TIME".into(), Bind::Text, Some("time")),
        Date32 | Date64 | Timestamp(_, _) | Time32(_) | Time64(_) => {
            ("TEXT".into(), Bind::Text, None)
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) if pg => {
            ("BYTEA".into(), Bind::Bytes, None)
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            ("BLOB".into(), Bind::Bytes, None)
        }
        other => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!("column `{name}`: the SQL sink cannot write values of type {other}"),
            ))
        }
    };
    Ok(ColumnPlan {
        name: name.to_string(),
        sql_type,
        not_null: !nullable,
        bind,
        cast,
    })
}

/// One value ready to bind.
#[derive(Clone, Debug, PartialEq)]
enum Val {
    Null,
    I(i64),
    F(f64),
    B(bool),
    T(String),
    Y(Vec<u8>),
}

fn arrow_err(e: arrow::error::ArrowError) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"))
}

fn frac_format(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Second => "",
        TimeUnit::Millisecond => "%.3f",
        TimeUnit::Microsecond => "%.6f",
        TimeUnit::Nanosecond => "%.9f",
    }
}

fn timestamp_text(v: i64, unit: TimeUnit, zoned: bool) -> Option<String> {
    let t = match unit {
        TimeUnit::Second => chrono::DateTime::from_timestamp(v, 0),
        TimeUnit::Millisecond => chrono::DateTime::from_timestamp_millis(v),
        TimeUnit::Microsecond => chrono::DateTime::from_timestamp_micros(v),
        TimeUnit::Nanosecond => Some(chrono::DateTime::from_timestamp_nanos(v)),
    }?;
    let fmt = format!("%Y-%m-%dT%H:%M:%S{}", frac_format(unit));
    let mut s = t.naive_utc().format(&fmt).to_string();
    if zoned {
        s.push('Z');
    }
    Some(s)
}

fn time_text(nanos: i64, unit: TimeUnit) -> Option<String> {
    let secs = u32::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
    let frac = u32::try_from(nanos.rem_euclid(1_000_000_000)).ok()?;
    let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(secs, frac)?;
    Some(
        t.format(&format!("%H:%M:%S{}", frac_format(unit)))
            .to_string(),
    )
}

/// The values of one column, rendered for binding.
fn column_values(col: &ArrayRef, name: &str) -> Result<Vec<Val>> {
    use DataType::*;
    let n = col.len();
    let bad_value = |what: String| {
        Error::new(
            &codes::SINK_WRITE_FAILED,
            format!("column `{name}`: {what}"),
        )
    };
    let mut out = Vec::with_capacity(n);
    let nulls = |i: usize| col.is_null(i);
    match col.data_type() {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
            let c = cast(col, &Int64).map_err(arrow_err)?;
            let a = c.as_primitive::<Int64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::I(a.value(i))
                });
            }
        }
        UInt64 => {
            let a = col.as_primitive::<UInt64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value(i).to_string())
                });
            }
        }
        Float16 | Float32 => {
            let c = cast(col, &Float32).map_err(arrow_err)?;
            let a = c.as_primitive::<Float32Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::F(a.value(i) as f64)
                });
            }
        }
        Float64 => {
            let a = col.as_primitive::<Float64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::F(a.value(i))
                });
            }
        }
        Decimal128(_, _) => {
            let a = col.as_primitive::<arrow::datatypes::Decimal128Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value_as_string(i))
                });
            }
        }
        Decimal256(_, _) => {
            let a = col.as_primitive::<arrow::datatypes::Decimal256Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value_as_string(i))
                });
            }
        }
        Utf8 | LargeUtf8 | Utf8View => {
            let c = cast(col, &Utf8).map_err(arrow_err)?;
            let a = c.as_string::<i32>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value(i).to_string())
                });
            }
        }
        Boolean => {
            let a = col.as_boolean();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::B(a.value(i))
                });
            }
        }
        Date32 | Date64 => {
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let d = if col.data_type() == &Date32 {
                    arrow::temporal_conversions::as_date::<Date32Type>(
                        col.as_primitive::<Date32Type>().value(i) as i64,
                    )
                } else {
                    arrow::temporal_conversions::as_date::<Date64Type>(
                        col.as_primitive::<Date64Type>().value(i),
                    )
                };
                let d = d.ok_or_else(|| bad_value(format!("row {i}: date out of range")))?;
                out.push(Val::T(d.format("%Y-%m-%d").to_string()));
            }
        }
        Timestamp(unit, tz) => {
            let zoned = tz.is_some();
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let v = match unit {
                    TimeUnit::Second => col.as_primitive::<TimestampSecondType>().value(i),
                    TimeUnit::Millisecond => {
                        col.as_primitive::<TimestampMillisecondType>().value(i)
                    }
                    TimeUnit::Microsecond => {
                        col.as_primitive::<TimestampMicrosecondType>().value(i)
                    }
                    TimeUnit::Nanosecond => col.as_primitive::<TimestampNanosecondType>().value(i),
                };
                let s = timestamp_text(v, *unit, zoned)
                    .ok_or_else(|| bad_value(format!("row {i}: timestamp {v} out of range")))?;
                out.push(Val::T(s));
            }
        }
        Time32(unit) | Time64(unit) => {
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let nanos = match unit {
                    TimeUnit::Second => {
                        col.as_primitive::<Time32SecondType>().value(i) as i64 * 1_000_000_000
                    }
                    TimeUnit::Millisecond => {
                        col.as_primitive::<Time32MillisecondType>().value(i) as i64 * 1_000_000
                    }
                    TimeUnit::Microsecond => {
                        col.as_primitive::<Time64MicrosecondType>().value(i) * 1_000
                    }
                    TimeUnit::Nanosecond => col.as_primitive::<Time64NanosecondType>().value(i),
                };
                let s = time_text(nanos, *unit)
                    .ok_or_else(|| bad_value(format!("row {i}: time out of range")))?;
                out.push(Val::T(s));
            }
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            let c = cast(col, &LargeBinary).map_err(arrow_err)?;
            let a = c.as_binary::<i64>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::Y(a.value(i).to_vec())
                });
            }
        }
        other => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!("column `{name}`: the SQL sink cannot write values of type {other}"),
            ))
        }
    }
    Ok(out)
}

fn type_err(name: &str, v: &Val) -> sqlx::error::BoxDynError {
    format!("column `{name}`: value {v:?} does not fit the column's bind type").into()
}

fn add_pg(
    args: &mut PgArguments,
    col: &ColumnPlan,
    v: &Val,
) -> std::result::Result<(), sqlx::error::BoxDynError> {
    match (col.bind, v) {
        (Bind::I16, Val::Null) => args.add(None::<i16>),
        (Bind::I16, Val::I(x)) => args.add(i16::try_from(*x).map_err(|_| type_err(&col.name, v))?),
        (Bind::I32, Val::Null) => args.add(None::<i32>),
        (Bind::I32, Val::I(x)) => args.add(i32::try_from(*x).map_err(|_| type_err(&col.name, v))?),
        (Bind::I64, Val::Null) => args.add(None::<i64>),
        (Bind::I64, Val::I(x)) => args.add(*x),
        (Bind::F32, Val::Null) => args.add(None::<f32>),
        (Bind::F32, Val::F(x)) => args.add(*x as f32),
        (Bind::F64, Val::Null) => args.add(None::<f64>),
        (Bind::F64, Val::F(x)) => args.add(*x),
        (Bind::Bool, Val::Null) => args.add(None::<bool>),
        (Bind::Bool, Val::B(x)) => args.add(*x),
        (Bind::Text, Val::Null) => args.add(None::<String>),
        (Bind::Text, Val::T(x)) => args.add(x.clone()),
        (Bind::Bytes, Val::Null) => args.add(None::<Vec<u8>>),
        (Bind::Bytes, Val::Y(x)) => args.add(x.clone()),
        _ => Err(type_err(&col.name, v)),
    }
}

fn add_sqlite(
    args: &mut SqliteArguments<'static>,
    col: &ColumnPlan,
    v: &Val,
) -> std::result::Result<(), sqlx::error::BoxDynError> {
    match v {
        Val::Null => args.add(None::<i64>),
        Val::I(x) => args.add(*x),
        Val::F(x) => args.add(*x),
        Val::B(x) => args.add(*x),
        Val::T(x) if col.bind == Bind::Text => args.add(x.clone()),
        // UInt64 in SQLite: an INTEGER when it fits.
        Val::T(x) => {
            args.add(x.parse::<i64>().map_err(|_| {
                format!("column `{}`: {x} does not fit an SQLite INTEGER", col.name)
            })?)
        }
        Val::Y(x) => args.add(x.clone()),
    }
}

// ---------------------------------------------------------------------------------------
// Statements

struct Statements {
    dialect: Dialect,
    table: TableName,
    columns: Vec<ColumnPlan>,
    keys: Vec<String>,
}

impl Statements {
    fn create_table(&self, upsert: bool) -> String {
        let mut cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                format!(
                    "{} {}{}",
                    quote(&c.name),
                    c.sql_type,
                    if c.not_null { " NOT NULL" } else { "" }
                )
            })
            .collect();
        if upsert {
            cols.push(format!(
                "PRIMARY KEY ({})",
                self.keys
                    .iter()
                    .map(|k| quote(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            self.table.quoted(),
            cols.join(", ")
        )
    }

    fn create_progress(&self) -> String {
        let (bigint, ts) = match self.dialect {
            Dialect::Postgres => ("BIGINT", "TIMESTAMPTZ"),
            Dialect::Sqlite => ("INTEGER", "TEXT"),
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {} (query_id TEXT NOT NULL, sink TEXT NOT NULL, batch_id {bigint}, committed_at {ts}, PRIMARY KEY (query_id, sink))",
            self.table.progress_table()
        )
    }

    fn placeholder(&self, n: usize, col: &ColumnPlan) -> String {
        match (self.dialect, col.cast) {
            (Dialect::Postgres, Some(c)) => format!("${n}::{c}"),
            (Dialect::Postgres, None) => format!("${n}"),
            (Dialect::Sqlite, _) => "?".to_string(),
        }
    }

    fn insert(&self, rows: usize, upsert: bool) -> String {
        let cols: Vec<String> = self.columns.iter().map(|c| quote(&c.name)).collect();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.table.quoted(),
            cols.join(", ")
        );
        let mut n = 0;
        for r in 0..rows {
            if r > 0 {
                sql.push(',');
            }
            sql.push('(');
            for (i, c) in self.columns.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                n += 1;
                sql.push_str(&self.placeholder(n, c));
            }
            sql.push(')');
        }
        if upsert {
            let keys: Vec<String> = self.keys.iter().map(|k| quote(k)).collect();
            let updates: Vec<String> = self
                .columns
                .iter()
                .filter(|c| !self.keys.contains(&c.name))
                .map(|c| format!("{q} = excluded.{q}", q = quote(&c.name)))
                .collect();
            if updates.is_empty() {
                sql.push_str(&format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", ")));
            } else {
                sql.push_str(&format!(
                    " ON CONFLICT ({}) DO UPDATE SET {}",
                    keys.join(", "),
                    updates.join(", ")
                ));
            }
        }
        sql
    }

    fn rows_per_statement(&self) -> usize {
        (self.dialect.max_binds() / self.columns.len().max(1)).max(1)
    }
}

/// The rows of a batch to write, as rendered columns and the row order.
struct Rendered {
    columns: Vec<Vec<Val>>,
    rows: Vec<usize>,
}

fn render(data: &Table, plan: &[ColumnPlan], dedupe_keys: Option<&[String]>) -> Result<Rendered> {
    let batch: RecordBatch = data.concat().map_err(arrow_err)?;
    let mut columns = Vec::with_capacity(plan.len());
    for c in plan {
        let col = batch.column_by_name(&c.name).ok_or_else(|| {
            Error::new(
                &codes::SINK_CONTRACT_MISMATCH,
                format!("column `{}` is missing from the batch", c.name),
            )
        })?;
        columns.push(column_values(col, &c.name)?);
    }
    let n = batch.num_rows();
    let rows = match dedupe_keys {
        None => (0..n).collect(),
        Some(keys) => {
            // The last row of each key wins (a multi-row upsert may not touch a row twice).
            let idx: Vec<usize> = keys
                .iter()
                .map(|k| {
                    plan.iter()
                        .position(|c| &c.name == k)
                        .expect("checked keys")
                })
                .collect();
            // Collecting into a map keeps the last row of each key.
            let last: HashMap<Vec<String>, usize> = (0..n)
                .map(|r| {
                    let key: Vec<String> = idx
                        .iter()
                        .map(|&i| format!("{:?}", columns[i][r]))
                        .collect();
                    (key, r)
                })
                .collect();
            let mut keep: Vec<usize> = last.into_values().collect();
            keep.sort_unstable();
            keep
        }
    };
    Ok(Rendered { columns, rows })
}

// ---------------------------------------------------------------------------------------
// The sink

enum Conn {
    Pg(PgConnection),
    Sqlite(SqliteConnection),
}

/// A `postgres://` or `sqlite://` sink (see the [module docs](self)).
pub struct SqlSink {
    asset: String,
    options: SqlSinkOptions,
    target: Target,
    described: String,
    statements: Statements,
    mode: ExecutionMode,
    conn: Option<Conn>,
}

impl std::fmt::Debug for SqlSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlSink")
            .field("asset", &self.asset)
            .field("target", &self.described)
            .field("options", &self.options)
            .finish()
    }
}

impl SqlSink {
    /// Creates the sink: checks the binding and the schema's types (connects nothing).
    pub fn new(ctx: SinkContext) -> Result<Self> {
        let options = SqlSinkOptions::from_uri(&ctx.uri)?;
        let target = match options.dialect {
            Dialect::Postgres => {
                Target::Postgres(Box::new(pg_options(&ctx.uri, options.ssl_mode.as_deref())?))
            }
            Dialect::Sqlite => {
                let loc = ctx.uri.location.as_str();
                if loc.is_empty() {
                    return Err(bad_uri(&ctx.uri, "an SQLite binding needs a file path"));
                }
                Target::Sqlite(Box::new(sqlite_options(&ctx.resolve_path(loc))))
            }
        };
        let schema: SchemaRef = ctx.schema.clone();
        if schema.fields().is_empty() {
            return Err(Error::new(
                &codes::SINK_CONTRACT_MISMATCH,
                format!("sink `{}`: the schema has no columns", ctx.asset),
            ));
        }
        let columns = columns_of(options.dialect, &schema)?;
        for k in &options.keys {
            if !columns.iter().any(|c| &c.name == k) {
                return Err(bad_uri(
                    &ctx.uri,
                    format!("key column `{k}` is not a column of `{}`", ctx.asset),
                ));
            }
        }
        let statements = Statements {
            dialect: options.dialect,
            table: options.table.clone(),
            columns,
            keys: options.keys.clone(),
        };
        Ok(SqlSink {
            asset: ctx.asset.clone(),
            described: describe_target(&ctx.uri),
            options,
            target,
            statements,
            mode: ctx.mode,
            conn: None,
        })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> Error {
        let mut msg = format!(
            "sinks[{}]: {} table `{}`: {what}: {e}",
            self.asset, self.described, self.options.table
        );
        let text = e.to_string();
        if text.contains("ON CONFLICT") {
            msg.push_str(&format!(
                " (upsert needs a primary key or unique index on ({}))",
                self.options.keys.join(", ")
            ));
        }
        Error::new(&codes::SINK_WRITE_FAILED, msg)
    }

    async fn connection(&mut self) -> Result<&mut Conn> {
        if self.conn.is_none() {
            let conn = match &self.target {
                Target::Postgres(o) => PgConnection::connect_with(o).await.map(Conn::Pg),
                Target::Sqlite(o) => {
                    if let Some(dir) = o.get_filename().parent() {
                        if !dir.as_os_str().is_empty() {
                            std::fs::create_dir_all(dir).map_err(|e| {
                                Error::new(
                                    &codes::IO_ERROR,
                                    format!(
                                        "sinks[{}]: cannot create `{}`: {e}",
                                        self.asset,
                                        dir.display()
                                    ),
                                )
                            })?;
                        }
                    }
                    SqliteConnection::connect_with(o).await.map(Conn::Sqlite)
                }
            }
            .map_err(|e| {
                Error::new(
                    &codes::IO_ERROR,
                    format!(
                        "sinks[{}]: cannot connect to {}: {e}",
                        self.asset, self.described
                    ),
                )
            })?;
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    async fn ensure_progress_table(&mut self) -> Result<()> {
        let sql = self.statements.create_progress();
        let result = match self.connection().await? {
            Conn::Pg(c) => sqlx::query(&sql).execute(&mut *c).await.map(|_| ()),
            Conn::Sqlite(c) => sqlx::query(&sql).execute(&mut *c).await.map(|_| ()),
        };
        if let Err(e) = result {
            // Two first writers may race on CREATE TABLE IF NOT EXISTS; the loser sees a
            // unique violation on the catalog. The table exists then.
            if !self.progress_table_exists().await? {
                return Err(self.fail("cannot create the progress table", e));
            }
        }
        Ok(())
    }

    async fn progress_table_exists(&mut self) -> Result<bool> {
        let progress = match &self.options.table.schema {
            Some(s) => format!("{}.{}", quote(s), quote(PROGRESS_TABLE)),
            None => quote(PROGRESS_TABLE),
        };
        let r = match self.connection().await? {
            Conn::Pg(c) => sqlx::query("SELECT to_regclass($1) IS NOT NULL")
                .bind(progress)
                .fetch_one(&mut *c)
                .await
                .map(|r| r.get::<bool, _>(0)),
            Conn::Sqlite(c) => {
                sqlx::query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?")
                    .bind(PROGRESS_TABLE)
                    .fetch_one(&mut *c)
                    .await
                    .map(|r| r.get::<i64, _>(0) > 0)
            }
        };
        r.map_err(|e| self.fail("cannot look up the progress table", e))
    }

    async fn write_batch(&mut self, batch: &SinkBatch<'_>) -> Result<WriteOutcome> {
        let streaming = self.mode == ExecutionMode::Streaming;
        let upsert = self.options.mode == WriteMode::Upsert;
        if batch.output_mode == OutputMode::Update && !upsert {
            return Err(Error::new(
                &codes::SINK_MODE_UNSUPPORTED,
                format!(
                    "sinks[{}]: the update output mode needs `mode=upsert&keys=...` on the SQL binding",
                    self.asset
                ),
            ));
        }
        let replace = self.options.mode == WriteMode::Overwrite
            || (streaming && batch.output_mode == OutputMode::Complete);
        let rendered = render(
            batch.data,
            &self.statements.columns,
            upsert.then_some(self.statements.keys.as_slice()),
        )
        .map_err(|e| {
            let asset = self.asset.clone();
            e.map_diagnostics(move |d| d.at(format!("sinks[{asset}]")))
        })?;
        if streaming {
            self.ensure_progress_table().await?;
        }
        let job = Job {
            statements: &self.statements,
            rendered: &rendered,
            query_id: batch.query_id,
            sink: self.options.table.to_string(),
            batch_id: batch.batch_id,
            streaming,
            upsert,
            replace,
        };
        let outcome = match self.conn.as_mut().expect("connected above") {
            Conn::Pg(c) => job.run_pg(c).await,
            Conn::Sqlite(c) => job.run_sqlite(c).await,
        };
        outcome.map_err(|(what, e)| self.fail(what, e))
    }
}

fn columns_of(dialect: Dialect, schema: &Schema) -> Result<Vec<ColumnPlan>> {
    schema
        .fields()
        .iter()
        .map(|f| column_plan(dialect, f.name(), f.data_type(), f.is_nullable()))
        .collect()
}

/// One batch's transaction.
struct Job<'a> {
    statements: &'a Statements,
    rendered: &'a Rendered,
    query_id: &'a str,
    sink: String,
    batch_id: u64,
    streaming: bool,
    upsert: bool,
    replace: bool,
}

type JobResult<T> = std::result::Result<T, (&'static str, String)>;

fn at<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> (&'static str, String) {
    move |e| (what, e.to_string())
}

impl Job<'_> {
    fn chunks(&self) -> impl Iterator<Item = &[usize]> {
        self.rendered
            .rows
            .chunks(self.statements.rows_per_statement())
    }

    fn batch_id_i64(&self) -> JobResult<i64> {
        i64::try_from(self.batch_id).map_err(|_| ("batch id", "does not fit BIGINT".to_string()))
    }

    async fn run_pg(&self, c: &mut PgConnection) -> JobResult<WriteOutcome> {
        let batch_id = self.batch_id_i64()?;
        let mut tx = c.begin().await.map_err(at("BEGIN"))?;
        sqlx::query(&self.statements.create_table(self.upsert))
            .execute(&mut *tx)
            .await
            .map_err(at("cannot create the table"))?;
        if self.streaming {
            let progress = self.statements.table.progress_table();
            sqlx::query(&format!(
                "INSERT INTO {progress} (query_id, sink, batch_id, committed_at) VALUES ($1, $2, NULL, NULL) ON CONFLICT (query_id, sink) DO NOTHING"
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot lock the progress row"))?;
            let recorded: Option<i64> = sqlx::query(&format!(
                "SELECT batch_id FROM {progress} WHERE query_id = $1 AND sink = $2 FOR UPDATE"
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .fetch_one(&mut *tx)
            .await
            .map_err(at("cannot read the progress row"))?
            .get(0);
            if recorded.is_some_and(|r| batch_id <= r) {
                tx.rollback().await.map_err(at("ROLLBACK"))?;
                return Ok(WriteOutcome::AlreadyCommitted);
            }
        }
        if self.replace {
            sqlx::query(&format!("DELETE FROM {}", self.statements.table.quoted()))
                .execute(&mut *tx)
                .await
                .map_err(at("cannot delete the previous rows"))?;
        }
        for chunk in self.chunks() {
            let sql = self.statements.insert(chunk.len(), self.upsert);
            let mut args = PgArguments::default();
            for &r in chunk {
                for (col, vals) in self.statements.columns.iter().zip(&self.rendered.columns) {
                    add_pg(&mut args, col, &vals[r]).map_err(at("cannot bind a value"))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *tx)
                .await
                .map_err(at("cannot insert the rows"))?;
        }
        etlantic_core::faults::check(etlantic_core::faults::IN_SINK, self.batch_id);
        if self.streaming {
            sqlx::query(&format!(
                "INSERT INTO {} (query_id, sink, batch_id, committed_at) VALUES ($1, $2, $3, now()) ON CONFLICT (query_id, sink) DO UPDATE SET batch_id = excluded.batch_id, committed_at = excluded.committed_at",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .bind(batch_id)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot record the batch in the progress table"))?;
        }
        tx.commit().await.map_err(at("COMMIT"))?;
        Ok(WriteOutcome::Written {
            rows: self.rendered.rows.len() as u64,
        })
    }

    async fn run_sqlite(&self, c: &mut SqliteConnection) -> JobResult<WriteOutcome> {
        let batch_id = self.batch_id_i64()?;
        let mut tx = c
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(at("BEGIN IMMEDIATE"))?;
        sqlx::query(&self.statements.create_table(self.upsert))
            .execute(&mut *tx)
            .await
            .map_err(at("cannot create the table"))?;
        if self.streaming {
            let recorded: Option<i64> = sqlx::query(&format!(
                "SELECT batch_id FROM {} WHERE query_id = ? AND sink = ?",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .fetch_optional(&mut *tx)
            .await
            .map_err(at("cannot read the progress row"))?
            .and_then(|r| r.get::<Option<i64>, _>(0));
            if recorded.is_some_and(|r| batch_id <= r) {
                tx.rollback().await.map_err(at("ROLLBACK"))?;
                return Ok(WriteOutcome::AlreadyCommitted);
            }
        }
        if self.replace {
            sqlx::query(&format!("DELETE FROM {}", self.statements.table.quoted()))
                .execute(&mut *tx)
                .await
                .map_err(at("cannot delete the previous rows"))?;
        }
        for chunk in self.chunks() {
            let sql = self.statements.insert(chunk.len(), self.upsert);
            let mut args = SqliteArguments::default();
            for &r in chunk {
                for (col, vals) in self.statements.columns.iter().zip(&self.rendered.columns) {
                    add_sqlite(&mut args, col, &vals[r]).map_err(at("cannot bind a value"))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *tx)
                .await
                .map_err(at("cannot insert the rows"))?;
        }
        etlantic_core::faults::check(etlantic_core::faults::IN_SINK, self.batch_id);
        if self.streaming {
            sqlx::query(&format!(
                "INSERT INTO {} (query_id, sink, batch_id, committed_at) VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) ON CONFLICT (query_id, sink) DO UPDATE SET batch_id = excluded.batch_id, committed_at = excluded.committed_at",
                self.statements.table.progress_table()
            ))
            .bind(self.query_id)
            .bind(&self.sink)
            .bind(batch_id)
            .execute(&mut *tx)
            .await
            .map_err(at("cannot record the batch in the progress table"))?;
        }
        tx.commit().await.map_err(at("COMMIT"))?;
        Ok(WriteOutcome::Written {
            rows: self.rendered.rows.len() as u64,
        })
    }
}

#[async_trait::async_trait]
impl Sink for SqlSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        self.connection().await?;
        let result = self.write_batch(&batch).await;
        if result.is_err() {
            // The transaction was rolled back when it was dropped; start the next write
            // on a fresh connection rather than trust this one.
            if let Some(conn) = self.conn.take() {
                let _ = match conn {
                    Conn::Pg(c) => c.close().await,
                    Conn::Sqlite(c) => c.close().await,
                };
            }
        }
        result
    }

    async fn close(&mut self) -> Result<()> {
        if let Some(conn) = self.conn.take() {
            let r = match conn {
                Conn::Pg(c) => c.close().await,
                Conn::Sqlite(c) => c.close().await,
            };
            r.map_err(|e| self.fail("cannot close the connection", e))?;
        }
        Ok(())
    }

    async fn last_committed_batch(&mut self, query_id: &str) -> Result<Option<u64>> {
        if self.mode == ExecutionMode::Batch || !self.progress_table_exists().await? {
            return Ok(None);
        }
        let sink = self.options.table.to_string();
        let progress = self.options.table.progress_table();
        let r = match self.connection().await? {
            Conn::Pg(c) => sqlx::query(&format!(
                "SELECT batch_id FROM {progress} WHERE query_id = $1 AND sink = $2"
            ))
            .bind(query_id)
            .bind(&sink)
            .fetch_optional(&mut *c)
            .await
            .map(|r| r.and_then(|r| r.get::<Option<i64>, _>(0))),
            Conn::Sqlite(c) => sqlx::query(&format!(
                "SELECT batch_id FROM {progress} WHERE query_id = ? AND sink = ?"
            ))
            .bind(query_id)
            .bind(&sink)
            .fetch_optional(&mut *c)
            .await
            .map(|r| r.and_then(|r| r.get::<Option<i64>, _>(0))),
        };
        let id = r.map_err(|e| self.fail("cannot read the progress row", e))?;
        Ok(id.and_then(|i| u64::try_from(i).ok()))
    }
}

/// The Arrow schema the sink would create a table for, with every column's SQL type
/// (for docs, `etlantic plugins` and tests).
pub fn sql_types(dialect: Dialect, schema: &Schema) -> Result<Vec<(String, String)>> {
    Ok(columns_of(dialect, schema)?
        .into_iter()
        .map(|c| (c.name, c.sql_type))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;

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
}
