//! Portable DTCS plans compiled to one SQL query: a `WITH` chain of one common table
//! expression per action, in PostgreSQL's or SQLite's dialect.
//!
//! Every relation carries, besides its columns, an ordinal column (`__etl_ord`) that
//! records the DTCS row order: staged inputs number their rows, `dtcs:sort` renumbers
//! them (stable: ties keep their order), joins number left-major. The order-dependent
//! actions — `dtcs:limit`, `dtcs:distinct` and `dtcs:deduplicate` (first or last row per
//! key) and the `first`/`last` aggregates — read it, so their results are the same as on
//! the embedded engine. The final query returns the rows in that order.
//!
//! Semantics kept from DTCS: three-valued logic (SQL's own), nulls group and partition
//! together (SQL's `GROUP BY`/`PARTITION BY`), null keys never join unless the join is
//! null-safe (`IS NOT DISTINCT FROM`, SQLite `IS`), `concat` and `+` on strings are null
//! when any argument is, `least`/`greatest` are null when any argument is, `substr`
//! counts from 0, `trim` strips Unicode white space, `round` rounds half away from zero.
//!
//! What a dialect cannot compute exactly is not declared (see [`crate::capabilities`]):
//! the compiler returns `ETL501` for it instead of computing something else.

use crate::dialect::{quote, string_literal, Dialect, Ty};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{
    Action, AggFunc, BinaryOp, DecodedPlan, Expr, JoinType, Literal, NamedExpr, SortKey, UnaryOp,
};
use indexmap::IndexMap;
use serde_json::Value;

/// The ordinal column every relation carries.
pub const ORD: &str = "__etl_ord";

/// Unicode `White_Space`, which DTCS `trim` removes.
const WHITE_SPACE: &str = "\u{9}\u{a}\u{b}\u{c}\u{d}\u{20}\u{85}\u{a0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// A relation of the query: a table or CTE with typed user columns and [`ORD`].
#[derive(Clone, Debug)]
pub struct Rel {
    /// The quoted name to select from.
    pub from: String,
    /// User columns in order.
    pub columns: Vec<(String, Ty)>,
}

impl Rel {
    fn ty(&self, name: &str) -> Option<&Ty> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    fn column_list(&self, alias: Option<&str>) -> String {
        self.columns
            .iter()
            .map(|(n, _)| match alias {
                Some(a) => format!("{a}.{}", quote(n)),
                None => quote(n),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn unsupported(what: impl std::fmt::Display, dialect: Dialect) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!(
            "the `{}` backend cannot compute {what}",
            dialect.backend_name()
        ),
    )
}

fn mismatch(msg: impl Into<String>) -> Error {
    Error::new(&codes::TYPE_MISMATCH, msg.into())
}

/// A column of a union: output name, column of the left side, column of the right
/// side (none when that side lacks it), unified type.
type UnionColumn = (String, Option<String>, Option<String>, Ty);

/// Builds the `WITH` chain.
pub struct QueryBuilder {
    dialect: Dialect,
    ctes: Vec<(String, String)>,
    relations: IndexMap<String, Rel>,
    counter: usize,
}

impl QueryBuilder {
    /// A builder in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        QueryBuilder {
            dialect,
            ctes: Vec::new(),
            relations: IndexMap::new(),
            counter: 0,
        }
    }

    /// Names a relation (a staged table, or a step's result).
    pub fn bind(&mut self, name: &str, rel: Rel) {
        self.relations.insert(name.to_string(), rel);
    }

