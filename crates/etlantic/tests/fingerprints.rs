//! The plan fingerprint is identical from two working directories, across runs and after
//! YAML → plan → YAML (`plan --emit-pipeline`); `run` executes exactly the plan `plan`
//! prints, `run --plan` runs a saved plan, and a hand-edited plan is refused (ETL901).

mod common;

use common::*;
use etlantic::scaffold::EXPECTED_OUTPUT;
use serde_json::Value;

#[test]
fn same_fingerprint_from_different_working_directories() {
    let parent = Project::empty();
    parent.run(&["init", "proj"]).ok();
    let proj = parent.join("proj");
    let abs_pipeline = proj.join("pipeline.yaml");
    let abs_profile = proj.join("profiles/local.yaml");

    let in_project = plan_fingerprint(&proj, &["plan"]);
    let from_parent = plan_fingerprint(parent.path(), &["plan", "proj/pipeline.yaml"]);
    let elsewhere = Project::empty();
    let absolute = plan_fingerprint(
        elsewhere.path(),
        &[
            "plan",
            abs_pipeline.to_str().unwrap(),
            "--profile",
            abs_profile.to_str().unwrap(),
        ],
    );
    let from_subdir = {
        std::fs::create_dir_all(proj.join("data/sub")).unwrap();
        plan_fingerprint(&proj.join("data/sub"), &["plan", "../../pipeline.yaml"])
    };
    assert_eq!(in_project, from_parent);
    assert_eq!(in_project, absolute);
    assert_eq!(in_project, from_subdir);

    // The whole plan is the same bytes, not only the fingerprint.
    let a = etlantic(&proj, &["plan"]).stdout;
    let b = etlantic(elsewhere.path(), &["plan", abs_pipeline.to_str().unwrap()]).stdout;
    assert_eq!(a, b);
    assert!(
        !a.contains(parent.path().to_str().unwrap()),
        "no absolute path in the plan"
    );

    // A profile outside the project: the plan records where it is relative to the project
    // (no absolute path), and the fingerprint does not depend on it.
    let outside = Project::empty();
    std::fs::copy(&abs_profile, outside.join("stream.yaml")).unwrap();
    let r = etlantic(
        &proj,
        &[
            "plan",
            "--profile",
            outside.join("stream.yaml").to_str().unwrap(),
        ],
    );
    r.ok();
    let plan = r.stdout_json();
    let recorded = plan["provenance"]["profileFile"].as_str().unwrap();
    assert!(
        recorded.starts_with("../") && recorded.ends_with("/stream.yaml"),
        "{recorded}"
    );
    assert!(!recorded.contains("//"), "{recorded}");
    assert!(
        !r.stdout.contains(outside.path().to_str().unwrap()),
        "no absolute path"
    );
    assert_eq!(plan["fingerprint"].as_str().unwrap(), in_project);

    // A copy of the project somewhere else plans the same.
    let copy = Project::empty();
    copy_dir(&proj, copy.path());
    assert_eq!(plan_fingerprint(copy.path(), &["plan"]), in_project);
}

#[test]
fn same_fingerprint_across_runs_and_equal_to_the_plan() {
    let p = Project::init();
    let planned = plan_fingerprint(p.path(), &["plan"]);
    assert_eq!(plan_fingerprint(p.path(), &["plan"]), planned);
    let mut run_ids = Vec::new();
    for _ in 0..2 {
        let r = p.run(&["run", "--format", "json"]);
        r.ok();
        let report = r.stdout_json();
        assert_eq!(report["fingerprint"], planned.as_str());
        run_ids.push(report["run_id"].as_str().unwrap().to_string());
    }
    assert_ne!(run_ids[0], run_ids[1], "each run has its own id");
    let human = p.run(&["run"]);
    human.ok();
    assert!(human.stdout.contains(&planned), "{}", human.stdout);
    assert_eq!(plan_fingerprint(p.path(), &["plan"]), planned);
    // The fingerprint covers the content: it changes with the pipeline.
    p.edit("pipeline.yaml", "status != 'cancelled'", "status == 'paid'");
    assert_ne!(plan_fingerprint(p.path(), &["plan"]), planned);
}

