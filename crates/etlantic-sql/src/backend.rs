//! [`SqlBackend`]: the `postgres` and `sqlite` backends of SQL regions.

use crate::capabilities;
use crate::compile::{QueryBuilder, Rel, ORD};
use crate::dialect::{quote, Dialect, Ty};
use crate::values::{build_column, column_values, placeholder, Val};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{Backend, BackendCapabilities, RegionLocation, StepLogic, StepTask};
use indexmap::IndexMap;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Row, TypeInfo, ValueRef};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where the backend's regions run.
#[derive(Clone, Debug)]
enum Location {
    /// No database named: SQLite runs in a private in-memory database; PostgreSQL
    /// refuses (`ETL506`).
    Unbound,
    /// An SQLite database file.
    SqliteFile(PathBuf),
    /// A PostgreSQL database.
    Postgres(Box<PgConnectOptions>, String),
}

/// Runs portable DTCS steps inside PostgreSQL or SQLite.
///
/// Each region runs in one connection and one transaction that is rolled back at the
/// end: its Arrow inputs are staged into temporary tables (see [`crate::dialect`] for the
/// column types), the steps compile to one `WITH` query per requested output
/// ([`crate::compile`]), and the rows come back as Arrow in exactly the schema
/// [`Backend::output_schema`] promised. Nothing of the region is left in the database.
///
/// The registered instances (`postgres`, `sqlite`) are unbound; the planner binds a
/// region to the database of the assets it reads or writes through
/// [`Backend::at_location`]. Unbound, `sqlite` runs in a private in-memory database.
#[derive(Clone, Debug)]
pub struct SqlBackend {
    dialect: Dialect,
    location: Location,
    /// Relations read where they lie: name → (table, the schema it is read as).
    in_place: Vec<(String, (String, SchemaRef))>,
}

impl SqlBackend {
    /// The unbound backend of a dialect.
    pub const fn unbound(dialect: Dialect) -> Self {
        SqlBackend {
            dialect,
            location: Location::Unbound,
            in_place: Vec::new(),
        }
    }

    /// A PostgreSQL backend on the database of `url` (`postgres://user@host:port/db`).
    pub fn postgres(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            Error::new(
                &codes::BAD_URI,
                format!(
                    "cannot read PostgreSQL URL `{}`: {e}",
                    etlantic_core::uri::redact(url)
                ),
            )
        })?;
        Ok(SqlBackend {
            dialect: Dialect::Postgres,
            location: Location::Postgres(Box::new(options), etlantic_core::uri::redact(url)),
            in_place: Vec::new(),
        })
    }

    /// An SQLite backend on the database file at `path`.
    pub fn sqlite_file(path: impl Into<PathBuf>) -> Self {
        SqlBackend {
            dialect: Dialect::Sqlite,
            location: Location::SqliteFile(path.into()),
            in_place: Vec::new(),
        }
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> Error {
        let place = match &self.location {
            Location::Unbound => "a private in-memory database".to_string(),
            Location::SqliteFile(p) => format!("sqlite://{}", p.display()),
            Location::Postgres(_, url) => url.clone(),
        };
        let d = etlantic_core::diagnostics::Diagnostic::new(
            &codes::ENGINE_ERROR,
            format!("SQL region in {place}: {what}: {e}"),
        );
        if self.in_place.is_empty() {
            d.into()
        } else {
            d.help("A table read in place (`read=in_place`) is checked by the database's types only: a value that does not convert to its contract's type fails the query. Fix the value, or drop `read=in_place` so that the source quarantines such rows.").into()
        }
    }

    /// The schemas of every relation: the inputs', then each step's.
    fn schemas(
        &self,
        steps: &[StepTask],
        inputs: &IndexMap<String, Table>,
    ) -> Result<IndexMap<String, SchemaRef>> {
        let mut schemas: IndexMap<String, SchemaRef> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.schema.clone()))
            .chain(
                self.in_place
                    .iter()
                    .map(|(n, (_, s))| (n.clone(), s.clone())),
            )
            .collect();
        for step in steps {
            let ports = step
                .inputs
                .iter()
                .map(|(port, rel)| {
                    schemas
                        .get(rel)
                        .cloned()
                        .map(|s| (port.clone(), s))
                        .ok_or_else(|| {
                            Error::new(
                                &codes::UNKNOWN_NODE,
                                format!(
                                    "step `{}` reads `{rel}`, which the region does not have",
                                    step.id
                                ),
                            )
                        })
                })
                .collect::<Result<IndexMap<_, _>>>()?;
            let schema = self.output_schema(step, &ports)?;
            schemas.insert(step.id.clone(), schema);
        }
        Ok(schemas)
    }

    /// Compiles `steps` over relations of the given schemas; returns the builder and the
    /// relation of every step.
    fn compile(
        &self,
        steps: &[StepTask],
        relations: &IndexMap<String, (String, SchemaRef)>,
    ) -> Result<(QueryBuilder, IndexMap<String, Rel>)> {
        let mut qb = QueryBuilder::new(self.dialect);
        for (name, (table, schema)) in relations {
            qb.bind(name, rel_of(quote(table), schema));
        }
        let mut out = IndexMap::new();
        for step in steps {
            let StepLogic::Portable {
                plan,
                parameters,
                output,
            } = &step.logic
            else {
                return Err(Error::new(
                    &codes::BACKEND_UNSUPPORTED_ACTION,
                    format!(
                        "step `{}`: the `{}` backend runs portable plans only",
                        step.id,
                        self.dialect.backend_name()
                    ),
                ));
            };
            let rel = qb.plan(plan.decoded(), parameters, &step.inputs, output)?;
            qb.bind(&step.id, rel.clone());
            out.insert(step.id.clone(), rel);
        }
        Ok((qb, out))
    }
}

