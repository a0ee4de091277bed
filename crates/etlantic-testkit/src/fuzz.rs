//! The fuzz harnesses: what each coverage-guided fuzz target of `fuzz/` (run by
//! `cargo xtask fuzz`) does with its input bytes.
//!
//! Each harness feeds arbitrary bytes to one reader of untrusted input — the pipeline and
//! profile loaders with validation, the ODCS/DTCS/DPCS loaders, the DTCS expression
//! parser, the record decoders, the checkpoint readers — and must return without
//! panicking, hanging or exhausting memory, whatever the bytes: bad input is an error
//! with a code (or a quarantined record), never a crash. The harnesses live here rather
//! than in the fuzz crate so that the normal test suite runs them over the seed and
//! regression inputs in `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` (see
//! `tests/fuzz_regressions.rs`) without building libFuzzer.

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use etlantic_core::plugin::{ReadLimit, Source, SourceContext};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Lets panics that a reader of untrusted input turns into errors unwind under a fuzzer
/// whose panic hook aborts on every panic (see
/// [`etlantic_core::untrusted::quiet_guarded_panics`]); call it once at start-up.
pub use etlantic_core::untrusted::quiet_guarded_panics;

/// A harness: it takes any bytes and must return.
pub type Harness = fn(&[u8]);

/// Every harness, by fuzz target name.
pub const TARGETS: &[(&str, Harness)] = &[
    ("pipeline_profile", pipeline_profile),
    ("contracts", contracts),
    ("dtcs_expression", dtcs_expression),
    ("decode_jsonl", decode_jsonl),
    ("decode_csv", decode_csv),
    ("decode_parquet", decode_parquet),
    ("kafka_value", kafka_value),
    ("batch_log", batch_log),
    ("state_log", state_log),
    ("state_snapshot", state_snapshot),
    ("source_log", source_log),
    ("sink_log", sink_log),
];

/// The harness of a fuzz target.
pub fn harness(target: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == target).map(|(_, f)| *f)
}

/// The first part of `data` up to a NUL byte, and the rest (inputs of two documents).
fn split2(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// A scratch directory of the process, emptied for each input.
fn scratch() -> PathBuf {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("etlantic-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir
    });
    let dir = base.join(format!("{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

fn write(path: &Path, bytes: &[u8]) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("a scratch directory");
    }
    std::fs::write(path, bytes).expect("a scratch file");
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(f)
}

const ORDERS_CONTRACT: &str = include_str!("fuzz/orders.odcs.yaml");

/// Whether a text names a device or kernel file a loader would read forever (the
/// loaders read the paths a pipeline names; `/dev/zero` never ends).
fn names_a_device(text: &str) -> bool {
    ["/dev", "/proc", "/sys"].iter().any(|d| text.contains(d))
}

/// A pipeline (before the first NUL) and a profile (after it), loaded and validated in
/// a project whose `contracts/orders.odcs.yaml` is a valid contract.
pub fn pipeline_profile(data: &[u8]) {
    let (pipeline, profile) = split2(data);
    let (pipeline, profile) = (text(pipeline), text(profile));
    if names_a_device(&pipeline) || names_a_device(&profile) {
        return;
    }
    let root = scratch();
    write(
        &root.join("contracts/orders.odcs.yaml"),
        ORDERS_CONTRACT.as_bytes(),
    );
    let Ok(pipeline) = etlantic_core::model::Pipeline::from_yaml(&pipeline, "pipeline.yaml") else {
        return;
    };
    let profile = match etlantic_core::profile::Profile::from_yaml(&profile, "profile.yaml") {
        Ok(p) => {
            let _ = p.check("profile.yaml");
            p
        }
        Err(_) => etlantic_core::profile::Profile::new("default"),
    };
    let project = etlantic_plan::Project {
        root,
        pipeline_file: "pipeline.yaml".into(),
        pipeline,
        profile,
        profile_file: Some("profile.yaml".into()),
    };
    let _ = etlantic_plan::validate(&project);
    if let Ok(plan) = etlantic_plan::plan(&project).into_result() {
        let json = plan.to_canonical_json();
        let back = etlantic_plan::PipelinePlan::from_json(&json, "plan.json");
        assert!(back.is_ok(), "a plan does not read back: {back:?}");
    }
}

/// An ODCS, DTCS or DPCS document, or a DTCS transform plan (each loader is tried, as
/// `etlantic diff` and a pipeline's `plan:` load them).
pub fn contracts(data: &[u8]) {
    let t = text(data);
    let _ = etlantic_core::contract::Contract::parse(&t, "contract.yaml", None);
    if let Ok(plan) = etlantic_core::ir::TransformPlan::from_yaml(&t, "plan.yaml") {
        let _ = plan.decoded();
    }
    let format = if t.trim_start().starts_with('{') {
        dtcs::DocumentFormat::Json
    } else {
        dtcs::DocumentFormat::Yaml
    };
    if let Ok(c) = dtcs::parse(t.as_bytes(), format).into_contract() {
        let _ = dtcs::validate(&c);
    }
    let parsed = if t.trim_start().starts_with('{') {
        dpcs::parse_json(&t)
    } else {
        dpcs::parse_yaml(&t)
    };
    if let Ok(c) = parsed {
        let _ = dpcs::validate(&c);
    }
}

/// A DTCS expression, parsed and (when it parses) compiled against a schema.
pub fn dtcs_expression(data: &[u8]) {
    let t = text(data);
    if let Ok(expr) = etlantic_core::ir::Expr::parse(&t) {
        let _ = etlantic_datafusion::expression_type(&expr, &decoder_schema());
    }
}

/// The contract every decoder harness decodes against: each kind of column, required
/// and optional, a zoned timestamp, a decimal, rules.
fn decoder_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(10, 2), true),
        Field::new("ratio", DataType::Float64, true),
        Field::new("small", DataType::Int16, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("day", DataType::Date32, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("Europe/Paris".into())),
            true,
        ),
        Field::new(
            "utc",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
    ]))
}

