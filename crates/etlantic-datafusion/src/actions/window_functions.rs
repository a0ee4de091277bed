//! `dtcs:with_fields` with window functions: `row_number`, `rank`, `dense_rank`, `lag`
//! and `lead` over `partitionBy` in `orderBy` order.
//!
//! Rows equal in the window's order keep their input order (the relation's ordinal is
//! the last sort key), so `row_number` and `lag` are deterministic as in ETLantic-py,
//! whose sorts are stable.

use crate::error;
use crate::expr::{compile, Scope};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::{is_reserved, ORD};
use datafusion::logical_expr::{lit, Expr as DfExpr, ExprFunctionExt, SortExpr};
use etlantic_core::ir::{Expr, Literal, UnaryOp, WindowField};
use etlantic_core::Result;

/// Applies the assignments, each over the input rows; an existing column of the same
/// name is replaced in place, a new one appended.
pub(crate) fn window_fields(
    rel: Relation,
    assignments: &[WindowField],
    demand: Demand,
) -> Result<Relation> {
    if let Some(a) = assignments.iter().find(|a| is_reserved(&a.name)) {
        return Err(error::invalid_plan(format!(
            "with_fields: the column name `{}` is reserved by the DataFusion backend",
            a.name
        )));
    }
    let scope = rel.scope();
    let tie_break: Vec<SortExpr> = if rel.ordered {
        vec![rel.col(ORD).sort(true, false)]
    } else {
        vec![]
    };
    let mut values: Vec<(String, DfExpr)> = Vec::new();
    for a in assignments {
        let value = window_expr(a, &scope, &tie_break)?.alias(&a.name);
        match values.iter_mut().find(|(n, _)| *n == a.name) {
            Some(v) => v.1 = value,
            None => values.push((a.name.clone(), value)),
        }
    }
    let mut exprs = Vec::new();
    for c in rel.columns() {
        match values.iter().position(|(n, _)| *n == c) {
            Some(i) => exprs.push(values.remove(i).1),
            None => exprs.push(rel.col(&c)),
        }
    }
    exprs.extend(values.into_iter().map(|(_, v)| v));
    let ordered = rel.ordered;
    let moved = rel.select(exprs, true)?;
    // A window sorts its partitions: the rows come out in another order.
    let out = Relation::shuffled(moved.df, ordered);
    if demand == Demand::None {
        out.keep_order(false)
    } else {
        Ok(out)
    }
}

/// A constant integer argument (`lag(x, 2)`).
fn const_int(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(Literal::Integer(i)) => Some(*i),
        Expr::Unary(UnaryOp::Negate, inner) => const_int(inner).and_then(i64::checked_neg),
        _ => None,
    }
}

fn window_expr(a: &WindowField, scope: &Scope, tie_break: &[SortExpr]) -> Result<DfExpr> {
    let bad = |msg: String| error::type_mismatch(format!("window assignment `{}`: {msg}", a.name));
    let Expr::Call { function, args } = &a.call else {
        return Err(bad(format!("`{}` is not a window function", a.call)));
    };
    use datafusion::functions_window::expr_fn;
    let f = match (function.as_str(), args.len()) {
        ("dtcs:row_number", 0) => expr_fn::row_number(),
        ("dtcs:rank", 0) => expr_fn::rank(),
        ("dtcs:dense_rank", 0) => expr_fn::dense_rank(),
        ("dtcs:lag" | "dtcs:lead", 1..=3) => {
            let value = compile(&args[0], scope)?;
            let offset = match args.get(1) {
                None => 1,
                Some(e) => const_int(e).filter(|n| *n >= 0).ok_or_else(|| {
                    bad("the offset must be a non-negative integer literal".into())
                })?,
            };
            let default = match args.get(2) {
                None => lit(datafusion::common::ScalarValue::Null),
                Some(e) => compile(e, scope)?,
            };
            let udwf = if function == "dtcs:lag" {
                datafusion::functions_window::lead_lag::lag_udwf()
            } else {
                datafusion::functions_window::lead_lag::lead_udwf()
            };
            udwf.call(vec![value, lit(offset), default])
        }
        (f, n) => {
            return Err(bad(format!(
                "`{f}` with {n} argument(s) is not a window function this backend computes"
            )))
        }
    };
    let partition: Vec<DfExpr> = a
        .partition_by
        .iter()
        .map(|p| compile(p, scope))
        .collect::<Result<_>>()?;
    let mut order: Vec<SortExpr> = a
        .order_by
        .iter()
        .map(|k| Ok(compile(&k.expr, scope)?.sort(!k.descending, k.nulls_first)))
        .collect::<Result<_>>()?;
    order.extend(tie_break.iter().cloned());
    f.partition_by(partition)
        .order_by(order)
        .build()
        .map_err(|e| error::datafusion(e, "window function"))
}
