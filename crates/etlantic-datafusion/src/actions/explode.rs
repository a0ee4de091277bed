//! `dtcs:explode`: one row per element of a list column.
//!
//! The element goes to `alias` (appended; an existing column of that name is an error,
//! unless the alias is the list column itself, which is then replaced). `outer` keeps rows
//! whose list is null or empty, with a null element. Elements keep their list order.

use crate::error::{self, DfResultExt};
use crate::expr::types::{describe, is_list};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use datafusion::common::{ScalarValue, UnnestOptions};
use datafusion::functions_nested::expr_fn::{cardinality, range};
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::{lit, when, ExprFunctionExt, ExprSchemable};
use etlantic_core::Result;

const ITEM: &str = "__etl_item";
const POS: &str = "__etl_pos";

/// Applies an explode.
pub(crate) fn explode(
    rel: Relation,
    column: &str,
    alias: &str,
    outer: bool,
    demand: Demand,
) -> Result<Relation> {
    rel.require(column)?;
    if alias != column && rel.has(alias) {
        return Err(error::invalid_plan(format!(
            "explode: the output column `{alias}` already exists"
        )));
    }
    let list = rel.col(column);
    let t = list.get_type(rel.schema().as_ref()).df("explode")?;
    if !is_list(&t) {
        return Err(error::type_mismatch(format!(
            "explode needs a list column, `{column}` is {}",
            describe(&t)
        )));
    }
    let with_pos = demand == Demand::Require && rel.ordered;
    // Outer: an empty list behaves like a null one (one row, null element).
    let items = if outer {
        when(
            cardinality(list.clone()).eq(lit(0u64)),
            lit(ScalarValue::try_from(&t).unwrap_or(ScalarValue::Null)),
        )
        .otherwise(list.clone())
        .df("explode")?
    } else {
        list.clone()
    };
    let mut exprs = rel.column_exprs();
    if rel.ordered {
        exprs.push(rel.col(ORD));
    }
    exprs.push(items.alias(ITEM));
    if with_pos {
        exprs.push(range(lit(0i64), cast_i64(cardinality(list)), lit(1i64)).alias(POS));
    }
    let ordered = rel.ordered;
    let mut unnest_cols = vec![ITEM];
    if with_pos {
        unnest_cols.push(POS);
    }
    let df = rel
        .df
        .select(exprs)
        .and_then(|df| {
            df.unnest_columns_with_options(
                &unnest_cols,
                UnnestOptions::new().with_preserve_nulls(outer),
            )
        })
        .df("explode")?;
    let exploded = Relation::shuffled(df, ordered);
    let mut out = Vec::new();
    for c in rel_columns_without(&exploded, &[ITEM, POS]) {
        if c == column && alias == column {
            out.push(exploded.col(ITEM).alias(alias));
        } else {
            out.push(exploded.col(&c));
        }
    }
    if alias != column {
        out.push(exploded.col(ITEM).alias(alias));
    }
    if with_pos {
        let ord = row_number()
            .order_by(vec![
                exploded.col(ORD).sort(true, false),
                exploded.col(POS).sort(true, true),
            ])
            .build()
            .df("explode order")?;
        return exploded.select_with_ord(out, ord);
    }
    exploded.select(out, false)
}

fn cast_i64(e: datafusion::logical_expr::Expr) -> datafusion::logical_expr::Expr {
    datafusion::logical_expr::cast(e, arrow::datatypes::DataType::Int64)
}

fn rel_columns_without(rel: &Relation, hidden: &[&str]) -> Vec<String> {
    rel.columns()
        .into_iter()
        .filter(|c| !hidden.contains(&c.as_str()))
        .collect()
}
