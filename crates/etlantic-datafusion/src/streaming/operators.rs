//! Stateful streaming operators: event-time window aggregation (tumbling, sliding,
//! session), plain group-by aggregation, and deduplication (with and within the
//! watermark). They keep Spark Structured Streaming's semantics:
//!
//! - late input is judged against the watermark of the *previous* micro-batch, state is
//!   evicted and emitted with the *current* one (equal when no-data batches run);
//! - a row is late for a window when `window_end <= watermark`; for dedup when
//!   `event_time <= watermark`;
//! - append mode emits a window once, when the watermark passes its end; update mode
//!   emits the windows changed in the batch; complete mode emits the whole table,
//!   never evicts, keeps late rows (except for session windows, which Spark filters in
//!   every mode) and needs no no-data batches;
//! - `null` is an ordinary group key; rows with a null event time are ignored by window
//!   aggregations.
//!
//! Every operator snapshots its whole state as one Arrow record batch per version.

use super::accumulators::{Acc, Accumulators, AggSpec};
use super::groups::{Bucket, GroupRef, GroupStore};
use super::ttl::{StateTtl, ROWS_REMOVED_BY_TTL, UPDATED_COLUMN};
use arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use arrow::compute::{cast, filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::logical_expr::EmitTo;
use datafusion::physical_plan::aggregates::group_values::{new_group_values, GroupValues};
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::streaming::OutputMode;
/// State maps are keyed by row-encoded group keys on the hot path of every micro-batch:
/// foldhash is several times faster than the default SipHash there (no `HashDoS` exposure:
/// its seed is random per process).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

/// Watermarks and mode for one micro-batch.
#[derive(Clone, Copy, Debug)]
pub struct OpContext {
    /// Late input rows are judged against this watermark (µs since the epoch).
    pub late_watermark_us: i64,
    /// State is evicted and emitted with this watermark (µs since the epoch).
    pub evict_watermark_us: i64,
    /// Whether the operator's input has a watermark at all.
    pub has_watermark: bool,
    /// The output mode of the query.
    pub output_mode: OutputMode,
    /// Process late rows as if on time (late policy `accept`).
    pub accept_late: bool,
    /// The micro-batch's processing time: its batch timestamp from the write-ahead log
    /// (epoch ms), the same when the batch is replayed. State TTL and processing-time
    /// timers follow it.
    pub processing_time_ms: i64,
}

/// What an operator produced for one micro-batch.
#[derive(Debug, Default)]
pub struct OpOutput {
    /// Rows for the next step.
    pub rows: Vec<RecordBatch>,
    /// Input rows that were late (not processed unless `accept_late`).
    pub late: Option<RecordBatch>,
    /// Number of late input rows.
    pub late_count: u64,
    /// Where the late rows are in the input: (index of the input batch, rows), so the
    /// runtime can route the rows as they were before the operator's input preparation.
    pub late_index: Vec<(usize, Vec<u32>)>,
}

/// What a two-input operator (a stream-stream join) produced for one micro-batch.
#[derive(Debug, Default)]
pub struct PairOutput {
    /// Rows for the next step.
    pub rows: Vec<RecordBatch>,
    /// Late rows of the left and the right input, as they entered the operator.
    pub late: [Option<RecordBatch>; 2],
    /// Number of late rows of each input.
    pub late_count: [u64; 2],
    /// Rows of each input rejected for repeating a key that input declares unique
    /// (while the operator still held the first row of that key), as they entered it.
    pub duplicates: [Option<RecordBatch>; 2],
}

/// State size metrics (Spark's `stateOperators[]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateMetrics {
    /// Rows in the state after the batch.
    pub rows_total: u64,
    /// Rows added or changed in the batch.
    pub rows_updated: u64,
    /// Rows evicted in the batch.
    pub rows_removed: u64,
    /// Approximate bytes held.
    pub memory_bytes: u64,
}

/// The state a snapshot holds is damaged or of another shape than the operator's
/// (`ETL801`).
pub(crate) fn corrupt_state(operator: &str, message: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("the {operator} state in the checkpoint does not fit the query: {message}"),
    )
    .with_help("the checkpoint was written by another query or is damaged: restore it from a backup, or start the query on a new checkpoint")
}

/// The column `name` of a state snapshot as an array of type `T`, or `ETL801` when it is
/// missing or of another type (a snapshot is read from disk: never trusted to fit).
pub(crate) fn state_column<T: Array + Clone + 'static>(
    state: &RecordBatch,
    name: &str,
    operator: &str,
) -> Result<T> {
    let col = state
        .column_by_name(name)
        .ok_or_else(|| corrupt_state(operator, format!("no column `{name}`")))?;
    col.as_any()
        .downcast_ref::<T>()
        .cloned()
        .ok_or_else(|| corrupt_state(operator, format!("column `{name}` is {}", col.data_type())))
}

/// A stateful operator of the streaming runtime.
///
/// # Invariants an implementer must keep
/// - `restore` never panics on what it reads: a snapshot is read from disk, and a missing
///   column or one of another type is `ETL801` ([`state_column`] helps).
/// - `process` is deterministic: the same input, watermarks and prior state give the same
///   output and the same new state (micro-batches are replayed after a failure).
/// - `snapshot` captures everything `process` depends on; `restore(snapshot())` on a
///   fresh operator gives an operator that behaves identically.
/// - Output batches have exactly `output_schema()`.
pub trait StatefulOperator: Send {
    /// Spark's operator name for progress records.
    fn name(&self) -> &'static str;
    /// The schema of emitted rows.
    fn output_schema(&self) -> SchemaRef;
    /// Processes one micro-batch (empty for a no-data batch).
    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput>;
    /// Processes one micro-batch of an operator with two inputs (a stream-stream join,
    /// see [`super::join`]): `left` is the step's target, `right` its secondary input.
    /// One-input operators keep the default, which refuses.
    fn process_pair(
        &mut self,
        _left: &[RecordBatch],
        _right: &[RecordBatch],
        _ctx: &OpContext,
    ) -> Result<PairOutput> {
        Err(Error::new(
            &codes::ENGINE_ERROR,
            format!("the `{}` operator reads one input", self.name()),
        ))
    }
    /// The whole state as one batch.
    fn snapshot(&self) -> Result<RecordBatch>;
    /// Replaces the state with a snapshot.
    fn restore(&mut self, state: &RecordBatch) -> Result<()>;
    /// For an operator that keeps a changelog (see [`super::checkpoint`]): the columns of
    /// its snapshot that identify a state row. `None` (the default): whole snapshots only.
    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// The changes since the previous call (or since `restore`, or since the start), as a
    /// [`super::checkpoint::changes_batch`]: rows in the snapshot's layout that were added
    /// or changed, and the identities of rows that left. The driver calls it once per
    /// micro-batch, after `process`, and writes either the changes or a whole snapshot.
    ///
    /// Invariant: the snapshot of the previous version with these changes applied
    /// ([`super::checkpoint::apply_changes`]) restores an operator that behaves exactly like
    /// `restore(snapshot())` would. Operators without a changelog return `None`.
    fn changes(&mut self) -> Result<Option<RecordBatch>> {
        Ok(None)
    }
    /// State metrics of the last batch.
    fn metrics(&self) -> StateMetrics;
    /// Whether a watermark advance calls for a no-data micro-batch in this output mode
    /// (Spark's `shouldRunAnotherBatch`).
    fn needs_no_data_batch(&self, _mode: OutputMode) -> bool {
        true
    }
    /// Whether the operator has work due without new input — a timer at or behind the
    /// watermark (`watermark_ms`, `None` without one) or at or before the processing time
    /// `now_ms` — so the driver runs a no-data micro-batch for it.
    fn has_due_work(&self, _watermark_ms: Option<i64>, _now_ms: i64) -> bool {
        false
    }
    /// Expires state rows not updated for `ttl` of processing time (the profile's
    /// `state_ttl`, see [`super::ttl`]). Operators that keep no such state refuse.
    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        Err(Error::new(
            &codes::UNKNOWN_STATE_OPERATOR,
            format!(
                "the `{}` operator does not support a state TTL ({ttl})",
                self.name()
            ),
        ))
    }
    /// Operator-specific figures of the last micro-batch (progress `customMetrics`).
    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        vec![]
    }
    /// Called when the query stops.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

