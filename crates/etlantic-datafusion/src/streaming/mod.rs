//! The embedded streaming engine: how a streaming query's transformations run per
//! micro-batch under the runtime (`etlantic_runtime`), with Spark Structured Streaming's
//! semantics.
//!
//! - [`engine`]: [`DataFusionEngine`], the runtime's [`etlantic_runtime::engine`]
//!   implementation — compiles a plan into a program and runs it per micro-batch;
//! - [`program`]: the executable form: each transformation split into runs of stateless
//!   steps ([`stateless`], planned once on DataFusion; [`slots`]: their inputs) and
//!   stateful operators;
//! - [`operators`]: window/group aggregation and dedup with state, late-row handling;
//! - [`join`]: stream-stream joins (both sides in state, evicted by the watermark);
//! - [`processor`]: custom stateful processors (`process` steps: typed state, timers, TTL);
//! - `store_layout`: the byte layouts of operators' state in a state store (`state_store:
//!   disk`);
//! - [`ttl`]: state TTL in processing time (group-bys, dedup, joins without a watermark);
//! - [`accumulators`]: aggregate state with Spark's result types; `groups`: the groups of
//!   window and plain aggregations, in buckets by window.

pub mod accumulators;
pub mod engine;
mod groups;
pub mod join;
pub mod operators;
pub mod processor;
pub mod program;
pub mod slots;
pub mod stateless;
mod store_layout;
pub mod ttl;

pub use engine::DataFusionEngine;