    /// A relation by name.
    pub fn relation(&self, name: &str) -> Result<&Rel> {
        self.relations.get(name).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_NODE,
                format!("the SQL region has no relation `{name}`"),
            )
        })
    }

    fn push(&mut self, sql: String, columns: Vec<(String, Ty)>) -> Rel {
        self.counter += 1;
        let name = format!("__etl_q{}", self.counter);
        self.ctes.push((name.clone(), sql));
        Rel {
            from: quote(&name),
            columns,
        }
    }

    /// The query that returns relation `rel` (user columns only) in its row order.
    pub fn finish(&self, rel: &Rel) -> String {
        let mut sql = String::new();
        if !self.ctes.is_empty() {
            sql.push_str("WITH ");
            let parts: Vec<String> = self
                .ctes
                .iter()
                .map(|(n, q)| format!("{} AS ({q})", quote(n)))
                .collect();
            sql.push_str(&parts.join(",\n"));
            sql.push('\n');
        }
        let cols = if rel.columns.is_empty() {
            "1 AS __etl_empty".to_string()
        } else {
            rel.column_list(None)
        };
        sql.push_str(&format!(
            "SELECT {cols} FROM {} ORDER BY {}",
            rel.from,
            quote(ORD)
        ));
        sql
    }

    /// Compiles the actions of `plan` whose relations lead to `output`, reading the plan
    /// inputs from `inputs` (plan input id → relation name bound in this builder).
    pub fn plan(
        &mut self,
        plan: &DecodedPlan,
        parameters: &IndexMap<String, Value>,
        inputs: &IndexMap<String, String>,
        output: &str,
    ) -> Result<Rel> {
        let mut bound = Vec::with_capacity(plan.inputs.len());
        for input in &plan.inputs {
            let relation = inputs.get(&input.id).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_NODE,
                    format!("plan input `{}` is not connected", input.id),
                )
            })?;
            bound.push((input.id.clone(), self.relation(relation)?.clone()));
        }
        plan.evaluate(parameters, bound, output, |_, op, target, secondary| {
            self.action(op, target, secondary)
        })
    }

    fn action(&mut self, op: &Action, r: Rel, secondary: Option<Rel>) -> Result<Rel> {
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
        let mut terms = Vec::new();
        for k in keys {
            let e = ExprCompiler::over(self.dialect, r).compile(&k.expr)?;
            terms.push(format!(
                "{} {} NULLS {}",
                e.sql,
                if k.descending { "DESC" } else { "ASC" },
                if k.nulls_first { "FIRST" } else { "LAST" }
            ));
        }
        terms.push(format!("{ord} ASC"));
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

/// The common type of two sides (numbers widen; null takes the other side's type).
fn unify(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Null, t) | (t, Ty::Null) => t.clone(),
        (Ty::Float, t) | (t, Ty::Float) if t.is_numeric() => Ty::Float,
        (Ty::Decimal(p, s), Ty::Int) | (Ty::Int, Ty::Decimal(p, s)) => Ty::Decimal(*p, *s),
        (Ty::Decimal(p1, s1), Ty::Decimal(p2, s2)) => Ty::Decimal((*p1).max(*p2), (*s1).max(*s2)),
        (a, _) => a.clone(),
    }
}

fn typed_null(d: Dialect, t: &Ty) -> String {
    match (d, t.column_type(d)) {
        (Dialect::Postgres, Some(ct)) => format!("CAST(NULL AS {ct})"),
        _ => "NULL".into(),
    }
}

fn cast_to(d: Dialect, sql: &str, from: &Ty, to: &Ty) -> String {
    if from == to {
        return sql.to_string();
    }
    match (d, to.column_type(d)) {
        (Dialect::Postgres, Some(ct)) => format!("CAST({sql} AS {ct})"),
        _ => sql.to_string(),
    }
}

/// A compiled expression.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// SQL text.
    pub sql: String,
    /// Its value kind.
    pub ty: Ty,
}

impl Compiled {
    fn new(sql: impl Into<String>, ty: Ty) -> Self {
        Compiled {
            sql: sql.into(),
            ty,
        }
    }

    /// As a `WHERE`/`ON` condition.
    fn as_predicate(&self, d: Dialect) -> String {
        match (d, &self.ty) {
            (Dialect::Postgres, Ty::Null) => "CAST(NULL AS BOOLEAN)".into(),
            _ => format!("({})", self.sql),
        }
    }
}

/// Compiles expressions over named columns.
struct ExprCompiler {
    dialect: Dialect,
    /// name → (SQL reference, kind)
    scope: Vec<(String, String, Ty)>,
}

