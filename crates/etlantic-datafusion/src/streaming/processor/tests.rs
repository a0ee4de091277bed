//! Tests of `processor`.

use super::*;
use arrow::array::StringArray;
use etlantic_core::plugin::processor::{invalid, MapState, ProcessorProvider, ValueState};
use etlantic_core::plugin::ProcessorRegistration;
use serde_json::json;

/// Counts each `tag` per key in a map state (TTL 10 s) and, 5 s of processing time
/// after the key's last input, emits `{user, summary}`.
struct TagsProvider;
struct Tags {
    schema: SchemaRef,
    tags: Option<MapState<String, i64>>,
    rows: Option<ValueState<i64>>,
    bad_output: bool,
}

impl ProcessorProvider for TagsProvider {
    fn name(&self) -> &'static str {
        "unit_tags"
    }
    fn description(&self) -> &'static str {
        "unit test processor"
    }
    fn create(&self, spec: &ProcessorSpec) -> Result<Box<dyn StatefulProcessor>> {
        if spec.time_mode != TimeMode::ProcessingTime {
            return Err(invalid("processing time only"));
        }
        Ok(Box::new(Tags {
            schema: Arc::new(Schema::new(vec![
                Field::new("user", DataType::Utf8, true),
                Field::new("summary", DataType::Utf8, false),
            ])),
            tags: None,
            rows: None,
            bad_output: spec.options.get("bad_output").is_some(),
        }))
    }
}

impl StatefulProcessor for Tags {
    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn init(&mut self, init: &mut ProcessorInit) -> Result<()> {
        self.tags = Some(init.map_state("tags", Some("10 seconds".parse()?))?);
        self.rows = Some(init.value_state("rows", None)?);
        Ok(())
    }
    fn handle_input_rows(
        &mut self,
        _key: &GroupKey,
        rows: &RecordBatch,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let (tags, n) = (self.tags.unwrap(), self.rows.unwrap());
        let col = rows.column_by_name("tag").unwrap();
        let col = col.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..col.len() {
            let t = col.value(i).to_string();
            let c = tags.get(ctx, &t)?.unwrap_or(0);
            tags.put(ctx, &t, &(c + 1))?;
        }
        let total = n.get(ctx)?.unwrap_or(0) + rows.num_rows() as i64;
        n.set(ctx, &total)?;
        let now = ctx.timer_values().processing_time_ms;
        ctx.register_timer(now + 5_000)
    }
    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        _timer: ExpiredTimer,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let (tags, n) = (self.tags.unwrap(), self.rows.unwrap());
        let entries = tags.entries(ctx)?;
        let summary = format!("{} rows; {:?}", n.get(ctx)?.unwrap_or(0), entries);
        if self.bad_output {
            return ctx.emit(&json!({"user": key.get("user"), "nope": 1}));
        }
        ctx.emit(&json!({"user": key.get("user"), "summary": summary}))
    }
}

inventory::submit! { ProcessorRegistration(&TagsProvider) }

fn input() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("user", DataType::Utf8, true),
        Field::new("tag", DataType::Utf8, false),
    ]))
}

