//! The executable form of a streaming region: every transformation split into runs of
//! stateless steps (run by DataFusion on each micro-batch) and stateful steps (run by the
//! operators of [`super::operators`] against their state).

use super::accumulators::AggSpec;
use super::join::{JoinLayout, JoinSideSpec, StreamJoinOperator};
use super::operators::{
    AggregateLayout, AggregateOperator, DedupOperator, Geometry, StatefulOperator,
};
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::keys::UniqueKey;
use etlantic_core::ir::lineage::EventColumn;
use etlantic_core::ir::{Action, ActionNode, Expr, NamedExpr, WindowKind};
use etlantic_core::plugin::{StepLogic, StepTask};
use etlantic_core::streaming::{Duration, LatePolicy, OutputMode};
use etlantic_runtime::engine::ProgramSource;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// A stateful step with its operator.
pub struct StatefulUnit {
    /// Stable operator id (`<transform>.<step>`), the state directory name.
    pub id: String,
    /// The step.
    pub step: ActionNode,
    /// The operator.
    pub op: Box<dyn StatefulOperator>,
    /// Expressions to evaluate into the operator's input (aggregations): key columns,
    /// `__arg{i}` and `__time`.
    pub prepare: Vec<NamedExpr>,
    /// The late-event policy of the sources feeding it.
    pub late_policy: LatePolicy,
    /// The sources feeding it.
    pub sources: Vec<String>,
    /// Whether any of them is watermarked.
    pub watermarked: bool,
    /// How far (µs) behind the watermark the event time it compares with the watermark
    /// may be (after a stream-stream join: see `lineage::EventColumn`), plus a window's
    /// allowed lateness: it judges late rows and evicts state by the watermarks minus
    /// this.
    pub watermark_lag_us: i64,
    /// A window's allowed lateness (zero for other steps), included in
    /// `watermark_lag_us`; named in the reason of the late rows it quarantines.
    pub allowed_lateness: Duration,
    /// Whether another stateful unit reads what it emits: it then runs in append mode
    /// whatever the sink's (see [`mark_inner_units`]).
    pub inner: bool,
    /// The second input of a two-input operator (a stream-stream join), else `None`.
    pub secondary: Option<SecondaryInput>,
    /// The plan computing `prepare`, made on the first micro-batch and reused.
    pub prepared: crate::streaming::stateless::StepsCache,
    /// Rows of the changes written since the operator's last whole snapshot (operators
    /// with a changelog; see `checkpoint::whole_snapshot_due`). Starts at 0, also after
    /// a restart, which only delays the next whole snapshot.
    pub changes_since_whole: u64,
}

/// The second input of a two-input stateful unit (the right side of a stream-stream
/// join; the step's target is the first).
#[derive(Clone, Debug)]
pub struct SecondaryInput {
    /// The relation read.
    pub relation: String,
    /// The late-event policy of the sources feeding it.
    pub late_policy: LatePolicy,
    /// The sources feeding it.
    pub sources: Vec<String>,
}

/// A piece of a transformation.
pub enum Unit {
    /// Consecutive stateless DTCS steps, and the relations among their results that
    /// later units (or the transformation's output) read.
    Stateless {
        /// The steps.
        steps: Vec<ActionNode>,
        /// Results to materialise.
        outputs: Vec<String>,
        /// Their plans, made on the first micro-batch and reused.
        prepared: crate::streaming::stateless::StepsCache,
    },
    /// One stateful step.
    Stateful(Box<StatefulUnit>),
}

/// A transformation of the streaming region.
pub struct TransformUnit {
    /// Transformation id.
    pub id: String,
    /// Port → upstream node.
    pub inputs: IndexMap<String, String>,
    /// Its pieces, in order (portable plans).
    pub units: Vec<Unit>,
    /// The relation that is the transformation's output.
    pub output: String,
    /// Parameter values.
    pub parameters: IndexMap<String, Value>,
    /// A non-portable step (SQL or engine-specific implementation), or a step placed on
    /// another backend (an SQL region), run whole on each micro-batch's rows.
    pub opaque: Option<StepTask>,
    /// The backend of an opaque step placed elsewhere than this engine (bound to its
    /// location); `None` runs it on this engine.
    pub backend: Option<std::sync::Arc<dyn etlantic_core::plugin::Backend>>,
    /// The event-time columns of its output (see [`etlantic_core::ir::lineage`]);
    /// empty for an opaque step.
    pub event_columns: Vec<EventColumn>,
    /// The unique keys of its output (see [`etlantic_core::ir::keys`]); empty for an
    /// opaque step.
    pub unique_keys: Vec<UniqueKey>,
}

