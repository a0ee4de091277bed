//! The checkpoint directory, in Spark's layout but for the micro-batch log:
//!
//! ```text
//! <checkpoint>/
//!   metadata                 {"id": query id, "planFingerprint", "compatibility", ...}
//!   log/<first batch>.log    the micro-batch log (see super::batch_log): per micro-batch
//!                            its offsets record (the write-ahead log: source ranges,
//!                            watermark, timestamp, before processing) and its commit
//!                            record (after the sinks: next watermark, max event times)
//!   state/<op>/<version>.arrow   operator state after batch `version - 1` (Arrow IPC)
//!   state-changes/<first version>.log   or only its changes since the previous version
//!                            written: one record per state write, every operator's
//!                            changes in it (see super::state_log)
//!   sources/<n>/             per-source state (e.g. the files a directory stream has seen)
//!   progress.jsonl           one StreamingQueryProgress per micro-batch (rotated to
//!                            progress.1.jsonl at 8 MiB, see `ProgressLog`)
//!   .lock                    held by the running query
//! ```
//!
//! Spark keeps the offsets and commits as one file per micro-batch in `offsets/` and
//! `commits/`; a checkpoint written that way (by an earlier ETLantic) is still read, and
//! continued in the log.
//!
//! An operator that keeps a changelog (a stream-stream join: its state grows by the
//! rows of each micro-batch, and rewriting all of it every micro-batch would cost more and
//! more) writes its changes every version and a whole snapshot every
//! [`FULL_SNAPSHOT_EVERY`] versions once the changes since the last one are half the
//! state (see [`whole_snapshot_due`]), like Spark's HDFS state store (`N.snapshot` and
//! `N.delta`) and RocksDB's changelog checkpointing. A version is read as its whole
//! snapshot, or as its changes applied to the version they were written since (named in
//! the changelog record), read the same way back to a whole snapshot or to version 0,
//! whose state is empty. The changes are appended to the state log
//! ([`super::state_log`]) and synced before the commit; the whole snapshot is written in
//! the background after them (the query skips one while the previous is still being
//! written), so a version can have both. Files and changelog segments are removed only
//! once a later whole snapshot is durable (see [`StateFiles::write`]).
//!
//! A checkpoint written before the state log has a file per operator and version,
//! `state/<op>/<version>.arrow` for every operator and `<version>.delta.arrow` for
//! changes (naming its `since` in [`SINCE_METADATA`]); those are still read, and a
//! restart continues in the state log.
//!
//! Under a state checkpoint interval (the profile's `state_checkpoint_interval`) only
//! some micro-batches write their operators' state: versions in between have no files,
//! and each commit names the newest version that was durable
//! ([`CommitEntry::state_version`]).
//!
//! Every file but the two logs is written atomically: a temporary file in the same
//! directory, `fsync`, `rename`, then `fsync` of the directory, so a crash leaves either
//! the old or the new file, never a torn one. The logs are appended to, each record with
//! a checksum (see [`super::batch_log`] and [`super::state_log`] for what a crash can
//! leave and how it is repaired).

use super::batch_log::BatchLog;
use super::progress::ProgressLog;
use super::state_log::{LogEntry, Logged, StateLog};
use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array,
};
use arrow::compute::kernels::boolean::not;
use arrow::compute::{
    cast, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch, SortColumn,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::CompressionType;
use arrow::row::{RowConverter, SortField};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::storage::{self, Storage, Sub};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn io_err(at: &str, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::IO_ERROR,
        format!("checkpoint {at}: {e}"),
    ))
}

fn corrupt(at: &str, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("checkpoint file {at} is unreadable: {e}"),
    ))
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

/// A checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    root: PathBuf,
    /// Where its files are (the local directory `root`, or what a test mounted there).
    storage: Arc<dyn Storage>,
    log: BatchLog,
    state_log: Arc<StateLog>,
    /// `progress.jsonl`, rotated (see [`ProgressLog`]).
    progress: Mutex<ProgressLog>,
    _lock: storage::Lock,
}