fn rows(data: &[(Option<&str>, &str)]) -> RecordBatch {
    RecordBatch::try_new(
        input(),
        vec![
            Arc::new(StringArray::from(
                data.iter().map(|(u, _)| *u).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                data.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn op(options: Value) -> ProcessorOperator {
    ProcessorOperator::new(
        "unit_tags",
        &["user".to_string()],
        TimeMode::ProcessingTime,
        &options,
        input(),
        None,
        ExecutionMode::Streaming,
    )
    .unwrap()
}

fn ctx(now: i64) -> OpContext {
    OpContext {
        late_watermark_us: 0,
        evict_watermark_us: 0,
        has_watermark: false,
        output_mode: OutputMode::Append,
        accept_late: false,
        processing_time_ms: now,
    }
}

fn out_rows(out: &OpOutput) -> Vec<Value> {
    out.rows
        .iter()
        .flat_map(|b| etlantic_core::plugin::processor::rows_as_json(b).unwrap())
        .map(Value::Object)
        .collect()
}

#[test]
fn map_state_timers_and_ttl_survive_snapshot_and_restore() {
    let mut a = op(json!({}));
    let out = a
        .process(
            &[rows(&[
                (Some("u1"), "x"),
                (None, "y"),
                (Some("u1"), "x"),
                (Some("u1"), "z"),
            ])],
            &ctx(0),
        )
        .unwrap();
    assert!(out_rows(&out).is_empty());
    // u1: 2 map entries + count + timer; null key: 1 entry + count + timer.
    assert_eq!(a.metrics().rows_total, 7);
    assert!(a.has_due_work(None, 5_000));
    assert!(!a.has_due_work(None, 4_999));
    let snap = a.snapshot().unwrap();
    assert_eq!(snap.num_rows(), 7);
    let mut b = op(json!({}));
    b.restore(&snap).unwrap();
    assert_eq!(b.snapshot().unwrap(), snap);
    // u1 again at 3 s: entry x gets a fresh TTL (z keeps 0 s); a second timer at 8 s.
    for o in [&mut a, &mut b] {
        o.process(&[rows(&[(Some("u1"), "x")])], &ctx(3_000))
            .unwrap();
    }
    assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
    // At 6 s the 5 s timers fire, in (time, key) order (a null key sorts first).
    let (oa, ob) = (
        a.process(&[], &ctx(6_000)).unwrap(),
        b.process(&[], &ctx(6_000)).unwrap(),
    );
    assert_eq!(out_rows(&oa), out_rows(&ob));
    assert_eq!(
        out_rows(&oa),
        [
            json!({"user": null, "summary": "1 rows; [(\"y\", 1)]"}),
            json!({"user": "u1", "summary": "4 rows; [(\"x\", 3), (\"z\", 1)]"}),
        ]
        .to_vec()
    );
    let metric = |o: &ProcessorOperator, name: &str| {
        o.custom_metrics()
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    };
    assert_eq!(metric(&b, "numExpiredTimers"), Some(2));
    assert_eq!(metric(&b, "numRegisteredTimers"), Some(1));
    // At 10 s y and z (written at 0 s) have expired: the 8 s timer of u1 no longer
    // sees z, and the end of the batch removes both.
    let out = b.process(&[], &ctx(10_000)).unwrap();
    assert_eq!(
        out_rows(&out),
        [json!({"user": "u1", "summary": "4 rows; [(\"x\", 3)]"})].to_vec()
    );
    assert_eq!(metric(&b, ROWS_REMOVED_BY_TTL), Some(2));
    // At 13 s x (written at 3 s) expires: only the two counts remain.
    let out = b.process(&[], &ctx(13_000)).unwrap();
    assert!(out_rows(&out).is_empty());
    assert_eq!(metric(&b, ROWS_REMOVED_BY_TTL), Some(1));
    assert_eq!(b.metrics().rows_total, 2);
    assert_eq!(b.metrics().rows_removed, 1);
}

#[test]
fn bad_rows_and_unknown_processors_are_reported_with_codes() {
    let mut o = op(json!({"bad_output": true}));
    o.process(&[rows(&[(Some("u"), "t")])], &ctx(0)).unwrap();
    let e = o.process(&[], &ctx(5_000)).unwrap_err();
    assert_eq!(e.code(), "ETL707");
    assert!(e.to_string().contains("unit_tags"), "{e}");
    let e = ProcessorOperator::new(
        "nope",
        &[],
        TimeMode::None,
        &Value::Null,
        input(),
        None,
        ExecutionMode::Streaming,
    )
    .err()
    .unwrap();
    assert_eq!(e.code(), "ETL220");
    let e = ProcessorOperator::new(
        "unit_tags",
        &["who".to_string()],
        TimeMode::ProcessingTime,
        &Value::Null,
        input(),
        None,
        ExecutionMode::Streaming,
    )
    .err()
    .unwrap();
    assert_eq!(e.code(), "ETL206");
    let e = ProcessorOperator::new(
        "unit_tags",
        &[],
        TimeMode::EventTime,
        &Value::Null,
        input(),
        None,
        ExecutionMode::Streaming,
    )
    .err()
    .unwrap();
    assert_eq!(e.code(), "ETL320");
}

/// On the disk store the processor emits what it emits in memory, in the same order,
/// with the same metrics, timers due and snapshot after every micro-batch — map and
/// value state, TTL expiring entries of keys the batch does not touch, processing-time
/// timers of untouched keys — and a store restored on another working copy from the
/// checkpoint alone goes on alike.
#[test]
fn on_the_disk_store_it_behaves_like_in_memory() {
    use crate::streaming::operators::test_disk_store;
    let dir = tempfile::tempdir().unwrap();
    // (processing time, rows (user, tag)) of each micro-batch.
    type Batch<'a> = (i64, Vec<(Option<&'a str>, &'a str)>);
    let batches: Vec<Batch<'_>> = vec![
        (
            0,
            vec![
                (Some("u1"), "x"),
                (None, "y"),
                (Some("u1"), "x"),
                (Some("u2"), "z"),
            ],
        ),
        (1_000, vec![(Some("u3"), "x")]),
        (3_000, vec![(Some("u1"), "x")]),
        (6_000, vec![]),
        (7_000, vec![(Some("u2"), "w"), (Some("u4"), "q")]),
        (10_000, vec![]),
        (13_000, vec![(Some("u3"), "y")]),
        (20_000, vec![]),
        (30_000, vec![(Some("u1"), "x")]),
        (40_000, vec![]),
    ];
    let metric = |o: &ProcessorOperator, name: &str| {
        o.custom_metrics()
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    };
    let step = |memory: &mut ProcessorOperator, disk: &mut ProcessorOperator, n: usize| {
        let (now, data) = &batches[n];
        let input: Vec<RecordBatch> = if data.is_empty() {
            vec![]
        } else {
            vec![rows(data)]
        };
        let want = memory.process(&input, &ctx(*now)).unwrap();
        let got = disk.process(&input, &ctx(*now)).unwrap();
        assert_eq!(out_rows(&got), out_rows(&want), "batch {n}");
        let (m, d) = (memory.metrics(), disk.metrics());
        assert_eq!(
            (d.rows_total, d.rows_updated, d.rows_removed),
            (m.rows_total, m.rows_updated, m.rows_removed),
            "batch {n}"
        );
        assert_eq!(disk.custom_metrics(), memory.custom_metrics(), "batch {n}");
        assert_eq!(
            disk.snapshot().unwrap(),
            memory.snapshot().unwrap(),
            "batch {n}"
        );
        for later in [*now, now + 2_000, now + 5_000, now + 20_000] {
            assert_eq!(
                disk.has_due_work(None, later),
                memory.has_due_work(None, later),
                "batch {n}, due at {later}"
            );
        }
        out_rows(&want).len() as u64 + metric(memory, ROWS_REMOVED_BY_TTL).unwrap_or(0)
    };
    let mut memory = op(json!({}));
    let mut disk = op(json!({}));
    disk.use_store(test_disk_store(dir.path(), "a", "checkpoint"))
        .unwrap();
    let mut seen = 0;
    let mut at_version_4 = None;
    for n in 0..batches.len() {
        seen += step(&mut memory, &mut disk, n);
        disk.store().unwrap().commit(n as u64 + 1).unwrap();
        if n + 1 == 4 {
            at_version_4 = Some(memory.snapshot().unwrap());
        }
    }
    assert!(seen > 5, "the batches emit rows and expire entries");
    // Another machine restores version 4 from the checkpoint alone.
    let mut moved = op(json!({}));
    moved
        .use_store(test_disk_store(dir.path(), "b", "checkpoint"))
        .unwrap();
    moved.store().unwrap().restore(Some(4)).unwrap();
    let mut again = op(json!({}));
    again.restore(&at_version_4.unwrap()).unwrap();
    assert_eq!(moved.snapshot().unwrap(), again.snapshot().unwrap());
    for n in 4..batches.len() {
        step(&mut again, &mut moved, n);
    }
    // A snapshot restored into the store (the runtime's rebuild) holds the same state.
    let mut rebuilt = op(json!({}));
    rebuilt
        .use_store(test_disk_store(dir.path(), "c", "checkpoint-c"))
        .unwrap();
    let mut reference = op(json!({}));
    for (now, data) in &batches[..3] {
        reference.process(&[rows(data)], &ctx(*now)).unwrap();
    }
    let snap = reference.snapshot().unwrap();
    rebuilt.restore(&snap).unwrap();
    assert_eq!(rebuilt.snapshot().unwrap(), snap);
    for n in 3..batches.len() {
        step(&mut reference, &mut rebuilt, n);
    }
}
