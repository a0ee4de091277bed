//! # etlantic-testkit
//!
//! Test harnesses for ETLantic-rs:
//! - [`conformance`]: the Spark conformance runner (`etlantic conformance spark DIR`);
//! - [`equivalence`]: the backend-equivalence runner and its corpus of portable cases;
//! - [`fuzz`]: the fuzz harnesses of `cargo xtask fuzz` (and of their regression tests);
//! - [`kit`]: the plugin kit, checking a source, sink or backend plugin against the
//!   invariants its trait states.
#![warn(missing_docs)]

pub mod conformance;
pub mod equivalence;
pub mod fuzz;
pub mod kit;
pub mod nexmark;
