//! Tests of the stream-stream join operator.

use super::*;
use arrow::array::{AsArray, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::TimeUnit;
use etlantic_core::streaming::{Duration, OutputMode};

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn side(key: &str, time: &str, wm: bool) -> JoinSideSpec {
    JoinSideSpec {
        schema: Arc::new(Schema::new(vec![
            Field::new(key, DataType::Utf8, true),
            Field::new(time, ts(), true),
        ])),
        keys: vec![key.into()],
        watermark_column: wm.then(|| time.to_string()),
        accept_late: false,
        unique: false,
    }
}

fn layout(join_type: JoinType, lwm: bool, rwm: bool, range: bool) -> JoinLayout {
    let (left, right) = (side("ad", "it", lwm), side("cad", "ct", rwm));
    let output_schema = Arc::new(Schema::new(
        left.schema
            .fields()
            .iter()
            .chain(right.schema.fields())
            .map(|f| f.as_ref().clone())
            .collect::<Vec<_>>(),
    ));
    JoinLayout {
        join_type,
        left,
        right,
        time_range: range.then(|| JoinTimeRange {
            left: "it".into(),
            right: "ct".into(),
            lower: Duration::from_secs(20),
            upper: Duration::from_secs(5),
        }),
        predicate: None,
        null_safe: false,
        output_schema,
    }
}

fn batch(spec: &JoinSideSpec, rows: &[(&str, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        spec.schema.clone(),
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| Some(r.0)).collect::<Vec<_>>(),
            )),
            Arc::new(
                TimestampMicrosecondArray::from(
                    rows.iter().map(|r| r.1 * 1_000_000).collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ),
        ],
    )
    .unwrap()
}

fn ctx(wm_secs: i64) -> OpContext {
    OpContext {
        late_watermark_us: wm_secs * 1_000_000,
        evict_watermark_us: wm_secs * 1_000_000,
        has_watermark: true,
        output_mode: OutputMode::Append,
        accept_late: false,
        processing_time_ms: 0,
    }
}

#[test]
fn state_watermarks_are_derived_like_spark() {
    let e = state_evictions(&layout(JoinType::Inner, true, true, true));
    assert_eq!(
        e,
        [
            Some(Eviction {
                column: "it".into(),
                offset_ms: -20_001
            }),
            Some(Eviction {
                column: "ct".into(),
                offset_ms: -5_001
            }),
        ]
    );
    // One side without a watermark: the range cannot bound either side.
    assert_eq!(
        state_evictions(&layout(JoinType::Left, false, true, true)),
        [None, None]
    );
    assert_eq!(
        state_evictions(&layout(JoinType::Inner, true, true, false)),
        [None, None]
    );
    // A watermarked time among the keys evicts both sides by that key.
    let mut l = layout(JoinType::Left, true, false, false);
    l.left.keys.push("it".into());
    l.right.keys.push("ct".into());
    let e = state_evictions(&l);
    assert_eq!(e[0].as_ref().unwrap().column, "it");
    assert_eq!(e[1].as_ref().unwrap().column, "ct");
    assert_eq!(e[1].as_ref().unwrap().offset_ms, 0);
}

#[test]
fn a_restored_snapshot_behaves_like_the_original() {
    let l = layout(JoinType::Full, true, true, true);
    let mut a = StreamJoinOperator::new(l.clone()).unwrap();
    let left = [batch(&l.left, &[("a", 100), ("b", 101), ("c", 102)])];
    let right = [batch(&l.right, &[("a", 105), ("z", 90)])];
    let out = a.process_pair(&left, &right, &ctx(0)).unwrap();
    assert_eq!(out.rows[0].num_rows(), 1);
    let snap = a.snapshot().unwrap();
    assert_eq!(snap.num_rows(), 5);
    let mut b = StreamJoinOperator::new(l.clone()).unwrap();
    b.restore(&snap).unwrap();
    assert_eq!(b.snapshot().unwrap(), snap);
    // The same next micro-batch on both: the watermark evicts everything.
    let next_l = [batch(&l.left, &[("b", 500)])];
    let next_r = [batch(&l.right, &[("c", 500)])];
    let oa = a.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
    let ob = b.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
    assert_eq!(oa.rows, ob.rows);
    // b and c of the left, z of the right, never matched: 3 outer rows.
    assert_eq!(oa.rows[0].num_rows(), 3);
    assert_eq!(a.metrics().rows_total, 2);
    assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
}