fn engine(e: impl std::fmt::Display) -> Error {
    Error::new(&codes::ENGINE_ERROR, e.to_string())
}

/// Event times of a timestamp column in microseconds.
pub fn micros(col: &ArrayRef) -> Result<TimestampMicrosecondArray> {
    let tz = match col.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::new(
                &codes::BAD_WATERMARK,
                format!("event time must be a timestamp, got {other}"),
            ))
        }
    };
    let c = cast(col, &DataType::Timestamp(TimeUnit::Microsecond, tz)).map_err(engine)?;
    Ok(c.as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .expect("timestamp µs")
        .clone())
}

/// The geometry of a window in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Geometry {
    /// Tumbling windows of this size.
    Tumbling(i64),
    /// Sliding windows (size, slide).
    Sliding(i64, i64),
    /// Sessions with this gap.
    Session(i64),
}

/// Where the columns of an aggregation's prepared input are.
#[derive(Clone, Debug)]
pub struct AggregateLayout {
    /// Group key fields (in the prepared input and in the output).
    pub keys: Vec<Field>,
    /// Aggregates; argument `i` is the prepared column `__arg{i}`.
    pub aggregates: Vec<AggSpec>,
    /// The window, with the type of the time column (prepared column `__time`).
    pub window: Option<(Geometry, DataType)>,
    /// For a plain aggregation: the key that is the watermarked event time.
    pub event_time_key: Option<usize>,
}

struct Group {
    start: i64,
    end: i64,
    key: OwnedRow,
    /// For plain aggregations keyed by the watermarked event time: its value (µs).
    event_key: Option<i64>,
    accs: Vec<Acc>,
    updated: bool,
    /// Processing time of its last update (epoch ms); `None` when restored from a
    /// checkpoint that did not record it.
    updated_ms: Option<i64>,
}

/// The key column of an aggregation without keys: one constant value per row.
fn constant_key(rows: usize) -> ArrayRef {
    Arc::new(BooleanArray::new(
        arrow::buffer::BooleanBuffer::new_set(rows),
        None,
    ))
}

/// The groups of a keyless aggregation in one micro-batch: its distinct window starts
/// in first-seen order, a start's position being its group id. A micro-batch spans a
/// few windows and its rows come nearly in event-time order, so a row's start is mostly
/// the previous row's and a map holds the rest; DataFusion's general group table would
/// hash every row (Nexmark q7: 200 000 bids per micro-batch, two or three windows).
#[derive(Default)]
struct StartGroups {
    starts: Vec<i64>,
    ids: HashMap<i64, usize>,
    last: Option<(i64, usize)>,
}

impl StartGroups {
    /// Appends the group id of each of `starts` to `ids`.
    fn intern(&mut self, starts: &[i64], ids: &mut Vec<usize>) {
        ids.reserve(starts.len());
        for &start in starts {
            let id = match self.last {
                Some((last, id)) if last == start => id,
                _ => {
                    let next = self.starts.len();
                    let id = *self.ids.entry(start).or_insert(next);
                    if id == next {
                        self.starts.push(start);
                    }
                    self.last = Some((start, id));
                    id
                }
            };
            ids.push(id);
        }
    }

    /// How many groups.
    fn len(&self) -> usize {
        self.starts.len()
    }

    /// The group columns of a keyless aggregation's batch groups: the window starts and
    /// the constant key (none when there are no groups).
    fn into_groups(self) -> Vec<ArrayRef> {
        if self.starts.is_empty() {
            return vec![];
        }
        let n = self.starts.len();
        vec![Arc::new(Int64Array::from(self.starts)), constant_key(n)]
    }
}

/// Whether a row is late: its window ends at or before the cutoff (windowed), or its
/// event-time key is at or before it (plain aggregation keyed by the event time).
fn late_for(cutoff: Option<i64>, windowed: bool, end: i64, event_key: Option<i64>) -> bool {
    match cutoff {
        None => false,
        Some(wm) if windowed => end <= wm,
        Some(wm) => event_key.is_some_and(|k| k <= wm),
    }
}

/// Batches smaller than twice this are grouped on one thread.
const MIN_ROWS_PER_THREAD: usize = 32 * 1024;
/// At most this many threads group one batch.
const MAX_THREADS: usize = 4;

/// The columns of one input batch an aggregation reads.
struct BatchColumns {
    keys: Vec<ArrayRef>,
    args: Vec<Option<ArrayRef>>,
    times: Option<TimestampMicrosecondArray>,
    event_keys: Option<TimestampMicrosecondArray>,
}

/// Rows `offset..offset + len` of input batch `batch`.
struct Piece {
    batch: usize,
    offset: usize,
    len: usize,
}

/// Pieces of a micro-batch, grouped and aggregated: the late rows (input batch, rows),
/// the group values (window starts, then the key columns) and the groups' accumulators,
/// flat: group `g`'s are `accs[g * n..][..n]` for `n` aggregates.
struct BatchGroups {
    late: Vec<(usize, Vec<u32>)>,
    groups: Vec<ArrayRef>,
    accs: Vec<Acc>,
}

/// Window and plain group-by aggregation.
pub struct AggregateOperator {
    layout: AggregateLayout,
    accs: Accumulators,
    /// Encodes the key columns (or a constant column for a global aggregation).
    keys: RowConverter,
    schema: SchemaRef,
    /// Tumbling, sliding and plain aggregation: the groups in buckets by window.
    store: GroupStore,
    /// Session windows: key bytes → sessions sorted by start, never overlapping.
    sessions: HashMap<Vec<u8>, Vec<Group>>,
    metrics: StateMetrics,
    /// Groups not updated for this long (processing time) are evicted.
    ttl: Option<StateTtl>,
    /// Groups evicted by the TTL in the last micro-batch.
    ttl_removed: u64,
    /// The processing time of the micro-batch being processed (epoch ms).
    now_ms: i64,
}

fn key_fields(layout: &AggregateLayout) -> Vec<Field> {
    if layout.keys.is_empty() {
        vec![Field::new("__global", DataType::Boolean, true)]
    } else {
        layout.keys.clone()
    }
}

