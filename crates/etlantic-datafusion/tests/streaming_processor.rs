//! Custom stateful processing (`process` steps, Spark's `transformWithState`) and state
//! TTL, through the Rust API on memory sources and sinks: event-time timers firing in
//! no-data batches, late rows, restarts from every batch's checkpoint compared with an
//! uninterrupted run, processing-time timers and TTL on an injected clock, the batch
//! (bounded) semantics, TTL eviction of a group-by without a watermark, progress state
//! metrics and the planner's diagnostics.
//!
//! The processors are registered by this test binary, as a third-party crate would.

mod streaming_support;

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_core::plugin::processor::{
    invalid, iso_millis, timestamp_millis, ExpiredTimer, GroupKey, ListState, ProcessorContext,
    ProcessorInit, ProcessorProvider, ProcessorSpec, StatefulProcessor, ValueState,
};
use etlantic_core::plugin::{ProcessorRegistration, StepLogic, StepTask};
use etlantic_core::streaming::{Duration, ExecutionMode, OutputMode, TimeMode};
use etlantic_core::Result;
use etlantic_runtime::ManualClock;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;
use streaming_support::*;

use etlantic_sinks as _;
use etlantic_sources as _;

// ------------------------------------------------------------------ test processors

/// `test_sessions`: per key, counts events and sums `amount` until the user has been
/// inactive for `gap` in event time (a timer at the last event + gap), then emits
/// `{<key>, first, last, events, total}` and forgets the key. Optional `ttl`: the state
/// expires after that long without an update (processing time).
struct SessionsProvider;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Session {
    first_ms: i64,
    last_ms: i64,
    events: i64,
}

struct Sessions {
    gap_ms: i64,
    ttl: Option<Duration>,
    schema: SchemaRef,
    session: Option<ValueState<Session>>,
    amounts: Option<ListState<i64>>,
}

impl ProcessorProvider for SessionsProvider {
    fn name(&self) -> &'static str {
        "test_sessions"
    }
    fn description(&self) -> &'static str {
        "per-key event counter with an inactivity timer (tests)"
    }
    fn create(&self, spec: &ProcessorSpec) -> Result<Box<dyn StatefulProcessor>> {
        spec.expect_options("test_sessions", &["gap", "ttl"])?;
        if spec.time_mode != TimeMode::EventTime {
            return Err(invalid("test_sessions needs `time_mode: event_time`"));
        }
        let gap = spec
            .option_duration("gap")?
            .ok_or_else(|| invalid("test_sessions needs the option `gap`"))?;
        let ts = spec.column("ts")?.data_type().clone();
        spec.column("amount")?;
        let mut fields: Vec<Field> = spec
            .keys
            .iter()
            .map(|k| Ok(spec.column(k)?.clone().with_nullable(true)))
            .collect::<Result<_>>()?;
        fields.push(Field::new("first", ts.clone(), false));
        fields.push(Field::new("last", ts, false));
        fields.push(Field::new("events", DataType::Int64, false));
        fields.push(Field::new("total", DataType::Int64, false));
        Ok(Box::new(Sessions {
            gap_ms: gap.as_millis(),
            ttl: spec.option_duration("ttl")?,
            schema: Arc::new(Schema::new(fields)),
            session: None,
            amounts: None,
        }))
    }
}

impl StatefulProcessor for Sessions {
    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn init(&mut self, init: &mut ProcessorInit) -> Result<()> {
        self.session = Some(init.value_state("session", self.ttl)?);
        self.amounts = Some(init.list_state("amounts", self.ttl)?);
        Ok(())
    }