fn rel_of(from: String, schema: &SchemaRef) -> Rel {
    Rel {
        from,
        columns: schema
            .fields()
            .iter()
            .map(|f| (f.name().clone(), Ty::of(f.data_type())))
            .collect(),
    }
}

/// A connection of either dialect.
enum Conn {
    Pg(PgConnection),
    Lite(SqliteConnection),
}

impl SqlBackend {
    async fn connect(&self) -> Result<Conn> {
        match (&self.location, self.dialect) {
            (Location::Postgres(o, _), _) => {
                let mut c = PgConnection::connect_with(o)
                    .await
                    .map_err(|e| self.fail("cannot connect", e))?;
                // One transaction, rolled back at the end; timestamps read in UTC.
                sqlx::Executor::execute(&mut c, sqlx::raw_sql("BEGIN; SET LOCAL TIME ZONE 'UTC'"))
                    .await
                    .map_err(|e| self.fail("cannot begin", e))?;
                Ok(Conn::Pg(c))
            }
            (Location::Unbound, Dialect::Postgres) => Err(Error::new(
                &codes::REGION_LOCATION,
                "a `postgres` SQL region needs a database: it runs in the database of the postgres:// assets it reads or writes",
            )),
            (loc, _) => {
                let o = match loc {
                    Location::SqliteFile(p) => SqliteConnectOptions::new()
                        .filename(p)
                        .read_only(true)
                        .create_if_missing(false),
                    _ => SqliteConnectOptions::from_str("sqlite::memory:")
                        .map_err(|e| self.fail("cannot open", e))?,
                };
                let mut c = SqliteConnection::connect_with(&o)
                    .await
                    .map_err(|e| self.fail("cannot open the database", e))?;
                sqlx::Executor::execute(&mut c, sqlx::raw_sql("BEGIN"))
                    .await
                    .map_err(|e| self.fail("cannot begin", e))?;
                Ok(Conn::Lite(c))
            }
        }
    }

