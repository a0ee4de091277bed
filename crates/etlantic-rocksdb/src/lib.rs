//! The `disk` state store: an operator's state in RocksDB on the local disk, checkpointed
//! incrementally (see [`etlantic_runtime::state_store`]).
//!
//! A commit makes a version durable by uploading its **changelog** — the micro-batch's
//! writes, in order ([`changelog`]) — so what it costs on the critical path follows what
//! the micro-batch changed, not how much state there is. Every so often a commit also
//! takes a **snapshot**: RocksDB's files of that version, of which a background thread
//! copies to the checkpoint only the SSTs the previous snapshot did not hold
//! ([`snapshot`]). A restore of version `v` loads the newest snapshot at or before `v`
//! and replays the changelogs after it. This is Spark's RocksDB state store with
//! changelog checkpointing, and Flink's incremental RocksDB checkpoints for the
//! snapshots.
//!
//! When a snapshot is due ([`SnapshotPolicy`]): once the changelogs since the last one
//! hold half the last snapshot's bytes (at least 64 MiB), or after 100 versions. That
//! bounds both what a restore replays (half the state) and what snapshots upload per
//! micro-batch: a snapshot copies at most the state's bytes and comes at most every
//! `0.5 × state` bytes of changelog, so on average at most twice the changelog bytes —
//! whatever the size of the state.
//!
//! Layout of a store in the checkpoint:
//!
//! ```text
//! changelog/<version>.log          the writes of a version, applied to the one before
//! snapshot/<version>.json          a snapshot's manifest: its SSTs and small files
//! sst/<file number>-<uuid>.sst     immutable, shared by the snapshots that name them
//! small/<version>/<name>           CURRENT, MANIFEST-*, OPTIONS-* of a snapshot
//! ```
//!
//! (`versions/<version>.json`, the snapshots of an earlier layout that took one at every
//! commit, are read as snapshots.) Writes go to the memtable without RocksDB's
//! write-ahead log: the changelog is the log, and a micro-batch that did not commit is run
//! again from the restored version.

mod changelog;
mod snapshot;

use changelog::{changelog_path, ChangelogWriter};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::Storage;
use etlantic_runtime::state_store::{
    CommitStats, ScanVisitor, StateStore, StateStoreProvider, StateStoreRegistration, StoreContext,
    StoreWrite, StoreWrites,
};
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, Cache, Options, WriteBatch, WriteBufferManager, WriteOptions, DB,
};
use snapshot::{Manifest, Snapshotted, Uploaded};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

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

/// When a commit also takes a snapshot: when any bound is reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SnapshotPolicy {
    /// Versions since the last snapshot.
    pub max_versions: u64,
    /// Bytes of changelog since the last snapshot, as a share of that snapshot's bytes…
    pub changelog_share: f64,
    /// …but never fewer than these (a small state is not snapshotted at every commit).
    pub min_changelog_bytes: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            max_versions: 100,
            changelog_share: 0.5,
            min_changelog_bytes: 64 << 20,
        }
    }
}

pub(crate) fn engine(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::ENGINE_ERROR,
        format!("the disk state store: {what}: {e}"),
    )
}

pub(crate) fn io(what: &str, at: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("the disk state store: {what} {}: {e}", at.display()),
    )
}

/// What the store's part of the checkpoint holds.
#[derive(Default)]
struct Catalog {
    /// Snapshots whose manifest is written: version → (manifest path, manifest).
    snapshots: BTreeMap<u64, (String, Manifest)>,
    /// Changelogs: version → bytes.
    changelogs: BTreeMap<u64, u64>,
}

impl Catalog {
    fn load(storage: &dyn Storage) -> Result<Self> {
        let mut catalog = Catalog::default();
        // The earlier layout's snapshots first: a snapshot of the same version replaces.
        for dir in ["versions", "snapshot"] {
            for name in storage.list(dir)? {
                let Some(version) = name.strip_suffix(".json").and_then(|v| v.parse().ok()) else {
                    continue;
                };
                let path = format!("{dir}/{name}");
                if let Some(m) = snapshot::read_manifest(storage, &path)? {
                    catalog.snapshots.insert(version, (path, m));
                }
            }
        }
        for (name, meta) in storage.list_files("changelog")? {
            if let Some(version) = changelog::version_of(&name) {
                catalog.changelogs.insert(version, meta.size);
            }
        }
        Ok(catalog)
    }

