//! Each DTCS action as one common table expression: filters and projections, the
//! row-order actions (sort, limit, distinct, deduplicate), unions, joins and aggregates,
//! every one keeping the ordinal column.

use super::expr::ExprCompiler;
use super::{cast_to, mismatch, typed_null, unify, unsupported, QueryBuilder, Rel, ORD};
use crate::dialect::{quote, Dialect, Ty};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Action, AggFunc, Expr, JoinType, NamedExpr, SortKey, WindowField};

/// A column of a union: output name, column of the left side, column of the right
/// side (none when that side lacks it), unified type.
type UnionColumn = (String, Option<String>, Option<String>, Ty);

impl QueryBuilder {
    pub(super) fn action(&mut self, op: &Action, r: Rel, secondary: Option<Rel>) -> Result<Rel> {
        let ord = quote(ORD);
        let d = self.dialect;
        match op {
            Action::Filter { predicate } => {
                let p = ExprCompiler::over(d, &r).compile(predicate)?;
                let sql = format!(
                    "SELECT {}, {ord} FROM {} WHERE {}",
                    r.column_list(None),
                    r.from,
                    p.as_predicate(d)
                );
                Ok(self.push(sql, r.columns.clone()))
            }
            Action::Project { fields } => self.project(&r, fields),
            Action::WindowFields { assignments } => self.window_fields(&r, assignments),
            Action::WithFields { assignments } => {
                let mut cur = r;
                for a in assignments {
                    let e = ExprCompiler::over(d, &cur).compile(&a.expr)?;
                    let mut cols = Vec::new();
                    let mut exprs = Vec::new();
                    let mut replaced = false;
                    for (n, t) in &cur.columns {
                        if *n == a.name {
                            exprs.push(format!("{} AS {}", e.sql, quote(n)));
                            cols.push((n.clone(), e.ty.clone()));
                            replaced = true;
                        } else {
                            exprs.push(quote(n));
                            cols.push((n.clone(), t.clone()));
                        }
                    }
                    if !replaced {
                        exprs.push(format!("{} AS {}", e.sql, quote(&a.name)));
                        cols.push((a.name.clone(), e.ty.clone()));
                    }
                    exprs.push(ord.clone());
                    let sql = format!("SELECT {} FROM {}", exprs.join(", "), cur.from);
                    cur = self.push(sql, cols);
                }
                Ok(cur)
            }
            Action::DropFields {
                fields,
                ignore_missing,
            } => {
                if !ignore_missing {
                    if let Some(f) = fields.iter().find(|f| r.ty(f).is_none()) {
                        return Err(mismatch(format!("cannot drop unknown column `{f}`")));
                    }
                }
                let keep: Vec<NamedExpr> = r
                    .columns
                    .iter()
                    .filter(|(n, _)| !fields.contains(n))
                    .map(|(n, _)| NamedExpr::column(n))
                    .collect();
                self.project(&r, &keep)
            }
            Action::RenameFields { mapping } => {
                let fields: Vec<NamedExpr> = r
                    .columns
                    .iter()
                    .map(|(n, _)| NamedExpr {
                        name: mapping.get(n).cloned().unwrap_or_else(|| n.clone()),
                        expr: Expr::col(n),
                    })
                    .collect();
                self.project(&r, &fields)
            }
            Action::Join {
                right,
                join_type,
                left_keys,
                right_keys,
                predicate,
                null_safe,
                time_range,
            } => {
                let rr = secondary.ok_or_else(|| {
                    Error::new(
                        &codes::UNKNOWN_NODE,
                        format!("join reads unknown `{right}`"),
                    )
                })?;
                self.join(
                    &r,
                    &rr,
                    JoinSpec {
                        join_type: *join_type,
                        left_keys,
                        right_keys,
                        predicate: predicate.as_ref(),
                        null_safe: *null_safe,
                        time_range: time_range.as_ref(),
                    },
                )
            }
            Action::Union {
                other,
                by_name,
                allow_missing,
                distinct,
            } => {
                let o = secondary.ok_or_else(|| {
                    Error::new(
                        &codes::UNKNOWN_NODE,
                        format!("union reads unknown `{other}`"),
                    )
                })?;
                let u = self.union(&r, &o, *by_name, *allow_missing)?;
                if *distinct {
                    self.first_per_key(&u, None, false)
                } else {
                    Ok(u)
                }
            }
            Action::Aggregate {
                group_by,
                aggregates,
            } => self.aggregate(&r, group_by, aggregates),
            Action::Sort { keys } => self.sort(&r, keys),
            Action::Limit { count, offset } => {
                let sql = format!(
                    "SELECT {}, {ord} FROM {} ORDER BY {ord} LIMIT {count} OFFSET {offset}",
                    r.column_list(None),
                    r.from
                );
                Ok(self.push(sql, r.columns.clone()))
            }
            Action::Distinct { fields } => self.first_per_key(&r, fields.as_deref(), false),
            Action::Deduplicate { keys, keep_last } => {
                let keys = if keys.is_empty() {
                    None
                } else {
                    Some(keys.as_slice())
                };
                self.first_per_key(&r, keys, *keep_last)
            }
            other => Err(unsupported(format!("`{}`", other.id()), d)),
        }
    }