impl Checkpoint {
    /// Opens (creating if needed) a checkpoint directory and takes its lock. Its files
    /// go through [`etlantic_core::storage::open`] of `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let storage = storage::open(&root);
        let lock = storage.lock(".lock").map_err(|e| {
            if e.code() == codes::CHECKPOINT_LOCKED.code {
                Diagnostic::new(
                    &codes::CHECKPOINT_LOCKED,
                    format!("checkpoint {} is in use by another query", root.display()),
                )
                .into()
            } else {
                e
            }
        })?;
        let sub = |dir: &str| -> Arc<dyn Storage> { Arc::new(Sub::new(storage.clone(), dir)) };
        let log = BatchLog::open_in(sub("log"))?;
        let state_log = Arc::new(StateLog::open_in(sub("state-changes"), sub("state"))?);
        let progress = Mutex::new(ProgressLog::in_storage(storage.clone()));
        Ok(Checkpoint {
            root,
            storage,
            log,
            state_log,
            progress,
            _lock: lock,
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read_json<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        match self.storage.read(path)? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| corrupt(&self.storage.display(path), e)),
            None => Ok(None),
        }
    }

    /// The metadata, if the checkpoint has been used before.
    pub fn metadata(&self) -> Result<Option<Metadata>> {
        self.read_json("metadata")
    }

    /// Writes the metadata, atomically and durably.
    pub fn write_metadata(&self, m: &Metadata) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(m).expect("checkpoint entries serialise");
        storage::put_bytes(self.storage.as_ref(), "metadata", &bytes)
    }

    /// The batch ids of a directory of Spark's layout (`offsets/`, `commits/`), if the
    /// checkpoint has one (see the module docs).
    fn legacy_ids(&self, dir: &str) -> Result<Vec<u64>> {
        let mut ids: Vec<u64> = self
            .storage
            .list(dir)?
            .iter()
            .filter_map(|name| name.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The latest batch id with an offsets record.
    pub fn latest_offsets(&self) -> Result<Option<u64>> {
        let legacy = self.legacy_ids("offsets")?.last().copied();
        Ok(self.log.latest_offsets().max(legacy))
    }

    /// The latest batch id with a commit record.
    pub fn latest_commit(&self) -> Result<Option<u64>> {
        let legacy = self.legacy_ids("commits")?.last().copied();
        Ok(self.log.latest_commit().max(legacy))
    }

    /// The offsets record of `batch`.
    pub fn offsets(&self, batch: u64) -> Result<Option<OffsetEntry>> {
        match self.log.offsets(batch)? {
            Some(e) => Ok(Some(e)),
            None => self.read_json(&format!("offsets/{batch}")),
        }
    }

    /// Logs `batch`'s offsets (the write-ahead log entry), durably.
    pub fn write_offsets(&self, batch: u64, e: &OffsetEntry) -> Result<()> {
        self.log.append_offsets(batch, e)
    }

    /// The commit record of `batch`.
    pub fn commit(&self, batch: u64) -> Result<Option<CommitEntry>> {
        match self.log.commit(batch)? {
            Some(e) => Ok(Some(e)),
            None => self.read_json(&format!("commits/{batch}")),
        }
    }

    /// Logs `batch`'s commit. It is durable once the next offsets are written or
    /// [`Checkpoint::sync_log`] returns (see [`super::batch_log`]).
    pub fn write_commit(&self, batch: u64, e: &CommitEntry) -> Result<()> {
        self.log.append_commit(batch, e)
    }

    /// Makes every offsets and commit record written so far durable.
    pub fn sync_log(&self) -> Result<()> {
        self.log.sync()
    }

    /// The directory of source number `n`.
    pub fn source_dir(&self, n: usize) -> PathBuf {
        self.root.join("sources").join(n.to_string())
    }

    /// The operator state files, as a handle that can be moved to another thread (the
    /// runtime writes the snapshots while the sinks write).
    pub fn state_files(&self) -> StateFiles {
        StateFiles {
            storage: Arc::new(Sub::new(self.storage.clone(), "state")),
            log: self.state_log.clone(),
        }
    }

    /// Writes an operator's state snapshot for `version` (the state after batch
    /// `version - 1`).
    pub fn write_state(&self, op: &str, version: u64, state: &RecordBatch) -> Result<()> {
        self.state_files().write(op, version, state)
    }

    /// Reads an operator's state snapshot for `version`.
    pub fn read_state(&self, op: &str, version: u64) -> Result<Option<RecordBatch>> {
        self.state_files().read(op, version)
    }

    /// Reads an operator's state for `version`, from a whole snapshot and the changes
    /// written after it; `identity` names the columns that identify a state row (the
    /// operator's [`super::operators::StatefulOperator::changelog_identity`]).
    pub fn read_state_chain(
        &self,
        op: &str,
        version: u64,
        identity: Option<&[&str]>,
    ) -> Result<Option<RecordBatch>> {
        self.state_files().read_chain(op, version, identity)
    }

    /// Appends a progress record to `progress.jsonl` (rotated, see [`ProgressLog`]).
    pub fn append_progress(&self, progress: &Value) -> Result<()> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(progress)
    }
}

/// The operators' state: the `state/` directory, with their whole snapshots as one Arrow
/// IPC file per operator and version (`state/<op>/<version>.arrow`), and the state
/// log (`state-changes/`, see [`super::state_log`]).
#[derive(Clone, Debug)]
pub struct StateFiles {
    /// The `state/` directory.
    storage: Arc<dyn Storage>,
    log: Arc<StateLog>,
}

impl StateFiles {
    fn path(&self, op: &str, version: u64) -> String {
        format!("{op}/{version}.arrow")
    }

    fn delta_path(&self, op: &str, version: u64) -> String {
        format!("{op}/{version}.delta.arrow")
    }

    fn write_file(&self, path: &str, batch: &RecordBatch) -> Result<()> {
        // Encoded straight into the file (the storage buffers its writes): a
        // micro-batch's state can be tens of MB, which an in-memory copy would allocate
        // (and fault in) again for every file.
        let at = self.storage.display(path);
        self.storage.put(path, &mut |out| {
            // LZ4 frames: state holds long runs of nulls (a join side's columns in the
            // other side's rows, removed rows) and repeated values; compressing costs less
            // than writing and syncing them. Readers decompress transparently.
            let options = IpcWriteOptions::default()
                .try_with_compression(Some(CompressionType::LZ4_FRAME))
                .map_err(|e| io_err(&at, e))?;
            let mut w = FileWriter::try_new_with_options(out, &batch.schema(), options)
                .map_err(|e| io_err(&at, e))?;
            w.write(batch).map_err(|e| io_err(&at, e))?;
            w.finish().map_err(|e| io_err(&at, e))
        })
    }

