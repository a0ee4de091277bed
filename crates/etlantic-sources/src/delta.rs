//! The `delta://` source: a Delta Lake table on the local file system, read as a table
//! (bounded) or as its change data feed (streaming), through `deltalake`.
//!
//! # Binding
//!
//! `delta://<path>?version=N&startingVersion=N&maxVersionsPerTrigger=N` — `<path>` is the
//! table directory, relative to the project root or absolute, or a table on an object
//! store written as its URL (`delta://s3://bucket/table`; built with the `object-store`
//! feature, reached with the profile's `storage_options` and the `AWS_*` variables).
//!
//! # Bounded (batch runs, the static side of stream-static joins)
//!
//! The table's latest snapshot, or the snapshot of `version=N` (time travel). The offset
//! is `{"version": V}`, the snapshot read. A path that is not a Delta table is an error
//! (`ETL706`).
//!
//! # Streaming: the change data feed
//!
//! The table must have `delta.enableChangeDataFeed=true` (the `delta://` sink sets it with
//! `change_data_feed=true`). Every commit from `startingVersion` (default 0) on becomes
//! rows like Spark's `readChangeFeed`: the table's columns plus
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `_change_type` | string | `insert`, `update_preimage`, `update_postimage`, `delete` |
//! | `_commit_version` | long | the table version of the change |
//! | `_commit_timestamp` | timestamp (UTC) | the commit's time |
//!
//! (The source's contract decides which columns the pipeline sees: declare the ones you
//! need; columns the contract does not name are dropped.) Appends read as `insert`s;
//! `MERGE`, `UPDATE` and `DELETE` commits read from their change-data files; an overwrite
//! reads as `delete`s of the removed files' rows and `insert`s of the new ones.
//!
//! Offsets are table versions: `{"version": V}` means every commit up to and including
//! `V` is read. [`Source::latest_offset`] returns the table's latest version, or at most
//! `maxVersionsPerTrigger` versions past the start (Spark's option of the same name;
//! [`ReadLimit::max_records`] is not applied — a version is read whole). `read(start,
//! end)` reads the versions in `(start, end]` (`[startingVersion, end]` when `start` is
//! `None`). A table that does not exist yet has no new data.
//!
//! Replayable: a committed Delta version never changes, so a version range always reads
//! the same rows; they are returned ordered by `_commit_version`, then by their values,
//! so a replay also returns them in the same order. (Log cleanup or `VACUUM` removing the
//! files of versions not read yet breaks this, as in Spark.) Rejected rows carry the
//! asset, the commit version as the position's `offset` and their 0-based `row` in the
//! read.

use crate::decode::{row_as_json, ContractDecoder};
use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{cast, concat_batches, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::row::{RowConverter, SortField};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::logstore::{logstore_for, LogStoreRef, StorageConfig};
use deltalake::{DeltaTable, DeltaTableConfig, DeltaTableError};
use etlantic_core::data::{Offset, SourcePosition};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::storage::{Location, StorageOptions};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use std::sync::Arc;
use url::Url;

/// The change-type column of the change data feed.
pub const CHANGE_TYPE: &str = "_change_type";
/// The commit-version column of the change data feed.
pub const COMMIT_VERSION: &str = "_commit_version";
/// The commit-timestamp column of the change data feed.
pub const COMMIT_TIMESTAMP: &str = "_commit_timestamp";

/// The options of a `delta://` source binding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaSourceOptions {
    /// Bounded reads: the snapshot version (latest when `None`).
    pub version: Option<u64>,
    /// Streaming: the first version of the change data feed (default 0).
    pub starting_version: u64,
    /// Streaming: at most this many versions per micro-batch.
    pub max_versions_per_trigger: Option<u64>,
}

