//! A small equivalence harness: a case (input tables, steps in pipeline YAML syntax,
//! parameters) runs as one portable step on the Polars backend and on the reference
//! engine (DataFusion); both must give the same schema and the same rows.

#![allow(dead_code)]

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::compute::{cast, cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::Error;
use etlantic_core::ir::{TransformPlan, TransformPlanBuilder};
use etlantic_core::model::steps::Step;
use etlantic_core::plugin::{Backend, StepLogic, StepTask};
use etlantic_datafusion::DataFusionBackend;
use etlantic_polars::PolarsBackend;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// An input table.
#[derive(Clone, Debug, Deserialize)]
pub struct InputSpec {
    /// Column name → type.
    pub columns: IndexMap<String, String>,
    /// Rows (decimals, dates and timestamps as strings).
    #[serde(default)]
    pub rows: Vec<Vec<Value>>,
}

/// Expected rows (only their number is checked here; values are compared with the
/// reference engine).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Expected {
    /// The rows.
    #[serde(default)]
    pub rows: Vec<Vec<Value>>,
    /// Whether the order matters.
    #[serde(default)]
    pub ordered: bool,
}

/// A case.
#[derive(Clone, Debug, Deserialize)]
pub struct Case {
    /// Its name.
    #[serde(skip)]
    pub name: String,
    /// Inputs by port; the first is the target of the first step.
    pub inputs: IndexMap<String, InputSpec>,
    /// The steps.
    pub steps: Vec<Step>,
    /// Parameters.
    #[serde(default)]
    pub parameters: IndexMap<String, Value>,
    /// Expected rows, when given.
    #[serde(default)]
    pub expect: Option<Expected>,
    /// Compare in order.
    #[serde(default)]
    pub ordered: bool,
    /// Relative tolerance of floating-point results.
    #[serde(default)]
    pub tolerance: Option<f64>,
}

impl Case {
    /// Parses a case.
    pub fn parse(name: &str, yaml: &str) -> Case {
        Case::try_parse(name, yaml).unwrap_or_else(|e| panic!("case {name}: {e}"))
    }

    /// Parses a case, or says why it cannot.
    pub fn try_parse(name: &str, yaml: &str) -> Result<Case, String> {
        let mut c: Case = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        c.name = name.to_string();
        Ok(c)
    }

    /// Whether rows compare in order.
    pub fn ordered(&self) -> bool {
        self.ordered || self.expect.as_ref().is_some_and(|e| e.ordered)
    }
}

/// The Arrow type of a case column type.
pub fn data_type(t: &str) -> DataType {
    match t.trim() {
        "integer" => DataType::Int64,
        "int32" => DataType::Int32,
        "int16" => DataType::Int16,
        "int8" => DataType::Int8,
        "uint8" => DataType::UInt8,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float" => DataType::Float64,
        "float32" => DataType::Float32,
        "string" => DataType::Utf8,
        "large_string" => DataType::LargeUtf8,
        "boolean" => DataType::Boolean,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "timestamp_ns" => DataType::Timestamp(TimeUnit::Nanosecond, None),
        d if d.starts_with("decimal(") && d.ends_with(')') => {
            let inner = &d["decimal(".len()..d.len() - 1];
            let (p, s) = inner.split_once(',').expect("decimal(p,s)");
            DataType::Decimal128(p.trim().parse().unwrap(), s.trim().parse().unwrap())
        }
        other => panic!("unknown column type `{other}`"),
    }
}

fn schema(spec: &InputSpec) -> SchemaRef {
    Arc::new(Schema::new(
        spec.columns
            .iter()
            .map(|(n, t)| Field::new(n, data_type(t), true))
            .collect::<Vec<_>>(),
    ))
}

fn table(name: &str, spec: &InputSpec) -> Table {
    let schema = schema(spec);
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let texts: Vec<Option<String>> = spec
            .rows
            .iter()
            .map(|r| match &r[i] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                v => Some(v.to_string()),
            })
            .collect();
        let text: ArrayRef = Arc::new(StringArray::from(texts));
        let col = cast_with_options(
            &text,
            f.data_type(),
            &CastOptions {
                safe: false,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("input `{name}` column `{}`: {e}", f.name()));
        columns.push(col);
    }
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    Table::new(schema, vec![batch])
}

