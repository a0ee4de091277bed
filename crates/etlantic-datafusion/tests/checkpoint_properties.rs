//! Property tests of the checkpoint readers (proptest). The micro-batch log and the state
//! log are written by their own writers, then damaged — cut anywhere, a byte changed
//! anywhere, garbage appended — and opened again. Opening never panics; what it reads is
//! what was written, never a changed record; a cut only loses the records it cut; any
//! other damage is either repaired as a torn tail or refused with ETL801.

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use etlantic_runtime::checkpoint::batch_log::{read_all, BatchLog};
use etlantic_runtime::checkpoint::state_log::{read_logged, LogEntry, Logged, StateLog};
use etlantic_runtime::checkpoint::{CommitEntry, OffsetEntry, SourceRange};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn offsets(batch: u64, note: &str) -> OffsetEntry {
    OffsetEntry {
        batch_watermark_ms: batch as i64 * 10,
        late_watermark_ms: 0,
        batch_timestamp_ms: 1_000 + batch as i64,
        kind: "data".into(),
        sources: BTreeMap::from([(
            "s".into(),
            SourceRange {
                start: Some(serde_json::json!({"index": batch, "note": note})),
                end: Some(serde_json::json!({"index": batch + 1})),
            },
        )]),
        conf: BTreeMap::new(),
    }
}

fn commit(batch: u64) -> CommitEntry {
    CommitEntry {
        next_batch_watermark_ms: batch as i64 * 10 + 5,
        max_event_time_ms: BTreeMap::from([("s".into(), batch as i64)]),
        state_version: None,
    }
}

/// What damage to do to the last segment.
#[derive(Clone, Debug)]
enum Damage {
    Cut(usize),
    Flip(usize, u8),
    Append(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::Cut),
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Damage::Flip(i, x)),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(Damage::Append),
    ]
}

/// Damages the file; returns the length of the file before the damage point that is
/// untouched (every byte before it is as written).
fn apply(path: &Path, d: &Damage) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let intact = match d {
        Damage::Cut(at) => {
            let at = at % (bytes.len() + 1);
            bytes.truncate(at);
            at
        }
        Damage::Flip(at, x) => {
            let at = at % bytes.len();
            bytes[at] ^= x;
            at
        }
        Damage::Append(garbage) => {
            let n = bytes.len();
            bytes.extend_from_slice(garbage);
            n
        }
    };
    std::fs::write(path, &bytes).unwrap();
    intact
}

fn segment(dir: &Path) -> std::path::PathBuf {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v.pop().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_micro_batch_log_reads_back_what_was_written_or_refuses(
        notes in proptest::collection::vec("[a-z\"\\\\é]{0,8}", 1..8),
        committed in any::<bool>(),
        d in damage(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let log = BatchLog::open(dir.path()).unwrap();
        let n = notes.len() as u64;
        for (b, note) in notes.iter().enumerate() {
            let b = b as u64;
            log.append_offsets(b, &offsets(b, note)).unwrap();
            if b + 1 < n || committed {
                log.append_commit(b, &commit(b)).unwrap();
            }
        }
        log.sync().unwrap();
        drop(log);
        let path = segment(dir.path());
        let whole = std::fs::read(&path).unwrap();
        let intact = apply(&path, &d);
        let opened = BatchLog::open(dir.path());
        match opened {
            Ok(log) => {
                // Every record read is the one written; the records wholly before the
                // damage are all there.
                let records = read_all(dir.path()).unwrap();
                for (b, e) in &records.offsets {
                    prop_assert_eq!(e, &offsets(*b, &notes[*b as usize]));
                }
                for (b, e) in &records.commits {
                    prop_assert_eq!(e, &commit(*b));
                }
                let lines_before = whole[..intact.min(whole.len())]
                    .iter()
                    .filter(|c| **c == b'\n')
                    .count();
                prop_assert!(
                    records.offsets.len() + records.commits.len() >= lines_before,
                    "records before the damage were lost"
                );
                for b in 0..n {
                    if let Some(e) = log.offsets(b).unwrap() {
                        prop_assert_eq!(e, offsets(b, &notes[b as usize]));
                    }
                }
            }
            Err(e) => {
                prop_assert!(!matches!(d, Damage::Cut(_)), "a cut is a torn tail: {}", e);
                prop_assert_eq!(e.code(), "ETL801");
            }
        }
    }

    #[test]
    fn the_state_log_reads_back_what_was_written_or_refuses(
        sizes in proptest::collection::vec(0usize..40, 1..5),
        d in damage(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (log_dir, state_dir) = (dir.path().join("state-changes"), dir.path().join("state"));
        let log = StateLog::open(&log_dir, &state_dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let batch = |v: u64, rows: usize| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(
                        (0..rows).map(|i| format!("k{v}-{i}")).collect::<Vec<_>>(),
                    )),
                    Arc::new(Int64Array::from((0..rows as i64).collect::<Vec<_>>())),
                ],
            )
            .unwrap()
        };
        for (i, rows) in sizes.iter().enumerate() {
            let v = i as u64 + 1;
            let b = batch(v, *rows);
            log.append(v, v - 1, &[("op", LogEntry::Whole(&b))]).unwrap();
        }
        drop(log);
        apply(&segment(&log_dir), &d);
        let opened = StateLog::open(&log_dir, &state_dir);
        if let Err(e) = &opened {
            prop_assert!(!matches!(d, Damage::Cut(_)), "a cut is a torn tail: {}", e);
            prop_assert_eq!(e.code(), "ETL801");
        }
        for (i, rows) in sizes.iter().enumerate() {
            let v = i as u64 + 1;
            match read_logged(&log_dir, "op", v) {
                Ok(Some(Logged::Whole(b))) => prop_assert_eq!(b, batch(v, *rows)),
                Ok(Some(_)) => prop_assert!(false, "a whole entry read back as changes"),
                Ok(None) => {}
                Err(e) => prop_assert_eq!(e.code(), "ETL801"),
            }
        }
    }
}