    /// Runs one statement. (The statement helpers return boxed `Send` futures: sqlx's
    /// higher-ranked `Executor` bounds are otherwise not provably `Send` behind
    /// `async_trait`.)
    fn execute<'a>(
        &'a self,
        conn: &'a mut Conn,
        sql: &'a str,
        binds: Vec<Val>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            match conn {
                Conn::Pg(c) => {
                    let mut q = sqlx::query(sql);
                    for v in binds {
                        q = match v {
                            Val::Null => q.bind(None::<String>),
                            Val::I(i) => q.bind(i.to_string()),
                            Val::F(f) => q.bind(f.to_string()),
                            Val::T(t) => q.bind(t),
                        };
                    }
                    q.execute(c).await.map(|_| ())
                }
                Conn::Lite(c) => {
                    let mut q = sqlx::query(sql);
                    for v in binds {
                        q = match v {
                            Val::Null => q.bind(None::<i64>),
                            Val::I(i) => q.bind(i),
                            Val::F(f) => q.bind(f),
                            Val::T(t) => q.bind(t),
                        };
                    }
                    q.execute(c).await.map(|_| ())
                }
            }
            .map_err(|e| self.fail(&format!("statement failed (`{}`)", short_sql(sql)), e))
        })
    }

    /// Creates a temporary table `name` holding `table` with an ordinal column.
    fn stage<'a>(
        &'a self,
        conn: &'a mut Conn,
        name: &'a str,
        table: &'a Table,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let d = self.dialect;
            let mut defs = Vec::new();
            let mut kinds = Vec::new();
            for f in table.schema.fields() {
                let ty = Ty::of(f.data_type());
                let ct = ty.column_type(d).ok_or_else(|| {
                    Error::new(
                        &codes::UNSUPPORTED_TYPE,
                        format!(
                            "column `{}`: an SQL region cannot hold values of type {}",
                            f.name(),
                            f.data_type()
                        ),
                    )
                })?;
                defs.push(format!("{} {ct}", quote(f.name())));
                kinds.push(ty);
            }
            defs.push(format!("{} BIGINT", quote(ORD)));
            self.execute(
                conn,
                &format!(
                    "CREATE TEMPORARY TABLE {} ({})",
                    quote(name),
                    defs.join(", ")
                ),
                vec![],
            )
            .await?;
            let batch: RecordBatch = table
                .concat()
                .map_err(|e| self.fail("cannot read the input", e))?;
            let columns: Vec<Vec<Val>> = batch
                .columns()
                .iter()
                .zip(table.schema.fields())
                .map(|(c, f)| column_values(d, c, f.name()))
                .collect::<Result<_>>()?;
            let width = kinds.len() + 1;
            let per_statement = (d.max_binds() / width).clamp(1, 1000);
            let names: Vec<String> = table
                .schema
                .fields()
                .iter()
                .map(|f| quote(f.name()))
                .chain([quote(ORD)])
                .collect();
            let mut row = 0;
            while row < batch.num_rows() {
                let end = (row + per_statement).min(batch.num_rows());
                let mut tuples = Vec::with_capacity(end - row);
                let mut binds = Vec::with_capacity((end - row) * width);
                let mut n = 0;
                // Rows are column-major here; `r` indexes every column of the row.
                #[allow(clippy::needless_range_loop)]
                for r in row..end {
                    let mut ph = Vec::with_capacity(width);
                    for (c, ty) in kinds.iter().enumerate() {
                        n += 1;
                        ph.push(placeholder(d, n, ty));
                        binds.push(columns[c][r].clone());
                    }
                    n += 1;
                    ph.push(placeholder(d, n, &Ty::Int));
                    binds.push(Val::I(r as i64 + 1));
                    tuples.push(format!("({})", ph.join(", ")));
                }
                let sql = format!(
                    "INSERT INTO {} ({}) VALUES {}",
                    quote(name),
                    names.join(", "),
                    tuples.join(", ")
                );
                self.execute(conn, &sql, binds).await?;
                row = end;
            }
            Ok(())
        })
    }

    /// Runs a query and returns its rows in `schema`.
    fn fetch<'a>(
        &'a self,
        conn: &'a mut Conn,
        sql: &'a str,
        schema: &'a SchemaRef,
    ) -> BoxFuture<'a, Result<Table>> {
        Box::pin(async move {
            let width = schema.fields().len();
            let mut columns: Vec<Vec<Val>> = vec![Vec::new(); width];
            match conn {
                Conn::Pg(c) => {
                    // The simple-query protocol: every value in PostgreSQL's text output.
                    // (`Executor::fetch_all`'s boxed future: sqlx's generic `fetch_all` is not
                    // provably `Send` behind `async_trait`.)
                    let results = sqlx::Executor::fetch_all(c, sqlx::raw_sql(sql))
                        .await
                        .map_err(|e| {
                            self.fail(&format!("query failed (`{}`)", short_sql(sql)), e)
                        })?;
                    for row in &results {
                        for (i, col) in columns.iter_mut().enumerate().take(row.len().min(width)) {
                            let v = row
                                .try_get_raw(i)
                                .map_err(|e| self.fail("cannot read", e))?;
                            col.push(if v.is_null() {
                                Val::Null
                            } else {
                                Val::T(
                                    v.as_str()
                                        .map_err(|e| self.fail("cannot read", e))?
                                        .to_string(),
                                )
                            });
                        }
                    }
                }
                Conn::Lite(c) => {
                    let results = sqlx::Executor::fetch_all(c, sqlx::query(sql))
                        .await
                        .map_err(|e| {
                            self.fail(&format!("query failed (`{}`)", short_sql(sql)), e)
                        })?;
                    for row in &results {
                        for (i, col) in columns.iter_mut().enumerate().take(row.len().min(width)) {
                            let raw = row
                                .try_get_raw(i)
                                .map_err(|e| self.fail("cannot read", e))?;
                            let kind = if raw.is_null() {
                                "NULL".to_string()
                            } else {
                                raw.type_info().name().to_string()
                            };
                            let read = |e| self.fail("cannot read", e);
                            col.push(match kind.as_str() {
                                "NULL" => Val::Null,
                                "INTEGER" | "BOOLEAN" => {
                                    Val::I(row.try_get_unchecked::<i64, _>(i).map_err(read)?)
                                }
                                "REAL" | "NUMERIC" => {
                                    Val::F(row.try_get_unchecked::<f64, _>(i).map_err(read)?)
                                }
                                _ => Val::T(row.try_get_unchecked::<String, _>(i).map_err(read)?),
                            });
                        }
                    }
                }
            }
            let arrays = columns
                .into_iter()
                .zip(schema.fields())
                .map(|(vals, f)| build_column(self.dialect, vals, f.data_type(), f.name()))
                .collect::<Result<Vec<_>>>()?;
            match RecordBatch::try_new(schema.clone(), arrays.clone()) {
                Ok(b) => Ok(Table::new(schema.clone(), vec![b])),
                Err(_) => {
                    // A column the schema declares non-null came back with nulls: keep it
                    // nullable, as `Table::conform_to` does (the sink contract reports them).
                    let relaxed = Arc::new(arrow::datatypes::Schema::new(
                        schema
                            .fields()
                            .iter()
                            .map(|f| f.as_ref().clone().with_nullable(true))
                            .collect::<Vec<_>>(),
                    ));
                    let b = RecordBatch::try_new(relaxed.clone(), arrays)
                        .map_err(|e| self.fail("cannot assemble the result", e))?;
                    Ok(Table::new(relaxed, vec![b]))
                }
            }
        })
    }

    /// Reads `table` where it lies, as a temporary view with the columns of `schema`
    /// converted to the region's storage types (a value that does not convert fails the
    /// query) and the row order the table is scanned in.
    fn view_in_place<'a>(
        &'a self,
        conn: &'a mut Conn,
        view: &'a str,
        table: &'a str,
        schema: &'a SchemaRef,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let d = self.dialect;
            let mut columns = Vec::new();
            for f in schema.fields() {
                let ct = Ty::of(f.data_type()).column_type(d).ok_or_else(|| {
                    Error::new(
                        &codes::UNSUPPORTED_TYPE,
                        format!(
                            "column `{}` of `{table}`: an SQL region cannot hold values of type {}",
                            f.name(),
                            f.data_type()
                        ),
                    )
                })?;
                columns.push(format!(
                    "CAST({} AS {ct}) AS {}",
                    quote(f.name()),
                    quote(f.name())
                ));
            }
            let qualified: Vec<String> = table.split('.').map(quote).collect();
            self.execute(
                conn,
                &format!(
                    "CREATE TEMPORARY VIEW {} AS SELECT {}, row_number() OVER () AS {} FROM {}",
                    quote(view),
                    columns.join(", "),
                    quote(ORD),
                    qualified.join(".")
                ),
                vec![],
            )
            .await
        })
    }

    /// Stages the inputs, compiles the steps and reads every requested output.
    fn run_region<'a>(
        &'a self,
        conn: &'a mut Conn,
        steps: &'a [StepTask],
        inputs: &'a IndexMap<String, Table>,
        outputs: &'a [String],
        schemas: &'a IndexMap<String, SchemaRef>,
    ) -> BoxFuture<'a, Result<IndexMap<String, Table>>> {
        Box::pin(async move {
            let mut staged: IndexMap<String, (String, SchemaRef)> = IndexMap::new();
            for (i, (name, table)) in inputs.iter().enumerate() {
                let temp = format!("__etl_in_{i}");
                self.stage(conn, &temp, table).await?;
                staged.insert(name.clone(), (temp, table.schema.clone()));
            }
            for (i, (name, (table, schema))) in self.in_place.iter().enumerate() {
                let view = format!("__etl_table_{i}");
                self.view_in_place(conn, &view, table, schema).await?;
                staged.insert(name.clone(), (view, schema.clone()));
            }
            let (qb, rels) = self.compile(steps, &staged)?;
            let mut out = IndexMap::new();
            for name in outputs {
                if let Some(t) = inputs.get(name) {
                    out.insert(name.clone(), t.clone());
                    continue;
                }
                let rel = rels.get(name).ok_or_else(|| {
                    Error::new(
                        &codes::UNKNOWN_NODE,
                        format!("the region has no step `{name}`"),
                    )
                })?;
                let sql = qb.finish(rel);
                let table = self.fetch(conn, &sql, &schemas[name]).await?;
                out.insert(name.clone(), table);
            }
            Ok(out)
        })
    }

    async fn finish(&self, conn: Conn) {
        match conn {
            Conn::Pg(mut c) => {
                let _ = sqlx::Executor::execute(&mut c, sqlx::raw_sql("ROLLBACK")).await;
                let _ = c.close().await;
            }
            Conn::Lite(mut c) => {
                let _ = sqlx::Executor::execute(&mut c, sqlx::raw_sql("ROLLBACK")).await;
                let _ = c.close().await;
            }
        }
    }
}

