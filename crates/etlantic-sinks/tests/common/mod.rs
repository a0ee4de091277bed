//! Helpers shared by the integration tests.
#![allow(dead_code)]

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array, RecordBatch,
    StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::SchemaRef;
use etlantic_core::contract::Contract;
use etlantic_core::data::Table;
use etlantic_core::plugin::{SinkBatch, SinkContext};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use std::path::Path;
use std::sync::Arc;

// Link the crates so that their providers register themselves.
use etlantic_sinks as _;
use etlantic_sources as _;

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
        required: true
      - name: "customer"
        logicalType: "string"
      - name: "amount"
        logicalType: "number"
        physicalType: "decimal(10,2)"
      - name: "ts"
        logicalType: "timestamp"
        required: true
      - name: "day"
        logicalType: "date"
      - name: "paid"
        logicalType: "boolean"
      - name: "score"
        logicalType: "number"
"#;

pub fn contract() -> Arc<Contract> {
    Arc::new(Contract::parse(ORDERS, "orders.yaml", None).unwrap())
}

pub const TS0: i64 = 1_704_164_645_123_000; // 2024-01-02T03:04:05.123Z

/// Orders `first..first + n`; odd ids have nulls in every nullable column.
pub fn orders(first: i64, n: i64) -> RecordBatch {
    let schema = contract().arrow_schema();
    let ids: Vec<i64> = (first..first + n).collect();
    let odd = |i: &i64| i % 2 == 1;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from(
            ids.iter()
                .map(|i| (!odd(i)).then(|| format!("Cust, \"{i}\"")))
                .collect::<Vec<_>>(),
        )),
        Arc::new(
            Decimal128Array::from(
                ids.iter()
                    .map(|i| (!odd(i)).then_some(*i as i128 * 1000 + 50))
                    .collect::<Vec<_>>(),
            )
            .with_precision_and_scale(10, 2)
            .unwrap(),
        ),
        Arc::new(
            TimestampMicrosecondArray::from(
                ids.iter().map(|i| TS0 + i * 60_000_000).collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(Date32Array::from(
            ids.iter()
                .map(|i| (!odd(i)).then_some(19724 + *i as i32))
                .collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            ids.iter()
                .map(|i| (!odd(i)).then_some(i % 4 == 0))
                .collect::<Vec<_>>(),
        )),
        Arc::new(Float64Array::from(
            ids.iter()
                .map(|i| (!odd(i)).then_some(*i as f64 + 0.25))
                .collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

pub fn table(batches: Vec<RecordBatch>) -> Table {
    Table::new(contract().arrow_schema(), batches)
}

pub fn sink_ctx(
    root: &Path,
    uri: &str,
    mode: ExecutionMode,
    output_mode: OutputMode,
) -> SinkContext {
    SinkContext {
        storage_options: Default::default(),
        asset: "orders_out".into(),
        uri: BindingUri::parse(uri).unwrap(),
        schema: contract().arrow_schema(),
        contract: Some(contract()),
        root: root.to_path_buf(),
        mode,
        output_mode,
    }
}

pub fn batch<'a>(
    query_id: &'a str,
    batch_id: u64,
    mode: OutputMode,
    data: &'a Table,
) -> SinkBatch<'a> {
    SinkBatch {
        query_id,
        batch_id,
        output_mode: mode,
        data,
    }
}

pub fn concat(schema: &SchemaRef, batches: &[RecordBatch]) -> RecordBatch {
    arrow::compute::concat_batches(schema, batches).unwrap()
}

/// Sorted names of the entries of a directory.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
