//! The Spark conformance corpus (`../shared/conformance/spark`, recorded from Apache
//! Spark) on the embedded streaming runtime: every scenario must pass, stream-stream and
//! stream-static joins included (their join state rows and late-row counts are compared
//! with Spark's too).
//!
//! The newer recordings in `../shared/conformance/spark-pending` run too.
//!
//! `NOT_YET` lists scenarios a runtime feature is still missing for: they must be
//! reported as failed (never skipped). It is empty: both folders pass.

use etlantic_testkit::conformance::run_dir;
use std::path::Path;

use etlantic_sinks as _;
use etlantic_sources as _;

const NOT_YET: &[&str] = &[];

fn shared(folder: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/conformance")
        .join(folder)
}

/// Runs every scenario of `dir`; returns how many ran.
async fn corpus(dir: std::path::PathBuf) -> usize {
    assert!(
        dir.is_dir(),
        "the conformance corpus is missing at {}",
        dir.display()
    );
    let outcomes = run_dir(&dir).await.expect("corpus runs");
    let mut problems = Vec::new();
    for o in &outcomes {
        let expected_to_pass = !NOT_YET.contains(&o.name.as_str());
        if expected_to_pass && !o.passed {
            problems.push(format!("{}\n  {}", o.line(), o.problems.join("\n  ")));
        }
        if !expected_to_pass {
            assert!(!o.passed, "{} passes now: remove it from NOT_YET", o.name);
            assert!(
                !o.problems.is_empty(),
                "{} failed without saying why",
                o.name
            );
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    outcomes.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_corpus() {
    let n = corpus(shared("spark")).await;
    assert!(n >= 19, "only {n} scenarios found");
}

/// The newer recordings (watermarks after filters and null join keys, dedup over a
/// union): they joined once the runtime measured watermarks where Spark does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_pending_corpus() {
    let n = corpus(shared("spark-pending")).await;
    assert!(n >= 5, "only {n} scenarios found");
}

/// The corpus — Spark's recordings and the generated `spark-diff` scenarios — with the
/// operators' state in the disk store (RocksDB): every scenario gives Spark's rows —
/// deduplications, tumbling, sliding and session windows, group-bys in every output
/// mode, stream-stream joins of every type, and stateless queries (the store is then
/// never opened).
#[cfg(feature = "disk-state")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_corpus_on_the_disk_store() {
    std::hint::black_box(&etlantic_rocksdb::DiskStoreProvider);
    let mut passed = Vec::new();
    let mut problems = Vec::new();
    let spark_diff =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/spark-diff");
    for dir in [shared("spark"), shared("spark-pending"), spark_diff] {
        for o in etlantic_testkit::conformance::runner::run_dir_on(&dir, "disk")
            .await
            .expect("corpus runs")
        {
            if o.passed {
                passed.push(o.name.clone());
            } else {
                problems.push(format!("{}\n  {}", o.line(), o.problems.join("\n  ")));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for must in [
        "dedup_ts_in_key",
        "dedup_within_watermark",
        "tumbling_append_late",
        "tumbling_update_late",
        "tumbling_complete_no_watermark",
        "sliding_append",
        "groupby_complete_no_window",
        "project_filter_basic",
        "ss_join_inner",
        "ss_join_left_outer",
        "min_join_null_key_watermark",
        "min_left_outer_null_right_key_watermark",
        "session_append",
    ] {
        assert!(
            passed.iter().any(|p| p == must),
            "{must} must pass on disk: {passed:?}"
        );
    }
    let joins = passed
        .iter()
        .filter(|p| p.contains("stream_stream_join"))
        .count();
    assert!(joins >= 19, "only {joins} generated joins passed on disk");
    assert!(passed.len() >= 19 + 5 + 47, "{} passed", passed.len());
}

/// The scenarios `cargo xtask spark-diff` generated and recorded from a local Spark
/// (`tests/conformance/spark-diff/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_diff_corpus() {
    let n =
        corpus(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/spark-diff"))
            .await;
    assert!(n >= 40, "only {n} scenarios found");
}

/// The same key from both inputs of a union in one micro-batch: Spark keeps the first
/// input's row, on every run and every number of threads. Run many times, because a
/// reordering race shows only sometimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedup_over_a_union_keeps_the_first_inputs_row_every_time() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../../shared/conformance/spark-pending/min_union_dedup_tskey_drop_duplicates.json",
    );
    for run in 0..25 {
        let o = etlantic_testkit::conformance::runner::run_scenario(&path).await;
        assert!(
            o.passed,
            "run {run}: {}\n  {}",
            o.line(),
            o.problems.join("\n  ")
        );
    }
}

/// Scenarios the Spark backend cannot run yet through ETLantic's plan; they must fail
/// (never be skipped), with a reason.
const NOT_YET_ON_SPARK: &[&str] = &[];

/// The same corpus through ETLantic's plan on real Apache Spark (a local Spark Connect
/// server from the `pyspark` package): Spark must reproduce its own recording.
#[test]
fn spark_corpus_on_real_spark() {
    let server = etlantic_spark_compat::local::LocalSparkConnect::start()
        .expect("a local Spark Connect server (`cargo xtask setup` installs pyspark)");
    let mut outcomes = Vec::new();
    for (folder, at_least) in [("spark", 19), ("spark-pending", 5)] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/conformance")
            .join(folder);
        let found = etlantic_testkit::conformance::on_spark::run_dir_on_spark(&dir, &server.url())
            .expect("corpus runs");
        assert!(
            found.len() >= at_least,
            "only {} scenarios in {folder}",
            found.len()
        );
        outcomes.extend(found);
    }
    let mut problems = Vec::new();
    for o in &outcomes {
        println!("{}", o.line());
        let expected_to_pass = !NOT_YET_ON_SPARK.contains(&o.name.as_str());
        if expected_to_pass && !o.passed {
            problems.push(format!("{}\n  {}", o.line(), o.problems.join("\n  ")));
        }
        if !expected_to_pass {
            assert!(
                !o.passed,
                "{} passes now: remove it from NOT_YET_ON_SPARK",
                o.name
            );
            assert!(
                !o.problems.is_empty(),
                "{} failed without saying why",
                o.name
            );
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
