//! # etlantic-polars
//!
//! ETLantic's batch backend on [Polars](https://pola.rs): [`PolarsBackend`], registered
//! as the `polars` backend, runs batch regions whose steps are portable DTCS transform
//! plans (`dtcs.transform-plan/2`), compiled to Polars lazy queries, and registered
//! engine-specific implementations for `polars`.
//!
//! ## The handover
//!
//! ETLantic's tables are arrow-rs record batches; Polars has its own Arrow
//! implementation. Columns cross over through the Arrow C data interface, without
//! copying buffers ([`interop`]): arrow-rs exports each column (`FFI_ArrowArray` +
//! `FFI_ArrowSchema`), the two C structs move into `polars-arrow`'s identical ones and
//! Polars imports them as a `Series`. Results take the opposite way and are then cast to
//! exactly the schema the backend promised. Polars holds fewer physical types than
//! Arrow, so narrow integers, `Float16`, small decimals, `Date64` and second-unit times
//! are widened on the way in (values unchanged) and cast back on the way out; types it
//! cannot hold here (times, intervals, lists, structs, maps, 256-bit decimals) are
//! refused with `ETL501` while planning.
//!
//! ## Types
//!
//! The output schema of a portable step is the reference engine's: [`PolarsBackend`]'s
//! `output_schema` checks that it compiles the step and then returns what
//! `etlantic_datafusion::DataFusionBackend` computes for it (DataFusion's type rules are
//! the reference rules of portable plans), and `execute_batch` returns tables in exactly
//! that schema. Inside a step, every expression computes in the same class of type as
//! there (integers, exact decimals, floating point, strings, ...).
//!
//! ## Semantics
//!
//! The same as the reference engine's, action by action (see [`capabilities`] for what is
//! declared, and the `actions` and `expr` modules for the definitions):
//!
//! - Expressions use SQL's three-valued logic (Kleene `&&`/`||`, comparisons with null
//!   are null, a filter keeps the rows whose predicate is true). Integer arithmetic is
//!   checked (overflow and division by zero are errors; `/` truncates, `%` keeps the
//!   dividend's sign), decimals are exact, `+` on strings concatenates. Failing
//!   functions fail only on rows whose value is used (`case_when` branches, later
//!   `coalesce` arguments and the right side of `&&`/`||` are guarded).
//! - Functions have DTCS's definitions: `concat` is null when an argument is, `substr`
//!   counts characters from 0, `trim` strips Unicode white space, `round` rounds half
//!   away from zero and returns a decimal, `least`/`greatest` are null when an argument
//!   is, `lower`/`upper` map all of Unicode.
//! - Row order is explicit: every relation carries a hidden ordinal column, so a stable
//!   sort (nulls last by default), `limit`, `distinct` and `deduplicate` (first or last
//!   row per key), and the `first`/`last` aggregates follow the DTCS row order exactly;
//!   joins number their rows left-major, unions the target's rows first.
//! - Aggregation: null is an ordinary group key; `sum` of no values is null; without
//!   group columns there is exactly one row.
//! - Joins: same-named key pairs merge into one column (coalesced for right and full
//!   joins), other colliding columns are an error, semi and anti joins output the left
//!   columns, null keys never match unless `nullSafe`.
//!
//! Two documented differences from the reference engine remain. Floating-point `sum`
//! and `average` add the values one by one in row order, as the reference engine's
//! grouped aggregation does; its global (ungrouped) aggregation adds them in SIMD lanes,
//! so a global floating-point sum may differ in the last bits. And the right side of
//! `&&`/`||` is evaluated only on rows where the left side does not decide the result
//! (as PostgreSQL and SQLite do), where the reference engine evaluates it on a whole
//! batch: an error there (say, a division by zero that the left side guards against)
//! is not an error here.
//!
//! Polars runs on a thread of its own for every step: its engine must not block a Tokio
//! worker thread (it panics on a current-thread runtime), and a panic inside it becomes
//! an `ETL707` error.
//!
//! Errors are [`etlantic_core::Error`]s with stable codes: `ETL501` for what this backend
//! does not implement, `ETL206`/`ETL302`/`ETL209` for plan errors, `ETL707` for failures
//! while running (integer overflow, division by zero, ...). User input never panics.
#![warn(missing_docs)]

mod actions;
mod backend;
pub mod capabilities;
mod error;
mod expr;
pub mod interop;
mod plan;
mod relation;
mod types;

pub use backend::PolarsBackend;

/// The Polars version this crate is built with (re-exported so that plugins implementing
/// [`etlantic_core::plugin::TransformImpl`] for `polars` use the same one).
pub use polars;

static POLARS: PolarsBackend = PolarsBackend;

inventory::submit! { etlantic_core::plugin::BackendRegistration(&POLARS) }
