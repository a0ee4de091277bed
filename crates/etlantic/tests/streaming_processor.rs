//! The facade's example stateful processor (`session_summary`) from pipeline YAML through
//! the real `etlantic` binary: a streaming run with event-time timers, late rows and a
//! file sink; killing the process at every step of the batch protocol
//! (`ETLANTIC_FAIL_POINT=<point>:<batch id>`) and restarting it loses and duplicates
//! nothing; a batch run closes every session at the end of the input and equals the
//! built-in session window; an unknown processor is `ETL220`.
//!
//! The stream: one JSON-lines file per micro-batch (`read_limit: {max_files: 1}`), a 10 s
//! watermark, late rows quarantined, sessions with a 30 s gap. The backlog's data batches
//! run back to back (0–5), each judging lateness by the previous micro-batch's watermark
//! and firing the timers its own watermark passed; no-data batch 6 fires the last timer:
//!
//! | batch | file rows | watermark in force | sessions emitted |
//! |---|---|---|---|
//! | 0 | u1 00:00, u1 00:10, u2 00:05 | – | |
//! | 1 | u1 00:20, u2 00:50, u3 00:55 | 00:00 | |
//! | 2 | u1 01:10 | 00:45 | u2 00:05–00:35 (1) |
//! | 3 | u2 01:15, u3 00:30 (late: behind 00:45) | 01:00 | u1 00:00–00:50 (3) |
//! | 4 | u4 02:00 | 01:05 | |
//! | 5 | u5 03:00 | 01:50 | u3 00:55–01:25 (1), u1 01:10–01:40 (1), u2 00:50–01:45 (2) |
//! | 6 | (no data) | 02:50 | u4 02:00–02:30 (1) |

mod common;
use common::crash::quarantined;

use arrow::array::Array;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: user_sessions
assets:
  clicks:
    contract: contracts/clicks.yaml
  sessions:
    contract: contracts/sessions.yaml
sources:
  - id: clicks
    asset: clicks
    event_time: {column: ts}
    watermark: 10 seconds
    late_events: {policy: quarantine}
    read_limit: {max_files: 1}
transforms:
  - id: sessions
    inputs:
      clicks: clicks
    steps:
      - process:
          processor: session_summary
          keys: [user]
          time_mode: event_time
          options: {time_column: ts, gap: 30 seconds}
sinks:
  - id: write_sessions
    input: sessions
    asset: sessions
    output_mode: append
"#;

const STREAM_PROFILE: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: file://chk
state_store: memory
bindings:
  clicks: file://in?format=jsonl
  sessions: file://out/sessions/?format=jsonl
quarantine: file://out/quarantine.jsonl
"#;

const BATCH_PROFILE: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: batch
mode: batch
bindings:
  clicks: file://in?format=jsonl
  sessions: file://out/batch_sessions.jsonl
quarantine: file://out/quarantine.jsonl
"#;

const CLICKS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "clicks"
name: "clicks"
status: "active"
schema:
  - name: "clicks"
    logicalType: "object"
    properties:
      - name: "ts"
        logicalType: "timestamp"
        required: true
      - name: "user"
        logicalType: "string"
        required: true
"#;

const SESSIONS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "sessions"
name: "sessions"
status: "active"
schema:
  - name: "sessions"
    logicalType: "object"
    properties:
      - name: "user"
        logicalType: "string"
      - name: "session_start"
        logicalType: "timestamp"
      - name: "session_end"
        logicalType: "timestamp"
      - name: "events"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

