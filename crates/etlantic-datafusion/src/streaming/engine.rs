//! The embedded engine under the runtime: a streaming query's transformations
//! compiled into runs of stateless steps (planned on DataFusion once, run per
//! micro-batch) and stateful operators ([`super::operators`], [`super::join`],
//! [`super::processor`]), implementing [`etlantic_runtime::engine`]'s traits.

use super::operators::OpContext;
use super::program::{
    build_transform, gather_rows, mark_inner_units, prepare_input, StatefulUnit, TransformUnit,
    Unit, UpstreamKeys,
};
use crate::capabilities::BACKEND_NAME;
use crate::expr::{compile_predicate, Scope};
use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::keys::UniqueKey;
use etlantic_core::ir::lineage::EventColumn;
use etlantic_core::ir::{Action, Expr};
use etlantic_core::plugin::{self, StepTask};
use etlantic_core::streaming::{Duration, LatePolicy, OutputMode};
use etlantic_plan::plan::PipelinePlan;
use etlantic_runtime::engine::{
    BatchTimes, DuplicateRows, LateRows, MicroBatchProgram, OperatorState, ProgramContext,
    ProgramRun, ProgramSource, RowFilter, StreamingEngine,
};
use etlantic_runtime::progress::StateOperatorProgress;
use indexmap::IndexMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The embedded streaming engine (registered with the runtime as `datafusion`).
pub struct DataFusionEngine;

impl StreamingEngine for DataFusionEngine {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn compile(&self, ctx: ProgramContext<'_>) -> Result<Box<dyn MicroBatchProgram>> {
        let plan = ctx.plan;
        let source_infos: HashMap<String, ProgramSource> = ctx
            .sources
            .iter()
            .map(|s| (s.id.clone(), s.clone()))
            .collect();
        let mut upstream: HashMap<String, Vec<String>> = ctx
            .sources
            .iter()
            .map(|s| (s.id.clone(), vec![s.id.clone()]))
            .collect();
        let mut node_schemas: HashMap<String, SchemaRef> = ctx
            .sources
            .iter()
            .map(|s| (s.id.clone(), s.schema.clone()))
            .collect();
        // The event-time columns of every node's output, through the transformations
        // (a window's bounds are event time downstream: chained stateful operators).
        let mut node_event_time: HashMap<String, Vec<EventColumn>> = source_infos
            .iter()
            .map(|(id, i)| {
                (
                    id.clone(),
                    i.event_time.iter().map(EventColumn::new).collect(),
                )
            })
            .collect();
        // The unique keys of every node's output: the sources' contracts declare them,
        // the transformations' steps keep some (a stream-stream join keeps less state
        // when a side is unique on its join keys).
        let mut node_unique: HashMap<String, Vec<UniqueKey>> = HashMap::new();
        for s in &plan.sources {
            node_unique.insert(s.id.clone(), plan.asset_contract(&s.asset)?.unique_keys());
        }
        let mut transforms = Vec::new();
        for t in &plan.transforms {
            let task = plan.step_task(&t.id)?;
            let mut schemas: HashMap<String, SchemaRef> = HashMap::new();
            let mut fed = Vec::new();
            for (port, node) in &task.inputs {
                schemas.insert(
                    port.clone(),
                    node_schemas.get(node).cloned().ok_or_else(|| {
                        Error::new(&codes::PLAN_INVALID, format!("unknown node `{node}`"))
                    })?,
                );
                fed.extend(upstream.get(node).cloned().unwrap_or_default());
            }
            let port_upstream: HashMap<String, Vec<String>> = task
                .inputs
                .iter()
                .map(|(_, n)| (n.clone(), upstream.get(n).cloned().unwrap_or_default()))
                .collect();
            let unit = if t.backend == self.name() {
                // An accepted late row or an expired key lets a stateful step emit a
                // key again.
                let accepts_late = fed.iter().any(|s| {
                    source_infos
                        .get(s)
                        .is_some_and(|i| i.late == LatePolicy::Accept)
                });
                let has_ttl = plan
                    .profile
                    .state_ttl
                    .keys()
                    .any(|k| *k == t.id || k.starts_with(&format!("{}.", t.id)));
                build_transform(
                    &task,
                    &port_upstream,
                    &node_event_time,
                    UpstreamKeys {
                        of_nodes: &node_unique,
                        stateful_keys: !accepts_late && !has_ttl,
                    },
                    &source_infos,
                    &mut schemas,
                )?
            } else {
                // Placed on another backend (an SQL region): run whole per micro-batch.
                let backend = plugin::backend(&t.backend).ok_or_else(|| {
                    Error::new(
                        &codes::NO_BACKEND,
                        format!("backend `{}` of `{}` is not linked", t.backend, t.id),
                    )
                })?;
                let location = plan
                    .regions
                    .iter()
                    .find(|r| r.steps.contains(&t.id))
                    .and_then(|r| r.location.clone());
                let backend: Arc<dyn etlantic_core::plugin::Backend> = match location {
                    Some(place) => backend.at_location(&etlantic_core::plugin::RegionLocation {
                        uri: (ctx.resolve)(&place)?,
                        root: ctx.root.to_path_buf(),
                        // Streaming regions read no table in place (the planner refuses it).
                        tables: IndexMap::new(),
                    })?,
                    None => Arc::new(BackendRef(backend)),
                };
                TransformUnit {
                    id: t.id.clone(),
                    inputs: task.inputs.clone(),
                    units: vec![],
                    output: t.id.clone(),
                    parameters: IndexMap::new(),
                    opaque: Some(task.clone()),
                    backend: Some(backend),
                    event_columns: vec![],
                    unique_keys: vec![],
                }
            };
            let out_schema = match &unit.opaque {
                Some(_) => etlantic_plan::plan::arrow_schema(&t.schema).into(),
                None => schemas
                    .get(&unit.output)
                    .cloned()
                    .ok_or_else(|| Error::new(&codes::PLAN_INVALID, "no output schema"))?,
            };
            node_schemas.insert(t.id.clone(), out_schema.clone());
            fed.sort();
            fed.dedup();
            let event_time = match &unit.opaque {
                // An opaque step keeps the event-time columns of its inputs that it
                // outputs under the same name.
                Some(_) => {
                    let mut cols: Vec<EventColumn> = Vec::new();
                    for c in task
                        .inputs
                        .values()
                        .flat_map(|n| node_event_time.get(n).cloned().unwrap_or_default())
                        .filter(|c| out_schema.field_with_name(&c.name).is_ok())
                    {
                        EventColumn::merge_into(&mut cols, c);
                    }
                    cols
                }
                None => unit.event_columns.clone(),
            };
            node_event_time.insert(t.id.clone(), event_time);
            node_unique.insert(t.id.clone(), unit.unique_keys.clone());
            upstream.insert(t.id.clone(), fed);
            transforms.push(unit);
        }

        mark_inner_units(&mut transforms);
        apply_profile_ttl(&plan.profile.state_ttl, &mut transforms)?;
        Ok(Box::new(DataFusionProgram {
            output_modes: output_modes(plan),
            transforms,
        }))
    }

