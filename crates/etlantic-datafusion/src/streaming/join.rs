//! Stream-stream joins: Spark's `StreamingSymmetricHashJoinExec` (state format v2) for
//! `dtcs:join` steps whose two inputs are both unbounded.
//!
//! Both sides are buffered in state, keyed by the join keys. For each micro-batch:
//!
//! (The steps are given with the left side first; when only the right side is unique on
//! the join keys the right side goes first: `StreamJoinOperator::first_side`.)
//!
//! 1. the left input is filtered: rows behind the watermark (their side's watermarked
//!    event-time column `<=` the late watermark) are late and routed by the late policy;
//!    on a side whose unmatched rows are never emitted (the right side of a left outer
//!    join, both sides of an inner join) rows with a null key, or a null time-range
//!    column, can never match and are skipped (Spark infers `IS NOT NULL` filters there);
//! 2. every remaining left row is joined with the right side's state and then added to
//!    the left state, remembering whether it matched;
//! 3. the right input is filtered the same way and joined with the left state, which now
//!    holds this batch's left rows too (so rows of the same batch meet exactly once);
//!    matched left rows are marked when the left side is preserved (only an outer join
//!    reads the mark: marking changes the state row, which the changelog then writes
//!    again); a right row is added to the right state unless the
//!    state watermark would evict it right away (an unmatched row of a right or full
//!    outer join is always added, so that it is emitted at eviction);
//! 4. state is evicted with the *state watermark* of each side, derived like Spark's
//!    `StreamingSymmetricHashJoinHelper`:
//!    - when a join key is the watermarked event-time column of a side, rows of both
//!      sides whose value of that key is `<=` the watermark go (key predicate);
//!    - otherwise, with a time range `left.t BETWEEN right.t - lower AND right.t + upper`
//!      and watermarks on both `t` columns, a left row can only match future right rows
//!      while `left.t > watermark - lower`, so left rows with `left.t <= watermark -
//!      lower - 1 ms` go; right rows with `right.t <= watermark - upper - 1 ms` go
//!      (value predicates; the `- 1 ms` is Spark's, for the inclusive bounds);
//!    - a side with neither keeps its state (an inner join without watermarks keeps
//!      everything; progress reports the size).
//!
//!    An evicted row of a preserved side (left for left outer, right for right outer,
//!    both for full outer) that never matched is emitted with nulls for the other side.
//!
//! Null keys never match (unless the join is `nullSafe`). A join predicate is evaluated
//! on the candidate pairs (keys and range already equal/within) and decides what counts
//! as a match. The output has the batch join's columns (`dtcs:join`'s column rules): the
//! left columns, then the right ones, with key pairs of the same name merged. Output mode
//! is append: every row is final.
//!
//! When a side is unique on the join keys ([`JoinSideSpec::unique`]), a row of the other
//! side that found that side's row of its key in state is not buffered (it has met the
//! one row it ever can), and a new row of the unique side removes the other side's rows
//! of its key; unmatched rows of a preserved side are kept either way, for their outer
//! row at eviction. A row repeating a unique key still held (or one an earlier row of the
//! batch has) is rejected before step 2 and returned in [`PairOutput::duplicates`].
//!
//! With a state TTL (the profile's `state_ttl`, see [`super::ttl`]) a buffered row also
//! expires when neither its arrival nor a match touched it for the TTL, silently and
//! before the micro-batch's input meets the state.
//!
//! The state of both sides is one Arrow snapshot per version: `__side`, `__seq` (arrival
//! order), `__matched`, the update time, then the left columns (`l.<name>`) and the right
//! ones (`r.<name>`); keys and times are recomputed from the columns on restore.

use super::operators::{micros, OpContext, OpOutput, PairOutput, StateMetrics, StatefulOperator};
use super::program::{SecondaryInput, SourceInfo, StatefulUnit};
use super::progress::StateProgress;
use super::ttl::{StateTtl, ROWS_REMOVED_BY_TTL, UPDATED_COLUMN};
use crate::expr::types::{common_type, describe};
use crate::expr::{compile_predicate, Scope};
use arrow::array::{
    new_null_array, Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, UInt32Array,
    UInt64Array, UInt8Array,
};
use arrow::compute::kernels::zip::zip;
use arrow::compute::{cast, concat_batches, filter_record_batch, interleave, is_not_null};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::logical_expr::Expr as DfExpr;
use datafusion::physical_expr::PhysicalExpr;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Action, ActionNode, Expr, JoinTimeRange, JoinType};
use etlantic_core::streaming::LatePolicy;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

mod state;
use state::{Entry, FastMap, SideState};

fn engine(e: impl std::fmt::Display) -> Error {
    Error::new(&codes::ENGINE_ERROR, e.to_string())
}

const LEFT: usize = 0;
const RIGHT: usize = 1;
const QUALIFIERS: [&str; 2] = ["__etl_l", "__etl_r"];

/// What the runtime knows of one side of a stream-stream join.
#[derive(Clone, Debug)]
pub struct JoinSideSpec {
    /// The schema of the side's input.
    pub schema: SchemaRef,
    /// Its key columns.
    pub keys: Vec<String>,
    /// Its watermarked event-time column, if the input carries one.
    pub watermark_column: Option<String>,
    /// Process late rows as if on time (late policy `accept`).
    pub accept_late: bool,
    /// No two rows of the side's stream have equal keys (a unique key of its contract
    /// lies within the join keys). The other side then keeps no row once it has met
    /// this side's row of its key, and a second row of a key this side still holds is
    /// a contract violation: it is rejected, not joined (see [`PairOutput::duplicates`]).
    pub unique: bool,
}

/// Everything a [`StreamJoinOperator`] is built from.
#[derive(Clone, Debug)]
pub struct JoinLayout {
    /// Inner, left, right or full.
    pub join_type: JoinType,
    /// The left side (the step's target).
    pub left: JoinSideSpec,
    /// The right side.
    pub right: JoinSideSpec,
    /// The event-time range condition.
    pub time_range: Option<JoinTimeRange>,
    /// A predicate over the joined row, AND-ed with keys and range.
    pub predicate: Option<Expr>,
    /// Null keys match each other.
    pub null_safe: bool,
    /// The output schema (the batch join's).
    pub output_schema: SchemaRef,
}

/// How a side's state is evicted: rows whose value of `column` is at or below
/// `watermark + offset_ms` go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The column compared (a timestamp of this side).
    pub column: String,
    /// Added to the watermark (ms): 0 for a key predicate, `-(bound) - 1` for a value
    /// predicate.
    pub offset_ms: i64,
}

/// The state watermark predicates of both sides, as Spark derives them.
pub fn state_evictions(layout: &JoinLayout) -> [Option<Eviction>; 2] {
    let sides = [&layout.left, &layout.right];
    // A watermarked event-time column among the keys: both sides evict by that key.
    let key_ordinal = sides.iter().find_map(|s| {
        let wm = s.watermark_column.as_ref()?;
        s.keys.iter().position(|k| k == wm)
    });
    if let Some(i) = key_ordinal {
        return sides.map(|s| {
            let column = s.keys[i].clone();
            let is_time = s
                .schema
                .field_with_name(&column)
                .is_ok_and(|f| matches!(f.data_type(), DataType::Timestamp(..)));
            is_time.then_some(Eviction {
                column,
                offset_ms: 0,
            })
        });
    }
    let Some(r) = &layout.time_range else {
        return [None, None];
    };
    let both = layout.left.watermark_column.as_deref() == Some(r.left.as_str())
        && layout.right.watermark_column.as_deref() == Some(r.right.as_str());
    if !both {
        return [None, None];
    }
    [
        Some(Eviction {
            column: r.left.clone(),
            offset_ms: -r.lower.as_millis() - 1,
        }),
        Some(Eviction {
            column: r.right.clone(),
            offset_ms: -r.upper.as_millis() - 1,
        }),
    ]
}

/// Where an output column comes from.
#[derive(Clone, Copy, Debug)]
enum OutCol {
    Left(usize),
    Right(usize),
    /// A key of the same name on both sides (left value, else right value).
    Merged(usize, usize),
}

type RowRef = (u32, u32);

/// The progress custom metric of a join with a side unique on the join keys: rows of a
/// micro-batch that the join did not keep, or dropped from its state, because they had
/// met the unique side's one row of their key (see [`JoinSideSpec::unique`]).
pub const ROWS_RELEASED_BY_UNIQUE_KEY: &str = "numRowsReleasedByUniqueKey";