impl StatefulUnit {
    /// The output mode it runs in when its sink's is `sink_mode`.
    pub fn mode(&self, sink_mode: OutputMode) -> OutputMode {
        if self.inner {
            OutputMode::Append
        } else {
            sink_mode
        }
    }
}

/// Marks the inner stateful units of `transforms` (in execution order): those another
/// stateful unit comes after, later in their transformation or in a transformation that
/// reads theirs (directly or not). An inner unit runs in append mode, emitting each row
/// once, final by the watermark, so that the unit after it never sees a row change; only
/// the last runs in its sink's mode. The plan's rules assume the same
/// (`etlantic_plan::stateful_chain`).
pub fn mark_inner_units(transforms: &mut [TransformUnit]) {
    // Whether a transformation reading the i-th one (directly or not) keeps state.
    let mut followed = vec![false; transforms.len()];
    for i in (0..transforms.len()).rev() {
        let id = transforms[i].id.clone();
        followed[i] = transforms.iter().enumerate().skip(i + 1).any(|(j, u)| {
            u.inputs.values().any(|n| *n == id)
                && (followed[j] || u.units.iter().any(|x| matches!(x, Unit::Stateful(_))))
        });
    }
    for (t, followed) in transforms.iter_mut().zip(followed) {
        let stateful: Vec<usize> = t
            .units
            .iter()
            .enumerate()
            .filter(|(_, u)| matches!(u, Unit::Stateful(_)))
            .map(|(i, _)| i)
            .collect();
        for (k, &i) in stateful.iter().enumerate() {
            if let Unit::Stateful(s) = &mut t.units[i] {
                s.inner = followed || k + 1 < stateful.len();
            }
        }
    }
}

/// The unique keys upstream of a transformation (see [`etlantic_core::ir::keys`]).
#[derive(Clone, Copy)]
pub struct UpstreamKeys<'a> {
    /// The unique keys of every upstream node's output.
    pub of_nodes: &'a HashMap<String, Vec<UniqueKey>>,
    /// Whether its deduplications and aggregations emit each key once (no source feeding
    /// it accepts late rows, no state TTL applies to it): their keys are then unique
    /// keys of their output.
    pub stateful_keys: bool,
}

fn schema_of(rel: &str, schemas: &HashMap<String, SchemaRef>) -> Result<SchemaRef> {
    schemas.get(rel).cloned().ok_or_else(|| {
        Error::new(
            &codes::PLAN_INVALID,
            format!("unknown relation `{rel}` in a streaming step"),
        )
    })
}

/// The column of `input` a stateful step compares with the watermark, among the
/// event-time columns `event_cols` of its input.
fn present_watermark_column(event_cols: &[String], input: &SchemaRef) -> Option<String> {
    let present: Vec<String> = event_cols
        .iter()
        .filter(|c| input.field_with_name(c).is_ok())
        .cloned()
        .collect();
    etlantic_core::ir::lineage::watermark_column(&present).cloned()
}

/// The lag behind the watermark of the column `column` among `cols` (0 when it is not
/// an event-time column: the step then compares nothing with the watermark).
fn lag_of(cols: &[EventColumn], column: Option<&str>) -> i64 {
    column
        .and_then(|c| cols.iter().find(|x| x.name == c))
        .map_or(0, |c| c.lag_us)
}

/// The group key of a plain aggregation compared with the watermark: an event-time column
/// among the keys, a window's end first (see `lineage::watermark_column`).
fn aggregate_time_key(group_by: &[NamedExpr], event_cols: &[String]) -> Option<usize> {
    let keyed: Vec<String> = event_cols
        .iter()
        .filter(|c| {
            group_by
                .iter()
                .any(|g| matches!(&g.expr, Expr::Column(k) if k == *c))
        })
        .cloned()
        .collect();
    etlantic_core::ir::lineage::watermark_column(&keyed).and_then(|c| {
        group_by
            .iter()
            .position(|g| matches!(&g.expr, Expr::Column(k) if k == c))
    })
}

