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
fn a_windows_allowed_lateness_decodes_and_round_trips() {
    let decode = |window: Value| {
        decode_action(
            WINDOW_AGGREGATE,
            &obj(json!({"window": window, "aggregates": [{"as": "n", "op": "count_all"}]})),
        )
    };
    let lateness = |a: &Action| match a {
        Action::WindowAggregate { window, .. } => window.allowed_lateness,
        _ => panic!("{a:?}"),
    };
    let a = decode(json!({"type": "tumbling", "timeField": "ts", "size": "10 seconds", "allowedLateness": "PT30S"})).unwrap();
    assert_eq!(lateness(&a), Duration::from_secs(30));
    let encoded = encode_action(&a).unwrap();
    assert_eq!(encoded["window"]["allowedLateness"], json!("30 seconds"));
    assert_eq!(decode_action(WINDOW_AGGREGATE, &obj(encoded)).unwrap(), a);
    // The pipeline's spelling, and none: zero, and not written (plans keep their bytes).
    let b =
        decode(json!({"timeField": "ts", "size": "10 seconds", "allowed_lateness": "1 minute"}))
            .unwrap();
    assert_eq!(lateness(&b), Duration::from_secs(60));
    let c = decode(json!({"timeField": "ts", "size": "10 seconds"})).unwrap();
    assert_eq!(lateness(&c), Duration::ZERO);
    assert!(encode_action(&c).unwrap()["window"]
        .get("allowedLateness")
        .is_none());
    // A bad duration, or a key the window does not know, is refused, never ignored.
    let err = decode(json!({"timeField": "ts", "size": "10 seconds", "allowedLateness": "soon"}))
        .unwrap_err();
    assert!(err.contains("soon"), "{err}");
    let err = decode(json!({"timeField": "ts", "size": "10 seconds", "lateness": "1 minute"}))
        .unwrap_err();
    assert!(err.contains("unknown window key `lateness`"), "{err}");
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

/// The parameter shapes ETLantic-py writes decode as their `dtcs` crate equivalents.
#[test]
fn etlantic_py_parameter_shapes() {
    use crate::ir::expr::{Expr, Literal};
    let agg = |key: &str| {
        decode_action(
            "dtcs:aggregate",
            &obj(json!({"groupBy": [], key: [{"name": "n", "expression":
                {"kind": "call", "callee": "dtcs:count_all", "args": []}}]})),
        )
        .unwrap()
    };
    assert_eq!(agg("aggregations"), agg("aggregates"));
    assert_eq!(
        decode_action("dtcs:sort", &obj(json!({"keys": [{"column": "k"}]}))).unwrap(),
        decode_action("dtcs:sort", &obj(json!({"keys": [{"field": "k"}]}))).unwrap()
    );
    assert_eq!(
        decode_action("dtcs:limit", &obj(json!({"n": 2}))).unwrap(),
        Action::Limit {
            count: 2,
            offset: 0
        }
    );
    // ETLantic-py explodes in place and keeps empty lists; the dtcs form drops them.
    let Action::Explode { outer, alias, .. } =
        decode_action("dtcs:explode", &obj(json!({"field": "tags"}))).unwrap()
    else {
        panic!("an explode")
    };
    assert!(outer);
    assert_eq!(alias, "tags");
    let Action::Explode { outer, .. } =
        decode_action("dtcs:explode", &obj(json!({"expr": "tags", "as": ["tag"]}))).unwrap()
    else {
        panic!("an explode")
    };
    assert!(!outer);
    // `in(x, 3, 4)` is `in(x, list(3, 4))`; `in(x, v)` keeps its meaning.
    let call = |args: Value| {
        Expr::decode(&json!({"kind": "call", "callee": "dtcs:in", "args": args})).unwrap()
    };
    let x = json!({"kind": "fieldRef", "scope": "field", "target": "x"});
    let int = |i: i64| json!({"kind": "literal", "value": {"type": "integer", "value": i}});
    assert_eq!(
        call(json!([x, int(3), int(4)])),
        Expr::Call {
            function: "dtcs:in".into(),
            args: vec![
                Expr::col("x"),
                Expr::Call {
                    function: "dtcs:list".into(),
                    args: vec![
                        Expr::Literal(Literal::Integer(3)),
                        Expr::Literal(Literal::Integer(4))
                    ]
                }
            ]
        }
    );
    assert_eq!(
        call(json!([x, int(3)])),
        Expr::Call {
            function: "dtcs:in".into(),
            args: vec![Expr::col("x"), Expr::Literal(Literal::Integer(3))]
        }
    );
}

/// Window functions are `with_fields` assignments with a `window`; a frame, a mix with
/// row assignments or a function that is not a window function is refused.
#[test]
fn window_function_assignments() {
    use crate::ir::expr::Expr;
    let assignment = |window: Value| {
        json!({"name": "rn", "expression": {"kind": "call", "callee": "dtcs:row_number", "args": []},
               "window": window})
    };
    let w = json!({"partitionBy": ["g"], "orderBy": [{"expression":
        {"kind": "fieldRef", "scope": "field", "target": "v"}, "direction": "desc", "nulls": "first"}]});
    let a = decode_action(
        "dtcs:with_fields",
        &obj(json!({"assignments": [assignment(w.clone())]})),
    )
    .unwrap();
    let Action::WindowFields { assignments } = &a else {
        panic!("window fields: {a:?}")
    };
    assert_eq!(assignments[0].partition_by, vec![Expr::col("g")]);
    assert!(assignments[0].order_by[0].descending && assignments[0].order_by[0].nulls_first);
    assert_eq!(a.id(), "dtcs:with_fields");
    let functions: Vec<String> = a.expressions().iter().flat_map(|e| e.functions()).collect();
    assert!(functions.contains(&"dtcs:row_number".to_string()));
    // It encodes back to the same action.
    let enc = encode_action(&a).unwrap();
    assert_eq!(decode_action("dtcs:with_fields", &obj(enc)).unwrap(), a);
    let refused = |assignments: Value| {
        decode_action(
            "dtcs:with_fields",
            &obj(json!({"assignments": assignments})),
        )
        .unwrap_err()
    };
    let mut framed = w.clone();
    framed["frame"] = json!({"type": "rows", "start": "unboundedPreceding", "end": "currentRow"});
    assert!(refused(json!([assignment(framed)])).contains("window frame"));
    let row = json!({"name": "x", "expression": "1"});
    assert!(refused(json!([assignment(w.clone()), row])).contains("mixes"));
    let not_window = json!({"name": "u", "expression": "upper(s)", "window": w});
    assert!(refused(json!([not_window])).contains("not a window function"));
    // In a projection, a window is refused rather than dropped.
    let projected = json!({"fields": [assignment(json!({"partitionBy": ["g"]}))]});
    assert!(decode_action("dtcs:project", &obj(projected)).is_err());
}
