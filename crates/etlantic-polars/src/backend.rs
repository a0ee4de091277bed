//! [`PolarsBackend`]: the `polars` batch backend.

use crate::capabilities::{self, BACKEND_NAME};
use crate::error::{self, PlResultExt};
use crate::interop::{dataframe_to_table, empty_dataframe, table_to_dataframe};
use crate::plan::compile_plan;
use crate::relation::Relation;
use arrow::datatypes::SchemaRef;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::codes;
use etlantic_core::ir::TransformPlan;
use etlantic_core::plugin::{Backend, BackendCapabilities, StepLogic, StepTask, TransformImpl};
use etlantic_core::Result;
use etlantic_datafusion::DataFusionBackend;
use indexmap::IndexMap;
use polars::prelude::{DataFrame, DataType as PlType, LazyFrame};
use serde_json::Value;
use std::collections::HashMap;

/// The batch backend on [Polars](https://pola.rs).
///
/// Runs portable DTCS plans (compiled to Polars lazy queries, see [`crate`]) and
/// registered [`TransformImpl`]s for this backend; SQL steps are refused (`ETL501`).
/// Every step is one lazy query over its inputs, handed over from Arrow through the C
/// data interface ([`crate::interop`]); its result comes back as Arrow in exactly the
/// schema [`Backend::output_schema`] promised.
///
/// The schema of a portable step is the reference engine's (DataFusion's type rules for
/// portable plans): `output_schema` asks [`DataFusionBackend`] for it, after checking
/// that this backend compiles the step.
#[derive(Clone, Copy, Debug, Default)]
pub struct PolarsBackend;

/// Schemas by port (accepting relation names too, as the reference engine does).
fn schemas_by_port(
    step: &StepTask,
    inputs: &IndexMap<String, SchemaRef>,
) -> IndexMap<String, SchemaRef> {
    let mut by_port = IndexMap::new();
    for (port, relation) in &step.inputs {
        if let Some(s) = inputs.get(port).or_else(|| inputs.get(relation)) {
            by_port.insert(port.clone(), s.clone());
        }
    }
    for (k, s) in inputs {
        if !by_port.contains_key(k) && !step.inputs.values().any(|r| r == k) {
            by_port.insert(k.clone(), s.clone());
        }
    }
    by_port
}

/// The registered implementation `name` for this backend.
fn transform_impl(name: &str) -> Result<&'static dyn TransformImpl> {
    etlantic_core::plugin::transform_impl(BACKEND_NAME, name).ok_or_else(|| {
        error::unsupported(format!(
            "the transformation implementation `{name}` (none is linked for `{BACKEND_NAME}`)"
        ))
    })
}

