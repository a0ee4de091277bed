//! Checkpoint recovery by killing the real `etlantic` process at every step of the batch
//! protocol (`ETLANTIC_FAIL_POINT=<point>:<batch id>` makes it `abort()`), restarting it,
//! and comparing the committed sink output and the quarantine with an uninterrupted run.
//!
//! The pipeline: a directory of JSON-lines click events (one file per micro-batch via
//! `read_limit: {max_files: 1}`), event time with a 10 s watermark, late events
//! quarantined, a 1-minute tumbling count per campaign in append mode, a file sink
//! directory. Every data batch moves the watermark, so micro-batches alternate data /
//! no-data: 0 d, 1 nd, 2 d, ..., 10 d (the last file), 11 nd.

mod common;
use common::crash::*;
use common::{batch_log, logged_commit, logged_offsets, logged_state_versions};

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

const MICRO_BATCHES: u64 = 7;

fn project(dir: &Path) {
    write_click_counts(dir, &click_counts_profile(""));
}

/// The committed sink rows as a sorted multiset of canonical JSON strings.
fn committed(dir: &Path) -> Vec<String> {
    canonical_window_rows(&etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap())
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The logged offsets without their batch timestamps, and the source's file log.
fn offsets_and_files(dir: &Path) -> (BTreeMap<u64, Value>, BTreeMap<String, Vec<String>>) {
    let chk = dir.join("chk");
    let mut offsets = BTreeMap::new();
    for n in 0..MICRO_BATCHES + 2 {
        if let Some(mut v) = logged_offsets(&chk, n) {
            v.as_object_mut().unwrap().remove("batchTimestampMs");
            offsets.insert(n, v);
        }
    }
    let mut files = BTreeMap::new();
    let log = etlantic_sources::files::SeenLog::open(chk.join("sources/0")).unwrap();
    for index in 0..=log.last_index().unwrap_or(0) {
        if let Some(list) = log.files(index).unwrap() {
            files.insert(
                index.to_string(),
                list.into_iter().map(|f| f.path).collect::<Vec<_>>(),
            );
        }
    }
    (offsets, files)
}

/// The state versions the single operator has in the state log (none before its first
/// state write).
fn state_versions(dir: &Path) -> Vec<u64> {
    let logged = logged_state_versions(&dir.join("chk"));
    assert!(logged.len() <= 1, "one stateful operator: {logged:?}");
    logged.into_values().next().unwrap_or_default()
}

/// Checks what every finished run must have, crashed or not.
fn check_finished(dir: &Path, reference: &Reference, label: &str) {
    assert_eq!(
        committed(dir),
        reference.rows,
        "{label}: committed output differs from the uninterrupted run (lost or duplicated rows)"
    );
    assert_eq!(
        quarantined(dir),
        reference.quarantine,
        "{label}: quarantine differs from the uninterrupted run"
    );
    let (offsets, files) = offsets_and_files(dir);
    assert_eq!(offsets, reference.offsets, "{label}: offsets log differs");
    assert_eq!(files, reference.files, "{label}: file assignment differs");
    let chk = dir.join("chk");
    let log = batch_log(&chk);
    for n in 0..MICRO_BATCHES {
        assert!(log.commits.contains_key(&n), "{label}: commit of batch {n}");
    }
    assert!(!log.offsets.contains_key(&MICRO_BATCHES));
    // State versions N+1 for the last ten batches (older ones are pruned).
    let state = state_versions(dir);
    for n in MICRO_BATCHES.saturating_sub(10)..MICRO_BATCHES {
        assert!(
            state.contains(&(n + 1)),
            "{label}: state version {} of batch {n}",
            n + 1
        );
    }
}

struct Reference {
    rows: Vec<String>,
    quarantine: Vec<String>,
    offsets: BTreeMap<u64, Value>,
    files: BTreeMap<String, Vec<String>>,
}

fn reference() -> Reference {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    run_ok(dir);
    let rows = committed(dir);
    // The uninterrupted run itself is right.
    let mut expected = vec![
        window("00:00", "01:00", "c1", 2),
        window("00:00", "01:00", "c2", 1),
        window("01:00", "02:00", "c1", 2),
        window("01:00", "02:00", "c2", 1),
        window("02:00", "03:00", "c2", 1),
        window("02:00", "03:00", "c3", 1),
        window("03:00", "04:00", "c3", 1),
    ];
    expected.sort();
    assert_eq!(rows, expected);
    let q =
        etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl")).unwrap();
    let mut seen: Vec<(String, Value, Value)> = q
        .iter()
        .map(|l| {
            (
                l["code"].as_str().unwrap().to_string(),
                l["position"].clone(),
                l["batch_id"].clone(),
            )
        })
        .collect();
    seen.sort_by_key(|(c, _, _)| c.clone());
    assert_eq!(seen.len(), 3, "{q:?}");
    assert_eq!(seen[0].0, "ETL701");
    assert_eq!(seen[0].1["file"], json!("in/000.jsonl"));
    assert_eq!(seen[0].1["line"], json!(4));
    assert_eq!(seen[0].2, json!(0));
    assert_eq!(seen[1].0, "ETL702");
    assert_eq!(seen[1].1["file"], json!("in/002.jsonl"));
    assert_eq!(seen[1].1["line"], json!(2));
    assert_eq!(seen[1].2, json!(2));
    assert_eq!(seen[2].0, "ETL708", "the late 00:30 click");
    assert_eq!(seen[2].2, json!(3));
    let (offsets, files) = offsets_and_files(dir);
    let kinds: Vec<&str> = offsets
        .values()
        .map(|v| v["kind"].as_str().unwrap())
        .collect();
    // A backlog runs its data batches back to back (each evicts with the watermark the
    // previous one advanced, as Spark does); one no-data batch closes the run.
    let mut expected_kinds = ["data"].repeat(6);
    expected_kinds.push("no_data");
    assert_eq!(kinds, expected_kinds);
    let expected_files: BTreeMap<String, Vec<String>> = (0..6)
        .map(|i| (i.to_string(), vec![format!("{i:03}.jsonl")]))
        .collect();
    assert_eq!(files, expected_files, "one file per data batch");
    let reference = Reference {
        quarantine: quarantined(dir),
        rows,
        offsets,
        files,
    };
    check_finished(dir, &reference, "reference");
    reference
}

#[test]
fn killed_at_every_step_the_restarted_query_loses_and_duplicates_nothing() {
    let reference = reference();
    // 0: first data batch (with a malformed line), 2: the first batch that emits a
    // window (and has a bad record), 3: the data batch with the late row, 5: the last data
    // batch, 6: the last (no-data) batch.
    for point in FAIL_POINTS {
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
            // Where it died.
            let chk = dir.join("chk");
            let offsets_n = logged_offsets(&chk, batch);
            let committed_n = logged_commit(&chk, batch).is_some();
            let state_n = state_versions(dir).contains(&(batch + 1));
            assert!(offsets_n.is_some(), "{label}: offsets of {batch} logged");
            assert!(logged_offsets(&chk, batch + 1).is_none());
            // The sink already holds the batch unless the process died before the sinks.
            let sink_logged = dir
                .join("out/counts/_etlantic_sink")
                .join(batch.to_string())
                .exists();
            // In the middle of the write the data file may be there, the log entry not.
            assert_eq!(
                sink_logged,
                !matches!(point, "after_offsets" | "in_sink"),
                "{label}: sink log"
            );
            match point {
                "after_offsets" => assert!(!state_n && !committed_n, "{label}"),
                // The state snapshot is written while the sinks write: it may be there.
                "in_sink" | "after_sink" => assert!(!committed_n, "{label}"),
                "after_state" => assert!(state_n && !committed_n, "{label}"),
                _ => assert!(committed_n, "{label}"),
            }
            let (_, files_before) = offsets_and_files(dir);

            run_ok(dir);

            // The logged batch was re-run with exactly its logged offsets and files.
            assert_eq!(
                logged_offsets(&chk, batch),
                offsets_n,
                "{label}: offsets of {batch} re-used"
            );
            let (_, files_after) = offsets_and_files(dir);
            for (index, list) in &files_before {
                assert_eq!(
                    files_after.get(index),
                    Some(list),
                    "{label}: files of index {index}"
                );
            }
            check_finished(dir, &reference, &label);
            // The restart ran the rest: the replayed batch (or the next) first.
            let progress: Vec<Value> = read(&chk.join("progress.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let ids: Vec<u64> = progress
                .iter()
                .map(|p| p["batchId"].as_u64().unwrap())
                .collect();
            let resumed_at = if point == "after_commit" {
                batch + 1
            } else {
                batch
            };
            // (A batch killed after its commit never wrote its progress record.)
            let mut expected: Vec<u64> = (0..batch).collect();
            expected.extend(resumed_at..MICRO_BATCHES);
            assert_eq!(ids, expected, "{label}: progress batch ids");
        }
    }
}

/// A machine crash may lose the last commit record: it is appended to the log without a
/// sync (the next offsets record's sync makes it durable). The restart cuts the torn
/// record off and runs the batch again; the sink writes nothing twice.
#[test]
fn a_commit_torn_by_a_machine_crash_runs_its_batch_again() {
    let reference = reference();
    for batch in [2u64, 5] {
        let label = format!("torn commit of {batch}");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        project(dir);
        let o = run(dir, Some(&format!("after_commit:{batch}")));
        assert_eq!(o.status.signal(), Some(6), "{label}\n{}", describe(&o));
        let chk = dir.join("chk");
        assert!(logged_commit(&chk, batch).is_some(), "{label}");
        // What the machine kept of the log: all but the second half of the commit.
        let segment = std::fs::read_dir(chk.join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .max_by_key(|p| {
                p.file_stem()
                    .unwrap()
                    .to_string_lossy()
                    .parse::<u64>()
                    .unwrap()
            })
            .unwrap();
        let bytes = std::fs::read(&segment).unwrap();
        let body = &bytes[..bytes.len() - 1];
        let last_line = body.iter().rposition(|b| *b == b'\n').unwrap() + 1;
        let cut = last_line + (bytes.len() - last_line) / 2;
        std::fs::write(&segment, &bytes[..cut]).unwrap();
        assert!(
            logged_commit(&chk, batch).is_none(),
            "{label}: the commit is torn"
        );
        assert!(logged_offsets(&chk, batch).is_some(), "{label}");

        run_ok(dir);
        check_finished(dir, &reference, &label);
    }
}

/// A machine crash in the middle of a quarantine append leaves a torn last line. The
/// restart used to fail on it (ETL706) every time; now it cuts the torn line off, runs
/// the batch again and writes its records once.
#[test]
fn a_quarantine_line_torn_by_a_crash_is_cut_off_and_written_again() {
    let reference = reference();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    // Batch 2 quarantines the bad timestamp of file 2, then dies in its sink.
    let o = run(dir, Some("in_sink:2"));
    assert_eq!(o.status.signal(), Some(6), "{}", describe(&o));
    let path = dir.join("out/quarantine.jsonl");
    let bytes = std::fs::read(&path).unwrap();
    let body = &bytes[..bytes.len() - 1];
    let last_line = body.iter().rposition(|b| *b == b'\n').unwrap() + 1;
    let torn = &bytes[..last_line + (bytes.len() - last_line) / 2];
    std::fs::write(&path, torn).unwrap();
    assert!(!torn.ends_with(b"\n"));

    run_ok(dir);
    check_finished(dir, &reference, "torn quarantine line");
}

/// Runs the pipeline with extra arguments.
fn run_with(dir: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .args(extra)
        .env_remove("ETLANTIC_FAIL_POINT")
        .output()
        .expect("the etlantic binary runs")
}

/// An available-now backfill stops after `--max-batches` micro-batches (it used to run
/// to the end regardless), leaving only committed batches; the next runs go on from the
/// checkpoint and end as the uninterrupted run.
#[test]
fn an_available_now_backfill_stops_at_max_batches_and_resumes() {
    let reference = reference();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    let chk = dir.join("chk");
    let mut expected_commits = 0u64;
    for step in [2u64, 3] {
        let o = run_with(dir, &["--max-batches", &step.to_string()]);
        assert!(o.status.success(), "{}", describe(&o));
        expected_commits += step;
        let log = batch_log(&chk);
        let committed: Vec<u64> = log.commits.keys().copied().collect();
        assert_eq!(
            committed,
            (0..expected_commits).collect::<Vec<_>>(),
            "after --max-batches {step}"
        );
        assert!(
            !log.offsets.contains_key(&expected_commits),
            "no batch started after the last one allowed"
        );
    }
    run_ok(dir);
    check_finished(dir, &reference, "resumed backfill");
}

/// Ctrl-C (SIGINT) stops an available-now backfill after the current micro-batch: the
/// process exits 0 with every started batch committed, and the next run finishes the
/// backlog with the output of an uninterrupted run.
#[test]
fn ctrl_c_stops_an_available_now_backfill_cleanly_and_it_resumes() {
    const EXTRA_FILES: usize = 400;
    let setup = |dir: &Path| {
        project(dir);
        for i in 0..EXTRA_FILES {
            // One click a file, 10 s apart from 06:00 on: every file a data batch.
            let secs = 360 + 10 * i;
            let line = format!(
                r#"{{"ts": "2024-01-01T{:02}:{:02}:{:02}Z", "campaign": "c{}", "user": "u"}}"#,
                secs / 3600,
                secs / 60 % 60,
                secs % 60,
                i % 3
            );
            std::fs::write(dir.join(format!("in/{:03}.jsonl", 6 + i)), line + "\n").unwrap();
        }
    };
    let whole = tempfile::tempdir().unwrap();
    setup(whole.path());
    run_ok(whole.path());
    let expected = committed(whole.path());

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env_remove("ETLANTIC_FAIL_POINT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first progress record, then interrupt.
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    loop {
        let line = lines.next().expect("a progress record").unwrap();
        if line.contains("\"batchId\"") {
            break;
        }
    }
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit {status:?}: {rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("Ctrl-C")),
        "the stop is announced: {rest:?}"
    );
    let log = batch_log(&dir.join("chk"));
    let committed_ids: Vec<u64> = log.commits.keys().copied().collect();
    let n = committed_ids.len() as u64;
    assert!(
        n < EXTRA_FILES as u64,
        "stopped early, not at the end of the backlog: {n} batches"
    );
    assert_eq!(committed_ids, (0..n).collect::<Vec<_>>());
    assert!(!log.offsets.contains_key(&n), "nothing started and left");

    run_ok(dir);
    assert_eq!(committed(dir), expected, "resumed after Ctrl-C");
}

/// A source file appended to after the stream picked it up (here: between the crash of
/// its batch and the replay) is never read with its new bytes: the replay rejects the
/// whole file with ETL713. Under `on_error: fail` the query stops with a diagnostic naming
/// the file; under the default `quarantine` the file is quarantined and the query goes on.
#[test]
fn a_source_file_changed_before_its_replay_fails_or_is_quarantined() {
    for fail in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        project(dir);
        if fail {
            let profile = dir.join("profiles/local.yaml");
            let text = std::fs::read_to_string(&profile).unwrap();
            std::fs::write(&profile, text + "on_error: fail\n").unwrap();
            // Without the malformed line of file 0, which `fail` would stop at first.
            let f0 = dir.join("in/000.jsonl");
            let text = std::fs::read_to_string(&f0).unwrap();
            std::fs::write(&f0, text.replace("{not json\n", "")).unwrap();
        }
        let o = run(dir, Some("after_offsets:1"));
        assert_eq!(o.status.signal(), Some(6), "{}", describe(&o));
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("in/001.jsonl"))
            .unwrap()
            .write_all((click("01:20", "c9", "u9") + "\n").as_bytes())
            .unwrap();
        let o = run(dir, None);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if fail {
            assert_eq!(o.status.code(), Some(4), "{}", describe(&o));
            assert!(text.contains("ETL705") && text.contains("ETL713"), "{text}");
            assert!(text.contains("in/001.jsonl"), "{text}");
            continue;
        }
        assert!(o.status.success(), "{}", describe(&o));
        let q = etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl"))
            .unwrap();
        let changed: Vec<&Value> = q.iter().filter(|l| l["code"] == "ETL713").collect();
        assert_eq!(changed.len(), 1, "{q:#?}");
        assert_eq!(changed[0]["position"]["file"], "in/001.jsonl");
        assert_eq!(changed[0]["batch_id"], 1);
        // None of the file's clicks (old or new) were counted.
        let rows = committed(dir);
        assert!(!rows.iter().any(|r| r.contains("c9")), "{rows:?}");
        assert!(
            rows.contains(&window("01:00", "02:00", "c1", 1)),
            "01:05 c1 of file 1 not counted: {rows:?}"
        );
    }
}

#[test]
fn a_finished_query_restarted_does_nothing_and_keeps_its_output() {
    let reference = reference();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    run_ok(dir);
    run_ok(dir);
    check_finished(dir, &reference, "restarted");
    // A new file after the restart is picked up as batch 12 and closes [05:00, 06:00)
    // once the watermark passes it.
    std::fs::write(dir.join("in/006.jsonl"), click("07:00", "c9", "u9") + "\n").unwrap();
    run_ok(dir);
    let rows = committed(dir);
    assert_eq!(rows.len(), reference.rows.len() + 1);
    assert!(rows.contains(&window("05:00", "06:00", "c1", 1)));
}

/// Under a state checkpoint interval longer than the run, no micro-batch writes the
/// aggregation's state: a restart after a kill rebuilds it by running every committed
/// micro-batch again from its logged offsets (writing nothing), then re-runs the killed
/// one. The sink and the quarantine end up as in the uninterrupted run.
#[test]
fn killed_under_a_state_checkpoint_interval_the_restart_rebuilds_the_state() {
    let reference = reference();
    for point in ["in_sink", "after_sink", "after_commit"] {
        for batch in [2u64, 3, 5] {
            let label = format!("interval {point}:{batch}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            project(dir);
            let profile = dir.join("profiles/local.yaml");
            let text = std::fs::read_to_string(&profile).unwrap();
            std::fs::write(&profile, text + "state_checkpoint_interval: 1 hour\n").unwrap();
            let o = run(dir, Some(&format!("{point}:{batch}")));
            assert_eq!(o.status.signal(), Some(6), "{label}\n{}", describe(&o));
            run_ok(dir);
            assert_eq!(committed(dir), reference.rows, "{label}: committed output");
            assert_eq!(
                quarantined(dir),
                reference.quarantine,
                "{label}: quarantine"
            );
            // The same offsets log, but for the plan fingerprint (the profile differs).
            let unfingerprinted = |log: &BTreeMap<u64, Value>| {
                let mut log = log.clone();
                for e in log.values_mut() {
                    e["conf"]["planFingerprint"] = Value::Null;
                }
                log
            };
            let (offsets, files) = offsets_and_files(dir);
            assert_eq!(
                unfingerprinted(&offsets),
                unfingerprinted(&reference.offsets),
                "{label}: offsets log"
            );
            assert_eq!(files, reference.files, "{label}: file assignment");
            assert!(
                state_versions(dir).is_empty(),
                "{label}: no state was written"
            );
            let last = logged_commit(&dir.join("chk"), MICRO_BATCHES - 1).unwrap();
            assert_eq!(last["stateVersion"], json!(0), "{label}: {last}");
        }
    }
}
