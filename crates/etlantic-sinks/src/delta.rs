//! The `delta://` sink: Delta Lake tables on the local file system (through `deltalake`).
//!
//! # Binding
//!
//! `delta://<path>?mode=append|merge|overwrite&keys=a,b&change_data_feed=true` — `<path>`
//! is the table directory, relative to the project root or absolute; it is created when
//! absent.
//!
//! - `mode=append` (default): every batch is appended.
//! - `mode=merge&keys=a,b`: every batch is upserted by key with one Delta `MERGE`
//!   (`target.a = source.a AND target.b = source.b`): matched rows are updated with the
//!   batch's values, the others are inserted. Keys compare with SQL equality, so a row
//!   with a null key never matches and is inserted. A batch must not hold two rows with
//!   the same key. Needed for the `update` output mode.
//! - `mode=overwrite`: every write replaces the table (batch runs; in streaming runs only
//!   with the `complete` output mode).
//! - `change_data_feed=true`: a table created by the sink gets
//!   `delta.enableChangeDataFeed=true` (what the `delta://` change-data-feed source reads).
//!
//! When the table does not exist the first write creates it from the incoming Arrow
//! schema, in the same commit as the data. Types are mapped to Delta's: every timestamp
//! with a time zone becomes Delta `timestamp` (Arrow `Timestamp(µs, "UTC")`, the instant
//! is kept, the zone label is not — Delta stores instants in UTC), every timestamp
//! without a zone becomes `timestamp_ntz` (µs; the table gets the `timestampNtz`
//! feature), second/millisecond/nanosecond units become microseconds (nanoseconds are
//! truncated).
//!
//! # Exactly-once protocol (streaming runs)
//!
//! Every micro-batch becomes exactly one Delta commit carrying the application
//! transaction `txn { appId: <query id>, version: <batch id> }`, written atomically with
//! the batch's data files (Delta's commit is the atomic creation of
//! `_delta_log/<version>.json`). Before writing, the sink reads the latest `txn` version of
//! the query id from the table's snapshot and returns [`WriteOutcome::AlreadyCommitted`],
//! changing nothing, when the batch id is not above it — so a batch replayed after a crash
//! is never written twice, whichever step the crash hit. This is the protocol of Spark's
//! Delta sink; the sink declares [`SinkCommitProtocol::IdempotentByBatch`].
//! [`Sink::last_committed_batch`] reports that `txn` version.
//!
//! Empty batches are committed too (a commit with the `txn` and no files), so the `txn`
//! version always names the last batch the query handed to the sink.
//!
//! Output modes: `append` (append, or upsert with `mode=merge`), `update` (needs
//! `mode=merge`: the changed rows are upserted by key), `complete` (the batch replaces the
//! table in one overwrite commit, which also carries the `txn`).
//!
//! ## Durability
//!
//! `deltalake`'s local object store writes files without `fsync`. The sink's log store
//! syncs the data and change files a commit adds, and their directories, before the
//! commit entry is written, and the commit file and `_delta_log/` after it: a batch the
//! sink reports written survives a power cut, as the checkpoint's commit that follows it
//! assumes.
//!
//! ## Where the `in_sink` fail point is
//!
//! `deltalake`'s write and merge builders write the data files and commit in one call,
//! so the sink opens the table through a thin [`deltalake::logstore::LogStore`] wrapper
//! whose `write_commit_entry` — the single call that makes a commit visible — first calls
//! [`etlantic_core::faults::check`]`(IN_SINK, batch_id)`. A crash there leaves the
//! batch's Parquet files (and, for `merge`, its change-data files) in the table directory
//! with no log entry referencing them: readers ignore them (`VACUUM` removes them) and the
//! replayed batch writes new ones.
//!
//! # Batch runs
//!
//! One write per run, without a `txn` (a batch run has no batch identity to replay):
//! `mode=append` appends, `mode=overwrite` replaces, `mode=merge` upserts. Running a batch
//! pipeline twice with `mode=append` appends twice.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use bytes::Bytes;
use deltalake::datafusion::catalog::Session;
use deltalake::datafusion::common::{Column, TableReference};
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::{CommitProperties, TransactionError};
use deltalake::kernel::{Transaction, Version};
use deltalake::logstore::object_store::ObjectStore;
use deltalake::logstore::{
    logstore_for, CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef, StorageConfig,
};
use deltalake::protocol::SaveMode;
use deltalake::{DeltaResult, DeltaTable, DeltaTableConfig, DeltaTableError};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use url::Url;
use uuid::Uuid;

