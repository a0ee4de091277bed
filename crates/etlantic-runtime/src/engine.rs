//! What the runtime asks of the engine that runs a streaming query's transformations.
//!
//! The runtime owns everything around the transformations — sources and sinks, the
//! micro-batch protocol, the checkpoint, watermarks, quality gates, quarantine and
//! progress — and hands each micro-batch's rows to a [`MicroBatchProgram`] that a
//! [`StreamingEngine`] compiled from the plan. The program runs the stateless steps and
//! the stateful operators; the runtime checkpoints the operators' state through
//! [`OperatorState`].
//!
//! An engine is linked by registering it with [`inventory`] (see [`EngineRegistration`]);
//! the runtime picks the engine of the plan's streaming region by its backend's name.

use crate::progress::StateOperatorProgress;
use crate::state_store::StateStore;
use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::Expr;
use etlantic_core::streaming::{Duration, LatePolicy};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use std::collections::HashMap;
use std::path::Path;

/// A source (streaming or static) as a program reads it.
#[derive(Clone, Debug)]
pub struct ProgramSource {
    /// The source id: the relation its rows arrive as.
    pub id: String,
    /// The schema of its rows.
    pub schema: SchemaRef,
    /// The event-time column its watermark is measured on (`None` without a watermark).
    pub event_time: Option<String>,
    /// The watermark's delay (µs), when it has one.
    pub delay_us: Option<i64>,
    /// What happens to its late rows.
    pub late: LatePolicy,
    /// A static source: a bounded table read for every micro-batch (stream-static joins).
    pub is_static: bool,
}

/// What a program is compiled from.
pub struct ProgramContext<'a> {
    /// The plan.
    pub plan: &'a PipelinePlan,
    /// Its sources, streaming first, then static, each once.
    pub sources: Vec<ProgramSource>,
    /// The project root, against which relative locations resolve.
    pub root: &'a Path,
    /// Resolves a binding or location text (secret references) into a URI.
    pub resolve: &'a (dyn Fn(&str) -> Result<BindingUri> + Sync),
}

/// The watermarks and clock a micro-batch runs with, as its offsets record logged them
/// (the same when it runs again after a restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTimes {
    /// Late rows are judged against this watermark (the previous micro-batch's; ms).
    pub late_watermark_ms: i64,
    /// State is evicted and emitted with this watermark (ms).
    pub batch_watermark_ms: i64,
    /// The micro-batch's processing time (epoch ms).
    pub batch_timestamp_ms: i64,
}

/// Rows a stateful step found late whose policy routes them (quarantine, side output).
#[derive(Debug)]
pub struct LateRows {
    /// The policy of the sources feeding the step.
    pub policy: LatePolicy,
    /// The rows, as they entered the step.
    pub rows: RecordBatch,
    /// The sources feeding the step, comma-separated (their quarantine position).
    pub sources: String,
    /// The step's allowed lateness (a window's; zero elsewhere): the rows were later
    /// than the watermark minus it.
    pub allowed_lateness: Duration,
}

/// Rows a stateful step rejected for repeating a key their contract declares unique
/// (a stream-stream join still holding an earlier row of that key).
#[derive(Debug)]
pub struct DuplicateRows {
    /// The rows, as they entered the step.
    pub rows: RecordBatch,
    /// The unique key's columns.
    pub keys: Vec<String>,
    /// The sources of that input, comma-separated.
    pub sources: String,
}

/// What one micro-batch's transformations produced besides their output relations.
#[derive(Debug, Default)]
pub struct ProgramRun {
    /// Rows behind the watermark, whatever their policy.
    pub late_count: u64,
    /// Late rows to route by their policy.
    pub late: Vec<LateRows>,
    /// Rows rejected for repeating a unique key.
    pub duplicates: Vec<DuplicateRows>,
    /// One entry per stateful operator that ran, in execution order.
    pub state: Vec<StateOperatorProgress>,
}

/// An engine that runs a streaming region micro-batch by micro-batch under the runtime.
///
/// # Invariants an implementer must keep
/// - `compile` reads nothing; the program it returns holds all the query's state and is
///   driven only through [`MicroBatchProgram`].
/// - `row_filter` evaluates an IR predicate with SQL's three-valued logic: a row is
///   selected only where the predicate is true (not null).
pub trait StreamingEngine: Send + Sync {
    /// The backend name the planner places streaming steps on (`datafusion`).
    fn name(&self) -> &'static str;

