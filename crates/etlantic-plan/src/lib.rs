//! # etlantic-plan
//!
//! Validation phases, the planner, the PipelinePlan, its fingerprint, `explain` and `diff`.
//!
//! ```text
//! Project (pipeline + profile) --plan()--> PipelinePlan (canonical JSON, sha256)
//!                                            |-- explain: text / Mermaid
//!                                            '-- diff: two plans
//! ```
//!
//! Validation runs in phases — structural, reference, semantic, streaming, capability,
//! guarantee, policy — and stops at the first phase with an error. Every diagnostic has
//! a stable code (`etlantic_core::diagnostics::codes`).
#![warn(missing_docs)]

pub mod capability;
pub mod column_lineage;
pub mod diff;
pub mod event_time;
pub mod explain;
mod graph;
pub mod join_rules;
pub mod plan;
pub mod planner;
pub mod project;
pub mod schema;
pub mod state_rules;
pub mod stateful_chain;
pub mod streaming_rules;
pub mod watermark_rows;

pub use plan::PipelinePlan;
pub use planner::{plan, validate, PlanOutcome, DEFAULT_BACKEND};
pub use project::Project;