impl ExprCompiler {
    fn over(dialect: Dialect, r: &Rel) -> Self {
        ExprCompiler {
            dialect,
            scope: r
                .columns
                .iter()
                .map(|(n, t)| (n.clone(), quote(n), t.clone()))
                .collect(),
        }
    }

    fn with_scope(dialect: Dialect, scope: Vec<(String, String, Ty)>) -> Self {
        ExprCompiler { dialect, scope }
    }

    fn compile(&self, e: &Expr) -> Result<Compiled> {
        let d = self.dialect;
        match e {
            Expr::Column(c) => self
                .scope
                .iter()
                .find(|(n, _, _)| n == c)
                .map(|(_, s, t)| Compiled::new(s.clone(), t.clone()))
                .ok_or_else(|| Error::new(&codes::UNKNOWN_COLUMN, format!("unknown column `{c}`"))),
            Expr::Parameter(p) => Err(Error::new(
                &codes::UNKNOWN_PARAMETER,
                format!("parameter `{p}` has no value"),
            )),
            Expr::Literal(l) => Ok(literal(d, l)),
            Expr::Unary(UnaryOp::Not, x) => {
                let x = self.compile(x)?;
                if !matches!(x.ty, Ty::Bool | Ty::Null) {
                    return Err(mismatch("`!` needs a boolean"));
                }
                Ok(Compiled::new(format!("(NOT {})", x.sql), Ty::Bool))
            }
            Expr::Unary(UnaryOp::Negate, x) => {
                let x = self.compile(x)?;
                if !x.ty.is_numeric() && x.ty != Ty::Null {
                    return Err(mismatch("`-` needs a number"));
                }
                Ok(Compiled::new(format!("(-{})", x.sql), x.ty))
            }
            Expr::Binary(op, l, r) => self.binary(*op, l, r),
            Expr::Call { function, args } => self.call(function, args),
        }
    }

    /// Compiles `r` compared with `l`'s kind: a string literal compared with a date or
    /// timestamp is read as one (SQLite keeps them as integers).
    fn comparand(&self, other: &Compiled, e: &Expr) -> Result<Compiled> {
        if let (Expr::Literal(Literal::String(s)), true) = (e, other.ty.is_temporal()) {
            return temporal_literal(self.dialect, s, &other.ty);
        }
        self.compile(e)
    }

