//! Chained stateful operators (Spark 3.5+ semantics): a window aggregation's output is
//! event time downstream (its window bounds), so a second aggregation grouped by the
//! windows, or a stream-stream join on them, finalises by the same watermark in the same
//! micro-batch; late rows are dropped once, by the first operator; a restart resumes
//! every operator of the chain from the checkpoint. Every operator but the last runs in
//! append mode, so the last one may run in update or complete mode. An aggregation reads
//! an inner stream-stream join's output by the watermark less the join's time range
//! (Nexmark q4's shape). And the planning rules: chains whose inner aggregation cannot
//! finalise in update or complete mode (`ETL407`), aggregations that group windows by
//! their start only (`ETL401`), windows over windows and stateful steps other than
//! aggregations after a join (`ETL404`) are refused.
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

/// Events → `first` (transformation `per_user`) → `second` (`per_window`) → sink `out`
/// with the columns `cols`.
fn two_steps(
    name: &str,
    first: &str,
    second: &str,
    cols: &[(&str, &str)],
    mode: OutputMode,
) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("per_user", &["events"], &[first])
        .transform_yaml("per_window", &["per_user"], &[second])
        .sink("out", "per_window", cols, mode)
}

/// Events → count per user and window → highest count and users per window.
fn chain(name: &str, second: &str, mode: OutputMode) -> Fixture {
    two_steps(name, PER_USER, second, TOP, mode)
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
    // Update and complete mode: the windows are final before the second aggregation
    // reads them, and only the second runs in the sink's mode.
    for mode in [OutputMode::Update, OutputMode::Complete] {
        assert_eq!(
            codes_of(&chain("chain_mode", PER_WINDOW, mode)),
            (true, vec![]),
            "{mode:?}"
        );
    }
    // An inner aggregation that never finalises (no window, no event-time key): its
    // rows would change under the second one.
    let per_user_ever = "aggregate: {group_by: [user], aggregates: {n: \"count_all()\"}}";
    let counts = "aggregate: {aggregates: {top: \"max(n)\", users: \"count_all()\"}}";
    for mode in [OutputMode::Update, OutputMode::Complete] {
        let cols = &[("top", "long"), ("users", "long")];
        let fx = two_steps("chain_never_final", per_user_ever, counts, cols, mode);
        assert_eq!(
            codes_of(&fx),
            (false, vec!["ETL407".to_string()]),
            "{mode:?}"
        );
    }
    // Grouped by the window start only: a window's start can be behind the watermark
    // when it is emitted.
    let by_start = "aggregate: {group_by: [window_start], aggregates: {top: \"max(n)\", users: \"count_all()\"}}";
    let cols = &[
        ("window_start", "timestamp"),
        ("top", "long"),
        ("users", "long"),
    ];
    let fx = two_steps("chain_start", PER_USER, by_start, cols, OutputMode::Append);
    assert_eq!(codes_of(&fx), (false, vec!["ETL401".to_string()]));
    // A window over another window's bounds.
    let over = "window_aggregate: {window: {type: tumbling, column: window_end, size: 1 minute}, aggregates: {top: \"max(n)\", users: \"count_all()\"}}";
    assert_eq!(
        codes_of(&chain("chain_window", over, OutputMode::Append)),
        (false, vec!["ETL404".to_string()])
    );
}

/// The second aggregation of [`chain`] over all windows: how many counts of a user in a
/// window, and the highest.
const OVER_WINDOWS: &str = "aggregate: {aggregates: {counts: \"count_all()\", top: \"max(n)\"}}";

fn totals(counts: i64, top: i64) -> Value {
    json!({"counts": counts, "top": top})
}

#[tokio::test]
async fn a_final_window_aggregation_feeds_an_aggregation_in_update_and_complete_mode() {
    let cols = &[("counts", "long"), ("top", "long")];
    for mode in [OutputMode::Update, OutputMode::Complete] {
        let fx = two_steps("chain_update", PER_USER, OVER_WINDOWS, cols, mode);
        let mut run = fx.start().await;
        let mut got = Vec::new();
        for batch in scenario() {
            let new = run.step("events", batch, "out").await;
            got.push(match mode {
                OutputMode::Complete if run.writes("out") > 0 => run.last_write("out"),
                _ => new,
            });
        }
        // Each window's counts reach the second aggregation once, final: a and b in
        // [0, 10) and [10, 20) in the second data batch's no-data micro-batch, c in
        // [20, 30) in the fourth. The late row of the third batch is dropped by the
        // first aggregation.
        let want = match mode {
            OutputMode::Update => {
                vec![vec![], rows(&[totals(4, 2)]), vec![], rows(&[totals(5, 2)])]
            }
            _ => vec![
                vec![],
                rows(&[totals(4, 2)]),
                rows(&[totals(4, 2)]),
                rows(&[totals(5, 2)]),
            ],
        };
        assert_eq!(got, want, "{mode:?}");
    }
}

