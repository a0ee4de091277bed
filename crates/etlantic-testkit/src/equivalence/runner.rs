//! Runs a case on every backend and compares each result with the expected rows.
//!
//! Batch backends (DataFusion, SQLite, PostgreSQL, Polars when linked) get the case as
//! one portable step ([`StepTask`]) and run it through the [`Backend`] trait, exactly as
//! a batch region does. The streaming runtime gets an ordinary pipeline: every input a
//! memory stream, the steps as one transformation, a memory sink (complete output mode
//! for aggregations, append otherwise), planned by the planner; it runs once with all
//! rows in one micro-batch and once with one row per stream per micro-batch.
//!
//! A backend is skipped only through what it declares: the capability check of the
//! planner (`ETL501`), a backend's own refusal at planning time (`output_schema`), or the
//! streaming rules (`ETL4xx`). Everything else that goes wrong is a failure.

use super::case::Case;
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::contract::types::property_from_field;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::Error;
use etlantic_core::ir::{TransformPlan, TransformPlanBuilder};
use etlantic_core::model::{Pipeline, SinkDef, SourceDef, TransformBuilder};
use etlantic_core::plugin::{Backend, RegionKind, StepLogic, StepTask};
use etlantic_core::profile::Profile;
use etlantic_core::streaming::{ExecutionMode, LatePolicy, OutputMode, Trigger};
use etlantic_plan::Project;
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use etlantic_sinks::memory::MemorySink;
use etlantic_sources::memory::MemoryStream;
use indexmap::IndexMap;
use serde_json::{json, Value};
use std::sync::Arc;

/// How a backend runs a case.
#[derive(Clone)]
pub enum Target {
    /// A batch backend, through [`Backend::execute_batch`].
    Batch(Arc<dyn Backend>),
    /// The streaming runtime, all rows in one micro-batch.
    StreamOneBatch,
    /// The streaming runtime, one row per stream per micro-batch.
    StreamManyBatches,
}

/// A named backend of the matrix.
#[derive(Clone)]
pub struct BackendUnderTest {
    /// Its column name in the matrix.
    pub label: String,
    /// How it runs.
    pub target: Target,
    /// The relative numeric tolerance it documents (used when the case sets none).
    pub tolerance: f64,
}

impl BackendUnderTest {
    /// A batch backend.
    pub fn batch(label: &str, backend: Arc<dyn Backend>, tolerance: f64) -> Self {
        BackendUnderTest {
            label: label.into(),
            target: Target::Batch(backend),
            tolerance,
        }
    }

    /// The streaming runtime in one or many micro-batches.
    pub fn streaming(many: bool) -> Self {
        BackendUnderTest {
            label: if many { "stream-many" } else { "stream-one" }.into(),
            target: if many {
                Target::StreamManyBatches
            } else {
                Target::StreamOneBatch
            },
            tolerance: 0.0,
        }
    }
}

/// The result of one case on one backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Equal to the expected rows.
    Pass,
    /// The backend declares it cannot run the case (the diagnostic code and message).
    Unsupported(String),
    /// Anything else.
    Fail(String),
}

impl Outcome {
    /// The matrix cell.
    pub fn symbol(&self) -> &'static str {
        match self {
            Outcome::Pass => "ok",
            Outcome::Unsupported(_) => "-",
            Outcome::Fail(_) => "FAIL",
        }
    }
}

/// Whether an error is a declared refusal (capability or streaming rules).
fn is_declared_refusal(e: &Error) -> bool {
    let errors: Vec<_> = e.diagnostics().iter().filter(|d| d.is_error()).collect();
    !errors.is_empty()
        && errors
            .iter()
            .all(|d| d.code.starts_with("ETL5") || d.code.starts_with("ETL4"))
}

fn refusal(e: &Error) -> Outcome {
    if is_declared_refusal(e) {
        Outcome::Unsupported(first_line(e))
    } else {
        Outcome::Fail(first_line(e))
    }
}

