//! The backend-equivalence corpus on every backend of the workspace, PostgreSQL
//! included (the server on 127.0.0.1:5432; `ETLANTIC_TEST_POSTGRES` overrides the URL).
//! Prints the support matrix; fails on any case a backend claims and gets wrong.

use etlantic_testkit::equivalence::{corpus_dir, standard_backends, Case, Matrix, Outcome};

fn postgres_url() -> String {
    std::env::var("ETLANTIC_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_is_equal_on_every_backend_that_claims_it() {
    let cases = Case::load_dir(&corpus_dir()).expect("corpus loads");
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    let backends = standard_backends(Some(&postgres_url())).expect("backends");
    let matrix = Matrix::run(&cases, &backends).await;
    println!("{}", matrix.render());
    let failures = matrix.failures();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The reference engine runs every case: a case it cannot run is a corpus error.
    for (case, outcomes) in &matrix.rows {
        assert_eq!(outcomes[0], Outcome::Pass, "{case} on datafusion");
    }
    // Every other backend passes most of the corpus (a regression that turns a whole
    // backend into "unsupported" would otherwise go unnoticed).
    for (i, b) in matrix.backends.iter().enumerate() {
        let passed = matrix
            .rows
            .iter()
            .filter(|(_, o)| o[i] == Outcome::Pass)
            .count();
        assert!(
            passed * 2 >= cases.len(),
            "{b} passes only {passed} of {} cases",
            cases.len()
        );
    }
}

/// Every transformation with portable steps in every example pipeline
/// (`examples/*/pipeline.yaml`) is run by a case of the corpus (`from:`), so the
/// examples are checked on every backend too.
#[test]
fn every_example_pipeline_is_in_the_corpus() {
    let cases = Case::load_dir(&corpus_dir()).expect("corpus loads");
    let examples = corpus_dir().join("../../../examples");
    let mut missing = Vec::new();
    let mut found = 0;
    for entry in std::fs::read_dir(&examples).expect("examples/") {
        let file = entry.unwrap().path().join("pipeline.yaml");
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let pipeline: etlantic_core::model::Pipeline =
            serde_yaml::from_str(&text).expect("an example pipeline parses");
        let example = file.parent().unwrap().file_name().unwrap().to_owned();
        for t in pipeline.transforms.iter().filter(|t| t.steps.is_some()) {
            found += 1;
            let covered = cases.iter().any(|c| {
                c.from.as_ref().is_some_and(|r| {
                    r.transform == t.id
                        && std::path::Path::new(&r.pipeline)
                            .parent()
                            .and_then(|p| p.file_name())
                            == Some(example.as_os_str())
                })
            });
            if !covered {
                missing.push(format!("{}: {}", example.to_string_lossy(), t.id));
            }
        }
    }
    assert!(found >= 3, "{found} example transformations");
    assert!(missing.is_empty(), "not in the corpus: {missing:?}");
}
