//! Tests of the aggregation: grouped folding against row-at-a-time folding.

use super::input::StartGroups;
use super::*;
use arrow::array::StringArray;
use etlantic_core::ir::AggFunc;
use std::collections::BTreeMap;

#[test]
fn start_groups_number_starts_in_first_seen_order_across_pieces() {
    let mut g = StartGroups::default();
    let mut ids = Vec::new();
    g.intern(&[20, 20, 10, 20, 30, 10], &mut ids);
    assert_eq!(ids, vec![0, 0, 1, 0, 2, 1]);
    // A later piece of the same micro-batch continues the numbering.
    ids.clear();
    g.intern(&[30, 40, 10], &mut ids);
    assert_eq!(ids, vec![2, 3, 1]);
    assert_eq!(g.len(), 4);
    assert_eq!(g.starts, vec![20, 10, 30, 40]);
}

const SEC: i64 = 1_000_000;

/// Rows with a key out of 7 (one null), a value (every 11th null) and an event time
/// over 200 s, in an order that is not sorted by time.
fn input(n: usize) -> RecordBatch {
    let keys: StringArray = (0..n)
        .map(|i| (i % 7 != 3).then(|| format!("k{}", i % 7)))
        .collect();
    let values: Int64Array = (0..n).map(|i| (i % 11 != 0).then_some(i as i64)).collect();
    let times = TimestampMicrosecondArray::from(
        (0..n)
            .map(|i| ((i * 7919) % 200_000) as i64 * 1000)
            .collect::<Vec<_>>(),
    )
    .with_timezone("UTC");
    let time_type = times.data_type().clone();
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("__arg0", DataType::Int64, true),
            Field::new("__arg1", DataType::Int64, true),
            Field::new("__arg2", DataType::Int64, true),
            Field::new("__arg3", DataType::Int64, true),
            Field::new("__time", time_type, true),
        ])),
        vec![
            Arc::new(keys),
            Arc::new(values.clone()),
            Arc::new(values.clone()),
            Arc::new(values.clone()),
            Arc::new(values),
            Arc::new(times),
        ],
    )
    .unwrap()
}

fn operator(geometry: Geometry) -> AggregateOperator {
    windowed(Some(geometry))
}

/// The test aggregation with `geometry`, or a plain group-by without one.
fn windowed(geometry: Option<Geometry>) -> AggregateOperator {
    let spec = |name: &str, func| AggSpec {
        name: name.into(),
        func,
        input_type: Some(DataType::Int64),
    };
    AggregateOperator::new(AggregateLayout {
        keys: vec![Field::new("k", DataType::Utf8, true)],
        aggregates: vec![
            spec("n", AggFunc::Count),
            spec("s", AggFunc::Sum),
            spec("first", AggFunc::First),
            spec("last", AggFunc::Last),
        ],
        window: geometry.map(|g| {
            (
                g,
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
            )
        }),
        event_time_key: None,
    })
    .unwrap()
}

type Expected = BTreeMap<(i64, Option<String>), (i64, Option<i64>, Option<i64>, Option<i64>)>;

/// What the operator must produce: each row folded into each of its windows in input
/// order, late rows (window end at or before `watermark`) left out.
fn reference(batch: &RecordBatch, geometry: Geometry, watermark: i64) -> (Expected, Vec<u32>) {
    let keys = batch
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let values = batch
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let times = micros(batch.column(5)).unwrap();
    let mut out = Expected::new();
    let mut late = Vec::new();
    for i in 0..batch.num_rows() {
        let ts = times.value(i);
        let windows: Vec<(i64, i64)> = match geometry {
            Geometry::Tumbling(size) => vec![(ts.div_euclid(size) * size, size)],
            Geometry::Sliding(size, slide) => (0..size / slide)
                .map(|j| (ts.div_euclid(slide) * slide - j * slide, size))
                .collect(),
            Geometry::Session(_) => unreachable!(),
        };
        let mut row_late = false;
        for (start, size) in windows {
            if start + size <= watermark {
                row_late = true;
                continue;
            }
            let key = keys.is_valid(i).then(|| keys.value(i).to_string());
            let v = values.is_valid(i).then(|| values.value(i));
            let e = out.entry((start, key)).or_insert((0, None, None, None));
            if let Some(v) = v {
                e.0 += 1;
                e.1 = Some(e.1.unwrap_or(0) + v);
                e.2 = e.2.or(Some(v));
                e.3 = Some(v);
            }
        }
        if row_late {
            late.push(i as u32);
        }
    }
    (out, late)
}

