//! # etlantic-spark-compat
//!
//! Running ETLantic plans on Apache Spark through its Spark Connect protocol.
//!
//! - [`local`]: a local Spark Connect server from the `pyspark` package (tests, trying a
//!   pipeline on Spark without a cluster).
#![warn(missing_docs)]

pub mod local;