/// What one side's input did in a micro-batch ([`StreamJoinOperator::run_side`]).
#[derive(Default)]
struct SideRun {
    late: Option<RecordBatch>,
    late_count: u64,
    /// Entries added to this side's state.
    added: u64,
    /// Entries of the other side's state that met this (unique) side's row of their key.
    removed_other: u64,
    /// Rows not added for having met the other (unique) side's row of their key.
    not_kept: u64,
    /// Rows rejected for repeating a key of this (unique) side.
    duplicates: Option<RecordBatch>,
}

/// The rows of `batch` that `which` selects (`None` when there are none).
fn take_rows(batch: &RecordBatch, which: &[bool]) -> Result<Option<RecordBatch>> {
    if !which.contains(&true) {
        return Ok(None);
    }
    filter_record_batch(batch, &BooleanArray::from(which.to_vec()))
        .map(Some)
        .map_err(engine)
}

/// The stream-stream join operator.
pub struct StreamJoinOperator {
    layout: JoinLayout,
    evictions: [Option<Eviction>; 2],
    preserved: [bool; 2],
    /// Each side's rows are unique on the join keys ([`JoinSideSpec::unique`]; never
    /// for a null-safe join, whose null keys would repeat).
    unique: [bool; 2],
    key_types: Vec<DataType>,
    converter: RowConverter,
    out_cols: Vec<OutCol>,
    nulls: [Vec<ArrayRef>; 2],
    predicate: Option<(Arc<dyn PhysicalExpr>, SchemaRef)>,
    sides: [SideState; 2],
    /// The key hasher of both sides (see [`SideState::new`]).
    hasher: foldhash::fast::RandomState,
    metrics: StateMetrics,
    ttl: Option<StateTtl>,
    ttl_removed: u64,
    /// Rows of the micro-batch not kept, or dropped, for having met a unique side's row
    /// of their key (the [`ROWS_RELEASED_BY_UNIQUE_KEY`] metric).
    unique_released: u64,
}

fn relaxed(schema: &SchemaRef) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<Field>>(),
    ))
}

fn side_name(side: usize) -> &'static str {
    if side == LEFT {
        "left"
    } else {
        "right"
    }
}

fn require_time(schema: &Schema, column: &str, side: usize, what: &str) -> Result<()> {
    let f = schema.field_with_name(column).map_err(|_| {
        Error::new(
            &codes::UNKNOWN_COLUMN,
            format!(
                "the {what} `{column}` is not a column of the join's {} input",
                side_name(side)
            ),
        )
    })?;
    if !matches!(f.data_type(), DataType::Timestamp(..)) {
        return Err(Error::new(
            &codes::TYPE_MISMATCH,
            format!(
                "the {what} `{column}` ({} side) is {}, not a timestamp",
                side_name(side),
                describe(f.data_type())
            ),
        ));
    }
    Ok(())
}