/// How the sink writes a batch (`?mode=`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeltaWriteMode {
    /// Append every batch.
    Append,
    /// Upsert every batch by these key columns (Delta `MERGE`).
    Merge {
        /// The key columns.
        keys: Vec<String>,
    },
    /// Replace the table with every write.
    Overwrite,
}

/// The options of a `delta://` sink binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaSinkOptions {
    /// How batches are written.
    pub mode: DeltaWriteMode,
    /// Enable the change data feed on a table the sink creates.
    pub change_data_feed: bool,
}

impl DeltaSinkOptions {
    /// Parses the URI parameters (`ETL007` for an unknown or invalid one).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let bad = |msg: String| {
            Error::from(
                Diagnostic::new(
                    &codes::BAD_URI,
                    format!("binding `{}`: {msg}", uri.redacted()),
                )
                .help("delta://<path>?mode=append|merge|overwrite&keys=a,b&change_data_feed=true"),
            )
        };
        if uri.location.trim().is_empty() {
            return Err(bad("a delta binding needs a table directory".into()));
        }
        let mut mode = None;
        let mut keys: Option<Vec<String>> = None;
        let mut change_data_feed = false;
        for (k, v) in &uri.params {
            match k.as_str() {
                "mode" => mode = Some(v.to_ascii_lowercase()),
                "keys" => {
                    let list: Vec<String> = v
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect();
                    if list.is_empty() {
                        return Err(bad("`keys` names no column".into()));
                    }
                    keys = Some(list);
                }
                "change_data_feed" | "enableChangeDataFeed" => {
                    change_data_feed = match v.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad(format!("`{k}={v}` must be true or false"))),
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter `{other}` for the delta sink (known: {})",
                        option_names(OPTIONS)
                    )))
                }
            }
        }
        let mode = match mode.as_deref().unwrap_or("append") {
            "append" => DeltaWriteMode::Append,
            "overwrite" => DeltaWriteMode::Overwrite,
            "merge" | "upsert" => DeltaWriteMode::Merge {
                keys: keys
                    .take()
                    .ok_or_else(|| bad("`mode=merge` needs `keys=<column>,...`".into()))?,
            },
            other => {
                return Err(bad(format!(
                    "unknown mode `{other}` (append, merge or overwrite)"
                )))
            }
        };
        if keys.is_some() {
            return Err(bad("`keys` is only used with `mode=merge`".into()));
        }
        Ok(DeltaSinkOptions {
            mode,
            change_data_feed,
        })
    }

    /// The streaming output modes the options accept.
    pub fn output_modes(&self) -> Vec<OutputMode> {
        match self.mode {
            DeltaWriteMode::Append => vec![OutputMode::Append, OutputMode::Complete],
            DeltaWriteMode::Merge { .. } => {
                vec![OutputMode::Append, OutputMode::Update, OutputMode::Complete]
            }
            DeltaWriteMode::Overwrite => vec![OutputMode::Complete],
        }
    }
}

/// The provider of `delta://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaSinkProvider;

inventory::submit! { SinkRegistration(&DeltaSinkProvider) }

/// The query parameters of a `delta://` sink binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "mode",
        default: "append",
        meaning: "`append` appends each micro-batch; `merge` (also `upsert`) upserts by `keys` with a Delta MERGE; `overwrite` replaces the table at each write.",
    },
    BindingOption {
        name: "keys",
        default: "none (required with `merge`)",
        meaning: "Comma-separated key columns the merge matches on.",
    },
    BindingOption {
        name: "change_data_feed",
        default: "false",
        meaning: "A table the sink creates gets `delta.enableChangeDataFeed=true` (also `enableChangeDataFeed`).",
    },
];

