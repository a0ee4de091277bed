//! Project automation: `cargo xtask <command>`.
//!
//! - `ci`: prepare the machine (protoc, PostgreSQL), then run the test suite and the
//!   Spark conformance corpus — what `.ci/run` runs;
//! - `demo`: scaffold the streaming example into `scratch/demo-streaming` and run it in its
//!   two steps, then the batch example in `scratch/demo`;
//! - `docs`: regenerate generated documentation (`docs/diagnostics.md`);
//! - `equivalence`: run the backend-equivalence corpus and write the support matrix
//!   (`docs/equivalence-matrix.md`);
//! - `bench`: run benchmarks (`clicks`, `join`, `kafka`; see `cargo xtask bench --help`);
//! - `fuzz`: coverage-guided fuzzing of every reader of untrusted input (`fuzz/`);
//! - `soak`: a long streaming run that must not grow (memory, files, state, checkpoint).

mod soak;
mod spark_diff;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Prepare the machine and run every test (what CI runs).
    Ci,
    /// Prepare the machine only (protoc, PostgreSQL, the ETLantic-py virtualenv).
    Setup,
    /// Scaffold the streaming example into scratch/demo-streaming and run it in two steps,
    /// then the batch example in scratch/demo.
    Demo,
    /// Regenerate docs/diagnostics.md from the code catalogue.
    Docs,
    /// Run the backend-equivalence corpus on every backend (PostgreSQL included) and
    /// write the support matrix to docs/equivalence-matrix.md.
    Equivalence,
    /// Run a benchmark: `clicks` (2M click events through `etlantic run`: batch and
    /// streaming, Parquet and JSON lines, wall and CPU time per configuration) or `decode`
    /// (JSON decoding alone: the contract decoder's two paths and arrow-json) or `join` (a
    /// time-bounded Nexmark join of bids and auctions: events/s and state size over time;
    /// `ETLANTIC_BENCH_EVENTS` sets the number of generator events, default 20M) or
    /// `kafka` (Kafka mock cluster → window → Delta: events/s and checkpoint cost per
    /// micro-batch; `ETLANTIC_BENCH_EVENTS`, default 1M) or `nexmark` (the Nexmark
    /// queries, streaming vs DataFusion batch; `--events`, default 2M) or `state` (a
    /// dedup and a join whose state only grows: throughput, peak memory, state write and
    /// restart as the state grows; `--sizes`, default 1M,5M events).
    Bench {
        /// Which benchmark.
        #[arg(default_value = "clicks")]
        name: String,
        /// Measurements per engine.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Generator events (`nexmark`; default 2M).
        #[arg(long)]
        events: Option<u64>,
        /// Comma-separated generator event counts (`state`; default 1000000,5000000).
        #[arg(long)]
        sizes: Option<String>,
        /// Further options for the benchmark program after `--` (`state`: `--stores disk`,
        /// `--per-batch 250000`, `--query join`, `--memory-limit 128MB`); with them the
        /// rows are printed and the docs' table is left as it is.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// A randomized differential test against Apache Spark: generates `--count` small
    /// streaming scenarios (seeded), records them on a local Spark (pyspark), replays them
    /// on the embedded runtime and keeps them in `tests/conformance/spark-diff/`. Fails
    /// when the runtime and Spark differ. Takes minutes: not part of `ci`.
    SparkDiff {
        /// How many scenarios.
        #[arg(long, default_value_t = 12)]
        count: usize,
        /// The generator's seed (the same seed gives the same scenarios).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Fuzz every harness of `etlantic_testkit::fuzz` (pipeline and profile loading, the
    /// contract loaders, the expression parser, the record decoders, the checkpoint
    /// readers) with libFuzzer for `--seconds` each; crashes go to
    /// `fuzz/artifacts/<target>/` and fail the command.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only these targets (default: all).
        #[arg(long)]
        target: Vec<String>,
    },
    /// Run a streaming query over the Nexmark generator at a fixed rate (a window, a
    /// dedup and a stream-stream join) for `--minutes`, sampling memory, open files, state
    /// rows and checkpoint size; fails if any grows over the second half. Writes
    /// `samples.csv`, `soak.svg` and `summary.md` to `--out`.
    Soak {
        /// Length of the run.
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Generator events per second.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 10)]
        interval: u64,
        /// Output directory (default `scratch/soak`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run the release build of the CLI (default: the debug build the tests use).
        #[arg(long)]
        release: bool,
        /// Run this `etlantic` binary as it is, without building (e.g. a copy of an
        /// earlier build, while the working tree changes).
        #[arg(long, conflicts_with = "release")]
        binary: Option<PathBuf>,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {:?}", cmd);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The Spark Connect protocol crate compiles .proto files with `protoc`.
