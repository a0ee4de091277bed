//! Clickstream benchmark: a 1-minute tumbling count per campaign, with a 1-minute
//! watermark, over the click events of `shared/bench/gen_clicks.py` (2M events in 10
//! files), run through the `etlantic` CLI exactly as a user runs it, in every
//! configuration the Spark comparison needs, each named for what it is:
//!
//! | configuration | profile | read limit |
//! |---|---|---|
//! | `batch` | `mode: batch` (one bounded run, no checkpoint) | — |
//! | `stream, all files in 1 micro-batch` | `mode: streaming`, `trigger: available_now` | none (Spark's headline run: AvailableNow reads all ten files at once) |
//! | `stream, 1 file per micro-batch` | same | `read_limit: {max_files: 1}` (ten micro-batches) |
//!
//! each on Parquet and on JSON lines, and once more on JSON lines in which 1% of the
//! records are malformed (the run must quarantine exactly those). The sink is a Parquet
//! directory, the checkpoint and quarantine local files. For reference (not ETLantic) it
//! also runs the same aggregation as a DataFusion SQL `COPY` over the Parquet files.
//!
//! Each run is a child process: its wall time, CPU time (user + system, from `wait4`) and
//! peak resident memory are its own. Figures are events per second of wall time and
//! events per CPU-second; compare them as ratios within one run of the benchmark.
//!
//! `cargo xtask bench clicks` (which generates the data first) or
//! `cargo bench -p etlantic --no-default-features --bench clickstream -- --data <dir>`
//! (`<dir>` holding `parquet/` and `jsonl/`).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const CONTRACTS: [(&str, &str); 2] = [
    (
        "clicks",
        r#"[{"name": "event_id", "logicalType": "integer"},
            {"name": "ts", "logicalType": "timestamp", "required": true},
            {"name": "campaign_id", "logicalType": "string"},
            {"name": "user_id", "logicalType": "integer"},
            {"name": "price", "logicalType": "number"}]"#,
    ),
    (
        "counts",
        r#"[{"name": "window_start", "logicalType": "timestamp"},
            {"name": "window_end", "logicalType": "timestamp"},
            {"name": "campaign_id", "logicalType": "string"},
            {"name": "clicks", "logicalType": "integer"}]"#,
    ),
];

/// One configuration of the benchmark.
struct Config {
    name: String,
    mode: &'static str,
    /// `read_limit.max_files` (streaming only).
    max_files: Option<usize>,
    format: &'static str,
    data: PathBuf,
    /// Records the run must quarantine.
    malformed: u64,
}

/// The figures of one run of one configuration.
#[derive(Clone, Debug)]
struct Measured {
    wall: f64,
    cpu: f64,
    peak_mb: f64,
    windows: u64,
}

