//! Chained stateful operators: which stateful steps run as *inner* operators.
//!
//! A stateful step (an aggregation, a dedup, a `process` step or a stream-stream join) is
//! inner when another stateful step comes after it: later in its transformation, or in a
//! transformation that reads its transformation's output (directly or not, whatever the
//! sink). An inner operator runs in append mode whatever its sink's mode: it emits each
//! row once, final by the watermark, so the operator after it never sees a row change
//! (there are no retractions). Only the last stateful operator runs in its sink's mode.
//! That is how an aggregation over a finalised aggregation or join runs in update or
//! complete mode (Nexmark q4: the average of the winning bids per category, each winning
//! bid final once its auction is over), where Spark refuses chained stateful operators
//! outside append mode. The streaming runtime applies the same rule to the units it
//! builds (`etlantic-datafusion`'s streaming query).

use crate::graph::{is_static, sources_of, transforms_of};
use crate::project::Project;
use etlantic_core::ir::{Action, TransformPlan};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Whether any streaming source feeds `node`.
fn streams(project: &Project, node: &str) -> bool {
    let mut s = Vec::new();
    sources_of(project, node, &mut s);
    s.iter().any(|id| !is_static(project, id))
}

/// The ids of the stateful steps of transformation `t` on streams, in step order: steps
/// that keep state across micro-batches (a join only when both sides are streams; a
/// join with a static table is a join per micro-batch).
pub fn stateful_steps(
    project: &Project,
    plans: &HashMap<String, Arc<TransformPlan>>,
    t: &str,
) -> Vec<String> {
    let (Some(def), Some(plan)) = (project.pipeline.transform(t), plans.get(t)) else {
        return Vec::new();
    };
    let mut streaming: HashMap<String, bool> = def
        .inputs
        .iter()
        .map(|(port, r)| (port.clone(), streams(project, r.from())))
        .collect();
    let mut out = Vec::new();
    for step in &plan.decoded().steps {
        let is = |rel: &str| streaming.get(rel).copied().unwrap_or(false);
        let any = is(&step.target) || step.op.secondary_inputs().iter().any(|r| is(r));
        let stateful = match &step.op {
            Action::Join { right, .. } => is(&step.target) && is(right),
            op => op.is_stateful() && any,
        };
        if stateful {
            out.push(step.id.clone());
        }
        streaming.insert(step.id.clone(), any);
    }
    out
}

/// Whether a transformation that reads `t`'s output (directly or not) has a stateful step.
pub fn followed_by_state(
    project: &Project,
    plans: &HashMap<String, Arc<TransformPlan>>,
    t: &str,
) -> bool {
    project.pipeline.transforms.iter().any(|u| {
        if u.id == t {
            return false;
        }
        let mut upstream = Vec::new();
        transforms_of(project, &u.id, &mut upstream);
        upstream.iter().any(|x| x == t) && !stateful_steps(project, plans, &u.id).is_empty()
    })
}

/// The inner stateful steps of transformation `t` (see the module docs): all of its
/// stateful steps when a later transformation has one, else all but its last.
pub fn inner_steps(
    project: &Project,
    plans: &HashMap<String, Arc<TransformPlan>>,
    t: &str,
) -> HashSet<String> {
    let mut steps = stateful_steps(project, plans, t);
    if !followed_by_state(project, plans, t) {
        steps.pop();
    }
    steps.into_iter().collect()
}