    /// Window functions as SQL window functions over the same rows; rows equal in the
    /// window's order keep their row order (the ordinal is the last sort key).
    fn window_fields(&mut self, r: &Rel, assignments: &[WindowField]) -> Result<Rel> {
        let d = self.dialect;
        let ord = quote(ORD);
        let mut values: Vec<(String, String, Ty)> = Vec::new();
        for a in assignments {
            let Expr::Call { function, args } = &a.call else {
                return Err(mismatch(format!("`{}` is not a window function", a.call)));
            };
            let (call, ty) = match (function.as_str(), args.len()) {
                ("dtcs:row_number", 0) => ("row_number()".to_string(), Ty::Int),
                ("dtcs:rank", 0) => ("rank()".to_string(), Ty::Int),
                ("dtcs:dense_rank", 0) => ("dense_rank()".to_string(), Ty::Int),
                ("dtcs:lag" | "dtcs:lead", 1..=3) => {
                    let x = ExprCompiler::over(d, r).compile(&args[0])?;
                    let offset = match args.get(1) {
                        None => 1,
                        Some(e) => super::expr::const_int(e).filter(|n| *n >= 0).ok_or_else(|| {
                            mismatch(format!(
                                "window assignment `{}`: the offset must be a non-negative integer literal",
                                a.name
                            ))
                        })?,
                    };
                    let default = match args.get(2) {
                        Some(e) => ExprCompiler::over(d, r).compile(e)?.sql,
                        None => "NULL".to_string(),
                    };
                    let f = if function == "dtcs:lag" {
                        "lag"
                    } else {
                        "lead"
                    };
                    (format!("{f}({}, {offset}, {default})", x.sql), x.ty)
                }
                (f, _) => return Err(unsupported(format!("the window function `{f}`"), d)),
            };
            let mut partition = Vec::new();
            for p in &a.partition_by {
                partition.push(ExprCompiler::over(d, r).compile(p)?.sql);
            }
            let terms = order_terms(d, r, &a.order_by)?;
            let partition = if partition.is_empty() {
                String::new()
            } else {
                format!("PARTITION BY {} ", partition.join(", "))
            };
            let sql = format!("{call} OVER ({partition}ORDER BY {})", terms.join(", "));
            match values.iter_mut().find(|(n, _, _)| *n == a.name) {
                Some(v) => *v = (a.name.clone(), sql, ty),
                None => values.push((a.name.clone(), sql, ty)),
            }
        }
        let mut exprs = Vec::new();
        let mut cols = Vec::new();
        for (n, t) in &r.columns {
            match values.iter().position(|(v, _, _)| v == n) {
                Some(i) => {
                    let (name, sql, ty) = values.remove(i);
                    exprs.push(format!("{sql} AS {}", quote(&name)));
                    cols.push((name, ty));
                }
                None => {
                    exprs.push(quote(n));
                    cols.push((n.clone(), t.clone()));
                }
            }
        }
        for (name, sql, ty) in values {
            exprs.push(format!("{sql} AS {}", quote(&name)));
            cols.push((name, ty));
        }
        exprs.push(ord);
        let sql = format!("SELECT {} FROM {}", exprs.join(", "), r.from);
        Ok(self.push(sql, cols))
    }

