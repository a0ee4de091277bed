//! The checkpoint directory, in Spark's layout but for the micro-batch log:
//!
//! ```text
//! <checkpoint>/
//!   metadata                 {"id": query id, "planFingerprint", "compatibility", ...}
//!   log/<first batch>.log    the micro-batch log (see batch_log): per micro-batch
//!                            its offsets record (the write-ahead log: source ranges,
//!                            watermark, timestamp, before processing) and its commit
//!                            record (after the sinks: next watermark, max event times)
//!   state/<op>/<version>.arrow   operator state after batch `version - 1` (Arrow IPC)
//!   state-changes/<first version>.log   or only its changes since the previous version
//!                            written: one record per state write, every operator's
//!                            changes in it (see state_log)
//!   state-store/<op>/        operator state kept in a state store other than memory
//!                            (the profile's `state_store`; its layout is the store's,
//!                            see `crate::state_store`)
//!   sources/<n>/             per-source state (e.g. the files a directory stream has seen)
//!   progress.jsonl           one StreamingQueryProgress per micro-batch (rotated to
//!                            progress.1.jsonl at 8 MiB, see `ProgressLog`)
//!   status.json              the last run: running (with a heartbeat), stopped or
//!                            failed, and why (see `crate::status`)
//!   .lock                    held by the running query
//! ```
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
//! ([`state_log`]) and synced before the commit; the whole snapshot is written in
//! the background after them (the query skips one while the previous is still being
//! written), so a version can have both. Files and changelog segments are removed only
//! once a later whole snapshot is durable (see [`StateFiles::write`]).
//!
//! Under a state checkpoint interval (the profile's `state_checkpoint_interval`) only
//! some micro-batches write their operators' state: versions in between have no files,
//! and each commit names the newest version that was durable
//! ([`CommitEntry::state_version`]).
//!
//! Every file but the two logs is written atomically: a temporary file in the same
//! directory, `fsync`, `rename`, then `fsync` of the directory, so a crash leaves either
//! the old or the new file, never a torn one. The logs are appended to, each record with
//! a checksum (see [`batch_log`] and [`state_log`] for what a crash can
//! leave and how it is repaired).
//!
//! The modules: [`records`] (the log's records and the errors of every reader, a leaf),
//! [`batch_log`] (offsets and commits), [`state_log`] and [`state_files`] (operator
//! state), [`changes`] (the changelog format) and `ipc_guard` (reading Arrow IPC that a
//! crash or a disk may have damaged without aborting).

pub mod batch_log;
pub mod changes;
mod ipc_guard;
pub mod records;
pub mod state_files;
pub mod state_log;

pub use changes::{
    apply_chain, apply_changes, changes_batch, removed_rows, removed_runs, REMOVED, REMOVED_THROUGH,
};
pub use records::{
    whole_snapshot_due, CommitEntry, Metadata, OffsetEntry, SourceRange, FULL_SNAPSHOT_EVERY,
};
pub use state_files::StateFiles;

use crate::progress::{ProgressLog, QueryProgress};
use arrow::array::RecordBatch;
use batch_log::BatchLog;
use etlantic_core::diagnostics::{codes, Diagnostic, Result};
use etlantic_core::storage::{self, Location, Storage, StorageOptions, Sub};
use records::corrupt_file;
use serde::de::DeserializeOwned;
use state_log::StateLog;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A query's checkpoint (see the [module docs](self)), opened and locked.
#[derive(Debug)]
pub struct Checkpoint {
    root: Location,
    /// Where its files are (the local directory `root`, an object store, or what a test
    /// mounted there).
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
        Self::open_at(&Location::Local(root.into()), &StorageOptions::default())
    }

    /// Opens (creating if needed) the checkpoint at `root`, a local directory or an
    /// object-store prefix, and takes its lock. An object store is checked first
    /// (reachable, bucket there, credentials accepted, conditional creates honoured:
    /// what keeps two writers from both committing a micro-batch).
    pub fn open_at(root: &Location, options: &StorageOptions) -> Result<Self> {
        let root = root.clone();
        storage::check_location(&root, options, true)?;
        let storage = storage::open_location(&root, options)?;
        let lock = storage.lock(".lock").map_err(|e| {
            if e.code() == codes::CHECKPOINT_LOCKED.code {
                Diagnostic::new(
                    &codes::CHECKPOINT_LOCKED,
                    format!("checkpoint {root} is in use by another query: {e}"),
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

    /// Where it is.
    pub fn root(&self) -> &Location {
        &self.root
    }

    /// Its files (for records kept beside the logs, such as the status record).
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.storage.clone()
    }

    /// Requests its storage retried after transient failures so far (object stores).
    pub fn storage_retries(&self) -> u64 {
        self.storage.retries()
    }

    fn read_json<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        match self.storage.read(path)? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| corrupt_file(&self.storage.display(path), e)),
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

    /// The latest batch id with an offsets record.
    pub fn latest_offsets(&self) -> Result<Option<u64>> {
        Ok(self.log.latest_offsets())
    }

    /// The latest batch id with a commit record.
    pub fn latest_commit(&self) -> Result<Option<u64>> {
        Ok(self.log.latest_commit())
    }

    /// The offsets record of `batch`.
    pub fn offsets(&self, batch: u64) -> Result<Option<OffsetEntry>> {
        self.log.offsets(batch)
    }

    /// Logs `batch`'s offsets (the write-ahead log entry), durably.
    pub fn write_offsets(&self, batch: u64, e: &OffsetEntry) -> Result<()> {
        self.log.append_offsets(batch, e)
    }

    /// The commit record of `batch`.
    pub fn commit(&self, batch: u64) -> Result<Option<CommitEntry>> {
        self.log.commit(batch)
    }

    /// Logs `batch`'s commit. It is durable once the next offsets are written or
    /// [`Checkpoint::sync_log`] returns (see [`batch_log`]).
    pub fn write_commit(&self, batch: u64, e: &CommitEntry) -> Result<()> {
        self.log.append_commit(batch, e)
    }

    /// Makes every offsets and commit record written so far durable.
    pub fn sync_log(&self) -> Result<()> {
        self.log.sync()
    }

    /// The storage of source number `n` (`sources/<n>/`).
    pub fn source_state(&self, n: usize) -> Arc<dyn Storage> {
        Arc::new(Sub::new(self.storage.clone(), &format!("sources/{n}")))
    }

    /// Where operator `op` keeps its state when a [`crate::state_store::StateStore`]
    /// holds it.
    pub fn state_store_dir(&self, op: &str) -> Arc<dyn Storage> {
        Arc::new(Sub::new(self.storage.clone(), &format!("state-store/{op}")))
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
    /// operator's [`crate::engine::OperatorState::changelog_identity`]).
    pub fn read_state_chain(
        &self,
        op: &str,
        version: u64,
        identity: Option<&[&str]>,
    ) -> Result<Option<RecordBatch>> {
        self.state_files().read_chain(op, version, identity)
    }

    /// Appends a progress record to `progress.jsonl` (rotated, see [`ProgressLog`]).
    pub fn append_progress(&self, progress: &QueryProgress) -> Result<()> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use std::collections::BTreeMap;

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
}
