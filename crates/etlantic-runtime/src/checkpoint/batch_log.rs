//! The micro-batch log of a checkpoint: every micro-batch's `offsets` record (the
//! write-ahead log, appended before the batch reads) and its `commit` record (appended
//! after its sinks and state), in append-only segment files `log/<first batch>.log`.
//!
//! Spark keeps two files per micro-batch, `offsets/<batch>` and `commits/<batch>`, each
//! written as a temporary file and renamed. Made durable, that is two new files, two
//! renames and four `fsync`s per micro-batch: the largest fixed cost of a small
//! micro-batch (Nexmark q3, 200 000 events per micro-batch: a fifth of the CPU). Here a
//! micro-batch appends two lines to one open file and syncs it once:
//!
//! - an `offsets` record is appended and synced (`fdatasync`) before the batch reads, so
//!   a restart re-runs the batch with exactly these offsets;
//! - a `commit` record is appended without a sync. The next `offsets` record's sync makes
//!   it durable too (one file: its sync covers everything appended before), and so does
//!   [`BatchLog::sync`] (at a clean stop, and before a source is told it may release
//!   data). A machine crash in between can lose that one record and nothing else: the
//!   restart then finds the batch logged but not committed and runs it again — exactly
//!   the recovery of a crash before the commit, which sinks are built for (they are
//!   idempotent by batch id). A crash of the process alone loses nothing appended.
//!
//! Each line is `<CRC-32 of the JSON, 8 hex digits> <JSON>\n`, the JSON
//! `{"batch":N,"offsets":{...}}` or `{"batch":N,"commit":{...}}` (the entries of
//! [`OffsetEntry`] and [`CommitEntry`]). Opening the log checks the lines of its last
//! segment: a torn tail — the record being written when the machine stopped, a line
//! incomplete or failing its checksum, followed by at most one more line (the `offsets`
//! record whose sync had not returned) — is cut off, so appends continue a well-formed
//! log. A bad line followed by more is corruption and an error (`ETL801`), never
//! skipped.
//!
//! On an object store, which cannot append, a segment is one object rewritten whole at
//! each sync, conditionally on the version last written (so a second writer fails
//! rather than overwrites, see `etlantic_object_store`): one `PUT` per micro-batch, and
//! segments of [`OBJECT_SEGMENT_BATCHES`] micro-batches keep it small. A torn tail
//! cannot happen there (an object is whole or absent).
//!
//! A new segment starts every [`SEGMENT_BATCHES`] micro-batches, the previous one synced
//! first (so a torn record can only be in the last segment). Segments wholly before the
//! retained batches are deleted then: the last [`MIN_BATCHES_TO_RETAIN`] (Spark's
//! `minBatchesToRetain` default), and every batch from the one a restart reads first on
//! (the batch before the state version the last commit names, whose committed successors
//! a restart runs again under a state checkpoint interval).

use super::records::{corrupt_log as corrupt, io_err, CommitEntry, OffsetEntry};
use etlantic_core::diagnostics::Result;
use etlantic_core::storage::{AppendFile, Storage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Micro-batches per segment file.
pub const SEGMENT_BATCHES: u64 = 100;

/// Micro-batches per segment on an object store, where every sync rewrites the whole
/// segment (see [`Storage::appends`]): a few kilobytes per `PUT`.
pub const OBJECT_SEGMENT_BATCHES: u64 = 10;

/// The micro-batches whose records are always kept (Spark's `minBatchesToRetain`).
pub const MIN_BATCHES_TO_RETAIN: u64 = 100;

/// One line of the log, as written.
#[derive(Serialize)]
struct LineRef<'a> {
    batch: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    offsets: Option<&'a OffsetEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    commit: Option<&'a CommitEntry>,
}

/// One line of the log, as read.
#[derive(Deserialize)]
struct Line {
    batch: u64,
    #[serde(default)]
    offsets: Option<OffsetEntry>,
    #[serde(default)]
    commit: Option<CommitEntry>,
}

/// The records of one segment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogRecords {
    /// Batch → its offsets record.
    pub offsets: BTreeMap<u64, OffsetEntry>,
    /// Batch → its commit record.
    pub commits: BTreeMap<u64, CommitEntry>,
}

impl LogRecords {
    fn extend(&mut self, other: LogRecords) {
        self.offsets.extend(other.offsets);
        self.commits.extend(other.commits);
    }
}

