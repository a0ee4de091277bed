//! Nexmark on the streaming runtime against the same queries as DataFusion batch queries.
//!
//! For every query of `etlantic_testkit::nexmark::QUERIES`: the pipeline runs on the
//! streaming runtime (`available_now`, `--per-batch` generator events per micro-batch)
//! over `--events` generator events, its sink counting rows; then the query's reference
//! SQL runs in DataFusion over the same events, generated into memory first (generation
//! is timed on both sides). Throughput is generator events per CPU-second of this
//! process (`/proc/self/stat`: user + system time of every thread), so it reads as
//! events/s per core on a shared machine; the stream/batch ratio compares the two in
//! one run.
//!
//! Then, on the wall clock (the generator paced with `realtime=true`, so event time is
//! arrival time):
//! - end-to-end latency at a 100 ms processing-time trigger: for every output row, the
//!   time from its `date_time` to the sink's write, as p50/p99;
//! - checkpoint overhead at 1-second triggers: the write-ahead log, state snapshots and
//!   commit (`walCommit` + `commitOffsets` of the progress records) as a share of the
//!   trigger interval and of the micro-batches' own time.
//!
//! `cargo xtask bench nexmark --events N` runs it; `--markdown FILE` writes the tables;
//! `--repeat N` (default 3) keeps the fastest of at least N runs of each side (more for
//! short queries, until a side has run `--min-cpu S` CPU-seconds, default 2); `--query qN` runs
//! one query and `--profile stream|stream-interval|batch` one side of its throughput
//! measurement only (for `perf record`). The throughput table has a second streaming
//! column with the profile's `state_checkpoint_interval` set to `--state-interval D`
//! (default 1 second): the state written once per D of processing time, as Flink
//! checkpoints, instead of after every micro-batch.

mod common;

use arrow::array::RecordBatch;
use common::{arg, cpu_seconds};
use datafusion::prelude::SessionContext;
use etlantic_core::plugin::{ReadLimit, Source, SourceContext};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_plan::Project;
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use etlantic_sources::nexmark::NexmarkSource;
use etlantic_testkit::nexmark::{profile, realtime_profile, Query, QUERIES};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// mimalloc, the allocator of the `etlantic` binary (its `mimalloc` feature), unless
/// `ETLANTIC_BENCH_ALLOCATOR=system` names glibc's: the same binary measures both.
#[global_allocator]
static GLOBAL: BenchAllocator = BenchAllocator(AtomicU8::new(UNDECIDED));

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;

/// Chooses once, at the first allocation (before anything could be freed), by reading
/// the environment with `getenv`, which does not allocate.
struct BenchAllocator(AtomicU8);

impl BenchAllocator {
    fn choice(&self) -> u8 {
        match self.0.load(Ordering::Relaxed) {
            UNDECIDED => {
                // SAFETY: a NUL-terminated name; getenv returns null or a C string.
                let value = unsafe { libc::getenv(c"ETLANTIC_BENCH_ALLOCATOR".as_ptr()) };
                let system = !value.is_null()
                    // SAFETY: non-null, from getenv.
                    && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"system";
                let choice = if system { SYSTEM } else { MIMALLOC };
                self.0.store(choice, Ordering::Relaxed);
                choice
            }
            chosen => chosen,
        }
    }
}

