//! The sink kit: checks a [`SinkProvider`] against the invariants of
//! [`etlantic_core::plugin::Sink`], reading back what it wrote through the author's
//! [`SinkHarness`].
//!
//! The rows are the kit's counts (`window_start`, `window_end` timestamps, `name`
//! string, `n` long; see [`COUNTS_CONTRACT`]). [`check_sink`] drives the sink directly:
//!
//! 1. `capabilities`: answered from the binding alone; the sink runs in streaming runs;
//! 2. `write`: two micro-batches, each row once;
//! 3. `replay` (idempotent and transactional sinks): a `(query id, batch id)` written
//!    again changes nothing (`AlreadyCommitted`, or rows unchanged);
//! 4. `last_committed`: when the sink says which batch it committed last, it says the
//!    right one;
//! 5. `complete` (when declared): a complete-mode write replaces the result, and its
//!    replay changes nothing;
//! 6. `close`: closing twice is fine.
//!
//! [`check_sink_killed_at_every_step`] runs a streaming query — a directory of JSON
//! lines (one file per micro-batch) counted per name in 10-second windows — into the sink
//! in a child process (the test binary run again), kills it with
//! `ETLANTIC_FAIL_POINT=<point>:<batch>` at every step of the batch protocol
//! ([`FAIL_POINTS`]) of several batches, restarts it, and compares what the target holds
//! with an uninterrupted run: the same rows for an exactly-once sink (0 lost, 0
//! duplicated), every row at least once for a plain-append one.