    /// Called once the whole snapshot of `version` is durable: removes the files of
    /// versions no chain can need any more. A restart may still re-run the batch before
    /// `version`, whose chain reaches back to the previous whole snapshot, so files
    /// before that one go, and only those more than [`KEPT_VERSIONS`] back (the rest
    /// stay for inspection). Changes alone never remove anything: the chain of the
    /// newest version reaches back to the newest whole snapshot, however old it is (a
    /// snapshot written in the background may have been skipped).
    fn forget_before(&self, op: &str, version: u64) {
        let Ok(entries) = self.storage.list(op) else {
            return;
        };
        let files: Vec<(u64, bool, String)> = entries
            .iter()
            .filter_map(|name| {
                let (number, whole) = match name.strip_suffix(".delta.arrow") {
                    Some(n) => (n, false),
                    None => (name.strip_suffix(".arrow")?, true),
                };
                Some((number.parse().ok()?, whole, format!("{op}/{name}")))
            })
            .collect();
        let Some(previous) = files
            .iter()
            .filter(|(v, whole, _)| *whole && *v < version)
            .map(|(v, _, _)| *v)
            .max()
        else {
            return;
        };
        let oldest_kept = previous.min(version.saturating_sub(KEPT_VERSIONS));
        for (v, _, path) in &files {
            if *v < oldest_kept {
                let _ = self.storage.delete(path);
            }
        }
    }

    /// Writes an operator's whole snapshot for `version` atomically and durably.
    pub fn write(&self, op: &str, version: u64, state: &RecordBatch) -> Result<()> {
        self.write_file(&self.path(op, version), state)?;
        self.forget_before(op, version);
        self.log.note_whole(op, version);
        Ok(())
    }

    /// Writes an operator's changes since version `since` (see [`changes_batch`]): the
    /// previous version whose state was written, `version - 1` unless a state checkpoint
    /// interval skipped some. [`StateFiles::read_chain`] follows `since`.
    pub fn write_changes(
        &self,
        op: &str,
        version: u64,
        since: u64,
        changes: &RecordBatch,
    ) -> Result<()> {
        self.write_logged(version, since, &[(op, LogEntry::Changes(changes))])
    }

    /// Writes what `version` holds of every operator in `entries` (operator id, its
    /// changes since `since` or its whole state) as one record of the state log, durably
    /// (one sync for all of them).
    pub fn write_logged(
        &self,
        version: u64,
        since: u64,
        entries: &[(&str, LogEntry<'_>)],
    ) -> Result<()> {
        self.log.append(version, since, entries)?;
        // A whole snapshot file of this version from before a restart belongs to a run of
        // the batch that did not commit; the chain must use this record instead.
        if self.log.may_have_stale_whole(version) {
            for (op, _) in entries {
                let path = self.path(op, version);
                if self.storage.size(&path)?.is_some() {
                    self.storage.delete(&path)?;
                    self.log.note_whole_removed(op);
                }
            }
        }
        Ok(())
    }

    /// What the state log holds of `op` at `version`, or a changes file of the layout
    /// before it (`<version>.delta.arrow`).
    fn read_logged(&self, op: &str, version: u64) -> Result<Option<Logged>> {
        if let Some(logged) = self.log.read(op, version)? {
            return Ok(Some(logged));
        }
        let path = self.delta_path(op, version);
        match self.read_file(&path)? {
            Some(changes) => Ok(Some(Logged::Changes {
                since: since_of(&self.storage.display(&path), &changes, version)?,
                changes,
            })),
            None => Ok(None),
        }
    }

    /// Reads the state of `version`: a whole snapshot of it (a file, or an entry of the
    /// state log), or its changes applied to the state of the version they were written
    /// since (found the same way, back to a whole snapshot or to version 0, whose state
    /// is empty). `None` when nothing was written for `version`.
    pub fn read_chain(
        &self,
        op: &str,
        version: u64,
        identity: Option<&[&str]>,
    ) -> Result<Option<RecordBatch>> {
        let mut deltas = Vec::new();
        let mut v = version;
        let base = loop {
            if let Some(full) = self.read(op, v)? {
                break Some(full);
            }
            match (identity, self.read_logged(op, v)?) {
                (_, Some(Logged::Whole(full))) => break Some(full),
                (Some(_), Some(Logged::Changes { since, changes })) => {
                    deltas.push(changes);
                    if since == 0 {
                        break None;
                    }
                    v = since;
                }
                (None, Some(Logged::Changes { .. })) => {
                    return Err(corrupt(
                        &self.storage.display(op),
                        format!("version {v} holds changes, but the operator keeps no changelog"),
                    ))
                }
                (_, None) if deltas.is_empty() => return Ok(None),
                (_, None) => {
                    return Err(corrupt(
                        &self.storage.display(op),
                        format!("the state changes of version {v} are missing"),
                    ))
                }
            }
        };
        let Some(identity) = identity else {
            return Ok(base);
        };
        let mut state = base;
        for d in deltas.iter().rev() {
            state = Some(apply_changes(state.as_ref(), d, identity)?);
        }
        Ok(state)
    }

    fn read_file(&self, path: &str) -> Result<Option<RecordBatch>> {
        let Some(bytes) = self.storage.read(path)? else {
            return Ok(None);
        };
        let at = self.storage.display(path);
        let mut file = std::io::Cursor::new(bytes);
        let len = file.get_ref().len() as u64;
        super::ipc_guard::check_file(&mut file, len, &at)?;
        super::ipc_guard::decode(&at, || {
            let mut reader = FileReader::try_new(file, None).map_err(|e| corrupt(&at, e))?;
            match reader.next() {
                Some(b) => Ok(Some(b.map_err(|e| corrupt(&at, e))?)),
                None => Err(corrupt(&at, "no record batch")),
            }
        })
    }

    /// Reads an operator's whole snapshot for `version` (`None` when there is none).
    pub fn read(&self, op: &str, version: u64) -> Result<Option<RecordBatch>> {
        self.read_file(&self.path(op, version))
    }
}

/// The schema metadata key of a changes file that names the version the changes were
/// written since.
pub const SINCE_METADATA: &str = "etlantic.state.since";

/// The version the changes file `path` of `version` was written since: its
/// [`SINCE_METADATA`], or `version - 1` for files written before it existed.
fn since_of(path: &str, changes: &RecordBatch, version: u64) -> Result<u64> {
    match changes.schema().metadata().get(SINCE_METADATA) {
        None => Ok(version.saturating_sub(1)),
        Some(s) => match s.parse::<u64>() {
            Ok(since) if since < version => Ok(since),
            _ => Err(corrupt(
                path,
                format!("`{SINCE_METADATA}` is `{s}`, not a version before {version}"),
            )),
        },
    }
}

/// A whole snapshot every this many versions; changes in between.
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

/// The column of a changes batch that marks a removed row.
pub const REMOVED: &str = "__removed";

/// The column of a changes batch by which one removed row stands for a run of them:
/// every identity from the row's own to the one whose last identity column is this
/// value (the other identity columns equal), inclusive. Null for a single row.
pub const REMOVED_THROUGH: &str = "__removed_through";

fn relaxed(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<Field>>(),
    )
}

/// Rows in the layout `schema` (a snapshot's) that stand for removed state rows: the
/// `identity` columns given, nulls elsewhere.
pub fn removed_rows(schema: &SchemaRef, identity: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let n = identity.first().map(|(_, a)| a.len()).unwrap_or(0);
    let cols = schema
        .fields()
        .iter()
        .map(|f| {
            identity
                .iter()
                .find(|(name, _)| name == f.name())
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| new_null_array(f.data_type(), n))
        })
        .collect();
    RecordBatch::try_new(Arc::new(relaxed(schema)), cols).map_err(engine_err)
}

