//! The streaming validation phase: Spark Structured Streaming's supported-operation rules
//! for unbounded inputs (`UnsupportedOperationChecker`), each with its own code.
//!
//! - `ETL401` an aggregation in append mode needs a watermark on the event-time column it
//!   groups or windows by (after a stream-stream join, a column the join's time range
//!   bounds);
//! - `ETL402` session windows do not support update mode;
//! - `ETL436` a window with allowed lateness over a column without a watermark;
//! - `ETL403` complete mode needs an aggregation;
//! - `ETL404` sort without complete-mode aggregation, limit outside complete mode,
//!   dedup within the watermark without a watermark, window functions (`row_number`,
//!   `lag`, …) at all;
//! - `ETL407` an aggregation whose rows feed another stateful step, in update or
//!   complete mode, that cannot finalise them by the watermark (no window or event-time
//!   key a watermark bounds). Stateful steps chain: every one but the last runs in append
//!   mode, finalising by the watermark on the event-time columns it receives (see
//!   [`crate::event_time`] and [`crate::stateful_chain`]), and the last runs in its
//!   sink's mode;
//! - joins and static sources: see [`crate::join_rules`] (`ETL404`, `ETL409`, `ETL430`,
//!   `ETL431`, `ETL432`).

use crate::project::Project;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics};
use etlantic_core::ir::lineage::WINDOW_BOUNDS;
use etlantic_core::ir::{Action, AggFunc, Expr, TransformPlan, WindowKind};
use etlantic_core::streaming::{Duration, OutputMode};
use std::collections::HashMap;
use std::sync::Arc;

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

