//! A streaming query that reads JSON-lines objects from S3 and writes windowed counts to
//! a file sink on S3, with its checkpoint and quarantine on S3 too (a real S3-compatible
//! server, moto, on 127.0.0.1), through the real `etlantic` binary: killed at every step
//! of the batch protocol (`ETLANTIC_FAIL_POINT`) and restarted, it gives the rows,
//! quarantine and logged offsets of an uninterrupted run on the local disk; a second
//! writer on the checkpoint is refused; bad configurations are diagnostics with a code.
#![cfg(feature = "object-store")]

mod common;
use common::crash::{
    describe, input_files, output_text, run_totals_twice, write_click_counts, FAIL_POINTS,
};

use etlantic::object_store::testing::S3TestServer;
use etlantic::object_store::ObjectStorage;
use etlantic_core::storage::{Storage, Sub};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

/// Where a run's input, output, quarantine and checkpoint are.
#[derive(Clone, Copy)]
struct At<'a> {
    clicks: &'a str,
    counts: &'a str,
    quarantine: &'a str,
    checkpoint: &'a str,
}

/// The click-count profile with everything `at` says.
fn profile_to(at: &At<'_>, extra: &str) -> String {
    format!(
        r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: {}
bindings:
  clicks: {}?format=jsonl
  counts: {}
quarantine: {}
{extra}"#,
        at.checkpoint, at.clicks, at.counts, at.quarantine
    )
}

/// The click-count profile with its checkpoint at `checkpoint`, the rest local.
fn profile(checkpoint: &str, extra: &str) -> String {
    profile_to(
        &At {
            clicks: "file://in",
            counts: "file://out/counts/?format=jsonl",
            quarantine: "file://out/quarantine.jsonl",
            checkpoint,
        },
        extra,
    )
}

/// Where the counts go: a file sink's directory, a Delta table or an Iceberg table (in a
/// warehouse), on S3.
#[derive(Clone, Copy, Debug)]
enum Counts {
    Files,
    #[cfg(feature = "delta")]
    Delta,
    #[cfg(feature = "iceberg")]
    Iceberg,
}

impl Counts {
    fn binding(self, name: &str) -> String {
        match self {
            Counts::Files => format!("s3://chk/{name}/counts/?format=jsonl"),
            #[cfg(feature = "delta")]
            Counts::Delta => format!("delta://s3://chk/{name}/counts"),
            #[cfg(feature = "iceberg")]
            Counts::Iceberg => format!("iceberg://db/counts?warehouse=s3://chk/{name}/warehouse"),
        }
    }

    /// The rows written by the run in project `dir`, as a sorted multiset.
    fn rows(self, server: &S3TestServer, dir: &Path, name: &str) -> Vec<String> {
        let url = format!("s3://chk/{name}/counts");
        match self {
            Counts::Files => s3_rows(server, &url),
            #[cfg(feature = "iceberg")]
            Counts::Iceberg => {
                let binding = etlantic_core::uri::BindingUri::parse(&self.binding(name)).unwrap();
                let target = etlantic_sinks::iceberg::IcebergTarget::from_uri(&binding)
                    .unwrap()
                    .resolve(dir)
                    .with_storage_options(server.options());
                assert!(target.warehouse.is_remote());
                let batches = tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(target.read_rows())
                    .expect("the Iceberg table on S3 is readable");
                common::crash::canonical_window_rows(&batches)
            }
            #[cfg(feature = "delta")]
            Counts::Delta => {
                let location =
                    etlantic_core::storage::Location::parse(&url, Path::new("/")).unwrap();
                let batches = tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(etlantic_sinks::delta::read_table_at(
                        &location,
                        &server.options(),
                    ))
                    .expect("the Delta table on S3 is readable");
                common::crash::canonical_window_rows(&batches)
            }
        }
    }
}

