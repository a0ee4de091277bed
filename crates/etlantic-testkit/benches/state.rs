//! State larger than memory: what a stateful operator costs as its state grows.
//!
//! Two queries over the Nexmark generator, with no watermark, so their state only grows:
//! - `dedup`: a deduplication over nearly unique bid keys (auction, bidder, price,
//!   date_time) — a key per bid;
//! - `join`: bids joined to auctions (inner, on the auction id) — every bid and auction
//!   held.
//!
//! For each query, each state store (`--stores`, default `memory,disk`) and each size
//! (`--events`, comma-separated; default 1M and 5M, 1M events per micro-batch) one child
//! process runs the query to the end with `available_now` and reports: events per
//! CPU-second of the process (≈ per core), peak resident memory (`VmHWM`), the state
//! write and commit per micro-batch (`commitOffsets` of the progress records: it waits
//! for the state write), the bytes the process wrote per micro-batch (`/proc/self/io`
//! `wchar`: the checkpoint, and for the disk store also its local files), the bytes the
//! state write added to the checkpoint per micro-batch (the memory store: everything it
//! wrote; the disk store: `stateStoreBytesCopied`), the state rows held at the end, and
//! the restart time: a new query on the same checkpoint restoring that state, its local
//! working copy deleted first (a new machine). A child per measurement keeps peak memory
//! its own. A query the store refuses (an operator not yet on the disk store) is a row
//! saying so.
//!
//! `cargo xtask bench state` runs it; `--markdown FILE` writes the table;
//! `--query dedup|join` runs one query; `--memory-limit` sets `state_memory_limit`
//! (default 256 MB).

mod common;

use common::{arg, cpu_seconds};
use etlantic_core::streaming::OutputMode;
use etlantic_plan::Project;
use etlantic_runtime::{StreamingOptions, StreamingQuery};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

// The generator source and the foreach sink reach the planner through the registries.
use etlantic_sinks as _;
use etlantic_sources as _;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BIDS: &str = "{name: bids, logicalType: object, properties: [{name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: bidder, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: price, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: channel, logicalType: string}, {name: url, logicalType: string}, {name: date_time, logicalType: timestamp}, {name: extra, logicalType: string}]}";
const AUCTIONS: &str = "{name: auctions, logicalType: object, properties: [{name: id, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: item_name, logicalType: string}, {name: description, logicalType: string}, {name: initial_bid, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: reserve, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: date_time, logicalType: timestamp}, {name: expires, logicalType: timestamp}, {name: seller, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: category, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: extra, logicalType: string}]}";

fn contract(id: &str, schema: &str) -> String {
    format!("{{version: \"1.0.0\", apiVersion: v3.1.0, kind: DataContract, id: {id}, name: {id}, status: active, schema: [{schema}]}}")
}

/// The pipeline of `query`.
fn pipeline(query: &str) -> String {
    let bids = contract("bids", BIDS);
    match query {
        "dedup" => format!(
            "apiVersion: etlantic/v1\nkind: Pipeline\nname: state_dedup\nassets:\n  bids:\n    contract: {bids}\n  out:\n    contract: {}\nsources:\n  - id: bids\n    asset: bids\ntransforms:\n  - id: unique\n    inputs: {{bids: bids}}\n    steps:\n      - deduplicate: {{keys: [auction, bidder, price, date_time]}}\n      - select: [auction, bidder, price, date_time]\nsinks:\n  - id: out\n    input: unique\n    asset: out\n",
            contract("out", "{name: out, logicalType: object, properties: [{name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: bidder, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: price, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: date_time, logicalType: timestamp}]}")
        ),
        "join" => format!(
            "apiVersion: etlantic/v1\nkind: Pipeline\nname: state_join\nassets:\n  bids:\n    contract: {bids}\n  auctions:\n    contract: {}\n  out:\n    contract: {}\nsources:\n  - id: bids\n    asset: bids\n  - id: auctions\n    asset: auctions\ntransforms:\n  - id: opened\n    inputs: {{auctions: auctions}}\n    steps:\n      - select: [id, seller]\n  - id: matched\n    inputs: {{bids: bids, opened: opened}}\n    steps:\n      - join:\n          right: opened\n          'on': {{left: [auction], right: [id]}}\n          how: inner\n      - select: [auction, bidder, price, seller]\nsinks:\n  - id: out\n    input: matched\n    asset: out\n",
            contract("auctions", AUCTIONS),
            contract("out", "{name: out, logicalType: object, properties: [{name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: bidder, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: price, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: seller, logicalType: integer, logicalTypeOptions: {format: i64}}]}")
        ),
        other => panic!("--query takes dedup or join, not {other}"),
    }
}

