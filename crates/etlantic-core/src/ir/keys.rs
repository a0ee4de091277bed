//! Which column sets identify a row of a plan's relations: the unique keys the inputs'
//! contracts declare (`unique` columns, the primary key), followed through the steps.
//!
//! A key survives what neither duplicates rows nor changes its columns: filters, sorts,
//! limits, deduplications, renames (under the new names) and projections that keep its
//! columns as they are. Anything that may repeat a row or rewrite a key column (explode,
//! union, joins, a computed value assigned to a key column, an opaque step) ends the keys
//! it touches.
//!
//! Deduplications and aggregations establish keys: one row per deduplication key, per
//! group, per window and group. On a stream that holds only when each of them emits a
//! key once: in append mode (the mode of every stateful step that feeds another), with
//! late rows dropped rather than accepted (an accepted late row reopens an evicted key)
//! and without a state TTL (an expired key starts over). The caller says whether that is
//! so ([`unique_keys`]'s `stateful_keys`). Besides those keys, the analysis only forgets
//! keys: a key it reports holds whenever the input keys do.
//!
//! The streaming runtime relies on these to keep less state: a stream-stream join whose
//! one side is unique on its join keys drops a row of the other side once it has met
//! that side's row (see `etlantic-datafusion`'s `streaming::join`).

use super::lineage::WINDOW_BOUNDS;
use super::{Action, ActionNode, Expr};
use std::collections::HashMap;

/// A set of columns whose values identify a row (column names, in no particular order).
pub type UniqueKey = Vec<String>;

/// Unique keys per relation of a plan: `ports` holds those of the plan's inputs; every
/// step's output gets the keys that survive it (see the module docs). With
/// `stateful_keys`, deduplications and aggregations add the keys they establish.
pub fn unique_keys(
    steps: &[ActionNode],
    ports: HashMap<String, Vec<UniqueKey>>,
    stateful_keys: bool,
) -> HashMap<String, Vec<UniqueKey>> {
    let mut map = ports;
    for step in steps {
        let mut cur = map.get(&step.target).cloned().unwrap_or_default();
        match &step.op {
            Action::RenameFields { mapping } => {
                for key in cur.iter_mut() {
                    for c in key.iter_mut() {
                        if let Some(n) = mapping.get(c) {
                            *c = n.clone();
                        }
                    }
                }
            }
            Action::Project { fields } => {
                // Each key column under the name a plain reference gives it.
                let renamed = |c: &String| {
                    fields.iter().find_map(|f| match &f.expr {
                        Expr::Column(src) if src == c => Some(f.name.clone()),
                        _ => None,
                    })
                };
                cur = cur
                    .iter()
                    .filter_map(|key| key.iter().map(renamed).collect())
                    .collect();
            }
            Action::WithFields { assignments } => {
                // A key column assigned anything but itself is no longer the key.
                let rewritten = |c: &String| {
                    assignments
                        .iter()
                        .any(|a| a.name == *c && a.expr != Expr::Column(c.clone()))
                };
                cur.retain(|key| !key.iter().any(rewritten));
            }
            Action::DropFields { fields, .. } => {
                cur.retain(|key| !key.iter().any(|c| fields.contains(c)));
            }
            // Fewer rows, the same columns.
            Action::Filter { .. }
            | Action::Sort { .. }
            | Action::Limit { .. }
            | Action::Distinct { .. }
            | Action::DeduplicateWithinWatermark { .. } => {}
            // One row per key from here on (a streaming deduplication keeps every key
            // until the watermark passes an event time among them, after which no row
            // of that key can come).
            Action::Deduplicate { keys, .. } => {
                if stateful_keys && !keys.is_empty() {
                    add_key(&mut cur, keys.clone());
                }
            }
            // One row per group (per window and group): the group columns are a key, and
            // so is an input key among them (one input row per value, so one group).
            Action::Aggregate { group_by, .. } => {
                cur = if stateful_keys {
                    group_keys(&cur, group_by, &[])
                } else {
                    vec![]
                };
            }
            Action::WindowAggregate { group_by, .. } => {
                cur = if stateful_keys {
                    group_keys(&cur, group_by, &WINDOW_BOUNDS)
                } else {
                    vec![]
                };
            }
            // Everything else may repeat rows or computes its own columns.
            _ => cur.clear(),
        }
        map.insert(step.id.clone(), cur);
    }
    map
}

/// The keys of an aggregation's output: its group columns with `extra` (a window's
/// bounds: one row per window and group), and each input key that its group columns
/// keep as plain columns (under their output names) with `extra` (a row may fall in
/// several sliding windows). None for a global aggregation, whose one row per emission
/// is no key a join could use.
fn group_keys(
    input: &[UniqueKey],
    group_by: &[super::NamedExpr],
    extra: &[&str],
) -> Vec<UniqueKey> {
    if group_by.is_empty() && extra.is_empty() {
        return vec![];
    }
    let with_extra = |mut key: UniqueKey| {
        key.extend(extra.iter().map(|c| c.to_string()));
        key
    };
    let grouped_as = |c: &String| {
        group_by.iter().find_map(|g| match &g.expr {
            Expr::Column(src) if src == c => Some(g.name.clone()),
            _ => None,
        })
    };
    let mut out = vec![with_extra(
        group_by.iter().map(|g| g.name.clone()).collect(),
    )];
    for key in input {
        if let Some(kept) = key.iter().map(grouped_as).collect::<Option<UniqueKey>>() {
            add_key(&mut out, with_extra(kept));
        }
    }
    out
}

