//! An in-memory disk that loses power on request: the test double of [`Storage`] for
//! crash tests that a process kill cannot make.
//!
//! A killed process leaves the operating system's page cache behind, so everything it
//! wrote survives, synced or not. A power cut does not: [`PowerCutDisk`] keeps each
//! appended file's durable bytes (as of its last [`AppendFile::sync`]) apart from what
//! was written since, and at a cut drops the unsynced bytes — optionally keeping a
//! prefix of them in the file written last, as a torn write. Whole-file writes
//! ([`Storage::put`]), deletes and renames are durable when they return, as the
//! [`Storage`] contract says.
//!
//! Every operation that changes the disk is an *event*, counted from 0. [`PowerCutDisk::cut_before`]
//! arms a cut before event `n`: that event and every later one fail with `ETL706`
//! ("power cut") and the disk keeps only what was durable. [`PowerCutDisk::power_on`]
//! then lets a new run (the restart after the cut) use the disk again. A test runs its
//! pipeline once to count the events, then once per event with the cut there, restarts
//! it after each cut, and compares the outputs.

use super::{AppendFile, Lock, Storage};
use crate::diagnostics::{codes, Diagnostic, Error, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Clone)]
struct SimFile {
    /// What reads see.
    current: Vec<u8>,
    /// What survives a power cut.
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, SimFile>,
    events: u64,
    cut_before: Option<u64>,
    tear: bool,
    off: bool,
    /// A description of each event, in order.
    trace: Vec<String>,
    /// The file written last (torn at a cut).
    last_written: Option<String>,
    /// Held locks: path → the holder's token.
    locks: BTreeMap<String, u64>,
    next_token: u64,
    /// What the cut destroyed, for test messages.
    lost: Vec<String>,
}

/// The disk (see the [module docs](self)). Cheap to share: clones see the same disk.
#[derive(Debug, Default, Clone)]
pub struct PowerCutDisk {
    state: Arc<Mutex<State>>,
}

fn power_cut(what: &str) -> Error {
    Error::from(Diagnostic::new(
        &codes::IO_ERROR,
        format!("power cut: {what} did not happen"),
    ))
}

impl State {
    /// Counts one event; cuts the power when it is the armed one.
    fn event(&mut self, what: String, tear_write: Option<(&str, &[u8])>) -> Result<()> {
        if self.off {
            return Err(power_cut(&what));
        }
        if self.cut_before == Some(self.events) {
            self.cut(tear_write);
            return Err(power_cut(&what));
        }
        self.events += 1;
        self.trace.push(what);
        Ok(())
    }

    /// Drops every unsynced byte, keeping half of the file written last's (with the write
    /// in flight) when tearing.
    fn cut(&mut self, in_flight: Option<(&str, &[u8])>) {
        self.off = true;
        let torn = if self.tear {
            match in_flight {
                Some((path, bytes)) => {
                    if let Some(f) = self.files.get_mut(path) {
                        f.current.extend_from_slice(bytes);
                    }
                    Some(path.to_string())
                }
                None => self.last_written.clone(),
            }
        } else {
            None
        };
        for (path, f) in self.files.iter_mut() {
            if f.current == f.durable {
                continue;
            }
            let common = f
                .current
                .iter()
                .zip(&f.durable)
                .take_while(|(a, b)| a == b)
                .count();
            let unsynced = f.current.len().saturating_sub(f.durable.len());
            if torn.as_deref() == Some(path.as_str()) && f.current.len() > f.durable.len() {
                let keep = f.durable.len() + unsynced / 2;
                // Overwrites of durable bytes are lost; appended bytes kept in part.
                let mut kept = f.durable.clone();
                kept.extend_from_slice(&f.current[f.durable.len()..keep]);
                self.lost.push(format!(
                    "{path}: {} of {unsynced} unsynced bytes kept (torn)",
                    keep - f.durable.len()
                ));
                f.durable = kept;
            } else {
                self.lost.push(format!(
                    "{path}: {unsynced} unsynced bytes lost (first difference at {common})"
                ));
            }
            f.current = f.durable.clone();
        }
        self.locks.clear();
    }

    fn file(&self, path: &str) -> Result<&SimFile> {
        self.files
            .get(path)
            .ok_or_else(|| super::io_error("open", path, "no such file"))
    }
}

impl PowerCutDisk {
    /// An empty disk with the power on.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events so far (operations that changed the disk).
    pub fn events(&self) -> u64 {
        self.state().events
    }

