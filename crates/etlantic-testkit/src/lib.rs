//! # etlantic-testkit
//!
//! Test harnesses for ETLantic-rs:
//! - [`conformance`]: the Spark conformance runner (`etlantic conformance spark DIR`);
//! - [`equivalence`]: the backend-equivalence runner and its corpus of portable cases.
#![warn(missing_docs)]

pub mod conformance;
#[cfg(feature = "equivalence")]
pub mod equivalence;
pub mod nexmark;