fn first_line(e: &Error) -> String {
    e.diagnostics()
        .iter()
        .find(|d| d.is_error())
        .map(|d| format!("{}: {}", d.code, d.message))
        .unwrap_or_else(|| e.to_string())
}

/// The case as one portable step over its inputs (ports named after the inputs).
pub fn step_task(case: &Case) -> Result<StepTask, String> {
    let mut b = TransformPlanBuilder::new(&case.name);
    for name in case.inputs.keys() {
        let schema = case.schema(name)?;
        b = b.input(name, Some(schema.as_ref()));
    }
    b = b.from_input(case.inputs.keys().next().expect("checked when loaded"));
    for s in &case.steps {
        b = b.step(s.0.clone());
    }
    let plan: TransformPlan = b
        .output("result", None)
        .build()
        .map_err(|e| format!("the steps do not make a plan: {e}"))?;
    Ok(StepTask {
        id: "result".into(),
        inputs: case.inputs.keys().map(|n| (n.clone(), n.clone())).collect(),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: case.parameters.clone(),
            output: "result".into(),
        },
    })
}

/// Runs a case on one backend.
pub async fn run_case(case: &Case, backend: &BackendUnderTest) -> Outcome {
    let tolerance = case.tolerance.unwrap_or(0.0).max(backend.tolerance);
    let got = match &backend.target {
        Target::Batch(b) => run_batch(case, b.as_ref()).await,
        Target::StreamOneBatch => run_streaming(case, false).await,
        Target::StreamManyBatches => run_streaming(case, true).await,
    };
    match got {
        Ok(table) => match compare(case, &table, tolerance) {
            Ok(()) => Outcome::Pass,
            Err(e) => Outcome::Fail(e),
        },
        Err(o) => o,
    }
}

async fn run_batch(case: &Case, backend: &dyn Backend) -> Result<Table, Outcome> {
    let task = step_task(case).map_err(Outcome::Fail)?;
    etlantic_plan::capability::check_step(backend, &task.id, &task.logic, RegionKind::Batch)
        .map_err(|e| refusal(&e))?;
    let tables = case.tables().map_err(Outcome::Fail)?;
    let schemas: IndexMap<String, SchemaRef> = tables
        .iter()
        .map(|(n, t)| (n.clone(), t.schema.clone()))
        .collect();
    let schema = backend
        .output_schema(&task, &schemas)
        .map_err(|e| refusal(&e))?;
    let mut out = backend
        .execute_batch(std::slice::from_ref(&task), tables, &["result".to_string()])
        .await
        .map_err(|e| Outcome::Fail(first_line(&e)))?;
    let table = out
        .swap_remove("result")
        .ok_or_else(|| Outcome::Fail("no result returned".into()))?;
    if table.schema.fields().len() != schema.fields().len()
        || table
            .schema
            .fields()
            .iter()
            .zip(schema.fields())
            .any(|(a, b)| a.name() != b.name() || a.data_type() != b.data_type())
    {
        return Err(Outcome::Fail(format!(
            "the result schema {:?} is not the promised {:?}",
            table.schema, schema
        )));
    }
    Ok(table)
}

fn contract_of(name: &str, schema: &SchemaRef) -> Value {
    let props: Vec<Value> = schema
        .fields()
        .iter()
        .map(|f| property_from_field(f))
        .collect();
    json!({
        "version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract",
        "id": name, "status": "draft",
        "schema": [{"name": name, "logicalType": "object", "properties": props}],
    })
}