const DECODER_CONTRACT: &str = include_str!("fuzz/records.odcs.yaml");

fn decoder_contract() -> Arc<etlantic_core::contract::Contract> {
    static C: OnceLock<Arc<etlantic_core::contract::Contract>> = OnceLock::new();
    C.get_or_init(|| {
        Arc::new(
            etlantic_core::contract::Contract::parse(DECODER_CONTRACT, "records.odcs.yaml", None)
                .expect("the fuzz contract is valid"),
        )
    })
    .clone()
}

/// Reads `bytes` as the file `name` through the file source (batch mode).
fn read_file(name: &str, bytes: &[u8]) {
    let root = scratch();
    write(&root.join(name), bytes);
    let contract = decoder_contract();
    let Ok(uri) = BindingUri::parse(&format!("file://{name}")) else {
        return;
    };
    let ctx = SourceContext {
        storage_options: Default::default(),
        asset: "records".into(),
        uri,
        schema: contract.arrow_schema(),
        contract: Some(contract),
        root,
        mode: ExecutionMode::Batch,
        state: None,
    };
    let Some(provider) = etlantic_core::plugin::source_provider("file") else {
        return;
    };
    let Ok(mut source) = provider.create(ctx) else {
        return;
    };
    block_on(async {
        if let Ok(Some(end)) = source.latest_offset(None, &ReadLimit::unlimited()).await {
            if let Ok(batch) = source.read(None, &end).await {
                check_batch(source.as_ref(), &batch);
            }
        }
    });
}

/// What every read must keep: batches of the source's schema, origins covering them.
fn check_batch(source: &dyn Source, batch: &etlantic_core::plugin::SourceBatch) {
    for b in &batch.batches {
        assert_eq!(b.schema(), source.schema(), "a batch of another schema");
    }
    if !batch.origins.is_empty() {
        assert_eq!(
            batch.origins.len() as usize,
            batch.num_rows(),
            "origins do not cover the rows"
        );
    }
}