/// The profile of a run with everything on S3 under `s3://chk/<name>`, and `extra`.
fn all_on_s3(name: &str, counts: Counts, extra: &str) -> String {
    profile_to(
        &At {
            clicks: &format!("s3://chk/{name}/in/"),
            counts: &counts.binding(name),
            quarantine: &format!("s3://chk/{name}/quarantine.jsonl"),
            checkpoint: &format!("s3://chk/{name}/checkpoint"),
        },
        extra,
    )
}

/// Uploads the click files to `s3://chk/<name>/in/`, as a producer would.
fn upload_clicks(server: &S3TestServer, name: &str) {
    let input = storage(server, &format!("s3://chk/{name}/in"));
    for (file, text) in input_files() {
        etlantic_core::storage::put_bytes(input.as_ref(), &file, text.as_bytes()).unwrap();
    }
}

/// Runs the binary in `dir` with the server's `AWS_*` variables (the AWS way).
fn run(server: &S3TestServer, dir: &Path, fail_point: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env_remove("ETLANTIC_FAIL_POINT")
        .envs(server.env());
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd.output().expect("the etlantic binary runs")
}

fn run_ok(server: &S3TestServer, dir: &Path) {
    let o = run(server, dir, None);
    assert!(o.status.success(), "run failed: {}", describe(&o));
}

fn storage(server: &S3TestServer, url: &str) -> Arc<dyn Storage> {
    Arc::new(ObjectStorage::open(&url::Url::parse(url).unwrap(), &server.options()).unwrap())
}

use common::comparable_offsets as offsets;

fn s3_log(storage: &Arc<dyn Storage>) -> etlantic_runtime::checkpoint::batch_log::LogRecords {
    etlantic_runtime::checkpoint::batch_log::read_all_in(&Sub::new(storage.clone(), "log"))
        .expect("the checkpoint log on S3 is readable")
}

#[derive(Debug, PartialEq)]
struct Finished {
    rows: Vec<String>,
    quarantine: Vec<String>,
    offsets: BTreeMap<u64, Value>,
}

/// The quarantined records at `location` (a file or an S3 prefix), each file named by
/// its name alone (a local source names it by path, an S3 source by URL).
fn quarantined(server: &S3TestServer, location: &str) -> Vec<String> {
    let location = etlantic_core::storage::Location::parse(location, Path::new("/")).unwrap();
    let mut v: Vec<String> =
        etlantic_runtime::quarantine::read_quarantine_at(&location, &server.options())
            .unwrap()
            .iter()
            .map(|l| {
                let mut position = l["position"].clone();
                if let Some(file) = position["file"].as_str() {
                    position["file"] = file.rsplit('/').next().unwrap_or_default().into();
                }
                serde_json::json!({"code": l["code"], "position": position, "raw": l["raw"], "batch": l["batch_id"]})
                    .to_string()
            })
            .collect();
    v.sort();
    v
}

fn rows(dir: &Path) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap();
    common::crash::canonical_window_rows(&batches)
}

fn s3_rows(server: &S3TestServer, url: &str) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed_in(storage(server, url).as_ref())
        .expect("the sink's output on S3 is readable");
    common::crash::canonical_window_rows(&batches)
}

