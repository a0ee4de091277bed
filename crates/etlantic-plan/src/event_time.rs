//! Event-time columns across a pipeline: which columns of every node's output carry
//! event time under a watermark.
//!
//! A watermarked streaming source has its event-time column; a transformation's output
//! has the columns [`event_time_lags`] follows through its steps from its ports (a
//! window aggregation adds its window bounds, which is what lets a window aggregation or
//! a stream-stream join read another window aggregation's output: chained stateful
//! operators), each with its lag behind the watermark (a stream-stream join's time range
//! delays its columns, which is what lets an aggregation read a join's output). A non-portable transformation (SQL, a linked implementation) passes on the
//! event-time columns of its inputs. The streaming runtime derives the same columns from
//! the plan (`etlantic-datafusion`'s program builder).

use crate::project::Project;
use etlantic_core::ir::lineage::{event_time_lags, EventColumn};
use etlantic_core::ir::TransformPlan;
use std::collections::HashMap;
use std::sync::Arc;

/// Event-time columns per node, computed on demand and remembered.
pub struct EventTimeColumns<'a> {
    project: &'a Project,
    plans: &'a HashMap<String, Arc<TransformPlan>>,
    known: HashMap<String, Vec<EventColumn>>,
}

fn names(cols: Vec<EventColumn>) -> Vec<String> {
    cols.into_iter().map(|c| c.name).collect()
}

impl<'a> EventTimeColumns<'a> {
    /// Over `project`, whose portable transformations have the plans `plans`.
    pub fn new(project: &'a Project, plans: &'a HashMap<String, Arc<TransformPlan>>) -> Self {
        EventTimeColumns {
            project,
            plans,
            known: HashMap::new(),
        }
    }

    /// The event-time columns of the output of `node` (a source or a transformation).
    pub fn of(&mut self, node: &str) -> Vec<String> {
        names(self.lagged(node))
    }

    /// [`Self::of`] with each column's lag behind the watermark (see [`EventColumn`]).
    pub fn lagged(&mut self, node: &str) -> Vec<EventColumn> {
        if let Some(c) = self.known.get(node) {
            return c.clone();
        }
        // Seeded first: a cycle (refused elsewhere) ends here instead of recursing.
        self.known.insert(node.to_string(), Vec::new());
        let cols = self.compute(node);
        self.known.insert(node.to_string(), cols.clone());
        cols
    }

    /// The event-time columns of every relation of the plan of transformation `t`
    /// (ports and steps).
    pub fn lineage(&mut self, t: &str) -> HashMap<String, Vec<String>> {
        self.lagged_lineage(t)
            .into_iter()
            .map(|(rel, cols)| (rel, names(cols)))
            .collect()
    }

    /// [`Self::lineage`] with each column's lag behind the watermark.
    pub fn lagged_lineage(&mut self, t: &str) -> HashMap<String, Vec<EventColumn>> {
        let Some(def) = self.project.pipeline.transform(t) else {
            return HashMap::new();
        };
        let ports: HashMap<String, Vec<EventColumn>> = def
            .inputs
            .iter()
            .map(|(port, r)| (port.clone(), r.from().to_string()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(port, from)| (port, self.lagged(&from)))
            .collect();
        match self.plans.get(t) {
            Some(plan) => event_time_lags(&plan.decoded().steps, ports),
            None => ports,
        }
    }

    fn compute(&mut self, node: &str) -> Vec<EventColumn> {
        if let Some(s) = self.project.pipeline.source(node) {
            return match (&s.event_time, s.watermark, s.is_static()) {
                (Some(e), Some(_), false) => vec![EventColumn::new(&e.column)],
                _ => Vec::new(),
            };
        }
        let Some(def) = self.project.pipeline.transform(node) else {
            return Vec::new();
        };
        let Some(plan) = self.plans.get(node).cloned() else {
            // Not portable: its inputs' event-time columns, as it may pass them on.
            let froms: Vec<String> = def.inputs.values().map(|r| r.from().to_string()).collect();
            let mut cols: Vec<EventColumn> = Vec::new();
            for from in froms {
                for c in self.lagged(&from) {
                    EventColumn::merge_into(&mut cols, c);
                }
            }
            return cols;
        };
        let lineage = self.lagged_lineage(node);
        let decoded = plan.decoded();
        // The planner's rule: the output `result`, or the only one.
        let output = decoded
            .outputs
            .get("result")
            .or_else(|| (decoded.outputs.len() == 1).then(|| decoded.outputs.values().next())?)
            .cloned();
        output
            .and_then(|o| lineage.get(&o).cloned())
            .unwrap_or_default()
    }
}
