//! Helpers of the streaming integration tests: a pipeline + streaming profile on memory
//! sources and sinks (each test gets its own stream names), fed scenario batch by
//! scenario batch, with the sink output read back as canonical JSON rows.
#![allow(dead_code)]

pub mod joins;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use etlantic_core::ir::Action;
use etlantic_core::model::{Pipeline, PipelineBuilder, SinkDef, SourceDef, TransformBuilder};
use etlantic_core::plugin::ReadLimit;
use etlantic_core::profile::Profile;
use etlantic_core::streaming::{
    Duration, EventTime, ExecutionMode, LatePolicy, OutputMode, Trigger,
};
use etlantic_plan::plan::PipelinePlan;
use etlantic_plan::{PlanOutcome, Project};
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use etlantic_sinks::memory::MemorySink;
use etlantic_sources::memory::MemoryStream;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// 2024-01-01T00:00:00Z in seconds.
pub const T0: i64 = 1_704_067_200;

/// `T0 + secs` as the ISO form the helpers give timestamps (`...T00:00:05.000Z`).
pub fn ts(secs: i64) -> String {
    ts_ms((T0 + secs) * 1000)
}

/// Epoch milliseconds as ISO-8601 UTC with milliseconds.
pub fn ts_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `T0 + secs` in epoch milliseconds.
pub fn ms(secs: i64) -> i64 {
    (T0 + secs) * 1000
}

/// An event row `{ts, user, amount}`.
pub fn ev(secs: i64, user: &str, amount: i64) -> Value {
    json!({"ts": ts(secs), "user": user, "amount": amount})
}

/// The event schema used by most tests.
pub const EVENTS: &[(&str, &str)] = &[("ts", "timestamp"), ("user", "string"), ("amount", "long")];

/// An inline ODCS contract; types are `string`, `long`, `double`, `boolean`, `timestamp`.
pub fn contract(name: &str, cols: &[(&str, &str)]) -> Value {
    keyed_contract(name, cols, &[])
}

/// [`contract`] with `primary_key` as its primary key columns.
pub fn keyed_contract(name: &str, cols: &[(&str, &str)], primary_key: &[&str]) -> Value {
    let props: Vec<Value> = cols
        .iter()
        .map(|(n, t)| {
            let mut p = match *t {
                "string" => json!({"logicalType": "string"}),
                "long" => {
                    json!({"logicalType": "integer", "logicalTypeOptions": {"format": "i64"}})
                }
                "double" => {
                    json!({"logicalType": "number", "logicalTypeOptions": {"format": "f64"}})
                }
                "boolean" => json!({"logicalType": "boolean"}),
                "timestamp" => json!({"logicalType": "timestamp"}),
                other => panic!("unknown type {other}"),
            };
            p["name"] = json!(n);
            if primary_key.contains(n) {
                p["primaryKey"] = json!(true);
            }
            p
        })
        .collect();
    json!({
        "version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract",
        "id": name, "status": "draft",
        "schema": [{"name": name, "logicalType": "object", "properties": props}],
    })
}

/// A pipeline under construction, with its streaming profile and a temporary project
/// directory (checkpoint in `<dir>/checkpoint`, quarantine in `<dir>/out/quarantine.jsonl`).
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub tag: String,
    pub name: String,
    pub builder: PipelineBuilder,
    pub profile: Profile,
}

/// A source declaration for [`Fixture::source`].
pub struct Src<'a> {
    pub id: &'a str,
    pub cols: &'a [(&'a str, &'a str)],
    /// `(column, delay)`.
    pub watermark: Option<(&'a str, &'a str)>,
    pub late: LatePolicy,
    pub read_limit: Option<ReadLimit>,
    /// A binding other than the default memory stream.
    pub binding: Option<String>,
    /// The contract's primary key columns.
    pub primary_key: &'a [&'a str],
}

impl<'a> Src<'a> {
    /// A memory source with the event columns and no watermark.
    pub fn new(id: &'a str) -> Self {
        Src {
            id,
            cols: EVENTS,
            watermark: None,
            late: LatePolicy::Drop,
            read_limit: None,
            binding: None,
            primary_key: &[],
        }
    }