impl StreamJoinOperator {
    /// A join with empty state.
    pub fn new(layout: JoinLayout) -> Result<Self> {
        let preserved = match layout.join_type {
            JoinType::Inner => [false, false],
            JoinType::Left => [true, false],
            JoinType::Right => [false, true],
            JoinType::Full => [true, true],
            other => {
                return Err(Error::new(
                    &codes::UNSUPPORTED_STREAMING_OP,
                    format!(
                    "{} joins of two streams are not supported (inner, left, right and full are)",
                    other.name()
                ),
                ))
            }
        };
        let (l, r) = (&layout.left, &layout.right);
        if l.keys.len() != r.keys.len() {
            return Err(engine("a join needs as many right keys as left keys"));
        }
        let mut key_types = Vec::new();
        for (lk, rk) in l.keys.iter().zip(&r.keys) {
            let lt = l.schema.field_with_name(lk).map_err(|_| {
                Error::new(
                    &codes::UNKNOWN_COLUMN,
                    format!("left join key `{lk}` is not a column"),
                )
            })?;
            let rt = r.schema.field_with_name(rk).map_err(|_| {
                Error::new(
                    &codes::UNKNOWN_COLUMN,
                    format!("right join key `{rk}` is not a column"),
                )
            })?;
            let t = common_type(lt.data_type(), rt.data_type()).ok_or_else(|| {
                Error::new(
                    &codes::TYPE_MISMATCH,
                    format!(
                        "join keys `{lk}` ({}) and `{rk}` ({}) cannot be compared",
                        describe(lt.data_type()),
                        describe(rt.data_type())
                    ),
                )
            })?;
            key_types.push(t);
        }
        if let Some(tr) = &layout.time_range {
            require_time(&l.schema, &tr.left, LEFT, "time-range column")?;
            require_time(&r.schema, &tr.right, RIGHT, "time-range column")?;
        }
        for (i, s) in [l, r].iter().enumerate() {
            if let Some(c) = &s.watermark_column {
                require_time(&s.schema, c, i, "event-time column")?;
            }
        }
        let converter = RowConverter::new(
            key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )
        .map_err(engine)?;
        // Output columns by the batch join's rules.
        let merged: Vec<&String> = l
            .keys
            .iter()
            .zip(&r.keys)
            .filter(|(a, b)| a == b)
            .map(|(a, _)| a)
            .collect();
        let mut out_cols = Vec::new();
        let mut names = Vec::new();
        for (j, f) in l.schema.fields().iter().enumerate() {
            if merged.contains(&f.name()) {
                let rj = r.schema.index_of(f.name()).map_err(engine)?;
                out_cols.push(OutCol::Merged(j, rj));
            } else {
                out_cols.push(OutCol::Left(j));
            }
            names.push(f.name().clone());
        }
        for (j, f) in r.schema.fields().iter().enumerate() {
            if !merged.contains(&f.name()) {
                out_cols.push(OutCol::Right(j));
                names.push(f.name().clone());
            }
        }
        let expected: Vec<&String> = layout
            .output_schema
            .fields()
            .iter()
            .map(|f| f.name())
            .collect();
        if names.iter().collect::<Vec<_>>() != expected {
            return Err(engine(format!(
                "stream join output columns {names:?} differ from the planned {expected:?}"
            )));
        }
        let nulls = [l, r].map(|s| {
            s.schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), 1))
                .collect::<Vec<_>>()
        });
        let predicate = match &layout.predicate {
            None => None,
            Some(p) => Some(compile_joined_predicate(p, &l.schema, &r.schema)?),
        };
        let unique = [l.unique, r.unique].map(|u| u && !layout.null_safe);
        let evictions = state_evictions(&layout);
        let hasher = foldhash::fast::RandomState::default();
        let mut layout = layout;
        // Outer rows have nulls where the inputs may have none.
        layout.output_schema = relaxed(&layout.output_schema);
        Ok(StreamJoinOperator {
            evictions,
            preserved,
            unique,
            key_types,
            converter,
            out_cols,
            nulls,
            predicate,
            sides: [
                SideState::new(hasher.clone()),
                SideState::new(hasher.clone()),
            ],
            hasher,
            metrics: StateMetrics::default(),
            ttl: None,
            ttl_removed: 0,
            unique_released: 0,
            layout,
        })
    }

    /// The eviction predicates of the sides (for tests and explain).
    pub fn evictions(&self) -> &[Option<Eviction>; 2] {
        &self.evictions
    }

    fn spec(&self, side: usize) -> &JoinSideSpec {
        if side == LEFT {
            &self.layout.left
        } else {
            &self.layout.right
        }
    }

    fn range_column(&self, side: usize) -> Option<&str> {
        self.layout.time_range.as_ref().map(|r| {
            if side == LEFT {
                r.left.as_str()
            } else {
                r.right.as_str()
            }
        })
    }

    /// Whether each row has a null key (never when the join is null-safe).
    fn null_keys(&self, side: usize, batch: &RecordBatch) -> Result<Vec<bool>> {
        let mut out = vec![false; batch.num_rows()];
        if self.layout.null_safe {
            return Ok(out);
        }
        for k in &self.spec(side).keys {
            let c = batch
                .column_by_name(k)
                .ok_or_else(|| engine(format!("missing join key {k}")))?;
            if c.null_count() > 0 {
                for (i, o) in out.iter_mut().enumerate() {
                    *o |= c.is_null(i);
                }
            }
        }
        Ok(out)
    }

    fn key_rows(&self, side: usize, batch: &RecordBatch) -> Result<(Rows, Vec<bool>)> {
        let spec = self.spec(side);
        let mut cols = Vec::with_capacity(spec.keys.len());
        for (k, t) in spec.keys.iter().zip(&self.key_types) {
            let c = batch
                .column_by_name(k)
                .ok_or_else(|| engine(format!("missing join key {k}")))?;
            cols.push(if c.data_type() == t {
                c.clone()
            } else {
                cast(c, t).map_err(engine)?
            });
        }
        let rows = self.converter.convert_columns(&cols).map_err(engine)?;
        let mut null_key = vec![false; batch.num_rows()];
        if !self.layout.null_safe {
            for c in cols.iter().filter(|c| c.null_count() > 0) {
                for (i, n) in null_key.iter_mut().enumerate() {
                    *n |= c.is_null(i);
                }
            }
        }
        Ok((rows, null_key))
    }

    fn times(batch: &RecordBatch, column: Option<&str>) -> Result<Vec<Option<i64>>> {
        match column {
            None => Ok(vec![None; batch.num_rows()]),
            Some(c) => {
                let col = batch
                    .column_by_name(c)
                    .ok_or_else(|| engine(format!("missing time column {c}")))?;
                Ok(micros(col)?.iter().collect())
            }
        }
    }

    fn threshold_us(&self, side: usize, ctx: &OpContext) -> Option<i64> {
        if !ctx.has_watermark {
            return None;
        }
        self.evictions[side]
            .as_ref()
            .map(|e| (ctx.evict_watermark_us.div_euclid(1000) + e.offset_ms) * 1000)
    }

    /// Steps 1-3 for one side: filter, join with the other side's state, store.
    /// Adds the joined pairs (left ref, right ref) to `pairs`.
    fn run_side(
        &mut self,
        side: usize,
        input: &[RecordBatch],
        ctx: &OpContext,
        pairs: &mut Vec<(Option<RowRef>, Option<RowRef>)>,
    ) -> Result<SideRun> {
        let spec = self.spec(side).clone();
        let other = 1 - side;
        let nonempty: Vec<&RecordBatch> = input.iter().filter(|b| b.num_rows() > 0).collect();
        let batch = match nonempty.as_slice() {
            [] => return Ok(SideRun::default()),
            [one] => (*one).clone(),
            _ => concat_batches(&spec.schema, nonempty).map_err(engine)?,
        };
        // 1. Filter: never-matching rows of a non-preserved side, late rows.
        let null_key = self.null_keys(side, &batch)?;
        // The range, watermark and eviction columns are often one (Nexmark q7's
        // `date_time`): its times are read once.
        let range = Self::times(&batch, self.range_column(side))?;
        let wm_owned;
        let wm_times: &[Option<i64>] =
            if spec.watermark_column.as_deref() == self.range_column(side) {
                &range
            } else {
                wm_owned = Self::times(&batch, spec.watermark_column.as_deref())?;
                &wm_owned
            };
        let mut keep = Vec::with_capacity(batch.num_rows());
        let mut late = Vec::new();
        for i in 0..batch.num_rows() {
            let hopeless = null_key[i] || (self.layout.time_range.is_some() && range[i].is_none());
            if hopeless && !self.preserved[side] {
                keep.push(false);
                continue;
            }
            let is_late = ctx.has_watermark
                && !spec.accept_late
                && wm_times[i].is_some_and(|t| t <= ctx.late_watermark_us);
            if is_late {
                late.push(i as u32);
            }
            keep.push(!is_late);
        }
        let late_batch = if late.is_empty() {
            None
        } else {
            let idx = UInt32Array::from(late.clone());
            let cols = batch
                .columns()
                .iter()
                .map(|c| arrow::compute::take(c, &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(engine)?;
            Some(RecordBatch::try_new(batch.schema(), cols).map_err(engine)?)
        };
        let all_kept = keep.iter().all(|k| *k);
        let kept = if all_kept {
            batch
        } else {
            filter_record_batch(&batch, &BooleanArray::from(keep)).map_err(engine)?
        };
        let late_count = late.len() as u64;
        if kept.num_rows() == 0 {
            return Ok(SideRun {
                late: late_batch,
                late_count,
                ..SideRun::default()
            });
        }
        let (rows, null_key) = self.key_rows(side, &kept)?;
        // Each key is hashed once, for both sides' state (they share the hasher).
        let hashes: Vec<u64> = (0..rows.num_rows())
            .map(|i| self.sides[side].hash(rows.row(i).as_ref()))
            .collect();
        let duplicate = if self.unique[side] {
            self.repeated_keys(side, &rows, &hashes, &null_key)
        } else {
            vec![false; kept.num_rows()]
        };
        let duplicates = take_rows(&kept, &duplicate)?;
        let range = if all_kept {
            range
        } else {
            Self::times(&kept, self.range_column(side))?
        };
        let evict_col = self.evictions[side].as_ref().map(|e| e.column.clone());
        let evict_owned;
        let evict_times: &[Option<i64>] = if evict_col.as_deref() == self.range_column(side) {
            &range
        } else {
            evict_owned = Self::times(&kept, evict_col.as_deref())?;
            &evict_owned
        };
        let chunk = self.sides[side].add_chunk(kept.clone());

        // 2./3. Join with the other side's state.
        let (lower, upper) = self
            .layout
            .time_range
            .as_ref()
            .map(|r| (r.lower.as_micros(), r.upper.as_micros()))
            .unwrap_or((0, 0));
        let in_range = |this_t: Option<i64>, that_t: Option<i64>| -> bool {
            if self.layout.time_range.is_none() {
                return true;
            }
            let (Some(a), Some(b)) = (this_t, that_t) else {
                return false;
            };
            let (lt, rt) = if side == LEFT { (a, b) } else { (b, a) };
            lt >= rt - lower && lt <= rt + upper
        };
        // Candidates: (row of this batch, slot of the other side's entry).
        self.sides[other].prepare_probes(kept.num_rows());
        let mut candidates: Vec<(usize, u32)> = Vec::new();
        // Whether the other side holds the row's key, and (when this side is unique) the
        // other side's entries of the keys probed.
        let mut other_holds_key = vec![false; kept.num_rows()];
        let mut probed: Vec<u32> = Vec::new();
        // An empty other side matches nothing (Nexmark q7: the window maxima are evicted
        // soon after they meet the bids, so most bids find none to probe).
        let probes = if self.sides[other].rows == 0 {
            0
        } else {
            kept.num_rows()
        };
        for i in 0..probes {
            if null_key[i] || duplicate[i] {
                continue;
            }
            for (slot, e) in self.sides[other].matches_hashed(hashes[i], rows.row(i).as_ref()) {
                other_holds_key[i] = true;
                if self.unique[side] {
                    probed.push(slot);
                }
                if in_range(range[i], e.range_time.get()) {
                    candidates.push((i, slot));
                }
            }
        }
        let accepted: Vec<bool> = match &self.predicate {
            None => vec![true; candidates.len()],
            Some(_) if candidates.is_empty() => vec![],
            Some((expr, schema)) => {
                let this_refs: Vec<Option<RowRef>> = candidates
                    .iter()
                    .map(|(i, _)| Some((chunk, *i as u32)))
                    .collect();
                let other_refs: Vec<Option<RowRef>> = candidates
                    .iter()
                    .map(|(_, slot)| {
                        let e = self.sides[other].entry(*slot);
                        Some((e.chunk, e.row))
                    })
                    .collect();
                let (lrefs, rrefs) = if side == LEFT {
                    (this_refs, other_refs)
                } else {
                    (other_refs, this_refs)
                };
                let mut cols = self.gather(LEFT, &lrefs)?;
                cols.extend(self.gather(RIGHT, &rrefs)?);
                let joined = RecordBatch::try_new(schema.clone(), cols).map_err(engine)?;
                let v = expr
                    .evaluate(&joined)
                    .and_then(|v| v.into_array(joined.num_rows()))
                    .map_err(engine)?;
                let b = v
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| engine("a join predicate must be boolean"))?;
                (0..b.len()).map(|k| b.is_valid(k) && b.value(k)).collect()
            }
        };
        let mut matched = vec![false; kept.num_rows()];
        for ((i, slot), ok) in candidates.iter().zip(accepted) {
            if !ok {
                continue;
            }
            let st = &mut self.sides[other];
            let e = *st.entry(*slot);
            // Only a preserved side's mark is read (its unmatched rows are emitted at
            // eviction); marking a row makes it a change the next checkpoint writes,
            // so an inner join's rows are left as they are (Nexmark q3 wrote each
            // person again in the checkpoint after its first auction).
            if (self.preserved[other] && !e.matched) || self.ttl.is_some() {
                let e = st.entry_mut(*slot);
                e.matched = true;
                if self.ttl.is_some() {
                    // A match keeps the buffered row alive.
                    e.updated_ms = Some(ctx.processing_time_ms).into();
                }
            }
            let that_ref = Some((e.chunk, e.row));
            matched[*i] = true;
            let this_ref = Some((chunk, *i as u32));
            pairs.push(if side == LEFT {
                (this_ref, that_ref)
            } else {
                (that_ref, this_ref)
            });
        }
        // This side is unique: the other side's rows of the keys it met can meet no
        // other row, and go unless they are unmatched rows of a preserved side (emitted
        // when evicted).
        let removed_other = if probed.is_empty() {
            0
        } else {
            let st = &self.sides[other];
            let done: Vec<u32> = probed
                .into_iter()
                .filter(|slot| !self.preserved[other] || st.entry(*slot).matched)
                .collect();
            self.sides[other].remove_slots(&done) as u64
        };
        // Store. Rows of the side that goes first always (they may still meet this
        // batch's rows of the other side); the second side's rows unless they are
        // evicted right away, except unmatched rows of a preserved side, which are
        // emitted at eviction. Neither when the other side is
        // unique and holds the row's key (its one row of that key is the only one the
        // row can ever meet), unless it is an unmatched row of a preserved side;
        // rejected duplicates never.
        let threshold = self.threshold_us(side, ctx);
        // Keys of one schema are mostly of one length: the first one's is the estimate.
        let key_len = if rows.num_rows() > 0 {
            rows.row(0).as_ref().len()
        } else {
            0
        };
        self.sides[side].reserve(kept.num_rows(), kept.num_rows() * key_len);
        let mut added = 0;
        let mut not_kept = 0;
        for i in 0..kept.num_rows() {
            let evicting_now = threshold.is_some_and(|th| evict_times[i].is_some_and(|t| t <= th));
            let waits_outer = self.preserved[side] && !matched[i];
            let met_its_match = self.unique[other] && other_holds_key[i];
            let released = met_its_match && !waits_outer;
            not_kept += u64::from(released);
            let add = !duplicate[i]
                && !released
                && (side == self.first_side() || !evicting_now || waits_outer);
            if add {
                self.sides[side].insert_hashed(
                    hashes[i],
                    rows.row(i).as_ref(),
                    Entry {
                        seq: 0,
                        chunk,
                        row: i as u32,
                        range_time: range[i].into(),
                        evict_time: evict_times[i].into(),
                        matched: matched[i],
                        updated_ms: Some(ctx.processing_time_ms).into(),
                    },
                );
                added += 1;
            }
        }
        Ok(SideRun {
            late: late_batch,
            late_count,
            added,
            removed_other,
            not_kept,
            duplicates,
        })
    }

    /// The side whose input meets the state first in a micro-batch (the other side's
    /// input then meets the state with this batch's rows of the first in it): the left,
    /// as in Spark, unless only the right side is unique. Its rows then go first, so
    /// that the left rows of the same batch find their right row in state and are not
    /// kept, instead of being kept and dropped again when it comes (Nexmark q4: most bids
    /// arrive in the micro-batch of their auction). The output holds the same pairs
    /// either way, in another order.
    fn first_side(&self) -> usize {
        if self.unique[RIGHT] && !self.unique[LEFT] {
            RIGHT
        } else {
            LEFT
        }
    }

    /// Which rows repeat a key of this (unique) side: one it holds, or one an earlier
    /// row of the batch has. `hashes` are the rows' key hashes ([`SideState::hash`]).
    fn repeated_keys(
        &mut self,
        side: usize,
        rows: &Rows,
        hashes: &[u64],
        null_key: &[bool],
    ) -> Vec<bool> {
        let state = &mut self.sides[side];
        state.prepare_probes(rows.num_rows());
        // The batch's keys so far, by row, hashed with the state's hashes.
        let mut seen: hashbrown::HashTable<u32> =
            hashbrown::HashTable::with_capacity(rows.num_rows());
        (0..rows.num_rows())
            .map(|i| {
                if null_key[i] {
                    return false;
                }
                let (hash, key) = (hashes[i], rows.row(i));
                let earlier = match seen.entry(
                    hash,
                    |&j| rows.row(j as usize) == key,
                    |&j| hashes[j as usize],
                ) {
                    hashbrown::hash_table::Entry::Occupied(_) => true,
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        v.insert(i as u32);
                        false
                    }
                };
                earlier || state.matches_hashed(hash, key.as_ref()).next().is_some()
            })
            .collect()
    }

    /// The columns of `side` for `refs` (`None`: nulls).
    ///
    /// Changelogs and snapshots gather the rows of whole micro-batches in arrival order:
    /// when `refs` are few runs of consecutive rows of one chunk, the runs are sliced
    /// (no copy for one run, one copy for several) instead of interleaved row by row.
    fn gather(&self, side: usize, refs: &[Option<RowRef>]) -> Result<Vec<ArrayRef>> {
        if let Some(runs) = row_runs(refs) {
            return self.gather_runs(side, &runs);
        }
        let state = &self.sides[side];
        let mut order: Vec<u32> = Vec::new();
        let mut pos: FastMap<u32, usize> = FastMap::default();
        // Consecutive refs are mostly of one chunk: its position is remembered, so the
        // map is looked up once per change of chunk, not once per row.
        let mut last: Option<(u32, usize)> = None;
        let indices: Vec<(usize, usize)> = refs
            .iter()
            .map(|r| match r {
                None => (0, 0),
                Some((c, row)) => {
                    let p = match last {
                        Some((lc, lp)) if lc == *c => lp,
                        _ => {
                            let p = *pos.entry(*c).or_insert_with(|| {
                                order.push(*c);
                                order.len()
                            });
                            last = Some((*c, p));
                            p
                        }
                    };
                    (p, *row as usize)
                }
            })
            .collect();
        let batches: Vec<&RecordBatch> = order
            .iter()
            .map(|c| {
                state
                    .chunks
                    .get(c)
                    .ok_or_else(|| engine(format!("join state chunk {c} is gone")))
            })
            .collect::<Result<_>>()?;
        let n = self.spec(side).schema.fields().len();
        (0..n)
            .map(|j| {
                let mut arrays: Vec<&dyn Array> = vec![self.nulls[side][j].as_ref()];
                arrays.extend(batches.iter().map(|b| b.column(j).as_ref()));
                interleave(&arrays, &indices).map_err(engine)
            })
            .collect()
    }

    /// The columns of `side` for runs of rows (chunk, first row, length).
    fn gather_runs(&self, side: usize, runs: &[(u32, u32, u32)]) -> Result<Vec<ArrayRef>> {
        let state = &self.sides[side];
        let slices: Vec<RecordBatch> = runs
            .iter()
            .map(|(c, row, len)| {
                state
                    .chunks
                    .get(c)
                    .map(|b| b.slice(*row as usize, *len as usize))
                    .ok_or_else(|| engine(format!("join state chunk {c} is gone")))
            })
            .collect::<Result<_>>()?;
        let schema = &self.spec(side).schema;
        match slices.as_slice() {
            [one] => Ok(one.columns().to_vec()),
            many => Ok(concat_batches(schema, many)
                .map_err(engine)?
                .columns()
                .to_vec()),
        }
    }

    fn emit(&self, pairs: &[(Option<RowRef>, Option<RowRef>)]) -> Result<RecordBatch> {
        let schema = self.layout.output_schema.clone();
        if pairs.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let lrefs: Vec<Option<RowRef>> = pairs.iter().map(|p| p.0).collect();
        let rrefs: Vec<Option<RowRef>> = pairs.iter().map(|p| p.1).collect();
        let lcols = self.gather(LEFT, &lrefs)?;
        let rcols = self.gather(RIGHT, &rrefs)?;
        let mut cols = Vec::with_capacity(self.out_cols.len());
        for (oc, f) in self.out_cols.iter().zip(schema.fields()) {
            let to = |a: &ArrayRef| -> Result<ArrayRef> {
                if a.data_type() == f.data_type() {
                    Ok(a.clone())
                } else {
                    cast(a, f.data_type()).map_err(engine)
                }
            };
            cols.push(match oc {
                OutCol::Left(j) => to(&lcols[*j])?,
                OutCol::Right(j) => to(&rcols[*j])?,
                OutCol::Merged(lj, rj) => {
                    let (l, r) = (to(&lcols[*lj])?, to(&rcols[*rj])?);
                    let mask = is_not_null(&l).map_err(engine)?;
                    zip(&mask, &l, &r).map_err(engine)?
                }
            });
        }
        RecordBatch::try_new(schema, cols).map_err(engine)
    }

    /// Merges the live rows of a side into one chunk when dead rows dominate.
    fn compact(&mut self, side: usize) -> Result<()> {
        let state = &self.sides[side];
        let total = state.chunk_rows();
        if total <= 2 * state.rows + 4096 && state.chunks.len() <= 64 + state.rows / 64 {
            return Ok(());
        }
        let entries = state.entries_by_seq();
        let refs: Vec<Option<RowRef>> = entries.iter().map(|e| Some((e.chunk, e.row))).collect();
        let cols = self.gather(side, &refs)?;
        let batch = RecordBatch::try_new(self.spec(side).schema.clone(), cols).map_err(engine)?;
        self.sides[side].rechunk(batch);
        Ok(())
    }

    /// State rows (the snapshot's layout) of the given entries of each side, one batch
    /// per side (concatenated by the caller, once).
    fn state_rows(&self, entries: &[Vec<Entry>; 2]) -> Result<Vec<RecordBatch>> {
        let schema = self.snapshot_schema();
        let mut parts = Vec::new();
        for side in [LEFT, RIGHT] {
            let entries = &entries[side];
            let n = entries.len();
            let refs: Vec<Option<RowRef>> =
                entries.iter().map(|e| Some((e.chunk, e.row))).collect();
            let own = self.gather(side, &refs)?;
            let mut cols: Vec<ArrayRef> = vec![
                Arc::new(UInt8Array::from(vec![side as u8; n])),
                Arc::new(UInt64Array::from(
                    entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    entries.iter().map(|e| e.matched).collect::<Vec<_>>(),
                )),
                Arc::new(
                    entries
                        .iter()
                        .map(|e| e.updated_ms.get())
                        .collect::<Int64Array>(),
                ),
            ];
            for s in [LEFT, RIGHT] {
                if s == side {
                    cols.extend(own.iter().cloned());
                } else {
                    cols.extend(
                        self.spec(s)
                            .schema
                            .fields()
                            .iter()
                            .map(|f| new_null_array(f.data_type(), n)),
                    );
                }
            }
            parts.push(RecordBatch::try_new(schema.clone(), cols).map_err(engine)?);
        }
        Ok(parts)
    }

    fn snapshot_schema(&self) -> SchemaRef {
        let mut fields = vec![
            Field::new("__side", DataType::UInt8, false),
            Field::new("__seq", DataType::UInt64, false),
            Field::new("__matched", DataType::Boolean, false),
            Field::new(UPDATED_COLUMN, DataType::Int64, true),
        ];
        for (side, prefix) in [(LEFT, "l."), (RIGHT, "r.")] {
            for f in self.spec(side).schema.fields() {
                fields.push(Field::new(
                    format!("{prefix}{}", f.name()),
                    f.data_type().clone(),
                    true,
                ));
            }
        }
        Arc::new(Schema::new(fields))
    }
}

