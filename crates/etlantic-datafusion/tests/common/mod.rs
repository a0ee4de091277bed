//! Helpers shared by the integration tests: tables from JSON rows and back, and running
//! plans through the backend.
#![allow(dead_code)]

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_core::ir::{Action, Expr, TransformPlan, TransformPlanBuilder};
use etlantic_core::plugin::{Backend, StepLogic, StepTask};
use etlantic_datafusion::DataFusionBackend;
use indexmap::IndexMap;
use serde_json::Value;
use std::io::Cursor;
use std::sync::Arc;

/// A schema from `(name, dtcs type)` pairs (all nullable).
pub fn schema(fields: &[(&str, &str)]) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|(n, t)| {
                Field::new(
                    *n,
                    etlantic_core::ir::types::arrow_type(t)
                        .unwrap_or_else(|| panic!("no arrow type for {t}")),
                    true,
                )
            })
            .collect::<Vec<_>>(),
    ))
}

/// A timestamp type with the given unit, UTC.
pub fn ts(unit: TimeUnit) -> DataType {
    DataType::Timestamp(unit, Some("UTC".into()))
}

/// Reads JSON lines into a table of `schema` (arrow-json).
pub fn table_from_jsonl(schema: SchemaRef, text: &str) -> Table {
    let reader = arrow::json::ReaderBuilder::new(schema.clone())
        .build(Cursor::new(text.as_bytes().to_vec()))
        .expect("json reader");
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .expect("valid json lines");
    Table::new(schema, batches)
}

/// A table of `schema` from JSON rows.
pub fn table(schema: SchemaRef, rows: &[Value]) -> Table {
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    table_from_jsonl(schema, &text)
}

/// The rows of a table as JSON objects (nulls explicit).
pub fn rows(t: &Table) -> Vec<Value> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::JsonArray>(&mut buf);
        for b in &t.batches {
            w.write(b).expect("json writer");
        }
        w.finish().expect("json writer");
    }
    if buf.is_empty() {
        return vec![];
    }
    match serde_json::from_slice(&buf).expect("json") {
        Value::Array(a) => a,
        other => panic!("not an array: {other}"),
    }
}

/// Sorts rows by their JSON text (for order-insensitive comparison).
pub fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(|r| r.to_string());
    rows
}

/// Runs a portable plan's `result` output over the inputs (by plan input id).
pub async fn run_plan(
    plan: TransformPlan,
    inputs: Vec<(&str, Table)>,
    parameters: IndexMap<String, Value>,
) -> etlantic_core::Result<Table> {
    let task = StepTask {
        id: "step".into(),
        inputs: inputs
            .iter()
            .map(|(p, _)| (p.to_string(), p.to_string()))
            .collect(),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters,
            output: "result".into(),
        },
    };
    let backend = DataFusionBackend;
    let schemas: IndexMap<String, SchemaRef> = inputs
        .iter()
        .map(|(p, t)| (p.to_string(), t.schema.clone()))
        .collect();
    let expected_schema = backend.output_schema(&task, &schemas);
    let inputs: IndexMap<String, Table> = inputs
        .into_iter()
        .map(|(p, t)| (p.to_string(), t))
        .collect();
    let mut out = backend
        .execute_batch(&[task], inputs, &["step".to_string()])
        .await?;
    let t = out.swap_remove("step").expect("output");
    // output_schema never reads data and agrees with execution.
    assert_eq!(
        expected_schema?, t.schema,
        "output_schema differs from execution"
    );
    for b in &t.batches {
        assert_eq!(b.schema(), t.schema);
    }
    Ok(t)
}

/// A plan that applies `steps` in a chain to the first input.
pub fn chain(inputs: &[(&str, &Table)], steps: Vec<Action>) -> TransformPlan {
    let mut b = TransformPlanBuilder::new("test");
    for (name, t) in inputs {
        b = b.input(name, Some(&t.schema));
    }
    if let Some((first, _)) = inputs.first() {
        b = b.from_input(first);
    }
    for s in steps {
        b = b.step(s);
    }
    b.output("result", None).build().expect("plan builds")
}

/// Runs `steps` chained on the first of `inputs`.
pub async fn run(inputs: Vec<(&str, Table)>, steps: Vec<Action>) -> etlantic_core::Result<Table> {
    let refs: Vec<(&str, &Table)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
    let plan = chain(&refs, steps);
    run_plan(plan, inputs, IndexMap::new()).await
}

/// Runs steps and returns the rows.
pub async fn run_rows(inputs: Vec<(&str, Table)>, steps: Vec<Action>) -> Vec<Value> {
    rows(&run(inputs, steps).await.unwrap_or_else(|e| panic!("{e}")))
}

/// Parses DTCS expression text.
pub fn e(text: &str) -> Expr {
    Expr::parse(text).unwrap_or_else(|err| panic!("{err}"))
}

/// `name = expr` for project / with_fields.
pub fn named(name: &str, expr: &str) -> etlantic_core::ir::NamedExpr {
    etlantic_core::ir::NamedExpr {
        name: name.into(),
        expr: e(expr),
    }
}

/// A one-row table evaluation: `with_fields out = expr` then project `out`.
pub async fn eval(input: Table, expr: &str) -> etlantic_core::Result<Vec<Value>> {
    let t = run(
        vec![("t", input)],
        vec![Action::Project {
            fields: vec![named("out", expr)],
        }],
    )
    .await?;
    Ok(rows(&t).into_iter().map(|r| r["out"].clone()).collect())
}
