//! Which rows of a source its watermark is measured on.
//!
//! Spark measures a watermark in its `EventTimeWatermark` node, and its optimizer moves
//! filters below that node before the query runs: a row such a filter drops never
//! counts toward the maximum event time. The rule, from Spark's optimizer
//! (`PushPredicateThroughNonJoin`, `PushPredicateThroughJoin`, `InferFiltersFromConstraints`,
//! `EliminateOuterJoin`), followed from every sink back to each source:
//!
//! - a filter's conjuncts move down through projections, renames, added and dropped
//!   columns (a computed column is replaced by its expression), sorts, whole-row
//!   distincts, explodes (those not reading the exploded element), unions (into both
//!   inputs) and aggregations (those reading grouping columns only);
//! - they stop at deduplications, limits, custom processors and non-portable steps;
//! - through a join, a conjunct reading one side only moves into that side when the side
//!   is not the null-supplying side of an outer join, and the join condition's one-sided
//!   conjuncts move into each side it does not preserve (both for inner and semi joins);
//! - a join infers more: `is not null` of every column its equality keys (or a
//!   null-intolerant condition) read, and each known condition on a key carried over to
//!   the key it equals; those land in the same sides (inner and semi: both; left outer and
//!   anti: the right; right outer: the left; full outer: none);
//! - an outer join whose output a filter above rejects nulls of its null-supplying side
//!   is an inner join (left or right, for a full join) for all of this;
//! - at the source, conjuncts that read the event-time column stay above the watermark
//!   (Spark never moves those below it).
//!
//! A source read by several paths (a fan-out to several sinks) counts a row any of them
//! would count: the rows are the disjunction of each path's conjunction. Spark runs each
//! sink as its own query with its own watermark; one watermark per source that follows
//! the path that sees the newest rows is the closest one query can come, and never holds
//! every path back to the slowest.

use crate::project::Project;
use etlantic_core::ir::columns::step_columns;
use etlantic_core::ir::{Action, BinaryOp, Expr, JoinType, Literal, TransformPlan, UnaryOp};
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// A conjunction of predicates over a relation's columns (empty: every row).
type Conj = Vec<Expr>;

/// A disjunction of conjunctions: the rows some consumer may see (empty: no consumer).
type Dnf = Vec<Conj>;

/// A portable transformation's plan, parameters and the output the pipeline reads.
pub struct PortableLogic<'a> {
    /// The plan.
    pub plan: &'a Arc<TransformPlan>,
    /// Its parameter values.
    pub parameters: &'a IndexMap<String, Value>,
    /// The plan output used.
    pub output: &'a str,
}

enum Kind {
    Source,
    Step(Action),
    Opaque,
}

struct Rel {
    kind: Kind,
    cols: Option<Vec<String>>,
    inputs: Vec<usize>,
}