/// Runs of removed state rows in the layout `schema` (a snapshot's): `prefix` gives all
/// identity columns but the last, `last` names the last, which holds non-negative
/// integers; run `i` removes the identities from `first[i]` to `through[i]` of it.
/// Nulls elsewhere. A state that leaves in arrival order (a join's rows, evicted by
/// the watermark) logs a few runs per micro-batch instead of a row per removed row.
pub fn removed_runs<'a>(
    schema: &SchemaRef,
    mut prefix: Vec<(&'a str, ArrayRef)>,
    last: &'a str,
    first: UInt64Array,
    through: UInt64Array,
) -> Result<RecordBatch> {
    let field = schema.field_with_name(last).map_err(engine_err)?;
    let first = cast(&(Arc::new(first) as ArrayRef), field.data_type()).map_err(engine_err)?;
    prefix.push((last, first));
    let rows = removed_rows(schema, prefix)?;
    let mut fields: Vec<Field> = rows
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(REMOVED_THROUGH, DataType::UInt64, true));
    let mut cols = rows.columns().to_vec();
    cols.push(Arc::new(through));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(engine_err)
}

/// A changes batch: the rows added or changed (`upserts`, batches in a snapshot's
/// layout), then the `removed` ones (see [`removed_rows`] and [`removed_runs`]), with a
/// [`REMOVED`] column telling which. The parts are copied once, into the result.
pub fn changes_batch(upserts: &[RecordBatch], removed: &RecordBatch) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = relaxed(&removed.schema())
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(REMOVED, DataType::Boolean, false));
    let schema = Arc::new(Schema::new(fields));
    let runs = removed.schema().index_of(REMOVED_THROUGH).is_ok();
    let part = |b: &RecordBatch, removed: bool| -> Result<RecordBatch> {
        let mut cols = b.columns().to_vec();
        // Upserted rows stand for themselves only.
        if runs && !removed {
            cols.push(new_null_array(&DataType::UInt64, b.num_rows()));
        }
        cols.push(Arc::new(BooleanArray::from(vec![removed; b.num_rows()])));
        RecordBatch::try_new(schema.clone(), cols).map_err(engine_err)
    };
    let mut parts = upserts
        .iter()
        .map(|b| part(b, false))
        .collect::<Result<Vec<_>>>()?;
    parts.push(part(removed, true)?);
    concat_batches(&schema, &parts).map_err(engine_err)
}