    fn binary(&self, op: BinaryOp, le: &Expr, re: &Expr) -> Result<Compiled> {
        let d = self.dialect;
        let mut l = self.compile(le)?;
        let r = self.comparand(&l, re)?;
        if matches!(le, Expr::Literal(Literal::String(_))) && r.ty.is_temporal() {
            l = self.comparand(&r, le)?;
        }
        let cmp = |sym: &str| {
            Ok(Compiled::new(
                format!("({} {sym} {})", l.sql, r.sql),
                Ty::Bool,
            ))
        };
        match op {
            BinaryOp::Eq => cmp("="),
            BinaryOp::NotEq => cmp("<>"),
            BinaryOp::Lt => cmp("<"),
            BinaryOp::LtEq => cmp("<="),
            BinaryOp::Gt => cmp(">"),
            BinaryOp::GtEq => cmp(">="),
            BinaryOp::NullSafeEq => cmp(match d {
                Dialect::Postgres => "IS NOT DISTINCT FROM",
                Dialect::Sqlite => "IS",
            }),
            BinaryOp::And | BinaryOp::Or => {
                for x in [&l, &r] {
                    if !matches!(x.ty, Ty::Bool | Ty::Null) {
                        return Err(mismatch("`&&`/`||` need booleans"));
                    }
                }
                let (ls, rs) = (l.as_predicate(d), r.as_predicate(d));
                let sym = if op == BinaryOp::And { "AND" } else { "OR" };
                Ok(Compiled::new(format!("({ls} {sym} {rs})"), Ty::Bool))
            }
            BinaryOp::Contains => self.contains(l, r),
            BinaryOp::Add if l.ty == Ty::Text && r.ty == Ty::Text => {
                Ok(Compiled::new(format!("({} || {})", l.sql, r.sql), Ty::Text))
            }
            BinaryOp::Add
            | BinaryOp::Subtract
            | BinaryOp::Multiply
            | BinaryOp::Divide
            | BinaryOp::Modulo => {
                for x in [&l, &r] {
                    if !x.ty.is_numeric() && x.ty != Ty::Null {
                        return Err(unsupported(
                            format!("arithmetic on {:?}", x.ty).to_lowercase(),
                            d,
                        ));
                    }
                }
                let ty = unify(&l.ty, &r.ty);
                let sym = match op {
                    BinaryOp::Add => "+",
                    BinaryOp::Subtract => "-",
                    BinaryOp::Multiply => "*",
                    BinaryOp::Divide => "/",
                    _ => "%",
                };
                if op == BinaryOp::Divide && d == Dialect::Sqlite {
                    // SQLite divides by zero into NULL; DTCS fails. `abs(i64::MIN)`
                    // raises SQLite's integer-overflow error for a zero divisor.
                    return Ok(Compiled::new(
                        format!(
                            "({} / CASE WHEN {r} = 0 THEN abs(-9223372036854775807 - 1) ELSE {r} END)",
                            l.sql,
                            r = r.sql
                        ),
                        ty,
                    ));
                }
                if op == BinaryOp::Modulo && d == Dialect::Postgres && ty != Ty::Int {
                    return Ok(Compiled::new(
                        format!(
                            "mod(CAST({} AS NUMERIC), CAST({} AS NUMERIC))",
                            l.sql, r.sql
                        ),
                        ty,
                    ));
                }
                Ok(Compiled::new(format!("({} {sym} {})", l.sql, r.sql), ty))
            }
        }
    }

    fn contains(&self, l: Compiled, r: Compiled) -> Result<Compiled> {
        if !matches!(l.ty, Ty::Text | Ty::Null) || !matches!(r.ty, Ty::Text | Ty::Null) {
            return Err(unsupported("`contains` on non-strings", self.dialect));
        }
        let f = match self.dialect {
            Dialect::Postgres => "strpos",
            Dialect::Sqlite => "instr",
        };
        Ok(Compiled::new(
            format!("({f}({}, {}) > 0)", l.sql, r.sql),
            Ty::Bool,
        ))
    }

    fn args(&self, args: &[Expr]) -> Result<Vec<Compiled>> {
        args.iter().map(|a| self.compile(a)).collect()
    }

