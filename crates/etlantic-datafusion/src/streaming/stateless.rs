//! Stateless steps of a micro-batch, run with the batch plan compiler on the batch's rows.

use crate::plan::compile_plan;
use crate::relation::Relation;
use crate::session::{new_context, new_reusable_context};
use crate::streaming::slots::InputSlot;
use crate::table::{
    arrow_schema, check_names, conform, ordinal_schema, scan, scan_provider, with_ordinals,
};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::execution::{SessionState, TaskContext};
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::{collect_partitioned, ExecutionPlan};
use datafusion::prelude::SessionContext;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Action, ActionNode, DecodedPlan, Expr, NamedExpr, PlanInput};
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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

/// Compiles `steps` into the data frame of `output`; `scan` gives the scan of each input
/// the steps read.
fn compile_with(
    steps: &[ActionNode],
    output: &str,
    params: &IndexMap<String, Value>,
    ctx: &SessionContext,
    mut scan_input: impl FnMut(&SessionState, &str) -> Result<datafusion::prelude::DataFrame>,
) -> Result<datafusion::prelude::DataFrame> {
    let plan = sub_plan(steps, output);
    let state = ctx.state();
    let mut relations = HashMap::new();
    for input in &plan.inputs {
        relations.insert(
            input.id.clone(),
            Relation::scan(scan_input(&state, &input.id)?),
        );
    }
    compile_plan(&plan, params, relations, output)?.finish()
}

fn missing(input: &str) -> Error {
    Error::new(
        &codes::PLAN_INVALID,
        format!("a streaming step reads `{input}`, which is not available"),
    )
}

fn compile(
    steps: &[ActionNode],
    output: &str,
    tables: &HashMap<String, Table>,
    params: &IndexMap<String, Value>,
) -> Result<datafusion::prelude::DataFrame> {
    compile_with(steps, output, params, &new_context(), |state, name| {
        scan(state, name, tables.get(name).ok_or_else(|| missing(name))?)
    })
}

/// Stateless steps compiled once (planning, optimization, physical planning) and run on
/// each micro-batch's rows, which [`InputSlot`]s hand to the plans when they run.
///
/// A micro-batch of a few thousand rows is processed in well under a millisecond, while
/// building a session and planning the steps again costs milliseconds: this is the
/// streaming counterpart of a prepared statement. Plans are reset before each run
/// (`reset_plan_states`: a hash join's build side, ...). Dynamic filters are off in the
/// session that plans them, as they are wired between operators at planning time and
/// would carry one run's values into the next.
pub struct PreparedSteps {
    /// Per input: its name, its schema as handed in, and its slot.
    inputs: Vec<(String, SchemaRef, Arc<InputSlot>)>,
    /// Per output: its name, its schema and its plan.
    outputs: Vec<(String, SchemaRef, Arc<dyn ExecutionPlan>)>,
    task: Arc<TaskContext>,
}

impl PreparedSteps {
    /// Plans `steps` for `outputs`, reading inputs of the schemas in `tables`.
    pub async fn prepare(
        steps: &[ActionNode],
        outputs: &[String],
        tables: &HashMap<String, Table>,
        params: &IndexMap<String, Value>,
    ) -> Result<Self> {
        let ctx = new_reusable_context();
        let mut inputs: Vec<(String, SchemaRef, Arc<InputSlot>)> = Vec::new();
        let mut planned = Vec::new();
        for out in outputs {
            let df = compile_with(steps, out, params, &ctx, |state, name| {
                let slot = match inputs.iter().find(|(n, _, _)| n == name) {
                    Some((_, _, slot)) => slot.clone(),
                    None => {
                        let table = tables.get(name).ok_or_else(|| missing(name))?;
                        check_names(&table.schema, &format!("input `{name}`"))?;
                        let slot = Arc::new(InputSlot::new(ordinal_schema(&table.schema)));
                        inputs.push((name.to_string(), table.schema.clone(), slot.clone()));
                        slot
                    }
                };
                scan_provider(state, name, slot)
            })?;
            let schema = arrow_schema(&df);
            let plan = df
                .create_physical_plan()
                .await
                .map_err(|e| Error::new(&codes::ENGINE_ERROR, e.to_string()))?;
            planned.push((out.clone(), schema, plan));
        }
        Ok(PreparedSteps {
            inputs,
            outputs: planned,
            task: ctx.task_ctx(),
        })
    }

    /// Whether the plans were made for inputs of the schemas of those in `tables`.
    pub fn fits(&self, tables: &HashMap<String, Table>) -> bool {
        self.inputs.iter().all(|(name, schema, _)| {
            tables
                .get(name)
                .is_some_and(|t| t.schema.fields() == schema.fields())
        })
    }

    /// Runs the plans over the tables in `local` and stores their results there.
    pub async fn run(&self, local: &mut HashMap<String, Table>) -> Result<()> {
        for (name, _, slot) in &self.inputs {
            let table = local.get(name).ok_or_else(|| missing(name))?;
            slot.fill(with_ordinals(name, table)?.1);
        }
        let result = self.run_plans(local).await;
        for (_, _, slot) in &self.inputs {
            slot.clear();
        }
        result
    }