    /// With `columns` as the contract's primary key.
    pub fn primary_key(mut self, columns: &'a [&'a str]) -> Self {
        self.primary_key = columns;
        self
    }

    /// With a watermark on `column`.
    pub fn watermark(mut self, column: &'a str, delay: &'a str) -> Self {
        self.watermark = Some((column, delay));
        self
    }

    /// With a late-event policy.
    pub fn late(mut self, late: LatePolicy) -> Self {
        self.late = late;
        self
    }
}

impl Fixture {
    /// A streaming pipeline named `name` (available-now trigger).
    pub fn new(name: &str) -> Self {
        // The planner and the runtime reach the embedded engine through registries.
        etlantic_datafusion::link();
        let mut profile = Profile::new("test");
        profile.mode = ExecutionMode::Streaming;
        profile.trigger = Some(Trigger::AvailableNow);
        profile.quarantine = Some("file://out/quarantine.jsonl".into());
        Fixture {
            dir: tempfile::tempdir().expect("temp dir"),
            tag: uuid::Uuid::new_v4().simple().to_string(),
            name: name.to_string(),
            builder: Pipeline::builder(name),
            profile,
        }
    }

    /// The memory stream or sink name of node `id`.
    pub fn mem(&self, id: &str) -> String {
        format!("{}_{id}", self.tag)
    }

    /// Adds a source (asset named like the source).
    pub fn source(mut self, s: Src<'_>) -> Self {
        self.builder = self
            .builder
            .asset_inline(s.id, keyed_contract(s.id, s.cols, s.primary_key))
            .source_def(SourceDef {
                id: s.id.into(),
                asset: s.id.into(),
                event_time: s.watermark.map(|(c, _)| EventTime {
                    column: c.into(),
                    timezone: "UTC".into(),
                }),
                watermark: s
                    .watermark
                    .map(|(_, d)| d.parse::<Duration>().expect("duration")),
                late_events: s.late,
                read_limit: s.read_limit,
                static_refresh: None,
            });
        let binding = s
            .binding
            .unwrap_or_else(|| format!("memory://{}", self.mem(s.id)));
        self.profile.bindings.insert(s.id.into(), binding);
        self
    }

    /// Adds a transformation `id` reading `inputs` (port = node) with these steps.
    pub fn transform(mut self, id: &str, inputs: &[&str], steps: Vec<Action>) -> Self {
        let mut t = TransformBuilder::new(id);
        for i in inputs {
            t = t.input(*i, *i);
        }
        for s in steps {
            t = t.step(s);
        }
        self.builder = self.builder.transform(t);
        self
    }

    /// Adds a transformation from steps in the YAML short syntax.
    pub fn transform_yaml(mut self, id: &str, inputs: &[&str], steps: &[&str]) -> Self {
        let mut t = TransformBuilder::new(id);
        for i in inputs {
            t = t.input(*i, *i);
        }
        for s in steps {
            t = t.step_yaml(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
        self.builder = self.builder.transform(t);
        self
    }

    /// Adds a memory sink `id` reading `input`, with an asset of these columns.
    pub fn sink(mut self, id: &str, input: &str, cols: &[(&str, &str)], mode: OutputMode) -> Self {
        let asset = format!("{id}_asset");
        self.builder = self
            .builder
            .asset_inline(asset.clone(), contract(&asset, cols))
            .sink_def(SinkDef {
                id: id.into(),
                input: input.into(),
                asset: asset.clone(),
                output_mode: Some(mode),
                write_mode: None,
                keys: vec![],
            });
        self.profile
            .bindings
            .insert(asset, format!("memory://{}", self.mem(id)));
        self
    }

    /// Changes the profile.
    pub fn with_profile(mut self, f: impl FnOnce(&mut Profile)) -> Self {
        f(&mut self.profile);
        self
    }

    /// The project.
    pub fn project(&self) -> Project {
        Project::from_parts(
            self.dir.path(),
            self.builder.clone().build(),
            self.profile.clone(),
        )
    }

    /// Plans the project.
    pub fn plan_outcome(&self) -> PlanOutcome {
        etlantic_plan::plan(&self.project())
    }

    /// Plans the project, panicking with the diagnostics on failure.
    pub fn plan(&self) -> PipelinePlan {
        self.plan_outcome()
            .into_result()
            .unwrap_or_else(|e| panic!("planning failed: {e}"))
    }

    /// The checkpoint directory.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("checkpoint")
    }

    /// The quarantine file.
    pub fn quarantine(&self) -> PathBuf {
        self.dir.path().join("out/quarantine.jsonl")
    }

    /// The records of the quarantine output.
    pub fn quarantined(&self) -> Vec<Value> {
        std::fs::read_to_string(self.quarantine())
            .expect("a quarantine output")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// Options for a query of this fixture.
    pub fn options(&self) -> StreamingOptions {
        StreamingOptions::new(self.dir.path(), self.checkpoint())
    }

    /// Plans and starts the query.
    pub async fn start(&self) -> Running<'_> {
        self.start_with(self.options()).await
    }

    /// Plans and starts the query with these options (e.g. an injected clock).
    pub async fn start_with(&self, options: StreamingOptions) -> Running<'_> {
        let plan = self.plan();
        let query = StreamingQuery::start(&plan, options)
            .await
            .unwrap_or_else(|e| panic!("cannot start: {e}"));
        Running {
            fx: self,
            plan,
            query,
            seen: BTreeMap::new(),
        }
    }
}