    fn handle_input_rows(
        &mut self,
        _key: &GroupKey,
        rows: &RecordBatch,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let (session, amounts) = (self.session.unwrap(), self.amounts.unwrap());
        let times = timestamp_millis(rows, "ts")?;
        let amount = rows
            .column_by_name("amount")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone();
        let mut s = session.get(ctx)?;
        for (i, t) in times.iter().enumerate() {
            let Some(t) = *t else { continue };
            let s = s.get_or_insert(Session {
                first_ms: t,
                last_ms: t,
                events: 0,
            });
            s.first_ms = s.first_ms.min(t);
            s.last_ms = s.last_ms.max(t);
            s.events += 1;
            amounts.append(ctx, &amount.value(i))?;
        }
        if let Some(s) = s {
            session.set(ctx, &s)?;
            for t in ctx.list_timers() {
                ctx.delete_timer(t);
            }
            ctx.register_timer(s.last_ms + self.gap_ms)?;
        }
        Ok(())
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        _timer: ExpiredTimer,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let (session, amounts) = (self.session.unwrap(), self.amounts.unwrap());
        if let Some(s) = session.get(ctx)? {
            let mut row = key.values().clone();
            row.insert("first".into(), json!(iso_millis(s.first_ms)));
            row.insert("last".into(), json!(iso_millis(s.last_ms)));
            row.insert("events".into(), json!(s.events));
            row.insert("total".into(), json!(amounts.get(ctx)?.iter().sum::<i64>()));
            ctx.emit(&row)?;
        }
        session.clear(ctx)?;
        amounts.clear(ctx)?;
        Ok(())
    }
}

inventory::submit! { ProcessorRegistration(&SessionsProvider) }

/// `test_idle`: counts a key's events and, `timeout` of processing time after its last
/// input, emits `{<key>, events, alerted_at}` (processing-time timers).
struct IdleProvider;

struct Idle {
    timeout_ms: i64,
    schema: SchemaRef,
    count: Option<ValueState<i64>>,
}

impl ProcessorProvider for IdleProvider {
    fn name(&self) -> &'static str {
        "test_idle"
    }
    fn description(&self) -> &'static str {
        "alerts when a key has no input for a while (tests)"
    }
    fn create(&self, spec: &ProcessorSpec) -> Result<Box<dyn StatefulProcessor>> {
        let timeout = spec
            .option_duration("timeout")?
            .ok_or_else(|| invalid("test_idle needs `timeout`"))?;
        let mut fields: Vec<Field> = spec
            .keys
            .iter()
            .map(|k| Ok(spec.column(k)?.clone().with_nullable(true)))
            .collect::<Result<_>>()?;
        fields.push(Field::new("events", DataType::Int64, false));
        fields.push(Field::new(
            "alerted_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ));
        Ok(Box::new(Idle {
            timeout_ms: timeout.as_millis(),
            schema: Arc::new(Schema::new(fields)),
            count: None,
        }))
    }
}

impl StatefulProcessor for Idle {
    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn init(&mut self, init: &mut ProcessorInit) -> Result<()> {
        self.count = Some(init.value_state("count", None)?);
        Ok(())
    }

    fn handle_input_rows(
        &mut self,
        _key: &GroupKey,
        rows: &RecordBatch,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let count = self.count.unwrap();
        let n = count.get(ctx)?.unwrap_or(0) + rows.num_rows() as i64;
        count.set(ctx, &n)?;
        for t in ctx.list_timers() {
            ctx.delete_timer(t);
        }
        let now = ctx.timer_values().processing_time_ms;
        ctx.register_timer(now + self.timeout_ms)
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: ExpiredTimer,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let count = self.count.unwrap();
        let mut row = key.values().clone();
        row.insert("events".into(), json!(count.get(ctx)?.unwrap_or(0)));
        row.insert("alerted_at".into(), json!(iso_millis(timer.time_ms)));
        ctx.emit(&row)?;
        count.clear(ctx)
    }
}

inventory::submit! { ProcessorRegistration(&IdleProvider) }

// ------------------------------------------------------------------ helpers

const SESSION_COLS: &[(&str, &str)] = &[
    ("user", "string"),
    ("first", "timestamp"),
    ("last", "timestamp"),
    ("events", "long"),
    ("total", "long"),
];

fn session(user: &str, first: i64, last: i64, events: i64, total: i64) -> Value {
    json!({"user": user, "first": ts(first), "last": ts(last), "events": events, "total": total})
}

fn sessions_step(options: &str) -> String {
    format!("process: {{processor: test_sessions, keys: [user], time_mode: event_time, options: {options}}}")
}

/// `events` (watermark 5 s) → `sessions` (gap 10 s) → `out` (append).
fn sessions_fixture(name: &str, options: &str) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("sessions", &["events"], &[&sessions_step(options)])
        .sink("out", "sessions", SESSION_COLS, OutputMode::Append)
}

