//! Exactly-once into Delta Lake, end to end through the `etlantic` binary: a directory of
//! JSON-lines clicks → 1-minute tumbling count per campaign (10 s watermark) → a Delta
//! table. The process is killed (`ETLANTIC_FAIL_POINT=<point>:<batch>` makes it
//! `abort()`) at every step of the batch protocol — after the offsets WAL, in the middle
//! of the Delta write (data files written, commit not), after the sink commit, after the
//! state snapshot, after the commit log — at several batches, restarted, and the Delta
//! table is compared (as a multiset) with the table of an uninterrupted run: nothing lost,
//! nothing duplicated. The same for the update output mode into a `mode=merge` table.
//! Also: a batch run reading a Delta table (bounded source) into a Delta table.

mod common;
use common::batch_log;
use common::crash::*;

use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

/// The query a test runs: the sink's output mode and the window's allowed lateness.
#[derive(Clone, Copy)]
struct Query {
    output_mode: &'static str,
    lateness: Option<&'static str>,
}

/// A query in `output_mode` whose window allows no lateness.
fn query(output_mode: &'static str) -> Query {
    Query {
        output_mode,
        lateness: None,
    }
}

fn pipeline(q: Query) -> String {
    let output_mode = q.output_mode;
    let lateness = q
        .lateness
        .map(|d| format!(", allowed_lateness: {d}"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: etlantic/v1
kind: Pipeline
name: click_counts
assets:
  clicks:
    contract: contracts/clicks.yaml
  counts:
    contract: contracts/counts.yaml
sources:
  - id: clicks
    asset: clicks
    event_time: {{column: ts}}
    watermark: 10 seconds
    late_events: {{policy: drop}}
    read_limit: {{max_files: 1}}
transforms:
  - id: per_minute
    inputs:
      clicks: clicks
    steps:
      - window_aggregate:
          window: {{type: tumbling, column: ts, size: 1 minute{lateness}}}
          group_by: [campaign]
          aggregates: {{n: "count_all()"}}
sinks:
  - id: write_counts
    input: per_minute
    asset: counts
    output_mode: {output_mode}
"#
    )
}

fn profile(binding: &str) -> String {
    common::available_now_profile(
        &[("clicks", "file://in?format=jsonl"), ("counts", binding)],
        "",
    )
}

/// Six files, one per data batch (batches 0–5; batch 6 is the last, no-data, batch).
/// File 3 line 3 is late and dropped: batch 3 judges lateness by the watermark of batch 2
/// (01:05), and the row's window [00:00, 01:00) ends before it.
fn input_files() -> Vec<(String, String)> {
    let files = [
        vec![
            click("00:10", "c1", "u1"),
            click("00:20", "c2", "u2"),
            click("00:50", "c1", "u3"),
        ],
        vec![click("01:05", "c1", "u1"), click("01:15", "c2", "u4")],
        vec![click("01:30", "c1", "u5")],
        vec![
            click("02:20", "c2", "u1"),
            click("02:40", "c3", "u2"),
            click("00:30", "c1", "u6"),
        ],
        vec![click("03:10", "c3", "u3")],
        vec![click("05:00", "c1", "u4")],
    ];
    files
        .iter()
        .enumerate()
        .map(|(i, lines)| (format!("{i:03}.jsonl"), lines.join("\n") + "\n"))
        .collect()
}

fn project(dir: &Path, q: Query, binding: &str) {
    for (path, text) in [
        ("pipeline.yaml", pipeline(q)),
        ("profiles/local.yaml", profile(binding)),
        ("contracts/clicks.yaml", CLICKS.to_string()),
        ("contracts/counts.yaml", COUNTS.to_string()),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    for (name, text) in input_files() {
        let p = dir.join("in").join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The Delta table's rows as a sorted multiset of canonical JSON strings.
fn table_rows(table: &Path) -> Vec<String> {
    canonical_window_rows(&block_on(etlantic_sinks::delta::read_table(table)).unwrap())
}

/// The windows every run must end with (append mode: the watermark closed them; the
/// late 00:30 click is dropped).
fn closed_windows() -> Vec<String> {
    vec![
        window("00:00", "01:00", "c1", 2),
        window("00:00", "01:00", "c2", 1),
        window("01:00", "02:00", "c1", 2),
        window("01:00", "02:00", "c2", 1),
        window("02:00", "03:00", "c2", 1),
        window("02:00", "03:00", "c3", 1),
        window("03:00", "04:00", "c3", 1),
    ]
}

/// The `txn` version of the query in the table (the last batch it committed).
fn txn_version(dir: &Path) -> Option<i64> {
    let query_id = std::fs::read_to_string(dir.join("chk/metadata"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["id"].as_str().map(str::to_string))?;
    block_on(etlantic_sinks::delta::app_transaction_version(
        dir.join("out/counts"),
        &query_id,
    ))
    .unwrap()
}

/// Delta commits in the table's log.
fn delta_versions(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("out/counts/_delta_log"))
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".json")
            })
            .count()
        })
        .unwrap_or(0)
}

