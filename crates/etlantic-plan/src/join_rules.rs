//! The streaming rules of joins and static sources (part of the streaming phase), as
//! Spark's `UnsupportedOperationChecker` states them for stream-stream and stream-static
//! joins:
//!
//! - a join of two streams runs in append mode only (`ETL409`), needs equality keys, and
//!   is inner, left, right or full outer (`ETL404` otherwise: semi, anti and cross joins
//!   of two streams are not run by the embedded runtime);
//! - an outer join of two streams must know when a row can no longer match: a
//!   watermarked event-time column among the keys, or a watermark on the nullable side
//!   and a `time_range` that bounds the preserved side's time by it (`ETL430`); a side
//!   whose state nothing evicts is reported as a warning (`ETL431`), unless the profile
//!   gives the transformation a `state_ttl`;
//! - a join of a stream with a static table must keep the stream's side: inner, left
//!   outer with the stream on the left, right outer with the stream on the right, semi
//!   and anti with the stream on the left; full outer joins with a static side are
//!   refused (`ETL404`);
//! - after a stream-stream join, only aggregations may keep state (`ETL404` otherwise),
//!   and only after an inner join of two watermarked streams: its `time_range` (or an
//!   event-time key) bounds how far behind the watermark its output's event time can be,
//!   which the aggregation finalises by (see [`crate::event_time`]); an outer join emits
//!   its unmatched rows late by an amount nothing bounds. A join whose output feeds
//!   another stateful step runs in append mode whatever the sink's mode (see
//!   [`crate::stateful_chain`]); a join after windows is fine too (the windows' bounds
//!   are event time);
//! - a static source (`static_refresh`) has no event time, watermark, late-event policy
//!   or read limit, and a sink needs at least one streaming source (`ETL432`).

use crate::graph::{is_static, sources_of, transforms_of};
use crate::project::Project;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics};
use etlantic_core::ir::{Action, JoinType, TransformPlan};
use etlantic_core::streaming::{LatePolicy, OutputMode};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Whether a relation comes out of a stream-stream join, as stateful steps after it care.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum AfterJoin {
    /// No stream-stream join before it.
    #[default]
    No,
    /// An inner join of two watermarked streams: its output's event time is bounded.
    Inner,
    /// Another stream-stream join: nothing bounds how late its rows can be.
    Unbounded,
}

/// Whether every source feeding `node` is static (and there is one).
pub fn only_static(project: &Project, node: &str) -> bool {
    let mut s = Vec::new();
    sources_of(project, node, &mut s);
    !s.is_empty() && s.iter().all(|id| is_static(project, id))
}

