//! # etlantic-sinks
//!
//! Sink plugins of ETLantic. Each connector lives in its own module behind its own cargo
//! feature and registers itself with
//! `inventory::submit! { etlantic_core::plugin::SinkRegistration(&Provider) }`.
//!
//! | scheme | module | feature | batch | streaming | output modes | protocol |
//! |---|---|---|---|---|---|---|
//! | `file://` | [`files`] | `files` | yes | yes (a directory) | append, complete | idempotent by batch id |
//! | `console://` | [`console`] | `console` | yes | yes | append, update, complete | plain append |
//! | `memory://<name>` | [`memory`] | `memory` | yes | yes | append, update, complete | idempotent by batch id |
//! | `foreach://<name>` | [`foreach`] | `foreach` | yes | yes | append, update, complete | plain append (a user callback) |
//! | `iceberg://<namespace>/<table>` | `iceberg` | `iceberg` | no | yes | append | idempotent by batch id (query and batch id in the snapshot summary, checked on replay) |
//! | `postgres://`, `postgresql://`, `sqlite://` | [`sql`] | `sql` | yes | yes | append, complete; update with `mode=upsert` | transactional (one transaction per batch with a progress row) |
//! | `kafka://<servers>/<topic>` | `kafka` | `kafka` | yes | yes | append, update | transactional (exactly-once with a transactional Kafka broker); `transactions=false`: plain append |
//! | `delta://<path>` | `delta` | `delta` | yes | yes | append, update (`mode=merge`), complete | idempotent by batch id (Delta `txn` app id = query id, version = batch id) |
//!
//! The quarantine output is the runtime's (`etlantic_runtime::quarantine`), not a sink.
//!
//! `docs/connectors.md` gives each connector's binding, commit protocol and what its tests
//! show (and cannot show).
//!
//! Registration happens when the crate is linked into the final binary: a program or
//! test that reaches the providers only through the registry
//! (`etlantic_core::plugin::sink_provider("file")`) must still name the crate,
//! e.g. with `use etlantic_sinks as _;`.
#![warn(missing_docs)]

#[cfg(feature = "console")]
pub mod console;
#[cfg(feature = "delta")]
pub mod delta;
#[cfg(feature = "delta")]
mod delta_store;
#[cfg(feature = "files")]
pub mod files;
#[cfg(feature = "foreach")]
pub mod foreach;
#[cfg(feature = "iceberg")]
pub mod iceberg;
#[cfg(feature = "iceberg")]
pub mod iceberg_store;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "sql")]
pub mod sql;

#[cfg(feature = "files")]
pub use files::read_committed;