/// The case's inputs as tables.
pub fn tables(case: &Case) -> IndexMap<String, Table> {
    case.inputs
        .iter()
        .map(|(n, s)| (n.clone(), table(n, s)))
        .collect()
}

/// The case as one portable step.
pub fn step_task(case: &Case) -> StepTask {
    let mut b = TransformPlanBuilder::new(&case.name);
    for (name, spec) in &case.inputs {
        b = b.input(name, Some(schema(spec).as_ref()));
    }
    b = b.from_input(case.inputs.keys().next().expect("an input"));
    for s in &case.steps {
        b = b.step(s.0.clone());
    }
    let plan: TransformPlan = b.output("result", None).build().expect("a plan");
    StepTask {
        id: "result".into(),
        inputs: case.inputs.keys().map(|n| (n.clone(), n.clone())).collect(),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: case.parameters.clone(),
            output: "result".into(),
        },
    }
}

/// What a backend made of a case.
#[derive(Debug)]
pub enum Run {
    /// Refused while planning (`output_schema`).
    Refused(Error),
    /// Failed while running.
    Failed(Error),
    /// The result, and the schema promised.
    Ok(Table, SchemaRef),
}

/// Runs a case on a backend, as a batch region does.
pub async fn run(backend: &dyn Backend, case: &Case) -> Run {
    run_task(backend, step_task(case), tables(case)).await
}

/// Runs one step over tables on a backend, as a batch region does.
pub async fn run_task(
    backend: &dyn Backend,
    task: StepTask,
    tables: IndexMap<String, Table>,
) -> Run {
    let schemas: IndexMap<String, SchemaRef> = tables
        .iter()
        .map(|(n, t)| (n.clone(), t.schema.clone()))
        .collect();
    let schema = match backend.output_schema(&task, &schemas) {
        Ok(s) => s,
        Err(e) => return Run::Refused(e),
    };
    match backend
        .execute_batch(std::slice::from_ref(&task), tables, &["result".to_string()])
        .await
    {
        Ok(mut out) => Run::Ok(out.swap_remove("result").expect("result"), schema),
        Err(e) => Run::Failed(e),
    }
}

/// A value in the comparison's normal form.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Null,
    Float(f64),
    Text(String),
}

fn cells(col: &ArrayRef) -> Vec<Cell> {
    let n = col.len();
    if matches!(col.data_type(), DataType::Float32 | DataType::Float64) {
        let f = cast(col, &DataType::Float64).unwrap();
        let a = f.as_primitive::<arrow::datatypes::Float64Type>();
        return (0..n)
            .map(|i| {
                if a.is_null(i) {
                    Cell::Null
                } else {
                    Cell::Float(a.value(i))
                }
            })
            .collect();
    }
    let s = cast(col, &DataType::Utf8).unwrap();
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

fn rows(table: &Table) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for b in &table.batches {
        let cols: Vec<Vec<Cell>> = b.columns().iter().map(cells).collect();
        for r in 0..b.num_rows() {
            out.push(cols.iter().map(|c| c[r].clone()).collect());
        }
    }
    out
}

fn key(r: &[Cell]) -> String {
    r.iter()
        .map(|c| match c {
            Cell::Null => "0".to_string(),
            Cell::Float(x) => format!("1{x:+.9e}"),
            Cell::Text(s) => format!("2{s}"),
        })
        .collect::<Vec<_>>()
        .join("\u{1}")
}

fn close(a: &Cell, b: &Cell, tolerance: f64) -> bool {
    match (a, b) {
        (Cell::Float(x), Cell::Float(y)) => {
            x == y
                || (x.is_nan() && y.is_nan())
                || (x - y).abs() <= tolerance * x.abs().max(y.abs())
        }
        _ => a == b,
    }
}

fn first_code(e: &Error) -> String {
    e.diagnostics()
        .iter()
        .find(|d| d.is_error())
        .map(|d| format!("{}: {}", d.code, d.message))
        .unwrap_or_else(|| e.to_string())
}

