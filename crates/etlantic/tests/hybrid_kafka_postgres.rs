//! The hybrid walk-through of `examples/orders-to-postgres-hybrid`, as a test: a Kafka
//! topic `orders` (librdkafka's mock cluster, in this process, reached by the `etlantic`
//! child process over TCP) → revenue per region in 1-minute tumbling windows on the
//! streaming runtime (a stateful region on DataFusion) → the contract of the hand-over
//! port → report columns computed inside PostgreSQL (an SQL region, placed there by the
//! profile's `engines:` override) → upserted into a reporting table in the same database.
//!
//! Bad input is quarantined with its reason and Kafka position (a negative amount, an
//! unknown status, a record that is not JSON, an order after its window closed); the
//! rest is counted once. The query is killed at every step of the micro-batch protocol,
//! restarted, and the table and the quarantine equal the uninterrupted run's: exactly
//! once across the restart, through both regions.
//!
//! The example's files are used as they are; the test only points the sink at a fresh
//! schema and shortens the trigger (or uses `available_now` where the run must end by
//! itself) and caps a micro-batch at 10 offsets so that the stream has many.

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use serde_json::{json, Value};
use sqlx::Connection;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const REGIONS: [&str; 3] = ["eu", "us", "apac"];
/// 2026-11-30T08:00:00Z.
const START: i64 = 1_796_025_600;
/// One order per region every 10 s for 6 minutes.
const SLOTS: i64 = 36;

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/orders-to-postgres-hybrid")
}

