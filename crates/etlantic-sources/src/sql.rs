//! The SQL source: a PostgreSQL (`postgres://`, `postgresql://`) or SQLite (`sqlite://`)
//! table or query read as a bounded table, through `sqlx`.
//!
//! # Binding
//!
//! ```text
//! postgres://[user[:password]@]host[:port]/database?table=[schema.]name
//! postgres://[user[:password]@]host[:port]/database?query=SELECT ...
//! sqlite://<path>?table=name            (or ?query=...)
//! ```
//!
//! Exactly one of `table` (read with `SELECT * FROM <quoted name>`) and `query` (any
//! single `SELECT`, percent-encoded in the URI where needed) is required; PostgreSQL also
//! takes `sslmode`. The password comes from a profile secret
//! (`postgres://etl:${secret:pg}@db/warehouse`), is taken literally and never printed.
//! An SQLite path is relative to the project root unless absolute; the file is opened
//! read-only and must exist.
//!
//! # Bounded only
//!
//! The source declares `bounded: true, unbounded: false`: a batch run reads the whole
//! result once, and a streaming query may use it only as a static source
//! (`static_refresh`, the static side of a stream-static join), read again in bounded
//! mode per micro-batch or per interval. Used as a streaming source the planner refuses
//! it (`ETL503`). The declared guarantee is `replayable` in the sense of a bounded
//! table: reading it again returns the same rows as long as the table does not change.
//!
//! # Conversion to the contract's schema
//!
//! Result columns are matched to the contract's fields by name; extra columns are
//! ignored, a missing nullable field is null and a missing required field fails the read
//! (`ETL702`). Each value is converted with the contract decoder's rules
//! ([`crate::decode`]): PostgreSQL integers, floats, `NUMERIC` (exact, never rounded),
//! `BOOLEAN`, `TEXT`, `DATE`, `TIME`, `TIMESTAMP` (naive: read in the column's
//! `defaultTimezone`), `TIMESTAMPTZ` (the instant) and `BYTEA`; SQLite `INTEGER` (also
//! `0`/`1` for booleans and epoch milliseconds for timestamps), `REAL`, `TEXT` (ISO-8601
//! dates and timestamps, exact decimal text) and `BLOB`. Numbers in text are parsed for
//! numeric fields, and any scalar becomes its text for a string field.
//!
//! A row that does not fit the contract (a value of the wrong type, out of range, a
//! decimal with too many digits, a null in a required field, a broken constraint) is not
//! returned but rejected — quarantined by the runtime — with its 0-based position in
//! the result (`position.row`) and the row rendered as JSON (`raw`).

use crate::decode::{BatchBuilder, ContractDecoder};
use arrow::array::{ArrayRef, BinaryArray, LargeBinaryArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::data::{Offset, SourcePosition};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names_except, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use futures::TryStreamExt;
use serde_json::{Map, Number, Value};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Column, Connection, Row, TypeInfo, ValueRef};
use std::str::FromStr;
use std::sync::Arc;

/// Rows per output batch.
const BATCH_ROWS: usize = 8192;

/// The SQL dialect of a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
}

/// What the source reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqlRead {
    /// A table, `name` or `schema.name`.
    Table {
        /// The schema, when given.
        schema: Option<String>,
        /// The table.
        name: String,
    },
    /// A query.
    Query(String),
}

impl SqlRead {
    /// The statement that reads it.
    pub fn sql(&self) -> String {
        match self {
            SqlRead::Table { schema, name } => match schema {
                Some(s) => format!("SELECT * FROM {}.{}", quote(s), quote(name)),
                None => format!("SELECT * FROM {}", quote(name)),
            },
            SqlRead::Query(q) => q.clone(),
        }
    }
}

/// Quotes an SQL identifier.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The options of an SQL source binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlSourceOptions {
    /// The dialect.
    pub dialect: Dialect,
    /// What to read.
    pub read: SqlRead,
    /// PostgreSQL `sslmode`.
    pub ssl_mode: Option<String>,
}

fn bad_uri(uri: &BindingUri, why: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::BAD_URI,
        format!("binding `{}`: {why}", uri.redacted()),
    )
}

