//! ETLantic's runtime: what runs a pipeline around the engine that transforms its rows.
//!
//! It owns, for every engine alike:
//!
//! - [`driver`]: the micro-batch driver ([`StreamingQuery`]) — triggers, the batch
//!   protocol, recovery — which also runs batch plans, as one bounded micro-batch with
//!   no checkpoint, on the plan's regions ([`regions`]);
//! - [`connect`]: opening the sources and sinks of a plan (batch and streaming alike);
//! - [`checkpoint`]: the checkpoint (micro-batch log, state log, state files, lock);
//! - [`watermark`] and [`clock`]: event-time watermarks and the processing-time clock;
//! - [`quality`]: the contracts' quality rules where data crosses a contract;
//! - [`quarantine`] and [`secrets`]: rejected records as JSON lines, with secret values
//!   scrubbed from everything written or reported;
//! - [`progress`]: the typed progress record ([`progress::QueryProgress`]), serialised in
//!   Spark's `StreamingQueryProgress` shape, and [`report`]: the run report built from
//!   a run's progress records;
//! - [`state_store`]: the trait of versioned key-value stores that keep an operator's
//!   state on disk, checkpointed incrementally;
//! - [`static_source`]: static tables joined to streams;
//! - [`status`]: the running query's status record and what `etlantic status` reads;
//! - [`whole_query`]: queries a backend runs whole in another system (Spark), whose
//!   progress the runtime relays.
//!
//! Engines plug in through [`engine::StreamingEngine`]: they compile a plan's
//! transformations into a [`engine::MicroBatchProgram`] that runs each micro-batch and
//! exposes its operators' state to the checkpoint.

pub mod checkpoint;
pub mod clock;
pub mod connect;
pub mod driver;
pub mod engine;
pub mod progress;
pub mod quality;
pub mod quarantine;
pub mod regions;
pub mod report;
pub mod secrets;
pub mod state_store;
pub mod static_source;
pub mod status;
pub mod watermark;
pub mod whole_query;

pub use clock::{Clock, ManualClock};
pub use driver::{
    compatibility_fingerprint, BatchOptions, FailPoint, ProgressListener, StreamingOptions,
    StreamingQuery,
};
pub use secrets::SecretResolver;
