//! The records of a checkpoint and the errors its readers raise: the leaf every other
//! checkpoint module builds on (no module of the checkpoint is imported here).

use etlantic_core::diagnostics::{codes, Diagnostic, Error};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// An `ETL706` I/O error on a checkpoint file; `at` is where it is, as its storage shows
/// it.
pub(crate) fn io_err(at: &str, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::IO_ERROR,
        format!("checkpoint {at}: {e}"),
    ))
}

/// An `ETL801` error for a checkpoint file that cannot be read as what it should hold.
pub(crate) fn corrupt_file(at: &str, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("checkpoint file {at} is unreadable: {e}"),
    ))
}

/// An `ETL801` error for a damaged record of a checkpoint log (the micro-batch log or the
/// state log): only a torn last record is repaired.
pub(crate) fn corrupt_log(at: &str, what: impl std::fmt::Display) -> Error {
    Error::from(
        Diagnostic::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("checkpoint log {at} is corrupt: {what}"),
        )
        .help(
            "Only the last record of the log can be torn by a crash, and it is repaired on \
             open; damage before it needs the checkpoint restored from a backup, or a new \
             checkpoint location.",
        ),
    )
}

/// The `metadata` file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// The query id, stable across restarts.
    pub id: String,
    /// The pipeline.
    pub pipeline: String,
    /// Fingerprint of the plan that created the checkpoint.
    pub plan_fingerprint: String,
    /// Fingerprint of what restarts must keep equal (sources, logic, sinks).
    pub compatibility: String,
    /// When the checkpoint was created (UTC ISO-8601).
    pub created_at: String,
    /// The state store that writes the operators' state (the profile's `state_store`);
    /// checkpoints written before stores could be chosen hold `memory` state.
    #[serde(default = "memory_store")]
    pub state_store: String,
    /// The application the query belongs to: the profile's `application_id`, else one
    /// generated when the checkpoint was created (or first opened by a version that
    /// knows applications) and kept from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
}

fn memory_store() -> String {
    etlantic_core::profile::MEMORY_STATE_STORE.into()
}

/// One source's range in a batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceRange {
    /// The end of the previous batch (`None` before the first).
    pub start: Option<Value>,
    /// The end of this batch (`None` while the source has produced nothing).
    pub end: Option<Value>,
}

/// An `offsets/<batch>` entry: the write-ahead log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OffsetEntry {
    /// The watermark in force for this batch (epoch milliseconds).
    pub batch_watermark_ms: i64,
    /// The watermark of the previous micro-batch (late rows are judged against it).
    pub late_watermark_ms: i64,
    /// The batch's timestamp (epoch milliseconds).
    pub batch_timestamp_ms: i64,
    /// `data` or `no_data`.
    pub kind: String,
    /// Source id → range.
    pub sources: BTreeMap<String, SourceRange>,
    /// Settings the batch ran with.
    pub conf: BTreeMap<String, String>,
}

/// A `commits/<batch>` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitEntry {
    /// The watermark for the next batch (epoch milliseconds).
    pub next_batch_watermark_ms: i64,
    /// Per watermarked source: the maximum event time seen so far (epoch ms).
    pub max_event_time_ms: BTreeMap<String, i64>,
    /// The newest state version durable when the batch committed: the batch's own
    /// (`batch + 1`) when it wrote its operators' state, an earlier one under a state
    /// checkpoint interval. A restart restores this version and runs the committed
    /// batches from it on again to rebuild the rest. Absent in checkpoints written before
    /// the interval existed, where it is always `batch + 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_version: Option<u64>,
}

impl CommitEntry {
    /// The state version a restart after `batch` (this entry's batch) restores.
    pub fn state_version_of(&self, batch: u64) -> u64 {
        self.state_version.unwrap_or(batch + 1)
    }
}

pub const FULL_SNAPSHOT_EVERY: u64 = 10;

/// Whether an operator with a changelog writes a whole snapshot at its `writes`th state
/// write (its version, when every micro-batch writes its state): on every
/// [`FULL_SNAPSHOT_EVERY`]th write, once the changes written since its last whole
/// snapshot (`changed_rows`, upserted and removed rows) are at least half as many rows as
/// its state holds now (`state_rows`).
///
/// A state that churns (a window's rows, in and out every few micro-batches) is
/// snapshotted every [`FULL_SNAPSHOT_EVERY`] versions, as in Spark. A state that only
/// grows (a join whose inputs have no watermark) is snapshotted each time it has about
/// doubled instead: rewriting all of it every [`FULL_SNAPSHOT_EVERY`] versions would cost
/// work proportional to its size each time (quadratic in all). Reading a version back
/// replays changes of at most about as many rows as the state holds (half of it, plus
/// the versions up to the next multiple of [`FULL_SNAPSHOT_EVERY`]).
pub fn whole_snapshot_due(writes: u64, changed_rows: u64, state_rows: u64) -> bool {
    writes.is_multiple_of(FULL_SNAPSHOT_EVERY) && 2 * changed_rows >= state_rows
}

/// State files kept per operator (older ones are removed).
pub(crate) const KEPT_VERSIONS: u64 = 2 * FULL_SNAPSHOT_EVERY;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_snapshots_are_due_every_tenth_version_once_the_changes_are_half_the_state() {
        // Churning state: due on the tenth version.
        assert!(whole_snapshot_due(10, 1_800, 200));
        assert!(!whole_snapshot_due(9, 1_800, 200));
        // Growing state: not while the changes are less than half the state, then due.
        assert!(!whole_snapshot_due(20, 499, 1_000));
        assert!(whole_snapshot_due(20, 500, 1_000));
        assert!(!whole_snapshot_due(21, 500, 1_000));
        // An empty state with no changes (a restart's counter starts at 0).
        assert!(whole_snapshot_due(30, 0, 0));
    }
}