    /// The description of each event so far.
    pub fn trace(&self) -> Vec<String> {
        self.state().trace.clone()
    }

    /// Arms a power cut before event `n` (counted from 0 over the disk's life); with
    /// `tear`, the file written last keeps half of its unsynced bytes.
    pub fn cut_before(&self, n: u64, tear: bool) {
        let mut s = self.state();
        s.cut_before = Some(n);
        s.tear = tear;
    }

    /// Whether the power is off (the armed cut happened).
    pub fn is_off(&self) -> bool {
        self.state().off
    }

    /// What the cut destroyed, one line per file.
    pub fn lost(&self) -> Vec<String> {
        self.state().lost.clone()
    }

    /// Turns the power back on (disarming any cut): the disk holds what was durable.
    pub fn power_on(&self) {
        let mut s = self.state();
        s.off = false;
        s.cut_before = None;
        s.lost.clear();
    }

    /// A copy of the disk as it is now (every file's current content, all durable).
    pub fn snapshot(&self) -> PowerCutDisk {
        let s = self.state();
        let files = s
            .files
            .iter()
            .map(|(k, f)| {
                (
                    k.clone(),
                    SimFile {
                        current: f.current.clone(),
                        durable: f.current.clone(),
                    },
                )
            })
            .collect();
        PowerCutDisk {
            state: Arc::new(Mutex::new(State {
                files,
                ..State::default()
            })),
        }
    }
}

impl Storage for PowerCutDisk {
    fn display(&self, path: &str) -> String {
        format!("power-cut-disk:/{path}")
    }

    fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let s = self.state();
        if s.off {
            return Err(power_cut(&format!("reading {path}")));
        }
        Ok(s.files.get(path).map(|f| f.current.clone()))
    }

    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let s = self.state();
        if s.off {
            return Err(power_cut(&format!("reading {path}")));
        }
        let f = s.file(path)?;
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= f.current.len() as u64);
        match end {
            Some(end) => Ok(f.current[offset as usize..end as usize].to_vec()),
            None => Err(super::io_error(
                "read",
                path,
                format!(
                    "{len} bytes at {offset} are past its end ({} bytes)",
                    f.current.len()
                ),
            )),
        }
    }

    fn size(&self, path: &str) -> Result<Option<u64>> {
        let s = self.state();
        if s.off {
            return Err(power_cut(&format!("reading {path}")));
        }
        Ok(s.files.get(path).map(|f| f.current.len() as u64))
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let s = self.state();
        if s.off {
            return Err(power_cut(&format!("listing {dir}")));
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{}/", dir.trim_end_matches('/'))
        };
        let mut out: Vec<String> = s
            .files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|rest| match rest.split_once('/') {
                Some((d, _)) => format!("{d}/"),
                None => rest.to_string(),
            })
            .collect();
        out.dedup();
        Ok(out)
    }

    fn put(
        &self,
        path: &str,
        fill: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<()> {
        let mut buf = Vec::new();
        fill(&mut buf)?;
        let mut s = self.state();
        s.event(format!("put {path} ({} bytes)", buf.len()), None)?;
        s.files.insert(
            path.to_string(),
            SimFile {
                current: buf.clone(),
                durable: buf,
            },
        );
        Ok(())
    }

    fn put_if_absent(&self, path: &str, bytes: &[u8]) -> Result<bool> {
        let mut s = self.state();
        s.event(format!("put_if_absent {path}"), None)?;
        if s.files.contains_key(path) {
            return Ok(false);
        }
        s.files.insert(
            path.to_string(),
            SimFile {
                current: bytes.to_vec(),
                durable: bytes.to_vec(),
            },
        );
        Ok(true)
    }

    fn delete(&self, path: &str) -> Result<()> {
        let mut s = self.state();
        s.event(format!("delete {path}"), None)?;
        s.files.remove(path);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let mut s = self.state();
        s.event(format!("rename {from} to {to}"), None)?;
        let mut f = s
            .files
            .remove(from)
            .ok_or_else(|| super::io_error("rename", from, "no such file"))?;
        // A rename is durable; the bytes that were not synced stay unsynced.
        f.durable.truncate(f.durable.len().min(f.current.len()));
        s.files.insert(to.to_string(), f);
        Ok(())
    }

    fn append(&self, path: &str) -> Result<Box<dyn AppendFile>> {
        let mut s = self.state();
        if !s.files.contains_key(path) {
            s.event(format!("create {path}"), None)?;
            s.files.insert(path.to_string(), SimFile::default());
        } else if s.off {
            return Err(power_cut(&format!("opening {path}")));
        }
        Ok(Box::new(SimAppend {
            disk: self.clone(),
            path: path.to_string(),
        }))
    }

    fn lock(&self, path: &str) -> Result<Lock> {
        let mut s = self.state();
        if s.off {
            return Err(power_cut(&format!("locking {path}")));
        }
        if s.locks.contains_key(path) {
            return Err(Diagnostic::new(
                &codes::CHECKPOINT_LOCKED,
                format!("`{path}` is locked by another process"),
            )
            .into());
        }
        s.next_token += 1;
        let token = s.next_token;
        s.locks.insert(path.to_string(), token);
        Ok(Lock::new(SimLock {
            disk: self.clone(),
            path: path.to_string(),
            token,
        }))
    }
}