/// `base` (a snapshot, or nothing) with a changes batch applied: rows of `base` that the
/// changes replace or remove (same `identity` values) go, the upserted rows come in, and
/// the result is ordered by `identity`.
pub fn apply_changes(
    base: Option<&RecordBatch>,
    changes: &RecordBatch,
    identity: &[&str],
) -> Result<RecordBatch> {
    let bad = |m: String| Error::new(&codes::CHECKPOINT_CORRUPT, format!("state changes: {m}"));
    let flags = changes
        .column_by_name(REMOVED)
        .and_then(|c| c.as_any().downcast_ref::<BooleanArray>().cloned())
        .ok_or_else(|| bad(format!("no `{REMOVED}` column")))?;
    let data_schema = {
        let fields: Vec<Field> = changes
            .schema()
            .fields()
            .iter()
            .filter(|f| f.name() != REMOVED && f.name() != REMOVED_THROUGH)
            .map(|f| f.as_ref().clone())
            .collect();
        Arc::new(Schema::new(fields))
    };
    let data = |b: &RecordBatch| -> Result<RecordBatch> {
        let cols = data_schema
            .fields()
            .iter()
            .map(|f| {
                let c = b
                    .column_by_name(f.name())
                    .ok_or_else(|| bad(format!("no column `{}`", f.name())))?;
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    cast(c, f.data_type()).map_err(engine_err)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            data_schema.clone(),
            cols,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
        )
        .map_err(engine_err)
    };
    let upserts = data(
        &filter_record_batch(changes, &not(&flags).map_err(engine_err)?).map_err(engine_err)?,
    )?;
    let id_cols = |b: &RecordBatch| -> Result<Vec<ArrayRef>> {
        identity
            .iter()
            .map(|c| {
                b.column_by_name(c)
                    .cloned()
                    .ok_or_else(|| bad(format!("no identity column `{c}`")))
            })
            .collect()
    };
    let converter = RowConverter::new(
        id_cols(changes)?
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )
    .map_err(engine_err)?;
    let touched_rows = converter
        .convert_columns(&id_cols(changes)?)
        .map_err(engine_err)?;
    let touched: HashSet<&[u8]> = (0..touched_rows.num_rows())
        .map(|i| touched_rows.row(i).data())
        .collect();
    let runs = RemovedRuns::of(changes, identity)?;
    let mut parts = Vec::new();
    if let Some(base) = base {
        let base = data(base)?;
        let base_ids = id_cols(&base)?;
        let ids = converter.convert_columns(&base_ids).map_err(engine_err)?;
        let in_run = runs.contains_fn(&base_ids)?;
        let keep = BooleanArray::from(
            (0..ids.num_rows())
                .map(|i| !touched.contains(ids.row(i).data()) && !in_run(i))
                .collect::<Vec<bool>>(),
        );
        parts.push(filter_record_batch(&base, &keep).map_err(engine_err)?);
    }
    parts.push(upserts);
    let merged = concat_batches(&data_schema, &parts).map_err(engine_err)?;
    let sort: Vec<SortColumn> = id_cols(&merged)?
        .into_iter()
        .map(|values| SortColumn {
            values,
            options: None,
        })
        .collect();
    let order = lexsort_to_indices(&sort, None).map_err(engine_err)?;
    take_record_batch(&merged, &order).map_err(engine_err)
}

/// The runs of removed identities of a changes batch (its rows with a
/// [`REMOVED_THROUGH`]): per value of the identity columns but the last (encoded as
/// rows; empty when the identity is one column), the ranges of the last, sorted.
struct RemovedRuns {
    /// Encodes the identity columns but the last (`None`: there are none).
    prefix: Option<RowConverter>,
    ranges: std::collections::HashMap<Vec<u8>, Vec<(u64, u64)>>,
}

impl RemovedRuns {
    fn of(changes: &RecordBatch, identity: &[&str]) -> Result<Self> {
        let bad = |m: String| Error::new(&codes::CHECKPOINT_CORRUPT, format!("state changes: {m}"));
        let Some((last, prefix)) = identity.split_last() else {
            return Err(bad("the operator's changelog has no identity".into()));
        };
        let column = |name: &str| {
            changes
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("no identity column `{name}`")))
        };
        let Some(through) = changes.column_by_name(REMOVED_THROUGH) else {
            return Ok(RemovedRuns {
                prefix: None,
                ranges: Default::default(),
            });
        };
        let prefix_cols = prefix
            .iter()
            .map(|c| column(c))
            .collect::<Result<Vec<_>>>()?;
        let mut runs = RemovedRuns {
            prefix: (!prefix_cols.is_empty())
                .then(|| {
                    RowConverter::new(
                        prefix_cols
                            .iter()
                            .map(|a| SortField::new(a.data_type().clone()))
                            .collect(),
                    )
                })
                .transpose()
                .map_err(engine_err)?,
            ranges: Default::default(),
        };
        let through = cast(through, &DataType::UInt64).map_err(engine_err)?;
        let through = through.as_primitive::<arrow::datatypes::UInt64Type>();
        let first = cast(&column(last)?, &DataType::UInt64).map_err(engine_err)?;
        let first = first.as_primitive::<arrow::datatypes::UInt64Type>();
        let keys = runs.keys(&prefix_cols)?;
        for i in (0..changes.num_rows()).filter(|i| through.is_valid(*i)) {
            if first.is_null(i) || first.value(i) > through.value(i) {
                return Err(bad(format!(
                    "a run of removed rows is malformed (row {i} of the changes)"
                )));
            }
            runs.ranges
                .entry(Self::key(&keys, i).to_vec())
                .or_default()
                .push((first.value(i), through.value(i)));
        }
        for r in runs.ranges.values_mut() {
            r.sort_unstable();
        }
        Ok(runs)
    }

    fn keys(&self, prefix_cols: &[ArrayRef]) -> Result<Option<arrow::row::Rows>> {
        self.prefix
            .as_ref()
            .map(|c| c.convert_columns(prefix_cols))
            .transpose()
            .map_err(engine_err)
    }

    fn key(keys: &Option<arrow::row::Rows>, i: usize) -> &[u8] {
        keys.as_ref().map_or(&[], |k| k.row(i).data())
    }

    /// Whether row `i` of the state whose identity columns are `ids` lies in a run.
    fn contains_fn(&self, ids: &[ArrayRef]) -> Result<impl Fn(usize) -> bool + '_> {
        let (keys, last) = match ids.split_last() {
            Some((last, prefix)) if !self.ranges.is_empty() => (
                self.keys(prefix)?,
                Some(cast(last, &DataType::UInt64).map_err(engine_err)?),
            ),
            _ => (None, None),
        };
        Ok(move |i: usize| {
            let Some(last) = &last else {
                return false;
            };
            let last = last.as_primitive::<arrow::datatypes::UInt64Type>();
            if last.is_null(i) {
                return false;
            }
            let v = last.value(i);
            self.ranges.get(Self::key(&keys, i)).is_some_and(|r| {
                // The last run starting at or before `v` (runs never overlap).
                let at = r.partition_point(|(first, _)| *first <= v);
                at > 0 && v <= r[at - 1].1
            })
        })
    }
}

