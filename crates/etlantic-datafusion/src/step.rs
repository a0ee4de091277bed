//! One transformation step: a portable DTCS plan, a SQL query or a registered
//! engine-specific implementation, turned into a data frame (or run directly).

use crate::capabilities::BACKEND_NAME;
use crate::error::{self, DfResultExt};
use crate::plan::compile_plan;
use crate::relation::Relation;
use crate::session::new_context;
use crate::table::{arrow_schema, conform, scan};
use arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::{DataFrame, SessionContext};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::codes;
use etlantic_core::ir::TransformPlan;
use etlantic_core::plugin::{StepLogic, StepTask, TransformImpl};
use etlantic_core::Result;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// A step ready to run.
pub(crate) enum Prepared {
    /// A DataFusion data frame (portable plans and SQL).
    Frame(Box<DataFrame>),
    /// A registered implementation, run on the materialised inputs.
    Impl(&'static dyn TransformImpl),
}

/// Runs the analyzer so the schema is the one execution produces.
fn analyzed(df: DataFrame) -> Result<DataFrame> {
    Relation::new(df).analyzed().map(|r| r.df)
}

/// Builds the data frame of a portable plan's `output` over `inputs` (by plan input id).
pub fn plan_dataframe(
    ctx: &SessionContext,
    plan: &TransformPlan,
    parameters: &IndexMap<String, Value>,
    output: &str,
    inputs: &IndexMap<String, Table>,
) -> Result<DataFrame> {
    let state = ctx.state();
    let decoded = plan.decoded();
    let mut relations = HashMap::new();
    for input in &decoded.inputs {
        let table = inputs.get(&input.id).ok_or_else(|| {
            error::err(
                &codes::UNKNOWN_PORT,
                format!(
                    "the plan reads input `{}`, which the step does not provide (inputs: {})",
                    input.id,
                    inputs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        relations.insert(
            input.id.clone(),
            Relation::scan(scan(&state, &input.id, table)?),
        );
    }
    let rel = compile_plan(decoded, parameters, relations, output)?;
    analyzed(rel.finish()?)
}

/// Builds the data frame of a SQL query over `inputs` (tables named after the ports), in
/// a fresh session. Only queries are allowed (no DDL, DML or statements).
pub async fn sql_dataframe(query: &str, inputs: &IndexMap<String, Table>) -> Result<DataFrame> {
    let ctx = new_context();
    for (port, table) in inputs {
        let mem = MemTable::try_new(table.schema.clone(), vec![table.batches.clone()])
            .df(&format!("input `{port}`"))?;
        ctx.register_table(port.as_str(), Arc::new(mem))
            .df(&format!("input `{port}`"))?;
    }
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let df = ctx.sql_with_options(query, options).await.df("SQL step")?;
    analyzed(df)
}

/// Prepares a step over its inputs (by port).
pub(crate) async fn prepare(task: &StepTask, inputs: &IndexMap<String, Table>) -> Result<Prepared> {
    match &task.logic {
        StepLogic::Portable {
            plan,
            parameters,
            output,
        } => {
            let ctx = new_context();
            plan_dataframe(&ctx, plan, parameters, output, inputs)
                .map(|df| Prepared::Frame(Box::new(df)))
        }
        StepLogic::Sql { query } => sql_dataframe(query, inputs)
            .await
            .map(|df| Prepared::Frame(Box::new(df))),
        StepLogic::Impl { name } => {
            let imp =
                etlantic_core::plugin::transform_impl(BACKEND_NAME, name).ok_or_else(|| {
                    error::unsupported(format!(
                        "no transformation implementation `{name}` is linked for `{BACKEND_NAME}`"
                    ))
                })?;
            Ok(Prepared::Impl(imp))
        }
    }
}

/// The schema a step produces (no data is read).
pub(crate) async fn output_schema(
    task: &StepTask,
    inputs: &IndexMap<String, SchemaRef>,
) -> Result<SchemaRef> {
    let tables: IndexMap<String, Table> = inputs
        .iter()
        .map(|(p, s)| (p.clone(), Table::empty(s.clone())))
        .collect();
    if let Some(staged) = staged(task, &tables).await {
        return staged.map(|t| t.schema);
    }
    match prepare(task, &tables).await? {
        Prepared::Frame(df) => Ok(arrow_schema(&df)),
        Prepared::Impl(imp) => imp.output_schema(inputs),
    }
}

/// Runs a step.
pub(crate) async fn execute(task: &StepTask, inputs: IndexMap<String, Table>) -> Result<Table> {
    if let Some(staged) = staged(task, &inputs).await {
        return staged;
    }
    match prepare(task, &inputs).await? {
        Prepared::Frame(df) => {
            let schema = arrow_schema(&df);
            // In partition order (a union's first input first): the same rows in the same
            // order on every run, whatever finishes first.
            let batches: Vec<_> = (*df)
                .collect_partitioned()
                .await
                .df("execution")?
                .into_iter()
                .flatten()
                .collect();
            Ok(Table::new(schema.clone(), conform(&schema, batches)?))
        }
        Prepared::Impl(imp) => imp.execute(inputs),
    }
}

/// Runs a portable plan with `process` steps in stages (see [`crate::staged`]); `None`
/// for every other step.
async fn staged(task: &StepTask, inputs: &IndexMap<String, Table>) -> Option<Result<Table>> {
    match &task.logic {
        StepLogic::Portable {
            plan,
            parameters,
            output,
        } if crate::staged::has_processor(plan) => {
            Some(crate::staged::run(plan, parameters, output, inputs).await)
        }
        _ => None,
    }
}