impl AggregateOperator {
    /// A new operator with empty state.
    pub fn new(layout: AggregateLayout) -> Result<Self> {
        let keys = RowConverter::new(
            key_fields(&layout)
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(engine)?;
        let accs = Accumulators::new(layout.aggregates.clone())?;
        let mut fields = Vec::new();
        if let Some((_, t)) = &layout.window {
            fields.push(Field::new("window_start", t.clone(), false));
            fields.push(Field::new("window_end", t.clone(), false));
        }
        fields.extend(layout.keys.iter().cloned());
        fields.extend(layout.aggregates.iter().map(AggSpec::output_field));
        let store = GroupStore::new(layout.aggregates.len());
        Ok(AggregateOperator {
            schema: Arc::new(Schema::new(fields)),
            layout,
            accs,
            keys,
            store,
            sessions: HashMap::default(),
            metrics: StateMetrics::default(),
            ttl: None,
            ttl_removed: 0,
            now_ms: 0,
        })
    }

    fn geometry(&self) -> Option<Geometry> {
        self.layout.window.as_ref().map(|(g, _)| *g)
    }

    fn key_columns(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        if self.layout.keys.is_empty() {
            return Ok(vec![constant_key(batch.num_rows())]);
        }
        self.layout
            .keys
            .iter()
            .map(|f| {
                batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                    engine(format!(
                        "the aggregation input has no key column `{}`",
                        f.name()
                    ))
                })
            })
            .collect()
    }

    fn emit(&self, groups: &[GroupRef<'_>]) -> Result<RecordBatch> {
        let mut cols: Vec<ArrayRef> = Vec::new();
        if let Some((_, t)) = &self.layout.window {
            let tz = match t {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            let starts =
                TimestampMicrosecondArray::from(groups.iter().map(|g| g.start).collect::<Vec<_>>())
                    .with_timezone_opt(tz.clone());
            let ends =
                TimestampMicrosecondArray::from(groups.iter().map(|g| g.end).collect::<Vec<_>>())
                    .with_timezone_opt(tz);
            cols.push(cast(&(Arc::new(starts) as ArrayRef), t).map_err(engine)?);
            cols.push(cast(&(Arc::new(ends) as ArrayRef), t).map_err(engine)?);
        }
        if !self.layout.keys.is_empty() {
            cols.extend(
                self.keys
                    .convert_rows(groups.iter().map(|g| g.key))
                    .map_err(engine)?,
            );
        }
        cols.extend(self.accs.finish(groups.iter().map(|g| g.accs))?);
        RecordBatch::try_new(self.schema.clone(), cols).map_err(engine)
    }

    fn windows_of(&self, ts: i64, out: &mut Vec<(i64, i64)>) {
        out.clear();
        match self.geometry() {
            Some(Geometry::Tumbling(size)) => {
                let start = ts.div_euclid(size) * size;
                out.push((start, start + size));
            }
            Some(Geometry::Sliding(size, slide)) => {
                let mut start = ts.div_euclid(slide) * slide;
                while start + size > ts {
                    out.push((start, start + size));
                    start -= slide;
                }
                out.reverse();
            }
            Some(Geometry::Session(gap)) => out.push((ts, ts + gap)),
            None => out.push((0, 0)),
        }
    }

    fn is_late(&self, end: i64, event_key: Option<i64>, ctx: &OpContext) -> bool {
        late_for(
            self.late_cutoff(ctx),
            self.layout.window.is_some(),
            end,
            event_key,
        )
    }

    /// The input columns of one batch: key columns, aggregate arguments, event times
    /// (µs; windowed aggregations) and event-time keys (µs; plain aggregations keyed by
    /// the watermarked event time).
    fn batch_columns(&self, batch: &RecordBatch) -> Result<BatchColumns> {
        let keys = self.key_columns(batch)?;
        let args = (0..self.layout.aggregates.len())
            .map(|i| batch.column_by_name(&format!("__arg{i}")).cloned())
            .collect();
        let times = match &self.layout.window {
            Some(_) => Some(micros(
                batch
                    .column_by_name("__time")
                    .ok_or_else(|| engine("no __time column"))?,
            )?),
            None => None,
        };
        let event_keys = match self.layout.event_time_key {
            Some(k) => Some(micros(&keys[k])?),
            None => None,
        };
        Ok(BatchColumns {
            keys,
            args,
            times,
            event_keys,
        })
    }

    /// Session windows: every row opens a session that merges with the overlapping ones of
    /// its key. Returns the late rows.
    fn add_sessions(
        &mut self,
        batch: &RecordBatch,
        ctx: &OpContext,
        updated: &mut u64,
    ) -> Result<Vec<u32>> {
        let cols = self.batch_columns(batch)?;
        let rows = self.keys.convert_columns(&cols.keys).map_err(engine)?;
        let inputs = self.accs.prepare(&cols.args)?;
        let mut late_rows = Vec::new();
        let mut windows = Vec::new();
        for i in 0..batch.num_rows() {
            let ts = match &cols.times {
                Some(t) if t.is_null(i) => continue,
                Some(t) => t.value(i),
                None => 0,
            };
            self.windows_of(ts, &mut windows);
            let mut row_late = false;
            for &(start, end) in windows.iter() {
                if self.is_late(end, None, ctx) {
                    row_late = true;
                    continue;
                }
                let key = rows.row(i);
                let owned = key.owned();
                self.add_session(key.as_ref(), &owned, start, end, i, &inputs)?;
                *updated += 1;
            }
            if row_late {
                late_rows.push(i as u32);
            }
        }
        Ok(late_rows)
    }

    /// Tumbling, sliding and plain aggregation of a micro-batch. The rows are first
    /// grouped by (window start, key) with DataFusion's vectorised group tables and
    /// aggregated per group of the micro-batch; then each such group is folded into the
    /// state. That is one state lookup per group of the micro-batch instead of one per
    /// row. A large micro-batch is split into contiguous row ranges grouped on their own
    /// threads; the ranges are folded in in order, so `first`/`last` keep the row order.
    /// Returns the late rows (input batch, rows).
    fn add_grouped(
        &mut self,
        input: &[RecordBatch],
        ctx: &OpContext,
        updated: &mut u64,
    ) -> Result<Vec<(usize, Vec<u32>)>> {
        let cols = input
            .iter()
            .map(|b| self.batch_columns(b))
            .collect::<Result<Vec<_>>>()?;
        let total: usize = input.iter().map(RecordBatch::num_rows).sum();
        if total == 0 {
            return Ok(vec![]);
        }
        let threads = if total >= 2 * MIN_ROWS_PER_THREAD {
            std::thread::available_parallelism()
                .map_or(1, |p| p.get())
                .min(total / MIN_ROWS_PER_THREAD)
                .min(MAX_THREADS)
        } else {
            1
        };
        // Contiguous pieces (batch, offset, length) of about `total / threads` rows each.
        let share = total.div_ceil(threads);
        let mut parts: Vec<Vec<Piece>> = vec![Vec::new()];
        let mut filled = 0;
        for (b, batch) in input.iter().enumerate() {
            let mut offset = 0;
            while offset < batch.num_rows() {
                if filled == share {
                    parts.push(Vec::new());
                    filled = 0;
                }
                let len = (batch.num_rows() - offset).min(share - filled);
                parts.last_mut().expect("one part").push(Piece {
                    batch: b,
                    offset,
                    len,
                });
                offset += len;
                filled += len;
            }
        }
        let this = &*self;
        let cols = &cols;
        let grouped: Vec<Result<BatchGroups>> = if parts.len() == 1 {
            vec![this.group_pieces(cols, &parts[0], ctx)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = parts[1..]
                    .iter()
                    .map(|p| scope.spawn(move || this.group_pieces(cols, p, ctx)))
                    .collect();
                let mut all = vec![this.group_pieces(cols, &parts[0], ctx)];
                for h in handles {
                    all.push(h.join().unwrap_or_else(|_| {
                        Err(engine("a worker thread of the aggregation panicked"))
                    }));
                }
                all
            })
        };
        let mut late: Vec<(usize, Vec<u32>)> = Vec::new();
        for g in grouped {
            let g = g?;
            for (b, rows) in g.late {
                match late.last_mut() {
                    Some((last, acc)) if *last == b => acc.extend(rows),
                    _ => late.push((b, rows)),
                }
            }
            self.fold_in(g.groups, g.accs, ctx.processing_time_ms, updated)?;
        }
        Ok(late)
    }

    /// Groups the rows of some pieces of a micro-batch by (window start, key) and
    /// aggregates each group.
    fn group_pieces(
        &self,
        cols: &[BatchColumns],
        pieces: &[Piece],
        ctx: &OpContext,
    ) -> Result<BatchGroups> {
        let df = |e: datafusion::error::DataFusionError| engine(e);
        let cut = self.late_cutoff(ctx);
        let sliding = matches!(self.geometry(), Some(Geometry::Sliding(..)));
        let mut table: Option<Box<dyn GroupValues>> = None;
        // Without keys, the window start alone is the group.
        let keyless = self.layout.keys.is_empty();
        let mut windows = StartGroups::default();
        let mut accs: Vec<Acc> = Vec::new();
        let width = self.layout.aggregates.len();
        let mut late: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut ids = Vec::new();
        let mut key_types: Vec<DataType> = Vec::new();
        for piece in pieces {
            let (offset, len) = (piece.offset, piece.len);
            let c = &cols[piece.batch];
            let times = c.times.as_ref().map(|t| t.slice(offset, len));
            let event_keys = c.event_keys.as_ref().map(|t| t.slice(offset, len));
            // Which rows go to which window, and which are late.
            let mut rows: Vec<u32> = Vec::with_capacity(len);
            let mut starts: Vec<i64> = Vec::with_capacity(len);
            let mut late_rows: Vec<u32> = Vec::new();
            self.assign_windows(
                times.as_ref(),
                event_keys.as_ref(),
                cut,
                (offset, len),
                &mut rows,
                &mut starts,
                &mut late_rows,
            );
            if !late_rows.is_empty() {
                late.push((piece.batch, late_rows));
            }
            if rows.is_empty() {
                continue;
            }
            // With at most one window per row and none left out, the rows are the piece.
            let identity = rows.len() == len && !sliding;
            let index = UInt32Array::from(rows);
            let pick = |a: &ArrayRef| -> Result<ArrayRef> {
                let a = a.slice(offset, len);
                if identity {
                    Ok(a)
                } else {
                    take(&a, &index, None).map_err(engine)
                }
            };
            let args = c
                .args
                .iter()
                .map(|a| a.as_ref().map(&pick).transpose())
                .collect::<Result<Vec<_>>>()?;
            let inputs = self.accs.prepare(&args)?;
            ids.clear();
            let group_count = if keyless {
                windows.intern(&starts, &mut ids);
                windows.len()
            } else {
                let mut group_cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(starts))];
                for k in &c.keys {
                    group_cols.push(pick(k)?);
                }
                let table = match &mut table {
                    Some(t) => t,
                    None => {
                        key_types = group_cols.iter().map(|c| c.data_type().clone()).collect();
                        let schema = Arc::new(Schema::new(
                            key_types
                                .iter()
                                .enumerate()
                                .map(|(i, t)| Field::new(format!("g{i}"), t.clone(), true))
                                .collect::<Vec<_>>(),
                        ));
                        table.insert(new_group_values(schema, &GroupOrdering::None).map_err(df)?)
                    }
                };
                table.intern(&group_cols, &mut ids).map_err(df)?;
                table.len()
            };
            while accs.len() < group_count * width {
                self.accs.init_into(&mut accs);
            }
            self.accs.update_groups(&mut accs, &ids, &inputs)?;
        }
        if keyless {
            let groups = windows.into_groups();
            return Ok(BatchGroups { late, groups, accs });
        }
        let Some(mut table) = table else {
            return Ok(BatchGroups {
                late,
                groups: vec![],
                accs,
            });
        };
        let mut groups = table.emit(EmitTo::All).map_err(df)?;
        // Group tables may hand back an equivalent type (a dictionary's values): the
        // state encodes keys with the input's types.
        for (g, t) in groups.iter_mut().zip(&key_types) {
            if g.data_type() != t {
                *g = cast(g, t).map_err(engine)?;
            }
        }
        Ok(BatchGroups { late, groups, accs })
    }

    /// Assigns the rows of a piece (`times` and `event_keys` sliced to it, starting at
    /// `offset` of its input batch, `len` rows) to their windows: each (row, window) that is not late
    /// goes to `rows`/`starts`, each row with a late window to `late_rows` (by its index in
    /// the input batch). Rows with a null event time belong to no window.
    #[allow(clippy::too_many_arguments)]
    fn assign_windows(
        &self,
        times: Option<&TimestampMicrosecondArray>,
        event_keys: Option<&TimestampMicrosecondArray>,
        cut: Option<i64>,
        (offset, len): (usize, usize),
        rows: &mut Vec<u32>,
        starts: &mut Vec<i64>,
        late_rows: &mut Vec<u32>,
    ) {
        if let (Some(Geometry::Tumbling(size)), Some(t)) = (self.geometry(), times) {
            // One window per row, the common case: no per-row window list.
            let has_nulls = t.null_count() > 0;
            for (i, &ts) in t.values().iter().enumerate() {
                if has_nulls && t.is_null(i) {
                    continue;
                }
                let start = ts.div_euclid(size) * size;
                if cut.is_some_and(|wm| start + size <= wm) {
                    late_rows.push((offset + i) as u32);
                } else {
                    rows.push(i as u32);
                    starts.push(start);
                }
            }
            return;
        }
        let windowed = self.layout.window.is_some();
        let mut windows = Vec::new();
        for i in 0..len {
            let ts = match times {
                Some(t) if t.is_null(i) => continue,
                Some(t) => t.value(i),
                None => 0,
            };
            self.windows_of(ts, &mut windows);
            let event_key = event_keys.and_then(|e| e.is_valid(i).then(|| e.value(i)));
            let mut row_late = false;
            for &(start, end) in windows.iter() {
                if late_for(cut, windowed, end, event_key) {
                    row_late = true;
                } else {
                    rows.push(i as u32);
                    starts.push(start);
                }
            }
            if row_late {
                late_rows.push((offset + i) as u32);
            }
        }
    }

    /// The watermark late rows are judged against, or `None` when no row is late.
    fn late_cutoff(&self, ctx: &OpContext) -> Option<i64> {
        if !ctx.has_watermark || ctx.accept_late {
            return None;
        }
        // Spark filters late rows of a complete-mode aggregation only for session windows
        // (in the session restore step); tumbling, sliding and plain aggregations keep
        // them, as complete mode keeps every group anyway.
        if ctx.output_mode == OutputMode::Complete
            && !matches!(self.geometry(), Some(Geometry::Session(_)))
        {
            return None;
        }
        Some(ctx.late_watermark_us)
    }

    /// Folds the groups of a batch (`groups` = [window starts, key columns...], their
    /// accumulators flat as in [`BatchGroups`]) into the state.
    fn fold_in(
        &mut self,
        groups: Vec<ArrayRef>,
        mut accs: Vec<Acc>,
        now_ms: i64,
        updated: &mut u64,
    ) -> Result<()> {
        if groups.is_empty() || groups[0].is_empty() {
            return Ok(());
        }
        let width = self.layout.aggregates.len();
        let starts = groups[0]
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| engine("window starts are not 64-bit integers"))?
            .clone();
        let keys = &groups[1..];
        let rows = self.keys.convert_columns(keys).map_err(engine)?;
        let event_keys = match self.layout.event_time_key {
            Some(k) => Some(micros(&keys[k])?),
            None => None,
        };
        let size = match self.geometry() {
            Some(Geometry::Tumbling(size) | Geometry::Sliding(size, _)) => size,
            _ => 0,
        };
        let windowed = self.layout.window.is_some();
        let merger = &self.accs;
        for g in 0..starts.len() {
            let start = starts.value(g);
            let event_key = event_keys
                .as_ref()
                .and_then(|e| e.is_valid(g).then(|| e.value(g)));
            let newly = self.store.fold(
                &self.keys,
                start,
                if windowed { start + size } else { 0 },
                rows.row(g),
                &mut accs[g * width..(g + 1) * width],
                event_key,
                now_ms,
                |state, batch| merger.merge(state, batch),
            )?;
            *updated += u64::from(newly);
        }
        Ok(())
    }

    fn add_session(
        &mut self,
        key: &[u8],
        owned: &OwnedRow,
        start: i64,
        end: i64,
        row: usize,
        inputs: &[super::accumulators::AggInput],
    ) -> Result<()> {
        let now_ms = self.now_ms;
        let list = self.sessions.entry(key.to_vec()).or_default();
        // Sessions that overlap or touch [start, end) merge with it.
        let mut merged = Group {
            start,
            end,
            key: owned.clone(),
            event_key: None,
            accs: self.accs.init(),
            updated: true,
            updated_ms: Some(now_ms),
        };
        self.accs.update(&mut merged.accs, inputs, row)?;
        let mut keep = Vec::with_capacity(list.len() + 1);
        let mut parts: Vec<Group> = Vec::new();
        for g in list.drain(..) {
            if g.start <= merged.end && merged.start <= g.end {
                parts.push(g);
            } else {
                keep.push(g);
            }
        }
        parts.push(merged);
        parts.sort_by_key(|g| (g.start, g.end));
        let mut it = parts.into_iter();
        let mut acc = it.next().expect("at least the new session");
        for mut g in it {
            acc.start = acc.start.min(g.start);
            acc.end = acc.end.max(g.end);
            self.accs.merge(&mut acc.accs, &mut g.accs)?;
        }
        acc.updated = true;
        acc.updated_ms = Some(now_ms);
        keep.push(acc);
        keep.sort_by_key(|g| g.start);
        *list = keep;
        Ok(())
    }
}

