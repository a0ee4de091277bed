//! Where checkpoints, connector logs, file outputs and the quarantine keep their bytes.
//!
//! Everything the runtime must find again after a crash goes through [`Storage`]: a
//! directory of named byte files, rooted somewhere. [`LocalStorage`] is a directory of
//! the local file system; [`power_cut::PowerCutDisk`] is an in-memory disk that keeps
//! unsynced bytes apart and can lose them, for tests; object stores (S3 and the like)
//! implement the same trait through a [`StorageProvider`] (they have no append, see
//! [`Storage::append`]).
//!
//! [`open`] gives the storage of a local directory, honouring test mounts ([`mount`]);
//! [`open_location`] that of any [`Location`], object stores included.
//!
//! # The durability contract
//!
//! An implementation keeps these invariants, which the checkpoint's recovery relies on:
//!
//! - [`Storage::put`] replaces a file **atomically and durably**: when it returns `Ok`,
//!   the new content survives a power cut; if the machine stops before that, readers
//!   later see the old content or the new one, never a mix (a leftover temporary object
//!   is never listed). [`Storage::put_if_absent`] is the same, but only when no file of
//!   that name exists — two writers cannot both create it.
//! - [`Storage::delete`] and [`Storage::rename`] are durable when they return.
//! - An [`AppendFile`]'s writes are **not** durable until its [`AppendFile::sync`]
//!   returns: a power cut keeps every byte synced before it and may keep any prefix of
//!   what was written after the last sync (a torn tail), never bytes that were not
//!   written. Creating the file ([`Storage::append`] of a new name) is durable.
//! - Reads see every write made through the storage before them (read-your-writes).
//! - [`Storage::lock`] is exclusive between live processes; a process that dies releases
//!   it (on an object store: a lease, taken over once its holder is known dead or its
//!   time ran out).
//!
//! Paths are relative, `/`-separated, with no `.` or `..` segment.

pub mod location;
pub mod power_cut;
pub mod requests;
pub mod testing;

pub use location::{
    check_location, open_location, Location, StorageOptions, StorageProvider, StorageRegistration,
    OBJECT_SCHEMES,
};

use crate::diagnostics::{codes, Diagnostic, Error, Result};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A directory of named byte files that survive crashes (see the [module docs](self)).
pub trait Storage: Send + Sync + fmt::Debug {
    /// Where `path` is, for messages (a file path or a URL).
    fn display(&self, path: &str) -> String;

    /// The whole file at `path`, or `None` when there is none.
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>>;

    /// `len` bytes of `path` from `offset`; an error when they are not all there.
    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// The size of `path`, or `None` when there is none.
    fn size(&self, path: &str) -> Result<Option<u64>>;

    /// The names directly in directory `dir` (`""` for the root), sorted; a
    /// sub-directory's name ends with `/`. A missing directory has none.
    fn list(&self, dir: &str) -> Result<Vec<String>>;

    /// The size, modification time and version of `path`, or `None` when there is none.
    /// Two answers for one path are equal only if its content did not change between
    /// them, as far as the storage can tell (a disk: same size and modification time; an
    /// object store: same ETag).
    fn stat(&self, path: &str) -> Result<Option<FileMeta>> {
        Ok(self.size(path)?.map(|size| FileMeta {
            size,
            modified_ms: 0,
            version: None,
        }))
    }

    /// The files directly in directory `dir` with their [`FileMeta`], sorted by name
    /// (sub-directories left out). An object store answers with one listing, not a
    /// request per file.
    fn list_files(&self, dir: &str) -> Result<Vec<(String, FileMeta)>> {
        let mut out = Vec::new();
        for name in self.list(dir)? {
            if name.ends_with('/') {
                continue;
            }
            if let Some(meta) = self.stat(&join(dir, &name))? {
                out.push((name, meta));
            }
        }
        Ok(out)
    }

