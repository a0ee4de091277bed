//! The ETLantic-py interop fixtures: each plan, run on the fixture's inputs, produces
//! exactly ETLantic-py's rows.

mod common;

use arrow::datatypes::{Field, Schema};
use common::{rows, run_plan, sorted, table_from_jsonl};
use etlantic_core::ir::types::arrow_type;
use etlantic_core::ir::TransformPlan;
use indexmap::IndexMap;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/etlantic-py")
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(fixtures_dir().join("manifest.json")).unwrap()).unwrap()
}

fn fixture(name: &str) -> Value {
    manifest()["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
        .clone()
}

/// Loads the plan and the inputs (schemas from the plan's input declarations) and runs it.
async fn run_fixture(name: &str) -> etlantic_core::Result<Vec<Value>> {
    let f = fixture(name);
    let dir = fixtures_dir();
    let plan_path = dir.join(f["plan"].as_str().unwrap());
    let plan = TransformPlan::from_json(
        &std::fs::read(&plan_path).unwrap(),
        &plan_path.display().to_string(),
    )
    .unwrap();
    let mut inputs = Vec::new();
    for input in &plan.decoded().inputs {
        let schema = Arc::new(Schema::new(
            input
                .fields
                .iter()
                .map(|pf| Field::new(&pf.name, arrow_type(&pf.dtcs_type).unwrap(), pf.nullable))
                .collect::<Vec<_>>(),
        ));
        let path = dir.join(f["inputs"][&input.id].as_str().unwrap());
        let text = std::fs::read_to_string(path).unwrap();
        inputs.push((input.id.clone(), table_from_jsonl(schema, &text)));
    }
    let params: IndexMap<String, Value> = f["parameters"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let inputs: Vec<(&str, _)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let t = run_plan(plan, inputs, params).await?;
    Ok(rows(&t))
}

fn expected(name: &str) -> Vec<Value> {
    let f = fixture(name);
    let path = fixtures_dir().join(f["expected"]["result"].as_str().unwrap());
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn check(name: &str) {
    let actual = run_fixture(name)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let exp = expected(name);
    assert_eq!(
        exp.len(),
        fixture(name)["expected_rows"].as_u64().unwrap() as usize
    );
    // Same columns in the same order.
    let keys = |r: &Value| r.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&actual[0]), keys(&exp[0]), "{name}: columns");
    if fixture(name)["ordered"] == json!(true) {
        assert_eq!(actual, exp, "{name}");
    } else {
        assert_eq!(sorted(actual), sorted(exp), "{name}");
    }
}

#[tokio::test]
async fn filter_enrich_orders() {
    check("filter_enrich_orders").await;
}

#[tokio::test]
async fn publish_customers() {
    check("publish_customers").await;
}

#[tokio::test]
async fn customer_totals() {
    check("customer_totals").await;
}

#[tokio::test]
async fn orders_left_join_customers() {
    check("orders_left_join_customers").await;
}

#[tokio::test]
async fn top_orders() {
    check("top_orders").await;
}

#[tokio::test]
async fn unique_user_events() {
    check("unique_user_events").await;
}

/// ETLantic-py refuses `amount * 2` (its portable baseline only multiplies literals);
/// we support field arithmetic.
#[tokio::test]
async fn unsupported_field_arithmetic_runs_here() {
    let actual = run_fixture("unsupported_field_arithmetic").await.unwrap();
    // `amount` is replaced in place (same position), doubled.
    assert_eq!(
        actual,
        vec![
            json!({"order_id": 1, "customer_id": 10, "amount": 241.0, "status": "paid"}),
            json!({"order_id": 2, "customer_id": 10, "amount": 30.0, "status": "paid"}),
        ]
    );
}

/// Every fixture directory is covered by a test above.
#[test]
fn every_fixture_is_tested() {
    let names: Vec<String> = manifest()["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        vec![
            "filter_enrich_orders",
            "publish_customers",
            "customer_totals",
            "orders_left_join_customers",
            "top_orders",
            "unique_user_events",
            "unsupported_field_arithmetic"
        ]
    );
}
