//! Every action on real data, with exact expected rows (nulls included).

mod common;

use common::{e, named, run, run_rows, schema, sorted, table};
use etlantic_core::ir::{Action, AggFunc, Aggregate, JoinType, NamedExpr, SortKey};
use indexmap::IndexMap;
use serde_json::json;

fn people() -> etlantic_core::data::Table {
    table(
        schema(&[("id", "integer"), ("name", "string"), ("age", "integer")]),
        &[
            json!({"id": 1, "name": "ada", "age": 36}),
            json!({"id": 2, "name": "bob", "age": null}),
            json!({"id": 3, "name": null, "age": 20}),
            json!({"id": 4, "name": "dan", "age": 36}),
        ],
    )
}

fn key(expr: &str, descending: bool, nulls_first: bool) -> SortKey {
    SortKey {
        expr: e(expr),
        descending,
        nulls_first,
    }
}

fn agg(name: &str, func: AggFunc, arg: Option<&str>) -> Aggregate {
    Aggregate {
        name: name.into(),
        func,
        arg: arg.map(e),
    }
}

// ---------------------------------------------------------------- row-wise actions

#[tokio::test]
async fn filter_drops_false_and_null() {
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Filter {
            predicate: e("age > 25"),
        }],
    )
    .await;
    // Input order is kept; the row with a null age is dropped (null > 25 is null).
    assert_eq!(
        out,
        vec![
            json!({"id": 1, "name": "ada", "age": 36}),
            json!({"id": 4, "name": "dan", "age": 36}),
        ]
    );
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Filter {
            predicate: e("!(age > 25)"),
        }],
    )
    .await;
    assert_eq!(out, vec![json!({"id": 3, "name": null, "age": 20})]);
}

#[tokio::test]
async fn project_computes_and_orders_columns() {
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Project {
            fields: vec![named("next", "age + 1"), NamedExpr::column("id")],
        }],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"next": 37, "id": 1}),
            json!({"next": null, "id": 2}),
            json!({"next": 21, "id": 3}),
            json!({"next": 37, "id": 4}),
        ]
    );
}

#[tokio::test]
async fn with_fields_replaces_in_place_appends_and_chains() {
    let out = run_rows(
        vec![("p", people())],
        vec![
            Action::Filter {
                predicate: e("id <= 2"),
            },
            Action::WithFields {
                assignments: vec![
                    named("x", "id * 10"),
                    named("id", "x + 1"),
                    named("y", "id"),
                ],
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"id": 11, "name": "ada", "age": 36, "x": 10, "y": 11}),
            json!({"id": 21, "name": "bob", "age": null, "x": 20, "y": 21}),
        ]
    );
    let keys: Vec<&String> = out[0].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["id", "name", "age", "x", "y"]);
}