impl SqlSourceOptions {
    /// Parses the URI's parameters (`ETL007` when neither or both of `table` and `query`
    /// are given, or for an unknown parameter).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let dialect = match uri.scheme.as_str() {
            "postgres" | "postgresql" => Dialect::Postgres,
            "sqlite" => Dialect::Sqlite,
            _ => return Err(bad_uri(uri, "not a postgres:// or sqlite:// binding")),
        };
        let mut read = None;
        let mut ssl_mode = None;
        for (k, v) in &uri.params {
            let this = match k.as_str() {
                "table" => {
                    let (schema, name) = match v.split_once('.') {
                        Some((s, n)) => (Some(s.to_string()), n.to_string()),
                        None => (None, v.clone()),
                    };
                    if name.is_empty() || name.contains('.') || schema.as_deref() == Some("") {
                        return Err(bad_uri(
                            uri,
                            format!("`table={v}` is not `name` or `schema.name`"),
                        ));
                    }
                    SqlRead::Table { schema, name }
                }
                "query" => {
                    if v.trim().is_empty() {
                        return Err(bad_uri(uri, "`query=` is empty"));
                    }
                    SqlRead::Query(v.clone())
                }
                // Whether an SQL region reads the table in place (the planner's
                // business); `rows` is this source's way.
                "read" if v == "rows" || v == "in_place" => continue,
                "sslmode" if dialect == Dialect::Postgres => {
                    PgSslMode::from_str(v).map_err(|_| {
                        bad_uri(uri, format!("`sslmode={v}` is not a PostgreSQL sslmode"))
                    })?;
                    ssl_mode = Some(v.clone());
                    continue;
                }
                other => {
                    return Err(bad_uri(
                        uri,
                        format!(
                            "unknown parameter `{other}` for the SQL source (known: {})",
                            known_options(dialect)
                        ),
                    ))
                }
            };
            if read.replace(this).is_some() {
                return Err(bad_uri(uri, "give one of `table=` and `query=`, not both"));
            }
        }
        let read = read.ok_or_else(|| {
            bad_uri(
                uri,
                "the SQL source needs `?table=<name>` or `?query=<SELECT ...>`",
            )
        })?;
        Ok(SqlSourceOptions {
            dialect,
            read,
            ssl_mode,
        })
    }
}

/// Parses `[user[:password]@]host[:port]/database` (the password literally; the last `@`
/// ends the user info).
fn pg_options(uri: &BindingUri, ssl_mode: Option<&str>) -> Result<PgConnectOptions> {
    let loc = uri.location.as_str();
    let (userinfo, rest) = match loc.rfind('@') {
        Some(at) => (Some(&loc[..at]), &loc[at + 1..]),
        None => (None, loc),
    };
    let (hostport, database) = rest.split_once('/').unwrap_or((rest, ""));
    let database = database.trim_end_matches('/');
    if hostport.is_empty() || database.is_empty() || database.contains('/') {
        return Err(bad_uri(
            uri,
            "a PostgreSQL binding is postgres://user@host:port/database",
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
        .options([("TimeZone", "UTC"), ("DateStyle", "ISO")]);
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

fn describe_target(uri: &BindingUri) -> String {
    let loc = match uri.location.rfind('@') {
        Some(at) => {
            let user = uri.location[..at].split(':').next().unwrap_or("");
            format!("{user}@{}", &uri.location[at + 1..])
        }
        None => uri.location.clone(),
    };
    format!("{}://{loc}", uri.scheme)
}

/// The provider of `postgres://` (and `postgresql://`) sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostgresSourceProvider;
/// The provider of `sqlite://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteSourceProvider;

inventory::submit! { SourceRegistration(&PostgresSourceProvider) }
inventory::submit! { SourceRegistration(&SqliteSourceProvider) }

fn capabilities(uri: &BindingUri) -> Result<SourceCapabilities> {
    SqlSourceOptions::from_uri(uri)?;
    Ok(SourceCapabilities {
        bounded: true,
        unbounded: false,
        guarantee: SourceGuarantee::Replayable,
    })
}

const PG_DESCRIPTION: &str =
    "A PostgreSQL table or query, read as a bounded table (batch runs, static sides of joins)";

/// The query parameters of a `postgres://`, `postgresql://` or `sqlite://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "table",
        default: "required unless `query` is given",
        meaning: "The table to read, `name` or `schema.name` (quoted, case-sensitive).",
    },
    BindingOption {
        name: "query",
        default: "required unless `table` is given",
        meaning: "One SELECT to read instead of a table (percent-encoded in the URI where needed).",
    },
    BindingOption {
        name: "read",
        default: "rows",
        meaning: "`rows` reads through the source; `in_place` lets an SQL region on the same PostgreSQL database read the table where it lies (batch runs, `table` only).",
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

impl SourceProvider for PostgresSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "postgres"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["postgresql"]
    }
    fn description(&self) -> &'static str {
        PG_DESCRIPTION
    }
    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        capabilities(uri)
    }
    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(SqlSource::new(ctx)?))
    }
}

