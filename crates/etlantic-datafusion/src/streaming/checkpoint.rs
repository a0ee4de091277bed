//! The checkpoint directory, in Spark's layout:
//!
//! ```text
//! <checkpoint>/
//!   metadata                 {"id": query id, "planFingerprint", "compatibility", ...}
//!   offsets/<batch>          write-ahead log: source ranges, watermark, timestamp (before processing)
//!   commits/<batch>          after the sinks: next watermark, max event times
//!   state/<op>/<version>.arrow   operator state after batch `version - 1` (Arrow IPC)
//!   sources/<n>/             per-source state (e.g. the files a directory stream has seen)
//!   progress.jsonl           one StreamingQueryProgress per micro-batch
//!   .lock                    held by the running query
//! ```
//!
//! Every file is written atomically: a temporary file in the same directory, `fsync`,
//! `rename`, then `fsync` of the directory, so a crash leaves either the old or the new
//! file, never a torn one.

use arrow::array::RecordBatch;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::durable::write_atomic;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::IO_ERROR,
        format!("checkpoint {}: {e}", path.display()),
    ))
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::from(Diagnostic::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("checkpoint file {} is unreadable: {e}", path.display()),
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
}

/// A checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    root: PathBuf,
    _lock: Option<File>,
}

impl Checkpoint {
    /// Opens (creating if needed) a checkpoint directory and takes its lock.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        for d in ["offsets", "commits", "state", "sources"] {
            fs::create_dir_all(root.join(d)).map_err(|e| io_err(&root, e))?;
        }
        let lock_path = root.join(".lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_err(&lock_path, e))?;
        if lock.try_lock().is_err() {
            return Err(Diagnostic::new(
                &codes::CHECKPOINT_LOCKED,
                format!("checkpoint {} is in use by another query", root.display()),
            )
            .into());
        }
        Ok(Checkpoint {
            root,
            _lock: Some(lock),
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| corrupt(path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(path, e)),
        }
    }

    fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
        write_atomic(
            path,
            &serde_json::to_vec_pretty(value).expect("checkpoint entries serialise"),
        )
    }

    /// The metadata, if the checkpoint has been used before.
    pub fn metadata(&self) -> Result<Option<Metadata>> {
        Self::read_json(&self.root.join("metadata"))
    }

    /// Writes the metadata.
    pub fn write_metadata(&self, m: &Metadata) -> Result<()> {
        Self::write_json(&self.root.join("metadata"), m)
    }

    fn batch_ids(&self, dir: &str) -> Result<Vec<u64>> {
        let d = self.root.join(dir);
        let mut ids: Vec<u64> = fs::read_dir(&d)
            .map_err(|e| io_err(&d, e))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The latest batch id in the offsets log.
    pub fn latest_offsets(&self) -> Result<Option<u64>> {
        Ok(self.batch_ids("offsets")?.last().copied())
    }

    /// The latest batch id in the commit log.
    pub fn latest_commit(&self) -> Result<Option<u64>> {
        Ok(self.batch_ids("commits")?.last().copied())
    }

    /// Reads `offsets/<batch>`.
    pub fn offsets(&self, batch: u64) -> Result<Option<OffsetEntry>> {
        Self::read_json(&self.root.join("offsets").join(batch.to_string()))
    }

    /// Writes `offsets/<batch>` (the write-ahead log entry).
    pub fn write_offsets(&self, batch: u64, e: &OffsetEntry) -> Result<()> {
        Self::write_json(&self.root.join("offsets").join(batch.to_string()), e)
    }

    /// Reads `commits/<batch>`.
    pub fn commit(&self, batch: u64) -> Result<Option<CommitEntry>> {
        Self::read_json(&self.root.join("commits").join(batch.to_string()))
    }

    /// Writes `commits/<batch>`.
    pub fn write_commit(&self, batch: u64, e: &CommitEntry) -> Result<()> {
        Self::write_json(&self.root.join("commits").join(batch.to_string()), e)
    }

    /// The directory of source number `n`.
    pub fn source_dir(&self, n: usize) -> PathBuf {
        self.root.join("sources").join(n.to_string())
    }

    /// The operator state files, as a handle that can be moved to another thread (the
    /// runtime writes the snapshots while the sinks write).
    pub fn state_files(&self) -> StateFiles {
        StateFiles {
            root: self.root.join("state"),
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

    /// Appends a progress record to `progress.jsonl`.
    pub fn append_progress(&self, progress: &Value) -> Result<()> {
        let path = self.root.join("progress.jsonl");
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let mut line = serde_json::to_vec(progress).expect("progress serialises");
        line.push(b'\n');
        f.write_all(&line).map_err(|e| io_err(&path, e))
    }
}

/// The `state/` directory: one Arrow IPC file per operator and version
/// (`state/<op>/<version>.arrow`).
#[derive(Clone, Debug)]
pub struct StateFiles {
    root: PathBuf,
}

impl StateFiles {
    fn path(&self, op: &str, version: u64) -> PathBuf {
        self.root.join(op).join(format!("{version}.arrow"))
    }

    /// Writes an operator's snapshot for `version` atomically and durably; keeps the ten
    /// versions before it for inspection and removes older ones (never read again).
    pub fn write(&self, op: &str, version: u64, state: &RecordBatch) -> Result<()> {
        let mut buf = Vec::new();
        {
            let mut w = FileWriter::try_new(&mut buf, &state.schema())
                .map_err(|e| io_err(&self.root, e))?;
            w.write(state).map_err(|e| io_err(&self.root, e))?;
            w.finish().map_err(|e| io_err(&self.root, e))?;
        }
        write_atomic(&self.path(op, version), &buf)?;
        if version > 10 {
            let _ = fs::remove_file(self.path(op, version - 10));
        }
        Ok(())
    }

    /// Reads an operator's snapshot for `version` (`None` when there is none).
    pub fn read(&self, op: &str, version: u64) -> Result<Option<RecordBatch>> {
        let path = self.path(op, version);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, e)),
        };
        let mut reader = FileReader::try_new(file, None).map_err(|e| corrupt(&path, e))?;
        match reader.next() {
            Some(b) => Ok(Some(b.map_err(|e| corrupt(&path, e))?)),
            None => Err(corrupt(&path, "no record batch")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use std::sync::Arc;

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
        std::fs::write(dir.path().join("commits/0"), b"{not json").unwrap();
        assert_eq!(cp.commit(0).unwrap_err().code(), "ETL801");
        drop(cp);
        assert!(Checkpoint::open(dir.path()).is_ok());
    }
}