fn actual(batch: &RecordBatch) -> Expected {
    let starts = micros(batch.column(0)).unwrap();
    let keys = batch
        .column(2)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let col = |i: usize| {
        batch
            .column(i)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
    };
    let opt = |a: &Int64Array, r: usize| a.is_valid(r).then(|| a.value(r));
    (0..batch.num_rows())
        .map(|r| {
            (
                (
                    starts.value(r),
                    keys.is_valid(r).then(|| keys.value(r).to_string()),
                ),
                (
                    col(3).value(r),
                    opt(col(4), r),
                    opt(col(5), r),
                    opt(col(6), r),
                ),
            )
        })
        .collect()
}

/// A batch large enough to be grouped on several threads gives what folding each row
/// into its windows in order gives: counts, sums, `first`/`last` in input order, a
/// null key as a key, and the late rows in input order.
#[test]
fn grouped_batches_match_row_at_a_time_folding() {
    let batch = input(150_000);
    for geometry in [
        Geometry::Tumbling(10 * SEC),
        Geometry::Sliding(10 * SEC, 5 * SEC),
    ] {
        let watermark = 60 * SEC;
        let mut op = operator(geometry);
        let ctx = OpContext {
            late_watermark_us: watermark,
            evict_watermark_us: watermark,
            has_watermark: true,
            output_mode: OutputMode::Update,
            accept_late: false,
            processing_time_ms: 0,
        };
        let out = op.process(std::slice::from_ref(&batch), &ctx).unwrap();
        let (expected, late) = reference(&batch, geometry, watermark);
        assert_eq!(actual(&out.rows[0]), expected, "{geometry:?}");
        assert_eq!(out.late_index, vec![(0, late.clone())], "{geometry:?}");
        assert_eq!(out.late_count, late.len() as u64);
        // A second batch folds into the same groups.
        let again = op.process(std::slice::from_ref(&batch), &ctx).unwrap();
        let doubled: Expected = expected
            .iter()
            .map(|(k, (n, s, f, _))| (k.clone(), (2 * n, s.map(|s| 2 * s), *f, expected[k].3)))
            .collect();
        assert_eq!(actual(&again.rows[0]), doubled, "{geometry:?}");
    }
}

/// A snapshot whose columns have other types than the operator's (another query's
/// checkpoint, damage) is ETL801 on restore, never a panic; the operator's own
/// snapshot restores.
#[test]
fn restoring_state_of_another_shape_is_etl801_not_a_panic() {
    let batch = input(1_000);
    let ctx = OpContext {
        late_watermark_us: 0,
        evict_watermark_us: 0,
        has_watermark: true,
        output_mode: OutputMode::Update,
        accept_late: false,
        processing_time_ms: 0,
    };
    let mut op = operator(Geometry::Tumbling(10 * SEC));
    op.process(std::slice::from_ref(&batch), &ctx).unwrap();
    let snap = op.snapshot().unwrap();
    operator(Geometry::Tumbling(10 * SEC))
        .restore(&snap)
        .unwrap();
    let schema = snap.schema();
    for (i, field) in schema.fields().iter().enumerate() {
        for to in [DataType::Int32, DataType::Utf8, DataType::Float64] {
            if field.data_type() == &to {
                continue;
            }
            let Ok(col) = cast(snap.column(i), &to) else {
                continue;
            };
            let mut fields: Vec<Field> =
                schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields[i] = Field::new(field.name(), to.clone(), true);
            let mut cols = snap.columns().to_vec();
            cols[i] = col;
            let bad = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
            let err = operator(Geometry::Tumbling(10 * SEC))
                .restore(&bad)
                .expect_err(&format!("`{}` as {to}", field.name()));
            assert_eq!(err.code(), "ETL801", "`{}` as {to}: {err}", field.name());
        }
    }
    // A column missing.
    let mut dedup = DedupOperator::new(batch.schema(), vec!["k".into()], None, None).unwrap();
    let err = dedup.restore(&snap).unwrap_err();
    assert_eq!(err.code(), "ETL801", "{err}");
}

