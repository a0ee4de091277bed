//! What the Spark backend runs. The planner places a step here only when every action
//! and function it uses is listed; the unit tests compile every listed function, so the
//! backend never claims what its compiler refuses.
//!
//! Not declared (so the planner keeps them on the embedded engine, or refuses):
//! `cast`/`try_cast` and the `to_*` conversions (Spark's ANSI casts and DTCS's differ on
//! malformed text), date and time functions, `power`/`sqrt`,
//! `explode`; window aggregations and `dedup_within_watermark` in batch regions (they
//! run in streaming regions, see [`STREAMING_ACTIONS`]); ETLantic's accept, quarantine
//! and side-output late policies (Spark drops late rows); quarantine of bad records.

use etlantic_core::ir::action::{DEDUP_WITHIN_WATERMARK, WINDOW_AGGREGATE};
use etlantic_core::plugin::{BackendCapabilities, RegionKind, StreamingSupport};

/// Actions, canonical (aliases are matched through `etlantic_core::ir::canonical_action_id`).
pub const ACTIONS: &[&str] = &[
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
];

/// Scalar functions.
pub const FUNCTIONS: &[&str] = &[
    "dtcs:lower",
    "dtcs:upper",
    "dtcs:concat",
    "dtcs:concat_ws",
    "dtcs:substr",
    "dtcs:replace",
    "dtcs:length",
    "dtcs:contains",
    "dtcs:starts_with",
    "dtcs:ends_with",
    "dtcs:trim",
    "dtcs:ltrim",
    "dtcs:rtrim",
    "dtcs:coalesce",
    "dtcs:if_null",
    "dtcs:null_if",
    "dtcs:case_when",
    "dtcs:is_null",
    "dtcs:abs",
    "dtcs:round",
    "dtcs:least",
    "dtcs:greatest",
    "dtcs:in",
    "dtcs:between",
];

/// Aggregate functions.
pub const AGGREGATES: &[&str] = &[
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

/// Actions of streaming regions: the batch actions without the order-dependent ones
/// Spark refuses on a stream outside complete mode (the planner's streaming rules
/// already confine `sort` and `limit` there), plus the incremental operators.
pub const STREAMING_ACTIONS: &[&str] = &[
    WINDOW_AGGREGATE,
    DEDUP_WITHIN_WATERMARK,
    "dtcs:filter",
    "dtcs:project",
    "dtcs:with_fields",
    "dtcs:drop_fields",
    "dtcs:rename_fields",
    "dtcs:join",
    "dtcs:union",
    "dtcs:aggregate",
    "dtcs:distinct",
    "dtcs:deduplicate",
];

/// The backend's capabilities.
pub fn capabilities() -> BackendCapabilities {
    BackendCapabilities {
        region_kinds: vec![RegionKind::Batch, RegionKind::Streaming],
        dtcs_profiles: vec![],
        actions: ACTIONS.iter().map(|s| s.to_string()).collect(),
        functions: FUNCTIONS
            .iter()
            .chain(AGGREGATES)
            .map(|s| s.to_string())
            .collect(),
        sql_engines: vec![],
        continuous: false,
        // Regions run at a Spark Connect endpoint (`endpoints: {spark: sc://...}`).
        location_schemes: vec!["sc".into()],
        streaming: StreamingSupport {
            // Spark drops rows behind the watermark in its stateful operators.
            late_policies: vec!["drop".into()],
            // Spark's readers null or drop malformed records, or fail (FAILFAST, which
            // is what a streaming region uses): nothing reaches a quarantine.
            quarantine: false,
            // A Structured Streaming query reads its sources and writes its sinks.
            whole_query: true,
            io_schemes: vec!["file".into()],
            actions: STREAMING_ACTIONS.iter().map(|s| s.to_string()).collect(),
            // Spark closes a window when the watermark passes its end.
            allowed_lateness: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{compile, Scope};
    use arrow::datatypes::DataType;
    use etlantic_core::ir::Expr;

    /// Every declared scalar function compiles for arguments of the types it takes.
    #[test]
    fn every_declared_function_compiles() {
        let scope = Scope::plain([
            ("s", &DataType::Utf8),
            ("n", &DataType::Int64),
            ("b", &DataType::Boolean),
        ]);
        let call = |f: &str, args: &[&str]| Expr::Call {
            function: f.to_string(),
            args: args.iter().map(|a| Expr::col(*a)).collect(),
        };
        for f in FUNCTIONS {
            let args: &[&str] = match *f {
                "dtcs:lower" | "dtcs:upper" | "dtcs:length" | "dtcs:trim" | "dtcs:ltrim"
                | "dtcs:rtrim" => &["s"],
                "dtcs:concat" | "dtcs:concat_ws" | "dtcs:contains" | "dtcs:starts_with"
                | "dtcs:ends_with" => &["s", "s"],
                "dtcs:replace" => &["s", "s", "s"],
                "dtcs:substr" => &["s", "n", "n"],
                "dtcs:case_when" => &["b", "n", "n"],
                "dtcs:is_null" | "dtcs:abs" | "dtcs:round" => &["n"],
                "dtcs:between" => &["n", "n", "n"],
                "dtcs:in" => {
                    let list = Expr::Call {
                        function: "dtcs:list".into(),
                        args: vec![Expr::col("n"), Expr::col("n")],
                    };
                    let e = Expr::Call {
                        function: f.to_string(),
                        args: vec![Expr::col("n"), list],
                    };
                    compile(&e, &scope).unwrap_or_else(|e| panic!("{f}: {e:?}"));
                    continue;
                }
                _ => &["n", "n"],
            };
            compile(&call(f, args), &scope).unwrap_or_else(|e| panic!("{f}: {e:?}"));
        }
    }
}