    /// Compiles the transformations of `ctx.plan`.
    fn compile(&self, ctx: ProgramContext<'_>) -> Result<Box<dyn MicroBatchProgram>>;

    /// A predicate over batches (the rows a watermark is measured on).
    fn row_filter(&self, predicate: &Expr) -> Result<Box<dyn RowFilter>>;
}

/// A compiled predicate.
pub trait RowFilter: Send {
    /// Where the predicate is true for `batch`'s rows (false where null).
    fn evaluate(&mut self, batch: &RecordBatch) -> Result<BooleanArray>;
}

/// The transformations of a streaming query, compiled, with their operators' state.
///
/// # Invariants an implementer must keep
/// - `run` is deterministic in its inputs, the [`BatchTimes`] and the operators' state:
///   a micro-batch run again after a restart (same offsets, same times, state restored
///   to the version before it) produces the same rows. The runtime relies on it for
///   exactly-once sinks.
/// - `run` adds a relation for every transformation (named by its id) to `relations`,
///   reading only relations already there (sources, static tables, earlier
///   transformations).
/// - A failed `run` may leave the operators holding part of the micro-batch; the runtime
///   then refuses to run further micro-batches until the query is restarted.
/// - [`MicroBatchProgram::operators`] returns the same operators, with the same ids, in
///   the same order, at every call.
#[async_trait]
pub trait MicroBatchProgram: Send {
    /// Runs one micro-batch's transformations.
    async fn run(
        &mut self,
        relations: &mut HashMap<String, Table>,
        times: &BatchTimes,
    ) -> Result<ProgramRun>;

    /// The stateful operators, for the checkpoint.
    fn operators(&mut self) -> Vec<&mut dyn OperatorState>;

    /// Whether any transformation keeps state.
    fn has_state(&self) -> bool;

    /// Whether a watermark advance calls for a no-data micro-batch: some watermarked
    /// operator emits or evicts on it in its output mode (Spark's
    /// `shouldRunAnotherBatch`).
    fn needs_no_data_batch(&self) -> bool;

    /// Whether an operator has work due without new input: a timer at or behind the
    /// watermark in force (`watermark_ms`, `None` without one) or at or before `now_ms`.
    fn has_due_work(&self, watermark_ms: Option<i64>, now_ms: i64) -> bool;

    /// Called once when the query stops.
    fn close(&mut self) -> Result<()>;
}

/// One stateful operator's state, as the checkpoint sees it.
///
/// An operator keeps its state in memory (the checkpoint then reads it as snapshots and
/// changes) or, once given one by [`OperatorState::use_store`], in a [`StateStore`],
/// which the runtime commits, restores and prunes by version instead.
///
/// # Invariants an implementer must keep
/// - `restore(snapshot())` gives an operator that behaves exactly like this one.
/// - Once `use_store` succeeded, the operator keeps all of its state in that store
///   (nothing that a restored store would not give back lives only in memory across
///   micro-batches), [`OperatorState::store`] returns it, and `changes` returns `None`.
/// - An operator that cannot keep its state in a store refuses `use_store` with
///   `ETL435` naming why; it never keeps the state in memory instead.
/// - With a changelog ([`OperatorState::changelog_identity`] is `Some`), `changes` returns
///   the changes since the previous call (or since `restore`, or the start) as a
///   [`crate::checkpoint::changes_batch`], and the previous version's snapshot with them
///   applied ([`crate::checkpoint::apply_changes`]) restores an operator that behaves
///   like `restore(snapshot())`. Without one it returns `None`.
pub trait OperatorState: Send {
    /// The operator id, stable across restarts (`<transformation>.<step>`): its state's
    /// name in the checkpoint.
    fn id(&self) -> &str;
    /// The columns of its snapshot that identify a state row, for an operator with a
    /// changelog.
    fn changelog_identity(&self) -> Option<&'static [&'static str]>;
    /// The whole state as one batch.
    fn snapshot(&self) -> Result<RecordBatch>;
    /// Replaces the state with a snapshot.
    fn restore(&mut self, state: &RecordBatch) -> Result<()>;
    /// The changes since the previous call (see the trait docs).
    fn changes(&mut self) -> Result<Option<RecordBatch>>;
    /// Rows in the state now.
    fn rows_total(&self) -> u64;
    /// Keeps the state in `store` from now on, starting empty (the runtime restores a
    /// version next). The default refuses (`ETL435`).
    fn use_store(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        drop(store);
        Err(store_unsupported(
            self.id(),
            "it keeps its state in memory only",
        ))
    }
    /// The store its state is in, once [`OperatorState::use_store`] gave it one.
    fn store(&mut self) -> Option<&mut dyn StateStore> {
        None
    }
}

