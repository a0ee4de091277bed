//! # etlantic-datafusion
//!
//! ETLantic's embedded engine on [Apache DataFusion](https://datafusion.apache.org).
//!
//! - The **batch engine**: [`DataFusionBackend`], registered as the `datafusion` backend,
//!   runs batch regions — portable DTCS transform plans (`dtcs.transform-plan/2`,
//!   compiled to DataFusion logical plans), SQL steps, and registered engine-specific
//!   implementations.
//! - The **embedded streaming engine** ([`streaming`]): the stateful operators and the
//!   per-micro-batch programs the runtime (`etlantic_runtime`) drives, reusing the same
//!   plan compiler; registered with the runtime as [`streaming::DataFusionEngine`].
//!
//! ## Semantics
//!
//! - Expressions use SQL three-valued logic with DTCS functions (see
//!   [`capabilities::supported_functions`]); type errors are found while planning.
//! - Actions follow DTCS and ETLantic-py: a stable sort with nulls last, distinct and
//!   deduplicate keep the first row of each group at its position, joins merge same-named
//!   key columns and refuse other colliding columns, null is an ordinary group key, ...
//! - `etlantic:window_aggregate` computes epoch-aligned tumbling and sliding windows and
//!   gap-based session windows over a bounded input;
//!   `etlantic:deduplicate_within_watermark` is deduplicate-first in batch mode.
//! - Row order is tracked explicitly and computed only where a step depends on it.
//!
//! Errors are [`etlantic_core::Error`]s with stable codes (`ETL206` unknown column,
//! `ETL302` type mismatch, `ETL306` unknown function, `ETL501` unsupported, `ETL209`
//! missing parameter, `ETL707` engine failure). User input never panics.
#![warn(missing_docs)]

mod actions;
mod backend;
pub mod capabilities;
mod error;
mod expr;
mod plan;
mod relation;
mod session;
mod staged;
mod step;
pub mod streaming;
mod table;

pub use backend::DataFusionBackend;
pub use expr::expression_type;
pub use session::new_context;
pub use step::{plan_dataframe, sql_dataframe};

/// The DataFusion version this crate is built with (re-exported so that plugins use the
/// same one).
pub use datafusion;

inventory::submit! { etlantic_core::plugin::BackendRegistration(&DataFusionBackend) }
inventory::submit! { etlantic_runtime::engine::EngineRegistration(&streaming::DataFusionEngine) }

/// Keeps this crate's registrations — the `datafusion` backend and the embedded
/// streaming engine — in a program that reaches them only through the registries
/// (`etlantic_core::plugin::backend`, `etlantic_runtime::engine::engine`): a linker
/// drops the object files of a library nothing refers to, and their registrations with
/// them. Defined next to the registrations, so calling it refers to their object file.
#[inline(never)]
pub fn link() {
    std::hint::black_box(BACKEND_REGISTERED);
}

/// See [`link`].
static BACKEND_REGISTERED: &str = capabilities::BACKEND_NAME;