/// JSON lines decoded against a contract.
pub fn decode_jsonl(data: &[u8]) {
    read_file("records.jsonl", data);
}

/// CSV (with a header line) decoded against a contract.
pub fn decode_csv(data: &[u8]) {
    read_file("records.csv", data);
}

/// Parquet bytes decoded against a contract.
pub fn decode_parquet(data: &[u8]) {
    read_file("records.parquet", data);
}

/// A Kafka record value in the `json` format, decoded by the contract decoder as the
/// Kafka source does for each record (the Kafka client itself is librdkafka's) — and
/// decoded twice: through the decoder's fast path (then the per-record path when it
/// declines) and through the per-record path alone. The two must take the same records
/// with the same values; a difference panics, which the fuzzer reports as a finding.
pub fn kafka_value(data: &[u8]) {
    let contract = decoder_contract();
    let Ok(decoder) =
        etlantic_sources::decode::ContractDecoder::new(contract.arrow_schema(), Some(&contract))
    else {
        return;
    };
    let per_record = |b: &mut etlantic_sources::decode::BatchBuilder| {
        serde_json::from_slice::<serde_json::Value>(data)
            .ok()
            .is_some_and(|v| b.push_json(&v).is_ok())
    };
    let mut slow = decoder.clone().with_fast_path(false).builder();
    let mut fast = decoder.builder();
    let slow_took = per_record(&mut slow);
    let fast_took = fast.push_json_bytes(data) || per_record(&mut fast);
    assert_eq!(
        slow_took,
        fast_took,
        "the fast path and the per-record path disagree on {:?}",
        String::from_utf8_lossy(data)
    );
    let (slow, fast) = (slow.finish(), fast.finish());
    assert_eq!(
        slow.ok().flatten(),
        fast.ok().flatten(),
        "the fast path decodes {:?} differently",
        String::from_utf8_lossy(data)
    );
}

/// A checkpoint's micro-batch log segment.
pub fn batch_log(data: &[u8]) {
    let root = scratch();
    write(&root.join("log/0.log"), data);
    if let Ok(log) = etlantic_runtime::checkpoint::batch_log::BatchLog::open(root.join("log")) {
        for b in 0..=log.latest_offsets().unwrap_or(0).min(1000) {
            let _ = log.offsets(b);
            let _ = log.commit(b);
        }
    }
    let _ = etlantic_runtime::checkpoint::batch_log::read_all(&root.join("log"));
}

/// A checkpoint's state log segment.
pub fn state_log(data: &[u8]) {
    let root = scratch();
    write(&root.join("state-changes/0.log"), data);
    let dir = root.join("state-changes");
    if let Ok(versions) = etlantic_runtime::checkpoint::state_log::logged_versions(&dir) {
        for (op, vs) in versions.iter().take(16) {
            for v in vs.iter().take(64) {
                let _ = etlantic_runtime::checkpoint::state_log::read_logged(&dir, op, *v);
            }
        }
    }
    let _ = etlantic_runtime::checkpoint::state_log::StateLog::open(dir, root.join("state"));
}

/// A whole state snapshot file, read and restored into a window aggregation and a dedup.
pub fn state_snapshot(data: &[u8]) {
    use etlantic_datafusion::streaming::operators::StatefulOperator;
    let root = scratch();
    write(&root.join("state/agg/1.arrow"), data);
    let Ok(checkpoint) = etlantic_runtime::checkpoint::Checkpoint::open(&root) else {
        return;
    };
    let Ok(Some(state)) = checkpoint.read_state("agg", 1) else {
        return;
    };
    if let Ok(mut op) = window_aggregation() {
        let _ = op.restore(&state);
    }
    if let Ok(mut op) = etlantic_datafusion::streaming::operators::DedupOperator::new(
        decoder_schema(),
        vec!["id".into()],
        None,
        None,
    ) {
        let _ = op.restore(&state);
    }
}

