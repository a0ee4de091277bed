//! The seen-files log of a directory stream: which files each batch index was assigned,
//! kept in the source's checkpoint directory (`sources/<n>/`).
//!
//! Spark keeps one file per micro-batch and compacts them every 10 batches into one file
//! holding every entry, rewritten whole at each compaction (its cost grows with the age
//! of the query). Here entries live in **segments** of [`SEGMENT_INDEXES`] consecutive
//! indexes:
//!
//! - a new index is first written as its own entry file `<index>` (JSON [`LogEntry`],
//!   written atomically: temporary file, `fsync`, rename, directory `fsync`);
//! - every [`COMPACT_EVERY`] indexes the entries of the current segment are written
//!   together as `<first index>.seg` (JSON lines, one [`LogEntry`] per line, also written
//!   atomically), and only then are the entry files it holds deleted. A segment file is
//!   rewritten at most `SEGMENT_INDEXES / COMPACT_EVERY` times, then never again, so
//!   compaction costs a bounded amount per micro-batch however long the query runs;
//! - the directory holds `total / SEGMENT_INDEXES` segment files and fewer than
//!   `COMPACT_EVERY` entry files (plus, after a crash between a segment write and the
//!   deletions, the entry files the segment already holds: they are deleted on open).
//!
//! Memory: the names of all files ever assigned (a stream never reads a name twice, as
//! in Spark) and the entries of the current segment. Entries of older segments are read
//! back from their segment file when a replay or a state rebuild asks for them.
//!
//! A log written before segments existed (one entry file per index) is read as is and
//! compacted into segments when it is opened.

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{put_bytes, Storage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

/// Indexes per segment file.
pub const SEGMENT_INDEXES: u64 = 1000;
/// Entry files are merged into their segment every this many indexes.
pub const COMPACT_EVERY: u64 = 10;

/// One entry of the seen-files log: the files assigned to a batch index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Format version of the entry (1).
    pub version: u32,
    /// The batch index.
    pub index: u64,
    /// The files, in read order.
    pub files: Vec<LoggedFile>,
}

/// A file in the seen-files log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedFile {
    /// Path relative to the source directory.
    pub path: String,
    /// Size in bytes when it was listed.
    pub size: u64,
    /// Modification time when it was listed (epoch milliseconds).
    pub modified_ms: i64,
    /// The object's ETag when it was listed, on an object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl LoggedFile {
    /// What was logged of the file, to compare with what it is now.
    pub fn meta(&self) -> etlantic_core::storage::FileMeta {
        etlantic_core::storage::FileMeta {
            size: self.size,
            modified_ms: self.modified_ms,
            version: self.version.clone(),
        }
    }
}

fn corrupt(at: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("file source log `{at}` is corrupt: {e}"),
    )
}

fn segment_of(index: u64) -> u64 {
    index - index % SEGMENT_INDEXES
}

/// The seen-files log of one source (see the [module docs](self)).
#[derive(Debug)]
pub struct SeenLog {
    /// Where its files are (the checkpoint's `sources/<n>/`, on any storage).
    storage: Arc<dyn Storage>,
    /// Every file name ever assigned.
    seen: HashSet<String>,
    /// The entries of the current segment (and any later index), by index.
    current: BTreeMap<u64, Vec<LoggedFile>>,
    /// The first index of the current segment.
    current_segment: u64,
    /// Indexes of `current` that are only in their own entry file so far.
    unmerged: Vec<u64>,
    /// The first indexes of the segment files on disk.
    segments: Vec<u64>,
    last: Option<u64>,
}

impl SeenLog {
    /// Opens the log in `dir` (empty when the directory does not exist yet); compacts
    /// entry files of full compaction intervals into their segments and deletes entry
    /// files a segment already holds.
    pub fn open(dir: PathBuf) -> Result<Self> {
        Self::open_in(etlantic_core::storage::open(&dir))
    }

