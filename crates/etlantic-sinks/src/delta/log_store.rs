//! The log store the sink commits through: `deltalake`'s own, made durable (the files a
//! commit adds and the commit file are synced), with the `in_sink` fail point in front of
//! the one call that makes a commit visible.

use async_trait::async_trait;
use bytes::Bytes;
use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::Version;
use deltalake::logstore::object_store::ObjectStore;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::DeltaResult;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use url::Url;
use uuid::Uuid;

pub(super) const DISARMED: u64 = u64::MAX;

/// The local log store of `deltalake`, made durable, with the `in_sink` fail point in
/// front of the one call that makes a commit visible (see the [module docs](super)).
///
/// `deltalake`'s local object store writes files without `fsync`: a power cut after a
/// commit could lose the commit file or the data files it names, while the query's
/// checkpoint — synced — records the batch as done. So before a commit entry is written,
/// the data and change files it adds are synced (with their directories), and after it,
/// the commit file and `_delta_log/`: when the commit returns, the batch survives a power
/// cut.
pub(super) struct FaultLogStore {
    pub(super) inner: LogStoreRef,
    /// The batch id being committed, or [`DISARMED`].
    pub(super) batch: AtomicU64,
    /// The table directory.
    pub(super) root: PathBuf,
    /// Whether the table is on the local disk, which `deltalake` writes without syncing
    /// (under a storage mount it goes through the storage layer, durable by contract).
    pub(super) local: bool,
}

impl FaultLogStore {
    /// Syncs the files a commit adds (its `add` and `cdc` actions) and their directories.
    async fn sync_added_files(&self, commit: &CommitOrBytes) -> std::io::Result<()> {
        if !self.local {
            return Ok(());
        }
        let bytes = match commit {
            CommitOrBytes::LogBytes(b) => b.to_vec(),
            CommitOrBytes::TmpCommit(p) => std::fs::read(self.root.join(p.as_ref()))?,
        };
        let base = Url::from_directory_path(&self.root)
            .map_err(|_| std::io::Error::other("the table directory is not absolute"))?;
        let mut dirs = std::collections::BTreeSet::new();
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(action) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            for kind in ["add", "cdc"] {
                let Some(path) = action[kind]["path"].as_str() else {
                    continue;
                };
                let file = base
                    .join(path)
                    .ok()
                    .and_then(|u| u.to_file_path().ok())
                    .ok_or_else(|| std::io::Error::other(format!("bad file path `{path}`")))?;
                std::fs::File::open(&file)?.sync_all()?;
                dirs.extend(file.parent().map(Path::to_path_buf));
            }
        }
        for dir in dirs {
            etlantic_core::durable::sync_dir(&dir)?;
        }
        Ok(())
    }

    /// Syncs a committed `version`: the files it added, then its commit file.
    pub(super) async fn sync_version(&self, version: Version) -> std::io::Result<()> {
        if !self.local {
            return Ok(());
        }
        let log = self
            .root
            .join("_delta_log")
            .join(format!("{version:020}.json"));
        let bytes = std::fs::read(log)?;
        self.sync_added_files(&CommitOrBytes::LogBytes(Bytes::from(bytes)))
            .await?;
        self.sync_commit(version)
    }

    /// Syncs the commit file of `version` and `_delta_log/`.
    fn sync_commit(&self, version: Version) -> std::io::Result<()> {
        if !self.local {
            return Ok(());
        }
        let log = self.root.join("_delta_log");
        std::fs::File::open(log.join(format!("{version:020}.json")))?.sync_all()?;
        etlantic_core::durable::sync_dir(&log)
    }
}

fn durability_error(what: &str, e: std::io::Error) -> TransactionError {
    TransactionError::LogStoreError {
        msg: format!("cannot make the commit durable: {what}"),
        source: Box::new(e),
    }
}

#[async_trait]
impl LogStore for FaultLogStore {
    fn name(&self) -> String {
        // `deltalake` decides from the name whether to pass the commit as bytes (the
        // conditional-put path of its default store), so keep the wrapped name.
        self.inner.name()
    }

    async fn refresh(&self) -> DeltaResult<()> {
        self.inner.refresh().await
    }

    async fn read_commit_entry(&self, version: Version) -> DeltaResult<Option<Bytes>> {
        self.inner.read_commit_entry(version).await
    }

    async fn write_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> std::result::Result<(), TransactionError> {
        self.sync_added_files(&commit_or_bytes)
            .await
            .map_err(|e| durability_error("syncing its data files", e))?;
        let batch = self.batch.load(Ordering::SeqCst);
        if batch != DISARMED {
            // The batch's data files are written; the commit is not.
            etlantic_core::faults::check(etlantic_core::faults::IN_SINK, batch);
        }
        self.inner
            .write_commit_entry(version, commit_or_bytes, operation_id)
            .await?;
        self.sync_commit(version)
            .map_err(|e| durability_error("syncing the commit file", e))
    }

    async fn abort_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> std::result::Result<(), TransactionError> {
        self.inner
            .abort_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn get_latest_version(&self, start_version: Version) -> DeltaResult<Version> {
        self.inner.get_latest_version(start_version).await
    }

    fn object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.object_store(operation_id)
    }

    fn root_object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.root_object_store(operation_id)
    }

    fn config(&self) -> &LogStoreConfig {
        self.inner.config()
    }
}
