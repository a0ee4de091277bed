//! # etlantic-core
//!
//! The model and the plugin contract of ETLantic-rs. No engine dependencies.
//!
//! - [`contract`]: ODCS v3 data contracts (through the `odcs` crate) and the one mapping
//!   of ODCS types to Arrow types;
//! - [`model`]: pipelines (assets, sources, transformations with typed ports, sinks),
//!   from YAML or the Rust builder;
//! - [`ir`]: the portable transformation IR, DTCS's `dtcs.transform-plan/2` (through the
//!   `dtcs` crate), with ETLantic's documented streaming extensions;
//! - [`profile`]: execution profiles binding assets to URIs;
//! - [`plugin`]: source, sink, backend and transformation plugin traits, registered with
//!   `inventory`;
//! - [`streaming`] and [`guarantee`]: streaming semantics and delivery guarantees as data;
//! - [`diagnostics`]: stable codes, rendered as text, JSON and SARIF;
//! - [`durable`]: atomic, durable file writes for checkpoints and connector logs;
//! - [`storage`]: where checkpoints, logs and file outputs keep their bytes (local disk,
//!   a power-cut simulator for tests, object stores later);
//! - [`untrusted`]: running third-party decoders on bytes from disk or users.
#![warn(missing_docs)]

pub mod canonical;
pub mod contract;
pub mod data;
pub mod diagnostics;
pub mod durable;
pub mod faults;
pub mod guarantee;
pub mod ir;
pub mod model;
pub mod plugin;
pub mod profile;
pub mod read_progress;
pub mod storage;
pub mod streaming;
pub mod untrusted;
pub mod uri;

pub use diagnostics::{Diagnostic, Diagnostics, Error, Result};

// Re-exported so plugin crates use the same versions.
pub use arrow;
pub use async_trait::async_trait;
pub use inventory;
