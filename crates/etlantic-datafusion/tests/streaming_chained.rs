//! Chained stateful operators (Spark 3.5+ semantics, append mode): a window
//! aggregation's output is event time downstream (its window bounds), so a second
//! aggregation grouped by the windows, or a stream-stream join on them, finalises by the
//! same watermark in the same micro-batch; late rows are dropped once, by the first
//! operator; a restart resumes every operator of the chain from the checkpoint. And the
//! planning rules: chains in update or complete mode (`ETL407`), aggregations that group
//! windows by their start only (`ETL401`) and windows over windows (`ETL404`) are refused.
//!
//! The scenario (times in seconds after 2024-01-01T00:00:00Z, watermark 5 s): events
//! `(ts, user, amount)` counted per user in 10-second tumbling windows, then per window
//! the highest count and the number of users.

mod common;
mod streaming_support;

use etlantic_core::streaming::OutputMode;
use serde_json::{json, Value};
use streaming_support::*;

const TOP: &[(&str, &str)] = &[
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("top", "long"),
    ("users", "long"),
];

const PER_USER: &str = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {n: \"count_all()\"}}";

/// Events → count per user and window → highest count and users per window.
fn chain(name: &str, second: &str, mode: OutputMode) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("per_user", &["events"], &[PER_USER])
        .transform_yaml("per_window", &["per_user"], &[second])
        .sink("out", "per_window", TOP, mode)
}

const PER_WINDOW: &str = "aggregate: {group_by: [window_start, window_end], aggregates: {top: \"max(n)\", users: \"count_all()\"}}";

fn top(start: i64, top: i64, users: i64) -> Value {
    json!({"window_start": ts(start), "window_end": ts(start + 10), "top": top, "users": users})
}

fn scenario() -> Vec<Vec<Value>> {
    vec![
        // Watermark after: 12 - 5 = 7 s; no window has ended.
        vec![ev(1, "a", 1), ev(2, "a", 1), ev(3, "b", 1), ev(12, "a", 1)],
        // 25 - 5 = 20 s: [0, 10) and [10, 20) end; both operators emit them in the
        // no-data micro-batch that follows.
        vec![ev(16, "b", 1), ev(25, "a", 1)],
        // 8 s is behind the watermark: dropped by the first operator (its window has
        // been emitted); 31 - 5 = 26 s ends nothing new.
        vec![ev(8, "a", 1), ev(31, "c", 1)],
        // 40 - 5 = 35 s: [20, 30) ends.
        vec![ev(40, "c", 1)],
    ]
}

fn expected() -> Vec<Vec<String>> {
    vec![
        vec![],
        rows(&[top(0, 2, 2), top(10, 1, 2)]),
        vec![],
        rows(&[top(20, 1, 1)]),
    ]
}

#[tokio::test]
async fn an_aggregation_of_windows_finalises_with_the_first_aggregation() {
    let fx = chain("chain_agg", PER_WINDOW, OutputMode::Append);
    let mut run = fx.start().await;
    let mut got = Vec::new();
    for batch in scenario() {
        got.push(run.step("events", batch, "out").await);
    }
    assert_eq!(got, expected());
    // The late row is counted once, by the first operator, in the third data batch.
    let dropped: Vec<u64> = run
        .progress()
        .iter()
        .map(|p| {
            p["stateOperators"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["numRowsDroppedByWatermark"].as_u64().unwrap_or(0))
                .sum::<u64>()
        })
        .collect();
    assert_eq!(dropped.iter().sum::<u64>(), 1, "{dropped:?}");
    // Both operators report state; the second holds no window it has emitted.
    let last = run.progress().last().cloned().unwrap();
    let ops = last["stateOperators"].as_array().unwrap();
    assert_eq!(ops.len(), 2);
    assert_eq!(ops[1]["numRowsTotal"], 0, "{last}");
}

