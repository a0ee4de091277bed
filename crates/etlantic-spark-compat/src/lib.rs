//! # etlantic-spark-compat
//!
//! Running ETLantic plans on Apache Spark through its Spark Connect protocol.
//!
//! - [`backend`]: [`SparkBackend`], batch regions compiled into Spark Connect plans
//!   ([`compile`], [`expr`]) and run on a Spark Connect endpoint; what it declares is in
//!   [`capabilities`].
//! - [`streaming`]: a planned streaming pipeline run as a Spark Structured Streaming
//!   query (JSON-lines, CSV and Parquet file sources, watermarks, window aggregations,
//!   deduplication, joins; Spark's file sink or a memory sink read back as Arrow),
//!   driven like a Spark user drives one (progress, processAllAvailable, stop).
//! - [`local`]: a local Spark Connect server from the `pyspark` package (tests, trying a
//!   pipeline on Spark without a cluster).
#![warn(missing_docs)]

pub mod backend;
pub mod capabilities;
pub mod compile;
pub mod convert;
pub mod expr;
pub mod local;
pub mod streaming;
pub mod whole_query;

pub use backend::SparkBackend;