/// A tumbling-window count, sum and first/last per key (the snapshot harness's operator).
fn window_aggregation(
) -> etlantic_core::Result<etlantic_datafusion::streaming::operators::AggregateOperator> {
    use etlantic_core::ir::AggFunc;
    use etlantic_datafusion::streaming::accumulators::AggSpec;
    use etlantic_datafusion::streaming::operators::{AggregateLayout, AggregateOperator, Geometry};
    let spec = |name: &str, func, t: DataType| AggSpec {
        name: name.into(),
        func,
        input_type: Some(t),
    };
    AggregateOperator::new(AggregateLayout {
        keys: vec![Field::new("name", DataType::Utf8, true)],
        aggregates: vec![
            spec("n", AggFunc::Count, DataType::Int64),
            spec("s", AggFunc::Sum, DataType::Decimal128(10, 2)),
            spec("first", AggFunc::First, DataType::Utf8),
            spec("avg", AggFunc::Average, DataType::Float64),
            spec("max", AggFunc::Max, DataType::Date32),
        ],
        window: Some((
            Geometry::Tumbling(60_000_000),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        )),
        event_time_key: None,
    })
}

/// A directory stream's seen-files log: the bytes as a segment file and as an entry file.
pub fn source_log(data: &[u8]) {
    let root = scratch();
    let (seg, entry) = split2(data);
    write(&root.join("src/0.seg"), seg);
    write(&root.join("src/5"), entry);
    if let Ok(log) = etlantic_sources::files::SeenLog::open(root.join("src")) {
        for i in 0..=log.last_index().unwrap_or(0).min(2000) {
            let _ = log.files(i);
        }
    }
}

/// A file sink's log entry, read with the output it vouches for.
pub fn sink_log(data: &[u8]) {
    let root = scratch();
    let (entry, file) = split2(data);
    write(&root.join("out/_etlantic_sink/0"), entry);
    write(&root.join("out/part-00000-q.jsonl"), file);
    let _ = etlantic_sinks::files::read_log(root.join("out"));
    let _ = etlantic_sinks::files::read_committed(root.join("out"));
}

const SEED_PIPELINE: &str = include_str!("fuzz/seed_pipeline.yaml");
const SEED_PROFILE: &str = include_str!("fuzz/seed_profile.yaml");
const SEED_STREAMING_PIPELINE: &str = include_str!("fuzz/seed_streaming_pipeline.yaml");
const SEED_STREAMING_PROFILE: &str = include_str!("fuzz/seed_streaming_profile.yaml");
const SEED_DTCS: &str = include_str!("fuzz/seed.dtcs.yaml");
const SEED_DTCS_PLAN: &str = include_str!("fuzz/seed_plan.json");
const SEED_DPCS: &str = include_str!("fuzz/seed.dpcs.yaml");

const SEED_EXPRESSIONS: &[&str] = &[
    "status != 'cancelled'",
    "amount * 2 + ratio >= 10.5 and not flag",
    "coalesce(name, 'none') == 'x' or id in (1, 2, 3)",
    "date_trunc('hour', at) > utc",
    "substring(upper(name), 1, 3) || '-' || cast(id as string)",
    "case when id > 3 then 'big' else 'small' end",
    "round(amount, 1) between 0 and 100",
];

const SEED_JSONL: &str = "{\"id\": 1, \"name\": \"acme\", \"amount\": 12.50, \"ratio\": 0.5, \"small\": 7, \"flag\": true, \"day\": \"2024-01-02\", \"at\": \"2024-07-01T12:00:00\", \"utc\": \"2024-07-01T12:00:00.123Z\"}\n\
{\"id\": 2, \"name\": null, \"amount\": \"x\", \"at\": \"2024-03-31T02:30:00\"}\n\
{\"id\": -1, \"name\": \"Zed\", \"small\": 70000, \"day\": \"2024-02-30\"}\n\
not json\n\
{\"name\": \"missing id\"}\n";

const SEED_CSV: &str = "id,name,amount,ratio,small,flag,day,at,utc\n\
1,acme,12.50,0.5,7,true,2024-01-02,2024-07-01T12:00:00,2024-07-01T12:00:00Z\n\
2,,x,,,,,,\n\
3,\"quoted, name\",1e3,2,1,maybe,2024-13-01,yesterday,\n\
4,short\n";

