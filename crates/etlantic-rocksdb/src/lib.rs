//! The `disk` state store: an operator's state in RocksDB on the local disk, checkpointed
//! incrementally (see [`etlantic_runtime::state_store`]).
//!
//! RocksDB keeps data in immutable sorted files (SSTs) plus a few small files naming
//! them (`CURRENT`, `MANIFEST-*`, `OPTIONS-*`). A commit flushes the memtable into a
//! RocksDB checkpoint (hard links of the live SSTs), copies to the checkpoint only the
//! SSTs that the version it builds on did not already hold there, and the small files,
//! then writes the version's manifest — the commit point — naming every file. This is
//! Spark's RocksDB state store (`RocksDBFileManager`) and Flink's incremental RocksDB
//! checkpoints. SSTs are stored under a name with a random suffix, so an SST of a version
//! that was rolled back (its file number reused later) is never mistaken for a new one.
//!
//! Layout of a store in the checkpoint:
//!
//! ```text
//! sst/<file number>-<uuid>.sst     immutable, shared by the versions that name them
//! small/<version>/<name>           CURRENT, MANIFEST-*, OPTIONS-* of a version
//! versions/<version>.json          the manifest: what the version is made of
//! ```
//!
//! The working copy keeps the files of its last commit (`commit-<version>/`, hard links
//! of the SSTs, and the version's manifest): a restart on the same machine restores that
//! version from them when the checkpoint's manifest of it is the same, and reads the
//! checkpoint otherwise (another version, another machine, a lost working copy).
//!
//! Writes go to the memtable without RocksDB's write-ahead log: the micro-batch log is
//! the write-ahead log, and a micro-batch that did not commit is run again from the
//! restored version.

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{put_bytes, Storage};
use etlantic_runtime::state_store::{
    CommitStats, ScanVisitor, StateStore, StateStoreProvider, StateStoreRegistration, StoreContext,
    StoreWrite, StoreWrites,
};
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, Cache, Options, WriteBatch, WriteBufferManager, WriteOptions, DB,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The `disk` state store provider.
pub struct DiskStoreProvider;

inventory::submit! { StateStoreRegistration(&DiskStoreProvider) }

impl StateStoreProvider for DiskStoreProvider {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn open(&self, ctx: StoreContext) -> Result<Box<dyn StateStore>> {
        Ok(Box::new(DiskStore::open(ctx)?))
    }
}

/// One SST of a version: its name in the working copy and in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredFile {
    local: String,
    stored: String,
    size: u64,
}

/// A version's manifest (`versions/<version>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    version: u64,
    ssts: Vec<StoredFile>,
    /// Names of the small files under `small/<version>/`.
    small: Vec<String>,
}

fn manifest_path(version: u64) -> String {
    format!("versions/{version}.json")
}

fn engine(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::ENGINE_ERROR,
        format!("the disk state store: {what}: {e}"),
    )
}

fn io(what: &str, at: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("the disk state store: {what} {}: {e}", at.display()),
    )
}

/// An operator's state in RocksDB.
pub struct DiskStore {
    ctx: StoreContext,
    db: Option<DB>,
    options: Options,
    /// The block cache, which the memtables are charged to as well.
    cache: Cache,
    /// The SSTs the checkpoint holds of the version the working copy builds on, by
    /// (local name, size).
    uploaded: HashMap<(String, u64), String>,
}

impl DiskStore {
    /// Opens a store on the empty state, in a fresh working copy.
    pub fn open(ctx: StoreContext) -> Result<Self> {
        let limit = ctx.memory_limit_bytes.max(8 << 20);
        // One budget for the block cache and the memtables (charged to the cache).
        let cache = Cache::new_lru_cache(limit);
        let buffers =
            WriteBufferManager::new_write_buffer_manager_with_cache(limit / 2, true, cache.clone());
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_bloom_filter(10.0, false);
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        options.set_write_buffer_manager(&buffers);
        options.set_write_buffer_size((limit / 4).min(64 << 20));
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut store = DiskStore {
            ctx,
            db: None,
            options,
            cache,
            uploaded: HashMap::new(),
        };
        store.reset_working_copy()?;
        store.db = Some(store.open_db()?);
        Ok(store)
    }

    fn db_dir(&self) -> PathBuf {
        self.ctx.local_dir.join("db")
    }

    fn open_db(&self) -> Result<DB> {
        // The default column family named, so that batched reads can address it.
        DB::open_cf(
            &self.options,
            self.db_dir(),
            [rocksdb::DEFAULT_COLUMN_FAMILY_NAME],
        )
        .map_err(|e| engine("open", e))
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("open between calls")
    }

    /// Closes the database and empties the working copy.
    fn reset_working_copy(&mut self) -> Result<()> {
        self.db = None;
        let dir = self.db_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io("clear", &dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))
    }

    fn storage(&self) -> &dyn Storage {
        self.ctx.checkpoint.as_ref()
    }

    fn manifest(&self, version: u64) -> Result<Manifest> {
        let path = manifest_path(version);
        let bytes = self.storage().read(&path)?.ok_or_else(|| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!(
                    "the state of operator `{}` has no version {version} ({})",
                    self.ctx.operator,
                    self.storage().display(&path)
                ),
            )
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!("{}: {e}", self.storage().display(&path)),
            )
        })
    }
}

