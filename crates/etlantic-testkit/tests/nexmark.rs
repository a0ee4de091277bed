//! Every Nexmark query pipeline (`crates/etlantic-testkit/nexmark/`) on the streaming
//! runtime, fed by the `nexmark://` generator in many micro-batches, equals its reference
//! SQL run by DataFusion in batch over the same generated events (as multisets) — with
//! the operators' state in memory, and in the disk store (RocksDB).

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::display::array_value_to_string;
use datafusion::prelude::SessionContext;
use etlantic_core::plugin::{ReadLimit, Source, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_plan::Project;
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use etlantic_sinks::memory::MemorySink;
use etlantic_sources::nexmark::NexmarkSource;
use etlantic_testkit::nexmark::{profile_spaced, Query, QUERIES};

const EVENTS: u64 = 60_000;
const PER_BATCH: u64 = 5_000;
/// 1 ms of event time per event: 60 s in all, so that 10-second windows close.
const EVENT_GAP_US: u64 = 1_000;

/// Every value of every row as text, sorted.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, i).unwrap())
                .collect();
            out.push(cells.join("|"));
        }
    }
    out.sort();
    out
}

/// All the events of one generator stream, read in one range.
async fn generated(asset: &str, schema: SchemaRef) -> Vec<RecordBatch> {
    let uri = format!("nexmark://{asset}?events_per_batch={EVENTS}&max_events={EVENTS}&event_gap_us={EVENT_GAP_US}&start_ms=0");
    let mut s = NexmarkSource::new(SourceContext {
        storage_options: Default::default(),
        asset: asset.into(),
        uri: BindingUri::parse(&uri).unwrap(),
        schema,
        contract: None,
        root: ".".into(),
        mode: ExecutionMode::Streaming,
        state: None,
    })
    .unwrap();
    let end = s
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    s.read(None, &end).await.unwrap().batches
}

/// The query's output rows with its state in `store`, its reference's, and the rows its
/// stream-stream join released for having met a unique side's row (`None`: no join with
/// a unique side).
async fn run(q: &Query, store: &str) -> (Vec<String>, Vec<String>, Option<u64>) {
    let dir = tempfile::tempdir().unwrap();
    // The tests of both stores run at once in this process: a sink each.
    let sink = format!("nexmark_{}_{store}_{}", q.name, std::process::id());
    std::fs::write(dir.path().join("pipeline.yaml"), q.pipeline).unwrap();
    std::fs::write(
        dir.path().join("profile.yaml"),
        profile_spaced(
            q,
            EVENTS,
            PER_BATCH,
            EVENT_GAP_US,
            &format!("memory://{sink}"),
        )
        .replace(
            "mode: streaming\n",
            &format!("mode: streaming\nstate_store: {store}\n"),
        ),
    )
    .unwrap();
    let project = Project::load(
        &dir.path().join("pipeline.yaml"),
        Some(&dir.path().join("profile.yaml")),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", q.name));
    etlantic_datafusion::link();
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .unwrap_or_else(|e| panic!("{}: {e}", q.name));

    // The reference: DataFusion SQL over the same events.
    let ctx = SessionContext::new();
    for s in &plan.sources {
        let schema = plan.asset_contract(&s.asset).unwrap().arrow_schema();
        let batches = generated(&s.asset, schema.clone()).await;
        let table = datafusion::datasource::MemTable::try_new(schema, vec![batches]).unwrap();
        ctx.register_table(s.asset.as_str(), std::sync::Arc::new(table))
            .unwrap();
    }
    let want = rows(
        &ctx.sql(q.reference_sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", q.name))
            .collect()
            .await
            .unwrap(),
    );

    MemorySink::clear(&sink);
    let opts = StreamingOptions::new(dir.path(), dir.path().join("chk"));
    let mut query = StreamingQuery::start(&plan, opts)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", q.name));
    let batches = query.process_all_available().await.unwrap();
    assert!(
        batches >= EVENTS / PER_BATCH,
        "{}: {batches} micro-batches",
        q.name
    );
    // The current result: every row written in append mode, the last table in complete.
    let got = MemorySink::rows(&sink);
    MemorySink::clear(&sink);
    let progress = std::fs::read_to_string(dir.path().join("chk/progress.jsonl")).unwrap();
    let released = progress
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .flat_map(|p| {
            let ops = p["stateOperators"].as_array().cloned().unwrap_or_default();
            ops.into_iter()
                .filter_map(|op| op["customMetrics"]["numRowsReleasedByUniqueKey"].as_u64())
        })
        .reduce(|a, b| a + b);
    (rows(&got), want, released)
}

/// Every query on `store` equals its reference.
async fn every_query_on(store: &str) {
    for q in QUERIES {
        let (got, want, released) = run(q, store).await;
        assert!(!want.is_empty(), "{}: the reference has rows", q.name);
        assert_eq!(got.len(), want.len(), "{} on {store}: row count", q.name);
        assert!(got == want, "{} on {store}: rows differ", q.name);
        println!(
            "{} on {store}: {} rows equal; rows released by a unique key: {released:?}",
            q.name,
            got.len()
        );
        // The joins of q3 (persons' primary key), q4 (auctions' primary key) and q8 (two
        // window aggregations, unique per group and window) have a unique side, and it
        // takes effect.
        if ["q3", "q4", "q8"].contains(&q.name) {
            assert!(released.is_some_and(|n| n > 0), "{}: {released:?}", q.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nexmark_query_equals_its_reference_sql() {
    every_query_on("memory").await;
}

#[cfg(feature = "disk-state")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_disk_store_every_nexmark_query_equals_its_reference_sql() {
    std::hint::black_box(&etlantic_rocksdb::DiskStoreProvider);
    every_query_on("disk").await;
}