impl SinkProvider for DeltaSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "delta"
    }

    fn description(&self) -> &'static str {
        "Delta Lake tables (append, merge by key, overwrite); idempotent per batch through Delta txn (app id = query id, version = batch id)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        let options = DeltaSinkOptions::from_uri(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: options.output_modes(),
            guarantee: SinkGuarantee::new(SinkCommitProtocol::IdempotentByBatch),
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(DeltaSink::new(ctx)?))
    }
}

/// The table's location as an absolute directory URL.
pub(crate) fn table_url(path: &Path) -> Result<Url> {
    let abs = etlantic_core::uri::absolute_normalized(path).map_err(|e| {
        Error::new(
            &codes::IO_ERROR,
            format!("cannot resolve `{}`: {e}", path.display()),
        )
    })?;
    Url::from_directory_path(&abs).map_err(|_| {
        Error::new(
            &codes::BAD_URI,
            format!("`{}` is not a usable table directory", abs.display()),
        )
    })
}

/// Turns a `deltalake` error into a diagnostic.
fn delta_error(
    code: &'static etlantic_core::diagnostics::CodeInfo,
    what: &'static str,
) -> impl Fn(DeltaTableError) -> Error {
    move |e| Error::new(code, format!("{what}: {e}"))
}

const DISARMED: u64 = u64::MAX;

/// The local log store of `deltalake`, made durable, with the `in_sink` fail point in
/// front of the one call that makes a commit visible (see the [module docs](self)).
///
/// `deltalake`'s local object store writes files without `fsync`: a power cut after a
/// commit could lose the commit file or the data files it names, while the query's
/// checkpoint — synced — records the batch as done. So before a commit entry is written,
/// the data and change files it adds are synced (with their directories), and after it,
/// the commit file and `_delta_log/`: when the commit returns, the batch survives a power
/// cut.
struct FaultLogStore {
    inner: LogStoreRef,
    /// The batch id being committed, or [`DISARMED`].
    batch: AtomicU64,
    /// The table directory.
    root: PathBuf,
    /// Whether the table is on the local disk, which `deltalake` writes without syncing
    /// (under a storage mount it goes through the storage layer, durable by contract).
    local: bool,
}