    /// Opens the log kept in `storage` (see [`SeenLog::open`]).
    pub fn open_in(storage: Arc<dyn Storage>) -> Result<Self> {
        let mut log = SeenLog {
            storage,
            seen: HashSet::new(),
            current: BTreeMap::new(),
            current_segment: 0,
            unmerged: Vec::new(),
            segments: Vec::new(),
            last: None,
        };
        let mut entry_files = Vec::new();
        for name in log.storage.list("")? {
            if let Some(first) = name
                .strip_suffix(".seg")
                .and_then(|n| n.parse::<u64>().ok())
            {
                log.segments.push(first);
            } else if let Ok(index) = name.parse::<u64>() {
                entry_files.push(index);
            }
        }
        log.segments.sort_unstable();
        entry_files.sort_unstable();
        // Segments: every name is seen; the newest segment's entries stay in memory.
        let mut in_segments: HashSet<u64> = HashSet::new();
        let newest = log.segments.last().copied();
        for &first in &log.segments.clone() {
            for entry in log.read_segment(first)? {
                log.seen.extend(entry.files.iter().map(|f| f.path.clone()));
                in_segments.insert(entry.index);
                log.last = log.last.max(Some(entry.index));
                if Some(first) == newest {
                    log.current.insert(entry.index, entry.files);
                }
            }
        }
        log.current_segment = newest.unwrap_or(0);
        // Entry files: stale ones (already in a segment) are deleted; the others are read.
        let mut stale = Vec::new();
        let mut older: BTreeMap<u64, BTreeMap<u64, Vec<LoggedFile>>> = BTreeMap::new();
        for index in entry_files {
            let name = index.to_string();
            if in_segments.contains(&index) {
                stale.push(name);
                continue;
            }
            let at = log.storage.display(&name);
            let bytes = log.storage.read(&name)?.unwrap_or_default();
            let entry: LogEntry = serde_json::from_slice(&bytes).map_err(|e| corrupt(&at, e))?;
            if entry.index != index {
                return Err(corrupt(&at, format!("it holds index {}", entry.index)));
            }
            log.seen.extend(entry.files.iter().map(|f| f.path.clone()));
            log.last = log.last.max(Some(index));
            older
                .entry(segment_of(index))
                .or_default()
                .insert(index, entry.files);
        }
        let _ = log.storage.delete_all(&stale);
        // Entry files of segments before the newest one (a log from before segments, or
        // a crash right after a segment filled): merged into their segments now.
        let newest_segment = older.keys().next_back().copied().max(newest).unwrap_or(0);
        for (first, entries) in older {
            if first < newest_segment {
                let mut all: BTreeMap<u64, Vec<LoggedFile>> = match log.segments.contains(&first) {
                    true => log
                        .read_segment(first)?
                        .into_iter()
                        .map(|e| (e.index, e.files))
                        .collect(),
                    false => BTreeMap::new(),
                };
                let merged: Vec<u64> = entries.keys().copied().collect();
                all.extend(entries);
                log.write_segment(first, &all)?;
                log.delete_entry_files(&merged);
                if !log.segments.contains(&first) {
                    log.segments.push(first);
                    log.segments.sort_unstable();
                }
            } else {
                if log.current_segment != first {
                    log.current.clear();
                    log.current_segment = first;
                }
                log.unmerged.extend(entries.keys().copied());
                log.current.extend(entries);
            }
        }
        if log.unmerged.len() as u64 >= COMPACT_EVERY {
            log.compact()?;
        }
        Ok(log)
    }

    /// Where the log is, for messages.
    pub fn location(&self) -> String {
        self.storage.display("")
    }

    /// The highest index assigned.
    pub fn last_index(&self) -> Option<u64> {
        self.last
    }

    /// Whether a file name was ever assigned.
    pub fn contains(&self, name: &str) -> bool {
        self.seen.contains(name)
    }