/// The scenario (watermark delay 5 s, gap 10 s). After each batch the watermark is
/// max - 5 s and a no-data batch fires the timers it passed:
/// - b0: a@1, a@3, b@4 → wm -1 s; timers a 13, b 14
/// - b1: a@12, c@20 → wm 15: b fires (a moved to 22, c 30)
/// - b2: d@40 → wm 35: a (22) and c (30) fire
/// - b3: a@30 is late (≤ 35) and dropped; e@50 → wm 45 (d's timer 50 waits)
/// - b4: nothing
/// - b5: f@70 → wm 65: d (50) and e (60) fire; f stays
fn scenario() -> Vec<Vec<Value>> {
    vec![
        vec![ev(1, "a", 1), ev(3, "a", 2), ev(4, "b", 5)],
        vec![ev(12, "a", 4), ev(20, "c", 7)],
        vec![ev(40, "d", 3)],
        vec![ev(30, "a", 100), ev(50, "e", 2)],
        vec![],
        vec![ev(70, "f", 9)],
    ]
}

fn expected_outputs() -> Vec<Vec<String>> {
    vec![
        vec![],
        rows(&[session("b", 4, 4, 1, 5)]),
        rows(&[session("a", 1, 12, 3, 7), session("c", 20, 20, 1, 7)]),
        vec![],
        vec![],
        rows(&[session("d", 40, 40, 1, 3), session("e", 50, 50, 1, 2)]),
    ]
}

fn op_field(p: &Value, f: &str) -> Value {
    p["stateOperators"][0][f].clone()
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn event_time_timers_emit_sessions_when_the_watermark_passes_them() {
    let fx = sessions_fixture("proc_sessions", "{gap: 10 seconds}");
    let mut q = fx.start().await;
    let mut outs = Vec::new();
    let mut micro = Vec::new();
    for rows in scenario() {
        micro.push(q.feed(&[("events", rows)]).await);
        outs.push(q.new_rows("out"));
    }
    assert_eq!(outs, expected_outputs());
    // Every data batch moved the watermark, so a no-data batch fired the timers (b4 is
    // an empty data batch: the watermark stays).
    assert_eq!(micro, [2, 2, 2, 2, 1, 2]);
    let p = q.progress();
    assert_eq!(p.len(), 11);
    let kinds: Vec<&str> = p.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "data", "no_data", "data", "no_data", "data", "no_data", "data", "no_data", "data",
            "data", "no_data"
        ]
    );
    assert_eq!(
        op_field(&p[0], "operatorName"),
        json!("transformWithStateExec")
    );
    // State rows = stored values + list elements + timers.
    // b0: a (session, 2 amounts, timer) + b (session, 1 amount, timer) = 7.
    assert_eq!(op_field(&p[0], "numRowsTotal"), json!(7));
    assert_eq!(op_field(&p[0], "numRowsUpdated"), json!(2 + 3 + 2));
    let custom = op_field(&p[0], "customMetrics");
    assert_eq!(custom["numValueStateVars"], json!(1));
    assert_eq!(custom["numListStateVars"], json!(1));
    assert_eq!(custom["numRegisteredTimers"], json!(2));
    assert_eq!(custom["numExpiredTimers"], json!(0));
    // b1's no-data batch (micro-batch 3) fired b's timer and removed its 3 rows.
    assert_eq!(
        op_field(&p[3], "customMetrics")["numExpiredTimers"],
        json!(1)
    );
    assert_eq!(op_field(&p[3], "numRowsRemoved"), json!(3));
    // a: session + 3 amounts + timer; c: session + 1 amount + timer.
    assert_eq!(op_field(&p[3], "numRowsTotal"), json!(8));
    // The late a@30 of b3 (micro-batch 6) was dropped by the watermark.
    assert_eq!(op_field(&p[6], "numRowsDroppedByWatermark"), json!(1));
    assert_eq!(p[6]["lateRows"], json!(1));
    // At the end only f is in state: its session, one amount, one timer.
    assert_eq!(op_field(&p[10], "numRowsTotal"), json!(3));
    assert!(op_field(&p[10], "memoryUsedBytes").as_u64().unwrap() > 0);
    // Checkpointed like every operator without a changelog: its whole state, logged at
    // every version.
    let logged = etlantic_runtime::checkpoint::state_log::logged_versions(
        &fx.checkpoint().join("state-changes"),
    )
    .unwrap();
    assert_eq!(logged.len(), 1, "{logged:?}");
    let versions = logged.values().next().unwrap();
    let last_batch = p.last().unwrap()["batchId"].as_u64().unwrap();
    assert_eq!(versions.last(), Some(&(last_batch + 1)), "{versions:?}");
}

