//! The `memory://<name>` sink: a process-global registry of everything written, for
//! tests and the conformance runner.
//!
//! Every streaming write is kept, in order, with its query id, batch id and output mode
//! ([`MemoryWrite`]); read them with [`MemorySink::snapshot`] or [`MemorySink::take`], or
//! the current result with [`MemorySink::rows`].
//!
//! - Idempotent by batch id: a `(query id, batch id)` already written is skipped
//!   ([`WriteOutcome::AlreadyCommitted`]), like a replay after a crash.
//! - Complete output mode: each write is the whole result, so the current result
//!   ([`MemorySink::rows`]) is the last complete table; the earlier writes stay in the
//!   snapshot for inspection.
//! - Batch runs overwrite: each write replaces the registry entry's content.
//!
//! The record of committed batches lives with the data, in the registry, so it survives
//! the sink instance (a restarted query in the same process sees it).

use arrow::array::RecordBatch;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use std::collections::{BTreeSet, HashMap};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// One write kept by a memory sink.
#[derive(Clone, Debug)]
pub struct MemoryWrite {
    /// The query that wrote it.
    pub query_id: String,
    /// Its batch id.
    pub batch_id: u64,
    /// How to interpret its rows.
    pub output_mode: OutputMode,
    /// The rows.
    pub table: Table,
}

#[derive(Debug, Default)]
struct Entry {
    writes: Vec<MemoryWrite>,
    committed: BTreeSet<(String, u64)>,
}

static SINKS: LazyLock<Mutex<HashMap<String, Entry>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn sinks() -> MutexGuard<'static, HashMap<String, Entry>> {
    SINKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `memory://<name>` sink, and the registry of what memory sinks wrote.
#[derive(Clone, Debug)]
pub struct MemorySink {
    name: String,
    mode: ExecutionMode,
}

impl MemorySink {
    /// A sink writing to the registry entry `name`.
    pub fn new(name: impl Into<String>, mode: ExecutionMode) -> Self {
        MemorySink {
            name: name.into(),
            mode,
        }
    }

    /// The writes kept under `name`, in order (empty when there are none).
    pub fn snapshot(name: &str) -> Vec<MemoryWrite> {
        sinks()
            .get(name)
            .map(|e| e.writes.clone())
            .unwrap_or_default()
    }

    /// Removes and returns the writes kept under `name`, and forgets its committed batch
    /// ids.
    pub fn take(name: &str) -> Vec<MemoryWrite> {
        sinks().remove(name).map(|e| e.writes).unwrap_or_default()
    }

    /// The current result under `name`: the rows of the last complete-mode write and of
    /// every write after it, or of every write when none is in complete mode.
    pub fn rows(name: &str) -> Vec<RecordBatch> {
        let writes = Self::snapshot(name);
        let start = writes
            .iter()
            .rposition(|w| w.output_mode == OutputMode::Complete)
            .unwrap_or(0);
        writes
            .into_iter()
            .skip(start)
            .flat_map(|w| w.table.batches)
            .collect()
    }

    /// The batch ids committed under `name` by `query_id`, ascending.
    pub fn committed_batches(name: &str, query_id: &str) -> Vec<u64> {
        sinks()
            .get(name)
            .map(|e| {
                e.committed
                    .iter()
                    .filter(|(q, _)| q == query_id)
                    .map(|(_, b)| *b)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets everything kept under `name`.
    pub fn clear(name: &str) {
        sinks().remove(name);
    }
}

/// The provider of `memory://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemorySinkProvider;

inventory::submit! { SinkRegistration(&MemorySinkProvider) }

fn sink_name(uri: &BindingUri) -> Result<String> {
    let name = uri.location.trim_matches('/');
    if name.is_empty() {
        return Err(Error::new(
            &codes::BAD_URI,
            format!("`{uri}`: a memory binding needs a name, e.g. memory://results"),
        ));
    }
    Ok(name.to_string())
}

impl SinkProvider for MemorySinkProvider {
    fn scheme(&self) -> &'static str {
        "memory"
    }

    fn description(&self) -> &'static str {
        "In-memory results for tests (etlantic_sinks::memory::MemorySink), idempotent by batch id"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        sink_name(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append, OutputMode::Update, OutputMode::Complete],
            guarantee: SinkGuarantee::new(SinkCommitProtocol::IdempotentByBatch),
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(MemorySink::new(sink_name(&ctx.uri)?, ctx.mode)))
    }
}

#[async_trait::async_trait]
impl Sink for MemorySink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let mut all = sinks();
        let entry = all.entry(self.name.clone()).or_default();
        let key = (batch.query_id.to_string(), batch.batch_id);
        let write = MemoryWrite {
            query_id: batch.query_id.to_string(),
            batch_id: batch.batch_id,
            output_mode: batch.output_mode,
            table: batch.data.clone(),
        };
        if self.mode == ExecutionMode::Batch {
            entry.writes = vec![write];
            entry.committed.insert(key);
        } else {
            if entry.committed.contains(&key) {
                return Ok(WriteOutcome::AlreadyCommitted);
            }
            entry.writes.push(write);
            entry.committed.insert(key);
        }
        Ok(WriteOutcome::Written {
            rows: batch.data.num_rows() as u64,
        })
    }

    async fn last_committed_batch(&mut self, query_id: &str) -> Result<Option<u64>> {
        Ok(Self::committed_batches(&self.name, query_id)
            .last()
            .copied())
    }
}
