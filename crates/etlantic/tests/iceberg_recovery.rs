//! The Iceberg sink end to end through the `etlantic` CLI, killed at every step of the
//! batch protocol (`ETLANTIC_FAIL_POINT=<point>:<batch id>` makes the process `abort()`),
//! restarted, and compared with an uninterrupted run: the table's rows, read with
//! iceberg's table scan, are the same multiset (0 lost, 0 duplicated).
//!
//! The pipeline (as in `streaming_recovery.rs`): a directory of JSON-lines click events,
//! one file per micro-batch, a 10 s watermark, a 1-minute tumbling count per campaign in
//! append mode, here into `iceberg://analytics/counts` (SQL catalog on SQLite, warehouse
//! on disk). Micro-batches alternate data / no-data: 0 d, 1 nd, ..., 10 d, 11 nd.
#![cfg(feature = "iceberg")]

mod common;
use common::crash::*;

use etlantic_core::uri::BindingUri;
use etlantic_sinks::iceberg::IcebergTarget;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

const BINDING: &str =
    "iceberg://analytics/counts?catalog=sqlite://lake/catalog.db&warehouse=lake/warehouse";

fn profile() -> String {
    click_counts_profile_into(
        r#""iceberg://analytics/counts?catalog=sqlite://lake/catalog.db&warehouse=lake/warehouse""#,
        "",
    )
}

const MICRO_BATCHES: u64 = 7;

fn project(dir: &Path) {
    write_click_counts(dir, &profile());
}

fn target(dir: &Path) -> IcebergTarget {
    IcebergTarget::from_uri(&BindingUri::parse(BINDING).unwrap())
        .unwrap()
        .resolve(dir)
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The table's rows (iceberg table scan) as a sorted multiset of canonical JSON strings.
fn committed(dir: &Path) -> Vec<String> {
    canonical_window_rows(&block_on(target(dir).read_rows()).unwrap())
}

/// The batch ids recorded in the table's snapshot summaries, oldest first.
fn sink_batches(dir: &Path) -> Vec<u64> {
    if !dir.join("lake/catalog.db").exists() {
        return vec![];
    }
    let t = target(dir);
    let mut ids: Vec<u64> = match block_on(t.committed_batches()) {
        Ok(v) => v.into_iter().map(|(_, b)| b).collect(),
        // The catalog exists but the table not yet (killed before the first commit).
        Err(_) => vec![],
    };
    ids.reverse();
    ids
}

fn reference() -> Vec<String> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    run_ok(dir);
    let rows = committed(dir);
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
    assert_eq!(rows, expected, "the uninterrupted run is right");
    // One snapshot per micro-batch, in order.
    assert_eq!(sink_batches(dir), (0..MICRO_BATCHES).collect::<Vec<_>>());
    // The table: timestamps with time zone, field ids in order.
    let t = block_on(target(dir).load_table()).unwrap();
    let types: Vec<(i32, String, String)> = t
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.id, f.name.clone(), f.field_type.to_string()))
        .collect();
    assert_eq!(
        types,
        [
            (1, "window_start", "timestamptz"),
            (2, "window_end", "timestamptz"),
            (3, "campaign", "string"),
            (4, "n", "long")
        ]
        .map(|(i, n, t)| (i, n.to_string(), t.to_string()))
    );
    rows
}

#[test]
fn iceberg_sink_killed_at_every_step_loses_and_duplicates_nothing() {
    let reference = reference();
    // 0: first data batch (no window closes: an empty sink batch), 2: the first batch
    // that emits a window, 3: a data batch with a late row, 5: the last data batch,
    // 6: the last (no-data) batch.
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
            // Where it died: the sink committed the batch unless the process died
            // before the catalog commit.
            let sink_has_batch = sink_batches(dir).contains(&batch);
            assert_eq!(
                sink_has_batch,
                !matches!(point, "after_offsets" | "in_sink"),
                "{label}: snapshot of the batch"
            );
            let expected_before: Vec<u64> = if sink_has_batch {
                (0..=batch).collect()
            } else {
                (0..batch).collect()
            };
            assert_eq!(sink_batches(dir), expected_before, "{label}");

            run_ok(dir);

            assert_eq!(
                committed(dir),
                reference,
                "{label}: rows differ from the uninterrupted run (lost or duplicated)"
            );
            // Each batch committed exactly once, in order.
            assert_eq!(
                sink_batches(dir),
                (0..MICRO_BATCHES).collect::<Vec<_>>(),
                "{label}: snapshots"
            );
        }
    }
}

#[test]
fn a_finished_query_restarted_commits_nothing_more_and_a_new_file_appends() {
    let reference = reference();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir);
    run_ok(dir);
    run_ok(dir);
    assert_eq!(committed(dir), reference);
    assert_eq!(sink_batches(dir), (0..MICRO_BATCHES).collect::<Vec<_>>());
    // A new file after the restart is picked up and closes [05:00, 06:00) once the
    // watermark passes it.
    std::fs::write(
        dir.join("in/006.jsonl"),
        r#"{"ts": "2024-01-01T00:07:00Z", "campaign": "c9", "user": "u9"}"#.to_string() + "\n",
    )
    .unwrap();
    run_ok(dir);
    let rows = committed(dir);
    assert_eq!(rows.len(), reference.len() + 1);
    assert!(rows.contains(&window("05:00", "06:00", "c1", 1)));
}

#[test]
fn batch_runs_and_complete_mode_are_refused_at_planning_and_write_nothing() {
    for (label, pipeline, profile) in [
        (
            "batch run",
            CLICK_COUNTS_PIPELINE.replace("    output_mode: append\n", ""),
            as_batch(&profile()),
        ),
        (
            "complete mode",
            CLICK_COUNTS_PIPELINE.replace("output_mode: append", "output_mode: complete"),
            profile(),
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        project(dir);
        std::fs::write(dir.join("pipeline.yaml"), pipeline).unwrap();
        std::fs::write(dir.join("profiles/local.yaml"), profile).unwrap();
        let o = run(dir, None);
        assert!(!o.status.success(), "{label}: {}", describe(&o));
        let out =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(out.contains("ETL504"), "{label}: {}", describe(&o));
        assert!(!dir.join("lake").exists(), "{label}: nothing written");
    }
}