/// Inputs each harness starts from: valid documents, records, files and checkpoints (the
/// binary ones made here by the writers they test), so that fuzzing begins from what the
/// readers meet in practice.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let two = |a: &str, b: &str| [a.as_bytes(), &[0], b.as_bytes()].concat();
    match target {
        "pipeline_profile" => vec![
            two(SEED_PIPELINE, SEED_PROFILE),
            two(SEED_STREAMING_PIPELINE, SEED_STREAMING_PROFILE),
        ],
        "contracts" => vec![
            ORDERS_CONTRACT.into(),
            DECODER_CONTRACT.into(),
            SEED_DTCS.into(),
            SEED_DTCS_PLAN.into(),
            SEED_DPCS.into(),
        ],
        "dtcs_expression" => SEED_EXPRESSIONS
            .iter()
            .map(|e| e.as_bytes().to_vec())
            .collect(),
        "decode_jsonl" => vec![SEED_JSONL.into()],
        "decode_csv" => vec![SEED_CSV.into()],
        "decode_parquet" => vec![parquet_seed()],
        "kafka_value" => SEED_JSONL.lines().map(|l| l.as_bytes().to_vec()).collect(),
        "batch_log" | "state_log" | "state_snapshot" | "source_log" | "sink_log" => {
            checkpoint_seeds(target)
        }
        _ => Vec::new(),
    }
}

/// A Parquet file of the decoder contract's columns (some values out of its rules).
fn parquet_seed() -> Vec<u8> {
    use arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int16Array, Int64Array,
        RecordBatch, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, -2, 3])),
        Arc::new(StringArray::from(vec![Some("acme"), None, Some("Zed")])),
        Arc::new(
            Decimal128Array::from(vec![Some(1250), None, Some(-5)])
                .with_precision_and_scale(10, 2)
                .expect("a decimal type"),
        ),
        Arc::new(Float64Array::from(vec![Some(0.5), Some(2.0), None])),
        Arc::new(Int16Array::from(vec![Some(7), None, Some(-1)])),
        Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
        Arc::new(Date32Array::from(vec![Some(19_000), None, Some(0)])),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000), None, Some(0)])
                .with_timezone("Europe/Paris"),
        ),
        Arc::new(
            TimestampMillisecondArray::from(vec![Some(1_700_000_000_000), None, Some(0)])
                .with_timezone("UTC"),
        ),
    ];
    let batch =
        RecordBatch::try_new(decoder_schema(), columns).expect("the seed batch fits its schema");
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None)
        .expect("a Parquet writer");
    w.write(&batch).expect("the seed batch writes");
    w.close().expect("the Parquet file closes");
    out
}