/// Builds the units of one transformation. `schemas` holds the schemas of every relation
/// visible to it (its ports), and receives the schemas of the steps; `event_time` holds
/// the event-time columns of every upstream node's output, `unique` their unique keys.
pub fn build_transform(
    task: &StepTask,
    upstream_sources: &HashMap<String, Vec<String>>,
    event_time: &HashMap<String, Vec<EventColumn>>,
    unique: UpstreamKeys<'_>,
    sources: &HashMap<String, ProgramSource>,
    schemas: &mut HashMap<String, SchemaRef>,
) -> Result<TransformUnit> {
    let inputs: IndexMap<String, String> = task.inputs.clone();
    let (plan, parameters, output) = match &task.logic {
        StepLogic::Portable {
            plan,
            parameters,
            output,
        } => (plan.clone(), parameters.clone(), output.clone()),
        _ => {
            return Ok(TransformUnit {
                id: task.id.clone(),
                inputs,
                units: vec![],
                output: task.id.clone(),
                parameters: IndexMap::new(),
                opaque: Some(task.clone()),
                backend: None,
                event_columns: vec![],
                unique_keys: vec![],
            })
        }
    };
    let decoded = plan.decoded();
    // Which sources feed which relation of the plan.
    let mut feeders: HashMap<String, Vec<String>> = HashMap::new();
    for (port, node) in &inputs {
        feeders.insert(
            port.clone(),
            upstream_sources.get(node).cloned().unwrap_or_default(),
        );
    }
    let mut units: Vec<Unit> = Vec::new();
    let mut run: Vec<ActionNode> = Vec::new();
    // Relations fed by static sources only are bounded tables in every micro-batch.
    let is_static = |fed: &[String]| {
        !fed.is_empty()
            && fed
                .iter()
                .all(|s| sources.get(s).is_some_and(|i| i.is_static))
    };
    // Event-time columns through the steps: stream-stream joins need them per side, and
    // a stateful step reads its event time from its input.
    let lineage = {
        let ports = inputs
            .iter()
            .map(|(port, node)| {
                (
                    port.clone(),
                    event_time.get(node).cloned().unwrap_or_default(),
                )
            })
            .collect();
        etlantic_core::ir::lineage::event_time_lags(&decoded.steps, ports)
    };
    // Unique keys through the steps: a stream-stream join keeps less state when a side
    // is unique on its join keys.
    let keys = {
        let ports = inputs
            .iter()
            .map(|(port, node)| {
                (
                    port.clone(),
                    unique.of_nodes.get(node).cloned().unwrap_or_default(),
                )
            })
            .collect();
        etlantic_core::ir::keys::unique_keys(&decoded.steps, ports, unique.stateful_keys)
    };
    let unique_on = |rel: &str, columns: &[String]| {
        keys.get(rel)
            .is_some_and(|k| etlantic_core::ir::keys::is_unique_on(k, columns))
    };
    let names = |cols: &[EventColumn]| cols.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    for step in &decoded.steps {
        let mut fed: Vec<String> = feeders.get(&step.target).cloned().unwrap_or_default();
        for s in step.op.secondary_inputs() {
            fed.extend(feeders.get(s).cloned().unwrap_or_default());
        }
        fed.sort();
        fed.dedup();
        feeders.insert(step.id.clone(), fed.clone());
        // A join of two streams keeps both sides in state; a join with a static side is
        // an ordinary join of each micro-batch with the static table.
        if let Action::Join {
            right,
            left_keys,
            right_keys,
            ..
        } = &step.op
        {
            let left_fed = feeders.get(&step.target).cloned().unwrap_or_default();
            let right_fed = feeders.get(right).cloned().unwrap_or_default();
            if !is_static(&left_fed) && !is_static(&right_fed) {
                let unique_on_keys = [
                    unique_on(&step.target, left_keys),
                    unique_on(right, right_keys),
                ];
                let lineage_of = |rel: &str| names(lineage.get(rel).map_or(&[][..], |c| c));
                let (left_events, right_events) = (lineage_of(&step.target), lineage_of(right));
                // Keep in state only the columns the join and what follows it read.
                let pruned = prune_join_inputs(
                    step,
                    decoded,
                    schemas,
                    [&left_events, &right_events],
                    [
                        (&left_fed, unique_on_keys[0]),
                        (&right_fed, unique_on_keys[1]),
                    ]
                    .map(|(fed, unique)| {
                        unique
                            || fed.iter().any(|s| {
                                sources.get(s).is_some_and(|i| {
                                    !matches!(i.late, LatePolicy::Drop | LatePolicy::Accept)
                                })
                            })
                    }),
                );
                let step = match pruned {
                    Some((projections, joined)) => {
                        for p in projections {
                            let schema =
                                crate::streaming::stateless::step_schema(&p, schemas, &parameters)?;
                            schemas.insert(p.id.clone(), schema);
                            run.push(p);
                        }
                        joined
                    }
                    None => step.clone(),
                };
                if !run.is_empty() {
                    units.push(Unit::Stateless {
                        steps: std::mem::take(&mut run),
                        outputs: vec![],
                        prepared: Default::default(),
                    });
                }
                let Action::Join {
                    right: pruned_right,
                    ..
                } = &step.op
                else {
                    unreachable!("a join stays a join");
                };
                let unit = join_unit(
                    format!("{}.{}", task.id, step.id),
                    &step,
                    JoinInput {
                        relation: &step.target,
                        sources: left_fed,
                        event_columns: left_events,
                        unique_on_keys: unique_on_keys[0],
                    },
                    JoinInput {
                        relation: pruned_right,
                        sources: right_fed,
                        event_columns: right_events,
                        unique_on_keys: unique_on_keys[1],
                    },
                    schemas,
                    &parameters,
                    sources,
                )?;
                schemas.insert(step.id.clone(), unit.op.output_schema());
                units.push(Unit::Stateful(Box::new(unit)));
                continue;
            }
        }
        if !step.op.is_stateful() || is_static(&fed) {
            let schema = crate::streaming::stateless::step_schema(step, schemas, &parameters)?;
            schemas.insert(step.id.clone(), schema);
            run.push(step.clone());
            continue;
        }
        if !run.is_empty() {
            units.push(Unit::Stateless {
                steps: std::mem::take(&mut run),
                outputs: vec![],
                prepared: Default::default(),
            });
        }
        let input = schema_of(&step.target, schemas)?;
        let infos: Vec<&ProgramSource> = fed.iter().filter_map(|s| sources.get(s)).collect();
        let watermarked = infos.iter().any(|i| i.event_time.is_some());
        let late_policy = infos.first().map(|i| i.late.clone()).unwrap_or_default();
        let lagged: &[EventColumn] = lineage.get(&step.target).map_or(&[][..], |c| c);
        let event_cols: Vec<String> = names(lagged);
        // After a stream-stream join, the event time the step compares with the watermark
        // may lag it (see `lineage::EventColumn`).
        let compared = match &step.op {
            Action::WindowAggregate { window, .. } => Some(window.time_column.clone()),
            Action::Aggregate { group_by, .. } => aggregate_time_key(group_by, &event_cols)
                .and_then(|k| match &group_by[k].expr {
                    Expr::Column(c) => Some(c.clone()),
                    _ => None,
                }),
            _ => present_watermark_column(&event_cols, &input),
        };
        let mut watermark_lag_us = lag_of(lagged, compared.as_deref());
        let mut allowed_lateness = Duration::ZERO;
        // A window with allowed lateness judges rows and closes windows against the
        // watermark minus the lateness: a row is late only when its window ended more
        // than that before the watermark, and the window's state (and, in append mode,
        // its one output row) waits as long.
        if let Action::WindowAggregate { window, .. } = &step.op {
            allowed_lateness = window.allowed_lateness;
            watermark_lag_us = watermark_lag_us.saturating_add(window.allowed_lateness.as_micros());
        }
        let (op, prepare): (Box<dyn StatefulOperator>, Vec<NamedExpr>) = match &step.op {
            Action::Aggregate {
                group_by,
                aggregates,
            }
            | Action::WindowAggregate {
                group_by,
                aggregates,
                ..
            } => {
                let window = match &step.op {
                    Action::WindowAggregate { window, .. } => Some(window.clone()),
                    _ => None,
                };
                let mut prepare: Vec<NamedExpr> = group_by.clone();
                let bound = |e: &Expr| {
                    e.bind_parameters(&parameters)
                        .map_err(|m| Error::new(&codes::UNKNOWN_PARAMETER, m))
                };
                for p in prepare.iter_mut() {
                    p.expr = bound(&p.expr)?;
                }
                let mut specs = Vec::new();
                for (i, a) in aggregates.iter().enumerate() {
                    let input_type = match &a.arg {
                        Some(e) => {
                            let e = bound(e)?;
                            let t = crate::streaming::stateless::expr_type(&e, &input)?;
                            prepare.push(NamedExpr {
                                name: format!("__arg{i}"),
                                expr: e,
                            });
                            Some(t)
                        }
                        None => None,
                    };
                    specs.push(AggSpec {
                        name: a.name.clone(),
                        func: a.func,
                        input_type,
                    });
                }
                let key_fields: Vec<Field> = group_by
                    .iter()
                    .map(|g| {
                        let t = crate::streaming::stateless::expr_type(&bound(&g.expr)?, &input)?;
                        Ok(Field::new(&g.name, t, true))
                    })
                    .collect::<Result<_>>()?;
                let window_layout = match &window {
                    Some(w) => {
                        let t = input
                            .field_with_name(&w.time_column)
                            .map_err(|_| {
                                Error::new(
                                    &codes::UNKNOWN_COLUMN,
                                    format!(
                                        "window column `{}` is not in the input",
                                        w.time_column
                                    ),
                                )
                            })?
                            .data_type()
                            .clone();
                        if !matches!(t, DataType::Timestamp(..)) {
                            return Err(Error::new(
                                &codes::BAD_WATERMARK,
                                format!(
                                    "window column `{}` is {t}, not a timestamp",
                                    w.time_column
                                ),
                            ));
                        }
                        prepare.push(NamedExpr {
                            name: "__time".into(),
                            expr: Expr::col(&w.time_column),
                        });
                        let g = match w.kind {
                            WindowKind::Tumbling { size } => Geometry::Tumbling(size.as_micros()),
                            WindowKind::Sliding { size, slide } => {
                                Geometry::Sliding(size.as_micros(), slide.as_micros())
                            }
                            WindowKind::Session { gap } => Geometry::Session(gap.as_micros()),
                        };
                        Some((g, t))
                    }
                    None => None,
                };
                // The key compared with the watermark: an event-time column among the
                // keys, a window's end first (see `lineage::watermark_column`).
                let event_time_key = if window_layout.is_none() {
                    aggregate_time_key(group_by, &event_cols)
                } else {
                    None
                };
                let layout = AggregateLayout {
                    keys: key_fields,
                    aggregates: specs,
                    window: window_layout,
                    event_time_key,
                };
                (Box::new(AggregateOperator::new(layout)?), prepare)
            }
            Action::Deduplicate { keys, .. } | Action::Distinct { fields: Some(keys) } => {
                let time = present_watermark_column(&event_cols, &input);
                (
                    Box::new(DedupOperator::new(input.clone(), keys.clone(), time, None)?),
                    vec![],
                )
            }
            Action::Distinct { fields: None } => (
                Box::new(DedupOperator::new(input.clone(), vec![], None, None)?),
                vec![],
            ),
            Action::DeduplicateWithinWatermark { keys } => {
                let time = present_watermark_column(&event_cols, &input);
                let delay = infos.iter().find_map(|i| i.delay_us).unwrap_or(0);
                (
                    Box::new(DedupOperator::new(
                        input.clone(),
                        keys.clone(),
                        time,
                        Some(delay),
                    )?),
                    vec![],
                )
            }
            Action::Process {
                processor,
                keys,
                time_mode,
                options,
            } => {
                let time = present_watermark_column(&event_cols, &input);
                (
                    Box::new(super::processor::ProcessorOperator::new(
                        processor,
                        keys,
                        *time_mode,
                        options,
                        input.clone(),
                        time,
                        etlantic_core::streaming::ExecutionMode::Streaming,
                    )?),
                    vec![],
                )
            }
            other => {
                return Err(Error::new(
                    &codes::UNSUPPORTED_STREAMING_OP,
                    format!("{} is not a streaming operator", other.id()),
                ))
            }
        };
        schemas.insert(step.id.clone(), op.output_schema());
        units.push(Unit::Stateful(Box::new(StatefulUnit {
            id: format!("{}.{}", task.id, step.id),
            step: step.clone(),
            op,
            prepare,
            late_policy,
            sources: fed,
            watermarked,
            watermark_lag_us,
            allowed_lateness,
            inner: false,
            secondary: None,
            prepared: Default::default(),
            changes_since_whole: 0,
        })));
    }
    if !run.is_empty() {
        units.push(Unit::Stateless {
            steps: run,
            outputs: vec![],
            prepared: Default::default(),
        });
    }
    let output = decoded.outputs.get(&output).cloned().ok_or_else(|| {
        Error::new(
            &codes::PLAN_INVALID,
            format!("the plan of `{}` has no output `{output}`", task.id),
        )
    })?;
    // Which results of each stateless run are read later.
    let reads_after = |from: usize| -> Vec<String> {
        let mut r = vec![output.clone()];
        for u in &units[from..] {
            let steps: Vec<&ActionNode> = match u {
                Unit::Stateless { steps, .. } => steps.iter().collect(),
                Unit::Stateful(s) => vec![&s.step],
            };
            for s in steps {
                r.push(s.target.clone());
                r.extend(s.op.secondary_inputs().into_iter().map(String::from));
            }
        }
        r
    };
    let needed: Vec<Vec<String>> = (0..units.len()).map(|i| reads_after(i + 1)).collect();
    for (u, later) in units.iter_mut().zip(needed) {
        if let Unit::Stateless { steps, outputs, .. } = u {
            *outputs = steps
                .iter()
                .map(|s| s.id.clone())
                .filter(|id| later.contains(id))
                .collect();
        }
    }
    Ok(TransformUnit {
        id: task.id.clone(),
        inputs,
        units,
        event_columns: lineage.get(&output).cloned().unwrap_or_default(),
        unique_keys: keys.get(&output).cloned().unwrap_or_default(),
        output,
        parameters,
        opaque: None,
        backend: None,
    })
}

