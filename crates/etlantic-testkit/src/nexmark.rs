//! The Nexmark queries as ETLantic pipelines, with their reference SQL.
//!
//! Each query is a pipeline file in `crates/etlantic-testkit/nexmark/` over the assets
//! `bids`, `auctions` and `persons` (fed by the `nexmark://` generator, see
//! `etlantic_sources::nexmark`) and one sink asset `out`, plus a DataFusion SQL query that
//! computes the same result in batch over the same generated events. The test
//! `tests/nexmark.rs` runs each query on the streaming runtime and compares the two.

use std::path::PathBuf;

/// One Nexmark query.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// `q0`, `q1`, ...
    pub name: &'static str,
    /// The pipeline (YAML).
    pub pipeline: &'static str,
    /// The same query as DataFusion SQL over tables `bids`, `auctions`, `persons`.
    pub reference_sql: &'static str,
}

/// The queries implemented so far.
pub const QUERIES: &[Query] = &[
    Query {
        name: "q0",
        pipeline: include_str!("../nexmark/q0.yaml"),
        reference_sql: include_str!("../nexmark/q0.sql"),
    },
    Query {
        name: "q1",
        pipeline: include_str!("../nexmark/q1.yaml"),
        reference_sql: include_str!("../nexmark/q1.sql"),
    },
    Query {
        name: "q2",
        pipeline: include_str!("../nexmark/q2.yaml"),
        reference_sql: include_str!("../nexmark/q2.sql"),
    },
    Query {
        name: "q3",
        pipeline: include_str!("../nexmark/q3.yaml"),
        reference_sql: include_str!("../nexmark/q3.sql"),
    },
];

/// The directory of the query files.
pub fn query_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("nexmark")
}

/// A streaming profile for `query`: its sources bound to the generator streams of their
/// names with `events` events in all and `per_batch` per micro-batch, and `out` to the
/// binding `sink` (e.g. `memory://name`).
pub fn profile(query: &Query, events: u64, per_batch: u64, sink: &str) -> String {
    let pipeline: etlantic_core::model::Pipeline =
        serde_yaml::from_str(query.pipeline).expect("the query files parse");
    let mut p = "apiVersion: etlantic/v1\nkind: Profile\nname: nexmark\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n".to_string();
    for s in &pipeline.sources {
        p.push_str(&format!(
            "  {}: nexmark://{}?events_per_batch={per_batch}&max_events={events}&start_ms=0\n",
            s.asset, s.asset
        ));
    }
    p.push_str(&format!("  out: {sink}\n"));
    p
}