impl SourceProvider for SqliteSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "sqlite"
    }
    fn description(&self) -> &'static str {
        "An SQLite table or query, read as a bounded table (batch runs, static sides of joins)"
    }
    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        capabilities(uri)
    }
    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(SqlSource::new(ctx)?))
    }
}

enum Target {
    Postgres(Box<PgConnectOptions>),
    Sqlite(Box<SqliteConnectOptions>),
}

/// A `postgres://` or `sqlite://` source (see the [module docs](self)).
pub struct SqlSource {
    asset: String,
    options: SqlSourceOptions,
    target: Target,
    described: String,
    decoder: ContractDecoder,
}

impl std::fmt::Debug for SqlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlSource")
            .field("asset", &self.asset)
            .field("target", &self.described)
            .field("read", &self.options.read)
            .finish()
    }
}

impl SqlSource {
    /// Creates the source (checks the binding; connects nothing).
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = SqlSourceOptions::from_uri(&ctx.uri)?;
        let target = match options.dialect {
            Dialect::Postgres => {
                Target::Postgres(Box::new(pg_options(&ctx.uri, options.ssl_mode.as_deref())?))
            }
            Dialect::Sqlite => {
                if ctx.uri.location.is_empty() {
                    return Err(bad_uri(&ctx.uri, "an SQLite binding needs a file path"));
                }
                Target::Sqlite(Box::new(
                    SqliteConnectOptions::new()
                        .filename(ctx.resolve_path(&ctx.uri.location))
                        .read_only(true)
                        .create_if_missing(false),
                ))
            }
        };
        let decoder = ContractDecoder::new(ctx.schema.clone(), ctx.contract.as_deref())?;
        Ok(SqlSource {
            asset: ctx.asset.clone(),
            described: describe_target(&ctx.uri),
            options,
            target,
            decoder,
        })
    }

    fn fail(&self, code: &'static codes::CodeInfo, what: &str, e: impl std::fmt::Display) -> Error {
        Error::new(
            code,
            format!("sources[{}]: {}: {what}: {e}", self.asset, self.described),
        )
    }

    async fn read_all(&self) -> Result<SourceBatch> {
        let sql = self.options.read.sql();
        let mut reader = Reader::new(self);
        match &self.target {
            Target::Postgres(o) => {
                let mut conn = PgConnection::connect_with(o)
                    .await
                    .map_err(|e| self.fail(&codes::IO_ERROR, "cannot connect", e))?;
                {
                    // The simple-query protocol: every value as PostgreSQL's text output.
                    let mut rows = sqlx::raw_sql(&sql).fetch(&mut conn);
                    while let Some(row) = rows
                        .try_next()
                        .await
                        .map_err(|e| self.fail(&codes::IO_ERROR, "the query failed", e))?
                    {
                        let mut raws = Vec::with_capacity(row.columns().len());
                        for (i, col) in row.columns().iter().enumerate() {
                            let v = row.try_get_raw(i).map_err(|e| {
                                self.fail(&codes::IO_ERROR, "cannot read a value", e)
                            })?;
                            let raw = if v.is_null() {
                                Raw::Null
                            } else {
                                let text = v.as_str().map_err(|e| {
                                    self.fail(&codes::IO_ERROR, "cannot read a value", e)
                                })?;
                                pg_raw(col.type_info().name(), text)
                            };
                            raws.push((col.name(), raw));
                        }
                        reader.push(&raws)?;
                    }
                }
                let _ = conn.close().await;
            }
            Target::Sqlite(o) => {
                let mut conn = SqliteConnection::connect_with(o)
                    .await
                    .map_err(|e| self.fail(&codes::IO_ERROR, "cannot open the database", e))?;
                {
                    let mut rows = sqlx::query(&sql).fetch(&mut conn);
                    while let Some(row) = rows
                        .try_next()
                        .await
                        .map_err(|e| self.fail(&codes::IO_ERROR, "the query failed", e))?
                    {
                        let mut raws = Vec::with_capacity(row.columns().len());
                        for (i, col) in row.columns().iter().enumerate() {
                            let v = row.try_get_raw(i).map_err(|e| {
                                self.fail(&codes::IO_ERROR, "cannot read a value", e)
                            })?;
                            let kind = if v.is_null() {
                                "NULL".to_string()
                            } else {
                                v.type_info().name().to_string()
                            };
                            let raw = match kind.as_str() {
                                "NULL" => Raw::Null,
                                "INTEGER" | "BOOLEAN" => {
                                    Raw::Int(row.try_get_unchecked::<i64, _>(i).map_err(|e| {
                                        self.fail(&codes::IO_ERROR, "cannot read a value", e)
                                    })?)
                                }
                                "REAL" | "NUMERIC" => {
                                    Raw::Float(row.try_get_unchecked::<f64, _>(i).map_err(|e| {
                                        self.fail(&codes::IO_ERROR, "cannot read a value", e)
                                    })?)
                                }
                                "BLOB" => {
                                    Raw::Bytes(row.try_get_unchecked::<Vec<u8>, _>(i).map_err(
                                        |e| self.fail(&codes::IO_ERROR, "cannot read a value", e),
                                    )?)
                                }
                                _ => Raw::Text(row.try_get_unchecked::<String, _>(i).map_err(
                                    |e| self.fail(&codes::IO_ERROR, "cannot read a value", e),
                                )?),
                            };
                            raws.push((col.name(), raw));
                        }
                        reader.push(&raws)?;
                    }
                }
                let _ = conn.close().await;
            }
        }
        reader.finish()
    }
}