/// For each watermarked source, the predicate over its columns that selects the rows its
/// watermark is measured on, or `None` for every row.
///
/// `columns` holds each source's and each transformation's output columns; `portable` the
/// portable transformations' logic (any other transformation is opaque: nothing moves
/// through it).
pub fn watermark_rows(
    project: &Project,
    order: &[String],
    columns: &HashMap<String, Vec<String>>,
    portable: &HashMap<String, PortableLogic<'_>>,
) -> IndexMap<String, Option<Expr>> {
    let pl = &project.pipeline;
    let mut rels: Vec<Rel> = Vec::new();
    let mut node_rel: HashMap<String, usize> = HashMap::new();
    for s in &pl.sources {
        node_rel.insert(s.id.clone(), rels.len());
        rels.push(Rel {
            kind: Kind::Source,
            cols: columns.get(&s.id).cloned(),
            inputs: vec![],
        });
    }
    for id in order {
        let Some(t) = pl.transform(id) else { continue };
        let froms: IndexMap<String, Option<usize>> = t
            .inputs
            .iter()
            .map(|(port, r)| (port.clone(), node_rel.get(r.from()).copied()))
            .collect();
        let out = portable.get(id).and_then(|logic| {
            let decoded = logic.plan.decoded();
            let mut local: HashMap<String, usize> = HashMap::new();
            for (port, rel) in &froms {
                local.insert(port.clone(), (*rel)?);
            }
            for step in &decoded.steps {
                let target = *local.get(&step.target)?;
                let other_id = match &step.op {
                    Action::Join { right, .. } => Some(right),
                    Action::Union { other, .. } => Some(other),
                    _ => None,
                };
                let other = match other_id {
                    Some(o) => Some(*local.get(o)?),
                    None => None,
                };
                let op = step.op.bind_parameters(logic.parameters).ok();
                let cols = match (&op, &rels[target].cols) {
                    (Some(op), Some(tc)) => {
                        let oc = other.and_then(|o| rels[o].cols.clone());
                        if other.is_some() && oc.is_none() {
                            None
                        } else {
                            step_columns(op, tc, oc.as_deref())
                        }
                    }
                    _ => None,
                };
                local.insert(step.id.clone(), rels.len());
                rels.push(Rel {
                    kind: op.map_or(Kind::Opaque, Kind::Step),
                    cols,
                    inputs: std::iter::once(target).chain(other).collect(),
                });
            }
            let rel_id = decoded.outputs.get(logic.output)?;
            local.get(rel_id).copied()
        });
        let out = out.unwrap_or_else(|| {
            rels.push(Rel {
                kind: Kind::Opaque,
                cols: columns.get(id).cloned(),
                inputs: froms.values().flatten().copied().collect(),
            });
            rels.len() - 1
        });
        node_rel.insert(id.clone(), out);
    }

    let constraints = constraints(&rels);
    let mut reach: Vec<Dnf> = vec![Vec::new(); rels.len()];
    for k in &pl.sinks {
        if let Some(&r) = node_rel.get(&k.input) {
            reach[r].push(Vec::new());
        }
    }
    for i in (0..rels.len()).rev() {
        let dnf = std::mem::take(&mut reach[i]);
        if dnf.is_empty() {
            continue;
        }
        let dnf = normalize(dnf);
        for (input, conj) in push_down(&rels, &constraints, i, &dnf) {
            reach[input].push(conj);
        }
        reach[i] = dnf;
    }

    let mut out = IndexMap::new();
    for s in &pl.sources {
        let (Some(e), Some(_)) = (&s.event_time, s.watermark) else {
            continue;
        };
        let dnf = normalize(std::mem::take(&mut reach[node_rel[&s.id]]));
        let kept: Dnf = dnf
            .into_iter()
            .map(|c| {
                c.into_iter()
                    .filter(|p| !p.columns().contains(&e.column))
                    .collect()
            })
            .collect();
        let kept = normalize(kept);
        let predicate = match kept.as_slice() {
            [] => None,
            [c] if c.is_empty() => None,
            _ => kept
                .into_iter()
                .map(|c| and_all(c).expect("a normalized conjunction is not empty"))
                .reduce(|a, b| Expr::Binary(BinaryOp::Or, Box::new(a), Box::new(b))),
        };
        out.insert(s.id.clone(), predicate);
    }
    out
}