/// What building the workspace needs from the system: `protoc` (Spark Connect's
/// protocol) and libclang (bindgen, for RocksDB's bindings). Installs Debian's packages
/// when missing.
fn ensure_build_tools() -> Result<()> {
    if !(have("protoc") || std::env::var_os("PROTOC").is_some()) {
        apt_install("protobuf-compiler", "protoc")?;
    }
    if !have_libclang() {
        apt_install("libclang-dev", "libclang")?;
    }
    // Not for the build but for the tests: `etlantic report`'s page is checked in
    // headless Chromium.
    if !have("chromium") {
        apt_install(
            "chromium",
            "chromium (headless, for the HTML report's test)",
        )?;
    }
    Ok(())
}

/// Whether bindgen will find libclang (`LIBCLANG_PATH`, or an LLVM install of Debian's).
fn have_libclang() -> bool {
    if std::env::var_os("LIBCLANG_PATH").is_some() {
        return true;
    }
    std::fs::read_dir("/usr/lib")
        .map(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("llvm-")
                    && e.path().join("lib/libclang.so").exists()
            })
        })
        .unwrap_or(false)
}

fn apt_install(package: &str, what: &str) -> Result<()> {
    eprintln!("{what} is missing: installing Debian's {package}");
    let install = format!("apt-get install -y {package} >/dev/null || (apt-get update >/dev/null && apt-get install -y {package} >/dev/null)");
    let sudo = if have("sudo") && !is_root() {
        "sudo "
    } else {
        ""
    };
    run(Command::new("sh")
        .arg("-c")
        .arg(install.replace("apt-get", &format!("{sudo}apt-get"))))
    .with_context(|| format!("install {package} ({what}) with your package manager"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// Makes sure the virtualenv `~/<dir>` exists and `module` imports in it; otherwise
/// creates it and installs `requirement` (a pinned pip requirement).
fn ensure_venv(dir: &str, module: &str, requirement: &str) -> Result<()> {
    let venv = home().join(dir);
    let python = venv.join("bin/python");
    let installed = python.exists()
        && Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if installed {
        return Ok(());
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", requirement]))
}

/// The interop tests load generated documents with ETLantic-py (PyPI `etlantic`, the
/// version the fixtures were made with) from this virtualenv.
fn ensure_etlantic_py() -> Result<()> {
    ensure_venv(".cache/etlantic-py-venv", "etlantic", "etlantic==0.59.0")
}

/// The Spark Connect tests start a local Spark Connect server from the `pyspark` package
/// (the version the conformance corpus was recorded with) in this virtualenv (the path
/// `etlantic_spark_compat::local::SPARK_VENV` looks in). Java 17 runs it.
fn ensure_pyspark() -> Result<()> {
    ensure_venv(".cache/etlantic-spark-venv", "pyspark", "pyspark==4.3.0")
}

/// The object-store tests start a local S3-compatible server, `moto`'s server mode, from
/// this virtualenv (the path `etlantic_object_store::testing` looks in): it honours
/// conditional creates as AWS S3 does, starts in about a second, and keeps its objects in
/// memory.
fn ensure_s3_server() -> Result<()> {
    ensure_venv(".cache/etlantic-s3-venv", "moto", "moto[server]==5.2.6")
}

/// Builds the workspace's tests, then removes the executables in `target/debug/deps`
/// that this build did not produce.
///
/// Every integration test is its own executable of about 1 GB (it links DataFusion,
/// Polars, Delta Lake, Iceberg, ...). A change of a crate's dependencies changes the
/// hash in the file names of all tests above it, so an incremental target directory
/// would otherwise keep a stale copy of each per such change and fill the disk.
fn build_tests_and_prune(root: &Path) -> Result<()> {
    let out = Command::new(cargo())
        .current_dir(root)
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        // With a JSON message format the compiler's diagnostics go to stdout as JSON;
        // print them as the compiler rendered them, or CI shows no reason at all.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] == "compiler-message" {
                if let Some(rendered) = msg["message"]["rendered"].as_str() {
                    eprint!("{rendered}");
                }
            }
        }
        bail!("building the tests failed");
    }
    // Cargo's JSON messages name every executable it produced or found fresh.
    let text = String::from_utf8_lossy(&out.stdout);
    let current: std::collections::HashSet<PathBuf> = text
        .split("\"executable\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(PathBuf::from)
        .collect();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let Ok(entries) = std::fs::read_dir(target.join("debug/deps")) else {
        return Ok(());
    };
    let mut freed = 0u64;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Executables are named `<name>-<16 hex digits>`, without an extension.
        let is_executable = name.rsplit_once('-').is_some_and(|(_, hash)| {
            hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit())
        });
        if is_executable && !current.contains(&e.path()) {
            freed += e.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = std::fs::remove_file(e.path());
        }
    }
    if freed > 0 {
        eprintln!(
            "removed stale test executables: {:.1} GB",
            freed as f64 / 1e9
        );
    }
    Ok(())
}

