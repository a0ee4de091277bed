//! `dtcs:union`: the target's rows, then the other relation's rows.
//!
//! By name, columns are the target's in order followed by the other side's extra columns
//! (only with `allowMissingColumns`, filled with nulls on the side that lacks them). By
//! position, both sides need the same number of columns and the target's names win.
//! Types are unified (integers widen, integers and decimals become decimals); anything
//! else is a type mismatch. `distinct` keeps the first of equal rows.

use super::ordering;
use crate::error::{self, DfResultExt};
use crate::expr::types::{common_type, describe};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Expr as DfExpr;
use datafusion::logical_expr::{cast, lit, ExprFunctionExt, ExprSchemable};
use etlantic_core::Result;

const SIDE: &str = "__etl_side";
const SIDE_ORD: &str = "__etl_side_ord";

fn column_type(rel: &Relation, name: &str) -> Result<DataType> {
    rel.col(name).get_type(rel.schema().as_ref()).df("union")
}

/// One side projected onto the output columns: `(name, source column or None)`.
fn align(
    rel: Relation,
    columns: &[(String, Option<String>, DataType)],
    side: i64,
    with_ord: bool,
) -> Result<Relation> {
    let mut exprs = Vec::new();
    for (name, source, t) in columns {
        let e = match source {
            Some(src) => {
                let st = column_type(&rel, src)?;
                if st == *t {
                    rel.col(src)
                } else {
                    cast(rel.col(src), t.clone())
                }
            }
            None => lit(ScalarValue::try_from(t).unwrap_or(ScalarValue::Null)),
        };
        exprs.push(e.alias(name));
    }
    if with_ord {
        exprs.push(lit(side).alias(SIDE));
        let ord = if rel.ordered {
            rel.col(ORD)
        } else {
            lit(ScalarValue::Int64(None))
        };
        exprs.push(ord.alias(SIDE_ORD));
    }
    let df = rel.df.select(exprs).df("union input")?;
    Ok(Relation::shuffled(df, false))
}

fn missing(e: etlantic_core::Error, side: &str) -> etlantic_core::Error {
    error::with_help(
        error::prefixed(e, &format!("union by name: {side} lacks a column")),
        "Set allowMissingColumns to fill it with nulls, or project both sides to the same columns.",
    )
}

/// Applies a union.
pub(crate) fn union(
    target: Relation,
    other: Relation,
    by_name: bool,
    allow_missing: bool,
    distinct: bool,
    demand: Demand,
) -> Result<Relation> {
    let tcols = target.columns();
    let ocols = other.columns();
    // (output name, target source, other source)
    let mut layout: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    if by_name {
        for c in &tcols {
            let o = ocols.contains(c).then(|| c.clone());
            if o.is_none() && !allow_missing {
                return Err(missing(
                    error::unknown_column(c, &ocols),
                    "the other relation",
                ));
            }
            layout.push((c.clone(), Some(c.clone()), o));
        }
        for c in ocols.iter().filter(|c| !tcols.contains(c)) {
            if !allow_missing {
                return Err(missing(error::unknown_column(c, &tcols), "the target"));
            }
            layout.push((c.clone(), None, Some(c.clone())));
        }
    } else {
        if tcols.len() != ocols.len() {
            return Err(error::type_mismatch(format!(
                "union by position needs the same number of columns: {} and {}",
                tcols.len(),
                ocols.len()
            )));
        }
        for (t, o) in tcols.iter().zip(&ocols) {
            layout.push((t.clone(), Some(t.clone()), Some(o.clone())));
        }
    }
    let mut columns_t = Vec::new();
    let mut columns_o = Vec::new();
    for (name, ts, os) in &layout {
        let tt = match ts {
            Some(s) => column_type(&target, s)?,
            None => DataType::Null,
        };
        let ot = match os {
            Some(s) => column_type(&other, s)?,
            None => DataType::Null,
        };
        let t = common_type(&tt, &ot).ok_or_else(|| {
            error::type_mismatch(format!(
                "union: column `{name}` is {} on one side and {} on the other",
                describe(&tt),
                describe(&ot)
            ))
        })?;
        columns_t.push((name.clone(), ts.clone(), t.clone()));
        columns_o.push((name.clone(), os.clone(), t));
    }
    let want_order = demand == Demand::Require || (distinct && demand != Demand::None);
    let t = align(target, &columns_t, 0, want_order)?;
    let o = align(other, &columns_o, 1, want_order)?;
    let df = t.df.union(o.df).df("union")?;
    let unioned = Relation::shuffled(df, false);
    let names: Vec<DfExpr> = unioned.column_exprs();
    let rel = if want_order {
        let ord = datafusion::functions_window::expr_fn::row_number()
            .order_by(vec![
                unioned.col(SIDE).sort(true, false),
                unioned.col(SIDE_ORD).sort(true, false),
            ])
            .build()
            .df("union order")?;
        unioned.select_with_ord(names, ord)?
    } else {
        unioned.select(names, false)?
    };
    if distinct {
        ordering::distinct_rows(rel, demand)
    } else {
        Ok(rel)
    }
}