#[async_trait::async_trait]
impl Source for SqlSource {
    fn checks_record_rules(&self) -> bool {
        // The contract decoder checks them while it decodes, with each record's position.
        true
    }

    fn schema(&self) -> SchemaRef {
        self.decoder.schema()
    }

    /// The whole result is one offset: `{"snapshot": true}` when nothing was read yet.
    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        _limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        Ok(match start {
            None => Some(Offset(serde_json::json!({"snapshot": true}))),
            Some(s) => Some(s.clone()),
        })
    }

    /// Reads the whole table or query result (nothing when `start` is given: a bounded
    /// source has nothing after its one snapshot).
    async fn read(&mut self, start: Option<&Offset>, _end: &Offset) -> Result<SourceBatch> {
        if start.is_some() {
            return Ok(SourceBatch::default());
        }
        self.read_all().await
    }
}

// ---------------------------------------------------------------------------------------
// Values

/// One value as read, before conversion to the contract's type.
#[derive(Clone, Debug, PartialEq)]
enum Raw {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    /// An exact decimal in text (PostgreSQL `NUMERIC`).
    Num(String),
    Text(String),
    Bytes(Vec<u8>),
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A PostgreSQL text-format value of type `type_name` (sqlx's upper-case name).
fn pg_raw(type_name: &str, text: &str) -> Raw {
    let fallback = || Raw::Text(text.to_string());
    match type_name {
        "INT2" | "INT4" | "INT8" | "OID" => {
            text.parse().map(Raw::Int).unwrap_or_else(|_| fallback())
        }
        "FLOAT4" | "FLOAT8" => text.parse().map(Raw::Float).unwrap_or_else(|_| fallback()),
        "NUMERIC" => Raw::Num(text.to_string()),
        "BOOL" => match text {
            "t" => Raw::Bool(true),
            "f" => Raw::Bool(false),
            _ => fallback(),
        },
        "BYTEA" => text
            .strip_prefix("\\x")
            .and_then(hex_decode)
            .map(Raw::Bytes)
            .unwrap_or_else(fallback),
        "TIMESTAMPTZ" => {
            // `2024-01-01 10:00:00.123+00` (TimeZone is UTC) → RFC 3339.
            let t = text.replacen(' ', "T", 1);
            let t = match t.rfind(['+', '-']) {
                Some(p) if p > 10 && t.len() - p == 3 => format!("{t}:00"),
                _ => t,
            };
            Raw::Text(t)
        }
        "TIMESTAMP" => Raw::Text(text.replacen(' ', "T", 1)),
        _ => fallback(),
    }
}

fn number(text: &str) -> Option<Value> {
    serde_json::from_str::<Number>(text.trim())
        .ok()
        .map(Value::Number)
}

/// The JSON value handed to the contract decoder for a field of type `dt`.
fn json_for(raw: &Raw, dt: &DataType) -> Value {
    use DataType::*;
    let numeric = dt.is_numeric() && !matches!(dt, Decimal128(_, _) | Decimal256(_, _));
    let stringy = matches!(dt, Utf8 | LargeUtf8 | Decimal128(_, _) | Decimal256(_, _));
    match raw {
        Raw::Null => Value::Null,
        Raw::Int(i) if *dt == Boolean && (*i == 0 || *i == 1) => Value::Bool(*i == 1),
        Raw::Int(i) if stringy => Value::String(i.to_string()),
        Raw::Int(i) => Value::from(*i),
        Raw::Float(f) if stringy => Value::String(f.to_string()),
        Raw::Float(f) => Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string())),
        Raw::Bool(b) if stringy => Value::String(b.to_string()),
        Raw::Bool(b) => Value::Bool(*b),
        Raw::Num(s) if numeric => number(s).unwrap_or_else(|| Value::String(s.clone())),
        Raw::Num(s) => Value::String(s.clone()),
        Raw::Text(s) if numeric => number(s).unwrap_or_else(|| Value::String(s.clone())),
        Raw::Text(s) if *dt == Boolean => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "t" => Value::Bool(true),
            "false" | "f" => Value::Bool(false),
            _ => Value::String(s.clone()),
        },
        Raw::Text(s) => Value::String(s.clone()),
        Raw::Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) if stringy => Value::String(s.to_string()),
            _ => Value::Array(b.iter().map(|x| Value::from(*x)).collect()),
        },
    }
}

