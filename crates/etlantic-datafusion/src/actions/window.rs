//! `etlantic:window_aggregate` on a bounded input (batch mode).
//!
//! Window geometry (the same as Spark's `window` / `session_window`):
//! - tumbling `size`: `[k*size, (k+1)*size)`, aligned to the Unix epoch;
//! - sliding `size`/`slide`: every `[k*slide, k*slide+size)` that contains the event (an
//!   event belongs to up to `ceil(size/slide)` windows);
//! - session `gap`: per group key, events sorted by time; an event starts a new session
//!   when it is more than `gap` after the previous one, so sessions that overlap or touch
//!   (an event exactly `gap` later) merge. A session is `[first event, last event + gap)`.
//!
//! Rows with a null event time belong to no window. Output: `window_start`, `window_end`
//! (timestamps of the time column's unit and zone), the group columns, the aggregates.

use super::aggregate::aggregate_expr;
use super::unique_names;
use crate::error::{self, DfResultExt};
use crate::expr::compile;
use crate::expr::types::{describe, millis_in_unit};
use crate::plan::order::Demand;
use crate::relation::Relation;
use crate::table::ORD;
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{ScalarValue, UnnestOptions};
use datafusion::functions_aggregate::expr_fn::{max, min};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::functions_nested::expr_fn::range;
use datafusion::functions_window::expr_fn::{lag, row_number};
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    cast, lit, when, Expr as DfExpr, ExprFunctionExt, ExprSchemable, WindowFrame, WindowFrameBound,
    WindowFrameUnits, WindowFunctionDefinition,
};
use etlantic_core::ir::{Aggregate, NamedExpr, WindowKind, WindowSpec};
use etlantic_core::Result;

const T: &str = "__etl_t";
const K: &str = "__etl_k";
const WS: &str = "__etl_ws";
const WE: &str = "__etl_we";
const PREV: &str = "__etl_prev";
const NEW: &str = "__etl_new";
const SID: &str = "__etl_sid";
const MIN_ORD: &str = "__etl_min_ord";

fn group_col(i: usize) -> String {
    format!("__etl_g{i}")
}

/// `x - floor_mod(x, m)`: the start of the `m`-aligned bucket of `x` (works for negative
/// times too).
fn floor_to(x: DfExpr, m: i64) -> DfExpr {
    let r = ((x.clone() % lit(m)) + lit(m)) % lit(m);
    x - r
}

fn ticks(ms: i64, unit: TimeUnit, what: &str) -> Result<i64> {
    millis_in_unit(ms, unit).filter(|t| *t > 0).ok_or_else(|| {
        error::type_mismatch(format!(
            "window {what} of {ms} ms is not a whole positive number of the time column's unit ({unit:?})"
        ))
    })
}

