//! The micro-batch streaming runtime, with Spark Structured Streaming's semantics.
//!
//! - [`query`]: the driver ([`StreamingQuery`]): triggers, the batch protocol, recovery;
//! - [`checkpoint`]: the checkpoint directory, atomic writes; [`batch_log`]: its log of
//!   micro-batch offsets and commits;
//! - [`watermark`]: event-time watermarks (min/max policy, never backwards);
//! - [`operators`]: window/group aggregation and dedup with state, late-row handling;
//! - [`join`]: stream-stream joins (both sides in state, evicted by the watermark);
//! - [`static_source`]: static sources, the bounded side of stream-static joins;
//! - [`processor`]: custom stateful processors (`process` steps: typed state, timers, TTL);
//! - [`ttl`]: state TTL in processing time (group-bys, dedup, joins without a watermark);
//! - [`clock`]: the processing-time clock (injectable for tests);
//! - [`accumulators`]: aggregate state with Spark's result types; `groups`: the groups of
//!   window and plain aggregations, in buckets by window;
//! - [`program`] and [`stateless`]: how a plan's steps run per micro-batch ([`slots`]:
//!   the inputs of plans planned once and run per micro-batch);
//! - [`progress`]: `StreamingQueryProgress`-shaped records.

pub mod accumulators;
pub mod batch_log;
pub mod checkpoint;
pub mod clock;
mod groups;
mod ipc_guard;
pub mod join;
pub mod operators;
pub mod processor;
pub mod program;
pub mod progress;
pub mod query;
pub mod slots;
pub mod state_log;
pub mod stateless;
pub mod static_source;
pub mod ttl;
pub mod watermark;

pub use clock::{Clock, ManualClock};
pub use query::{
    compatibility_fingerprint, FailPoint, ProgressListener, SecretResolver, StreamingOptions,
    StreamingQuery,
};