    /// Assigns `files` to `index` (the next index) durably.
    pub fn append(&mut self, index: u64, files: Vec<LoggedFile>) -> Result<()> {
        if self.last.is_some_and(|l| index <= l) {
            return Err(Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!(
                    "file source log `{}`: index {index} is already assigned",
                    self.storage.display("")
                ),
            ));
        }
        let entry = LogEntry {
            version: 1,
            index,
            files,
        };
        let text =
            serde_json::to_string(&entry).map_err(|e| corrupt(&self.storage.display(""), e))?;
        put_bytes(self.storage.as_ref(), &index.to_string(), text.as_bytes())?;
        self.seen.extend(entry.files.iter().map(|f| f.path.clone()));
        self.last = Some(index);
        let segment = segment_of(index);
        if segment != self.current_segment {
            // The previous segment is complete: whatever of it is still in entry files
            // goes into its segment file before the new segment starts.
            if !self.unmerged.is_empty() {
                self.compact()?;
            }
            self.current.clear();
            self.current_segment = segment;
        }
        self.current.insert(index, entry.files);
        self.unmerged.push(index);
        if self.unmerged.len() as u64 >= COMPACT_EVERY {
            self.compact()?;
        }
        Ok(())
    }

    /// The files assigned to `index`, if any (read back from its segment file when it is
    /// an older segment's).
    pub fn files(&self, index: u64) -> Result<Option<Vec<LoggedFile>>> {
        if let Some(files) = self.current.get(&index) {
            return Ok(Some(files.clone()));
        }
        let first = segment_of(index);
        if !self.segments.contains(&first) {
            return Ok(None);
        }
        Ok(self
            .read_segment(first)?
            .into_iter()
            .find(|e| e.index == index)
            .map(|e| e.files))
    }

    /// Writes the current segment's entries as its segment file, then deletes the entry
    /// files it now holds.
    fn compact(&mut self) -> Result<()> {
        let first = self.current_segment;
        self.write_segment(first, &self.current)?;
        if !self.segments.contains(&first) {
            self.segments.push(first);
        }
        let merged = std::mem::take(&mut self.unmerged);
        self.delete_entry_files(&merged);
        Ok(())
    }

    fn write_segment(&self, first: u64, entries: &BTreeMap<u64, Vec<LoggedFile>>) -> Result<()> {
        let mut text = String::new();
        for (index, files) in entries {
            let line = serde_json::to_string(&LogEntry {
                version: 1,
                index: *index,
                files: files.clone(),
            })
            .map_err(|e| corrupt(&self.storage.display(""), e))?;
            text.push_str(&line);
            text.push('\n');
        }
        put_bytes(
            self.storage.as_ref(),
            &format!("{first}.seg"),
            text.as_bytes(),
        )
    }

    fn read_segment(&self, first: u64) -> Result<Vec<LogEntry>> {
        let name = format!("{first}.seg");
        let path = self.storage.display(&name);
        let bytes = self.storage.read(&name)?.unwrap_or_default();
        let text = std::str::from_utf8(&bytes).map_err(|e| corrupt(&path, e))?;
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let entry: LogEntry = serde_json::from_str(line).map_err(|e| corrupt(&path, e))?;
            if segment_of(entry.index) != first {
                return Err(corrupt(
                    &path,
                    format!("index {} does not belong to it", entry.index),
                ));
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// Deletes entry files that a durable segment file holds. A failure leaves a stale
    /// file that the next open deletes.
    fn delete_entry_files(&self, indexes: &[u64]) {
        let names: Vec<String> = indexes.iter().map(u64::to_string).collect();
        let _ = self.storage.delete_all(&names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn file(name: &str) -> LoggedFile {
        LoggedFile {
            path: name.into(),
            size: name.len() as u64,
            modified_ms: 7,
            version: None,
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Appends keep the directory small: a segment file per 1,000 indexes and fewer than
    /// ten entry files; every index reads back, from memory or from its segment, also
    /// after a reopen.
    #[test]
    fn appends_compact_into_segments_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("src");
        let mut log = SeenLog::open(dir.clone()).unwrap();
        let n = 2_345u64;
        for i in 0..n {
            log.append(i, vec![file(&format!("f{i}.jsonl"))]).unwrap();
            let files = names_in(&dir);
            let entries = files.iter().filter(|f| !f.ends_with(".seg")).count();
            assert!(entries < COMPACT_EVERY as usize, "{i}: {files:?}");
        }
        assert_eq!(
            names_in(&dir)
                .into_iter()
                .filter(|f| f.ends_with(".seg"))
                .collect::<Vec<_>>(),
            vec!["0.seg", "1000.seg", "2000.seg"]
        );
        for log in [log, SeenLog::open(dir.clone()).unwrap()] {
            assert_eq!(log.last_index(), Some(n - 1));
            for i in [0, 1, 999, 1000, 1999, 2000, 2339, 2340, 2344] {
                assert_eq!(
                    log.files(i).unwrap(),
                    Some(vec![file(&format!("f{i}.jsonl"))]),
                    "{i}"
                );
                assert!(log.contains(&format!("f{i}.jsonl")));
            }
            assert_eq!(log.files(n).unwrap(), None);
            assert!(log.current.len() <= SEGMENT_INDEXES as usize);
        }
        // An index is assigned once.
        let mut log = SeenLog::open(dir).unwrap();
        assert_eq!(log.append(5, vec![]).unwrap_err().code(), "ETL801");
    }

    /// A log of 100,000 micro-batches in the layout before segments (one entry file per
    /// index) opens, compacts into 100 segment files, keeps one segment's entries in
    /// memory, and serves every index and name.
    #[test]
    fn a_hundred_thousand_entry_files_compact_on_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("src");
        std::fs::create_dir_all(&dir).unwrap();
        let n = 100_000u64;
        for i in 0..n {
            let entry = LogEntry {
                version: 1,
                index: i,
                files: vec![file(&format!("part-{i:06}.jsonl"))],
            };
            std::fs::write(
                dir.join(i.to_string()),
                serde_json::to_string_pretty(&entry).unwrap(),
            )
            .unwrap();
        }
        let log = SeenLog::open(dir.clone()).unwrap();
        let files = names_in(&dir);
        assert_eq!(files.len(), 100, "{:?}", &files[..files.len().min(20)]);
        assert!(files.iter().all(|f| f.ends_with(".seg")));
        assert_eq!(log.last_index(), Some(n - 1));
        assert_eq!(log.seen.len(), n as usize);
        assert_eq!(log.current.len(), SEGMENT_INDEXES as usize);
        for i in [0, 12_345, 99_000, 99_999] {
            assert_eq!(
                log.files(i).unwrap(),
                Some(vec![file(&format!("part-{i:06}.jsonl"))])
            );
        }
        // It goes on: the next index starts segment 100000.
        drop(log);
        let mut log = SeenLog::open(dir.clone()).unwrap();
        log.append(n, vec![file("next.jsonl")]).unwrap();
        assert!(log.contains("next.jsonl") && log.contains("part-000000.jsonl"));
        assert_eq!(log.current.len(), 1);
    }

    /// A crash after a segment was written but before its entry files were deleted
    /// leaves stale entry files: the next open deletes them and reads the segment.
    #[test]
    fn stale_entry_files_after_a_crash_are_deleted_on_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("src");
        let mut log = SeenLog::open(dir.clone()).unwrap();
        for i in 0..10 {
            log.append(i, vec![file(&format!("f{i}"))]).unwrap();
        }
        assert_eq!(names_in(&dir), vec!["0.seg"]);
        // What the crash left: the entry files of 3 and 4 again.
        for i in [3u64, 4] {
            let entry = LogEntry {
                version: 1,
                index: i,
                files: vec![file(&format!("f{i}"))],
            };
            etlantic_core::durable::write_atomic(
                &dir.join(i.to_string()),
                serde_json::to_string(&entry).unwrap().as_bytes(),
            )
            .unwrap();
        }
        let log = SeenLog::open(dir.clone()).unwrap();
        assert_eq!(names_in(&dir), vec!["0.seg"]);
        assert_eq!(log.files(4).unwrap(), Some(vec![file("f4")]));
        // Damage is ETL801, never skipped.
        std::fs::write(dir.join("0.seg"), "{not json\n").unwrap();
        assert_eq!(SeenLog::open(dir).unwrap_err().code(), "ETL801");
    }
}
