//! The column names of a step's output, from the column names of its inputs: what a
//! static analysis over a plan (which columns a predicate may move across) needs without
//! an engine to infer the types. Follows the engine's column rules (see
//! `etlantic-datafusion`'s actions): a join outputs the left columns, then the right ones
//! but the keys of the same name on both sides (semi and anti joins: the left columns);
//! a union by name outputs the target's columns, then the other's extra ones.

use super::lineage::WINDOW_BOUNDS;
use super::{Action, JoinType};

/// The output columns of `op` applied to a relation with `target` columns (and, for a
/// join or a union, the other relation with `other` columns); `None` when they are not
/// known without an engine (a custom processor) or a needed input is unknown.
pub fn step_columns(
    op: &Action,
    target: &[String],
    other: Option<&[String]>,
) -> Option<Vec<String>> {
    let mut cols = target.to_vec();
    match op {
        Action::Filter { .. }
        | Action::Sort { .. }
        | Action::Limit { .. }
        | Action::Distinct { .. }
        | Action::Deduplicate { .. }
        | Action::DeduplicateWithinWatermark { .. } => {}
        Action::Project { fields } => cols = fields.iter().map(|f| f.name.clone()).collect(),
        Action::WithFields { assignments } => {
            for a in assignments {
                if !cols.contains(&a.name) {
                    cols.push(a.name.clone());
                }
            }
        }
        Action::WindowFields { assignments } => {
            for a in assignments {
                if !cols.contains(&a.name) {
                    cols.push(a.name.clone());
                }
            }
        }
        Action::DropFields { fields, .. } => cols.retain(|c| !fields.contains(c)),
        Action::RenameFields { mapping } => {
            for c in &mut cols {
                if let Some(new) = mapping.get(c) {
                    *c = new.clone();
                }
            }
        }
        Action::Join {
            join_type,
            left_keys,
            right_keys,
            ..
        } => {
            if !matches!(join_type, JoinType::Semi | JoinType::Anti) {
                let merged: Vec<&String> = left_keys
                    .iter()
                    .zip(right_keys)
                    .filter(|(l, r)| l == r)
                    .map(|(l, _)| l)
                    .collect();
                for c in other? {
                    if !merged.contains(&c) && !cols.contains(c) {
                        cols.push(c.clone());
                    }
                }
            }
        }
        Action::Union { by_name, .. } => {
            if *by_name {
                for c in other? {
                    if !cols.contains(c) {
                        cols.push(c.clone());
                    }
                }
            }
        }
        Action::Aggregate {
            group_by,
            aggregates,
        } => {
            cols = group_by
                .iter()
                .map(|g| g.name.clone())
                .chain(aggregates.iter().map(|a| a.name.clone()))
                .collect()
        }
        Action::WindowAggregate {
            group_by,
            aggregates,
            ..
        } => {
            cols = WINDOW_BOUNDS
                .iter()
                .map(|b| b.to_string())
                .chain(group_by.iter().map(|g| g.name.clone()))
                .chain(aggregates.iter().map(|a| a.name.clone()))
                .collect()
        }
        Action::Explode { alias, .. } => {
            if !cols.contains(alias) {
                cols.push(alias.clone());
            }
        }
        Action::Process { .. } => return None,
    }
    Some(cols)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Expr, NamedExpr};
    use indexmap::IndexMap;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn joins_merge_same_named_keys_and_unions_append_the_other_columns() {
        let join = Action::Join {
            right: "r".into(),
            join_type: JoinType::Left,
            left_keys: s(&["id", "a"]),
            right_keys: s(&["id", "b"]),
            predicate: None,
            null_safe: false,
            time_range: None,
        };
        assert_eq!(
            step_columns(&join, &s(&["id", "a", "x"]), Some(&s(&["id", "b", "y"]))),
            Some(s(&["id", "a", "x", "b", "y"]))
        );
        let union = Action::Union {
            other: "o".into(),
            by_name: true,
            allow_missing: true,
            distinct: false,
        };
        assert_eq!(
            step_columns(&union, &s(&["a", "b"]), Some(&s(&["c", "a"]))),
            Some(s(&["a", "b", "c"]))
        );
        let rename = Action::RenameFields {
            mapping: IndexMap::from([("a".to_string(), "z".to_string())]),
        };
        assert_eq!(
            step_columns(&rename, &s(&["a", "b"]), None),
            Some(s(&["z", "b"]))
        );
        let with = Action::WithFields {
            assignments: vec![NamedExpr {
                name: "c".into(),
                expr: Expr::col("a"),
            }],
        };
        assert_eq!(step_columns(&with, &s(&["a"]), None), Some(s(&["a", "c"])));
    }
}
