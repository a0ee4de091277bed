//! DTCS actions as Polars operations on [`Relation`]s.
//!
//! Semantics (the same as the reference engine's, see `etlantic-datafusion`'s actions):
//!
//! - `filter` keeps the rows whose predicate is true; `project`, `with_fields` (each
//!   assignment sees the previous ones; a replaced column keeps its position),
//!   `drop_fields`, `rename_fields` (all at once) keep the row order.
//! - `sort` is stable (ties keep their input order), nulls last unless a key asks for
//!   them first. `limit` skips `offset` rows and keeps `count`, in row order.
//! - `distinct` keeps the first of each group of equal rows; `deduplicate` the first (or
//!   last) row per key; null keys form one group.
//! - `aggregate`: the group columns, then the aggregates; null is an ordinary group key;
//!   without group columns there is exactly one row (`count` 0, `sum` null on an empty
//!   input). `sum` of no values is null, `average` of decimals is exact (truncated at four
//!   more digits, like the reference engine), `first`/`last` follow the row order.
//! - `join`: key pairs with the same name merge into one column (`coalesce(left,
//!   right)` for right and full joins); another column on both sides is an error; semi and
//!   anti joins output the left columns. Null keys never match unless `nullSafe`; the
//!   optional predicate (and the `etlantic:timeRange` condition) is part of the match, so
//!   outer joins keep the rows it rejects. Output order: left-major, then right order,
//!   unmatched right rows last.
//! - `union` by name (missing columns with `allowMissingColumns` are null) or by
//!   position; types unified as the reference engine does; the target's rows first;
//!   `distinct` keeps the first of equal rows.

use crate::error;
use crate::expr::{compile, compile_predicate, int_lit, kernels, Compiled, Scope};
use crate::relation::{is_reserved, ord, Relation, ORD};
use crate::types::{
    common_type, describe, is_decimal, is_float, is_null, is_unsigned, precision, scale,
    MAX_PRECISION,
};
use etlantic_core::ir::{Action, AggFunc, Aggregate, JoinTimeRange, JoinType, NamedExpr, SortKey};
use etlantic_core::Result;
use indexmap::IndexMap;
use polars::prelude::*;

/// Applies one action to its target (and the secondary relation of a join or union).
pub(crate) fn apply(
    action: &Action,
    target: Relation,
    secondary: Option<Relation>,
) -> Result<Relation> {
    let need_secondary = || {
        secondary
            .clone()
            .ok_or_else(|| error::engine("internal: the secondary relation is missing"))
    };
    match action {
        Action::Filter { predicate } => {
            let p = compile_predicate(predicate, &target.scope())?;
            Ok(Relation {
                lf: target.lf.filter(p),
                ..target
            })
        }
        Action::Project { fields } => project(target, fields),
        Action::WithFields { assignments } => with_fields(target, assignments),
        Action::DropFields {
            fields,
            ignore_missing,
        } => {
            if !ignore_missing {
                for f in fields {
                    target.require(f)?;
                }
            }
            let scope = target.scope();
            let values = target
                .names()
                .into_iter()
                .filter(|c| !fields.contains(c))
                .map(|c| Ok((c.clone(), scope.column(&c)?)))
                .collect::<Result<Vec<_>>>()?;
            Ok(target.select(values))
        }
        Action::RenameFields { mapping } => {
            let scope = target.scope();
            let values = target
                .names()
                .into_iter()
                .map(|c| {
                    let new = mapping.get(&c).cloned().unwrap_or_else(|| c.clone());
                    Ok((new, scope.column(&c)?))
                })
                .collect::<Result<Vec<_>>>()?;
            unique_names(values.iter().map(|(n, _)| n.as_str()), "rename_fields")?;
            Ok(target.select(values))
        }
        Action::Join { .. } => join(target, need_secondary()?, action),
        Action::Union {
            by_name,
            allow_missing,
            distinct,
            ..
        } => {
            let u = union(target, need_secondary()?, *by_name, *allow_missing)?;
            if *distinct {
                distinct_rows(u)
            } else {
                Ok(u)
            }
        }
        Action::Aggregate {
            group_by,
            aggregates,
        } => aggregate(target, group_by, aggregates),
        Action::Sort { keys } => sort(target, keys),
        Action::Limit { count, offset } => {
            let rel = target.in_order();
            let offset = i64::try_from(*offset).unwrap_or(i64::MAX);
            let count = IdxSize::try_from(*count).unwrap_or(IdxSize::MAX);
            Ok(Relation {
                lf: rel.lf.slice(offset, count),
                ..rel
            })
        }
        Action::Distinct { fields } => match fields {
            None => distinct_rows(target),
            Some(f) => first_per_key(target, f, false),
        },
        Action::Deduplicate { keys, keep_last } => {
            if keys.is_empty() {
                distinct_rows(target)
            } else {
                first_per_key(target, keys, *keep_last)
            }
        }
        // In batch mode every event is within the watermark: the first row per key wins.
        Action::DeduplicateWithinWatermark { keys } => {
            if keys.is_empty() {
                distinct_rows(target)
            } else {
                first_per_key(target, keys, false)
            }
        }
        other => Err(error::unsupported(format!("the action `{}`", other.id()))),
    }
}