impl DeltaSourceOptions {
    /// Parses the URI parameters (`ETL007` for an unknown or invalid one).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let bad = |msg: String| {
            Error::from(
                Diagnostic::new(
                    &codes::BAD_URI,
                    format!("binding `{}`: {msg}", uri.redacted()),
                )
                .help("delta://<path>?version=N | ?startingVersion=N&maxVersionsPerTrigger=N"),
            )
        };
        if uri.location.trim().is_empty() {
            return Err(bad("a delta binding needs a table directory".into()));
        }
        let number = |k: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| bad(format!("`{k}={v}` must be a non-negative integer")))
        };
        let mut o = DeltaSourceOptions::default();
        for (k, v) in &uri.params {
            match k.as_str() {
                "version" | "versionAsOf" => o.version = Some(number(k, v)?),
                "startingVersion" | "starting_version" => o.starting_version = number(k, v)?,
                "maxVersionsPerTrigger" | "max_versions_per_trigger" => {
                    let n = number(k, v)?;
                    if n == 0 {
                        return Err(bad(format!("`{k}` must be at least 1")));
                    }
                    o.max_versions_per_trigger = Some(n);
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter `{other}` for the delta source (known: {})",
                        option_names(OPTIONS)
                    )))
                }
            }
        }
        Ok(o)
    }
}

/// The provider of `delta://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaSourceProvider;

inventory::submit! { SourceRegistration(&DeltaSourceProvider) }

/// The query parameters of a `delta://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "version",
        default: "latest",
        meaning: "Bounded reads: the table version to read (time travel; also `versionAsOf`).",
    },
    BindingOption {
        name: "startingVersion",
        default: "0",
        meaning: "Streaming: the first table version of the change data feed to read (also `starting_version`).",
    },
    BindingOption {
        name: "maxVersionsPerTrigger",
        default: "unlimited",
        meaning: "Streaming: at most this many table versions per micro-batch, at least 1 (also `max_versions_per_trigger`).",
    },
];

impl SourceProvider for DeltaSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "delta"
    }

    fn description(&self) -> &'static str {
        "Delta Lake tables: a snapshot (bounded) or the change data feed from a version (streaming)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        DeltaSourceOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: true,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        let options = DeltaSourceOptions::from_uri(&ctx.uri)?;
        let decoder = ContractDecoder::new(ctx.schema.clone(), ctx.contract.as_deref())?;
        Ok(Box::new(DeltaSource {
            asset: ctx.asset.clone(),
            location: ctx.uri.location.clone(),
            table: Location::parse_path_or_object(&ctx.uri.location, &ctx.root)?,
            storage_options: ctx.storage_options.clone(),
            options,
            mode: ctx.mode,
            decoder,
        }))
    }
}

/// A `delta://` source (see the [module docs](self)).
#[derive(Debug)]
pub struct DeltaSource {
    asset: String,
    location: String,
    table: Location,
    storage_options: StorageOptions,
    options: DeltaSourceOptions,
    mode: ExecutionMode,
    decoder: ContractDecoder,
}

fn io(what: &str, table: &Location, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("{what} the Delta table `{table}`: {e}"),
    )
}

/// The log store of the table at `table`.
fn log_store(table: &Location, options: &StorageOptions) -> Result<LogStoreRef> {
    match table {
        Location::Local(path) => {
            let abs = etlantic_core::uri::absolute_normalized(path)
                .map_err(|e| io("cannot resolve", table, e))?;
            let url = Url::from_directory_path(&abs).map_err(|_| {
                Error::new(
                    &codes::BAD_URI,
                    format!("`{}` is not a usable table directory", abs.display()),
                )
            })?;
            logstore_for(&url, StorageConfig::default()).map_err(|e| io("cannot open", table, e))
        }
        #[cfg(feature = "object-store")]
        Location::Remote(url) => etlantic_object_store::delta_log_store(url, options),
        #[cfg(not(feature = "object-store"))]
        Location::Remote(url) => {
            let _ = options;
            Err(Error::new(
                &codes::UNKNOWN_SCHEME,
                format!("cannot open the Delta table `{url}`: this build has no object-store support"),
            )
            .with_help("Build etlantic with the `object-store` feature (it serves s3://, gs:// and az://)."))
        }
    }
}