#[test]
fn killed_at_every_step_with_its_checkpoint_on_s3_the_restart_loses_and_duplicates_nothing() {
    let server = S3TestServer::start();
    server.create_bucket("chk");

    // The reference: an uninterrupted run with everything local.
    let reference = local_reference(&server);
    let batches = reference.offsets.len() as u64;

    // Uninterrupted on S3: the same, and input, output, quarantine and checkpoint are
    // all on S3.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_click_counts(dir, &all_on_s3("uninterrupted", Counts::Files, ""));
    std::fs::remove_dir_all(dir.join("in")).unwrap();
    upload_clicks(&server, "uninterrupted");
    run_ok(&server, dir);
    let chk = storage(&server, "s3://chk/uninterrupted/checkpoint");
    let done = Finished {
        rows: Counts::Files.rows(&server, dir, "uninterrupted"),
        quarantine: quarantined(&server, "s3://chk/uninterrupted/quarantine.jsonl"),
        offsets: offsets(s3_log(&chk)),
    };
    assert_eq!(done, reference);
    // `etlantic dlq list` reads the quarantine's objects on S3.
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["dlq", "list", "--format", "json"])
        .envs(server.env())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let groups: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        common::dlq_records(&groups),
        reference.quarantine.len() as u64,
        "{groups}"
    );
    // `etlantic status` reads the checkpoint on S3, named by the profile or as a URI.
    for args in [
        &["status", "--format", "json"][..],
        &[
            "status",
            "s3://chk/uninterrupted/checkpoint",
            "--format",
            "json",
        ][..],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
            .current_dir(dir)
            .args(args)
            .envs(server.env())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", describe(&o));
        let s: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(s["state"], "stopped", "{s}");
        assert_eq!(s["batchesThisRun"], batches, "{s}");
        assert!(s["checkpointBytes"].as_u64().unwrap() > 0, "{s}");
    }
    let local_files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        local_files
            .iter()
            .all(|f| ["pipeline.yaml", "profiles", "contracts"].contains(&f.as_str())),
        "nothing written locally: {local_files:?}"
    );
    // Each source object was logged with its ETag.
    let seen =
        etlantic_sources::files::SeenLog::open_in(Arc::new(Sub::new(chk.clone(), "sources/0")))
            .unwrap();
    let last = seen.last_index().expect("objects were logged");
    for index in 0..=last {
        for file in seen.files(index).unwrap().unwrap() {
            assert!(file.version.is_some(), "{file:?}");
        }
    }
    let top = chk.list("").unwrap();
    for name in [
        "log/",
        "metadata",
        "progress.jsonl",
        "sources/",
        "state-changes/",
    ] {
        assert!(top.contains(&name.to_string()), "{name} in {top:?}");
    }
    // The lease is released at the end.
    assert!(!top.contains(&".lock".to_string()), "{top:?}");
    let progress = String::from_utf8(chk.read("progress.jsonl").unwrap().unwrap()).unwrap();
    assert_eq!(
        progress.lines().count() as u64,
        batches,
        "a record per micro-batch"
    );

    kill_at_every_step(&server, Counts::Files, &reference, None);
}

/// The reference of the click counts: an uninterrupted run on the local disk.
fn local_reference(server: &S3TestServer) -> Finished {
    let local = tempfile::tempdir().unwrap();
    write_click_counts(local.path(), &profile("file://chk", ""));
    run_ok(server, local.path());
    let reference = Finished {
        rows: rows(local.path()),
        quarantine: quarantined(
            server,
            local.path().join("out/quarantine.jsonl").to_str().unwrap(),
        ),
        offsets: offsets(common::batch_log(&local.path().join("chk"))),
    };
    assert_eq!(reference.rows.len(), 7, "{:?}", reference.rows);
    assert_eq!(reference.quarantine.len(), 3, "{:?}", reference.quarantine);
    reference
}

/// How a run keeps its state: the memory store, or the disk store (whose working copy
/// each restart loses: it restores from S3 alone).
const DISK_STATE: &str = "state_store: disk\nstate_memory_limit: 32 MB\nstate_snapshot_every: 2\n";

