//! Unit tests of action decoding, parameter binding and round trips through encoding.

use super::*;
use serde_json::{json, Map};

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn binds_parameters_and_reports_missing_values() {
    let a = Action::Filter {
        predicate: Expr::Binary(
            super::super::expr::BinaryOp::GtEq,
            Box::new(Expr::col("amount")),
            Box::new(Expr::Parameter("min".into())),
        ),
    };
    let mut p = IndexMap::new();
    p.insert("min".to_string(), json!(20));
    match a.bind_parameters(&p).unwrap() {
        Action::Filter { predicate } => assert_eq!(
            predicate,
            Expr::Binary(
                super::super::expr::BinaryOp::GtEq,
                Box::new(Expr::col("amount")),
                Box::new(Expr::Literal(super::super::expr::Literal::Integer(20)))
            )
        ),
        _ => panic!("not a filter"),
    }
    let e = a.bind_parameters(&IndexMap::new()).unwrap_err();
    assert_eq!(e.code(), "ETL209");
    assert!(e.to_string().contains("`min`"));
}

#[test]
fn decodes_py_and_crate_aggregate_forms() {
    let py = decode_action(
        "dtcs:aggregate",
        &obj(json!({"groupBy": ["g"], "aggregates": [{"name": "t", "expression": {"kind": "call", "callee": "dtcs:sum", "args": [{"kind": "fieldRef", "target": "v"}]}}]})),
    )
    .unwrap();
    let krate = decode_action(
        "dtcs:aggregate",
        &obj(json!({"groupBy": ["g"], "aggregates": [{"as": "t", "op": "sum", "field": "v"}]})),
    )
    .unwrap();
    assert_eq!(py, krate);
    let back = decode_action("dtcs:aggregate", &obj(encode_action(&py).unwrap())).unwrap();
    assert_eq!(back, py);
}

#[test]
fn window_actions_round_trip() {
    let a = decode_action(
        WINDOW_AGGREGATE,
        &obj(json!({"window": {"type": "sliding", "timeField": "ts", "size": "PT10S", "slide": "5 seconds"},
                    "groupBy": ["user"], "aggregates": [{"as": "n", "op": "count_all"}]})),
    )
    .unwrap();
    match &a {
        Action::WindowAggregate { window, .. } => assert_eq!(
            window.kind,
            WindowKind::Sliding {
                size: Duration::from_secs(10),
                slide: Duration::from_secs(5)
            }
        ),
        _ => panic!(),
    }
    assert_eq!(
        decode_action(WINDOW_AGGREGATE, &obj(encode_action(&a).unwrap())).unwrap(),
        a
    );
    assert!(decode_action(
        WINDOW_AGGREGATE,
        &obj(json!({"window": {"type": "sliding", "timeField": "ts", "size": "5 seconds", "slide": "10 seconds"}, "aggregates": []}))
    )
    .is_err());
}

#[test]
fn join_time_range_decodes_and_round_trips() {
    let a = decode_action(
        "dtcs:join",
        &obj(json!({"right": "clicks", "leftKey": "ad_id", "type": "left_outer",
                    "etlantic:timeRange": {"left": "imp_ts", "right": "click_ts", "lower": "20 seconds", "upper": "PT5S"}})),
    )
    .unwrap();
    let Action::Join {
        time_range: Some(r),
        join_type,
        ..
    } = &a
    else {
        panic!("{a:?}")
    };
    assert_eq!(*join_type, JoinType::Left);
    assert_eq!(
        r,
        &JoinTimeRange {
            left: "imp_ts".into(),
            right: "click_ts".into(),
            lower: Duration::from_secs(20),
            upper: Duration::from_secs(5),
        }
    );
    let enc = encode_action(&a).unwrap();
    assert_eq!(enc[JOIN_TIME_RANGE]["lower"], json!("20 seconds"));
    assert_eq!(decode_action("dtcs:join", &obj(enc)).unwrap(), a);
    // A time range alone is a condition; bad ranges are refused.
    assert!(decode_action(
        "dtcs:join",
        &obj(json!({"right": "r", "etlantic:timeRange": {"left": "a", "right": "b"}}))
    )
    .is_ok());
    for bad in [
        json!({"left": "a"}),
        json!({"left": "a", "right": "b", "lower": 5}),
        json!({"left": "a", "right": "b", "within": "5 seconds"}),
        json!({"left": "a", "right": "b", "lower": "-5 seconds"}),
    ] {
        assert!(
            decode_action(
                "dtcs:join",
                &obj(json!({"right": "r", "leftKey": "k", JOIN_TIME_RANGE: bad}))
            )
            .is_err(),
            "{bad}"
        );
    }
}

#[test]
fn every_action_round_trips() {
    let samples = vec![
        ("dtcs:filter", json!({"predicate": "a > 1"})),
        (
            "dtcs:project",
            json!({"fields": ["a", {"name": "b2", "expression": "b * 2"}]}),
        ),
        (
            "dtcs:with_fields",
            json!({"assignments": [{"as": "c", "expr": "a + 1"}]}),
        ),
        (
            "dtcs:drop_fields",
            json!({"fields": ["a"], "missingPolicy": "ignore"}),
        ),
        ("dtcs:rename_fields", json!({"mapping": {"a": "x"}})),
        (
            "dtcs:join",
            json!({"right": "r", "leftKey": ["a", "b"], "rightKey": ["c", "d"], "type": "left"}),
        ),
        (
            "dtcs:join",
            json!({"right": "r", "leftKey": "ad", "type": "full",
                   "etlantic:timeRange": {"left": "imp_ts", "right": "click_ts", "lower": "20 seconds", "upper": "PT0S"}}),
        ),
        (
            "dtcs:union",
            json!({"other": "o", "mode": "byName", "allowMissingColumns": true}),
        ),
        (
            "dtcs:sort",
            json!({"keys": [{"field": "a", "descending": true, "nulls": "first"}]}),
        ),
        ("dtcs:limit", json!({"count": 3, "offset": 1})),
        ("dtcs:distinct", json!({})),
        (
            "dtcs:deduplicate",
            json!({"keys": ["id"], "retain": "last"}),
        ),
        (
            "dtcs:explode",
            json!({"expr": "items", "as": ["item"], "outer": true}),
        ),
        (DEDUP_WITHIN_WATERMARK, json!({"keys": ["id"]})),
    ];
    for (id, p) in samples {
        let a = decode_action(id, &obj(p)).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(a.id(), id);
        let enc = encode_action(&a).unwrap_or(json!({}));
        assert_eq!(decode_action(id, &obj(enc)).unwrap(), a, "{id}");
    }
    assert!(decode_action("dtcs:pivot", &Map::new()).is_err());
    assert!(decode_action("dtcs:limit", &obj(json!({"count": -1}))).is_err());
}
