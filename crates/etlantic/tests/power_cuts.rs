//! Power cuts: the windowed click-count pipeline of the recovery tests run in this
//! process on a simulated disk ([`PowerCutDisk`], mounted over the project's directory so
//! that the checkpoint, the quarantine and the file sink's output live on it), with the
//! power cut before every write and sync it makes — once dropping every unsynced byte,
//! once keeping half of the last file's unsynced tail (a torn write) — then restarted on
//! what the disk kept. A process kill (the other recovery tests) keeps the page cache; a
//! power cut does not, so this is where a missing sync would show. Every restart must end
//! with the output of an uninterrupted run: 0 rows lost, 0 duplicated, the same
//! quarantine.
//!
//! The file sink writes through the same storage, and so do Delta Lake (through an
//! object store over it) and Apache Iceberg (through a file I/O over it), so their own
//! unsynced bytes are cut too; Iceberg's catalog, a SQLite database, stays on the real
//! disk, as an external catalog service would. SQLite writes through its own I/O layer
//! to the real disk (outside the simulated one) and commits with SQLite's durability, so
//! the SQLite run cuts the checkpoint and the quarantine at every write and sync while
//! the table keeps every commit it reported — what a power cut does once SQLite's
//! commit has returned — and checks that the checkpoint's recovery and the sink's
//! idempotency together still write each batch once.

mod common;
use common::crash::*;

use etlantic_core::storage::{self, power_cut::PowerCutDisk};
use std::path::Path;
use std::sync::Arc;

/// A sink of the test: how it is bound (`{tables}` is a directory on the real disk) and
/// how its rows are read back.
#[derive(Clone, Copy, Debug)]
enum Sink {
    Files,
    Delta,
    Iceberg,
    Sqlite,
}

impl Sink {
    fn binding(self, tables: &Path) -> String {
        let t = tables.display();
        match self {
            Sink::Files => "file://out/counts/?format=jsonl".into(),
            // Inside the project, on the simulated disk: Delta writes through the storage
            // layer there (an object store over it).
            Sink::Delta => "delta://out/counts".into(),
            // The warehouse on the simulated disk (Iceberg writes its files through the
            // storage layer), the catalog, a SQLite database, on the real one.
            Sink::Iceberg => format!(
                "iceberg://analytics/counts?catalog=sqlite://{t}/catalog.db&warehouse=out/warehouse"
            ),
            Sink::Sqlite => format!("sqlite://{t}/counts.db?table=counts"),
        }
    }

    /// The committed rows, canonical and sorted.
    fn rows(self, dir: &Path, tables: &Path) -> Vec<String> {
        fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        }
        match self {
            Sink::Files => canonical_window_rows(
                &etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap(),
            ),
            Sink::Delta => canonical_window_rows(
                &block_on(etlantic_sinks::delta::read_table(dir.join("out/counts"))).unwrap(),
            ),
            Sink::Iceberg => {
                let uri = etlantic_core::uri::BindingUri::parse(&self.binding(tables)).unwrap();
                let target = etlantic_sinks::iceberg::IcebergTarget::from_uri(&uri)
                    .unwrap()
                    .resolve(dir);
                canonical_window_rows(&block_on(target.read_rows()).unwrap())
            }
            Sink::Sqlite => {
                use sqlx::Connection;
                let path = tables.join("counts.db");
                let rows: Vec<(String, String, String, i64)> = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async {
                        let o = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                        let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
                        sqlx::query_as(
                            "SELECT CAST(window_start AS TEXT), CAST(window_end AS TEXT), campaign, n FROM counts",
                        )
                        .fetch_all(&mut c)
                        .await
                        .unwrap()
                    });
                let mut v: Vec<String> = rows
                    .into_iter()
                    .map(|(a, b, c, d)| format!("{a} | {b} | {c} | {d}"))
                    .collect();
                v.sort();
                v
            }
        }
    }
}

fn project(dir: &Path, sink: Sink, tables: &Path) {
    write_click_counts(dir, &click_counts_profile_into(&sink.binding(tables), ""));
}

