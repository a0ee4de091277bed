//! `etlantic init`: a runnable example project on embedded defaults.
//!
//! The example reads orders (JSON lines, two of which break the contract on purpose),
//! drops cancelled ones, and writes revenue per customer to a CSV file; the bad records
//! land in `out/quarantine.jsonl` with their reason and line number.

use etlantic_core::diagnostics::{codes, Error, Result};
use std::path::{Path, PathBuf};

/// The files `init` writes, relative to the project directory.
pub const FILES: &[(&str, &str)] = &[
    ("pipeline.yaml", PIPELINE),
    ("contracts/orders.odcs.yaml", ORDERS_CONTRACT),
    ("contracts/customer_revenue.odcs.yaml", REVENUE_CONTRACT),
    ("profiles/local.yaml", PROFILE),
    ("data/orders.jsonl", ORDERS_DATA),
    (".gitignore", "out/\n.etlantic/\n"),
];

/// The expected content of `out/customer_revenue.csv` after `etlantic run`.
pub const EXPECTED_OUTPUT: &str =
    "customer,orders,revenue\nacme,3,245.5\nglobex,2,80.0\ninitech,1,19.99\n";

const PIPELINE: &str = r#"# An ETLantic pipeline: assets with contracts, sources, transformations, sinks.
# Where the assets live is the profile's business (profiles/local.yaml).
apiVersion: etlantic/v1
kind: Pipeline
name: customer_revenue
description: Revenue and order count per customer, from orders that were not cancelled.
assets:
  orders:
    contract: contracts/orders.odcs.yaml
  customer_revenue:
    contract: contracts/customer_revenue.odcs.yaml
sources:
  - id: orders
    asset: orders
transforms:
  - id: revenue
    inputs:
      orders: orders
    steps:
      - filter: "status != 'cancelled'"
      - aggregate:
          group_by: [customer]
          aggregates:
            orders: "count_all()"
            revenue: "sum(amount)"
      - sort: [customer]
sinks:
  - id: write_revenue
    input: revenue
    asset: customer_revenue
"#;

const ORDERS_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
name: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "order_id"
        logicalType: "integer"
        logicalTypeOptions: {minimum: 1}
        required: true
        unique: true
      - name: "customer"
        logicalType: "string"
        required: true
      - name: "amount"
        logicalType: "number"
        required: true
      - name: "status"
        logicalType: "string"
        required: true
      - name: "ordered_at"
        logicalType: "timestamp"
"#;

const REVENUE_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "customer_revenue"
name: "customer_revenue"
status: "active"
schema:
  - name: "customer_revenue"
    logicalType: "object"
    properties:
      - name: "customer"
        logicalType: "string"
        required: true
      - name: "orders"
        logicalType: "integer"
        required: true
      - name: "revenue"
        logicalType: "number"
"#;

const PROFILE: &str = r#"# Binds the pipeline's logical assets to places, for local runs.
apiVersion: etlantic/v1
kind: Profile
name: local
bindings:
  orders: file://data/orders.jsonl
  customer_revenue: file://out/customer_revenue.csv
quarantine: file://out/quarantine.jsonl
on_error: quarantine
"#;

const ORDERS_DATA: &str = r#"{"order_id": 1, "customer": "acme", "amount": 120.5, "status": "paid", "ordered_at": "2024-01-01T10:00:00Z"}
{"order_id": 2, "customer": "globex", "amount": 30.0, "status": "paid", "ordered_at": "2024-01-01T10:05:00Z"}
{"order_id": 3, "customer": "acme", "amount": 99.0, "status": "cancelled", "ordered_at": "2024-01-01T10:07:00Z"}
{"order_id": 4, "customer": "acme", "amount": 25.0, "status": "shipped", "ordered_at": "2024-01-01T11:00:00Z"}
{"order_id": 5, "customer": "initech", "amount": 19.99, "status": "paid", "ordered_at": "2024-01-01T11:30:00Z"}
{"order_id": 6, "customer": "globex", "amount": "fifty", "status": "paid", "ordered_at": "2024-01-01T12:00:00Z"}
{"order_id": 7, "customer": "globex", "amount": 50.0, "status": "paid", "ordered_at": "2024-01-01T12:10:00Z"}
{"order_id": 8, "customer": "acme", "amount": 100.0, "status": "paid", "ordered_at": "2024-01-01T12:30:00Z"
{"order_id": 9, "customer": "acme", "amount": 100.0, "status": "paid", "ordered_at": "2024-01-01T13:00:00Z"}
"#;

/// Writes the example project into `dir` (created if needed). Refuses to overwrite an
/// existing `pipeline.yaml`.
pub fn init(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("pipeline.yaml").exists() {
        return Err(Error::new(
            &codes::IO_ERROR,
            format!(
                "{} already holds a pipeline.yaml; refusing to overwrite it",
                dir.display()
            ),
        ));
    }
    let mut written = Vec::new();
    for (rel, content) in FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", parent.display())))?;
        }
        std::fs::write(&path, content)
            .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}