    fn call(&self, function: &str, args: &[Expr]) -> Result<Compiled> {
        let d = self.dialect;
        let short = function.strip_prefix("dtcs:").unwrap_or(function);
        let arity = |min: usize, max: Option<usize>| -> Result<()> {
            if args.len() < min || max.is_some_and(|m| args.len() > m) {
                return Err(mismatch(format!(
                    "{short}: wrong number of arguments ({})",
                    args.len()
                )));
            }
            Ok(())
        };
        let strings = |a: &[Compiled]| -> Result<()> {
            if a.iter().all(|x| matches!(x.ty, Ty::Text | Ty::Null)) {
                Ok(())
            } else {
                Err(mismatch(format!("{short}: expects strings")))
            }
        };
        let numbers = |a: &[Compiled]| -> Result<()> {
            if a.iter().all(|x| x.ty.is_numeric() || x.ty == Ty::Null) {
                Ok(())
            } else {
                Err(mismatch(format!("{short}: expects numbers")))
            }
        };
        let any_null = |a: &[Compiled]| -> String {
            a.iter()
                .map(|x| format!("{} IS NULL", x.sql))
                .collect::<Vec<_>>()
                .join(" OR ")
        };
        match function {
            "dtcs:concat" => {
                arity(2, None)?;
                let a = self.args(args)?;
                strings(&a)?;
                let parts: Vec<String> = a.iter().map(|x| x.sql.clone()).collect();
                Ok(Compiled::new(format!("({})", parts.join(" || ")), Ty::Text))
            }
            "dtcs:substr" => {
                arity(2, Some(3))?;
                let a = self.args(args)?;
                if !matches!(a[0].ty, Ty::Text | Ty::Null)
                    || a[1..].iter().any(|x| !matches!(x.ty, Ty::Int | Ty::Null))
                {
                    return Err(mismatch("substr: expects a string and integers"));
                }
                for x in args[1..].iter() {
                    if let Expr::Literal(Literal::Integer(n)) = x {
                        if *n < 0 {
                            return Err(mismatch("substr: negative start or length"));
                        }
                    } else {
                        // A computed start could be negative, which DTCS makes an error.
                        return Err(unsupported("`substr` with a computed start or length", d));
                    }
                }
                // PostgreSQL's substr takes INTEGER positions.
                let int = |x: &Compiled| match d {
                    Dialect::Postgres => format!("CAST({} AS INTEGER)", x.sql),
                    Dialect::Sqlite => x.sql.clone(),
                };
                let len = a
                    .get(2)
                    .map(|l| format!(", {}", int(l)))
                    .unwrap_or_default();
                Ok(Compiled::new(
                    format!("substr({}, {} + 1{len})", a[0].sql, int(&a[1])),
                    Ty::Text,
                ))
            }
            "dtcs:replace" => {
                arity(3, Some(3))?;
                let a = self.args(args)?;
                strings(&a)?;
                if matches!(&args[1], Expr::Literal(Literal::String(s)) if s.is_empty()) {
                    // Replacing the empty string differs between engines.
                    return Err(unsupported("`replace` of the empty string", d));
                }
                Ok(Compiled::new(
                    format!("replace({}, {}, {})", a[0].sql, a[1].sql, a[2].sql),
                    Ty::Text,
                ))
            }
            "dtcs:length" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                strings(&a)?;
                Ok(Compiled::new(format!("length({})", a[0].sql), Ty::Int))
            }
            "dtcs:contains" => {
                arity(2, Some(2))?;
                let mut a = self.args(args)?;
                let r = a.pop().expect("two");
                let l = a.pop().expect("two");
                self.contains(l, r)
            }
            "dtcs:starts_with" | "dtcs:ends_with" => {
                arity(2, Some(2))?;
                let a = self.args(args)?;
                strings(&a)?;
                let (s, p) = (&a[0].sql, &a[1].sql);
                let sql = if function == "dtcs:starts_with" {
                    format!("(substr({s}, 1, length({p})) = {p})")
                } else {
                    format!(
                        "(length({p}) <= length({s}) AND substr({s}, length({s}) - length({p}) + 1) = {p})"
                    )
                };
                Ok(Compiled::new(sql, Ty::Bool))
            }
            "dtcs:trim" | "dtcs:ltrim" | "dtcs:rtrim" => {
                arity(1, Some(2))?;
                let a = self.args(args)?;
                strings(&a)?;
                let chars = a
                    .get(1)
                    .map(|c| c.sql.clone())
                    .unwrap_or_else(|| string_literal(WHITE_SPACE));
                let f = match (d, short) {
                    (Dialect::Postgres, "trim") => "btrim",
                    _ => short,
                };
                Ok(Compiled::new(
                    format!("{f}({}, {chars})", a[0].sql),
                    Ty::Text,
                ))
            }
            "dtcs:coalesce" | "dtcs:if_null" => {
                arity(
                    if short == "if_null" { 2 } else { 1 },
                    if short == "if_null" { Some(2) } else { None },
                )?;
                let a = self.args(args)?;
                let ty = a.iter().fold(Ty::Null, |t, x| unify(&t, &x.ty));
                let parts: Vec<String> = a.iter().map(|x| cast_to(d, &x.sql, &x.ty, &ty)).collect();
                if parts.len() == 1 {
                    return Ok(Compiled::new(parts[0].clone(), ty));
                }
                Ok(Compiled::new(format!("COALESCE({})", parts.join(", ")), ty))
            }
            "dtcs:null_if" => {
                arity(2, Some(2))?;
                let a = self.args(args)?;
                Ok(Compiled::new(
                    format!("NULLIF({}, {})", a[0].sql, a[1].sql),
                    a[0].ty.clone(),
                ))
            }
            "dtcs:case_when" => {
                arity(2, None)?;
                let a = self.args(args)?;
                let mut sql = String::from("CASE");
                let mut ty = Ty::Null;
                let mut i = 0;
                while i + 1 < a.len() {
                    if !matches!(a[i].ty, Ty::Bool | Ty::Null) {
                        return Err(mismatch("case_when: conditions must be boolean"));
                    }
                    ty = unify(&ty, &a[i + 1].ty);
                    i += 2;
                }
                if a.len() % 2 == 1 {
                    ty = unify(&ty, &a[a.len() - 1].ty);
                }
                let mut i = 0;
                while i + 1 < a.len() {
                    sql.push_str(&format!(
                        " WHEN {} THEN {}",
                        a[i].as_predicate(d),
                        cast_to(d, &a[i + 1].sql, &a[i + 1].ty, &ty)
                    ));
                    i += 2;
                }
                if a.len() % 2 == 1 {
                    let o = &a[a.len() - 1];
                    sql.push_str(&format!(" ELSE {}", cast_to(d, &o.sql, &o.ty, &ty)));
                }
                sql.push_str(" END");
                Ok(Compiled::new(sql, ty))
            }
            "dtcs:is_null" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                Ok(Compiled::new(format!("({} IS NULL)", a[0].sql), Ty::Bool))
            }
            "dtcs:abs" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                numbers(&a)?;
                Ok(Compiled::new(format!("abs({})", a[0].sql), a[0].ty.clone()))
            }
            "dtcs:round" => {
                arity(1, Some(2))?;
                let a = self.args(args)?;
                numbers(&a)?;
                let digits = a
                    .get(1)
                    .map(|x| x.sql.clone())
                    .unwrap_or_else(|| "0".into());
                // Half away from zero: PostgreSQL's numeric round (its float round is
                // half to even), SQLite's round.
                let sql = match d {
                    Dialect::Postgres => format!(
                        "CAST(round(CAST({} AS NUMERIC), CAST({digits} AS INTEGER)) AS DOUBLE PRECISION)",
                        a[0].sql
                    ),
                    Dialect::Sqlite => format!("round({}, {digits})", a[0].sql),
                };
                Ok(Compiled::new(sql, Ty::Float))
            }
            "dtcs:floor" | "dtcs:ceil" if d == Dialect::Postgres => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                numbers(&a)?;
                Ok(Compiled::new(
                    format!("{short}(CAST({} AS DOUBLE PRECISION))", a[0].sql),
                    Ty::Float,
                ))
            }
            "dtcs:least" | "dtcs:greatest" => {
                arity(2, None)?;
                let a = self.args(args)?;
                numbers(&a)?;
                let parts: Vec<String> = a
                    .iter()
                    .map(|x| match d {
                        Dialect::Postgres => format!("CAST({} AS DOUBLE PRECISION)", x.sql),
                        Dialect::Sqlite => format!("CAST({} AS REAL)", x.sql),
                    })
                    .collect();
                let f = match (d, short) {
                    (Dialect::Postgres, _) => short.to_uppercase(),
                    (Dialect::Sqlite, "least") => "min".into(),
                    _ => "max".into(),
                };
                Ok(Compiled::new(
                    format!(
                        "(CASE WHEN {} THEN NULL ELSE {f}({}) END)",
                        any_null(&a),
                        parts.join(", ")
                    ),
                    Ty::Float,
                ))
            }
            "dtcs:in" => {
                arity(2, Some(2))?;
                let v = self.compile(&args[0])?;
                match &args[1] {
                    Expr::Call {
                        function,
                        args: items,
                    } if matches!(function.as_str(), "dtcs:list" | "dtcs:tuple") => {
                        if items.is_empty() {
                            return Ok(Compiled::new("FALSE", Ty::Bool));
                        }
                        let items: Vec<String> = items
                            .iter()
                            .map(|i| self.comparand(&v, i).map(|c| c.sql))
                            .collect::<Result<_>>()?;
                        Ok(Compiled::new(
                            format!("({} IN ({}))", v.sql, items.join(", ")),
                            Ty::Bool,
                        ))
                    }
                    Expr::Literal(Literal::String(_)) if matches!(v.ty, Ty::Text | Ty::Null) => {
                        let hay = self.compile(&args[1])?;
                        self.contains(hay, v)
                    }
                    other => {
                        let item = self.comparand(&v, other)?;
                        if item.ty == Ty::Text && matches!(v.ty, Ty::Text | Ty::Null) {
                            return self.contains(item, v);
                        }
                        Ok(Compiled::new(
                            format!("({} IN ({}))", v.sql, item.sql),
                            Ty::Bool,
                        ))
                    }
                }
            }
            "dtcs:between" => {
                arity(3, Some(3))?;
                let v = self.compile(&args[0])?;
                let lo = self.comparand(&v, &args[1])?;
                let hi = self.comparand(&v, &args[2])?;
                Ok(Compiled::new(
                    format!(
                        "({v} >= {lo} AND {v} <= {hi})",
                        v = v.sql,
                        lo = lo.sql,
                        hi = hi.sql
                    ),
                    Ty::Bool,
                ))
            }
            other => Err(unsupported(format!("the function `{other}`"), d)),
        }
    }
}