/// How a value appears in a rejected record's raw text.
fn json_raw(raw: &Raw) -> Value {
    match raw {
        Raw::Null => Value::Null,
        Raw::Int(i) => Value::from(*i),
        Raw::Float(f) => Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string())),
        Raw::Bool(b) => Value::Bool(*b),
        Raw::Num(s) | Raw::Text(s) => Value::String(s.clone()),
        Raw::Bytes(b) => Value::String(format!("\\x{}", hex_encode(b))),
    }
}

fn is_binary(dt: &DataType) -> bool {
    matches!(dt, DataType::Binary | DataType::LargeBinary)
}

/// Turns result rows into batches of the contract's schema and rejected records.
struct Reader<'a> {
    source: &'a SqlSource,
    schema: SchemaRef,
    builder: BatchBuilder,
    /// Binary fields: their index and the accepted rows' bytes (the decoder takes JSON
    /// strings for binary fields, which cannot hold arbitrary bytes).
    binary: Vec<(usize, Vec<Option<Vec<u8>>>)>,
    out: SourceBatch,
    row: u64,
    checked: bool,
}

impl<'a> Reader<'a> {
    fn new(source: &'a SqlSource) -> Self {
        let schema = source.decoder.schema();
        let binary = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| is_binary(f.data_type()))
            .map(|(i, _)| (i, Vec::new()))
            .collect();
        Reader {
            source,
            schema,
            builder: source.decoder.builder(),
            binary,
            out: SourceBatch::default(),
            row: 0,
            checked: false,
        }
    }

    fn push(&mut self, raws: &[(&str, Raw)]) -> Result<()> {
        if !self.checked {
            self.checked = true;
            for f in self.schema.fields() {
                if !f.is_nullable() && !raws.iter().any(|(n, _)| n == f.name()) {
                    return Err(self.source.fail(
                        &codes::RECORD_TYPE_MISMATCH,
                        "the result has no column for a required field",
                        format!(
                            "`{}` (columns: {})",
                            f.name(),
                            raws.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
        }
        let mut obj = Map::new();
        let mut bytes: Vec<Option<Vec<u8>>> = Vec::with_capacity(self.binary.len());
        for f in self.schema.fields().iter() {
            let Some((_, raw)) = raws.iter().find(|(n, _)| n == f.name()) else {
                continue;
            };
            if is_binary(f.data_type()) {
                let b = match raw {
                    Raw::Null => None,
                    Raw::Bytes(b) => Some(b.clone()),
                    Raw::Text(s) | Raw::Num(s) => Some(s.as_bytes().to_vec()),
                    other => {
                        // Not bytes: let the decoder reject it with its usual message.
                        obj.insert(f.name().clone(), json_for(other, &DataType::Int64));
                        bytes.push(None);
                        continue;
                    }
                };
                obj.insert(
                    f.name().clone(),
                    if b.is_some() {
                        Value::String(String::new())
                    } else {
                        Value::Null
                    },
                );
                bytes.push(b);
            } else {
                obj.insert(f.name().clone(), json_for(raw, f.data_type()));
            }
        }
        match self.builder.push_json(&Value::Object(obj)) {
            Ok(()) => {
                for ((_, col), b) in self.binary.iter_mut().zip(bytes) {
                    col.push(b);
                }
            }
            Err(problem) => {
                let raw: Map<String, Value> = raws
                    .iter()
                    .map(|(n, r)| (n.to_string(), json_raw(r)))
                    .collect();
                let position = SourcePosition {
                    asset: self.source.asset.clone(),
                    row: Some(self.row),
                    ..SourcePosition::default()
                };
                self.out
                    .rejected
                    .push(problem.into_rejected(position, Value::Object(raw).to_string()));
            }
        }
        self.row += 1;
        if self.builder.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let Some(batch) = self.builder.finish()? else {
            return Ok(());
        };
        let batch = if self.binary.is_empty() {
            batch
        } else {
            let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
            for (i, col) in self.binary.iter_mut() {
                let values = std::mem::take(col);
                columns[*i] = match self.schema.field(*i).data_type() {
                    DataType::LargeBinary => Arc::new(LargeBinaryArray::from_iter(values)),
                    _ => Arc::new(BinaryArray::from_iter(values)),
                };
            }
            RecordBatch::try_new(self.schema.clone(), columns)
                .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}")))?
        };
        self.out.batches.push(batch);
        Ok(())
    }

    fn finish(mut self) -> Result<SourceBatch> {
        self.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o =
            SqlSourceOptions::from_uri(&BindingUri::parse("postgres://u@h/db?table=s.t").unwrap())
                .unwrap();
        assert_eq!(o.read.sql(), "SELECT * FROM \"s\".\"t\"");
        let o = SqlSourceOptions::from_uri(
            &BindingUri::parse("sqlite://x.db?query=SELECT%201").unwrap(),
        )
        .unwrap();
        assert_eq!(o.read, SqlRead::Query("SELECT 1".into()));
        for bad in [
            "sqlite://x.db",
            "sqlite://x.db?table=t&query=SELECT%201",
            "sqlite://x.db?table=t&x=1",
        ] {
            let e = SqlSourceOptions::from_uri(&BindingUri::parse(bad).unwrap()).unwrap_err();
            assert_eq!(e.code(), "ETL007", "{bad}");
        }
    }

    #[test]
    fn postgres_text_values() {
        assert_eq!(
            pg_raw("TIMESTAMPTZ", "2024-01-01 10:00:00.5+00"),
            Raw::Text("2024-01-01T10:00:00.5+00:00".into())
        );
        assert_eq!(
            pg_raw("TIMESTAMPTZ", "2024-01-01 10:00:00+05:30"),
            Raw::Text("2024-01-01T10:00:00+05:30".into())
        );
        assert_eq!(pg_raw("BYTEA", "\\x00ff"), Raw::Bytes(vec![0, 255]));
        assert_eq!(pg_raw("BOOL", "t"), Raw::Bool(true));
        assert_eq!(pg_raw("INT8", "-7"), Raw::Int(-7));
        assert_eq!(
            json_for(&Raw::Num("12.50".into()), &DataType::Decimal128(10, 2)),
            Value::String("12.50".into())
        );
        assert_eq!(
            json_for(&Raw::Int(1), &DataType::Boolean),
            Value::Bool(true)
        );
        assert_eq!(
            json_for(&Raw::Text("42".into()), &DataType::Int32),
            Value::from(42)
        );
    }
}
