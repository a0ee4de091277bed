//! A streaming query whose checkpoint and file sink are on S3 (a real S3-compatible
//! server, moto, on 127.0.0.1), through the real `etlantic` binary: killed at every step
//! of the batch protocol (`ETLANTIC_FAIL_POINT`) and restarted, it gives the rows,
//! quarantine and logged offsets of an uninterrupted run on the local disk; a second
//! writer on the checkpoint is refused; bad configurations are diagnostics with a code.
#![cfg(feature = "object-store")]

mod common;
use common::crash::{describe, output_text, quarantined, write_click_counts, FAIL_POINTS};

use etlantic::object_store::testing::S3TestServer;
use etlantic::object_store::ObjectStorage;
use etlantic_core::storage::{Storage, Sub};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

/// The click-count profile with its checkpoint at `checkpoint`, the counts written to
/// `counts` (a directory, local or on S3).
fn profile_to(checkpoint: &str, counts: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: {checkpoint}
bindings:
  clicks: file://in?format=jsonl
  counts: {counts}?format=jsonl
quarantine: file://out/quarantine.jsonl
{extra}"#
    )
}

/// The click-count profile with its checkpoint at `checkpoint`, the counts local.
fn profile(checkpoint: &str, extra: &str) -> String {
    profile_to(checkpoint, "file://out/counts/", extra)
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

fn checkpoint(server: &S3TestServer, url: &str) -> Arc<dyn Storage> {
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

fn rows(dir: &Path) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed(dir.join("out/counts")).unwrap();
    common::crash::canonical_window_rows(&batches)
}

fn s3_rows(server: &S3TestServer, url: &str) -> Vec<String> {
    let batches = etlantic_sinks::files::read_committed_in(checkpoint(server, url).as_ref())
        .expect("the sink's output on S3 is readable");
    common::crash::canonical_window_rows(&batches)
}

#[test]
fn killed_at_every_step_with_its_checkpoint_on_s3_the_restart_loses_and_duplicates_nothing() {
    let server = S3TestServer::start();
    server.create_bucket("chk");

    // The reference: an uninterrupted run with a local checkpoint.
    let local = tempfile::tempdir().unwrap();
    write_click_counts(local.path(), &profile("file://chk", ""));
    run_ok(&server, local.path());
    let reference = Finished {
        rows: rows(local.path()),
        quarantine: quarantined(local.path()),
        offsets: offsets(common::batch_log(&local.path().join("chk"))),
    };
    assert_eq!(reference.rows.len(), 7, "{:?}", reference.rows);
    let batches = reference.offsets.len() as u64;

    // Uninterrupted on S3: the same, and the checkpoint and output are all on S3.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_click_counts(
        dir,
        &profile_to("s3://chk/uninterrupted", "s3://chk/out/uninterrupted/", ""),
    );
    run_ok(&server, dir);
    let chk = checkpoint(&server, "s3://chk/uninterrupted");
    let done = Finished {
        rows: s3_rows(&server, "s3://chk/out/uninterrupted"),
        quarantine: quarantined(dir),
        offsets: offsets(s3_log(&chk)),
    };
    assert_eq!(done, reference);
    assert!(!dir.join("chk").exists() && !dir.join(".etlantic").exists());
    assert!(!dir.join("out/counts").exists());
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

    for point in FAIL_POINTS {
        for batch in [0u64, 2, 4, batches - 1] {
            let label = format!("{point}:{batch}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let at = format!("s3://chk/{point}-{batch}");
            let out = format!("s3://chk/out/{point}-{batch}");
            write_click_counts(dir, &profile_to(&at, &format!("{out}/"), ""));
            let o = run(&server, dir, Some(&label));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            let chk = checkpoint(&server, &at);
            let log = s3_log(&chk);
            assert!(log.offsets.contains_key(&batch), "{label}: offsets logged");
            if point != "after_commit" {
                assert!(!log.commits.contains_key(&batch), "{label}: not committed");
            }
            // The killed process's lease is still there: the restart on this machine
            // takes it over at once (its holder is dead).
            assert!(chk.list("").unwrap().contains(&".lock".to_string()));
            run_ok(&server, dir);
            let done = Finished {
                rows: s3_rows(&server, &out),
                quarantine: quarantined(dir),
                offsets: offsets(s3_log(&chk)),
            };
            assert_eq!(done, reference, "{label}");
        }
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
    let held = checkpoint(&server, "s3://chk/held");
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
    let chk = checkpoint(&server, "s3://chk/with-options");
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