fn literal(d: Dialect, l: &Literal) -> Compiled {
    match l {
        Literal::Null => Compiled::new("NULL", Ty::Null),
        Literal::Boolean(b) => Compiled::new(
            match (d, b) {
                (Dialect::Postgres, true) => "TRUE",
                (Dialect::Postgres, false) => "FALSE",
                (Dialect::Sqlite, true) => "1",
                (Dialect::Sqlite, false) => "0",
            },
            Ty::Bool,
        ),
        Literal::Integer(i) => Compiled::new(
            match d {
                Dialect::Postgres => format!("CAST({i} AS BIGINT)"),
                Dialect::Sqlite => i.to_string(),
            },
            Ty::Int,
        ),
        Literal::Decimal(f) => {
            let text = if f.is_finite() {
                format!("{f:?}")
            } else {
                "NULL".into()
            };
            Compiled::new(
                match d {
                    Dialect::Postgres => format!("CAST({text} AS DOUBLE PRECISION)"),
                    Dialect::Sqlite => format!("CAST({text} AS REAL)"),
                },
                Ty::Float,
            )
        }
        Literal::String(s) => Compiled::new(
            match d {
                Dialect::Postgres => format!("CAST({} AS TEXT)", string_literal(s)),
                Dialect::Sqlite => string_literal(s),
            },
            Ty::Text,
        ),
    }
}

