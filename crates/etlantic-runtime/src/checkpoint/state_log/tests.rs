//! Tests of the state log.

use super::*;
use arrow::array::Int64Array;
use arrow::datatypes::{DataType, Field, Schema};
use std::fs;
use std::sync::Arc;

fn batch(values: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
}

fn ids(b: &RecordBatch) -> Vec<i64> {
    b.column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .values()
        .to_vec()
}

fn open(root: &Path) -> StateLog {
    StateLog::open(root.join("state-changes"), root.join("state")).unwrap()
}

/// Appends changes of the given ids for each operator.
fn append(log: &StateLog, version: u64, since: u64, ops: &[(&str, &[i64])]) {
    let batches: Vec<(&str, RecordBatch)> = ops.iter().map(|(op, ids)| (*op, batch(ids))).collect();
    let entries: Vec<(&str, LogEntry<'_>)> = batches
        .iter()
        .map(|(op, b)| (*op, LogEntry::Changes(b)))
        .collect();
    log.append(version, since, &entries).unwrap();
}

/// The logged changes of `op` at `version`: their `since` and ids.
fn changes(log: &StateLog, op: &str, version: u64) -> Option<(u64, Vec<i64>)> {
    match log.read(op, version).unwrap()? {
        Logged::Changes { since, changes } => Some((since, ids(&changes))),
        Logged::Whole(_) => panic!("{op}@{version} is whole, not changes"),
    }
}

fn segment_names(root: &Path) -> Vec<u64> {
    segments(&etlantic_core::storage::LocalStorage::new(
        root.join("state-changes"),
    ))
    .unwrap()
    .into_iter()
    .map(|(f, _)| f)
    .collect()
}

#[test]
fn records_round_trip_across_a_reopen_and_the_last_record_of_a_version_wins() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    append(&log, 1, 0, &[("t.a", &[1, 2]), ("t.b", &[3])]);
    append(&log, 2, 1, &[("t.a", &[4]), ("t.b", &[])]);
    // A re-run of version 2 (its batch did not commit) writes it again.
    append(&log, 2, 1, &[("t.a", &[5]), ("t.b", &[6])]);
    // An operator without a changelog logs its whole state.
    let whole = batch(&[8, 9]);
    log.append(2, 1, &[("t.w", LogEntry::Whole(&whole))])
        .unwrap();
    let check = |log: &StateLog| {
        assert_eq!(changes(log, "t.a", 1), Some((0, vec![1, 2])));
        assert_eq!(changes(log, "t.a", 2), Some((1, vec![5])));
        assert_eq!(changes(log, "t.b", 2), Some((1, vec![6])));
        assert_eq!(changes(log, "t.a", 3), None);
        assert_eq!(changes(log, "t.c", 1), None);
        match log.read("t.w", 2).unwrap() {
            Some(Logged::Whole(b)) => assert_eq!(ids(&b), vec![8, 9]),
            other => panic!("{other:?}"),
        }
    };
    check(&log);
    drop(log);
    let log = open(dir.path());
    check(&log);
    let versions = logged_versions(&dir.path().join("state-changes")).unwrap();
    assert_eq!(versions["t.a"], vec![1, 2]);
    assert_eq!(versions["t.w"], vec![2]);
    match read_logged(&dir.path().join("state-changes"), "t.a", 2).unwrap() {
        Some(Logged::Changes { since: 1, changes }) => assert_eq!(ids(&changes), vec![5]),
        other => panic!("{other:?}"),
    }
    // Appends go on in the same segment after a reopen.
    append(&log, 3, 2, &[("t.a", &[7])]);
    assert_eq!(segment_names(dir.path()), vec![1]);
    assert_eq!(changes(&log, "t.a", 3), Some((2, vec![7])));
}

fn last_segment(root: &Path) -> std::path::PathBuf {
    let name = segments(&etlantic_core::storage::LocalStorage::new(
        root.join("state-changes"),
    ))
    .unwrap()
    .pop()
    .unwrap()
    .1;
    root.join("state-changes").join(name)
}

