//! The walk-through of `examples/clicks-to-delta`, as a test: a Kafka topic `clicks`
//! (librdkafka's mock cluster, created in this process and reached by the `etlantic` child
//! process over TCP) → 1-hour tumbling count per campaign with a 1-hour watermark → a Delta
//! table, on a processing-time trigger (100 ms here, 30 s in the example's profile),
//! checkpointed, crashed in the middle of the stream and restarted: the table holds
//! exactly the expected counts, once. A click 2 hours late is dropped — or quarantined with
//! its reason when the source's late policy says so.
//!
//! The example project's files are used as they are; the test only shortens the trigger
//! and caps a micro-batch at 20 offsets so that the stream has many micro-batches.

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CAMPAIGNS: [&str; 3] = ["spring", "summer", "winter"];
/// 2026-11-30T08:00:00Z.
const START: i64 = 1_796_025_600;

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/clicks-to-delta")
}

fn iso(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One click per campaign every 5 minutes from 08:00 to 12:55 (180 clicks, keyed by
/// campaign over 2 partitions), then one click of 08:30 — more than 2 hours behind the
/// newest event, so its window [08:00, 09:00) has long closed.
fn produce(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut id = 0i64;
    let send = |id: i64, secs: i64, campaign: &str, partition: i32| {
        let value =
            json!({"event_id": id, "ts": iso(secs), "campaign_id": campaign, "user_id": id % 7});
        p.send(
            BaseRecord::<str, str>::to("clicks")
                .partition(partition)
                .key(campaign)
                .payload(&value.to_string()),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    };
    for slot in 0..60 {
        for (c, campaign) in CAMPAIGNS.iter().enumerate() {
            send(id, START + slot * 300, campaign, (c % 2) as i32);
            id += 1;
        }
    }
    send(9_999, START + 30 * 60, "spring", 0);
    p.flush(Duration::from_secs(10)).unwrap();
}

/// What the table must hold when the stream has caught up: the final watermark is
/// 12:55 - 1 h = 11:55, so the windows [08:00, 09:00), [09:00, 10:00) and [10:00, 11:00)
/// are closed and emitted, 12 clicks per campaign each; the late click counts nowhere.
fn expected() -> Vec<String> {
    let mut rows = Vec::new();
    for h in 0..3 {
        for c in CAMPAIGNS {
            rows.push(format!(
                "{}|{}|{c}|12",
                iso(START + h * 3600),
                iso(START + (h + 1) * 3600)
            ));
        }
    }
    rows.sort();
    rows
}

struct Env {
    _cluster: MockCluster<'static, DefaultProducerContext>,
    bootstrap: String,
    dir: tempfile::TempDir,
}

fn setup(late_policy: &str) -> Env {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("clicks", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    produce(&bootstrap);
    let dir = tempfile::tempdir().unwrap();
    let ex = example_dir();
    for f in [
        "pipeline.yaml",
        "profiles/local.yaml",
        "contracts/clicks.yaml",
        "contracts/clicks_per_hour.yaml",
    ] {
        let mut text = std::fs::read_to_string(ex.join(f)).unwrap();
        if f == "profiles/local.yaml" {
            assert!(text.contains("trigger: processing_time 30 seconds"));
            text = text
                .replace(
                    "trigger: processing_time 30 seconds",
                    "trigger: processing_time 100 milliseconds",
                )
                .replace("format=json", "format=json&maxOffsetsPerTrigger=20");
        }
        if f == "pipeline.yaml" {
            assert!(text.contains("late_events: {policy: drop}"));
            text = text.replace(
                "late_events: {policy: drop}",
                &format!("late_events: {{policy: {late_policy}}}"),
            );
        }
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    Env {
        _cluster: cluster,
        bootstrap,
        dir,
    }
}

fn command(env: &Env, fail_point: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(env.dir.path())
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env("KAFKA_BOOTSTRAP", &env.bootstrap)
        .env_remove("ETLANTIC_FAIL_POINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn table(dir: &Path) -> Vec<String> {
    let path = dir.join("out/clicks_per_hour");
    if !path.join("_delta_log").exists() {
        return vec![];
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batches = rt
        .block_on(etlantic_sinks::delta::read_table(&path))
        .unwrap();
    let mut rows = Vec::new();
    for b in &batches {
        let cols: Vec<Vec<String>> = ["window_start", "window_end", "campaign_id", "clicks"]
            .iter()
            .map(|c| {
                let col = b.column_by_name(c).unwrap_or_else(|| panic!("column {c}"));
                let col = if let arrow::datatypes::DataType::Timestamp(_, _) = col.data_type() {
                    arrow::compute::cast(
                        col,
                        &arrow::datatypes::DataType::Timestamp(
                            arrow::datatypes::TimeUnit::Second,
                            Some("UTC".into()),
                        ),
                    )
                    .unwrap()
                } else {
                    col.clone()
                };
                (0..b.num_rows())
                    .map(|i| {
                        let s = arrow::util::display::array_value_to_string(&col, i).unwrap();
                        // Timestamps print as `2026-11-30T08:00:00Z`.
                        s.replace("+00:00", "Z")
                    })
                    .collect()
            })
            .collect();
        for i in 0..b.num_rows() {
            rows.push(
                cols.iter()
                    .map(|c| c[i].clone())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    rows.sort();
    rows
}

/// Runs the query until the table holds the expected number of rows (or the deadline),
/// lets it run a little longer — a duplicate would show up then — and stops it with
/// Ctrl-C (SIGINT), as a user would.
fn run_until_caught_up(env: &Env) -> Output {
    let child: Child = command(env, None).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while table(env.dir.path()).len() < expected().len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "stopped cleanly: {}", describe(&out));
    out
}

fn progress(dir: &Path) -> Vec<Value> {
    let p = dir.join(".etlantic/checkpoints/clicks_per_hour/progress.jsonl");
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn late_rows(dir: &Path) -> u64 {
    progress(dir)
        .iter()
        .flat_map(|p| p["stateOperators"].as_array().cloned().unwrap_or_default())
        .map(|op| op["numRowsDroppedByWatermark"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn uninterrupted_stream_counts_every_click_once_and_drops_the_late_one() {
    let env = setup("drop");
    run_until_caught_up(&env);
    assert_eq!(table(env.dir.path()), expected());
    // Many micro-batches, offsets in the checkpoint, the late click dropped by the watermark.
    let p = progress(env.dir.path());
    assert!(p.len() >= 10, "{} micro-batches", p.len());
    assert_eq!(late_rows(env.dir.path()), 1, "the 2-hours-late click");
    let q = env.dir.path().join("out/quarantine.jsonl");
    assert!(!q.exists() || std::fs::read_to_string(q).unwrap().trim().is_empty());
}

#[test]
fn crashed_mid_stream_and_restarted_the_table_is_exactly_once() {
    // Killed in the middle of a Delta write, and right after a commit-log entry.
    for point in ["in_sink:3", "after_sink:7", "after_commit:5"] {
        let env = setup("drop");
        let out = command(&env, Some(point)).output().unwrap();
        assert_eq!(
            out.status.signal(),
            Some(6),
            "{point}: must abort\n{}",
            describe(&out)
        );
        assert!(
            table(env.dir.path()).len() < expected().len(),
            "{point}: crashed mid-stream"
        );
        run_until_caught_up(&env);
        assert_eq!(table(env.dir.path()), expected(), "{point}");
        // Every batch id is committed once in the checkpoint.
        let ids: Vec<u64> = progress(env.dir.path())
            .iter()
            .map(|p| p["batchId"].as_u64().unwrap())
            .collect();
        let mut unique = ids.clone();
        unique.dedup();
        assert_eq!(ids, unique, "{point}: batch ids {ids:?}");
    }
}

#[test]
fn a_click_two_hours_late_is_quarantined_with_its_reason_when_the_policy_says_so() {
    let env = setup("quarantine");
    run_until_caught_up(&env);
    assert_eq!(table(env.dir.path()), expected());
    let q =
        etlantic_runtime::quarantine::read_quarantine(env.dir.path().join("out/quarantine.jsonl"))
            .unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["code"], json!("ETL708"), "{:?}", q[0]);
    let raw = q[0]["raw"].to_string();
    assert!(raw.contains("9999"), "the late click itself: {raw}");
    let reason = q[0].to_string().to_lowercase();
    assert!(
        reason.contains("watermark") || reason.contains("late"),
        "{reason}"
    );
    // A late row is judged after decoding, so it names its source asset (the record
    // itself is in `raw`), and the micro-batch that dropped it.
    assert_eq!(q[0]["position"]["asset"], json!("clicks"), "{:?}", q[0]);
    assert!(q[0]["batch_id"].as_u64().is_some(), "{:?}", q[0]);
}