/// Deduplicates each conjunction; a disjunction with an empty conjunction is every row.
fn normalize(dnf: Dnf) -> Dnf {
    let mut out: Dnf = Vec::new();
    for c in dnf {
        let mut d: Conj = Vec::new();
        for p in c {
            if !d.contains(&p) {
                d.push(p);
            }
        }
        if d.is_empty() {
            return vec![Vec::new()];
        }
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

fn and_all(c: Conj) -> Option<Expr> {
    c.into_iter()
        .reduce(|a, b| Expr::Binary(BinaryOp::And, Box::new(a), Box::new(b)))
}

/// The conjuncts of a predicate.
fn conjuncts(e: &Expr) -> Vec<Expr> {
    match e {
        Expr::Binary(BinaryOp::And, a, b) => {
            let mut v = conjuncts(a);
            v.extend(conjuncts(b));
            v
        }
        e => vec![e.clone()],
    }
}

/// `e` with every column replaced by `map`'s expression for it; `None` when a column has
/// none.
fn substitute(e: &Expr, map: &dyn Fn(&str) -> Option<Expr>) -> Option<Expr> {
    Some(match e {
        Expr::Column(c) => map(c)?,
        Expr::Unary(op, a) => Expr::Unary(*op, Box::new(substitute(a, map)?)),
        Expr::Binary(op, a, b) => Expr::Binary(
            *op,
            Box::new(substitute(a, map)?),
            Box::new(substitute(b, map)?),
        ),
        Expr::Call { function, args } => Expr::Call {
            function: function.clone(),
            args: args
                .iter()
                .map(|a| substitute(a, map))
                .collect::<Option<_>>()?,
        },
        e => e.clone(),
    })
}

fn rename(e: &Expr, map: &dyn Fn(&str) -> Option<String>) -> Option<Expr> {
    substitute(e, &|c| map(c).map(Expr::Column))
}

fn is_not_null(column: &str) -> Expr {
    Expr::Unary(
        UnaryOp::Not,
        Box::new(Expr::Call {
            function: "dtcs:is_null".into(),
            args: vec![Expr::col(column)],
        }),
    )
}

/// Functions whose result is null whenever an argument is (Spark's `NullIntolerant`).
const NULL_INTOLERANT_FUNCTIONS: &[&str] = &[
    "dtcs:abs",
    "dtcs:upper",
    "dtcs:lower",
    "dtcs:length",
    "dtcs:cast",
    "dtcs:trim",
    "dtcs:ltrim",
    "dtcs:rtrim",
];

fn null_intolerant_op(op: BinaryOp) -> bool {
    !matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::NullSafeEq)
}

/// The columns a null in which makes `e` null (Spark's `scanNullIntolerantAttribute`).
fn null_intolerant_columns(e: &Expr) -> Vec<String> {
    match e {
        Expr::Column(c) => vec![c.clone()],
        Expr::Unary(_, a) => null_intolerant_columns(a),
        Expr::Binary(op, a, b) if null_intolerant_op(*op) => {
            let mut v = null_intolerant_columns(a);
            v.extend(null_intolerant_columns(b));
            v
        }
        Expr::Call { function, args } if NULL_INTOLERANT_FUNCTIONS.contains(&function.as_str()) => {
            args.iter().flat_map(null_intolerant_columns).collect()
        }
        _ => Vec::new(),
    }
}

/// Whether `e` is null whenever all its columns are (structurally, as far as known).
fn null_when_columns_null(e: &Expr) -> bool {
    match e {
        Expr::Column(_) | Expr::Literal(Literal::Null) => true,
        Expr::Unary(_, a) => null_when_columns_null(a),
        Expr::Binary(BinaryOp::And | BinaryOp::Or, a, b) => {
            null_when_columns_null(a) && null_when_columns_null(b)
        }
        Expr::Binary(op, a, b) if null_intolerant_op(*op) => {
            null_when_columns_null(a) || null_when_columns_null(b)
        }
        Expr::Call { function, args } if NULL_INTOLERANT_FUNCTIONS.contains(&function.as_str()) => {
            args.iter().any(null_when_columns_null)
        }
        _ => false,
    }
}

/// Whether a filter `e` drops every row whose columns `e` reads are all null (Spark's
/// `canFilterOutNull`).
fn rejects_nulls(e: &Expr) -> bool {
    if e.columns().is_empty() {
        return false;
    }
    match e {
        Expr::Binary(BinaryOp::And, a, b) => rejects_nulls(a) || rejects_nulls(b),
        Expr::Binary(BinaryOp::Or, a, b) => rejects_nulls(a) && rejects_nulls(b),
        e => null_when_columns_null(e),
    }
}

fn subset(cols: &[String], of: &[String]) -> bool {
    cols.iter().all(|c| of.contains(c))
}

/// What is known to hold on each relation's rows (Spark's constraints), as far as this
/// analysis needs: filters, carried through renames, projections and joins.
fn constraints(rels: &[Rel]) -> Vec<Conj> {
    let mut out: Vec<Conj> = Vec::with_capacity(rels.len());
    for rel in rels {
        let input = |k: usize| -> &Conj { &out[rel.inputs[k]] };
        let known: Conj = match &rel.kind {
            Kind::Source | Kind::Opaque => Vec::new(),
            Kind::Step(op) => match op {
                Action::Filter { predicate } => {
                    let mut c = input(0).clone();
                    c.extend(conjuncts(predicate));
                    c
                }
                Action::Sort { .. }
                | Action::Limit { .. }
                | Action::Distinct { .. }
                | Action::Deduplicate { .. }
                | Action::DeduplicateWithinWatermark { .. } => input(0).clone(),
                Action::Project { fields } => {
                    let map = |c: &str| {
                        fields
                            .iter()
                            .find(|f| f.expr == Expr::col(c))
                            .map(|f| f.name.clone())
                    };
                    input(0).iter().filter_map(|e| rename(e, &map)).collect()
                }
                Action::WithFields { .. } | Action::WindowFields { .. } => {
                    let assigned = op.assigned_columns();
                    input(0)
                        .iter()
                        .filter(|e| !e.columns().iter().any(|c| assigned.contains(&c.as_str())))
                        .cloned()
                        .collect()
                }
                Action::DropFields { fields, .. } => input(0)
                    .iter()
                    .filter(|e| !e.columns().iter().any(|c| fields.contains(c)))
                    .cloned()
                    .collect(),
                Action::RenameFields { mapping } => input(0)
                    .iter()
                    .filter_map(|e| {
                        rename(e, &|c| {
                            Some(mapping.get(c).cloned().unwrap_or(c.to_string()))
                        })
                    })
                    .collect(),
                Action::Explode { column, alias, .. } => input(0)
                    .iter()
                    .filter(|e| alias != column || !e.columns().contains(alias))
                    .cloned()
                    .collect(),
                Action::Aggregate { group_by, .. } | Action::WindowAggregate { group_by, .. } => {
                    let map = |c: &str| {
                        group_by
                            .iter()
                            .find(|g| g.expr == Expr::col(c))
                            .map(|g| g.name.clone())
                    };
                    input(0).iter().filter_map(|e| rename(e, &map)).collect()
                }
                Action::Join {
                    join_type,
                    predicate,
                    ..
                } => {
                    let cols = rel.cols.clone().unwrap_or_default();
                    let mut c: Conj = Vec::new();
                    match join_type {
                        JoinType::Inner | JoinType::Cross => {
                            c.extend(input(0).iter().cloned());
                            c.extend(input(1).iter().cloned());
                            c.extend(predicate.iter().flat_map(conjuncts));
                        }
                        JoinType::Semi => {
                            c.extend(input(0).iter().cloned());
                            c.extend(predicate.iter().flat_map(conjuncts));
                        }
                        JoinType::Left | JoinType::Anti => c.extend(input(0).iter().cloned()),
                        JoinType::Right => c.extend(input(1).iter().cloned()),
                        JoinType::Full => {}
                    }
                    c.retain(|e| subset(&e.columns(), &cols));
                    c
                }
                Action::Union { .. } | Action::Process { .. } => Vec::new(),
            },
        };
        out.push(known);
    }
    out
}

/// The side of a join a column belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Left,
    Right,
}

