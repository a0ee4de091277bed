//! Stateless steps of a micro-batch, run with the batch plan compiler on the batch's rows.

use crate::plan::compile_plan;
use crate::relation::Relation;
use crate::session::new_context;
use crate::table::{arrow_schema, conform, scan};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Action, ActionNode, DecodedPlan, Expr, NamedExpr, PlanInput};
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A plan made of `steps` whose inputs are the relations they read but do not produce.
fn sub_plan(steps: &[ActionNode], output: &str) -> DecodedPlan {
    let produced: HashSet<&str> = steps.iter().map(|s| s.id.as_str()).collect();
    let mut inputs: Vec<PlanInput> = Vec::new();
    for s in steps {
        for r in std::iter::once(s.target.as_str()).chain(s.op.secondary_inputs()) {
            if !produced.contains(r) && !inputs.iter().any(|i| i.id == r) {
                inputs.push(PlanInput {
                    id: r.to_string(),
                    fields: vec![],
                    unbounded: true,
                });
            }
        }
    }
    DecodedPlan {
        inputs,
        steps: steps.to_vec(),
        outputs: IndexMap::from([(output.to_string(), output.to_string())]),
        output_fields: IndexMap::new(),
    }
}

fn compile(
    steps: &[ActionNode],
    output: &str,
    tables: &HashMap<String, Table>,
    params: &IndexMap<String, Value>,
) -> Result<datafusion::prelude::DataFrame> {
    let plan = sub_plan(steps, output);
    let ctx = new_context();
    let state = ctx.state();
    let mut relations = HashMap::new();
    for input in &plan.inputs {
        let table = tables.get(&input.id).ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!(
                    "a streaming step reads `{}`, which is not available",
                    input.id
                ),
            )
        })?;
        relations.insert(
            input.id.clone(),
            Relation::scan(scan(&state, &input.id, table)?),
        );
    }
    compile_plan(&plan, params, relations, output)?.finish()
}

/// Runs `steps` over the tables in `local` and stores the relations named in `outputs`.
pub async fn run_steps(
    steps: &[ActionNode],
    outputs: &[String],
    local: &mut HashMap<String, Table>,
    params: &IndexMap<String, Value>,
) -> Result<()> {
    for out in outputs {
        let df = compile(steps, out, local, params)?;
        let schema = arrow_schema(&df);
        let batches = df
            .collect()
            .await
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, e.to_string()))?;
        let batches = conform(&schema, batches)?;
        local.insert(out.clone(), Table::new(schema, batches));
    }
    Ok(())
}

/// The schema of one step's result, given the schemas of the relations it reads.
pub fn step_schema(
    step: &ActionNode,
    schemas: &HashMap<String, SchemaRef>,
    params: &IndexMap<String, Value>,
) -> Result<SchemaRef> {
    let tables: HashMap<String, Table> = schemas
        .iter()
        .map(|(k, s)| (k.clone(), Table::empty(s.clone())))
        .collect();
    let df = compile(std::slice::from_ref(step), &step.id, &tables, params)?;
    Ok(arrow_schema(&df))
}

/// The type of an expression over rows of `schema`.
pub fn expr_type(expr: &Expr, schema: &SchemaRef) -> Result<DataType> {
    let step = ActionNode {
        id: "__probe".into(),
        action: "dtcs:project".into(),
        target: "__in".into(),
        op: Action::Project {
            fields: vec![NamedExpr {
                name: "__x".into(),
                expr: expr.clone(),
            }],
        },
    };
    let schemas = HashMap::from([("__in".to_string(), schema.clone())]);
    let s = step_schema(&step, &schemas, &IndexMap::new())?;
    Ok(s.field(0).data_type().clone())
}

/// Evaluates named expressions over a table (the input of a stateful operator).
pub async fn project(table: &Table, exprs: &[NamedExpr]) -> Result<Vec<RecordBatch>> {
    let step = ActionNode {
        id: "__prepared".into(),
        action: "dtcs:project".into(),
        target: "__in".into(),
        op: Action::Project {
            fields: exprs.to_vec(),
        },
    };
    let mut local = HashMap::from([("__in".to_string(), table.clone())]);
    run_steps(
        std::slice::from_ref(&step),
        &["__prepared".to_string()],
        &mut local,
        &IndexMap::new(),
    )
    .await?;
    Ok(local
        .remove("__prepared")
        .map(|t| t.batches)
        .unwrap_or_default())
}