/// The files of a real checkpoint and file sink: a streaming query (a tumbling count and
/// a dedup over a directory stream, into a file sink) run over three micro-batches.
fn checkpoint_seeds(target: &str) -> Vec<Vec<u8>> {
    use etlantic_sinks as _;
    use etlantic_sources as _;
    let root = scratch().join("seed");
    for (i, lines) in [
        "{\"ts\": \"2024-01-01T00:00:10Z\", \"k\": \"a\"}\n{\"ts\": \"2024-01-01T00:00:20Z\", \"k\": \"b\"}\n",
        "{\"ts\": \"2024-01-01T00:01:10Z\", \"k\": \"a\"}\n",
        "{\"ts\": \"2024-01-01T00:02:30Z\", \"k\": \"c\"}\n",
    ]
    .iter()
    .enumerate()
    {
        write(&root.join(format!("in/{i:03}.jsonl")), lines.as_bytes());
    }
    write(
        &root.join("pipeline.yaml"),
        SEED_STREAMING_PIPELINE.as_bytes(),
    );
    write(
        &root.join("profile.yaml"),
        SEED_STREAMING_PROFILE.as_bytes(),
    );
    write(
        &root.join("contracts/events.odcs.yaml"),
        EVENTS_CONTRACT.as_bytes(),
    );
    write(
        &root.join("contracts/counts.odcs.yaml"),
        COUNTS_CONTRACT.as_bytes(),
    );
    let project = etlantic_plan::Project::load(
        &root.join("pipeline.yaml"),
        Some(&root.join("profile.yaml")),
    )
    .expect("the seed project loads");
    etlantic_datafusion::link();
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the seed project plans");
    let opts = etlantic_runtime::StreamingOptions::new(&root, root.join("chk"));
    block_on(async {
        let mut q = etlantic_runtime::StreamingQuery::start(&plan, opts)
            .await
            .expect("the seed query starts");
        q.run().await.expect("the seed query runs");
    });
    let files_in = |dir: &Path| -> Vec<Vec<u8>> {
        let mut paths: Vec<PathBuf> = walk(dir);
        paths.sort();
        paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
    };
    match target {
        "batch_log" => files_in(&root.join("chk/log")),
        "state_log" => files_in(&root.join("chk/state-changes")),
        "state_snapshot" => {
            // The window aggregation's and the dedup's own snapshots, as whole files.
            use etlantic_datafusion::streaming::operators::StatefulOperator;
            let chk = root.join("snapshots");
            let checkpoint =
                etlantic_runtime::checkpoint::Checkpoint::open(&chk).expect("a checkpoint");
            let agg = window_aggregation().expect("the aggregation");
            let dedup = etlantic_datafusion::streaming::operators::DedupOperator::new(
                decoder_schema(),
                vec!["id".into()],
                None,
                None,
            )
            .expect("the dedup");
            let mut out = files_in(&root.join("chk/state"));
            for (op, snap) in [("agg", agg.snapshot()), ("dedup", dedup.snapshot())] {
                checkpoint
                    .write_state(op, 1, &snap.expect("a snapshot"))
                    .expect("the snapshot writes");
                out.extend(files_in(&chk.join("state").join(op)));
            }
            out
        }
        "source_log" => {
            let entries = files_in(&root.join("chk/sources/0"));
            entries
                .iter()
                .map(|e| [&b""[..], &[0], e].concat())
                .collect()
        }
        "sink_log" => {
            let log = files_in(&root.join("out/counts/_etlantic_sink"));
            let data: Vec<Vec<u8>> = walk(&root.join("out/counts"))
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                .filter_map(|p| std::fs::read(p).ok())
                .collect();
            log.iter()
                .zip(data.iter().chain(std::iter::repeat(&Vec::new())))
                .map(|(l, d)| [l.as_slice(), &[0], d].concat())
                .collect()
        }
        _ => Vec::new(),
    }
}

const EVENTS_CONTRACT: &str = include_str!("fuzz/events.odcs.yaml");
const COUNTS_CONTRACT: &str = include_str!("fuzz/counts.odcs.yaml");

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Small deterministic mutations of `input` (bit flips, byte insertions, deletions,
/// truncations, duplicated slices), `n` of them from `seed`: a cheap stand-in for a fuzzer
/// that the normal test suite runs on every seed.
pub fn mutations(input: &[u8], seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            let mut v = input.to_vec();
            for _ in 0..1 + next() % 4 {
                let len = v.len().max(1);
                let at = (next() as usize) % len;
                match next() % 6 {
                    0 if !v.is_empty() => v[at] ^= 1 << (next() % 8),
                    1 => v.insert(at.min(v.len()), next() as u8),
                    2 if !v.is_empty() => {
                        v.remove(at);
                    }
                    3 => v.truncate(at),
                    4 if !v.is_empty() => {
                        let end = (at + 1 + (next() as usize) % 16).min(v.len());
                        let piece = v[at..end].to_vec();
                        let to = (next() as usize) % (v.len() + 1);
                        v.splice(to..to, piece);
                    }
                    _ if !v.is_empty() => {
                        v[at] = [0, b'"', b'\n', 0xff, b'{', b'9'][(next() % 6) as usize]
                    }
                    _ => v.push(next() as u8),
                }
            }
            v
        })
        .collect()
}
