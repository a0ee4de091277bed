//! Interchange with the contract standards and with ETLantic-py:
//! - `generate odcs|dtcs|dpcs` writes documents that reload with the odcs, dtcs and dpcs
//!   crates (and, where the ETLantic-py virtualenv exists, load in ETLantic-py);
//! - every ETLantic-py fixture plan runs through a pipeline (`plan:` pointing at it) and
//!   produces ETLantic-py's rows.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                out.extend(files_under(&e.path()));
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

fn generate_all(p: &Project) {
    for kind in ["odcs", "dtcs", "dpcs"] {
        let r = p.run(&["generate", kind, "-o", "generated"]);
        r.ok();
        assert!(r.stdout.contains("wrote "), "{}", r.stdout);
    }
}

#[test]
fn generated_documents_reload_with_the_standards_crates() {
    let p = Project::init();
    generate_all(&p);
    let g = p.join("generated");
    let rel: Vec<String> = files_under(&g)
        .iter()
        .map(|f| {
            f.strip_prefix(&g)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    assert_eq!(
        rel,
        vec![
            "data/customer_revenue.odcs.yaml",
            "data/orders.odcs.yaml",
            "data/revenue_output.odcs.yaml",
            "pipelines/customer_revenue.dpcs.yaml",
            "transformations/customer_revenue.revenue.dtcs.yaml",
            "transformations/customer_revenue.revenue.transform-plan.json",
        ]
    );

    // ODCS: strict parse and validation by the `odcs` crate (through Contract::parse).
    for f in ["orders", "customer_revenue", "revenue_output"] {
        let rel = format!("generated/data/{f}.odcs.yaml");
        let c = etlantic::core::contract::Contract::parse(&p.read(&rel), &rel, None)
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(!c.fields.is_empty());
    }
    // The asset contracts come back as written in the project.
    let orders = etlantic::core::contract::Contract::parse(
        &p.read("generated/data/orders.odcs.yaml"),
        "gen",
        None,
    )
    .unwrap();
    let source = etlantic::core::contract::Contract::parse(
        &p.read("contracts/orders.odcs.yaml"),
        "src",
        None,
    )
    .unwrap();
    assert_eq!(orders.arrow_schema(), source.arrow_schema());
    assert_eq!(orders.canonical_json(), source.canonical_json());

    // DTCS: the transformation contract validates; the transform plan loads and has the
    // fingerprint the pipeline plan records.
    let dtcs_text = p.read("generated/transformations/customer_revenue.revenue.dtcs.yaml");
    let contract = dtcs::parse(dtcs_text.as_bytes(), dtcs::DocumentFormat::Yaml)
        .into_contract()
        .unwrap_or_else(|r| {
            panic!(
                "DTCS contract does not parse: {:?}",
                r.errors()
                    .iter()
                    .map(|d| d.message.clone())
                    .collect::<Vec<_>>()
            )
        });
    assert!(dtcs::validate(&contract).is_valid());
    let plan_text =
        p.read("generated/transformations/customer_revenue.revenue.transform-plan.json");
    let tp = etlantic::core::ir::TransformPlan::from_json(plan_text.as_bytes(), "tp")
        .unwrap_or_else(|e| panic!("{e}"));
    let planned = p.run(&["plan"]);
    planned.ok();
    let pipeline_plan = planned.stdout_json();
    assert_eq!(
        pipeline_plan["transforms"][0]["logic"]["dtcsFingerprint"],
        tp.fingerprint().as_str()
    );
    let v: Value = serde_json::from_str(&plan_text).unwrap();
    assert_eq!(v["planIdentity"], "dtcs.transform-plan/2");

    // DPCS: parses and validates with the `dpcs` crate.
    let dpcs_text = p.read("generated/pipelines/customer_revenue.dpcs.yaml");
    let doc = dpcs::parse_yaml(&dpcs_text).unwrap_or_else(|e| panic!("{e}"));
    let report = dpcs::validate(&doc);
    assert!(
        report.is_valid(),
        "{:?}",
        report
            .errors()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    );
    let y: Value = serde_yaml::from_str(&dpcs_text).unwrap();
    assert_eq!(y["interface"]["inputs"][0]["id"], "orders");
    assert_eq!(y["interface"]["outputs"][0]["id"], "write_revenue");
    assert_eq!(y["steps"][0]["id"], "revenue");
    // Every contract reference resolves to a generated file.
    for r in y["contractReferences"].as_array().unwrap() {
        let loc = r["location"].as_str().unwrap();
        assert!(p.exists(&format!("generated/{loc}")), "{loc}");
    }
}

const PY: &str = "/root/.cache/etlantic-py-venv/bin/python";

/// Runs ETLantic-py's load check on a document; `None` when the virtualenv is absent.
fn py_load_check(doc: &Path, extra: &[&str]) -> Option<std::process::Output> {
    if !Path::new(PY).exists() {
        return None;
    }
    let script = repo_root().join("scripts/etlantic_py_load_check.py");
    Some(
        std::process::Command::new(PY)
            .arg(script)
            .arg("--strict")
            .args(extra)
            .arg(doc)
            .output()
            .expect("python runs"),
    )
}

#[test]
fn generated_transform_plan_and_dpcs_load_in_etlantic_py() {
    // Never a silent pass: `cargo xtask ci` (and `cargo xtask setup`) create the
    // virtualenv; without it this test fails and says how to make it.
    assert!(
        Path::new(PY).exists(),
        "{PY} does not exist, so ETLantic-py cannot check the generated documents: run `cargo xtask setup` (or see tests/fixtures/etlantic-py/README.md)"
    );
    let p = Project::init();
    generate_all(&p);
    let plan = p.join("generated/transformations/customer_revenue.revenue.transform-plan.json");
    // Load, and run on the example's good rows against the expected result.
    let good: String = p
        .read("data/orders.jsonl")
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != 5 && *i != 7)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    p.write("good_orders.jsonl", &good);
    let input = format!("orders={}", p.join("good_orders.jsonl").display());
    p.write(
        "expected.jsonl",
        "{\"customer\": \"acme\", \"orders\": 3, \"revenue\": 245.5}\n{\"customer\": \"globex\", \"orders\": 2, \"revenue\": 80.0}\n{\"customer\": \"initech\", \"orders\": 1, \"revenue\": 19.99}\n",
    );
    let expected = p.join("expected.jsonl");
    for (doc, extra) in [
        (plan.clone(), vec![]),
        (
            plan.clone(),
            vec![
                "--input",
                input.as_str(),
                "--expected",
                expected.to_str().unwrap(),
            ],
        ),
        (
            p.join("generated/pipelines/customer_revenue.dpcs.yaml"),
            vec![],
        ),
        (
            p.join("generated/transformations/customer_revenue.revenue.dtcs.yaml"),
            vec![],
        ),
        (p.join("generated/data/orders.odcs.yaml"), vec![]),
    ] {
        let out = py_load_check(&doc, &extra).expect("checked above");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "ETLantic-py refuses {} {extra:?}:\n{text}",
            doc.display()
        );
        assert!(text.contains("LOADS"), "{text}");
    }
}