/// Runs the scenario's batches `from..to` on a (possibly restarted) query of `fx`.
async fn run_batches(fx: &Fixture, from: usize, to: usize) {
    let mut q = fx.start().await;
    for rows in scenario().into_iter().take(to).skip(from) {
        q.feed(&[("events", rows)]).await;
    }
}

fn all_output(fx: &Fixture) -> (Vec<String>, Vec<u64>) {
    let writes = etlantic_sinks::memory::MemorySink::snapshot(&fx.mem("out"));
    let batches: Vec<RecordBatch> = writes
        .iter()
        .flat_map(|w| w.table.batches.clone())
        .collect();
    (
        canon_rows(&batches),
        writes.iter().map(|w| w.batch_id).collect(),
    )
}

#[tokio::test]
async fn a_query_restarted_after_any_batch_gives_the_uninterrupted_result() {
    let reference = sessions_fixture("proc_reference", "{gap: 10 seconds}");
    run_batches(&reference, 0, 6).await;
    let (want_rows, want_batches) = all_output(&reference);
    let mut expected = expected_outputs().concat();
    expected.sort();
    assert_eq!(want_rows, expected);
    let want_state = progress_of(&reference.checkpoint())
        .last()
        .cloned()
        .unwrap();
    for k in 1..6 {
        let fx = sessions_fixture(&format!("proc_restart_{k}"), "{gap: 10 seconds}");
        run_batches(&fx, 0, k).await;
        // A new query on the same checkpoint: state, timers and the watermark come back.
        run_batches(&fx, k, 6).await;
        let (rows, batches) = all_output(&fx);
        assert_eq!(rows, want_rows, "restart after scenario batch {k}");
        assert_eq!(batches, want_batches, "micro-batch ids after restart {k}");
        let last = progress_of(&fx.checkpoint()).last().cloned().unwrap();
        assert_eq!(
            op_field(&last, "numRowsTotal"),
            op_field(&want_state, "numRowsTotal"),
            "{k}"
        );
    }
    // Stopped between a data batch and the no-data batch it owes (the timers of b1 and
    // b2 fire in those): the restarted query runs the no-data batch first.
    for k in [1usize, 2] {
        let fx = sessions_fixture(&format!("proc_owed_{k}"), "{gap: 10 seconds}");
        run_batches(&fx, 0, k).await;
        {
            let q = fx.start().await;
            q.push("events", &scenario()[k]);
            let mut q = q;
            assert!(q.query.run_once().await.unwrap());
        }
        let mut q = fx.start().await;
        let next = q.query.next_batch_id();
        assert!(q.query.run_once().await.unwrap());
        let p = q.progress();
        assert_eq!(p.last().unwrap()["batchId"], json!(next));
        assert_eq!(p.last().unwrap()["kind"], json!("no_data"));
        drop(q);
        run_batches(&fx, k + 1, 6).await;
        let (rows, batches) = all_output(&fx);
        assert_eq!(rows, want_rows, "stopped before the no-data batch of {k}");
        assert_eq!(batches, want_batches, "{k}");
    }
}