/// Checks joins and static sources; returns what it found.
pub fn check(project: &Project, plans: &HashMap<String, Arc<TransformPlan>>) -> Diagnostics {
    let mut d = Diagnostics::new();
    let file = project.pipeline_file.clone();
    let pl = &project.pipeline;

    for s in pl.sources.iter().filter(|s| s.is_static()) {
        let mut misuse = Vec::new();
        if s.event_time.is_some() {
            misuse.push("event_time");
        }
        if s.watermark.is_some() {
            misuse.push("watermark");
        }
        if s.late_events != LatePolicy::Drop {
            misuse.push("late_events");
        }
        if s.read_limit.is_some() {
            misuse.push("read_limit");
        }
        if !misuse.is_empty() {
            d.push(
                Diagnostic::new(
                    &codes::STATIC_SOURCE_MISUSE,
                    format!(
                        "static source `{}` declares {}, which only streams have",
                        s.id,
                        misuse.join(", ")
                    ),
                )
                .at(format!("sources[{}]", s.id))
                .in_file(file.clone()),
            );
        }
    }

    // Diagnostics that do not depend on the sink are reported once.
    let mut reported: HashSet<(String, String, &'static str)> = HashSet::new();
    let mut event_time = crate::event_time::EventTimeColumns::new(project, plans);
    for sink in &pl.sinks {
        let mode = sink.output_mode.unwrap_or_default();
        let mut sources = Vec::new();
        sources_of(project, &sink.input, &mut sources);
        if !sources.is_empty() && sources.iter().all(|s| is_static(project, s)) {
            d.push(
                Diagnostic::new(
                    &codes::STATIC_SOURCE_MISUSE,
                    format!(
                        "`{}` reads only static sources ({}); a streaming query needs a stream",
                        sink.id,
                        sources.join(", ")
                    ),
                )
                .at(format!("sinks[{}]", sink.id))
                .in_file(file.clone())
                .help("Join the static table with a streaming source, or run the pipeline in batch mode."),
            );
        }
        let mut transforms = Vec::new();
        transforms_of(project, &sink.input, &mut transforms);
        // Transformations whose output comes out of a stream-stream join.
        let mut after_join: HashMap<String, AfterJoin> = HashMap::new();
        for t in &transforms {
            let Some(def) = pl.transform(t) else { continue };
            let Some(plan) = plans.get(t) else { continue };
            let decoded = plan.decoded();
            let mut fed: HashMap<String, Vec<String>> = HashMap::new();
            let mut joined: HashMap<String, AfterJoin> = HashMap::new();
            for (port, r) in &def.inputs {
                let mut s = Vec::new();
                sources_of(project, r.from(), &mut s);
                fed.insert(port.clone(), s);
                joined.insert(
                    port.clone(),
                    after_join.get(r.from()).copied().unwrap_or_default(),
                );
            }
            let inner = crate::stateful_chain::inner_steps(project, plans, t);
            let lineage = event_time.lineage(t);
            let streaming = |fed: &[String]| fed.iter().any(|s| !is_static(project, s));
            let ttl = project
                .profile
                .state_ttl
                .keys()
                .any(|k| k == t || k.starts_with(&format!("{t}.")));
            for step in &decoded.steps {
                let path = format!("transforms[{t}].steps[{}]", step.id);
                let mut inputs = vec![step.target.clone()];
                inputs.extend(step.op.secondary_inputs().iter().map(|s| s.to_string()));
                let mut f: Vec<String> = inputs
                    .iter()
                    .flat_map(|r| fed.get(r).cloned().unwrap_or_default())
                    .collect();
                f.sort();
                f.dedup();
                let mut after = inputs
                    .iter()
                    .map(|r| joined.get(r).copied().unwrap_or_default())
                    .max()
                    .unwrap_or_default();
                let mut once =
                    |d: &mut Diagnostics, code: &'static codes::CodeInfo, diag: Diagnostic| {
                        if reported.insert((t.clone(), step.id.clone(), code.code)) {
                            d.push(diag.at(path.clone()).in_file(file.clone()));
                        }
                    };
                if after != AfterJoin::No && step.op.is_stateful() && streaming(&f) {
                    let refused = if after == AfterJoin::Unbounded {
                        Some(Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("`{t}`: a stateful step ({}) after an outer stream-stream join, or one of a stream without a watermark, is not supported", step.op.id()),
                        )
                        .help("Only an inner join of two watermarked streams bounds how late its output's event time can be (by its time_range or an event-time key). Aggregate before the join, or write the join's output and read it in another pipeline."))
                    } else if !step.op.is_aggregation() {
                        Some(Diagnostic::new(
                            &codes::UNSUPPORTED_STREAMING_OP,
                            format!("`{t}`: only an aggregation can follow a stream-stream join ({} cannot)", step.op.id()),
                        )
                        .help("Deduplicate or process the streams before the join."))
                    } else {
                        None
                    };
                    if let Some(diag) = refused {
                        once(&mut d, &codes::UNSUPPORTED_STREAMING_OP, diag);
                    }
                }
                if let Action::Join {
                    right,
                    join_type,
                    left_keys,
                    right_keys,
                    time_range,
                    ..
                } = &step.op
                {
                    let lfed = fed.get(&step.target).cloned().unwrap_or_default();
                    let rfed = fed.get(right).cloned().unwrap_or_default();
                    let (ls, rs) = (streaming(&lfed), streaming(&rfed));
                    let jt = join_type.name();
                    if ls && rs {
                        if after != AfterJoin::No {
                            once(
                                &mut d,
                                &codes::UNSUPPORTED_STREAMING_OP,
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!("`{t}`: a stream-stream join of another stream-stream join's output is not supported"),
                                )
                                .help("A join compares its inputs' event time with the watermark as it arrives, and a join's output arrives later than that. Write the first join's output and read it in another pipeline."),
                            );
                        }
                        let lwm = lineage.get(&step.target).cloned().unwrap_or_default();
                        let rwm = lineage.get(right).cloned().unwrap_or_default();
                        after = if *join_type == JoinType::Inner
                            && !lwm.is_empty()
                            && !rwm.is_empty()
                        {
                            AfterJoin::Inner
                        } else {
                            AfterJoin::Unbounded
                        };
                        // A join that feeds another stateful step emits its rows once, in
                        // append mode, whatever the sink's mode.
                        if mode != OutputMode::Append && !inner.contains(&step.id) {
                            d.push(
                                Diagnostic::new(
                                    &codes::UPDATE_MODE_UNSUPPORTED,
                                    format!(
                                        "the join of two streams in `{t}` feeds `{}` in {} mode; stream-stream joins run in append mode only",
                                        sink.id,
                                        mode.as_str()
                                    ),
                                )
                                .at(path.clone())
                                .in_file(file.clone())
                                .help("Use `output_mode: append` for this sink."),
                            );
                        }
                        if matches!(join_type, JoinType::Semi | JoinType::Anti | JoinType::Cross) {
                            once(
                                &mut d,
                                &codes::UNSUPPORTED_STREAMING_OP,
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!("`{t}`: {jt} joins of two streams are not supported (inner, left, right and full outer are)"),
                                ),
                            );
                            continue;
                        }
                        if left_keys.is_empty() {
                            once(
                                &mut d,
                                &codes::UNSUPPORTED_STREAMING_OP,
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!("`{t}`: a join of two streams needs equality keys"),
                                )
                                .help("Join on key columns (`on: [...]`), optionally with a `time_range`."),
                            );
                            continue;
                        }
                        let wm_in_keys = left_keys.iter().any(|k| lwm.contains(k))
                            || right_keys.iter().any(|k| rwm.contains(k));
                        // Spark's getStateValueWatermark: the range bounds a side's time by
                        // the other side's watermarked time.
                        let bounds_left =
                            time_range.as_ref().is_some_and(|r| rwm.contains(&r.right));
                        let bounds_right =
                            time_range.as_ref().is_some_and(|r| lwm.contains(&r.left));
                        let valid = match join_type {
                            JoinType::Left => bounds_left,
                            JoinType::Right => bounds_right,
                            JoinType::Full => bounds_left && bounds_right,
                            _ => true,
                        };
                        if !wm_in_keys && !valid {
                            once(
                                &mut d,
                                &codes::OUTER_JOIN_WITHOUT_WATERMARK,
                                Diagnostic::new(
                                    &codes::OUTER_JOIN_WITHOUT_WATERMARK,
                                    format!(
                                        "`{t}`: the {jt} outer join of two streams has no watermark in its keys, and no watermark on the nullable side with a `time_range` over it"
                                    ),
                                ),
                            );
                            continue;
                        }
                        // Which sides the watermark will clean (as the runtime derives it).
                        let evicted = if wm_in_keys {
                            [true, true]
                        } else {
                            let both = time_range
                                .as_ref()
                                .is_some_and(|r| lwm.contains(&r.left) && rwm.contains(&r.right));
                            [both, both]
                        };
                        let preserved = match join_type {
                            JoinType::Left => [true, false],
                            JoinType::Right => [false, true],
                            JoinType::Full => [true, true],
                            _ => [false, false],
                        };
                        let kept: Vec<String> = ["left", "right"]
                            .iter()
                            .zip(evicted.iter().zip(preserved))
                            .filter(|(_, (e, _))| !**e)
                            .map(|(n, (_, p))| {
                                if p {
                                    format!("{n} (its unmatched rows are never emitted)")
                                } else {
                                    n.to_string()
                                }
                            })
                            .collect();
                        if !kept.is_empty() && !ttl {
                            once(
                                &mut d,
                                &codes::UNBOUNDED_JOIN_STATE,
                                Diagnostic::new(
                                    &codes::UNBOUNDED_JOIN_STATE,
                                    format!(
                                        "`{t}`: the {jt} join of two streams keeps every row of its {} side in state",
                                        kept.join(" and ")
                                    ),
                                ),
                            );
                        }
                    } else if ls != rs {
                        // A stream with a static table: the stream's side must be kept.
                        let refused = match join_type {
                            JoinType::Full => true,
                            JoinType::Left | JoinType::Semi | JoinType::Anti => !ls,
                            JoinType::Right => !rs,
                            JoinType::Inner | JoinType::Cross => false,
                        };
                        if refused {
                            once(
                                &mut d,
                                &codes::UNSUPPORTED_STREAMING_OP,
                                Diagnostic::new(
                                    &codes::UNSUPPORTED_STREAMING_OP,
                                    format!(
                                        "`{t}`: a {jt} join with the static side {} is not supported on streams",
                                        if ls { "on the right" } else { "on the left" }
                                    ),
                                )
                                .help("A stream-static join must keep the stream's rows: use inner, or an outer join that preserves the stream's side."),
                            );
                        }
                    }
                }
                fed.insert(step.id.clone(), f);
                joined.insert(step.id.clone(), after);
            }
            let out = decoded
                .outputs
                .values()
                .map(|r| joined.get(r).copied().unwrap_or_default())
                .max()
                .unwrap_or_default();
            after_join.insert(t.clone(), out);
        }
    }
    d
}
