//! `dtcs:aggregate` / `dtcs:group`.
//!
//! Output: the group columns, then the aggregates. Null is an ordinary group key. With no
//! group columns there is exactly one output row (SQL semantics: `count` 0, `sum` null on
//! an empty input). Groups come out in order of their first row when order is required.

use super::unique_names;
use crate::error::{self, DfResultExt};
use crate::expr::types::{describe, is_numeric};
use crate::expr::{compile, Scope};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use arrow::datatypes::DataType;
use datafusion::functions_aggregate::expr_fn::{
    avg, count, count_distinct, first_value, last_value, max, min, stddev, stddev_pop, sum,
    var_pop, var_sample,
};
use datafusion::logical_expr::{lit, Expr as DfExpr};
use etlantic_core::ir::{AggFunc, Aggregate, NamedExpr};
use etlantic_core::Result;

/// One aggregate as a DataFusion aggregate expression (unaliased). `ord` orders
/// `first`/`last`.
pub(crate) fn aggregate_expr(a: &Aggregate, scope: &Scope, ord: Option<DfExpr>) -> Result<DfExpr> {
    let arg = match (&a.arg, a.func) {
        (_, AggFunc::CountAll) => return Ok(count(lit(1i64))),
        (Some(e), _) => compile(e, scope)?,
        (None, f) => {
            return Err(error::type_mismatch(format!(
                "aggregate `{}`: {} needs an argument",
                a.name,
                f.id()
            )))
        }
    };
    let t = scope.type_of(&arg)?;
    let numeric = |what: &str| -> Result<()> {
        if is_numeric(&t) || t == DataType::Null {
            Ok(())
        } else {
            Err(error::type_mismatch(format!(
                "aggregate `{}`: {what} needs numbers, got {}",
                a.name,
                describe(&t)
            )))
        }
    };
    let order = || {
        ord.clone()
            .map(|o| vec![o.sort(true, false)])
            .unwrap_or_default()
    };
    Ok(match a.func {
        AggFunc::CountAll => unreachable!("handled above"),
        AggFunc::Count => count(arg),
        AggFunc::CountDistinct => count_distinct(arg),
        AggFunc::Sum => {
            numeric("sum")?;
            sum(arg)
        }
        AggFunc::Average => {
            numeric("average")?;
            avg(arg)
        }
        AggFunc::Min => min(arg),
        AggFunc::Max => max(arg),
        AggFunc::First => first_value(arg, order()),
        AggFunc::Last => last_value(arg, order()),
        AggFunc::Variance
        | AggFunc::VariancePopulation
        | AggFunc::Stddev
        | AggFunc::StddevPopulation => {
            numeric(a.func.id())?;
            let x = datafusion::logical_expr::cast(arg, DataType::Float64);
            match a.func {
                AggFunc::Variance => var_sample(x),
                AggFunc::VariancePopulation => var_pop(x),
                AggFunc::Stddev => stddev(x),
                _ => stddev_pop(x),
            }
        }
    })
}

/// Applies an aggregation.
pub(crate) fn aggregate(
    rel: Relation,
    group_by: &[NamedExpr],
    aggregates: &[Aggregate],
    demand: Demand,
) -> Result<Relation> {
    unique_names(
        group_by
            .iter()
            .map(|g| g.name.as_str())
            .chain(aggregates.iter().map(|a| a.name.as_str())),
        "aggregate",
    )?;
    let scope = rel.scope();
    let groups = group_by
        .iter()
        .map(|g| Ok(compile(&g.expr, &scope)?.alias(&g.name)))
        .collect::<Result<Vec<_>>>()?;
    let ord = rel.ordered.then(|| rel.col(ORD));
    let mut aggs = aggregates
        .iter()
        .map(|a| Ok(aggregate_expr(a, &scope, ord.clone())?.alias(&a.name)))
        .collect::<Result<Vec<_>>>()?;
    let ordered = demand == Demand::Require && rel.ordered;
    if ordered {
        aggs.push(min(rel.col(ORD)).alias(ORD));
    }
    let df = rel.df.aggregate(groups, aggs).df("aggregate")?;
    Ok(Relation::shuffled(df, ordered))
}