fn add_key(keys: &mut Vec<UniqueKey>, key: UniqueKey) {
    if !keys.iter().any(|k| same_columns(k, &key)) {
        keys.push(key);
    }
}

fn same_columns(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().all(|c| b.contains(c))
}

/// Whether rows with equal values in `columns` are one row: some key of `keys` lies
/// within `columns` (a join on columns that contain a unique key matches at most one row
/// of that side per value).
pub fn is_unique_on(keys: &[UniqueKey], columns: &[String]) -> bool {
    keys.iter()
        .any(|k| !k.is_empty() && k.iter().all(|c| columns.contains(c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{JoinType, NamedExpr};
    use indexmap::IndexMap;

    fn node(id: &str, target: &str, op: Action) -> ActionNode {
        ActionNode::new(id, target, op)
    }

    fn keys_after(steps: Vec<ActionNode>, last: &str) -> Vec<UniqueKey> {
        let ports = HashMap::from([("persons".to_string(), vec![vec!["id".to_string()]])]);
        unique_keys(&steps, ports, true)
            .remove(last)
            .unwrap_or_default()
    }

    #[test]
    fn keys_follow_filters_renames_and_plain_projections() {
        let steps = vec![
            node(
                "f",
                "persons",
                Action::Filter {
                    predicate: Expr::parse("state == 'OR'").unwrap(),
                },
            ),
            node(
                "p",
                "f",
                Action::Project {
                    fields: vec![NamedExpr::column("id"), NamedExpr::column("name")],
                },
            ),
            node(
                "r",
                "p",
                Action::RenameFields {
                    mapping: IndexMap::from([("id".to_string(), "seller_id".to_string())]),
                },
            ),
        ];
        let keys = keys_after(steps, "r");
        assert_eq!(keys, vec![vec!["seller_id".to_string()]]);
        assert!(is_unique_on(&keys, &["seller_id".into()]));
        assert!(is_unique_on(&keys, &["seller_id".into(), "name".into()]));
        assert!(!is_unique_on(&keys, &["name".into()]));
    }

    #[test]
    fn keys_end_where_rows_may_repeat_or_key_columns_change() {
        let projected_away = vec![node(
            "p",
            "persons",
            Action::Project {
                fields: vec![NamedExpr::column("name")],
            },
        )];
        assert!(keys_after(projected_away, "p").is_empty());
        let rewritten = vec![node(
            "w",
            "persons",
            Action::WithFields {
                assignments: vec![NamedExpr {
                    name: "id".into(),
                    expr: Expr::parse("id % 10").unwrap(),
                }],
            },
        )];
        assert!(keys_after(rewritten, "w").is_empty());
        let joined = vec![node(
            "j",
            "persons",
            Action::Join {
                right: "persons".into(),
                join_type: JoinType::Inner,
                left_keys: vec!["name".into()],
                right_keys: vec!["name".into()],
                predicate: None,
                null_safe: false,
                time_range: None,
            },
        )];
        assert!(keys_after(joined, "j").is_empty());
        let exploded = vec![node(
            "x",
            "persons",
            Action::Explode {
                column: "tags".into(),
                alias: "tag".into(),
                outer: false,
            },
        )];
        assert!(keys_after(exploded, "x").is_empty());
    }

    #[test]
    fn deduplications_and_aggregations_add_keys_when_they_emit_a_key_once() {
        let dedup = vec![node(
            "d",
            "persons",
            Action::Deduplicate {
                keys: vec!["email".into()],
                keep_last: false,
            },
        )];
        let keys = keys_after(dedup.clone(), "d");
        assert!(is_unique_on(&keys, &["email".into()]));
        assert!(is_unique_on(&keys, &["id".into()]));
        let windowed = vec![node(
            "w",
            "persons",
            Action::WindowAggregate {
                window: crate::ir::WindowSpec {
                    time_column: "ts".into(),
                    kind: crate::ir::WindowKind::Tumbling {
                        size: crate::streaming::Duration::from_secs(10),
                    },
                    allowed_lateness: crate::streaming::Duration::ZERO,
                },
                group_by: vec![NamedExpr::column("id"), NamedExpr::column("name")],
                aggregates: vec![],
            },
        )];
        let keys = keys_after(windowed.clone(), "w");
        let window_and_id: Vec<String> = ["id", "window_start", "window_end"]
            .map(String::from)
            .to_vec();
        // The group columns, and the input key `id` among them, with the window.
        assert!(is_unique_on(&keys, &window_and_id));
        assert!(!is_unique_on(&keys, &["id".into()]), "one row per window");
        assert!(!is_unique_on(
            &keys,
            &["name", "window_start", "window_end"].map(String::from)
        ));
        // Not when a stateful step may emit a key twice (accepted late rows, a TTL).
        let ports = HashMap::from([("persons".to_string(), vec![vec!["id".to_string()]])]);
        let keys = unique_keys(&dedup, ports.clone(), false);
        assert_eq!(keys["d"], vec![vec!["id".to_string()]]);
        let keys = unique_keys(&windowed, ports, false);
        assert!(keys["w"].is_empty());
    }
}