fn iso(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One good order: (id, seconds after START, region, amount, status).
type Order = (i64, i64, &'static str, f64, &'static str);

/// The good orders, in production order. Amounts are multiples of 0.25, so sums are
/// exact in binary floating point on both sides; every 11th order is cancelled.
fn orders() -> Vec<Order> {
    let mut v = Vec::new();
    let mut id = 0;
    for slot in 0..SLOTS {
        for region in REGIONS {
            let amount = 5.0 + (id % 8) as f64 * 2.5;
            let status = if id % 11 == 10 { "cancelled" } else { "paid" };
            v.push((id, slot * 10, region, amount, status));
            id += 1;
        }
    }
    v
}

/// Produces the orders (keyed by region over 2 partitions) with four bad records among
/// them, and one order 5 minutes late at the end.
fn produce(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let send = |payload: String, key: &str| {
        let partition = if key == "us" { 1 } else { 0 };
        p.send(
            BaseRecord::<str, str>::to("orders")
                .partition(partition)
                .key(key)
                .payload(&payload),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    };
    for (i, (id, at, region, amount, status)) in orders().into_iter().enumerate() {
        send(
            json!({"order_id": id, "ts": iso(START + at), "region": region, "amount": amount, "status": status})
                .to_string(),
            region,
        );
        match i {
            20 => send(
                json!({"order_id": 9001, "ts": iso(START + at), "region": "eu", "amount": -3.0, "status": "paid"}).to_string(),
                "eu",
            ),
            40 => send(
                json!({"order_id": 9002, "ts": iso(START + at), "region": "us", "amount": 7.5, "status": "lost"}).to_string(),
                "us",
            ),
            60 => send(r#"{"order_id": 9003, "ts": "#.to_string(), "eu"),
            _ => {}
        }
    }
    // The newest event is at 08:05:50, so the watermark is 08:05:20 and the window
    // [08:00, 08:01) closed long ago.
    send(
        json!({"order_id": 9004, "ts": iso(START + 5), "region": "eu", "amount": 12.5, "status": "paid"})
            .to_string(),
        "eu",
    );
    p.flush(Duration::from_secs(10)).unwrap();
}

/// The table the run must leave: per (window start, region) the count and revenue of
/// the orders that are not cancelled, the average order and the tier — computed here
/// from the generated orders, independently of the engines.
fn expected() -> Vec<String> {
    let mut per: BTreeMap<(i64, &str), (i64, f64)> = BTreeMap::new();
    for (_, at, region, amount, status) in orders() {
        if status == "cancelled" {
            continue;
        }
        let e = per.entry((at / 60 * 60, region)).or_default();
        e.0 += 1;
        e.1 += amount;
    }
    per.into_iter()
        .map(|((start, region), (n, revenue))| {
            let tier = if revenue >= 80.0 { "high" } else { "normal" };
            render(
                START + start,
                START + start + 60,
                region,
                n,
                revenue,
                revenue / n as f64,
                tier,
            )
        })
        .collect()
}

fn render(
    start: i64,
    end: i64,
    region: &str,
    n: i64,
    revenue: f64,
    avg: f64,
    tier: &str,
) -> String {
    format!(
        "{}|{}|{region}|{n}|{revenue:.4}|{avg:.6}|{tier}",
        iso(start),
        iso(end)
    )
}

static SEQ: AtomicU32 = AtomicU32::new(0);

struct Env {
    _cluster: MockCluster<'static, DefaultProducerContext>,
    bootstrap: String,
    dir: tempfile::TempDir,
    schema: String,
}

impl Drop for Env {
    fn drop(&mut self) {
        let schema = self.schema.clone();
        block_on(pg_exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")));
    }
}

enum Trigger {
    /// The example's processing-time trigger, shortened to 100 ms.
    ProcessingTime,
    /// Process what the topic holds, then stop.
    AvailableNow,
}

fn setup(trigger: Trigger) -> Env {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    produce(&bootstrap);
    let schema = format!(
        "etl_hybrid_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    block_on(pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )));
    let dir = tempfile::tempdir().unwrap();
    let ex = example_dir();
    for f in [
        "pipeline.yaml",
        "profiles/local.yaml",
        "contracts/orders.yaml",
        "contracts/minute_revenue.yaml",
        "contracts/revenue_report.yaml",
    ] {
        let mut text = std::fs::read_to_string(ex.join(f)).unwrap();
        if f == "profiles/local.yaml" {
            for (from, _) in [
                ("trigger: processing_time 10 seconds", ()),
                ("table=public.revenue_report", ()),
                ("format=json", ()),
            ] {
                assert!(text.contains(from), "the example profile has `{from}`");
            }
            let trigger = match trigger {
                Trigger::ProcessingTime => "trigger: processing_time 100 milliseconds",
                Trigger::AvailableNow => "trigger: available_now",
            };
            text = text
                .replace("trigger: processing_time 10 seconds", trigger)
                .replace(
                    "table=public.revenue_report",
                    &format!("table={schema}.revenue_report"),
                )
                .replace("format=json", "format=json&maxOffsetsPerTrigger=10");
        }
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    Env {
        _cluster: cluster,
        bootstrap,
        dir,
        schema,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn pg_exec(sql: &str) {
    let mut c = sqlx::PgConnection::connect(PG)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run `cargo xtask setup`)");
    sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
}

fn command(env: &Env, args: &[&str], fail_point: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(env.dir.path())
        .args(args)
        .env("KAFKA_BOOTSTRAP", &env.bootstrap)
        .env_remove("ETLANTIC_FAIL_POINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd
}

fn run(env: &Env, fail_point: Option<&str>) -> Output {
    command(
        env,
        &["run", "pipeline.yaml", "--format", "json"],
        fail_point,
    )
    .output()
    .unwrap()
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The reporting table, rendered and sorted (empty while it does not exist).
fn table(env: &Env) -> Vec<String> {
    let sql = format!(
        "SELECT CAST(EXTRACT(EPOCH FROM window_start) AS BIGINT), CAST(EXTRACT(EPOCH FROM window_end) AS BIGINT), region, orders, revenue, avg_order, tier FROM {}.revenue_report",
        env.schema
    );
    type Row = (i64, i64, String, i64, f64, f64, String);
    let rows: Vec<Row> = block_on(async {
        let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
        sqlx::query_as(&sql)
            .fetch_all(&mut c)
            .await
            .unwrap_or_default()
    });
    let mut v: Vec<String> = rows
        .into_iter()
        .map(|(s, e, region, n, revenue, avg, tier)| render(s, e, &region, n, revenue, avg, &tier))
        .collect();
    v.sort();
    v
}

/// The quarantine as sorted (code, Kafka position, batch) records.
fn quarantined(dir: &Path) -> Vec<Value> {
    let path = dir.join("out/quarantine.jsonl");
    if !path.exists() {
        return vec![];
    }
    let mut v: Vec<Value> = etlantic_runtime::quarantine::read_quarantine(path)
        .unwrap()
        .iter()
        .map(|l| json!({"code": l["code"], "position": l["position"], "raw": l["raw"], "batch": l["batch_id"]}))
        .collect();
    v.sort_by_key(|q| q.to_string());
    v
}

fn progress(dir: &Path) -> Vec<Value> {
    let p = dir.join(".etlantic/checkpoints/revenue_report/progress.jsonl");
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn explain_shows_the_sql_region_in_postgres_and_its_transitions() {
    let env = setup(Trigger::AvailableNow);
    let o = command(&env, &["explain", "pipeline.yaml"], None)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for line in [
        "r0 (Streaming on datafusion): reads [orders], hands on [per_minute]",
        "r1 (Sql on postgres in postgres://postgres@127.0.0.1:5432/test): reads [per_minute], hands on [report]",
        "region:r0 → region:r1: per_minute (arrow→staged-table)",
        "region:r1 → sink:to_postgres: report (query-result→arrow)",
        "orders → to_postgres: exactly_once",
    ] {
        assert!(text.contains(line), "`{line}` in\n{text}");
    }
}

/// Runs the query until the table holds the expected rows (or the deadline), lets it
/// run a little longer — a double count would show up then — and stops it with Ctrl-C.
#[test]
fn the_stream_fills_the_report_table_in_postgres_and_quarantines_bad_orders() {
    let env = setup(Trigger::ProcessingTime);
    let child: Child = command(&env, &["run", "pipeline.yaml", "--format", "json"], None)
        .spawn()
        .unwrap();
    let want = expected();
    let deadline = Instant::now() + Duration::from_secs(120);
    while table(&env) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "stopped cleanly: {}", describe(&out));
    assert_eq!(table(&env), want);
    assert!(want.len() == 18, "6 windows × 3 regions");
    assert!(progress(env.dir.path()).len() >= 10, "many micro-batches");

    let q = quarantined(env.dir.path());
    let mut codes: Vec<&str> = q.iter().map(|r| r["code"].as_str().unwrap()).collect();
    codes.sort();
    assert_eq!(q.len(), 4, "{q:#?}");
    for r in &q {
        let raw = r["raw"].to_string();
        let pos = &r["position"];
        if r["code"] == json!("ETL708") {
            // A late row is judged by the window operator, after decoding and the
            // filter: it names its source asset, and `raw` is the order itself.
            assert_eq!(pos["asset"], json!("orders"), "{r}");
        } else {
            assert!(
                pos["topic"] == json!("orders") && pos["offset"].as_u64().is_some(),
                "the Kafka position of {r}"
            );
        }
        assert!(
            ["9001", "9002", "9003", "9004"]
                .iter()
                .any(|id| raw.contains(id)),
            "a bad order itself: {r}"
        );
    }
    for id in ["9001", "9002", "9003", "9004"] {
        let n = q
            .iter()
            .filter(|r| r["raw"].to_string().contains(id))
            .count();
        assert_eq!(n, 1, "bad order {id} quarantined once: {q:#?}");
    }
    assert!(codes.contains(&"ETL708"), "the late order: {codes:?}");
}

#[test]
fn killed_at_every_step_and_restarted_the_report_is_exactly_once() {
    let reference = setup(Trigger::AvailableNow);
    let o = run(&reference, None);
    assert!(o.status.success(), "{}", describe(&o));
    let want = table(&reference);
    assert_eq!(want, expected(), "the uninterrupted run");
    let want_quarantine = quarantined(reference.dir.path());
    assert_eq!(want_quarantine.len(), 4, "{want_quarantine:#?}");
    let batches = progress(reference.dir.path()).len() as u64;
    assert!(batches >= 10, "{batches} micro-batches");

    for point in [
        "after_offsets",
        "in_sink",
        "after_sink",
        "after_state",
        "after_commit",
    ] {
        for batch in [1, batches / 2, batches - 2] {
            let label = format!("{point}:{batch}");
            let env = setup(Trigger::AvailableNow);
            let o = run(&env, Some(&label));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            let o = run(&env, None);
            assert!(o.status.success(), "{label}: restart\n{}", describe(&o));
            assert_eq!(table(&env), want, "{label}: report table");
            assert_eq!(
                quarantined(env.dir.path()),
                want_quarantine,
                "{label}: quarantine"
            );
            let ids: Vec<u64> = progress(env.dir.path())
                .iter()
                .map(|p| p["batchId"].as_u64().unwrap())
                .collect();
            let mut unique = ids.clone();
            unique.dedup();
            assert_eq!(ids, unique, "{label}: batch ids {ids:?}");
        }
    }
}
