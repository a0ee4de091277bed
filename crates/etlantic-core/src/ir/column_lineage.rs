//! Column-level lineage: which input columns each output column is computed from, and
//! which input columns decide which rows there are (filters, join keys, grouping, sort
//! keys, windows). The vocabulary is OpenLineage's column-lineage facet: a *direct*
//! dependency is an identity, a transformation or an aggregation of the input value; an
//! *indirect* one affects the whole relation (a filter, a join, a group by, a sort, a
//! window).
//!
//! The analysis is static: it follows each step of a plan as [`super::columns`] does,
//! and never needs an engine. A step whose output columns are not known statically (a
//! custom processor) makes its relation *opaque*: its columns have no lineage rather than
//! a guessed one.

use super::action::{Action, Aggregate, NamedExpr};
use super::columns::step_columns;
use super::lineage::WINDOW_BOUNDS;
use super::{DecodedPlan, Expr};
use indexmap::IndexMap;
use std::collections::{BTreeMap, BTreeSet};

/// A column of an input relation (an input port of a plan, or a pipeline source).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    /// The input relation.
    pub relation: String,
    /// Its column.
    pub column: String,
}

impl Origin {
    /// Column `column` of `relation`.
    pub fn new(relation: impl Into<String>, column: impl Into<String>) -> Self {
        Origin {
            relation: relation.into(),
            column: column.into(),
        }
    }
}

/// How an output value is computed from an input column. Ordered from the weakest: a
/// chain of steps takes the strongest of its links (an identity of an aggregate is an
/// aggregation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direct {
    /// The value itself, under any name.
    Identity,
    /// A value computed from it row by row.
    Transformation,
    /// A value computed from it over a group of rows.
    Aggregation,
}

impl Direct {
    /// OpenLineage's subtype name.
    pub fn subtype(self) -> &'static str {
        match self {
            Direct::Identity => "IDENTITY",
            Direct::Transformation => "TRANSFORMATION",
            Direct::Aggregation => "AGGREGATION",
        }
    }
}

/// How an input column decides which rows a relation has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Indirect {
    /// A filter predicate, or the columns that decide which duplicate stays.
    Filter,
    /// A join key or join condition.
    Join,
    /// A grouping column.
    GroupBy,
    /// A sort key.
    Sort,
    /// The event-time column a window is assigned by.
    Window,
}

impl Indirect {
    /// OpenLineage's subtype name.
    pub fn subtype(self) -> &'static str {
        match self {
            Indirect::Filter => "FILTER",
            Indirect::Join => "JOIN",
            Indirect::GroupBy => "GROUP_BY",
            Indirect::Sort => "SORT",
            Indirect::Window => "WINDOW",
        }
    }
}

/// The lineage of one relation: per column, the input columns it is computed from; and
/// the input columns that decide its rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RelationLineage {
    /// Column → the input columns it is computed from, and how. A column with an empty
    /// map depends on no input column (a literal, `count(*)`).
    pub columns: IndexMap<String, BTreeMap<Origin, Direct>>,
    /// The input columns that decide which rows the relation has.
    pub rows: BTreeMap<Origin, BTreeSet<Indirect>>,
    /// The columns are not known statically (a custom processor): `columns` is empty and
    /// says nothing.
    pub opaque: bool,
}