    fn row_filter(&self, predicate: &Expr) -> Result<Box<dyn RowFilter>> {
        Ok(Box::new(PredicateFilter {
            predicate: predicate.clone(),
            compiled: None,
        }))
    }
}

/// A streaming query's transformations on the embedded engine.
struct DataFusionProgram {
    transforms: Vec<TransformUnit>,
    /// The output mode each transformation emits in (see [`output_modes`]).
    output_modes: HashMap<String, OutputMode>,
}

#[async_trait::async_trait]
impl MicroBatchProgram for DataFusionProgram {
    async fn run(
        &mut self,
        relations: &mut HashMap<String, Table>,
        times: &BatchTimes,
    ) -> Result<ProgramRun> {
        let ctx_base = OpContext {
            late_watermark_us: times.late_watermark_ms * 1000,
            evict_watermark_us: times.batch_watermark_ms * 1000,
            has_watermark: false,
            output_mode: OutputMode::Append,
            accept_late: false,
            processing_time_ms: times.batch_timestamp_ms,
        };
        let mut out = ProgramRun::default();
        for t in self.transforms.iter_mut() {
            let mut local: HashMap<String, Table> = HashMap::new();
            for (port, node) in &t.inputs {
                let table = relations.get(node).cloned().ok_or_else(|| {
                    Error::new(
                        &codes::PLAN_INVALID,
                        format!("`{}` reads `{node}`, which nothing produced", t.id),
                    )
                })?;
                local.insert(port.clone(), table);
            }
            if let Some(task) = &t.opaque {
                let backend: &dyn etlantic_core::plugin::Backend = match &t.backend {
                    Some(b) => b.as_ref(),
                    None => plugin::backend(BACKEND_NAME).expect("this crate registers it"),
                };
                // A backend is handed relations by name; the task maps its ports to them.
                let inputs = t
                    .inputs
                    .iter()
                    .map(|(port, node)| (node.clone(), local[port].clone()))
                    .collect();
                let mut out = backend
                    .execute_batch(
                        std::slice::from_ref(task),
                        inputs,
                        std::slice::from_ref(&task.id),
                    )
                    .await?;
                relations.insert(
                    t.id.clone(),
                    out.swap_remove(&task.id).expect("requested output"),
                );
                continue;
            }
            let mode = self.output_modes.get(&t.id).copied().unwrap_or_default();
            for unit in t.units.iter_mut() {
                match unit {
                    Unit::Stateless {
                        steps,
                        outputs,
                        prepared,
                    } => {
                        prepared
                            .run(steps, outputs, &mut local, &t.parameters)
                            .await?;
                    }
                    Unit::Stateful(s) if s.secondary.is_some() => {
                        // Two inputs: a stream-stream join (see `super::join`).
                        let ctx = OpContext {
                            has_watermark: s.watermarked,
                            output_mode: s.mode(mode),
                            ..ctx_base
                        };
                        let run = run_pair_unit(s, &local, &ctx)?;
                        out.late_count += run.late_count;
                        out.late.extend(run.late_routes);
                        out.duplicates.extend(run.duplicates);
                        out.state.push(run.progress);
                        local.insert(s.step.id.clone(), run.output);
                    }
                    Unit::Stateful(s) => {
                        let input = local.get(&s.step.target).cloned().ok_or_else(|| {
                            Error::new(
                                &codes::PLAN_INVALID,
                                format!("unknown relation `{}`", s.step.target),
                            )
                        })?;
                        let (originals, prepared) =
                            prepare_input(&input, &s.prepare, &mut s.prepared).await?;
                        // After a stream-stream join its event time may lag the
                        // watermark by the join's time range: both watermarks lag too.
                        let ctx = OpContext {
                            late_watermark_us: ctx_base
                                .late_watermark_us
                                .saturating_sub(s.watermark_lag_us),
                            evict_watermark_us: ctx_base
                                .evict_watermark_us
                                .saturating_sub(s.watermark_lag_us),
                            has_watermark: s.watermarked,
                            output_mode: s.mode(mode),
                            accept_late: s.late_policy == LatePolicy::Accept,
                            ..ctx_base
                        };
                        let t_op = Instant::now();
                        let op_out = s.op.process(&prepared, &ctx)?;
                        out.late_count += op_out.late_count;
                        // Late rows are routed as they entered the step, not as the
                        // operator's prepared input (keys, `__arg*`, `__time`).
                        let late = if s.prepare.is_empty() {
                            op_out.late
                        } else {
                            gather_rows(&originals, &op_out.late_index)?
                        };
                        if let Some(rows) = late {
                            out.late.push(LateRows {
                                policy: s.late_policy.clone(),
                                rows,
                                sources: s.sources.join(","),
                                allowed_lateness: s.allowed_lateness,
                            });
                        }
                        out.state.push(StateOperatorProgress::new(
                            s.op.name(),
                            &s.id,
                            s.op.metrics(),
                            op_out.late_count,
                            t_op.elapsed(),
                        ));
                        local.insert(
                            s.step.id.clone(),
                            Table::new(s.op.output_schema(), op_out.rows),
                        );
                    }
                }
            }
            let output = local.remove(&t.output).ok_or_else(|| {
                Error::new(
                    &codes::PLAN_INVALID,
                    format!("`{}` produced no `{}`", t.id, t.output),
                )
            })?;
            relations.insert(t.id.clone(), output);
        }
        // Operator-specific figures of the micro-batch (Spark's `customMetrics`).
        for entry in out.state.iter_mut() {
            if let Some(s) = self.stateful().find(|s| s.id == entry.operator_id) {
                entry.custom_metrics =
                    s.op.custom_metrics()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v as i64))
                        .collect();
            }
        }
        Ok(out)
    }

    fn operators(&mut self) -> Vec<&mut dyn OperatorState> {
        self.transforms
            .iter_mut()
            .flat_map(|t| t.units.iter_mut())
            .filter_map(|u| match u {
                Unit::Stateful(s) => Some(s.as_mut() as &mut dyn OperatorState),
                Unit::Stateless { .. } => None,
            })
            .collect()
    }

    fn has_state(&self) -> bool {
        self.stateful().next().is_some()
    }

    fn needs_no_data_batch(&self) -> bool {
        self.transforms.iter().any(|t| {
            let mode = self.output_modes.get(&t.id).copied().unwrap_or_default();
            t.units.iter().any(
                |u| matches!(u, Unit::Stateful(s) if s.watermarked && s.op.needs_no_data_batch(s.mode(mode))),
            )
        })
    }

    fn has_due_work(&self, watermark_ms: Option<i64>, now_ms: i64) -> bool {
        self.stateful().any(|s| {
            s.op.has_due_work(
                watermark_ms.map(|w| w.saturating_sub(s.watermark_lag_us / 1000)),
                now_ms,
            )
        })
    }

    fn close(&mut self) -> Result<()> {
        for t in self.transforms.iter_mut() {
            for u in t.units.iter_mut() {
                if let Unit::Stateful(s) = u {
                    s.op.close()?;
                }
            }
        }
        Ok(())
    }
}

