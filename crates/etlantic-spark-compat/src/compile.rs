//! Portable steps (DTCS transform plans) as Spark Connect plans.
//!
//! A relation is a Spark `DataFrame` plus the kinds of its columns. Spark does not keep
//! row order, but DTCS does (`limit`, `deduplicate` keep-first/last, `distinct`, ties of
//! `sort`), so every relation carries an ordinal column, [`ORD`]: an `array<bigint>`
//! compared lexicographically.
//!
//! - An input row's ordinal is `[its index]`.
//! - A join's row is `left ordinal ++ right ordinal`; an unmatched right row of a
//!   right/full join sorts after every left row, as in the embedded engine.
//! - A union's rows are `[0] ++ left` and `[1] ++ right`.
//! - A group's row is the smallest ordinal of its rows (the first row's position).
//!
//! Order-dependent actions sort by it; the region's results are collected in its order.
//! The ordinal never needs a single partition: it is an ordinary column, sorted by
//! Spark's distributed range sort where an action needs order.

use crate::expr::{self, ident, Compiled, Kind, Scope};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{
    Action, AggFunc, Aggregate, DecodedPlan, Expr, JoinType, NamedExpr, SortKey,
};
use etlantic_core::streaming::Duration;
use indexmap::IndexMap;
use serde_json::Value;
use spark_connect::functions::expr as sql;
use spark_connect::DataFrame;

/// The ordinal column every relation carries.
pub const ORD: &str = "__etl_ord";

/// A relation in a Spark session: its data frame (the user columns, then [`ORD`]) and
/// the kinds of its user columns.
#[derive(Clone)]
pub struct Rel {
    /// The data frame.
    pub df: DataFrame,
    /// User columns and their kinds, in order.
    pub columns: Vec<(String, Kind)>,
}

impl Rel {
    fn scope(&self) -> Scope {
        let mut s = Scope::default();
        for (n, k) in &self.columns {
            s.bind(n, ident(n), *k);
        }
        s
    }

    fn kind(&self, name: &str) -> Option<Kind> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, k)| *k)
    }

    fn require(&self, name: &str, what: &str) -> Result<Kind> {
        self.kind(name).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_COLUMN,
                format!("{what}: unknown column `{name}`"),
            )
        })
    }

    /// `SELECT <exprs>, <ord>`.
    fn select(&self, exprs: Vec<String>, columns: Vec<(String, Kind)>, ord: &str) -> Rel {
        let mut all: Vec<spark_connect::Column> = exprs.iter().map(|e| sql(e)).collect();
        all.push(sql(&format!("{ord} AS {}", ident(ORD))));
        Rel {
            df: self.df.select(all),
            columns,
        }
    }

    fn with_ord(&self, exprs: Vec<String>, columns: Vec<(String, Kind)>) -> Rel {
        self.select(exprs, columns, &ident(ORD))
    }

    /// The data frame in the relation's order without the ordinal (what a region hands
    /// on).
    pub fn ordered_output(&self) -> DataFrame {
        let columns: Vec<spark_connect::Column> = self
            .columns
            .iter()
            .map(|(n, _)| spark_connect::functions::col(n))
            .collect();
        self.df
            .sort(vec![spark_connect::functions::col(ORD)
                .asc_nulls_first()
                .expression()
                .clone()])
            .select(columns)
    }
}

fn unknown(what: &str, name: &str) -> Error {
    Error::new(
        &codes::UNKNOWN_NODE,
        format!("{what} reads unknown `{name}`"),
    )
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!("the Spark backend does not run {what}"),
    )
}

/// The relation of every plan input (`ETL201` for one that is not connected).
fn connected(plan: &DecodedPlan, inputs: &IndexMap<String, Rel>) -> Result<Vec<(String, Rel)>> {
    plan.inputs
        .iter()
        .map(|input| {
            let rel = inputs.get(&input.id).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_NODE,
                    format!("plan input `{}` is not connected", input.id),
                )
            })?;
            Ok((input.id.clone(), rel.clone()))
        })
        .collect()
}