async fn run_streaming(case: &Case, many: bool) -> Result<Table, Outcome> {
    let tag = format!("eq_{}_{}", case.name, uuid::Uuid::new_v4().simple());
    let task = step_task(case).map_err(Outcome::Fail)?;
    let tables = case.tables().map_err(Outcome::Fail)?;
    // The sink's contract is the step's output schema by the reference type rules.
    let schemas: IndexMap<String, SchemaRef> = tables
        .iter()
        .map(|(n, t)| (n.clone(), t.schema.clone()))
        .collect();
    let out_schema = etlantic_datafusion::DataFusionBackend
        .output_schema(&task, &schemas)
        .map_err(|e| refusal(&e))?;
    let aggregates = case.steps.iter().any(|s| s.0.is_aggregation());
    let mut b = Pipeline::builder(format!("equivalence_{}", case.name));
    let mut profile = Profile::new("equivalence");
    profile.mode = ExecutionMode::Streaming;
    profile.trigger = Some(Trigger::AvailableNow);
    let mut t = TransformBuilder::new("result");
    for (name, schema) in &schemas {
        b = b.asset_inline(name.clone(), contract_of(name, schema));
        profile
            .bindings
            .insert(name.clone(), format!("memory://{tag}_{name}"));
        b = b.source_def(SourceDef {
            id: name.clone(),
            asset: name.clone(),
            event_time: None,
            watermark: None,
            late_events: LatePolicy::Drop,
            read_limit: None,
            static_refresh: None,
        });
        t = t.input(name.clone(), name.clone());
    }
    for s in &case.steps {
        t = t.step(s.0.clone());
    }
    for (k, v) in &case.parameters {
        t = t.parameter(k.clone(), v.clone());
    }
    b = b.transform(t);
    b = b.asset_inline("out", contract_of("out", &out_schema));
    profile
        .bindings
        .insert("out".into(), format!("memory://{tag}_out"));
    let output_mode = if aggregates {
        OutputMode::Complete
    } else {
        OutputMode::Append
    };
    b = b.sink_def(SinkDef {
        id: "out".into(),
        input: "result".into(),
        asset: "out".into(),
        output_mode: Some(output_mode),
        write_mode: None,
        keys: vec![],
    });
    let dir = tempfile::tempdir().map_err(|e| Outcome::Fail(e.to_string()))?;
    let project = Project::from_parts(dir.path(), b.build(), profile);
    etlantic_datafusion::link();
    let outcome = etlantic_plan::plan(&project);
    let plan = match outcome.into_result() {
        Ok(p) => p,
        Err(e) => return Err(refusal(&e)),
    };
    let sink_name = format!("{tag}_out");
    let streams: Vec<(String, String)> = case
        .inputs
        .keys()
        .map(|n| (n.clone(), format!("{tag}_{n}")))
        .collect();
    for (n, s) in &streams {
        MemoryStream::register(s, schemas[n].clone());
    }
    MemorySink::clear(&sink_name);
    let result = async {
        let opts = StreamingOptions::new(dir.path(), dir.path().join("checkpoint"));
        let mut query = StreamingQuery::start(&plan, opts)
            .await
            .map_err(|e| Outcome::Fail(format!("cannot start: {}", first_line(&e))))?;
        let rounds = if many {
            case.inputs
                .values()
                .map(|i| i.rows.len())
                .max()
                .unwrap_or(0)
                .max(1)
        } else {
            1
        };
        for round in 0..rounds {
            for (n, s) in &streams {
                let rows = &case.inputs[n].rows;
                let chunk: Vec<Vec<Value>> = if many {
                    rows.get(round).cloned().into_iter().collect()
                } else {
                    rows.clone()
                };
                let batch = case.batch(n, &chunk).map_err(Outcome::Fail)?;
                MemoryStream::push(s, batch).map_err(|e| Outcome::Fail(first_line(&e)))?;
            }
            query
                .process_all_available()
                .await
                .map_err(|e| Outcome::Fail(format!("micro-batch {round}: {}", first_line(&e))))?;
        }
        let writes = MemorySink::snapshot(&sink_name);
        let batches: Vec<RecordBatch> = if output_mode == OutputMode::Complete {
            writes
                .last()
                .map(|w| w.table.batches.clone())
                .unwrap_or_default()
        } else {
            writes
                .iter()
                .flat_map(|w| w.table.batches.clone())
                .collect()
        };
        Ok(Table::new(out_schema.clone(), batches))
    }
    .await;
    for (_, s) in &streams {
        MemoryStream::remove(s);
    }
    MemorySink::clear(&sink_name);
    result
}