/// The log store of the table at `url` (directory `dir`): `deltalake`'s own for a local
/// directory, or one over the storage layer when `dir` is under a storage mount.
fn table_log_store(url: &Url, dir: &Path) -> Result<LogStoreRef> {
    let store = if etlantic_core::storage::is_mounted(dir) {
        deltalake::logstore::logstore_with(
            Arc::new(crate::delta_store::StorageObjectStore),
            url,
            StorageConfig::default(),
        )
    } else {
        logstore_for(url, StorageConfig::default())
    };
    store.map_err(delta_error(&codes::IO_ERROR, "cannot open the Delta table"))
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
    async fn sync_version(&self, version: Version) -> std::io::Result<()> {
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

/// Opens the table at `path` through `log_store`; `Ok(None)` when it is not a Delta table
/// (yet).
async fn load(log_store: LogStoreRef) -> Result<Option<DeltaTable>> {
    let mut table = DeltaTable::new(log_store, DeltaTableConfig::default());
    match table.load().await {
        Ok(()) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(Error::new(
            &codes::IO_ERROR,
            format!("cannot load the Delta table: {e}"),
        )),
    }
}

/// Reads the latest snapshot of the Delta table at `path` (for tests and tools).
pub async fn read_table(path: impl AsRef<Path>) -> Result<Vec<RecordBatch>> {
    let url = table_url(path.as_ref())?;
    let store = table_log_store(&url, path.as_ref())?;
    let Some(table) = load(store).await? else {
        return Err(Error::new(
            &codes::IO_ERROR,
            format!("`{}` is not a Delta table", path.as_ref().display()),
        ));
    };
    let session = table_session(table.log_store().as_ref());
    let (_, stream) = table
        .scan_table()
        .with_session_state(session)
        .await
        .map_err(delta_error(&codes::IO_ERROR, "cannot scan the Delta table"))?;
    let batches = deltalake::operations::collect_sendable_stream(stream)
        .await
        .map_err(|e| {
            Error::new(
                &codes::IO_ERROR,
                format!("cannot read the Delta table: {e}"),
            )
        })?;
    batches.iter().map(plain_types).collect()
}

/// A DataFusion session that reads the table's files through the table's own store.
///
/// delta-rs registers a table's store in a session only where the session has none for
/// the table's URL, and DataFusion's default session always has the local file system
/// for `file://`; without this, a table in a mounted [`etlantic_core::storage`] would
/// have its log read through the mount and its data files from the real disk.
fn table_session(store: &dyn deltalake::logstore::LogStore) -> Arc<dyn Session> {
    let state = deltalake::delta_datafusion::create_session()
        .into_inner()
        .state();
    state
        .runtime_env()
        .register_object_store(store.root_url(), store.root_object_store(None));
    Arc::new(state)
}

/// The batch with DataFusion's view types (`Utf8View`, `BinaryView`) as plain `Utf8` and
/// `Binary`, the types a contract's schema uses.
fn plain_types(batch: &RecordBatch) -> Result<RecordBatch> {
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        let plain = match c.data_type() {
            DataType::Utf8View => Some(DataType::Utf8),
            DataType::BinaryView => Some(DataType::Binary),
            _ => None,
        };
        match plain {
            Some(t) => {
                columns.push(cast(c, &t).map_err(err)?);
                fields.push(f.as_ref().clone().with_data_type(t));
            }
            None => {
                columns.push(c.clone());
                fields.push(f.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(err)
}

/// The `txn` version recorded for `app_id` in the table at `path` (`None` when the table
/// or the app id is absent).
pub async fn app_transaction_version(path: impl AsRef<Path>, app_id: &str) -> Result<Option<i64>> {
    let path = path.as_ref();
    if !path.join("_delta_log").is_dir() {
        return Ok(None);
    }
    let url = table_url(path)?;
    let store = logstore_for(&url, StorageConfig::default())
        .map_err(delta_error(&codes::IO_ERROR, "cannot open the Delta table"))?;
    match load(store.clone()).await? {
        Some(table) => txn_version(&table, app_id).await,
        None => Ok(None),
    }
}

async fn txn_version(table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
    let snapshot = table.snapshot().map_err(delta_error(
        &codes::IO_ERROR,
        "the Delta table has no snapshot",
    ))?;
    snapshot
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
        .map_err(delta_error(
            &codes::IO_ERROR,
            "cannot read the Delta txn actions",
        ))
}

/// A `delta://` sink (see the [module docs](self)).
pub struct DeltaSink {
    asset: String,
    path: PathBuf,
    options: DeltaSinkOptions,
    mode: ExecutionMode,
    /// The wrapped log store, created on first use.
    store: Option<Arc<FaultLogStore>>,
}

impl std::fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaSink")
            .field("asset", &self.asset)
            .field("path", &self.path)
            .field("options", &self.options)
            .field("mode", &self.mode)
            .finish()
    }
}

impl DeltaSink {
    /// Creates the sink (writes nothing). Checks the options and that the merge keys are
    /// columns of the sink's schema.
    pub fn new(ctx: SinkContext) -> Result<Self> {
        let options = DeltaSinkOptions::from_uri(&ctx.uri)?;
        if let DeltaWriteMode::Merge { keys } = &options.mode {
            for k in keys {
                if ctx.schema.field_with_name(k).is_err() {
                    return Err(Error::from(
                        Diagnostic::new(
                            &codes::BAD_URI,
                            format!(
                                "binding `{}`: merge key `{k}` is not a column of `{}`",
                                ctx.uri.redacted(),
                                ctx.asset
                            ),
                        )
                        .help(format!(
                            "columns: {}",
                            ctx.schema
                                .fields()
                                .iter()
                                .map(|f| f.name().as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    ));
                }
            }
        }
        Ok(DeltaSink {
            asset: ctx.asset.clone(),
            path: ctx.resolve_path(&ctx.uri.location),
            options,
            mode: ctx.mode,
            store: None,
        })
    }

    fn store(&mut self) -> Result<Arc<FaultLogStore>> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        std::fs::create_dir_all(&self.path).map_err(|e| {
            Error::new(
                &codes::IO_ERROR,
                format!("cannot create `{}`: {e}", self.path.display()),
            )
        })?;
        let url = table_url(&self.path)?;
        let inner = table_log_store(&url, &self.path)?;
        let store = Arc::new(FaultLogStore {
            inner,
            batch: AtomicU64::new(DISARMED),
            root: etlantic_core::uri::absolute_normalized(&self.path).map_err(|e| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("cannot resolve `{}`: {e}", self.path.display()),
                )
            })?,
            local: !etlantic_core::storage::is_mounted(&self.path),
        });
        self.store = Some(store.clone());
        Ok(store)
    }

    /// What a batch does to the table, or `ETL504` for an output mode the options cannot
    /// take.
    fn action(&self, output_mode: OutputMode) -> Result<Action> {
        if self.mode == ExecutionMode::Batch {
            return Ok(match &self.options.mode {
                DeltaWriteMode::Append => Action::Append,
                DeltaWriteMode::Overwrite => Action::Overwrite,
                DeltaWriteMode::Merge { keys } => Action::Merge(keys.clone()),
            });
        }
        match (output_mode, &self.options.mode) {
            (OutputMode::Complete, _) => Ok(Action::Overwrite),
            (OutputMode::Append, DeltaWriteMode::Append) => Ok(Action::Append),
            (OutputMode::Append | OutputMode::Update, DeltaWriteMode::Merge { keys }) => {
                Ok(Action::Merge(keys.clone()))
            }
            (mode, _) => Err(Error::from(
                Diagnostic::new(
                    &codes::SINK_MODE_UNSUPPORTED,
                    format!(
                        "the delta sink with `mode={}` does not take the {} output mode",
                        match self.options.mode {
                            DeltaWriteMode::Append => "append",
                            DeltaWriteMode::Merge { .. } => "merge",
                            DeltaWriteMode::Overwrite => "overwrite",
                        },
                        match mode {
                            OutputMode::Append => "append",
                            OutputMode::Update => "update",
                            OutputMode::Complete => "complete",
                        }
                    ),
                )
                .help(
                    "use `mode=merge&keys=...` for the update output mode; `complete` overwrites",
                ),
            )),
        }
    }

    async fn write_inner(&mut self, batch: &SinkBatch<'_>) -> Result<WriteOutcome> {
        let rows = batch.data.num_rows() as u64;
        let streaming = self.mode == ExecutionMode::Streaming;
        let action = self.action(batch.output_mode)?;
        let store = self.store()?;
        let table = load(store.clone() as LogStoreRef).await?;
        if streaming {
            if let Some(t) = &table {
                if let Some(v) = txn_version(t, batch.query_id).await? {
                    if v >= 0 && batch.batch_id <= v as u64 {
                        // The commit may be the one a killed process made before it synced
                        // it (the page cache kept it): the checkpoint is about to count on
                        // it.
                        if let Some(latest) = t.version() {
                            store.sync_version(latest).await.map_err(|e| {
                                Error::new(
                                    &codes::SINK_WRITE_FAILED,
                                    format!("cannot make the committed table durable: {e}"),
                                )
                            })?;
                        }
                        return Ok(WriteOutcome::AlreadyCommitted);
                    }
                }
            }
        }
        let (schema, batches) = delta_batches(&batch.data.schema, &batch.data.batches)?;
        let mut props = CommitProperties::default();
        if streaming {
            let version = i64::try_from(batch.batch_id).map_err(|_| {
                Error::new(
                    &codes::SINK_WRITE_FAILED,
                    format!(
                        "batch id {} does not fit a Delta txn version",
                        batch.batch_id
                    ),
                )
            })?;
            props = props.with_application_transaction(Transaction::new_with_last_update(
                batch.query_id,
                version,
                Some(chrono::Utc::now().timestamp_millis()),
            ));
            store.batch.store(batch.batch_id, Ordering::SeqCst);
        }
        let result = self
            .commit(store.clone(), table, action, schema, batches, props)
            .await;
        store.batch.store(DISARMED, Ordering::SeqCst);
        result?;
        Ok(WriteOutcome::Written { rows })
    }

    async fn commit(
        &self,
        store: Arc<FaultLogStore>,
        table: Option<DeltaTable>,
        action: Action,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> Result<()> {
        let failed = |e: DeltaTableError| {
            Error::new(
                &codes::SINK_WRITE_FAILED,
                format!(
                    "cannot write the Delta table `{}`: {e}",
                    self.path.display()
                ),
            )
        };
        let table = match table {
            Some(t) => t,
            None => DeltaTable::new(store as LogStoreRef, DeltaTableConfig::default()),
        };
        let exists = table.version().is_some();
        match action {
            Action::Merge(keys) if exists => {
                let nonempty: Vec<RecordBatch> =
                    batches.into_iter().filter(|b| b.num_rows() > 0).collect();
                if nonempty.is_empty() {
                    // Nothing to upsert: commit the txn alone (an append of nothing).
                    return self
                        .write_files(table, SaveMode::Append, schema, vec![], props)
                        .await
                        .map_err(failed);
                }
                let ctx = SessionContext::new();
                let source = ctx
                    .read_batches(nonempty)
                    .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("datafusion: {e}")))?;
                let qualified = |rel: &str, name: &str| {
                    Expr::Column(Column::new(Some(TableReference::bare(rel)), name))
                };
                let predicate = keys
                    .iter()
                    .map(|k| qualified("target", k).eq(qualified("source", k)))
                    .reduce(Expr::and)
                    .expect("merge keys are never empty");
                let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
                let names2 = names.clone();
                let session = table_session(table.log_store().as_ref());
                table
                    .merge(source, predicate)
                    .with_session_state(session)
                    .with_source_alias("source")
                    .with_target_alias("target")
                    .with_commit_properties(props)
                    .when_matched_update(|u| {
                        names.iter().fold(u, |u, n| {
                            u.update(Column::new_unqualified(n.clone()), qualified("source", n))
                        })
                    })
                    .map_err(failed)?
                    .when_not_matched_insert(|i| {
                        names2.iter().fold(i, |i, n| {
                            i.set(Column::new_unqualified(n.clone()), qualified("source", n))
                        })
                    })
                    .map_err(failed)?
                    .await
                    .map_err(failed)?;
                Ok(())
            }
            Action::Overwrite if exists => self
                .write_files(table, SaveMode::Overwrite, schema, batches, props)
                .await
                .map_err(failed),
            // Appends, and the first write of any mode (which creates the table).
            _ => self
                .write_files(table, SaveMode::Append, schema, batches, props)
                .await
                .map_err(failed),
        }
    }

    async fn write_files(
        &self,
        table: DeltaTable,
        save_mode: SaveMode,
        schema: SchemaRef,
        mut batches: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> DeltaResult<()> {
        if batches.is_empty() {
            batches.push(RecordBatch::new_empty(schema));
        }
        let mut builder = table
            .write(batches)
            .with_save_mode(save_mode)
            .with_commit_properties(props);
        if self.options.change_data_feed {
            builder = builder.with_configuration([(
                "delta.enableChangeDataFeed".to_string(),
                Some("true".to_string()),
            )]);
        }
        builder.await?;
        Ok(())
    }
}

enum Action {
    Append,
    Overwrite,
    Merge(Vec<String>),
}

#[async_trait]
impl Sink for DeltaSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let asset = self.asset.clone();
        self.write_inner(&batch)
            .await
            .map_err(|e| e.map_diagnostics(|d| d.at(format!("sinks[{asset}]"))))
    }

    async fn last_committed_batch(&mut self, query_id: &str) -> Result<Option<u64>> {
        if self.mode == ExecutionMode::Batch {
            return Ok(None);
        }
        Ok(app_transaction_version(&self.path, query_id)
            .await?
            .and_then(|v| u64::try_from(v).ok()))
    }
}

/// The Delta type of an Arrow type: zoned timestamps as `Timestamp(µs, "UTC")`, naive
/// ones as `Timestamp(µs)`, at any depth.
fn delta_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Timestamp(_, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Date64 => DataType::Date32,
        DataType::Struct(fields) => DataType::Struct(delta_fields(fields)),
        DataType::List(item) => DataType::List(delta_field(item)),
        DataType::LargeList(item) => DataType::LargeList(delta_field(item)),
        other => other.clone(),
    }
}

