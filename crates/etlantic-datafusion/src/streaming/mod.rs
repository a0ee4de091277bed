//! The micro-batch streaming runtime, with Spark Structured Streaming's semantics.
//!
//! - [`query`]: the driver ([`StreamingQuery`]): triggers, the batch protocol, recovery;
//! - [`checkpoint`]: Spark's checkpoint layout, atomic writes;
//! - [`watermark`]: event-time watermarks (min/max policy, never backwards);
//! - [`operators`]: window/group aggregation and dedup with state, late-row handling;
//! - [`accumulators`]: aggregate state with Spark's result types;
//! - [`program`] and [`stateless`]: how a plan's steps run per micro-batch;
//! - [`progress`]: `StreamingQueryProgress`-shaped records.

pub mod accumulators;
pub mod checkpoint;
pub mod operators;
pub mod program;
pub mod progress;
pub mod query;
pub mod stateless;
pub mod watermark;

pub use query::{
    compatibility_fingerprint, FailPoint, ProgressListener, SecretResolver, StreamingOptions,
    StreamingQuery,
};
