//! How far a source is in the read it is doing now: files and bytes done of the total,
//! rows decoded. A source that reads much in one call (a batch run reads a whole
//! directory in one micro-batch) updates it as it goes, and a progress bar polls it from
//! another thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one source's current read, shared between the source (which writes them)
/// and whoever shows progress (which reads them). Lock-free; each figure is read on its
/// own, so a reader may see one file's figures half-updated — fine for a progress bar,
/// not for accounting (the progress records are the accounting).
#[derive(Debug, Default)]
pub struct ReadProgress {
    files_total: AtomicU64,
    files_done: AtomicU64,
    bytes_total: AtomicU64,
    bytes_done: AtomicU64,
    rows: AtomicU64,
}

/// What [`ReadProgress::snapshot`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadSnapshot {
    /// Files the current read covers.
    pub files_total: u64,
    /// Files of it done.
    pub files_done: u64,
    /// Their bytes (0 when not known).
    pub bytes_total: u64,
    /// Bytes of the files done.
    pub bytes_done: u64,
    /// Records decoded so far in the current read.
    pub rows: u64,
}

impl ReadProgress {
    /// A read of `files` files of `bytes` bytes (0 when unknown) begins.
    pub fn begin(&self, files: u64, bytes: u64) {
        self.files_done.store(0, Relaxed);
        self.bytes_done.store(0, Relaxed);
        self.rows.store(0, Relaxed);
        self.bytes_total.store(bytes, Relaxed);
        self.files_total.store(files, Relaxed);
    }

    /// One file of `bytes` bytes is done, with `rows` records decoded from it.
    pub fn file_done(&self, bytes: u64, rows: u64) {
        self.bytes_done.fetch_add(bytes, Relaxed);
        self.rows.fetch_add(rows, Relaxed);
        self.files_done.fetch_add(1, Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> ReadSnapshot {
        ReadSnapshot {
            files_total: self.files_total.load(Relaxed),
            files_done: self.files_done.load(Relaxed),
            bytes_total: self.bytes_total.load(Relaxed),
            bytes_done: self.bytes_done.load(Relaxed),
            rows: self.rows.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_counts_from_zero_each_time() {
        let p = ReadProgress::default();
        p.begin(2, 300);
        p.file_done(100, 7);
        assert_eq!(
            p.snapshot(),
            ReadSnapshot {
                files_total: 2,
                files_done: 1,
                bytes_total: 300,
                bytes_done: 100,
                rows: 7
            }
        );
        p.begin(1, 0);
        p.file_done(0, 3);
        let s = p.snapshot();
        assert_eq!((s.files_done, s.files_total, s.rows), (1, 1, 3));
    }
}