/// On the disk store (RocksDB) the aggregation emits what it emits in memory, and holds
/// the same groups after every micro-batch: tumbling, sliding and session windows and a
/// plain group-by, in every output mode, with a state TTL, over micro-batches whose watermark
/// closes windows; and a store restored on another working copy goes on alike.
#[test]
fn on_the_disk_store_it_behaves_like_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let open = |local: String, checkpoint: &str| test_disk_store(dir.path(), &local, checkpoint);
    let all = input(3000);
    let slices: Vec<RecordBatch> = (0..6).map(|i| all.slice(i * 500, 500)).collect();
    let sorted_rows = |out: &OpOutput| -> Vec<String> {
        let mut rows: Vec<String> = out
            .rows
            .iter()
            .flat_map(|b| {
                (0..b.num_rows())
                    .map(|i| {
                        (0..b.num_columns())
                            .map(|c| {
                                arrow::util::display::array_value_to_string(b.column(c), i).unwrap()
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        rows.sort();
        rows
    };
    let kinds = [
        ("tumbling", Some(Geometry::Tumbling(10 * SEC))),
        ("sliding", Some(Geometry::Sliding(20 * SEC, 5 * SEC))),
        ("session", Some(Geometry::Session(SEC / 2))),
        ("plain", None),
    ];
    for (kind, geometry) in kinds {
        for mode in [OutputMode::Append, OutputMode::Update, OutputMode::Complete] {
            if kind == "plain" && mode == OutputMode::Append {
                continue;
            }
            for ttl in [None, Some("2 seconds")] {
                let label = format!("{kind} {mode:?} ttl {ttl:?}");
                let checkpoint = format!("checkpoint-{kind}-{mode:?}-{ttl:?}");
                let build = || {
                    let mut op = windowed(geometry);
                    if let Some(t) = ttl {
                        op.set_state_ttl(t.parse().unwrap()).unwrap();
                    }
                    op
                };
                let mut memory = build();
                let mut disk = build();
                disk.use_store(open(format!("a-{checkpoint}"), &checkpoint))
                    .unwrap();
                let ctx = |n: usize| OpContext {
                    late_watermark_us: (n as i64 * 30 - 40) * SEC,
                    evict_watermark_us: (n as i64 * 30 - 10) * SEC,
                    has_watermark: true,
                    output_mode: mode,
                    accept_late: false,
                    processing_time_ms: n as i64 * 1000,
                };
                for (n, slice) in slices.iter().enumerate() {
                    let want = memory
                        .process(std::slice::from_ref(slice), &ctx(n))
                        .unwrap();
                    let got = disk.process(std::slice::from_ref(slice), &ctx(n)).unwrap();
                    assert_eq!(sorted_rows(&got), sorted_rows(&want), "{label}: batch {n}");
                    assert_eq!(got.late_count, want.late_count, "{label}: batch {n}");
                    let (m, d) = (memory.metrics(), disk.metrics());
                    assert_eq!(
                        (d.rows_total, d.rows_updated, d.rows_removed),
                        (m.rows_total, m.rows_updated, m.rows_removed),
                        "{label}: batch {n}"
                    );
                    // Snapshots list groups in another order: compare them sorted.
                    let snap = |op: &AggregateOperator| {
                        let s = op.snapshot().unwrap();
                        let mut out = sorted_rows(&OpOutput {
                            rows: vec![s],
                            ..Default::default()
                        });
                        out.sort();
                        out
                    };
                    assert_eq!(snap(&disk), snap(&memory), "{label}: state after {n}");
                    disk.store().unwrap().commit(n as u64 + 1).unwrap();
                }
                // Another machine restores version 3 and runs batches 3.. again.
                let mut moved = build();
                moved
                    .use_store(open(format!("b-{checkpoint}"), &checkpoint))
                    .unwrap();
                moved.store().unwrap().restore(Some(3)).unwrap();
                let mut again = build();
                for (n, slice) in slices.iter().enumerate().take(3) {
                    again.process(std::slice::from_ref(slice), &ctx(n)).unwrap();
                }
                for (n, slice) in slices.iter().enumerate().skip(3) {
                    let want = again.process(std::slice::from_ref(slice), &ctx(n)).unwrap();
                    let got = moved.process(std::slice::from_ref(slice), &ctx(n)).unwrap();
                    assert_eq!(
                        sorted_rows(&got),
                        sorted_rows(&want),
                        "{label}: restored, batch {n}"
                    );
                }
            }
        }
    }
}
