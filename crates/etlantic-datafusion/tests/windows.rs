//! `etlantic:window_aggregate` geometry in batch mode: tumbling, sliding and session
//! windows, exact bounds.

mod common;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use common::{e, run, run_rows, schema, sorted, table, ts};
use etlantic_core::ir::{Action, AggFunc, Aggregate, NamedExpr, SortKey, WindowKind, WindowSpec};
use etlantic_core::streaming::Duration;
use serde_json::json;
use std::sync::Arc;

fn events() -> etlantic_core::data::Table {
    table(
        schema(&[("user", "string"), ("ts", "datetime"), ("v", "integer")]),
        &[
            json!({"user": "a", "ts": "1970-01-01T00:00:00Z", "v": 1}),
            json!({"user": "a", "ts": "1970-01-01T00:00:03Z", "v": 2}),
            json!({"user": "b", "ts": "1970-01-01T00:00:01Z", "v": 10}),
            // exactly `gap` after the previous `a` event: the session continues
            json!({"user": "a", "ts": "1970-01-01T00:00:08Z", "v": 3}),
            // on a tumbling boundary: belongs to the next window
            json!({"user": "b", "ts": "1970-01-01T00:00:10Z", "v": 20}),
            // more than `gap` after 8s: a new session
            json!({"user": "a", "ts": "1970-01-01T00:00:14Z", "v": 4}),
            // before the epoch
            json!({"user": "c", "ts": "1969-12-31T23:59:55Z", "v": 100}),
            // no event time: in no window
            json!({"user": "a", "ts": null, "v": 1000}),
            json!({"user": null, "ts": "1970-01-01T00:00:02Z", "v": 7}),
        ],
    )
}

fn window(kind: WindowKind, group: bool) -> Action {
    Action::WindowAggregate {
        window: WindowSpec {
            time_column: "ts".into(),
            kind,
            allowed_lateness: etlantic_core::streaming::Duration::ZERO,
        },
        group_by: if group {
            vec![NamedExpr::column("user")]
        } else {
            vec![]
        },
        aggregates: vec![
            Aggregate {
                name: "n".into(),
                func: AggFunc::CountAll,
                arg: None,
            },
            Aggregate {
                name: "total".into(),
                func: AggFunc::Sum,
                arg: Some(e("v")),
            },
        ],
    }
}

fn by_window() -> Action {
    Action::Sort {
        keys: ["window_start", "user"]
            .iter()
            .map(|c| SortKey {
                expr: e(c),
                descending: false,
                nulls_first: true,
            })
            .collect(),
    }
}

#[tokio::test]
async fn tumbling_windows_are_epoch_aligned_and_half_open() {
    let out = run_rows(
        vec![("events", events())],
        vec![
            window(
                WindowKind::Tumbling {
                    size: Duration::from_secs(10),
                },
                true,
            ),
            by_window(),
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"window_start": "1969-12-31T23:59:50Z", "window_end": "1970-01-01T00:00:00Z", "user": "c", "n": 1, "total": 100}),
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:10Z", "user": null, "n": 1, "total": 7}),
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:10Z", "user": "a", "n": 3, "total": 6}),
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:10Z", "user": "b", "n": 1, "total": 10}),
            json!({"window_start": "1970-01-01T00:00:10Z", "window_end": "1970-01-01T00:00:20Z", "user": "a", "n": 1, "total": 4}),
            json!({"window_start": "1970-01-01T00:00:10Z", "window_end": "1970-01-01T00:00:20Z", "user": "b", "n": 1, "total": 20}),
        ]
    );
    let keys: Vec<&String> = out[0].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        vec!["window_start", "window_end", "user", "n", "total"]
    );
}

#[tokio::test]
async fn sliding_windows_contain_every_row_in_range() {
    let out = run_rows(
        vec![("events", events())],
        vec![
            window(
                WindowKind::Sliding {
                    size: Duration::from_secs(10),
                    slide: Duration::from_secs(5),
                },
                false,
            ),
            Action::Sort {
                keys: vec![SortKey {
                    expr: e("window_start"),
                    descending: false,
                    nulls_first: false,
                }],
            },
        ],
    )
    .await;
    // Events (s): -5, 0, 1, 2, 3, 8, 10, 14.
    assert_eq!(
        out,
        vec![
            // [-10, 0): -5
            json!({"window_start": "1969-12-31T23:59:50Z", "window_end": "1970-01-01T00:00:00Z", "n": 1, "total": 100}),
            // [-5, 5): -5, 0, 1, 2, 3
            json!({"window_start": "1969-12-31T23:59:55Z", "window_end": "1970-01-01T00:00:05Z", "n": 5, "total": 120}),
            // [0, 10): 0, 1, 2, 3, 8
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:10Z", "n": 5, "total": 23}),
            // [5, 15): 8, 10, 14
            json!({"window_start": "1970-01-01T00:00:05Z", "window_end": "1970-01-01T00:00:15Z", "n": 3, "total": 27}),
            // [10, 20): 10, 14
            json!({"window_start": "1970-01-01T00:00:10Z", "window_end": "1970-01-01T00:00:20Z", "n": 2, "total": 24}),
        ]
    );
}

