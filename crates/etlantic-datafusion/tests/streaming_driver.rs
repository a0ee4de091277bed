//! The micro-batch driver through the Rust API: triggers (available-now with a file
//! limit, once, processing-time, continuous → fallback), progress records, restarts from
//! the checkpoint, and the checkpoint's guards (incompatible plan ETL802, second query
//! ETL803).

mod streaming_support;

use etlantic_core::plugin::ReadLimit;
use etlantic_core::streaming::{Duration, OutputMode, Trigger};
use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::StreamingQuery;
use etlantic_sinks::memory::MemorySink;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use streaming_support::*;

use etlantic_sinks as _;
use etlantic_sources as _;

const TUMBLING: &str = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";

/// Writes a JSON-lines file into `dir` the way a producer should (staged, renamed).
fn drop_file(dir: &Path, name: &str, rows: &[Value]) {
    std::fs::create_dir_all(dir).unwrap();
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let staged = dir.join(format!(".{name}.tmp"));
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(staged, dir.join(name)).unwrap();
}

/// `events` read from the directory `<root>/in` (at most `max_files` per batch), passed
/// through to the memory sink `out`.
fn directory_pipeline(name: &str, max_files: Option<usize>, trigger: Trigger) -> Fixture {
    let mut src = Src::new("events");
    src.binding = Some("file://in?format=jsonl".into());
    src.read_limit = max_files.map(|n| ReadLimit {
        max_files: Some(n),
        max_records: None,
    });
    Fixture::new(name)
        .source(src)
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| p.trigger = Some(trigger))
}

fn files_of() -> [Vec<Value>; 3] {
    [
        vec![ev(1, "a", 1), ev(2, "b", 2)],
        vec![ev(3, "c", 3)],
        vec![ev(4, "d", 4), ev(5, "e", 5), ev(6, "f", 6)],
    ]
}

fn field(progress: &[Value], f: impl Fn(&Value) -> Value) -> Vec<Value> {
    progress.iter().map(f).collect()
}

#[tokio::test]
async fn available_now_drains_a_directory_in_several_batches_under_a_file_limit() {
    let fx = directory_pipeline("avail_now", Some(1), Trigger::AvailableNow);
    let input = fx.dir.path().join("in");
    let files = files_of();
    for (i, rows) in files.iter().enumerate() {
        drop_file(&input, &format!("{i:03}.jsonl"), rows);
    }
    {
        let mut q = fx.start().await;
        q.query.run().await.unwrap();
        let p = q.progress();
        // One micro-batch per file, then it stops by itself.
        assert_eq!(
            field(&p, |r| r["batchId"].clone()),
            [json!(0), json!(1), json!(2)]
        );
        assert_eq!(
            field(&p, |r| r["numInputRows"].clone()),
            [json!(2), json!(1), json!(3)]
        );
        assert_eq!(
            field(&p, |r| r["sources"][0]["endOffset"].clone()),
            [
                json!({"index": 0}),
                json!({"index": 1}),
                json!({"index": 2})
            ]
        );
        assert_eq!(q.written_batches("out"), [0, 1, 2]);
        assert_eq!(q.new_rows("out"), rows(&files.concat()));
    }
    // A later run picks up only the new file, as batch 3.
    drop_file(&input, "003.jsonl", &[ev(7, "g", 7)]);
    let mut q = fx.start().await;
    assert_eq!(q.query.next_batch_id(), 3);
    q.query.run().await.unwrap();
    let p = q.progress();
    assert_eq!(p.len(), 4);
    assert_eq!(p[3]["sources"][0]["startOffset"], json!({"index": 2}));
    assert_eq!(p[3]["sources"][0]["endOffset"], json!({"index": 3}));
    let all = MemorySink::snapshot(&fx.mem("out"));
    assert_eq!(canon_rows(&all[3].table.batches), rows(&[ev(7, "g", 7)]));
}

#[tokio::test]
async fn once_runs_exactly_one_batch_with_everything_available() {
    // Spark's Trigger.Once ignores read limits (that is what AvailableNow adds).
    let fx = directory_pipeline("once", Some(1), Trigger::Once);
    let input = fx.dir.path().join("in");
    let files = files_of();
    for (i, rows) in files.iter().enumerate() {
        drop_file(&input, &format!("{i:03}.jsonl"), rows);
    }
    {
        let mut q = fx.start().await;
        q.query.run().await.unwrap();
        let p = q.progress();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0]["numInputRows"], json!(6));
        assert_eq!(q.written_batches("out"), [0]);
        assert_eq!(q.new_rows("out"), rows(&files.concat()));
    }
    {
        // Nothing new: no batch at all.
        let mut q = fx.start().await;
        q.query.run().await.unwrap();
        assert_eq!(q.progress().len(), 1);
    }
    drop_file(&input, "003.jsonl", &[ev(7, "g", 7)]);
    let mut q = fx.start().await;
    q.query.run().await.unwrap();
    let p = q.progress();
    assert_eq!(p.len(), 2);
    assert_eq!(p[1]["batchId"], json!(1));
    assert_eq!(p[1]["numInputRows"], json!(1));
}