/// A started query of a fixture.
pub struct Running<'a> {
    pub fx: &'a Fixture,
    pub plan: PipelinePlan,
    pub query: StreamingQuery,
    /// Sink id → number of writes already returned by [`Running::step`].
    seen: BTreeMap<String, usize>,
}

impl Running<'_> {
    /// Pushes rows to a memory source (one batch, possibly empty).
    pub fn push(&self, source: &str, rows: &[Value]) {
        let schema = self
            .plan
            .asset_contract(source)
            .expect("asset")
            .arrow_schema();
        MemoryStream::push(&self.fx.mem(source), to_batch(&schema, rows)).expect("push");
    }

    /// One scenario batch: pushes a batch (possibly empty) to every listed source, runs
    /// everything available and returns the number of micro-batches that ran.
    pub async fn feed(&mut self, batch: &[(&str, Vec<Value>)]) -> u64 {
        for (source, rows) in batch {
            self.push(source, rows);
        }
        self.query
            .process_all_available()
            .await
            .unwrap_or_else(|e| panic!("processing failed: {e}"))
    }

    /// [`Running::feed`] for the single source `source`, then the new rows of `sink`.
    pub async fn step(&mut self, source: &str, rows: Vec<Value>, sink: &str) -> Vec<String> {
        self.feed(&[(source, rows)]).await;
        self.new_rows(sink)
    }

    /// The rows `sink` received since the last call, canonical and sorted.
    pub fn new_rows(&mut self, sink: &str) -> Vec<String> {
        let writes = MemorySink::snapshot(&self.fx.mem(sink));
        let from = self
            .seen
            .insert(sink.to_string(), writes.len())
            .unwrap_or(0);
        let batches: Vec<RecordBatch> = writes[from..]
            .iter()
            .flat_map(|w| w.table.batches.clone())
            .collect();
        canon_rows(&batches)
    }

    /// The number of writes `sink` received so far.
    pub fn writes(&self, sink: &str) -> usize {
        MemorySink::snapshot(&self.fx.mem(sink)).len()
    }

    /// The batch ids `sink` received, in order.
    pub fn written_batches(&self, sink: &str) -> Vec<u64> {
        MemorySink::snapshot(&self.fx.mem(sink))
            .iter()
            .map(|w| w.batch_id)
            .collect()
    }

    /// The rows of the last write of `sink` (complete mode: the current result table).
    pub fn last_write(&self, sink: &str) -> Vec<String> {
        let writes = MemorySink::snapshot(&self.fx.mem(sink));
        canon_rows(&writes.last().expect("a write").table.batches)
    }

    /// The progress records written to the checkpoint so far.
    pub fn progress(&self) -> Vec<Value> {
        progress_of(&self.fx.checkpoint())
    }
}

