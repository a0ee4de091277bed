//! # etlantic-testkit
//!
//! Test harnesses for ETLantic-rs:
//! - [`conformance`]: the Spark conformance runner (`etlantic conformance spark DIR`);
//! - later: the backend-equivalence runner, plugin conformance suites, fault injection.
#![warn(missing_docs)]

pub mod conformance;