/// `refs` as runs of consecutive rows of one chunk (chunk, first row, length), when none
/// is `None` and the runs are long enough (64 rows on average) for slicing to beat
/// interleaving.
fn row_runs(refs: &[Option<RowRef>]) -> Option<Vec<(u32, u32, u32)>> {
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    for r in refs {
        let (chunk, row) = (*r)?;
        match runs.last_mut() {
            Some((c, first, len)) if *c == chunk && *first + *len == row => *len += 1,
            _ => {
                if runs.len() * 64 > refs.len() {
                    return None;
                }
                runs.push((chunk, row, 1));
            }
        }
    }
    Some(runs)
}

/// Compiles a join predicate over `left ++ right` columns (each column by its plain
/// name, the left one first when both sides have it, as in the batch join).
fn compile_joined_predicate(
    p: &Expr,
    left: &SchemaRef,
    right: &SchemaRef,
) -> Result<(Arc<dyn PhysicalExpr>, SchemaRef)> {
    let l = DFSchema::try_from_qualified_schema(QUALIFIERS[LEFT], left).map_err(engine)?;
    let r = DFSchema::try_from_qualified_schema(QUALIFIERS[RIGHT], right).map_err(engine)?;
    let mut both = l.clone();
    both.merge(&r);
    let both = Arc::new(both);
    let mut bindings: IndexMap<String, DfExpr> = IndexMap::new();
    for (q, s) in [(QUALIFIERS[LEFT], left), (QUALIFIERS[RIGHT], right)] {
        for f in s.fields() {
            bindings.entry(f.name().clone()).or_insert_with(|| {
                DfExpr::Column(Column::new(Some(TableReference::bare(q)), f.name()))
            });
        }
    }
    let scope = Scope::with_columns(both.clone(), bindings);
    let logical = compile_predicate(p, &scope)?;
    let state = crate::session::new_context().state();
    let physical = state.create_physical_expr(logical, &both).map_err(engine)?;
    let arrow_schema: SchemaRef = Arc::new(Schema::new(
        left.fields()
            .iter()
            .map(|f| f.as_ref().clone().with_name(format!("l.{}", f.name())))
            .chain(
                right
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone().with_name(format!("r.{}", f.name()))),
            )
            .collect::<Vec<Field>>(),
    ));
    Ok((physical, arrow_schema))
}