    async fn run_plans(&self, local: &mut HashMap<String, Table>) -> Result<()> {
        let engine =
            |e: datafusion::error::DataFusionError| Error::new(&codes::ENGINE_ERROR, e.to_string());
        for (out, schema, plan) in &self.outputs {
            let plan = reset_plan_states(plan.clone()).map_err(engine)?;
            // Partition by partition, in partition order: a union's first input, then its
            // second. `collect` would interleave partitions as they finish, and a stateful
            // step after it (a dedup keeping the first row per key) would keep a different
            // row from run to run.
            let batches: Vec<_> = collect_partitioned(plan, self.task.clone())
                .await
                .map_err(engine)?
                .into_iter()
                .flatten()
                .collect();
            let batches = conform(schema, batches)?;
            local.insert(out.clone(), Table::new(schema.clone(), batches));
        }
        Ok(())
    }
}

/// The prepared plans of a run of stateless steps, made on first use and again when the
/// input schemas change.
#[derive(Default)]
pub struct StepsCache(Option<PreparedSteps>);

impl StepsCache {
    /// Runs `steps` for `outputs` over the tables in `local` (see [`run_steps`]).
    pub async fn run(
        &mut self,
        steps: &[ActionNode],
        outputs: &[String],
        local: &mut HashMap<String, Table>,
        params: &IndexMap<String, Value>,
    ) -> Result<()> {
        let prepared = match self.0.take() {
            Some(p) if p.fits(local) => p,
            _ => PreparedSteps::prepare(steps, outputs, local, params).await?,
        };
        let result = prepared.run(local).await;
        self.0 = Some(prepared);
        result
    }
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

/// Evaluates named expressions over a table (the input of a stateful operator), with
/// the plan in `plans` (made on first use).
pub async fn project(
    table: &Table,
    exprs: &[NamedExpr],
    plans: &mut StepsCache,
) -> Result<Vec<RecordBatch>> {
    let step = ActionNode {
        id: "__prepared".into(),
        action: "dtcs:project".into(),
        target: "__in".into(),
        op: Action::Project {
            fields: exprs.to_vec(),
        },
    };
    let mut local = HashMap::from([("__in".to_string(), table.clone())]);
    plans
        .run(
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use etlantic_core::ir::JoinType;

    fn table(ids: &[i64], names: &[&str], name_col: &str) -> Table {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(name_col, DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
            ],
        )
        .expect("a batch");
        Table::new(schema, vec![batch])
    }

    fn join_steps() -> Vec<ActionNode> {
        vec![ActionNode {
            id: "joined".into(),
            action: "dtcs:join".into(),
            target: "events".into(),
            op: Action::Join {
                right: "people".into(),
                join_type: JoinType::Inner,
                left_keys: vec!["id".into()],
                right_keys: vec!["id".into()],
                predicate: None,
                null_safe: false,
                time_range: None,
            },
        }]
    }

    fn rows(local: &HashMap<String, Table>) -> Vec<String> {
        let t = &local["joined"];
        let mut out: Vec<String> = arrow::util::pretty::pretty_format_batches(&t.batches)
            .expect("printable")
            .to_string()
            .lines()
            .map(String::from)
            .collect();
        out.sort();
        out
    }

    /// A prepared plan run on new inputs (both sides of a hash join change) gives what
    /// planning afresh gives, each time: nothing of one run leaks into the next.
    #[tokio::test]
    async fn a_prepared_plan_rerun_on_new_rows_equals_a_fresh_plan() {
        let steps = join_steps();
        let outputs = vec!["joined".to_string()];
        let params = IndexMap::new();
        let mut cache = StepsCache::default();
        let runs = [
            (
                table(&[1, 2, 3], &["a", "b", "c"], "what"),
                table(&[1, 3], &["x", "z"], "who"),
            ),
            (
                table(&[2, 4], &["d", "e"], "what"),
                table(&[2, 4, 5], &["y", "w", "v"], "who"),
            ),
            (table(&[], &[], "what"), table(&[1], &["x"], "who")),
            (
                table(&[1, 1], &["f", "g"], "what"),
                table(&[1], &["q"], "who"),
            ),
        ];
        for (events, people) in runs {
            let mut fresh = HashMap::from([
                ("events".to_string(), events.clone()),
                ("people".to_string(), people.clone()),
            ]);
            run_steps(&steps, &outputs, &mut fresh, &params)
                .await
                .expect("a fresh run");
            let mut reused = HashMap::from([
                ("events".to_string(), events),
                ("people".to_string(), people),
            ]);
            cache
                .run(&steps, &outputs, &mut reused, &params)
                .await
                .expect("a prepared run");
            assert_eq!(rows(&reused), rows(&fresh));
        }
    }

    /// Another input schema re-plans instead of running a plan made for the old one.
    #[tokio::test]
    async fn a_new_input_schema_is_planned_again() {
        let steps = join_steps();
        let outputs = vec!["joined".to_string()];
        let params = IndexMap::new();
        let mut cache = StepsCache::default();
        let mut local = HashMap::from([
            ("events".to_string(), table(&[1], &["a"], "what")),
            ("people".to_string(), table(&[1], &["x"], "who")),
        ]);
        cache
            .run(&steps, &outputs, &mut local, &params)
            .await
            .expect("first");
        local.insert("people".into(), table(&[1], &["x"], "someone"));
        cache
            .run(&steps, &outputs, &mut local, &params)
            .await
            .expect("second");
        let schema = local["joined"].schema.clone();
        assert!(schema.field_with_name("someone").is_ok(), "{schema:?}");
    }
}