/// The profile of one measurement.
struct Setup<'a> {
    query: &'a str,
    store: &'a str,
    memory_limit: &'a str,
    events: u64,
    per_batch: u64,
}

fn profile(setup: &Setup<'_>, sink: &str) -> String {
    let Setup {
        query,
        store,
        memory_limit,
        events,
        per_batch,
    } = setup;
    let params = format!("events_per_batch={per_batch}&max_events={events}&start_ms=0");
    let mut p = format!("apiVersion: etlantic/v1\nkind: Profile\nname: state\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nstate_store: {store}\nstate_memory_limit: {memory_limit}\nbindings:\n  bids: nexmark://bids?{params}\n");
    if *query == "join" {
        p.push_str(&format!("  auctions: nexmark://auctions?{params}\n"));
    }
    p.push_str(&format!("  out: {sink}\n"));
    p
}

/// A `/proc/self/<file>` figure: the number after `key`.
fn proc_figure(file: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs one measurement in this process and prints it as a JSON line.
fn child(setup: &Setup<'_>) {
    let Setup { query, events, .. } = *setup;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = format!("state_bench_{query}");
    let rows = Arc::new(AtomicU64::new(0));
    let counter = rows.clone();
    etlantic_sinks::foreach::register(
        &name,
        Arc::new(move |b: etlantic_sinks::foreach::ForeachBatch<'_>| {
            if b.output_mode != OutputMode::Complete {
                counter.fetch_add(b.data.num_rows() as u64, Ordering::Relaxed);
            }
            Ok(())
        }),
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline(query)).expect("write");
    std::fs::write(
        dir.path().join("profile.yaml"),
        profile(setup, &format!("foreach://{name}")),
    )
    .expect("write");
    let project = Project::load(
        &dir.path().join("pipeline.yaml"),
        Some(&dir.path().join("profile.yaml")),
    )
    .expect("the query loads");
    etlantic_datafusion::link();
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the query plans");
    // Per micro-batch with input: commitOffsets ms, bytes written, state rows, bytes
    // the state stores' commits copied to the checkpoint, bytes their background
    // snapshots copied.
    let batches = Arc::new(Mutex::new(Vec::<(f64, u64, u64, u64, u64)>::new()));
    let seen = batches.clone();
    let last_wchar = Arc::new(AtomicU64::new(proc_figure("io", "wchar:")));
    let mut opts = StreamingOptions::new(dir.path(), dir.path().join("chk"));
    opts.on_progress = Some(Arc::new(
        move |p: &etlantic_runtime::progress::QueryProgress| {
            let now = proc_figure("io", "wchar:");
            let wrote = now.saturating_sub(last_wchar.swap(now, Ordering::Relaxed));
            // The memory store's state write ends in `commitOffsets`; a store's commit
            // runs before the sinks and reports its own time.
            let store_commit: i64 = p
                .state_operators
                .iter()
                .filter_map(|o| o.custom_metrics.get("stateStoreCommitMs"))
                .sum();
            let commit = p.duration_ms.get("commitOffsets").copied().unwrap_or(0) as f64
                + store_commit.max(0) as f64;
            let state: u64 = p.state_operators.iter().map(|o| o.num_rows_total).sum();
            let metric = |name: &str| -> u64 {
                let sum: i64 = p
                    .state_operators
                    .iter()
                    .filter_map(|o| o.custom_metrics.get(name))
                    .sum();
                sum.max(0) as u64
            };
            let copied = metric("stateStoreBytesCopied");
            let snapshots = metric("stateStoreSnapshotBytesCopied");
            if p.num_input_rows > 0 {
                seen.lock()
                    .expect("not poisoned")
                    .push((commit, wrote, state, copied, snapshots));
            }
        },
    ));
    let (c0, w0) = (cpu_seconds(), Instant::now());
    let started = rt.block_on(async {
        let mut q = match StreamingQuery::start(&plan, opts).await {
            Ok(q) => q,
            Err(e) => return Err(e),
        };
        q.process_all_available().await.expect("the query runs");
        q.close().await.expect("the query closes");
        Ok(())
    });
    if let Err(e) = started {
        // The store refuses the query (an operator not on it yet): say so.
        println!(
            "{}",
            serde_json::json!({"query": query, "events": events, "refused": e.code(), "why": e.to_string()})
        );
        return;
    }
    let (cpu, wall) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
    let peak_kb = proc_figure("status", "VmHWM:");
    // Restart on a new machine: a new query on the checkpoint, restoring the state
    // without the working copy.
    let _ = std::fs::remove_dir_all(dir.path().join(".etlantic/state"));
    let t = Instant::now();
    rt.block_on(async {
        let opts = StreamingOptions::new(dir.path(), dir.path().join("chk"));
        let mut q = StreamingQuery::start(&plan, opts)
            .await
            .expect("the query restarts");
        q.close().await.expect("the query closes");
    });
    let restart = t.elapsed().as_secs_f64();
    let b = batches.lock().expect("not poisoned");
    let n = b.len().max(1) as f64;
    let state_rows = b.last().map_or(0, |x| x.2);
    // The last micro-batch's figures show how they grow with the state; the mean, their
    // cost over the run.
    let last = b.last().copied().unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({
            "query": query, "events": events, "batches": b.len(),
            "rows_out": rows.load(Ordering::Relaxed), "state_rows": state_rows,
            "events_per_cpu_s": events as f64 / cpu.max(1e-3), "wall_s": wall,
            "peak_rss_mb": peak_kb as f64 / 1024.0,
            "commit_ms_mean": b.iter().map(|x| x.0).sum::<f64>() / n,
            "commit_ms_last": last.0,
            "written_mb_mean": b.iter().map(|x| x.1 as f64).sum::<f64>() / n / 1e6,
            "written_mb_last": last.1 as f64 / 1e6,
            // The memory store's state write is all the process writes; the disk
            // store's, its changelogs and snapshots.
            "checkpoint_mb_mean": b.iter().map(|x| if setup.store == "memory" { x.1 } else { x.3 + x.4 } as f64).sum::<f64>() / n / 1e6,
            "checkpoint_mb_last": if setup.store == "memory" { last.1 } else { last.3 + last.4 } as f64 / 1e6,
            "commit_mb_mean": b.iter().map(|x| if setup.store == "memory" { x.1 } else { x.3 } as f64).sum::<f64>() / n / 1e6,
            "commit_mb_max": b.iter().map(|x| if setup.store == "memory" { x.1 } else { x.3 }).max().unwrap_or(0) as f64 / 1e6,
            "restart_s": restart,
        })
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let per_batch: u64 = arg(&args, "--per-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // Links the disk state store.
    std::hint::black_box(&etlantic_rocksdb::DiskStoreProvider);
    let memory_limit = arg(&args, "--memory-limit").unwrap_or_else(|| "256 MB".into());
    if let Some(query) = arg(&args, "--child") {
        let events = arg(&args, "--events")
            .and_then(|v| v.parse().ok())
            .expect("--events N");
        let store = arg(&args, "--store").unwrap_or_else(|| "memory".into());
        child(&Setup {
            query: &query,
            store: &store,
            memory_limit: &memory_limit,
            events,
            per_batch,
        });
        return;
    }
    let stores: Vec<String> = arg(&args, "--stores")
        .unwrap_or_else(|| "memory,disk".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let sizes: Vec<u64> = arg(&args, "--events")
        .unwrap_or_else(|| "1000000,5000000".into())
        .split(',')
        .map(|v| v.trim().parse().expect("--events takes numbers"))
        .collect();
    let queries: Vec<String> = match arg(&args, "--query") {
        Some(q) => vec![q],
        None => vec!["dedup".into(), "join".into()],
    };
    let exe = std::env::current_exe().expect("this program");
    let mut table = format!(
        "Nexmark events, {per_batch} per micro-batch, no watermark (the state only grows); one process per row; the disk store with `state_memory_limit: {memory_limit}`. *state write ms*: per micro-batch `commitOffsets` (the wait for the state write, then the commit) plus, for the disk store, its commit (`stateStoreCommitMs`: the changelog's upload, and when one is due the start of a snapshot: flush and hard links), mean over the run and the last micro-batch; *commit MB*: what the commit itself copied to the checkpoint per micro-batch, on the critical path (memory store: all the process wrote; disk store: the changelog), mean and largest; *checkpoint MB*: that plus what background snapshots copied (the disk store's SSTs and small files, counted with the commit after they finished), mean and last; *MB written*: all bytes the process wrote per micro-batch (for the disk store also RocksDB's local flushes and compactions); *restart s*: a new query restoring the final state from the checkpoint, without a local working copy.\n\n| query | store | events | state rows | events/s/core | peak RSS MB | state write ms (mean / last) | commit MB (mean / max) | checkpoint MB (mean / last) | MB written (mean / last) | restart s |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for q in &queries {
        for store in &stores {
            for &n in &sizes {
                let out = Command::new(&exe)
                    .args(["--child", q, "--events", &n.to_string()])
                    .args(["--per-batch", &per_batch.to_string()])
                    .args(["--store", store, "--memory-limit", &memory_limit])
                    .output()
                    .expect("the child runs");
                if !out.status.success() {
                    // A measurement that could not finish (the memory store out of the
                    // machine's memory at 50M keys) is a row saying so, not a lost table.
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let why = stderr.lines().last().unwrap_or("").replace('|', "/");
                    let row = format!(
                        "| {q} | {store} | {n} | failed ({}): {why} ||||||||\n",
                        out.status
                    );
                    eprint!("{stderr}");
                    print!("{row}");
                    table.push_str(&row);
                    continue;
                }
                let line = String::from_utf8_lossy(&out.stdout);
                let m: serde_json::Value = line
                    .lines()
                    .rev()
                    .find_map(|l| serde_json::from_str(l).ok())
                    .expect("a JSON line");
                let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
                let row = match m.get("refused") {
                Some(code) => format!(
                    "| {q} | {store} | {n} | refused at start ({}): {} ||||||||\n",
                    code.as_str().unwrap_or("?"),
                    m["why"].as_str().unwrap_or("").replace('|', "/")
                ),
                None => format!(
                    "| {q} | {store} | {n} | {} | {:.0} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} |\n",
                    m["state_rows"],
                    f("events_per_cpu_s"),
                    f("peak_rss_mb"),
                    f("commit_ms_mean"),
                    f("commit_ms_last"),
                    f("commit_mb_mean"),
                    f("commit_mb_max"),
                    f("checkpoint_mb_mean"),
                    f("checkpoint_mb_last"),
                    f("written_mb_mean"),
                    f("written_mb_last"),
                    f("restart_s"),
                ),
            };
                print!("{row}");
                table.push_str(&row);
            }
        }
    }
    println!("\n{table}");
    if let Some(path) = arg(&args, "--markdown") {
        let doc = format!(
            "# State benchmark\n\nProduced by `cargo xtask bench state` on one machine in one run; compare rows within a run, not across runs or machines.\n\n{table}"
        );
        std::fs::write(&path, doc).expect("the markdown file is written");
    }
}