fn encode(line: &LineRef<'_>) -> Vec<u8> {
    let json = serde_json::to_vec(line).expect("log records serialise");
    let mut out = Vec::with_capacity(json.len() + 10);
    out.extend_from_slice(format!("{:08x} ", crc32fast::hash(&json)).as_bytes());
    out.extend_from_slice(&json);
    out.push(b'\n');
    out
}

/// The record of one complete line (without its `\n`), if it is intact.
fn decode(line: &[u8]) -> Option<Line> {
    let (crc, json) = (line.get(..8)?, line.get(9..)?);
    if line.get(8) != Some(&b' ') {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(crc).ok()?, 16).ok()?;
    if crc32fast::hash(json) != crc {
        return None;
    }
    let parsed: Line = serde_json::from_slice(json).ok()?;
    // Exactly one of the two entries.
    (parsed.offsets.is_some() != parsed.commit.is_some()).then_some(parsed)
}

/// A parsed segment: its records, the length of its intact prefix, and whether a torn
/// tail follows that prefix.
struct Parsed {
    records: LogRecords,
    intact_len: usize,
    torn: bool,
}

/// Parses a segment's bytes. A bad line followed by more than one further line is
/// corruption (see the module docs).
fn parse(path: &str, bytes: &[u8]) -> Result<Parsed> {
    let mut records = LogRecords::default();
    let mut at = 0;
    while at < bytes.len() {
        let end = bytes[at..].iter().position(|b| *b == b'\n').map(|p| at + p);
        let line = end.and_then(|e| decode(&bytes[at..e]));
        let (Some(end), Some(line)) = (end, line) else {
            // A torn record: at most one more line may follow it.
            let rest = &bytes[at..];
            let lines_after = rest
                .split(|b| *b == b'\n')
                .skip(1)
                .filter(|l| !l.is_empty())
                .count();
            if lines_after > 1 {
                return Err(corrupt(
                    path,
                    format!("a damaged record at byte {at} is followed by {lines_after} more"),
                ));
            }
            return Ok(Parsed {
                records,
                intact_len: at,
                torn: true,
            });
        };
        match (line.offsets, line.commit) {
            (Some(o), _) => {
                records.offsets.insert(line.batch, o);
            }
            (_, Some(c)) => {
                records.commits.insert(line.batch, c);
            }
            _ => unreachable!("decode keeps lines with one entry"),
        }
        at = end + 1;
    }
    Ok(Parsed {
        records,
        intact_len: bytes.len(),
        torn: false,
    })
}

/// The segment files of a log (`<first>.log`, by the first batch or version they hold),
/// in order, with their names; the state log (`super::state_log`) names its segments the
/// same way.
pub(crate) fn segments(storage: &dyn Storage) -> Result<Vec<(u64, String)>> {
    let mut out: Vec<(u64, String)> = storage
        .list("")?
        .into_iter()
        .filter_map(|name| {
            let first = name.strip_suffix(".log")?.parse().ok()?;
            Some((first, name))
        })
        .collect();
    out.sort_unstable_by_key(|(first, _)| *first);
    Ok(out)
}

fn read_segment(storage: &dyn Storage, name: &str) -> Result<Parsed> {
    let at = storage.display(name);
    let bytes = storage
        .read(name)?
        .ok_or_else(|| io_err(&at, "the segment is gone"))?;
    parse(&at, &bytes)
}

/// Reads every record of the log in `dir` (the checkpoint's `log/` directory) without
/// opening it for writing: for tools and tests. A torn tail is left out, not repaired.
pub fn read_all(dir: &Path) -> Result<LogRecords> {
    read_all_in(etlantic_core::storage::open(dir).as_ref())
}

/// [`read_all`] of the log in `storage`.
pub fn read_all_in(storage: &dyn Storage) -> Result<LogRecords> {
    let mut all = LogRecords::default();
    let segs = segments(storage)?;
    for (i, (_, name)) in segs.iter().enumerate() {
        let parsed = read_segment(storage, name)?;
        if parsed.torn && i + 1 < segs.len() {
            return Err(corrupt(
                &storage.display(name),
                "a damaged record before the last segment",
            ));
        }
        all.extend(parsed.records);
    }
    Ok(all)
}