/// Openings of items `{ots, item, category}`: bids on an item count for 10 seconds
/// after it opens.
const OPENS: &[(&str, &str)] = &[
    ("ots", "timestamp"),
    ("item", "string"),
    ("category", "string"),
];

fn open(secs: i64, item: &str, category: &str) -> Value {
    json!({"ots": ts(secs), "item": item, "category": category})
}

/// A pipeline `name` with the sources `events` (bids: `ts`, `user` = the item, `amount`)
/// and `opens`, both with a 5-second watermark.
fn bids_and_openings(name: &str) -> Fixture {
    Fixture::new(name)
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .source(Src {
            cols: OPENS,
            ..Src::new("opens").watermark("ots", "5 seconds")
        })
}

/// Bids (`events`: `ts`, `user` = the item, `amount`) joined with their item's opening
/// (a bid counts up to 10 s after it), the best bid per item once no bid can still
/// count, and per category the items and their average best bid: Nexmark q4's shape.
fn best_bids(name: &str, mode: OutputMode) -> Fixture {
    bids_and_openings(name)
        .transform_yaml(
            "best",
            &["events", "opens"],
            &[
                "join: {right: opens, on: {left: [user], right: [item]}, time_range: {left: ts, right: ots, lower: 0 seconds, upper: 10 seconds}}",
                "select: [item, category, ots, amount]",
                "aggregate: {group_by: [item, category, ots], aggregates: {best: \"max(amount)\"}}",
            ],
        )
        .transform_yaml(
            "per_category",
            &["best"],
            &["aggregate: {group_by: [category], aggregates: {items: \"count_all()\", avg_best: \"avg(best)\"}}"],
        )
        .sink(
            "out",
            "per_category",
            &[("category", "string"), ("items", "long"), ("avg_best", "double")],
            mode,
        )
}

fn category(name: &str, items: i64, avg_best: f64) -> Value {
    json!({"category": name, "items": items, "avg_best": avg_best})
}

/// Per scenario batch: openings and bids. Watermark 5 s on both; the global one is the
/// lower. The best bid of an item is final once the watermark is 10 s past its opening.
fn auction_scenario() -> Vec<(Vec<Value>, Vec<Value>)> {
    vec![
        // Watermark after: min(14, 3) - 5 = -2 s. The 14 s bid on c is outside c's 10 s.
        (
            vec![open(1, "a", "X"), open(2, "b", "X"), open(3, "c", "Y")],
            vec![
                ev(2, "a", 5),
                ev(4, "a", 8),
                ev(3, "b", 4),
                ev(14, "c", 1),
                ev(5, "c", 2),
            ],
        ),
        // 12 s is within b's 10 s (both ends count). Watermark min(22, 20) - 5 = 15 s:
        // a, b and c (opened at or before 15 - 10 = 5 s) are final: a 8, b 6, c 2. g
        // opened at 12 s, behind the watermark, and can still take bids until 22 s.
        (
            vec![open(20, "d", "Y"), open(12, "g", "Y")],
            vec![ev(12, "b", 6), ev(22, "d", 7), ev(13, "g", 3)],
        ),
        // The 8 s bid on a is behind the watermark (15 s): dropped by the join. The 18 s
        // bid on g is not, and joins g (12 s). d's best becomes 9. Watermark 25 s: g
        // (opened at or before 25 - 10 = 15 s) is final, with 7.
        (
            vec![open(30, "e", "X")],
            vec![
                ev(8, "a", 100),
                ev(31, "e", 4),
                ev(29, "d", 9),
                ev(18, "g", 7),
            ],
        ),
        // Watermark 45 s: d (20 s) and e (30 s) are final; f (50 s) is not.
        (vec![open(50, "f", "X")], vec![ev(50, "f", 1)]),
    ]
}

/// What [`auction_scenario`] writes per batch in update mode.
fn expected_categories() -> Vec<Vec<String>> {
    vec![
        vec![],
        rows(&[category("X", 2, 7.0), category("Y", 1, 2.0)]),
        rows(&[category("Y", 2, 4.5)]),
        rows(&[category("X", 3, 6.0), category("Y", 3, 6.0)]),
    ]
}