/// A value in the comparison's normal form.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Null,
    Num(f64),
    Bool(bool),
    Text(String),
}

impl Cell {
    fn key(&self) -> String {
        match self {
            Cell::Null => "0".into(),
            Cell::Num(x) => format!("1{:+.6e}", x),
            Cell::Bool(b) => format!("2{b}"),
            Cell::Text(s) => format!("3{s}"),
        }
    }

    fn from_json(v: &Value) -> Cell {
        match v {
            Value::Null => Cell::Null,
            Value::Bool(b) => Cell::Bool(*b),
            Value::Number(n) => Cell::Num(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => Cell::Text(s.clone()),
            other => Cell::Text(other.to_string()),
        }
    }

    fn close(&self, other: &Cell, tolerance: f64) -> bool {
        match (self, other) {
            (Cell::Num(a), Cell::Num(b)) => {
                a == b || (a - b).abs() <= tolerance * a.abs().max(b.abs()).max(1.0)
            }
            (a, b) => a == b,
        }
    }
}

fn cells(col: &ArrayRef) -> Result<Vec<Cell>, String> {
    let n = col.len();
    let dt = col.data_type();
    let err = |e: arrow::error::ArrowError| e.to_string();
    Ok(match dt {
        DataType::Boolean => {
            let a = col.as_boolean();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Cell::Null
                    } else {
                        Cell::Bool(a.value(i))
                    }
                })
                .collect()
        }
        t if t.is_numeric() => {
            let f = cast(col, &DataType::Float64).map_err(err)?;
            let a = f.as_primitive::<arrow::datatypes::Float64Type>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Cell::Null
                    } else {
                        Cell::Num(a.value(i))
                    }
                })
                .collect()
        }
        DataType::Timestamp(_, _) => {
            // ISO-8601 in UTC with `Z`, e.g. `2024-01-01T10:00:00Z`.
            let us = cast(
                col,
                &DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None),
            )
            .map_err(err)?;
            let a = us.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Cell::Null
                    } else {
                        let t = chrono::DateTime::from_timestamp_micros(a.value(i))
                            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string())
                            .unwrap_or_default();
                        Cell::Text(t)
                    }
                })
                .collect()
        }
        _ => {
            let s = cast(col, &DataType::Utf8).map_err(err)?;
            let a = s.as_string::<i32>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Cell::Null
                    } else {
                        Cell::Text(a.value(i).to_string())
                    }
                })
                .collect()
        }
    })
}

fn rows_of(table: &Table) -> Result<Vec<Vec<Cell>>, String> {
    let mut rows = Vec::new();
    for b in &table.batches {
        let cols: Vec<Vec<Cell>> = b.columns().iter().map(cells).collect::<Result<_, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(cols.iter().map(|c| c[r].clone()).collect());
        }
    }
    Ok(rows)
}

fn render(rows: &[Vec<Cell>]) -> String {
    let shown: Vec<String> = rows
        .iter()
        .take(12)
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .map(|c| match c {
                    Cell::Null => "null".into(),
                    Cell::Num(x) => format!("{x}"),
                    Cell::Bool(b) => b.to_string(),
                    Cell::Text(s) => format!("{s:?}"),
                })
                .collect();
            format!("[{}]", cells.join(", "))
        })
        .collect();
    let more = if rows.len() > 12 {
        format!(" (+{} more)", rows.len() - 12)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(" "))
}