/// Column pruning below a stream-stream join: a join keeps both inputs in state, so
/// when the one step reading its output is a projection (`select`), each input is first
/// projected to the columns that projection reads plus what the join itself needs (keys,
/// predicate, time range, event time). Returns the projections to run first and the join
/// reading them, or `None` when nothing can be pruned. A side stays whole when rows of it
/// may leave the join as they entered it (`stays_whole`): its late rows are routed
/// somewhere (quarantine, side output), or it is unique on the join keys and a repeated
/// key's row is quarantined (`ETL704`).
fn prune_join_inputs(
    step: &ActionNode,
    plan: &etlantic_core::ir::DecodedPlan,
    schemas: &HashMap<String, SchemaRef>,
    event_columns: [&Vec<String>; 2],
    stays_whole: [bool; 2],
) -> Option<(Vec<ActionNode>, ActionNode)> {
    let Action::Join {
        right,
        left_keys,
        right_keys,
        predicate,
        time_range,
        ..
    } = &step.op
    else {
        return None;
    };
    if stays_whole.iter().all(|w| *w) || plan.outputs.values().any(|o| o == &step.id) {
        return None;
    }
    let readers: Vec<&ActionNode> = plan
        .steps
        .iter()
        .filter(|s| s.target == step.id || s.op.secondary_inputs().contains(&step.id.as_str()))
        .collect();
    let [reader] = readers.as_slice() else {
        return None;
    };
    let Action::Project { fields } = &reader.op else {
        return None;
    };
    if reader.target != step.id {
        return None;
    }
    let read: Vec<String> = fields.iter().flat_map(|f| f.expr.columns()).collect();
    let inputs = [&step.target, right];
    let [left_schema, right_schema] = inputs.map(|r| schemas.get(r.as_str()).cloned());
    let (left_schema, right_schema) = (left_schema?, right_schema?);
    let names =
        |s: &SchemaRef| -> Vec<String> { s.fields().iter().map(|f| f.name().clone()).collect() };
    let (left_names, right_names) = (names(&left_schema), names(&right_schema));
    // A name on both sides that is not a merged key pair: the output naming is subtle,
    // leave it alone.
    let merged = crate::actions::join::merged_keys(left_keys, right_keys);
    if left_names
        .iter()
        .any(|n| right_names.contains(n) && !merged.contains(&n))
    {
        return None;
    }
    let mut needed: Vec<String> = read;
    needed.extend(predicate.iter().flat_map(|p| p.columns()));
    if let Some(r) = time_range {
        needed.push(r.left.clone());
        needed.push(r.right.clone());
    }
    let keep = |all: &[String], keys: &[String], events: &[String], whole: bool| -> Vec<String> {
        all.iter()
            .filter(|c| whole || needed.contains(c) || keys.contains(c) || events.contains(c))
            .cloned()
            .collect()
    };
    let left_keep = keep(&left_names, left_keys, event_columns[0], stays_whole[0]);
    let right_keep = keep(&right_names, right_keys, event_columns[1], stays_whole[1]);
    if left_keep.len() == left_names.len() && right_keep.len() == right_names.len() {
        return None;
    }
    let project = |side: &str, target: &str, cols: &[String]| ActionNode {
        id: format!("{}.__{side}_columns", step.id),
        action: "dtcs:project".into(),
        target: target.to_string(),
        op: Action::Project {
            fields: cols.iter().map(|c| NamedExpr::column(c)).collect(),
        },
    };
    let l = project("left", &step.target, &left_keep);
    let r = project("right", right, &right_keep);
    let mut joined = step.clone();
    joined.target = l.id.clone();
    if let Action::Join { right, .. } = &mut joined.op {
        *right = r.id.clone();
    }
    Some((vec![l, r], joined))
}

