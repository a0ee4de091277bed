//! Snapshots: a version's whole state as RocksDB files in the checkpoint, uploaded off the
//! critical path, so that a restore replays only the changelogs written after one.
//!
//! A snapshot of version `v` is taken at the commit of `v`: RocksDB flushes its memtable
//! and hard-links the live files into `snapshot-<v>/` of the working copy (immutable from
//! then on, whatever the database does next). A background thread then copies to the
//! checkpoint the SSTs the previous snapshot did not hold, under a name with a random
//! suffix (an SST number reused after a rollback is never mistaken for an uploaded one),
//! and the small files naming them (`CURRENT`, `MANIFEST-*`, `OPTIONS-*`), and writes the
//! snapshot's manifest last: until then the snapshot does not exist for a restore. The
//! working copy keeps the last snapshot's files, so that a restart on the same machine
//! reads no SST from the checkpoint.

use crate::{engine, io};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{put_bytes, Storage};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One SST of a snapshot: its name in the working copy and in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredFile {
    pub local: String,
    pub stored: String,
    pub size: u64,
}

/// A snapshot's manifest (`snapshot/<version>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub version: u64,
    pub ssts: Vec<StoredFile>,
    /// Names of the small files under `small/<version>/`.
    pub small: Vec<String>,
}

impl Manifest {
    /// The bytes of its SSTs: the state's size in the checkpoint.
    pub fn bytes(&self) -> u64 {
        self.ssts.iter().map(|f| f.size).sum()
    }
}

/// Where snapshot `version`'s manifest is.
pub(crate) fn manifest_path(version: u64) -> String {
    format!("snapshot/{version}.json")
}

/// Where the small files of snapshot `version` are.
pub(crate) fn small_dir(version: u64) -> String {
    format!("small/{version}")
}

/// The SSTs the checkpoint holds of the newest snapshot, by (local name, size): the next
/// snapshot references them instead of copying them again.
pub(crate) type Uploaded = HashMap<(String, u64), String>;

/// Reads snapshot `version`'s manifest at `path`.
pub(crate) fn read_manifest(storage: &dyn Storage, path: &str) -> Result<Option<Manifest>> {
    let Some(bytes) = storage.read(path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("{}: {e}", storage.display(path)),
        )
    })
}

/// The local copy of a snapshot in the working copy.
pub(crate) fn local_dir(working_copy: &Path, version: u64) -> PathBuf {
    working_copy.join(format!("snapshot-{version}"))
}

/// The manifest kept with a local copy, as the checkpoint holds it.
const LOCAL_MANIFEST: &str = "manifest.json";

/// What a finished snapshot did.
pub(crate) struct Snapshotted {
    pub manifest: Manifest,
    pub uploaded: Uploaded,
    pub files_copied: u64,
    pub bytes_copied: u64,
}

/// Uploads the snapshot staged in `staged` (hard links of the files of `version`),
/// referencing the SSTs of `uploaded`; run on a background thread.
pub(crate) fn upload(
    storage: Arc<dyn Storage>,
    staged: PathBuf,
    version: u64,
    uploaded: Uploaded,
) -> Result<Snapshotted> {
    let storage = storage.as_ref();
    let mut names: Vec<String> = std::fs::read_dir(&staged)
        .map_err(|e| io("list", &staged, e))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| io("list", &staged, e))?;
    names.sort();
    // A run that crashed while uploading this snapshot may have left small files of it.
    let small = small_dir(version);
    let stale: Vec<String> = storage
        .list(&small)?
        .into_iter()
        .map(|n| format!("{small}/{n}"))
        .collect();
    storage.delete_all(&stale)?;
    let mut done = Snapshotted {
        manifest: Manifest {
            version,
            ssts: Vec::new(),
            small: Vec::new(),
        },
        uploaded: Uploaded::new(),
        files_copied: 0,
        bytes_copied: 0,
    };
    for name in names {
        let path = staged.join(&name);
        let size = std::fs::metadata(&path)
            .map_err(|e| io("stat", &path, e))?
            .len();
        let copy = |to: &str| -> Result<()> {
            storage.put(to, &mut |out| {
                let mut file = std::fs::File::open(&path).map_err(|e| io("read", &path, e))?;
                std::io::copy(&mut file, out).map_err(|e| io("copy", &path, e))?;
                Ok(())
            })
        };
        if let Some(stem) = name.strip_suffix(".sst") {
            let key = (name.clone(), size);
            let stored = match uploaded.get(&key) {
                Some(stored) => stored.clone(),
                None => {
                    let stored = format!("sst/{stem}-{}.sst", uuid::Uuid::new_v4().simple());
                    copy(&stored)?;
                    done.files_copied += 1;
                    done.bytes_copied += size;
                    stored
                }
            };
            done.uploaded.insert(key, stored.clone());
            done.manifest.ssts.push(StoredFile {
                local: name,
                stored,
                size,
            });
        } else {
            copy(&format!("{small}/{name}"))?;
            done.files_copied += 1;
            done.bytes_copied += size;
            done.manifest.small.push(name);
        }
    }
    let bytes = serde_json::to_vec(&done.manifest).map_err(|e| engine("manifest", e))?;
    // The snapshot's commit point: every file it names is durable already.
    put_bytes(storage, &manifest_path(version), &bytes)?;
    // The snapshot is in the checkpoint now: a local copy that cannot be kept only costs
    // a restart on this machine a download.
    if let Err(e) = keep_local_copy(&staged, &bytes) {
        tracing::warn!("the disk state store: snapshot {version} is not kept locally: {e}");
    }
    Ok(done)
}