const QUALIFIER: [&str; 2] = ["\u{1}l.", "\u{1}r."];

fn q(side: Side) -> &'static str {
    QUALIFIER[side as usize]
}

/// `e` over one side's own column names, if it reads that side's columns only.
fn unqualify(e: &Expr, side: Side) -> Option<Expr> {
    rename(e, &|c| c.strip_prefix(q(side)).map(str::to_string))
}

/// What a relation passes to its inputs: `(input, conjunction over its columns)` for each
/// conjunction of `dnf` (the rows some consumer of relation `i` may see).
fn push_down(rels: &[Rel], constraints: &[Conj], i: usize, dnf: &Dnf) -> Vec<(usize, Conj)> {
    let rel = &rels[i];
    let all = |k: usize| {
        dnf.iter()
            .map(|_| (rel.inputs[k], Vec::new()))
            .collect::<Vec<_>>()
    };
    let op = match &rel.kind {
        Kind::Source => return Vec::new(),
        Kind::Opaque => return (0..rel.inputs.len()).flat_map(all).collect(),
        Kind::Step(op) => op,
    };
    let map_each = |f: &dyn Fn(&Expr) -> Option<Expr>| -> Vec<(usize, Conj)> {
        dnf.iter()
            .map(|c| (rel.inputs[0], c.iter().filter_map(f).collect()))
            .collect()
    };
    match op {
        Action::Filter { predicate } => dnf
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.extend(conjuncts(predicate));
                (rel.inputs[0], c)
            })
            .collect(),
        Action::Sort { .. } | Action::DropFields { .. } => map_each(&|e| Some(e.clone())),
        Action::Distinct { fields: None } => map_each(&|e| Some(e.clone())),
        Action::Distinct { fields: Some(_) }
        | Action::Deduplicate { .. }
        | Action::DeduplicateWithinWatermark { .. }
        | Action::Limit { .. }
        | Action::WindowFields { .. }
        | Action::Process { .. } => all(0),
        Action::Project { fields } => map_each(&|e| {
            substitute(e, &|c| {
                fields.iter().find(|f| f.name == c).map(|f| f.expr.clone())
            })
        }),
        Action::WithFields { assignments } => map_each(&|e| {
            let mut e = e.clone();
            for a in assignments.iter().rev() {
                e = substitute(&e, &|c| {
                    Some(if c == a.name {
                        a.expr.clone()
                    } else {
                        Expr::col(c)
                    })
                })?;
            }
            Some(e)
        }),
        Action::RenameFields { mapping } => map_each(&|e| {
            rename(e, &|c| {
                Some(
                    mapping
                        .iter()
                        .find(|(_, new)| new.as_str() == c)
                        .map_or(c.to_string(), |(old, _)| old.clone()),
                )
            })
        }),
        Action::Explode { column, alias, .. } => map_each(&|e| {
            let cols = e.columns();
            (!cols.contains(alias) && (alias != column || !cols.contains(column)))
                .then(|| e.clone())
        }),
        Action::Aggregate { group_by, .. } | Action::WindowAggregate { group_by, .. } => {
            if group_by.is_empty() {
                return all(0);
            }
            map_each(&|e| {
                substitute(e, &|c| {
                    group_by
                        .iter()
                        .find(|g| g.name == c)
                        .map(|g| g.expr.clone())
                })
            })
        }
        Action::Union { by_name, .. } => {
            let (t, o) = (rel.inputs[0], rel.inputs[1]);
            let Some(tcols) = rels[t].cols.clone() else {
                return dnf
                    .iter()
                    .flat_map(|_| [(t, Vec::new()), (o, Vec::new())])
                    .collect();
            };
            let ocols = rels[o].cols.clone();
            let mut out = Vec::new();
            for c in dnf {
                let to_target: Conj = c
                    .iter()
                    .filter_map(|e| {
                        substitute(e, &|n| {
                            Some(if tcols.iter().any(|x| x == n) {
                                Expr::col(n)
                            } else {
                                Expr::Literal(Literal::Null)
                            })
                        })
                    })
                    .collect();
                let to_other: Conj = match &ocols {
                    None => Vec::new(),
                    Some(ocols) => c
                        .iter()
                        .filter_map(|e| {
                            substitute(e, &|n| {
                                if *by_name {
                                    Some(if ocols.iter().any(|x| x == n) {
                                        Expr::col(n)
                                    } else {
                                        Expr::Literal(Literal::Null)
                                    })
                                } else {
                                    let k = tcols.iter().position(|x| x == n)?;
                                    ocols.get(k).map(Expr::col)
                                }
                            })
                        })
                        .collect(),
                };
                out.push((t, to_target));
                out.push((o, to_other));
            }
            out
        }
        Action::Join {
            join_type,
            left_keys,
            right_keys,
            predicate,
            null_safe,
            ..
        } => push_through_join(
            rels,
            constraints,
            rel,
            dnf,
            JoinParts {
                join_type: *join_type,
                left_keys,
                right_keys,
                predicate: predicate.as_ref(),
                null_safe: *null_safe,
            },
        ),
    }
}

