//! What the Polars backend executes, as the planner reads it.
//!
//! The lists are the single source of truth and list only what the compiler computes
//! with DTCS semantics (the planner fails closed on everything else); a test compiles
//! every listed action and function.

use etlantic_core::ir::action::DEDUP_WITHIN_WATERMARK;
use etlantic_core::plugin::{BackendCapabilities, RegionKind};

/// The backend's name in profiles and plans.
pub const BACKEND_NAME: &str = "polars";

/// Action ids, canonical: their aliases (`etlantic_core::ir::canonical_action_id`) are
/// supported with them. `etlantic:deduplicate_within_watermark` is deduplicate-first on
/// a bounded input.
pub const SUPPORTED_ACTIONS: &[&str] = &[
    "dtcs:filter",
    "dtcs:project",
    "dtcs:with_fields",
    "dtcs:drop_fields",
    "dtcs:rename_fields",
    "dtcs:join",
    "dtcs:union",
    "dtcs:aggregate",
    "dtcs:sort",
    "dtcs:limit",
    "dtcs:distinct",
    "dtcs:deduplicate",
    DEDUP_WITHIN_WATERMARK,
];

/// Aggregate function ids (valid in `dtcs:aggregate`; `dtcs:min`/`dtcs:max` with two or
/// more arguments are also the scalar `least`/`greatest`).
pub const SUPPORTED_AGGREGATES: &[&str] = &[
    "dtcs:count_all",
    "dtcs:count",
    "dtcs:count_distinct",
    "dtcs:sum",
    "dtcs:average",
    "dtcs:min",
    "dtcs:max",
    "dtcs:first",
    "dtcs:last",
    "dtcs:variance",
    "dtcs:stddev",
];

/// Every function id: the scalar functions of the expression compiler, then the
/// aggregates.
pub fn supported_functions() -> Vec<String> {
    crate::expr::FUNCTIONS
        .iter()
        .chain(SUPPORTED_AGGREGATES)
        .map(|s| s.to_string())
        .collect()
}

/// The capabilities the backend declares: batch regions only, no complete DTCS profile,
/// no SQL steps.
pub fn capabilities() -> BackendCapabilities {
    BackendCapabilities {
        region_kinds: vec![RegionKind::Batch],
        dtcs_profiles: vec![],
        actions: SUPPORTED_ACTIONS.iter().map(|s| s.to_string()).collect(),
        functions: supported_functions(),
        sql_engines: vec![],
        continuous: false,
        location_schemes: vec![],
        streaming: Default::default(),
    }
}