/// The result of comparing the two backends on a case.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Same schema and rows.
    Same,
    /// Both refused (`output_schema`) or both failed (running) with this code.
    SameError(String),
    /// Polars refused the case with `ETL501`.
    Unsupported(String),
    /// A difference.
    Differs(String),
}

/// Runs a case on both backends and compares them.
pub async fn compare(case: &Case) -> Outcome {
    let reference = run(&DataFusionBackend, case).await;
    let polars = run(&PolarsBackend, case).await;
    compare_runs(case, reference, polars)
}

/// Compares the runs of the reference engine and Polars.
pub fn compare_runs(case: &Case, reference: Run, polars: Run) -> Outcome {
    match (reference, polars) {
        (_, Run::Refused(e)) if first_code(&e).starts_with("ETL501") => {
            Outcome::Unsupported(first_code(&e))
        }
        (Run::Refused(a), Run::Refused(b)) => {
            let (a, b) = (first_code(&a), first_code(&b));
            if a[..6] == b[..6] {
                Outcome::SameError(a[..6].to_string())
            } else {
                Outcome::Differs(format!("refused with {b}, the reference with {a}"))
            }
        }
        (Run::Failed(a), Run::Failed(b)) => {
            let (a, b) = (first_code(&a), first_code(&b));
            if a[..6] == b[..6] {
                Outcome::SameError(a[..6].to_string())
            } else {
                Outcome::Differs(format!("failed with {b}, the reference with {a}"))
            }
        }
        (Run::Ok(a, sa), Run::Ok(b, sb)) => {
            if sa != sb {
                return Outcome::Differs(format!("schema {sb:?}, the reference {sa:?}"));
            }
            if b.schema.fields().len() != sb.fields().len()
                || b.schema
                    .fields()
                    .iter()
                    .zip(sb.fields())
                    .any(|(x, y)| x.name() != y.name() || x.data_type() != y.data_type())
            {
                return Outcome::Differs(format!(
                    "result schema {:?} is not the promised {sb:?}",
                    b.schema
                ));
            }
            let (mut want, mut got) = (rows(&a), rows(&b));
            if let Some(e) = &case.expect {
                if e.rows.len() != want.len() {
                    return Outcome::Differs(format!(
                        "the reference gives {} rows, the case expects {}",
                        want.len(),
                        e.rows.len()
                    ));
                }
            }
            if !case.ordered() {
                want.sort_by_key(|r| key(r));
                got.sort_by_key(|r| key(r));
            }
            let tolerance = case.tolerance.unwrap_or(0.0);
            let equal = want.len() == got.len()
                && want.iter().zip(&got).all(|(w, g)| {
                    w.len() == g.len() && w.iter().zip(g).all(|(x, y)| close(x, y, tolerance))
                });
            if equal {
                Outcome::Same
            } else {
                Outcome::Differs(format!(
                    "rows differ\n    reference {want:?}\n    polars    {got:?}"
                ))
            }
        }
        (a, b) => Outcome::Differs(format!(
            "polars: {}\n    reference: {}",
            describe(&b),
            describe(&a)
        )),
    }
}

fn describe(r: &Run) -> String {
    match r {
        Run::Refused(e) => format!("refused ({})", first_code(e)),
        Run::Failed(e) => format!("failed ({})", first_code(e)),
        Run::Ok(t, _) => format!("{} rows", t.num_rows()),
    }
}

/// Asserts that Polars and the reference engine give the same result on a case given
/// as YAML.
pub async fn assert_same(name: &str, yaml: &str) {
    let case = Case::parse(name, yaml);
    match compare(&case).await {
        Outcome::Same => {}
        other => panic!("case {name}: {other:?}"),
    }
}

/// Asserts that Polars and the reference engine both refuse or fail a case with `code`.
pub async fn assert_same_error(name: &str, yaml: &str, code: &str) {
    let case = Case::parse(name, yaml);
    match compare(&case).await {
        Outcome::SameError(c) if c == code => {}
        other => panic!("case {name}: expected {code} on both, got {other:?}"),
    }
}
