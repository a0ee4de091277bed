//! Helpers shared by the integration tests.
#![allow(dead_code)]

use etlantic_core::contract::Contract;
use etlantic_core::data::RejectedRecord;
use etlantic_core::plugin::{Source, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const ORDERS: &str = r#"
version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "order_id"
        logicalType: "integer"
        logicalTypeOptions: {minimum: 1}
        required: true
      - name: "customer"
        logicalType: "string"
        logicalTypeOptions: {maxLength: 10, pattern: "[A-Z][a-z]+"}
      - name: "amount"
        logicalType: "number"
        physicalType: "decimal(10,2)"
        logicalTypeOptions: {minimum: 0}
      - name: "ts"
        logicalType: "timestamp"
        required: true
      - name: "day"
        logicalType: "date"
      - name: "paid"
        logicalType: "boolean"
      - name: "score"
        logicalType: "number"
        logicalTypeOptions: {exclusiveMaximum: 100}
"#;

pub const EVENTS: &str = r#"
version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "events"
status: "active"
schema:
  - name: "events"
    logicalType: "object"
    properties:
      - name: "id"
        logicalType: "integer"
        logicalTypeOptions: {minimum: 0}
        required: true
      - name: "note"
        logicalType: "string"
      - name: "ts"
        logicalType: "timestamp"
      - name: "v"
        logicalType: "number"
"#;

pub fn contract(text: &str) -> Arc<Contract> {
    Arc::new(Contract::parse(text, "test.yaml", None).unwrap())
}

pub fn ctx(
    root: &Path,
    asset: &str,
    uri: &str,
    contract: &Arc<Contract>,
    mode: ExecutionMode,
    state_dir: Option<PathBuf>,
) -> SourceContext {
    SourceContext {
        storage_options: Default::default(),
        asset: asset.to_string(),
        uri: BindingUri::parse(uri).unwrap(),
        schema: contract.arrow_schema(),
        contract: Some(contract.clone()),
        root: root.to_path_buf(),
        mode,
        state: state_dir.map(|d| etlantic_core::storage::open(&d)),
    }
}

/// The `file://` source of `asset` at `uri` for a batch run in the project at `root`.
pub fn batch_file_source(
    root: &Path,
    asset: &str,
    uri: &str,
    contract: &Arc<Contract>,
) -> Box<dyn Source> {
    etlantic_core::plugin::source_provider("file")
        .expect("file source registered")
        .create(ctx(root, asset, uri, contract, ExecutionMode::Batch, None))
        .unwrap()
}

pub fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// The `id` column (Int64) of every batch read, in order.
pub fn ids(out: &etlantic_core::plugin::SourceBatch) -> Vec<i64> {
    use arrow::array::{Array, Int64Array};
    out.batches
        .iter()
        .flat_map(|b| {
            let a = b
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
        })
        .collect()
}

/// Reads everything a bounded source has.
pub async fn read_all(source: &mut Box<dyn Source>) -> etlantic_core::plugin::SourceBatch {
    let limit = etlantic_core::plugin::ReadLimit::unlimited();
    match source.latest_offset(None, &limit).await.unwrap() {
        Some(end) => source.read(None, &end).await.unwrap(),
        None => Default::default(),
    }
}

/// (code, field, line, row) of a reject.
pub type Summary = (String, Option<String>, Option<u64>, Option<u64>);

/// (code, field, line, row) of each reject.
pub fn summary(rejected: &[RejectedRecord]) -> Vec<Summary> {
    rejected
        .iter()
        .map(|r| {
            (
                r.code.clone(),
                r.field.clone(),
                r.position.line,
                r.position.row,
            )
        })
        .collect()
}

/// The error `create` returns (panics when it succeeds).
pub fn create_err(
    provider: &dyn etlantic_core::plugin::SourceProvider,
    ctx: SourceContext,
) -> etlantic_core::Error {
    match provider.create(ctx) {
        Ok(_) => panic!("create should fail"),
        Err(e) => e,
    }
}
