//! Column-level lineage of a whole pipeline: for each sink, which source columns each of
//! its columns is computed from, and which source columns decide its rows.
//!
//! Each portable transformation is analysed step by step
//! ([`etlantic_core::ir::column_lineage`]) and composed with the lineage of what its ports
//! read. A transformation written in SQL or implemented in code is not analysed: its
//! columns have no lineage (rather than a guessed one), though the row decisions of what
//! it reads still reach the sinks after it.

use crate::plan::{PipelinePlan, PlanLogic};
use etlantic_core::ir::column_lineage::{plan_lineage, RelationLineage};
use etlantic_core::ir::TransformPlan;
use indexmap::IndexMap;
use std::collections::BTreeMap;

/// The lineage of each sink of `plan` (by sink id), in terms of the pipeline's sources
/// (origins name source ids and their columns). A sink's columns are the ones its schema
/// declares; a column whose lineage is unknown is absent.
pub fn sink_lineage(plan: &PipelinePlan) -> IndexMap<String, RelationLineage> {
    let names = |schema: &crate::plan::SchemaSpec| -> Vec<String> {
        schema.iter().map(|f| f.name.clone()).collect()
    };
    let mut nodes: BTreeMap<String, RelationLineage> = BTreeMap::new();
    // Every node's column names, from the plan: known even where the lineage is not.
    let mut columns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &plan.sources {
        let cols = plan
            .assets
            .get(&s.asset)
            .map(|a| names(&a.schema))
            .unwrap_or_default();
        nodes.insert(s.id.clone(), RelationLineage::input(&s.id, &cols));
        columns.insert(s.id.clone(), cols);
    }
    for t in &plan.transforms {
        let lineage = transform_lineage(t, &nodes, &columns);
        nodes.insert(t.id.clone(), lineage);
        columns.insert(t.id.clone(), names(&t.schema));
    }
    plan.sinks
        .iter()
        .map(|sink| {
            let mut lineage = nodes.get(&sink.input).cloned().unwrap_or_default();
            let declared: Vec<&str> = sink.schema.iter().map(|f| f.name.as_str()).collect();
            if !declared.is_empty() {
                lineage
                    .columns
                    .retain(|c, _| declared.contains(&c.as_str()));
            }
            (sink.id.clone(), lineage)
        })
        .collect()
}

/// A transformation's lineage, from the lineage of the nodes its ports read.
fn transform_lineage(
    t: &crate::plan::PlanTransform,
    nodes: &BTreeMap<String, RelationLineage>,
    columns: &BTreeMap<String, Vec<String>>,
) -> RelationLineage {
    let upstream: BTreeMap<String, RelationLineage> = t
        .inputs
        .iter()
        .map(|(port, node)| (port.clone(), nodes.get(node).cloned().unwrap_or_default()))
        .collect();
    let analysed = match &t.logic {
        PlanLogic::Portable { plan, output, .. } => {
            TransformPlan::from_value(plan, &t.id).ok().and_then(|p| {
                let ports = t
                    .inputs
                    .iter()
                    .filter_map(|(port, node)| Some((port.clone(), columns.get(node)?.clone())))
                    .collect();
                plan_lineage(p.decoded(), &ports).shift_remove(output)
            })
        }
        PlanLogic::Sql { .. } | PlanLogic::Impl { .. } => None,
    };
    match analysed {
        Some(here) => here.through(&upstream),
        None => {
            // Not analysed: what decides the inputs' rows still decides the output's.
            let mut rows = BTreeMap::new();
            for up in upstream.values() {
                for (o, hows) in &up.rows {
                    rows.entry(o.clone())
                        .or_insert_with(std::collections::BTreeSet::new)
                        .extend(hows.iter().copied());
                }
            }
            RelationLineage::opaque(rows)
        }
    }
}