use super::{canonical, io, KitReport};
use etlantic_core::async_trait;
use etlantic_core::contract::Contract;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::Result;
use etlantic_core::guarantee::SinkCommitProtocol;
use etlantic_core::plugin::{Sink, SinkBatch, SinkContext, SinkProvider, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// The steps of the batch protocol the kill test stops a query at, in protocol order:
/// after the offsets are in the write-ahead log, inside the sink's write (the sink calls
/// `etlantic_core::faults::check(IN_SINK, batch_id)` between staging its rows and making
/// them visible), after the sink's write, after the state, after the commit log.
pub const FAIL_POINTS: [&str; 5] = [
    "after_offsets",
    etlantic_core::faults::IN_SINK,
    "after_sink",
    "after_state",
    "after_commit",
];

/// The contract of the kit's rows (ODCS YAML).
pub const COUNTS_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "kit_counts"
name: "kit_counts"
status: "active"
schema:
  - name: "kit_counts"
    logicalType: "object"
    properties:
      - name: "window_start"
        logicalType: "timestamp"
      - name: "window_end"
        logicalType: "timestamp"
      - name: "name"
        logicalType: "string"
      - name: "n"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

/// What the kit needs from a sink's author: fresh targets, and a way to read them back.
#[async_trait]
pub trait SinkHarness: Send + Sync {
    /// The binding of a fresh, empty target called `name` for rows of
    /// [`COUNTS_CONTRACT`] (a table, topic, stream or directory of that name; the kit uses
    /// a new name for every run). Relative paths are resolved against the kit's project
    /// directory, the same one in every call.
    fn binding(&self, name: &str) -> String;
    /// The rows target `name` holds now, as JSON objects with the kit's columns
    /// (timestamps as RFC 3339 text, `YYYY-MM-DD HH:MM:SS[.f]` text taken as UTC, or
    /// microseconds since the epoch), in any order. A target that does not exist yet
    /// holds no rows.
    async fn rows(&self, project: &Path, name: &str) -> Result<Vec<Value>>;
}

/// One kit row.
pub fn count_row(start_secs: i64, name: &str, n: i64) -> Value {
    let t = |s: i64| format!("2024-01-01T00:{:02}:{:02}Z", s / 60, s % 60);
    json!({"window_start": t(start_secs), "window_end": t(start_secs + 10), "name": name, "n": n})
}

/// The schema of the kit's rows.
pub fn counts_schema() -> arrow::datatypes::SchemaRef {
    Contract::parse(COUNTS_CONTRACT, "kit_counts.yaml", None)
        .expect("the kit's contract parses")
        .arrow_schema()
}

fn counts_table(rows: &[Value]) -> Result<Table> {
    let schema = counts_schema();
    Ok(Table::new(
        schema.clone(),
        vec![super::to_batch(&schema, rows)?],
    ))
}

fn sink_context(uri: BindingUri, dir: &Path, output_mode: OutputMode) -> Result<SinkContext> {
    let contract = Contract::parse(COUNTS_CONTRACT, "kit_counts.yaml", None)?;
    Ok(SinkContext {
        asset: "kit_counts".into(),
        uri,
        schema: contract.arrow_schema(),
        contract: Some(Arc::new(contract)),
        root: dir.to_path_buf(),
        mode: ExecutionMode::Streaming,
        output_mode,
        storage_options: Default::default(),
    })
}

/// Checks `provider` by writing to targets of `harness`; `dir` is the kit's project
/// directory.
pub async fn check_sink(
    provider: &'static dyn SinkProvider,
    harness: &dyn SinkHarness,
    dir: &Path,
) -> KitReport {
    let mut report = KitReport::new(format!("sink `{}`", provider.scheme()));
    if let Err(e) = direct(provider, harness, dir, &mut report).await {
        report.fail("kit", format!("stopped: {e}"));
    }
    report
}

async fn direct(
    provider: &'static dyn SinkProvider,
    harness: &dyn SinkHarness,
    dir: &Path,
    report: &mut KitReport,
) -> Result<()> {
    let target = unique("kit_direct");
    let uri = BindingUri::parse(&harness.binding(&target))?;
    let caps = provider.capabilities(&uri)?;
    report.check(
        "capabilities",
        caps.streaming,
        "the sink declares it cannot run in streaming runs (`streaming: false`)",
    );
    if !caps.streaming {
        return Ok(());
    }
    let exactly_once = caps.guarantee.protocol != SinkCommitProtocol::PlainAppend;
    let query = uuid_like();
    let first = vec![count_row(0, "a", 2), count_row(0, "b", 1)];
    let second = vec![count_row(10, "a", 1)];
    if caps.output_modes.contains(&OutputMode::Append) {
        let mut sink = provider.create(sink_context(uri.clone(), dir, OutputMode::Append)?)?;
        let t0 = counts_table(&first)?;
        let o = write(sink.as_mut(), &query, 0, OutputMode::Append, &t0).await?;
        report.check(
            "write",
            o == WriteOutcome::Written { rows: 2 },
            format!("writing 2 rows returned {o:?}"),
        );
        let t1 = counts_table(&second)?;
        write(sink.as_mut(), &query, 1, OutputMode::Append, &t1).await?;
        let all: Vec<Value> = first.iter().chain(&second).cloned().collect();
        report.check_values("write", &harness.rows(dir, &target).await?, &all);
        if exactly_once {
            let o = write(sink.as_mut(), &query, 1, OutputMode::Append, &t1).await?;
            let rows = harness.rows(dir, &target).await?;
            report.check(
                "replay",
                matches!(
                    o,
                    WriteOutcome::AlreadyCommitted | WriteOutcome::Written { .. }
                ),
                format!("{o:?}"),
            );
            report.check_values("replay", &rows, &all);
            // Another instance (a restart) sees the committed batch too.
            let mut restarted =
                provider.create(sink_context(uri.clone(), dir, OutputMode::Append)?)?;
            write(restarted.as_mut(), &query, 0, OutputMode::Append, &t0).await?;
            report.check_values("replay", &harness.rows(dir, &target).await?, &all);
            if let Some(last) = restarted.last_committed_batch(&query).await? {
                report.check(
                    "last_committed",
                    last == 1,
                    format!("batches 0 and 1 committed, last_committed_batch says {last}"),
                );
            }
            restarted.close().await?;
        }
        sink.close().await?;
        sink.close().await?;
        report.pass("close");
    }
    if caps.output_modes.contains(&OutputMode::Complete) {
        let target = unique("kit_complete");
        let uri = BindingUri::parse(&harness.binding(&target))?;
        let mut sink = provider.create(sink_context(uri, dir, OutputMode::Complete)?)?;
        let t0 = counts_table(&first)?;
        let replaced = vec![count_row(0, "a", 3), count_row(10, "a", 1)];
        let t1 = counts_table(&replaced)?;
        for (batch_id, t) in [(0, &t0), (1, &t1)] {
            write(sink.as_mut(), &query, batch_id, OutputMode::Complete, t).await?;
        }
        report.check_values("complete", &harness.rows(dir, &target).await?, &replaced);
        if exactly_once {
            write(sink.as_mut(), &query, 0, OutputMode::Complete, &t0).await?;
            report.check_values("complete", &harness.rows(dir, &target).await?, &replaced);
        }
        sink.close().await?;
    }
    Ok(())
}

/// Writes `data` as micro-batch `batch_id` of `query`.
async fn write(
    sink: &mut dyn Sink,
    query: &str,
    batch_id: u64,
    output_mode: OutputMode,
    data: &Table,
) -> Result<WriteOutcome> {
    sink.write(SinkBatch {
        query_id: query,
        batch_id,
        output_mode,
        data,
    })
    .await
}

fn unique(prefix: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

fn uuid_like() -> String {
    format!("kit-query-{}", unique("q"))
}

// ------------------------------------------------------------------ the kill test

/// The environment variable that makes the kit's test run as the child of a kill test:
/// it holds the child's project directory and target, as JSON.
pub const CHILD_VAR: &str = "ETLANTIC_KIT_CHILD";

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: kit_counts
assets:
  events:
    contract: contracts/events.yaml
  counts:
    contract: contracts/counts.yaml
sources:
  - id: events
    asset: events
    event_time: {column: ts}
    watermark: 5 seconds
    read_limit: {max_files: 1}
transforms:
  - id: per_window
    inputs: {events: events}
    steps:
      - window_aggregate:
          window: {type: tumbling, column: ts, size: 10 seconds}
          group_by: [name]
          aggregates: {n: "count_all()"}
sinks:
  - id: out
    input: per_window
    asset: counts
    output_mode: MODE
"#;

/// The input files, one per micro-batch: windows close as the watermark (5 s behind the
/// latest event) passes their ends.
fn input_files() -> Vec<String> {
    let line = |s: i64, name: &str, id: i64| {
        json!({"id": id, "name": name, "ts": format!("2024-01-01T00:{:02}:{:02}Z", s / 60, s % 60)})
            .to_string()
    };
    vec![
        vec![line(1, "a", 0), line(3, "b", 1), line(4, "a", 2)],
        vec![line(12, "a", 3), line(16, "b", 4)],
        vec![line(22, "a", 5), line(25, "c", 6)],
        vec![line(31, "b", 7), line(47, "a", 8)],
    ]
    .into_iter()
    .map(|lines| lines.join("\n") + "\n")
    .collect()
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}

/// Writes the kill test's project into `dir`, its sink bound to `binding`.
fn write_project(dir: &Path, binding: &str, mode: OutputMode) -> Result<()> {
    write_file(
        &dir.join("pipeline.yaml"),
        &PIPELINE.replace("MODE", mode.as_str()),
    )?;
    write_file(
        &dir.join("contracts/events.yaml"),
        &super::source::EVENTS_CONTRACT.replace("kit_events", "events"),
    )?;
    write_file(
        &dir.join("contracts/counts.yaml"),
        &COUNTS_CONTRACT.replace("kit_counts", "counts"),
    )?;
    let profile = format!(
        "apiVersion: etlantic/v1\nkind: Profile\nname: kit\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  events: file://in?format=jsonl\n  counts: \"{}\"\n",
        binding.replace('"', "\\\"")
    );
    write_file(&dir.join("profiles/local.yaml"), &profile)?;
    for (i, text) in input_files().iter().enumerate() {
        write_file(&dir.join(format!("in/{i:03}.jsonl")), text)?;
    }
    Ok(())
}

/// Runs the kill test's query in `dir` to its end (what the child does).
async fn run_query(dir: &Path) -> Result<()> {
    etlantic_datafusion::link();
    let project = etlantic_plan::Project::load(
        &dir.join("pipeline.yaml"),
        Some(&dir.join("profiles/local.yaml")),
    )?;
    let plan = etlantic_plan::plan(&project).into_result()?;
    let opts = etlantic_runtime::StreamingOptions::new(dir, dir.join("chk"));
    let mut query = etlantic_runtime::StreamingQuery::start(&plan, opts).await?;
    query.run().await?;
    query.close().await
}

/// The micro-batches a finished query committed, from its checkpoint's batch log.
fn committed_batches(dir: &Path) -> Result<Vec<u64>> {
    let log = etlantic_runtime::checkpoint::batch_log::read_all(&dir.join("chk/log"))?;
    Ok(log.commits.into_keys().collect())
}

/// Kills a streaming query into the sink at every step of the batch protocol (see the
/// module docs). `test_name` is the full name of the test that calls it: the kit runs
/// that test again, alone, as the child, whose call runs the query and ends the process
/// (exit 0 when the query finished, 1 when it failed; killed at a fail point, it
/// aborts).
pub async fn check_sink_killed_at_every_step(
    provider: &'static dyn SinkProvider,
    test_name: &str,
    harness: &dyn SinkHarness,
    dir: &Path,
) -> KitReport {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        let spec: Value = serde_json::from_str(&spec).expect("the kit's child spec");
        let child_dir = Path::new(spec["dir"].as_str().expect("dir"));
        // The child ends here: what follows the call in the test is the parent's.
        match run_query(child_dir).await {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("the kit's child query failed: {e}");
                std::process::exit(1)
            }
        }
    }
    let mut report = KitReport::new(format!("sink `{}` killed at every step", provider.scheme()));
    if let Err(e) = kill_test(provider, test_name, harness, dir, &mut report).await {
        report.fail("kit", format!("stopped: {e}"));
    }
    report
}