#[tokio::test]
async fn a_restarted_chain_resumes_every_operator_from_the_checkpoint() {
    let fx = chain("chain_restart", PER_WINDOW, OutputMode::Append);
    let data = scenario();
    let mut got = Vec::new();
    {
        let mut run = fx.start().await;
        got.push(run.step("events", data[0].clone(), "out").await);
        // Batch 2's data micro-batch only: the no-data micro-batch it owes (which emits
        // through both operators) runs after the restart.
        run.push("events", &data[1]);
        assert!(run.query.run_once().await.unwrap());
        got.push(run.new_rows("out"));
    }
    let mut run = fx.start().await;
    run.new_rows("out");
    assert_eq!(run.query.process_all_available().await.unwrap(), 1);
    got.last_mut().unwrap().extend(run.new_rows("out"));
    got.last_mut().unwrap().sort();
    for batch in data[2..].iter().cloned() {
        got.push(run.step("events", batch, "out").await);
    }
    assert_eq!(got, expected());
}

#[tokio::test]
async fn a_window_aggregation_joins_the_stream_it_aggregates() {
    // Each event with the highest amount of its window (Nexmark q7's shape).
    let fx = Fixture::new("chain_join")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml(
            "maxes",
            &["events"],
            &["window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, aggregates: {best: \"max(amount)\"}}"],
        )
        .transform_yaml(
            "best",
            &["events", "maxes"],
            &[
                "join: {right: maxes, on: {left: [amount], right: [best]}, predicate: \"ts >= window_start && ts < window_end\", time_range: {left: ts, right: window_end, lower: 10 seconds, upper: 0 seconds}}",
                "select: [ts, user, amount]",
            ],
        )
        .sink("out", "best", EVENTS, OutputMode::Append);
    let mut run = fx.start().await;
    let mut got = Vec::new();
    for batch in [
        vec![ev(1, "a", 5), ev(4, "b", 7), ev(6, "c", 7), ev(12, "a", 3)],
        // 25 - 5 = 20 s: [0, 10) and [10, 20) end.
        vec![ev(15, "b", 2), ev(25, "a", 1)],
        // 8 s is late for both operators; 40 - 5 = 35 s ends [20, 30).
        vec![ev(8, "z", 100), ev(40, "c", 9)],
    ] {
        got.push(run.step("events", batch, "out").await);
    }
    assert_eq!(
        got,
        vec![
            vec![],
            rows(&[ev(4, "b", 7), ev(6, "c", 7), ev(12, "a", 3)]),
            rows(&[ev(25, "a", 1)]),
        ]
    );
    // The join's state is evicted by the watermark (35 s): a window's maximum is
    // dropped once emitted, an event once no window that can still be emitted holds it
    // (Spark's bound: ts <= watermark - 10 s - 1 ms), so the 25 s and 40 s events remain.
    let last = run.progress().last().cloned().unwrap();
    let join = last["stateOperators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["operatorName"] == "symmetricHashJoin")
        .cloned()
        .unwrap_or_else(|| panic!("a join operator: {last}"));
    assert_eq!(join["numRowsTotal"], 2, "{join}");
}

#[tokio::test]
async fn chains_the_runtime_cannot_finalise_are_refused_with_codes() {
    // Append mode, grouped by the windows: accepted.
    assert_eq!(
        codes_of(&chain("chain_ok", PER_WINDOW, OutputMode::Append)),
        (true, vec![])
    );
    // Update and complete mode: the first aggregation's rows would change.
    for mode in [OutputMode::Update, OutputMode::Complete] {
        let (ok, codes) = codes_of(&chain("chain_mode", PER_WINDOW, mode));
        assert!(
            !ok && codes.contains(&"ETL407".to_string()),
            "{mode:?}: {codes:?}"
        );
    }
    // Grouped by the window start only: a window's start can be behind the watermark
    // when it is emitted.
    let by_start = "aggregate: {group_by: [window_start], aggregates: {top: \"max(n)\", users: \"count_all()\"}}";
    let fx = Fixture::new("chain_start")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("per_user", &["events"], &[PER_USER])
        .transform_yaml("per_window", &["per_user"], &[by_start])
        .sink(
            "out",
            "per_window",
            &[
                ("window_start", "timestamp"),
                ("top", "long"),
                ("users", "long"),
            ],
            OutputMode::Append,
        );
    assert_eq!(codes_of(&fx), (false, vec!["ETL401".to_string()]));
    // A window over another window's bounds.
    let over = "window_aggregate: {window: {type: tumbling, column: window_end, size: 1 minute}, aggregates: {top: \"max(n)\", users: \"count_all()\"}}";
    assert_eq!(
        codes_of(&chain("chain_window", over, OutputMode::Append)),
        (false, vec!["ETL404".to_string()])
    );
}
