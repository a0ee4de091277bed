//! Runs conformance scenarios on real Apache Spark through ETLantic's plan: the
//! scenario's pipeline is planned as on the embedded runtime, its sources bound to
//! JSON-lines directories, and the plan compiled into one Spark Structured Streaming
//! query (`etlantic_spark_compat::streaming`). Spark is driven as the corpus generator
//! drove it: one new file per source and scenario batch, then `processAllAvailable`.
//!
//! Compared per batch: the rows the sink received (a multiset), and
//! `lastProgress.eventTime.watermark`; at the end, the sink's content and the number of
//! data micro-batches in Spark's progress (mapped to ETLantic's progress records). A scenario Spark
//! must reject passes when planning or starting the query fails.

use super::runner::{expected_rows, rows_of, ScenarioOutcome};
use super::scenario::Scenario;
use super::to_pipeline::scenario_pipeline;
use arrow::array::RecordBatch;
use etlantic_plan::Project;
use etlantic_spark_compat::streaming::SparkStreamingQuery;
use serde_json::Value;
use std::path::Path;

/// Runs one scenario file at the Spark Connect endpoint `url` (blocking).
pub fn run_scenario_on_spark(path: &Path, url: &str) -> ScenarioOutcome {
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("?")
        .to_string();
    let mut outcome = ScenarioOutcome {
        name,
        passed: false,
        problems: vec![],
    };
    match run_inner(path, url) {
        Ok(problems) => {
            outcome.passed = problems.is_empty();
            outcome.problems = problems;
        }
        Err(e) => outcome.problems.push(e),
    }
    outcome
}

/// Runs every `*.json` scenario of a directory at `url`, in name order (blocking).
pub fn run_dir_on_spark(dir: &Path, url: &str) -> Result<Vec<ScenarioOutcome>, String> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    paths.sort();
    Ok(paths
        .iter()
        .map(|p| run_scenario_on_spark(p, url))
        .collect())
}

fn jsonl(rows: &[Value]) -> String {
    rows.iter().map(|r| format!("{r}\n")).collect()
}

/// `a` minus `b`, as multisets of normalised rows.
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut rest = b.to_vec();
    let mut out = Vec::new();
    for r in a {
        match rest.iter().position(|x| x == r) {
            Some(i) => {
                rest.swap_remove(i);
            }
            None => out.push(r.clone()),
        }
    }
    out.sort();
    out
}

fn run_inner(path: &Path, url: &str) -> Result<Vec<String>, String> {
    let s = Scenario::load(path)?;
    let tag = format!("conf_{}_{}", s.name, uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path();
    let mut sp = scenario_pipeline(&s, &tag)?;
    // Sources as JSON-lines locations Spark reads: a directory per stream, a file per
    // static table.
    let staging = root.join("staging");
    std::fs::create_dir_all(&staging).map_err(|e| e.to_string())?;
    for (name, spec) in &s.sources {
        let binding = if spec.is_static {
            let file = root.join(format!("static_{name}.jsonl"));
            std::fs::write(&file, jsonl(&spec.rows)).map_err(|e| e.to_string())?;
            format!("file://{}?format=jsonl", file.display())
        } else {
            let d = root.join(format!("in_{name}"));
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            format!("file://{}?format=jsonl", d.display())
        };
        sp.profile.bindings.insert(name.clone(), binding);
    }
    let project = Project::from_parts(root, sp.pipeline.clone(), sp.profile.clone());
    let outcome = etlantic_plan::plan(&project);
    let plan = match outcome.into_result() {
        Ok(plan) => plan,
        Err(_) if s.expect_error => return Ok(vec![]),
        Err(e) => return Err(format!("planning failed: {e}")),
    };
    let sink = format!("{tag}_sink");
    let query = SparkStreamingQuery::start(&plan, url, root, &root.join("checkpoint"), &sink, 200);
    let query = match query {
        // Refused by Spark (or by the compiler, as ETLantic's planner would); an
        // unreachable endpoint is no refusal.
        Err(e) if s.expect_error && e.code() != "ETL710" => return Ok(vec![]),
        Err(e) => return Err(format!("cannot start on Spark: {e}")),
        Ok(_) if s.expect_error => {
            return Ok(vec!["Spark rejects this query but it started".into()])
        }
        Ok(q) => q,
    };
    let expected = s
        .expected
        .as_ref()
        .ok_or("the scenario has no expected result")?;
    let columns = &expected.output_columns;
    let complete = expected.output_mode.as_deref() == Some("complete");
    let mut problems = Vec::new();
    let mut before: Vec<String> = Vec::new();
    let mut last: Vec<RecordBatch> = Vec::new();
    for (i, batch) in s.batches.iter().enumerate() {
        // Every streaming source gets one file (empty when it has no rows), written
        // aside and renamed in back to back so that one trigger sees them all.
        let mut staged = Vec::new();
        for (name, spec) in &s.sources {
            if spec.is_static {
                continue;
            }
            let rows = batch.get(name).cloned().unwrap_or_default();
            let file = staging.join(format!("{name}_{i:05}.jsonl"));
            std::fs::write(&file, jsonl(&rows)).map_err(|e| e.to_string())?;
            staged.push((file, root.join(format!("in_{name}/{i:05}.jsonl"))));
        }
        for (from, to) in &staged {
            std::fs::rename(from, to).map_err(|e| e.to_string())?;
        }
        query
            .process_all_available()
            .map_err(|e| format!("batch {i}: {e}"))?;
        let now_batches = query.sink_rows().map_err(|e| format!("batch {i}: {e}"))?;
        let now = rows_of(&now_batches, columns)?;
        let got = if complete {
            now.clone()
        } else {
            minus(&now, &before)
        };
        before = now;
        last = now_batches;
        let Some(exp) = expected.batches.iter().find(|b| b.index == i) else {
            problems.push(format!("batch {i}: no expected result recorded"));
            continue;
        };
        let want = expected_rows(&exp.output, columns);
        if got != want {
            problems.push(format!(
                "batch {i}: output differs\n  expected {want:?}\n  got      {got:?}"
            ));
        }
        if let Some(w) = &exp.last_progress_watermark {
            let progress = query.last_progress().map_err(|e| e.to_string())?;
            let got = progress
                .as_ref()
                .and_then(|p| p["eventTime"]["watermark"].as_str())
                .map(String::from);
            if got.as_deref() != Some(w.as_str()) {
                problems.push(format!(
                    "batch {i}: lastProgress watermark: expected {w}, got {got:?}"
                ));
            }
        }
    }
    // Spark's progress, as ETLantic progress records: at least one data micro-batch per
    // scenario batch (FORMAT.md, "How the generator drives Spark"). On a loaded machine
    // a trigger can fire between the renames of two sources' files and split a batch in
    // two (the generator retried such runs), so more is allowed; fewer is not.
    let data_batches = query
        .recent_progress()
        .map_err(|e| e.to_string())?
        .iter()
        .filter(|p| p["kind"] == "data")
        .count();
    if data_batches < s.batches.len() {
        problems.push(format!(
            "{data_batches} data micro-batches in the progress records for {} scenario batches",
            s.batches.len()
        ));
    }
    let got = rows_of(&last, columns)?;
    let want = expected_rows(&expected.final_rows, columns);
    if got != want {
        problems.push(format!(
            "final sink content differs\n  expected {want:?}\n  got      {got:?}"
        ));
    }
    query.stop().map_err(|e| e.to_string())?;
    Ok(problems)
}