    /// Replaces `path` atomically and durably with what `fill` writes.
    fn put(
        &self,
        path: &str,
        fill: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<()>;

    /// Creates `path` with `bytes`, atomically and durably, only if it does not exist;
    /// returns whether it created it.
    fn put_if_absent(&self, path: &str, bytes: &[u8]) -> Result<bool>;

    /// Deletes `path`, durably; nothing happens when there is none.
    fn delete(&self, path: &str) -> Result<()>;

    /// Deletes every path of `paths`, durably when it returns (an implementation may make
    /// them durable together: one directory sync for many files).
    fn delete_all(&self, paths: &[String]) -> Result<()> {
        for p in paths {
            self.delete(p)?;
        }
        Ok(())
    }

    /// Renames `from` to `to`, replacing `to`, durably (atomic on a local disk; on an
    /// object store a copy then a delete).
    fn rename(&self, from: &str, to: &str) -> Result<()>;

    /// Opens `path` for appending, creating it (empty, durably) when missing. Object
    /// stores cannot append and answer `ETL706`; callers that need to run on them write
    /// whole files instead.
    fn append(&self, path: &str) -> Result<Box<dyn AppendFile>>;

    /// Takes the exclusive lock named `path` for as long as the returned guard lives:
    /// `ETL803` when another live process holds it.
    fn lock(&self, path: &str) -> Result<Lock>;

    /// Whether [`Storage::append`] works here (a file system) or not (an object store):
    /// callers that append on a disk write an object per record where it does not.
    fn appends(&self) -> bool {
        true
    }

    /// How many requests it has retried after transient failures since it was opened
    /// (an object store's; a disk retries nothing).
    fn retries(&self) -> u64 {
        0
    }
}

/// What a storage tells of a file ([`Storage::stat`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileMeta {
    /// Size in bytes.
    pub size: u64,
    /// Last modification, in epoch milliseconds (0 when the storage does not say).
    pub modified_ms: i64,
    /// A tag that changes with every new content (an object's ETag), when the storage
    /// has one.
    pub version: Option<String>,
}

impl FileMeta {
    /// Whether `other` describes the same content: the same size and version where both
    /// have a version (an object store's listing and `HEAD` may round the time
    /// differently), else the same size and modification time.
    pub fn same_as(&self, other: &FileMeta) -> bool {
        match (&self.version, &other.version) {
            (Some(a), Some(b)) => self.size == other.size && a == b,
            _ => self.size == other.size && self.modified_ms == other.modified_ms,
        }
    }
}

/// The [`FileMeta`] of a local file (symbolic links followed), `None` when there is none.
pub fn file_meta(path: &Path) -> Result<Option<FileMeta>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(FileMeta {
            size: m.len(),
            modified_ms: m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as i64),
            version: None,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("stat", &show(path), e)),
    }
}

/// A held [`Storage::lock`]: released when dropped.
pub struct Lock {
    _held: Box<dyn Send + Sync>,
}

impl Lock {
    /// A lock held for as long as `held` lives.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Lock {
            _held: Box::new(held),
        }
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lock")
    }
}

