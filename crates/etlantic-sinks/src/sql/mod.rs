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

mod columns;
mod connect;
mod job;
mod sink;
mod statements;
#[cfg(test)]
mod tests;

pub use columns::sql_types;

use connect::Target;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names_except, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use sqlx::postgres::{PgConnection, PgSslMode};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};
use statements::Statements;
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

/// The provider of `postgres://` (and `postgresql://`) sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostgresSinkProvider;
/// The provider of `sqlite://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteSinkProvider;

inventory::submit! { SinkRegistration(&PostgresSinkProvider) }
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
    fn aliases(&self) -> &'static [&'static str] {
        &["postgresql"]
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
