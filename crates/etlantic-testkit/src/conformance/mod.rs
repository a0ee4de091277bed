//! The Spark conformance runner: scenarios recorded from Apache Spark
//! (`shared/conformance/spark/`, format in its FORMAT.md) run on the embedded streaming
//! runtime, batch by batch, compared with Spark's outputs and watermarks; [`on_spark`]
//! runs the same scenarios through ETLantic's plan on real Spark.

#[cfg(feature = "spark")]
pub mod on_spark;
pub mod runner;
pub mod scenario;
pub mod to_pipeline;

pub use runner::{run_dir, run_scenario, ScenarioOutcome};
