//! Order-sensitive actions: sort, limit, distinct, deduplicate.

use crate::error::DfResultExt;
use crate::expr::compile;
use crate::expr::types::{describe, is_list};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use datafusion::functions_aggregate::expr_fn::min;
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::{lit, ExprFunctionExt, SortExpr};
use etlantic_core::ir::SortKey;
use etlantic_core::Result;

/// `dtcs:sort`: stable (ties keep their input order); nulls last unless asked otherwise.
/// When nothing downstream cares about order (e.g. the sort feeds an aggregation), the
/// sort is dropped.
pub(crate) fn sort(rel: Relation, keys: &[SortKey], demand: Demand) -> Result<Relation> {
    let scope = rel.scope();
    let mut order: Vec<SortExpr> = Vec::with_capacity(keys.len() + 1);
    for k in keys {
        let e = compile(&k.expr, &scope)?;
        let t = scope.type_of(&e)?;
        if is_list(&t) {
            return Err(crate::error::type_mismatch(format!(
                "cannot sort by `{}` ({})",
                k.expr,
                describe(&t)
            )));
        }
        order.push(e.sort(!k.descending, k.nulls_first));
    }
    if demand == Demand::None {
        return rel.keep_order(false);
    }
    order.extend(rel.ord_sort());
    let ord = row_number().order_by(order).build().df("sort")?;
    let exprs = rel.column_exprs();
    rel.select_with_ord(exprs, ord)
}

/// `dtcs:limit`: skips `offset` rows, keeps `count`.
pub(crate) fn limit(rel: Relation, count: u64, offset: u64, demand: Demand) -> Result<Relation> {
    let ordered = rel.ordered;
    let df = if ordered && !rel.in_order {
        let sort = rel.ord_sort();
        rel.df.sort(sort).df("limit")?
    } else {
        rel.df
    };
    let df = df
        .limit(offset as usize, Some(count as usize))
        .df("limit")?;
    Relation {
        df,
        ordered,
        in_order: ordered,
    }
    .keep_order(demand != Demand::None)
}

/// `dtcs:distinct` on all columns: one row per group of equal rows, at the position of
/// the first one.
pub(crate) fn distinct_rows(rel: Relation, demand: Demand) -> Result<Relation> {
    let groups = rel.column_exprs();
    if demand != Demand::None && rel.ordered {
        let ord = min(rel.col(ORD)).alias(ORD);
        let df = rel.df.aggregate(groups, vec![ord]).df("distinct")?;
        return Ok(Relation::shuffled(df, true));
    }
    let df = rel
        .df
        .select(groups)
        .and_then(|d| d.distinct())
        .df("distinct")?;
    Ok(Relation::shuffled(df, false))
}

/// `dtcs:distinct` on fields / `dtcs:deduplicate`: the first (or last) row per key, in
/// input order. Null keys form one group.
pub(crate) fn first_per_key(
    rel: Relation,
    keys: &[String],
    keep_last: bool,
    demand: Demand,
) -> Result<Relation> {
    for k in keys {
        rel.require(k)?;
    }
    const RANK: &str = "__etl_rank";
    let partition = keys.iter().map(|k| rel.col(k)).collect();
    let order = if rel.ordered {
        vec![rel.col(ORD).sort(!keep_last, false)]
    } else {
        vec![]
    };
    let rank = row_number()
        .partition_by(partition)
        .order_by(order)
        .build()
        .df("deduplicate")?
        .alias(RANK);
    let mut exprs = rel.column_exprs();
    if rel.ordered {
        exprs.push(rel.col(ORD));
    }
    exprs.push(rank);
    let ordered = rel.ordered;
    let df = rel.df.select(exprs).df("deduplicate")?;
    let ranked = Relation::shuffled(df, ordered);
    let rank_col = ranked.col(RANK);
    let df = ranked.df.filter(rank_col.eq(lit(1u64))).df("deduplicate")?;
    let filtered = Relation::shuffled(df, ordered);
    let exprs = filtered.column_exprs();
    filtered.select(exprs, demand != Demand::None)
}
