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

/// An event-time column of a relation, and how far behind the watermark its values may
/// be in the rows still to come.
///
/// A source's event-time column has no lag: the watermark is what drops rows behind it.
/// A stream-stream join delays columns: a bid that arrives now may still match an auction
/// that started up to the join's time range earlier, so the join's output can carry an
/// auction time up to that range behind the watermark (Spark's watermark propagation for
/// multiple stateful operators). A stateful step after the join compares such a column
/// with the watermark minus its lag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventColumn {
    /// The column.
    pub name: String,
    /// How far (µs) behind the watermark later rows may be; [`UNBOUNDED_LAG`] when nothing
    /// bounds it.
    pub lag_us: i64,
}

/// The lag of an event-time column that nothing bounds (a join's column outside its time
/// range): no watermark can finalise by it.
pub const UNBOUNDED_LAG: i64 = i64::MAX;

impl EventColumn {
    /// A column without lag.
    pub fn new(name: impl Into<String>) -> Self {
        EventColumn {
            name: name.into(),
            lag_us: 0,
        }
    }

    /// Whether a watermark can finalise by this column.
    pub fn is_bounded(&self) -> bool {
        self.lag_us != UNBOUNDED_LAG
    }

    /// Adds `column` to `columns`; a column already there by its name keeps the larger
    /// lag (rows from either input may come out under it).
    pub fn merge_into(columns: &mut Vec<EventColumn>, column: EventColumn) {
        match columns.iter_mut().find(|x| x.name == column.name) {
            Some(x) => x.lag_us = x.lag_us.max(column.lag_us),
            None => columns.push(column),
        }
    }
}

/// Event-time columns per relation of a plan, followed through the steps: renames and
/// projections of a column keep it an event-time column under its new name; a column
/// replaced by a computed value or dropped stops being one.
pub fn event_time_lineage(
    steps: &[ActionNode],
    ports: HashMap<String, Vec<String>>,
) -> HashMap<String, Vec<String>> {
    let ports = ports
        .into_iter()
        .map(|(port, cols)| (port, cols.into_iter().map(EventColumn::new).collect()))
        .collect();
    event_time_lags(steps, ports)
        .into_iter()
        .map(|(rel, cols)| (rel, cols.into_iter().map(|c| c.name).collect()))
        .collect()
}