/// A string literal read as a date or timestamp of kind `ty`.
fn temporal_literal(d: Dialect, s: &str, ty: &Ty) -> Result<Compiled> {
    let bad = || mismatch(format!("`{s}` is not a date or timestamp"));
    match d {
        Dialect::Postgres => {
            let ct = ty.column_type(d).expect("temporal");
            Ok(Compiled::new(
                format!("CAST({} AS {ct})", string_literal(s)),
                ty.clone(),
            ))
        }
        Dialect::Sqlite => {
            let micros = parse_instant_micros(s).ok_or_else(bad)?;
            let value = match ty {
                Ty::Date => micros.div_euclid(86_400_000_000),
                _ => micros,
            };
            Ok(Compiled::new(value.to_string(), ty.clone()))
        }
    }
}

/// Microseconds since the epoch of an ISO date or date-time (UTC when it has no zone).
pub fn parse_instant_micros(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    for f in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc().timestamp_micros());
        }
    }
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .map(|d| {
            d.and_hms_opt(0, 0, 0)
                .expect("midnight")
                .and_utc()
                .timestamp_micros()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::{AGGREGATES, FUNCTIONS, POSTGRES_ONLY_FUNCTIONS};

    fn rel() -> Rel {
        Rel {
            from: quote("t"),
            columns: vec![
                ("i".into(), Ty::Int),
                ("f".into(), Ty::Float),
                ("s".into(), Ty::Text),
                ("b".into(), Ty::Bool),
                ("ts".into(), Ty::Timestamp { zoned: true }),
            ],
        }
    }

    /// One expression per declared scalar function.
    fn sample(f: &str) -> &'static str {
        match f {
            "dtcs:concat" => "concat(s, 'x')",
            "dtcs:substr" => "substr(s, 1, 2)",
            "dtcs:replace" => "replace(s, 'a', 'b')",
            "dtcs:length" => "length(s)",
            "dtcs:contains" => "contains(s, 'a')",
            "dtcs:starts_with" => "starts_with(s, 'a')",
            "dtcs:ends_with" => "ends_with(s, 'a')",
            "dtcs:trim" => "trim(s)",
            "dtcs:ltrim" => "ltrim(s)",
            "dtcs:rtrim" => "rtrim(s)",
            "dtcs:coalesce" => "coalesce(i, 0)",
            "dtcs:if_null" => "if_null(s, 'x')",
            "dtcs:null_if" => "null_if(i, 1)",
            "dtcs:case_when" => "case_when(b, 1, 2)",
            "dtcs:is_null" => "is_null(s)",
            "dtcs:abs" => "abs(f)",
            "dtcs:round" => "round(f, 1)",
            "dtcs:least" => "least(i, f)",
            "dtcs:greatest" => "greatest(i, f)",
            "dtcs:in" => "i in list(1, 2)",
            "dtcs:between" => "between(ts, '2024-01-01', '2024-02-01')",
            "dtcs:floor" => "floor(f)",
            "dtcs:ceil" => "ceil(f)",
            other => panic!("no sample for declared function {other}"),
        }
    }

    #[test]
    fn every_declared_function_compiles_in_its_dialects() {
        for (d, fs) in [
            (Dialect::Sqlite, FUNCTIONS.to_vec()),
            (
                Dialect::Postgres,
                FUNCTIONS
                    .iter()
                    .chain(POSTGRES_ONLY_FUNCTIONS)
                    .copied()
                    .collect(),
            ),
        ] {
            for f in fs {
                let e = Expr::parse(sample(f)).unwrap();
                assert!(
                    e.functions().contains(&f.to_string()),
                    "{f}: {:?}",
                    e.functions()
                );
                ExprCompiler::over(d, &rel())
                    .compile(&e)
                    .unwrap_or_else(|err| panic!("{f} in {d:?}: {err}"));
            }
            // Undeclared functions are refused, never approximated.
            let e = Expr::parse("upper(s)").unwrap();
            let err = ExprCompiler::over(d, &rel()).compile(&e).unwrap_err();
            assert_eq!(err.code(), "ETL501");
        }
        for f in POSTGRES_ONLY_FUNCTIONS {
            let e = Expr::parse(sample(f)).unwrap();
            assert!(ExprCompiler::over(Dialect::Sqlite, &rel())
                .compile(&e)
                .is_err());
        }
        assert_eq!(AGGREGATES.len(), 9);
    }

    #[test]
    fn sqlite_reads_temporal_literals_as_integers() {
        let e = Expr::parse("ts >= '2024-01-01T00:00:01Z'").unwrap();
        let c = ExprCompiler::over(Dialect::Sqlite, &rel())
            .compile(&e)
            .unwrap();
        assert_eq!(c.sql, "(\"ts\" >= 1704067201000000)");
        let c = ExprCompiler::over(Dialect::Postgres, &rel())
            .compile(&e)
            .unwrap();
        assert!(
            c.sql
                .contains("CAST('2024-01-01T00:00:01Z' AS TIMESTAMPTZ)"),
            "{}",
            c.sql
        );
    }
}
