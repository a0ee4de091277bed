//! The backend-equivalence runner: one portable transformation, every backend that
//! declares the capability, equal results as multisets.
//!
//! The corpus is a directory of case files ([`case::Case`]): input tables, steps in
//! pipeline YAML syntax, expected rows. [`runner::Matrix::run`] runs each case on each
//! [`runner::BackendUnderTest`] and [`runner::Matrix::render`] prints the support
//! matrix. [`standard_backends`] lists the backends of this workspace: DataFusion
//! batch, the streaming runtime in one and in many micro-batches, Polars, SQLite, and
//! PostgreSQL when a URL is given.

pub mod case;
pub mod etlantic_py;
pub mod runner;

pub use case::Case;
pub use runner::{run_case, BackendUnderTest, Matrix, Outcome};

#[cfg(feature = "equivalence")]
use std::sync::Arc;

#[cfg(feature = "equivalence")]
/// The relative tolerance the SQLite backend documents for numeric results (its
/// decimals are binary floating point).
pub const SQLITE_TOLERANCE: f64 = 1e-9;

/// The corpus shipped with this crate.
pub fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("equivalence")
}

#[cfg(feature = "equivalence")]
/// The backends of the workspace; PostgreSQL runs against `postgres_url` and Spark
/// against the Spark Connect endpoint `spark_url` when given.
pub fn standard_backends(
    postgres_url: Option<&str>,
    spark_url: Option<&str>,
) -> etlantic_core::Result<Vec<BackendUnderTest>> {
    let mut v = vec![
        BackendUnderTest::batch(
            "datafusion",
            Arc::new(etlantic_datafusion::DataFusionBackend),
            0.0,
        ),
        BackendUnderTest::streaming(false),
        BackendUnderTest::streaming(true),
        BackendUnderTest::batch("polars", Arc::new(etlantic_polars::PolarsBackend), 0.0),
        BackendUnderTest::batch(
            "sqlite",
            Arc::new(etlantic_sql::SqlBackend::unbound(
                etlantic_sql::Dialect::Sqlite,
            )),
            SQLITE_TOLERANCE,
        ),
    ];
    if let Some(url) = postgres_url {
        v.push(BackendUnderTest::batch(
            "postgres",
            Arc::new(etlantic_sql::SqlBackend::postgres(url)?),
            0.0,
        ));
    }
    if let Some(url) = spark_url {
        v.push(BackendUnderTest::batch(
            "spark",
            Arc::new(etlantic_spark_compat::SparkBackend::new(url)),
            0.0,
        ));
    }
    Ok(v)
}