/// Runs the click counts with everything on S3 (and the profile's `state`, else the
/// memory store), killed at every step of the batch protocol at several batches and
/// restarted: each ends as `reference`.
fn kill_at_every_step(
    server: &S3TestServer,
    counts: Counts,
    reference: &Finished,
    state: Option<&str>,
) {
    let batches = reference.offsets.len() as u64;
    for point in FAIL_POINTS {
        for batch in [0u64, 2, 4, batches - 1] {
            let label = format!("{counts:?} {point}:{batch}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let store = if state.is_some() { "-disk" } else { "" };
            let name = format!("{counts:?}{store}-{point}-{batch}").to_lowercase();
            let at = format!("s3://chk/{name}/checkpoint");
            write_click_counts(dir, &all_on_s3(&name, counts, state.unwrap_or("")));
            std::fs::remove_dir_all(dir.join("in")).unwrap();
            upload_clicks(server, &name);
            let o = run(server, dir, Some(&format!("{point}:{batch}")));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            let chk = storage(server, &at);
            let log = s3_log(&chk);
            assert!(log.offsets.contains_key(&batch), "{label}: offsets logged");
            if point != "after_commit" {
                assert!(!log.commits.contains_key(&batch), "{label}: not committed");
            }
            // The killed process's lease is still there: the restart on this machine
            // takes it over at once (its holder is dead).
            assert!(chk.list("").unwrap().contains(&".lock".to_string()));
            if state.is_some() {
                std::fs::remove_dir_all(dir.join(".etlantic/state")).unwrap();
            }
            run_ok(server, dir);
            let done = Finished {
                rows: counts.rows(server, dir, &name),
                quarantine: quarantined(server, &format!("s3://chk/{name}/quarantine.jsonl")),
                offsets: offsets(s3_log(&chk)),
            };
            assert_eq!(&done, reference, "{label}");
        }
    }
}

#[cfg(feature = "delta")]
#[test]
fn a_delta_table_on_s3_killed_at_every_step_loses_and_duplicates_nothing() {
    let server = S3TestServer::start();
    server.create_bucket("chk");
    let reference = local_reference(&server);
    kill_at_every_step(&server, Counts::Delta, &reference, None);

    // A batch pipeline reads one of the tables (the bounded delta source on S3) and
    // overwrites a table of totals on S3, twice: the totals are replaced, not appended.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_click_counts(dir, &profile("file://chk", ""));
    run_totals_twice(
        dir,
        "delta://s3://chk/delta-after_commit-0/counts",
        "delta://s3://chk/totals?mode=overwrite",
        &server.env(),
    );
    let location =
        etlantic_core::storage::Location::parse("s3://chk/totals", Path::new("/")).unwrap();
    let batches = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(etlantic_sinks::delta::read_table_at(
            &location,
            &server.options(),
        ))
        .unwrap();
    let mut got = BTreeMap::new();
    for b in &batches {
        let c = arrow::array::AsArray::as_string::<i32>(b.column_by_name("campaign").unwrap());
        let t = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
            b.column_by_name("total").unwrap(),
        );
        for i in 0..b.num_rows() {
            assert!(
                got.insert(c.value(i).to_string(), t.value(i)).is_none(),
                "appended twice"
            );
        }
    }
    let mut expected = BTreeMap::new();
    for row in &reference.rows {
        let v: Value = serde_json::from_str(row).unwrap();
        *expected
            .entry(v["campaign"].as_str().unwrap().to_string())
            .or_insert(0i64) += v["n"].as_i64().unwrap();
    }
    assert_eq!(got, expected);
}

#[cfg(feature = "iceberg")]
#[test]
fn an_iceberg_warehouse_on_s3_killed_at_every_step_loses_and_duplicates_nothing() {
    let server = S3TestServer::start();
    server.create_bucket("chk");
    let reference = local_reference(&server);
    kill_at_every_step(&server, Counts::Iceberg, &reference, None);
    // The table's files are on S3; only the SQLite catalog is local.
    let wh = storage(
        &server,
        "s3://chk/iceberg-after_commit-0/warehouse/db/counts",
    );
    assert!(wh.list("").unwrap().contains(&"metadata/".to_string()));
    assert!(wh.list("").unwrap().contains(&"data/".to_string()));
}

/// The disk state store with its checkpoint on S3: the window aggregation's changelogs
/// and snapshots go to S3, and every restart — after a kill at every step, its working
/// copy deleted — restores from S3 alone.
#[test]
fn the_disk_state_store_on_s3_killed_at_every_step_restores_from_s3_alone() {
    let server = S3TestServer::start();
    server.create_bucket("chk");
    let reference = local_reference(&server);
    kill_at_every_step(&server, Counts::Files, &reference, Some(DISK_STATE));
    // The store's part of the checkpoint: changelogs, and snapshots with their SSTs.
    let chk = storage(&server, "s3://chk/files-disk-after_commit-0/checkpoint");
    let stores = chk.list("state-store").unwrap();
    assert_eq!(stores.len(), 1, "one stateful operator: {stores:?}");
    let store = format!("state-store/{}", stores[0]);
    for dir in ["changelog/", "snapshot/", "sst/", "small/"] {
        assert!(
            chk.list(&store).unwrap().contains(&dir.to_string()),
            "{dir} in {store}"
        );
    }
}

