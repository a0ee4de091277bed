//! Which relations of a plan must know their row order.
//!
//! Order costs: keeping the ordinal of an input through filters and projections is free,
//! but giving a join, a union or an aggregation's output an order takes a sort. So order
//! is computed only where something downstream depends on it: a sort (stability), a
//! limit, distinct/deduplicate (which row is first), `first`/`last` aggregates. Plan
//! outputs keep an order when it comes for free ([`Demand::Keep`]).

use etlantic_core::ir::{Action, AggFunc, Aggregate, DecodedPlan, JoinType};
use std::collections::HashMap;

/// How much a relation's consumers care about its row order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Demand {
    /// Nobody: the ordinal may be dropped.
    None,
    /// Keep it if the relation already has it; do not compute one.
    Keep,
    /// A consumer depends on it: compute it.
    Require,
}

fn uses_first_last(aggs: &[Aggregate]) -> bool {
    aggs.iter()
        .any(|a| matches!(a.func, AggFunc::First | AggFunc::Last))
}

/// The demand an action puts on its input relations, given the demand on its output.
pub(crate) fn input_demand(op: &Action, out: Demand) -> (Demand, Demand) {
    let require_if_required = if out == Demand::Require {
        Demand::Require
    } else {
        Demand::None
    };
    match op {
        Action::Filter { .. }
        | Action::Project { .. }
        | Action::WithFields { .. }
        | Action::DropFields { .. }
        | Action::RenameFields { .. } => (out, Demand::None),
        Action::Explode { .. } => (require_if_required, Demand::None),
        Action::Join { join_type, .. } => match join_type {
            // Semi/anti joins keep the left rows and their ordinal as they are.
            JoinType::Semi | JoinType::Anti => (out, Demand::None),
            _ => (require_if_required, require_if_required),
        },
        Action::Union { .. } => (require_if_required, require_if_required),
        Action::Aggregate { aggregates, .. } | Action::WindowAggregate { aggregates, .. } => {
            if uses_first_last(aggregates) {
                (Demand::Require, Demand::None)
            } else {
                (require_if_required, Demand::None)
            }
        }
        Action::Sort { .. } => {
            if out == Demand::None {
                (Demand::None, Demand::None)
            } else {
                (Demand::Require, Demand::None)
            }
        }
        Action::Distinct { fields: None } => (require_if_required, Demand::None),
        Action::Deduplicate { keys, .. } if keys.is_empty() => (require_if_required, Demand::None),
        Action::Limit { .. }
        | Action::Distinct { .. }
        | Action::Deduplicate { .. }
        | Action::DeduplicateWithinWatermark { .. } => (Demand::Require, Demand::None),
        // A processor sees each key's rows in input order; window functions break ties
        // in the window's order by it.
        Action::Process { .. } | Action::WindowFields { .. } => (Demand::Require, Demand::None),
    }
}

/// The demand on every relation (inputs and steps) of `plan` when `outputs` are read.
pub(crate) fn demands(plan: &DecodedPlan, outputs: &[&str]) -> HashMap<String, Demand> {
    let mut d: HashMap<String, Demand> = HashMap::new();
    let raise = |d: &mut HashMap<String, Demand>, name: &str, v: Demand| {
        let e = d.entry(name.to_string()).or_insert(Demand::None);
        if v > *e {
            *e = v;
        }
    };
    for o in outputs {
        raise(&mut d, o, Demand::Keep);
    }
    for step in plan.steps.iter().rev() {
        // Steps nothing reads are dead: they put no demand on their inputs.
        let Some(out) = d.get(&step.id).copied() else {
            continue;
        };
        let (target, secondary) = input_demand(&step.op, out);
        raise(&mut d, &step.target, target);
        for s in step.op.secondary_inputs() {
            raise(&mut d, s, secondary);
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use etlantic_core::ir::{ActionNode, Expr, SortKey};
    use indexmap::IndexMap;

    fn node(id: &str, target: &str, op: Action) -> ActionNode {
        ActionNode::new(id, target, op)
    }

    #[test]
    fn order_is_required_only_upstream_of_order_sensitive_steps() {
        let join = Action::Join {
            right: "dim".into(),
            join_type: JoinType::Inner,
            left_keys: vec!["k".into()],
            right_keys: vec!["k".into()],
            predicate: None,
            null_safe: false,
            time_range: None,
        };
        let sort = Action::Sort {
            keys: vec![SortKey {
                expr: Expr::col("k"),
                descending: false,
                nulls_first: false,
            }],
        };
        let plan = DecodedPlan {
            inputs: vec![],
            steps: vec![
                node(
                    "f",
                    "orders",
                    Action::Filter {
                        predicate: Expr::col("b"),
                    },
                ),
                node("j", "f", join),
                node("s", "j", sort),
                node(
                    "l",
                    "s",
                    Action::Limit {
                        count: 1,
                        offset: 0,
                    },
                ),
            ],
            outputs: IndexMap::new(),
            output_fields: IndexMap::new(),
        };
        let d = demands(&plan, &["l"]);
        assert_eq!(d["l"], Demand::Keep);
        assert_eq!(d["s"], Demand::Require);
        assert_eq!(d["j"], Demand::Require);
        assert_eq!(d["f"], Demand::Require);
        assert_eq!(d["dim"], Demand::Require);
        // Without the limit, the sort's input still needs order (stability), the join's
        // inputs do not.
        let d = demands(&plan, &["j"]);
        assert_eq!(d["j"], Demand::Keep);
        assert_eq!(d.get("f").copied().unwrap_or(Demand::None), Demand::None);
    }
}
