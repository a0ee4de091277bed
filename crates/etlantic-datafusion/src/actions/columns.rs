//! Row-wise actions: filter, project, with_fields, drop_fields, rename_fields.
//!
//! They keep the input's row order (and its ordinal, when anyone cares).

use super::unique_names;
use crate::error::{self, DfResultExt};
use crate::expr::{compile, compile_predicate};
use crate::plan::order::Demand;
use crate::relation::Relation;
use etlantic_core::ir::{Expr, NamedExpr};
use etlantic_core::Result;
use indexmap::IndexMap;

fn keep(demand: Demand) -> bool {
    demand != Demand::None
}

/// `dtcs:filter`: keeps the rows whose predicate is true (null drops the row).
pub(crate) fn filter(rel: Relation, predicate: &Expr, demand: Demand) -> Result<Relation> {
    let p = compile_predicate(predicate, &rel.scope())?;
    let (ordered, in_order) = (rel.ordered, rel.in_order);
    let df = rel.df.filter(p).df("filter")?;
    Relation {
        df,
        ordered,
        in_order,
    }
    .keep_order(keep(demand))
}

/// `dtcs:project`: exactly these columns, in this order.
pub(crate) fn project(rel: Relation, fields: &[NamedExpr], demand: Demand) -> Result<Relation> {
    unique_names(fields.iter().map(|f| f.name.as_str()), "project")?;
    let scope = rel.scope();
    let exprs = fields
        .iter()
        .map(|f| Ok(compile(&f.expr, &scope)?.alias(&f.name)))
        .collect::<Result<Vec<_>>>()?;
    rel.select(exprs, keep(demand))
}

/// `dtcs:with_fields`: assignments in order; each sees the previous ones. Replacing a
/// column keeps its position, a new column is appended.
pub(crate) fn with_fields(
    mut rel: Relation,
    assignments: &[NamedExpr],
    demand: Demand,
) -> Result<Relation> {
    // Assigning a name twice is allowed (the later one wins); reserved names are not.
    if let Some(a) = assignments
        .iter()
        .find(|a| crate::table::is_reserved(&a.name))
    {
        return Err(error::invalid_plan(format!(
            "with_fields: the column name `{}` is reserved by the DataFusion backend",
            a.name
        )));
    }
    for a in assignments {
        let scope = rel.scope();
        let value = compile(&a.expr, &scope)?.alias(&a.name);
        let mut replaced = false;
        let mut exprs = Vec::new();
        for c in rel.columns() {
            if c == a.name {
                exprs.push(value.clone());
                replaced = true;
            } else {
                exprs.push(rel.col(&c));
            }
        }
        if !replaced {
            exprs.push(value);
        }
        rel = rel.select(exprs, true)?;
    }
    rel.keep_order(keep(demand))
}

/// `dtcs:drop_fields`: a missing column is an error unless `ignore_missing`.
pub(crate) fn drop_fields(
    rel: Relation,
    fields: &[String],
    ignore_missing: bool,
    demand: Demand,
) -> Result<Relation> {
    if !ignore_missing {
        for f in fields {
            rel.require(f)?;
        }
    }
    let exprs = rel
        .columns()
        .iter()
        .filter(|c| !fields.contains(c))
        .map(|c| rel.col(c))
        .collect();
    rel.select(exprs, keep(demand))
}

/// `dtcs:rename_fields`: all renames at once (so `a→b, b→a` swaps); a mapping for a
/// column the input does not have is ignored, as in the DTCS reference runtime.
pub(crate) fn rename_fields(
    rel: Relation,
    mapping: &IndexMap<String, String>,
    demand: Demand,
) -> Result<Relation> {
    let columns = rel.columns();
    let names: Vec<&str> = columns
        .iter()
        .map(|c| mapping.get(c).map(String::as_str).unwrap_or(c))
        .collect();
    unique_names(names.iter().copied(), "rename_fields").map_err(|e| {
        error::invalid_plan(format!(
            "{}; rename or drop the other column first",
            e.diagnostics()
                .iter()
                .next()
                .map(|d| d.message.clone())
                .unwrap_or_default()
        ))
    })?;
    let exprs = columns
        .iter()
        .zip(&names)
        .map(|(c, n)| rel.col(c).alias(*n))
        .collect();
    rel.select(exprs, keep(demand))
}