#[test]
fn compaction_keeps_the_live_rows() {
    let l = layout(JoinType::Inner, true, true, true);
    let mut op = StreamJoinOperator::new(l.clone()).unwrap();
    let rows: Vec<(String, i64)> = (0..10_000)
        .map(|i| (format!("k{i}"), if i % 10 == 0 { 1_000 } else { 100 }))
        .collect();
    let refs: Vec<(&str, i64)> = rows.iter().map(|(k, t)| (k.as_str(), *t)).collect();
    op.process_pair(&[batch(&l.left, &refs)], &[], &ctx(0))
        .unwrap();
    assert_eq!(op.metrics().rows_total, 10_000);
    // Watermark 500 s: the 9 000 rows at 100 s go; the chunk is rewritten.
    op.process_pair(&[], &[], &ctx(500)).unwrap();
    assert_eq!(op.metrics().rows_total, 1_000);
    assert_eq!(op.sides[LEFT].chunk_rows(), 1_000);
    // A compacted row still matches.
    let out = op
        .process_pair(&[], &[batch(&l.right, &[("k9990", 1_002)])], &ctx(500))
        .unwrap();
    assert_eq!(out.rows[0].num_rows(), 1);
    let snap = op.snapshot().unwrap();
    assert_eq!(snap.num_rows(), 1_001);
}

/// The rows of `batches` as sorted strings (order-free comparison).
fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            (0..b.num_rows()).map(move |i| {
                b.columns()
                    .iter()
                    .map(|c| arrow::util::display::array_value_to_string(c, i).unwrap())
                    .collect::<Vec<_>>()
                    .join("|")
            })
        })
        .collect();
    out.sort();
    out
}

/// A right side with one row per key, arriving at batch `key` (13 keys); left rows
/// of every key in every batch, some before and some after their right row.
fn left_rows(b: i64) -> Vec<(String, i64)> {
    (0..6)
        .map(|j| (format!("k{}", (b * 7 + j) % 13), b * 10 + j))
        .collect()
}

fn right_rows(b: i64) -> Vec<(String, i64)> {
    if b < 13 {
        vec![(format!("k{b}"), b * 10)]
    } else {
        vec![]
    }
}

fn as_refs(rows: &[(String, i64)]) -> Vec<(&str, i64)> {
    rows.iter().map(|(k, t)| (k.as_str(), *t)).collect()
}

/// A side declared unique on its join keys changes how much state the join keeps,
/// never what it outputs: the same batches through the join with and without the
/// declaration give the same rows, and with it the left side holds no row that met
/// its right row (an inner join keeps none of those; a left outer join keeps only
/// unmatched ones, for their null-padded row at eviction).
#[test]
fn a_unique_side_changes_the_state_not_the_output() {
    for join_type in [JoinType::Inner, JoinType::Left, JoinType::Full] {
        let plain = layout(join_type, true, true, true);
        let mut unique = plain.clone();
        unique.right.unique = true;
        let mut a = StreamJoinOperator::new(plain.clone()).unwrap();
        let mut b = StreamJoinOperator::new(unique).unwrap();
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        let (mut held_a, mut held_b, mut matched_a) = (0, 0, 0);
        for batch_no in 0..25 {
            let l = [batch(&plain.left, &as_refs(&left_rows(batch_no)))];
            let r = [batch(&plain.right, &as_refs(&right_rows(batch_no)))];
            let c = ctx(batch_no * 10 - 30);
            out_a.extend(a.process_pair(&l, &r, &c).unwrap().rows);
            let ob = b.process_pair(&l, &r, &c).unwrap();
            assert!(ob.duplicates.iter().all(Option::is_none));
            out_b.extend(ob.rows);
            held_a += a.sides[LEFT].rows;
            held_b += b.sides[LEFT].rows;
            matched_a += a.sides[LEFT]
                .entries_by_seq()
                .iter()
                .filter(|e| e.matched)
                .count();
            // Every left row still held by `b` is one that has not met its right row.
            for e in b.sides[LEFT].entries_by_seq() {
                assert!(!e.matched, "{join_type:?}: a matched left row is held");
            }
        }
        assert_eq!(sorted_rows(&out_a), sorted_rows(&out_b), "{join_type:?}");
        assert!(!out_a.iter().all(|b| b.num_rows() == 0));
        if join_type == JoinType::Inner {
            // The left side is not preserved, so its held rows are not marked when
            // they match (see the next test): the declaration must still save state.
            assert!(held_b < held_a, "{join_type:?}: {held_b} vs {held_a}");
        } else {
            // Without the declaration the matched rows wait for their eviction.
            assert!(matched_a > 0, "{join_type:?}");
            assert!(
                held_b <= held_a - matched_a,
                "{join_type:?}: {held_b} left rows held over the batches, {held_a} \
                 ({matched_a} matched) without the key"
            );
        }
    }
}