impl StatefulOperator for StreamJoinOperator {
    fn name(&self) -> &'static str {
        "symmetricHashJoin"
    }

    fn output_schema(&self) -> SchemaRef {
        self.layout.output_schema.clone()
    }

    fn process(&mut self, _input: &[RecordBatch], _ctx: &OpContext) -> Result<OpOutput> {
        Err(engine("a stream-stream join reads two inputs"))
    }

    fn process_pair(
        &mut self,
        left: &[RecordBatch],
        right: &[RecordBatch],
        ctx: &OpContext,
    ) -> Result<PairOutput> {
        // State TTL first: expired rows go silently, before the input meets the state.
        self.ttl_removed = 0;
        if let Some(ttl) = self.ttl {
            for side in [LEFT, RIGHT] {
                self.ttl_removed += self.sides[side].expire(&ttl, ctx.processing_time_ms) as u64;
            }
        }
        let before = (self.sides[LEFT].rows + self.sides[RIGHT].rows) as u64;
        let mut pairs = Vec::new();
        let (l, r) = if self.first_side() == LEFT {
            let l = self.run_side(LEFT, left, ctx, &mut pairs)?;
            (l, self.run_side(RIGHT, right, ctx, &mut pairs)?)
        } else {
            let r = self.run_side(RIGHT, right, ctx, &mut pairs)?;
            (self.run_side(LEFT, left, ctx, &mut pairs)?, r)
        };
        let (added_l, added_r) = (l.added, r.added);
        // 4. Eviction; unmatched rows of preserved sides are emitted.
        let mut removed = l.removed_other + r.removed_other;
        self.unique_released = removed + l.not_kept + r.not_kept;
        for side in [LEFT, RIGHT] {
            if let Some(th) = self.threshold_us(side, ctx) {
                // Only a preserved side's evicted entries are needed (its unmatched
                // rows are emitted); an inner side's are just dropped.
                let mut gone = Vec::new();
                let keep = self.preserved[side].then_some(&mut gone);
                removed += self.sides[side].evict(th, keep) as u64;
                if self.preserved[side] {
                    for e in gone.iter().filter(|e| !e.matched) {
                        let r = Some((e.chunk, e.row));
                        pairs.push(if side == LEFT { (r, None) } else { (None, r) });
                    }
                }
            }
        }
        let batch = self.emit(&pairs)?;
        for side in [LEFT, RIGHT] {
            self.sides[side].drop_dead_chunks();
            self.compact(side)?;
        }
        let total = (self.sides[LEFT].rows + self.sides[RIGHT].rows) as u64;
        debug_assert_eq!(before + added_l + added_r - removed, total);
        self.metrics = StateMetrics {
            rows_total: total,
            rows_updated: added_l + added_r,
            rows_removed: removed + self.ttl_removed,
            memory_bytes: self.sides[LEFT].memory_bytes() + self.sides[RIGHT].memory_bytes(),
        };
        Ok(PairOutput {
            rows: vec![batch],
            late: [l.late, r.late],
            late_count: [l.late_count, r.late_count],
            duplicates: [l.duplicates, r.duplicates],
        })
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        let entries = [LEFT, RIGHT].map(|side| self.sides[side].entries_by_seq());
        concat_batches(&self.snapshot_schema(), &self.state_rows(&entries)?).map_err(engine)
    }

    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        Some(&["__side", "__seq"])
    }

    /// The entries added since the last call, the older ones whose `matched` or update
    /// time changed, and (as `__removed` rows, one per run of consecutive `seq`s) the
    /// older ones that left.
    fn changes(&mut self) -> Result<Option<RecordBatch>> {
        let [(left, left_gone), (right, right_gone)] =
            [LEFT, RIGHT].map(|side| self.sides[side].take_changes());
        let parts = self.state_rows(&[left, right])?;
        // Rows leave in about arrival order: runs of consecutive `seq`s, one row each.
        let (mut sides, mut first, mut through) = (Vec::new(), Vec::new(), Vec::new());
        for (side, mut gone) in [(LEFT, left_gone), (RIGHT, right_gone)] {
            gone.sort_unstable();
            for run in gone.chunk_by(|a, b| *a + 1 == *b) {
                sides.push(side as u8);
                first.push(run[0]);
                through.push(run[run.len() - 1]);
            }
        }
        let gone = super::checkpoint::removed_runs(
            &self.snapshot_schema(),
            vec![("__side", Arc::new(UInt8Array::from(sides)) as ArrayRef)],
            "__seq",
            UInt64Array::from(first),
            UInt64Array::from(through),
        )?;
        Ok(Some(super::checkpoint::changes_batch(&parts, &gone)?))
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        let bad = |m: &str| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!("stream join state is malformed: {m}"),
            )
        };
        let col = |name: &str| {
            state
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(&format!("no column `{name}`")))
        };
        let sides = col("__side")?;
        let sides = sides
            .as_any()
            .downcast_ref::<UInt8Array>()
            .ok_or_else(|| bad("__side"))?
            .clone();
        let seqs = col("__seq")?;
        let seqs = seqs
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| bad("__seq"))?
            .clone();
        let matched = col("__matched")?;
        let matched = matched
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| bad("__matched"))?
            .clone();
        // Written since state TTL exists; older snapshots have no update times.
        let updated = state
            .column_by_name(UPDATED_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>().cloned())
            .unwrap_or_else(|| Int64Array::from(vec![None; state.num_rows()]));
        self.sides = [
            SideState::new(self.hasher.clone()),
            SideState::new(self.hasher.clone()),
        ];
        for (side, prefix) in [(LEFT, "l."), (RIGHT, "r.")] {
            let mask = BooleanArray::from(
                (0..state.num_rows())
                    .map(|i| sides.value(i) as usize == side)
                    .collect::<Vec<_>>(),
            );
            let schema = self.spec(side).schema.clone();
            let cols = schema
                .fields()
                .iter()
                .map(|f| {
                    let c = col(&format!("{prefix}{}", f.name()))?;
                    let c = arrow::compute::filter(&c, &mask).map_err(engine)?;
                    if c.data_type() == f.data_type() {
                        Ok(c)
                    } else {
                        cast(&c, f.data_type()).map_err(engine)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let batch = RecordBatch::try_new(schema.clone(), cols.clone())
                .or_else(|_| RecordBatch::try_new(relaxed(&schema), cols))
                .map_err(engine)?;
            let side_seqs = arrow::compute::filter(&seqs, &mask).map_err(engine)?;
            let side_seqs = side_seqs
                .as_any()
                .downcast_ref::<UInt64Array>()
                .expect("u64")
                .clone();
            let side_matched = arrow::compute::filter(&matched, &mask).map_err(engine)?;
            let side_matched = side_matched
                .as_any()
                .downcast_ref::<BooleanArray>()
                .expect("bool")
                .clone();
            let side_updated = arrow::compute::filter(&updated, &mask).map_err(engine)?;
            let side_updated = side_updated
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("i64")
                .clone();
            if batch.num_rows() == 0 {
                continue;
            }
            // Snapshots and merged changes are written in arrival order, which the
            // state keeps.
            if side_seqs.values().windows(2).any(|w| w[0] >= w[1]) {
                return Err(bad("the rows of a side are not in `__seq` order"));
            }
            let (rows, _) = self.key_rows(side, &batch)?;
            let range = Self::times(&batch, self.range_column(side))?;
            let evict_col = self.evictions[side].as_ref().map(|e| e.column.clone());
            let evict_times = Self::times(&batch, evict_col.as_deref())?;
            let st = &mut self.sides[side];
            let chunk = st.add_chunk(batch);
            for i in 0..side_seqs.len() {
                // The arrival order of the snapshot is kept.
                st.insert_at(
                    side_seqs.value(i),
                    rows.row(i).as_ref(),
                    Entry {
                        seq: 0,
                        chunk,
                        row: i as u32,
                        range_time: range[i].into(),
                        evict_time: evict_times[i].into(),
                        matched: side_matched.value(i),
                        updated_ms: side_updated
                            .is_valid(i)
                            .then(|| side_updated.value(i))
                            .into(),
                    },
                );
            }
        }
        // What was restored is checkpointed: the changelog starts here.
        for st in self.sides.iter_mut() {
            st.mark_checkpointed();
        }
        Ok(())
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    /// Buffered rows of both sides expire when neither arrival nor a match touched them
    /// for `ttl` of processing time (for joins whose state no watermark bounds). They go
    /// silently: an expired outer-side row is not emitted.
    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        self.ttl = Some(StateTtl::new(ttl)?);
        Ok(())
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        let mut m = Vec::new();
        if self.ttl.is_some() {
            m.push((ROWS_REMOVED_BY_TTL, self.ttl_removed));
        }
        if self.unique.contains(&true) {
            m.push((ROWS_RELEASED_BY_UNIQUE_KEY, self.unique_released));
        }
        m
    }

    /// Spark's `shouldRunAnotherBatch`: a watermark advance matters when some side's
    /// state is evicted by it.
    fn needs_no_data_batch(&self, _mode: etlantic_core::streaming::OutputMode) -> bool {
        self.evictions.iter().any(Option::is_some)
    }
}

// ---------------------------------------------------------------------------------------
// Building the unit, and running it in a micro-batch.

/// One input of a join step as the program builder sees it.
pub struct JoinInput<'a> {
    /// The relation read.
    pub relation: &'a str,
    /// The sources feeding it.
    pub sources: Vec<String>,
    /// Event-time columns it carries (see [`etlantic_core::ir::lineage`]).
    pub event_columns: Vec<String>,
    /// Whether its rows are unique on the join keys (see [`etlantic_core::ir::keys`]).
    pub unique_on_keys: bool,
}