/// Runs the pipeline of `dir` in this process; returns the run report.
fn run_in_process(dir: &Path) -> etlantic::run::RunReport {
    let project =
        etlantic_plan::Project::load(&dir.join("pipeline.yaml"), None).expect("the project loads");
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the project plans");
    let ctx = etlantic::run::RunContext::for_plan(&plan, dir);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(etlantic::run::run_streaming(
            &plan,
            &ctx,
            etlantic::run::StreamingRun {
                on_progress: None,
                stop: Default::default(),
                max_batches: None,
                metrics_addr: None,
                progress: None,
            },
        ))
}

/// What a finished run leaves: the committed window rows and the quarantine (code,
/// position, raw), each sorted.
fn outcome(dir: &Path, sink: Sink, tables: &Path) -> (Vec<String>, Vec<String>) {
    let rows = sink.rows(dir, tables);
    let mut quarantine: Vec<String> =
        etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl"))
            .unwrap()
            .iter()
            .map(|l| {
                serde_json::json!([l["code"], l["position"], l["raw"], l["batch_id"]]).to_string()
            })
            .collect();
    quarantine.sort();
    (rows, quarantine)
}

/// Cuts the power before every event of the uninterrupted run, with and without a torn
/// write, restarts, and compares; returns how many cuts it made.
fn cut_everywhere(sink: Sink) -> u64 {
    // The uninterrupted run, on its own disk: the outcome and how many events it makes.
    let tmp = tempfile::tempdir().unwrap();
    let tables = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    project(dir, sink, tables.path());
    let disk = PowerCutDisk::new();
    let _mount = storage::mount(dir, Arc::new(disk.clone()));
    let report = run_in_process(dir);
    assert_eq!(report.status, "succeeded", "{:?}", report.errors);
    let reference = outcome(dir, sink, tables.path());
    assert_eq!(reference.0.len(), 7, "the windows of the recovery tests");
    assert_eq!(reference.1.len(), 3, "the bad, mistyped and late clicks");
    let events = disk.events();
    assert!(
        events > 30,
        "a few micro-batches make many writes and syncs: {events}"
    );
    let trace = disk.trace();
    drop(_mount);

    let mut cuts = 0;
    for n in 0..events {
        for tear in [false, true] {
            let label = format!(
                "{sink:?}: cut before event {n} ({}), torn: {tear}",
                trace[n as usize]
            );
            let tmp = tempfile::tempdir().unwrap();
            let tables = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            project(dir, sink, tables.path());
            let disk = PowerCutDisk::new();
            let _mount = storage::mount(dir, Arc::new(disk.clone()));
            disk.cut_before(n, tear);
            let crashed = run_in_process(dir);
            // The status record is for people and never fails a query: a cut at its last
            // write finds the run's work done. Every other cut stops the run.
            let last_status_write = n + 1 == events && trace[n as usize].contains("status.json");
            if !last_status_write {
                assert_eq!(
                    crashed.status, "failed",
                    "{label}: the run must stop at the cut"
                );
            }
            assert!(disk.is_off(), "{label}");
            let lost = disk.lost();
            disk.power_on();
            let restarted = run_in_process(dir);
            assert_eq!(
                restarted.status, "succeeded",
                "{label}: the restart failed after losing {lost:?}: {:?}",
                restarted.errors
            );
            let got = outcome(dir, sink, tables.path());
            assert_eq!(
                got.0, reference.0,
                "{label}: the sink differs from the uninterrupted run (lost {lost:?})"
            );
            assert_eq!(
                got.1, reference.1,
                "{label}: the quarantine differs (lost {lost:?})"
            );
            cuts += 1;
        }
    }
    assert_eq!(cuts, 2 * events);
    eprintln!("{sink:?}: {cuts} power cuts at {events} events, each restart exact");
    cuts
}

#[test]
fn files_cut_at_every_write_and_sync_lose_and_duplicate_nothing() {
    cut_everywhere(Sink::Files);
}

#[test]
fn delta_cut_at_every_write_and_sync_loses_and_duplicates_nothing() {
    cut_everywhere(Sink::Delta);
}

#[test]
fn iceberg_cut_at_every_write_and_sync_loses_and_duplicates_nothing() {
    cut_everywhere(Sink::Iceberg);
}

#[test]
fn sqlite_with_its_checkpoint_cut_everywhere_loses_and_duplicates_nothing() {
    cut_everywhere(Sink::Sqlite);
}
