//! The backend contract: registration, capabilities, SQL and registered implementations,
//! multi-step regions, schemas that match execution, order on multi-batch inputs.

mod common;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use common::{e, rows, schema, table};
use etlantic_core::data::Table;
use etlantic_core::ir::{Action, SortKey, TransformPlanBuilder};
use etlantic_core::plugin::{Backend, RegionKind, StepLogic, StepTask, TransformImpl};
use etlantic_datafusion::DataFusionBackend;
use indexmap::IndexMap;
use serde_json::json;
use std::sync::Arc;

fn task(id: &str, inputs: &[(&str, &str)], logic: StepLogic) -> StepTask {
    StepTask {
        id: id.into(),
        inputs: inputs
            .iter()
            .map(|(p, r)| (p.to_string(), r.to_string()))
            .collect(),
        logic,
    }
}

fn orders() -> Table {
    table(
        schema(&[
            ("id", "integer"),
            ("customer", "string"),
            ("amount", "decimal"),
        ]),
        &[
            json!({"id": 1, "customer": "a", "amount": 10.0}),
            json!({"id": 2, "customer": "b", "amount": 5.5}),
            json!({"id": 3, "customer": "a", "amount": 2.5}),
        ],
    )
}

#[test]
fn registered_with_batch_capabilities() {
    let b = etlantic_core::plugin::backend("datafusion").expect("registered");
    assert_eq!(b.name(), "datafusion");
    let caps = b.capabilities();
    assert_eq!(
        caps.region_kinds,
        vec![RegionKind::Batch, RegionKind::Streaming]
    );
    assert_eq!(caps.sql_engines, vec!["datafusion".to_string()]);
    assert!(!caps.continuous);
    for a in [
        "dtcs:filter",
        "dtcs:join",
        "dtcs:union",
        "dtcs:aggregate",
        "dtcs:explode",
        "etlantic:window_aggregate",
        "etlantic:deduplicate_within_watermark",
    ] {
        assert!(caps.supports_action(a), "{a}");
    }
    for f in [
        "dtcs:upper",
        "dtcs:substr",
        "dtcs:case_when",
        "dtcs:count_all",
        "dtcs:first",
    ] {
        assert!(caps.supports_function(f), "{f}");
    }
    assert!(!caps.supports_function("dtcs:regex_matches"));
    assert!(caps
        .dtcs_profiles
        .contains(&"dtcs:profile/portable-relational/2".to_string()));
}

/// The profiles claimed are complete: every action and function they require is listed.
#[test]
fn claimed_profiles_are_complete() {
    let caps = DataFusionBackend.capabilities();
    let registry = dtcs::registry::default_registry();
    let mut required: Vec<String> = Vec::new();
    let mut profile = Some("dtcs:profile/portable-relational/1".to_string());
    while let Some(p) = profile {
        let entry = registry.get(&p).expect("profile entry");
        let def: serde_json::Value =
            serde_json::from_str(entry.definition.as_deref().expect("definition")).unwrap();
        for key in ["requiredActions", "requiredFunctions"] {
            for id in def[key].as_array().into_iter().flatten() {
                required.push(id.as_str().unwrap().to_string());
            }
        }
        profile = def["extends"].as_str().map(String::from);
    }
    assert!(required.len() > 15, "{required:?}");
    for id in required {
        assert!(
            caps.supports_action(&id) || caps.supports_function(&id),
            "profile requires {id}"
        );
    }
}

/// Every fixture's declared requirements are covered by the capabilities.
#[test]
fn fixtures_requirements_are_supported() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/etlantic-py/manifest.json");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(dir).unwrap()).unwrap();
    let caps = DataFusionBackend.capabilities();
    for f in m["fixtures"].as_array().unwrap() {
        for a in f["requirements"]["actions"].as_array().unwrap() {
            assert!(caps.supports_action(a.as_str().unwrap()), "{a}");
        }
        for g in f["requirements"]["functions"].as_array().unwrap() {
            assert!(caps.supports_function(g.as_str().unwrap()), "{g}");
        }
    }
}