#[tokio::test]
async fn state_ttl_of_a_processor_expires_by_processing_time() {
    // TTL 1 minute on the session state: user a's state expires while the watermark
    // stands still, so when the watermark later passes a's timer nothing is emitted.
    let fx = sessions_fixture("proc_ttl", "{gap: 10 seconds, ttl: 1 minute}");
    let clock = ManualClock::new(ms(1_000));
    let mut opts = fx.options();
    opts.clock = clock.clock();
    let mut q = fx.start_with(opts).await;
    q.feed(&[("events", vec![ev(1, "a", 1), ev(2, "a", 2)])])
        .await;
    assert_eq!(q.new_rows("out"), Vec::<String>::new());
    // 59 s later b arrives: a's state is still alive (written at 1000 s, expires 1060 s).
    clock.advance(59_000);
    q.feed(&[("events", vec![ev(3, "b", 5)])]).await;
    let p = q.progress();
    let last = p.last().unwrap();
    assert_eq!(
        op_field(last, "customMetrics")["numRowsRemovedByTtl"],
        json!(0)
    );
    // a: session + 2 amounts + timer; b: session + amount + timer.
    assert_eq!(op_field(last, "numRowsTotal"), json!(7));
    // At 1061 s a's value and list elements are expired; the timer stays registered.
    clock.advance(2_000);
    q.feed(&[("events", vec![ev(4, "c", 1)])]).await;
    let p = q.progress();
    let data = &p[p.len() - 2];
    assert_eq!(data["kind"], json!("data"));
    assert_eq!(
        op_field(data, "customMetrics")["numRowsRemovedByTtl"],
        json!(3)
    );
    // a: its timer; b and c: session, one amount, timer each.
    assert_eq!(op_field(data, "numRowsTotal"), json!(1 + 3 + 3));
    // The watermark passes every timer: b and c are summarised, a (expired) is not.
    q.feed(&[("events", vec![ev(100, "z", 0)])]).await;
    assert_eq!(
        q.new_rows("out"),
        rows(&[session("b", 3, 3, 1, 5), session("c", 4, 4, 1, 1)])
    );
}

/// `events` without a watermark → `idle` (processing-time timers, timeout 30 s) → `out`.
fn idle_fixture(name: &str) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events"))
        .transform_yaml(
            "idle",
            &["events"],
            &["process: {processor: test_idle, keys: [user], time_mode: processing_time, options: {timeout: 30 seconds}}"],
        )
        .sink(
            "out",
            "idle",
            &[("user", "string"), ("events", "long"), ("alerted_at", "timestamp")],
            OutputMode::Append,
        )
}

#[tokio::test]
async fn processing_time_timers_fire_when_the_injected_clock_passes_them() {
    let fx = idle_fixture("proc_idle");
    let clock = ManualClock::new(ms(0));
    let mut opts = fx.options();
    opts.clock = clock.clock();
    {
        let mut q = fx.start_with(opts.clone()).await;
        assert_eq!(
            q.feed(&[("events", vec![ev(0, "a", 1), ev(0, "b", 1)])])
                .await,
            1
        );
        clock.advance(10_000);
        assert_eq!(q.feed(&[("events", vec![ev(0, "a", 1)])]).await, 1);
        // 29 s after b's input: nothing is due, no batch runs.
        clock.advance(19_000);
        assert_eq!(q.query.process_all_available().await.unwrap(), 0);
        assert_eq!(q.new_rows("out"), Vec::<String>::new());
        // At 30 s b's timer is due: a no-data batch fires it.
        clock.advance(1_000);
        assert_eq!(q.query.process_all_available().await.unwrap(), 1);
        assert_eq!(
            q.new_rows("out"),
            rows(&[json!({"user": "b", "events": 1, "alerted_at": ts(30)})])
        );
        let p = q.progress();
        assert_eq!(p.last().unwrap()["kind"], json!("no_data"));
        assert_eq!(
            op_field(p.last().unwrap(), "customMetrics")["numExpiredTimers"],
            json!(1)
        );
    }
    // A restart keeps a's timer (registered at 10 s for 40 s) in the checkpoint.
    clock.advance(15_000);
    let mut q = fx.start_with(opts).await;
    q.new_rows("out"); // what the first run wrote
    assert_eq!(q.query.process_all_available().await.unwrap(), 1);
    assert_eq!(
        q.new_rows("out"),
        rows(&[json!({"user": "a", "events": 2, "alerted_at": ts(40)})])
    );
    assert_eq!(
        op_field(q.progress().last().unwrap(), "numRowsTotal"),
        json!(0)
    );
    assert_eq!(q.query.process_all_available().await.unwrap(), 0);
}