impl RelationLineage {
    /// An input relation: each column is itself.
    pub fn input(relation: &str, columns: &[String]) -> Self {
        RelationLineage {
            columns: columns
                .iter()
                .map(|c| {
                    let origin = Origin::new(relation, c.clone());
                    (c.clone(), BTreeMap::from([(origin, Direct::Identity)]))
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A relation whose columns are not known statically, keeping the rows' lineage of
    /// what it reads.
    pub fn opaque(rows: BTreeMap<Origin, BTreeSet<Indirect>>) -> Self {
        RelationLineage {
            columns: IndexMap::new(),
            rows,
            opaque: true,
        }
    }

    /// The column names, in order (`None` when opaque).
    pub fn column_names(&self) -> Option<Vec<String>> {
        (!self.opaque).then(|| self.columns.keys().cloned().collect())
    }

    /// The input columns an expression over this relation reads, each with how the
    /// expression uses it: a bare column reference is an identity, anything else a
    /// transformation (composed with how the column itself was computed).
    pub fn of_expr(&self, expr: &Expr) -> BTreeMap<Origin, Direct> {
        let how = match expr {
            Expr::Column(_) => Direct::Identity,
            _ => Direct::Transformation,
        };
        let mut out = BTreeMap::new();
        for c in expr.columns() {
            if let Some(origins) = self.columns.get(&c) {
                for (o, d) in origins {
                    merge_direct(&mut out, o.clone(), (*d).max(how));
                }
            }
        }
        out
    }

    /// The input columns of `column`, as a value computed from it.
    fn transformed(&self, column: &str) -> BTreeMap<Origin, Direct> {
        let mut out = BTreeMap::new();
        for (o, d) in self.columns.get(column).into_iter().flatten() {
            merge_direct(&mut out, o.clone(), (*d).max(Direct::Transformation));
        }
        out
    }

    /// Records that the input columns `expr` reads decide the rows, as `how`.
    fn rows_by_expr(&mut self, expr: &Expr, how: Indirect) {
        for o in self.of_expr(expr).into_keys() {
            self.rows.entry(o).or_default().insert(how);
        }
    }

    /// Records that the input columns of the named columns decide the rows, as `how`.
    fn rows_by_columns<'a>(
        &mut self,
        columns: impl IntoIterator<Item = &'a String>,
        how: Indirect,
    ) {
        for c in columns {
            self.rows_by_expr(&Expr::Column(c.clone()), how);
        }
    }

    fn merge_rows(&mut self, other: &RelationLineage) {
        for (o, hows) in &other.rows {
            self.rows.entry(o.clone()).or_default().extend(hows);
        }
    }

    /// This relation's lineage with its inputs replaced by what they are computed from:
    /// `inputs` gives each input relation's own lineage (a plan's ports bound to upstream
    /// relations). Inputs not in `inputs` stay as they are; a column computed from an
    /// opaque input's column is left out (its lineage is unknown).
    pub fn through(&self, inputs: &BTreeMap<String, RelationLineage>) -> RelationLineage {
        let mut out = RelationLineage {
            opaque: self.opaque,
            ..Default::default()
        };
        // `None`: not one of `inputs`; `Some(None)`: an input whose columns are unknown.
        let resolve = |o: &Origin| -> Option<Option<BTreeMap<Origin, Direct>>> {
            let up = inputs.get(&o.relation)?;
            Some(match up.opaque {
                true => None,
                false => Some(up.columns.get(&o.column).cloned().unwrap_or_default()),
            })
        };
        'columns: for (name, origins) in &self.columns {
            let mut col = BTreeMap::new();
            for (o, d) in origins {
                match resolve(o) {
                    Some(Some(up)) => {
                        for (uo, ud) in up {
                            merge_direct(&mut col, uo, ud.max(*d));
                        }
                    }
                    // Computed from a column whose own lineage is unknown: unknown too.
                    Some(None) => continue 'columns,
                    None => merge_direct(&mut col, o.clone(), *d),
                }
            }
            out.columns.insert(name.clone(), col);
        }
        for (o, hows) in &self.rows {
            match resolve(o) {
                Some(up) => {
                    for uo in up.unwrap_or_default().into_keys() {
                        out.rows.entry(uo).or_default().extend(hows);
                    }
                }
                None => {
                    out.rows.entry(o.clone()).or_default().extend(hows);
                }
            }
        }
        // What decides an input's rows decides the rows of everything computed from it.
        for (relation, up) in inputs {
            if self.reads(relation) {
                out.merge_rows(up);
            }
        }
        out
    }

    /// Whether any column or row decision of this relation comes from `relation`.
    fn reads(&self, relation: &str) -> bool {
        self.columns
            .values()
            .flat_map(|m| m.keys())
            .chain(self.rows.keys())
            .any(|o| o.relation == relation)
    }
}

fn merge_direct(into: &mut BTreeMap<Origin, Direct>, origin: Origin, how: Direct) {
    let e = into.entry(origin).or_insert(how);
    *e = (*e).max(how);
}

/// The lineage of each output of `plan`, in terms of its input ports. `inputs` gives each
/// input's columns (the plan's declared fields are used for an input it does not name).
pub fn plan_lineage(
    plan: &DecodedPlan,
    inputs: &BTreeMap<String, Vec<String>>,
) -> IndexMap<String, RelationLineage> {
    let mut relations: BTreeMap<String, RelationLineage> = BTreeMap::new();
    for input in &plan.inputs {
        let columns = inputs
            .get(&input.id)
            .cloned()
            .unwrap_or_else(|| input.fields.iter().map(|f| f.name.clone()).collect());
        relations.insert(
            input.id.clone(),
            RelationLineage::input(&input.id, &columns),
        );
    }
    for step in &plan.steps {
        let target = relations.get(&step.target).cloned().unwrap_or_default();
        let other = secondary(&step.op).and_then(|o| relations.get(o).cloned());
        let out = step_lineage(&step.op, target, other.as_ref());
        relations.insert(step.id.clone(), out);
    }
    plan.outputs
        .iter()
        .map(|(port, rel)| {
            (
                port.clone(),
                relations.get(rel).cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// The second relation a join or union reads.
fn secondary(op: &Action) -> Option<&String> {
    match op {
        Action::Join { right, .. } => Some(right),
        Action::Union { other, .. } => Some(other),
        _ => None,
    }
}

/// The lineage of `op` applied to `target` (and `other`, for a join or union).
pub fn step_lineage(
    op: &Action,
    mut rel: RelationLineage,
    other: Option<&RelationLineage>,
) -> RelationLineage {
    if rel.opaque && !matches!(op, Action::Union { .. } | Action::Join { .. }) {
        return RelationLineage::opaque(rel.rows);
    }
    match op {
        Action::Filter { predicate } => rel.rows_by_expr(predicate, Indirect::Filter),
        Action::Project { fields } => rel.columns = computed(&rel, fields),
        Action::WithFields { assignments } => {
            // Evaluated in order: a later assignment sees the earlier ones.
            for a in assignments {
                let col = rel.of_expr(&a.expr);
                rel.columns.insert(a.name.clone(), col);
            }
        }
        Action::WindowFields { assignments } => {
            // Every assignment reads the input rows; the partition and order decide which
            // rows a value comes from (OpenLineage's INDIRECT WINDOW).
            let input = rel.clone();
            for a in assignments {
                for p in &a.partition_by {
                    rel.rows_by_expr(p, Indirect::Window);
                }
                for k in &a.order_by {
                    rel.rows_by_expr(&k.expr, Indirect::Window);
                }
                rel.columns.insert(a.name.clone(), input.of_expr(&a.call));
            }
        }
        Action::DropFields { fields, .. } => rel.columns.retain(|c, _| !fields.contains(c)),
        Action::RenameFields { mapping } => {
            rel.columns = rel
                .columns
                .into_iter()
                .map(|(c, o)| (mapping.get(&c).cloned().unwrap_or(c), o))
                .collect();
        }
        Action::Sort { keys } => {
            for k in keys {
                rel.rows_by_expr(&k.expr, Indirect::Sort);
            }
        }
        Action::Limit { .. } => {}
        Action::Distinct { fields } => {
            let cols: Vec<String> = match fields {
                Some(f) => f.clone(),
                None => rel.columns.keys().cloned().collect(),
            };
            rel.rows_by_columns(&cols, Indirect::Filter);
        }
        Action::Deduplicate { keys, .. } => {
            let cols: Vec<String> = match keys.is_empty() {
                true => rel.columns.keys().cloned().collect(),
                false => keys.clone(),
            };
            rel.rows_by_columns(&cols, Indirect::Filter);
        }
        Action::DeduplicateWithinWatermark { keys } => rel.rows_by_columns(keys, Indirect::Filter),
        Action::Explode { column, alias, .. } => {
            let col = rel.transformed(column);
            rel.columns.insert(alias.clone(), col);
        }
        Action::Aggregate {
            group_by,
            aggregates,
        } => rel = grouped(rel, group_by, aggregates, IndexMap::new()),
        Action::WindowAggregate {
            window,
            group_by,
            aggregates,
        } => {
            let bound = rel.transformed(&window.time_column);
            rel.rows_by_columns([&window.time_column], Indirect::Window);
            let bounds = WINDOW_BOUNDS
                .iter()
                .map(|b| (b.to_string(), bound.clone()))
                .collect();
            rel = grouped(rel, group_by, aggregates, bounds);
        }
        Action::Join {
            left_keys,
            right_keys,
            predicate,
            time_range,
            join_type,
            ..
        } => {
            let Some(right) = other else {
                return RelationLineage::opaque(rel.rows);
            };
            let mut left = rel;
            let mut right = right.clone();
            left.rows_by_columns(left_keys, Indirect::Join);
            right.rows_by_columns(right_keys, Indirect::Join);
            if let Some(t) = time_range {
                left.rows_by_columns([&t.left], Indirect::Join);
                right.rows_by_columns([&t.right], Indirect::Join);
            }
            let columns = match (left.column_names(), right.column_names()) {
                (Some(l), Some(r)) => step_columns(op, &l, Some(&r)),
                _ => None,
            };
            let mut out = RelationLineage {
                rows: left.rows.clone(),
                ..Default::default()
            };
            out.merge_rows(&right);
            match columns {
                Some(names) => {
                    let semi = matches!(join_type, super::JoinType::Semi | super::JoinType::Anti);
                    for name in names {
                        let mut col = left.columns.get(&name).cloned().unwrap_or_default();
                        if !semi {
                            // A key of the same name on both sides is one column, from
                            // either side.
                            for (o, d) in right.columns.get(&name).cloned().unwrap_or_default() {
                                merge_direct(&mut col, o, d);
                            }
                        }
                        out.columns.insert(name, col);
                    }
                }
                None => out.opaque = true,
            }
            if let Some(p) = predicate {
                if !out.opaque {
                    out.rows_by_expr(p, Indirect::Join);
                }
            }
            return out;
        }
        Action::Union { by_name, .. } => {
            let Some(other) = other else {
                return RelationLineage::opaque(rel.rows);
            };
            let mut out = RelationLineage {
                rows: rel.rows.clone(),
                opaque: rel.opaque || other.opaque,
                ..Default::default()
            };
            out.merge_rows(other);
            if out.opaque {
                return RelationLineage::opaque(out.rows);
            }
            let (Some(t), Some(o)) = (rel.column_names(), other.column_names()) else {
                return RelationLineage::opaque(out.rows);
            };
            let names = step_columns(op, &t, Some(&o)).unwrap_or(t.clone());
            for (i, name) in names.iter().enumerate() {
                let mut col = rel.columns.get(name).cloned().unwrap_or_default();
                let theirs = match by_name {
                    true => other.columns.get(name),
                    false => o.get(i).and_then(|n| other.columns.get(n)),
                };
                for (o, d) in theirs.cloned().unwrap_or_default() {
                    merge_direct(&mut col, o, d);
                }
                out.columns.insert(name.clone(), col);
            }
            return out;
        }
        Action::Process { keys, .. } => {
            rel.rows_by_columns(keys, Indirect::GroupBy);
            return RelationLineage::opaque(rel.rows);
        }
    }
    rel
}

/// The columns `fields` compute over `rel`.
fn computed(
    rel: &RelationLineage,
    fields: &[NamedExpr],
) -> IndexMap<String, BTreeMap<Origin, Direct>> {
    fields
        .iter()
        .map(|f| (f.name.clone(), rel.of_expr(&f.expr)))
        .collect()
}

/// An aggregation's lineage: `leading` columns (a window's bounds), the grouping columns,
/// then the aggregates.
fn grouped(
    mut rel: RelationLineage,
    group_by: &[NamedExpr],
    aggregates: &[Aggregate],
    leading: IndexMap<String, BTreeMap<Origin, Direct>>,
) -> RelationLineage {
    for g in group_by {
        rel.rows_by_expr(&g.expr, Indirect::GroupBy);
    }
    let mut columns = leading;
    columns.extend(computed(&rel, group_by));
    for a in aggregates {
        let col = a
            .arg
            .as_ref()
            .map(|e| {
                rel.of_expr(e)
                    .into_keys()
                    .map(|o| (o, Direct::Aggregation))
                    .collect()
            })
            .unwrap_or_default();
        columns.insert(a.name.clone(), col);
    }
    rel.columns = columns;
    rel
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ActionNode, AggFunc, JoinType, PlanInput};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn direct(pairs: &[(&str, &str, Direct)]) -> BTreeMap<Origin, Direct> {
        pairs
            .iter()
            .map(|(r, c, d)| (Origin::new(*r, *c), *d))
            .collect()
    }

    fn plan(inputs: &[&str], steps: Vec<ActionNode>, output: &str) -> DecodedPlan {
        DecodedPlan {
            inputs: inputs
                .iter()
                .map(|i| PlanInput {
                    id: i.to_string(),
                    fields: vec![],
                    unbounded: false,
                })
                .collect(),
            steps,
            outputs: IndexMap::from([("out".to_string(), output.to_string())]),
            output_fields: IndexMap::new(),
        }
    }

    #[test]
    fn projections_renames_and_aggregates_follow_their_inputs() {
        let steps = vec![
            ActionNode::new(
                "f",
                "orders",
                Action::Filter {
                    predicate: Expr::parse("status == 'paid'").unwrap(),
                },
            ),
            ActionNode::new(
                "w",
                "f",
                Action::WithFields {
                    assignments: vec![NamedExpr {
                        name: "net".into(),
                        expr: Expr::parse("amount - discount").unwrap(),
                    }],
                },
            ),
            ActionNode::new(
                "r",
                "w",
                Action::RenameFields {
                    mapping: IndexMap::from([("customer".to_string(), "who".to_string())]),
                },
            ),
            ActionNode::new(
                "a",
                "r",
                Action::Aggregate {
                    group_by: vec![NamedExpr::column("who")],
                    aggregates: vec![
                        Aggregate {
                            name: "total".into(),
                            func: AggFunc::Sum,
                            arg: Some(Expr::col("net")),
                        },
                        Aggregate {
                            name: "n".into(),
                            func: AggFunc::CountAll,
                            arg: None,
                        },
                    ],
                },
            ),
        ];
        let p = plan(&["orders"], steps, "a");
        let inputs = BTreeMap::from([(
            "orders".to_string(),
            s(&["customer", "amount", "discount", "status"]),
        )]);
        let out = &plan_lineage(&p, &inputs)["out"];
        assert_eq!(out.column_names(), Some(s(&["who", "total", "n"])));
        assert_eq!(
            out.columns["who"],
            direct(&[("orders", "customer", Direct::Identity)])
        );
        assert_eq!(
            out.columns["total"],
            direct(&[
                ("orders", "amount", Direct::Aggregation),
                ("orders", "discount", Direct::Aggregation),
            ])
        );
        assert!(out.columns["n"].is_empty());
        assert_eq!(
            out.rows,
            BTreeMap::from([
                (
                    Origin::new("orders", "customer"),
                    BTreeSet::from([Indirect::GroupBy])
                ),
                (
                    Origin::new("orders", "status"),
                    BTreeSet::from([Indirect::Filter])
                ),
            ])
        );
    }

    #[test]
    fn joins_merge_keys_and_windows_derive_their_bounds() {
        let steps = vec![
            ActionNode::new(
                "j",
                "clicks",
                Action::Join {
                    right: "pages".into(),
                    join_type: JoinType::Inner,
                    left_keys: s(&["page"]),
                    right_keys: s(&["page"]),
                    predicate: None,
                    null_safe: false,
                    time_range: None,
                },
            ),
            ActionNode::new(
                "w",
                "j",
                Action::WindowAggregate {
                    window: crate::ir::WindowSpec {
                        time_column: "ts".into(),
                        kind: crate::ir::WindowKind::Tumbling {
                            size: crate::streaming::Duration::from_secs(60),
                        },
                        allowed_lateness: crate::streaming::Duration::ZERO,
                    },
                    group_by: vec![NamedExpr::column("title")],
                    aggregates: vec![Aggregate {
                        name: "clicks".into(),
                        func: AggFunc::Count,
                        arg: Some(Expr::col("page")),
                    }],
                },
            ),
        ];
        let p = plan(&["clicks", "pages"], steps, "w");
        let inputs = BTreeMap::from([
            ("clicks".to_string(), s(&["page", "ts"])),
            ("pages".to_string(), s(&["page", "title"])),
        ]);
        let out = &plan_lineage(&p, &inputs)["out"];
        assert_eq!(
            out.column_names(),
            Some(s(&["window_start", "window_end", "title", "clicks"]))
        );
        assert_eq!(
            out.columns["window_end"],
            direct(&[("clicks", "ts", Direct::Transformation)])
        );
        assert_eq!(
            out.columns["title"],
            direct(&[("pages", "title", Direct::Identity)])
        );
        assert_eq!(
            out.columns["clicks"],
            direct(&[
                ("clicks", "page", Direct::Aggregation),
                ("pages", "page", Direct::Aggregation),
            ])
        );
        assert_eq!(
            out.rows[&Origin::new("clicks", "ts")],
            BTreeSet::from([Indirect::Window])
        );
        assert_eq!(
            out.rows[&Origin::new("pages", "page")],
            BTreeSet::from([Indirect::Join])
        );
        assert_eq!(
            out.rows[&Origin::new("pages", "title")],
            BTreeSet::from([Indirect::GroupBy])
        );
    }

    #[test]
    fn a_custom_processor_is_opaque_and_composition_substitutes_inputs() {
        let p = plan(
            &["events"],
            vec![ActionNode::new(
                "p",
                "events",
                Action::Process {
                    processor: "sessions".into(),
                    keys: s(&["user"]),
                    time_mode: crate::streaming::TimeMode::EventTime,
                    options: serde_json::json!({}),
                },
            )],
            "p",
        );
        let inputs = BTreeMap::from([("events".to_string(), s(&["user", "ts"]))]);
        let out = &plan_lineage(&p, &inputs)["out"];
        assert!(out.opaque);
        assert_eq!(out.column_names(), None);

        // A plan's port `in` bound to a source `raw` whose `u` was renamed to `user`.
        let upstream = RelationLineage {
            columns: IndexMap::from([(
                "user".to_string(),
                direct(&[("raw", "u", Direct::Identity)]),
            )]),
            rows: BTreeMap::from([(Origin::new("raw", "ok"), BTreeSet::from([Indirect::Filter]))]),
            opaque: false,
        };
        let here = RelationLineage {
            columns: IndexMap::from([(
                "n".to_string(),
                direct(&[("in", "user", Direct::Aggregation)]),
            )]),
            rows: BTreeMap::from([(
                Origin::new("in", "user"),
                BTreeSet::from([Indirect::GroupBy]),
            )]),
            opaque: false,
        };
        let composed = here.through(&BTreeMap::from([("in".to_string(), upstream)]));
        assert_eq!(
            composed.columns["n"],
            direct(&[("raw", "u", Direct::Aggregation)])
        );
        assert_eq!(
            composed.rows,
            BTreeMap::from([
                (Origin::new("raw", "ok"), BTreeSet::from([Indirect::Filter])),
                (Origin::new("raw", "u"), BTreeSet::from([Indirect::GroupBy])),
            ])
        );
    }
}