impl StatefulOperator for AggregateOperator {
    fn name(&self) -> &'static str {
        if matches!(self.geometry(), Some(Geometry::Session(_))) {
            "sessionWindowStateStoreSaveExec"
        } else {
            "stateStoreSave"
        }
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput> {
        let mut out = OpOutput::default();
        let mut late_batches = Vec::new();
        let mut updated = 0u64;
        let now_ms = ctx.processing_time_ms;
        self.now_ms = now_ms;
        // Groups whose TTL ran out are gone before the input is applied.
        self.ttl_removed = self.expire_ttl(now_ms);
        let session = matches!(self.geometry(), Some(Geometry::Session(_)));
        let late = if session {
            let mut late = Vec::new();
            for (b, batch) in input.iter().enumerate().filter(|(_, b)| b.num_rows() > 0) {
                late.push((b, self.add_sessions(batch, ctx, &mut updated)?));
            }
            late
        } else {
            self.add_grouped(input, ctx, &mut updated)?
        };
        for (batch_index, late_rows) in late {
            let batch = &input[batch_index];
            if !late_rows.is_empty() {
                out.late_count += late_rows.len() as u64;
                out.late_index.push((batch_index, late_rows.clone()));
                let idx = UInt32Array::from(late_rows);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(engine)?;
                late_batches.push(RecordBatch::try_new(batch.schema(), cols).map_err(engine)?);
            }
        }
        if !late_batches.is_empty() {
            out.late = Some(
                arrow::compute::concat_batches(&late_batches[0].schema(), &late_batches)
                    .map_err(engine)?,
            );
        }

        // Emit and evict.
        let evicted = match ctx.output_mode {
            OutputMode::Complete => {
                let batch = self.emit(&self.all_groups())?;
                out.rows.push(batch);
                0
            }
            OutputMode::Update => {
                let changed: Vec<GroupRef<'_>> = if session {
                    self.session_groups()
                        .filter(|(_, u)| *u)
                        .map(|(g, _)| g)
                        .collect()
                } else {
                    self.store.updated().collect()
                };
                let batch = self.emit(&changed)?;
                out.rows.push(batch);
                self.evict(ctx, session).len()
            }
            OutputMode::Append => {
                let evicted = self.evict(ctx, session);
                let mut refs: Vec<GroupRef<'_>> = Vec::with_capacity(evicted.len());
                refs.extend(evicted.groups());
                out.rows.push(self.emit(&refs)?);
                refs.len()
            }
        };
        self.store.clear_updated();
        for list in self.sessions.values_mut() {
            for g in list.iter_mut() {
                g.updated = false;
            }
        }
        let after = self.state_rows();
        self.metrics = StateMetrics {
            rows_total: after,
            rows_updated: updated,
            rows_removed: evicted as u64 + self.ttl_removed,
            memory_bytes: self.memory_bytes(),
        };
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        let groups = self.all_groups();
        let mut fields = vec![
            Field::new("__start", DataType::Int64, false),
            Field::new("__end", DataType::Int64, false),
            Field::new("__event_key", DataType::Int64, true),
            Field::new(UPDATED_COLUMN, DataType::Int64, true),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(
                groups.iter().map(|g| g.start).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                groups.iter().map(|g| g.end).collect::<Vec<_>>(),
            )),
            Arc::new(groups.iter().map(|g| g.event_key).collect::<Int64Array>()),
            Arc::new(groups.iter().map(|g| g.updated_ms).collect::<Int64Array>()),
        ];
        let key_fields = key_fields(&self.layout);
        let key_cols = self
            .keys
            .convert_rows(groups.iter().map(|g| g.key))
            .map_err(engine)?;
        for (f, c) in key_fields.iter().zip(key_cols) {
            fields.push(Field::new(
                format!("__key_{}", f.name()),
                c.data_type().clone(),
                true,
            ));
            cols.push(c);
        }
        for (f, c) in self.accs.state_columns(groups.iter().map(|g| g.accs))? {
            fields.push(f);
            cols.push(c);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(engine)
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        const OP: &str = "aggregation";
        let col = |name: &str| {
            state
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| corrupt_state(OP, format!("no column `{name}`")))
        };
        let starts: Int64Array = state_column(state, "__start", OP)?;
        let ends: Int64Array = state_column(state, "__end", OP)?;
        let ek: Int64Array = state_column(state, "__event_key", OP)?;
        // Checkpoints written before TTL existed have no update times.
        let updated_ms: Option<Int64Array> = match state.column_by_name(UPDATED_COLUMN) {
            Some(_) => Some(state_column(state, UPDATED_COLUMN, OP)?),
            None => None,
        };
        let key_cols: Vec<ArrayRef> = key_fields(&self.layout)
            .iter()
            .map(|f| col(&format!("__key_{}", f.name())))
            .collect::<Result<_>>()?;
        let rows = self
            .keys
            .convert_columns(&key_cols)
            .map_err(|e| corrupt_state(OP, format!("group keys: {e}")))?;
        let accs = self.accs.restore(state)?;
        self.store.clear();
        self.sessions.clear();
        let session = matches!(self.geometry(), Some(Geometry::Session(_)));
        for (i, a) in accs.into_iter().enumerate() {
            let event_key = ek.is_valid(i).then(|| ek.value(i));
            let updated_ms = updated_ms
                .as_ref()
                .and_then(|u| u.is_valid(i).then(|| u.value(i)));
            if session {
                let g = Group {
                    start: starts.value(i),
                    end: ends.value(i),
                    key: rows.row(i).owned(),
                    event_key,
                    accs: a,
                    updated: false,
                    updated_ms,
                };
                self.sessions
                    .entry(rows.row(i).as_ref().to_vec())
                    .or_default()
                    .push(g);
            } else {
                let group = GroupRef {
                    start: starts.value(i),
                    end: ends.value(i),
                    key: rows.row(i),
                    accs: &[],
                    event_key,
                    updated_ms,
                };
                self.store.restore(&self.keys, group, a);
            }
        }
        for list in self.sessions.values_mut() {
            list.sort_by_key(|g| g.start);
        }
        Ok(())
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    /// Complete mode never evicts or emits on a watermark advance alone.
    fn needs_no_data_batch(&self, mode: OutputMode) -> bool {
        mode != OutputMode::Complete
    }

    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        self.ttl = Some(StateTtl::new(ttl)?);
        Ok(())
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        match self.ttl {
            Some(_) => vec![(ROWS_REMOVED_BY_TTL, self.ttl_removed)],
            None => vec![],
        }
    }
}

