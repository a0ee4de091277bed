//! # ETLantic-rs
//!
//! Typed, contract-checked pipelines that run bounded (batch) or unbounded (micro-batch
//! streaming) on pluggable backends.
//!
//! This facade re-exports the crates and links the plugins its cargo features enable
//! (each plugin registers itself with `inventory`):
//!
//! | feature | plugins |
//! |---|---|
//! | always | DataFusion engine; file (JSON lines, CSV, Parquet), memory, console, rate; the `session_summary` stateful processor ([`processors`]) |
//! | `kafka` | Kafka source and sink |
//! | `delta` | Delta Lake sink and change-data-feed source |
//! | `iceberg` | Iceberg sink |
//! | `sql` | PostgreSQL/SQLite sink and the SQL-region backend |
//! | `polars` | Polars batch backend |
//! | `spark` | Spark Connect backend |
//!
//! ```no_run
//! # async fn demo() -> etlantic::core::Result<()> {
//! let project = etlantic::plan::Project::load("pipeline.yaml".as_ref(), None)?;
//! let plan = etlantic::plan::plan(&project).into_result()?;
//! let report = etlantic::run::run_batch(&plan, &etlantic::run::RunContext::for_plan(&plan, &project.root)).await;
//! println!("{}", report.status);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod binding_docs;
pub mod contract_diff;
pub mod dlq;
pub mod emit;
pub mod generate;
pub mod history;
pub mod metrics;
pub mod openlineage;
pub mod processors;
pub mod progress_view;
pub mod run;
pub mod scaffold;
pub mod status;

pub use etlantic_core as core;
pub use etlantic_datafusion as datafusion;
pub use etlantic_plan as plan;
pub use etlantic_runtime as runtime;
pub use etlantic_sinks as sinks;
pub use etlantic_sources as sources;

#[cfg(feature = "object-store")]
pub use etlantic_object_store as object_store;
#[cfg(feature = "polars")]
pub use etlantic_polars as polars;
#[cfg(feature = "disk-state")]
pub use etlantic_rocksdb as rocksdb;
#[cfg(feature = "spark")]
pub use etlantic_spark_compat as spark;
#[cfg(feature = "sql")]
pub use etlantic_sql as sql;

/// Keeps the connector plugins of the enabled features in the final binary.
///
/// Plugins register through `inventory`, whose registrations live in the connector's
/// object file; a linker drops an object file nothing refers to, so a connector module
/// that the facade never names directly could silently be missing. The `etlantic` binary
/// calls this at start; a program embedding the facade may do the same.
pub fn link_plugins() {
    // The embedded engine registers with the runtime, which names no engine.
    etlantic_datafusion::link();
    #[cfg(feature = "spark")]
    std::hint::black_box(&etlantic_spark_compat::whole_query::SparkWholeQuery);
    #[cfg(feature = "kafka")]
    {
        std::hint::black_box(&etlantic_sources::kafka::KafkaSourceProvider);
        std::hint::black_box(&etlantic_sinks::kafka::KafkaSinkProvider);
    }
    #[cfg(feature = "delta")]
    {
        std::hint::black_box(&etlantic_sources::delta::DeltaSourceProvider);
        std::hint::black_box(&etlantic_sinks::delta::DeltaSinkProvider);
    }
    #[cfg(feature = "iceberg")]
    std::hint::black_box(&etlantic_sinks::iceberg::IcebergSinkProvider);
    #[cfg(feature = "disk-state")]
    std::hint::black_box(&etlantic_rocksdb::DiskStoreProvider);
    #[cfg(feature = "object-store")]
    std::hint::black_box(&etlantic_object_store::ObjectStoreProvider);
    #[cfg(feature = "sql")]
    {
        std::hint::black_box(&etlantic_sources::sql::PostgresSourceProvider);
        std::hint::black_box(&etlantic_sources::sql::SqliteSourceProvider);
        std::hint::black_box(&etlantic_sinks::sql::PostgresSinkProvider);
        std::hint::black_box(&etlantic_sinks::sql::SqliteSinkProvider);
    }
}

/// Process exit codes of the `etlantic` command.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// The pipeline, a profile or a contract is invalid (load, structural, reference,
    /// semantic, streaming or policy phase).
    pub const INVALID_PIPELINE: i32 = 1;
    /// Command-line usage error.
    pub const USAGE: i32 = 2;
    /// The pipeline is valid but cannot be planned (capability, guarantee, planning).
    pub const PLANNING_FAILED: i32 = 3;
    /// Running the plan failed.
    pub const EXECUTION_FAILED: i32 = 4;
    /// `etlantic diff` of two contract versions found at least one breaking change.
    pub const BREAKING_CHANGES: i32 = 5;

    /// The exit code for an error, from the phase of its first error diagnostic.
    pub fn for_error(e: &etlantic_core::Error) -> i32 {
        use etlantic_core::diagnostics::Phase::*;
        match e.phase() {
            Some(Capability | Guarantee | Planning) => PLANNING_FAILED,
            Some(Execution | Checkpoint) => EXECUTION_FAILED,
            _ => INVALID_PIPELINE,
        }
    }
}