/// A file open for appending (see [`Storage::append`] for what is durable when).
pub trait AppendFile: Send + fmt::Debug {
    /// Its length, written bytes included.
    fn len(&self) -> u64;

    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes` at the end.
    fn write(&mut self, bytes: &[u8]) -> Result<()>;

    /// Overwrites bytes from `offset`, which must not reach past the end (a record's head
    /// written over the space reserved for it).
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()>;

    /// Cuts the file to `len` bytes and makes that durable (a torn tail repaired).
    fn truncate(&mut self, len: u64) -> Result<()>;

    /// Makes everything written so far durable.
    fn sync(&mut self) -> Result<()>;
}

/// An `ETL706` error of a storage operation.
pub fn io_error(what: &str, at: &str, e: impl fmt::Display) -> Error {
    Error::new(&codes::IO_ERROR, format!("cannot {what} `{at}`: {e}"))
}

/// `path` under `dir` (either may be empty).
pub fn join(dir: &str, path: &str) -> String {
    match (dir.trim_end_matches('/'), path) {
        ("", p) => p.to_string(),
        (d, "") => d.to_string(),
        (d, p) => format!("{d}/{p}"),
    }
}

/// A storage seen from one of its directories: every path is taken relative to `dir`.
#[derive(Debug, Clone)]
pub struct Sub {
    inner: Arc<dyn Storage>,
    dir: String,
}

impl Sub {
    /// The storage `inner` rooted at its directory `dir`.
    pub fn new(inner: Arc<dyn Storage>, dir: &str) -> Self {
        Sub {
            inner,
            dir: dir.trim_end_matches('/').to_string(),
        }
    }

    fn at(&self, path: &str) -> String {
        join(&self.dir, path)
    }
}

impl Storage for Sub {
    fn display(&self, path: &str) -> String {
        self.inner.display(&self.at(path))
    }
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        self.inner.read(&self.at(path))
    }
    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.read_range(&self.at(path), offset, len)
    }
    fn size(&self, path: &str) -> Result<Option<u64>> {
        self.inner.size(&self.at(path))
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.inner.list(&self.at(dir))
    }
    fn stat(&self, path: &str) -> Result<Option<FileMeta>> {
        self.inner.stat(&self.at(path))
    }
    fn list_files(&self, dir: &str) -> Result<Vec<(String, FileMeta)>> {
        self.inner.list_files(&self.at(dir))
    }
    fn put(
        &self,
        path: &str,
        fill: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<()> {
        self.inner.put(&self.at(path), fill)
    }
    fn put_if_absent(&self, path: &str, bytes: &[u8]) -> Result<bool> {
        self.inner.put_if_absent(&self.at(path), bytes)
    }
    fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(&self.at(path))
    }
    fn delete_all(&self, paths: &[String]) -> Result<()> {
        let at: Vec<String> = paths.iter().map(|p| self.at(p)).collect();
        self.inner.delete_all(&at)
    }
    fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(&self.at(from), &self.at(to))
    }
    fn append(&self, path: &str) -> Result<Box<dyn AppendFile>> {
        self.inner.append(&self.at(path))
    }
    fn lock(&self, path: &str) -> Result<Lock> {
        self.inner.lock(&self.at(path))
    }
    fn appends(&self) -> bool {
        self.inner.appends()
    }
    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

/// Writes `bytes` to `path` of `storage` atomically and durably.
pub fn put_bytes(storage: &dyn Storage, path: &str, bytes: &[u8]) -> Result<()> {
    storage.put(path, &mut |w| {
        w.write_all(bytes).map_err(|e| io_error("write", path, e))
    })
}

/// Every file under directory `dir` of `storage`, recursively, as its path relative to
/// `dir` and its size, in no particular order.
pub fn walk_files(storage: &dyn Storage, dir: &str) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut pending = vec![String::new()];
    while let Some(sub) = pending.pop() {
        for name in storage.list(&join(dir, &sub))? {
            let rel = join(&sub, name.trim_end_matches('/'));
            if name.ends_with('/') {
                pending.push(rel);
            } else if let Some(size) = storage.size(&join(dir, &rel))? {
                out.push((rel, size));
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------- mounts

type Mounts = RwLock<Vec<(PathBuf, Arc<dyn Storage>)>>;

fn mounts() -> &'static Mounts {
    static MOUNTS: std::sync::OnceLock<Mounts> = std::sync::OnceLock::new();
    MOUNTS.get_or_init(|| RwLock::new(Vec::new()))
}

/// Makes [`open`] serve every location under `root` from `storage` (whose root stands for
/// `root`) instead of the local disk, until the returned guard is dropped: how a test
/// runs a pipeline on a [`power_cut::PowerCutDisk`].
pub fn mount(root: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> MountGuard {
    let root = root.into();
    mounts()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push((root.clone(), storage));
    MountGuard { root }
}

/// Keeps a [`mount`] in place.
#[derive(Debug)]
pub struct MountGuard {
    root: PathBuf,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        mounts()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(r, _)| r != &self.root);
    }
}

/// Whether `dir` is under a [`mount`] (its files are not the local disk's).
pub fn is_mounted(dir: &Path) -> bool {
    mounts()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|(root, _)| dir.starts_with(root))
}

/// The storage rooted at directory `dir`: a mounted one when `dir` is under a mount,
/// else the local disk.
pub fn open(dir: &Path) -> Arc<dyn Storage> {
    let mounts = mounts().read().unwrap_or_else(|p| p.into_inner());
    for (root, storage) in mounts.iter() {
        if let Ok(rest) = dir.strip_prefix(root) {
            let rel: Vec<String> = rest
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            return Arc::new(Sub::new(storage.clone(), &rel.join("/")));
        }
    }
    Arc::new(LocalStorage::new(dir))
}

// ------------------------------------------------------------------------- local disk

/// A directory of the local file system (see the [module docs](self)): atomic replaces
/// by temporary file, `fsync`, rename and directory `fsync`; appends to open files,
/// `fdatasync` on [`AppendFile::sync`]; locks with `flock`.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    /// The directory `root` (created when something is first written).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage { root: root.into() }
    }

    /// The local path of `path`.
    pub fn path(&self, path: &str) -> PathBuf {
        if path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
    }

    /// The directory of `p`, created durably when missing (see [`create_dirs`]).
    fn parent_dir(&self, p: &Path) -> Result<PathBuf> {
        let dir = p
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.root.clone());
        create_dirs(&dir)?;
        Ok(dir)
    }
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

pub use crate::durable::create_dirs;

impl Storage for LocalStorage {
    fn display(&self, path: &str) -> String {
        show(&self.path(path))
    }

    fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let p = self.path(path);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &show(&p), e)),
        }
    }

    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let p = self.path(path);
        let mut f = File::open(&p).map_err(|e| io_error("open", &show(&p), e))?;
        let size = f
            .metadata()
            .map_err(|e| io_error("stat", &show(&p), e))?
            .len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(io_error(
                "read",
                &show(&p),
                format!("{len} bytes at {offset} are past its end ({size} bytes)"),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| io_error("read", &show(&p), e))?;
        Ok(buf)
    }

    fn size(&self, path: &str) -> Result<Option<u64>> {
        let p = self.path(path);
        match fs::metadata(&p) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("stat", &show(&p), e)),
        }
    }

    fn stat(&self, path: &str) -> Result<Option<FileMeta>> {
        file_meta(&self.path(path))
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let p = self.path(dir);
        let entries = match fs::read_dir(&p) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("list", &show(&p), e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| io_error("list", &show(&p), e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            // Temporary files of an atomic replace are never listed.
            if name.starts_with('.') && name.ends_with(".tmp") {
                continue;
            }
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            out.push(if is_dir { format!("{name}/") } else { name });
        }
        out.sort();
        Ok(out)
    }

    fn put(
        &self,
        path: &str,
        fill: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<()> {
        crate::durable::write_atomic_with(&self.path(path), |f| {
            let mut w = std::io::BufWriter::with_capacity(64 * 1024, f);
            fill(&mut w)?;
            w.into_inner()
                .map_err(|e| io_error("write", path, e.error()))
        })
    }

    fn put_if_absent(&self, path: &str, bytes: &[u8]) -> Result<bool> {
        let p = self.path(path);
        let dir = self.parent_dir(&p)?;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{}.{}-{}.tmp",
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = File::create(&tmp).map_err(|e| io_error("create", &show(&tmp), e))?;
            f.write_all(bytes)
                .and_then(|_| f.sync_all())
                .map_err(|e| io_error("write", &show(&tmp), e))?;
            // `link` fails when the name exists: create-if-absent, atomically.
            match fs::hard_link(&tmp, &p) {
                Ok(()) => {
                    crate::durable::sync_dir(&dir).map_err(|e| io_error("sync", &show(&dir), e))?;
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(io_error("create", &show(&p), e)),
            }
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    fn delete(&self, path: &str) -> Result<()> {
        let p = self.path(path);
        match fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("delete", &show(&p), e)),
        }
        if let Some(dir) = p.parent() {
            crate::durable::sync_dir(dir).map_err(|e| io_error("sync", &show(dir), e))?;
        }
        Ok(())
    }

    fn delete_all(&self, paths: &[String]) -> Result<()> {
        let mut dirs = std::collections::BTreeSet::new();
        for path in paths {
            let p = self.path(path);
            match fs::remove_file(&p) {
                Ok(()) => {
                    dirs.extend(p.parent().map(Path::to_path_buf));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("delete", &show(&p), e)),
            }
        }
        for dir in dirs {
            crate::durable::sync_dir(&dir).map_err(|e| io_error("sync", &show(&dir), e))?;
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (f, t) = (self.path(from), self.path(to));
        let dir = self.parent_dir(&t)?;
        fs::rename(&f, &t).map_err(|e| io_error("rename", &show(&f), e))?;
        crate::durable::sync_dir(&dir).map_err(|e| io_error("sync", &show(&dir), e))?;
        if let Some(src_dir) = f.parent().filter(|d| *d != dir) {
            crate::durable::sync_dir(src_dir).map_err(|e| io_error("sync", &show(src_dir), e))?;
        }
        Ok(())
    }

    fn append(&self, path: &str) -> Result<Box<dyn AppendFile>> {
        let p = self.path(path);
        let dir = self.parent_dir(&p)?;
        let existed = p.exists();
        // Appends go through an `O_APPEND` descriptor, so that a file other processes
        // append to too (a quarantine shared by several queries) never has records
        // overwritten; `write_at` and `truncate` use a second, positioned one.
        let appender = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(|e| io_error("open", &show(&p), e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| io_error("open", &show(&p), e))?;
        if !existed {
            file.sync_all()
                .map_err(|e| io_error("sync", &show(&p), e))?;
            crate::durable::sync_dir(&dir).map_err(|e| io_error("sync", &show(&dir), e))?;
        }
        let len = file
            .metadata()
            .map_err(|e| io_error("stat", &show(&p), e))?
            .len();
        Ok(Box::new(LocalAppend {
            path: p,
            appender,
            file,
            len,
        }))
    }

    fn lock(&self, path: &str) -> Result<Lock> {
        let p = self.path(path);
        self.parent_dir(&p)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| io_error("open", &show(&p), e))?;
        if file.try_lock().is_err() {
            return Err(Diagnostic::new(
                &codes::CHECKPOINT_LOCKED,
                format!("`{}` is locked by another process", show(&p)),
            )
            .into());
        }
        Ok(Lock::new(file))
    }
}

/// A local file open for appending.
#[derive(Debug)]
struct LocalAppend {
    path: PathBuf,
    /// Opened with `O_APPEND`: every write lands at the end, whoever else appends.
    appender: File,
    /// Opened for positioned writes (a record's head) and truncation.
    file: File,
    /// The length as this handle knows it (exact when it is the file's only writer).
    len: u64,
}

impl AppendFile for LocalAppend {
    fn len(&self) -> u64 {
        self.len
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.appender
            .write_all(bytes)
            .map_err(|e| io_error("write", &show(&self.path), e))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(io_error(
                "write",
                &show(&self.path),
                format!(
                    "{} bytes at {offset} pass its end ({})",
                    bytes.len(),
                    self.len
                ),
            ));
        }
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| io_error("write", &show(&self.path), e))
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| io_error("truncate", &show(&self.path), e))?;
        self.len = len;
        self.file
            .sync_all()
            .map_err(|e| io_error("sync", &show(&self.path), e))
    }

    fn sync(&mut self) -> Result<()> {
        // One file: a sync through either descriptor covers both.
        self.file
            .sync_data()
            .map_err(|e| io_error("sync", &show(&self.path), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract every implementation keeps, checked on the local disk and the
    /// simulated one.
    pub(crate) fn contract(s: &dyn Storage) {
        testing::whole_files(s);
        put_bytes(s, "a/x", b"two").unwrap();
        assert_eq!(s.read_range("a/x", 2, 5).unwrap_err().code(), "ETL706");
        assert!(s.put_if_absent("a/y", b"first").unwrap());
        let mut f = s.append("a/log").unwrap();
        assert_eq!(f.len(), 0);
        f.write(b"hello ").unwrap();
        f.write(b"world").unwrap();
        f.write_at(0, b"J").unwrap();
        assert!(f.write_at(10, b"xx").is_err());
        f.sync().unwrap();
        assert_eq!(s.read("a/log").unwrap().unwrap(), b"Jello world");
        f.truncate(5).unwrap();
        assert_eq!(s.read("a/log").unwrap().unwrap(), b"Jello");
        drop(f);
        let f = s.append("a/log").unwrap();
        assert_eq!(f.len(), 5);
        put_bytes(s, "a/b/z", b"z").unwrap();
        assert_eq!(s.list("a").unwrap(), vec!["b/", "log", "x", "y"]);
        s.rename("a/x", "a/w").unwrap();
        assert_eq!(s.read("a/x").unwrap(), None);
        assert_eq!(s.read("a/w").unwrap().unwrap(), b"two");
        s.delete("a/w").unwrap();
        s.delete("a/w").unwrap();
        assert_eq!(s.list("a").unwrap(), vec!["b/", "log", "y"]);
        let sub = Sub::new(Arc::new(LocalStorage::new("/nonexistent")), "q");
        assert!(sub.display("f").ends_with("q/f"));
        let lock = s.lock("lock").unwrap();
        assert_eq!(
            s.lock("lock").err().map(|e| e.code().to_string()),
            Some("ETL803".into())
        );
        drop(lock);
        s.lock("lock").unwrap();
    }

    #[test]
    fn the_local_disk_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        contract(&LocalStorage::new(dir.path()));
        // No temporary file is left or listed.
        let names: Vec<String> = fs::read_dir(dir.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn mounts_route_locations_under_their_root() {
        let disk = Arc::new(power_cut::PowerCutDisk::new());
        let root = PathBuf::from("/mounted/root");
        {
            let _m = mount(&root, disk.clone());
            put_bytes(open(&root.join("chk")).as_ref(), "f", b"x").unwrap();
            assert_eq!(disk.read("chk/f").unwrap().unwrap(), b"x");
        }
        // Unmounted: the local disk again.
        assert!(open(&root.join("chk"))
            .display("f")
            .starts_with("/mounted/root/chk"));
        assert_eq!(join("a/", "b"), "a/b");
        assert_eq!(join("", "b"), "b");
    }
}