fn click(mmss: &str, user: &str) -> String {
    format!(r#"{{"ts": "2024-01-01T00:{mmss}Z", "user": "{user}"}}"#)
}

fn input_files() -> Vec<(String, String)> {
    let files = [
        vec![
            click("00:00", "u1"),
            click("00:10", "u1"),
            click("00:05", "u2"),
        ],
        vec![
            click("00:20", "u1"),
            click("00:50", "u2"),
            click("00:55", "u3"),
        ],
        vec![click("01:10", "u1")],
        vec![click("01:15", "u2"), click("00:30", "u3")],
        vec![click("02:00", "u4")],
        vec![click("03:00", "u5")],
    ];
    files
        .iter()
        .enumerate()
        .map(|(i, lines)| (format!("{i:03}.jsonl"), lines.join("\n") + "\n"))
        .collect()
}

const MICRO_BATCHES: u64 = 7;

fn project(dir: &Path) {
    project_on(dir, "memory");
}

/// The project with its streaming state in `store`.
fn project_on(dir: &Path, store: &str) {
    let stream_profile =
        STREAM_PROFILE.replace("state_store: memory", &format!("state_store: {store}"));
    for (path, text) in [
        ("pipeline.yaml", PIPELINE),
        ("profiles/local.yaml", stream_profile.as_str()),
        ("profiles/batch.yaml", BATCH_PROFILE),
        ("contracts/clicks.yaml", CLICKS),
        ("contracts/sessions.yaml", SESSIONS),
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

fn run_with(dir: &Path, args: &[&str], fail_point: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(dir)
        .args(args)
        .env_remove("ETLANTIC_FAIL_POINT");
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd.output().expect("the etlantic binary runs")
}

fn run(dir: &Path, fail_point: Option<&str>) -> Output {
    run_with(
        dir,
        &["run", "pipeline.yaml", "--format", "json"],
        fail_point,
    )
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_ok(dir: &Path) {
    let o = run(dir, None);
    assert!(o.status.success(), "run failed: {}", describe(&o));
}

/// A row of the JSON-lines writer with timestamps normalised to `...Z` milliseconds.
fn canonical(line: &str) -> String {
    let mut v: BTreeMap<String, Value> = serde_json::from_str(line).unwrap();
    for k in ["session_start", "session_end", "window_start", "window_end"] {
        if let Some(t) = v.get(k).and_then(Value::as_str) {
            let t = chrono::DateTime::parse_from_rfc3339(t).unwrap();
            v.insert(
                k.into(),
                json!(t
                    .with_timezone(&chrono::Utc)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            );
        }
    }
    serde_json::to_string(&v).unwrap()
}

/// The committed sink rows as a sorted multiset of canonical JSON strings.
fn committed(dir: &Path) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed(dir.join("out/sessions")).unwrap();
    let mut rows: Vec<String> = common::json_rows(&batches)
        .iter()
        .map(|v| canonical(&v.to_string()))
        .collect();
    rows.sort();
    rows
}

fn session(user: &str, start: &str, end: &str, events: i64) -> String {
    canonical(
        &json!({"user": user, "session_start": format!("2024-01-01T00:{start}Z"),
                "session_end": format!("2024-01-01T00:{end}Z"), "events": events})
        .to_string(),
    )
}

fn expected_stream() -> Vec<String> {
    let mut v = vec![
        session("u2", "00:05", "00:35", 1),
        session("u1", "00:00", "00:50", 3),
        session("u3", "00:55", "01:25", 1),
        session("u1", "01:10", "01:40", 1),
        session("u2", "00:50", "01:45", 2),
        session("u4", "02:00", "02:30", 1),
    ];
    v.sort();
    v
}

fn progress(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("chk/progress.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What every finished streaming run must have, crashed or not.
fn check_finished(dir: &Path, label: &str) {
    check_output(dir, label);
    // The last state snapshot holds only u5's open session: one list element, one timer.
    let chk = dir.join("chk");
    let ops: Vec<String> = common::logged_state_versions(&chk).into_keys().collect();
    assert_eq!(ops.len(), 1, "{label}: one stateful operator");
    let state = [common::logged_whole_state(&chk, &ops[0], MICRO_BATCHES).expect("logged")];
    let kinds: Vec<String> = state
        .iter()
        .flat_map(|b| {
            let k = b.column_by_name("__kind").unwrap();
            let k = k
                .as_any()
                .downcast_ref::<arrow::array::StringArray>()
                .unwrap();
            (0..k.len())
                .map(|i| k.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(kinds, ["list", "timer"], "{label}");
}

/// What a finished streaming run wrote, on either state store: the sessions, the
/// quarantine, a commit per micro-batch.
fn check_output(dir: &Path, label: &str) {
    assert_eq!(
        committed(dir),
        expected_stream(),
        "{label}: committed sessions"
    );
    let q = quarantined(dir);
    assert_eq!(q.len(), 1, "{label}: the late u3 click, once: {q:?}");
    assert!(
        q[0].contains("ETL708") && q[0].contains("\"batch\":3"),
        "{label}: {q:?}"
    );
    let chk = dir.join("chk");
    let log = common::batch_log(&chk);
    for n in 0..MICRO_BATCHES {
        assert!(log.commits.contains_key(&n), "{label}: commit of batch {n}");
    }
    assert!(!log.offsets.contains_key(&MICRO_BATCHES), "{label}");
}

#[test]
fn the_example_processor_runs_from_yaml_and_summarises_sessions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    run_ok(dir);
    check_finished(dir, "uninterrupted");
    let p = progress(dir);
    let kinds: Vec<&str> = p.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    let mut expected_kinds = ["data"].repeat(6);
    expected_kinds.push("no_data");
    assert_eq!(kinds, expected_kinds);
    let op = &p[5]["stateOperators"][0];
    assert_eq!(op["operatorName"], json!("transformWithStateExec"));
    assert_eq!(op["customMetrics"]["numExpiredTimers"], json!(3));
    assert_eq!(op["customMetrics"]["numListStateVars"], json!(1));
    assert_eq!(
        p[3]["stateOperators"][0]["numRowsDroppedByWatermark"],
        json!(1)
    );
    // A restart of the finished query does nothing.
    run_ok(dir);
    check_finished(dir, "restarted");
    assert_eq!(progress(dir).len(), MICRO_BATCHES as usize);
    // `etlantic plugins` lists the processor.
    let o = run_with(dir, &["plugins"], None);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("session_summary"));
}

#[test]
fn killed_at_every_step_the_restarted_processor_query_loses_and_duplicates_nothing() {
    // 0: the first data batch; 2: the batch that fires u2's timer; 3: the batch with the
    // late row; 5: the batch that fires three timers; 6: the last (no-data) batch.
    for point in ["after_offsets", "after_sink", "after_state", "after_commit"] {
        for batch in [0u64, 2, 3, 5, 6] {
            let label = format!("{point}:{batch}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            project(dir);
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
            let chk = dir.join("chk");
            assert!(common::logged_offsets(&chk, batch).is_some(), "{label}");
            assert_eq!(
                common::logged_commit(&chk, batch).is_some(),
                point == "after_commit",
                "{label}"
            );
            run_ok(dir);
            check_finished(dir, &label);
        }
    }
}

/// The processor's state in the disk store (RocksDB): the uninterrupted run holds u5's
/// list element and timer at the end, and a run killed at every step gives the same
/// output, whether the restart finds its working copy or restores from the checkpoint
/// alone.
#[test]
fn on_the_disk_store_the_killed_processor_query_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    project_on(tmp.path(), "disk");
    run_ok(tmp.path());
    check_output(tmp.path(), "uninterrupted on disk");
    let p = progress(tmp.path());
    let last = &p.last().unwrap()["stateOperators"][0];
    assert_eq!(last["numRowsTotal"], json!(2), "{last}");
    assert_eq!(
        last["customMetrics"]["numRegisteredTimers"],
        json!(1),
        "{last}"
    );
    assert!(common::logged_state_versions(&tmp.path().join("chk")).is_empty());
    for point in ["after_offsets", "after_sink", "after_state", "after_commit"] {
        for batch in [0u64, 2, 3, 5, 6] {
            for lose_working_copy in [false, true] {
                let label = format!("{point}:{batch}, working copy lost: {lose_working_copy}");
                let tmp = tempfile::tempdir().unwrap();
                let dir = tmp.path();
                project_on(dir, "disk");
                let o = run(dir, Some(&format!("{point}:{batch}")));
                assert_eq!(o.status.signal(), Some(6), "{label}\n{}", describe(&o));
                if lose_working_copy {
                    std::fs::remove_dir_all(dir.join(".etlantic/state")).unwrap();
                }
                run_ok(dir);
                check_output(dir, &label);
            }
        }
    }
}

#[test]
fn in_batch_mode_every_session_closes_at_the_end_of_the_input() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    let o = run_with(
        dir,
        &[
            "run",
            "pipeline.yaml",
            "--profile",
            "profiles/batch.yaml",
            "--format",
            "json",
        ],
        None,
    );
    assert!(o.status.success(), "{}", describe(&o));
    let read = |name: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_to_string(dir.join("out").join(name))
            .unwrap()
            .lines()
            .map(canonical)
            .collect();
        v.sort();
        v
    };
    // No watermark, nothing late: u3's 00:30 click joins its 00:55 session, and u5's
    // session closes at the end of the input too.
    let mut want = vec![
        session("u1", "00:00", "00:50", 3),
        session("u1", "01:10", "01:40", 1),
        session("u2", "00:05", "00:35", 1),
        session("u2", "00:50", "01:45", 2),
        session("u3", "00:30", "01:25", 2),
        session("u4", "02:00", "02:30", 1),
        session("u5", "03:00", "03:30", 1),
    ];
    want.sort();
    let got = read("batch_sessions.jsonl");
    assert_eq!(got, want);
    // The built-in session window gives the same sessions.
    let window = PIPELINE.replace(
        r#"      - process:
          processor: session_summary
          keys: [user]
          time_mode: event_time
          options: {time_column: ts, gap: 30 seconds}"#,
        r#"      - window_aggregate:
          window: {type: session, column: ts, gap: 30 seconds}
          group_by: [user]
          aggregates: {events: "count_all()"}
      - select: [user, {session_start: window_start}, {session_end: window_end}, events]"#,
    );
    assert_ne!(window, PIPELINE);
    std::fs::write(dir.join("window.yaml"), window).unwrap();
    std::fs::remove_file(dir.join("out/batch_sessions.jsonl")).unwrap();
    let o = run_with(
        dir,
        &[
            "run",
            "window.yaml",
            "--profile",
            "profiles/batch.yaml",
            "--format",
            "json",
        ],
        None,
    );
    assert!(o.status.success(), "{}", describe(&o));
    assert_eq!(read("batch_sessions.jsonl"), got);
}

#[test]
fn an_unknown_processor_is_a_reference_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    std::fs::write(
        dir.join("pipeline.yaml"),
        PIPELINE.replace("processor: session_summary", "processor: session_sumary"),
    )
    .unwrap();
    let o = run_with(
        dir,
        &["validate", "pipeline.yaml", "--format", "json"],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("ETL220") && text.contains("session_sumary"),
        "{text}"
    );
    assert!(
        text.contains("session_summary"),
        "the hint lists linked processors: {text}"
    );
}