#[test]
fn yaml_plan_yaml_keeps_the_fingerprint() {
    let p = Project::init();
    let plan = p.run(&["plan", "-o", "plan.json", "--emit-pipeline", "emitted.yaml"]);
    plan.ok();
    let original: Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    let yaml = p.read("emitted.yaml");
    // Self-contained: contracts and the DTCS plan are inline, no file reference left.
    assert!(!yaml.contains("contracts/"), "{yaml}");
    assert!(yaml.contains("dtcs.transform-plan/2"), "{yaml}");
    let doc: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(doc["name"], "customer_revenue");
    assert_eq!(doc["sources"][0]["id"], "orders");
    assert_eq!(doc["transforms"][0]["id"], "revenue");
    assert_eq!(doc["transforms"][0]["inputs"]["orders"], "orders");
    assert!(doc["transforms"][0]["plan"].is_object());
    assert!(doc["transforms"][0].get("steps").is_none());
    assert_eq!(doc["sinks"][0]["id"], "write_revenue");
    assert_eq!(doc["sinks"][0]["input"], "revenue");
    assert_eq!(doc["assets"]["orders"]["contract"]["id"], "orders");

    // Planning the emitted file with the same profile: the same fingerprint, and the
    // same plan except for where things were read from.
    let again = p.run(&[
        "plan",
        "emitted.yaml",
        "--profile",
        "profiles/local.yaml",
        "--emit-pipeline",
        "emitted2.yaml",
    ]);
    again.ok();
    let replanned = again.stdout_json();
    assert_eq!(replanned["fingerprint"], original["fingerprint"]);
    let strip = |mut v: Value| {
        v.as_object_mut().unwrap().remove("provenance");
        v
    };
    assert_eq!(strip(replanned), strip(original.clone()));
    // A fixed point: emitting again gives the same file, except for its header line.
    let body = |s: String| s.lines().skip(2).collect::<Vec<_>>().join("\n");
    assert_eq!(body(p.read("emitted2.yaml")), body(yaml));

    // And it runs to the same result, from anywhere.
    let elsewhere = Project::empty();
    std::fs::create_dir_all(elsewhere.join("data")).unwrap();
    std::fs::copy(
        p.join("data/orders.jsonl"),
        elsewhere.join("data/orders.jsonl"),
    )
    .unwrap();
    std::fs::copy(p.join("emitted.yaml"), elsewhere.join("pipeline.yaml")).unwrap();
    std::fs::create_dir_all(elsewhere.join("profiles")).unwrap();
    std::fs::copy(
        p.join("profiles/local.yaml"),
        elsewhere.join("profiles/local.yaml"),
    )
    .unwrap();
    let r = elsewhere.run(&["run", "--format", "json"]);
    r.ok();
    assert_eq!(r.stdout_json()["fingerprint"], original["fingerprint"]);
    assert_eq!(elsewhere.read("out/customer_revenue.csv"), EXPECTED_OUTPUT);
}