// SAFETY: every call forwards to one allocator, the same for the whole process (the choice
// is made before the first allocation and never changes).
unsafe impl std::alloc::GlobalAlloc for BenchAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if self.choice() == SYSTEM {
            unsafe { std::alloc::System.alloc(layout) }
        } else {
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if self.choice() == SYSTEM {
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        } else {
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if self.choice() == SYSTEM {
            unsafe { std::alloc::System.alloc_zeroed(layout) }
        } else {
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if self.choice() == SYSTEM {
            unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
        } else {
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

/// Minor page faults of this process so far: a fault clears a fresh page, which costs
/// about as much CPU as a few thousand instructions.
fn minor_faults() -> u64 {
    // SAFETY: an all-zero `rusage` is valid, and `getrusage` only writes into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "the process's resource usage is readable");
    u.ru_minflt as u64
}

struct Measure {
    rows: u64,
    wall: f64,
    cpu: f64,
    faults: u64,
}

fn measure<T>(f: impl FnOnce() -> (u64, T)) -> Measure {
    let (c0, w0, f0) = (cpu_seconds(), Instant::now(), minor_faults());
    let (rows, _) = f();
    Measure {
        rows,
        wall: w0.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - c0,
        faults: minor_faults() - f0,
    }
}

/// Plans `q` with the profile `profile` in `dir`.
fn plan(dir: &std::path::Path, q: &Query, profile: &str) -> etlantic_plan::PipelinePlan {
    std::fs::write(dir.join("pipeline.yaml"), q.pipeline).expect("write");
    std::fs::write(dir.join("profile.yaml"), profile).expect("write");
    let project = Project::load(&dir.join("pipeline.yaml"), Some(&dir.join("profile.yaml")))
        .expect("the query loads");
    etlantic_datafusion::link();
    etlantic_plan::plan(&project)
        .into_result()
        .expect("the query plans")
}

/// The streaming side; with `state_interval` (a duration) the profile's
/// `state_checkpoint_interval`: the operators' state is written once that much processing
/// time has passed, not after every micro-batch.
fn stream(
    rt: &tokio::runtime::Runtime,
    q: &Query,
    events: u64,
    per_batch: u64,
    state_interval: Option<&str>,
) -> Measure {
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = format!("nexmark_bench_{}", q.name);
    let rows = Arc::new(AtomicU64::new(0));
    let counter = rows.clone();
    etlantic_sinks::foreach::register(
        &name,
        Arc::new(move |b: etlantic_sinks::foreach::ForeachBatch<'_>| {
            // The rows of the result: in complete mode each write is all of it.
            let n = b.data.num_rows() as u64;
            match b.output_mode {
                OutputMode::Complete => counter.store(n, Ordering::Relaxed),
                _ => {
                    counter.fetch_add(n, Ordering::Relaxed);
                }
            }
            Ok(())
        }),
    );
    let mut profile_text = profile(q, events, per_batch, &format!("foreach://{name}"));
    if let Some(d) = state_interval {
        profile_text.push_str(&format!("state_checkpoint_interval: {d}\n"));
    }
    let plan = plan(dir.path(), q, &profile_text);
    measure(|| {
        rt.block_on(async {
            let opts = StreamingOptions::new(dir.path(), dir.path().join("chk"));
            let mut query = StreamingQuery::start(&plan, opts)
                .await
                .expect("the query starts");
            query.process_all_available().await.expect("the query runs");
            query.close().await.expect("the query closes");
        });
        (rows.load(Ordering::Relaxed), ())
    })
}

fn batch(rt: &tokio::runtime::Runtime, q: &Query, events: u64) -> Measure {
    let dir = tempfile::tempdir().expect("a temp dir");
    let plan = plan(
        dir.path(),
        q,
        &profile(q, events, events, "memory://unused"),
    );
    measure(|| {
        rt.block_on(async {
            let ctx = SessionContext::new();
            for s in &plan.sources {
                let schema = plan
                    .asset_contract(&s.asset)
                    .expect("a contract")
                    .arrow_schema();
                let uri = format!(
                    "nexmark://{}?events_per_batch={events}&max_events={events}&start_ms=0",
                    s.asset
                );
                let mut src = NexmarkSource::new(SourceContext {
                    storage_options: Default::default(),
                    asset: s.asset.clone(),
                    uri: BindingUri::parse(&uri).expect("a URI"),
                    schema: schema.clone(),
                    contract: None,
                    root: dir.path().into(),
                    mode: ExecutionMode::Streaming,
                    state: None,
                })
                .expect("the generator");
                let end = src
                    .latest_offset(None, &ReadLimit::unlimited())
                    .await
                    .expect("an offset")
                    .expect("events");
                let batches = src.read(None, &end).await.expect("events").batches;
                let table = datafusion::datasource::MemTable::try_new(schema, vec![batches])
                    .expect("a table");
                ctx.register_table(s.asset.as_str(), Arc::new(table))
                    .expect("registered");
            }
            let out: Vec<RecordBatch> = ctx
                .sql(q.reference_sql)
                .await
                .expect("the reference SQL")
                .collect()
                .await
                .expect("runs");
            (out.iter().map(|b| b.num_rows() as u64).sum(), ())
        })
    })
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What a paced run saw: the latency of every output row (µs) and the progress records.
struct Paced {
    latencies_us: Vec<i64>,
    progress: Vec<serde_json::Value>,
}

/// Runs `q` on the wall clock: `rate` events/s for `seconds`, the trigger given; the sink
/// records, for every output row, the time from its `date_time` (if it has one) to now.
/// `background_snapshots` as in [`StreamingOptions`].
fn paced(
    rt: &tokio::runtime::Runtime,
    q: &Query,
    trigger: &str,
    rate: u64,
    seconds: u64,
    background_snapshots: bool,
) -> Paced {
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = format!("nexmark_paced_{}_{}", q.name, trigger.replace(' ', "_"));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let sink_latencies = latencies.clone();
    etlantic_sinks::foreach::register(
        &name,
        Arc::new(move |b: etlantic_sinks::foreach::ForeachBatch<'_>| {
            let now = now_us();
            let mut out = sink_latencies.lock().expect("not poisoned");
            for batch in &b.data.batches {
                let Some(col) = batch.column_by_name("date_time") else {
                    continue;
                };
                let micros = arrow::compute::cast(
                    col,
                    &arrow::datatypes::DataType::Timestamp(
                        arrow::datatypes::TimeUnit::Microsecond,
                        None,
                    ),
                )
                .and_then(|c| arrow::compute::cast(&c, &arrow::datatypes::DataType::Int64))
                .expect("a timestamp");
                let micros = micros
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .expect("Int64");
                out.extend(micros.iter().flatten().map(|t| now - t));
            }
            Ok(())
        }),
    );
    // A little lead, so the first trigger finds the query started.
    let start_ms = now_us() / 1000 + 300;
    let events = rate * seconds;
    let plan = plan(
        dir.path(),
        q,
        &realtime_profile(
            q,
            trigger,
            rate,
            events,
            start_ms,
            &format!("foreach://{name}"),
        ),
    );
    let progress = Arc::new(Mutex::new(Vec::new()));
    let listener = progress.clone();
    let mut opts = StreamingOptions::new(dir.path(), dir.path().join("chk"));
    opts.background_snapshots = background_snapshots;
    opts.on_progress = Some(Arc::new(
        move |p: &etlantic_runtime::progress::QueryProgress| {
            listener.lock().expect("not poisoned").push(p.to_json());
        },
    ));
    let stop = opts.stop.clone();
    rt.block_on(async {
        let mut query = StreamingQuery::start(&plan, opts)
            .await
            .expect("the query starts");
        // Stop once the last event is due and a few more triggers have run.
        let stopper = std::thread::spawn({
            let stop: Arc<AtomicBool> = stop.clone();
            move || {
                std::thread::sleep(Duration::from_millis(300 + seconds * 1000 + 2500));
                stop.store(true, Ordering::SeqCst);
            }
        });
        query.run().await.expect("the query runs");
        stopper.join().expect("the stopper");
    });
    let mut latencies_us = std::mem::take(&mut *latencies.lock().expect("not poisoned"));
    latencies_us.sort_unstable();
    let progress = std::mem::take(&mut *progress.lock().expect("not poisoned"));
    Paced {
        latencies_us,
        progress,
    }
}

fn percentile(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// A duration of the progress records (ms), summed over the micro-batches with input.
fn duration_ms(progress: &[serde_json::Value], key: &str) -> f64 {
    progress
        .iter()
        .filter(|p| p["numInputRows"].as_u64().unwrap_or(0) > 0)
        .map(|p| p["durationMs"][key].as_f64().unwrap_or(0.0))
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let events: u64 = arg(&args, "--events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let per_batch: u64 = arg(&args, "--per-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let repeat: usize = arg(&args, "--repeat")
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let allocator = if GLOBAL.choice() == SYSTEM {
        "glibc malloc"
    } else {
        "mimalloc"
    };
    let min_cpu: f64 = arg(&args, "--min-cpu")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    // `--state-interval D` (default 1 second): the second streaming column writes the
    // operators' state once per D of processing time (Flink's checkpoint interval)
    // instead of after every micro-batch (Spark's way, the first column).
    let state_interval = arg(&args, "--state-interval").unwrap_or_else(|| "1 second".into());
    let mut table = format!(
        "Nexmark, {events} generator events, {per_batch} per micro-batch, allocator {allocator}; events per CPU-second of the process (≈ per core), the fastest of at least {repeat} runs of each side (more for short queries: until each side has used {min_cpu} CPU-seconds). *stream*: the state checkpointed after every micro-batch (Spark's way); *stream, state every {state_interval}*: `state_checkpoint_interval: {state_interval}` (Flink's way; offsets and commits still logged per micro-batch; a run shorter than the interval, as q0–q3 and q8 here, writes no state at all, a longer one about once per interval).\n\n| query | output rows | stream events/s/core | batch events/s/core | stream/batch | stream, state every {state_interval}: events/s/core | its stream/batch | stream wall s | runs |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    // `--query q3`: one query only (profiling).
    let only = arg(&args, "--query");
    let selected = |q: &&Query| only.as_deref().is_none_or(|o| o == q.name);
    // `--profile stream|batch`: run that side of the throughput table only, then stop
    // (so `perf record` sees one of them).
    // `--profile-runs N` (default 1) runs it N times in one process: the later runs are
    // warm (allocator pages, page cache), as the fastest run of the table is.
    let profile_side = arg(&args, "--profile");
    if let Some(side) = profile_side.as_deref() {
        let runs: usize = arg(&args, "--profile-runs")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        for q in QUERIES.iter().filter(selected) {
            for _ in 0..runs {
                let m = match side {
                    "stream" => stream(&rt, q, events, per_batch, None),
                    "stream-interval" => stream(&rt, q, events, per_batch, Some(&state_interval)),
                    "batch" => batch(&rt, q, events),
                    other => {
                        panic!("--profile takes stream, stream-interval or batch, not {other}")
                    }
                };
                println!(
                    "{} {side}: {} rows, {:.0} events/s/core, {:.2} s wall, {} minor faults",
                    q.name,
                    m.rows,
                    events as f64 / m.cpu.max(1e-3),
                    m.wall,
                    m.faults
                );
            }
        }
        return;
    }
    // `--repeat N` (default 3): each side runs at least N times, alternating, and the
    // fastest run counts. The CPU cost of page faults and file system calls on these
    // shared virtual machines varies up to twofold from run to run, which one run
    // cannot tell from a real difference. Short queries (q3 and q8 take a tenth of a
    // second) run more often, until each side has used `--min-cpu` CPU-seconds (at
    // most 50 runs): their fastest run is then as settled as a long query's.
    let fastest = |a: Measure, b: Measure| if b.cpu < a.cpu { b } else { a };
    let interval = Some(state_interval.as_str());
    for q in QUERIES.iter().filter(selected) {
        let mut s = stream(&rt, q, events, per_batch, None);
        let mut si = stream(&rt, q, events, per_batch, interval);
        let mut b = batch(&rt, q, events);
        let (mut s_cpu, mut b_cpu) = (s.cpu.min(si.cpu), b.cpu);
        let mut runs = 1;
        while runs < repeat || (runs < 50 && s_cpu.min(b_cpu) < min_cpu) {
            let s2 = stream(&rt, q, events, per_batch, None);
            let si2 = stream(&rt, q, events, per_batch, interval);
            let b2 = batch(&rt, q, events);
            s_cpu += s2.cpu.min(si2.cpu);
            b_cpu += b2.cpu;
            s = fastest(s, s2);
            si = fastest(si, si2);
            b = fastest(b, b2);
            runs += 1;
        }
        assert_eq!(s.rows, b.rows, "{}: stream and batch disagree", q.name);
        assert_eq!(
            si.rows, b.rows,
            "{}: stream (state interval) and batch disagree",
            q.name
        );
        let rate = |m: &Measure| events as f64 / m.cpu.max(1e-3);
        let line = format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {} |\n",
            q.name,
            s.rows,
            rate(&s),
            rate(&b),
            rate(&s) / rate(&b),
            rate(&si),
            rate(&si) / rate(&b),
            s.wall,
            runs
        );
        print!("{line}");
        table.push_str(&line);
    }
    println!("\n{table}");

    // Latency at a 100 ms trigger (queries whose output carries `date_time`).
    let rate: u64 = arg(&args, "--latency-rate")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let seconds: u64 = arg(&args, "--seconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut latency = format!(
        "End-to-end latency at a 100 ms processing-time trigger, {rate} events/s for {seconds} s (generator paced by the wall clock; from each output row's event time to its sink write).\n\n| query | output rows | p50 ms | p99 ms | max ms | micro-batches |\n|---|---|---|---|---|---|\n"
    );
    for q in QUERIES
        .iter()
        .filter(|q| ["q0", "q1"].contains(&q.name))
        .filter(selected)
    {
        let r = paced(
            &rt,
            q,
            "processing_time 100 milliseconds",
            rate,
            seconds,
            true,
        );
        let line = format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {} |\n",
            q.name,
            r.latencies_us.len(),
            percentile(&r.latencies_us, 0.5),
            percentile(&r.latencies_us, 0.99),
            percentile(&r.latencies_us, 1.0),
            r.progress.len()
        );
        print!("{line}");
        latency.push_str(&line);
    }

    // Checkpoint overhead at 1-second triggers.
    let rate: u64 = arg(&args, "--checkpoint-rate")
        .and_then(|v| v.parse().ok())
        .unwrap_or(500_000);
    let mut overhead = format!(
        "Checkpoint overhead at 1-second processing-time triggers, {rate} events/s for {seconds} s: the write-ahead log (`walCommit`) plus state snapshots and commit (`commitOffsets`) per micro-batch with input. Whole snapshots of changelog state (every 10th micro-batch, once its changes since the last one are half the state) written in the background, or before the commit for comparison.\n\n| query | whole snapshots | micro-batches | checkpoint ms/batch | batch ms/batch | share of the 1 s interval | share of batch time |\n|---|---|---|---|---|---|---|\n"
    );
    for q in QUERIES
        .iter()
        .filter(|q| ["q1", "q3", "q5", "q7"].contains(&q.name))
        .filter(selected)
    {
        // Changelog operators (stream-stream joins) write a whole snapshot on a 10th
        // micro-batch: in the background (the default), and before the commit for
        // comparison in the same run.
        for background in [true, false] {
            let r = paced(
                &rt,
                q,
                "processing_time 1 second",
                rate,
                seconds,
                background,
            );
            let batches = r
                .progress
                .iter()
                .filter(|p| p["numInputRows"].as_u64().unwrap_or(0) > 0)
                .count()
                .max(1) as f64;
            let ckpt =
                duration_ms(&r.progress, "walCommit") + duration_ms(&r.progress, "commitOffsets");
            let total = duration_ms(&r.progress, "triggerExecution");
            let line = format!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1}% | {:.1}% |\n",
                q.name,
                if background {
                    "background"
                } else {
                    "before the commit"
                },
                batches,
                ckpt / batches,
                total / batches,
                100.0 * ckpt / (batches * 1000.0),
                100.0 * ckpt / total.max(1e-9)
            );
            print!("{line}");
            overhead.push_str(&line);
        }
    }

    if let Some(path) = arg(&args, "--markdown") {
        std::fs::write(
            &path,
            format!("# Nexmark results\n\nProduced by `cargo xtask bench nexmark` on one machine in one run; figures from different runs (or machines) are not comparable, the ratios within a run are.\n\n## Throughput\n\n{table}\n## Latency\n\n{latency}\n## Checkpoint overhead\n\n{overhead}"),
        )
        .expect("the results file is writable");
    }
}
