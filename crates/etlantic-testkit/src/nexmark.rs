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

/// The queries implemented: every query of the Nexmark suite that reads only the event
/// streams (q0–q5, q7, q8; q6 averages each seller's last 10 closing prices, a window
/// over rows that no stateful step here keeps).
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
    Query {
        name: "q4",
        pipeline: include_str!("../nexmark/q4.yaml"),
        reference_sql: include_str!("../nexmark/q4.sql"),
    },
    Query {
        name: "q5",
        pipeline: include_str!("../nexmark/q5.yaml"),
        reference_sql: include_str!("../nexmark/q5.sql"),
    },
    Query {
        name: "q7",
        pipeline: include_str!("../nexmark/q7.yaml"),
        reference_sql: include_str!("../nexmark/q7.sql"),
    },
    Query {
        name: "q8",
        pipeline: include_str!("../nexmark/q8.yaml"),
        reference_sql: include_str!("../nexmark/q8.sql"),
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
    profile_spaced(query, events, per_batch, 100, sink)
}

/// [`profile`] with `event_gap_us` of event time between consecutive events (the
/// default is 100 µs, Beam's 10 000 events/s): windowed queries need enough event time
/// for windows to close.
pub fn profile_spaced(
    query: &Query,
    events: u64,
    per_batch: u64,
    event_gap_us: u64,
    sink: &str,
) -> String {
    profile_with(
        query,
        "available_now",
        &format!(
            "events_per_batch={per_batch}&max_events={events}&event_gap_us={event_gap_us}&start_ms=0"
        ),
        sink,
    )
}

/// A streaming profile for `query` paced by the wall clock: `rate` events per second
/// from `start_ms` (epoch ms), `events` in all, the `trigger` given (e.g.
/// `processing_time 100 milliseconds`). Event time is arrival time, so the delay from an
/// output row's `date_time` to its sink is the end-to-end latency.
pub fn realtime_profile(
    query: &Query,
    trigger: &str,
    rate: u64,
    events: u64,
    start_ms: i64,
    sink: &str,
) -> String {
    let gap_us = (1_000_000 / rate.max(1)).max(1);
    profile_with(
        query,
        trigger,
        &format!(
            "events_per_batch={events}&max_events={events}&event_gap_us={gap_us}&start_ms={start_ms}&realtime=true"
        ),
        sink,
    )
}

fn profile_with(query: &Query, trigger: &str, source_params: &str, sink: &str) -> String {
    let pipeline: etlantic_core::model::Pipeline =
        serde_yaml::from_str(query.pipeline).expect("the query files parse");
    let mut p = format!("apiVersion: etlantic/v1\nkind: Profile\nname: nexmark\nmode: streaming\ntrigger: {trigger}\ncheckpoint: file://chk\nbindings:\n");
    for s in &pipeline.sources {
        p.push_str(&format!(
            "  {}: nexmark://{}?{source_params}\n",
            s.asset, s.asset
        ));
    }
    p.push_str(&format!("  out: {sink}\n"));
    p
}
