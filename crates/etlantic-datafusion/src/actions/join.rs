//! `dtcs:join`, with ETLantic-py's column rules.
//!
//! - Key pairs with the same name on both sides merge into one output column (for right
//!   and full joins its value is `coalesce(left, right)`); key pairs with different names
//!   keep both columns.
//! - Any other column present on both sides is an error (`collisionPolicy: fail`), except
//!   for semi and anti joins, which output the left columns only.
//! - Null keys never match unless `nullSafe`; the optional predicate is three-valued (a
//!   null predicate is no match).
//! - An event-time range (`etlantic:timeRange`) adds
//!   `left.t >= right.t - lower AND left.t <= right.t + upper` to the condition (both
//!   sides timestamps, compared at microsecond precision; a null time matches nothing).
//! - Output columns: the left ones in order, then the right ones in order.
//! - Output order (when required downstream): left-major, then right order; unmatched
//!   right rows last. Semi and anti joins keep the left order.

use crate::error::{self, DfResultExt};
use crate::expr::types::{common_type, describe};
use crate::expr::{compile_predicate, Scope};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use arrow::datatypes::DataType;
use datafusion::common::{Column, NullEquality, TableReference};
use datafusion::logical_expr::logical_plan::builder::build_join_schema;
use datafusion::logical_expr::Expr as DfExpr;
use datafusion::logical_expr::{
    cast, lit, ExprFunctionExt, ExprSchemable, Join, JoinConstraint, JoinType as DfJoinType,
    LogicalPlan, LogicalPlanBuilder,
};
use datafusion::prelude::DataFrame;
use etlantic_core::ir::{Action, JoinType};
use etlantic_core::Result;
use indexmap::IndexMap;
use std::sync::Arc;

const LEFT: &str = "__etl_l";
const RIGHT: &str = "__etl_r";
const LEFT_ORD: &str = "__etl_lord";
const RIGHT_ORD: &str = "__etl_rord";

fn qcol(side: &str, name: &str) -> DfExpr {
    DfExpr::Column(Column::new(Some(TableReference::bare(side)), name))
}

fn unify(e: DfExpr, from: &DataType, to: &DataType) -> DfExpr {
    if from == to {
        e
    } else {
        cast(e, to.clone())
    }
}

/// Prepares one side: its user columns (and ordinal, renamed) under the alias `side`.
fn side(rel: Relation, side: &str, ord_name: &str, with_ord: bool) -> Result<DataFrame> {
    let mut exprs = rel.column_exprs();
    if with_ord && rel.ordered {
        exprs.push(rel.col(ORD).alias(ord_name));
    }
    rel.df
        .select(exprs)
        .and_then(|df| df.alias(side))
        .df("join input")
}