/// [`event_time_lineage`] with each column's lag (see [`EventColumn`]). Aggregations keep
/// the lag of their event-time keys (they emit a group once the watermark minus that lag
/// passes it), a window's bounds get the lag of its time column, and a stream-stream join
/// (both sides with event-time columns) delays its columns by its `time_range`: future
/// output rows pair a new row of one side with a held row of the other, so the left time
/// can be up to `lower` behind the right side's and the right time up to `upper` behind
/// the left side's. An event-time key pair of the join bounds its columns too; any other
/// event-time column of a stream-stream join is unbounded.
pub fn event_time_lags(
    steps: &[ActionNode],
    ports: HashMap<String, Vec<EventColumn>>,
) -> HashMap<String, Vec<EventColumn>> {
    let mut map = ports;
    let lag_of =
        |cols: &[EventColumn], name: &str| cols.iter().find(|c| c.name == name).map(|c| c.lag_us);
    for step in steps {
        let mut cur = map.get(&step.target).cloned().unwrap_or_default();
        match &step.op {
            Action::RenameFields { mapping } => {
                for c in cur.iter_mut() {
                    if let Some(n) = mapping.get(&c.name) {
                        c.name = n.clone();
                    }
                }
            }
            Action::Project { fields } => {
                cur = fields
                    .iter()
                    .filter_map(|f| match &f.expr {
                        Expr::Column(c) => Some(EventColumn {
                            name: f.name.clone(),
                            lag_us: lag_of(&cur, c)?,
                        }),
                        _ => None,
                    })
                    .collect();
            }
            Action::WithFields { assignments } => {
                for a in assignments {
                    let kept = match &a.expr {
                        Expr::Column(c) => lag_of(&cur, c),
                        _ => None,
                    };
                    match (kept, cur.iter().position(|c| c.name == a.name)) {
                        (Some(lag_us), Some(i)) => cur[i].lag_us = lag_us,
                        (Some(lag_us), None) => cur.push(EventColumn {
                            name: a.name.clone(),
                            lag_us,
                        }),
                        (None, _) => cur.retain(|c| c.name != a.name),
                    }
                }
            }
            Action::DropFields { fields, .. } => cur.retain(|c| !fields.contains(&c.name)),
            Action::Join {
                right,
                left_keys,
                right_keys,
                time_range,
                ..
            } => {
                let other = map.get(right).cloned().unwrap_or_default();
                if !cur.is_empty() && !other.is_empty() {
                    cur = join_lags(&cur, &other, left_keys, right_keys, time_range.as_ref());
                } else {
                    // One side has no event time (a static table): the other side's rows
                    // come out of the join as they came in.
                    for c in other {
                        if lag_of(&cur, &c.name).is_none() {
                            cur.push(c);
                        }
                    }
                }
            }
            Action::Union { other, .. } => {
                for c in map.get(other).cloned().unwrap_or_default() {
                    EventColumn::merge_into(&mut cur, c);
                }
            }
            Action::Aggregate { group_by, .. } => cur = keys_of(&cur, group_by),
            // The window of an event-time column is event time too (Spark gives the
            // `window` struct the watermark metadata): its bounds are final once emitted
            // in append mode, which is what lets a later window aggregation or join use
            // them (chained stateful operators). A window with allowed lateness is open
            // that much longer, so its bounds lag the watermark by it too.
            Action::WindowAggregate {
                group_by, window, ..
            } => {
                let windowed = lag_of(&cur, &window.time_column);
                cur = keys_of(&cur, group_by);
                if let Some(lag_us) = windowed {
                    let lag_us = lag_us.saturating_add(window.allowed_lateness.as_micros());
                    cur.extend(WINDOW_BOUNDS.iter().map(|c| EventColumn {
                        name: c.to_string(),
                        lag_us,
                    }));
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

/// The event-time columns among an aggregation's keys, under the keys' names.
fn keys_of(cols: &[EventColumn], group_by: &[super::NamedExpr]) -> Vec<EventColumn> {
    group_by
        .iter()
        .filter_map(|g| match &g.expr {
            Expr::Column(c) => cols.iter().find(|x| x.name == *c).map(|x| EventColumn {
                name: g.name.clone(),
                lag_us: x.lag_us,
            }),
            _ => None,
        })
        .collect()
}

/// The event-time columns of a stream-stream join's output (see [`event_time_lags`]).
fn join_lags(
    left: &[EventColumn],
    right: &[EventColumn],
    left_keys: &[String],
    right_keys: &[String],
    time_range: Option<&super::JoinTimeRange>,
) -> Vec<EventColumn> {
    let find = |cols: &[EventColumn], name: &str| cols.iter().find(|c| c.name == name).cloned();
    let mut bounds: HashMap<(bool, String), i64> = HashMap::new();
    let mut bound = |is_left: bool, name: &str, lag: i64| {
        let b = bounds.entry((is_left, name.to_string())).or_insert(lag);
        *b = (*b).min(lag);
    };
    if let Some(r) = time_range {
        if let (Some(l), Some(rt)) = (find(left, &r.left), find(right, &r.right)) {
            // A new right row at time t matches held left rows down to t - lower; a new
            // left row at t matches held right rows down to t - upper.
            let behind = |lag: i64, d: i64| lag.saturating_add(d).max(0);
            bound(
                true,
                &l.name,
                l.lag_us.max(behind(rt.lag_us, r.lower.as_micros())),
            );
            bound(
                false,
                &rt.name,
                rt.lag_us.max(behind(l.lag_us, r.upper.as_micros())),
            );
        }
    }
    for (lk, rk) in left_keys.iter().zip(right_keys) {
        if let (Some(l), Some(r)) = (find(left, lk), find(right, rk)) {
            // Equal times: every output row has one new side, so its time is at most the
            // larger lag behind.
            let lag = l.lag_us.max(r.lag_us);
            bound(true, &l.name, lag);
            bound(false, &r.name, lag);
        }
    }
    let side = |cols: &[EventColumn], is_left: bool| {
        cols.iter()
            .map(|c| EventColumn {
                name: c.name.clone(),
                lag_us: bounds
                    .get(&(is_left, c.name.clone()))
                    .copied()
                    .unwrap_or(UNBOUNDED_LAG),
            })
            .collect::<Vec<_>>()
    };
    let mut out = side(left, true);
    for c in side(right, false) {
        EventColumn::merge_into(&mut out, c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{JoinType, NamedExpr};
    use indexmap::IndexMap;

    fn node(id: &str, target: &str, op: Action) -> ActionNode {
        ActionNode::new(id, target, op)
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
                        allowed_lateness: crate::streaming::Duration::ZERO,
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

    #[test]
    fn allowed_lateness_delays_a_windows_bounds() {
        let mut window = crate::ir::WindowSpec::new(
            "ts",
            crate::ir::WindowKind::Tumbling {
                size: crate::streaming::Duration::from_secs(10),
            },
        );
        window.allowed_lateness = crate::streaming::Duration::from_secs(30);
        let steps = [node(
            "w",
            "bids",
            Action::WindowAggregate {
                window,
                group_by: vec![],
                aggregates: vec![],
            },
        )];
        let ports = HashMap::from([(
            "bids".to_string(),
            vec![EventColumn {
                name: "ts".into(),
                lag_us: 5,
            }],
        )]);
        let l = event_time_lags(&steps, ports);
        // A window is updated until the watermark passes its end plus the lateness.
        assert_eq!(
            l["w"],
            WINDOW_BOUNDS
                .map(|c| EventColumn {
                    name: c.into(),
                    lag_us: 30_000_005,
                })
                .to_vec()
        );
    }

    #[test]
    fn a_time_range_join_delays_its_columns_and_aggregations_keep_the_delay() {
        use crate::ir::{JoinTimeRange, WindowKind, WindowSpec};
        use crate::streaming::Duration;
        let secs = |n: i64| n * 1_000_000;
        let join = |time_range: Option<JoinTimeRange>, keys: [&str; 2]| {
            node(
                "j",
                "bids",
                Action::Join {
                    right: "auctions".into(),
                    join_type: JoinType::Inner,
                    left_keys: vec![keys[0].into()],
                    right_keys: vec![keys[1].into()],
                    predicate: None,
                    null_safe: false,
                    time_range,
                },
            )
        };
        // bid_ts within [auction_ts, auction_ts + 10 s]: a new bid may still meet an
        // auction 10 s older; a new auction only bids at or after its own time.
        let range = JoinTimeRange {
            left: "bid_ts".into(),
            right: "auction_ts".into(),
            lower: Duration::ZERO,
            upper: Duration::from_secs(10),
        };
        let ports = || {
            HashMap::from([
                (
                    "bids".to_string(),
                    vec![EventColumn::new("bid_ts"), EventColumn::new("other_ts")],
                ),
                ("auctions".to_string(), vec![EventColumn::new("auction_ts")]),
            ])
        };
        let steps = vec![
            join(Some(range.clone()), ["auction", "id"]),
            node(
                "a",
                "j",
                Action::Aggregate {
                    group_by: vec![NamedExpr::column("id"), NamedExpr::column("auction_ts")],
                    aggregates: vec![],
                },
            ),
            node(
                "w",
                "j",
                Action::WindowAggregate {
                    window: WindowSpec {
                        time_column: "auction_ts".into(),
                        kind: WindowKind::Tumbling {
                            size: Duration::from_secs(60),
                        },
                        allowed_lateness: crate::streaming::Duration::ZERO,
                    },
                    group_by: vec![],
                    aggregates: vec![],
                },
            ),
        ];
        let l = event_time_lags(&steps, ports());
        let lag = |rel: &str, col: &str| l[rel].iter().find(|c| c.name == col).unwrap().lag_us;
        assert_eq!(lag("j", "bid_ts"), 0);
        assert_eq!(lag("j", "auction_ts"), secs(10));
        assert_eq!(lag("j", "other_ts"), UNBOUNDED_LAG);
        assert!(!l["j"]
            .iter()
            .find(|c| c.name == "other_ts")
            .unwrap()
            .is_bounded());
        assert_eq!(
            l["a"],
            vec![EventColumn {
                name: "auction_ts".into(),
                lag_us: secs(10)
            }]
        );
        assert_eq!(lag("w", "window_end"), secs(10));
        assert_eq!(lag("w", "window_start"), secs(10));

        // Without a range nothing bounds either side; equal event-time keys bound both.
        let l = event_time_lags(&[join(None, ["auction", "id"])], ports());
        assert!(l["j"].iter().all(|c| !c.is_bounded()));
        let l = event_time_lags(&[join(None, ["bid_ts", "auction_ts"])], ports());
        assert_eq!(lag_in(&l["j"], "bid_ts"), 0);
        assert_eq!(lag_in(&l["j"], "auction_ts"), 0);

        // A side without event time (a static table) leaves the other side as it was.
        let ports = HashMap::from([(
            "bids".to_string(),
            vec![EventColumn {
                name: "bid_ts".into(),
                lag_us: 7,
            }],
        )]);
        let l = event_time_lags(&[join(None, ["auction", "id"])], ports);
        assert_eq!(
            l["j"],
            vec![EventColumn {
                name: "bid_ts".into(),
                lag_us: 7
            }]
        );
    }

    fn lag_in(cols: &[EventColumn], name: &str) -> i64 {
        cols.iter().find(|c| c.name == name).unwrap().lag_us
    }
}