#[tokio::test]
async fn a_bounded_run_fires_every_event_time_timer_at_the_end() {
    let plan = etlantic_core::ir::TransformPlanBuilder::new("sessions")
        .input("events", None)
        .from_input("events")
        .step(
            etlantic_core::model::steps::parse_step(&json!({"process": {
                "processor": "test_sessions", "keys": ["user"], "time_mode": "event_time",
                "options": {"gap": "10 seconds", "ttl": "1 second"}}}))
            .unwrap(),
        )
        .output("result", None)
        .build()
        .unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("user", DataType::Utf8, true),
        Field::new("amount", DataType::Int64, true),
    ]));
    let data: Vec<Value> = scenario().concat();
    let table = Table::new(schema.clone(), vec![to_batch(&schema, &data)]);
    let task = StepTask {
        id: "sessions".into(),
        inputs: IndexMap::from([("events".to_string(), "events".to_string())]),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: IndexMap::new(),
            output: "result".into(),
        },
    };
    etlantic_datafusion::link();
    let backend = etlantic_core::plugin::backend("datafusion").unwrap();
    let out_schema = backend
        .output_schema(
            &task,
            &IndexMap::from([("events".to_string(), schema.clone())]),
        )
        .unwrap();
    assert_eq!(
        out_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>(),
        ["user", "first", "last", "events", "total"]
    );
    let out = backend
        .execute_batch(
            &[task],
            IndexMap::from([("events".to_string(), table)]),
            &["sessions".to_string()],
        )
        .await
        .unwrap();
    // One session per user over the whole input (no watermark, nothing late; the TTL
    // does not apply in batch runs).
    assert_eq!(
        canon_rows(&out["sessions"].batches),
        rows(&[
            session("a", 1, 30, 4, 107),
            session("b", 4, 4, 1, 5),
            session("c", 20, 20, 1, 7),
            session("d", 40, 40, 1, 3),
            session("e", 50, 50, 1, 2),
            session("f", 70, 70, 1, 9),
        ])
    );
}

// ------------------------------------------------------------------ state TTL

fn counts_fixture(name: &str, mode: OutputMode, ttl: &str) -> Fixture {
    let ttl: Duration = ttl.parse().unwrap();
    Fixture::new(name)
        .source(Src::new("events"))
        .transform_yaml(
            "counts",
            &["events"],
            &["aggregate: {group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}"],
        )
        .sink(
            "out",
            "counts",
            &[("user", "string"), ("cnt", "long"), ("total", "long")],
            mode,
        )
        .with_profile(|p| {
            p.state_ttl.insert("counts".into(), ttl);
        })
}

fn cnt(user: &str, cnt: i64, total: i64) -> Value {
    json!({"user": user, "cnt": cnt, "total": total})
}

