//! The state log of a checkpoint: what each state write wrote of every operator — the
//! changes of an operator that keeps a changelog (see [`super`]), the whole
//! state of one that does not (a window aggregation, dedup: state the watermark keeps
//! small) — appended to segment files `state-changes/<first version>.log`.
//!
//! One file per operator and version would cost a micro-batch's state write a file
//! creation, two `fsync`s (file and directory) and a rename per operator, and later an
//! unlink — most of the state write's CPU for queries with several small operators (see
//! docs/streaming.md). Here a state write appends one record holding every operator's
//! entry to one open file and syncs it (`fdatasync`) once, before the commit that names
//! the version. The whole snapshots of changelog operators (large, written in the
//! background) stay files.
//!
//! A record is
//!
//! ```text
//! "ETLC"  head length (u32 LE)  head CRC-32 (u32 LE)  head  payload…
//! ```
//!
//! where the head is JSON, `{"version":V,"since":S,"entries":[{"op":…,"len":…,
//! "crc":…},…]}`, and each entry's payload (its `len` bytes, checked by its `crc`) is
//! the operator's changes, or its whole state when the entry has `"whole":true`, as an
//! Arrow IPC stream (LZ4 frames), in entry order. `since` is the version the changes
//! were written since (as in [`super`]). The payloads are encoded straight
//! into the file and the head written over its space afterwards, so the JSON is padded
//! with spaces to the length it would have with the largest numbers (see
//! `write_record`).
//!
//! Invariants the log keeps:
//!
//! - **The last record for a version wins.** A restart re-runs a batch that did not
//!   commit, which appends that version's record again; reads use the newest.
//! - **Only the last record can be torn.** Every append is synced before the next one
//!   and before a commit names its version. Opening the log checks every record of the
//!   last segment (head and payloads); a damaged record with no intact record after it
//!   is the record being written when the machine stopped, and is cut off. A damaged
//!   record followed by an intact one, or one in an earlier segment, is corruption and
//!   an error (`ETL801`): never skipped, since a commit may name its version.
//! - **A segment is removed only once no chain can need it**: every operator in the log
//!   has a later whole snapshot that is durable (a file, or an entry of the log), with
//!   the same margin as the whole snapshot files (see [`StateLog::note_whole`]). A new
//!   segment starts every [`SEGMENT_VERSIONS`] versions, so old records can go.
//!
//! On an object store, which cannot append, a segment is one object written whole at
//! each sync, so a segment holds one version ([`OBJECT_SEGMENT_VERSIONS`]): a record is
//! one `PUT`, and a torn record cannot happen (an object is whole or absent).