#[test]
fn yaml_plan_yaml_with_a_plan_file_parameters_sql_and_warnings() {
    // A richer pipeline: a `plan:` file with a parameter, a SQL step, a second source
    // that feeds nothing (a warning, which the plan keeps), sink settings.
    let p = Project::empty();
    copy_dir(&fixtures_dir().join("filter_enrich_orders"), p.path());
    p.write(
        "pipeline.yaml",
        r#"apiVersion: etlantic/v1
kind: Pipeline
name: rich
description: A plan file with a parameter, a SQL step and an unused source.
assets:
  orders: {contract: contracts/data/order.odcs.yaml}
  summary: {contract: contracts/data/ordersummary.odcs.yaml}
  summary_copy: {contract: contracts/data/ordersummary.odcs.yaml}
sources:
  - {id: orders, asset: orders}
  - {id: unused, asset: orders}
transforms:
  - id: enrich
    inputs: {orders: orders}
    plan: plan.json
    parameters: {min_amount: 20}
  - id: copy
    inputs: {enrich: enrich}
    sql: {query: "SELECT * FROM enrich"}
sinks:
  - {id: write_summary, input: enrich, asset: summary, write_mode: overwrite}
  - {id: write_copy, input: copy, asset: summary_copy}
"#,
    );
    p.write(
        "profiles/local.yaml",
        "apiVersion: etlantic/v1\nkind: Profile\nname: local\nbindings:\n  orders: file://input/orders.jsonl\n  summary: file://out/summary.jsonl\n  summary_copy: file://out/copy.jsonl\n",
    );
    let plan = p.run(&["plan", "--emit-pipeline", "emitted.yaml"]);
    plan.ok();
    let original = plan.stdout_json();
    assert!(
        original["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|d| d["code"] == "ETL106")),
        "expected an unused-source warning: {original:#}"
    );
    assert_eq!(original["transforms"][1]["logic"]["kind"], "sql");
    assert_eq!(
        original["transforms"][0]["logic"]["parameters"]["min_amount"],
        20
    );
    let emitted = p.read("emitted.yaml");
    assert!(emitted.contains("min_amount: 20"), "{emitted}");
    assert!(emitted.contains("SELECT * FROM enrich"), "{emitted}");
    assert!(emitted.contains("id: unused"), "{emitted}");

    let replanned = p.run(&["plan", "emitted.yaml", "-p", "profiles/local.yaml"]);
    replanned.ok();
    assert_eq!(
        replanned.stdout_json()["fingerprint"],
        original["fingerprint"],
        "emitted:\n{emitted}"
    );
    // Both run to the same outputs.
    p.run(&["run"]).ok();
    let first = (p.read("out/summary.jsonl"), p.read("out/copy.jsonl"));
    assert_eq!(jsonl(&first.0).len(), 4);
    assert_eq!(first.0, first.1);
    std::fs::remove_dir_all(p.join("out")).unwrap();
    p.run(&["run", "emitted.yaml", "-p", "profiles/local.yaml"])
        .ok();
    assert_eq!(
        (p.read("out/summary.jsonl"), p.read("out/copy.jsonl")),
        first
    );
}

#[test]
fn run_plan_runs_a_saved_plan_and_refuses_an_edited_one() {
    let p = Project::init();
    let plan = p.run(&["plan", "-o", "plan.json"]);
    plan.ok();
    let saved: Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    let fp = saved["fingerprint"].as_str().unwrap().to_string();
    // The plan goes to the file only; the terminal names the file and the fingerprint.
    assert_eq!(
        plan.stdout.trim(),
        format!("wrote the plan to plan.json ({fp})")
    );

    // Runs exactly that plan, even without the pipeline and contract files.
    std::fs::remove_file(p.join("pipeline.yaml")).unwrap();
    std::fs::remove_dir_all(p.join("contracts")).unwrap();
    let r = p.run(&["run", "--plan", "plan.json", "--format", "json"]);
    r.ok();
    assert_eq!(r.stdout_json()["fingerprint"], fp.as_str());
    assert_eq!(r.stdout_json()["quarantined"], 2);
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED_OUTPUT);

    // From another directory: relative bindings resolve against the plan's directory,
    // or against --root.
    std::fs::remove_dir_all(p.join("out")).unwrap();
    let elsewhere = Project::empty();
    let plan_path = p.join("plan.json");
    elsewhere
        .run(&["run", "--plan", plan_path.to_str().unwrap()])
        .ok();
    assert_eq!(p.read("out/customer_revenue.csv"), EXPECTED_OUTPUT);
    assert!(!elsewhere.exists("out"));
    std::fs::copy(&plan_path, elsewhere.join("moved.json")).unwrap();
    elsewhere
        .run(&[
            "run",
            "--plan",
            "moved.json",
            "--root",
            p.path().to_str().unwrap(),
        ])
        .ok();

    // Reformatting is not editing: compact JSON with the same content is accepted.
    let v: Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    p.write("compact.json", &serde_json::to_string(&v).unwrap());
    p.run(&["run", "--plan", "compact.json"]).ok();
    p.run(&["explain", "--plan", "compact.json"]).ok();

    // A hand edit that changes what runs is refused, by run, explain and diff.
    let edited = p
        .read("plan.json")
        .replace("\"op\": \"not_eq\"", "\"op\": \"eq\"");
    assert_ne!(edited, p.read("plan.json"));
    p.write("edited.json", &edited);
    std::fs::remove_dir_all(p.join("out")).unwrap();
    for args in [
        &["run", "--plan", "edited.json", "--format", "json"][..],
        &["explain", "--plan", "edited.json"],
        &["diff", "plan.json", "edited.json", "--format", "json"],
    ] {
        let r = p.run(args);
        r.expect_code(exit::PLANNING_FAILED);
        let text = r.all_output();
        assert!(text.contains("ETL901"), "{}: {text}", args.join(" "));
        assert!(text.contains("fingerprint mismatch"), "{text}");
    }
    let r = p.run(&["run", "--plan", "edited.json", "--format", "json"]);
    let d = find_diag(&r.stderr_json(), "ETL901");
    assert_eq!(d["file"], "edited.json");
    assert!(!d["help"].as_str().unwrap().is_empty());
    assert!(!p.exists("out"), "an edited plan runs nothing");

    // Editing the fingerprint to match is not possible by hand; a wrong one is refused.
    let mut v: Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    v["fingerprint"] = Value::String(format!("sha256:{}", "0".repeat(64)));
    p.write("forged.json", &serde_json::to_string_pretty(&v).unwrap());
    p.run(&["run", "--plan", "forged.json"])
        .expect_code(exit::PLANNING_FAILED);
    // Not a plan at all.
    p.write("garbage.json", "{\"hello\": 1}");
    let r = p.run(&["run", "--plan", "garbage.json", "--format", "json"]);
    r.expect_code(exit::PLANNING_FAILED);
    assert_eq!(error_codes(&r.stderr_json()), vec!["ETL901"]);
}
