//! How the sink works: checking the binding and schema, opening (and reopening) its
//! connection, keeping the progress table, and handing each batch to its transaction.

use super::columns::columns_of;
use super::connect::{describe_target, pg_options, sqlite_options, Target};
use super::job::Job;
use super::statements::{render, Statements};
use super::{bad_uri, quote, Conn, Dialect, SqlSink, SqlSinkOptions, WriteMode, PROGRESS_TABLE};
use arrow::datatypes::SchemaRef;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{SinkBatch, SinkContext, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};

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

    pub(super) fn fail(&self, what: &str, e: impl std::fmt::Display) -> Error {
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

    pub(super) async fn connection(&mut self) -> Result<&mut Conn> {
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

    pub(super) async fn progress_table_exists(&mut self) -> Result<bool> {
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

    pub(super) async fn write_batch(&mut self, batch: &SinkBatch<'_>) -> Result<WriteOutcome> {
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