/// Applies a join action.
pub(crate) fn join(
    left: Relation,
    right: Relation,
    action: &Action,
    demand: Demand,
) -> Result<Relation> {
    let Action::Join {
        join_type,
        left_keys,
        right_keys,
        predicate,
        null_safe,
        time_range,
        ..
    } = action
    else {
        return Err(error::engine("internal: not a join"));
    };
    let jt = *join_type;
    let semi_anti = matches!(jt, JoinType::Semi | JoinType::Anti);
    let lcols = left.columns();
    let rcols = right.columns();
    for k in left_keys {
        left.require(k)
            .map_err(|e| error::prefixed(e, "left join key"))?;
    }
    for k in right_keys {
        right
            .require(k)
            .map_err(|e| error::prefixed(e, "right join key"))?;
    }
    let merged = merged_keys(left_keys, right_keys);
    if !semi_anti {
        if let Some(c) = rcols
            .iter()
            .find(|c| !merged.contains(c) && lcols.contains(c))
        {
            return Err(error::with_help(
                error::invalid_plan(format!(
                    "join: column `{c}` is on both sides and is not a shared key (collisionPolicy: fail)"
                )),
                "Rename or drop the column on one side before the join, or join on it.",
            ));
        }
    }

    // Key types.
    let lschema = left.schema();
    let rschema = right.schema();
    let mut key_types = Vec::new();
    for (lk, rk) in left_keys.iter().zip(right_keys) {
        let lt = left.col(lk).get_type(lschema.as_ref()).df("join key")?;
        let rt = right.col(rk).get_type(rschema.as_ref()).df("join key")?;
        let t = common_type(&lt, &rt).ok_or_else(|| {
            error::type_mismatch(format!(
                "join keys `{lk}` ({}) and `{rk}` ({}) cannot be compared",
                describe(&lt),
                describe(&rt)
            ))
        })?;
        key_types.push((lt, rt, t));
    }

    // Time-range columns must be timestamps.
    let time_zones = match time_range {
        None => None,
        Some(r) => {
            let tz = |rel: &Relation, schema, c: &str, side: &str| -> Result<Option<Arc<str>>> {
                rel.require(c)
                    .map_err(|e| error::prefixed(e, &format!("{side} time-range column")))?;
                let t = rel.col(c).get_type(schema).df("join time range")?;
                match t {
                    DataType::Timestamp(_, tz) => Ok(tz),
                    other => Err(error::type_mismatch(format!(
                        "join time range: `{c}` ({side} side) is {}, not a timestamp",
                        describe(&other)
                    ))),
                }
            };
            Some((
                tz(&left, lschema.as_ref(), &r.left, "left")?,
                tz(&right, rschema.as_ref(), &r.right, "right")?,
            ))
        }
    };

    let want_order = demand == Demand::Require;
    let keep_left_order = semi_anti && demand != Demand::None;
    let left_ordered = left.ordered;
    let right_ordered = right.ordered;
    let with_lord = (want_order || keep_left_order) && left_ordered;
    let with_rord = want_order && !semi_anti && right_ordered;
    let (state, lplan) = side(left, LEFT, LEFT_ORD, with_lord)?.into_parts();
    let (_, rplan) = side(right, RIGHT, RIGHT_ORD, with_rord)?.into_parts();

    // The predicate sees every column by its plain name (left first on shared names).
    let mut bindings = IndexMap::new();
    for c in &lcols {
        bindings.insert(c.clone(), qcol(LEFT, c));
    }
    for c in &rcols {
        bindings.entry(c.clone()).or_insert_with(|| qcol(RIGHT, c));
    }
    let both =
        build_join_schema(lplan.schema(), rplan.schema(), &DfJoinType::Inner).df("join schema")?;
    let scope = Scope::with_columns(Arc::new(both), bindings);
    let filter = predicate
        .as_ref()
        .map(|p| compile_predicate(p, &scope))
        .transpose()?;
    let filter = match time_range {
        None => filter,
        Some(r) => {
            let (ltz, rtz) = time_zones.expect("checked with the range");
            let micros = |side: &str, c: &str, tz: Option<Arc<str>>| {
                let us = DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, tz);
                cast(cast(qcol(side, c), us), DataType::Int64)
            };
            let lt = micros(LEFT, &r.left, ltz);
            let rt = micros(RIGHT, &r.right, rtz);
            let cond = lt
                .clone()
                .gt_eq(rt.clone() - lit(r.lower.as_micros()))
                .and(lt.lt_eq(rt + lit(r.upper.as_micros())));
            Some(match filter {
                Some(f) => f.and(cond),
                None => cond,
            })
        }
    };

    let on: Vec<(DfExpr, DfExpr)> = left_keys
        .iter()
        .zip(right_keys)
        .zip(&key_types)
        .map(|((lk, rk), (lt, rt, t))| {
            (unify(qcol(LEFT, lk), lt, t), unify(qcol(RIGHT, rk), rt, t))
        })
        .collect();
    let df_type = match jt {
        JoinType::Inner | JoinType::Cross => DfJoinType::Inner,
        JoinType::Left => DfJoinType::Left,
        JoinType::Right => DfJoinType::Right,
        JoinType::Full => DfJoinType::Full,
        JoinType::Semi => DfJoinType::LeftSemi,
        JoinType::Anti => DfJoinType::LeftAnti,
    };
    let unconditional = on.is_empty() && filter.is_none();
    // Outer, semi and anti joins without a condition match every pair.
    let filter = if unconditional && !matches!(jt, JoinType::Inner | JoinType::Cross) {
        Some(datafusion::logical_expr::lit(true))
    } else {
        filter
    };
    let plan = if unconditional && matches!(jt, JoinType::Inner | JoinType::Cross) {
        LogicalPlanBuilder::from(lplan)
            .cross_join(rplan)
            .and_then(|b| b.build())
            .df("cross join")?
    } else {
        LogicalPlan::Join(
            Join::try_new(
                Arc::new(lplan),
                Arc::new(rplan),
                on,
                filter,
                df_type,
                JoinConstraint::On,
                if *null_safe {
                    NullEquality::NullEqualsNull
                } else {
                    NullEquality::NullEqualsNothing
                },
                false,
            )
            .df("join")?,
        )
    };
    let joined = Relation::shuffled(DataFrame::new(state, plan), false);

    // Output columns.
    let mut exprs = Vec::new();
    for c in &lcols {
        let merged_key = merged.contains(&c);
        if merged_key && matches!(jt, JoinType::Right | JoinType::Full) {
            let i = left_keys.iter().position(|k| k == c).expect("merged key");
            let (lt, rt, t) = &key_types[i];
            let value = datafusion::functions::core::coalesce().call(vec![
                unify(qcol(LEFT, c), lt, t),
                unify(qcol(RIGHT, c), rt, t),
            ]);
            exprs.push(value.alias(c));
        } else {
            exprs.push(qcol(LEFT, c).alias(c));
        }
    }
    if !semi_anti {
        for c in rcols.iter().filter(|c| !merged.contains(c)) {
            exprs.push(qcol(RIGHT, c).alias(c));
        }
    }
    if semi_anti {
        if with_lord {
            exprs.push(qcol(LEFT, LEFT_ORD).alias(ORD));
            let df = joined.df.select(exprs).df("join output")?;
            return Ok(Relation::shuffled(df, true));
        }
        return joined.select(exprs, false);
    }
    if want_order && (with_lord || with_rord) {
        let mut order = Vec::new();
        if with_lord {
            order.push(qcol(LEFT, LEFT_ORD).sort(true, false));
        }
        if with_rord {
            order.push(qcol(RIGHT, RIGHT_ORD).sort(true, false));
        }
        let ord = datafusion::functions_window::expr_fn::row_number()
            .order_by(order)
            .build()
            .df("join order")?;
        return joined.select_with_ord(exprs, ord);
    }
    joined.select(exprs, false)
}

/// The key pairs of the same name on both sides, which the join's output has once (the
/// left column).
pub(crate) fn merged_keys<'a>(left_keys: &'a [String], right_keys: &[String]) -> Vec<&'a String> {
    left_keys
        .iter()
        .zip(right_keys)
        .filter(|(l, r)| l == r)
        .map(|(l, _)| l)
        .collect()
}