/// Builds the stateful unit of a stream-stream join step.
pub fn join_unit(
    unit_id: String,
    step: &ActionNode,
    left: JoinInput<'_>,
    right: JoinInput<'_>,
    schemas: &HashMap<String, SchemaRef>,
    parameters: &IndexMap<String, Value>,
    sources: &HashMap<String, SourceInfo>,
) -> Result<StatefulUnit> {
    let Action::Join {
        join_type,
        left_keys,
        right_keys,
        predicate,
        null_safe,
        time_range,
        ..
    } = &step.op
    else {
        return Err(engine("internal: not a join"));
    };
    let schema_of = |rel: &str| {
        schemas.get(rel).cloned().ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!("unknown relation `{rel}` in a streaming join"),
            )
        })
    };
    let output_schema = super::stateless::step_schema(step, schemas, parameters)?;
    let side = |input: &JoinInput<'_>, keys: &Vec<String>| -> Result<(JoinSideSpec, LatePolicy)> {
        let schema = schema_of(input.relation)?;
        let infos: Vec<&SourceInfo> = input
            .sources
            .iter()
            .filter_map(|s| sources.get(s))
            .collect();
        let watermarked: Vec<&String> =
            infos.iter().filter_map(|i| i.event_time.as_ref()).collect();
        let present: Vec<String> = input
            .event_columns
            .iter()
            .filter(|c| schema.field_with_name(c).is_ok())
            .cloned()
            .collect();
        let watermark_column = etlantic_core::ir::lineage::watermark_column(&present)
            .filter(|_| !watermarked.is_empty())
            .cloned();
        let late = infos.first().map(|i| i.late.clone()).unwrap_or_default();
        Ok((
            JoinSideSpec {
                schema,
                keys: keys.clone(),
                watermark_column,
                accept_late: late == LatePolicy::Accept,
                unique: input.unique_on_keys,
            },
            late,
        ))
    };
    let (lspec, llate) = side(&left, left_keys)?;
    let (rspec, rlate) = side(&right, right_keys)?;
    let watermarked = lspec.watermark_column.is_some() || rspec.watermark_column.is_some();
    let predicate = predicate
        .as_ref()
        .map(|p| {
            p.bind_parameters(parameters)
                .map_err(|m| Error::new(&codes::UNKNOWN_PARAMETER, m))
        })
        .transpose()?;
    let op = StreamJoinOperator::new(JoinLayout {
        join_type: *join_type,
        left: lspec,
        right: rspec,
        time_range: time_range.clone(),
        predicate,
        null_safe: *null_safe,
        output_schema,
    })?;
    let any_source_watermarked = left
        .sources
        .iter()
        .chain(&right.sources)
        .any(|s| sources.get(s).is_some_and(|i| i.event_time.is_some()));
    Ok(StatefulUnit {
        id: unit_id,
        step: step.clone(),
        op: Box::new(op),
        prepare: vec![],
        late_policy: llate,
        sources: left.sources.clone(),
        watermarked: watermarked || any_source_watermarked,
        // The plan refuses a stream-stream join of a join's output, the one input whose
        // event time would lag the watermark.
        watermark_lag_us: 0,
        inner: false,
        prepared: Default::default(),
        changes_since_whole: 0,
        secondary: Some(SecondaryInput {
            relation: right.relation.to_string(),
            late_policy: rlate,
            sources: right.sources.clone(),
        }),
    })
}