/// Groups taken out of the state by an eviction: whole windows of the store, or
/// sessions.
enum Evicted {
    Windows(Vec<(i64, Bucket)>, usize),
    Sessions(Vec<Group>),
}

impl Evicted {
    fn groups(&self) -> Box<dyn Iterator<Item = GroupRef<'_>> + '_> {
        match self {
            Evicted::Windows(buckets, width) => Box::new(GroupStore::groups_of(buckets, *width)),
            Evicted::Sessions(list) => Box::new(list.iter().map(Group::as_ref)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Evicted::Windows(buckets, _) => buckets.iter().map(|(_, b)| b.len()).sum(),
            Evicted::Sessions(list) => list.len(),
        }
    }
}

impl Group {
    fn as_ref(&self) -> GroupRef<'_> {
        GroupRef {
            start: self.start,
            end: self.end,
            key: self.key.row(),
            accs: &self.accs,
            event_key: self.event_key,
            updated_ms: self.updated_ms,
        }
    }
}

impl AggregateOperator {
    /// The sessions, sorted by key and start, with their update flags.
    fn session_groups(&self) -> impl Iterator<Item = (GroupRef<'_>, bool)> + '_ {
        let mut v: Vec<&Group> = self.sessions.values().flatten().collect();
        v.sort_by(|a, b| (a.key.row(), a.start).cmp(&(b.key.row(), b.start)));
        v.into_iter().map(|g| (g.as_ref(), g.updated))
    }

    fn all_groups(&self) -> Vec<GroupRef<'_>> {
        // Sized up front: the groups come bucket by bucket, with no size hint, and a
        // snapshot of every micro-batch would otherwise regrow (and copy) the list.
        let mut all = Vec::with_capacity(self.state_rows() as usize);
        if matches!(self.geometry(), Some(Geometry::Session(_))) {
            all.extend(self.session_groups().map(|(g, _)| g));
        } else {
            all.extend(self.store.groups());
        }
        all
    }