/// Operator `operator` cannot keep its state in the profile's state store, for `why`
/// (`ETL435`).
pub fn store_unsupported(operator: &str, why: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::STATE_STORE_UNSUPPORTED,
        format!("operator `{operator}` cannot keep its state in the profile's state store: {why}"),
    )
}

/// The state a snapshot holds is damaged or of another shape than the operator's
/// (`ETL801`).
pub fn corrupt_state(operator: &str, message: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("the {operator} state in the checkpoint does not fit the query: {message}"),
    )
    .with_help("the checkpoint was written by another query or is damaged: restore it from a backup, or start the query on a new checkpoint")
}

/// The column `name` of a state snapshot as an array of type `T`, or `ETL801` when it is
/// missing or of another type (a snapshot is read from disk: never trusted to fit).
pub fn state_column<T: Array + Clone + 'static>(
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

/// Links a [`StreamingEngine`] into the runtime.
pub struct EngineRegistration(pub &'static dyn StreamingEngine);

inventory::collect!(EngineRegistration);

/// The linked engine named `name`.
pub fn engine(name: &str) -> Option<&'static dyn StreamingEngine> {
    inventory::iter::<EngineRegistration>
        .into_iter()
        .map(|r| r.0)
        .find(|e| e.name() == name)
}

/// The engine that runs `plan`'s streaming transformations: that of the backend its
/// streaming steps are placed on, else (a query with no such step) any linked one, the
/// first by name.
pub fn engine_for(plan: &PipelinePlan) -> Result<&'static dyn StreamingEngine> {
    let wanted: Option<&str> = plan
        .transforms
        .iter()
        .map(|t| t.backend.as_str())
        .find(|b| engine(b).is_some());
    if let Some(name) = wanted {
        return Ok(engine(name).expect("found above"));
    }
    let mut all: Vec<&'static dyn StreamingEngine> = inventory::iter::<EngineRegistration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    all.sort_by_key(|e| e.name());
    all.first().copied().ok_or_else(|| {
        Error::new(
            &codes::NO_BACKEND,
            "no streaming engine is linked into this program",
        )
        .with_help("Link one (the `etlantic-datafusion` crate registers the embedded engine).")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_store::{CommitStats, ScanVisitor, StoreWrites};

    /// A store that holds nothing (the default `use_store` never reads it).
    struct Unused;

    impl StateStore for Unused {
        fn get(&self, _key: &[u8]) -> Result<Option<Vec<u8>>> {
            Ok(None)
        }
        fn write(&mut self, _writes: StoreWrites) -> Result<()> {
            Ok(())
        }
        fn scan(&self, _: &[u8], _: Option<&[u8]>, _: &mut ScanVisitor<'_>) -> Result<()> {
            Ok(())
        }
        fn commit(&mut self, _version: u64) -> Result<CommitStats> {
            Ok(CommitStats::default())
        }
        fn restore(&mut self, _version: Option<u64>) -> Result<()> {
            Ok(())
        }
        fn retain(&mut self, _oldest: u64) -> Result<()> {
            Ok(())
        }
        fn versions(&self) -> Result<Vec<u64>> {
            Ok(vec![])
        }
    }

    /// An operator of a third-party engine that keeps the trait's defaults.
    struct InMemoryOnly;

    impl OperatorState for InMemoryOnly {
        fn id(&self) -> &str {
            "plugin.0"
        }
        fn changelog_identity(&self) -> Option<&'static [&'static str]> {
            None
        }
        fn snapshot(&self) -> Result<RecordBatch> {
            Ok(RecordBatch::new_empty(std::sync::Arc::new(
                arrow::datatypes::Schema::empty(),
            )))
        }
        fn restore(&mut self, _state: &RecordBatch) -> Result<()> {
            Ok(())
        }
        fn changes(&mut self) -> Result<Option<RecordBatch>> {
            Ok(None)
        }
        fn rows_total(&self) -> u64 {
            0
        }
    }

    /// An operator that does not implement `use_store` refuses a store with `ETL435`,
    /// naming itself, and then has none: never a silent fallback to memory.
    #[test]
    fn an_operator_without_store_support_refuses_one() {
        let mut op = InMemoryOnly;
        let err = op.use_store(Box::new(Unused)).unwrap_err();
        assert_eq!(err.code(), "ETL435", "{err}");
        assert!(err.to_string().contains("`plugin.0`"), "{err}");
        assert!(op.store().is_none());
    }
}