#[tokio::test]
async fn an_aggregation_finalises_a_joins_output_by_the_watermark_less_its_time_range() {
    for mode in [OutputMode::Update, OutputMode::Complete] {
        let fx = best_bids("join_then_aggregate", mode);
        let mut run = fx.start().await;
        let mut got = Vec::new();
        for (opens, bids) in auction_scenario() {
            run.feed(&[("opens", opens), ("events", bids)]).await;
            let new = run.new_rows("out");
            got.push(match mode {
                OutputMode::Complete if run.writes("out") > 0 => run.last_write("out"),
                _ => new,
            });
        }
        let want = match mode {
            OutputMode::Update => expected_categories(),
            _ => vec![
                vec![],
                rows(&[category("X", 2, 7.0), category("Y", 1, 2.0)]),
                rows(&[category("X", 2, 7.0), category("Y", 2, 4.5)]),
                rows(&[category("X", 3, 6.0), category("Y", 3, 6.0)]),
            ],
        };
        assert_eq!(got, want, "{mode:?}");
        // The late bid is counted once, by the join; the best-bid aggregation holds
        // only f, the category aggregation both categories.
        let progress = run.progress();
        let dropped: u64 = progress
            .iter()
            .flat_map(|p| p["stateOperators"].as_array().unwrap().clone())
            .map(|o| o["numRowsDroppedByWatermark"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(dropped, 1, "{mode:?}");
        let last = progress.last().unwrap();
        let totals: Vec<u64> = last["stateOperators"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["operatorName"] != "symmetricHashJoin")
            .map(|o| o["numRowsTotal"].as_u64().unwrap())
            .collect();
        assert_eq!(totals, vec![1, 2], "{mode:?}: {last}");
    }
}

#[tokio::test]
async fn a_restarted_join_and_aggregation_chain_resumes_from_the_checkpoint() {
    let fx = best_bids("join_then_aggregate_restart", OutputMode::Update);
    let data = auction_scenario();
    let mut got = Vec::new();
    for (opens, bids) in data {
        // A new query (a restart) for every scenario batch.
        let mut run = fx.start().await;
        run.new_rows("out");
        run.feed(&[("opens", opens), ("events", bids)]).await;
        got.push(run.new_rows("out"));
    }
    assert_eq!(got, expected_categories());
}

#[tokio::test]
async fn only_aggregations_by_a_bounded_event_time_follow_a_join() {
    assert_eq!(
        codes_of(&best_bids("join_ok", OutputMode::Complete)),
        (true, vec![])
    );
    let by_item_ots: &[(&str, &str)] = &[("item", "string"), ("ots", "timestamp"), ("n", "long")];
    let joined: &[(&str, &str)] = &[
        ("ts", "timestamp"),
        ("user", "string"),
        ("amount", "long"),
        ("ots", "timestamp"),
        ("item", "string"),
        ("category", "string"),
    ];
    let join_then = |name: &str, join: &str, then: &str, cols, mode: OutputMode| {
        bids_and_openings(name)
            .transform_yaml("j", &["events", "opens"], &[join, then])
            .sink("out", "j", cols, mode)
    };
    let ranged = "join: {right: opens, on: {left: [user], right: [item]}, time_range: {left: ts, right: ots, lower: 0 seconds, upper: 10 seconds}}";
    let unranged = "join: {right: opens, on: {left: [user], right: [item]}}";
    let outer = "join: {right: opens, on: {left: [user], right: [item]}, how: left, time_range: {left: ts, right: ots, lower: 0 seconds, upper: 10 seconds}}";
    let by_ots = "aggregate: {group_by: [item, ots], aggregates: {n: \"count_all()\"}}";
    let dedup = "deduplicate: {keys: [item, ots]}";
    for (name, join, then, cols, code) in [
        // Without a time range nothing bounds how late `ots` can come out of the join.
        ("join_unranged", unranged, by_ots, by_item_ots, "ETL401"),
        // An outer join emits its unmatched rows late by nothing bounded.
        ("join_outer", outer, by_ots, by_item_ots, "ETL404"),
        // Only aggregations read a join's output.
        ("join_dedup", ranged, dedup, joined, "ETL404"),
    ] {
        let (ok, codes) = codes_of(&join_then(name, join, then, cols, OutputMode::Append));
        assert!(
            !ok && codes.contains(&code.to_string()),
            "{name}: {codes:?}"
        );
    }
    // The bounded chain in append mode.
    assert_eq!(
        codes_of(&join_then(
            "join_append",
            ranged,
            by_ots,
            by_item_ots,
            OutputMode::Append
        )),
        (true, vec![])
    );
}
