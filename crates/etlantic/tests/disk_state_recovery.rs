//! `state_store: disk` through the real `etlantic` binary: a deduplication whose keys live
//! in RocksDB, killed at every step of the batch protocol (`ETLANTIC_FAIL_POINT`) and
//! restarted — with its local working copy kept, and deleted (a new machine: the state
//! comes back from the checkpoint alone) — gives the rows, quarantine and offsets of an
//! uninterrupted run on the memory store.
//!
//! The click-count window aggregation of the other recovery tests runs on it too, with
//! tumbling and with session windows, and gives the memory store's windows.
//!
//! And what the disk store refuses, with a code: a store that is not linked (`ETL434`), a
//! checkpoint whose state another store wrote (`ETL804`). (An operator that cannot keep
//! its state in a store, `ETL435`, is a third-party one: every built-in operator can.)

mod common;
use common::crash::{describe, output_text, quarantined, run, CLICKS, FAIL_POINTS};
use common::{batch_log, logged_commit, logged_offsets, logged_state_versions};

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: unique_clicks
assets:
  clicks:
    contract: contracts/clicks.yaml
  unique:
    contract: contracts/unique.yaml
sources:
  - id: clicks
    asset: clicks
    event_time: {column: ts}
    watermark: 10 seconds
    late_events: {policy: quarantine}
    read_limit: {max_files: 1}
transforms:
  - id: first_clicks
    inputs:
      clicks: clicks
    steps:
      - deduplicate: {keys: [user, ts]}
sinks:
  - id: write_unique
    input: first_clicks
    asset: unique
    output_mode: append
"#;

/// The state store settings of these tests: `store`, a small memory limit and a
/// snapshot every two versions.
fn state_settings(store: &str) -> String {
    format!(
        "state_store: {store}\nstate_memory_limit: 32 MB\nstate_snapshot_every: 2\n{}",
        common::QUARANTINE
    )
}

fn profile(store: &str) -> String {
    common::available_now_profile(
        &[
            ("clicks", "file://in?format=jsonl"),
            ("unique", "file://out/unique/?format=jsonl"),
        ],
        &state_settings(store),
    )
}

/// The profile of the click-count pipeline (`common::crash`) on `store`.
fn counts_profile(store: &str) -> String {
    common::available_now_profile(
        &[
            ("clicks", "file://in?format=jsonl"),
            ("counts", "file://out/counts/?format=jsonl"),
        ],
        &state_settings(store),
    )
}

