//! The plan compiler: a DTCS [`DecodedPlan`] → one Polars [`LazyFrame`] per output.
//!
//! Steps run in the order the plan decoded them. Each reads relations by name (a plan
//! input or an earlier step id), applies its action (see [`crate::actions`]) with its
//! parameter references bound, and publishes its result under its own id.

use crate::actions;
use crate::error;
use crate::relation::Relation;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::ir::{Action, Aggregate, DecodedPlan, Expr, NamedExpr, SortKey};
use etlantic_core::Result;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;

/// Compiles `plan` over `inputs` (a relation per plan input id) and returns the relation
/// published by the plan output port `output`.
pub(crate) fn compile_plan(
    plan: &DecodedPlan,
    parameters: &IndexMap<String, Value>,
    inputs: HashMap<String, Relation>,
    output: &str,
) -> Result<Relation> {
    let published = plan.outputs.get(output).ok_or_else(|| {
        error::err(
            &codes::UNKNOWN_PORT,
            format!(
                "the plan has no output `{output}` (outputs: {})",
                plan.outputs.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let mut relations = inputs;
    for step in &plan.steps {
        let path = format!("steps[{}]", step.id);
        let with_path = |e| error::at(e, &path);
        let action = bind_action(&step.op, parameters).map_err(with_path)?;
        let lookup = |name: &str| {
            relations.get(name).cloned().ok_or_else(|| {
                with_path(error::err(
                    &codes::UNKNOWN_NODE,
                    format!("step `{}` reads unknown relation `{name}`", step.id),
                ))
            })
        };
        let target = lookup(&step.target)?;
        let secondary = action
            .secondary_inputs()
            .first()
            .map(|s| lookup(s))
            .transpose()?;
        let result = actions::apply(&action, target, secondary).map_err(with_path)?;
        relations.insert(step.id.clone(), result);
    }
    relations.remove(published).ok_or_else(|| {
        error::err(
            &codes::UNKNOWN_NODE,
            format!("output `{output}` publishes unknown relation `{published}`"),
        )
    })
}

fn bind(e: &Expr, params: &IndexMap<String, Value>) -> Result<Expr> {
    e.bind_parameters(params).map_err(|m| {
        Diagnostic::new(&codes::UNKNOWN_PARAMETER, m)
            .help("Give the value under `parameters:` of the transformation.")
            .into()
    })
}

fn named(items: &[NamedExpr], params: &IndexMap<String, Value>) -> Result<Vec<NamedExpr>> {
    items
        .iter()
        .map(|n| {
            Ok(NamedExpr {
                name: n.name.clone(),
                expr: bind(&n.expr, params)?,
            })
        })
        .collect()
}

/// The action with every parameter reference replaced by its value (`ETL209` when a
/// value is missing).
pub(crate) fn bind_action(action: &Action, params: &IndexMap<String, Value>) -> Result<Action> {
    let aggregates = |items: &[Aggregate]| -> Result<Vec<Aggregate>> {
        items
            .iter()
            .map(|a| {
                Ok(Aggregate {
                    name: a.name.clone(),
                    func: a.func,
                    arg: a.arg.as_ref().map(|e| bind(e, params)).transpose()?,
                })
            })
            .collect()
    };
    Ok(match action {
        Action::Filter { predicate } => Action::Filter {
            predicate: bind(predicate, params)?,
        },
        Action::Project { fields } => Action::Project {
            fields: named(fields, params)?,
        },
        Action::WithFields { assignments } => Action::WithFields {
            assignments: named(assignments, params)?,
        },
        Action::Join {
            right,
            join_type,
            left_keys,
            right_keys,
            predicate,
            null_safe,
            time_range,
        } => Action::Join {
            right: right.clone(),
            join_type: *join_type,
            left_keys: left_keys.clone(),
            right_keys: right_keys.clone(),
            predicate: predicate.as_ref().map(|p| bind(p, params)).transpose()?,
            null_safe: *null_safe,
            time_range: time_range.clone(),
        },
        Action::Aggregate {
            group_by,
            aggregates: aggs,
        } => Action::Aggregate {
            group_by: named(group_by, params)?,
            aggregates: aggregates(aggs)?,
        },
        Action::Sort { keys } => Action::Sort {
            keys: keys
                .iter()
                .map(|k| {
                    Ok(SortKey {
                        expr: bind(&k.expr, params)?,
                        descending: k.descending,
                        nulls_first: k.nulls_first,
                    })
                })
                .collect::<Result<_>>()?,
        },
        other => other.clone(),
    })
}