/// What a two-input unit produced in a micro-batch.
pub struct PairRun {
    /// The output relation.
    pub output: Table,
    /// Late rows to route: (policy, rows, sources).
    pub late_routes: Vec<(LatePolicy, RecordBatch, String)>,
    /// Late rows in all.
    pub late_count: u64,
    /// Rows rejected for repeating a key their side declares unique.
    pub duplicates: Vec<DuplicateRows>,
    /// The operator's progress entry.
    pub progress: StateProgress,
}

/// Rows of one side of a stream-stream join that repeat a key the side declares unique
/// (see [`JoinSideSpec::unique`]): the runtime quarantines them (`ETL704`).
pub struct DuplicateRows {
    /// The rows, as they entered the join.
    pub rows: RecordBatch,
    /// The sources feeding the side (comma-separated).
    pub sources: String,
    /// The side's join keys.
    pub keys: Vec<String>,
}

/// Runs a two-input unit (a stream-stream join) on the relations of a micro-batch.
pub fn run_pair_unit(
    s: &mut StatefulUnit,
    local: &HashMap<String, Table>,
    ctx: &OpContext,
) -> Result<PairRun> {
    let sec = s
        .secondary
        .as_ref()
        .ok_or_else(|| engine("internal: not a two-input unit"))?;
    let get = |rel: &str| {
        local
            .get(rel)
            .cloned()
            .ok_or_else(|| Error::new(&codes::PLAN_INVALID, format!("unknown relation `{rel}`")))
    };
    let left = get(&s.step.target)?;
    let right = get(&sec.relation)?;
    let started = Instant::now();
    let out = s.op.process_pair(&left.batches, &right.batches, ctx)?;
    let mut late_routes = Vec::new();
    let [late_l, late_r] = out.late;
    if let Some(l) = late_l {
        late_routes.push((s.late_policy.clone(), l, s.sources.join(",")));
    }
    if let Some(r) = late_r {
        late_routes.push((sec.late_policy.clone(), r, sec.sources.join(",")));
    }
    let late_count = out.late_count[0] + out.late_count[1];
    let keys = match &s.step.op {
        Action::Join {
            left_keys,
            right_keys,
            ..
        } => [left_keys.clone(), right_keys.clone()],
        _ => Default::default(),
    };
    let sources = [s.sources.join(","), sec.sources.join(",")];
    let duplicates = out
        .duplicates
        .into_iter()
        .zip(keys.into_iter().zip(sources))
        .filter_map(|(rows, (keys, sources))| {
            rows.map(|rows| DuplicateRows {
                rows,
                sources,
                keys,
            })
        })
        .collect();
    Ok(PairRun {
        output: Table::new(s.op.output_schema(), out.rows),
        late_routes,
        late_count,
        duplicates,
        progress: StateProgress {
            operator_name: s.op.name().to_string(),
            id: s.id.clone(),
            metrics: s.op.metrics(),
            dropped_by_watermark: late_count,
            time_ms: started.elapsed().as_millis() as u64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::TimeUnit;
    use etlantic_core::streaming::{Duration, OutputMode};

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    }

    fn side(key: &str, time: &str, wm: bool) -> JoinSideSpec {
        JoinSideSpec {
            schema: Arc::new(Schema::new(vec![
                Field::new(key, DataType::Utf8, true),
                Field::new(time, ts(), true),
            ])),
            keys: vec![key.into()],
            watermark_column: wm.then(|| time.to_string()),
            accept_late: false,
            unique: false,
        }
    }

    fn layout(join_type: JoinType, lwm: bool, rwm: bool, range: bool) -> JoinLayout {
        let (left, right) = (side("ad", "it", lwm), side("cad", "ct", rwm));
        let output_schema = Arc::new(Schema::new(
            left.schema
                .fields()
                .iter()
                .chain(right.schema.fields())
                .map(|f| f.as_ref().clone())
                .collect::<Vec<_>>(),
        ));
        JoinLayout {
            join_type,
            left,
            right,
            time_range: range.then(|| JoinTimeRange {
                left: "it".into(),
                right: "ct".into(),
                lower: Duration::from_secs(20),
                upper: Duration::from_secs(5),
            }),
            predicate: None,
            null_safe: false,
            output_schema,
        }
    }

    fn batch(spec: &JoinSideSpec, rows: &[(&str, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            spec.schema.clone(),
            vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| Some(r.0)).collect::<Vec<_>>(),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from(
                        rows.iter().map(|r| r.1 * 1_000_000).collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap()
    }

    fn ctx(wm_secs: i64) -> OpContext {
        OpContext {
            late_watermark_us: wm_secs * 1_000_000,
            evict_watermark_us: wm_secs * 1_000_000,
            has_watermark: true,
            output_mode: OutputMode::Append,
            accept_late: false,
            processing_time_ms: 0,
        }
    }

    #[test]
    fn state_watermarks_are_derived_like_spark() {
        let e = state_evictions(&layout(JoinType::Inner, true, true, true));
        assert_eq!(
            e,
            [
                Some(Eviction {
                    column: "it".into(),
                    offset_ms: -20_001
                }),
                Some(Eviction {
                    column: "ct".into(),
                    offset_ms: -5_001
                }),
            ]
        );
        // One side without a watermark: the range cannot bound either side.
        assert_eq!(
            state_evictions(&layout(JoinType::Left, false, true, true)),
            [None, None]
        );
        assert_eq!(
            state_evictions(&layout(JoinType::Inner, true, true, false)),
            [None, None]
        );
        // A watermarked time among the keys evicts both sides by that key.
        let mut l = layout(JoinType::Left, true, false, false);
        l.left.keys.push("it".into());
        l.right.keys.push("ct".into());
        let e = state_evictions(&l);
        assert_eq!(e[0].as_ref().unwrap().column, "it");
        assert_eq!(e[1].as_ref().unwrap().column, "ct");
        assert_eq!(e[1].as_ref().unwrap().offset_ms, 0);
    }

    #[test]
    fn a_restored_snapshot_behaves_like_the_original() {
        let l = layout(JoinType::Full, true, true, true);
        let mut a = StreamJoinOperator::new(l.clone()).unwrap();
        let left = [batch(&l.left, &[("a", 100), ("b", 101), ("c", 102)])];
        let right = [batch(&l.right, &[("a", 105), ("z", 90)])];
        let out = a.process_pair(&left, &right, &ctx(0)).unwrap();
        assert_eq!(out.rows[0].num_rows(), 1);
        let snap = a.snapshot().unwrap();
        assert_eq!(snap.num_rows(), 5);
        let mut b = StreamJoinOperator::new(l.clone()).unwrap();
        b.restore(&snap).unwrap();
        assert_eq!(b.snapshot().unwrap(), snap);
        // The same next micro-batch on both: the watermark evicts everything.
        let next_l = [batch(&l.left, &[("b", 500)])];
        let next_r = [batch(&l.right, &[("c", 500)])];
        let oa = a.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
        let ob = b.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
        assert_eq!(oa.rows, ob.rows);
        // b and c of the left, z of the right, never matched: 3 outer rows.
        assert_eq!(oa.rows[0].num_rows(), 3);
        assert_eq!(a.metrics().rows_total, 2);
        assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
    }

    #[test]
    fn compaction_keeps_the_live_rows() {
        let l = layout(JoinType::Inner, true, true, true);
        let mut op = StreamJoinOperator::new(l.clone()).unwrap();
        let rows: Vec<(String, i64)> = (0..10_000)
            .map(|i| (format!("k{i}"), if i % 10 == 0 { 1_000 } else { 100 }))
            .collect();
        let refs: Vec<(&str, i64)> = rows.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        op.process_pair(&[batch(&l.left, &refs)], &[], &ctx(0))
            .unwrap();
        assert_eq!(op.metrics().rows_total, 10_000);
        // Watermark 500 s: the 9 000 rows at 100 s go; the chunk is rewritten.
        op.process_pair(&[], &[], &ctx(500)).unwrap();
        assert_eq!(op.metrics().rows_total, 1_000);
        assert_eq!(op.sides[LEFT].chunk_rows(), 1_000);
        // A compacted row still matches.
        let out = op
            .process_pair(&[], &[batch(&l.right, &[("k9990", 1_002)])], &ctx(500))
            .unwrap();
        assert_eq!(out.rows[0].num_rows(), 1);
        let snap = op.snapshot().unwrap();
        assert_eq!(snap.num_rows(), 1_001);
    }

    /// The rows of `batches` as sorted strings (order-free comparison).
    fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
        let mut out: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                (0..b.num_rows()).map(move |i| {
                    b.columns()
                        .iter()
                        .map(|c| arrow::util::display::array_value_to_string(c, i).unwrap())
                        .collect::<Vec<_>>()
                        .join("|")
                })
            })
            .collect();
        out.sort();
        out
    }

    /// A right side with one row per key, arriving at batch `key` (13 keys); left rows
    /// of every key in every batch, some before and some after their right row.
    fn left_rows(b: i64) -> Vec<(String, i64)> {
        (0..6)
            .map(|j| (format!("k{}", (b * 7 + j) % 13), b * 10 + j))
            .collect()
    }

    fn right_rows(b: i64) -> Vec<(String, i64)> {
        if b < 13 {
            vec![(format!("k{b}"), b * 10)]
        } else {
            vec![]
        }
    }

    fn as_refs(rows: &[(String, i64)]) -> Vec<(&str, i64)> {
        rows.iter().map(|(k, t)| (k.as_str(), *t)).collect()
    }

    /// A side declared unique on its join keys changes how much state the join keeps,
    /// never what it outputs: the same batches through the join with and without the
    /// declaration give the same rows, and with it the left side holds no row that met
    /// its right row (an inner join keeps none of those; a left outer join keeps only
    /// unmatched ones, for their null-padded row at eviction).
    #[test]
    fn a_unique_side_changes_the_state_not_the_output() {
        for join_type in [JoinType::Inner, JoinType::Left, JoinType::Full] {
            let plain = layout(join_type, true, true, true);
            let mut unique = plain.clone();
            unique.right.unique = true;
            let mut a = StreamJoinOperator::new(plain.clone()).unwrap();
            let mut b = StreamJoinOperator::new(unique).unwrap();
            let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
            let (mut held_a, mut held_b, mut matched_a) = (0, 0, 0);
            for batch_no in 0..25 {
                let l = [batch(&plain.left, &as_refs(&left_rows(batch_no)))];
                let r = [batch(&plain.right, &as_refs(&right_rows(batch_no)))];
                let c = ctx(batch_no * 10 - 30);
                out_a.extend(a.process_pair(&l, &r, &c).unwrap().rows);
                let ob = b.process_pair(&l, &r, &c).unwrap();
                assert!(ob.duplicates.iter().all(Option::is_none));
                out_b.extend(ob.rows);
                held_a += a.sides[LEFT].rows;
                held_b += b.sides[LEFT].rows;
                matched_a += a.sides[LEFT]
                    .entries_by_seq()
                    .iter()
                    .filter(|e| e.matched)
                    .count();
                // Every left row still held by `b` is one that has not met its right row.
                for e in b.sides[LEFT].entries_by_seq() {
                    assert!(!e.matched, "{join_type:?}: a matched left row is held");
                }
            }
            assert_eq!(sorted_rows(&out_a), sorted_rows(&out_b), "{join_type:?}");
            assert!(!out_a.iter().all(|b| b.num_rows() == 0));
            if join_type == JoinType::Inner {
                // The left side is not preserved, so its held rows are not marked when
                // they match (see the next test): the declaration must still save state.
                assert!(held_b < held_a, "{join_type:?}: {held_b} vs {held_a}");
            } else {
                // Without the declaration the matched rows wait for their eviction.
                assert!(matched_a > 0, "{join_type:?}");
                assert!(
                    held_b <= held_a - matched_a,
                    "{join_type:?}: {held_b} left rows held over the batches, {held_a} \
                     ({matched_a} matched) without the key"
                );
            }
        }
    }

    /// Only a preserved side's `matched` mark is ever read, so only there does a match
    /// change a held row, which the next checkpoint then writes again: in an inner join
    /// the changes after a match are the new rows alone.
    #[test]
    fn a_match_changes_a_held_row_only_on_a_preserved_side() {
        for (join_type, rewritten) in [(JoinType::Inner, 0), (JoinType::Left, 2)] {
            let l = layout(join_type, true, true, true);
            let mut op = StreamJoinOperator::new(l.clone()).unwrap();
            let left = [batch(&l.left, &[("a", 100), ("b", 101), ("c", 102)])];
            op.process_pair(&left, &[], &ctx(0)).unwrap();
            assert_eq!(op.changes().unwrap().unwrap().num_rows(), 3);
            let right = [batch(&l.right, &[("a", 103), ("b", 103)])];
            let out = op.process_pair(&[], &right, &ctx(0)).unwrap();
            assert_eq!(out.rows[0].num_rows(), 2, "{join_type:?}");
            let changes = op.changes().unwrap().unwrap();
            let sides = changes
                .column_by_name("__side")
                .unwrap()
                .as_primitive::<arrow::datatypes::UInt8Type>();
            let count = |side: usize| sides.iter().filter(|s| *s == Some(side as u8)).count();
            assert_eq!(count(RIGHT), 2, "{join_type:?}: the new right rows");
            assert_eq!(count(LEFT), rewritten, "{join_type:?}: left rows rewritten");
        }
    }

    /// A row repeating a unique key the join still holds is rejected and joins nothing,
    /// as is the second of two rows of one key in a batch.
    #[test]
    fn a_repeated_unique_key_is_rejected() {
        let mut l = layout(JoinType::Inner, true, true, true);
        l.right.unique = true;
        let mut op = StreamJoinOperator::new(l.clone()).unwrap();
        let out = op
            .process_pair(
                &[batch(&l.left, &[("a", 100)])],
                &[batch(&l.right, &[("a", 100), ("b", 100), ("a", 101)])],
                &ctx(0),
            )
            .unwrap();
        assert_eq!(
            out.rows[0].num_rows(),
            1,
            "the left row meets the first `a`"
        );
        let dup = out.duplicates[RIGHT].as_ref().expect("the second `a`");
        assert_eq!(sorted_rows(std::slice::from_ref(dup)).len(), 1);
        assert!(out.duplicates[LEFT].is_none());
        // `b` is held: its repeat in a later batch is rejected too, and its left row
        // meets the first `b` only.
        let out = op
            .process_pair(
                &[batch(&l.left, &[("b", 102)])],
                &[batch(&l.right, &[("b", 103)])],
                &ctx(0),
            )
            .unwrap();
        assert_eq!(out.rows[0].num_rows(), 1);
        let rows = sorted_rows(&out.rows);
        assert!(rows[0].ends_with("1970-01-01T00:01:40Z"), "{rows:?}");
        assert_eq!(
            out.duplicates[RIGHT].as_ref().map(RecordBatch::num_rows),
            Some(1)
        );
        // Without the declaration, both rows of a key join.
        let plain = layout(JoinType::Inner, true, true, true);
        let mut op = StreamJoinOperator::new(plain.clone()).unwrap();
        let out = op
            .process_pair(
                &[batch(&plain.left, &[("a", 100)])],
                &[batch(&plain.right, &[("a", 100), ("a", 101)])],
                &ctx(0),
            )
            .unwrap();
        assert_eq!(out.rows[0].num_rows(), 2);
        assert!(out.duplicates.iter().all(Option::is_none));
    }
}
