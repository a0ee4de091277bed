//! Opening and reading Delta tables: the table's URL and log store (local, over the
//! storage layer under a mount, or on an object store), loading its snapshot, reading its
//! rows and the `txn` version of a query.

use arrow::array::RecordBatch;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema};
use deltalake::datafusion::catalog::Session;
use deltalake::logstore::{logstore_for, LogStoreRef, StorageConfig};
use deltalake::{DeltaTable, DeltaTableConfig, DeltaTableError};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{Location, StorageOptions};
use std::path::Path;
use std::sync::Arc;
use url::Url;

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

/// The log store of the table at `location`: [`table_log_store`] for a directory, or
/// `deltalake`'s default log store (commits by conditional put: `If-None-Match: *`, so of
/// two writers of one version exactly one wins) over the bucket's object store.
pub(crate) fn location_log_store(
    location: &Location,
    options: &StorageOptions,
) -> Result<LogStoreRef> {
    match location {
        Location::Local(dir) => table_log_store(&table_url(dir)?, dir),
        Location::Remote(url) => remote_log_store(url, options),
    }
}

#[cfg(feature = "object-store")]
fn remote_log_store(url: &Url, options: &StorageOptions) -> Result<LogStoreRef> {
    etlantic_object_store::delta_log_store(url, options)
}

#[cfg(not(feature = "object-store"))]
fn remote_log_store(url: &Url, _options: &StorageOptions) -> Result<LogStoreRef> {
    Err(Error::new(
        &codes::UNKNOWN_SCHEME,
        format!("cannot open the Delta table `{url}`: this build has no object-store support"),
    )
    .with_help(
        "Build etlantic with the `object-store` feature (it serves s3://, gs:// and az://).",
    ))
}

/// Turns a `deltalake` error into a diagnostic.
fn delta_error(
    code: &'static etlantic_core::diagnostics::CodeInfo,
    what: &'static str,
) -> impl Fn(DeltaTableError) -> Error {
    move |e| Error::new(code, format!("{what}: {e}"))
}

/// The log store of the table at `url` (directory `dir`): `deltalake`'s own for a local
/// directory, or one over the storage layer when `dir` is under a storage mount.
pub(super) fn table_log_store(url: &Url, dir: &Path) -> Result<LogStoreRef> {
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

/// Opens the table at `path` through `log_store`; `Ok(None)` when it is not a Delta table
/// (yet).
pub(super) async fn load(log_store: LogStoreRef) -> Result<Option<DeltaTable>> {
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
    read_table_at(
        &Location::Local(path.as_ref().to_path_buf()),
        &StorageOptions::default(),
    )
    .await
}

/// Reads the latest snapshot of the Delta table at `location` (a directory, or a table
/// on an object store reached with `options`).
pub async fn read_table_at(
    location: &Location,
    options: &StorageOptions,
) -> Result<Vec<RecordBatch>> {
    let store = location_log_store(location, options)?;
    let Some(table) = load(store).await? else {
        return Err(Error::new(
            &codes::IO_ERROR,
            format!("`{location}` is not a Delta table"),
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
pub(super) fn table_session(store: &dyn deltalake::logstore::LogStore) -> Arc<dyn Session> {
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

pub(super) async fn txn_version(table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
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