    /// Deletes from the checkpoint, and forgets, the changelogs `changelogs` and the
    /// snapshots `snapshots` with their small files and the SSTs no other snapshot names.
    fn delete(
        &mut self,
        storage: &dyn Storage,
        snapshots: &[u64],
        changelogs: &[u64],
    ) -> Result<()> {
        if snapshots.is_empty() && changelogs.is_empty() {
            return Ok(());
        }
        let named: BTreeSet<&str> = self
            .snapshots
            .iter()
            .filter(|(v, _)| !snapshots.contains(v))
            .flat_map(|(_, (_, m))| m.ssts.iter().map(|f| f.stored.as_str()))
            .collect();
        let mut doomed: Vec<String> = changelogs.iter().map(|v| changelog_path(*v)).collect();
        for v in snapshots {
            let (path, m) = &self.snapshots[v];
            doomed.push(path.clone());
            let small = snapshot::small_dir(*v);
            doomed.extend(m.small.iter().map(|n| format!("{small}/{n}")));
            doomed.extend(
                m.ssts
                    .iter()
                    .filter(|f| !named.contains(f.stored.as_str()))
                    .map(|f| f.stored.clone()),
            );
        }
        doomed.sort();
        doomed.dedup();
        storage.delete_all(&doomed)?;
        for v in snapshots {
            self.snapshots.remove(v);
        }
        for v in changelogs {
            self.changelogs.remove(v);
        }
        Ok(())
    }

    /// The newest snapshot.
    fn newest_snapshot(&self) -> Option<&Manifest> {
        self.snapshots.values().next_back().map(|(_, m)| m)
    }
}

/// Versions and changelog bytes since the last snapshot (taken or restored).
#[derive(Clone, Copy, Debug, Default)]
struct SinceSnapshot {
    versions: u64,
    bytes: u64,
}

/// An operator's state in RocksDB.
pub struct DiskStore {
    ctx: StoreContext,
    policy: SnapshotPolicy,
    db: Option<DB>,
    options: Options,
    /// The block cache, which the memtables are charged to as well.
    cache: Cache,
    /// The version the working copy builds on: the last committed or restored.
    base: Option<u64>,
    /// The changelog of the writes since `base`; `None` after a commit failed half-way,
    /// until a restore.
    pending: Option<ChangelogWriter>,
    catalog: Catalog,
    since: SinceSnapshot,
    /// The SSTs the checkpoint holds of the newest snapshot.
    uploaded: Uploaded,
    /// The snapshot being uploaded.
    in_flight: Option<JoinHandle<Result<Snapshotted>>>,
    /// Files and bytes snapshots finished since the last commit uploaded.
    snapshotted: (u64, u64),
    /// Whether the checkpoint was cleared of files no snapshot names since the store
    /// opened.
    swept: bool,
}

impl DiskStore {
    /// Opens a store on the empty state, in a fresh working copy, snapshotting by the
    /// default [`SnapshotPolicy`] (with [`StoreContext::snapshot_every`] for its
    /// `max_versions` when set).
    pub fn open(ctx: StoreContext) -> Result<Self> {
        let mut policy = SnapshotPolicy::default();
        if let Some(every) = ctx.snapshot_every {
            policy.max_versions = every.max(1);
        }
        Self::open_with(ctx, policy)
    }

    /// Opens a store on the empty state, in a fresh working copy.
    pub fn open_with(ctx: StoreContext, policy: SnapshotPolicy) -> Result<Self> {
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
        let catalog = Catalog::load(ctx.checkpoint.as_ref())?;
        let mut store = DiskStore {
            ctx,
            policy,
            db: None,
            options,
            cache,
            base: None,
            pending: None,
            catalog,
            since: SinceSnapshot::default(),
            uploaded: Uploaded::new(),
            in_flight: None,
            snapshotted: (0, 0),
            swept: false,
        };
        store.reset_working_copy()?;
        store.db = Some(store.open_db()?);
        store.pending = Some(ChangelogWriter::create(&store.pending_path(), None)?);
        Ok(store)
    }

