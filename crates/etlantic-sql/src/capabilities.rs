//! What the SQL backends execute, per dialect. A unit test compiles every listed action
//! and function, so a backend never claims what its compiler refuses.

use crate::dialect::Dialect;
use etlantic_core::plugin::{BackendCapabilities, RegionKind};

/// Actions both dialects compile, canonical (aliases are matched through
/// `etlantic_core::ir::canonical_action_id`). The field actions `dtcs:lowercase` and
/// `dtcs:uppercase` are assignments of `dtcs:lower`/`dtcs:upper`, which are not
/// declared: DTCS case mapping is full Unicode (`ß` → `SS`), SQLite maps ASCII only and
/// PostgreSQL maps character by character by the database's locale.
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

/// Scalar functions both dialects compile.
pub const FUNCTIONS: &[&str] = &[
    "dtcs:concat",
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

/// Scalar functions only PostgreSQL computes exactly (SQLite has no `floor`/`ceil`
/// before 3.44). `lower`/`upper` are declared by neither dialect (see above).
pub const POSTGRES_ONLY_FUNCTIONS: &[&str] = &["dtcs:floor", "dtcs:ceil"];

/// Aggregate functions only PostgreSQL has (SQLite has no variance or standard
/// deviation).
pub const POSTGRES_ONLY_AGGREGATES: &[&str] = &["dtcs:variance", "dtcs:stddev"];

/// Aggregate functions (both dialects).
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
];

/// The capabilities of a dialect's backend.
pub fn capabilities(dialect: Dialect) -> BackendCapabilities {
    let pg = dialect == Dialect::Postgres;
    let actions: Vec<String> = ACTIONS.iter().map(|s| s.to_string()).collect();
    let mut functions: Vec<String> = FUNCTIONS
        .iter()
        .chain(AGGREGATES)
        .map(|s| s.to_string())
        .collect();
    // Window functions of `dtcs:with_fields` (SQLite has them since 3.25).
    functions.extend(
        etlantic_core::ir::WINDOW_FUNCTIONS
            .iter()
            .map(|s| s.to_string()),
    );
    if pg {
        functions.extend(
            POSTGRES_ONLY_FUNCTIONS
                .iter()
                .chain(POSTGRES_ONLY_AGGREGATES)
                .map(|s| s.to_string()),
        );
    }
    BackendCapabilities {
        region_kinds: vec![RegionKind::Sql],
        dtcs_profiles: vec![],
        actions,
        functions,
        sql_engines: vec![],
        continuous: false,
        location_schemes: match dialect {
            Dialect::Postgres => vec!["postgres".into(), "postgresql".into()],
            Dialect::Sqlite => vec!["sqlite".into()],
        },
        streaming: Default::default(),
    }
}