/// Applies a window aggregation.
pub(crate) fn window_aggregate(
    rel: Relation,
    window: &WindowSpec,
    group_by: &[NamedExpr],
    aggregates: &[Aggregate],
    demand: Demand,
) -> Result<Relation> {
    unique_names(
        ["window_start", "window_end"]
            .into_iter()
            .chain(group_by.iter().map(|g| g.name.as_str()))
            .chain(aggregates.iter().map(|a| a.name.as_str())),
        "window_aggregate",
    )?;
    let time = &window.time_column;
    rel.require(time)?;
    let tt = rel.col(time).get_type(rel.schema().as_ref()).df("window")?;
    let DataType::Timestamp(unit, tz) = tt.clone() else {
        return Err(error::type_mismatch(format!(
            "window_aggregate needs a timestamp time column, `{time}` is {}",
            describe(&tt)
        )));
    };

    // Stage 1: event time as ticks, group keys as hidden columns; null times dropped.
    let scope = rel.scope();
    let mut exprs = rel.column_exprs();
    if rel.ordered {
        exprs.push(rel.col(ORD));
    }
    exprs.push(cast(rel.col(time), DataType::Int64).alias(T));
    for (i, g) in group_by.iter().enumerate() {
        exprs.push(compile(&g.expr, &scope)?.alias(group_col(i)));
    }
    let ordered = rel.ordered;
    let df = rel.df.select(exprs).df("window")?;
    let staged = Relation::shuffled(df, ordered);
    let t_col = staged.col(T);
    let df = staged.df.filter(t_col.is_not_null()).df("window")?;
    let mut rel = Relation::shuffled(df, ordered);
    let keys: Vec<DfExpr> = (0..group_by.len())
        .map(|i| rel.col(&group_col(i)))
        .collect();

    // Stage 2: window bounds.
    match &window.kind {
        WindowKind::Tumbling { size } => {
            let s = ticks(size.as_millis(), unit, "size")?;
            let start = floor_to(rel.col(T), s);
            rel = add_columns(
                rel,
                vec![start.clone().alias(WS), (start + lit(s)).alias(WE)],
            )?;
        }
        WindowKind::Sliding { size, slide } => {
            let s = ticks(size.as_millis(), unit, "size")?;
            let d = ticks(slide.as_millis(), unit, "slide")?;
            let n = (s + d - 1) / d;
            rel = add_columns(rel, vec![range(lit(0i64), lit(n), lit(1i64)).alias(K)])?;
            let df = rel
                .df
                .unnest_columns_with_options(&[K], UnnestOptions::new().with_preserve_nulls(false))
                .df("sliding window")?;
            rel = Relation::shuffled(df, ordered);
            let start = floor_to(rel.col(T), d) - rel.col(K) * lit(d);
            rel = add_columns(
                rel,
                vec![start.clone().alias(WS), (start + lit(s)).alias(WE)],
            )?;
            let cond = rel.col(WE).gt(rel.col(T));
            let df = rel.df.filter(cond).df("sliding window")?;
            rel = Relation::shuffled(df, ordered);
        }
        WindowKind::Session { gap } => {
            let g = ticks(gap.as_millis(), unit, "gap")?;
            let mut order = vec![rel.col(T).sort(true, false)];
            order.extend(rel.ord_sort());
            let prev = lag(rel.col(T), Some(1), None)
                .partition_by(keys.clone())
                .order_by(order.clone())
                .build()
                .df("session window")?;
            rel = add_columns(rel, vec![prev.alias(PREV)])?;
            let new = when(
                rel.col(PREV)
                    .is_null()
                    .or((rel.col(T) - rel.col(PREV)).gt(lit(g))),
                lit(1i64),
            )
            .otherwise(lit(0i64))
            .df("session window")?;
            rel = add_columns(rel, vec![new.alias(NEW)])?;
            let keys: Vec<DfExpr> = (0..group_by.len())
                .map(|i| rel.col(&group_col(i)))
                .collect();
            let mut order = vec![rel.col(T).sort(true, false)];
            order.extend(rel.ord_sort());
            let running = DfExpr::from(WindowFunction::new(
                WindowFunctionDefinition::AggregateUDF(sum_udaf()),
                vec![rel.col(NEW)],
            ));
            let sid = running
                .partition_by(keys)
                .order_by(order)
                .window_frame(WindowFrame::new_bounds(
                    WindowFrameUnits::Rows,
                    WindowFrameBound::Preceding(ScalarValue::UInt64(None)),
                    WindowFrameBound::CurrentRow,
                ))
                .build()
                .df("session window")?;
            rel = add_columns(rel, vec![sid.alias(SID)])?;
        }
    }

    // Stage 3: aggregate per window and group.
    let scope = rel.scope();
    let ord = rel.ordered.then(|| rel.col(ORD));
    let mut groups = Vec::new();
    let mut bounds = Vec::new();
    // Sessions end `gap` after their last event (added below).
    let mut end_offset = 0i64;
    if let WindowKind::Session { gap } = &window.kind {
        end_offset = ticks(gap.as_millis(), unit, "gap")?;
        groups.push(rel.col(SID));
        bounds.push(min(rel.col(T)).alias(WS));
        bounds.push(max(rel.col(T)).alias(WE));
    } else {
        groups.push(rel.col(WS));
        groups.push(rel.col(WE));
    }
    for i in 0..group_by.len() {
        groups.push(rel.col(&group_col(i)));
    }
    let mut aggs = bounds;
    for a in aggregates {
        aggs.push(aggregate_expr(a, &scope, ord.clone())?.alias(&a.name));
    }
    let want_order = demand == Demand::Require;
    if want_order && rel.ordered {
        aggs.push(min(rel.col(ORD)).alias(MIN_ORD));
    }
    let df = rel.df.aggregate(groups, aggs).df("window aggregate")?;
    let agg = Relation::shuffled(df, false);

    // Stage 4: output columns.
    let ts_type = DataType::Timestamp(unit, tz);
    let mut out = vec![
        cast(agg.col(WS), ts_type.clone()).alias("window_start"),
        cast(agg.col(WE) + lit(end_offset), ts_type).alias("window_end"),
    ];
    for (i, g) in group_by.iter().enumerate() {
        out.push(agg.col(&group_col(i)).alias(&g.name));
    }
    for a in aggregates {
        out.push(agg.col(&a.name));
    }
    if want_order {
        let mut order = vec![agg.col(WS).sort(true, false), agg.col(WE).sort(true, false)];
        if agg.schema().has_column_with_unqualified_name(MIN_ORD) {
            order.push(agg.col(MIN_ORD).sort(true, false));
        }
        let ord = row_number().order_by(order).build().df("window order")?;
        return agg.select_with_ord(out, ord);
    }
    agg.select(out, false)
}

/// Appends columns, keeping everything (hidden columns included).
fn add_columns(rel: Relation, extra: Vec<DfExpr>) -> Result<Relation> {
    let schema = rel.schema();
    let mut exprs: Vec<DfExpr> = schema
        .iter()
        .map(|(q, f)| DfExpr::Column(datafusion::common::Column::new(q.cloned(), f.name())))
        .collect();
    exprs.extend(extra);
    let ordered = rel.ordered;
    let df = rel.df.select(exprs).df("window")?;
    Ok(Relation::shuffled(df, ordered))
}