fn version_of(offset: &Offset) -> Result<u64> {
    offset
        .0
        .get("version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!("`{}` is not an offset of a delta source", offset.0),
            )
        })
}

fn offset(version: u64) -> Offset {
    Offset(serde_json::json!({ "version": version }))
}

/// Opens the table at `table` (`Ok(None)` when it is not a Delta table yet).
async fn open(table: &Location, options: &StorageOptions) -> Result<Option<DeltaTable>> {
    if let Location::Local(path) = table {
        if !path.join("_delta_log").is_dir() {
            return Ok(None);
        }
    }
    let mut loaded = DeltaTable::new(log_store(table, options)?, DeltaTableConfig::default());
    match loaded.load().await {
        Ok(()) => Ok(Some(loaded)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(io("cannot load", table, e)),
    }
}

impl DeltaSource {
    async fn table(&self) -> Result<DeltaTable> {
        open(&self.table, &self.storage_options)
            .await?
            .ok_or_else(|| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("`{}` is not a Delta table", self.table),
                )
            })
    }

    /// The snapshot at `version`.
    async fn read_snapshot(&self, version: u64) -> Result<Vec<RecordBatch>> {
        let mut table = self.table().await?;
        if table.version() != Some(version) {
            table
                .load_version(version)
                .await
                .map_err(|e| io(&format!("cannot load version {version} of"), &self.table, e))?;
        }
        let (_, stream) = table
            .scan_table()
            .await
            .map_err(|e| io("cannot scan", &self.table, e))?;
        let batches = deltalake::operations::collect_sendable_stream(stream)
            .await
            .map_err(|e| io("cannot read", &self.table, e))?;
        batches.iter().map(normalize_cdf).collect()
    }

    /// The change data feed of versions `from..=to`, ordered (see the module docs).
    async fn read_changes(&self, from: u64, to: u64) -> Result<Vec<RecordBatch>> {
        let table = self.table().await?;
        let ctx = SessionContext::new();
        // The table's files are read through its own store (an object store's too).
        let store = table.log_store();
        ctx.runtime_env()
            .register_object_store(store.root_url(), store.root_object_store(None));
        let plan = table
            .scan_cdf()
            .with_starting_version(from)
            .with_ending_version(to)
            .build(&ctx.state(), None)
            .await
            .map_err(|e| io("cannot read the change data feed of", &self.table, e))?;
        let batches = deltalake::datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .map_err(|e| io("cannot read the change data feed of", &self.table, e))?;
        let batches = batches
            .iter()
            .map(normalize_cdf)
            .collect::<Result<Vec<_>>>()?;
        sort_changes(batches)
    }

    fn conform(&self, batches: Vec<RecordBatch>) -> Result<SourceBatch> {
        let mut out = SourceBatch::default();
        let mut row = 0u64;
        for batch in batches {
            let conformed = self.decoder.conform_batch(&batch)?;
            let versions = batch.column_by_name(COMMIT_VERSION).and_then(|c| {
                c.as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .cloned()
            });
            for (i, problem) in conformed.rejected {
                let position = SourcePosition {
                    asset: self.asset.clone(),
                    file: Some(self.location.clone()),
                    row: Some(row + i as u64),
                    offset: versions.as_ref().map(|v| v.value(i)),
                    ..SourcePosition::default()
                };
                out.rejected
                    .push(problem.into_rejected(position, row_as_json(&batch, i)));
            }
            if conformed.batch.num_rows() > 0 {
                out.batches.push(conformed.batch);
            }
            row += batch.num_rows() as u64;
        }
        Ok(out)
    }
}