/// Writes the project of `config` into `dir`.
fn project(dir: &Path, config: &Config) {
    std::fs::create_dir_all(dir.join("contracts")).expect("project dir");
    for (id, props) in CONTRACTS {
        let props: Value = serde_json::from_str(props).expect("contract properties");
        let contract = json!({"version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract",
            "id": id, "status": "active",
            "schema": [{"name": id, "logicalType": "object", "properties": props}]});
        std::fs::write(
            dir.join(format!("contracts/{id}.json")),
            contract.to_string(),
        )
        .expect("contract");
    }
    let read_limit = config
        .max_files
        .map(|n| format!("\n    read_limit: {{max_files: {n}}}"))
        .unwrap_or_default();
    std::fs::write(
        dir.join("pipeline.yaml"),
        format!(
            "apiVersion: etlantic/v1
kind: Pipeline
name: clickstream
assets:
  clicks: {{contract: contracts/clicks.json}}
  counts: {{contract: contracts/counts.json}}
sources:
  - id: clicks
    asset: clicks
    event_time: {{column: ts}}
    watermark: 1 minute
    late_events: {{policy: drop}}{read_limit}
transforms:
  - id: per_minute
    inputs: {{clicks: clicks}}
    steps:
      - window_aggregate:
          window: {{type: tumbling, column: ts, size: 1 minute}}
          group_by: [campaign_id]
          aggregates: {{clicks: \"count_all()\"}}
sinks:
  - id: out
    input: per_minute
    asset: counts
    output_mode: append
"
        ),
    )
    .expect("pipeline");
    let streaming = if config.mode == "streaming" {
        "trigger: available_now\ncheckpoint: file://checkpoint\n"
    } else {
        ""
    };
    std::fs::create_dir_all(dir.join("profiles")).expect("profiles");
    std::fs::write(
        dir.join("profiles/local.yaml"),
        format!(
            "apiVersion: etlantic/v1
kind: Profile
name: local
mode: {}
{streaming}quarantine: file://quarantine.jsonl
bindings:
  clicks: file://{}?format={}
  counts: file://out?format=parquet
",
            config.mode,
            config.data.display(),
            config.format
        ),
    )
    .expect("profile");
}

/// Runs `command` to its end; returns (wall seconds, CPU seconds, peak RSS in MB, exit
/// status) from the kernel's accounting of that one child.
// The child is reaped by `wait4` (which std's `wait` cannot do: it drops the usage).
#[allow(clippy::zombie_processes)]
fn measure(command: &mut Command) -> (f64, f64, f64, i32) {
    let started = Instant::now();
    let child = command.spawn().expect("the child starts");
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is valid, and `wait4` writes into the two locals only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: `pid` is our own child, not yet waited for (std's handle is never waited).
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let wall = started.elapsed().as_secs_f64();
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (wall, cpu, usage.ru_maxrss as f64 / 1024.0, code)
}

/// Runs `config` once through the CLI in a new project.
fn run_cli(cli: &Path, config: &Config, events: u64) -> Measured {
    let work = tempfile::tempdir().expect("tempdir");
    project(work.path(), config);
    let stdout = work.path().join("report.json");
    let stderr = work.path().join("stderr.txt");
    let (wall, cpu, peak_mb, code) = measure(
        Command::new(cli)
            .current_dir(work.path())
            .args(["run", "--format", "json"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file")),
    );
    let report = std::fs::read_to_string(&stdout).unwrap_or_default();
    assert_eq!(
        code,
        0,
        "{}: the run failed\n{report}\n{}",
        config.name,
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let report: Value = serde_json::from_str(report.trim()).expect("a JSON run report");
    let rows: u64 = report["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["rows"].as_u64().unwrap_or(0))
        .sum();
    let quarantined = report["quarantined"].as_u64().unwrap_or(0);
    // A misconfigured run (a path that reads nothing, a decoder that lost records) must
    // not report a figure.
    assert_eq!(
        (rows + quarantined, quarantined),
        (events, config.malformed),
        "{}: rows read and quarantined",
        config.name
    );
    if config.malformed > 0 {
        let lines =
            std::fs::read_to_string(work.path().join("quarantine.jsonl")).expect("quarantine file");
        let records: Vec<Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).expect("quarantine record"))
            .collect();
        assert_eq!(records.len() as u64, config.malformed, "{}", config.name);
        for r in &records {
            let text = r.to_string();
            assert!(
                text.contains("ETL70") && text.contains("\"line\""),
                "{}: a quarantined record names its code and line: {text}",
                config.name
            );
        }
    }
    // A stream's output is a directory of committed part files; a batch run's, one file.
    let out = work.path().join("out");
    let windows = if out.is_file() {
        count_parquet_file(&out)
    } else {
        etlantic_sinks::files::read_committed(&out)
            .map(|bs| bs.iter().map(|b| b.num_rows() as u64).sum())
            .unwrap_or(0)
    };
    Measured {
        wall,
        cpu,
        peak_mb,
        windows,
    }
}

/// The DataFusion SQL reference (in a child process of this benchmark).
fn datafusion_sql(parquet: &Path) -> u64 {
    use datafusion::prelude::*;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let work = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let ctx = SessionContext::new();
        ctx.register_parquet(
            "clicks",
            parquet.to_str().expect("utf-8 path"),
            ParquetReadOptions::default(),
        )
        .await
        .expect("register");
        let sql = format!(
            "COPY (SELECT date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS window_start, \
                          campaign_id, count(*) AS clicks \
                   FROM clicks GROUP BY 1, 2) TO '{}' STORED AS PARQUET",
            work.path().join("out.parquet").display()
        );
        let rows = ctx.sql(&sql).await.expect("sql").collect().await.expect("copy");
        rows[0]
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::UInt64Array>()
            .map(|a| a.value(0))
            .unwrap_or(0)
    })
}

fn count_parquet_file(path: &Path) -> u64 {
    use parquet::file::reader::FileReader;
    let f = std::fs::File::open(path).expect("open");
    let r = parquet::file::reader::SerializedFileReader::new(f).expect("parquet");
    r.metadata().file_metadata().num_rows() as u64
}

fn count_parquet_rows(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("data dir") {
        let p = e.expect("entry").path();
        if p.extension().and_then(|x| x.to_str()) == Some("parquet") {
            n += count_parquet_file(&p);
        }
    }
    n
}

/// Copies the JSON-lines files with one record in a hundred made malformed, in turn: cut
/// short, of a wrong type, without its required time; returns how many.
fn malformed_copy(jsonl: &Path, to: &Path) -> u64 {
    std::fs::create_dir_all(to).expect("malformed dir");
    let mut bad = 0u64;
    let mut names: Vec<PathBuf> = std::fs::read_dir(jsonl)
        .expect("jsonl dir")
        .map(|e| e.expect("entry").path())
        .collect();
    names.sort();
    for path in names {
        let text = std::fs::read_to_string(&path).expect("jsonl file");
        let mut out = String::with_capacity(text.len());
        for (i, line) in text.lines().enumerate() {
            if i % 100 == 42 {
                bad += 1;
                match bad % 3 {
                    0 => out.push_str(&line[..line.len() / 2]),
                    1 => {
                        out.push_str(&line.replacen("\"user_id\":", "\"user_id\":\"u\",\"x\":", 1))
                    }
                    _ => out.push_str(&line.replacen("\"ts\"", "\"time\"", 1)),
                }
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        std::fs::write(to.join(path.file_name().expect("name")), out).expect("write");
    }
    bad
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn main() {
    let data = PathBuf::from(arg("--data").unwrap_or_else(|| "scratch/bench".into()));
    let data = data.canonicalize().unwrap_or(data);
    if let Some(dir) = arg("--datafusion-sql") {
        println!("{}", datafusion_sql(Path::new(&dir)));
        return;
    }
    let (parquet, jsonl) = (data.join("parquet"), data.join("jsonl"));
    if !parquet.is_dir() || !jsonl.is_dir() {
        eprintln!(
            "no benchmark data at {} (parquet/ and jsonl/; run `cargo xtask bench clicks`)",
            data.display()
        );
        std::process::exit(2);
    }
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(3);
    let only = arg("--only");
    let events = count_parquet_rows(&parquet);
    let work = tempfile::tempdir().expect("tempdir");
    let malformed_dir = work.path().join("jsonl-malformed");
    let malformed = malformed_copy(&jsonl, &malformed_dir);
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_etlantic"));

    let mut configs = Vec::new();
    for (format, dir) in [("parquet", &parquet), ("jsonl", &jsonl)] {
        for (mode, max_files, what) in [
            ("batch", None, "batch (one bounded run)"),
            ("streaming", None, "stream, all files in 1 micro-batch"),
            ("streaming", Some(1), "stream, 1 file per micro-batch"),
        ] {
            configs.push(Config {
                name: format!("{what}, {format}"),
                mode,
                max_files,
                format,
                data: dir.clone(),
                malformed: 0,
            });
        }
    }
    configs.push(Config {
        name: "stream, all files in 1 micro-batch, jsonl, 1% malformed".into(),
        mode: "streaming",
        max_files: None,
        format: "jsonl",
        data: malformed_dir.clone(),
        malformed,
    });
    configs.retain(|c| only.as_deref().is_none_or(|o| c.name.contains(o)));

    let mut results: Vec<(String, Vec<Measured>)> = configs
        .iter()
        .map(|c| (c.name.clone(), Vec::new()))
        .collect();
    let mut reference = Vec::new();
    let exe = std::env::current_exe().expect("exe");
    // One unmeasured run first: the binary's pages come from disk only once.
    if let Some(first) = configs.first() {
        run_cli(&cli, first, events);
    }
    for _ in 0..runs {
        for (i, config) in configs.iter().enumerate() {
            results[i].1.push(run_cli(&cli, config, events));
        }
        let (wall, cpu, peak_mb, code) = measure(
            Command::new(&exe)
                .arg("--datafusion-sql")
                .arg(&parquet)
                .stdout(Stdio::null()),
        );
        assert_eq!(code, 0, "the DataFusion SQL reference failed");
        reference.push(Measured {
            wall,
            cpu,
            peak_mb,
            windows: 0,
        });
    }

    println!(
        "clickstream: {events} events in 10 files, 1-minute tumbling count per campaign, \
         through `etlantic run`; median of {runs} runs ({} cores)",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    println!(
        "  {:<58} {:>8} {:>8} {:>12} {:>14} {:>8} {:>8}",
        "configuration", "wall s", "CPU s", "events/s", "events/CPU-s", "peak MB", "windows"
    );
    let mut summary = serde_json::Map::new();
    let mut line = |name: &str, m: &[Measured]| {
        let wall = median(m.iter().map(|x| x.wall).collect());
        let cpu = median(m.iter().map(|x| x.cpu).collect());
        let peak = median(m.iter().map(|x| x.peak_mb).collect());
        let windows = m.first().map_or(0, |x| x.windows);
        println!(
            "  {:<58} {:>8.3} {:>8.3} {:>12.0} {:>14.0} {:>8.0} {:>8}",
            name,
            wall,
            cpu,
            events as f64 / wall,
            events as f64 / cpu,
            peak,
            windows
        );
        summary.insert(
            name.to_string(),
            json!({"wall_s": wall, "cpu_s": cpu, "events_per_s": events as f64 / wall,
                   "events_per_cpu_s": events as f64 / cpu, "peak_mb": peak, "windows": windows}),
        );
        (wall, cpu)
    };
    let mut by_name = std::collections::HashMap::new();
    for (name, m) in &results {
        by_name.insert(name.clone(), line(name, m));
    }
    line(
        "reference: DataFusion SQL COPY over the Parquet files",
        &reference,
    );
    println!("  ratios in this run (JSON lines / Parquet, wall and CPU):");
    for what in [
        "batch (one bounded run)",
        "stream, all files in 1 micro-batch",
        "stream, 1 file per micro-batch",
    ] {
        if let (Some(j), Some(p)) = (
            by_name.get(&format!("{what}, jsonl")),
            by_name.get(&format!("{what}, parquet")),
        ) {
            println!("    {what}: {:.2}x wall, {:.2}x CPU", j.0 / p.0, j.1 / p.1);
        }
    }
    println!("{}", Value::Object(summary));
}