use super::batch_log::segments;
use super::records::{corrupt_log as corrupt, io_err, FULL_SNAPSHOT_EVERY, KEPT_VERSIONS};
use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow::ipc::CompressionType;
use etlantic_core::diagnostics::Result;
use etlantic_core::storage::{AppendFile, Storage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// Versions per segment file.
pub const SEGMENT_VERSIONS: u64 = FULL_SNAPSHOT_EVERY;

/// Versions per segment on an object store, where every sync rewrites the whole segment
/// (see [`Storage::appends`]): a record per object.
pub const OBJECT_SEGMENT_VERSIONS: u64 = 1;

const MAGIC: &[u8; 4] = b"ETLC";
/// The magic, the head length and the head CRC.
const PREFIX: usize = 12;

/// The head of a record.
#[derive(Debug, Serialize, Deserialize)]
struct Head {
    version: u64,
    since: u64,
    entries: Vec<EntryHead>,
}

/// One operator's entry in a record's head.
#[derive(Debug, Serialize, Deserialize)]
struct EntryHead {
    op: String,
    len: u64,
    crc: u32,
    /// The payload is the operator's whole state, not changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    whole: bool,
}

/// What a state write logs of one operator.
#[derive(Clone, Copy, Debug)]
pub enum LogEntry<'a> {
    /// Its changes since the record's `since` (see [`super::changes::changes_batch`]).
    Changes(&'a RecordBatch),
    /// Its whole state.
    Whole(&'a RecordBatch),
}

impl<'a> LogEntry<'a> {
    fn batch(&self) -> &'a RecordBatch {
        match self {
            LogEntry::Changes(b) | LogEntry::Whole(b) => b,
        }
    }
}

/// One operator's state at one version, as read from the log.
#[derive(Clone, Debug)]
pub enum Logged {
    /// Its changes since version `since`.
    Changes {
        /// The version the changes were written since.
        since: u64,
        /// The changes.
        changes: RecordBatch,
    },
    /// Its whole state.
    Whole(RecordBatch),
}

/// Where one operator's changes of one version are.
#[derive(Clone, Copy, Debug)]
struct Location {
    /// The segment (its first version).
    segment: u64,
    offset: u64,
    len: u64,
    crc: u32,
    since: u64,
    whole: bool,
}

/// An intact record of a segment and where its payloads start.
struct Scanned {
    head: Head,
    payloads_at: u64,
}

/// A scanned segment: its intact records, the length of its intact prefix and whether a
/// damaged tail follows it.
struct Scan {
    records: Vec<Scanned>,
    intact_len: u64,
    torn: bool,
}

/// Parses the record at `at` of `bytes` (a whole segment, or as much of it as is
/// needed), checking the head and, when `verify` is set, the payloads. `None` when the
/// record is incomplete or damaged.
fn record_at(bytes: &[u8], at: usize, verify: bool) -> Option<(Head, usize, usize)> {
    let prefix = bytes.get(at..at.checked_add(PREFIX)?)?;
    if &prefix[..4] != MAGIC {
        return None;
    }
    let head_len = u32::from_le_bytes(prefix[4..8].try_into().ok()?) as usize;
    let head_crc = u32::from_le_bytes(prefix[8..12].try_into().ok()?);
    let head_at = at + PREFIX;
    let head_bytes = bytes.get(head_at..head_at.checked_add(head_len)?)?;
    if crc32fast::hash(head_bytes) != head_crc {
        return None;
    }
    let head: Head = serde_json::from_slice(head_bytes).ok()?;
    let payloads_at = head_at + head_len;
    let mut end = payloads_at;
    for e in &head.entries {
        let len = usize::try_from(e.len).ok()?;
        let payload = bytes.get(end..end.checked_add(len)?)?;
        if verify && crc32fast::hash(payload) != e.crc {
            return None;
        }
        end += len;
    }
    Some((head, payloads_at, end))
}

/// Scans a whole segment, checking every record.
fn scan_bytes(path: &str, bytes: &[u8]) -> Result<Scan> {
    let mut records = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some((head, payloads_at, end)) = record_at(bytes, at, true) else {
            // A torn record, unless an intact one follows it.
            let after = (at + 1..=bytes.len().saturating_sub(PREFIX))
                .find(|&i| bytes[i..].starts_with(MAGIC) && record_at(bytes, i, true).is_some());
            if let Some(i) = after {
                return Err(corrupt(
                    path,
                    format!(
                        "a damaged record at byte {at} is followed by an intact one at byte {i}"
                    ),
                ));
            }
            return Ok(Scan {
                records,
                intact_len: at as u64,
                torn: true,
            });
        };
        records.push(Scanned {
            head,
            payloads_at: payloads_at as u64,
        });
        at = end;
    }
    Ok(Scan {
        records,
        intact_len: bytes.len() as u64,
        torn: false,
    })
}

/// Scans a segment by its heads only (reading past the payloads): for the segments
/// before the last, whose payloads are checked when read.
fn scan_heads(storage: &dyn Storage, name: &str) -> Result<Scan> {
    let path = storage.display(name);
    let len = storage.size(name)?.unwrap_or(0);
    let mut records = Vec::new();
    let mut at = 0u64;
    let damaged = |at: u64| corrupt(&path, format!("a damaged record at byte {at}"));
    while at < len {
        if at + PREFIX as u64 > len {
            return Err(damaged(at));
        }
        let prefix = storage.read_range(name, at, PREFIX as u64)?;
        let head_len = u32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes")) as u64;
        if &prefix[..4] != MAGIC || at + PREFIX as u64 + head_len > len {
            return Err(damaged(at));
        }
        let head_bytes = storage.read_range(name, at + PREFIX as u64, head_len)?;
        // The payloads are not read: `record_at` sees the head only, so check its CRC
        // and parse it here.
        let head_crc = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes"));
        if crc32fast::hash(&head_bytes) != head_crc {
            return Err(damaged(at));
        }
        let head: Head = serde_json::from_slice(&head_bytes).map_err(|_| damaged(at))?;
        let payloads_at = at + PREFIX as u64 + head_len;
        let end = head
            .entries
            .iter()
            .try_fold(payloads_at, |end, e| end.checked_add(e.len))
            .filter(|end| *end <= len)
            .ok_or_else(|| damaged(at))?;
        records.push(Scanned { head, payloads_at });
        at = end;
    }
    Ok(Scan {
        records,
        intact_len: len,
        torn: false,
    })
}

