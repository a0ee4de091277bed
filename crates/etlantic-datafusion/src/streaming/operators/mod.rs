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
//!
//! [`aggregate`] holds the window and group-by aggregation, [`dedup`] the
//! deduplication; this module the [`StatefulOperator`] trait they implement.

mod aggregate;
mod dedup;
mod dedup_store;

pub use aggregate::{AggregateLayout, AggregateOperator, Geometry};
pub use dedup::DedupOperator;

use super::accumulators::{Acc, Accumulators, AggSpec};
use super::groups::{Bucket, GroupRef, GroupStore};
use super::ttl::{StateTtl, ROWS_REMOVED_BY_TTL, UPDATED_COLUMN};
use arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use arrow::compute::{cast, filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
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

/// A disk state store (RocksDB) for operator tests: its working copy `local` and its
/// checkpoint `checkpoint`, both under `dir`.
#[cfg(test)]
pub(crate) fn test_disk_store(
    dir: &std::path::Path,
    local: &str,
    checkpoint: &str,
) -> Box<dyn StateStore> {
    use etlantic_runtime::state_store::{StateStoreProvider, StoreContext};
    etlantic_rocksdb::DiskStoreProvider
        .open(StoreContext {
            operator: "t.0".into(),
            local_dir: dir.join(local),
            checkpoint: etlantic_core::storage::open(&dir.join(checkpoint)),
            memory_limit_bytes: 16 << 20,
            snapshot_every: None,
        })
        .expect("a disk store opens")
}

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

pub use etlantic_runtime::engine::{corrupt_state, state_column, store_unsupported};
pub use etlantic_runtime::progress::StateMetrics;
pub use etlantic_runtime::state_store::StateStore;
pub use etlantic_runtime::watermark::micros;

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
    /// For an operator that keeps a changelog (see `etlantic_runtime::checkpoint`): the columns of
    /// its snapshot that identify a state row. `None` (the default): whole snapshots only.
    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// The changes since the previous call (or since `restore`, or since the start), as a
    /// [`etlantic_runtime::checkpoint::changes_batch`]: rows in the snapshot's layout that were added
    /// or changed, and the identities of rows that left. The driver calls it once per
    /// micro-batch, after `process`, and writes either the changes or a whole snapshot.
    ///
    /// Invariant: the snapshot of the previous version with these changes applied
    /// ([`etlantic_runtime::checkpoint::apply_changes`]) restores an operator that behaves exactly like
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
    /// Keeps the state in `store` from now on, starting empty (see
    /// [`etlantic_runtime::engine::OperatorState::use_store`]). Operators that keep their
    /// state in memory only keep the default, which refuses (`ETL435`).
    fn use_store(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        drop(store);
        Err(store_unsupported(
            self.name(),
            "it keeps its state in memory only (docs/streaming.md lists the operators that run on a state store)",
        ))
    }
    /// The store its state is in, once [`StatefulOperator::use_store`] gave it one.
    fn store(&mut self) -> Option<&mut dyn StateStore> {
        None
    }
    /// Called when the query stops.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}