/// Runs one ETLantic-py fixture through a pipeline and compares with its expected rows.
fn check_fixture(name: &str) {
    let p = plan_project(name, None, true);
    let r = p.run(&["run", "--format", "json"]);
    r.ok();
    let report = r.stdout_json();
    assert_eq!(report["quarantined"], 0, "{name}: {report:#}");
    let actual = p.jsonl("out/result.jsonl");
    let expected = jsonl(&p.read("expected/result.jsonl"));
    let entry = manifest_entry(name);
    assert_eq!(
        expected.len() as u64,
        entry["expected_rows"].as_u64().unwrap()
    );
    assert_eq!(report["sinks"][0]["rows"], expected.len() as u64, "{name}");
    let keys = |r: &Value| r.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&actual[0]), keys(&expected[0]), "{name}: columns");
    let mut a: Vec<Value> = actual.iter().map(normalize).collect();
    let mut e: Vec<Value> = expected.iter().map(normalize).collect();
    if entry["ordered"] != Value::Bool(true) {
        a.sort_by_key(|v| v.to_string());
        e.sort_by_key(|v| v.to_string());
    }
    assert_eq!(a, e, "{name}");
    // The plan the run executed is the fixture's plan, unchanged.
    let plan = p.run(&["plan"]);
    plan.ok();
    let fixture_plan: Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    assert_eq!(
        plan.stdout_json()["transforms"][0]["logic"]["plan"],
        fixture_plan,
        "{name}: the plan is embedded as written by ETLantic-py"
    );
}