impl DataFusionProgram {
    fn stateful(&self) -> impl Iterator<Item = &StatefulUnit> {
        self.transforms
            .iter()
            .flat_map(|t| t.units.iter())
            .filter_map(|u| match u {
                Unit::Stateful(s) => Some(s.as_ref()),
                Unit::Stateless { .. } => None,
            })
    }
}

impl OperatorState for StatefulUnit {
    fn id(&self) -> &str {
        &self.id
    }

    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        self.op.changelog_identity()
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        self.op.snapshot()
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        self.op.restore(state)
    }

    fn changes(&mut self) -> Result<Option<RecordBatch>> {
        self.op.changes()
    }

    fn rows_total(&self) -> u64 {
        self.op.metrics().rows_total
    }

    fn use_store(
        &mut self,
        store: Box<dyn etlantic_runtime::state_store::StateStore>,
    ) -> Result<()> {
        let id = self.id.clone();
        self.op
            .use_store(store)
            .map_err(|e| e.map_diagnostics(|d| d.at(id.clone())))
    }

    fn store(&mut self) -> Option<&mut dyn etlantic_runtime::state_store::StateStore> {
        self.op.store()
    }
}

/// What a two-input unit produced in a micro-batch.
struct PairRun {
    /// The output relation.
    pub output: Table,
    /// Late rows to route.
    pub late_routes: Vec<LateRows>,
    /// Late rows in all.
    pub late_count: u64,
    /// Rows rejected for repeating a key their side declares unique.
    pub duplicates: Vec<DuplicateRows>,
    /// The operator's progress entry.
    pub progress: StateOperatorProgress,
}