#[test]
fn a_torn_last_record_is_cut_off_on_open_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    append(&log, 1, 0, &[("t.a", &[1])]);
    append(&log, 2, 1, &[("t.a", &[2, 3, 4])]);
    drop(log);
    let path = last_segment(dir.path());
    let intact = fs::read(&path).unwrap();
    // Cuts inside the last record: its prefix, head or payload torn.
    let second = record_at(&intact, 0, true).unwrap().2;
    for cut in [second + 3, second + 20, intact.len() - 1] {
        fs::write(&path, &intact[..cut]).unwrap();
        let log = open(dir.path());
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            second as u64,
            "cut {cut}"
        );
        assert_eq!(changes(&log, "t.a", 2), None);
        append(&log, 2, 1, &[("t.a", &[9])]);
        drop(log);
        let log = open(dir.path());
        assert_eq!(changes(&log, "t.a", 2), Some((1, vec![9])));
        assert_eq!(changes(&log, "t.a", 1), Some((0, vec![1])));
    }
    // A last record whose payload lost its bytes (zeros where the machine had not
    // written them) fails its checksum and is cut off too.
    let mut zeroed = intact.clone();
    let n = zeroed.len();
    zeroed[n - 8..].fill(0);
    fs::write(&path, &zeroed).unwrap();
    let log = open(dir.path());
    assert_eq!(changes(&log, "t.a", 2), None);
    assert_eq!(fs::metadata(&path).unwrap().len(), second as u64);
}

#[test]
fn a_damaged_record_before_an_intact_one_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    append(&log, 1, 0, &[("t.a", &[1])]);
    append(&log, 2, 1, &[("t.a", &[2])]);
    drop(log);
    let path = last_segment(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let first_end = record_at(&bytes, 0, true).unwrap().2;
    bytes[first_end - 1] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let e = StateLog::open(dir.path().join("state-changes"), dir.path().join("state")).unwrap_err();
    assert_eq!(e.code(), "ETL801", "{e}");
    // Nothing was cut.
    assert_eq!(fs::read(&path).unwrap(), bytes);
    // In a segment before the last, a damaged head is corruption too.
    let mut head_damaged = bytes[..first_end].to_vec();
    head_damaged[PREFIX + 2] ^= 0xff;
    fs::write(&path, &head_damaged).unwrap();
    fs::write(dir.path().join("state-changes/11.log"), b"").unwrap();
    let e = StateLog::open(dir.path().join("state-changes"), dir.path().join("state")).unwrap_err();
    assert_eq!(e.code(), "ETL801", "{e}");
}

#[test]
fn segments_go_once_every_operator_has_a_later_durable_whole_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    for v in 1..=45 {
        append(&log, v, v - 1, &[("t.a", &[v as i64]), ("t.b", &[])]);
    }
    assert_eq!(segment_names(dir.path()), vec![1, 11, 21, 31, 41]);
    // Whole snapshots of one operator only: the other one's chain needs everything.
    log.note_whole("t.a", 20);
    log.note_whole("t.a", 40);
    assert_eq!(segment_names(dir.path()), vec![1, 11, 21, 31, 41]);
    // Both at 20 and 40: chains start at 20 at the earliest (the batch before 40 may
    // run again), so the segment of versions 1 to 10 goes; 11 to 20 stays.
    log.note_whole("t.b", 20);
    log.note_whole("t.b", 40);
    assert_eq!(segment_names(dir.path()), vec![11, 21, 31, 41]);
    assert_eq!(changes(&log, "t.a", 10), None);
    assert_eq!(changes(&log, "t.a", 11), Some((10, vec![11])));
    // The margin of KEPT_VERSIONS: a whole snapshot at 44 keeps 24 on.
    log.note_whole("t.a", 44);
    log.note_whole("t.b", 44);
    assert_eq!(segment_names(dir.path()), vec![21, 31, 41]);
    // The same after a reopen, which reads the whole snapshots from the state files.
    drop(log);
    for op in ["t.a", "t.b"] {
        let d = dir.path().join("state").join(op);
        fs::create_dir_all(&d).unwrap();
        for v in [40, 44, 55] {
            fs::write(d.join(format!("{v}.arrow")), b"").unwrap();
        }
    }
    let log = open(dir.path());
    assert!(log.may_have_stale_whole(55));
    assert!(!log.may_have_stale_whole(56));
    append(&log, 56, 55, &[("t.a", &[]), ("t.b", &[])]);
    // Whole snapshots at 44 and 55: segments wholly before min(44, 55 - 20) = 35 go.
    assert_eq!(segment_names(dir.path()), vec![31, 41, 56]);
}

#[test]
fn an_operator_whose_whole_state_is_logged_keeps_its_last_versions() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    for v in 1..=60 {
        let whole = batch(&[v as i64]);
        log.append(v, v - 1, &[("t.w", LogEntry::Whole(&whole))])
            .unwrap();
    }
    // Old segments go when a new one starts: at 51, the newest whole state is 50's,
    // and chains need 30 on (50 - KEPT_VERSIONS), so the segments up to 20 are gone.
    assert_eq!(segment_names(dir.path()), vec![21, 31, 41, 51]);
    match log.read("t.w", 45).unwrap() {
        Some(Logged::Whole(b)) => assert_eq!(ids(&b), vec![45]),
        other => panic!("{other:?}"),
    }
}