fn short_sql(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 160 {
        format!("{}…", one_line.chars().take(160).collect::<String>())
    } else {
        one_line
    }
}

#[async_trait::async_trait]
impl Backend for SqlBackend {
    fn name(&self) -> &'static str {
        self.dialect.backend_name()
    }

    fn capabilities(&self) -> BackendCapabilities {
        capabilities::capabilities(self.dialect)
    }

    /// The schema of a portable step: the reference type rules of DTCS plans (the
    /// embedded engine's), after checking that the step compiles in this dialect.
    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        let relations: IndexMap<String, (String, SchemaRef)> = inputs
            .iter()
            .map(|(port, s)| (port.clone(), (format!("__etl_in_{port}"), s.clone())))
            .collect();
        let task = StepTask {
            id: step.id.clone(),
            inputs: inputs.keys().map(|p| (p.clone(), p.clone())).collect(),
            logic: step.logic.clone(),
        };
        self.compile(std::slice::from_ref(&task), &relations)?;
        etlantic_datafusion::DataFusionBackend.output_schema(&task, inputs)
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        let schemas = self.schemas(steps, &inputs)?;
        let mut conn = self.connect().await?;
        let result = self
            .run_region(&mut conn, steps, &inputs, outputs, &schemas)
            .await;
        self.finish(conn).await;
        result
    }

    fn at_location(&self, location: &RegionLocation) -> Result<Arc<dyn Backend>> {
        let uri = &location.uri;
        match (self.dialect, uri.scheme.as_str()) {
            (Dialect::Postgres, "postgres" | "postgresql") => {
                let url = format!("postgres://{}", uri.location);
                let mut b = SqlBackend::postgres(&url)?;
                b.in_place = location.tables.clone().into_iter().collect();
                if let (Some(mode), Location::Postgres(o, _)) =
                    (uri.param("sslmode"), &mut b.location)
                {
                    let m = sqlx::postgres::PgSslMode::from_str(mode).map_err(|e| {
                        Error::new(&codes::BAD_URI, format!("sslmode `{mode}`: {e}"))
                    })?;
                    **o = o.as_ref().clone().ssl_mode(m);
                }
                Ok(Arc::new(b))
            }
            (Dialect::Sqlite, "sqlite") => {
                let path = etlantic_core::uri::located(&location.root, &uri.location);
                let mut b = SqlBackend::sqlite_file(path);
                b.in_place = location.tables.clone().into_iter().collect();
                Ok(Arc::new(b))
            }
            _ => Err(Error::new(
                &codes::REGION_LOCATION,
                format!(
                    "the `{}` backend cannot run a region in {}",
                    self.dialect.backend_name(),
                    uri.redacted()
                ),
            )),
        }
    }
}