    fn project(&mut self, r: &Rel, fields: &[NamedExpr]) -> Result<Rel> {
        let mut exprs = Vec::new();
        let mut cols = Vec::new();
        for f in fields {
            let e = ExprCompiler::over(self.dialect, r).compile(&f.expr)?;
            exprs.push(format!("{} AS {}", e.sql, quote(&f.name)));
            cols.push((f.name.clone(), e.ty));
        }
        exprs.push(quote(ORD));
        let sql = format!("SELECT {} FROM {}", exprs.join(", "), r.from);
        Ok(self.push(sql, cols))
    }

    /// The first row (or last, with `last`) of each group of rows equal on `keys` (all
    /// columns when `None`), in row order.
    fn first_per_key(&mut self, r: &Rel, keys: Option<&[String]>, last: bool) -> Result<Rel> {
        let ord = quote(ORD);
        let keys: Vec<String> = match keys {
            Some(k) => {
                if let Some(bad) = k.iter().find(|k| r.ty(k).is_none()) {
                    return Err(mismatch(format!("unknown key column `{bad}`")));
                }
                k.iter().map(|k| quote(k)).collect()
            }
            None => r.columns.iter().map(|(n, _)| quote(n)).collect(),
        };
        let partition = if keys.is_empty() {
            String::new()
        } else {
            format!("PARTITION BY {} ", keys.join(", "))
        };
        let dir = if last { "DESC" } else { "ASC" };
        let inner = format!(
            "SELECT {}, {ord}, row_number() OVER ({partition}ORDER BY {ord} {dir}) AS __etl_rn FROM {}",
            r.column_list(None),
            r.from
        );
        let sql = format!(
            "SELECT {}, {ord} FROM ({inner}) AS __etl_d WHERE __etl_rn = 1",
            r.column_list(None)
        );
        Ok(self.push(sql, r.columns.clone()))
    }

    fn sort(&mut self, r: &Rel, keys: &[SortKey]) -> Result<Rel> {
        let ord = quote(ORD);
        let terms = order_terms(self.dialect, r, keys)?;
        let sql = format!(
            "SELECT {}, row_number() OVER (ORDER BY {}) AS {ord} FROM {}",
            r.column_list(None),
            terms.join(", "),
            r.from
        );
        Ok(self.push(sql, r.columns.clone()))
    }

    fn union(&mut self, a: &Rel, b: &Rel, by_name: bool, allow_missing: bool) -> Result<Rel> {
        let ord = quote(ORD);
        let mut columns: Vec<UnionColumn> = Vec::new();
        if by_name {
            for (n, t) in &a.columns {
                let other = b.ty(n);
                if other.is_none() && !allow_missing {
                    return Err(mismatch(format!(
                        "union by name: `{n}` is missing on one side"
                    )));
                }
                let ty = unify(t, other.unwrap_or(&Ty::Null));
                columns.push((n.clone(), Some(n.clone()), other.map(|_| n.clone()), ty));
            }
            for (n, t) in &b.columns {
                if a.ty(n).is_none() {
                    if !allow_missing {
                        return Err(mismatch(format!(
                            "union by name: `{n}` is missing on one side"
                        )));
                    }
                    columns.push((n.clone(), None, Some(n.clone()), t.clone()));
                }
            }
        } else {
            if a.columns.len() != b.columns.len() {
                return Err(mismatch(format!(
                    "union by position needs as many columns on both sides ({} and {})",
                    a.columns.len(),
                    b.columns.len()
                )));
            }
            for ((n, t), (m, u)) in a.columns.iter().zip(&b.columns) {
                columns.push((n.clone(), Some(n.clone()), Some(m.clone()), unify(t, u)));
            }
        }
        let side = |rel: &Rel, pick: &dyn Fn(&UnionColumn) -> Option<String>, side: i64| {
            let exprs: Vec<String> = columns
                .iter()
                .map(|c| match pick(c) {
                    Some(src) => format!(
                        "{} AS {}",
                        cast_to(
                            self.dialect,
                            &quote(&src),
                            rel.ty(&src).unwrap_or(&Ty::Null),
                            &c.3
                        ),
                        quote(&c.0)
                    ),
                    None => format!("{} AS {}", typed_null(self.dialect, &c.3), quote(&c.0)),
                })
                .collect();
            let mut exprs = exprs;
            exprs.push(format!("{side} AS __etl_side"));
            exprs.push(format!("{ord} AS __etl_side_ord"));
            format!("SELECT {} FROM {}", exprs.join(", "), rel.from)
        };
        let left = side(a, &|c| c.1.clone(), 0);
        let right = side(b, &|c| c.2.clone(), 1);
        let names: Vec<String> = columns.iter().map(|c| quote(&c.0)).collect();
        let sql = format!(
            "SELECT {}, row_number() OVER (ORDER BY __etl_side, __etl_side_ord) AS {ord} FROM ({left} UNION ALL {right}) AS __etl_u",
            names.join(", ")
        );
        Ok(self.push(sql, columns.into_iter().map(|c| (c.0, c.3)).collect()))
    }

