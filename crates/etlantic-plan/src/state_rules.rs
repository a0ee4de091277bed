//! Streaming rules for custom stateful processors and state TTL (run with
//! [`crate::streaming_rules`] in the streaming phase):
//!
//! - `ETL409` a `process` step cannot feed a sink in complete mode (Spark's
//!   `transformWithState` supports append and update);
//! - `ETL420` a `process` step with `time_mode: event_time` needs a watermarked input;
//! - `ETL221` a `state_ttl` entry names a transformation (or `<transformation>.<step>`
//!   operator) that keeps no streaming state;
//! - `ETL421` a `state_ttl` entry covers an aggregation that emits in append mode (it
//!   feeds a sink in append mode, or another stateful step)
//!   (the watermark bounds that state; expiring it would drop unemitted results).

use crate::project::Project;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics};
use etlantic_core::ir::{Action, ActionNode, TransformPlan};
use etlantic_core::streaming::{OutputMode, TimeMode};
use std::collections::HashMap;
use std::sync::Arc;

/// Transformations and sources a node reads, transitively.
fn upstream(
    project: &Project,
    node: &str,
    transforms: &mut Vec<String>,
    sources: &mut Vec<String>,
) {
    if project.pipeline.source(node).is_some() {
        if !sources.iter().any(|s| s == node) {
            sources.push(node.to_string());
        }
        return;
    }
    if let Some(t) = project.pipeline.transform(node) {
        for r in t.inputs.values() {
            upstream(project, r.from(), transforms, sources);
        }
        if !transforms.iter().any(|x| x == node) {
            transforms.push(node.to_string());
        }
    }
}

/// Whether a step keeps streaming state (joins included: a stream-stream join does).
fn keeps_state(step: &ActionNode) -> bool {
    step.op.is_stateful() || matches!(step.op, Action::Join { .. })
}

/// The steps of `transform` a `state_ttl` entry covers (`None`: the entry names no
/// stateful operator).
fn ttl_targets<'a>(
    op: &str,
    plans: &'a HashMap<String, Arc<TransformPlan>>,
) -> Option<Vec<&'a ActionNode>> {
    let (transform, step) = match op.split_once('.') {
        Some((t, s)) => (t, Some(s)),
        None => (op, None),
    };
    let plan = plans.get(transform)?;
    let steps: Vec<&ActionNode> = plan
        .decoded()
        .steps
        .iter()
        .filter(|s| keeps_state(s) && step.is_none_or(|id| s.id == id))
        .collect();
    (!steps.is_empty()).then_some(steps)
}

/// Checks every sink's query; returns the diagnostics found.
pub fn check(project: &Project, plans: &HashMap<String, Arc<TransformPlan>>) -> Diagnostics {
    let mut d = Diagnostics::new();
    let file = project.pipeline_file.clone();
    let profile_file = project.profile_file.clone().unwrap_or_default();
    for sink in &project.pipeline.sinks {
        let mode = sink.output_mode.unwrap_or_default();
        let (mut transforms, mut sources) = (Vec::new(), Vec::new());
        upstream(project, &sink.input, &mut transforms, &mut sources);
        let watermarked = sources
            .iter()
            .filter_map(|s| project.pipeline.source(s))
            .any(|s| s.watermark.is_some() && s.event_time.is_some());
        for t in &transforms {
            let Some(plan) = plans.get(t) else { continue };
            let inner = crate::stateful_chain::inner_steps(project, plans, t);
            for step in &plan.decoded().steps {
                // An inner stateful step runs in append mode (see `stateful_chain`).
                let mode = if inner.contains(&step.id) {
                    OutputMode::Append
                } else {
                    mode
                };
                let Action::Process {
                    processor,
                    time_mode,
                    ..
                } = &step.op
                else {
                    continue;
                };
                let path = format!("transforms[{t}].steps[{}]", step.id);
                if mode == OutputMode::Complete {
                    d.push(
                        Diagnostic::new(
                            &codes::UPDATE_MODE_UNSUPPORTED,
                            format!(
                                "processor `{processor}` in `{t}` cannot feed `{}` in complete mode",
                                sink.id
                            ),
                        )
                        .at(path.clone())
                        .in_file(file.clone())
                        .help("A `process` step emits rows in append or update mode."),
                    );
                }
                if *time_mode == TimeMode::EventTime && !watermarked {
                    d.push(
                        Diagnostic::new(
                            &codes::PROCESSOR_NEEDS_WATERMARK,
                            format!(
                                "processor `{processor}` in `{t}` uses event-time timers, but no input of `{}` has a watermark",
                                sink.id
                            ),
                        )
                        .at(path)
                        .in_file(file.clone()),
                    );
                }
            }
        }
        for op in project.pipeline_ttl_entries() {
            let transform = op.split_once('.').map_or(op, |(t, _)| t);
            if !transforms.iter().any(|t| t == transform) {
                continue;
            }
            let Some(steps) = ttl_targets(op, plans) else {
                continue;
            };
            let inner = crate::stateful_chain::inner_steps(project, plans, transform);
            let appends = |id: &str| mode == OutputMode::Append || inner.contains(id);
            if let Some(agg) = steps
                .iter()
                .find(|s| s.op.is_aggregation() && appends(&s.id))
            {
                d.push(
                    Diagnostic::new(
                        &codes::STATE_TTL_DROPS_RESULTS,
                        format!(
                            "`state_ttl` covers the aggregation `{}` of `{transform}`, which emits its rows in append mode (it feeds `{}`{})",
                            agg.id, sink.id,
                            if mode == OutputMode::Append { "" } else { " through another stateful step" }
                        ),
                    )
                    .at(format!("state_ttl.{op}"))
                    .in_file(profile_file.clone()),
                );
            }
        }
    }
    for op in project.pipeline_ttl_entries() {
        let transform = op.split_once('.').map_or(op, |(t, _)| t);
        if project.pipeline.transform(transform).is_none() {
            continue; // reported in the reference phase
        }
        if ttl_targets(op, plans).is_none() {
            d.push(
                Diagnostic::new(
                    &codes::UNKNOWN_STATE_OPERATOR,
                    format!("`state_ttl` names `{op}`, which keeps no streaming state"),
                )
                .at(format!("state_ttl.{op}"))
                .in_file(profile_file.clone()),
            );
        }
    }
    d
}

impl Project {
    /// The operators the profile's `state_ttl` names.
    fn pipeline_ttl_entries(&self) -> impl Iterator<Item = &str> {
        self.profile.state_ttl.keys().map(String::as_str)
    }
}
