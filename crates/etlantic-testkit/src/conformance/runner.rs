//! Runs conformance scenarios on the embedded streaming runtime and compares every
//! scenario batch's output and watermarks with what Spark recorded.
//!
//! A scenario batch is fed to memory sources (one push per source, empty or not, so a
//! data micro-batch runs for it as in Spark), then the query processes everything
//! available — one data micro-batch and, when the watermark moved, one no-data
//! micro-batch. Outputs are compared as multisets; a scenario the runtime cannot run
//! fails, it is never skipped.

use super::scenario::{Column, Scenario};
use super::to_pipeline::scenario_pipeline;
use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_plan::Project;
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use etlantic_sinks::memory::MemorySink;
use etlantic_sources::memory::MemoryStream;
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The outcome of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioOutcome {
    /// Scenario name.
    pub name: String,
    /// Whether every check passed.
    pub passed: bool,
    /// What differed (empty when passed).
    pub problems: Vec<String>,
}

impl ScenarioOutcome {
    /// `PASS name` or `FAIL name: first problem (+n more)`.
    pub fn line(&self) -> String {
        if self.passed {
            format!("PASS {}", self.name)
        } else {
            let more = if self.problems.len() > 1 {
                format!(" (+{} more)", self.problems.len() - 1)
            } else {
                String::new()
            };
            format!(
                "FAIL {}: {}{more}",
                self.name,
                self.problems.first().cloned().unwrap_or_default()
            )
        }
    }
}