#[tokio::test]
async fn state_ttl_evicts_groups_of_a_group_by_without_watermark() {
    let fx = counts_fixture("ttl_update", OutputMode::Update, "10 seconds");
    let clock = ManualClock::new(ms(0));
    let mut opts = fx.options();
    opts.clock = clock.clock();
    let mut q = fx.start_with(opts.clone()).await;
    assert_eq!(
        q.step("events", vec![ev(0, "a", 1), ev(0, "b", 2)], "out")
            .await,
        rows(&[cnt("a", 1, 1), cnt("b", 1, 2)])
    );
    clock.advance(5_000);
    assert_eq!(
        q.step("events", vec![ev(0, "a", 3)], "out").await,
        rows(&[cnt("a", 2, 4)])
    );
    // At 12 s b (last updated at 0 s) has expired; a (5 s) has not. b starts again.
    clock.advance(7_000);
    assert_eq!(
        q.step("events", vec![ev(0, "b", 10)], "out").await,
        rows(&[cnt("b", 1, 10)])
    );
    let p = q.progress();
    let last = p.last().unwrap();
    assert_eq!(op_field(last, "numRowsTotal"), json!(2));
    assert_eq!(op_field(last, "numRowsRemoved"), json!(1));
    assert_eq!(op_field(last, "numRowsUpdated"), json!(1));
    assert_eq!(
        op_field(last, "customMetrics")["numRowsRemovedByTtl"],
        json!(1)
    );
    drop(q);
    // The update times are checkpointed: after a restart at 16 s a (5 s) expires.
    clock.advance(4_000);
    let mut q = fx.start_with(opts).await;
    q.new_rows("out"); // what the first run wrote
    assert_eq!(
        q.step("events", vec![ev(0, "a", 1), ev(0, "b", 1)], "out")
            .await,
        rows(&[cnt("a", 1, 1), cnt("b", 2, 11)])
    );
    let p = q.progress();
    assert_eq!(
        op_field(p.last().unwrap(), "customMetrics")["numRowsRemovedByTtl"],
        json!(1)
    );
}

#[tokio::test]
async fn state_ttl_in_complete_mode_drops_expired_groups_from_the_result() {
    let fx = counts_fixture("ttl_complete", OutputMode::Complete, "1 minute");
    let clock = ManualClock::new(ms(0));
    let mut opts = fx.options();
    opts.clock = clock.clock();
    let mut q = fx.start_with(opts).await;
    q.feed(&[("events", vec![ev(0, "a", 1), ev(0, "b", 2)])])
        .await;
    clock.advance(30_000);
    q.feed(&[("events", vec![ev(0, "b", 2)])]).await;
    assert_eq!(q.last_write("out"), rows(&[cnt("a", 1, 1), cnt("b", 2, 4)]));
    clock.advance(45_000);
    q.feed(&[("events", vec![ev(0, "c", 7)])]).await;
    assert_eq!(q.last_write("out"), rows(&[cnt("b", 2, 4), cnt("c", 1, 7)]));
}

#[tokio::test]
async fn state_ttl_forgets_dedup_keys_without_watermark() {
    let fx = Fixture::new("ttl_dedup")
        .source(Src::new("events"))
        .transform_yaml("dedup", &["events"], &["deduplicate: [user]"])
        .sink("out", "dedup", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.state_ttl
                .insert("dedup".into(), "10 seconds".parse().unwrap());
        });
    let clock = ManualClock::new(ms(0));
    let mut opts = fx.options();
    opts.clock = clock.clock();
    let mut q = fx.start_with(opts).await;
    assert_eq!(
        q.step("events", vec![ev(1, "a", 1), ev(2, "a", 2)], "out")
            .await,
        rows(&[ev(1, "a", 1)])
    );
    clock.advance(9_000);
    assert_eq!(
        q.step("events", vec![ev(3, "a", 3)], "out").await,
        Vec::<String>::new()
    );
    // First seen at 0 s: forgotten at 10 s, so a is new again.
    clock.advance(1_000);
    assert_eq!(
        q.step("events", vec![ev(4, "a", 4)], "out").await,
        rows(&[ev(4, "a", 4)])
    );
    let p = q.progress();
    assert_eq!(
        op_field(p.last().unwrap(), "customMetrics")["numRowsRemovedByTtl"],
        json!(1)
    );
    assert_eq!(op_field(p.last().unwrap(), "numRowsTotal"), json!(1));
}