/// Scans every segment of the log in `storage` (the last one wholly, the others by their
/// heads). A torn tail of the last segment is reported, not repaired.
fn scan_all(storage: &dyn Storage) -> Result<Vec<(u64, String, Scan)>> {
    let segs = segments(storage)?;
    let last = segs.len().saturating_sub(1);
    let mut out = Vec::with_capacity(segs.len());
    for (i, (first, name)) in segs.into_iter().enumerate() {
        let scan = if i == last {
            let bytes = storage.read(&name)?.unwrap_or_default();
            scan_bytes(&storage.display(&name), &bytes)?
        } else {
            scan_heads(storage, &name)?
        };
        out.push((first, name, scan));
    }
    Ok(out)
}

/// The versions each operator has changes logged for in the state log `dir` (a
/// checkpoint's `state-changes/`), read without opening it for writing: for tools and
/// tests. A torn tail is left out, not repaired.
pub fn logged_versions(dir: &Path) -> Result<BTreeMap<String, Vec<u64>>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (_, _, scan) in scan_all(etlantic_core::storage::open(dir).as_ref())? {
        for r in &scan.records {
            for e in &r.head.entries {
                out.entry(e.op.clone()).or_default().push(r.head.version);
            }
        }
    }
    for versions in out.values_mut() {
        versions.sort_unstable();
        versions.dedup();
    }
    Ok(out)
}

/// The whole snapshot versions of operator `op` in the state directory `state`
/// (`<op>/<version>.arrow`).
fn whole_versions(state: &dyn Storage, op: &str) -> Vec<u64> {
    let Ok(entries) = state.list(op) else {
        return Vec::new();
    };
    let mut out: Vec<u64> = entries
        .iter()
        .filter_map(|name| name.strip_suffix(".arrow")?.parse().ok())
        .collect();
    out.sort_unstable();
    out
}

/// The durable whole snapshots of one operator that retention looks at: the newest and
/// the one before it.
#[derive(Clone, Copy, Debug, Default)]
struct Wholes {
    newest: Option<u64>,
    previous: Option<u64>,
}

impl Wholes {
    fn of(versions: &[u64]) -> Self {
        let mut it = versions.iter().rev();
        Wholes {
            newest: it.next().copied(),
            previous: it.next().copied(),
        }
    }

    fn add(&mut self, version: u64) {
        match self.newest {
            Some(n) if version == n => {}
            Some(n) if version > n => {
                self.previous = Some(n);
                self.newest = Some(version);
            }
            Some(_) if self.previous.is_none_or(|p| version > p) => self.previous = Some(version),
            Some(_) => {}
            None => self.newest = Some(version),
        }
    }

    /// The oldest version a chain may still need, as
    /// [`super::state_files::StateFiles`] keeps whole snapshot files: a restart may
    /// re-run the batch before the newest whole snapshot, whose chain reaches back to the
    /// previous one, and [`KEPT_VERSIONS`] are kept in any case.
    fn floor(&self) -> u64 {
        match (self.previous, self.newest) {
            (Some(p), Some(n)) => p.min(n.saturating_sub(KEPT_VERSIONS)),
            _ => 0,
        }
    }
}

/// The segment being appended to.
struct Current {
    first: u64,
    file: Box<dyn AppendFile>,
}

#[derive(Default)]
struct Inner {
    /// First version → the newest version with a record in that segment.
    segments: BTreeMap<u64, u64>,
    /// The newest record of each operator and version.
    index: HashMap<String, BTreeMap<u64, Location>>,
    current: Option<Current>,
    /// Per operator with a record, its durable whole snapshots.
    wholes: HashMap<String, Wholes>,
}

/// The state log (see the module docs). Owned by one query: the checkpoint's lock
/// keeps other writers out.
pub struct StateLog {
    /// The log's directory (`state-changes/`).
    storage: Arc<dyn Storage>,
    /// The whole snapshot files' directory (`state/`).
    state: Arc<dyn Storage>,
    inner: Mutex<Inner>,
    /// The newest whole snapshot version on disk when the log was opened: whole
    /// snapshots of versions after the last commit may be left by a run that did not
    /// commit (see [`StateLog::may_have_stale_whole`]).
    newest_whole_at_open: u64,
}

impl std::fmt::Debug for StateLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateLog")
            .field("at", &self.storage.display(""))
            .finish()
    }
}