/// Only a preserved side's `matched` mark is ever read, so only there does a match
/// change a held row, which the next checkpoint then writes again: in an inner join
/// the changes after a match are the new rows alone.
#[test]
fn a_match_changes_a_held_row_only_on_a_preserved_side() {
    for (join_type, rewritten) in [(JoinType::Inner, 0), (JoinType::Left, 2)] {
        let l = layout(join_type, true, true, true);
        let mut op = StreamJoinOperator::new(l.clone()).unwrap();
        let left = [batch(&l.left, &[("a", 100), ("b", 101), ("c", 102)])];
        op.process_pair(&left, &[], &ctx(0)).unwrap();
        assert_eq!(op.changes().unwrap().unwrap().num_rows(), 3);
        let right = [batch(&l.right, &[("a", 103), ("b", 103)])];
        let out = op.process_pair(&[], &right, &ctx(0)).unwrap();
        assert_eq!(out.rows[0].num_rows(), 2, "{join_type:?}");
        let changes = op.changes().unwrap().unwrap();
        let sides = changes
            .column_by_name("__side")
            .unwrap()
            .as_primitive::<arrow::datatypes::UInt8Type>();
        let count = |side: usize| sides.iter().filter(|s| *s == Some(side as u8)).count();
        assert_eq!(count(RIGHT), 2, "{join_type:?}: the new right rows");
        assert_eq!(count(LEFT), rewritten, "{join_type:?}: left rows rewritten");
    }
}

/// A row repeating a unique key the join still holds is rejected and joins nothing,
/// as is the second of two rows of one key in a batch.
#[test]
fn a_repeated_unique_key_is_rejected() {
    let mut l = layout(JoinType::Inner, true, true, true);
    l.right.unique = true;
    let mut op = StreamJoinOperator::new(l.clone()).unwrap();
    let out = op
        .process_pair(
            &[batch(&l.left, &[("a", 100)])],
            &[batch(&l.right, &[("a", 100), ("b", 100), ("a", 101)])],
            &ctx(0),
        )
        .unwrap();
    assert_eq!(
        out.rows[0].num_rows(),
        1,
        "the left row meets the first `a`"
    );
    let dup = out.duplicates[RIGHT].as_ref().expect("the second `a`");
    assert_eq!(sorted_rows(std::slice::from_ref(dup)).len(), 1);
    assert!(out.duplicates[LEFT].is_none());
    // `b` is held: its repeat in a later batch is rejected too, and its left row
    // meets the first `b` only.
    let out = op
        .process_pair(
            &[batch(&l.left, &[("b", 102)])],
            &[batch(&l.right, &[("b", 103)])],
            &ctx(0),
        )
        .unwrap();
    assert_eq!(out.rows[0].num_rows(), 1);
    let rows = sorted_rows(&out.rows);
    assert!(rows[0].ends_with("1970-01-01T00:01:40Z"), "{rows:?}");
    assert_eq!(
        out.duplicates[RIGHT].as_ref().map(RecordBatch::num_rows),
        Some(1)
    );
    // Without the declaration, both rows of a key join.
    let plain = layout(JoinType::Inner, true, true, true);
    let mut op = StreamJoinOperator::new(plain.clone()).unwrap();
    let out = op
        .process_pair(
            &[batch(&plain.left, &[("a", 100)])],
            &[batch(&plain.right, &[("a", 100), ("a", 101)])],
            &ctx(0),
        )
        .unwrap();
    assert_eq!(out.rows[0].num_rows(), 2);
    assert!(out.duplicates.iter().all(Option::is_none));
}