fn manifest_entry(name: &str) -> Value {
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("manifest.json")).unwrap(),
    )
    .unwrap();
    m["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap()
        .clone()
}

#[test]
fn every_etlantic_py_fixture_plan_runs_through_a_pipeline() {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("plan.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut ran = Vec::new();
    for name in &names {
        if name == "unsupported_field_arithmetic" {
            continue; // no contracts or expected output; see the test below
        }
        check_fixture(name);
        ran.push(name.as_str());
    }
    assert_eq!(
        ran,
        vec![
            "customer_totals",
            "filter_enrich_orders",
            "orders_left_join_customers",
            "publish_customers",
            "top_orders",
            "unique_user_events",
        ]
    );
}

/// ETLantic-py emits this plan but refuses to run it locally (field arithmetic); it has
/// no contracts or expected output. We run it through a pipeline with contracts written
/// here: `amount` is doubled in place.
#[test]
fn the_unsupported_field_arithmetic_fixture_runs_here() {
    let p = Project::empty();
    copy_dir(
        &fixtures_dir().join("unsupported_field_arithmetic"),
        p.path(),
    );
    let contract = |id: &str| {
        format!(
            "version: \"1.0.0\"\napiVersion: \"v3.1.0\"\nkind: \"DataContract\"\nid: \"{id}\"\nname: \"{id}\"\nstatus: \"active\"\nschema:\n  - name: \"{id}\"\n    logicalType: \"object\"\n    properties:\n      - {{name: \"order_id\", logicalType: \"integer\"}}\n      - {{name: \"customer_id\", logicalType: \"integer\"}}\n      - {{name: \"amount\", logicalType: \"number\"}}\n      - {{name: \"status\", logicalType: \"string\"}}\n"
        )
    };
    p.write("contracts/order.odcs.yaml", &contract("order"));
    p.write("contracts/doubled.odcs.yaml", &contract("doubled"));
    p.write(
        "pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: double\nassets:\n  orders: {contract: contracts/order.odcs.yaml}\n  doubled: {contract: contracts/doubled.odcs.yaml}\nsources:\n  - {id: orders, asset: orders}\ntransforms:\n  - id: double\n    inputs: {orders: orders}\n    plan: plan.json\nsinks:\n  - {id: out, input: double, asset: doubled}\n",
    );
    p.write(
        "profiles/local.yaml",
        "apiVersion: etlantic/v1\nkind: Profile\nname: local\nbindings:\n  orders: file://input/orders.jsonl\n  doubled: file://out/result.jsonl\n",
    );
    p.run(&["run"]).ok();
    let rows: Vec<Value> = p.jsonl("out/result.jsonl").iter().map(normalize).collect();
    assert_eq!(
        rows,
        vec![
            normalize(
                &serde_json::json!({"order_id": 1, "customer_id": 10, "amount": 241.0, "status": "paid"})
            ),
            normalize(
                &serde_json::json!({"order_id": 2, "customer_id": 10, "amount": 30.0, "status": "paid"})
            ),
        ]
    );
}
