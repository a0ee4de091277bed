//! The `dtcs` crate's reference runtime as an oracle: the same action parameters, run by
//! `dtcs::runtime::actions::apply_dataset_action` and by this backend, give the same rows
//! (on data without nulls, where the reference runtime's semantics agree with SQL's).

mod common;

use common::{rows, run, schema, table};
use dtcs::runtime::{Dataset, Row};
use etlantic_core::ir::action::decode_action;
use indexmap::IndexMap;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Runs `steps` (action id, parameters) on workspace `t` with the reference runtime.
fn reference(steps: &[(&str, Value)], inputs: &[(&str, &[Value])]) -> Vec<Value> {
    let mut ws: BTreeMap<String, Dataset> = BTreeMap::new();
    for (name, rows) in inputs {
        let ds: Dataset = rows
            .iter()
            .map(|r| serde_json::from_value::<Row>(r.clone()).unwrap())
            .collect();
        ws.insert(name.to_string(), ds);
    }
    for (action, params) in steps {
        let p: IndexMap<String, Value> = params
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        dtcs::runtime::actions::apply_dataset_action(action, "t", &p, &mut ws)
            .unwrap_or_else(|e| panic!("reference {action}: {e}"));
    }
    ws["t"]
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

/// Runs the same steps with the DataFusion backend.
async fn ours(
    steps: &[(&str, Value)],
    inputs: Vec<(&str, etlantic_core::data::Table)>,
) -> Vec<Value> {
    let actions = steps
        .iter()
        .map(|(a, p)| decode_action(a, p.as_object().unwrap()).unwrap())
        .collect();
    rows(&run(inputs, actions).await.unwrap())
}

fn orders() -> Vec<Value> {
    vec![
        json!({"id": 1, "g": "x", "amount": 5.5, "qty": 2}),
        json!({"id": 2, "g": "y", "amount": 1.25, "qty": 7}),
        json!({"id": 3, "g": "x", "amount": 9.0, "qty": 1}),
        json!({"id": 4, "g": "z", "amount": 3.5, "qty": 7}),
        json!({"id": 5, "g": "y", "amount": 1.25, "qty": 3}),
        json!({"id": 6, "g": "x", "amount": 0.75, "qty": 9}),
    ]
}

fn orders_table() -> etlantic_core::data::Table {
    table(
        schema(&[
            ("id", "integer"),
            ("g", "string"),
            ("amount", "decimal"),
            ("qty", "integer"),
        ]),
        &orders(),
    )
}

#[tokio::test]
async fn filter_with_fields_and_stable_sort_agree() {
    let steps = [
        ("dtcs:filter", json!({"predicate": "qty > 1 && g != 'z'"})),
        (
            "dtcs:with_fields",
            json!({"assignments": [{"as": "total", "expr": "amount * qty"}]}),
        ),
        (
            "dtcs:sort",
            json!({"keys": [{"field": "qty", "descending": true}]}),
        ),
    ];
    let expected = reference(&steps, &[("t", &orders())]);
    let actual = ours(&steps, vec![("t", orders_table())]).await;
    assert_eq!(actual, expected);
    assert_eq!(actual.len(), 4);
}

#[tokio::test]
async fn grouped_aggregation_agrees() {
    let steps = [
        (
            "dtcs:aggregate",
            json!({"groupBy": ["g"], "aggregates": [
                {"as": "total", "op": "sum", "field": "amount"},
                {"as": "n", "op": "count_all"},
                {"as": "mean", "op": "average", "field": "amount"},
                {"as": "top", "op": "max", "field": "amount"}
            ]}),
        ),
        ("dtcs:sort", json!({"keys": [{"field": "g"}]})),
    ];
    let expected = reference(&steps, &[("t", &orders())]);
    let actual = ours(&steps, vec![("t", orders_table())]).await;
    assert_eq!(actual, expected);
    assert_eq!(actual[0]["total"], json!(15.25));
}

#[tokio::test]
async fn inner_join_distinct_and_deduplicate_agree() {
    let dim = vec![
        json!({"g": "x", "label": "ex"}),
        json!({"g": "y", "label": "why"}),
    ];
    let dim_table = table(schema(&[("g", "string"), ("label", "string")]), &dim);
    let steps = [
        (
            "dtcs:join",
            json!({"right": "r", "leftKey": "g", "rightKey": "g", "type": "inner"}),
        ),
        (
            "dtcs:deduplicate",
            json!({"keys": ["label"], "retain": "last"}),
        ),
        ("dtcs:sort", json!({"keys": [{"field": "id"}]})),
    ];
    let expected = reference(&steps, &[("t", &orders()), ("r", &dim)]);
    let actual = ours(&steps, vec![("t", orders_table()), ("r", dim_table)]).await;
    assert_eq!(actual, expected);
    // The last `x` order is 6 and the last `y` order is 5.
    let ids: Vec<i64> = actual.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![5, 6]);

    let steps = [
        ("dtcs:project", json!({"fields": ["g", "qty"]})),
        ("dtcs:distinct", json!({"fields": ["qty"]})),
    ];
    let expected = reference(&steps, &[("t", &orders())]);
    let actual = ours(&steps, vec![("t", orders_table())]).await;
    assert_eq!(actual, expected);
}