/// Parquet files in the table directory.
fn parquet_on_disk(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("out/counts"))
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".parquet")
            })
            .count()
        })
        .unwrap_or(0)
}

/// `add` actions in the table's log (every data file a commit ever referenced).
fn files_added(dir: &Path) -> usize {
    let Ok(d) = std::fs::read_dir(dir.join("out/counts/_delta_log")) else {
        return 0;
    };
    d.map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("{\"add\""))
                .count()
        })
        .sum()
}

fn commits(dir: &Path) -> Vec<u64> {
    if !dir.join("chk/log").exists() {
        return Vec::new();
    }
    batch_log(&dir.join("chk")).commits.into_keys().collect()
}

/// Kills a fresh project at `point:batch`, checks it died where asked, restarts it and
/// returns the final table rows and Delta version count.
fn crash_and_recover(
    q: Query,
    binding: &str,
    point: &str,
    batch: u64,
    writes_rows: bool,
) -> (Vec<String>, usize) {
    let label = format!("{point}:{batch}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, q, binding);
    let o = run(dir, Some(&label));
    assert_eq!(
        o.status.signal(),
        Some(6),
        "{label}: must abort\n{}",
        describe(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ETLANTIC_FAIL_POINT reached"),
        "{label}: {}",
        describe(&o)
    );
    // Where it died: the Delta txn names the batch once the sink committed it.
    let committed = txn_version(dir);
    if matches!(point, "after_offsets" | "in_sink") {
        assert!(
            committed.is_none_or(|v| v < batch as i64),
            "{label}: the batch must not be in the table, txn {committed:?}"
        );
    } else {
        assert_eq!(
            committed,
            Some(batch as i64),
            "{label}: the batch is in the table"
        );
    }
    if point == "in_sink" && writes_rows {
        // The batch's data files are on disk, no commit references them.
        assert!(
            parquet_on_disk(dir) > files_added(dir),
            "{label}: staged, uncommitted data files"
        );
    }
    let versions_before = delta_versions(dir);
    run_ok(dir);
    assert!(
        commits(dir).contains(&batch),
        "{label}: the batch committed"
    );
    let versions = delta_versions(dir);
    assert!(versions >= versions_before, "{label}");
    (table_rows(&dir.join("out/counts")), versions)
}

fn reference(q: Query, binding: &str) -> (Vec<String>, usize, Vec<u64>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, q, binding);
    run_ok(dir);
    let rows = table_rows(&dir.join("out/counts"));
    let batches = commits(dir);
    // One Delta commit per micro-batch, each with the query's txn.
    assert_eq!(
        delta_versions(dir),
        batches.len(),
        "one Delta commit per batch"
    );
    assert_eq!(txn_version(dir), batches.last().map(|b| *b as i64));
    // A finished query restarted writes nothing more.
    run_ok(dir);
    assert_eq!(table_rows(&dir.join("out/counts")), rows);
    assert_eq!(delta_versions(dir), batches.len());
    (rows, batches.len(), batches)
}

#[test]
fn append_into_delta_killed_at_every_step_loses_and_duplicates_nothing() {
    let binding = "delta://out/counts";
    let (rows, versions, batches) = reference(query("append"), binding);
    let mut expected = closed_windows();
    expected.sort();
    assert_eq!(rows, expected, "the uninterrupted run is right");
    // The backlog's data batches run back to back (0–5), then one no-data batch (6).
    assert_eq!(batches, (0..7).collect::<Vec<_>>());
    for point in FAIL_POINTS {
        // 0: the first batch, creating the table with no rows; 1: a batch with nothing
        // to emit; 2: the batch that closes the first windows; 3: a batch with a late row
        // and nothing to emit; 5: the last data batch; 6: the last (no-data) batch,
        // closing a window.
        for batch in [0u64, 1, 2, 3, 5, 6] {
            let writes_rows = matches!(batch, 2 | 5 | 6);
            let (got, got_versions) =
                crash_and_recover(query("append"), binding, point, batch, writes_rows);
            assert_eq!(
                got, rows,
                "{point}:{batch}: the Delta table differs from the uninterrupted run"
            );
            assert_eq!(
                got_versions, versions,
                "{point}:{batch}: one Delta commit per batch, none twice"
            );
        }
    }
}

#[test]
fn update_mode_merged_into_delta_killed_and_restarted_keeps_one_row_per_window() {
    let binding = "delta://out/counts?mode=merge&keys=window_start,window_end,campaign";
    let (rows, versions, batches) = reference(query("update"), binding);
    // Update mode upserts every changed window, including the last one the watermark
    // never closes; the late click is still dropped.
    let mut expected = closed_windows();
    expected.push(window("05:00", "06:00", "c1", 1));
    expected.sort();
    assert_eq!(rows, expected, "the uninterrupted run is right");
    let last = *batches.last().unwrap();
    for point in FAIL_POINTS {
        for batch in [0u64, 2, last] {
            let (got, got_versions) =
                crash_and_recover(query("update"), binding, point, batch, batch == 0);
            assert_eq!(got, rows, "{point}:{batch}: merged table differs");
            assert_eq!(got_versions, versions, "{point}:{batch}: Delta commits");
        }
    }
}

/// Allowed lateness into a merged Delta table: the late 00:30 click (judged in batch 3 by
/// the watermark 01:05, its window [00:00, 01:00) ended 5 s before) is inside the 30 s of
/// lateness, so it updates its window, merged again with 3. Killed at every step of the
/// batches where that window is past its end but still open (2: the watermark reaches
/// 01:05; 3: the late click arrives), the restarted query still holds the window.
#[test]
fn update_mode_with_allowed_lateness_merges_late_updates_across_kills_inside_the_lateness() {
    let binding = "delta://out/counts?mode=merge&keys=window_start,window_end,campaign";
    let late = Query {
        output_mode: "update",
        lateness: Some("30 seconds"),
    };
    let (rows, versions, _) = reference(late, binding);
    let mut expected = closed_windows();
    expected[0] = window("00:00", "01:00", "c1", 3);
    expected.push(window("05:00", "06:00", "c1", 1));
    expected.sort();
    assert_eq!(rows, expected, "the uninterrupted run is right");
    for point in FAIL_POINTS {
        for batch in [2u64, 3] {
            let (got, got_versions) = crash_and_recover(late, binding, point, batch, false);
            assert_eq!(got, rows, "{point}:{batch}: merged table differs");
            assert_eq!(got_versions, versions, "{point}:{batch}: Delta commits");
        }
    }
}

/// Complete mode overwrites the whole table at every micro-batch (one Delta commit with
/// the batch's `txn`): killed at every step, the restarted query leaves the table of the
/// uninterrupted run, never a second copy of a result and never a half-replaced one.
#[test]
fn complete_mode_overwrites_killed_at_every_step_lose_and_duplicate_nothing() {
    let binding = "delta://out/counts";
    let (rows, versions, batches) = reference(query("complete"), binding);
    // Every window, the last one the watermark never closes included. Complete mode
    // keeps all state and drops no late row (as Spark): the 00:30 click counts. No
    // no-data batches in complete mode: the six files are batches 0-5.
    let mut expected = closed_windows();
    expected[0] = window("00:00", "01:00", "c1", 3);
    expected.push(window("05:00", "06:00", "c1", 1));
    expected.sort();
    assert_eq!(rows, expected, "the uninterrupted run is right");
    assert_eq!(batches, (0..6).collect::<Vec<_>>());
    for point in FAIL_POINTS {
        for batch in [0u64, 2, 3, 5] {
            let (got, got_versions) =
                crash_and_recover(query("complete"), binding, point, batch, true);
            assert_eq!(got, rows, "{point}:{batch}: the Delta table differs");
            assert_eq!(got_versions, versions, "{point}:{batch}: Delta commits");
        }
    }
}

#[test]
fn a_batch_run_reads_a_delta_table_and_overwrites_another() {
    // First a streaming run fills `out/counts`; then a batch pipeline reads it (bounded
    // delta source) and writes the campaigns' totals to another Delta table.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, query("append"), "delta://out/counts");
    run_ok(dir);
    run_totals_twice(
        dir,
        "delta://out/counts",
        "delta://out/totals?mode=overwrite",
        &[],
    );
    let batches = block_on(etlantic_sinks::delta::read_table(dir.join("out/totals"))).unwrap();
    let mut got = Vec::new();
    for b in &batches {
        let c = b.column_by_name("campaign").unwrap();
        let t = b.column_by_name("total").unwrap();
        let c = arrow::array::AsArray::as_string::<i32>(c);
        let t = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(t);
        for i in 0..b.num_rows() {
            got.push((c.value(i).to_string(), t.value(i)));
        }
    }
    got.sort();
    // Overwritten, not appended, by the second run.
    assert_eq!(
        got,
        vec![
            ("c1".to_string(), 4),
            ("c2".to_string(), 3),
            ("c3".to_string(), 2)
        ]
    );
}
