//! The source plugin contract.

use crate::contract::Contract;
use crate::data::{DataLoss, Offset, RejectedRecord, RowOrigins};
use crate::diagnostics::Result;
use crate::guarantee::SourceGuarantee;
use crate::storage::{Storage, StorageOptions};
use crate::streaming::ExecutionMode;
use crate::uri::BindingUri;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// How much one micro-batch may read (Spark's `maxFilesPerTrigger`,
/// `maxOffsetsPerTrigger`). `None` means no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLimit {
    /// At most this many new files per micro-batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files: Option<usize>,
    /// At most this many records per micro-batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records: Option<u64>,
}

impl ReadLimit {
    /// No limit.
    pub fn unlimited() -> Self {
        Self::default()
    }
}

/// What one read returned: the good rows and every rejected record.
#[derive(Clone, Debug, Default)]
pub struct SourceBatch {
    /// Rows that satisfy the source contract's schema, in the source's schema.
    pub batches: Vec<RecordBatch>,
    /// Records that did not parse or did not satisfy the contract, with their positions.
    pub rejected: Vec<RejectedRecord>,
    /// Where the good rows came from, row for row (empty when the source does not say;
    /// a source that fills it must cover every row of `batches`, in order).
    pub origins: RowOrigins,
    /// Records of the range that were gone when it was read and that the binding allowed
    /// the query to go on without (see [`DataLoss`]).
    pub lost: Vec<DataLoss>,
}

impl SourceBatch {
    /// Number of good rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// What a source can do, declared before it is created (the planner checks it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCapabilities {
    /// Can be read to its end in a batch run.
    pub bounded: bool,
    /// Can be read incrementally in a streaming run.
    pub unbounded: bool,
    /// Whether offset ranges can be re-read with the same result.
    pub guarantee: SourceGuarantee,
}

/// Everything a provider needs to create a source for one binding.
#[derive(Clone, Debug)]
pub struct SourceContext {
    /// The logical asset being read.
    pub asset: String,
    /// The binding, with secret references already resolved.
    pub uri: BindingUri,
    /// The Arrow schema the source must produce (derived from `contract`).
    pub schema: SchemaRef,
    /// The asset's data contract, for record-level checks while decoding.
    pub contract: Option<Arc<Contract>>,
    /// Directory relative paths are resolved against (the project root).
    pub root: PathBuf,
    /// Batch or streaming.
    pub mode: ExecutionMode,
    /// A directory in the checkpoint that belongs to this source (`sources/<n>/`), for
    /// sources that must remember what they have seen (e.g. the files of a directory
    /// stream). `None` in batch runs. It may be on an object store: write whole files
    /// (see [`Storage::appends`]).
    pub state: Option<Arc<dyn Storage>>,
    /// Options of the object stores the run reaches (the profile's `storage_options`),
    /// for a binding to an object-store location.
    pub storage_options: StorageOptions,
}

impl SourceContext {
    /// Resolves a location relative to the project root.
    pub fn resolve_path(&self, location: &str) -> PathBuf {
        crate::uri::located(&self.root, location)
    }
}

/// A readable input: a finite file, a directory that grows, a log, a generator.
///
/// The runtime drives a source like Spark's `Source`: it asks for the latest offset,
/// writes `(start, end]` to its write-ahead log, reads that range, and later reports the
/// range as committed.
///
/// # Invariants an implementer must keep
/// - `schema()` never changes over the life of the source, and every batch returned by
///   `read` has exactly that schema.
/// - Offsets are plain JSON and totally describe a position: a new instance of the same
///   source (after a restart) must accept offsets written by an earlier instance.
/// - `latest_offset(start, limit)` never returns an offset before `start`, and returns
///   `start` itself (or `None` when `start` is `None`) when there is nothing new. It must
///   respect `limit`.
/// - For a source declaring [`SourceGuarantee::Replayable`], `read(start, end)` returns the
///   same records every time it is called with the same arguments, including after a
///   restart, until `commit(end)` has been called for an offset at or after `end`.
/// - `read` never drops a record silently: a record that cannot be decoded into the
///   schema, or that breaks the contract's record-level rules, is returned in
///   [`SourceBatch::rejected`] with its position and raw text. Records of the range that
///   no longer exist (deleted by retention) fail the read with `ETL712`, unless the
///   binding allows going on, and then each gap is returned in [`SourceBatch::lost`].
/// - `commit(end)` only lets the source forget data up to `end`; it must be idempotent.
#[async_trait]
pub trait Source: Send + Sync {
    /// The schema of every batch this source returns.
    fn schema(&self) -> SchemaRef;

    /// The newest offset that may be read now, starting after `start` (the end of the
    /// previous batch, `None` at the very beginning), bounded by `limit`.
    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>>;

    /// Reads the records after `start` up to and including `end`.
    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch>;

    /// How far the read going on is (files and bytes done of the read's, records
    /// decoded), for progress bars: a source that reads much in one call (a directory in a
    /// batch run) returns the counters it updates as it reads, the same instance every
    /// time. Progress only: it never decides what is read. `None` (the default): not
    /// told.
    fn read_progress(&self) -> Option<Arc<crate::read_progress::ReadProgress>> {
        None
    }

    /// What the source holds after `position` (the end of the last micro-batch read)
    /// that the query has not read yet, as far as the source knows it from its last
    /// [`Source::latest_offset`] — it must not read data or make requests for it; `None`
    /// (the default) when it cannot tell.
    fn backlog(&self, _position: Option<&Offset>) -> Option<crate::data::Backlog> {
        None
    }

    /// Data up to `end` is durably processed; the source may release it.
    async fn commit(&mut self, _end: &Offset) -> Result<()> {
        Ok(())
    }

    /// A hint, given once after creation when the runtime can prove it: the pipeline
    /// reads only `columns` of the schema, every other column's values are never looked
    /// at (not by a step, a sink, the quarantine or a side output). A source may then skip
    /// decoding the other columns and return them as nulls — if it still applies every
    /// record-level rule of its contract, so a column that is required, constrained or
    /// converted in a way that can reject a record is decoded anyway. The schema does not
    /// change. The default ignores the hint.
    fn read_only(&mut self, _columns: &[String]) {}

    /// Whether the source itself rejects records that break the record rules of its
    /// contract (`logicalTypeOptions` ranges, lengths and patterns), naming each record's
    /// position (file and line, partition and offset). When `true`, the runtime leaves
    /// those rules out of the source's quality gate; when `false` (the default), the gate
    /// evaluates them on the decoded batches, so a source that does not check them loses
    /// nothing.
    fn checks_record_rules(&self) -> bool {
        false
    }

    /// Human-readable description of an offset for progress records (defaults to JSON).
    fn describe_offset(&self, offset: &Offset) -> serde_json::Value {
        offset.0.clone()
    }
}

/// Creates sources for one URI scheme. Registered with [`inventory::submit!`] through
/// [`crate::plugin::SourceRegistration`].
///
/// # Invariants an implementer must keep
/// - `scheme()` is a constant lower-case URI scheme; no two linked providers may share it.
/// - `capabilities` must be answered from the URI alone (no I/O), so that planning works
///   without touching the data, and it must not promise more than `create`d sources do.
/// - `create` does not read data; it may open connections or check that paths exist, and
///   reports problems as diagnostics with codes.
pub trait SourceProvider: Send + Sync + 'static {
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
    /// What a source for this binding can do.
    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities>;
    /// Creates the source.
    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>>;
}
