//! The Spark conformance corpus (`../shared/conformance/spark`, recorded from Apache
//! Spark) on the embedded streaming runtime: every scenario must pass, stream-stream and
//! stream-static joins included (their join state rows and late-row counts are compared
//! with Spark's too).
//!
//! `NOT_YET` lists scenarios a runtime feature is still missing for: they must be
//! reported as failed (never skipped). It is empty: the whole corpus passes.

use etlantic_testkit::conformance::run_dir;
use std::path::Path;

use etlantic_sinks as _;
use etlantic_sources as _;

const NOT_YET: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/spark");
    assert!(
        dir.is_dir(),
        "the conformance corpus is missing at {}",
        dir.display()
    );
    let outcomes = run_dir(&dir).await.expect("corpus runs");
    assert!(
        outcomes.len() >= 19,
        "only {} scenarios found",
        outcomes.len()
    );
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
}

/// Scenarios the Spark backend cannot run yet through ETLantic's plan; they must fail
/// (never be skipped), with a reason.
const NOT_YET_ON_SPARK: &[&str] = &[];

/// The same corpus through ETLantic's plan on real Apache Spark (a local Spark Connect
/// server from the `pyspark` package): Spark must reproduce its own recording.
#[test]
fn spark_corpus_on_real_spark() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/spark");
    let server = etlantic_spark_compat::local::LocalSparkConnect::start()
        .expect("a local Spark Connect server (`cargo xtask setup` installs pyspark)");
    let outcomes = etlantic_testkit::conformance::on_spark::run_dir_on_spark(&dir, &server.url())
        .expect("corpus runs");
    assert!(outcomes.len() >= 19, "only {} scenarios", outcomes.len());
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
