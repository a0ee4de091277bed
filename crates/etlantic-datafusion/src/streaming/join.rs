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

use super::operators::{
    micros, OpContext, OpOutput, PairOutput, StateMetrics, StateStore, StatefulOperator,
};
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

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{Expr, JoinTimeRange, JoinType};

use indexmap::IndexMap;

use std::sync::Arc;

mod matching;
mod state;
mod stored;
use matching::compile_joined_predicate;
use state::{Entry, FastMap, OptTime, SideState};

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
        .map_err(Error::engine)
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
    /// The state store holding both sides' rows, when the profile gives one: `sides`
    /// then hold a micro-batch's working set only (see [`stored`]).
    stored: Option<stored::StoredSides>,
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
            return Err(Error::engine(
                "a join needs as many right keys as left keys",
            ));
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
        .map_err(Error::engine)?;
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
                let rj = r.schema.index_of(f.name()).map_err(Error::engine)?;
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
            return Err(Error::engine(format!(
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
            stored: None,
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
                .ok_or_else(|| Error::engine(format!("missing join key {k}")))?;
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
                .ok_or_else(|| Error::engine(format!("missing join key {k}")))?;
            cols.push(if c.data_type() == t {
                c.clone()
            } else {
                cast(c, t).map_err(Error::engine)?
            });
        }
        let rows = self
            .converter
            .convert_columns(&cols)
            .map_err(Error::engine)?;
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
                    .ok_or_else(|| Error::engine(format!("missing time column {c}")))?;
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
        let batch =
            RecordBatch::try_new(self.spec(side).schema.clone(), cols).map_err(Error::engine)?;
        self.sides[side].rechunk(batch);
        Ok(())
    }

    /// State rows (the snapshot's layout) of the given entries of each side, one batch
    /// per side (concatenated by the caller, once).
    fn state_rows(&self, entries: &[Vec<Entry>; 2]) -> Result<Vec<RecordBatch>> {
        [LEFT, RIGHT]
            .into_iter()
            .map(|side| {
                let refs: Vec<Option<RowRef>> = entries[side]
                    .iter()
                    .map(|e| Some((e.chunk, e.row)))
                    .collect();
                let own = self.gather(side, &refs)?;
                self.side_state_rows(side, &entries[side], own)
            })
            .collect()
    }

    /// State rows (the snapshot's layout) of `entries` of `side`, whose columns are `own`.
    fn side_state_rows(
        &self,
        side: usize,
        entries: &[Entry],
        own: Vec<ArrayRef>,
    ) -> Result<RecordBatch> {
        let n = entries.len();
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
        let mut own = Some(own);
        for s in [LEFT, RIGHT] {
            if s == side {
                cols.extend(own.take().unwrap_or_default());
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
        RecordBatch::try_new(self.snapshot_schema(), cols).map_err(Error::engine)
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

impl StatefulOperator for StreamJoinOperator {
    fn name(&self) -> &'static str {
        "symmetricHashJoin"
    }

    fn output_schema(&self) -> SchemaRef {
        self.layout.output_schema.clone()
    }

    fn process(&mut self, _input: &[RecordBatch], _ctx: &OpContext) -> Result<OpOutput> {
        Err(Error::engine("a stream-stream join reads two inputs"))
    }

    fn process_pair(
        &mut self,
        left: &[RecordBatch],
        right: &[RecordBatch],
        ctx: &OpContext,
    ) -> Result<PairOutput> {
        // On a state store, the rows this micro-batch can touch come into memory.
        self.load_working_set([left, right], ctx)?;
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
        let in_memory = (self.sides[LEFT].rows + self.sides[RIGHT].rows) as u64;
        debug_assert_eq!(before + added_l + added_r - removed, in_memory);
        let (total, memory_bytes) = match self.stored.is_some() {
            true => {
                self.write_back()?;
                let stored = self.stored.as_ref().expect("checked above");
                (stored.count()?, stored.store.memory_bytes())
            }
            false => {
                for side in [LEFT, RIGHT] {
                    self.sides[side].drop_dead_chunks();
                    self.compact(side)?;
                }
                let bytes = self.sides[LEFT].memory_bytes() + self.sides[RIGHT].memory_bytes();
                (in_memory, bytes)
            }
        };
        self.metrics = StateMetrics {
            rows_total: total,
            rows_updated: added_l + added_r,
            rows_removed: removed + self.ttl_removed,
            memory_bytes,
        };
        Ok(PairOutput {
            rows: vec![batch],
            late: [l.late, r.late],
            late_count: [l.late_count, r.late_count],
            duplicates: [l.duplicates, r.duplicates],
        })
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        let parts = if self.stored.is_some() {
            [LEFT, RIGHT]
                .into_iter()
                .map(|side| {
                    let (entries, own) = self.stored_side(side)?;
                    self.side_state_rows(side, &entries, own)
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            let entries = [LEFT, RIGHT].map(|side| self.sides[side].entries_by_seq());
            self.state_rows(&entries)?
        };
        concat_batches(&self.snapshot_schema(), &parts).map_err(Error::engine)
    }

    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        Some(&["__side", "__seq"])
    }

    /// The entries added since the last call, the older ones whose `matched` or update
    /// time changed, and (as `__removed` rows, one per run of consecutive `seq`s) the
    /// older ones that left.
    fn changes(&mut self) -> Result<Option<RecordBatch>> {
        if self.stored.is_some() {
            return Ok(None);
        }
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
        let gone = etlantic_runtime::checkpoint::removed_runs(
            &self.snapshot_schema(),
            vec![("__side", Arc::new(UInt8Array::from(sides)) as ArrayRef)],
            "__seq",
            UInt64Array::from(first),
            UInt64Array::from(through),
        )?;
        Ok(Some(etlantic_runtime::checkpoint::changes_batch(
            &parts, &gone,
        )?))
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
                    let c = arrow::compute::filter(&c, &mask).map_err(Error::engine)?;
                    if c.data_type() == f.data_type() {
                        Ok(c)
                    } else {
                        cast(&c, f.data_type()).map_err(Error::engine)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let batch = RecordBatch::try_new(schema.clone(), cols.clone())
                .or_else(|_| RecordBatch::try_new(relaxed(&schema), cols))
                .map_err(Error::engine)?;
            let side_seqs = arrow::compute::filter(&seqs, &mask).map_err(Error::engine)?;
            let side_seqs = side_seqs
                .as_any()
                .downcast_ref::<UInt64Array>()
                .expect("u64")
                .clone();
            let side_matched = arrow::compute::filter(&matched, &mask).map_err(Error::engine)?;
            let side_matched = side_matched
                .as_any()
                .downcast_ref::<BooleanArray>()
                .expect("bool")
                .clone();
            let side_updated = arrow::compute::filter(&updated, &mask).map_err(Error::engine)?;
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
        self.replace_stored()
    }

    fn use_store(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        self.use_stored(store)
    }

    fn store(&mut self) -> Option<&mut dyn StateStore> {
        self.stored
            .as_mut()
            .map(|s| s.store.as_mut() as &mut dyn StateStore)
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

#[cfg(test)]
mod tests;