    fn join(&mut self, l: &Rel, r: &Rel, spec: JoinSpec<'_>) -> Result<Rel> {
        let d = self.dialect;
        let ord = quote(ORD);
        if spec.left_keys.len() != spec.right_keys.len() {
            return Err(mismatch("a join needs as many left keys as right keys"));
        }
        // Key conditions.
        let mut conds = Vec::new();
        for (lk, rk) in spec.left_keys.iter().zip(spec.right_keys) {
            if l.ty(lk).is_none() || r.ty(rk).is_none() {
                return Err(mismatch(format!("unknown join key `{lk}`/`{rk}`")));
            }
            let op = match (spec.null_safe, d) {
                (false, _) => "=",
                (true, Dialect::Postgres) => "IS NOT DISTINCT FROM",
                (true, Dialect::Sqlite) => "IS",
            };
            conds.push(format!("__etl_l.{} {op} __etl_r.{}", quote(lk), quote(rk)));
        }
        // Output columns (ETLantic-py's rules, see the DataFusion backend's join).
        let merged: Vec<&String> = spec
            .left_keys
            .iter()
            .zip(spec.right_keys)
            .filter(|(a, b)| a == b)
            .map(|(a, _)| a)
            .collect();
        let semi = matches!(spec.join_type, JoinType::Semi | JoinType::Anti);
        let mut out: Vec<(String, String, Ty)> = Vec::new();
        // The scope a predicate sees: every column of both sides by name.
        let mut scope: Vec<(String, String, Ty)> = Vec::new();
        for (n, t) in &l.columns {
            let e = if merged.contains(&n)
                && matches!(spec.join_type, JoinType::Right | JoinType::Full)
            {
                format!("COALESCE(__etl_l.{q}, __etl_r.{q})", q = quote(n))
            } else {
                format!("__etl_l.{}", quote(n))
            };
            out.push((n.clone(), e, t.clone()));
            scope.push((n.clone(), format!("__etl_l.{}", quote(n)), t.clone()));
        }
        for (n, t) in &r.columns {
            if merged.contains(&n) {
                continue;
            }
            if l.ty(n).is_some() && !semi {
                return Err(mismatch(format!(
                    "join: column `{n}` is on both sides; rename one"
                )));
            }
            if !semi {
                out.push((n.clone(), format!("__etl_r.{}", quote(n)), t.clone()));
            }
            if l.ty(n).is_none() {
                scope.push((n.clone(), format!("__etl_r.{}", quote(n)), t.clone()));
            }
        }
        if let Some(p) = spec.predicate {
            let e = ExprCompiler::with_scope(d, scope.clone()).compile(p)?;
            conds.push(e.as_predicate(d));
        }
        if let Some(tr) = spec.time_range {
            let (lt, rt) = (
                format!("__etl_l.{}", quote(&tr.left)),
                format!("__etl_r.{}", quote(&tr.right)),
            );
            let micros = |d: etlantic_core::streaming::Duration| d.as_micros();
            match d {
                Dialect::Postgres => {
                    conds.push(format!(
                        "{lt} >= {rt} - INTERVAL '{} microseconds' AND {lt} <= {rt} + INTERVAL '{} microseconds'",
                        micros(tr.lower),
                        micros(tr.upper)
                    ));
                }
                Dialect::Sqlite => {
                    conds.push(format!(
                        "{lt} >= {rt} - {} AND {lt} <= {rt} + {}",
                        micros(tr.lower),
                        micros(tr.upper)
                    ));
                }
            }
        }
        let on = if conds.is_empty() {
            "TRUE".to_string()
        } else {
            conds.join(" AND ")
        };
        let cols: Vec<String> = out
            .iter()
            .map(|(n, e, _)| format!("{e} AS {}", quote(n)))
            .collect();
        let sql = match spec.join_type {
            JoinType::Semi | JoinType::Anti => format!(
                "SELECT {}, __etl_l.{ord} AS {ord} FROM {} AS __etl_l WHERE {}EXISTS (SELECT 1 FROM {} AS __etl_r WHERE {on})",
                cols.join(", "),
                l.from,
                if spec.join_type == JoinType::Anti { "NOT " } else { "" },
                r.from
            ),
            jt => {
                let kind = match jt {
                    JoinType::Inner => "INNER JOIN",
                    JoinType::Left => "LEFT JOIN",
                    JoinType::Right => "RIGHT JOIN",
                    JoinType::Full => "FULL JOIN",
                    _ => "CROSS JOIN",
                };
                let on = if jt == JoinType::Cross {
                    String::new()
                } else {
                    format!(" ON {on}")
                };
                format!(
                    "SELECT {}, row_number() OVER (ORDER BY __etl_l.{ord} ASC NULLS LAST, __etl_r.{ord} ASC NULLS LAST) AS {ord} FROM {} AS __etl_l {kind} {} AS __etl_r{on}",
                    cols.join(", "),
                    l.from,
                    r.from
                )
            }
        };
        Ok(self.push(sql, out.into_iter().map(|(n, _, t)| (n, t)).collect()))
    }