#[tokio::test]
async fn drop_fields_requires_the_column_unless_ignored() {
    let out = run_rows(
        vec![("p", people())],
        vec![Action::DropFields {
            fields: vec!["age".into(), "nope".into()],
            ignore_missing: true,
        }],
    )
    .await;
    assert_eq!(out[0], json!({"id": 1, "name": "ada"}));
    let err = run(
        vec![("p", people())],
        vec![Action::DropFields {
            fields: vec!["nope".into()],
            ignore_missing: false,
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL206");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test]
async fn rename_fields_swaps_and_refuses_collisions() {
    let mut mapping = IndexMap::new();
    mapping.insert("id".to_string(), "name".to_string());
    mapping.insert("name".to_string(), "id".to_string());
    mapping.insert("missing".to_string(), "whatever".to_string());
    let out = run_rows(
        vec![("p", people())],
        vec![Action::RenameFields { mapping }],
    )
    .await;
    assert_eq!(out[0], json!({"name": 1, "id": "ada", "age": 36}));
    let keys: Vec<&String> = out[0].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["name", "id", "age"]);

    let mut mapping = IndexMap::new();
    mapping.insert("id".to_string(), "age".to_string());
    let err = run(
        vec![("p", people())],
        vec![Action::RenameFields { mapping }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL006");
}

// ---------------------------------------------------------------- joins

fn left() -> etlantic_core::data::Table {
    table(
        schema(&[("k", "integer"), ("l", "string")]),
        &[
            json!({"k": 1, "l": "a"}),
            json!({"k": null, "l": "b"}),
            json!({"k": 2, "l": "c"}),
            json!({"k": 1, "l": "d"}),
        ],
    )
}

fn right() -> etlantic_core::data::Table {
    table(
        schema(&[("k", "integer"), ("r", "string")]),
        &[
            json!({"k": 1, "r": "x"}),
            json!({"k": null, "r": "y"}),
            json!({"k": 3, "r": "z"}),
            json!({"k": 1, "r": "w"}),
        ],
    )
}

fn join(join_type: JoinType, null_safe: bool) -> Action {
    Action::Join {
        right: "right".into(),
        join_type,
        left_keys: vec!["k".into()],
        right_keys: vec!["k".into()],
        predicate: None,
        null_safe,
        time_range: None,
    }
}

async fn join_rows(action: Action) -> Vec<serde_json::Value> {
    sorted(run_rows(vec![("left", left()), ("right", right())], vec![action]).await)
}

#[tokio::test]
async fn inner_join_never_matches_null_keys() {
    assert_eq!(
        join_rows(join(JoinType::Inner, false)).await,
        sorted(vec![
            json!({"k": 1, "l": "a", "r": "x"}),
            json!({"k": 1, "l": "a", "r": "w"}),
            json!({"k": 1, "l": "d", "r": "x"}),
            json!({"k": 1, "l": "d", "r": "w"}),
        ])
    );
}

#[tokio::test]
async fn null_safe_join_matches_null_keys() {
    assert_eq!(
        join_rows(join(JoinType::Inner, true)).await,
        sorted(vec![
            json!({"k": 1, "l": "a", "r": "x"}),
            json!({"k": 1, "l": "a", "r": "w"}),
            json!({"k": null, "l": "b", "r": "y"}),
            json!({"k": 1, "l": "d", "r": "x"}),
            json!({"k": 1, "l": "d", "r": "w"}),
        ])
    );
}

#[tokio::test]
async fn left_join_keeps_unmatched_left_rows() {
    assert_eq!(
        join_rows(join(JoinType::Left, false)).await,
        sorted(vec![
            json!({"k": 1, "l": "a", "r": "x"}),
            json!({"k": 1, "l": "a", "r": "w"}),
            json!({"k": null, "l": "b", "r": null}),
            json!({"k": 2, "l": "c", "r": null}),
            json!({"k": 1, "l": "d", "r": "x"}),
            json!({"k": 1, "l": "d", "r": "w"}),
        ])
    );
}

#[tokio::test]
async fn right_and_full_joins_coalesce_the_merged_key() {
    assert_eq!(
        join_rows(join(JoinType::Right, false)).await,
        sorted(vec![
            json!({"k": 1, "l": "a", "r": "x"}),
            json!({"k": 1, "l": "a", "r": "w"}),
            json!({"k": 1, "l": "d", "r": "x"}),
            json!({"k": 1, "l": "d", "r": "w"}),
            json!({"k": null, "l": null, "r": "y"}),
            json!({"k": 3, "l": null, "r": "z"}),
        ])
    );
    assert_eq!(
        join_rows(join(JoinType::Full, false)).await,
        sorted(vec![
            json!({"k": 1, "l": "a", "r": "x"}),
            json!({"k": 1, "l": "a", "r": "w"}),
            json!({"k": 1, "l": "d", "r": "x"}),
            json!({"k": 1, "l": "d", "r": "w"}),
            json!({"k": null, "l": "b", "r": null}),
            json!({"k": 2, "l": "c", "r": null}),
            json!({"k": null, "l": null, "r": "y"}),
            json!({"k": 3, "l": null, "r": "z"}),
        ])
    );
}

#[tokio::test]
async fn semi_and_anti_joins_keep_left_rows_in_order() {
    let semi = run_rows(
        vec![("left", left()), ("right", right())],
        vec![join(JoinType::Semi, false)],
    )
    .await;
    assert_eq!(
        semi,
        vec![json!({"k": 1, "l": "a"}), json!({"k": 1, "l": "d"})]
    );
    // A null key has no match, so the anti join keeps it.
    let anti = run_rows(
        vec![("left", left()), ("right", right())],
        vec![join(JoinType::Anti, false)],
    )
    .await;
    assert_eq!(
        anti,
        vec![json!({"k": null, "l": "b"}), json!({"k": 2, "l": "c"})]
    );
    let anti_null_safe = run_rows(
        vec![("left", left()), ("right", right())],
        vec![join(JoinType::Anti, true)],
    )
    .await;
    assert_eq!(anti_null_safe, vec![json!({"k": 2, "l": "c"})]);
}

#[tokio::test]
async fn colliding_columns_fail_unless_semi_or_anti() {
    let dim = table(
        schema(&[("k", "integer"), ("l", "string")]),
        &[json!({"k": 1, "l": "other"})],
    );
    let err = run(
        vec![("left", left()), ("right", dim.clone())],
        vec![join(JoinType::Inner, false)],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL006");
    assert!(err.to_string().contains("`l`"), "{err}");
    let semi = run_rows(
        vec![("left", left()), ("right", dim)],
        vec![join(JoinType::Semi, false)],
    )
    .await;
    assert_eq!(
        semi,
        vec![json!({"k": 1, "l": "a"}), json!({"k": 1, "l": "d"})]
    );
}

#[tokio::test]
async fn differently_named_keys_and_predicates() {
    let dim = table(
        schema(&[("id", "integer"), ("lo", "integer")]),
        &[json!({"id": 1, "lo": 0}), json!({"id": 2, "lo": 5})],
    );
    let facts = table(
        schema(&[("k", "integer"), ("v", "integer")]),
        &[
            json!({"k": 1, "v": 3}),
            json!({"k": 2, "v": 3}),
            json!({"k": 2, "v": 9}),
        ],
    );
    let out = sorted(
        run_rows(
            vec![("facts", facts.clone()), ("dim", dim.clone())],
            vec![Action::Join {
                right: "dim".into(),
                join_type: JoinType::Inner,
                left_keys: vec!["k".into()],
                right_keys: vec!["id".into()],
                predicate: Some(e("v > lo")),
                null_safe: false,
                time_range: None,
            }],
        )
        .await,
    );
    assert_eq!(
        out,
        sorted(vec![
            json!({"k": 1, "v": 3, "id": 1, "lo": 0}),
            json!({"k": 2, "v": 9, "id": 2, "lo": 5}),
        ])
    );
    // Predicate only (a theta join), left outer.
    let out = sorted(
        run_rows(
            vec![("facts", facts), ("dim", dim)],
            vec![Action::Join {
                right: "dim".into(),
                join_type: JoinType::Left,
                left_keys: vec![],
                right_keys: vec![],
                predicate: Some(e("v < lo")),
                null_safe: false,
                time_range: None,
            }],
        )
        .await,
    );
    assert_eq!(
        out,
        sorted(vec![
            json!({"k": 1, "v": 3, "id": 2, "lo": 5}),
            json!({"k": 2, "v": 3, "id": 2, "lo": 5}),
            json!({"k": 2, "v": 9, "id": null, "lo": null}),
        ])
    );
}

#[tokio::test]
async fn cross_join_and_left_major_order() {
    let a = table(
        schema(&[("a", "integer")]),
        &[json!({"a": 2}), json!({"a": 1})],
    );
    let b = table(
        schema(&[("b", "string")]),
        &[json!({"b": "y"}), json!({"b": "x"})],
    );
    // The limit needs an order: left rows first, then right rows, as given.
    let out = run_rows(
        vec![("a", a), ("b", b)],
        vec![
            Action::Join {
                right: "b".into(),
                join_type: JoinType::Cross,
                left_keys: vec![],
                right_keys: vec![],
                predicate: None,
                null_safe: false,
                time_range: None,
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
            json!({"a": 2, "b": "y"}),
            json!({"a": 2, "b": "x"}),
            json!({"a": 1, "b": "y"}),
        ]
    );
}

// ---------------------------------------------------------------- union

#[tokio::test]
async fn union_by_name_fills_missing_columns_and_keeps_side_order() {
    let a = table(
        schema(&[("id", "integer"), ("x", "integer")]),
        &[json!({"id": 1, "x": 10}), json!({"id": 2, "x": 20})],
    );
    let b = table(
        schema(&[("y", "string"), ("id", "integer")]),
        &[json!({"y": "q", "id": 3})],
    );
    let out = run_rows(
        vec![("a", a.clone()), ("b", b.clone())],
        vec![
            Action::Union {
                other: "b".into(),
                by_name: true,
                allow_missing: true,
                distinct: false,
            },
            Action::Limit {
                count: 10,
                offset: 0,
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"id": 1, "x": 10, "y": null}),
            json!({"id": 2, "x": 20, "y": null}),
            json!({"id": 3, "x": null, "y": "q"}),
        ]
    );
    let err = run(
        vec![("a", a), ("b", b)],
        vec![Action::Union {
            other: "b".into(),
            by_name: true,
            allow_missing: false,
            distinct: false,
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL206");
}

#[tokio::test]
async fn union_by_position_widens_types_and_distinct_dedups() {
    let a = table(
        schema(&[("n", "integer"), ("s", "string")]),
        &[json!({"n": 1, "s": "a"}), json!({"n": 2, "s": "b"})],
    );
    let b = table(
        schema(&[("m", "decimal"), ("t", "string")]),
        &[json!({"m": 1.0, "t": "a"}), json!({"m": 2.5, "t": "c"})],
    );
    let steps = |distinct| {
        vec![
            Action::Union {
                other: "b".into(),
                by_name: false,
                allow_missing: false,
                distinct,
            },
            Action::Sort {
                keys: vec![key("n", false, false)],
            },
        ]
    };
    let out = run_rows(vec![("a", a.clone()), ("b", b.clone())], steps(false)).await;
    assert_eq!(
        out,
        vec![
            json!({"n": 1.0, "s": "a"}),
            json!({"n": 1.0, "s": "a"}),
            json!({"n": 2.0, "s": "b"}),
            json!({"n": 2.5, "s": "c"}),
        ]
    );
    let out = run_rows(vec![("a", a), ("b", b)], steps(true)).await;
    assert_eq!(
        out,
        vec![
            json!({"n": 1.0, "s": "a"}),
            json!({"n": 2.0, "s": "b"}),
            json!({"n": 2.5, "s": "c"}),
        ]
    );
}

// ---------------------------------------------------------------- aggregate

fn sales() -> etlantic_core::data::Table {
    table(
        schema(&[("g", "string"), ("v", "integer"), ("w", "decimal")]),
        &[
            json!({"g": "a", "v": 1, "w": 1.5}),
            json!({"g": null, "v": 2, "w": null}),
            json!({"g": "a", "v": null, "w": 2.5}),
            json!({"g": "b", "v": 4, "w": 4.0}),
            json!({"g": null, "v": 5, "w": 1.0}),
            json!({"g": "a", "v": 1, "w": 0.5}),
        ],
    )
}

#[tokio::test]
async fn aggregate_treats_null_as_a_group_and_counts_correctly() {
    let out = run_rows(
        vec![("s", sales())],
        vec![
            Action::Aggregate {
                group_by: vec![NamedExpr::column("g")],
                aggregates: vec![
                    agg("rows", AggFunc::CountAll, None),
                    agg("values", AggFunc::Count, Some("v")),
                    agg("distinct_values", AggFunc::CountDistinct, Some("v")),
                    agg("total", AggFunc::Sum, Some("v")),
                    agg("mean", AggFunc::Average, Some("w")),
                    agg("lo", AggFunc::Min, Some("v")),
                    agg("hi", AggFunc::Max, Some("w")),
                    agg("first_w", AggFunc::First, Some("w")),
                    agg("last_v", AggFunc::Last, Some("v")),
                ],
            },
            Action::Sort {
                keys: vec![key("g", false, true)],
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"g": null, "rows": 2, "values": 2, "distinct_values": 2, "total": 7,
                   "mean": 1.0, "lo": 2, "hi": 1.0, "first_w": null, "last_v": 5}),
            json!({"g": "a", "rows": 3, "values": 2, "distinct_values": 1, "total": 2,
                   "mean": 1.5, "lo": 1, "hi": 2.5, "first_w": 1.5, "last_v": 1}),
            json!({"g": "b", "rows": 1, "values": 1, "distinct_values": 1, "total": 4,
                   "mean": 4.0, "lo": 4, "hi": 4.0, "first_w": 4.0, "last_v": 4}),
        ]
    );
}

#[tokio::test]
async fn aggregate_groups_come_out_in_first_appearance_order_when_needed() {
    let out = run_rows(
        vec![("s", sales())],
        vec![
            Action::Aggregate {
                group_by: vec![named("group", "g")],
                aggregates: vec![agg("n", AggFunc::CountAll, None)],
            },
            Action::Limit {
                count: 10,
                offset: 0,
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"group": "a", "n": 3}),
            json!({"group": null, "n": 2}),
            json!({"group": "b", "n": 1}),
        ]
    );
}

#[tokio::test]
async fn global_aggregate_of_an_empty_input_is_one_row() {
    let out = run_rows(
        vec![("s", sales())],
        vec![
            Action::Filter {
                predicate: e("v > 100"),
            },
            Action::Aggregate {
                group_by: vec![],
                aggregates: vec![
                    agg("n", AggFunc::CountAll, None),
                    agg("total", AggFunc::Sum, Some("v")),
                ],
            },
        ],
    )
    .await;
    assert_eq!(out, vec![json!({"n": 0, "total": null})]);
}

#[tokio::test]
async fn aggregate_of_a_string_sum_is_a_type_error() {
    let err = run(
        vec![("s", sales())],
        vec![Action::Aggregate {
            group_by: vec![],
            aggregates: vec![agg("x", AggFunc::Sum, Some("g"))],
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL302");
}

// ---------------------------------------------------------------- sort, limit

#[tokio::test]
async fn sort_is_stable_with_nulls_last_by_default() {
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Sort {
            keys: vec![key("age", false, false)],
        }],
    )
    .await;
    let ids: Vec<i64> = out.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    // 20, 36 (id 1 before id 4: input order), null last.
    assert_eq!(ids, vec![3, 1, 4, 2]);
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Sort {
            keys: vec![key("age", true, false)],
        }],
    )
    .await;
    let ids: Vec<i64> = out.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![1, 4, 3, 2]);
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Sort {
            keys: vec![key("age", true, true), key("name", false, false)],
        }],
    )
    .await;
    let ids: Vec<i64> = out.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![2, 1, 4, 3]);
}

#[tokio::test]
async fn limit_with_offset_after_sort_and_in_input_order() {
    let out = run_rows(
        vec![("p", people())],
        vec![
            Action::Sort {
                keys: vec![key("id", true, false)],
            },
            Action::Limit {
                count: 2,
                offset: 1,
            },
        ],
    )
    .await;
    let ids: Vec<i64> = out.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![3, 2]);
    let out = run_rows(
        vec![("p", people())],
        vec![Action::Limit {
            count: 2,
            offset: 0,
        }],
    )
    .await;
    let ids: Vec<i64> = out.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2]);
}

