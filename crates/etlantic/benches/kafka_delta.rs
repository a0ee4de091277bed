//! Kafka → window aggregate → Delta benchmark (issue 5): the walk-through pipeline of
//! `examples/clicks-to-delta` (1-hour tumbling count per campaign, 1-hour watermark,
//! Delta sink with a `txn` per micro-batch) reading JSON clicks from librdkafka's
//! in-process mock cluster, available-now trigger, `maxOffsetsPerTrigger` per micro-batch.
//!
//! It first measures the mock cluster's own ceiling: a consumer configured as the source's
//! (read committed, no auto commit) that reads every click and only counts them. Then it
//! reports events/s end to end (and as a share of that ceiling) and the checkpoint cost per micro-batch — the offsets
//! WAL (`walCommit`) plus the state snapshot and commit log (`commitOffsets`), from the
//! progress records — in milliseconds and as a share of the micro-batch's time.
//!
//! `cargo xtask bench kafka` or
//! `cargo bench -p etlantic --bench kafka_delta -- --events 1000000 --per-batch 100000`.

use etlantic::plan::{plan, Project};
use etlantic_core::streaming::Trigger;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CAMPAIGNS: u64 = 1_000;
/// 2026-11-30T08:00:00Z.
const START_MS: i64 = 1_796_025_600_000;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The mock cluster keeps at most 5 MB (or 100,000 records) per partition and deletes
/// the oldest records beyond that, like a broker's retention: with clicks of about 100
/// bytes, the topic gets one partition per 40,000 clicks (at least 4) so that every click
/// produced before the query starts is still there when it reads.
fn partitions(events: u64) -> i32 {
    events.div_ceil(40_000).max(4) as i32
}

