//! What the DataFusion backend executes, as the planner reads it.
//!
//! The lists are the single source of truth: a test compiles every listed function and
//! action, so the backend never claims something it would reject.

use etlantic_core::ir::action::{DEDUP_WITHIN_WATERMARK, PROCESS, WINDOW_AGGREGATE};
use etlantic_core::plugin::{BackendCapabilities, RegionKind, StreamingSupport};

/// The backend's name in profiles and plans.
pub const BACKEND_NAME: &str = "datafusion";

/// DTCS profiles implemented completely (every required action, operator and function).
pub const SUPPORTED_PROFILES: &[&str] = &[
    "dtcs:profile/portable-relational-kernel/1",
    "dtcs:profile/portable-relational-kernel/2",
    "dtcs:profile/portable-relational/1",
    "dtcs:profile/portable-relational/2",
];

/// Action ids (DTCS and ETLantic extensions), canonical: their aliases
/// (`etlantic_core::ir::canonical_action_id`) are supported with them.
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
    "dtcs:explode",
    WINDOW_AGGREGATE,
    DEDUP_WITHIN_WATERMARK,
    PROCESS,
];

/// Aggregate function ids (valid in `dtcs:aggregate` and `etlantic:window_aggregate`;
/// `dtcs:min`/`dtcs:max` with two or more arguments are also scalar `least`/`greatest`).
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

/// Every function id: the scalar functions of the expression compiler, the aggregates,
/// then the window functions of `dtcs:with_fields`.
pub fn supported_functions() -> Vec<String> {
    crate::expr::functions_list()
        .iter()
        .chain(SUPPORTED_AGGREGATES)
        .chain(etlantic_core::ir::WINDOW_FUNCTIONS)
        .map(|s| s.to_string())
        .collect()
}

/// The capabilities the backend declares: batch regions, and streaming regions run by
/// the embedded micro-batch runtime (every late-event policy, quarantine of bad records).
pub fn capabilities() -> BackendCapabilities {
    BackendCapabilities {
        region_kinds: vec![RegionKind::Batch, RegionKind::Streaming],
        dtcs_profiles: SUPPORTED_PROFILES.iter().map(|s| s.to_string()).collect(),
        actions: SUPPORTED_ACTIONS.iter().map(|s| s.to_string()).collect(),
        functions: supported_functions(),
        sql_engines: vec![BACKEND_NAME.to_string()],
        continuous: false,
        location_schemes: vec![],
        streaming: StreamingSupport {
            allowed_lateness: true,
            late_policies: ["drop", "accept", "quarantine", "side_output"]
                .map(String::from)
                .to_vec(),
            quarantine: true,
            whole_query: false,
            io_schemes: vec![],
            actions: vec![],
        },
    }
}