#[tokio::test]
async fn processing_time_runs_again_when_new_files_appear() {
    let fx = directory_pipeline(
        "processing_time",
        None,
        Trigger::ProcessingTime(Duration::from_millis(50)),
    );
    let input = fx.dir.path().join("in");
    let plan = fx.plan();
    let opts = fx.options();
    let stop = opts.stop.clone();
    let mut query = StreamingQuery::start(&plan, opts).await.unwrap();
    let sink = fx.mem("out");
    let wait_for = |n: usize| {
        let sink = sink.clone();
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while MemorySink::snapshot(&sink).len() < n {
                assert!(std::time::Instant::now() < deadline, "no batch {n} in 30 s");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    let driver = async {
        drop_file(&input, "000.jsonl", &[ev(1, "a", 1)]);
        wait_for(1).await;
        // Idle triggers in between run no batch.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(MemorySink::snapshot(&sink).len(), 1);
        drop_file(&input, "001.jsonl", &[ev(2, "b", 2), ev(3, "c", 3)]);
        wait_for(2).await;
        stop.store(true, Ordering::SeqCst);
    };
    let (result, ()) = tokio::join!(query.run(), driver);
    result.unwrap();
    let writes = MemorySink::snapshot(&sink);
    assert_eq!(
        writes.iter().map(|w| w.batch_id).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(canon_rows(&writes[0].table.batches), rows(&[ev(1, "a", 1)]));
    assert_eq!(
        canon_rows(&writes[1].table.batches),
        rows(&[ev(2, "b", 2), ev(3, "c", 3)])
    );
}

#[tokio::test]
async fn processing_time_stops_after_max_batches() {
    let fx = directory_pipeline(
        "max_batches",
        Some(1),
        Trigger::ProcessingTime(Duration::from_millis(10)),
    );
    let input = fx.dir.path().join("in");
    for (i, rows) in files_of().iter().enumerate() {
        drop_file(&input, &format!("{i:03}.jsonl"), rows);
    }
    let plan = fx.plan();
    let mut opts = fx.options();
    opts.max_batches = Some(2);
    let mut query = StreamingQuery::start(&plan, opts).await.unwrap();
    query.run().await.unwrap();
    let p = progress_of(&fx.checkpoint());
    assert_eq!(
        field(&p, |r| r["numInputRows"].clone()),
        [json!(2), json!(1)]
    );
    assert_eq!(query.next_batch_id(), 2);
}

#[tokio::test]
async fn continuous_trigger_warns_and_falls_back_to_micro_batches() {
    let fx = Fixture::new("continuous")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["filter: \"amount > 1\""])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| p.trigger = Some(Trigger::Continuous(Duration::from_secs(1))));
    let outcome = fx.plan_outcome();
    let warnings: Vec<_> = outcome
        .diagnostics
        .iter()
        .filter(|d| d.code == "ETL405")
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", outcome.diagnostics);
    assert!(!warnings[0].is_error());
    assert!(
        warnings[0].message.contains("processing_time 1 second"),
        "the warning names the fallback: {}",
        warnings[0].message
    );
    assert!(!outcome.diagnostics.has_errors());
    let plan = outcome.plan.expect("planned despite the warning");
    let mut opts = fx.options();
    opts.max_batches = Some(1);
    let mut query = StreamingQuery::start(&plan, opts).await.unwrap();
    let schema = plan.asset_contract("events").unwrap().arrow_schema();
    etlantic_sources::memory::MemoryStream::push(
        &fx.mem("events"),
        to_batch(&schema, &[ev(1, "a", 1), ev(2, "b", 2)]),
    )
    .unwrap();
    query.run().await.unwrap();
    let writes = MemorySink::snapshot(&fx.mem("out"));
    assert_eq!(writes.len(), 1);
    assert_eq!(canon_rows(&writes[0].table.batches), rows(&[ev(2, "b", 2)]));
}

#[tokio::test]
async fn progress_records_are_shaped_like_spark() {
    let fx = Fixture::new("progress")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    let plan = fx.plan();
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let mut opts = fx.options();
    let s = seen.clone();
    opts.on_progress = Some(Arc::new(move |p: &QueryProgress| {
        s.lock().unwrap().push(p.to_json())
    }));
    let mut query = StreamingQuery::start(&plan, opts).await.unwrap();
    let schema = plan.asset_contract("events").unwrap().arrow_schema();
    let push = |rows: &[Value]| {
        etlantic_sources::memory::MemoryStream::push(&fx.mem("events"), to_batch(&schema, rows))
            .unwrap()
    };
    push(&[ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)]);
    query.process_all_available().await.unwrap();
    push(&[ev(26, "a", 1)]);
    query.process_all_available().await.unwrap();

    let p = progress_of(&fx.checkpoint());
    // progress.jsonl holds exactly what listeners got (compared as text: parsing floats
    // back is not exact).
    let lines: Vec<String> = std::fs::read_to_string(fx.checkpoint().join("progress.jsonl"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let heard: Vec<String> = seen.lock().unwrap().iter().map(Value::to_string).collect();
    assert_eq!(lines, heard);
    assert_eq!(
        field(&p, |r| r["batchId"].clone()),
        [json!(0), json!(1), json!(2), json!(3)]
    );

    let r = &p[0];
    assert_eq!(r["id"], json!(query.id()));
    assert_eq!(r["runId"], json!(query.run_id()));
    assert_ne!(r["id"], r["runId"]);
    assert_eq!(r["name"], json!("progress"));
    assert!(chrono::DateTime::parse_from_rfc3339(r["timestamp"].as_str().unwrap()).is_ok());
    assert_eq!(r["kind"], json!("data"));
    assert_eq!(r["numInputRows"], json!(3));
    assert!(r["inputRowsPerSecond"].as_f64().unwrap() > 0.0);
    assert!(r["processedRowsPerSecond"].as_f64().unwrap() > 0.0);
    for phase in [
        "triggerExecution",
        "latestOffset",
        "walCommit",
        "getBatch",
        "addBatch",
        "commitOffsets",
    ] {
        assert!(r["durationMs"][phase].is_u64(), "durationMs.{phase} in {r}");
    }
    assert_eq!(
        r["eventTime"],
        json!({
            "min": ts(1), "max": ts(12),
            "avg": ts_ms(ms(0) + 5_333),
            "watermark": "1970-01-01T00:00:00.000Z",
            "nextWatermark": ts(7),
        })
    );
    let op = &r["stateOperators"][0];
    assert_eq!(op["operatorName"], json!("stateStoreSave"));
    assert_eq!(op["numRowsTotal"], json!(2));
    assert_eq!(op["numRowsUpdated"], json!(2));
    assert!(op["memoryUsedBytes"].as_u64().unwrap() > 0);
    assert_eq!(op["numRowsDroppedByWatermark"], json!(0));
    let src = &r["sources"][0];
    assert!(src["description"].as_str().unwrap().contains("events"));
    assert_eq!(src["startOffset"], Value::Null);
    assert_eq!(src["endOffset"], json!(1));
    assert_eq!(src["numInputRows"], json!(3));
    assert!(r["sink"]["description"]
        .as_str()
        .unwrap()
        .starts_with("memory://"));
    assert_eq!(r["sink"]["numOutputRows"], json!(0));
    assert_eq!(
        r["checkpointLocation"],
        json!(fx.checkpoint().display().to_string())
    );

    // The no-data batch after the second push: no input, the advanced watermark, the
    // two closed windows out.
    let r = &p[3];
    assert_eq!(r["kind"], json!("no_data"));
    assert_eq!(r["numInputRows"], json!(0));
    assert_eq!(
        r["eventTime"],
        json!({"watermark": ts(21), "nextWatermark": ts(21)})
    );
    assert_eq!(r["sources"][0]["startOffset"], json!(2));
    assert_eq!(r["sources"][0]["endOffset"], json!(2));
    assert_eq!(r["sink"]["numOutputRows"], json!(2));
    assert_eq!(r["stateOperators"][0]["numRowsTotal"], json!(1));
    assert_eq!(r["id"], p[0]["id"]);
}

#[tokio::test]
async fn a_restart_resumes_from_the_checkpoint() {
    let fx = Fixture::new("restart")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    let (id, run1) = {
        let mut q = fx.start().await;
        q.feed(&[("events", vec![ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)])])
            .await;
        (q.query.id().to_string(), q.query.run_id().to_string())
    };
    let mut q = fx.start().await;
    assert_eq!(q.query.id(), id, "the query id survives restarts");
    assert_ne!(q.query.run_id(), run1, "every run has its own run id");
    assert_eq!(q.query.next_batch_id(), 2);
    assert_eq!(q.query.watermark_ms(), ms(7));
    // The state of batch 0 was restored: [0,10) of `a` counts the rows of both runs.
    let out = q
        .step("events", vec![ev(8, "a", 4), ev(26, "a", 1)], "out")
        .await;
    assert_eq!(out, rows(&[win(0, 10, "a", 3, 7), win(10, 20, "b", 1, 5)]));
    // Batches 0-1 (first run: data, no-data), 2-3 (this run: data, no-data).
    assert_eq!(q.written_batches("out"), [0, 1, 2, 3]);
}

#[tokio::test]
async fn a_restart_with_an_incompatible_plan_is_refused() {
    let fx = Fixture::new("compat")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    {
        let mut q = fx.start().await;
        q.feed(&[("events", vec![ev(1, "a", 1)])]).await;
    }
    // Another window size: the state would be misread.
    let changed = Fixture::new("compat")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml(
            "agg",
            &["events"],
            &[&TUMBLING.replace("10 seconds", "20 seconds")],
        )
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    let err = StreamingQuery::start(&changed.plan(), fx.options())
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), "ETL802", "{err}");
    // Another watermark delay, or a late policy that changes what is dropped, too.
    let changed = Fixture::new("compat")
        .source(Src::new("events").watermark("ts", "6 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    let err = StreamingQuery::start(&changed.plan(), fx.options())
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), "ETL802", "{err}");
    // Operational changes (trigger, bindings) are fine.
    let same = Fixture::new("compat")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append)
        .with_profile(|p| p.trigger = Some(Trigger::Once));
    let q = StreamingQuery::start(&same.plan(), fx.options())
        .await
        .unwrap();
    assert_eq!(q.next_batch_id(), 2);
}