/// Checks every sink's query against the rules; returns the diagnostics found.
pub fn check(project: &Project, plans: &HashMap<String, Arc<TransformPlan>>) -> Diagnostics {
    let mut d = crate::join_rules::check(project, plans);
    let file = project.pipeline_file.clone();
    let mut event_time = crate::event_time::EventTimeColumns::new(project, plans);
    for sink in &project.pipeline.sinks {
        let mode = sink.output_mode.unwrap_or_default();
        let (mut transforms, mut sources) = (Vec::new(), Vec::new());
        upstream(project, &sink.input, &mut transforms, &mut sources);
        let at = format!("sinks[{}]", sink.id);
        let mut aggregations = 0;
        for t in &transforms {
            let Some(plan) = plans.get(t) else { continue };
            // A transformation of static tables only is a batch computation per
            // micro-batch (e.g. a dimension prepared before a stream-static join).
            if crate::join_rules::only_static(project, t) {
                continue;
            }
            let lineage = event_time.lagged_lineage(t);
            let inner = crate::stateful_chain::inner_steps(project, plans, t);
            for step in &plan.decoded().steps {
                let path = format!("transforms[{t}].steps[{}]", step.id);
                // The watermarked event-time columns of the step's input that a watermark
                // can finalise by (a join's columns outside its time range cannot).
                let watermarked: Vec<String> = lineage
                    .get(&step.target)
                    .into_iter()
                    .flatten()
                    .filter(|c| c.is_bounded())
                    .map(|c| c.name.clone())
                    .collect();
                // An inner stateful step runs in append mode whatever the sink's mode.
                let is_inner = inner.contains(&step.id);
                let step_mode = if is_inner { OutputMode::Append } else { mode };
                // An aggregation that cannot finalise its rows: in append mode it would
                // never emit them (`what`); as an inner step in another mode its changing
                // rows would feed the next stateful step.
                let not_final = |what: String| {
                    if is_inner && mode != OutputMode::Append {
                        Diagnostic::new(
                            &codes::MULTIPLE_AGGREGATIONS,
                            format!("the aggregation `{}` in `{t}` feeds another stateful step but cannot finalise its rows by the watermark; every stateful step but the last emits final rows, whatever the sink's mode (`{}` is in {} mode)", step.id, sink.id, mode.as_str()),
                        )
                        .help("Group the inner aggregation by a window or a watermarked event-time column, so that it emits each row once, final by the watermark.")
                    } else {
                        Diagnostic::new(&codes::APPEND_AGG_WITHOUT_WATERMARK, what)
                    }
                };
                match &step.op {
                    Action::WindowFields { assignments } => {
                        let names: Vec<&str> = assignments.iter().map(|a| a.name.as_str()).collect();
                        d.push(
                            Diagnostic::new(
                                &codes::UNSUPPORTED_STREAMING_OP,
                                format!(
                                    "window functions ({}) in `{t}` need all rows of a partition; on an unbounded input a row's number or neighbour would change as rows arrive",
                                    names.join(", ")
                                ),
                            )
                            .help("Compute them in a batch run, or over event-time windows with `window_aggregate`; `deduplicate` keeps the first row per key on streams.")
                            .at(path.clone())
                            .in_file(file.clone()),
                        );
                    }
                    Action::WindowAggregate { window, aggregates, .. } => {
                        aggregations += 1;
                        if aggregates.iter().any(|a| a.func == AggFunc::CountDistinct) {
                            d.push(
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!("distinct aggregations are not supported on streams (`{t}`)"),
                                )
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                        if matches!(window.kind, WindowKind::Session { .. }) && step_mode == OutputMode::Update {
                            d.push(
                                Diagnostic::new(
                                    &codes::SESSION_WINDOW_UPDATE,
                                    format!("session window aggregation in `{t}` cannot feed `{}` in update mode", sink.id),
                                )
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                        if window.allowed_lateness > Duration::ZERO && !watermarked.contains(&window.time_column) {
                            d.push(
                                Diagnostic::new(
                                    &codes::LATENESS_WITHOUT_WATERMARK,
                                    format!(
                                        "the window over `{}` in `{t}` allows {} of lateness, but `{}` has no watermark",
                                        window.time_column, window.allowed_lateness, window.time_column
                                    ),
                                )
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                        let bounds = WINDOW_BOUNDS.iter().all(|b| watermarked.iter().any(|c| c == b));
                        if bounds && WINDOW_BOUNDS.contains(&window.time_column.as_str()) {
                            d.push(
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!(
                                        "`{t}` windows the output of a window aggregation by `{}`; a window over another window's bounds is not supported on streams",
                                        window.time_column
                                    ),
                                )
                                .help("Aggregate by the windows themselves (`aggregate` grouped by window_start, window_end), or window the original event-time column.")
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        } else if step_mode == OutputMode::Append && !watermarked.contains(&window.time_column) {
                            d.push(
                                not_final(format!(
                                    "window aggregation over `{}` in `{t}` feeds `{}` in append mode, but `{}` has no watermark",
                                    window.time_column, sink.id, window.time_column
                                ))
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                    }
                    Action::Aggregate { group_by, aggregates } => {
                        aggregations += 1;
                        if aggregates.iter().any(|a| a.func == AggFunc::CountDistinct) {
                            d.push(
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!("distinct aggregations are not supported on streams (`{t}`)"),
                                )
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                        let keyed_by_watermark = group_by
                            .iter()
                            .any(|g| matches!(&g.expr, Expr::Column(c) if watermarked.contains(c)));
                        // A window's start may be behind the watermark when the window
                        // is emitted: grouped by windows, the end is what finalises.
                        let keyed_by_start_only = WINDOW_BOUNDS.iter().all(|b| watermarked.iter().any(|c| c == b))
                            && [WINDOW_BOUNDS[0], WINDOW_BOUNDS[1]].map(|b| {
                                group_by.iter().any(|g| matches!(&g.expr, Expr::Column(c) if c == b))
                            }) == [true, false];
                        if step_mode == OutputMode::Append && keyed_by_start_only {
                            d.push(
                                not_final(format!("aggregation in `{t}` groups windows by `window_start` only; a window is final when its end passes the watermark"))
                                .help("Group by window_end too (`group_by: [window_start, window_end, ...]`).")
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        } else if step_mode == OutputMode::Append && !keyed_by_watermark {
                            d.push(
                                not_final(format!("aggregation in `{t}` feeds `{}` in append mode without a watermarked event-time key", sink.id))
                                .at(path.clone())
                                .in_file(file.clone()),
                            );
                        }
                    }
                    Action::Sort { .. } if !(mode == OutputMode::Complete && aggregations > 0) => d.push(
                        Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("sorting a stream in `{t}` is only supported after an aggregation in complete mode"),
                        )
                        .at(path.clone())
                        .in_file(file.clone()),
                    ),
                    Action::Limit { .. } if mode != OutputMode::Complete => d.push(
                        Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("limit on a stream in `{t}` is only supported in complete mode"),
                        )
                        .at(path.clone())
                        .in_file(file.clone()),
                    ),
                    // Keeping the last row needs the whole input; a stream keeps the
                    // first (Spark's dropDuplicates).
                    Action::Deduplicate { keep_last: true, .. } => d.push(
                        Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("deduplicating a stream in `{t}` keeps the first row per key; `retain: last` needs a bounded input"),
                        )
                        .help("Keep the first row (drop `retain: last`), or run the pipeline in batch mode.")
                        .at(path.clone())
                        .in_file(file.clone()),
                    ),
                    // A distinct union would remove duplicates within each micro-batch
                    // only; across micro-batches it needs dedup state.
                    Action::Union { distinct: true, .. } => d.push(
                        Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("a distinct union of streams in `{t}` is not supported"),
                        )
                        .help("Union without `distinct`, then `distinct: true` (a stateful dedup of the stream).")
                        .at(path.clone())
                        .in_file(file.clone()),
                    ),
                    Action::DeduplicateWithinWatermark { .. } if watermarked.is_empty() => d.push(
                        Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("dedup within the watermark in `{t}` needs a watermarked source"),
                        )
                        .at(path.clone())
                        .in_file(file.clone()),
                    ),
                    _ => {}
                }
            }
        }
        if mode == OutputMode::Complete && aggregations == 0 {
            d.push(
                Diagnostic::new(
                    &codes::COMPLETE_WITHOUT_AGGREGATION,
                    format!(
                        "`{}` uses complete mode but its query has no aggregation",
                        sink.id
                    ),
                )
                .at(at)
                .in_file(file.clone()),
            );
        }
    }
    d
}