/// The local copy of the last commit (`<working copy>/commit-<version>/`, with the
/// version's manifest as `manifest.json`).
const LOCAL_MANIFEST: &str = "manifest.json";

impl DiskStore {
    /// Keeps the files of the commit just made (`staged`, hard links of the SSTs) as the
    /// local copy of its version, in place of the previous one, so that a restart on this
    /// machine restores it without reading the checkpoint. Written after the commit
    /// point, with the manifest the checkpoint holds: a restore uses it only when that
    /// manifest is still the checkpoint's.
    fn keep_local_commit(&self, staged: &Path, manifest: &[u8]) -> Result<()> {
        let at = staged.join(LOCAL_MANIFEST);
        std::fs::write(&at, manifest).map_err(|e| io("write", &at, e))?;
        let dir = &self.ctx.local_dir;
        let entries = std::fs::read_dir(dir).map_err(|e| io("list", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io("list", dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("commit-") && entry.path() != staged {
                std::fs::remove_dir_all(entry.path()).map_err(|e| io("clear", &entry.path(), e))?;
            }
        }
        Ok(())
    }

    /// Replaces the working copy with `version` (see [`StateStore::restore`]).
    fn restore_version(&mut self, version: Option<u64>) -> Result<()> {
        let manifest = version.map(|v| self.manifest(v)).transpose()?;
        self.reset_working_copy()?;
        self.uploaded.clear();
        if let Some(m) = &manifest {
            if self.restore_local_commit(m)? {
                self.db = Some(self.open_db()?);
                return Ok(());
            }
        }
        if let Some(m) = manifest {
            let dir = self.db_dir();
            let fetch = |stored: &str, local: &str| -> Result<()> {
                let bytes = self.storage().read(stored)?.ok_or_else(|| {
                    Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        format!(
                            "version {} of operator `{}` names {}, which is missing",
                            m.version,
                            self.ctx.operator,
                            self.storage().display(stored)
                        ),
                    )
                })?;
                let at = dir.join(local);
                std::fs::write(&at, bytes).map_err(|e| io("write", &at, e))
            };
            for f in &m.ssts {
                fetch(&f.stored, &f.local)?;
            }
            for name in &m.small {
                fetch(&format!("small/{}/{name}", m.version), name)?;
            }
            self.uploaded = m
                .ssts
                .into_iter()
                .map(|f| ((f.local, f.size), f.stored))
                .collect();
        }
        self.db = Some(self.open_db()?);
        Ok(())
    }

    /// Restores `m` from the local copy of its commit, if there is one with the same
    /// manifest and every file it names; returns whether it did. SSTs are immutable and
    /// hard-linked; the small files, which RocksDB may rewrite, are copied.
    fn restore_local_commit(&mut self, m: &Manifest) -> Result<bool> {
        let local = self.ctx.local_dir.join(format!("commit-{}", m.version));
        let same = std::fs::read(local.join(LOCAL_MANIFEST))
            .ok()
            .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
            .is_some_and(|kept| kept == *m);
        let complete =
            same && m.ssts.iter().all(|f| {
                std::fs::metadata(local.join(&f.local)).is_ok_and(|md| md.len() == f.size)
            }) && m.small.iter().all(|n| local.join(n).is_file());
        if !complete {
            return Ok(false);
        }
        let dir = self.db_dir();
        for f in &m.ssts {
            let (from, to) = (local.join(&f.local), dir.join(&f.local));
            std::fs::hard_link(&from, &to).map_err(|e| io("link", &to, e))?;
        }
        for name in &m.small {
            let (from, to) = (local.join(name), dir.join(name));
            std::fs::copy(&from, &to).map_err(|e| io("copy", &to, e))?;
        }
        self.uploaded = m
            .ssts
            .iter()
            .map(|f| ((f.local.clone(), f.size), f.stored.clone()))
            .collect();
        Ok(true)
    }
}

impl StateStore for DiskStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db().get(key).map_err(|e| engine("read", e))
    }

    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        // RocksDB's batched MultiGet reads the keys' blocks together (and their filters
        // once per file), much cheaper than one `get` each.
        let db = self.db();
        let cf = db
            .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
            .ok_or_else(|| engine("read", "no default column family"))?;
        db.batched_multi_get_cf(cf, keys.iter().copied(), false)
            .into_iter()
            .map(|r| {
                r.map(|v| v.map(|v| v.to_vec()))
                    .map_err(|e| engine("read", e))
            })
            .collect()
    }

    fn memory_bytes(&self) -> u64 {
        self.cache.get_usage() as u64
    }

    fn write(&mut self, writes: StoreWrites) -> Result<()> {
        let mut batch = WriteBatch::default();
        for w in writes.0 {
            match w {
                StoreWrite::Put(k, v) => batch.put(k, v),
                StoreWrite::Delete(k) => batch.delete(k),
                StoreWrite::DeleteRange(from, to) => batch.delete_range(from, to),
            }
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db()
            .write_opt(batch, &opts)
            .map_err(|e| engine("write", e))
    }

    fn scan(&self, from: &[u8], to: Option<&[u8]>, visit: &mut ScanVisitor<'_>) -> Result<()> {
        let mut read = rocksdb::ReadOptions::default();
        if let Some(to) = to {
            read.set_iterate_upper_bound(to.to_vec());
        }
        let iter = self.db().iterator_opt(
            rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
            read,
        );
        for item in iter {
            let (k, v) = item.map_err(|e| engine("scan", e))?;
            if !visit(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    fn commit(&mut self, version: u64) -> Result<CommitStats> {
        let staged = self.ctx.local_dir.join(format!("commit-{version}"));
        if staged.exists() {
            std::fs::remove_dir_all(&staged).map_err(|e| io("clear", &staged, e))?;
        }
        // Flushes the memtable, then hard-links the live SSTs.
        Checkpoint::new(self.db())
            .and_then(|c| c.create_checkpoint(&staged))
            .map_err(|e| engine("checkpoint", e))?;
        let mut names: Vec<String> = std::fs::read_dir(&staged)
            .map_err(|e| io("list", &staged, e))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| io("list", &staged, e))?;
        names.sort();
        let mut stats = CommitStats::default();
        let mut manifest = Manifest {
            version,
            ssts: Vec::new(),
            small: Vec::new(),
        };
        let mut uploaded = HashMap::new();
        // A run that crashed after committing this version's files but before the
        // micro-batch commit may have left other small files of it.
        let small_dir = format!("small/{version}");
        let stale: Vec<String> = self
            .storage()
            .list(&small_dir)?
            .into_iter()
            .map(|n| format!("{small_dir}/{n}"))
            .collect();
        self.storage().delete_all(&stale)?;
        for name in names {
            let path = staged.join(&name);
            let size = std::fs::metadata(&path)
                .map_err(|e| io("stat", &path, e))?
                .len();
            stats.files_total += 1;
            stats.bytes_total += size;
            let read = || std::fs::read(&path).map_err(|e| io("read", &path, e));
            if let Some(stem) = name.strip_suffix(".sst") {
                let key = (name.clone(), size);
                let stored = match self.uploaded.get(&key) {
                    Some(stored) => stored.clone(),
                    None => {
                        let stored = format!("sst/{stem}-{}.sst", uuid::Uuid::new_v4().simple());
                        put_bytes(self.storage(), &stored, &read()?)?;
                        stats.files_uploaded += 1;
                        stats.bytes_uploaded += size;
                        stored
                    }
                };
                uploaded.insert(key, stored.clone());
                manifest.ssts.push(StoredFile {
                    local: name,
                    stored,
                    size,
                });
            } else {
                put_bytes(self.storage(), &format!("small/{version}/{name}"), &read()?)?;
                stats.files_uploaded += 1;
                stats.bytes_uploaded += size;
                manifest.small.push(name);
            }
        }
        let bytes = serde_json::to_vec(&manifest).map_err(|e| engine("manifest", e))?;
        // The commit point: every file it names is durable already.
        put_bytes(self.storage(), &manifest_path(version), &bytes)?;
        self.uploaded = uploaded;
        self.keep_local_commit(&staged, &bytes)?;
        Ok(stats)
    }

    fn restore(&mut self, version: Option<u64>) -> Result<()> {
        let restored = self.restore_version(version);
        if restored.is_err() {
            // A failed restore leaves the empty state, never a half-written one.
            self.reset_working_copy()?;
            self.uploaded.clear();
            self.db = Some(self.open_db()?);
        }
        restored
    }
    fn retain(&mut self, oldest: u64) -> Result<()> {
        let versions = self.versions()?;
        let mut referenced = BTreeSet::new();
        for &v in versions.iter().filter(|v| **v >= oldest) {
            referenced.extend(self.manifest(v)?.ssts.into_iter().map(|f| f.stored));
        }
        let mut doomed = Vec::new();
        for &v in versions.iter().filter(|v| **v < oldest) {
            let m = self.manifest(v)?;
            doomed.extend(m.small.iter().map(|n| format!("small/{v}/{n}")));
            doomed.push(manifest_path(v));
        }
        // SSTs no retained version names, among them those of commits that crashed
        // before their manifest.
        for name in self.storage().list("sst")? {
            let path = format!("sst/{name}");
            if !referenced.contains(&path) {
                doomed.push(path);
            }
        }
        self.storage().delete_all(&doomed)
    }

    fn versions(&self) -> Result<Vec<u64>> {
        let mut out: Vec<u64> = self
            .storage()
            .list("versions")?
            .iter()
            .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
            .collect();
        out.sort_unstable();
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