#[tokio::test]
async fn sliding_windows_with_a_slide_that_does_not_divide_the_size() {
    let t = table(
        schema(&[("ts", "datetime")]),
        &[json!({"ts": "1970-01-01T00:00:07Z"})],
    );
    let out = sorted(
        run_rows(
            vec![("events", t)],
            vec![Action::WindowAggregate {
                window: WindowSpec {
                    time_column: "ts".into(),
                    kind: WindowKind::Sliding {
                        size: Duration::from_secs(10),
                        slide: Duration::from_secs(4),
                    },
                    allowed_lateness: etlantic_core::streaming::Duration::ZERO,
                },
                group_by: vec![],
                aggregates: vec![Aggregate {
                    name: "n".into(),
                    func: AggFunc::CountAll,
                    arg: None,
                }],
            }],
        )
        .await,
    );
    // Starts at multiples of 4 in (7-10, 7]: 0 and 4.
    assert_eq!(
        out,
        vec![
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:10Z", "n": 1}),
            json!({"window_start": "1970-01-01T00:00:04Z", "window_end": "1970-01-01T00:00:14Z", "n": 1}),
        ]
    );
}

#[tokio::test]
async fn session_windows_merge_touching_events_per_key() {
    let out = run_rows(
        vec![("events", events())],
        vec![
            window(
                WindowKind::Session {
                    gap: Duration::from_secs(5),
                },
                true,
            ),
            by_window(),
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            json!({"window_start": "1969-12-31T23:59:55Z", "window_end": "1970-01-01T00:00:00Z", "user": "c", "n": 1, "total": 100}),
            // a: 0, 3, 8 (8 - 3 == gap: same session) → [0, 8 + 5)
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:13Z", "user": "a", "n": 3, "total": 6}),
            // b: 1 and 10 are 9s apart: two sessions
            json!({"window_start": "1970-01-01T00:00:01Z", "window_end": "1970-01-01T00:00:06Z", "user": "b", "n": 1, "total": 10}),
            json!({"window_start": "1970-01-01T00:00:02Z", "window_end": "1970-01-01T00:00:07Z", "user": null, "n": 1, "total": 7}),
            json!({"window_start": "1970-01-01T00:00:10Z", "window_end": "1970-01-01T00:00:15Z", "user": "b", "n": 1, "total": 20}),
            // a: 14 is 6s after 8: a new session
            json!({"window_start": "1970-01-01T00:00:14Z", "window_end": "1970-01-01T00:00:19Z", "user": "a", "n": 1, "total": 4}),
        ]
    );
}

#[tokio::test]
async fn window_bounds_keep_the_time_columns_unit_and_zone() {
    let unit = TimeUnit::Millisecond;
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", ts(unit), true),
        Field::new("v", DataType::Int64, true),
    ]));
    let t = table(
        schema,
        &[
            json!({"ts": "1970-01-01T00:00:00.250Z", "v": 1}),
            json!({"ts": "1970-01-01T00:00:00.750Z", "v": 2}),
            json!({"ts": "1970-01-01T00:00:01.100Z", "v": 3}),
        ],
    );
    let out = run(
        vec![("events", t)],
        vec![Action::WindowAggregate {
            window: WindowSpec {
                time_column: "ts".into(),
                kind: WindowKind::Tumbling {
                    size: Duration::from_millis(500),
                },
                allowed_lateness: etlantic_core::streaming::Duration::ZERO,
            },
            group_by: vec![],
            aggregates: vec![Aggregate {
                name: "first_v".into(),
                func: AggFunc::First,
                arg: Some(e("v")),
            }],
        }],
    )
    .await
    .unwrap();
    assert_eq!(out.schema.field(0).data_type(), &ts(unit));
    assert_eq!(out.schema.field(1).data_type(), &ts(unit));
    assert_eq!(
        sorted(common::rows(&out)),
        sorted(vec![
            json!({"window_start": "1970-01-01T00:00:00Z", "window_end": "1970-01-01T00:00:00.500Z", "first_v": 1}),
            json!({"window_start": "1970-01-01T00:00:00.500Z", "window_end": "1970-01-01T00:00:01Z", "first_v": 2}),
            json!({"window_start": "1970-01-01T00:00:01Z", "window_end": "1970-01-01T00:00:01.500Z", "first_v": 3}),
        ])
    );
}

#[tokio::test]
async fn windows_need_a_timestamp_column() {
    let err = run(
        vec![("events", events())],
        vec![Action::WindowAggregate {
            window: WindowSpec {
                time_column: "v".into(),
                kind: WindowKind::Tumbling {
                    size: Duration::from_secs(1),
                },
                allowed_lateness: etlantic_core::streaming::Duration::ZERO,
            },
            group_by: vec![],
            aggregates: vec![],
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL302");
}