/// Fails when two output columns would get the same name, or a reserved one.
fn unique_names<'a>(names: impl IntoIterator<Item = &'a str>, what: &str) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if is_reserved(n) {
            return Err(error::invalid_plan(format!(
                "{what}: the column name `{n}` is reserved by the Polars backend"
            )));
        }
        if !seen.insert(n) {
            return Err(error::invalid_plan(format!(
                "{what}: two output columns are named `{n}`"
            )));
        }
    }
    Ok(())
}

fn project(rel: Relation, fields: &[NamedExpr]) -> Result<Relation> {
    unique_names(fields.iter().map(|f| f.name.as_str()), "project")?;
    let scope = rel.scope();
    let values = fields
        .iter()
        .map(|f| Ok((f.name.clone(), compile(&f.expr, &scope)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(rel.select(values))
}

fn with_fields(mut rel: Relation, assignments: &[NamedExpr]) -> Result<Relation> {
    if let Some(a) = assignments.iter().find(|a| is_reserved(&a.name)) {
        return Err(error::invalid_plan(format!(
            "with_fields: the column name `{}` is reserved by the Polars backend",
            a.name
        )));
    }
    for a in assignments {
        let value = compile(&a.expr, &rel.scope())?;
        match rel.columns.iter_mut().find(|(n, _)| *n == a.name) {
            Some((_, t)) => *t = value.dtype.clone(),
            None => rel.columns.push((a.name.clone(), value.dtype.clone())),
        }
        rel.lf = rel.lf.with_columns([value.expr.alias(a.name.as_str())]);
    }
    Ok(rel)
}

fn sort(rel: Relation, keys: &[SortKey]) -> Result<Relation> {
    let scope = rel.scope();
    let mut by = Vec::with_capacity(keys.len() + 1);
    let mut descending = Vec::with_capacity(keys.len() + 1);
    let mut nulls_last = Vec::with_capacity(keys.len() + 1);
    for k in keys {
        let e = compile(&k.expr, &scope)?;
        if matches!(e.dtype, DataType::List(_)) {
            return Err(error::type_mismatch(format!(
                "cannot sort by `{}` ({})",
                k.expr,
                describe(&e.dtype)
            )));
        }
        by.push(e.expr);
        descending.push(k.descending);
        nulls_last.push(!k.nulls_first);
    }
    // Ties keep their order.
    by.push(ord());
    descending.push(false);
    nulls_last.push(true);
    let options = SortMultipleOptions {
        descending,
        nulls_last,
        multithreaded: true,
        maintain_order: true,
        limit: None,
    };
    let sorted = Relation {
        lf: rel.lf.sort_by_exprs(by, options),
        sorted: true,
        ..rel
    };
    Ok(sorted.renumber())
}

/// One row per group of equal rows, at the position of the first one.
fn distinct_rows(rel: Relation) -> Result<Relation> {
    if rel.columns.is_empty() {
        let rel = rel.in_order();
        return Ok(Relation {
            lf: rel.lf.slice(0, 1),
            ..rel
        });
    }
    let keys = rel.column_exprs();
    let lf = rel.lf.group_by(keys).agg([ord().min().alias(ORD)]);
    Ok(Relation {
        lf,
        columns: rel.columns,
        sorted: false,
    })
}

/// The first (or last) row per key, at its position. Null keys form one group.
fn first_per_key(rel: Relation, keys: &[String], keep_last: bool) -> Result<Relation> {
    for k in keys {
        rel.require(k)?;
    }
    let pick = if keep_last { ord().max() } else { ord().min() };
    // The input is read twice: computed once.
    let input = rel.lf.cache();
    let chosen = input
        .clone()
        .group_by(keys.iter().map(|k| col(k.as_str())).collect::<Vec<_>>())
        .agg([pick.alias(ORD)])
        .select([ord()]);
    let lf = input.join(
        chosen,
        [ord()],
        [ord()],
        JoinArgs::new(polars::prelude::JoinType::Semi),
    );
    Ok(Relation {
        lf,
        columns: rel.columns,
        sorted: false,
    })
}

/// A value that is evaluated once per row even when it is a constant (Polars evaluates
/// a literal once per group in an aggregation).
fn per_row(c: Compiled, constant: bool) -> Compiled {
    if !constant {
        return c;
    }
    let dtype = c.dtype.clone();
    Compiled::new(
        when(ord().is_null())
            .then(lit(NULL).cast(dtype.clone()))
            .otherwise(c.expr),
        dtype,
    )
}

/// The values of a group in row order.
fn in_row_order(x: Expr) -> Expr {
    x.sort_by([ord()], SortMultipleOptions::default())
}

/// `None` when there are no values (instead of Polars' 0 for a sum).
fn null_without_values(arg: &Expr, value: Expr, dtype: &DataType) -> Expr {
    when(arg.clone().count().eq(lit(0)))
        .then(lit(NULL).cast(dtype.clone()))
        .otherwise(value)
}

/// An aggregate: the aggregation expressions, an optional expression computed from them
/// afterwards (decimal averages), and the result type.
struct AggPlan {
    aggs: Vec<Expr>,
    post: Option<Expr>,
    dtype: DataType,
}

fn aggregate_plan(i: usize, a: &Aggregate, scope: &Scope) -> Result<AggPlan> {
    let name = a.name.as_str();
    let arg = match (&a.arg, a.func) {
        (_, AggFunc::CountAll) => {
            return Ok(AggPlan {
                aggs: vec![len().cast(DataType::Int64).alias(name)],
                post: None,
                dtype: DataType::Int64,
            })
        }
        (Some(e), _) => per_row(compile(e, scope)?, e.columns().is_empty()),
        (None, f) => {
            return Err(error::type_mismatch(format!(
                "aggregate `{name}`: {} needs an argument",
                f.id()
            )))
        }
    };
    let t = arg.dtype.clone();
    let numeric = |what: &str| -> Result<()> {
        if crate::types::is_numeric(&t) || is_null(&t) {
            Ok(())
        } else {
            Err(error::type_mismatch(format!(
                "aggregate `{name}`: {what} needs numbers, got {}",
                describe(&t)
            )))
        }
    };
    let x = arg.expr;
    let plain = |e: Expr, dtype: DataType| AggPlan {
        aggs: vec![e.alias(name)],
        post: None,
        dtype,
    };
    Ok(match a.func {
        AggFunc::CountAll => unreachable!("handled above"),
        AggFunc::Count => plain(x.count().cast(DataType::Int64), DataType::Int64),
        AggFunc::CountDistinct => plain(
            x.drop_nulls().n_unique().cast(DataType::Int64),
            DataType::Int64,
        ),
        AggFunc::Sum => {
            numeric("sum")?;
            let out = if is_decimal(&t) {
                DataType::Decimal(MAX_PRECISION, scale(&t))
            } else if is_float(&t) {
                DataType::Float64
            } else if is_unsigned(&t) {
                DataType::UInt64
            } else {
                DataType::Int64
            };
            let sum = if is_decimal(&t) {
                x.clone().sum().strict_cast(out.clone())
            } else if is_float(&t) {
                kernels::sequential_sum(in_row_order(x.clone()), false)
            } else {
                x.clone().strict_cast(out.clone()).sum()
            };
            plain(null_without_values(&x, sum, &out), out)
        }
        AggFunc::Average => {
            numeric("average")?;
            if is_decimal(&t) {
                let out = DataType::Decimal(
                    (precision(&t) + 4).min(MAX_PRECISION),
                    (scale(&t) + 4).min(MAX_PRECISION),
                );
                let (s, n) = (format!("__etl_avg_sum{i}"), format!("__etl_avg_n{i}"));
                AggPlan {
                    aggs: vec![
                        x.clone().sum().alias(s.as_str()),
                        x.count().cast(DataType::Int64).alias(n.as_str()),
                    ],
                    post: Some(
                        kernels::decimal_average(col(s.as_str()), col(n.as_str()), out.clone())
                            .alias(name),
                    ),
                    dtype: out,
                }
            } else {
                let mean = kernels::sequential_sum(
                    in_row_order(x.clone().strict_cast(DataType::Float64)),
                    true,
                );
                plain(
                    null_without_values(&x, mean, &DataType::Float64),
                    DataType::Float64,
                )
            }
        }
        AggFunc::Min => plain(x.min(), t),
        AggFunc::Max => plain(x.max(), t),
        AggFunc::First => plain(in_row_order(x).first(), t),
        AggFunc::Last => plain(in_row_order(x).last(), t),
        AggFunc::Variance
        | AggFunc::VariancePopulation
        | AggFunc::Stddev
        | AggFunc::StddevPopulation => {
            numeric(a.func.id())?;
            // Sample: over n - 1, null below two values; population: over n.
            let ddof: u8 = if matches!(a.func, AggFunc::Variance | AggFunc::Stddev) {
                1
            } else {
                0
            };
            let f = x.clone().strict_cast(DataType::Float64);
            let v = if matches!(a.func, AggFunc::Stddev | AggFunc::StddevPopulation) {
                f.std(ddof)
            } else {
                f.var(ddof)
            };
            plain(
                when(x.count().gt(lit(ddof as u32)))
                    .then(v)
                    .otherwise(lit(NULL).cast(DataType::Float64)),
                DataType::Float64,
            )
        }
    })
}

fn aggregate(rel: Relation, group_by: &[NamedExpr], aggregates: &[Aggregate]) -> Result<Relation> {
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
        .map(|g| Ok((g.name.clone(), compile(&g.expr, &scope)?)))
        .collect::<Result<Vec<_>>>()?;
    let plans = aggregates
        .iter()
        .enumerate()
        .map(|(i, a)| aggregate_plan(i, a, &scope))
        .collect::<Result<Vec<_>>>()?;
    let mut aggs: Vec<Expr> = plans.iter().flat_map(|p| p.aggs.clone()).collect();
    let lf = if groups.is_empty() {
        rel.lf
            .select(aggs)
            .with_columns([lit(0).cast(IDX_DTYPE).alias(ORD)])
    } else {
        aggs.push(ord().min().alias(ORD));
        rel.lf
            .group_by(
                groups
                    .iter()
                    .map(|(n, c)| c.expr.clone().alias(n.as_str()))
                    .collect::<Vec<_>>(),
            )
            .agg(aggs)
    };
    let posts: Vec<Expr> = plans.iter().filter_map(|p| p.post.clone()).collect();
    let lf = if posts.is_empty() {
        lf
    } else {
        lf.with_columns(posts)
    };
    let mut columns: Vec<(String, DataType)> =
        groups.into_iter().map(|(n, c)| (n, c.dtype)).collect();
    columns.extend(
        aggregates
            .iter()
            .zip(&plans)
            .map(|(a, p)| (a.name.clone(), p.dtype.clone())),
    );
    let mut exprs: Vec<Expr> = columns.iter().map(|(n, _)| col(n.as_str())).collect();
    exprs.push(ord());
    Ok(Relation {
        lf: lf.select(exprs),
        columns,
        sorted: false,
    })
}

/// A column of a union: its output name and its source on the target and the other side.
type UnionColumn = (String, Option<String>, Option<String>);

fn union(
    target: Relation,
    other: Relation,
    by_name: bool,
    allow_missing: bool,
) -> Result<Relation> {
    let tcols = target.names();
    let ocols = other.names();
    // (output name, target source, other source)
    let mut layout: Vec<UnionColumn> = Vec::new();
    let missing = |c: &str, cols: &[String], side: &str| {
        let e = error::unknown_column(c, cols);
        e.map_diagnostics(|mut d| {
            d.message = format!("union by name: {side} lacks a column: {}", d.message);
            d.help("Set allowMissingColumns to fill it with nulls, or project both sides to the same columns.")
        })
    };
    if by_name {
        for c in &tcols {
            let o = ocols.contains(c).then(|| c.clone());
            if o.is_none() && !allow_missing {
                return Err(missing(c, &ocols, "the other relation"));
            }
            layout.push((c.clone(), Some(c.clone()), o));
        }
        for c in ocols.iter().filter(|c| !tcols.contains(c)) {
            if !allow_missing {
                return Err(missing(c, &tcols, "the target"));
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
    let mut columns = Vec::with_capacity(layout.len());
    for (name, ts, os) in &layout {
        let tt = ts
            .as_ref()
            .map(|s| target.require(s).cloned())
            .transpose()?
            .unwrap_or(DataType::Null);
        let ot = os
            .as_ref()
            .map(|s| other.require(s).cloned())
            .transpose()?
            .unwrap_or(DataType::Null);
        let t = common_type(&tt, &ot).ok_or_else(|| {
            error::type_mismatch(format!(
                "union: column `{name}` is {} on one side and {} on the other",
                describe(&tt),
                describe(&ot)
            ))
        })?;
        columns.push((name.clone(), t));
    }
    let side =
        |rel: Relation, pick: &dyn Fn(&UnionColumn) -> Option<String>| -> Result<LazyFrame> {
            let rel = rel.in_order();
            let scope = rel.scope();
            let mut exprs = Vec::with_capacity(columns.len() + 1);
            for (l, (name, t)) in layout.iter().zip(&columns) {
                let e = match pick(l) {
                    Some(src) => scope.column(&src)?.cast_to(t),
                    None => lit(NULL).cast(t.clone()),
                };
                exprs.push(e.alias(name.as_str()));
            }
            exprs.push(ord());
            Ok(rel.lf.select(exprs))
        };
    let t = side(target, &|l| l.1.clone())?;
    let o = side(other, &|l| l.2.clone())?;
    let lf = concat(
        [t, o],
        UnionArgs {
            maintain_order: true,
            ..Default::default()
        },
    )
    .map_err(|e| error::polars(e, "union"))?;
    Ok(Relation {
        lf,
        columns,
        sorted: true,
    }
    .renumber())
}

const LORD: &str = "__etl_lord";
const RORD: &str = "__etl_rord";

fn lcol(i: usize) -> String {
    format!("__etl_l{i}")
}

fn rcol(i: usize) -> String {
    format!("__etl_r{i}")
}

fn join(left: Relation, right: Relation, action: &Action) -> Result<Relation> {
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
    let lcols = left.columns.clone();
    let rcols = right.columns.clone();
    let lnames = left.names();
    let rnames = right.names();
    if left_keys.len() != right_keys.len() {
        return Err(error::invalid_plan(
            "a join needs as many left keys as right keys",
        ));
    }
    for k in left_keys {
        left.require(k)?;
    }
    for k in right_keys {
        right.require(k)?;
    }
    let merged: Vec<&String> = left_keys
        .iter()
        .zip(right_keys)
        .filter(|(l, r)| l == r)
        .map(|(l, _)| l)
        .collect();
    if !semi_anti {
        if let Some(c) = rnames
            .iter()
            .find(|c| !merged.contains(c) && lnames.contains(c))
        {
            return Err(error::invalid_plan(format!(
                "join: column `{c}` is on both sides and is not a shared key (collisionPolicy: fail)"
            )));
        }
    }
    let lpos = |n: &str| lnames.iter().position(|c| c == n).expect("checked");
    let rpos = |n: &str| rnames.iter().position(|c| c == n).expect("checked");

    // Key types.
    let mut key_types = Vec::new();
    for (lk, rk) in left_keys.iter().zip(right_keys) {
        let lt = &lcols[lpos(lk)].1;
        let rt = &rcols[rpos(rk)].1;
        let t = common_type(lt, rt).ok_or_else(|| {
            error::type_mismatch(format!(
                "join keys `{lk}` ({}) and `{rk}` ({}) cannot be compared",
                describe(lt),
                describe(rt)
            ))
        })?;
        key_types.push(t);
    }

    // Both sides under hidden names, with their ordinals and the key columns.
    let mut lexprs: Vec<Expr> = lnames
        .iter()
        .enumerate()
        .map(|(i, n)| col(n.as_str()).alias(lcol(i).as_str()))
        .collect();
    lexprs.push(ord().alias(LORD));
    let mut rexprs: Vec<Expr> = rnames
        .iter()
        .enumerate()
        .map(|(i, n)| col(n.as_str()).alias(rcol(i).as_str()))
        .collect();
    rexprs.push(ord().alias(RORD));
    let mut lkeys = Vec::new();
    let mut rkeys = Vec::new();
    for (k, ((lk, rk), t)) in left_keys.iter().zip(right_keys).zip(&key_types).enumerate() {
        let (lname, rname) = (format!("__etl_lk{k}"), format!("__etl_rk{k}"));
        lexprs.push(
            Compiled::new(col(lk.as_str()), lcols[lpos(lk)].1.clone())
                .cast_to(t)
                .alias(lname.as_str()),
        );
        rexprs.push(
            Compiled::new(col(rk.as_str()), rcols[rpos(rk)].1.clone())
                .cast_to(t)
                .alias(rname.as_str()),
        );
        lkeys.push(col(lname.as_str()));
        rkeys.push(col(rname.as_str()));
    }
    // Each side (and the matching pairs) is read more than once: computed once.
    let l = left.lf.select(lexprs).cache();
    let r = right.lf.select(rexprs).cache();

    // The matching pairs.
    let mut pairs = if lkeys.is_empty() {
        l.clone().cross_join(r.clone(), None)
    } else {
        let args = JoinArgs::new(polars::prelude::JoinType::Inner)
            .with_coalesce(JoinCoalesce::KeepColumns);
        let mut args = args;
        args.nulls_equal = *null_safe;
        l.clone().join(r.clone(), lkeys, rkeys, args)
    };
    // The predicate sees every column by its plain name (left first on shared names).
    let mut bindings = IndexMap::new();
    for (i, (n, t)) in lcols.iter().enumerate() {
        bindings.insert(n.clone(), Compiled::new(col(lcol(i).as_str()), t.clone()));
    }
    for (i, (n, t)) in rcols.iter().enumerate() {
        bindings
            .entry(n.clone())
            .or_insert_with(|| Compiled::new(col(rcol(i).as_str()), t.clone()));
    }
    let scope = Scope::new(bindings);
    let mut condition = predicate
        .as_ref()
        .map(|p| compile_predicate(p, &scope))
        .transpose()?;
    if let Some(range) = time_range {
        let c = time_condition(range, &lcols, &rcols, &lnames, &rnames)?;
        condition = Some(match condition {
            Some(p) => p.and(c),
            None => c,
        });
    }
    if let Some(c) = condition {
        pairs = pairs.filter(c);
    }
    let pairs = pairs.cache();

    // Semi and anti joins: the left rows with (without) a match, in left order.
    if semi_anti {
        let how = if jt == JoinType::Semi {
            polars::prelude::JoinType::Semi
        } else {
            polars::prelude::JoinType::Anti
        };
        let matched = pairs.select([col(LORD)]);
        let lf = l
            .join(matched, [col(LORD)], [col(LORD)], JoinArgs::new(how))
            .select(
                (0..lnames.len())
                    .map(|i| col(lcol(i).as_str()).alias(lnames[i].as_str()))
                    .chain([col(LORD).alias(ORD)])
                    .collect::<Vec<_>>(),
            );
        return Ok(Relation {
            lf,
            columns: lcols,
            sorted: false,
        });
    }

    // Every column of the joined row (hidden names), for the pairs and unmatched rows.
    let all: Vec<(String, DataType)> = lcols
        .iter()
        .enumerate()
        .map(|(i, (_, t))| (lcol(i), t.clone()))
        .chain([(LORD.to_string(), IDX_DTYPE)])
        .chain(
            rcols
                .iter()
                .enumerate()
                .map(|(i, (_, t))| (rcol(i), t.clone())),
        )
        .chain([(RORD.to_string(), IDX_DTYPE)])
        .collect();
    let shape = |lf: LazyFrame, present: &dyn Fn(&str) -> bool| -> LazyFrame {
        lf.select(
            all.iter()
                .map(|(n, t)| {
                    if present(n) {
                        col(n.as_str())
                    } else {
                        lit(NULL).cast(t.clone()).alias(n.as_str())
                    }
                })
                .collect::<Vec<_>>(),
        )
    };
    let is_left = |n: &str| n == LORD || (n.starts_with("__etl_l") && !n.starts_with("__etl_lk"));
    let is_right = |n: &str| n == RORD || (n.starts_with("__etl_r") && !n.starts_with("__etl_rk"));
    let mut parts = vec![shape(pairs.clone(), &|_| true)];
    if matches!(jt, JoinType::Left | JoinType::Full) {
        let unmatched = l.join(
            pairs.clone().select([col(LORD)]),
            [col(LORD)],
            [col(LORD)],
            JoinArgs::new(polars::prelude::JoinType::Anti),
        );
        parts.push(shape(unmatched, &is_left));
    }
    if matches!(jt, JoinType::Right | JoinType::Full) {
        let unmatched = r.join(
            pairs.select([col(RORD)]),
            [col(RORD)],
            [col(RORD)],
            JoinArgs::new(polars::prelude::JoinType::Anti),
        );
        parts.push(shape(unmatched, &is_right));
    }
    let joined = if parts.len() == 1 {
        parts.pop().expect("one part")
    } else {
        concat(parts, UnionArgs::default()).map_err(|e| error::polars(e, "join"))?
    };
    // Left-major order, then right order; unmatched right rows last.
    let joined = joined.sort_by_exprs(
        [col(LORD), col(RORD)],
        SortMultipleOptions {
            descending: vec![false, false],
            nulls_last: vec![true, true],
            multithreaded: true,
            maintain_order: true,
            limit: None,
        },
    );

    // Output columns.
    let mut values: Vec<(String, Compiled)> = Vec::new();
    for (i, (n, t)) in lcols.iter().enumerate() {
        if merged.contains(&n) && matches!(jt, JoinType::Right | JoinType::Full) {
            let k = left_keys.iter().position(|k| k == n).expect("merged key");
            let kt = &key_types[k];
            let lv = Compiled::new(col(lcol(i).as_str()), t.clone()).cast_to(kt);
            let rv =
                Compiled::new(col(rcol(rpos(n)).as_str()), rcols[rpos(n)].1.clone()).cast_to(kt);
            values.push((
                n.clone(),
                Compiled::new(
                    when(lv.clone().is_not_null()).then(lv).otherwise(rv),
                    kt.clone(),
                ),
            ));
        } else {
            values.push((n.clone(), Compiled::new(col(lcol(i).as_str()), t.clone())));
        }
    }
    for (i, (n, t)) in rcols.iter().enumerate() {
        if !merged.contains(&n) {
            values.push((n.clone(), Compiled::new(col(rcol(i).as_str()), t.clone())));
        }
    }
    let mut exprs: Vec<Expr> = Vec::with_capacity(values.len());
    let mut columns = Vec::with_capacity(values.len());
    for (n, c) in values {
        exprs.push(c.expr.alias(n.as_str()));
        columns.push((n, c.dtype));
    }
    Ok(Relation {
        lf: joined.select(exprs).with_row_index(ORD, None),
        columns,
        sorted: true,
    })
}

/// `left.t >= right.t - lower AND left.t <= right.t + upper`, in microseconds.
fn time_condition(
    r: &JoinTimeRange,
    lcols: &[(String, DataType)],
    rcols: &[(String, DataType)],
    lnames: &[String],
    rnames: &[String],
) -> Result<Expr> {
    let micros = |cols: &[(String, DataType)],
                  names: &[String],
                  c: &str,
                  side: &str,
                  hidden: fn(usize) -> String|
     -> Result<Expr> {
        let i = names
            .iter()
            .position(|n| n == c)
            .ok_or_else(|| error::unknown_column(c, names))?;
        match &cols[i].1 {
            DataType::Datetime(_, tz) => Ok(col(hidden(i).as_str())
                .strict_cast(DataType::Datetime(TimeUnit::Microseconds, tz.clone()))
                .to_physical()),
            other => Err(error::type_mismatch(format!(
                "join time range: `{c}` ({side} side) is {}, not a timestamp",
                describe(other)
            ))),
        }
    };
    let lt = micros(lcols, lnames, &r.left, "left", lcol)?;
    let rt = micros(rcols, rnames, &r.right, "right", rcol)?;
    let lower = int_lit(r.lower.as_micros());
    let upper = int_lit(r.upper.as_micros());
    Ok(lt
        .clone()
        .gt_eq(rt.clone() - lower)
        .and(lt.lt_eq(rt + upper)))
}