#[tokio::test]
async fn a_second_query_on_the_same_checkpoint_is_refused() {
    let fx = Fixture::new("locked")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["filter: \"amount > 1\""])
        .sink("out", "pass", EVENTS, OutputMode::Append);
    let plan = fx.plan();
    let first = StreamingQuery::start(&plan, fx.options()).await.unwrap();
    let err = StreamingQuery::start(&plan, fx.options())
        .await
        .err()
        .expect("refused while the first runs");
    assert_eq!(err.code(), "ETL803", "{err}");
    drop(first);
    StreamingQuery::start(&plan, fx.options())
        .await
        .expect("free once the first query is gone");
}

#[tokio::test]
async fn a_failed_batch_stops_the_query_and_a_restart_re_runs_it() {
    // The sink directory is blocked by a file: the first batch fails after the operator
    // already absorbed its rows. Retrying on the same query would count them twice, so
    // the query refuses; a restart re-runs the batch from the checkpoint.
    let mut fx = Fixture::new("failed_batch")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    fx.profile.bindings.insert(
        "out_asset".into(),
        "file://out/windows/?format=jsonl".into(),
    );
    let blocked = fx.dir.path().join("out/windows");
    std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
    std::fs::write(&blocked, "not a directory").unwrap();
    {
        let mut q = fx.start().await;
        q.push("events", &[ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)]);
        assert!(q.query.process_all_available().await.is_err());
        std::fs::remove_file(&blocked).unwrap();
        let err = q.query.process_all_available().await.unwrap_err();
        assert_eq!(err.code(), "ETL707", "{err}");
        assert!(err.to_string().contains("micro-batch 0 failed"), "{err}");
    }
    let mut q = fx.start().await;
    assert_eq!(q.query.next_batch_id(), 0, "batch 0 was never committed");
    q.query.process_all_available().await.unwrap();
    q.push("events", &[ev(8, "a", 4), ev(26, "a", 1)]);
    q.query.process_all_available().await.unwrap();
    let out = etlantic_sinks::files::read_committed(fx.dir.path().join("out/windows")).unwrap();
    assert_eq!(
        canon_rows(&out),
        rows(&[win(0, 10, "a", 3, 7), win(10, 20, "b", 1, 5)])
    );
}