struct JoinParts<'a> {
    join_type: JoinType,
    left_keys: &'a [String],
    right_keys: &'a [String],
    predicate: Option<&'a Expr>,
    null_safe: bool,
}

fn push_through_join(
    rels: &[Rel],
    constraints: &[Conj],
    rel: &Rel,
    dnf: &Dnf,
    j: JoinParts<'_>,
) -> Vec<(usize, Conj)> {
    let (l, r) = (rel.inputs[0], rel.inputs[1]);
    let (Some(lcols), Some(rcols)) = (rels[l].cols.clone(), rels[r].cols.clone()) else {
        return dnf
            .iter()
            .flat_map(|_| [(l, Vec::new()), (r, Vec::new())])
            .collect();
    };
    let merged: Vec<&String> = j
        .left_keys
        .iter()
        .zip(j.right_keys)
        .filter(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    let outer_key = matches!(j.join_type, JoinType::Right | JoinType::Full);
    // An output column as a side's column (a key of the same name on both sides is
    // `coalesce(left, right)` in right and full joins: neither side's alone).
    let output_side = |c: &str| -> Option<String> {
        if lcols.iter().any(|x| x == c) {
            if outer_key && merged.iter().any(|m| m.as_str() == c) {
                return None;
            }
            Some(format!("{}{c}", q(Side::Left)))
        } else if rcols.iter().any(|x| x == c) {
            Some(format!("{}{c}", q(Side::Right)))
        } else {
            None
        }
    };
    // A condition column: the left one when both sides have it.
    let condition_side = |c: &str| -> Option<String> {
        if lcols.iter().any(|x| x == c) {
            Some(format!("{}{c}", q(Side::Left)))
        } else if rcols.iter().any(|x| x == c) {
            Some(format!("{}{c}", q(Side::Right)))
        } else {
            None
        }
    };
    let condition: Conj = j
        .predicate
        .map(conjuncts)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| rename(e, &condition_side))
        .collect();
    let mut equalities: Vec<(String, String)> = Vec::new();
    if !j.null_safe {
        for (a, b) in j.left_keys.iter().zip(j.right_keys) {
            equalities.push((
                format!("{}{a}", q(Side::Left)),
                format!("{}{b}", q(Side::Right)),
            ));
        }
    }
    for e in &condition {
        if let Expr::Binary(BinaryOp::Eq, a, b) = e {
            if let (Expr::Column(a), Expr::Column(b)) = (a.as_ref(), b.as_ref()) {
                equalities.push((a.clone(), b.clone()));
            }
        }
    }
    let key_equalities: Conj = equalities
        .iter()
        .map(|(a, b)| {
            Expr::Binary(
                BinaryOp::Eq,
                Box::new(Expr::col(a.clone())),
                Box::new(Expr::col(b.clone())),
            )
        })
        .collect();
    let qualified = |k: usize, side: Side| -> Conj {
        constraints[rel.inputs[k]]
            .iter()
            .filter_map(|e| rename(e, &|c| Some(format!("{}{c}", q(side)))))
            .collect()
    };
    let known_left = qualified(0, Side::Left);
    let known_right = qualified(1, Side::Right);

    let mut out = Vec::new();
    for c in dnf {
        let above: Conj = c.iter().filter_map(|e| rename(e, &output_side)).collect();
        let one_sided = |e: &Expr, side: Side| unqualify(e, side).is_some();
        let rejects = |side: Side| above.iter().any(|e| one_sided(e, side) && rejects_nulls(e));
        let join_type = match j.join_type {
            JoinType::Left if rejects(Side::Right) => JoinType::Inner,
            JoinType::Right if rejects(Side::Left) => JoinType::Inner,
            JoinType::Full => match (rejects(Side::Left), rejects(Side::Right)) {
                (true, true) => JoinType::Inner,
                (true, false) => JoinType::Left,
                (false, true) => JoinType::Right,
                (false, false) => JoinType::Full,
            },
            t => t,
        };
        // Which sides take the filter above, the condition's one-sided conjuncts and
        // inferred filters (Spark's PushPredicateThroughJoin, InferFiltersFromConstraints).
        let (above_to, condition_to): (&[Side], &[Side]) = match join_type {
            JoinType::Inner | JoinType::Cross => {
                (&[Side::Left, Side::Right], &[Side::Left, Side::Right])
            }
            JoinType::Semi => (&[Side::Left], &[Side::Left, Side::Right]),
            JoinType::Left | JoinType::Anti => (&[Side::Left], &[Side::Right]),
            JoinType::Right => (&[Side::Right], &[Side::Left]),
            JoinType::Full => (&[], &[]),
        };
        let mut pushed: [Conj; 2] = [Vec::new(), Vec::new()];
        for e in &above {
            for &side in above_to {
                if one_sided(e, side) {
                    pushed[side as usize].push(e.clone());
                }
            }
        }
        for e in &condition {
            for &side in condition_to {
                if one_sided(e, side) {
                    pushed[side as usize].push(e.clone());
                }
            }
        }
        if !condition_to.is_empty() {
            let mut all: Conj = known_left.clone();
            all.extend(known_right.iter().cloned());
            all.extend(pushed[0].iter().cloned());
            all.extend(pushed[1].iter().cloned());
            all.extend(condition.iter().cloned());
            all.extend(key_equalities.iter().cloned());
            let mut inferred: Conj = Vec::new();
            for (a, b) in &equalities {
                for e in &all {
                    for (from, to) in [(a, b), (b, a)] {
                        if e.columns().contains(from) && !e.columns().contains(to) {
                            if let Some(t) = rename(e, &|c| {
                                Some(if c == from { to.clone() } else { c.to_string() })
                            }) {
                                inferred.push(t);
                            }
                        }
                    }
                }
            }
            all.extend(inferred);
            let not_null: Conj = all
                .iter()
                .flat_map(null_intolerant_columns)
                .map(|c| is_not_null(&c))
                .collect();
            all.extend(not_null);
            for e in all {
                for &side in condition_to {
                    if one_sided(&e, side) && !e.columns().is_empty() {
                        pushed[side as usize].push(e.clone());
                    }
                }
            }
        }
        for side in [Side::Left, Side::Right] {
            let conj: Conj = pushed[side as usize]
                .iter()
                .filter_map(|e| unqualify(e, side))
                .collect();
            out.push((rel.inputs[side as usize], conj));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_are_rejected_by_comparisons_not_by_null_checks() {
        let p = |s: &str| Expr::parse(s).unwrap();
        assert!(rejects_nulls(&p("amount > 5")));
        assert!(rejects_nulls(&p("user == 'a' && x > 1")));
        assert!(!rejects_nulls(&p("is_null(user)")));
        assert!(!rejects_nulls(&p("user == 'a' || is_null(user)")));
        assert_eq!(null_intolerant_columns(&p("upper(a) == b")), vec!["a", "b"]);
        assert!(null_intolerant_columns(&p("coalesce(a, 'x') == 'x'")).is_empty());
    }
}
