//! # etlantic-sources
//!
//! Source plugins of ETLantic. Each connector lives in its own module behind its own
//! cargo feature and registers itself with
//! `inventory::submit! { etlantic_core::plugin::SourceRegistration(&Provider) }`, so
//! linking this crate with a feature makes its URI scheme available to profiles.
//!
//! | scheme | module | feature | bounded | unbounded | guarantee |
//! |---|---|---|---|---|---|
//! | `file://` | [`files`] | `files` | yes | directories | replayable |
//! | `memory://<name>` | [`memory`] | `memory` | yes | yes | replayable |
//! | `rate://` | [`rate`] | `generator` | no | yes | replayable |
//! | `nexmark://persons\|auctions\|bids` | [`nexmark`] | `generator` | no | yes | replayable |
//! | `postgres://`, `postgresql://`, `sqlite://` (`?table=` or `?query=`) | [`sql`] | `sql` | yes | no (static sides of joins only) | replayable while the table does not change |
//! | `kafka://<servers>/<topics>` | `kafka` | `kafka` | yes (to the high watermarks) | yes | replayable |
//! | `delta://<path>` | `delta` | `delta` | a snapshot (`version=N`) | the change data feed from `startingVersion` | replayable |
//!
//! Iceberg is a sink-side feature of `etlantic-sinks`. `docs/connectors.md` gives each
//! connector's binding and guarantees.
//!
//! Every source decodes contract-aware through [`decode`]: a record that does not parse,
//! has a value of the wrong type, misses a required field or breaks a field constraint
//! is returned as a [`etlantic_core::data::RejectedRecord`] (`ETL701`..`ETL704`) with its
//! position and raw text, never dropped; good records go on in batches of exactly the
//! contract's schema.
//!
//! Registration happens when the crate is linked into the final binary: a program or
//! test that reaches the providers only through the registry
//! (`etlantic_core::plugin::source_provider("file")`) must still name the crate,
//! e.g. with `use etlantic_sources as _;`.
#![warn(missing_docs)]

pub mod decode;
#[cfg(feature = "delta")]
pub mod delta;
#[cfg(feature = "files")]
pub mod files;
#[allow(dead_code)]
mod fsutil;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "generator")]
pub mod nexmark;
#[cfg(feature = "generator")]
pub mod rate;
#[cfg(feature = "sql")]
pub mod sql;