/// `_commit_version` as a signed long and `_commit_timestamp` as a UTC instant, as in
/// Spark (`deltalake` yields an unsigned version and a zone-less millisecond timestamp
/// holding UTC); DataFusion's view types (`Utf8View`, `BinaryView`) as plain `Utf8` and
/// `Binary`, the types contracts use.
fn normalize_cdf(batch: &RecordBatch) -> Result<RecordBatch> {
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        let target = match f.name().as_str() {
            COMMIT_VERSION => Some(DataType::Int64),
            COMMIT_TIMESTAMP => Some(DataType::Timestamp(
                TimeUnit::Millisecond,
                Some("UTC".into()),
            )),
            _ => match c.data_type() {
                DataType::Utf8View => Some(DataType::Utf8),
                DataType::BinaryView => Some(DataType::Binary),
                _ => None,
            },
        };
        match target {
            Some(t) if c.data_type() != &t => {
                columns.push(cast(c, &t).map_err(err)?);
                fields.push(Field::new(f.name(), t, f.is_nullable()));
            }
            _ => {
                columns.push(c.clone());
                fields.push(f.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(err)
}

/// One batch ordered by `_commit_version`, then by every column's value (a total order,
/// so that a replay returns the rows in the same order whatever order the files were
/// scanned in).
fn sort_changes(batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(vec![]);
    };
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let schema: SchemaRef = first.schema();
    let all = concat_batches(&schema, &batches).map_err(err)?;
    if all.num_rows() == 0 {
        return Ok(vec![]);
    }
    let first_col = schema.index_of(COMMIT_VERSION).ok();
    let order: Vec<usize> = first_col
        .into_iter()
        .chain((0..schema.fields().len()).filter(|i| Some(*i) != first_col))
        .collect();
    let sortable: Vec<usize> = order
        .into_iter()
        .filter(|&i| {
            RowConverter::supports_fields(&[SortField::new(schema.field(i).data_type().clone())])
        })
        .collect();
    let converter = RowConverter::new(
        sortable
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )
    .map_err(err)?;
    let cols: Vec<ArrayRef> = sortable.iter().map(|&i| all.column(i).clone()).collect();
    let rows = converter.convert_columns(&cols).map_err(err)?;
    let mut idx: Vec<u32> = (0..all.num_rows() as u32).collect();
    idx.sort_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
    let indices = UInt32Array::from(idx);
    let columns = all
        .columns()
        .iter()
        .map(|c| take(c, &indices, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(err)?;
    Ok(vec![RecordBatch::try_new(schema, columns).map_err(err)?])
}

#[async_trait::async_trait]
impl Source for DeltaSource {
    fn schema(&self) -> SchemaRef {
        self.decoder.schema()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        _limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        if self.mode == ExecutionMode::Batch {
            let version = match self.options.version {
                Some(v) => v,
                None => self.table().await?.version().unwrap_or_default(),
            };
            return Ok(Some(offset(version)));
        }
        let from = match start {
            Some(o) => version_of(o)? + 1,
            None => self.options.starting_version,
        };
        let Some(table) = open(&self.table, &self.storage_options).await? else {
            return Ok(start.cloned());
        };
        let latest = table.version().unwrap_or_default();
        if latest < from {
            return Ok(start.cloned());
        }
        let end = match self.options.max_versions_per_trigger {
            Some(n) => latest.min(from + n - 1),
            None => latest,
        };
        Ok(Some(offset(end)))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let to = version_of(end)?;
        let batches = if self.mode == ExecutionMode::Batch {
            self.read_snapshot(to).await?
        } else {
            let from = match start {
                Some(o) => version_of(o)? + 1,
                None => self.options.starting_version,
            };
            if from > to {
                return Ok(SourceBatch::default());
            }
            self.read_changes(from, to).await?
        };
        self.conform(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = DeltaSourceOptions::from_uri(
            &BindingUri::parse("delta://t?startingVersion=3&maxVersionsPerTrigger=2").unwrap(),
        )
        .unwrap();
        assert_eq!(o.starting_version, 3);
        assert_eq!(o.max_versions_per_trigger, Some(2));
        assert_eq!(o.version, None);
        for bad in [
            "delta://t?version=-1",
            "delta://t?maxVersionsPerTrigger=0",
            "delta://t?x=1",
            "delta://?version=1",
        ] {
            let e = DeltaSourceOptions::from_uri(&BindingUri::parse(bad).unwrap()).unwrap_err();
            assert_eq!(e.code(), "ETL007", "{bad}");
        }
    }
}