fn delta_field(f: &FieldRef) -> FieldRef {
    Arc::new(f.as_ref().clone().with_data_type(delta_type(f.data_type())))
}

fn delta_top_field(f: &FieldRef) -> FieldRef {
    Arc::new(
        f.as_ref()
            .clone()
            .with_data_type(delta_type(f.data_type()))
            .with_nullable(true),
    )
}

fn delta_fields(fields: &Fields) -> Fields {
    fields.iter().map(delta_field).collect()
}

/// The Arrow schema a Delta table created from `schema` has: Delta types (see
/// the [module docs](self)), every top-level column nullable (the contract checks
/// required columns before the sink; a nullable table keeps its schema stable across
/// batches whose Arrow nullability differs).
pub fn delta_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(delta_top_field)
            .collect::<Fields>(),
        schema.metadata().clone(),
    ))
}

/// Casts the batches to [`delta_schema`].
fn delta_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let target = delta_schema(schema);
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let columns = b
            .columns()
            .iter()
            .zip(target.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    cast(c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()
            .map_err(err)?;
        out.push(RecordBatch::try_new(target.clone(), columns).map_err(err)?);
    }
    Ok((target, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = DeltaSinkOptions::from_uri(&BindingUri::parse("delta://t").unwrap()).unwrap();
        assert_eq!(o.mode, DeltaWriteMode::Append);
        assert!(!o.change_data_feed);
        let o = DeltaSinkOptions::from_uri(
            &BindingUri::parse("delta://t?mode=merge&keys=a,%20b&change_data_feed=true").unwrap(),
        )
        .unwrap();
        assert_eq!(
            o.mode,
            DeltaWriteMode::Merge {
                keys: vec!["a".into(), "b".into()]
            }
        );
        assert!(o.change_data_feed);
        assert!(o.output_modes().contains(&OutputMode::Update));
        for bad in [
            "delta://t?mode=merge",
            "delta://t?keys=a",
            "delta://t?mode=upsertish",
            "delta://t?x=1",
            "delta://?mode=append",
            "delta://t?change_data_feed=maybe",
        ] {
            let e = DeltaSinkOptions::from_uri(&BindingUri::parse(bad).unwrap()).unwrap_err();
            assert_eq!(e.code(), "ETL007", "{bad}");
        }
    }

    #[test]
    fn timestamps_map_to_delta_types() {
        use arrow::datatypes::Field;
        let s = Schema::new(vec![
            Field::new(
                "a",
                DataType::Timestamp(TimeUnit::Millisecond, Some("+02:00".into())),
                true,
            ),
            Field::new("b", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            Field::new("c", DataType::Int64, false),
        ]);
        let d = delta_schema(&s);
        assert_eq!(
            d.field(0).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(
            d.field(1).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        assert_eq!(d.field(2).data_type(), &DataType::Int64);
    }
}