/// Runs a two-input unit (a stream-stream join) on the relations of a micro-batch.
fn run_pair_unit(
    s: &mut StatefulUnit,
    local: &HashMap<String, Table>,
    ctx: &OpContext,
) -> Result<PairRun> {
    let sec = s
        .secondary
        .as_ref()
        .ok_or_else(|| Error::new(&codes::ENGINE_ERROR, "internal: not a two-input unit"))?;
    let get = |rel: &str| {
        local
            .get(rel)
            .cloned()
            .ok_or_else(|| Error::new(&codes::PLAN_INVALID, format!("unknown relation `{rel}`")))
    };
    let left = get(&s.step.target)?;
    let right = get(&sec.relation)?;
    let started = Instant::now();
    let out = s.op.process_pair(&left.batches, &right.batches, ctx)?;
    let mut late_routes = Vec::new();
    let [late_l, late_r] = out.late;
    if let Some(l) = late_l {
        late_routes.push(LateRows {
            policy: s.late_policy.clone(),
            rows: l,
            sources: s.sources.join(","),
            allowed_lateness: Duration::ZERO,
        });
    }
    if let Some(r) = late_r {
        late_routes.push(LateRows {
            policy: sec.late_policy.clone(),
            rows: r,
            sources: sec.sources.join(","),
            allowed_lateness: Duration::ZERO,
        });
    }
    let late_count = out.late_count[0] + out.late_count[1];
    let keys = match &s.step.op {
        Action::Join {
            left_keys,
            right_keys,
            ..
        } => [left_keys.clone(), right_keys.clone()],
        _ => Default::default(),
    };
    let sources = [s.sources.join(","), sec.sources.join(",")];
    let duplicates = out
        .duplicates
        .into_iter()
        .zip(keys.into_iter().zip(sources))
        .filter_map(|(rows, (keys, sources))| {
            rows.map(|rows| DuplicateRows {
                rows,
                sources,
                keys,
            })
        })
        .collect();
    Ok(PairRun {
        output: Table::new(s.op.output_schema(), out.rows),
        late_routes,
        late_count,
        duplicates,
        progress: StateOperatorProgress::new(
            s.op.name(),
            &s.id,
            s.op.metrics(),
            late_count,
            started.elapsed(),
        ),
    })
}

