//! Durable, atomic file writes: the one way checkpoints, source logs and sink logs put a
//! file on disk.
//!
//! [`write_atomic`] writes a hidden temporary file in the target's directory, `fsync`s
//! it, renames it over the target and `fsync`s the directory. When it returns `Ok`, the
//! new content survives a crash of the process or of the machine; when the process dies
//! part way, readers see the old file or the new one, never a torn one (a leftover
//! temporary file is hidden, named `.<name>.<pid>-<n>.tmp`, and never read).
//!
//! A plugin that records progress in files (a sink's commit log, a source's seen-files
//! log) should use these helpers rather than `std::fs::write`, which is neither atomic nor
//! durable.

use crate::diagnostics::{codes, Error, Result};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// An `ETL706` I/O error naming what was attempted and the path.
pub fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("cannot {what} `{}`: {e}", path.display()),
    )
}

/// Writes `bytes` to `path` atomically and durably (see the module docs). Creates the
/// directory when it is missing.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |mut f| {
        f.write_all(bytes).map_err(|e| io_error("write", path, e))?;
        Ok(f)
    })
}

/// Like [`write_atomic`], but the content is produced by `fill`, which writes into the
/// temporary file and hands it back for the `fsync`. When `fill` fails, the temporary
/// file is removed and `path` is untouched.
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(File) -> Result<File>) -> Result<()> {
    let dir = parent_of(path);
    create_dirs(dir)?;
    let tmp = temporary_path(path);
    let result = (|| {
        let f = File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
        let f = fill(f)?;
        f.sync_all().map_err(|e| io_error("sync", &tmp, e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| io_error("rename into", path, e))?;
        sync_dir(dir).map_err(|e| io_error("sync", dir, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` and its missing ancestors, syncing the parent of each directory it
/// creates: a file's durability needs the names leading to it durable too.
pub fn create_dirs(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.as_os_str().is_empty() && !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("create directory", d, e)),
        }
        if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent).map_err(|e| io_error("sync", parent, e))?;
        }
    }
    Ok(())
}

/// `fsync`s a directory so that a rename or a new file in it is durable (a no-op where
/// directories cannot be synced).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
    }
    Ok(())
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A hidden temporary name next to `path`, unique within the process.
fn temporary_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_of(path).join(format!(
        ".{name}.{}-{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("entry");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("entry")]);
    }

    #[test]
    fn a_failing_fill_keeps_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry");
        write_atomic(&path, b"old").unwrap();
        let err = write_atomic_with(&path, |mut f| {
            f.write_all(b"partial").unwrap();
            Err(Error::new(&codes::IO_ERROR, "disk full"))
        })
        .unwrap_err();
        assert_eq!(err.code(), "ETL706");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