/// Keeps `staged` as the working copy's local copy of its snapshot, in place of the
/// previous one (and of copies an older layout left, `commit-*`).
fn keep_local_copy(staged: &Path, manifest: &[u8]) -> Result<()> {
    let at = staged.join(LOCAL_MANIFEST);
    std::fs::write(&at, manifest).map_err(|e| io("write", &at, e))?;
    let dir = staged.parent().expect("in the working copy");
    let entries = std::fs::read_dir(dir).map_err(|e| io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("list", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let other = name.starts_with("snapshot-") || name.starts_with("commit-");
        if other && entry.path() != staged {
            std::fs::remove_dir_all(entry.path()).map_err(|e| io("clear", &entry.path(), e))?;
        }
    }
    Ok(())
}

/// Fills the empty database directory `db_dir` with snapshot `m`: from the working copy's
/// local copy of it when it has one with the same manifest and every file (SSTs
/// hard-linked; the small files, which RocksDB may rewrite, copied), else from the
/// checkpoint. Returns the SSTs the checkpoint holds of it.
pub(crate) fn restore(
    storage: &dyn Storage,
    working_copy: &Path,
    db_dir: &Path,
    m: &Manifest,
    operator: &str,
) -> Result<Uploaded> {
    let local = local_dir(working_copy, m.version);
    let same = std::fs::read(local.join(LOCAL_MANIFEST))
        .ok()
        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        .is_some_and(|kept| kept == *m);
    let complete = same
        && m.ssts
            .iter()
            .all(|f| std::fs::metadata(local.join(&f.local)).is_ok_and(|md| md.len() == f.size))
        && m.small.iter().all(|n| local.join(n).is_file());
    if complete {
        for f in &m.ssts {
            let (from, to) = (local.join(&f.local), db_dir.join(&f.local));
            std::fs::hard_link(&from, &to).map_err(|e| io("link", &to, e))?;
        }
        for name in &m.small {
            let (from, to) = (local.join(name), db_dir.join(name));
            std::fs::copy(&from, &to).map_err(|e| io("copy", &to, e))?;
        }
    } else {
        let missing = |stored: &str| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!(
                    "snapshot {} of operator `{operator}` names {}, which is missing",
                    m.version,
                    storage.display(stored)
                ),
            )
        };
        let fetch = |stored: &str, local: &str, size: Option<u64>| -> Result<()> {
            let at = db_dir.join(local);
            let mut file = std::fs::File::create(&at).map_err(|e| io("create", &at, e))?;
            let mut write = |bytes: &[u8]| {
                std::io::Write::write_all(&mut file, bytes).map_err(|e| io("write", &at, e))
            };
            const PART: u64 = 8 << 20;
            match size {
                // By ranges: an SST can be larger than the memory the store may use.
                Some(size) if size > PART => {
                    if storage.size(stored)? != Some(size) {
                        return Err(missing(stored));
                    }
                    let mut from = 0;
                    while from < size {
                        let len = (size - from).min(PART);
                        write(&storage.read_range(stored, from, len)?)?;
                        from += len;
                    }
                    Ok(())
                }
                _ => write(&storage.read(stored)?.ok_or_else(|| missing(stored))?),
            }
        };
        for f in &m.ssts {
            fetch(&f.stored, &f.local, Some(f.size))?;
        }
        for name in &m.small {
            fetch(&format!("{}/{name}", small_dir(m.version)), name, None)?;
        }
    }
    Ok(m.ssts
        .iter()
        .map(|f| ((f.local.clone(), f.size), f.stored.clone()))
        .collect())
}