#[tokio::test]
async fn sql_steps_see_inputs_by_port_name() {
    let b = DataFusionBackend;
    let t = task(
        "totals",
        &[("orders", "raw_orders")],
        StepLogic::Sql {
            query: "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer ORDER BY customer"
                .into(),
        },
    );
    let mut schemas = IndexMap::new();
    schemas.insert("orders".to_string(), orders().schema);
    let planned = b.output_schema(&t, &schemas).unwrap();
    let mut inputs = IndexMap::new();
    inputs.insert("raw_orders".to_string(), orders());
    let out = b
        .execute_batch(&[t], inputs, &["totals".to_string()])
        .await
        .unwrap();
    let totals = &out["totals"];
    assert_eq!(planned, totals.schema);
    assert_eq!(
        rows(totals),
        vec![
            json!({"customer": "a", "total": 12.5}),
            json!({"customer": "b", "total": 5.5}),
        ]
    );
}

#[tokio::test]
async fn sql_steps_are_read_only() {
    let b = DataFusionBackend;
    let t = task(
        "x",
        &[("orders", "orders")],
        StepLogic::Sql {
            query: "CREATE TABLE t AS SELECT 1".into(),
        },
    );
    let mut inputs = IndexMap::new();
    inputs.insert("orders".to_string(), orders());
    let err = b
        .execute_batch(std::slice::from_ref(&t), inputs, &["x".to_string()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ETL501", "{err}");
    let bad = task(
        "y",
        &[("orders", "orders")],
        StepLogic::Sql {
            query: "SELECT nope FROM orders".into(),
        },
    );
    let mut schemas = IndexMap::new();
    schemas.insert("orders".to_string(), orders().schema);
    assert_eq!(
        b.output_schema(&bad, &schemas).unwrap_err().code(),
        "ETL206"
    );
}

/// A registered engine-specific implementation.
struct AddOne;

impl TransformImpl for AddOne {
    fn name(&self) -> &'static str {
        "test_add_one"
    }
    fn backend(&self) -> &'static str {
        "datafusion"
    }
    fn output_schema(
        &self,
        _inputs: &IndexMap<String, SchemaRef>,
    ) -> etlantic_core::Result<SchemaRef> {
        Ok(Arc::new(Schema::new(vec![Field::new(
            "n",
            DataType::Int64,
            false,
        )])))
    }
    fn execute(&self, inputs: IndexMap<String, Table>) -> etlantic_core::Result<Table> {
        let rows = inputs.values().next().map(Table::num_rows).unwrap_or(0) as i64;
        let schema = self.output_schema(&IndexMap::new())?;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![rows + 1]))],
        )
        .unwrap();
        Ok(Table::new(schema, vec![batch]))
    }
}

inventory::submit! { etlantic_core::plugin::TransformImplRegistration(&AddOne) }

#[tokio::test]
async fn registered_implementations_run() {
    let b = DataFusionBackend;
    let t = task(
        "counted",
        &[("orders", "orders")],
        StepLogic::Impl {
            name: "test_add_one".into(),
        },
    );
    let mut inputs = IndexMap::new();
    inputs.insert("orders".to_string(), orders());
    let out = b
        .execute_batch(&[t], inputs, &["counted".to_string()])
        .await
        .unwrap();
    assert_eq!(rows(&out["counted"]), vec![json!({"n": 4})]);
    let missing = task(
        "m",
        &[],
        StepLogic::Impl {
            name: "nope".into(),
        },
    );
    assert_eq!(
        b.output_schema(&missing, &IndexMap::new())
            .unwrap_err()
            .code(),
        "ETL501"
    );
}