/// `events` clicks over 2 hours of event time, in order, round-robin over the partitions.
fn produce(bootstrap: &str, events: u64) {
    let n = partitions(events) as u64;
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let span_ms = 2 * 3600 * 1000;
    for i in 0..events {
        let ts = START_MS + (i as i64 * span_ms) / events as i64;
        let ts = chrono::DateTime::from_timestamp_millis(ts)
            .expect("in range")
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let v = json!({"event_id": i, "ts": ts, "campaign_id": format!("c{:04}", i % CAMPAIGNS), "user_id": i % 100_003});
        let payload = v.to_string();
        let mut record = BaseRecord::<str, str>::to("clicks")
            .partition((i % n) as i32)
            .payload(&payload);
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    // Queue full: let the background thread drain it.
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// Reads all `events` clicks with a consumer configured as the Kafka source's, counting
/// them and touching nothing else; returns the seconds taken: the mock cluster's ceiling
/// for any reader in this process.
fn count_only(bootstrap: &str, events: u64) -> f64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "count-only")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions(events) {
        tpl.add_partition_offset("clicks", p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let started = Instant::now();
    let (mut n, mut bytes) = (0u64, 0usize);
    while n < events {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                use rdkafka::message::Message;
                n += 1;
                bytes += m.payload().map_or(0, <[u8]>::len);
            }
            Some(Err(e)) => panic!("count-only consumer: {e}"),
            None if started.elapsed() > Duration::from_secs(300) => {
                panic!("count-only consumer: {n} of {events} after 300 s")
            }
            None => {}
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert!(bytes > 0);
    secs
}

fn copy_project(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/clicks-to-delta");
    for f in [
        "pipeline.yaml",
        "profiles/local.yaml",
        "contracts/clicks.yaml",
        "contracts/clicks_per_hour.yaml",
    ] {
        std::fs::create_dir_all(to.join(f).parent().expect("parent")).expect("mkdir");
        std::fs::copy(from.join(f), to.join(f)).expect("copy");
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn main() {
    let events: u64 = arg("--events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let per_batch: u64 = arg("--per-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("clicks", partitions(events), 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let t = Instant::now();
    produce(&bootstrap, events);
    eprintln!(
        "produced {events} clicks in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let ceiling_secs = count_only(&bootstrap, events);

    let work = tempfile::tempdir().expect("tempdir");
    copy_project(work.path());
    let mut project = Project::load(
        &work.path().join("pipeline.yaml"),
        Some(&work.path().join("profiles/local.yaml")),
    )
    .expect("the example loads");
    project.profile.trigger = Some(Trigger::AvailableNow);
    project.profile.bindings.insert(
        "clicks".into(),
        format!("kafka://{bootstrap}/clicks?format=json&maxOffsetsPerTrigger={per_batch}"),
    );
    let p = plan(&project).into_result().expect("plans");
    let ctx = etlantic::run::RunContext::for_plan(&p, work.path());
    let records: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = records.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    let report = rt.block_on(etlantic::run::run_streaming(
        &p,
        &ctx,
        etlantic::run::StreamingRun {
            on_progress: Some(Arc::new(
                move |p: &etlantic_runtime::progress::QueryProgress| {
                    sink.lock().expect("lock").push(p.to_json())
                },
            )),
            stop: Default::default(),
            max_batches: None,
            metrics_addr: None,
            progress: None,
        },
    ));
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(report.status, "succeeded", "{:?}", report.errors);
    let read: u64 = report.sources.iter().map(|s| s.rows + s.rejected).sum();
    assert_eq!(read, events, "every click read");
    let progress = records.lock().expect("lock").clone();
    if arg("--verbose").is_some() || std::env::args().any(|a| a == "--verbose") {
        for p in &progress {
            eprintln!(
                "batch {} rows {} durationMs {}",
                p["batchId"], p["numInputRows"], p["durationMs"]
            );
        }
        eprintln!("run report: {} ms", report.duration_ms);
    }
    let ms = |p: &Value, k: &str| p["durationMs"][k].as_f64().unwrap_or(0.0);
    let data: Vec<&Value> = progress
        .iter()
        .filter(|p| p["numInputRows"].as_u64().unwrap_or(0) > 0)
        .collect();
    let checkpoint: Vec<f64> = data
        .iter()
        .map(|p| ms(p, "walCommit") + ms(p, "commitOffsets"))
        .collect();
    let share: Vec<f64> = data
        .iter()
        .map(|p| {
            let total = ms(p, "triggerExecution").max(1.0);
            (ms(p, "walCommit") + ms(p, "commitOffsets")) / total
        })
        .collect();
    let add_batch = median(data.iter().map(|p| ms(p, "addBatch")).collect());
    let get_batch = median(data.iter().map(|p| ms(p, "getBatch")).collect());
    let ck = median(checkpoint);
    let sh = median(share);
    println!(
        "kafka → window → delta: {events} events, {per_batch} per micro-batch, {} micro-batches ({} with data)",
        progress.len(),
        data.len()
    );
    println!(
        "  {:>10.0} events/s   {secs:.2} s   end to end",
        events as f64 / secs
    );
    println!(
        "  {:>10.0} events/s   {ceiling_secs:.2} s   the mock cluster's ceiling (a consumer that only counts); end to end is {:.0} % of it",
        events as f64 / ceiling_secs,
        100.0 * ceiling_secs / secs
    );
    println!(
        "  per data micro-batch (median): read {get_batch:.0} ms, aggregate + Delta commit {add_batch:.0} ms, checkpoint {ck:.1} ms ({:.1} % of the micro-batch)",
        sh * 100.0
    );
    println!(
        "{}",
        json!({"events": events, "per_batch": per_batch, "seconds": secs,
               "events_per_s": events as f64 / secs,
               "count_only_events_per_s": events as f64 / ceiling_secs, "micro_batches": progress.len(),
               "median_ms": {"getBatch": get_batch, "addBatch": add_batch, "checkpoint": ck},
               "checkpoint_share": sh})
    );
}
