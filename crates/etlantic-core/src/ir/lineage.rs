//! Which columns of a plan's relations are event-time columns: the watermarked
//! event-time columns of the inputs, followed through the steps. A rename or a plain
//! projection keeps a column an event-time column under its new name; a column replaced
//! by a computed value, dropped, or aggregated away stops being one; a join or a union
//! carries the columns of both sides. (Spark keeps the watermark metadata of a column
//! through aliases the same way.)

use super::{Action, ActionNode, Expr};
use std::collections::HashMap;

/// The columns a window aggregation adds to its output: each window's bounds.
pub const WINDOW_BOUNDS: [&str; 2] = ["window_start", "window_end"];

/// The column to compare with the watermark among a relation's event-time columns: a
/// window's end when the relation has window bounds (Spark compares a window struct's
/// `end`: a window is emitted once its end passes the watermark, while its start may
/// already be behind it), else the first.
pub fn watermark_column(columns: &[String]) -> Option<&String> {
    columns
        .iter()
        .find(|c| c.as_str() == WINDOW_BOUNDS[1])
        .or_else(|| columns.first())
}

/// Event-time columns per relation of a plan, followed through the steps: renames and
/// projections of a column keep it an event-time column under its new name; a column
/// replaced by a computed value or dropped stops being one.
pub fn event_time_lineage(
    steps: &[ActionNode],
    ports: HashMap<String, Vec<String>>,
) -> HashMap<String, Vec<String>> {
    let mut map = ports;
    for step in steps {
        let mut cur = map.get(&step.target).cloned().unwrap_or_default();
        match &step.op {
            Action::RenameFields { mapping } => {
                for c in cur.iter_mut() {
                    if let Some(n) = mapping.get(c) {
                        *c = n.clone();
                    }
                }
            }
            Action::Project { fields } => {
                cur = fields
                    .iter()
                    .filter(|f| matches!(&f.expr, Expr::Column(c) if cur.contains(c)))
                    .map(|f| f.name.clone())
                    .collect();
            }
            Action::WithFields { assignments } => {
                for a in assignments {
                    let keeps = matches!(&a.expr, Expr::Column(c) if cur.contains(c));
                    if keeps {
                        if !cur.contains(&a.name) {
                            cur.push(a.name.clone());
                        }
                    } else {
                        cur.retain(|c| *c != a.name);
                    }
                }
            }
            Action::DropFields { fields, .. } => cur.retain(|c| !fields.contains(c)),
            Action::Join { right, .. } | Action::Union { other: right, .. } => {
                for c in map.get(right).cloned().unwrap_or_default() {
                    if !cur.contains(&c) {
                        cur.push(c);
                    }
                }
            }
            Action::Aggregate { group_by, .. } => {
                cur = group_by
                    .iter()
                    .filter(|g| matches!(&g.expr, Expr::Column(c) if cur.contains(c)))
                    .map(|g| g.name.clone())
                    .collect();
            }
            // The window of an event-time column is event time too (Spark gives the
            // `window` struct the watermark metadata): its bounds are final once emitted
            // in append mode, which is what lets a later window aggregation or join use
            // them (chained stateful operators).
            Action::WindowAggregate {
                group_by, window, ..
            } => {
                let windowed = cur.contains(&window.time_column);
                cur = group_by
                    .iter()
                    .filter(|g| matches!(&g.expr, Expr::Column(c) if cur.contains(c)))
                    .map(|g| g.name.clone())
                    .collect();
                if windowed {
                    cur.extend(WINDOW_BOUNDS.iter().map(|c| c.to_string()));
                }
            }
            Action::Filter { .. }
            | Action::Sort { .. }
            | Action::Limit { .. }
            | Action::Distinct { .. }
            | Action::Deduplicate { .. }
            | Action::DeduplicateWithinWatermark { .. }
            | Action::Explode { .. } => {}
            // Anything else computes its own columns.
            #[allow(unreachable_patterns)]
            _ => cur.clear(),
        }
        map.insert(step.id.clone(), cur);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{JoinType, NamedExpr};
    use indexmap::IndexMap;

    fn node(id: &str, target: &str, op: Action) -> ActionNode {
        ActionNode {
            id: id.into(),
            action: op.id().into(),
            target: target.into(),
            op,
        }
    }

    #[test]
    fn follows_renames_projections_and_joins() {
        let steps = vec![
            node(
                "r",
                "clicks",
                Action::RenameFields {
                    mapping: IndexMap::from([("ts".to_string(), "click_ts".to_string())]),
                },
            ),
            node(
                "p",
                "imps",
                Action::Project {
                    fields: vec![
                        NamedExpr::column("ad"),
                        NamedExpr {
                            name: "imp_ts".into(),
                            expr: Expr::col("ts"),
                        },
                    ],
                },
            ),
            node(
                "w",
                "p",
                Action::WithFields {
                    assignments: vec![NamedExpr {
                        name: "imp_ts".into(),
                        expr: Expr::parse("imp_ts + 1").unwrap(),
                    }],
                },
            ),
            node(
                "j",
                "p",
                Action::Join {
                    right: "r".into(),
                    join_type: JoinType::Inner,
                    left_keys: vec!["ad".into()],
                    right_keys: vec!["ad".into()],
                    predicate: None,
                    null_safe: false,
                    time_range: None,
                },
            ),
        ];
        let ports = HashMap::from([
            ("clicks".to_string(), vec!["ts".to_string()]),
            ("imps".to_string(), vec!["ts".to_string()]),
        ]);
        let l = event_time_lineage(&steps, ports);
        assert_eq!(l["r"], vec!["click_ts"]);
        assert_eq!(l["p"], vec!["imp_ts"]);
        assert!(l["w"].is_empty());
        assert_eq!(l["j"], vec!["imp_ts", "click_ts"]);
    }

    #[test]
    fn a_window_of_event_time_is_event_time() {
        let window = |id: &str, column: &str| {
            node(
                id,
                "bids",
                Action::WindowAggregate {
                    window: crate::ir::WindowSpec {
                        time_column: column.into(),
                        kind: crate::ir::WindowKind::Tumbling {
                            size: crate::streaming::Duration::from_secs(10),
                        },
                    },
                    group_by: vec![NamedExpr::column("auction"), NamedExpr::column("ts")],
                    aggregates: vec![],
                },
            )
        };
        let ports = HashMap::from([("bids".to_string(), vec!["ts".to_string()])]);
        let l = event_time_lineage(&[window("w", "ts"), window("v", "other")], ports);
        assert_eq!(l["w"], vec!["ts", "window_start", "window_end"]);
        // A window over a column without a watermark is not event time.
        assert_eq!(l["v"], vec!["ts"]);
        assert_eq!(watermark_column(&l["w"]).unwrap(), "window_end");
        assert_eq!(watermark_column(&l["v"]).unwrap(), "ts");
        assert_eq!(watermark_column(&[]), None);
    }
}
