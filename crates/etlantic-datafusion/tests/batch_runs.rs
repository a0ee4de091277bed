//! A batch run is the streaming driver's one bounded micro-batch with no checkpoint: the
//! same sources, quality gates, quarantine, sinks and progress record as a streaming
//! micro-batch, on the plan's regions.

mod streaming_support;

use arrow::datatypes::SchemaRef;
use etlantic_core::diagnostics::Result;
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_runtime::{BatchOptions, StreamingQuery};
use etlantic_sinks::memory::MemorySink;
use etlantic_sources::memory::MemoryStream;
use serde_json::{json, Value};
use streaming_support::*;

/// A batch fixture: the events source (amount within [0, 100], users a, b or c) through
/// a pass-through transformation to two memory sinks.
fn batch_fixture(name: &str) -> Fixture {
    let mut fx = Fixture::new(name)
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .sink("copy", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.mode = ExecutionMode::Batch;
            p.trigger = None;
        });
    let mut events = contract("events", EVENTS);
    let props = events["schema"][0]["properties"].as_array_mut().unwrap();
    props[1]["quality"] = json!([{
        "id": "known", "metric": "invalidValues",
        "arguments": {"validValues": ["a", "b", "c"]}, "mustBe": 0
    }]);
    props[2]["logicalTypeOptions"] = json!({"minimum": 0, "maximum": 100});
    fx.builder = fx.builder.asset_inline("events", events);
    fx
}

fn push(fx: &Fixture, plan: &etlantic_plan::plan::PipelinePlan, rows: &[Value]) {
    let schema: SchemaRef = plan.asset_contract("events").unwrap().arrow_schema();
    MemoryStream::register(&fx.mem("events"), schema.clone());
    MemoryStream::push(&fx.mem("events"), to_batch(&schema, rows)).unwrap();
}

#[tokio::test]
async fn a_batch_run_is_one_bounded_micro_batch_without_a_checkpoint() {
    let fx = batch_fixture("batch_driver");
    let plan = fx.plan();
    push(
        &fx,
        &plan,
        &[
            ev(1, "a", 10),
            ev(2, "b", 200), // out of range: rejected while decoding
            ev(3, "z", 5),   // unknown user: taken out by the quality rule
            ev(4, "c", 60),
        ],
    );
    let mut q = StreamingQuery::start_batch(&plan, BatchOptions::new(fx.dir.path()))
        .await
        .unwrap();
    let progress = q.run_bounded().await.unwrap().to_json();
    assert_eq!(progress["batchId"], json!(0));
    assert_eq!(
        progress["id"],
        json!(plan.fingerprint),
        "the query id sinks see"
    );
    let source = &progress["sources"][0];
    assert_eq!(source["sourceId"], json!("events"));
    assert_eq!(
        source["numInputRows"],
        json!(3),
        "decoded rows: {progress:#}"
    );
    assert_eq!(source["numQuarantinedRows"], json!(2), "{progress:#}");
    assert_eq!(source["numRowsRuledOut"], json!(1), "{progress:#}");
    let sinks: Vec<(&str, i64)> = progress["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["sinkId"].as_str().unwrap(),
                s["numOutputRows"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sinks, vec![("out", 2), ("copy", 2)]);
    assert_eq!(progress["quarantinedRows"], json!(2));
    // Each sink got the rows as micro-batch 0 of the plan, once.
    for sink in ["out", "copy"] {
        let writes = MemorySink::snapshot(&fx.mem(sink));
        assert_eq!(writes.len(), 1, "{sink}");
        assert_eq!(writes[0].batch_id, 0);
        assert_eq!(writes[0].query_id, plan.fingerprint);
        assert_eq!(writes[0].table.num_rows(), 2);
    }
    // A batch run writes no checkpoint, and its quarantine records name no micro-batch.
    assert!(!fx.checkpoint().exists());
    let q_lines = fx.quarantined();
    assert_eq!(q_lines.len(), 2, "{q_lines:?}");
    for l in &q_lines {
        assert!(l.get("batch_id").is_none_or(Value::is_null), "{l}");
        assert_eq!(l["position"]["asset"], json!("events"));
    }
    // It runs once.
    let again = q.run_bounded().await.unwrap_err();
    assert!(again.to_string().contains("once"), "{again}");
}

#[tokio::test]
async fn a_batch_run_writes_its_sinks_even_when_its_sources_are_empty() {
    let fx = batch_fixture("batch_empty");
    let plan = fx.plan();
    MemoryStream::register(
        &fx.mem("events"),
        plan.asset_contract("events").unwrap().arrow_schema(),
    );
    let mut q = StreamingQuery::start_batch(&plan, BatchOptions::new(fx.dir.path()))
        .await
        .unwrap();
    let progress = q.run_bounded().await.unwrap();
    assert_eq!(progress.num_input_rows, 0);
    assert_eq!(MemorySink::snapshot(&fx.mem("out")).len(), 1);
}

#[tokio::test]
async fn a_streaming_plan_is_refused_as_a_batch_run() {
    let fx = batch_fixture("batch_refused").with_profile(|p| {
        p.mode = ExecutionMode::Streaming;
        p.trigger = Some(etlantic_core::streaming::Trigger::AvailableNow);
    });
    let plan = fx.plan();
    let err = StreamingQuery::start_batch(&plan, BatchOptions::new(fx.dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("streaming plan"), "{err}");
}

/// A sink that claims every batch is already committed (as a careless plugin might for
/// batch runs).
struct SkippingProvider;
struct SkippingSink;

#[async_trait::async_trait]
impl Sink for SkippingSink {
    async fn write(&mut self, _batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        Ok(WriteOutcome::AlreadyCommitted)
    }
}

impl SinkProvider for SkippingProvider {
    fn scheme(&self) -> &'static str {
        "skipping-test"
    }
    fn description(&self) -> &'static str {
        "a test sink that skips every batch as already committed"
    }
    fn capabilities(&self, _uri: &BindingUri) -> Result<SinkCapabilities> {
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append],
            guarantee: SinkGuarantee::new(SinkCommitProtocol::IdempotentByBatch),
        })
    }
    fn create(&self, _ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(SkippingSink))
    }
}

inventory::submit! { SinkRegistration(&SkippingProvider) }

/// A batch run has no checkpoint, so nothing of it was committed before: a sink that
/// skips its rows fails the run instead of letting it report rows it never wrote.
#[tokio::test]
async fn a_sink_that_skips_a_batch_run_fails_it() {
    let fx = batch_fixture("batch_skipping").with_profile(|p| {
        p.bindings
            .insert("copy_asset".into(), "skipping-test://anywhere".into());
    });
    let plan = fx.plan();
    push(&fx, &plan, &[ev(1, "a", 10)]);
    let mut q = StreamingQuery::start_batch(&plan, BatchOptions::new(fx.dir.path()))
        .await
        .unwrap();
    let err = q.run_bounded().await.unwrap_err();
    assert!(err.to_string().contains("already committed"), "{err}");
}