/// The progress records of a checkpoint (`progress.jsonl`).
pub fn progress_of(checkpoint: &Path) -> Vec<Value> {
    match std::fs::read_to_string(checkpoint.join("progress.jsonl")) {
        Ok(text) => text
            .lines()
            .map(|l| serde_json::from_str(l).expect("progress line is JSON"))
            .collect(),
        Err(_) => vec![],
    }
}

/// A batch of `schema` from JSON rows.
pub fn to_batch(schema: &SchemaRef, rows: &[Value]) -> RecordBatch {
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .expect("decoder");
    decoder.serialize(rows).expect("rows match the schema");
    decoder
        .flush()
        .expect("flush")
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone()))
}

fn cell(col: &ArrayRef, i: usize) -> Value {
    if col.is_null(i) {
        return Value::Null;
    }
    let cast = |t: &DataType| arrow::compute::cast(col, t).expect("cast");
    match col.data_type() {
        DataType::Timestamp(_, _) => {
            let a = cast(&DataType::Timestamp(TimeUnit::Millisecond, None));
            let a = a
                .as_any()
                .downcast_ref::<arrow::array::TimestampMillisecondArray>()
                .expect("ms");
            Value::String(ts_ms(a.value(i)))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let a = cast(&DataType::Utf8);
            Value::String(
                a.as_any()
                    .downcast_ref::<arrow::array::StringArray>()
                    .expect("utf8")
                    .value(i)
                    .to_string(),
            )
        }
        DataType::Boolean => Value::Bool(
            col.as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .expect("bool")
                .value(i),
        ),
        t if t.is_integer() => {
            let a = cast(&DataType::Int64);
            json!(a
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("i64")
                .value(i))
        }
        t if t.is_floating() => {
            let a = cast(&DataType::Float64);
            json!(a
                .as_any()
                .downcast_ref::<arrow::array::Float64Array>()
                .expect("f64")
                .value(i))
        }
        other => panic!("unexpected output type {other}"),
    }
}

/// Rows of batches as JSON objects.
pub fn json_rows(batches: &[RecordBatch]) -> Vec<Value> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let mut m = serde_json::Map::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                m.insert(f.name().clone(), cell(c, i));
            }
            out.push(Value::Object(m));
        }
    }
    out
}

/// A JSON value with object keys sorted (so equal rows print equally).
pub fn canon(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let b: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sorted(v))).collect();
                let mut out = serde_json::Map::new();
                for (k, v) in b {
                    out.insert(k.clone(), v);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// Canonical, sorted rows of batches (a multiset).
pub fn canon_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut v: Vec<String> = json_rows(batches).iter().map(canon).collect();
    v.sort();
    v
}

/// Canonical, sorted rows of expected JSON values.
pub fn rows(expected: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = expected.iter().map(canon).collect();
    v.sort();
    v
}

/// An expected window row `{window_start, window_end, user, cnt, total}`.
pub fn win(start: i64, end: i64, user: &str, cnt: i64, total: i64) -> Value {
    json!({"window_start": ts(start), "window_end": ts(end), "user": user, "cnt": cnt, "total": total})
}

/// The output columns of [`win`] rows.
pub const WIN_COLS: &[(&str, &str)] = &[
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("user", "string"),
    ("cnt", "long"),
    ("total", "long"),
];

/// Whether the fixture plans without errors, and the codes of every diagnostic.
pub fn codes_of(fx: &Fixture) -> (bool, Vec<String>) {
    let o = fx.plan_outcome();
    (
        o.plan.is_some() && !o.diagnostics.has_errors(),
        o.diagnostics.iter().map(|d| d.code.clone()).collect(),
    )
}

/// A one-source windowed pipeline: `events` (watermark 5 s, `late` policy) → `agg`
/// (`step`) → `out` (the [`win`] columns) in `mode`.
pub fn windowed(name: &str, step: &str, mode: OutputMode, late: LatePolicy) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events").watermark("ts", "5 seconds").late(late))
        .transform_yaml("agg", &["events"], &[step])
        .sink("out", "agg", WIN_COLS, mode)
}