    fn state_rows(&self) -> u64 {
        (self.store.len() + self.sessions.values().map(Vec::len).sum::<usize>()) as u64
    }

    /// Evicts the groups whose TTL ran out at `now_ms`; returns how many.
    fn expire_ttl(&mut self, now_ms: i64) -> u64 {
        let Some(ttl) = self.ttl else { return 0 };
        let mut removed = 0u64;
        for list in self.sessions.values_mut() {
            let before = list.len();
            list.retain(|g| !ttl.expired(g.updated_ms, now_ms));
            removed += (before - list.len()) as u64;
        }
        self.sessions.retain(|_, l| !l.is_empty());
        let gone = self
            .store
            .remove_where(&self.keys, |g| ttl.expired(g.updated_ms, now_ms));
        removed += gone.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        removed
    }

    fn memory_bytes(&self) -> u64 {
        let per_group =
            |g: &Group| 72 + g.key.row().as_ref().len() as u64 + 24 * g.accs.len() as u64;
        self.store.memory_bytes() + self.sessions.values().flatten().map(per_group).sum::<u64>()
    }

    /// Takes the closed groups (by the eviction watermark) out of the state.
    fn evict(&mut self, ctx: &OpContext, session: bool) -> Evicted {
        let width = self.store.width();
        if !ctx.has_watermark {
            return Evicted::Windows(Vec::new(), width);
        }
        let wm = ctx.evict_watermark_us;
        if session {
            let mut out = Vec::new();
            for list in self.sessions.values_mut() {
                let (closed, open): (Vec<Group>, Vec<Group>) =
                    list.drain(..).partition(|g| g.end <= wm);
                out.extend(closed);
                *list = open;
            }
            self.sessions.retain(|_, l| !l.is_empty());
            return Evicted::Sessions(out);
        }
        let buckets = if self.layout.window.is_some() {
            // A window closes once the watermark reaches its end: whole buckets go.
            self.store.close_windows(wm)
        } else if self.layout.event_time_key.is_some() {
            // A plain aggregation keyed by the event time: group by group.
            self.store
                .remove_where(&self.keys, |g| g.event_key.is_some_and(|k| k <= wm))
        } else {
            Vec::new()
        };
        Evicted::Windows(buckets, width)
    }
}

/// Deduplication: Spark's `dropDuplicates(keys)` (with or without a watermark) and
/// `dropDuplicatesWithinWatermark(keys)`.
pub struct DedupOperator {
    schema: SchemaRef,
    keys: Vec<String>,
    converter: RowConverter,
    /// Watermarked event-time column, if the input has one.
    time_column: Option<String>,
    /// `Some(delay µs)`: within-watermark mode (state expires at first event time + delay).
    within_delay_us: Option<i64>,
    /// key bytes → event time (µs) of the first occurrence, or expiry for within mode;
    /// `None` when the key carries no event time.
    seen: HashMap<Vec<u8>, Option<i64>>,
    /// key bytes → processing time (epoch ms) it was first seen, for the TTL.
    first_seen_ms: HashMap<Vec<u8>, i64>,
    /// Keys are forgotten this long (processing time) after they were first seen.
    ttl: Option<StateTtl>,
    /// Keys forgotten by the TTL in the last micro-batch.
    ttl_removed: u64,
    metrics: StateMetrics,
}