    fn aggregate(
        &mut self,
        r: &Rel,
        group_by: &[NamedExpr],
        aggregates: &[etlantic_core::ir::Aggregate],
    ) -> Result<Rel> {
        let d = self.dialect;
        let ord = quote(ORD);
        let mut groups = Vec::new();
        for g in group_by {
            groups.push((g.name.clone(), ExprCompiler::over(d, r).compile(&g.expr)?));
        }
        let partition = if groups.is_empty() {
            String::new()
        } else {
            format!(
                "PARTITION BY {} ",
                groups
                    .iter()
                    .map(|(_, e)| e.sql.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        // `first`/`last` become window columns of a pre-step (constant per group), then
        // any aggregate of that constant.
        let mut pre: Vec<String> = Vec::new();
        let mut outs: Vec<(String, String, Ty)> = Vec::new();
        for (i, a) in aggregates.iter().enumerate() {
            let arg = match &a.arg {
                Some(e) => Some(ExprCompiler::over(d, r).compile(e)?),
                None => None,
            };
            let need_arg = || {
                arg.clone()
                    .ok_or_else(|| mismatch(format!("`{}` needs an argument", a.func.id())))
            };
            let (sql, ty) = match a.func {
                AggFunc::CountAll => ("COUNT(*)".to_string(), Ty::Int),
                AggFunc::Count => (format!("COUNT({})", need_arg()?.sql), Ty::Int),
                AggFunc::CountDistinct => (format!("COUNT(DISTINCT {})", need_arg()?.sql), Ty::Int),
                AggFunc::Sum => {
                    let x = need_arg()?;
                    if !x.ty.is_numeric() && x.ty != Ty::Null {
                        return Err(mismatch("`sum` needs numbers"));
                    }
                    (format!("SUM({})", x.sql), x.ty)
                }
                AggFunc::Average => {
                    let x = need_arg()?;
                    if !x.ty.is_numeric() && x.ty != Ty::Null {
                        return Err(mismatch("`average` needs numbers"));
                    }
                    (format!("AVG({})", x.sql), Ty::Float)
                }
                AggFunc::Min | AggFunc::Max => {
                    let x = need_arg()?;
                    let f = match (d, &x.ty, a.func) {
                        (Dialect::Postgres, Ty::Bool, AggFunc::Min) => "bool_and",
                        (Dialect::Postgres, Ty::Bool, _) => "bool_or",
                        (_, _, AggFunc::Min) => "MIN",
                        _ => "MAX",
                    };
                    (format!("{f}({})", x.sql), x.ty)
                }
                AggFunc::Variance
                | AggFunc::VariancePopulation
                | AggFunc::Stddev
                | AggFunc::StddevPopulation => {
                    let x = need_arg()?;
                    if !x.ty.is_numeric() && x.ty != Ty::Null {
                        return Err(mismatch(format!("`{}` needs numbers", a.func.id())));
                    }
                    if d == Dialect::Sqlite {
                        // SQLite has neither function, nor a square root before 3.35.
                        return Err(unsupported(format!("`{}`", a.func.id()), d));
                    }
                    let f = match a.func {
                        AggFunc::Variance => "var_samp",
                        AggFunc::VariancePopulation => "var_pop",
                        AggFunc::Stddev => "stddev_samp",
                        _ => "stddev_pop",
                    };
                    (
                        format!("CAST({f}({}) AS DOUBLE PRECISION)", x.sql),
                        Ty::Float,
                    )
                }
                AggFunc::First | AggFunc::Last => {
                    let x = need_arg()?;
                    let col = format!("__etl_fl{i}");
                    pre.push(format!(
                        "first_value({}) OVER ({partition}ORDER BY {ord} {} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS {col}",
                        x.sql,
                        if a.func == AggFunc::First { "ASC" } else { "DESC" }
                    ));
                    let f = match (d, &x.ty) {
                        (Dialect::Postgres, Ty::Bool) => "bool_and",
                        _ => "MIN",
                    };
                    (format!("{f}({col})"), x.ty)
                }
            };
            outs.push((a.name.clone(), sql, ty));
        }
        let source = if pre.is_empty() {
            r.from.clone()
        } else {
            format!(
                "(SELECT *, {} FROM {}) AS __etl_pre",
                pre.join(", "),
                r.from
            )
        };
        let mut select: Vec<String> = groups
            .iter()
            .map(|(n, e)| format!("{} AS {}", e.sql, quote(n)))
            .collect();
        select.extend(outs.iter().map(|(n, s, _)| format!("{s} AS {}", quote(n))));
        select.push(format!("MIN({ord}) AS {ord}"));
        let group_clause = if groups.is_empty() {
            String::new()
        } else {
            format!(
                " GROUP BY {}",
                groups
                    .iter()
                    .map(|(_, e)| e.sql.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let sql = format!("SELECT {} FROM {source}{group_clause}", select.join(", "));
        let mut cols: Vec<(String, Ty)> = groups.into_iter().map(|(n, e)| (n, e.ty)).collect();
        cols.extend(outs.into_iter().map(|(n, _, t)| (n, t)));
        let rel = self.push(sql, cols);
        if group_by.is_empty() {
            // A global aggregate's one row has ordinal 1 (MIN over no rows is null).
            let sql = format!(
                "SELECT {}, 1 AS {ord} FROM {}",
                rel.column_list(None),
                rel.from
            );
            return Ok(self.push(sql, rel.columns.clone()));
        }
        Ok(rel)
    }
}

struct JoinSpec<'a> {
    join_type: JoinType,
    left_keys: &'a [String],
    right_keys: &'a [String],
    predicate: Option<&'a Expr>,
    null_safe: bool,
    time_range: Option<&'a etlantic_core::ir::JoinTimeRange>,
}

/// The `ORDER BY` terms of `keys` over `r`, then the ordinal, so that rows equal in the
/// keys keep their row order (a stable sort; deterministic window functions).
fn order_terms(d: Dialect, r: &Rel, keys: &[SortKey]) -> Result<Vec<String>> {
    let mut terms = Vec::new();
    for k in keys {
        let e = ExprCompiler::over(d, r).compile(&k.expr)?;
        terms.push(format!(
            "{} {} NULLS {}",
            e.sql,
            if k.descending { "DESC" } else { "ASC" },
            if k.nulls_first { "FIRST" } else { "LAST" }
        ));
    }
    terms.push(format!("{} ASC", quote(ORD)));
    Ok(terms)
}
