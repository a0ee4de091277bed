//! The operators' state files: whole snapshots as Arrow IPC files, and the state log
//! (see [`super::state_log`]) for changes and logged whole states.

use super::changes::apply_chain;
use super::records::{corrupt_file, io_err, KEPT_VERSIONS};
use super::state_log::{LogEntry, Logged, StateLog};
use arrow::array::RecordBatch;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::CompressionType;
use etlantic_core::diagnostics::Result;
use etlantic_core::storage::Storage;
use std::sync::Arc;

/// The operators' state: the `state/` directory, with their whole snapshots as one Arrow
/// IPC file per operator and version (`state/<op>/<version>.arrow`), and the state
/// log (`state-changes/`, see [`super::state_log`]).
#[derive(Clone, Debug)]
pub struct StateFiles {
    /// The `state/` directory.
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) log: Arc<StateLog>,
}

impl StateFiles {
    fn path(&self, op: &str, version: u64) -> String {
        format!("{op}/{version}.arrow")
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
        let files: Vec<(u64, String)> = entries
            .iter()
            .filter_map(|name| {
                let number = name.strip_suffix(".arrow")?;
                Some((number.parse().ok()?, format!("{op}/{name}")))
            })
            .collect();
        let Some(previous) = files
            .iter()
            .filter(|(v, _)| *v < version)
            .map(|(v, _)| *v)
            .max()
        else {
            return;
        };
        let oldest_kept = previous.min(version.saturating_sub(KEPT_VERSIONS));
        for (v, path) in &files {
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
            match (identity, self.log.read(op, v)?) {
                (_, Some(Logged::Whole(full))) => break Some(full),
                (Some(_), Some(Logged::Changes { since, changes })) => {
                    deltas.push(changes);
                    if since == 0 {
                        break None;
                    }
                    v = since;
                }
                (None, Some(Logged::Changes { .. })) => {
                    return Err(corrupt_file(
                        &self.storage.display(op),
                        format!("version {v} holds changes, but the operator keeps no changelog"),
                    ))
                }
                (_, None) if deltas.is_empty() => return Ok(None),
                (_, None) => {
                    return Err(corrupt_file(
                        &self.storage.display(op),
                        format!("the state changes of version {v} are missing"),
                    ))
                }
            }
        };
        let Some(identity) = identity else {
            return Ok(base);
        };
        // `deltas` are newest first; the chain is applied in one pass.
        deltas.reverse();
        Ok(Some(apply_chain(base.as_ref(), &deltas, identity)?))
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
            let mut reader = FileReader::try_new(file, None).map_err(|e| corrupt_file(&at, e))?;
            match reader.next() {
                Some(b) => Ok(Some(b.map_err(|e| corrupt_file(&at, e))?)),
                None => Err(corrupt_file(&at, "no record batch")),
            }
        })
    }

    /// Reads an operator's whole snapshot for `version` (`None` when there is none).
    pub fn read(&self, op: &str, version: u64) -> Result<Option<RecordBatch>> {
        self.read_file(&self.path(op, version))
    }
}

#[cfg(test)]
mod tests {
    use super::super::changes::fixtures::{changes, rows, state};
    use super::super::Checkpoint;
    use super::*;

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
}