fn engine_err(e: arrow::error::ArrowError) -> Error {
    Error::new(&codes::ENGINE_ERROR, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    /// A state of rows `(id, value)` identified by `id`.
    fn state(rows: &[(i64, &str)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("value", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn changes(upserts: &[(i64, &str)], removed: &[i64]) -> RecordBatch {
        let up = state(upserts);
        let gone = removed_rows(
            &up.schema(),
            vec![(
                "id",
                Arc::new(Int64Array::from(removed.to_vec())) as ArrayRef,
            )],
        )
        .unwrap();
        changes_batch(&[up], &gone).unwrap()
    }

    #[test]
    fn a_run_of_removed_rows_removes_its_whole_range_and_nothing_else() {
        let base = state(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (6, "f"), (7, "g")]);
        let up = state(&[(5, "e"), (9, "i")]);
        // Runs 2..=4 and 7..=8 (8 is not held: nothing to remove), and one row, 1.
        let runs = removed_runs(
            &up.schema(),
            vec![],
            "id",
            UInt64Array::from(vec![7, 2, 1]),
            UInt64Array::from(vec![8, 4, 1]),
        )
        .unwrap();
        let changes = changes_batch(&[up], &runs).unwrap();
        let applied = apply_changes(Some(&base), &changes, &["id"]).unwrap();
        assert_eq!(
            rows(&applied),
            vec![(5, "e".into()), (6, "f".into()), (9, "i".into())]
        );
        // A run whose end comes before its start is refused as corrupt.
        let bad = removed_runs(
            &state(&[]).schema(),
            vec![],
            "id",
            UInt64Array::from(vec![4]),
            UInt64Array::from(vec![2]),
        )
        .unwrap();
        let bad = changes_batch(&[state(&[])], &bad).unwrap();
        let err = apply_changes(Some(&base), &bad, &["id"]).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    #[test]
    fn runs_remove_only_the_rows_of_their_own_identity_prefix() {
        // A join's identity: (side, seq); both sides hold seqs 1..=3.
        let schema = Arc::new(Schema::new(vec![
            Field::new("side", DataType::UInt8, false),
            Field::new("seq", DataType::UInt64, false),
        ]));
        let held = |rows: &[(u8, u64)]| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(arrow::array::UInt8Array::from_iter_values(
                        rows.iter().map(|r| r.0),
                    )),
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ],
            )
            .unwrap()
        };
        let base = held(&[(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]);
        // Side 0 loses 1..=2, side 1 loses 3.
        let runs = removed_runs(
            &schema,
            vec![(
                "side",
                Arc::new(arrow::array::UInt8Array::from(vec![0, 1])) as ArrayRef,
            )],
            "seq",
            UInt64Array::from(vec![1, 3]),
            UInt64Array::from(vec![2, 3]),
        )
        .unwrap();
        let changes = changes_batch(&[held(&[])], &runs).unwrap();
        let applied = apply_changes(Some(&base), &changes, &["side", "seq"]).unwrap();
        let sides = applied
            .column(0)
            .as_primitive::<arrow::datatypes::UInt8Type>();
        let seqs = applied
            .column(1)
            .as_primitive::<arrow::datatypes::UInt64Type>();
        let left: Vec<(u8, u64)> = (0..applied.num_rows())
            .map(|i| (sides.value(i), seqs.value(i)))
            .collect();
        assert_eq!(left, vec![(0, 3), (1, 1), (1, 2)]);
    }

    fn rows(b: &RecordBatch) -> Vec<(i64, String)> {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let values = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        (0..b.num_rows())
            .map(|i| (ids.value(i), values.value(i).to_string()))
            .collect()
    }

    #[test]
    fn a_version_is_its_last_snapshot_with_the_later_changes_applied() {
        let dir = tempfile::tempdir().unwrap();
        let files = Checkpoint::open(dir.path()).unwrap().state_files();
        let id: Option<&[&str]> = Some(&["id"]);
        // Versions 1 and 2: changes from nothing.
        files
            .write_changes("j", 1, 0, &changes(&[(2, "b"), (1, "a")], &[]))
            .unwrap();
        files
            .write_changes("j", 2, 1, &changes(&[(3, "c"), (1, "A")], &[2]))
            .unwrap();
        let v2 = files.read_chain("j", 2, id).unwrap().unwrap();
        assert_eq!(rows(&v2), vec![(1, "A".into()), (3, "c".into())]);
        assert_eq!(
            rows(&files.read_chain("j", 1, id).unwrap().unwrap()).len(),
            2
        );
        // A whole snapshot at 3, changes at 4 on top of it.
        files
            .write("j", 3, &state(&[(1, "A"), (3, "c"), (4, "d")]))
            .unwrap();
        files
            .write_changes("j", 4, 3, &changes(&[(5, "e")], &[1, 4]))
            .unwrap();
        let v4 = files.read_chain("j", 4, id).unwrap().unwrap();
        assert_eq!(rows(&v4), vec![(3, "c".into()), (5, "e".into())]);
        // Nothing written for a version: no state; a gap in the chain: corrupt.
        assert_eq!(files.read_chain("k", 4, id).unwrap(), None);
        files
            .write_changes("k", 2, 1, &changes(&[(1, "a")], &[]))
            .unwrap();
        let e = files.read_chain("k", 2, id).unwrap_err();
        assert_eq!(e.code(), "ETL801", "{e}");
        // Changes for an operator without a changelog are refused, not misread.
        assert!(files.read_chain("j", 4, None).is_err());
        // Changes alone forget nothing: the chain still starts at the snapshot of 3.
        for v in 5..=(KEPT_VERSIONS + 5) {
            files
                .write_changes("j", v, v - 1, &changes(&[], &[]))
                .unwrap();
        }
        let logged = |op: &str| {
            super::super::state_log::logged_versions(&dir.path().join("state-changes"))
                .unwrap()
                .remove(op)
                .unwrap_or_default()
        };
        assert!(logged("j").contains(&4));
        let v25 = files
            .read_chain("j", KEPT_VERSIONS + 5, id)
            .unwrap()
            .unwrap();
        assert_eq!(rows(&v25), vec![(3, "c".into()), (5, "e".into())]);
        // A whole snapshot at 26 keeps everything from the previous one (3) on: a
        // restart may re-run batch 25, whose chain starts there.
        let whole = state(&[(3, "c"), (5, "e")]);
        files.write("j", 26, &whole).unwrap();
        assert!(dir.path().join("state/j/3.arrow").exists());
        assert!(logged("j").contains(&4));
        // The next one (30) forgets what is before 26 and more than KEPT_VERSIONS back.
        for v in 27..30 {
            files
                .write_changes("j", v, v - 1, &changes(&[], &[]))
                .unwrap();
        }
        files.write("j", 30, &whole).unwrap();
        assert!(!dir.path().join("state/j/3.arrow").exists());
        assert!(dir.path().join("state/j/26.arrow").exists());
        let v29 = files.read_chain("j", 29, id).unwrap().unwrap();
        assert_eq!(rows(&v29), vec![(3, "c".into()), (5, "e".into())]);
    }

    #[test]
    fn changes_chain_back_over_versions_that_wrote_no_state() {
        let dir = tempfile::tempdir().unwrap();
        let files = Checkpoint::open(dir.path()).unwrap().state_files();
        let id: Option<&[&str]> = Some(&["id"]);
        // State written at versions 3 and 7 only (a state checkpoint interval).
        files
            .write_changes("j", 3, 0, &changes(&[(1, "a"), (2, "b")], &[]))
            .unwrap();
        files
            .write_changes("j", 7, 3, &changes(&[(3, "c")], &[1]))
            .unwrap();
        // A stale file of an uncommitted run at 5 is not on the chain of 7.
        files
            .write_changes("j", 5, 3, &changes(&[(9, "z")], &[]))
            .unwrap();
        let v7 = files.read_chain("j", 7, id).unwrap().unwrap();
        assert_eq!(rows(&v7), vec![(2, "b".into()), (3, "c".into())]);
        assert_eq!(
            rows(&files.read_chain("j", 3, id).unwrap().unwrap()).len(),
            2
        );
        // A version nothing was written for has no state of its own.
        assert_eq!(files.read_chain("j", 6, id).unwrap(), None);
        // Changes since a version whose file is gone: corrupt, not silently short.
        files
            .write_changes("j", 9, 8, &changes(&[(4, "d")], &[]))
            .unwrap();
        let e = files.read_chain("j", 9, id).unwrap_err();
        assert_eq!(e.code(), "ETL801", "{e}");
    }

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

    /// Writes `changes` of `version` since `since` as the layout before the state
    /// changelog did: `state/<op>/<version>.delta.arrow`, naming `since` in its schema.
    fn write_changes_file(
        files: &StateFiles,
        op: &str,
        version: u64,
        since: u64,
        changes: &RecordBatch,
    ) {
        let mut metadata = changes.schema().metadata().clone();
        metadata.insert(SINCE_METADATA.to_string(), since.to_string());
        let schema = Arc::new(changes.schema().as_ref().clone().with_metadata(metadata));
        let changes = changes.clone().with_schema(schema).unwrap();
        files
            .write_file(&files.delta_path(op, version), &changes)
            .unwrap();
    }

    #[test]
    fn a_chain_of_changes_files_is_continued_in_the_state_log() {
        let dir = tempfile::tempdir().unwrap();
        let id: Option<&[&str]> = Some(&["id"]);
        {
            let files = Checkpoint::open(dir.path()).unwrap().state_files();
            files.write("j", 2, &state(&[(1, "a"), (2, "b")])).unwrap();
            write_changes_file(&files, "j", 3, 2, &changes(&[(3, "c")], &[1]));
            write_changes_file(&files, "j", 4, 3, &changes(&[(4, "d")], &[]));
        }
        // A restart of the query continues the chain in the changelog.
        let files = Checkpoint::open(dir.path()).unwrap().state_files();
        let v4 = files.read_chain("j", 4, id).unwrap().unwrap();
        assert_eq!(
            rows(&v4),
            vec![(2, "b".into()), (3, "c".into()), (4, "d".into())]
        );
        files
            .write_changes("j", 5, 4, &changes(&[(5, "e")], &[2]))
            .unwrap();
        let v5 = files.read_chain("j", 5, id).unwrap().unwrap();
        assert_eq!(
            rows(&v5),
            vec![(3, "c".into()), (4, "d".into()), (5, "e".into())]
        );
        assert!(!dir.path().join("state/j/5.delta.arrow").exists());
        // A legacy file whose `since` is not an earlier version is corrupt.
        write_changes_file(&files, "k", 3, 3, &changes(&[(1, "a")], &[]));
        let e = files.read_chain("k", 3, id).unwrap_err();
        assert_eq!(e.code(), "ETL801", "{e}");
    }

    #[test]
    fn an_operator_without_a_changelog_reads_its_logged_state_or_a_file_from_before_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let files = Checkpoint::open(dir.path()).unwrap().state_files();
            // The layout before the state log: a whole snapshot file per version.
            files.write("agg", 1, &state(&[(1, "a")])).unwrap();
        }
        let files = Checkpoint::open(dir.path()).unwrap().state_files();
        assert_eq!(
            rows(&files.read_chain("agg", 1, None).unwrap().unwrap()),
            vec![(1, "a".into())]
        );
        let v2 = state(&[(1, "a"), (2, "b")]);
        files
            .write_logged(2, 1, &[("agg", LogEntry::Whole(&v2))])
            .unwrap();
        assert_eq!(
            rows(&files.read_chain("agg", 2, None).unwrap().unwrap()).len(),
            2
        );
        // Its whole state is a base a changes chain can start from, too.
        let id: Option<&[&str]> = Some(&["id"]);
        files
            .write_changes("agg", 3, 2, &changes(&[(3, "c")], &[1]))
            .unwrap();
        let v3 = files.read_chain("agg", 3, id).unwrap().unwrap();
        assert_eq!(rows(&v3), vec![(2, "b".into()), (3, "c".into())]);
        assert_eq!(files.read_chain("agg", 4, None).unwrap(), None);
    }

    /// A whole snapshot left by a run that did not commit its version is removed when the
    /// re-run of that version writes changes, so the chain reads the changes.
    #[test]
    fn a_stale_whole_snapshot_gives_way_to_the_changes_of_a_re_run() {
        let dir = tempfile::tempdir().unwrap();
        let id: Option<&[&str]> = Some(&["id"]);
        {
            let files = Checkpoint::open(dir.path()).unwrap().state_files();
            files
                .write_changes("j", 1, 0, &changes(&[(1, "a")], &[]))
                .unwrap();
            files
                .write_changes("j", 2, 1, &changes(&[(2, "b")], &[]))
                .unwrap();
            // The background snapshot of version 2; its batch then did not commit.
            files.write("j", 2, &state(&[(1, "a"), (2, "b")])).unwrap();
        }
        let files = Checkpoint::open(dir.path()).unwrap().state_files();
        files
            .write_changes("j", 2, 1, &changes(&[(7, "g")], &[1]))
            .unwrap();
        assert!(!dir.path().join("state/j/2.arrow").exists());
        let v2 = files.read_chain("j", 2, id).unwrap().unwrap();
        assert_eq!(rows(&v2), vec![(7, "g".into())]);
    }

    #[test]
    fn logs_round_trip_and_the_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert!(Checkpoint::open(dir.path()).is_err_and(|e| e.code() == "ETL803"));
        assert_eq!(cp.latest_offsets().unwrap(), None);
        let e = OffsetEntry {
            batch_watermark_ms: 5,
            late_watermark_ms: 0,
            batch_timestamp_ms: 7,
            kind: "data".into(),
            sources: BTreeMap::from([(
                "a".into(),
                SourceRange {
                    start: None,
                    end: Some(serde_json::json!({"index": 1})),
                },
            )]),
            conf: BTreeMap::new(),
        };
        cp.write_offsets(0, &e).unwrap();
        cp.write_offsets(1, &e).unwrap();
        assert_eq!(cp.latest_offsets().unwrap(), Some(1));
        assert_eq!(cp.offsets(1).unwrap(), Some(e));
        let batch =
            RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        cp.write_state("op0", 2, &batch).unwrap();
        assert_eq!(cp.read_state("op0", 2).unwrap().unwrap(), batch);
        assert!(cp.read_state("op0", 3).unwrap().is_none());
        drop(cp);
        assert!(Checkpoint::open(dir.path()).is_ok());
    }

    /// A checkpoint of Spark's layout (one file per batch in `offsets/` and `commits/`,
    /// as ETLantic wrote them before the log) is read, and continued in the log.
    #[test]
    fn a_checkpoint_of_the_file_per_batch_layout_is_continued_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let entry = |b: i64| OffsetEntry {
            batch_watermark_ms: b,
            late_watermark_ms: 0,
            batch_timestamp_ms: 7,
            kind: "data".into(),
            sources: BTreeMap::new(),
            conf: BTreeMap::new(),
        };
        let commit = CommitEntry {
            next_batch_watermark_ms: 3,
            max_event_time_ms: BTreeMap::new(),
            state_version: None,
        };
        for b in 0..3 {
            etlantic_core::durable::write_atomic(
                &dir.path().join("offsets").join(b.to_string()),
                &serde_json::to_vec_pretty(&entry(b)).unwrap(),
            )
            .unwrap();
        }
        for b in 0..2 {
            etlantic_core::durable::write_atomic(
                &dir.path().join("commits").join(b.to_string()),
                &serde_json::to_vec_pretty(&commit).unwrap(),
            )
            .unwrap();
        }
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(cp.latest_offsets().unwrap(), Some(2));
        assert_eq!(cp.latest_commit().unwrap(), Some(1));
        assert_eq!(cp.offsets(1).unwrap(), Some(entry(1)));
        // Batch 2 re-runs and commits, batch 3 follows: both in the log.
        cp.write_commit(2, &commit).unwrap();
        cp.write_offsets(3, &entry(3)).unwrap();
        assert_eq!(cp.latest_commit().unwrap(), Some(2));
        assert_eq!(cp.latest_offsets().unwrap(), Some(3));
        assert_eq!(cp.offsets(3).unwrap(), Some(entry(3)));
        assert_eq!(cp.offsets(0).unwrap(), Some(entry(0)));
        assert_eq!(cp.commit(2).unwrap(), Some(commit.clone()));
        // An unreadable file of the old layout is reported, not taken for a missing one.
        std::fs::write(dir.path().join("commits/0"), b"{not json").unwrap();
        assert_eq!(cp.commit(0).unwrap_err().code(), "ETL801");
        drop(cp);
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(cp.latest_offsets().unwrap(), Some(3));
        assert_eq!(cp.latest_commit().unwrap(), Some(2));
    }
}