/// The segment being appended to.
struct Writer {
    file: Option<Box<dyn AppendFile>>,
    /// Its first batch.
    first: u64,
    /// The newest batch with an offsets record, and with a commit record.
    latest_offsets: Option<u64>,
    latest_commit: Option<u64>,
    /// The first batch a restart reads (see the module docs).
    recovery_floor: u64,
    /// Records appended since the last sync.
    unsynced: bool,
}

/// The micro-batch log (see the module docs). Owned by one query: the checkpoint's lock
/// keeps other writers out.
pub struct BatchLog {
    storage: Arc<dyn Storage>,
    writer: Mutex<Writer>,
    /// The records of the segment read last (restarts read many batches of one segment).
    cache: Mutex<Option<(u64, LogRecords)>>,
}

impl std::fmt::Debug for BatchLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchLog")
            .field("at", &self.storage.display(""))
            .finish()
    }
}

impl BatchLog {
    /// Opens the log in directory `dir` (see [`BatchLog::open_in`]).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(etlantic_core::storage::open(dir.as_ref()))
    }

    /// Opens the log kept in `storage` (rooted at the log's directory) and repairs a torn
    /// tail of its last segment.
    pub fn open_in(storage: Arc<dyn Storage>) -> Result<Self> {
        let segs = segments(storage.as_ref())?;
        let mut writer = Writer {
            file: None,
            first: 0,
            latest_offsets: None,
            latest_commit: None,
            recovery_floor: 0,
            unsynced: false,
        };
        if let Some((first, name)) = segs.last() {
            let parsed = read_segment(storage.as_ref(), name)?;
            let mut file = storage.append(name)?;
            if parsed.torn {
                file.truncate(parsed.intact_len as u64)?;
            }
            writer.file = Some(file);
            writer.first = *first;
            let mut records = parsed.records;
            // An empty last segment (a crash right after it was created): the newest
            // records are in the one before.
            if records.offsets.is_empty() && records.commits.is_empty() && segs.len() > 1 {
                records = read_segment(storage.as_ref(), &segs[segs.len() - 2].1)?.records;
            }
            writer.latest_offsets = records.offsets.keys().next_back().copied();
            if let Some((b, c)) = records.commits.iter().next_back() {
                writer.latest_commit = Some(*b);
                writer.recovery_floor = c.state_version_of(*b).saturating_sub(1);
            }
        }
        Ok(BatchLog {
            storage,
            writer: Mutex::new(writer),
            cache: Mutex::new(None),
        })
    }

    /// Micro-batches per segment on this storage.
    fn segment_batches(&self) -> u64 {
        if self.storage.appends() {
            SEGMENT_BATCHES
        } else {
            OBJECT_SEGMENT_BATCHES
        }
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        // A panic while appending leaves nothing half-done that the next append would
        // not also find: the file is append-only.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The newest batch with an offsets record.
    pub fn latest_offsets(&self) -> Option<u64> {
        self.writer().latest_offsets
    }

    /// The newest batch with a commit record.
    pub fn latest_commit(&self) -> Option<u64> {
        self.writer().latest_commit
    }

    /// The records of the segment holding `batch`.
    fn records_of<T>(&self, batch: u64, pick: impl FnOnce(&LogRecords) -> T) -> Result<T> {
        let segs = segments(self.storage.as_ref())?;
        let Some((first, name)) = segs.iter().rev().find(|(first, _)| *first <= batch) else {
            return Ok(pick(&LogRecords::default()));
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.as_ref().is_none_or(|(f, _)| f != first) {
            let parsed = read_segment(self.storage.as_ref(), name)?;
            *cache = Some((*first, parsed.records));
        }
        let (_, records) = cache.as_ref().expect("filled above");
        Ok(pick(records))
    }

    /// The offsets record of `batch`.
    pub fn offsets(&self, batch: u64) -> Result<Option<OffsetEntry>> {
        self.records_of(batch, |r| r.offsets.get(&batch).cloned())
    }

    /// The commit record of `batch`.
    pub fn commit(&self, batch: u64) -> Result<Option<CommitEntry>> {
        self.records_of(batch, |r| r.commits.get(&batch).cloned())
    }

    /// Appends `batch`'s offsets record and syncs the log: when this returns, the record
    /// (and every one before it) survives a crash of the machine.
    pub fn append_offsets(&self, batch: u64, entry: &OffsetEntry) -> Result<()> {
        let mut w = self.writer();
        if w.file.is_none() || batch >= w.first + self.segment_batches() {
            self.start_segment(&mut w, batch)?;
        }
        let line = LineRef {
            batch,
            offsets: Some(entry),
            commit: None,
        };
        self.append(&mut w, &line)?;
        self.sync_writer(&mut w)?;
        w.latest_offsets = Some(batch);
        Ok(())
    }

    /// Appends `batch`'s commit record, without a sync (see the module docs).
    pub fn append_commit(&self, batch: u64, entry: &CommitEntry) -> Result<()> {
        let mut w = self.writer();
        if w.file.is_none() {
            // No segment yet: a commit whose offsets this log never held (the driver
            // logs offsets first) still gets a segment to be read back from.
            self.start_segment(&mut w, batch)?;
        }
        let line = LineRef {
            batch,
            offsets: None,
            commit: Some(entry),
        };
        self.append(&mut w, &line)?;
        w.unsynced = true;
        w.latest_commit = Some(batch);
        w.recovery_floor = entry.state_version_of(batch).saturating_sub(1);
        Ok(())
    }

    /// Makes every record appended so far durable.
    pub fn sync(&self) -> Result<()> {
        let mut w = self.writer();
        self.sync_writer(&mut w)
    }

    fn sync_writer(&self, w: &mut Writer) -> Result<()> {
        if let Some(f) = w.file.as_mut() {
            f.sync()?;
        }
        w.unsynced = false;
        Ok(())
    }

    fn append(&self, w: &mut Writer, line: &LineRef<'_>) -> Result<()> {
        let bytes = encode(line);
        let file = w
            .file
            .as_mut()
            .expect("a segment is started before appending");
        file.write(&bytes)?;
        // A cached segment that this append extends is read again when needed.
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.as_ref().is_some_and(|(f, _)| *f == w.first) {
            *cache = None;
        }
        Ok(())
    }

    /// Starts the segment `log/<batch>.log`: the current one is synced first (so a torn
    /// record can only be in the last segment), the new file and its name made durable,
    /// then the segments no restart needs are deleted.
    fn start_segment(&self, w: &mut Writer, batch: u64) -> Result<()> {
        if w.unsynced {
            self.sync_writer(w)?;
        }
        // Created durably, its name included (the storage's contract).
        let file = self.storage.append(&format!("{batch}.log"))?;
        w.file = Some(file);
        w.first = batch;
        let keep_from = batch
            .saturating_sub(MIN_BATCHES_TO_RETAIN)
            .min(w.recovery_floor);
        let segs = segments(self.storage.as_ref())?;
        for pair in segs.windows(2) {
            let (_, name) = &pair[0];
            let next_first = pair[1].0;
            // The segment holds batches up to `next_first - 1`.
            if next_first <= keep_from {
                self.storage.delete(name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::SourceRange;
    use super::*;

    fn offsets(batch: u64) -> OffsetEntry {
        OffsetEntry {
            batch_watermark_ms: batch as i64 * 10,
            late_watermark_ms: 0,
            batch_timestamp_ms: 1_000 + batch as i64,
            kind: "data".into(),
            sources: BTreeMap::from([(
                "s".into(),
                SourceRange {
                    start: Some(serde_json::json!({"index": batch})),
                    end: Some(serde_json::json!({"index": batch + 1})),
                },
            )]),
            conf: BTreeMap::new(),
        }
    }

    fn commit(batch: u64, state_version: Option<u64>) -> CommitEntry {
        CommitEntry {
            next_batch_watermark_ms: batch as i64 * 10 + 5,
            max_event_time_ms: BTreeMap::from([("s".into(), batch as i64)]),
            state_version,
        }
    }

    /// Runs batches `range` through the log: offsets, then commit.
    fn run(log: &BatchLog, range: std::ops::Range<u64>, state_version: Option<u64>) {
        for b in range {
            log.append_offsets(b, &offsets(b)).unwrap();
            log.append_commit(b, &commit(b, state_version)).unwrap();
        }
    }

    fn segment_firsts(dir: &Path) -> Vec<u64> {
        segments(&etlantic_core::storage::LocalStorage::new(dir))
            .unwrap()
            .into_iter()
            .map(|(f, _)| f)
            .collect()
    }

    #[test]
    fn records_round_trip_across_segments_and_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        assert_eq!(log.latest_offsets(), None);
        assert_eq!(log.offsets(0).unwrap(), None);
        run(&log, 0..150, None);
        log.append_offsets(150, &offsets(150)).unwrap();
        assert_eq!(log.latest_offsets(), Some(150));
        assert_eq!(log.latest_commit(), Some(149));
        drop(log);
        let log = BatchLog::open(dir.path()).unwrap();
        assert_eq!(log.latest_offsets(), Some(150));
        assert_eq!(log.latest_commit(), Some(149));
        for b in [0, 99, 100, 149, 150] {
            assert_eq!(log.offsets(b).unwrap(), Some(offsets(b)), "batch {b}");
        }
        assert_eq!(log.commit(120).unwrap(), Some(commit(120, None)));
        assert_eq!(log.commit(150).unwrap(), None);
        assert_eq!(segment_firsts(dir.path()), vec![0, 100]);
        let all = read_all(dir.path()).unwrap();
        assert_eq!(all.offsets.len(), 151);
        assert_eq!(all.commits.len(), 150);
    }

    #[test]
    fn old_segments_go_once_no_restart_needs_them() {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        run(&log, 0..450, None);
        // Batches 350..450 must stay: segments 300 and 400 do, 0..=200 went.
        assert_eq!(segment_firsts(dir.path()), vec![300, 400]);
        assert_eq!(log.offsets(350).unwrap(), Some(offsets(350)));
        assert_eq!(log.offsets(250).unwrap(), None);

        // Under a state checkpoint interval the last commit names an old state version:
        // a restart reads from the batch before it, so its segment stays.
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        run(&log, 0..120, None);
        run(&log, 120..450, Some(121));
        assert_eq!(segment_firsts(dir.path()), vec![100, 200, 300, 400]);
        assert_eq!(log.offsets(120).unwrap(), Some(offsets(120)));
    }

    #[test]
    fn a_torn_tail_is_cut_off_wherever_the_crash_came() {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        run(&log, 0..3, None);
        drop(log);
        let path = dir.path().join("0.log");
        let full = std::fs::read(&path).unwrap();
        let line_ends: Vec<usize> = full
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1)
            .collect();
        // Lines: offsets 0, commit 0, offsets 1, commit 1, offsets 2, commit 2.
        assert_eq!(line_ends.len(), 6);
        // Cut anywhere within the last record, or damage the commit of batch 1 and
        // cut within the offsets of batch 2 after it: both are torn tails.
        let start_of_last = line_ends[4];
        for cut in start_of_last..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            let log = BatchLog::open(dir.path()).unwrap();
            assert_eq!(log.latest_offsets(), Some(2), "cut at {cut}");
            assert_eq!(log.latest_commit(), Some(1), "cut at {cut}");
            // The tail is gone: the log continues well-formed.
            log.append_commit(2, &commit(2, None)).unwrap();
            drop(log);
            let all = read_all(dir.path()).unwrap();
            assert_eq!(all.commits.get(&2), Some(&commit(2, None)), "cut at {cut}");
        }
        for cut in line_ends[3]..=line_ends[4] {
            let mut bytes = full[..cut].to_vec();
            // The commit of batch 1 lost a byte in the middle (its page never written).
            bytes[line_ends[2] + 20] ^= 0x55;
            std::fs::write(&path, &bytes).unwrap();
            let log = BatchLog::open(dir.path()).unwrap();
            assert_eq!(log.latest_offsets(), Some(1), "cut at {cut}");
            assert_eq!(log.latest_commit(), Some(0), "cut at {cut}");
        }
    }

    #[test]
    fn damage_before_the_tail_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        run(&log, 0..3, None);
        drop(log);
        let path = dir.path().join("0.log");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let err = BatchLog::open(dir.path()).unwrap_err();
        assert_eq!(err.code(), "ETL801");
        assert_eq!(read_all(dir.path()).unwrap_err().code(), "ETL801");
    }

    #[test]
    fn an_empty_last_segment_leaves_the_latest_records_in_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        run(&log, 0..100, None);
        drop(log);
        // A crash right after the next segment was created.
        std::fs::File::create(dir.path().join("100.log")).unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        assert_eq!(log.latest_offsets(), Some(99));
        assert_eq!(log.latest_commit(), Some(99));
        run(&log, 100..101, None);
        assert_eq!(log.offsets(100).unwrap(), Some(offsets(100)));
    }
}