/// Compiles the actions of `plan` that lead to `output`, its inputs bound to `inputs`
/// (plan input id → relation).
pub fn plan(
    plan: &DecodedPlan,
    parameters: &IndexMap<String, Value>,
    inputs: &IndexMap<String, Rel>,
    output: &str,
) -> Result<Rel> {
    plan.evaluate(
        parameters,
        connected(plan, inputs)?,
        output,
        |_, op, target, secondary| action(op, target, secondary),
    )
}

/// Like [`plan`], for a streaming query: the actions Spark runs incrementally
/// (`dropDuplicates`, `dropDuplicatesWithinWatermark`, `window`/`session_window`
/// aggregations, time-range joins) replace their batch forms; order-dependent actions
/// are refused. The ordinal is a constant there (streams have no order to keep).
pub fn streaming_plan(
    plan: &DecodedPlan,
    parameters: &IndexMap<String, Value>,
    inputs: &IndexMap<String, Rel>,
    output: &str,
) -> Result<Rel> {
    plan.evaluate(
        parameters,
        connected(plan, inputs)?,
        output,
        |_, op, target, secondary| streaming_action(op, target, secondary),
    )
}

fn user_columns(r: &Rel) -> Vec<&str> {
    r.columns.iter().map(|(n, _)| n.as_str()).collect()
}

fn spark_interval(d: etlantic_core::streaming::Duration) -> String {
    format!("{} milliseconds", d.as_millis())
}

