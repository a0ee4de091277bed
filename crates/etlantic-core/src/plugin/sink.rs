//! The sink plugin contract.

use crate::contract::Contract;
use crate::data::Table;
use crate::diagnostics::Result;
use crate::guarantee::SinkGuarantee;
use crate::storage::StorageOptions;
use crate::streaming::{ExecutionMode, OutputMode};
use crate::uri::BindingUri;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// What a sink can do, declared before it is created (the planner checks it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkCapabilities {
    /// Usable in batch runs.
    pub batch: bool,
    /// Usable in streaming runs.
    pub streaming: bool,
    /// Output modes accepted in streaming runs.
    pub output_modes: Vec<OutputMode>,
    /// How a batch is made durable, hence what end-to-end guarantee it can give.
    pub guarantee: SinkGuarantee,
}

/// Everything a provider needs to create a sink for one binding.
#[derive(Clone, Debug)]
pub struct SinkContext {
    /// The logical asset written.
    pub asset: String,
    /// The binding, with secret references already resolved.
    pub uri: BindingUri,
    /// The schema of the rows the sink will receive.
    pub schema: SchemaRef,
    /// The asset's contract, when it has one.
    pub contract: Option<Arc<Contract>>,
    /// Directory relative paths are resolved against (the project root).
    pub root: PathBuf,
    /// Batch or streaming.
    pub mode: ExecutionMode,
    /// The output mode of the query feeding the sink.
    pub output_mode: OutputMode,
    /// Options of the object stores the run reaches (the profile's `storage_options`),
    /// for a binding to an object-store location.
    pub storage_options: StorageOptions,
}

impl SinkContext {
    /// Resolves a location relative to the project root.
    pub fn resolve_path(&self, location: &str) -> PathBuf {
        crate::uri::located(&self.root, location)
    }
}

/// One batch of output handed to a sink.
#[derive(Clone, Debug)]
pub struct SinkBatch<'a> {
    /// Stable id of the query (the same across restarts of one checkpoint).
    pub query_id: &'a str,
    /// The micro-batch id (0 for a batch run).
    pub batch_id: u64,
    /// How to interpret the rows (append: new rows; update: changed rows; complete: the
    /// whole result, replacing what was written before).
    pub output_mode: OutputMode,
    /// The rows.
    pub data: &'a Table,
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The batch was written and is durable.
    Written {
        /// Rows written.
        rows: u64,
    },
    /// The sink recognised the batch as already committed and wrote nothing.
    AlreadyCommitted,
}

/// A writable output.
///
/// The runtime calls [`Sink::write`] once per micro-batch, after the batch's offsets are in
/// the write-ahead log and before the batch's commit-log entry is written. After a crash
/// the same batch (same `query_id`, `batch_id` and the same rows) may be written again.
///
/// # Invariants an implementer must keep
/// - When `write` returns `Ok`, the batch is durable in the target.
/// - When `write` returns `Err`, the target shows either the whole batch or none of it if
///   the sink declares [`crate::guarantee::SinkCommitProtocol::IdempotentByBatch`] or
///   [`crate::guarantee::SinkCommitProtocol::Transactional`]; plain-append sinks may
///   leave a partial batch (they declare at-least-once).
/// - A sink declaring `IdempotentByBatch` or `Transactional` must return
///   [`WriteOutcome::AlreadyCommitted`] and change nothing when asked to write a
///   `(query_id, batch_id)` it has already committed. The record of committed batches is
///   written atomically with the data, in the target, not in local memory.
/// - In [`OutputMode::Complete`] a write replaces the previous result.
/// - `write` never reorders or drops rows of the batch it is given.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Writes one batch.
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome>;

    /// Flushes and releases resources at the end of a run. Idempotent.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }

    /// The last batch id committed for `query_id`, when the sink keeps that record.
    async fn last_committed_batch(&mut self, _query_id: &str) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// Creates sinks for one URI scheme. Registered with [`inventory::submit!`] through
/// [`crate::plugin::SinkRegistration`].
///
/// # Invariants an implementer must keep
/// - `scheme()` is a constant lower-case URI scheme; no two linked providers may share it.
/// - `capabilities` answers from the URI alone (no I/O) and never promises more than the
///   created sinks keep: a declaration never claims a guarantee the tests do not show.
/// - `create` writes nothing.
pub trait SinkProvider: Send + Sync + 'static {
    /// The URI scheme handled, e.g. `file`.
    fn scheme(&self) -> &'static str;
    /// Further schemes it handles the same way (`postgresql` for `postgres`). Two linked
    /// providers must not claim one scheme (`ETL210`).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// One line describing the provider (for `etlantic plugins`).
    fn description(&self) -> &'static str;
    /// The query parameters its bindings accept, for the user docs (default: none). A
    /// provider that refuses unknown parameters names these in its diagnostic.
    fn options(&self) -> &'static [super::BindingOption] {
        &[]
    }
    /// What a sink for this binding can do.
    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities>;
    /// Creates the sink.
    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>>;
}