fn click(mmss: &str, campaign: &str, user: &str) -> String {
    format!(r#"{{"ts": "2024-01-01T00:{mmss}Z", "campaign": "{campaign}", "user": "{user}"}}"#)
}

/// One file per data micro-batch: repeats within a file and across files, a malformed
/// line, a bad timestamp, late rows (a repeat of a key the watermark already evicted is
/// late, never emitted twice).
fn input_files() -> Vec<String> {
    let files = [
        vec![
            click("00:10", "c1", "u1"),
            click("00:20", "c2", "u2"),
            click("00:10", "c1", "u1"),
            "{not json".to_string(),
        ],
        vec![
            click("00:10", "c1", "u1"),
            click("00:30", "c1", "u3"),
            click("00:21", "c2", "u2"),
        ],
        vec![
            click("00:50", "c3", "u4"),
            click("00:30", "c1", "u3"),
            r#"{"ts": "yesterday", "campaign": "c1", "user": "u7"}"#.to_string(),
        ],
        vec![click("01:05", "c1", "u5")],
        vec![
            click("00:10", "c1", "u1"),
            click("01:10", "c2", "u6"),
            click("01:05", "c1", "u5"),
        ],
        vec![click("02:00", "c3", "u7")],
        vec![click("01:10", "c2", "u6"), click("02:05", "c3", "u8")],
    ];
    files.iter().map(|lines| lines.join("\n") + "\n").collect()
}

fn project(dir: &Path, store: &str) {
    let unique = CLICKS.replace("\"clicks\"", "\"unique\"");
    for (path, text) in [
        ("pipeline.yaml", PIPELINE.to_string()),
        ("profiles/local.yaml", profile(store)),
        ("contracts/clicks.yaml", CLICKS.to_string()),
        ("contracts/unique.yaml", unique),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    for (i, text) in input_files().into_iter().enumerate() {
        let p = dir.join("in").join(format!("{i:03}.jsonl"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

fn run_ok(dir: &Path) {
    let o = run(dir, None);
    assert!(o.status.success(), "run failed: {}", describe(&o));
}

/// The committed sink rows as a sorted multiset of `user@ts` strings.
fn committed(dir: &Path) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed(dir.join("out/unique")).unwrap();
    let mut rows: Vec<String> = common::json_rows(&batches)
        .iter()
        .map(|v| {
            let ts = chrono::DateTime::parse_from_rfc3339(v["ts"].as_str().unwrap()).unwrap();
            format!("{}@{}", v["user"].as_str().unwrap(), ts.format("%M:%S"))
        })
        .collect();
    rows.sort();
    rows
}

/// The logged offsets as two runs with other `state_store`s agree on them.
fn offsets(dir: &Path) -> BTreeMap<u64, Value> {
    common::comparable_offsets(batch_log(&dir.join("chk")))
}

/// The versions the disk store holds of the query's one operator in the checkpoint.
fn store_versions(dir: &Path) -> Vec<u64> {
    let operators: Vec<_> = match std::fs::read_dir(dir.join("chk/state-store")) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => return vec![],
    };
    assert_eq!(operators.len(), 1, "one stateful operator: {operators:?}");
    assert!(
        operators[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("first_clicks."),
        "{operators:?}"
    );
    let at = operators[0].join("changelog");
    let mut v: Vec<u64> = match std::fs::read_dir(at) {
        Ok(d) => d
            .filter_map(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .strip_suffix(".log")?
                    .parse()
                    .ok()
            })
            .collect(),
        Err(_) => vec![],
    };
    v.sort_unstable();
    v
}

#[derive(Debug, PartialEq)]
struct Finished {
    rows: Vec<String>,
    quarantine: Vec<String>,
    offsets: BTreeMap<u64, Value>,
}

fn finished(dir: &Path) -> Finished {
    Finished {
        rows: committed(dir),
        quarantine: quarantined(dir),
        offsets: offsets(dir),
    }
}

/// The uninterrupted run on the memory store, checked by hand.
fn reference() -> Finished {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, "memory");
    run_ok(dir);
    let done = finished(dir);
    let expected: Vec<String> = [
        "u1@00:10", "u2@00:20", "u3@00:30", "u2@00:21", "u4@00:50", "u5@01:05", "u6@01:10",
        "u7@02:00", "u8@02:05",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect::<std::collections::BTreeSet<_>>()
    .into_iter()
    .collect();
    assert_eq!(done.rows, expected);
    let codes: Vec<String> = done
        .quarantine
        .iter()
        .map(|q| {
            serde_json::from_str::<Value>(q).unwrap()["code"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    // The malformed line, the bad timestamp, and the late repeat of file 4 (u1 at 00:10,
    // behind the watermark of 00:55). File 6's repeat of u6 at 01:10 is judged against
    // the watermark of micro-batch 5 (01:00, from file 4's 01:10): on time, and dropped
    // as a duplicate.
    let mut want = vec!["ETL701", "ETL702", "ETL708"];
    want.sort_unstable();
    let mut got = codes.clone();
    got.sort_unstable();
    assert_eq!(got, want, "{:?}", done.quarantine);
    done
}

#[test]
fn the_disk_store_gives_the_memory_stores_rows_and_keeps_versions_in_the_checkpoint() {
    let reference = reference();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, "disk");
    run_ok(dir);
    assert_eq!(finished(dir), reference);
    // The state is in the store's part of the checkpoint, not in the state log.
    let chk = dir.join("chk");
    assert!(
        logged_state_versions(&chk).is_empty(),
        "no state log entries for an operator on the disk store"
    );
    let batches = reference.offsets.len() as u64;
    let versions = store_versions(dir);
    assert_eq!(
        versions,
        (1..=batches).collect::<Vec<_>>(),
        "a version per micro-batch"
    );
    // The progress records carry the store's commit figures.
    let progress = std::fs::read_to_string(chk.join("progress.jsonl")).unwrap();
    let last: Value = serde_json::from_str(progress.lines().last().unwrap()).unwrap();
    let op = &last["stateOperators"][0];
    assert_eq!(op["operatorName"], json!("dedupe"));
    assert!(
        op["customMetrics"]["stateStoreTotalBytes"]
            .as_i64()
            .unwrap()
            > 0,
        "{op}"
    );
    assert!(
        op["customMetrics"].get("stateStoreBytesCopied").is_some(),
        "{op}"
    );
    // Two of the keys are still held (02:00 and 02:05: the watermark is 01:55).
    assert_eq!(op["numRowsTotal"], json!(2), "{op}");
}

#[test]
fn killed_at_every_step_on_the_disk_store_the_restart_loses_and_duplicates_nothing() {
    let reference = reference();
    let batches = reference.offsets.len() as u64;
    for point in FAIL_POINTS {
        for batch in [0u64, 2, 4, 5, batches - 1] {
            for lose_working_copy in [false, true] {
                let label = format!("{point}:{batch}, working copy lost: {lose_working_copy}");
                let tmp = tempfile::tempdir().unwrap();
                let dir = tmp.path();
                project(dir, "disk");
                let o = run(dir, Some(&format!("{point}:{batch}")));
                assert_eq!(
                    o.status.signal(),
                    Some(6),
                    "{label}: must abort\n{}",
                    describe(&o)
                );
                let chk = dir.join("chk");
                assert!(logged_offsets(&chk, batch).is_some(), "{label}");
                let committed_n = logged_commit(&chk, batch).is_some();
                let state_n = store_versions(dir).contains(&(batch + 1));
                match point {
                    "after_offsets" => assert!(!state_n && !committed_n, "{label}"),
                    "in_sink" | "after_sink" => assert!(!committed_n, "{label}"),
                    "after_state" => assert!(state_n && !committed_n, "{label}"),
                    _ => assert!(state_n && committed_n, "{label}"),
                }
                if lose_working_copy {
                    let working = dir.join(".etlantic/state");
                    assert!(working.is_dir(), "{label}: the working copy is there");
                    std::fs::remove_dir_all(&working).unwrap();
                }

                run_ok(dir);

                assert_eq!(finished(dir), reference, "{label}");
                let versions = store_versions(dir);
                assert_eq!(
                    versions.last(),
                    Some(&batches),
                    "{label}: the last version {versions:?}"
                );
            }
        }
    }
}

#[test]
fn what_the_disk_store_refuses_is_refused_with_a_code() {
    // A store that is not linked.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, "tape");
    let o = run(dir, None);
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL434"), "{text}");
    assert!(
        text.contains("disk") && text.contains("memory"),
        "names the linked ones: {text}"
    );

    // A checkpoint whose state the memory store wrote, restarted on the disk store (and
    // back): refused, never an empty state.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, "memory");
    let o = run(dir, Some("after_commit:2"));
    assert_eq!(o.status.signal(), Some(6), "{}", describe(&o));
    std::fs::write(dir.join("profiles/local.yaml"), profile("disk")).unwrap();
    let o = run(dir, None);
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL804"), "{text}");
    std::fs::write(dir.join("profiles/local.yaml"), profile("memory")).unwrap();
    run_ok(dir);
    assert_eq!(committed(dir), reference().rows);
}

/// The 1-minute tumbling click counts of `streaming_recovery`, and the same counts over
/// 30-second session windows, on the disk store: the same windows as in memory, killed at
/// a step of the batch protocol or not.
#[test]
fn window_counts_on_the_disk_store_match_the_memory_store() {
    let tumbling = "window: {type: tumbling, column: ts, size: 1 minute}";
    let session = "window: {type: session, column: ts, gap: 30 seconds}";
    let counts = |store: &str, window: &str, fail: Option<&str>| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        common::crash::write_click_counts(dir, &counts_profile(store));
        let pipeline = std::fs::read_to_string(dir.join("pipeline.yaml")).unwrap();
        assert!(pipeline.contains(tumbling));
        std::fs::write(
            dir.join("pipeline.yaml"),
            pipeline.replace(tumbling, window),
        )
        .unwrap();
        if let Some(point) = fail {
            let o = run(dir, Some(point));
            assert_eq!(o.status.signal(), Some(6), "{point}: {}", describe(&o));
        }
        run_ok(dir);
        let batches = etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap();
        common::crash::canonical_window_rows(&batches)
    };
    for (window, windows) in [(tumbling, Some(7)), (session, None)] {
        let memory = counts("memory", window, None);
        assert!(!memory.is_empty(), "{window}: windows are emitted");
        if let Some(n) = windows {
            assert_eq!(memory.len(), n, "{memory:?}");
        }
        assert_eq!(counts("disk", window, None), memory, "{window}");
        for point in ["after_state:2", "in_sink:3", "after_commit:5"] {
            assert_eq!(
                counts("disk", window, Some(point)),
                memory,
                "{window}, {point}"
            );
        }
    }
}