impl StateLog {
    /// Opens the log in directory `dir`, with the operators' whole snapshots in
    /// `state_dir/<op>/` (see [`StateLog::open_in`]).
    pub fn open(dir: impl AsRef<Path>, state_dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(
            etlantic_core::storage::open(dir.as_ref()),
            etlantic_core::storage::open(state_dir.as_ref()),
        )
    }

    /// Opens the log kept in `storage` (created at the first append), with the operators'
    /// whole snapshots in `state` (`<op>/<version>.arrow`), and repairs a torn tail of its
    /// last segment.
    pub fn open_in(storage: Arc<dyn Storage>, state: Arc<dyn Storage>) -> Result<Self> {
        let scans = scan_all(storage.as_ref())?;
        let mut inner = Inner::default();
        for (first, name, scan) in &scans {
            if scan.torn {
                storage.append(name)?.truncate(scan.intact_len)?;
            }
            let mut newest = 0;
            for r in &scan.records {
                inner.add_record(*first, &r.head, r.payloads_at);
                newest = newest.max(r.head.version);
            }
            inner.segments.insert(*first, newest);
        }
        if let Some((first, name, _)) = scans.last() {
            inner.current = Some(Current {
                first: *first,
                file: storage.append(name)?,
            });
        }
        let ops: Vec<String> = inner.index.keys().cloned().collect();
        for op in ops {
            let w = inner.wholes_of(state.as_ref(), &op);
            inner.wholes.insert(op, w);
        }
        let newest_whole_at_open = state
            .list("")?
            .iter()
            .filter_map(|d| d.strip_suffix('/'))
            .filter_map(|op| whole_versions(state.as_ref(), op).last().copied())
            .max()
            .unwrap_or(0);
        Ok(StateLog {
            storage,
            state,
            inner: Mutex::new(inner),
            newest_whole_at_open,
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // A panic while appending leaves at most a torn last record, which the next
        // append would follow; appends truncate it first (see `append`).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a whole snapshot of `version` may be on disk from a run that did not
    /// commit it (a version written before this log was opened).
    pub fn may_have_stale_whole(&self, version: u64) -> bool {
        version <= self.newest_whole_at_open
    }

    /// Appends one record with the entries of `version` of every operator in `entries`
    /// (operator id, entry; changes are since `since`), and syncs the log: when this
    /// returns, the record survives a crash of the machine.
    pub fn append(&self, version: u64, since: u64, entries: &[(&str, LogEntry<'_>)]) -> Result<()> {
        let mut inner = self.inner();
        let inner = &mut *inner;
        let per_segment = if self.storage.appends() {
            SEGMENT_VERSIONS
        } else {
            OBJECT_SEGMENT_VERSIONS
        };
        if inner
            .current
            .as_ref()
            .is_none_or(|c| version >= c.first + per_segment)
        {
            self.start_segment(inner, version)?;
        }
        let current = inner.current.as_mut().expect("started above");
        let start = current.file.len();
        let written = write_record(current.file.as_mut(), version, since, entries);
        let (head, head_len) = match written {
            Ok(h) => h,
            Err(e) => {
                // Cut what was written of the record, so the next append follows an
                // intact log; if even that fails, the open after a restart repairs it.
                let _ = current.file.truncate(start);
                let at = self.storage.display(&format!("{}.log", current.first));
                return Err(io_err(&at, format!("version {version}: {e}")));
            }
        };
        let first = current.first;
        let payloads_at = start + (PREFIX + head_len) as u64;
        inner.add_record(first, &head, payloads_at);
        let newest = inner.segments.entry(first).or_insert(0);
        *newest = (*newest).max(version);
        for e in &head.entries {
            if !inner.wholes.contains_key(&e.op) {
                let w = inner.wholes_of(self.state.as_ref(), &e.op);
                inner.wholes.insert(e.op.clone(), w);
            } else if e.whole {
                inner.wholes.get_mut(&e.op).expect("checked").add(version);
            }
        }
        Ok(())
    }

    /// Starts the segment `<version>.log`, makes its name durable, and removes the
    /// segments no chain needs any more.
    fn start_segment(&self, inner: &mut Inner, version: u64) -> Result<()> {
        // Created durably, its name included (the storage's contract).
        let file = self.storage.append(&format!("{version}.log"))?;
        inner.current = Some(Current {
            first: version,
            file,
        });
        inner.segments.entry(version).or_insert(0);
        self.forget(inner);
        Ok(())
    }

    /// Removes the segments, other than the current one, whose every record is older
    /// than what any operator's chain may need.
    fn forget(&self, inner: &mut Inner) {
        let floor = inner
            .index
            .keys()
            .map(|op| inner.wholes.get(op).copied().unwrap_or_default().floor())
            .min()
            .unwrap_or(0);
        let current = inner.current.as_ref().map(|c| c.first);
        let gone: Vec<u64> = inner
            .segments
            .iter()
            .filter(|(first, newest)| Some(**first) != current && **newest < floor)
            .map(|(first, _)| *first)
            .collect();
        for first in gone {
            if self.storage.delete(&format!("{first}.log")).is_ok() {
                inner.segments.remove(&first);
                for versions in inner.index.values_mut() {
                    versions.retain(|_, l| l.segment != first);
                }
            }
        }
        inner.index.retain(|_, versions| !versions.is_empty());
    }

    /// Called once the whole snapshot of `op` at `version` is durable: segments whose
    /// changes no chain needs any more are removed.
    pub fn note_whole(&self, op: &str, version: u64) {
        let mut inner = self.inner();
        if !inner.index.contains_key(op) {
            return;
        }
        inner.wholes.entry(op.to_string()).or_default().add(version);
        self.forget(&mut inner);
    }

    /// Called when the whole snapshot of `op` at `version` was removed (left by a run
    /// that did not commit it).
    pub fn note_whole_removed(&self, op: &str) {
        let mut inner = self.inner();
        if inner.wholes.contains_key(op) {
            let w = inner.wholes_of(self.state.as_ref(), op);
            inner.wholes.insert(op.to_string(), w);
        }
    }

    /// The entry of `op` at `version`, from the newest record of that version; `None`
    /// when the log has none.
    pub fn read(&self, op: &str, version: u64) -> Result<Option<Logged>> {
        let at = self
            .inner()
            .index
            .get(op)
            .and_then(|versions| versions.get(&version))
            .copied();
        at.map(|at| read_at(self.storage.as_ref(), op, version, at))
            .transpose()
    }
}

/// Reads the entry at `at`, checking its checksum.
fn read_at(storage: &dyn Storage, op: &str, version: u64, at: Location) -> Result<Logged> {
    let name = format!("{}.log", at.segment);
    let path = storage.display(&name);
    let file_len = storage.size(&name)?.unwrap_or(0);
    // The head that gave this location passed its checksum; its lengths are checked
    // against the file anyway before anything is allocated from them.
    if at
        .offset
        .checked_add(at.len)
        .is_none_or(|end| end > file_len)
    {
        return Err(corrupt(
            &path,
            format!(
                "the entry of `{op}` at version {version} ({} bytes at {}) is past the end of the file",
                at.len, at.offset
            ),
        ));
    }
    let bytes = storage.read_range(&name, at.offset, at.len)?;
    if crc32fast::hash(&bytes) != at.crc {
        return Err(corrupt(
            &path,
            format!("the entry of `{op}` at version {version} fails its checksum"),
        ));
    }
    super::ipc_guard::check_stream(&bytes, &path)?;
    let batch = super::ipc_guard::decode(&path, || {
        let mut reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| corrupt(&path, e))?;
        match reader.next() {
            Some(b) => b.map_err(|e| corrupt(&path, e)),
            None => Err(corrupt(&path, "an entry without a record batch")),
        }
    })?;
    Ok(if at.whole {
        Logged::Whole(batch)
    } else {
        Logged::Changes {
            since: at.since,
            changes: batch,
        }
    })
}

/// The entry of `op` at `version` in the state log `dir` (a checkpoint's
/// `state-changes/`), read without opening the log for writing: for tools and tests. A
/// torn tail is left out, not repaired.
pub fn read_logged(dir: &Path, op: &str, version: u64) -> Result<Option<Logged>> {
    let storage = etlantic_core::storage::open(dir);
    let mut inner = Inner::default();
    for (first, _, scan) in scan_all(storage.as_ref())? {
        for r in &scan.records {
            inner.add_record(first, &r.head, r.payloads_at);
        }
    }
    let at = inner
        .index
        .get(op)
        .and_then(|versions| versions.get(&version))
        .copied();
    at.map(|at| read_at(storage.as_ref(), op, version, at))
        .transpose()
}

impl Inner {
    /// The durable whole snapshots of `op`: its files in `state_dir/<op>/` and its whole
    /// entries in the log.
    fn wholes_of(&self, state: &dyn Storage, op: &str) -> Wholes {
        let mut versions = whole_versions(state, op);
        if let Some(logged) = self.index.get(op) {
            versions.extend(logged.iter().filter(|(_, l)| l.whole).map(|(v, _)| *v));
        }
        versions.sort_unstable();
        versions.dedup();
        Wholes::of(&versions)
    }

    fn add_record(&mut self, segment: u64, head: &Head, payloads_at: u64) {
        let mut offset = payloads_at;
        for e in &head.entries {
            self.index.entry(e.op.clone()).or_default().insert(
                head.version,
                Location {
                    segment,
                    offset,
                    len: e.len,
                    crc: e.crc,
                    since: head.since,
                    whole: e.whole,
                },
            );
            offset += e.len;
        }
    }
}

/// Writes one record at the end of `file` and syncs it: a space for the prefix and head,
/// the payloads (encoded straight into the file, through a buffer), then the prefix and
/// head over that space. Returns the head and its length.
///
/// Encoding into the file rather than into memory first keeps the bytes the kernel copies
/// warm in the cache (encoded into one buffer and then written, Nexmark q7's ≈3 MB of
/// changes per micro-batch cost ten times the kernel copy time). The head is only known
/// after the payloads, so its space is sized for the largest numbers (the JSON padded
/// with spaces); until it is written that space is zeros, which fail the head's check,
/// so a crash in between leaves a torn record.
fn write_record(
    file: &mut dyn AppendFile,
    version: u64,
    since: u64,
    entries: &[(&str, LogEntry<'_>)],
) -> std::io::Result<(Head, usize)> {
    let head_of = |sizes: &mut dyn FnMut(usize) -> (u64, u32)| Head {
        version,
        since,
        entries: entries
            .iter()
            .enumerate()
            .map(|(i, (op, entry))| {
                let (len, crc) = sizes(i);
                EntryHead {
                    op: op.to_string(),
                    len,
                    crc,
                    whole: matches!(entry, LogEntry::Whole(_)),
                }
            })
            .collect(),
    };
    let head_len = serde_json::to_vec(&head_of(&mut |_| (u64::MAX, u32::MAX)))
        .map_err(std::io::Error::other)?
        .len();
    let start = file.len();
    let mut out = BufWriter::with_capacity(64 << 10, Appending(&mut *file));
    out.write_all(&vec![0u8; PREFIX + head_len])?;
    let mut sizes = Vec::with_capacity(entries.len());
    for (_, entry) in entries {
        let mut tally = Tally {
            out: &mut out,
            crc: crc32fast::Hasher::new(),
            len: 0,
        };
        encode(&mut tally, entry.batch()).map_err(std::io::Error::other)?;
        sizes.push((tally.len, tally.crc.finalize()));
    }
    out.into_inner().map_err(|e| e.into_error())?;
    let head = head_of(&mut |i| sizes[i]);
    let mut head_bytes = serde_json::to_vec(&head).map_err(std::io::Error::other)?;
    // Never longer than with the largest numbers.
    head_bytes.resize(head_len, b' ');
    let mut prefix = Vec::with_capacity(PREFIX + head_len);
    prefix.extend_from_slice(MAGIC);
    prefix.extend_from_slice(&(head_len as u32).to_le_bytes());
    prefix.extend_from_slice(&crc32fast::hash(&head_bytes).to_le_bytes());
    prefix.extend_from_slice(&head_bytes);
    file.write_at(start, &prefix)
        .map_err(std::io::Error::other)?;
    file.sync().map_err(std::io::Error::other)?;
    Ok((head, head_len))
}

/// An [`AppendFile`] as an `io::Write` that appends.
struct Appending<'a>(&'a mut dyn AppendFile);

impl Write for Appending<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that counts and checksums what passes through it.
struct Tally<W> {
    out: W,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for Tally<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Encodes `batch` as an Arrow IPC stream with LZ4 frames into `out`.
fn encode(
    out: impl Write,
    batch: &RecordBatch,
) -> std::result::Result<(), arrow::error::ArrowError> {
    // LZ4 frames: changes hold long runs of nulls (a join side's columns in the other
    // side's rows, removed rows); compressing costs less than writing and syncing them
    // (Nexmark q7 without it: 30% more CPU, four times the kernel time).
    let options =
        IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME))?;
    let mut w = StreamWriter::try_new_with_options(out, &batch.schema(), options)?;
    w.write(batch)?;
    w.finish()
}

#[cfg(test)]
mod tests;