/// Tests that need PostgreSQL run against the real server on 127.0.0.1:5432.
fn ensure_postgres() -> Result<()> {
    let up = || {
        Command::new("sh")
            .arg("-c")
            .arg("pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if up() {
        return Ok(());
    }
    if !have("pg_ctlcluster") {
        eprintln!("warning: PostgreSQL is not running and pg_ctlcluster is not installed");
        return Ok(());
    }
    eprintln!("starting PostgreSQL");
    run(Command::new("sh").arg("-c").arg(
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n1) main start",
    ))?;
    for _ in 0..30 {
        if up() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    bail!("PostgreSQL did not come up on 127.0.0.1:5432")
}

/// The fuzz targets (the harnesses of `etlantic_testkit::fuzz::TARGETS`).
const FUZZ_TARGETS: &[&str] = &[
    "pipeline_profile",
    "contracts",
    "dtcs_expression",
    "decode_jsonl",
    "decode_csv",
    "decode_parquet",
    "kafka_value",
    "batch_log",
    "state_log",
    "state_snapshot",
    "source_log",
    "sink_log",
];

/// Builds the fuzz binary once, then fuzzes each target for `seconds` from its seeds and
/// what earlier runs kept in `fuzz/corpus/<target>/`.
fn fuzz(root: &Path, seconds: u64, only: &[String]) -> Result<()> {
    if !Command::new(cargo())
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        run(Command::new(cargo()).args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let targets: Vec<&str> = match only {
        [] => FUZZ_TARGETS.to_vec(),
        some => {
            for t in some {
                if !FUZZ_TARGETS.contains(&t.as_str()) {
                    bail!(
                        "unknown fuzz target `{t}` (known: {})",
                        FUZZ_TARGETS.join(", ")
                    );
                }
            }
            some.iter().map(String::as_str).collect()
        }
    };
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|d| d.with_file_name("fuzz-target"))
        .unwrap_or_else(|| home().join(".cache/etlantic-rs/fuzz-target"));
    // Rust code is memory-safe: libFuzzer looks for panics, aborts, hangs and memory
    // blow-ups, so no sanitizer (a much shorter build); debug assertions on.
    let common = |cmd: &mut Command| {
        cmd.current_dir(root)
            // cargo-fuzz passes nightly flags; the one toolchain here is stable.
            .env("RUSTC_BOOTSTRAP", "1")
            .args([
                "--fuzz-dir",
                "fuzz",
                "-O",
                "-a",
                "-s",
                "none",
                "--target-dir",
            ])
            .arg(&target_dir);
    };
    let mut build = Command::new(cargo());
    build.args(["fuzz", "build", "harness"]);
    common(&mut build);
    run(&mut build)?;
    let mut summary = Vec::new();
    let mut failed = Vec::new();
    for t in targets {
        let corpus = root.join("fuzz/corpus").join(t);
        let artifacts = root.join("fuzz/artifacts").join(t);
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let before = count_files(&artifacts);
        let mut cmd = Command::new(cargo());
        cmd.args(["fuzz", "run", "harness"]);
        common(&mut cmd);
        cmd.arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-timeout=30")
            .arg("-rss_limit_mb=3072")
            .arg("-print_final_stats=1")
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .env("ETLANTIC_FUZZ_TARGET", t)
            .env("ETLANTIC_FUZZ_SEEDS", &corpus)
            .stderr(std::process::Stdio::piped());
        eprintln!("$ fuzz {t} for {seconds} s");
        let out = cmd.output().with_context(|| format!("cannot fuzz {t}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let stat = |name: &str| -> u64 {
            log.lines()
                .filter_map(|l| l.strip_prefix(&format!("stat::{name}:")))
                .filter_map(|v| v.trim().parse().ok())
                .next_back()
                .unwrap_or(0)
        };
        let found = count_files(&artifacts) - before;
        let runs = stat("number_of_executed_units");
        summary.push(format!(
            "{t:<18} {seconds:>6} s  {runs:>10} runs  {:>6} corpus  {found} new crash(es)",
            count_files(&corpus),
        ));
        // No run at all: the target could not start (a full disk, a broken seed).
        if found > 0 || runs == 0 || !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            failed.push(t);
        }
    }
    println!("\nfuzzing, {seconds} s per target:\n{}", summary.join("\n"));
    if !failed.is_empty() {
        bail!(
            "crashes in {}: see fuzz/artifacts/<target>/; copy each input into fuzz/regressions/<target>/ with the fix",
            failed.join(", ")
        );
    }
    Ok(())
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = root();
    match cli.command {
        Cmd::Setup => {
            ensure_build_tools()?;
            ensure_postgres()?;
            ensure_etlantic_py()?;
            ensure_pyspark()?;
            ensure_s3_server()?;
        }
        Cmd::Ci => {
            ensure_build_tools()?;
            ensure_postgres()?;
            ensure_etlantic_py()?;
            ensure_pyspark()?;
            ensure_s3_server()?;
            build_tests_and_prune(&root)?;
            run(Command::new(cargo()).current_dir(&root).args([
                "test",
                "--workspace",
                "--no-fail-fast",
            ]))?;
            // The soak's smoke run: one minute of the soak query on the debug CLI the
            // tests built (fuzzing's smoke run is the test `fuzz_regressions`).
            run(Command::new(cargo()).current_dir(&root).args([
                "xtask",
                "soak",
                "--minutes",
                "1",
                "--interval",
                "5",
            ]))?;
        }
        Cmd::Demo => {
            ensure_build_tools()?;
            // Only what the examples use (files, DataFusion, the streaming runtime): no
            // Kafka, Delta, Iceberg, SQL, Polars, Spark, RocksDB or object stores, so the
            // first build is a fraction of the whole CLI's.
            run(Command::new(cargo()).current_dir(&root).args([
                "build",
                "--release",
                "-p",
                "etlantic",
                "--no-default-features",
                "--features",
                "mimalloc",
            ]))?;
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            let bin = target.join("release").join("etlantic");
            let fresh = |name: &str| -> Result<PathBuf> {
                let dir = root.join("scratch").join(name);
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                Ok(dir)
            };
            let show = |dir: &Path, rel: &str| {
                let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(rel))
                    .map(|d| d.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                files.sort();
                for f in files
                    .iter()
                    .filter(|f| f.extension().is_some_and(|e| e == "jsonl"))
                {
                    print!("{}", std::fs::read_to_string(f).unwrap_or_default());
                }
            };

            // The main job: a streaming query, in two steps.
            let demo = fresh("demo-streaming")?;
            println!(
                "== streaming: page views per 5-minute window ({})",
                demo.display()
            );
            run(Command::new(&bin)
                .args(["init", "--template", "streaming"])
                .arg(&demo))?;
            println!("\n-- step 1: two files in data/views/");
            run(Command::new(&bin).current_dir(&demo).arg("run"))?;
            run(Command::new(&bin)
                .current_dir(&demo)
                .args(["status", "--once"]))?;
            println!("\n-- step 2: a third file arrives; the query goes on from its checkpoint");
            std::fs::rename(
                demo.join("samples/step2/003.jsonl"),
                demo.join("data/views/003.jsonl"),
            )?;
            run(Command::new(&bin).current_dir(&demo).arg("run"))?;
            run(Command::new(&bin)
                .current_dir(&demo)
                .args(["report", "-o", "report.html"]))?;
            println!("\nout/views_per_page/ (each window once, when the watermark closed it):");
            show(&demo, "out/views_per_page");
            let q = std::fs::read_to_string(demo.join("out/quarantine.jsonl")).unwrap_or_default();
            println!("\nout/quarantine.jsonl:\n{q}");

            // Then the batch example.
            let demo = fresh("demo")?;
            println!("== batch: revenue per customer ({})", demo.display());
            run(Command::new(&bin).arg("init").arg(&demo))?;
            run(Command::new(&bin).current_dir(&demo).arg("run"))?;
            let out = std::fs::read_to_string(demo.join("out/customer_revenue.csv"))?;
            println!("\nout/customer_revenue.csv:\n{out}");
            let q = std::fs::read_to_string(demo.join("out/quarantine.jsonl")).unwrap_or_default();
            println!("out/quarantine.jsonl:\n{q}");
        }
        Cmd::Bench {
            name,
            runs,
            events,
            sizes,
            extra,
        } => {
            ensure_build_tools()?;
            match name.as_str() {
                "clicks" => {
                    let data = root.join("scratch/bench");
                    if !data.join("parquet").is_dir() || !data.join("jsonl").is_dir() {
                        let venv = home().join(".cache/etlantic-bench-venv");
                        let py = venv.join("bin/python");
                        if !py.exists() {
                            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
                            run(Command::new(venv.join("bin/pip"))
                                .args(["install", "-q", "numpy", "pyarrow"]))?;
                        }
                        run(Command::new(&py)
                            .arg(root.join("../shared/bench/gen_clicks.py"))
                            .arg("--out")
                            .arg(&data))?;
                    }
                    run(Command::new(cargo())
                        .current_dir(&root)
                        // The default features: the benchmark runs the `etlantic` binary
                        // users run (and shares its build with `bench kafka`).
                        .args(["bench", "-p", "etlantic"])
                        .args(["--bench", "clickstream", "--"])
                        .arg("--data")
                        .arg(&data)
                        .arg("--runs")
                        .arg(runs.to_string()))?;
                }
                "join" => {
                    // Nexmark bids x auctions, generated in the process (no data files).
                    let events = std::env::var("ETLANTIC_BENCH_EVENTS")
                        .unwrap_or_else(|_| "20000000".into());
                    run(Command::new(cargo())
                        .current_dir(&root)
                        .args(["bench", "-p", "etlantic", "--no-default-features"])
                        .args(["--bench", "nexmark_join", "--"])
                        .args(["--events", &events, "--runs"])
                        .arg(runs.to_string()))?;
                }
                "decode" => {
                    // JSON decoding alone: the fast path, the per-record path, arrow-json.
                    run(Command::new(cargo())
                        .current_dir(&root)
                        .args(["bench", "-p", "etlantic", "--bench", "json_decode", "--"])
                        .args(["--runs", &runs.max(15).to_string()]))?;
                }
                "kafka" => {
                    // Kafka (librdkafka's mock cluster, in the process) → window → Delta.
                    let events =
                        std::env::var("ETLANTIC_BENCH_EVENTS").unwrap_or_else(|_| "1000000".into());
                    run(Command::new(cargo())
                        .current_dir(&root)
                        .args(["bench", "-p", "etlantic", "--bench", "kafka_delta", "--"])
                        .args(["--events", &events]))?;
                }
                "nexmark" => {
                    // The Nexmark queries on the streaming runtime and as DataFusion batch
                    // queries; writes docs/nexmark.md.
                    let events = events.unwrap_or(2_000_000).to_string();
                    run(Command::new(cargo())
                        .current_dir(&root)
                        // Only DataFusion and the generator: no connector, no Polars, no
                        // SQL backends, so the release build is short.
                        .args(["bench", "-p", "etlantic-testkit", "--no-default-features"])
                        .args(["--bench", "nexmark", "--"])
                        .args(["--events", &events, "--markdown"])
                        .arg(root.join("docs/nexmark.md")))?;
                }
                "state" => {
                    // State that only grows, on the memory and the disk store; writes
                    // docs/state.md.
                    let sizes = sizes.unwrap_or_else(|| "1000000,5000000".into());
                    let mut cmd = Command::new(cargo());
                    cmd.current_dir(&root)
                        .args(["bench", "-p", "etlantic-testkit", "--no-default-features"])
                        .args(["--features", "disk-state"])
                        .args(["--bench", "state", "--"])
                        .args(["--events", &sizes]);
                    if extra.is_empty() {
                        cmd.arg("--markdown").arg(root.join("docs/state.md"));
                    } else {
                        cmd.args(&extra);
                    }
                    run(&mut cmd)?;
                }
                other => bail!(
                    "unknown benchmark `{other}` (known: clicks, decode, join, kafka, nexmark, state)"
                ),
            }
        }
        Cmd::Equivalence => {
            ensure_build_tools()?;
            ensure_postgres()?;
            run(Command::new(cargo())
                .current_dir(&root)
                .args([
                    "test",
                    "--workspace",
                    "--test",
                    "equivalence",
                    "--",
                    "--nocapture",
                ])
                .env(
                    "ETLANTIC_EQUIVALENCE_MATRIX",
                    root.join("docs/equivalence-matrix.md"),
                ))?;
        }
        Cmd::Fuzz { seconds, target } => fuzz(&root, seconds, &target)?,
        Cmd::Soak {
            minutes,
            rate,
            interval,
            out,
            release,
            binary,
        } => {
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            let binary = binary.unwrap_or_else(|| {
                target
                    .join(if release { "release" } else { "debug" })
                    .join("etlantic")
            });
            let options = soak::Options {
                minutes,
                rate,
                interval,
                out: out.unwrap_or_else(|| root.join("scratch/soak")),
                binary,
            };
            if options.binary.exists() && !options.binary.starts_with(&target) {
                return soak::run(&options);
            }
            ensure_build_tools()?;
            let mut build = Command::new(cargo());
            build.current_dir(&root);
            if release {
                build.args(["build", "-p", "etlantic", "--release"]);
            } else {
                // The debug CLI exactly as the tests build it: `cargo build --bins` would
                // resolve features without the dev-dependencies and build much of the
                // dependency graph a second time.
                build.args(["test", "--workspace", "--no-run"]);
            }
            run(&mut build)?;
            soak::run(&options)?;
        }
        Cmd::SparkDiff { count, seed } => {
            ensure_build_tools()?;
            ensure_pyspark()?;
            build_tests_and_prune(&root)?;
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            spark_diff::run(
                &root,
                &spark_diff::Options {
                    count,
                    seed,
                    keep: &root.join("tests/conformance/spark-diff"),
                    work: &root.join("scratch/spark-diff"),
                    python: &home().join(".cache/etlantic-spark-venv/bin/python"),
                    etlantic: &target.join("debug/etlantic"),
                },
            )?;
        }
        Cmd::Docs => {
            run(Command::new(cargo())
                .current_dir(&root)
                .args([
                    "test",
                    "-p",
                    "etlantic-core",
                    "--lib",
                    "diagnostics_doc_is_current",
                ])
                .env("ETLANTIC_UPDATE_DOCS", "1"))?;
        }
    }
    Ok(())
}