/// Compares a result with the case's expected rows.
pub fn compare(case: &Case, table: &Table, tolerance: f64) -> Result<(), String> {
    if let Some(cols) = &case.expect.columns {
        let got: Vec<String> = table
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        if &got != cols {
            return Err(format!("columns {got:?}, expected {cols:?}"));
        }
    }
    let mut got = rows_of(table)?;
    let mut want: Vec<Vec<Cell>> = case
        .expect
        .rows
        .iter()
        .map(|r| r.iter().map(Cell::from_json).collect())
        .collect();
    // Expected timestamps may be written without the `Z` or fraction.
    for r in want.iter_mut() {
        for c in r.iter_mut() {
            if let Cell::Text(s) = c {
                if let Some(us) = iso_micros(s) {
                    *c = Cell::Text(
                        chrono::DateTime::from_timestamp_micros(us)
                            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string())
                            .unwrap_or_default(),
                    );
                }
            }
        }
    }
    if !case.expect.ordered {
        let key = |r: &Vec<Cell>| r.iter().map(Cell::key).collect::<Vec<_>>().join("\u{1}");
        got.sort_by_key(key);
        want.sort_by_key(key);
    }
    let equal = got.len() == want.len()
        && got.iter().zip(&want).all(|(g, w)| {
            g.len() == w.len() && g.iter().zip(w).all(|(a, b)| a.close(b, tolerance))
        });
    if equal {
        Ok(())
    } else {
        Err(format!(
            "rows differ\n    expected {}\n    got      {}",
            render(&want),
            render(&got)
        ))
    }
}

/// An ISO timestamp (`2024-01-01T10:00:00[.f][Z]`) as microseconds; `None` for other text.
fn iso_micros(s: &str) -> Option<i64> {
    if s.len() < 19 || s.as_bytes().get(10) != Some(&b'T') {
        return None;
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_micros())
}

/// The outcomes of every case on every backend.
#[derive(Clone, Debug, Default)]
pub struct Matrix {
    /// Backend labels (columns).
    pub backends: Vec<String>,
    /// (case name, outcome per backend).
    pub rows: Vec<(String, Vec<Outcome>)>,
}

impl Matrix {
    /// Runs every case on every backend.
    pub async fn run(cases: &[Case], backends: &[BackendUnderTest]) -> Matrix {
        let mut m = Matrix {
            backends: backends.iter().map(|b| b.label.clone()).collect(),
            rows: Vec::new(),
        };
        for c in cases {
            let mut outcomes = Vec::new();
            for b in backends {
                outcomes.push(run_case(c, b).await);
            }
            m.rows.push((c.name.clone(), outcomes));
        }
        m
    }

    /// Failures as `case on backend: why`.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (case, outcomes) in &self.rows {
            for (b, o) in self.backends.iter().zip(outcomes) {
                if let Outcome::Fail(why) = o {
                    out.push(format!("{case} on {b}: {why}"));
                }
            }
        }
        out
    }

    /// The support matrix as a Markdown table (`ok`, `-` unsupported, `FAIL`), followed
    /// by the reason of every unsupported cell.
    pub fn render(&self) -> String {
        let mut s = format!("| case | {} |\n", self.backends.join(" | "));
        s.push_str(&format!("|---|{}\n", "---|".repeat(self.backends.len())));
        for (case, outcomes) in &self.rows {
            let cells: Vec<&str> = outcomes.iter().map(Outcome::symbol).collect();
            s.push_str(&format!("| {case} | {} |\n", cells.join(" | ")));
        }
        let totals: Vec<String> = (0..self.backends.len())
            .map(|i| {
                let ok = self
                    .rows
                    .iter()
                    .filter(|(_, o)| o[i] == Outcome::Pass)
                    .count();
                format!("{ok}/{}", self.rows.len())
            })
            .collect();
        s.push_str(&format!("| **passed** | {} |\n", totals.join(" | ")));
        let mut reasons = Vec::new();
        for (case, outcomes) in &self.rows {
            for (b, o) in self.backends.iter().zip(outcomes) {
                if let Outcome::Unsupported(why) = o {
                    reasons.push(format!("- {case} on {b}: {why}"));
                }
            }
        }
        if !reasons.is_empty() {
            s.push_str("\nUnsupported (declared):\n");
            s.push_str(&reasons.join("\n"));
            s.push('\n');
        }
        s
    }
}