#[test]
fn a_second_writer_is_refused_and_bad_configurations_are_diagnosed() {
    let server = S3TestServer::start();
    server.create_bucket("chk");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // Another live process holds the checkpoint's lease (this test process).
    write_click_counts(dir, &profile("s3://chk/held", ""));
    let held = storage(&server, "s3://chk/held");
    let lease = held.lock(".lock").unwrap();
    let o = run(&server, dir, None);
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL803"), "{text}");
    assert!(!dir.join("out/counts").exists(), "nothing written: {text}");
    drop(lease);
    run_ok(&server, dir);

    // A missing bucket.
    std::fs::write(
        dir.join("profiles/local.yaml"),
        profile("s3://no-such-bucket/chk", ""),
    )
    .unwrap();
    let o = run(&server, dir, None);
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL714"), "{text}");
    assert!(text.contains("s3://no-such-bucket/chk"), "{text}");

    // An endpoint nobody answers on: a diagnostic after bounded retries, not a hang.
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .envs(server.env())
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        .output()
        .unwrap();
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL716"), "{text}");

    // Options in the profile, credentials as references: they reach the store, and the
    // secret's value is printed nowhere.
    std::fs::write(
        dir.join("profiles/local.yaml"),
        profile(
            "s3://chk/with-options",
            &format!(
                "storage_options:\n  endpoint: {}\n  region: us-east-1\n  allow_http: \"true\"\n  access_key_id: ${{env:TEST_S3_KEY}}\n  secret_access_key: ${{env:TEST_S3_SECRET}}\n",
                server.endpoint()
            ),
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env("TEST_S3_KEY", "test")
        .env("TEST_S3_SECRET", "s3cr3t-value")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    let text = output_text(&o);
    assert!(o.status.success(), "{}", describe(&o));
    assert!(!text.contains("s3cr3t-value"), "{text}");
    let chk = storage(&server, "s3://chk/with-options");
    assert!(chk.read("metadata").unwrap().is_some());
    let progress = String::from_utf8(chk.read("progress.jsonl").unwrap().unwrap()).unwrap();
    assert!(!progress.contains("s3cr3t-value"));

    // A credential in plain text is refused before anything runs.
    std::fs::write(
        dir.join("profiles/local.yaml"),
        profile(
            "s3://chk/plain",
            "storage_options:\n  secret_access_key: hunter2\n",
        ),
    )
    .unwrap();
    let o = run(&server, dir, None);
    let text = output_text(&o);
    assert!(!o.status.success() && text.contains("ETL602"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

/// What one configuration's micro-batches cost in requests.
struct Cost {
    what: &'static str,
    /// The first progress record's requests (start-up and the first micro-batch).
    first: RequestCounts,
    /// The mean of the other micro-batches', by kind (rounded up).
    steady: RequestCounts,
}

use etlantic_core::storage::requests::RequestCounts;

/// Runs the click counts with the parts `at` puts on S3 and reads what each micro-batch
/// cost from its progress records (the checkpoint is on S3 in every configuration).
fn cost(server: &S3TestServer, what: &'static str, name: &str, at: At<'_>, upload: bool) -> Cost {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_click_counts(dir, &profile_to(&at, ""));
    if upload {
        upload_clicks(server, name);
    }
    run_ok(server, dir);
    let chk = storage(server, at.checkpoint);
    let text = String::from_utf8(chk.read("progress.jsonl").unwrap().unwrap()).unwrap();
    let records: Vec<etlantic_runtime::progress::QueryProgress> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let spent: Vec<RequestCounts> = records
        .iter()
        .map(|r| {
            r.storage_requests
                .expect("every micro-batch sends requests")
        })
        .collect();
    let rest = &spent[1..];
    let mean =
        |f: fn(&RequestCounts) -> u64| rest.iter().map(f).sum::<u64>().div_ceil(rest.len() as u64);
    Cost {
        what,
        first: spent[0],
        steady: RequestCounts {
            get: mean(|c| c.get),
            head: mean(|c| c.head),
            put: mean(|c| c.put),
            list: mean(|c| c.list),
            delete: mean(|c| c.delete),
            copy: mean(|c| c.copy),
        },
    }
}

/// The requests a micro-batch costs with each part of the query on S3, from the
/// `storageRequests` of the progress records (docs/connectors.md has the table this
/// prints with `--nocapture`). Bounds keep the costs from creeping up unnoticed.
#[test]
fn requests_per_micro_batch_are_reported_and_bounded() {
    let server = S3TestServer::start();
    server.create_bucket("chk");
    let local = At {
        clicks: "file://in",
        counts: "file://out/counts/?format=jsonl",
        quarantine: "file://out/quarantine.jsonl",
        checkpoint: "s3://chk/cost-checkpoint/checkpoint",
    };
    let mut costs = vec![cost(&server, "checkpoint", "cost-checkpoint", local, false)];
    costs.push(cost(
        &server,
        "checkpoint + file source",
        "cost-source",
        At {
            clicks: "s3://chk/cost-source/in/",
            checkpoint: "s3://chk/cost-source/checkpoint",
            ..local
        },
        true,
    ));
    costs.push(cost(
        &server,
        "checkpoint + file sink",
        "cost-sink",
        At {
            counts: "s3://chk/cost-sink/counts/?format=jsonl",
            checkpoint: "s3://chk/cost-sink/checkpoint",
            ..local
        },
        false,
    ));
    costs.push(cost(
        &server,
        "checkpoint + quarantine",
        "cost-quarantine",
        At {
            quarantine: "s3://chk/cost-quarantine/quarantine.jsonl",
            checkpoint: "s3://chk/cost-quarantine/checkpoint",
            ..local
        },
        false,
    ));
    #[cfg(feature = "delta")]
    costs.push(cost(
        &server,
        "checkpoint + Delta sink",
        "cost-delta",
        At {
            counts: "delta://s3://chk/cost-delta/counts",
            checkpoint: "s3://chk/cost-delta/checkpoint",
            ..local
        },
        false,
    ));
    #[cfg(feature = "iceberg")]
    costs.push(cost(
        &server,
        "checkpoint + Iceberg sink",
        "cost-iceberg",
        At {
            counts: "iceberg://db/counts?warehouse=s3://chk/cost-iceberg/warehouse",
            checkpoint: "s3://chk/cost-iceberg/checkpoint",
            ..local
        },
        false,
    ));
    println!("| on S3 | first micro-batch (GET/HEAD/PUT/LIST/DELETE/COPY) | each later micro-batch, mean (GET/HEAD/PUT/LIST/DELETE/COPY) |");
    println!("|---|---|---|");
    let show = |c: &RequestCounts| {
        format!(
            "{} / {} / {} / {} / {} / {} ({} in all)",
            c.get,
            c.head,
            c.put,
            c.list,
            c.delete,
            c.copy,
            c.total()
        )
    };
    for c in &costs {
        println!("| {} | {} | {} |", c.what, show(&c.first), show(&c.steady));
    }
    // The checkpoint alone: an offsets record and a commit record a micro-batch, a state
    // version, a few listings; never a request per row or per older micro-batch.
    let checkpoint = &costs[0].steady;
    assert!(checkpoint.put <= 8, "{}", show(checkpoint));
    assert!(checkpoint.total() <= 30, "{}", show(checkpoint));
    // Each part adds a bounded number of requests on top.
    for c in &costs[1..] {
        assert!(
            c.steady.total() <= checkpoint.total() + 40,
            "{}: {}",
            c.what,
            show(&c.steady)
        );
    }
}