/// The lazy query of a portable plan's `output` over `frames` (by plan input id), and
/// the columns (with their Polars types) it produces.
pub(crate) fn plan_query(
    plan: &TransformPlan,
    parameters: &IndexMap<String, Value>,
    output: &str,
    frames: IndexMap<String, DataFrame>,
) -> Result<(LazyFrame, Vec<(String, PlType)>)> {
    let decoded = plan.decoded();
    let mut relations = HashMap::new();
    let mut frames = frames;
    for input in &decoded.inputs {
        let df = frames.swap_remove(&input.id).ok_or_else(|| {
            error::err(
                &codes::UNKNOWN_PORT,
                format!(
                    "the plan reads input `{}`, which the step does not provide (inputs: {})",
                    input.id,
                    frames.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        relations.insert(
            input.id.clone(),
            Relation::scan(df, &format!("input `{}`", input.id))?,
        );
    }
    let rel = compile_plan(decoded, parameters, relations, output)?;
    let columns = rel.columns.clone();
    Ok((rel.finish(), columns))
}

/// Runs Polars work on a thread of its own.
///
/// Polars' engine blocks in place through Tokio when it finds itself on a thread of a
/// Tokio runtime, which panics on a current-thread runtime; a plain thread has none. A
/// panic of the engine becomes an `ETL707` error instead of unwinding into the caller.
fn off_runtime<T: Send>(what: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| s.spawn(f).join()).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown cause");
        Err(error::engine(format!("{what}: Polars panicked: {why}")))
    })
}

impl PolarsBackend {
    /// Compiles a portable step over empty inputs of the given schemas: refuses what the
    /// backend does not implement, without reading data.
    fn check(&self, step: &StepTask, inputs: &IndexMap<String, SchemaRef>) -> Result<()> {
        let StepLogic::Portable {
            plan,
            parameters,
            output,
        } = &step.logic
        else {
            return Ok(());
        };
        let frames = inputs
            .iter()
            .map(|(port, s)| Ok((port.clone(), empty_dataframe(s)?)))
            .collect::<Result<IndexMap<_, _>>>()?;
        off_runtime("planning", || {
            let (mut lf, columns) = plan_query(plan, parameters, output, frames)?;
            let schema = lf.collect_schema().pl("planning the Polars query")?;
            // The compiler tracks the type of every column; Polars must agree.
            let actual: Vec<(String, PlType)> = schema
                .iter()
                .map(|(n, t)| (n.to_string(), t.clone()))
                .collect();
            if actual != columns {
                return Err(error::engine(format!(
                    "internal: the Polars query produces {actual:?}, the compiler expected {columns:?}"
                )));
            }
            Ok(())
        })
    }

    /// Runs one step over its inputs (by port).
    fn run_step(&self, task: &StepTask, inputs: IndexMap<String, Table>) -> Result<Table> {
        match &task.logic {
            StepLogic::Portable {
                plan,
                parameters,
                output,
            } => {
                let schemas: IndexMap<String, SchemaRef> = inputs
                    .iter()
                    .map(|(p, t)| (p.clone(), t.schema.clone()))
                    .collect();
                let schema = DataFusionBackend.output_schema(task, &schemas)?;
                let frames = inputs
                    .iter()
                    .map(|(port, t)| {
                        table_to_dataframe(t)
                            .map(|df| (port.clone(), df))
                            .map_err(|e| error::at(e, &format!("input `{port}`")))
                    })
                    .collect::<Result<IndexMap<_, _>>>()?;
                off_runtime("execution", || {
                    let df = plan_query(plan, parameters, output, frames)?
                        .0
                        .collect()
                        .pl("execution")?;
                    dataframe_to_table(&df, &schema)
                })
            }
            StepLogic::Sql { .. } => Err(error::unsupported("SQL steps")),
            StepLogic::Impl { name } => transform_impl(name)?.execute(inputs),
        }
    }
}

#[async_trait::async_trait]
impl Backend for PolarsBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> BackendCapabilities {
        capabilities::capabilities()
    }

    /// The reference engine's schema of the step, once this backend has compiled it
    /// (`ETL501` for what it does not implement). No data is read.
    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        let path = format!("transforms[{}]", step.id);
        let by_port = schemas_by_port(step, inputs);
        match &step.logic {
            StepLogic::Portable { .. } => {
                let schema = DataFusionBackend.output_schema(step, &by_port)?;
                self.check(step, &by_port)
                    .map_err(|e| error::at(e, &path))?;
                Ok(schema)
            }
            StepLogic::Sql { .. } => Err(error::at(error::unsupported("SQL steps"), &path)),
            StepLogic::Impl { name } => transform_impl(name)
                .and_then(|imp| imp.output_schema(&by_port))
                .map_err(|e| error::at(e, &path)),
        }
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        let mut relations = inputs;
        for task in steps {
            tracing::debug!(step = %task.id, "polars: running step");
            let inputs = task.port_inputs(&relations)?;
            let table = self
                .run_step(task, inputs)
                .map_err(|e| error::at(e, &format!("transforms[{}]", task.id)))?;
            relations.insert(task.id.clone(), table);
        }
        outputs
            .iter()
            .map(|name| {
                relations
                    .get(name)
                    .cloned()
                    .map(|t| (name.clone(), t))
                    .ok_or_else(|| {
                        error::err(
                            &codes::UNKNOWN_NODE,
                            format!("output `{name}` is neither an input of the region nor a step"),
                        )
                    })
            })
            .collect()
    }
}