/// Evaluates the preparation of a stateful unit into the operator's input batches.
///
/// Returns `(originals, prepared)`: `prepared[i]` holds the prepared rows of
/// `originals[i]`, row for row, so that rows the operator singles out (late rows) can be
/// routed as they were before the preparation.
pub async fn prepare_input(
    table: &Table,
    prepare: &[NamedExpr],
    plans: &mut crate::streaming::stateless::StepsCache,
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
    if prepare.is_empty() {
        return Ok((table.batches.clone(), table.batches.clone()));
    }
    let engine = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, e.to_string());
    // Plain columns are taken directly; anything else goes through DataFusion.
    let all_columns = prepare
        .iter()
        .all(|p| matches!(&p.expr, Expr::Column(c) if table.schema.field_with_name(c).is_ok()));
    if !all_columns {
        // One batch in, one batch out: the projection keeps the row order.
        let original = table.concat().map_err(engine)?;
        if original.num_rows() == 0 {
            return Ok((vec![], vec![]));
        }
        let single = Table::new(table.schema.clone(), vec![original.clone()]);
        let projected = crate::streaming::stateless::project(&single, prepare, plans).await?;
        let Some(first) = projected.first() else {
            return Ok((vec![], vec![]));
        };
        let prepared =
            arrow::compute::concat_batches(&first.schema(), &projected).map_err(engine)?;
        return Ok((vec![original], vec![prepared]));
    }
    let fields: Vec<Field> = prepare
        .iter()
        .map(|p| match &p.expr {
            Expr::Column(c) => table
                .schema
                .field_with_name(c)
                .expect("checked")
                .clone()
                .with_name(&p.name),
            _ => unreachable!("all columns"),
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let prepared = table
        .batches
        .iter()
        .map(|b| {
            let cols: Vec<ArrayRef> = prepare
                .iter()
                .map(|p| match &p.expr {
                    Expr::Column(c) => b.column_by_name(c).cloned().expect("checked"),
                    _ => unreachable!(),
                })
                .collect();
            RecordBatch::try_new(schema.clone(), cols).map_err(engine)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((table.batches.clone(), prepared))
}

/// The rows of `batches` at `index` ((batch, rows) pairs), as one batch.
pub fn gather_rows(
    batches: &[RecordBatch],
    index: &[(usize, Vec<u32>)],
) -> Result<Option<RecordBatch>> {
    let engine = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, e.to_string());
    let mut parts = Vec::with_capacity(index.len());
    for (b, rows) in index {
        let batch = batches.get(*b).ok_or_else(|| {
            Error::new(
                &codes::ENGINE_ERROR,
                format!("late rows refer to input batch {b} of {}", batches.len()),
            )
        })?;
        let idx = arrow::array::UInt32Array::from(rows.clone());
        let cols = batch
            .columns()
            .iter()
            .map(|c| arrow::compute::take(c, &idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(engine)?;
        parts.push(RecordBatch::try_new(batch.schema(), cols).map_err(engine)?);
    }
    match parts.first() {
        None => Ok(None),
        Some(first) => Ok(Some(
            arrow::compute::concat_batches(&first.schema(), &parts).map_err(engine)?,
        )),
    }
}

/// One input of a join step as the program builder sees it.
pub struct JoinInput<'a> {
    /// The relation read.
    pub relation: &'a str,
    /// The sources feeding it.
    pub sources: Vec<String>,
    /// Event-time columns it carries (see [`etlantic_core::ir::lineage`]).
    pub event_columns: Vec<String>,
    /// Whether its rows are unique on the join keys (see [`etlantic_core::ir::keys`]).
    pub unique_on_keys: bool,
}

/// Builds the stateful unit of a stream-stream join step.
pub fn join_unit(
    unit_id: String,
    step: &ActionNode,
    left: JoinInput<'_>,
    right: JoinInput<'_>,
    schemas: &HashMap<String, SchemaRef>,
    parameters: &IndexMap<String, Value>,
    sources: &HashMap<String, ProgramSource>,
) -> Result<StatefulUnit> {
    let Action::Join {
        join_type,
        left_keys,
        right_keys,
        predicate,
        null_safe,
        time_range,
        ..
    } = &step.op
    else {
        return Err(Error::new(&codes::ENGINE_ERROR, "internal: not a join"));
    };
    let schema_of = |rel: &str| {
        schemas.get(rel).cloned().ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!("unknown relation `{rel}` in a streaming join"),
            )
        })
    };
    let output_schema = super::stateless::step_schema(step, schemas, parameters)?;
    let side = |input: &JoinInput<'_>, keys: &Vec<String>| -> Result<(JoinSideSpec, LatePolicy)> {
        let schema = schema_of(input.relation)?;
        let infos: Vec<&ProgramSource> = input
            .sources
            .iter()
            .filter_map(|s| sources.get(s))
            .collect();
        let watermarked: Vec<&String> =
            infos.iter().filter_map(|i| i.event_time.as_ref()).collect();
        let present: Vec<String> = input
            .event_columns
            .iter()
            .filter(|c| schema.field_with_name(c).is_ok())
            .cloned()
            .collect();
        let watermark_column = etlantic_core::ir::lineage::watermark_column(&present)
            .filter(|_| !watermarked.is_empty())
            .cloned();
        let late = infos.first().map(|i| i.late.clone()).unwrap_or_default();
        Ok((
            JoinSideSpec {
                schema,
                keys: keys.clone(),
                watermark_column,
                accept_late: late == LatePolicy::Accept,
                unique: input.unique_on_keys,
            },
            late,
        ))
    };
    let (lspec, llate) = side(&left, left_keys)?;
    let (rspec, rlate) = side(&right, right_keys)?;
    let watermarked = lspec.watermark_column.is_some() || rspec.watermark_column.is_some();
    let predicate = predicate
        .as_ref()
        .map(|p| {
            p.bind_parameters(parameters)
                .map_err(|m| Error::new(&codes::UNKNOWN_PARAMETER, m))
        })
        .transpose()?;
    let op = StreamJoinOperator::new(JoinLayout {
        join_type: *join_type,
        left: lspec,
        right: rspec,
        time_range: time_range.clone(),
        predicate,
        null_safe: *null_safe,
        output_schema,
    })?;
    let any_source_watermarked = left
        .sources
        .iter()
        .chain(&right.sources)
        .any(|s| sources.get(s).is_some_and(|i| i.event_time.is_some()));
    Ok(StatefulUnit {
        id: unit_id,
        step: step.clone(),
        op: Box::new(op),
        prepare: vec![],
        late_policy: llate,
        sources: left.sources.clone(),
        watermarked: watermarked || any_source_watermarked,
        // The plan refuses a stream-stream join of a join's output, the one input whose
        // event time would lag the watermark.
        watermark_lag_us: 0,
        allowed_lateness: Duration::ZERO,
        inner: false,
        prepared: Default::default(),
        changes_since_whole: 0,
        secondary: Some(SecondaryInput {
            relation: right.relation.to_string(),
            late_policy: rlate,
            sources: right.sources.clone(),
        }),
    })
}