    fn db_dir(&self) -> PathBuf {
        self.ctx.local_dir.join("db")
    }

    fn pending_path(&self) -> PathBuf {
        self.ctx.local_dir.join("changelog.pending")
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

    /// Closes the database and empties the working copy (its last snapshot's local copy
    /// stays).
    fn reset_working_copy(&mut self) -> Result<()> {
        self.db = None;
        self.pending = None;
        let dir = self.db_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io("clear", &dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))
    }

    fn storage(&self) -> &dyn Storage {
        self.ctx.checkpoint.as_ref()
    }

    fn needs_restore(&self) -> Error {
        Error::new(
            &codes::ENGINE_ERROR,
            format!(
                "the disk state store of operator `{}` failed to commit and must be restored first",
                self.ctx.operator
            ),
        )
    }

    /// Takes in a snapshot that finished uploading (`wait`: waits for one in flight).
    ///
    /// A snapshot that failed costs no durability (the changelogs hold every version),
    /// so it does not fail the query: it is logged, and the next commit takes another.
    /// What the failed upload may have written is found again in the checkpoint (its
    /// manifest may have landed although the request reported a failure) and the rest is
    /// swept.
    fn take_finished_snapshot(&mut self, wait: bool) -> Result<()> {
        let finished = self.in_flight.as_ref().is_some_and(|h| h.is_finished());
        if !(finished || wait) {
            return Ok(());
        }
        let Some(handle) = self.in_flight.take() else {
            return Ok(());
        };
        let failed = match handle.join() {
            Ok(Ok(done)) => {
                self.took_snapshot(done);
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the upload thread panicked".to_string(),
        };
        tracing::warn!(
            "the disk state store of operator `{}`: a snapshot failed, the next commit takes another: {failed}",
            self.ctx.operator
        );
        self.since.versions = self.since.versions.max(self.policy.max_versions);
        self.catalog = Catalog::load(self.storage())?;
        self.swept = false;
        Ok(())
    }

    /// Takes in snapshot `done`, uploaded.
    fn took_snapshot(&mut self, done: Snapshotted) {
        let version = done.manifest.version;
        self.uploaded = done.uploaded;
        self.snapshotted.0 += done.files_copied;
        self.snapshotted.1 += done.bytes_copied;
        self.catalog
            .snapshots
            .insert(version, (snapshot::manifest_path(version), done.manifest));
    }

    fn snapshot_due(&self) -> bool {
        let state = self.catalog.newest_snapshot().map_or(0, Manifest::bytes);
        let bytes = ((state as f64 * self.policy.changelog_share) as u64)
            .max(self.policy.min_changelog_bytes);
        self.since.versions >= self.policy.max_versions || self.since.bytes >= bytes
    }

    /// Stages the files of `version` (RocksDB flushes its memtable and hard-links the
    /// live files) and uploads them on a background thread.
    fn start_snapshot(&mut self, version: u64) -> Result<()> {
        let staged = snapshot::local_dir(&self.ctx.local_dir, version);
        if staged.exists() {
            std::fs::remove_dir_all(&staged).map_err(|e| io("clear", &staged, e))?;
        }
        Checkpoint::new(self.db())
            .and_then(|c| c.create_checkpoint(&staged))
            .map_err(|e| engine("snapshot", e))?;
        let (storage, uploaded) = (self.ctx.checkpoint.clone(), self.uploaded.clone());
        let handle = std::thread::Builder::new()
            .name("state-snapshot".into())
            .spawn(move || snapshot::upload(storage, staged, version, uploaded))
            .map_err(|e| engine("snapshot", e))?;
        self.in_flight = Some(handle);
        self.since = SinceSnapshot::default();
        Ok(())
    }

    /// Deletes what the checkpoint holds of versions after the one the commit builds on:
    /// they belong to a run that was rolled back (every commit builds on the newest
    /// version otherwise), and neither a restore nor retention may mix the two runs.
    fn drop_versions_after_base(&mut self) -> Result<()> {
        let after = self.base.map_or(0, |b| b + 1);
        let snapshots: Vec<u64> = self
            .catalog
            .snapshots
            .range(after..)
            .map(|(v, _)| *v)
            .collect();
        let changelogs: Vec<u64> = self
            .catalog
            .changelogs
            .range(after..)
            .map(|(v, _)| *v)
            .collect();
        if snapshots.is_empty() && changelogs.is_empty() {
            return Ok(());
        }
        let storage = self.ctx.checkpoint.clone();
        self.catalog
            .delete(storage.as_ref(), &snapshots, &changelogs)?;
        self.swept = false;
        Ok(())
    }

    /// Deletes the SSTs no snapshot names and the small files of snapshots without a
    /// manifest: what uploads cut short and rolled-back snapshots left. Only while no
    /// upload runs (its files are not named yet).
    fn sweep(&mut self) -> Result<()> {
        if self.swept || self.in_flight.is_some() {
            return Ok(());
        }
        let named: BTreeSet<&str> = self
            .catalog
            .snapshots
            .values()
            .flat_map(|(_, m)| m.ssts.iter().map(|f| f.stored.as_str()))
            .collect();
        let mut doomed: Vec<String> = self
            .storage()
            .list("sst")?
            .into_iter()
            .map(|n| format!("sst/{n}"))
            .filter(|p| !named.contains(p.as_str()))
            .collect();
        for dir in self.storage().list("small")? {
            let Some(version) = dir.strip_suffix('/').and_then(|v| v.parse::<u64>().ok()) else {
                continue;
            };
            if !self.catalog.snapshots.contains_key(&version) {
                let dir = snapshot::small_dir(version);
                doomed.extend(
                    self.storage()
                        .list(&dir)?
                        .into_iter()
                        .map(|n| format!("{dir}/{n}")),
                );
            }
        }
        self.storage().delete_all(&doomed)?;
        self.swept = true;
        Ok(())
    }

    /// Replaces the working copy with `version` (see [`StateStore::restore`]).
    fn restore_version(&mut self, version: Option<u64>) -> Result<()> {
        self.reset_working_copy()?;
        self.uploaded.clear();
        self.since = SinceSnapshot::default();
        self.base = None;
        // What another run may have changed since this store opened.
        self.catalog = Catalog::load(self.storage())?;
        self.swept = false;
        let mut chain = Vec::new();
        let mut snapshot = None;
        let mut at = version;
        while let Some(v) = at {
            if let Some((_, m)) = self.catalog.snapshots.get(&v) {
                snapshot = Some(m.clone());
                break;
            }
            match changelog::base_of(self.storage(), v)? {
                Some(Some(base)) if base >= v => {
                    return Err(Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        format!(
                            "the state changelog {} names version {base} as its base, not an older one",
                            self.storage().display(&changelog_path(v))
                        ),
                    ));
                }
                Some(base) => {
                    chain.push(v);
                    at = base;
                }
                None => {
                    let what = match v == version.expect("a version") {
                        true => format!("has no version {v}"),
                        false => format!(
                            "cannot rebuild version {}: it builds on version {v}, which the checkpoint no longer holds",
                            version.expect("a version")
                        ),
                    };
                    return Err(Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        format!(
                            "the state of operator `{}` {what} ({})",
                            self.ctx.operator,
                            self.storage().display(&changelog_path(v))
                        ),
                    ));
                }
            }
        }
        if let Some(m) = &snapshot {
            self.uploaded = snapshot::restore(
                self.storage(),
                &self.ctx.local_dir,
                &self.db_dir(),
                m,
                &self.ctx.operator,
            )?;
        }
        self.db = Some(self.open_db()?);
        for v in chain.into_iter().rev() {
            changelog::replay(self.storage(), v, self.db())?;
            self.since.versions += 1;
            self.since.bytes += self.catalog.changelogs.get(&v).copied().unwrap_or(0);
        }
        self.base = version;
        self.pending = Some(ChangelogWriter::create(&self.pending_path(), version)?);
        Ok(())
    }

    /// The files and bytes version `version` restores from: the newest snapshot and the
    /// changelogs after it.
    fn restored_from(&self, version: u64) -> (u64, u64) {
        let snapshot = self.catalog.snapshots.range(..=version).next_back();
        let (mut files, mut bytes, after) = match snapshot {
            Some((v, (_, m))) => (m.ssts.len() + m.small.len(), m.bytes(), v + 1),
            None => (0, 0, 0),
        };
        for size in self
            .catalog
            .changelogs
            .range(after..=version)
            .map(|(_, s)| *s)
        {
            files += 1;
            bytes += size;
        }
        (files as u64, bytes)
    }
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        // An upload left running would write to the checkpoint after the store is gone.
        if let Some(handle) = self.in_flight.take() {
            let _ = handle.join();
        }
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
        let Some(log) = self.pending.as_mut() else {
            return Err(self.needs_restore());
        };
        let mut batch = WriteBatch::default();
        let mut logged = Ok(());
        for w in writes.0 {
            logged = log.record(&w);
            if logged.is_err() {
                break;
            }
            match w {
                StoreWrite::Put(k, v) => batch.put(k, v),
                StoreWrite::Delete(k) => batch.delete(k),
                StoreWrite::DeleteRange(from, to) => batch.delete_range(from, to),
            }
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        let written = logged.and_then(|()| {
            self.db()
                .write_opt(batch, &opts)
                .map_err(|e| engine("write", e))
        });
        if written.is_err() {
            // The changelog and the database may disagree now: only a restore goes on.
            self.pending = None;
        }
        written
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
        self.take_finished_snapshot(false)?;
        let log = self.pending.take().ok_or_else(|| self.needs_restore())?;
        self.drop_versions_after_base()?;
        let (file, size) = log.finish(version)?;
        // The commit point: the changelog is durable when `put` returns.
        self.storage().put(&changelog_path(version), &mut |out| {
            let mut from = std::fs::File::open(&file).map_err(|e| io("read", &file, e))?;
            std::io::copy(&mut from, out).map_err(|e| io("copy", &file, e))?;
            Ok(())
        })?;
        self.catalog.changelogs.insert(version, size);
        self.base = Some(version);
        self.since.versions += 1;
        self.since.bytes += size;
        self.pending = Some(ChangelogWriter::create(&file, Some(version))?);
        if self.in_flight.is_none() && self.snapshot_due() {
            self.start_snapshot(version)?;
        }
        let (files_total, bytes_total) = self.restored_from(version);
        let (snapshot_files, snapshot_bytes) = std::mem::take(&mut self.snapshotted);
        Ok(CommitStats {
            files_uploaded: 1,
            bytes_uploaded: size,
            files_total,
            bytes_total,
            snapshot_files_uploaded: snapshot_files,
            snapshot_bytes_uploaded: snapshot_bytes,
        })
    }

    fn restore(&mut self, version: Option<u64>) -> Result<()> {
        // Whatever became of the upload in flight, the restore reads the checkpoint as it
        // is now (a failed upload left only files the sweep deletes).
        let _ = self.take_finished_snapshot(true);
        let restored = self.restore_version(version);
        if restored.is_err() {
            // A failed restore leaves the empty state, never a half-written one.
            self.reset_working_copy()?;
            self.uploaded.clear();
            self.base = None;
            self.db = Some(self.open_db()?);
            self.pending = Some(ChangelogWriter::create(&self.pending_path(), None)?);
        }
        restored
    }

    fn retain(&mut self, oldest: u64) -> Result<()> {
        self.take_finished_snapshot(false)?;
        // The newest snapshot at or before `oldest`: versions from it on restore from it.
        if let Some(kept) = self
            .catalog
            .snapshots
            .range(..=oldest)
            .next_back()
            .map(|(v, _)| *v)
        {
            let older: Vec<u64> = self
                .catalog
                .snapshots
                .range(..kept)
                .map(|(v, _)| *v)
                .collect();
            let changelogs: Vec<u64> = self
                .catalog
                .changelogs
                .range(..=kept)
                .map(|(v, _)| *v)
                .collect();
            let storage = self.ctx.checkpoint.clone();
            self.catalog.delete(storage.as_ref(), &older, &changelogs)?;
        }
        self.sweep()
    }

    fn versions(&self) -> Result<Vec<u64>> {
        let versions: BTreeSet<u64> = self
            .catalog
            .snapshots
            .keys()
            .chain(self.catalog.changelogs.keys())
            .copied()
            .collect();
        Ok(versions.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