/// A batch of `spec`'s rows whose key may be null.
fn batch_with_nulls(spec: &JoinSideSpec, rows: &[(Option<String>, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        spec.schema.clone(),
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(
                TimestampMicrosecondArray::from(
                    rows.iter().map(|r| r.1 * 1_000_000).collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ),
        ],
    )
    .unwrap()
}

/// Micro-batch `b` of the disk-store comparison: [`left_rows`] with a null key every
/// fifth batch and a late row every third; [`right_rows`] with, unless the right side
/// is unique, a second row of an older key.
fn disk_case_batches(l: &JoinLayout, b: i64) -> ([RecordBatch; 1], [RecordBatch; 1]) {
    let mut left: Vec<(Option<String>, i64)> = left_rows(b)
        .into_iter()
        .map(|(k, t)| (Some(k), t))
        .collect();
    if b % 5 == 0 {
        left.push((None, b * 10 + 1));
    }
    if b % 3 == 0 {
        left.push((Some(format!("k{}", b % 13)), b * 10 - 50));
    }
    let mut right: Vec<(Option<String>, i64)> = right_rows(b)
        .into_iter()
        .map(|(k, t)| (Some(k), t))
        .collect();
    if !l.right.unique {
        right.push((Some(format!("k{}", (b * 5) % 13)), b * 10 + 3));
    }
    (
        [batch_with_nulls(&l.left, &left)],
        [batch_with_nulls(&l.right, &right)],
    )
}

/// On the disk store, a join gives the in-memory join's rows, late and rejected rows,
/// metrics and snapshots, micro-batch by micro-batch — for every join type, with a side
/// unique on the key, and with a state TTL instead of a watermark — and a store restored
/// on another working copy from the checkpoint alone goes on like the in-memory join
/// restored from its snapshot.
#[test]
fn on_the_disk_store_it_behaves_like_in_memory() {
    use crate::streaming::operators::test_disk_store;
    let dir = tempfile::tempdir().unwrap();
    let unique_right = |join_type| {
        let mut l = layout(join_type, true, true, true);
        l.right.unique = true;
        l
    };
    let cases: Vec<(&str, JoinLayout, Option<&str>)> = vec![
        ("inner", layout(JoinType::Inner, true, true, true), None),
        ("left", layout(JoinType::Left, true, true, true), None),
        ("right", layout(JoinType::Right, true, true, true), None),
        ("full", layout(JoinType::Full, true, true, true), None),
        ("inner, unique right", unique_right(JoinType::Inner), None),
        ("left, unique right", unique_right(JoinType::Left), None),
        (
            "inner, no watermark, TTL",
            layout(JoinType::Inner, false, false, false),
            Some("25 seconds"),
        ),
        (
            "full, TTL",
            layout(JoinType::Full, true, true, true),
            Some("40 seconds"),
        ),
    ];
    const BATCHES: i64 = 24;
    const RESTORED_AT: i64 = 11;
    for (label, l, ttl) in cases {
        let build = || {
            let mut op = StreamJoinOperator::new(l.clone()).unwrap();
            if let Some(t) = ttl {
                op.set_state_ttl(t.parse().unwrap()).unwrap();
            }
            op
        };
        let context = |b: i64| OpContext {
            processing_time_ms: b * 10_000,
            ..ctx(b * 10 - 30)
        };
        let checkpoint = format!("checkpoint-{label}");
        let mut memory = build();
        let mut disk = build();
        disk.use_store(test_disk_store(
            dir.path(),
            &format!("a-{label}"),
            &checkpoint,
        ))
        .unwrap();
        let mut restored_snapshot = None;
        let compare =
            |memory: &mut StreamJoinOperator, disk: &mut StreamJoinOperator, b: i64, what: &str| {
                let (left, right) = disk_case_batches(&l, b);
                let want = memory.process_pair(&left, &right, &context(b)).unwrap();
                let got = disk.process_pair(&left, &right, &context(b)).unwrap();
                let at = format!("{label}, {what} batch {b}");
                assert_eq!(sorted_rows(&got.rows), sorted_rows(&want.rows), "{at}");
                assert_eq!(got.late_count, want.late_count, "{at}");
                for side in [LEFT, RIGHT] {
                    assert_eq!(
                        got.duplicates[side].as_ref().map(RecordBatch::num_rows),
                        want.duplicates[side].as_ref().map(RecordBatch::num_rows),
                        "{at}"
                    );
                }
                let (m, d) = (memory.metrics(), disk.metrics());
                assert_eq!(
                    (d.rows_total, d.rows_updated, d.rows_removed),
                    (m.rows_total, m.rows_updated, m.rows_removed),
                    "{at}"
                );
                assert_eq!(disk.custom_metrics(), memory.custom_metrics(), "{at}");
                assert_eq!(disk.snapshot().unwrap(), memory.snapshot().unwrap(), "{at}");
                let emitted: usize = want.rows.iter().map(RecordBatch::num_rows).sum();
                (emitted, m.rows_removed)
            };
        let (mut emitted, mut removed) = (0, 0);
        for b in 0..BATCHES {
            let (e, r) = compare(&mut memory, &mut disk, b, "");
            emitted += e;
            removed += r;
            disk.store().unwrap().commit(b as u64 + 1).unwrap();
            if b + 1 == RESTORED_AT {
                restored_snapshot = Some(memory.snapshot().unwrap());
            }
        }
        assert!(emitted > 0, "{label}: the case joins rows");
        assert!(removed > 0, "{label}: the case removes rows");
        // Another machine: the checkpoint alone, version RESTORED_AT.
        let mut moved = build();
        moved
            .use_store(test_disk_store(
                dir.path(),
                &format!("b-{label}"),
                &checkpoint,
            ))
            .unwrap();
        moved
            .store()
            .unwrap()
            .restore(Some(RESTORED_AT as u64))
            .unwrap();
        let mut again = build();
        again.restore(&restored_snapshot.unwrap()).unwrap();
        assert_eq!(
            moved.snapshot().unwrap(),
            again.snapshot().unwrap(),
            "{label}"
        );
        for b in RESTORED_AT..BATCHES {
            compare(&mut again, &mut moved, b, "restored,");
        }
    }
}

/// A join on the disk store restored from a snapshot (the runtime's rebuild from
/// snapshots and changelogs) holds that snapshot's rows in its store.
#[test]
fn a_snapshot_restores_into_the_disk_store() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(JoinType::Full, true, true, true);
    let mut a = StreamJoinOperator::new(l.clone()).unwrap();
    let left = [batch(&l.left, &[("a", 100), ("b", 101), ("c", 102)])];
    let right = [batch(&l.right, &[("a", 105), ("z", 90)])];
    a.process_pair(&left, &right, &ctx(0)).unwrap();
    let snap = a.snapshot().unwrap();
    let mut b = StreamJoinOperator::new(l.clone()).unwrap();
    b.use_store(crate::streaming::operators::test_disk_store(
        dir.path(),
        "local",
        "checkpoint",
    ))
    .unwrap();
    b.restore(&snap).unwrap();
    assert_eq!(b.snapshot().unwrap(), snap);
    assert!(
        b.sides.iter().all(|s| s.rows == 0),
        "nothing stays in memory"
    );
    let next_l = [batch(&l.left, &[("b", 500)])];
    let next_r = [batch(&l.right, &[("c", 500)])];
    let oa = a.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
    let ob = b.process_pair(&next_l, &next_r, &ctx(400)).unwrap();
    assert_eq!(sorted_rows(&oa.rows), sorted_rows(&ob.rows));
    assert_eq!(oa.rows[0].num_rows(), 3);
    assert_eq!(b.metrics().rows_total, 2);
    assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
}