/// A lock on the simulated disk, released on drop — unless a power cut already released
/// it and another holder took it since.
struct SimLock {
    disk: PowerCutDisk,
    path: String,
    token: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut s = self.disk.state();
        if s.locks.get(&self.path) == Some(&self.token) {
            s.locks.remove(&self.path);
        }
    }
}

/// A simulated file open for appending.
#[derive(Debug)]
struct SimAppend {
    disk: PowerCutDisk,
    path: String,
}

impl AppendFile for SimAppend {
    fn len(&self) -> u64 {
        self.disk
            .state()
            .files
            .get(&self.path)
            .map_or(0, |f| f.current.len() as u64)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let mut s = self.disk.state();
        s.event(
            format!("write {} bytes to {}", bytes.len(), self.path),
            Some((&self.path, bytes)),
        )?;
        s.last_written = Some(self.path.clone());
        let f = s
            .files
            .get_mut(&self.path)
            .ok_or_else(|| super::io_error("write", &self.path, "deleted"))?;
        f.current.extend_from_slice(bytes);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut s = self.disk.state();
        s.event(
            format!("write {} bytes at {offset} of {}", bytes.len(), self.path),
            None,
        )?;
        s.last_written = Some(self.path.clone());
        let f = s
            .files
            .get_mut(&self.path)
            .ok_or_else(|| super::io_error("write", &self.path, "deleted"))?;
        let end = (offset as usize)
            .checked_add(bytes.len())
            .filter(|e| *e <= f.current.len())
            .ok_or_else(|| super::io_error("write", &self.path, "past its end"))?;
        f.current[offset as usize..end].copy_from_slice(bytes);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        let mut s = self.disk.state();
        s.event(format!("truncate {} to {len}", self.path), None)?;
        let f = s
            .files
            .get_mut(&self.path)
            .ok_or_else(|| super::io_error("truncate", &self.path, "deleted"))?;
        f.current.truncate(len as usize);
        f.durable = f.current.clone();
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        let mut s = self.disk.state();
        s.event(format!("sync {}", self.path), None)?;
        if let Some(f) = s.files.get_mut(&self.path) {
            f.durable = f.current.clone();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_disk_keeps_the_contract() {
        super::super::tests::contract(&PowerCutDisk::new());
    }

    /// A cut drops what was not synced, keeps what was, and fails everything until the
    /// power is back; a torn cut keeps half of the last file's unsynced bytes.
    #[test]
    fn a_cut_keeps_only_what_was_durable() {
        for tear in [false, true] {
            let d = PowerCutDisk::new();
            super::super::put_bytes(&d, "meta", b"m").unwrap();
            let mut f = d.append("log").unwrap();
            f.write(b"synced;").unwrap();
            f.sync().unwrap();
            f.write(b"unsynced").unwrap();
            let before = d.events();
            d.cut_before(before, tear);
            assert_eq!(f.write(b"never").unwrap_err().code(), "ETL706");
            assert!(d.is_off());
            assert!(d.read("log").is_err());
            assert!(d.lost()[0].starts_with("log:"), "{:?}", d.lost());
            d.power_on();
            assert_eq!(d.read("meta").unwrap().unwrap(), b"m");
            let log = d.read("log").unwrap().unwrap();
            if tear {
                // Half of "unsynced" + "never" (13 bytes): 6.
                assert_eq!(log, b"synced;unsync");
            } else {
                assert_eq!(log, b"synced;");
            }
            // The disk goes on after the restart.
            let mut f = d.append("log").unwrap();
            f.write(b"again").unwrap();
            f.sync().unwrap();
            assert!(d.read("log").unwrap().unwrap().ends_with(b"again"));
            assert!(d.trace().iter().any(|t| t.starts_with("put meta")));
        }
    }
}
