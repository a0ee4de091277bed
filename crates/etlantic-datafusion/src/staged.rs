//! Portable plans with `etlantic:process` steps in batch runs.
//!
//! A custom stateful processor is not a DataFusion operator: the plan runs in stages —
//! runs of ordinary steps compiled by the plan compiler and collected, and each `process`
//! step applied to its collected input by
//! [`ProcessorOperator::run_bounded`](crate::streaming::processor::ProcessorOperator::run_bounded):
//! the whole bounded input is one micro-batch without a watermark, then every event-time
//! timer fires once (as if the watermark jumped to +∞). Processing-time timers do not
//! fire and state TTL does not apply in batch runs.

use crate::streaming::processor::ProcessorOperator;
use crate::streaming::stateless::run_steps;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Action, TransformPlan};
use etlantic_core::streaming::ExecutionMode;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// Whether a plan has a `process` step.
pub(crate) fn has_processor(plan: &TransformPlan) -> bool {
    plan.decoded()
        .steps
        .iter()
        .any(|s| matches!(s.op, Action::Process { .. }))
}

/// Runs `plan` over `inputs` (by plan input id) and returns its output `output`.
pub(crate) async fn run(
    plan: &TransformPlan,
    parameters: &IndexMap<String, Value>,
    output: &str,
    inputs: &IndexMap<String, Table>,
) -> Result<Table> {
    let decoded = plan.decoded();
    let published = decoded.outputs.get(output).ok_or_else(|| {
        Error::new(
            &codes::UNKNOWN_PORT,
            format!("the plan has no output `{output}`"),
        )
    })?;
    let mut local: HashMap<String, Table> =
        inputs.iter().map(|(k, t)| (k.clone(), t.clone())).collect();
    let steps = &decoded.steps;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let mut i = 0;
    while i < steps.len() {
        let step = &steps[i];
        if let Action::Process {
            processor,
            keys,
            time_mode,
            options,
        } = &step.op
        {
            let input = local.get(&step.target).cloned().ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_NODE,
                    format!(
                        "step `{}` reads unknown relation `{}`",
                        step.id, step.target
                    ),
                )
            })?;
            let mut op = ProcessorOperator::new(
                processor,
                keys,
                *time_mode,
                options,
                input.schema.clone(),
                None,
                ExecutionMode::Batch,
            )
            .map_err(|e| e.map_diagnostics(|d| d.at(format!("steps[{}]", step.id))))?;
            let rows = op.run_bounded(&input.batches, now_ms)?;
            let schema = crate::streaming::operators::StatefulOperator::output_schema(&op);
            local.insert(step.id.clone(), Table::new(schema, rows));
            i += 1;
            continue;
        }
        let end = steps[i..]
            .iter()
            .position(|s| matches!(s.op, Action::Process { .. }))
            .map_or(steps.len(), |p| i + p);
        let later: HashSet<&str> = steps[end..]
            .iter()
            .flat_map(|s| std::iter::once(s.target.as_str()).chain(s.op.secondary_inputs()))
            .chain(std::iter::once(published.as_str()))
            .collect();
        let outputs: Vec<String> = steps[i..end]
            .iter()
            .map(|s| s.id.clone())
            .filter(|id| later.contains(id.as_str()))
            .collect();
        run_steps(&steps[i..end], &outputs, &mut local, parameters).await?;
        i = end;
    }
    local.remove(published).ok_or_else(|| {
        Error::new(
            &codes::UNKNOWN_NODE,
            format!("output `{output}` publishes unknown relation `{published}`"),
        )
    })
}