/// Under a state checkpoint interval that has not passed yet, no micro-batch writes the
/// aggregation's state; every restart rebuilds it by running all committed micro-batches
/// again. Those runs write nothing: no sink gets a micro-batch twice and no late row is
/// quarantined twice; the output equals a run without restarts.
#[tokio::test]
async fn restarts_rebuild_state_a_checkpoint_interval_has_not_written_yet() {
    let feeds = [
        vec![ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)],
        vec![ev(2, "a", 7), ev(14, "b", 1), ev(25, "a", 1)],
        vec![ev(4, "c", 9), ev(27, "a", 2), ev(41, "b", 3)],
        vec![ev(30, "a", 1), ev(52, "c", 4)],
        vec![ev(33, "b", 8), ev(66, "a", 1)],
    ];
    let fixture = |name: &str| {
        Fixture::new(name)
            .source(
                Src::new("events")
                    .watermark("ts", "5 seconds")
                    .late(etlantic_core::streaming::LatePolicy::Quarantine),
            )
            .transform_yaml("agg", &["events"], &[TUMBLING])
            .sink("out", "agg", WIN_COLS, OutputMode::Append)
    };
    let reference = fixture("interval_ref");
    let mut expected = Vec::new();
    {
        let mut q = reference.start().await;
        for f in &feeds {
            expected.push(q.step("events", f.clone(), "out").await);
        }
    }
    let fx = fixture("interval")
        .with_profile(|p| p.state_checkpoint_interval = Some("1 hour".parse().expect("duration")));
    let clock = etlantic_runtime::ManualClock::new(0);
    let options = || {
        let mut o = fx.options();
        o.clock = clock.clock();
        o
    };
    let mut got = Vec::new();
    let mut q = fx.start_with(options()).await;
    for (k, f) in feeds.iter().enumerate() {
        if k == 2 || k == 4 {
            drop(q);
            q = fx.start_with(options()).await;
            q.new_rows("out");
        }
        got.push(q.step("events", f.clone(), "out").await);
    }
    assert_eq!(got, expected);
    let batches = q.written_batches("out");
    assert!(batches.windows(2).all(|w| w[0] < w[1]), "{batches:?}");
    // Late: ts 2 (feed 1) and 4 (feed 2), each quarantined once.
    assert_eq!(fx.quarantined().len(), 2, "{:?}", fx.quarantined());
    assert_eq!(reference.quarantined().len(), 2);
    // The directory appears with the first snapshot.
    let state_files = std::fs::read_dir(fx.checkpoint().join("state"))
        .map(|dirs| {
            dirs.flat_map(|d| std::fs::read_dir(d.expect("entry").path()).expect("op dir"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(state_files, 0, "the interval never passed");
    assert!(
        !fx.checkpoint().join("state-changes").exists(),
        "no changes were logged either"
    );
}

/// A stream that cannot be read again (a socket, say): planning only asks its
/// capabilities.
struct OnceOnlyProvider;

impl etlantic_core::plugin::SourceProvider for OnceOnlyProvider {
    fn scheme(&self) -> &'static str {
        "once-only-test"
    }
    fn description(&self) -> &'static str {
        "a stream whose records cannot be read again (test)"
    }
    fn capabilities(
        &self,
        _uri: &etlantic_core::uri::BindingUri,
    ) -> etlantic_core::diagnostics::Result<etlantic_core::plugin::SourceCapabilities> {
        Ok(etlantic_core::plugin::SourceCapabilities {
            bounded: false,
            unbounded: true,
            guarantee: etlantic_core::guarantee::SourceGuarantee::NotReplayable,
        })
    }
    fn create(
        &self,
        _ctx: etlantic_core::plugin::SourceContext,
    ) -> etlantic_core::diagnostics::Result<Box<dyn etlantic_core::plugin::Source>> {
        Err(etlantic_core::diagnostics::Error::new(
            &etlantic_core::diagnostics::codes::ENGINE_ERROR,
            "not created in this test",
        ))
    }
}

inventory::submit! { etlantic_core::plugin::SourceRegistration(&OnceOnlyProvider) }

/// A state checkpoint interval rebuilds state from committed micro-batches read again,
/// so planning refuses it over a source that cannot be read again (ETL433), and accepts
/// the same pipeline without the interval.
#[tokio::test]
async fn a_state_checkpoint_interval_needs_replayable_sources() {
    let fixture = |name: &str| {
        let mut src = Src::new("events").watermark("ts", "5 seconds");
        src.binding = Some("once-only-test://socket".into());
        Fixture::new(name)
            .source(src)
            .transform_yaml("agg", &["events"], &[TUMBLING])
            .sink("out", "agg", WIN_COLS, OutputMode::Append)
    };
    assert!(fixture("once_only").plan_outcome().into_result().is_ok());
    let refused = fixture("once_only_interval")
        .with_profile(|p| {
            p.state_checkpoint_interval = Some("10 seconds".parse().expect("duration"))
        })
        .plan_outcome()
        .into_result()
        .expect_err("refused");
    assert!(refused.to_string().contains("ETL433"), "{refused}");
    assert!(refused.to_string().contains("`events`"), "{refused}");
}