/// A predicate compiled on DataFusion for the schema of the batches it sees (compiled
/// again when that changes).
struct PredicateFilter {
    predicate: Expr,
    compiled: Option<(SchemaRef, Arc<dyn PhysicalExpr>)>,
}

impl RowFilter for PredicateFilter {
    fn evaluate(&mut self, batch: &RecordBatch) -> Result<BooleanArray> {
        let engine = |e: datafusion::error::DataFusionError| {
            Error::new(
                &codes::ENGINE_ERROR,
                format!("the rows a watermark is measured on: {e}"),
            )
        };
        let schema = batch.schema();
        let physical = match &self.compiled {
            Some((s, p)) if *s == schema => p.clone(),
            _ => {
                let df = Arc::new(DFSchema::try_from(schema.as_ref().clone()).map_err(engine)?);
                let logical = compile_predicate(&self.predicate, &Scope::of(df.clone()))?;
                let p = crate::session::new_context()
                    .state()
                    .create_physical_expr(logical, &df)
                    .map_err(engine)?;
                self.compiled = Some((schema, p.clone()));
                p
            }
        };
        let mask = physical
            .evaluate(batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(engine)?;
        let Some(mask) = mask.as_boolean_opt() else {
            return Err(Error::new(
                &codes::ENGINE_ERROR,
                format!("`{}` is not a predicate", self.predicate),
            ));
        };
        // A null predicate keeps no row, as a filter would.
        Ok(if mask.null_count() > 0 {
            arrow::compute::prep_null_mask_filter(mask)
        } else {
            mask.clone()
        })
    }
}

/// Applies the profile's `state_ttl` to the stateful operators of a program: an entry
/// naming an operator id (`<transformation>.<step>`) wins over one naming its
/// transformation. An operator-id entry that names no operator is an error (`ETL221`).
fn apply_profile_ttl(
    state_ttl: &IndexMap<String, Duration>,
    transforms: &mut [TransformUnit],
) -> Result<()> {
    let mut used: Vec<&str> = Vec::new();
    for t in transforms.iter_mut() {
        for u in t.units.iter_mut() {
            let Unit::Stateful(s) = u else { continue };
            let entry = state_ttl
                .get_key_value(&s.id)
                .or_else(|| state_ttl.get_key_value(&t.id));
            if let Some((name, ttl)) = entry {
                s.op.set_state_ttl(*ttl)?;
                used.push(name.as_str());
            }
        }
    }
    for name in state_ttl.keys() {
        if !used.contains(&name.as_str())
            && transforms
                .iter()
                .any(|t| name.starts_with(&format!("{}.", t.id)) || *name == t.id)
        {
            return Err(Error::new(
                &codes::UNKNOWN_STATE_OPERATOR,
                format!(
                    "`state_ttl` names `{name}`, which is not a stateful operator of this query"
                ),
            ));
        }
    }
    Ok(())
}

/// The output mode each transformation emits in: that of the sink downstream of it,
/// through any stateless transformations in between (an aggregation feeding an SQL
/// region that feeds an update-mode sink emits updates). With several sinks downstream,
/// the last declared wins.
fn output_modes(plan: &PipelinePlan) -> HashMap<String, OutputMode> {
    let mut modes = HashMap::new();
    for sink in &plan.sinks {
        let mut stack = vec![sink.input.as_str()];
        let mut seen = std::collections::HashSet::new();
        while let Some(node) = stack.pop() {
            if !seen.insert(node) {
                continue;
            }
            if let Some(t) = plan.transforms.iter().find(|t| t.id == node) {
                modes.insert(t.id.clone(), sink.output_mode);
                stack.extend(t.inputs.values().map(String::as_str));
            }
        }
    }
    modes
}

/// A registered (static) backend used where an owned one is expected.
struct BackendRef(&'static dyn etlantic_core::plugin::Backend);

#[async_trait::async_trait]
impl etlantic_core::plugin::Backend for BackendRef {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn capabilities(&self) -> etlantic_core::plugin::BackendCapabilities {
        self.0.capabilities()
    }

    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        self.0.output_schema(step, inputs)
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        self.0.execute_batch(steps, inputs, outputs).await
    }
}