// ---------------------------------------------------------------- distinct, dedup

fn events() -> etlantic_core::data::Table {
    table(
        schema(&[("k", "integer"), ("v", "string")]),
        &[
            json!({"k": 2, "v": "b"}),
            json!({"k": 1, "v": "a"}),
            json!({"k": 2, "v": "b"}),
            json!({"k": null, "v": "n1"}),
            json!({"k": 1, "v": "c"}),
            json!({"k": null, "v": "n2"}),
        ],
    )
}

#[tokio::test]
async fn distinct_keeps_first_occurrence_in_place() {
    let out = run_rows(
        vec![("e", events())],
        vec![
            Action::Distinct { fields: None },
            Action::Limit {
                count: 10,
                offset: 0,
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"k": 2, "v": "b"}),
            json!({"k": 1, "v": "a"}),
            json!({"k": null, "v": "n1"}),
            json!({"k": 1, "v": "c"}),
            json!({"k": null, "v": "n2"}),
        ]
    );
    let out = run_rows(
        vec![("e", events())],
        vec![Action::Distinct {
            fields: Some(vec!["k".into()]),
        }],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"k": 2, "v": "b"}),
            json!({"k": 1, "v": "a"}),
            json!({"k": null, "v": "n1"}),
        ]
    );
}

#[tokio::test]
async fn deduplicate_first_and_last_keep_input_order() {
    let out = run_rows(
        vec![("e", events())],
        vec![Action::Deduplicate {
            keys: vec!["k".into()],
            keep_last: true,
        }],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"k": 2, "v": "b"}),
            json!({"k": 1, "v": "c"}),
            json!({"k": null, "v": "n2"}),
        ]
    );
    let first = run_rows(
        vec![("e", events())],
        vec![Action::DeduplicateWithinWatermark {
            keys: vec!["k".into()],
        }],
    )
    .await;
    assert_eq!(
        first,
        vec![
            json!({"k": 2, "v": "b"}),
            json!({"k": 1, "v": "a"}),
            json!({"k": null, "v": "n1"}),
        ]
    );
    let err = run(
        vec![("e", events())],
        vec![Action::Deduplicate {
            keys: vec!["nope".into()],
            keep_last: false,
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL206");
}

// ---------------------------------------------------------------- explode

fn baskets() -> etlantic_core::data::Table {
    table(
        schema(&[("id", "integer"), ("items", "list<string>")]),
        &[
            json!({"id": 1, "items": ["b", "a"]}),
            json!({"id": 2, "items": []}),
            json!({"id": 3, "items": null}),
            json!({"id": 4, "items": ["c"]}),
        ],
    )
}

#[tokio::test]
async fn explode_inner_and_outer() {
    let explode = |outer| Action::Explode {
        column: "items".into(),
        alias: "item".into(),
        outer,
    };
    let out = run_rows(
        vec![("b", baskets())],
        vec![
            explode(false),
            Action::Limit {
                count: 10,
                offset: 0,
            },
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"id": 1, "items": ["b", "a"], "item": "b"}),
            json!({"id": 1, "items": ["b", "a"], "item": "a"}),
            json!({"id": 4, "items": ["c"], "item": "c"}),
        ]
    );
    let out = sorted(run_rows(vec![("b", baskets())], vec![explode(true)]).await);
    assert_eq!(
        out,
        sorted(vec![
            json!({"id": 1, "items": ["b", "a"], "item": "b"}),
            json!({"id": 1, "items": ["b", "a"], "item": "a"}),
            json!({"id": 2, "items": [], "item": null}),
            json!({"id": 3, "items": null, "item": null}),
            json!({"id": 4, "items": ["c"], "item": "c"}),
        ])
    );
    // Alias = the column itself: the list is replaced by its elements.
    let out = run_rows(
        vec![("b", baskets())],
        vec![Action::Explode {
            column: "items".into(),
            alias: "items".into(),
            outer: false,
        }],
    )
    .await;
    assert_eq!(
        sorted(out),
        sorted(vec![
            json!({"id": 1, "items": "b"}),
            json!({"id": 1, "items": "a"}),
            json!({"id": 4, "items": "c"}),
        ])
    );
    let err = run(
        vec![("b", baskets())],
        vec![Action::Explode {
            column: "id".into(),
            alias: "x".into(),
            outer: false,
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL302");
}

#[tokio::test]
async fn constant_join_conditions() {
    let a = table(schema(&[("a", "integer")]), &[json!({"a": 1})]);
    let empty = table(schema(&[("b", "integer")]), &[]);
    let join = |join_type| Action::Join {
        right: "b".into(),
        join_type,
        left_keys: vec![],
        right_keys: vec![],
        predicate: (join_type != JoinType::Cross).then(|| e("true")),
        null_safe: false,
        time_range: None,
    };
    let out = run_rows(
        vec![("a", a.clone()), ("b", empty.clone())],
        vec![join(JoinType::Left)],
    )
    .await;
    assert_eq!(out, vec![json!({"a": 1, "b": null})]);
    let out = run_rows(
        vec![("a", a.clone()), ("b", empty)],
        vec![join(JoinType::Cross)],
    )
    .await;
    assert!(out.is_empty());
    let one = table(schema(&[("b", "integer")]), &[json!({"b": 2})]);
    let out = run_rows(vec![("a", a), ("b", one)], vec![join(JoinType::Anti)]).await;
    assert!(out.is_empty());
}

#[tokio::test]
async fn a_relation_can_be_joined_and_unioned_with_itself() {
    let out = run_rows(
        vec![("left", left())],
        vec![Action::Join {
            right: "left".into(),
            join_type: JoinType::Semi,
            left_keys: vec!["k".into()],
            right_keys: vec!["k".into()],
            predicate: None,
            null_safe: false,
            time_range: None,
        }],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"k": 1, "l": "a"}),
            json!({"k": 2, "l": "c"}),
            json!({"k": 1, "l": "d"}),
        ]
    );
    let out = run_rows(
        vec![("left", left())],
        vec![Action::Union {
            other: "left".into(),
            by_name: true,
            allow_missing: false,
            distinct: true,
        }],
    )
    .await;
    assert_eq!(out.len(), 4);
}
