//! The `delta://` sink: Delta Lake tables on the local file system or an object store
//! (through `deltalake`).
//!
//! # Binding
//!
//! `delta://<path>?mode=append|merge|overwrite&keys=a,b&change_data_feed=true` — `<path>`
//! is the table directory, relative to the project root or absolute; it is created when
//! absent. A table on an object store is named by its URL: `delta://s3://bucket/table`
//! (also `gs://`, `az://`; the profile's `storage_options` and the `AWS_*` variables
//! configure the store). There a commit is `deltalake`'s conditional put of
//! `_delta_log/<version>.json` (`If-None-Match: *`): of two writers of one version
//! exactly one wins, which is the mutual exclusion Delta's protocol needs; the store
//! must honour conditional puts (AWS S3 has since 2024, as do MinIO, R2 and moto).
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

mod log_store;
mod schema;
mod table;
#[cfg(test)]
mod tests;
mod write;

pub use schema::delta_schema;
pub use table::{app_transaction_version, read_table, read_table_at};

use async_trait::async_trait;
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::storage::{Location, StorageOptions};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use log_store::{FaultLogStore, DISARMED};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use table::location_log_store;

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

/// A `delta://` sink (see the [module docs](self)).
pub struct DeltaSink {
    asset: String,
    location: Location,
    storage_options: StorageOptions,
    options: DeltaSinkOptions,
    mode: ExecutionMode,
    /// The wrapped log store, created on first use.
    store: Option<Arc<FaultLogStore>>,
    /// The table as this sink last committed it: the next micro-batch brings it up to
    /// date by reading only the commits after it (not the whole log since the last
    /// checkpoint, which on an object store is a `GET` per commit).
    table: Option<deltalake::DeltaTable>,
    /// The last `(query id, batch id)` this sink committed.
    last_txn: Option<(String, u64)>,
}

impl std::fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaSink")
            .field("asset", &self.asset)
            .field("location", &self.location)
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
            location: Location::parse_path_or_object(&ctx.uri.location, &ctx.root)?,
            storage_options: ctx.storage_options.clone(),
            options,
            mode: ctx.mode,
            store: None,
            table: None,
            last_txn: None,
        })
    }

    fn store(&mut self) -> Result<Arc<FaultLogStore>> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let (root, local) = match &self.location {
            Location::Local(path) => {
                std::fs::create_dir_all(path).map_err(|e| {
                    Error::new(
                        &codes::IO_ERROR,
                        format!("cannot create `{}`: {e}", path.display()),
                    )
                })?;
                let root = etlantic_core::uri::absolute_normalized(path).map_err(|e| {
                    Error::new(
                        &codes::IO_ERROR,
                        format!("cannot resolve `{}`: {e}", path.display()),
                    )
                })?;
                (root, !etlantic_core::storage::is_mounted(path))
            }
            // An object store's put is durable when it returns: nothing to sync.
            Location::Remote(_) => (PathBuf::new(), false),
        };
        let store = Arc::new(FaultLogStore {
            inner: location_log_store(&self.location, &self.storage_options)?,
            batch: AtomicU64::new(DISARMED),
            root,
            local,
        });
        self.store = Some(store.clone());
        Ok(store)
    }
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
        let version = match &self.location {
            Location::Local(path) => app_transaction_version(path, query_id).await?,
            Location::Remote(_) => {
                let store = self.store()? as deltalake::logstore::LogStoreRef;
                match table::load(store).await? {
                    Some(table) => table::txn_version(&table, query_id).await?,
                    None => None,
                }
            }
        };
        Ok(version.and_then(|v| u64::try_from(v).ok()))
    }
}