// ------------------------------------------------------------------ diagnostics

fn codes_of(fx: &Fixture) -> Vec<String> {
    fx.plan_outcome()
        .diagnostics
        .0
        .iter()
        .filter(|d| d.severity == etlantic_core::diagnostics::Severity::Error)
        .map(|d| d.code.clone())
        .collect()
}

#[test]
fn the_planner_explains_what_is_wrong_with_a_process_step_or_a_state_ttl() {
    let with_step = |name: &str, wm: bool, step: &str, mode: OutputMode| {
        let src = if wm {
            Src::new("events").watermark("ts", "5 seconds")
        } else {
            Src::new("events")
        };
        Fixture::new(name)
            .source(src)
            .transform_yaml("sessions", &["events"], &[step])
            .sink("out", "sessions", SESSION_COLS, mode)
    };
    let ok = sessions_step("{gap: 10 seconds}");
    assert_eq!(
        codes_of(&with_step("d0", true, &ok, OutputMode::Append)),
        Vec::<String>::new()
    );
    assert_eq!(
        codes_of(&with_step(
            "d1",
            true,
            "process: {processor: nope, keys: [user]}",
            OutputMode::Append
        )),
        ["ETL220"]
    );
    assert_eq!(
        codes_of(&with_step("d2", false, &ok, OutputMode::Append)),
        ["ETL420"]
    );
    assert!(
        codes_of(&with_step("d3", true, &ok, OutputMode::Complete)).contains(&"ETL409".to_string())
    );
    assert_eq!(
        codes_of(&with_step("d3u", true, &ok, OutputMode::Update)),
        Vec::<String>::new()
    );
    assert_eq!(
        codes_of(&with_step(
            "d4",
            true,
            &sessions_step("{gap: 10 seconds, colour: red}"),
            OutputMode::Append
        )),
        ["ETL320"]
    );
    assert_eq!(
        codes_of(&with_step(
            "d5",
            true,
            "process: {processor: test_sessions, keys: [nobody], time_mode: event_time, options: {gap: 1 second}}",
            OutputMode::Append
        )),
        ["ETL206"]
    );
    assert_eq!(
        codes_of(&with_step(
            "d6",
            true,
            "process: {processor: test_sessions, keys: [user], options: {gap: 1 second}}",
            OutputMode::Append
        )),
        ["ETL320"],
        "test_sessions refuses time_mode none"
    );
    // state_ttl: an unknown transformation, a stateless one, an append-mode window
    // aggregation (the watermark bounds it).
    let ttl = |name: &str, key: &str| {
        with_step(name, true, &ok, OutputMode::Append).with_profile(|p| {
            p.state_ttl.insert(key.into(), Duration::from_secs(60));
        })
    };
    assert_eq!(codes_of(&ttl("t0", "sessions")), Vec::<String>::new());
    assert_eq!(codes_of(&ttl("t1", "nothing")), ["ETL221"]);
    assert_eq!(codes_of(&ttl("t2", "sessions.nostep")), ["ETL221"]);
    let stateless = Fixture::new("t3")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.state_ttl.insert("pass".into(), Duration::from_secs(60));
        });
    assert_eq!(codes_of(&stateless), ["ETL221"]);
    let windowed = Fixture::new("t4")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &["window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}"])
        .sink("out", "agg", WIN_COLS, OutputMode::Append)
        .with_profile(|p| {
            p.state_ttl.insert("agg".into(), Duration::from_secs(60));
        });
    assert_eq!(codes_of(&windowed), ["ETL421"]);
    // The same in update mode is fine.
    let windowed = Fixture::new("t5")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &["window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}"])
        .sink("out", "agg", WIN_COLS, OutputMode::Update)
        .with_profile(|p| {
            p.state_ttl.insert("agg".into(), Duration::from_secs(60));
        });
    assert_eq!(codes_of(&windowed), Vec::<String>::new());
    let _ = ExecutionMode::Batch;
}