async fn kill_test(
    provider: &'static dyn SinkProvider,
    test_name: &str,
    harness: &dyn SinkHarness,
    dir: &Path,
    report: &mut KitReport,
) -> Result<()> {
    let probe = BindingUri::parse(&harness.binding("kit_probe"))?;
    let caps = provider.capabilities(&probe)?;
    let mode = if caps.output_modes.contains(&OutputMode::Append) {
        OutputMode::Append
    } else if caps.output_modes.contains(&OutputMode::Update) {
        OutputMode::Update
    } else {
        report.fail("kill", "the sink takes neither append nor update mode");
        return Ok(());
    };
    let exactly_once = caps.guarantee.protocol != SinkCommitProtocol::PlainAppend;
    let child = |run_dir: &Path, fail_point: Option<String>| -> Result<std::process::Output> {
        let exe = std::env::current_exe().map_err(io)?;
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, json!({"dir": run_dir}).to_string())
            .env_remove(etlantic_core::faults::FAIL_POINT_VAR);
        if let Some(fp) = fail_point {
            cmd.env(etlantic_core::faults::FAIL_POINT_VAR, fp);
        }
        cmd.output().map_err(io)
    };
    // The uninterrupted run.
    let reference = unique("kit_ref");
    let ref_dir = dir.join(&reference);
    write_project(&ref_dir, &harness.binding(&reference), mode)?;
    let o = child(&ref_dir, None)?;
    if !o.status.success() {
        report.fail(
            "kill",
            format!("the uninterrupted run failed: {}", describe(&o)),
        );
        return Ok(());
    }
    let want = canonical(&harness.rows(&ref_dir, &reference).await?);
    if want.is_empty() {
        report.fail("kill", "the uninterrupted run wrote no rows");
        return Ok(());
    }
    let batches = committed_batches(&ref_dir)?;
    let picked: Vec<u64> = pick(&batches);
    report.check(
        "kill",
        batches.len() >= 3,
        format!("the uninterrupted run committed micro-batches {batches:?}: too few to kill"),
    );
    for point in FAIL_POINTS {
        let mut reached_in_sink = false;
        for &batch in &picked {
            let label = format!("{point}:{batch}");
            let target = unique("kit_kill");
            let run_dir = dir.join(&target);
            write_project(&run_dir, &harness.binding(&target), mode)?;
            let o = child(&run_dir, Some(label.clone()))?;
            let aborted = std::os::unix::process::ExitStatusExt::signal(&o.status) == Some(6)
                && String::from_utf8_lossy(&o.stderr).contains("ETLANTIC_FAIL_POINT reached");
            if point == etlantic_core::faults::IN_SINK {
                reached_in_sink |= aborted;
                // A batch with nothing to write may never reach the sink's fail point.
            } else if !aborted {
                report.fail(
                    "kill",
                    format!("{label}: the query was not stopped there: {}", describe(&o)),
                );
                continue;
            }
            let o = child(&run_dir, None)?;
            if !o.status.success() {
                report.fail(
                    "kill",
                    format!("{label}: the restarted query failed: {}", describe(&o)),
                );
                continue;
            }
            let got = canonical(&harness.rows(&run_dir, &target).await?);
            if exactly_once {
                report.check(
                    "kill",
                    got == want,
                    format!("{label}: after the restart the target holds {got:?}, the uninterrupted run {want:?}"),
                );
            } else {
                let lost: Vec<&String> = want.iter().filter(|r| !got.contains(r)).collect();
                report.check(
                    "kill",
                    lost.is_empty(),
                    format!("{label}: rows lost: {lost:?}"),
                );
            }
        }
        if point == etlantic_core::faults::IN_SINK && exactly_once {
            report.check(
                "kill",
                reached_in_sink,
                "no run reached the `in_sink` fail point: an idempotent or transactional sink calls `etlantic_core::faults::check(IN_SINK, batch_id)` after staging a batch and before making it visible",
            );
        }
    }
    report.pass("kill");
    Ok(())
}

/// Up to four batches of `all`: the first, two in the middle, the last.
fn pick(all: &[u64]) -> Vec<u64> {
    if all.len() <= 4 {
        return all.to_vec();
    }
    let mut v = vec![
        all[0],
        all[all.len() / 3],
        all[2 * all.len() / 3],
        all[all.len() - 1],
    ];
    v.dedup();
    v
}

fn describe(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