#[tokio::test]
async fn a_region_chains_steps_and_returns_requested_outputs() {
    let b = DataFusionBackend;
    let plan = TransformPlanBuilder::new("big")
        .input("orders", Some(&orders().schema))
        .step(Action::Filter {
            predicate: e("amount > 3"),
        })
        .output("result", None)
        .build()
        .unwrap();
    let big = task(
        "big",
        &[("orders", "orders")],
        StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: IndexMap::new(),
            output: "result".into(),
        },
    );
    let count = task(
        "count",
        &[("src", "big")],
        StepLogic::Sql {
            query: "SELECT count(*) AS n FROM src".into(),
        },
    );
    let mut inputs = IndexMap::new();
    inputs.insert("orders".to_string(), orders());
    let out = b
        .execute_batch(
            &[big.clone(), count.clone()],
            inputs.clone(),
            &["count".to_string(), "big".to_string()],
        )
        .await
        .unwrap();
    assert_eq!(out.keys().collect::<Vec<_>>(), vec!["count", "big"]);
    assert_eq!(rows(&out["count"]), vec![json!({"n": 2})]);
    assert_eq!(out["big"].num_rows(), 2);
    // Reading a relation that does not exist.
    let err = b
        .execute_batch(&[count], inputs, &["count".to_string()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ETL201");
}

/// Many rows over several batches: ordinals stay global, so "first" and "stable" hold
/// across batch boundaries.
#[tokio::test]
async fn order_holds_across_batches() {
    let s = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    let n = 30_000i64;
    let mut batches = Vec::new();
    for chunk in 0..3 {
        let ks: Vec<i64> = (chunk * 10_000..(chunk + 1) * 10_000)
            .map(|i| i % 7)
            .collect();
        let vs: Vec<String> = (chunk * 10_000..(chunk + 1) * 10_000)
            .map(|i| format!("v{i}"))
            .collect();
        batches.push(
            RecordBatch::try_new(
                s.clone(),
                vec![
                    Arc::new(Int64Array::from(ks)),
                    Arc::new(StringArray::from(vs)),
                ],
            )
            .unwrap(),
        );
    }
    let input = Table::new(s, batches);
    assert_eq!(input.num_rows() as i64, n);
    // Last row per key, in input order: keys 0..6 last appear at n-7..n-1.
    let out = common::run_rows(
        vec![("t", input.clone())],
        vec![Action::Deduplicate {
            keys: vec!["k".into()],
            keep_last: true,
        }],
    )
    .await;
    let expected: Vec<serde_json::Value> = (n - 7..n)
        .map(|i| json!({"k": i % 7, "v": format!("v{i}")}))
        .collect();
    assert_eq!(out, expected);
    // A stable sort on k: within a key, input order.
    let out = common::run_rows(
        vec![("t", input)],
        vec![
            Action::Sort {
                keys: vec![SortKey {
                    expr: e("k"),
                    descending: true,
                    nulls_first: false,
                }],
            },
            Action::Limit {
                count: 3,
                offset: 0,
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"k": 6, "v": "v6"}),
            json!({"k": 6, "v": "v13"}),
            json!({"k": 6, "v": "v20"}),
        ]
    );
}

/// The action aliases the IR decodes (`dtcs:select`, `dtcs:group`, the field actions)
/// run like the actions they stand for.
#[tokio::test]
async fn action_aliases_run() {
    let node = |id: &str, action: &str, target: &str, params: serde_json::Value| {
        json!({"id": id, "kind": {"action": action, "id": id, "kind": "semanticAction",
               "parameters": params, "target": target}, "objectRef": format!("semanticActions.{id}")})
    };
    let doc = json!({
        "planIdentity": "dtcs.transform-plan/2",
        "profile": "dtcs:profile/portable-relational/2",
        "specificationVersion": "3.0.0",
        "transformation": "aliases",
        "inputs": {"t": {"id": "t", "optional": false}},
        "actions": [
            node("a1", "dtcs:uppercase", "t.name", json!({})),
            node("a2", "dtcs:select", "a1", json!({"predicate": "name != 'BOB'"})),
            node("a3", "dtcs:group", "a2", json!({"groupBy": ["name"], "aggregates": [{"as": "n", "op": "count_all"}]})),
            node("a4", "dtcs:trim", "a3.name", json!({})),
            node("a5", "dtcs:lowercase", "a4.name", json!({})),
            node("a6", "dtcs:sort", "a5", json!({"keys": [{"field": "name"}]})),
        ],
        "outputs": {"result": {"id": "result"}},
        "requirements": {"dependencies": [{"from": "a6", "to": "result", "reason": "lineage"}]},
        "errorMode": "fail"
    });
    let plan = etlantic_core::ir::TransformPlan::from_value(&doc, "aliases.json").unwrap();
    let caps = DataFusionBackend.capabilities();
    let (actions, functions) = plan.decoded().registry_ids();
    assert!(
        actions.iter().all(|a| caps.supports_action(a)),
        "{actions:?}"
    );
    assert!(
        functions.iter().all(|f| caps.supports_function(f)),
        "{functions:?}"
    );
    let input = table(
        schema(&[("name", "string")]),
        &[
            json!({"name": " ada"}),
            json!({"name": "bob"}),
            json!({"name": " ada"}),
            json!({"name": "cy "}),
        ],
    );
    let out = common::run_plan(plan, vec![("t", input)], IndexMap::new())
        .await
        .unwrap();
    assert_eq!(
        rows(&out),
        vec![
            json!({"name": "ada", "n": 2}),
            json!({"name": "cy", "n": 1})
        ]
    );
}
