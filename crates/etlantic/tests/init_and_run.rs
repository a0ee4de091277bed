//! `etlantic init` in an empty folder, then `etlantic run`: the example works end to end.

mod common;

use common::*;
use etlantic::scaffold::{EXPECTED_OUTPUT, FILES};

#[test]
fn init_then_run_writes_the_expected_output() {
    let p = Project::empty();
    let init = p.run(&["init"]);
    init.ok();
    for (rel, content) in FILES {
        assert_eq!(&p.read(rel), content, "{rel} as scaffolded");
        assert!(
            init.stdout.contains(rel),
            "init lists {rel}:\n{}",
            init.stdout
        );
    }
    assert!(!p.exists("out"), "init runs nothing");

    p.run(&["validate"]).ok();
    let run = p.run(&["run"]);
    run.ok();
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED_OUTPUT);
    assert!(run.stdout.contains("succeeded"), "{}", run.stdout);
    assert!(
        run.stdout.contains("7 rows read, 2 quarantined"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("3 rows written"), "{}", run.stdout);

    // The two bad records, with code, reason, file and line.
    let q = p.jsonl("out/quarantine.jsonl");
    assert_eq!(q.len(), 2, "{q:#?}");
    assert_eq!(q[0]["code"], "ETL702", "wrong type: {:#}", q[0]);
    assert_eq!(q[0]["field"], "amount");
    assert!(
        q[0]["reason"].as_str().unwrap().contains("fifty"),
        "{:#}",
        q[0]
    );
    assert_eq!(q[0]["position"]["file"], "data/orders.jsonl");
    assert_eq!(q[0]["position"]["line"], 6);
    assert_eq!(q[0]["position"]["asset"], "orders");
    assert!(q[0]["raw"].as_str().unwrap().contains("\"order_id\": 6"));
    assert_eq!(q[1]["code"], "ETL701", "unparsable: {:#}", q[1]);
    assert!(!q[1]["reason"].as_str().unwrap().is_empty());
    assert_eq!(q[1]["position"]["file"], "data/orders.jsonl");
    assert_eq!(q[1]["position"]["line"], 8);
    for r in &q {
        assert!(r["run_id"].is_string());
    }
}

#[test]
fn run_report_as_json_counts_rows_read_quarantined_and_written() {
    let p = Project::init();
    let r = p.run(&["run", "--format", "json"]);
    r.ok();
    let report = r.stdout_json();
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["pipeline"], "customer_revenue");
    assert_eq!(report["mode"], "batch");
    assert_eq!(report["sources"][0]["id"], "orders");
    assert_eq!(report["sources"][0]["rows"], 7);
    assert_eq!(report["sources"][0]["rejected"], 2);
    assert_eq!(report["sinks"][0]["id"], "write_revenue");
    assert_eq!(report["sinks"][0]["rows"], 3);
    assert_eq!(report["quarantined"], 2);
    assert_eq!(report["quarantine"], "out/quarantine.jsonl");
    assert!(report["fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(report.get("errors").is_none(), "{report:#}");
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED_OUTPUT);
}

#[test]
fn init_into_a_new_directory_and_run_from_elsewhere() {
    let parent = Project::empty();
    parent.run(&["init", "proj"]).ok();
    assert!(parent.exists("proj/pipeline.yaml"));
    // Relative paths resolve against the pipeline's directory, not the working directory.
    parent
        .run(&[
            "run",
            "proj/pipeline.yaml",
            "--profile",
            "proj/profiles/local.yaml",
        ])
        .ok();
    assert_eq!(
        parent.read("proj/out/customer_revenue.csv"),
        EXPECTED_OUTPUT
    );
    assert!(!parent.exists("out"));
}

#[test]
fn init_refuses_to_overwrite_a_project() {
    let p = Project::init();
    p.write("pipeline.yaml", "# mine\n");
    p.write("data/orders.jsonl", "{}\n");
    let r = p.run(&["init"]);
    assert_ne!(r.code, exit::OK, "{r:?}");
    r.expect_code(exit::EXECUTION_FAILED);
    assert!(r.stderr.contains("ETL706"), "{}", r.stderr);
    assert!(r.stderr.contains("refusing to overwrite"), "{}", r.stderr);
    assert_eq!(p.read("pipeline.yaml"), "# mine\n", "left untouched");
    assert_eq!(p.read("data/orders.jsonl"), "{}\n", "left untouched");
}

#[test]
fn version_and_usage_errors() {
    let p = Project::empty();
    let v = p.run(&["--version"]);
    v.ok();
    assert!(v.stdout.starts_with("etlantic "), "{}", v.stdout);
    p.run(&["frobnicate"]).expect_code(exit::USAGE);
    p.run(&["validate", "--format", "xml"])
        .expect_code(exit::USAGE);
    p.run(&["generate", "rdf"]).expect_code(exit::USAGE);
    // A pipeline file that does not exist is a load error (ETL001), not a crash.
    let r = p.run(&["validate", "nope.yaml", "--format", "json"]);
    r.expect_code(exit::INVALID_PIPELINE);
    assert_eq!(error_codes(&r.stdout_json()), vec!["ETL001"]);
}

/// The windows in the streaming template's sink as `HH:MM page views`, sorted.
fn windows(p: &Project) -> Vec<String> {
    let batches =
        etlantic_sinks::files::read_committed(p.path().join("out/views_per_page")).unwrap();
    let mut rows: Vec<String> = json_rows(&batches)
        .iter()
        .map(|v| {
            let start = v["window_start"].as_str().unwrap();
            let hhmm = &start[start.find('T').unwrap() + 1..][..5];
            format!("{hhmm} {} {}", v["page"].as_str().unwrap(), v["views"])
        })
        .collect();
    rows.sort();
    rows
}

fn quarantine_codes(p: &Project) -> Vec<String> {
    let mut codes: Vec<String> = p
        .read("out/quarantine.jsonl")
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["code"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    codes.sort();
    codes
}

#[test]
fn the_streaming_template_runs_in_two_steps() {
    use etlantic::scaffold::{STREAMING_EXPECTED_STEP1, STREAMING_EXPECTED_STEP2, STREAMING_FILES};
    let p = Project::empty();
    let init = p.run(&["init", "--template", "streaming"]);
    init.ok();
    for (rel, content) in STREAMING_FILES {
        assert_eq!(&p.read(rel), content, "{rel} as scaffolded");
    }
    assert!(init.stdout.contains("samples/step2"), "{}", init.stdout);
    p.run(&["validate"]).ok();

    // Step 1: two files; the first window closes; the bad time is quarantined.
    let run = p.run(&["run"]);
    run.ok();
    assert_eq!(windows(&p), STREAMING_EXPECTED_STEP1);
    assert_eq!(quarantine_codes(&p), ["ETL702"]);
    let status = p.run(&["status", "--format", "json"]);
    status.ok();
    let s = status.stdout_json();
    assert_eq!(s["state"], "stopped");
    assert_eq!(s["applicationId"], "views-local");

    // Step 2: the third file; the query goes on from its checkpoint.
    std::fs::rename(
        p.path().join("samples/step2/003.jsonl"),
        p.path().join("data/views/003.jsonl"),
    )
    .unwrap();
    p.run(&["run"]).ok();
    assert_eq!(windows(&p), STREAMING_EXPECTED_STEP2);
    assert_eq!(quarantine_codes(&p), ["ETL701", "ETL702", "ETL708"]);
    p.run(&["report", "-o", "report.html"]).ok();
    assert!(p.exists("report.html"));
}