fn iso_micros(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn iso_ms(ms: i64) -> String {
    iso_micros(ms * 1000)
}

/// A value in the corpus's normal form: timestamps as ISO ms strings, numbers as f64.
fn norm(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Number(n) => format!("{}", n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn cell(col: &ArrayRef, i: usize) -> Result<Value, String> {
    if col.is_null(i) {
        return Ok(Value::Null);
    }
    let c = col.as_ref();
    Ok(match c.data_type() {
        DataType::Timestamp(_, _) => {
            let us = arrow::compute::cast(col, &DataType::Timestamp(TimeUnit::Microsecond, None))
                .map_err(|e| e.to_string())?;
            let a = us
                .as_any()
                .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
                .expect("µs");
            Value::String(iso_micros(a.value(i)))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = arrow::compute::cast(col, &DataType::Utf8).map_err(|e| e.to_string())?;
            Value::String(
                s.as_any()
                    .downcast_ref::<arrow::array::StringArray>()
                    .expect("utf8")
                    .value(i)
                    .to_string(),
            )
        }
        DataType::Boolean => Value::Bool(
            c.as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .expect("bool")
                .value(i),
        ),
        t if t.is_integer() => {
            let x = arrow::compute::cast(col, &DataType::Int64).map_err(|e| e.to_string())?;
            Value::from(
                x.as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .expect("i64")
                    .value(i),
            )
        }
        t if t.is_floating() => {
            let x = arrow::compute::cast(col, &DataType::Float64).map_err(|e| e.to_string())?;
            Value::from(
                x.as_any()
                    .downcast_ref::<arrow::array::Float64Array>()
                    .expect("f64")
                    .value(i),
            )
        }
        other => return Err(format!("unexpected output type {other}")),
    })
}

pub(crate) fn rows_of(batches: &[RecordBatch], columns: &[Column]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let mut parts = Vec::new();
            for c in columns {
                let col = b
                    .column_by_name(&c.name)
                    .ok_or_else(|| format!("output has no column `{}`", c.name))?;
                parts.push(format!("{}={}", c.name, norm(&cell(col, i)?)));
            }
            out.push(parts.join(", "));
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) fn expected_rows(rows: &[Value], columns: &[Column]) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| {
                    format!(
                        "{}={}",
                        c.name,
                        norm(r.get(&c.name).unwrap_or(&Value::Null))
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    out.sort();
    out
}

fn to_batch(schema: &SchemaRef, rows: &[Value]) -> Result<RecordBatch, String> {
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(rows).map_err(|e| e.to_string())?;
    Ok(decoder
        .flush()
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

/// Runs one scenario file, the operators' state in memory.
pub async fn run_scenario(path: &Path) -> ScenarioOutcome {
    run_scenario_on(path, etlantic_core::profile::MEMORY_STATE_STORE).await
}

/// Runs one scenario file with the operators' state in `state_store` (the profile's
/// `state_store`: `memory`, `disk`). A query the store refuses fails with the store's
/// diagnostic among its problems.
pub async fn run_scenario_on(path: &Path, state_store: &str) -> ScenarioOutcome {
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("?")
        .to_string();
    let mut outcome = ScenarioOutcome {
        name: name.clone(),
        passed: false,
        problems: vec![],
    };
    match run_inner(path, state_store).await {
        Ok(problems) => {
            outcome.passed = problems.is_empty();
            outcome.problems = problems;
        }
        Err(e) => outcome.problems.push(e),
    }
    outcome
}

async fn run_inner(path: &Path, state_store: &str) -> Result<Vec<String>, String> {
    let s = Scenario::load(path)?;
    let tag = format!("conf_{}_{}", s.name, uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut sp = scenario_pipeline(&s, &tag)?;
    sp.profile.state_store = state_store.to_string();
    let project = Project::from_parts(dir.path(), sp.pipeline.clone(), sp.profile.clone());
    etlantic_datafusion::link();
    let outcome = etlantic_plan::plan(&project);
    if s.expect_error {
        return Ok(match outcome.plan {
            None if outcome.diagnostics.has_errors() => vec![],
            _ => vec!["Spark rejects this query but ETLantic planned it".into()],
        });
    }
    let plan = outcome
        .into_result()
        .map_err(|e| format!("planning failed: {e}"))?;
    let expected = s
        .expected
        .as_ref()
        .ok_or("the scenario has no expected result")?;
    for (source, stream) in &sp.streams {
        let contract = plan.asset_contract(source).map_err(|e| e.to_string())?;
        let schema = contract.arrow_schema();
        MemoryStream::register(stream, schema.clone());
        // A static table is there from the start (and read whole for every micro-batch).
        let spec = &s.sources[source];
        if spec.is_static {
            MemoryStream::push(stream, to_batch(&schema, &spec.rows)?)
                .map_err(|e| e.to_string())?;
        }
    }
    MemorySink::clear(&sp.sink);
    let progress: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
    let mut opts = StreamingOptions::new(dir.path(), dir.path().join("checkpoint"));
    let sink = progress.clone();
    opts.on_progress = Some(Arc::new(
        move |p: &etlantic_runtime::progress::QueryProgress| {
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(p.to_json())
        },
    ));
    let mut query = StreamingQuery::start(&plan, opts)
        .await
        .map_err(|e| format!("cannot start: {e}"))?;
    // Spark's join state metrics are exact (one state row per buffered input row), so
    // they are compared for stream-stream joins; for aggregations they are informative.
    let compare_state = s.query.get("kind").and_then(Value::as_str) == Some("stream_stream_join");
    let mut seen_progress = 0usize;
    let mut problems = Vec::new();
    let columns = &expected.output_columns;
    let mut seen_writes = 0usize;
    let mut last_complete: Vec<RecordBatch> = Vec::new();
    let mut all_rows: Vec<RecordBatch> = Vec::new();
    for (i, batch) in s.batches.iter().enumerate() {
        let during = query.watermark_ms();
        for (source, stream) in &sp.streams {
            if s.sources[source].is_static {
                continue;
            }
            let rows = batch.get(source).cloned().unwrap_or_default();
            let schema = plan
                .asset_contract(source)
                .map_err(|e| e.to_string())?
                .arrow_schema();
            MemoryStream::push(stream, to_batch(&schema, &rows)?).map_err(|e| e.to_string())?;
        }
        query
            .process_all_available()
            .await
            .map_err(|e| format!("batch {i}: {e}"))?;
        let writes = MemorySink::snapshot(&sp.sink);
        let new: Vec<&Table> = writes[seen_writes..].iter().map(|w| &w.table).collect();
        seen_writes = writes.len();
        let out: Vec<RecordBatch> = new.iter().flat_map(|t| t.batches.clone()).collect();
        if expected.output_mode.as_deref() == Some("complete") {
            if let Some(t) = new.last() {
                last_complete = t.batches.clone();
            }
        }
        all_rows.extend(out.clone());
        let Some(exp) = expected.batches.iter().find(|b| b.index == i) else {
            problems.push(format!("batch {i}: no expected result recorded"));
            continue;
        };
        // Complete mode hands the sink the whole table per micro-batch; Spark's recorded
        // `output` is the union of its micro-batches, which is what we collected too.
        let got = rows_of(&out, columns)?;
        let want = expected_rows(&exp.output, columns);
        if got != want {
            problems.push(format!(
                "batch {i}: output differs\n  expected {want:?}\n  got      {got:?}"
            ));
        }
        let after = query.watermark_ms();
        let records: Vec<Value> = {
            let all = progress.lock().unwrap_or_else(|e| e.into_inner());
            let new = all[seen_progress..].to_vec();
            seen_progress = all.len();
            new
        };
        if compare_state {
            problems.extend(compare_join_state(i, &records, &exp.micro_batches));
        }
        if let Some(w) = &exp.watermark_during {
            if *w != iso_ms(during) {
                problems.push(format!(
                    "batch {i}: watermark during: expected {w}, got {}",
                    iso_ms(during)
                ));
            }
        }
        if let Some(w) = &exp.watermark_after {
            if *w != iso_ms(after) {
                problems.push(format!(
                    "batch {i}: watermark after: expected {w}, got {}",
                    iso_ms(after)
                ));
            }
        }
    }
    let final_rows = if expected.output_mode.as_deref() == Some("complete") {
        last_complete
    } else {
        all_rows
    };
    let got = rows_of(&final_rows, columns)?;
    let want = expected_rows(&expected.final_rows, columns);
    if got != want {
        problems.push(format!(
            "final sink content differs\n  expected {want:?}\n  got      {got:?}"
        ));
    }
    for (_, stream) in &sp.streams {
        MemoryStream::remove(stream);
    }
    MemorySink::clear(&sp.sink);
    Ok(problems)
}

/// Compares the join operator's state rows after a scenario batch, and the rows it
/// dropped as late, with Spark's `numRowsTotal` and `numRowsDroppedByWatermark`.
fn compare_join_state(batch: usize, ours: &[Value], spark: &[Value]) -> Vec<String> {
    let op = |p: &Value, k: &str| -> u64 {
        p["stateOperators"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(|o| o[k].as_u64())
            .unwrap_or(0)
    };
    let mut problems = Vec::new();
    let want_rows = spark.last().and_then(|m| m["state_rows_total"].as_u64());
    let got_rows = ours.last().map(|p| op(p, "numRowsTotal"));
    if let (Some(w), Some(g)) = (want_rows, got_rows) {
        if w != g {
            problems.push(format!(
                "batch {batch}: join state rows: Spark {w}, ours {g}"
            ));
        }
    }
    let want_late: u64 = spark
        .iter()
        .filter_map(|m| m["dropped_by_watermark"].as_u64())
        .sum();
    let got_late: u64 = ours
        .iter()
        .map(|p| op(p, "numRowsDroppedByWatermark"))
        .sum();
    if want_late != got_late {
        problems.push(format!(
            "batch {batch}: rows dropped by the watermark: Spark {want_late}, ours {got_late}"
        ));
    }
    problems
}

/// Runs every `*.json` scenario of a directory, in name order, the state in memory.
pub async fn run_dir(dir: &Path) -> Result<Vec<ScenarioOutcome>, String> {
    run_dir_on(dir, etlantic_core::profile::MEMORY_STATE_STORE).await
}

/// Runs every `*.json` scenario of a directory, in name order, with the operators'
/// state in `state_store`.
pub async fn run_dir_on(dir: &Path, state_store: &str) -> Result<Vec<ScenarioOutcome>, String> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        out.push(run_scenario_on(&p, state_store).await);
    }
    Ok(out)
}