fn streaming_action(op: &Action, r: Rel, secondary: Option<Rel>) -> Result<Rel> {
    match op {
        Action::Deduplicate { keys, keep_last } => {
            if *keep_last {
                return Err(unsupported("`retain: last` deduplication of a stream"));
            }
            for k in keys {
                r.require(k, "deduplicate key")?;
            }
            let keys: Vec<&str> = if keys.is_empty() {
                user_columns(&r)
            } else {
                keys.iter().map(String::as_str).collect()
            };
            Ok(Rel {
                df: r.df.drop_duplicates(Some(keys)),
                columns: r.columns.clone(),
            })
        }
        Action::Distinct { fields } => {
            let keys: Vec<&str> = match fields {
                Some(f) => f.iter().map(String::as_str).collect(),
                None => user_columns(&r),
            };
            Ok(Rel {
                df: r.df.drop_duplicates(Some(keys)),
                columns: r.columns.clone(),
            })
        }
        Action::DeduplicateWithinWatermark { keys } => {
            for k in keys {
                r.require(k, "deduplicate key")?;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            Ok(Rel {
                df: r.df.drop_duplicates_within_watermark(Some(keys)),
                columns: r.columns.clone(),
            })
        }
        // Spark closes a window when the watermark passes its end; it has no allowed
        // lateness to keep it open longer, so such a window is not Spark's to run.
        Action::WindowAggregate { window, .. } if window.allowed_lateness > Duration::ZERO => {
            Err(unsupported(format!(
                "a window with allowed lateness ({}) on a stream: Spark Structured Streaming closes a window when the watermark passes its end",
                window.allowed_lateness
            )))
        }
        Action::WindowAggregate {
            window,
            group_by,
            aggregates,
        } => window_aggregate(&r, window, group_by, aggregates),
        Action::Sort { .. } | Action::Limit { .. } => Err(unsupported(format!(
            "`{}` on a stream (Spark sorts and limits only complete-mode results)",
            op.id()
        ))),
        other => action(other, r, secondary),
    }
}

fn window_aggregate(
    r: &Rel,
    window: &etlantic_core::ir::WindowSpec,
    group_by: &[NamedExpr],
    aggregates: &[Aggregate],
) -> Result<Rel> {
    let t = r.require(&window.time_column, "window time column")?;
    if t != Kind::Temporal {
        return Err(Error::new(
            &codes::TYPE_MISMATCH,
            format!(
                "window time column `{}` is not a timestamp",
                window.time_column
            ),
        ));
    }
    let ts = ident(&window.time_column);
    let w = match &window.kind {
        etlantic_core::ir::WindowKind::Tumbling { size } => {
            format!("window({ts}, '{}')", spark_interval(*size))
        }
        etlantic_core::ir::WindowKind::Sliding { size, slide } => format!(
            "window({ts}, '{}', '{}')",
            spark_interval(*size),
            spark_interval(*slide)
        ),
        etlantic_core::ir::WindowKind::Session { gap } => {
            format!("session_window({ts}, '{}')", spark_interval(*gap))
        }
    };
    let window_col = "__etl_window";
    let mut keys = vec![NamedExpr {
        name: window_col.into(),
        expr: Expr::col(window_col),
    }];
    keys.extend(group_by.iter().cloned());
    // The window is a group key Spark computes; it is bound under its name first.
    let with_window = Rel {
        df: r.df.select({
            let mut cols: Vec<spark_connect::Column> = r
                .columns
                .iter()
                .map(|(n, _)| spark_connect::functions::col(n))
                .collect();
            cols.push(spark_connect::functions::col(ORD));
            cols.push(sql(&format!("{w} AS {}", ident(window_col))));
            cols
        }),
        columns: {
            let mut c = r.columns.clone();
            c.push((window_col.into(), Kind::Other));
            c
        },
    };
    let grouped = aggregate(&with_window, &keys, aggregates)?;
    let mut exprs = vec![
        format!("{}.start AS `window_start`", ident(window_col)),
        format!("{}.end AS `window_end`", ident(window_col)),
    ];
    let mut columns = vec![
        ("window_start".to_string(), Kind::Temporal),
        ("window_end".to_string(), Kind::Temporal),
    ];
    for (n, k) in grouped.columns.iter().skip(1) {
        exprs.push(ident(n));
        columns.push((n.clone(), *k));
    }
    Ok(grouped.with_ord(exprs, columns))
}

fn action(op: &Action, r: Rel, secondary: Option<Rel>) -> Result<Rel> {
    match op {
        Action::Filter { predicate } => {
            let p = expr::predicate(predicate, &r.scope())?;
            Ok(Rel {
                df: r.df.filter(sql(&p)),
                columns: r.columns,
            })
        }
        Action::Project { fields } => project(&r, fields),
        Action::WithFields { assignments } => {
            let mut cur = r;
            for a in assignments {
                let c = expr::compile(&a.expr, &cur.scope())?;
                let mut fields: Vec<(String, Compiled)> = cur
                    .columns
                    .iter()
                    .map(|(n, k)| {
                        (
                            n.clone(),
                            Compiled {
                                sql: ident(n),
                                kind: *k,
                            },
                        )
                    })
                    .collect();
                match fields.iter_mut().find(|(n, _)| *n == a.name) {
                    Some((_, slot)) => *slot = c,
                    None => fields.push((a.name.clone(), c)),
                }
                cur = select_compiled(&cur, fields);
            }
            Ok(cur)
        }
        Action::DropFields {
            fields,
            ignore_missing,
        } => {
            if !ignore_missing {
                if let Some(f) = fields.iter().find(|f| r.kind(f).is_none()) {
                    return Err(Error::new(
                        &codes::UNKNOWN_COLUMN,
                        format!("cannot drop unknown column `{f}`"),
                    ));
                }
            }
            let keep: Vec<NamedExpr> = r
                .columns
                .iter()
                .filter(|(n, _)| !fields.contains(n))
                .map(|(n, _)| NamedExpr::column(n))
                .collect();
            project(&r, &keep)
        }
        Action::RenameFields { mapping } => {
            if let Some(missing) = mapping.keys().find(|k| r.kind(k).is_none()) {
                return Err(Error::new(
                    &codes::UNKNOWN_COLUMN,
                    format!("cannot rename unknown column `{missing}`"),
                ));
            }
            let fields: Vec<NamedExpr> = r
                .columns
                .iter()
                .map(|(n, _)| NamedExpr {
                    name: mapping.get(n).cloned().unwrap_or_else(|| n.clone()),
                    expr: Expr::col(n),
                })
                .collect();
            project(&r, &fields)
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
            let rr = secondary.ok_or_else(|| unknown("join", right))?;
            // `left.t BETWEEN right.t - lower AND right.t + upper`: the embedded
            // engine's condition in batch regions, and Spark's time-interval join
            // condition on streams (which bounds the join's state with the watermarks).
            let range = time_range.as_ref().map(|t| Expr::Call {
                function: "etlantic:__spark_time_range".into(),
                args: vec![
                    Expr::col(&t.left),
                    Expr::col(&t.right),
                    Expr::Literal(etlantic_core::ir::Literal::String(spark_interval(t.lower))),
                    Expr::Literal(etlantic_core::ir::Literal::String(spark_interval(t.upper))),
                ],
            });
            let predicate = match (predicate.clone(), range) {
                (Some(p), Some(r)) => Some(Expr::Binary(
                    etlantic_core::ir::BinaryOp::And,
                    Box::new(p),
                    Box::new(r),
                )),
                (p, r) => p.or(r),
            };
            join(
                &r,
                &rr,
                *join_type,
                left_keys,
                right_keys,
                predicate.as_ref(),
                *null_safe,
            )
        }
        Action::Union {
            other,
            by_name,
            allow_missing,
            distinct,
        } => {
            let o = secondary.ok_or_else(|| unknown("union", other))?;
            let u = union(&r, &o, *by_name, *allow_missing)?;
            if *distinct {
                first_per_key(&u, None, false)
            } else {
                Ok(u)
            }
        }
        Action::Aggregate {
            group_by,
            aggregates,
        } => aggregate(&r, group_by, aggregates),
        Action::Sort { keys } => sort(&r, keys),
        Action::Limit { count, offset } => {
            let count = i32::try_from(*count)
                .map_err(|_| unsupported(format!("a limit of {count} rows (at most 2^31 - 1)")))?;
            let offset = i32::try_from(*offset).map_err(|_| {
                unsupported(format!("an offset of {offset} rows (at most 2^31 - 1)"))
            })?;
            let sorted = r.df.sort(vec![ord_asc()]);
            let df = if offset > 0 {
                sorted.offset(offset)
            } else {
                sorted
            };
            Ok(Rel {
                df: df.limit(count),
                columns: r.columns,
            })
        }
        Action::Distinct { fields } => first_per_key(&r, fields.as_deref(), false),
        Action::Deduplicate { keys, keep_last } => {
            let keys = if keys.is_empty() {
                None
            } else {
                Some(keys.as_slice())
            };
            first_per_key(&r, keys, *keep_last)
        }
        other => Err(unsupported(format!("the action `{}`", other.id()))),
    }
}

fn ord_asc() -> spark_connect::expression::Expression {
    spark_connect::functions::col(ORD)
        .asc_nulls_first()
        .expression()
        .clone()
}

fn select_compiled(r: &Rel, fields: Vec<(String, Compiled)>) -> Rel {
    let exprs = fields
        .iter()
        .map(|(n, c)| format!("{} AS {}", c.sql, ident(n)))
        .collect();
    let columns = fields.into_iter().map(|(n, c)| (n, c.kind)).collect();
    r.with_ord(exprs, columns)
}

fn project(r: &Rel, fields: &[NamedExpr]) -> Result<Rel> {
    let scope = r.scope();
    let mut seen = std::collections::HashSet::new();
    let mut compiled = Vec::with_capacity(fields.len());
    for f in fields {
        if !seen.insert(f.name.as_str()) {
            return Err(Error::new(
                &codes::TRANSFORM_PLAN_INVALID,
                format!("two output columns are named `{}`", f.name),
            ));
        }
        compiled.push((f.name.clone(), expr::compile(&f.expr, &scope)?));
    }
    Ok(select_compiled(r, compiled))
}

const LEFT: &str = "__etl_l";
const RIGHT: &str = "__etl_r";

fn join(
    l: &Rel,
    r: &Rel,
    join_type: JoinType,
    left_keys: &[String],
    right_keys: &[String],
    predicate: Option<&Expr>,
    null_safe: bool,
) -> Result<Rel> {
    let semi_anti = matches!(join_type, JoinType::Semi | JoinType::Anti);
    for (lk, rk) in left_keys.iter().zip(right_keys) {
        let (a, b) = (
            l.require(lk, "left join key")?,
            r.require(rk, "right join key")?,
        );
        let numeric = |k: Kind| matches!(k, Kind::Int | Kind::Float | Kind::Decimal);
        if a != b && !(numeric(a) && numeric(b)) {
            return Err(Error::new(
                &codes::TYPE_MISMATCH,
                format!("join keys `{lk}` and `{rk}` cannot be compared"),
            ));
        }
    }
    // Key pairs of one name become one output column (ETLantic-py's rule).
    let merged: Vec<&String> = left_keys
        .iter()
        .zip(right_keys)
        .filter(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    if !semi_anti {
        if let Some((c, _)) = r
            .columns
            .iter()
            .find(|(c, _)| !merged.contains(&c) && l.kind(c).is_some())
        {
            return Err(Error::new(
                &codes::TRANSFORM_PLAN_INVALID,
                format!("join: column `{c}` is on both sides and is not a shared key (collisionPolicy: fail)"),
            )
            .with_help("Rename or drop the column on one side before the join, or join on it."));
        }
    }
    let q = |side: &str, c: &str| format!("{}.{}", ident(side), ident(c));
    // The predicate sees every column by its plain name (the left one on shared names).
    let mut scope = Scope::default();
    for (c, k) in &l.columns {
        scope.bind(c, q(LEFT, c), *k);
    }
    for (c, k) in &r.columns {
        scope.bind(c, q(RIGHT, c), *k);
    }
    let eq = if null_safe { "<=>" } else { "=" };
    let mut terms: Vec<String> = left_keys
        .iter()
        .zip(right_keys)
        .map(|(lk, rk)| format!("({} {eq} {})", q(LEFT, lk), q(RIGHT, rk)))
        .collect();
    if let Some(p) = predicate {
        terms.push(format!("({})", expr::predicate(p, &scope)?));
    }
    let condition = if terms.is_empty() {
        None
    } else {
        Some(sql(&terms.join(" AND ")))
    };
    let spark_type = match join_type {
        JoinType::Inner | JoinType::Cross => spark_connect::plan::JoinType::Inner,
        JoinType::Left => spark_connect::plan::JoinType::LeftOuter,
        JoinType::Right => spark_connect::plan::JoinType::RightOuter,
        JoinType::Full => spark_connect::plan::JoinType::FullOuter,
        JoinType::Semi => spark_connect::plan::JoinType::LeftSemi,
        JoinType::Anti => spark_connect::plan::JoinType::LeftAnti,
    };
    let joined = match condition {
        None if matches!(join_type, JoinType::Inner | JoinType::Cross) => {
            l.df.alias(LEFT).cross_join(&r.df.alias(RIGHT))
        }
        // Outer, semi and anti joins without a condition match every pair.
        None => {
            l.df.alias(LEFT)
                .join(&r.df.alias(RIGHT), Some(sql("TRUE")), spark_type)
        }
        Some(c) => {
            l.df.alias(LEFT)
                .join(&r.df.alias(RIGHT), Some(c), spark_type)
        }
    };
    let mut exprs = Vec::new();
    let mut columns = Vec::new();
    for (c, k) in &l.columns {
        let is_merged = merged.contains(&c);
        if is_merged && matches!(join_type, JoinType::Right | JoinType::Full) {
            exprs.push(format!(
                "coalesce({}, {}) AS {}",
                q(LEFT, c),
                q(RIGHT, c),
                ident(c)
            ));
        } else {
            exprs.push(format!("{} AS {}", q(LEFT, c), ident(c)));
        }
        columns.push((c.clone(), *k));
    }
    let ord = if semi_anti {
        q(LEFT, ORD)
    } else {
        for (c, k) in r.columns.iter().filter(|(c, _)| !merged.contains(&c)) {
            exprs.push(format!("{} AS {}", q(RIGHT, c), ident(c)));
            columns.push((c.clone(), *k));
        }
        // Unmatched right rows come after every left row.
        format!(
            "concat(coalesce({}, array(9223372036854775807L)), coalesce({}, array(-1L)))",
            q(LEFT, ORD),
            q(RIGHT, ORD)
        )
    };
    Ok(Rel {
        df: joined,
        columns: Vec::new(),
    }
    .select(exprs, columns, &ord))
}

fn union(l: &Rel, r: &Rel, by_name: bool, allow_missing: bool) -> Result<Rel> {
    let tag = |rel: &Rel, side: i64| {
        rel.select(
            rel.columns.iter().map(|(n, _)| ident(n)).collect(),
            rel.columns.clone(),
            &format!("concat(array({side}L), {})", ident(ORD)),
        )
    };
    let (lt, rt) = (tag(l, 0), tag(r, 1));
    if by_name {
        let mut columns = l.columns.clone();
        for (n, k) in &r.columns {
            if l.kind(n).is_none() {
                if !allow_missing {
                    return Err(Error::new(
                        &codes::TRANSFORM_PLAN_INVALID,
                        format!("union by name: `{n}` is only on the right side"),
                    )
                    .with_help("Set allowMissing to fill missing columns with nulls."));
                }
                columns.push((n.clone(), *k));
            }
        }
        if !allow_missing {
            if let Some((n, _)) = l.columns.iter().find(|(n, _)| r.kind(n).is_none()) {
                return Err(Error::new(
                    &codes::TRANSFORM_PLAN_INVALID,
                    format!("union by name: `{n}` is only on the left side"),
                )
                .with_help("Set allowMissing to fill missing columns with nulls."));
            }
        }
        let df = lt.df.union_by_name_opt(&rt.df, allow_missing);
        // `unionByName` puts the right-only columns after the left ones; the ordinal
        // goes last again.
        let rel = Rel {
            df,
            columns: columns.clone(),
        };
        return Ok(rel.with_ord(columns.iter().map(|(n, _)| ident(n)).collect(), columns));
    }
    if l.columns.len() != r.columns.len() {
        return Err(Error::new(
            &codes::TRANSFORM_PLAN_INVALID,
            format!(
                "union by position of {} and {} columns",
                l.columns.len(),
                r.columns.len()
            ),
        ));
    }
    Ok(Rel {
        df: lt.df.union_all(&rt.df),
        columns: l.columns.clone(),
    })
}

fn aggregate(r: &Rel, group_by: &[NamedExpr], aggregates: &[Aggregate]) -> Result<Rel> {
    let scope = r.scope();
    let mut columns = Vec::new();
    let mut groups = Vec::new();
    for g in group_by {
        let c = expr::compile(&g.expr, &scope)?;
        groups.push(sql(&c.sql).alias(&g.name));
        columns.push((g.name.clone(), c.kind));
    }
    let mut aggs = Vec::new();
    for a in aggregates {
        let arg = a
            .arg
            .as_ref()
            .map(|e| expr::compile(e, &scope))
            .transpose()?;
        let need = |arg: &Option<Compiled>| {
            arg.clone().ok_or_else(|| {
                Error::new(
                    &codes::TYPE_MISMATCH,
                    format!("aggregate `{}` needs an argument", a.name),
                )
            })
        };
        let (text, kind) = match a.func {
            AggFunc::CountAll => ("count(1)".to_string(), Kind::Int),
            AggFunc::Count => (format!("count({})", need(&arg)?.sql), Kind::Int),
            AggFunc::CountDistinct => (format!("count(DISTINCT {})", need(&arg)?.sql), Kind::Int),
            AggFunc::Sum => {
                let c = need(&arg)?;
                (format!("sum({})", c.sql), c.kind)
            }
            AggFunc::Average => {
                let c = need(&arg)?;
                let kind = if c.kind == Kind::Decimal {
                    Kind::Decimal
                } else {
                    Kind::Float
                };
                (format!("avg({})", c.sql), kind)
            }
            AggFunc::Min | AggFunc::Max => {
                let c = need(&arg)?;
                let f = if a.func == AggFunc::Min { "min" } else { "max" };
                (format!("{f}({})", c.sql), c.kind)
            }
            AggFunc::Variance
            | AggFunc::VariancePopulation
            | AggFunc::Stddev
            | AggFunc::StddevPopulation => {
                let c = need(&arg)?;
                let f = match a.func {
                    AggFunc::Variance => "var_samp",
                    AggFunc::VariancePopulation => "var_pop",
                    AggFunc::Stddev => "stddev_samp",
                    _ => "stddev_pop",
                };
                (format!("{f}(CAST({} AS DOUBLE))", c.sql), Kind::Float)
            }
            // The value of the group's first (last) row in DTCS order, null or not.
            AggFunc::First | AggFunc::Last => {
                let c = need(&arg)?;
                let f = if a.func == AggFunc::First {
                    "min_by"
                } else {
                    "max_by"
                };
                (format!("{f}({}, {})", c.sql, ident(ORD)), c.kind)
            }
        };
        aggs.push(sql(&text).alias(&a.name).expression().clone());
        columns.push((a.name.clone(), kind));
    }
    aggs.push(
        sql(&format!("min({})", ident(ORD)))
            .alias(ORD)
            .expression()
            .clone(),
    );
    let df = if groups.is_empty() {
        r.df.agg(aggs)
    } else {
        r.df.group_by(groups).agg(aggs)
    };
    let rel = Rel {
        df,
        columns: columns.clone(),
    };
    // A global aggregate of no rows has no ordinal; it is the only row.
    Ok(rel.select(
        columns.iter().map(|(n, _)| ident(n)).collect(),
        columns,
        &format!("coalesce({}, array(0L))", ident(ORD)),
    ))
}

fn sort(r: &Rel, keys: &[SortKey]) -> Result<Rel> {
    let scope = r.scope();
    // Ties keep their input order (a stable sort). The sorted position becomes the
    // ordinal, so later actions and the region's output keep this order. A window
    // without partitions numbers the rows in one task: sorting is global anyway.
    let mut over = Vec::new();
    for k in keys {
        let c = expr::compile(&k.expr, &scope)?;
        over.push(format!(
            "{} {} NULLS {}",
            c.sql,
            if k.descending { "DESC" } else { "ASC" },
            if k.nulls_first { "FIRST" } else { "LAST" }
        ));
    }
    over.push(format!("{} ASC", ident(ORD)));
    Ok(r.select_ord(format!(
        "array(row_number() OVER (ORDER BY {}))",
        over.join(", ")
    )))
}

impl Rel {
    /// The same columns with a new ordinal.
    fn select_ord(&self, ord: String) -> Rel {
        self.select(
            self.columns.iter().map(|(n, _)| ident(n)).collect(),
            self.columns.clone(),
            &ord,
        )
    }
}

/// The first (or last) row of every key, by ordinal; `keys = None` means all columns.
fn first_per_key(r: &Rel, keys: Option<&[String]>, keep_last: bool) -> Result<Rel> {
    let keys: Vec<String> = match keys {
        Some(k) => {
            for c in k {
                r.require(c, "deduplicate key")?;
            }
            k.to_vec()
        }
        None => r.columns.iter().map(|(n, _)| n.clone()).collect(),
    };
    let partition = if keys.is_empty() {
        String::new()
    } else {
        format!(
            "PARTITION BY {} ",
            keys.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ")
        )
    };
    let dir = if keep_last { "DESC" } else { "ASC" };
    let rn = "__etl_rn";
    let mut exprs: Vec<spark_connect::Column> = r
        .columns
        .iter()
        .map(|(n, _)| spark_connect::functions::col(n))
        .collect();
    exprs.push(spark_connect::functions::col(ORD));
    exprs.push(sql(&format!(
        "row_number() OVER ({partition}ORDER BY {} {dir}) AS {rn}",
        ident(ORD)
    )));
    let ranked = r.df.select(exprs);
    let kept = ranked.filter(sql(&format!("{rn} = 1")));
    Ok(Rel {
        df: kept,
        columns: r.columns.clone(),
    }
    .with_ord(
        r.columns.iter().map(|(n, _)| ident(n)).collect(),
        r.columns.clone(),
    ))
}