impl DedupOperator {
    /// A dedup over `keys` of rows with `schema` (all columns when `keys` is empty).
    pub fn new(
        schema: SchemaRef,
        keys: Vec<String>,
        time_column: Option<String>,
        within_delay_us: Option<i64>,
    ) -> Result<Self> {
        let keys = if keys.is_empty() {
            schema.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            keys
        };
        let fields = keys
            .iter()
            .map(|k| {
                schema
                    .field_with_name(k)
                    .map(|f| SortField::new(f.data_type().clone()))
                    .map_err(|_| {
                        Error::new(
                            &codes::UNKNOWN_COLUMN,
                            format!("dedup key `{k}` is not a column"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DedupOperator {
            converter: RowConverter::new(fields).map_err(engine)?,
            schema,
            keys,
            time_column,
            within_delay_us,
            seen: HashMap::default(),
            first_seen_ms: HashMap::default(),
            ttl: None,
            ttl_removed: 0,
            metrics: StateMetrics::default(),
        })
    }

    /// Whether the state can be evicted (the event time is a key, or within mode).
    fn evictable(&self) -> bool {
        self.within_delay_us.is_some()
            || self
                .time_column
                .as_ref()
                .is_some_and(|t| self.keys.contains(t))
    }
}

impl StatefulOperator for DedupOperator {
    fn name(&self) -> &'static str {
        if self.within_delay_us.is_some() {
            "dedupeWithinWatermark"
        } else {
            "dedupe"
        }
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput> {
        let mut out = OpOutput::default();
        let mut late_batches = Vec::new();
        let mut updated = 0;
        let now_ms = ctx.processing_time_ms;
        // Keys whose TTL ran out are forgotten before the input is checked.
        self.ttl_removed = 0;
        if let Some(ttl) = self.ttl {
            let expired: Vec<Vec<u8>> = self
                .seen
                .keys()
                .filter(|k| ttl.expired(self.first_seen_ms.get(*k).copied(), now_ms))
                .cloned()
                .collect();
            for k in expired {
                self.seen.remove(&k);
                self.first_seen_ms.remove(&k);
                self.ttl_removed += 1;
            }
        }
        let before = self.seen.len() as u64;
        for (batch_index, batch) in input.iter().enumerate().filter(|(_, b)| b.num_rows() > 0) {
            let cols: Vec<ArrayRef> = self
                .keys
                .iter()
                .map(|k| {
                    batch
                        .column_by_name(k)
                        .cloned()
                        .ok_or_else(|| engine(format!("missing dedup key {k}")))
                })
                .collect::<Result<_>>()?;
            let rows = self.converter.convert_columns(&cols).map_err(engine)?;
            let times = match (&self.time_column, ctx.has_watermark) {
                (Some(t), true) => Some(micros(
                    batch
                        .column_by_name(t)
                        .ok_or_else(|| engine(format!("missing {t}")))?,
                )?),
                _ => None,
            };
            let mut keep = Vec::with_capacity(batch.num_rows());
            let mut late = Vec::new();
            for i in 0..batch.num_rows() {
                let ts = times
                    .as_ref()
                    .and_then(|t| t.is_valid(i).then(|| t.value(i)));
                if let Some(ts) = ts {
                    if !ctx.accept_late && ts <= ctx.late_watermark_us {
                        keep.push(false);
                        late.push(i as u32);
                        continue;
                    }
                }
                let row = rows.row(i);
                let key = row.as_ref();
                if self.seen.contains_key(key) {
                    keep.push(false);
                    continue;
                }
                let value = match self.within_delay_us {
                    Some(d) => ts.map(|t| t + d),
                    None => ts,
                };
                self.seen.insert(key.to_vec(), value);
                self.first_seen_ms.insert(key.to_vec(), now_ms);
                updated += 1;
                keep.push(true);
            }
            if !late.is_empty() {
                out.late_count += late.len() as u64;
                out.late_index.push((batch_index, late.clone()));
                let idx = UInt32Array::from(late);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(engine)?;
                late_batches.push(RecordBatch::try_new(batch.schema(), cols).map_err(engine)?);
            }
            out.rows
                .push(filter_record_batch(batch, &BooleanArray::from(keep)).map_err(engine)?);
        }
        if !late_batches.is_empty() {
            out.late = Some(
                arrow::compute::concat_batches(&late_batches[0].schema(), &late_batches)
                    .map_err(engine)?,
            );
        }
        if ctx.has_watermark && self.evictable() {
            let wm = ctx.evict_watermark_us;
            self.seen.retain(|_, v| v.is_none_or(|t| t > wm));
            let seen = &self.seen;
            self.first_seen_ms.retain(|k, _| seen.contains_key(k));
        }
        let after = self.seen.len() as u64;
        self.metrics = StateMetrics {
            rows_total: after,
            rows_updated: updated,
            rows_removed: (before + updated).saturating_sub(after) + self.ttl_removed,
            memory_bytes: self.seen.keys().map(|k| k.len() as u64 + 40).sum(),
        };
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        let mut entries: Vec<(&Vec<u8>, &Option<i64>)> = self.seen.iter().collect();
        entries.sort();
        let keys =
            arrow::array::BinaryArray::from_iter_values(entries.iter().map(|(k, _)| k.as_slice()));
        let values: Int64Array = entries.iter().map(|(_, v)| **v).collect();
        let first_seen: Int64Array = entries
            .iter()
            .map(|(k, _)| self.first_seen_ms.get(*k).copied())
            .collect();
        RecordBatch::try_from_iter(vec![
            ("__key", Arc::new(keys) as ArrayRef),
            ("__value", Arc::new(values) as ArrayRef),
            (UPDATED_COLUMN, Arc::new(first_seen) as ArrayRef),
        ])
        .map_err(engine)
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        const OP: &str = "dedup";
        let keys: arrow::array::BinaryArray = state_column(state, "__key", OP)?;
        let values: Int64Array = state_column(state, "__value", OP)?;
        self.seen = (0..state.num_rows())
            .map(|i| {
                (
                    keys.value(i).to_vec(),
                    values.is_valid(i).then(|| values.value(i)),
                )
            })
            .collect();
        // Checkpoints written before TTL existed have no first-seen times.
        let first_seen: Option<Int64Array> = match state.column_by_name(UPDATED_COLUMN) {
            Some(_) => Some(state_column(state, UPDATED_COLUMN, OP)?),
            None => None,
        };
        self.first_seen_ms = match first_seen {
            Some(t) => (0..state.num_rows())
                .filter(|i| t.is_valid(*i))
                .map(|i| (keys.value(i).to_vec(), t.value(i)))
                .collect(),
            None => HashMap::default(),
        };
        Ok(())
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        self.ttl = Some(StateTtl::new(ttl)?);
        Ok(())
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        match self.ttl {
            Some(_) => vec![(ROWS_REMOVED_BY_TTL, self.ttl_removed)],
            None => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use etlantic_core::ir::AggFunc;
    use std::collections::BTreeMap;

    #[test]
    fn start_groups_number_starts_in_first_seen_order_across_pieces() {
        let mut g = StartGroups::default();
        let mut ids = Vec::new();
        g.intern(&[20, 20, 10, 20, 30, 10], &mut ids);
        assert_eq!(ids, vec![0, 0, 1, 0, 2, 1]);
        // A later piece of the same micro-batch continues the numbering.
        ids.clear();
        g.intern(&[30, 40, 10], &mut ids);
        assert_eq!(ids, vec![2, 3, 1]);
        assert_eq!(g.len(), 4);
        assert_eq!(g.starts, vec![20, 10, 30, 40]);
    }

    const SEC: i64 = 1_000_000;

    /// Rows with a key out of 7 (one null), a value (every 11th null) and an event time
    /// over 200 s, in an order that is not sorted by time.
    fn input(n: usize) -> RecordBatch {
        let keys: StringArray = (0..n)
            .map(|i| (i % 7 != 3).then(|| format!("k{}", i % 7)))
            .collect();
        let values: Int64Array = (0..n).map(|i| (i % 11 != 0).then_some(i as i64)).collect();
        let times = TimestampMicrosecondArray::from(
            (0..n)
                .map(|i| ((i * 7919) % 200_000) as i64 * 1000)
                .collect::<Vec<_>>(),
        )
        .with_timezone("UTC");
        let time_type = times.data_type().clone();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Utf8, true),
                Field::new("__arg0", DataType::Int64, true),
                Field::new("__arg1", DataType::Int64, true),
                Field::new("__arg2", DataType::Int64, true),
                Field::new("__arg3", DataType::Int64, true),
                Field::new("__time", time_type, true),
            ])),
            vec![
                Arc::new(keys),
                Arc::new(values.clone()),
                Arc::new(values.clone()),
                Arc::new(values.clone()),
                Arc::new(values),
                Arc::new(times),
            ],
        )
        .unwrap()
    }

    fn operator(geometry: Geometry) -> AggregateOperator {
        let spec = |name: &str, func| AggSpec {
            name: name.into(),
            func,
            input_type: Some(DataType::Int64),
        };
        AggregateOperator::new(AggregateLayout {
            keys: vec![Field::new("k", DataType::Utf8, true)],
            aggregates: vec![
                spec("n", AggFunc::Count),
                spec("s", AggFunc::Sum),
                spec("first", AggFunc::First),
                spec("last", AggFunc::Last),
            ],
            window: Some((
                geometry,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            )),
            event_time_key: None,
        })
        .unwrap()
    }

    type Expected = BTreeMap<(i64, Option<String>), (i64, Option<i64>, Option<i64>, Option<i64>)>;

    /// What the operator must produce: each row folded into each of its windows in input
    /// order, late rows (window end at or before `watermark`) left out.
    fn reference(batch: &RecordBatch, geometry: Geometry, watermark: i64) -> (Expected, Vec<u32>) {
        let keys = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let values = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let times = micros(batch.column(5)).unwrap();
        let mut out = Expected::new();
        let mut late = Vec::new();
        for i in 0..batch.num_rows() {
            let ts = times.value(i);
            let windows: Vec<(i64, i64)> = match geometry {
                Geometry::Tumbling(size) => vec![(ts.div_euclid(size) * size, size)],
                Geometry::Sliding(size, slide) => (0..size / slide)
                    .map(|j| (ts.div_euclid(slide) * slide - j * slide, size))
                    .collect(),
                Geometry::Session(_) => unreachable!(),
            };
            let mut row_late = false;
            for (start, size) in windows {
                if start + size <= watermark {
                    row_late = true;
                    continue;
                }
                let key = keys.is_valid(i).then(|| keys.value(i).to_string());
                let v = values.is_valid(i).then(|| values.value(i));
                let e = out.entry((start, key)).or_insert((0, None, None, None));
                if let Some(v) = v {
                    e.0 += 1;
                    e.1 = Some(e.1.unwrap_or(0) + v);
                    e.2 = e.2.or(Some(v));
                    e.3 = Some(v);
                }
            }
            if row_late {
                late.push(i as u32);
            }
        }
        (out, late)
    }

    fn actual(batch: &RecordBatch) -> Expected {
        let starts = micros(batch.column(0)).unwrap();
        let keys = batch
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let col = |i: usize| {
            batch
                .column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
        };
        let opt = |a: &Int64Array, r: usize| a.is_valid(r).then(|| a.value(r));
        (0..batch.num_rows())
            .map(|r| {
                (
                    (
                        starts.value(r),
                        keys.is_valid(r).then(|| keys.value(r).to_string()),
                    ),
                    (
                        col(3).value(r),
                        opt(col(4), r),
                        opt(col(5), r),
                        opt(col(6), r),
                    ),
                )
            })
            .collect()
    }

    /// A batch large enough to be grouped on several threads gives what folding each row
    /// into its windows in order gives: counts, sums, `first`/`last` in input order, a
    /// null key as a key, and the late rows in input order.
    #[test]
    fn grouped_batches_match_row_at_a_time_folding() {
        let batch = input(150_000);
        for geometry in [
            Geometry::Tumbling(10 * SEC),
            Geometry::Sliding(10 * SEC, 5 * SEC),
        ] {
            let watermark = 60 * SEC;
            let mut op = operator(geometry);
            let ctx = OpContext {
                late_watermark_us: watermark,
                evict_watermark_us: watermark,
                has_watermark: true,
                output_mode: OutputMode::Update,
                accept_late: false,
                processing_time_ms: 0,
            };
            let out = op.process(std::slice::from_ref(&batch), &ctx).unwrap();
            let (expected, late) = reference(&batch, geometry, watermark);
            assert_eq!(actual(&out.rows[0]), expected, "{geometry:?}");
            assert_eq!(out.late_index, vec![(0, late.clone())], "{geometry:?}");
            assert_eq!(out.late_count, late.len() as u64);
            // A second batch folds into the same groups.
            let again = op.process(std::slice::from_ref(&batch), &ctx).unwrap();
            let doubled: Expected = expected
                .iter()
                .map(|(k, (n, s, f, _))| (k.clone(), (2 * n, s.map(|s| 2 * s), *f, expected[k].3)))
                .collect();
            assert_eq!(actual(&again.rows[0]), doubled, "{geometry:?}");
        }
    }

    /// A snapshot whose columns have other types than the operator's (another query's
    /// checkpoint, damage) is ETL801 on restore, never a panic; the operator's own
    /// snapshot restores.
    #[test]
    fn restoring_state_of_another_shape_is_etl801_not_a_panic() {
        let batch = input(1_000);
        let ctx = OpContext {
            late_watermark_us: 0,
            evict_watermark_us: 0,
            has_watermark: true,
            output_mode: OutputMode::Update,
            accept_late: false,
            processing_time_ms: 0,
        };
        let mut op = operator(Geometry::Tumbling(10 * SEC));
        op.process(std::slice::from_ref(&batch), &ctx).unwrap();
        let snap = op.snapshot().unwrap();
        operator(Geometry::Tumbling(10 * SEC))
            .restore(&snap)
            .unwrap();
        let schema = snap.schema();
        for (i, field) in schema.fields().iter().enumerate() {
            for to in [DataType::Int32, DataType::Utf8, DataType::Float64] {
                if field.data_type() == &to {
                    continue;
                }
                let Ok(col) = cast(snap.column(i), &to) else {
                    continue;
                };
                let mut fields: Vec<Field> =
                    schema.fields().iter().map(|f| f.as_ref().clone()).collect();
                fields[i] = Field::new(field.name(), to.clone(), true);
                let mut cols = snap.columns().to_vec();
                cols[i] = col;
                let bad = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
                let err = operator(Geometry::Tumbling(10 * SEC))
                    .restore(&bad)
                    .expect_err(&format!("`{}` as {to}", field.name()));
                assert_eq!(err.code(), "ETL801", "`{}` as {to}: {err}", field.name());
            }
        }
        // A column missing.
        let mut dedup = DedupOperator::new(batch.schema(), vec!["k".into()], None, None).unwrap();
        let err = dedup.restore(&snap).unwrap_err();
        assert_eq!(err.code(), "ETL801", "{err}");
    }
}
