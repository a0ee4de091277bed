//! Stream-stream and stream-static joins on the embedded runtime, with exact expected
//! rows per scenario batch, state sizes from the progress records, late rows on both
//! sides, eviction by the watermark, outer rows at eviction, restarts from the
//! checkpoint, and the planning rules (Spark's supported-operation rules for joins).
//!
//! The stream-stream scenario (times in seconds after 2024-01-01T00:00:00Z):
//! impressions `(ad_id, imp_ts)` with a 10 s watermark, clicks `(click_ad, click_ts)`
//! with a 5 s watermark, joined on `ad_id = click_ad` and
//! `imp_ts BETWEEN click_ts - 20 s AND click_ts`. The left state keeps an impression
//! while `imp_ts > watermark - 20 s`, the right state a click while
//! `click_ts > watermark` (Spark's state-value watermarks, minus 1 ms).

mod common;
mod streaming_support;

use etlantic_core::model::SourceDef;
use etlantic_core::streaming::{LatePolicy, OutputMode, StaticRefresh};
use etlantic_datafusion::streaming::{ManualClock, StreamingOptions};
use serde_json::{json, Value};
use streaming_support::*;

const IMPS: &[(&str, &str)] = &[("ad_id", "string"), ("imp_ts", "timestamp")];
const CLICKS: &[(&str, &str)] = &[("click_ad", "string"), ("click_ts", "timestamp")];
const OUT: &[(&str, &str)] = &[
    ("ad_id", "string"),
    ("imp_ts", "timestamp"),
    ("click_ad", "string"),
    ("click_ts", "timestamp"),
];

fn imp(secs: i64, ad: &str) -> Value {
    json!({"ad_id": ad, "imp_ts": ts(secs)})
}

fn click(secs: i64, ad: &str) -> Value {
    json!({"click_ad": ad, "click_ts": ts(secs)})
}

/// An output row; `None` is the null side of an outer row.
fn out(i: Option<(i64, &str)>, c: Option<(i64, &str)>) -> Value {
    json!({
        "ad_id": i.map(|x| x.1), "imp_ts": i.map(|x| ts(x.0)),
        "click_ad": c.map(|x| x.1), "click_ts": c.map(|x| ts(x.0)),
    })
}

const RANGE: &str =
    "time_range: {left: imp_ts, right: click_ts, lower: 20 seconds, upper: 0 seconds}";

/// Impressions joined with clicks, `how` and `extra` (e.g. the time range) in the step.
fn join_fixture(
    name: &str,
    how: &str,
    imp_wm: Option<&str>,
    click_wm: Option<&str>,
    extra: &str,
) -> Fixture {
    let step = format!(
        "join: {{right: clicks, on: {{left: [ad_id], right: [click_ad]}}, how: {how}{}{extra}}}",
        if extra.is_empty() { "" } else { ", " }
    );
    join_fixture_step(name, imp_wm, click_wm, &step)
}

/// Impressions joined with clicks by `step` (YAML).
fn join_fixture_step(
    name: &str,
    imp_wm: Option<&str>,
    click_wm: Option<&str>,
    step: &str,
) -> Fixture {
    let mut imps = Src::new("imps");
    if let Some(d) = imp_wm {
        imps = imps.watermark("imp_ts", d);
    }
    let mut clicks = Src::new("clicks");
    if let Some(d) = click_wm {
        clicks = clicks.watermark("click_ts", d);
    }
    imps_and_clicks(name, imps, clicks, step)
}

/// The sources `imps` and `clicks` (their columns set here) joined by `step` (YAML).
fn imps_and_clicks(name: &str, imps: Src<'_>, clicks: Src<'_>, step: &str) -> Fixture {
    Fixture::new(name)
        .source(Src { cols: IMPS, ..imps })
        .source(Src {
            cols: CLICKS,
            ..clicks
        })
        .transform_yaml("joined", &["imps", "clicks"], &[step])
        .sink("out", "joined", OUT, OutputMode::Append)
}

/// A join step of impressions with clicks by ad, `how`, within [`RANGE`].
fn ranged_join(how: &str) -> String {
    format!(
        "join: {{right: clicks, on: {{left: [ad_id], right: [click_ad]}}, how: {how}, {RANGE}}}"
    )
}

/// The scenario: a click before its impression (d), a click too late for its impression
/// (c), clicks without impressions (x, the second a), late rows on both sides in batch 3.
fn scenario() -> Vec<(Vec<Value>, Vec<Value>)> {
    vec![
        (
            vec![imp(0, "a"), imp(2, "b"), imp(4, "c")],
            vec![click(5, "a"), click(6, "x")],
        ),
        (
            vec![imp(10, "d")],
            vec![click(21, "b"), click(30, "c"), click(9, "d")],
        ),
        (vec![imp(40, "e")], vec![click(45, "e"), click(41, "a")]),
        (
            vec![imp(70, "f"), imp(12, "g")],
            vec![click(75, "f"), click(12, "d")],
        ),
        (vec![imp(120, "h")], vec![click(121, "h")]),
    ]
}

/// The inner matches per batch.
fn matches() -> Vec<Vec<Value>> {
    vec![
        vec![out(Some((0, "a")), Some((5, "a")))],
        vec![out(Some((2, "b")), Some((21, "b")))],
        vec![out(Some((40, "e")), Some((45, "e")))],
        vec![out(Some((70, "f")), Some((75, "f")))],
        vec![out(Some((120, "h")), Some((121, "h")))],
    ]
}

fn op(p: &Value, k: &str) -> u64 {
    p["stateOperators"][0][k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} in {p}"))
}

/// Runs the scenario; returns per batch: (rows, state rows after, late rows, micro-batches).
async fn run_scenario(fx: &Fixture) -> Vec<(Vec<String>, u64, u64, u64)> {
    let mut run = fx.start().await;
    let mut res = Vec::new();
    for (imps, clicks) in scenario() {
        let before = run.progress().len();
        let n = run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        let progress = run.progress();
        let new = &progress[before..];
        let state = op(new.last().expect("a micro-batch"), "numRowsTotal");
        let late: u64 = new.iter().map(|p| op(p, "numRowsDroppedByWatermark")).sum();
        res.push((run.new_rows("out"), state, late, n));
    }
    res
}

fn expect(got: &[(Vec<String>, u64, u64, u64)], outer: [Vec<Value>; 5], label: &str) {
    let base = matches();
    for (i, (rows_got, state, late, n)) in got.iter().enumerate() {
        let mut want = base[i].clone();
        want.extend(outer[i].clone());
        assert_eq!(*rows_got, rows(&want), "{label}: rows of batch {i}");
        // Same state sizes as Spark's numRowsTotal for every join type here.
        assert_eq!(
            *state,
            [5, 9, 5, 3, 2][i],
            "{label}: state rows after batch {i}"
        );
        assert_eq!(*late, [0, 0, 0, 2, 0][i], "{label}: late rows of batch {i}");
        // Every batch moves the watermark: a data and a no-data micro-batch.
        assert_eq!(*n, 2, "{label}: micro-batches of batch {i}");
    }
}

#[tokio::test]
async fn inner_join_with_a_time_range_late_rows_and_eviction() {
    let fx = join_fixture(
        "ssj_inner",
        "inner",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = run_scenario(&fx).await;
    expect(&got, Default::default(), "inner");
}

#[tokio::test]
async fn left_outer_join_emits_unmatched_impressions_when_they_are_evicted() {
    let fx = join_fixture(
        "ssj_left",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = run_scenario(&fx).await;
    expect(
        &got,
        [
            vec![],
            vec![],
            // watermark 00:30: impressions at or before 00:09.999 go; c never matched.
            vec![out(Some((4, "c")), None)],
            // watermark 01:00: d (its click came 1 s before it) goes unmatched.
            vec![out(Some((10, "d")), None)],
            vec![],
        ],
        "left",
    );
}

#[tokio::test]
async fn right_outer_join_emits_unmatched_clicks_when_they_are_evicted() {
    let fx = join_fixture(
        "ssj_right",
        "right",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = run_scenario(&fx).await;
    expect(
        &got,
        [
            vec![],
            vec![],
            // watermark 00:30: clicks at or before 00:29.999 go; x and d never matched.
            vec![out(None, Some((6, "x"))), out(None, Some((9, "d")))],
            // watermark 01:00: c (too late for its impression) and the second a.
            vec![out(None, Some((30, "c"))), out(None, Some((41, "a")))],
            vec![],
        ],
        "right",
    );
}

#[tokio::test]
async fn full_outer_join_emits_both_sides_unmatched_rows() {
    let fx = join_fixture(
        "ssj_full",
        "full",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = run_scenario(&fx).await;
    expect(
        &got,
        [
            vec![],
            vec![],
            vec![
                out(Some((4, "c")), None),
                out(None, Some((6, "x"))),
                out(None, Some((9, "d"))),
            ],
            vec![
                out(Some((10, "d")), None),
                out(None, Some((30, "c"))),
                out(None, Some((41, "a"))),
            ],
            vec![],
        ],
        "full",
    );
}

#[tokio::test]
async fn eviction_figures_and_watermarks_per_micro_batch() {
    let fx = join_fixture(
        "ssj_figures",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let mut run = fx.start().await;
    for (imps, clicks) in scenario() {
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
    }
    let p = run.progress();
    assert_eq!(p.len(), 10);
    let kind: Vec<&str> = p.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kind, ["data", "no_data"].repeat(5));
    assert!(p
        .iter()
        .all(|r| r["stateOperators"][0]["operatorName"] == "symmetricHashJoin"));
    let total: Vec<u64> = p.iter().map(|r| op(r, "numRowsTotal")).collect();
    assert_eq!(total, [5, 5, 9, 9, 12, 5, 7, 3, 5, 2]);
    let removed: Vec<u64> = p.iter().map(|r| op(r, "numRowsRemoved")).collect();
    // 00:30: impressions a b c and clicks a x b d; 01:00: impression d, clicks c e a;
    // 01:50: impressions e f, click f.
    assert_eq!(removed, [0, 0, 0, 0, 0, 7, 0, 4, 0, 3]);
    let updated: Vec<u64> = p.iter().map(|r| op(r, "numRowsUpdated")).collect();
    // Late rows are not buffered (batch 3: 2 of 4 rows).
    assert_eq!(updated, [5, 0, 4, 0, 3, 0, 2, 0, 2, 0]);
    let wm: Vec<&str> = p
        .iter()
        .map(|r| r["eventTime"]["watermark"].as_str().unwrap())
        .collect();
    assert_eq!(
        wm,
        [
            "1970-01-01T00:00:00.000Z",
            "2023-12-31T23:59:54.000Z",
            "2023-12-31T23:59:54.000Z",
            "2024-01-01T00:00:00.000Z",
            "2024-01-01T00:00:00.000Z",
            "2024-01-01T00:00:30.000Z",
            "2024-01-01T00:00:30.000Z",
            "2024-01-01T00:01:00.000Z",
            "2024-01-01T00:01:00.000Z",
            "2024-01-01T00:01:50.000Z",
        ]
    );
    assert!(p.iter().all(|r| op(r, "memoryUsedBytes") > 0));
    // The state snapshot of every version is in the checkpoint, once the query is closed
    // (the whole snapshot of version 10 is written in the background).
    run.query.close().await.expect("the query closes");
    let state = fx.checkpoint().join("state");
    let ops: Vec<_> = std::fs::read_dir(&state).unwrap().collect();
    assert_eq!(ops.len(), 1);
    let dir = ops[0].as_ref().unwrap().path();
    assert!(dir.join("10.arrow").exists(), "{}", dir.display());
}

#[tokio::test]
async fn an_inner_join_without_watermarks_keeps_all_state_and_reports_it() {
    let fx = join_fixture("ssj_nowm", "inner", None, None, RANGE);
    // Planning warns that the state is unbounded.
    let outcome = fx.plan_outcome();
    let codes: Vec<&str> = outcome
        .diagnostics
        .iter()
        .map(|d| d.code.as_str())
        .collect();
    assert_eq!(codes, ["ETL431"], "{:?}", outcome.diagnostics);
    let mut run = fx.start().await;
    let mut got = Vec::new();
    for (imps, clicks) in [
        (vec![imp(0, "a"), imp(1, "b")], vec![click(2, "a")]),
        // b@50 is too late for b@1; a@4 matches a@0 and a@3; a@3 is after a@2.
        (vec![imp(3, "a")], vec![click(50, "b"), click(4, "a")]),
        (vec![], vec![]),
        // Hours later, everything is still there to match.
        (vec![], vec![click(7200, "x"), click(5, "b")]),
    ] {
        let before = run.progress().len();
        let n = run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        assert_eq!(n, 1, "no watermark, no no-data batches");
        let p = run.progress();
        let last = p.last().unwrap();
        assert_eq!(p.len(), before + 1);
        assert!(last["eventTime"].get("watermark").is_none(), "{last}");
        got.push((
            run.new_rows("out"),
            op(last, "numRowsTotal"),
            op(last, "memoryUsedBytes"),
        ));
    }
    let rows_of: Vec<&Vec<String>> = got.iter().map(|g| &g.0).collect();
    assert_eq!(
        rows_of,
        [
            &rows(&[out(Some((0, "a")), Some((2, "a")))]),
            &rows(&[
                out(Some((0, "a")), Some((4, "a"))),
                out(Some((3, "a")), Some((4, "a"))),
            ]),
            &rows(&[]),
            &rows(&[out(Some((1, "b")), Some((5, "b")))]),
        ]
    );
    let states: Vec<u64> = got.iter().map(|g| g.1).collect();
    assert_eq!(states, [3, 6, 6, 8]);
    let bytes: Vec<u64> = got.iter().map(|g| g.2).collect();
    assert!(
        bytes[0] > 0 && bytes[1] > bytes[0] && bytes[3] > bytes[2],
        "{bytes:?}"
    );
}

#[tokio::test]
async fn null_keys_never_match_and_outer_sides_emit_them_at_eviction() {
    let data = [
        (
            vec![json!({"ad_id": null, "imp_ts": ts(0)}), imp(1, "a")],
            vec![json!({"click_ad": null, "click_ts": ts(2)}), click(3, "a")],
        ),
        (vec![imp(60, "b")], vec![click(61, "b")]),
    ];
    for (how, states, outer) in [
        // Inner: rows with a null key never enter the state.
        ("inner", [2, 2], vec![]),
        (
            "full",
            [4, 2],
            vec![
                json!({"ad_id": null, "imp_ts": ts(0), "click_ad": null, "click_ts": null}),
                json!({"ad_id": null, "imp_ts": null, "click_ad": null, "click_ts": ts(2)}),
            ],
        ),
    ] {
        let fx = join_fixture(
            &format!("ssj_nulls_{how}"),
            how,
            Some("10 seconds"),
            Some("5 seconds"),
            RANGE,
        );
        let mut run = fx.start().await;
        let mut all = Vec::new();
        for (i, (imps, clicks)) in data.iter().enumerate() {
            run.feed(&[("imps", imps.clone()), ("clicks", clicks.clone())])
                .await;
            all.push(run.new_rows("out"));
            let last = run.progress().last().cloned().unwrap();
            assert_eq!(op(&last, "numRowsTotal"), states[i], "{how} batch {i}");
        }
        assert_eq!(
            all[0],
            rows(&[out(Some((1, "a")), Some((3, "a")))]),
            "{how}"
        );
        let mut want = vec![out(Some((60, "b")), Some((61, "b")))];
        want.extend(outer);
        assert_eq!(all[1], rows(&want), "{how}");
    }
}

#[tokio::test]
async fn a_watermarked_time_key_evicts_both_sides_by_key() {
    // Join on (ad, time) equality: no range needed, the key predicate cleans the state.
    let fx = join_fixture_step(
        "ssj_keytime",
        Some("10 seconds"),
        Some("5 seconds"),
        "join: {right: clicks, on: {left: [ad_id, imp_ts], right: [click_ad, click_ts]}, how: left}",
    );
    let outcome = fx.plan_outcome();
    assert!(
        outcome.diagnostics.is_empty(),
        "watermark in the keys: valid and bounded: {:?}",
        outcome.diagnostics
    );
    let mut run = fx.start().await;
    let batches = vec![
        (
            vec![imp(0, "a"), imp(5, "b")],
            vec![click(0, "a"), click(6, "b")],
        ),
        (vec![imp(30, "c")], vec![click(30, "c")]),
        // Late on both sides (watermark 00:20); e waits.
        (vec![imp(15, "d"), imp(100, "e")], vec![click(18, "d")]),
    ];
    let mut got = Vec::new();
    for (imps, clicks) in batches {
        let before = run.progress().len();
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        let p = run.progress();
        let late: u64 = p[before..]
            .iter()
            .map(|r| op(r, "numRowsDroppedByWatermark"))
            .sum();
        got.push((
            run.new_rows("out"),
            op(p.last().unwrap(), "numRowsTotal"),
            late,
        ));
    }
    assert_eq!(got[0], (rows(&[out(Some((0, "a")), Some((0, "a")))]), 4, 0));
    // Watermark 00:20: rows with a key time at or before it go; b never matched.
    assert_eq!(
        got[1],
        (
            rows(&[
                out(Some((30, "c")), Some((30, "c"))),
                out(Some((5, "b")), None)
            ]),
            2,
            0
        )
    );
    assert_eq!(got[2], (rows(&[]), 3, 2));
}

#[tokio::test]
async fn a_join_predicate_decides_what_matched() {
    // imp_ts < click_ts: a@0 and its click at the same instant are in the range but do
    // not match, so a is emitted unmatched when it is evicted.
    let fx = join_fixture(
        "ssj_pred",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        &format!("{RANGE}, predicate: \"imp_ts < click_ts\""),
    );
    let mut run = fx.start().await;
    run.feed(&[
        ("imps", vec![imp(0, "a"), imp(10, "b")]),
        ("clicks", vec![click(0, "a"), click(12, "b")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[out(Some((10, "b")), Some((12, "b")))])
    );
    run.feed(&[
        ("imps", vec![imp(100, "z")]),
        ("clicks", vec![click(101, "z")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[
            out(Some((100, "z")), Some((101, "z"))),
            out(Some((0, "a")), None)
        ])
    );
}

#[tokio::test]
async fn late_rows_of_each_side_follow_that_sides_policy() {
    let fx = imps_and_clicks(
        "ssj_late",
        Src::new("imps").watermark("imp_ts", "10 seconds"),
        Src::new("clicks")
            .watermark("click_ts", "5 seconds")
            .late(LatePolicy::Quarantine),
        &ranged_join("left"),
    );
    let mut run = fx.start().await;
    for (imps, clicks) in scenario() {
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
    }
    // Batch 3's late impression g is dropped; its late click d is quarantined.
    let lines = fx.quarantined();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["code"], "ETL708");
    let raw: Value = serde_json::from_str(lines[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["click_ad"], "d");
    assert_eq!(lines[0]["batch_id"], 6);
    let p = run.progress();
    assert_eq!(p[6]["lateRows"], 2);
}

#[tokio::test]
async fn a_restarted_join_recovers_its_state_from_the_checkpoint() {
    // Uninterrupted.
    let fx = join_fixture(
        "ssj_ref",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let reference: Vec<Vec<String>> = run_scenario(&fx).await.into_iter().map(|r| r.0).collect();

    // Stopped after batch 1, and again between batch 2's data micro-batch and the
    // no-data micro-batch it owes (which evicts impression c and emits it).
    let fx = join_fixture(
        "ssj_restart",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let data = scenario();
    let mut got: Vec<Vec<String>> = Vec::new();
    {
        let mut run = fx.start().await;
        for (imps, clicks) in data[..2].iter().cloned() {
            run.feed(&[("imps", imps), ("clicks", clicks)]).await;
            got.push(run.new_rows("out"));
        }
    }
    {
        let mut run = fx.start().await;
        run.new_rows("out");
        let (imps, clicks) = data[2].clone();
        run.push("imps", &imps);
        run.push("clicks", &clicks);
        assert!(run.query.run_once().await.unwrap(), "the data micro-batch");
        got.push(run.new_rows("out"));
    }
    let mut run = fx.start().await;
    run.new_rows("out");
    // The owed no-data micro-batch runs first, from the restored state.
    assert_eq!(run.query.process_all_available().await.unwrap(), 1);
    let last = got.last_mut().unwrap();
    last.extend(run.new_rows("out"));
    last.sort();
    let p = run.progress();
    assert_eq!(p.last().unwrap()["kind"], "no_data");
    assert_eq!(op(p.last().unwrap(), "numRowsTotal"), 5);
    for (imps, clicks) in data[3..].iter().cloned() {
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        got.push(run.new_rows("out"));
    }
    assert_eq!(got, reference);
    // Nothing was written twice.
    let batches = run.written_batches("out");
    let mut dedup = batches.clone();
    dedup.dedup();
    assert_eq!(batches, dedup);
}

#[tokio::test]
async fn state_ttl_expires_join_rows_without_a_watermark() {
    use etlantic_core::streaming::Duration;
    let fx = join_fixture("ssj_ttl", "inner", None, None, RANGE).with_profile(|p| {
        p.state_ttl
            .insert("joined".into(), "1 hour".parse::<Duration>().unwrap());
    });
    let outcome = fx.plan_outcome();
    assert!(
        !outcome.diagnostics.iter().any(|d| d.code == "ETL431"),
        "a TTL bounds the state: {:?}",
        outcome.diagnostics
    );
    let mut run = fx.start().await;
    run.feed(&[("imps", vec![imp(0, "a")]), ("clicks", vec![click(1, "a")])])
        .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[out(Some((0, "a")), Some((1, "a")))])
    );
    let p = run.progress();
    assert_eq!(op(p.last().unwrap(), "numRowsTotal"), 2);
    assert_eq!(
        p.last().unwrap()["stateOperators"][0]["customMetrics"]["numRowsRemovedByTtl"],
        0
    );
}

#[tokio::test]
async fn a_bounded_join_applies_the_same_time_range() {
    use etlantic_core::ir::{Action, JoinTimeRange, JoinType};
    // The whole scenario as two tables: the batch join finds the streaming inner join's
    // matches, plus d@10 x d@12, whose click the stream dropped as late.
    let (mut imps, mut clicks) = (vec![], vec![]);
    for (i, c) in scenario() {
        imps.extend(i);
        clicks.extend(c);
    }
    let left = common::table(
        common::schema(&[("ad_id", "string"), ("imp_ts", "datetime")]),
        &imps,
    );
    let right = common::table(
        common::schema(&[("click_ad", "string"), ("click_ts", "datetime")]),
        &clicks,
    );
    let join = Action::Join {
        right: "right".into(),
        join_type: JoinType::Inner,
        left_keys: vec!["ad_id".into()],
        right_keys: vec!["click_ad".into()],
        predicate: None,
        null_safe: false,
        time_range: Some(JoinTimeRange {
            left: "imp_ts".into(),
            right: "click_ts".into(),
            lower: "20 seconds".parse().unwrap(),
            upper: "0 seconds".parse().unwrap(),
        }),
    };
    let got: Vec<String> = common::run_rows(vec![("left", left), ("right", right)], vec![join])
        .await
        .iter()
        .map(|r| {
            // Batch output carries µs timestamps with an offset; compare as instants.
            let mut r = r.clone();
            for k in ["imp_ts", "click_ts"] {
                let t = chrono::DateTime::parse_from_rfc3339(r[k].as_str().unwrap()).unwrap();
                r[k] = json!(ts_ms(t.timestamp_millis()));
            }
            canon(&r)
        })
        .collect::<Vec<_>>();
    let mut got = got;
    got.sort();
    let mut want: Vec<Value> = matches().into_iter().flatten().collect();
    want.push(out(Some((10, "d")), Some((12, "d"))));
    assert_eq!(got, rows(&want));
}

// ------------------------------------------------------------------ stream-static joins

const EVENTS: &[(&str, &str)] = &[
    ("ts", "timestamp"),
    ("campaign_id", "string"),
    ("user", "string"),
];
const CAMPAIGNS: &[(&str, &str)] = &[("id", "string"), ("name", "string")];
const ENRICHED: &[(&str, &str)] = &[
    ("ts", "timestamp"),
    ("campaign_id", "string"),
    ("user", "string"),
    ("id", "string"),
    ("name", "string"),
];

fn event(secs: i64, campaign: Option<&str>, user: &str) -> Value {
    json!({"ts": ts(secs), "campaign_id": campaign, "user": user})
}

fn enriched(secs: i64, campaign: Option<&str>, user: &str, name: Option<&str>) -> Value {
    json!({"ts": ts(secs), "campaign_id": campaign, "user": user,
           "id": name.and(campaign), "name": name})
}

fn static_fixture(
    name: &str,
    how: &str,
    refresh: StaticRefresh,
    binding: Option<String>,
) -> Fixture {
    let mut events = Src::new("events");
    events.cols = EVENTS;
    let mut fx = Fixture::new(name).source(events);
    fx.builder = fx
        .builder
        .asset_inline("campaigns", contract("campaigns", CAMPAIGNS))
        .source_def(SourceDef {
            static_refresh: Some(refresh),
            ..SourceDef::new("campaigns", "campaigns")
        });
    let binding = binding.unwrap_or_else(|| format!("memory://{}", fx.mem("campaigns")));
    fx.profile.bindings.insert("campaigns".into(), binding);
    fx.transform_yaml(
        "enriched",
        &["events", "campaigns"],
        &[&format!(
            "join: {{right: campaigns, on: {{left: [campaign_id], right: [id]}}, how: {how}}}"
        )],
    )
    .sink("out", "enriched", ENRICHED, OutputMode::Append)
}

#[tokio::test]
async fn stream_static_join_reads_the_table_per_batch_or_cached() {
    let v1 = vec![json!({"id": "c1", "name": "spring"})];
    let v2 = vec![json!({"id": "c2", "name": "summer"})];
    let hour = StaticRefresh::Interval("1 hour".parse().unwrap());
    for (refresh, sees_update) in [(StaticRefresh::PerBatch, true), (hour, false)] {
        let fx = static_fixture(&format!("ssj_static_{sees_update}"), "left", refresh, None);
        assert!(fx.plan_outcome().diagnostics.is_empty());
        let mut run = fx.start().await;
        run.push("campaigns", &v1);
        run.feed(&[(
            "events",
            vec![
                event(1, Some("c1"), "a"),
                event(2, Some("c2"), "b"),
                event(3, None, "n"),
            ],
        )])
        .await;
        assert_eq!(
            run.new_rows("out"),
            rows(&[
                enriched(1, Some("c1"), "a", Some("spring")),
                enriched(2, Some("c2"), "b", None),
                enriched(3, None, "n", None),
            ])
        );
        // The table changes; the next micro-batch sees it unless the copy is cached.
        run.push("campaigns", &v2);
        run.feed(&[("events", vec![event(4, Some("c2"), "c")])])
            .await;
        let want = if sees_update {
            enriched(4, Some("c2"), "c", Some("summer"))
        } else {
            enriched(4, Some("c2"), "c", None)
        };
        assert_eq!(run.new_rows("out"), rows(&[want]), "{refresh}");
        // Static rows are not input rows of the stream; no state, one micro-batch each.
        let p = run.progress();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0]["numInputRows"], 3);
        assert_eq!(p[0]["sources"].as_array().unwrap().len(), 1);
        assert!(p[0]["stateOperators"].as_array().unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_cached_static_table_is_read_again_after_its_interval() {
    let refresh = StaticRefresh::Interval("200 milliseconds".parse().unwrap());
    let fx = static_fixture("ssj_static_expiry", "inner", refresh, None);
    let mut run = fx.start().await;
    run.push("campaigns", &[json!({"id": "c1", "name": "spring"})]);
    run.feed(&[("events", vec![event(1, Some("c1"), "a")])])
        .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[enriched(1, Some("c1"), "a", Some("spring"))])
    );
    run.push("campaigns", &[json!({"id": "c2", "name": "summer"})]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    run.feed(&[("events", vec![event(2, Some("c2"), "b")])])
        .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[enriched(2, Some("c2"), "b", Some("summer"))])
    );
}

#[tokio::test]
async fn a_static_file_is_read_as_a_bounded_table_for_every_batch() {
    let fx = static_fixture(
        "ssj_static_file",
        "inner",
        StaticRefresh::PerBatch,
        Some("file://campaigns.jsonl".into()),
    );
    let file = fx.dir.path().join("campaigns.jsonl");
    std::fs::write(&file, "{\"id\": \"c1\", \"name\": \"spring\"}\n").unwrap();
    let mut run = fx.start().await;
    run.feed(&[(
        "events",
        vec![event(1, Some("c1"), "a"), event(2, Some("c2"), "b")],
    )])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[enriched(1, Some("c1"), "a", Some("spring"))])
    );
    std::fs::write(
        &file,
        "{\"id\": \"c1\", \"name\": \"spring\"}\n{\"id\": \"c2\", \"name\": \"summer\"}\n{\"id\": \"c2\", \"name\": \"dup\"}\n",
    )
    .unwrap();
    run.feed(&[("events", vec![event(3, Some("c2"), "c")])])
        .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[
            enriched(3, Some("c2"), "c", Some("summer")),
            enriched(3, Some("c2"), "c", Some("dup")),
        ])
    );
}

#[tokio::test]
async fn a_static_table_can_be_prepared_by_a_transformation_before_the_join() {
    // campaigns (static) -> count per id (a batch aggregation, every micro-batch) ->
    // joined with the stream.
    let mut events = Src::new("events");
    events.cols = EVENTS;
    let mut fx = Fixture::new("sst_prepared").source(events);
    fx.builder = fx
        .builder
        .asset_inline("campaigns", contract("campaigns", CAMPAIGNS))
        .source_def(SourceDef {
            static_refresh: Some(StaticRefresh::PerBatch),
            ..SourceDef::new("campaigns", "campaigns")
        });
    let binding = format!("memory://{}", fx.mem("campaigns"));
    fx.profile.bindings.insert("campaigns".into(), binding);
    let fx = fx
        .transform_yaml(
            "variants",
            &["campaigns"],
            &["aggregate: {group_by: [id], aggregates: {variants: \"count_all()\"}}"],
        )
        .transform_yaml(
            "enriched",
            &["events", "variants"],
            &["join: {right: variants, on: {left: [campaign_id], right: [id]}}"],
        )
        .sink(
            "out",
            "enriched",
            &[
                ("ts", "timestamp"),
                ("campaign_id", "string"),
                ("user", "string"),
                ("id", "string"),
                ("variants", "long"),
            ],
            OutputMode::Append,
        );
    assert!(
        fx.plan_outcome().diagnostics.is_empty(),
        "{:?}",
        fx.plan_outcome().diagnostics
    );
    let mut run = fx.start().await;
    run.push(
        "campaigns",
        &[
            json!({"id": "c1", "name": "spring"}),
            json!({"id": "c1", "name": "spring-b"}),
            json!({"id": "c2", "name": "summer"}),
        ],
    );
    run.feed(&[("events", vec![event(1, Some("c1"), "a")])])
        .await;
    run.feed(&[(
        "events",
        vec![event(2, Some("c1"), "b"), event(3, Some("c2"), "c")],
    )])
    .await;
    let row = |secs: i64, c: &str, u: &str, n: i64| json!({"ts": ts(secs), "campaign_id": c, "user": u, "id": c, "variants": n});
    assert_eq!(
        run.new_rows("out"),
        rows(&[
            row(1, "c1", "a", 2),
            row(2, "c1", "b", 2),
            row(3, "c2", "c", 1)
        ])
    );
}

// ------------------------------------------------------------------ planning rules

#[tokio::test]
async fn outer_joins_of_streams_need_a_watermark_on_the_nullable_side_and_a_range() {
    let w = Some("10 seconds");
    for (how, lw, rw, extra, ok, codes) in [
        ("left", None, None, RANGE, false, vec!["ETL430"]),
        ("left", w, w, "", false, vec!["ETL430"]),
        ("left", w, None, RANGE, false, vec!["ETL430"]),
        // Spark accepts it, but impressions are never evicted, so never emitted.
        ("left", None, w, RANGE, true, vec!["ETL431"]),
        ("right", None, w, RANGE, false, vec!["ETL430"]),
        ("right", w, None, RANGE, true, vec!["ETL431"]),
        ("full", w, None, RANGE, false, vec!["ETL430"]),
        ("full", w, w, RANGE, true, vec![]),
        ("inner", w, w, "", true, vec!["ETL431"]),
        ("inner", w, w, RANGE, true, vec![]),
    ] {
        let fx = join_fixture("ssj_rules", how, lw, rw, extra);
        let (planned, got) = codes_of(&fx);
        assert_eq!(
            (planned, got.clone()),
            (ok, codes.iter().map(|c| c.to_string()).collect::<Vec<_>>()),
            "{how} {lw:?} {rw:?} {extra:?}: {got:?}"
        );
    }
}

#[tokio::test]
async fn unsupported_stream_joins_are_refused_with_codes() {
    let w = Some("10 seconds");
    // Update mode.
    let fx = join_fixture("ssj_upd", "inner", w, w, RANGE);
    let fx = Fixture {
        builder: {
            let mut p = fx.builder.clone().build();
            p.sinks[0].output_mode = Some(OutputMode::Update);
            rebuild(p)
        },
        ..fx
    };
    assert_eq!(codes_of(&fx), (false, vec!["ETL409".to_string()]));
    // Semi joins and joins without keys.
    for (name, step) in [
        (
            "semi",
            "join: {right: clicks, on: {left: [ad_id], right: [click_ad]}, how: semi}",
        ),
        (
            "keyless",
            "join: {right: clicks, on: \"ad_id == click_ad\"}",
        ),
    ] {
        let mut imps = Src::new("imps").watermark("imp_ts", "10 seconds");
        imps.cols = IMPS;
        let mut clicks = Src::new("clicks").watermark("click_ts", "10 seconds");
        clicks.cols = CLICKS;
        let fx = Fixture::new(name)
            .source(imps)
            .source(clicks)
            .transform_yaml("joined", &["imps", "clicks"], &[step])
            .sink(
                "out",
                "joined",
                if name == "semi" { IMPS } else { OUT },
                OutputMode::Append,
            );
        assert_eq!(codes_of(&fx), (false, vec!["ETL404".to_string()]), "{name}");
    }
    // A stateful step other than an aggregation after the join (an aggregation by a
    // column the time range bounds is accepted: see `streaming_chained`).
    let mut imps = Src::new("imps").watermark("imp_ts", "10 seconds");
    imps.cols = IMPS;
    let mut clicks = Src::new("clicks").watermark("click_ts", "10 seconds");
    clicks.cols = CLICKS;
    let fx = Fixture::new("ssj_agg_after")
        .source(imps)
        .source(clicks)
        .transform_yaml(
            "joined",
            &["imps", "clicks"],
            &[
                &format!(
                    "join: {{right: clicks, on: {{left: [ad_id], right: [click_ad]}}, {RANGE}}}"
                ),
                "deduplicate: {keys: [ad_id, imp_ts]}",
            ],
        )
        .sink("out", "joined", OUT, OutputMode::Append);
    assert_eq!(codes_of(&fx), (false, vec!["ETL404".to_string()]));
}

fn rebuild(p: etlantic_core::model::Pipeline) -> etlantic_core::model::PipelineBuilder {
    let mut b = etlantic_core::model::Pipeline::builder(&p.name);
    for (k, a) in &p.assets {
        b = b.asset_inline(
            k.clone(),
            match &a.contract {
                etlantic_core::model::ContractRef::Inline(v) => v.clone(),
                _ => unreachable!(),
            },
        );
    }
    for s in p.sources {
        b = b.source_def(s);
    }
    for t in p.transforms {
        let mut tb = etlantic_core::model::TransformBuilder::new(&t.id);
        for (port, r) in &t.inputs {
            tb = tb.input(port.clone(), r.from());
        }
        for s in t.steps.unwrap_or_default() {
            tb = tb.step(s.0);
        }
        b = b.transform(tb);
    }
    for s in p.sinks {
        b = b.sink_def(s);
    }
    b
}

#[tokio::test]
async fn static_sources_are_refused_where_they_cannot_work() {
    // A static side that an outer join would have to keep.
    let fx = static_fixture("sst_right", "right", StaticRefresh::PerBatch, None);
    assert_eq!(codes_of(&fx), (false, vec!["ETL404".to_string()]));
    let fx = static_fixture("sst_full", "full", StaticRefresh::PerBatch, None);
    assert_eq!(codes_of(&fx), (false, vec!["ETL404".to_string()]));
    // Streaming settings on a static source.
    let fx = static_fixture("sst_wm", "inner", StaticRefresh::PerBatch, None);
    let fx = Fixture {
        builder: {
            let mut p = fx.builder.clone().build();
            let s = p.sources.iter_mut().find(|s| s.id == "campaigns").unwrap();
            s.read_limit = Some(etlantic_core::plugin::ReadLimit {
                max_files: Some(1),
                max_records: None,
            });
            rebuild(p)
        },
        ..fx
    };
    assert_eq!(codes_of(&fx), (false, vec!["ETL432".to_string()]));
    // A sink fed by static sources only.
    let fx = static_fixture("sst_only", "inner", StaticRefresh::PerBatch, None)
        .transform_yaml("just_static", &["campaigns"], &["filter: \"id != 'x'\""])
        .sink("static_out", "just_static", CAMPAIGNS, OutputMode::Append);
    assert_eq!(codes_of(&fx), (false, vec!["ETL432".to_string()]));
    // A static source bound to a plugin that only streams.
    let fx = static_fixture(
        "sst_rate",
        "inner",
        StaticRefresh::PerBatch,
        Some("rate://?rows_per_second=1".into()),
    );
    let (planned, codes) = codes_of(&fx);
    assert!(!planned);
    assert!(codes.contains(&"ETL530".to_string()), "{codes:?}");
}

/// The file names in the state directory of the checkpoint's (only) stateful operator.
/// The versions the join's changes are logged for in the state changelog.
fn logged_versions(fx: &Fixture) -> Vec<u64> {
    let logged = etlantic_datafusion::streaming::state_log::logged_versions(
        &fx.checkpoint().join("state-changes"),
    )
    .expect("the state changelog");
    assert_eq!(logged.len(), 1, "one operator: {logged:?}");
    logged.into_values().next().expect("one operator")
}

/// The files of the join's state directory (none before its first whole snapshot).
fn state_file_names(fx: &Fixture) -> Vec<String> {
    // The directory appears with the first snapshot.
    let Ok(mut state) = std::fs::read_dir(fx.checkpoint().join("state")) else {
        return Vec::new();
    };
    let Some(dir) = state.next().map(|d| d.unwrap().path()) else {
        return Vec::new();
    };
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Feeds 14 scenario batches (an impression and a click a second later on one of three
/// ads, 5 s apart), restarting the query before the feeds in `restarts`; returns the
/// rows each feed emitted and the state size after it.
async fn long_run(fx: &Fixture, restarts: &[usize]) -> Vec<(Vec<String>, u64)> {
    feeding_run(fx, 14, restarts, || fx.options(), None).await
}

/// `batches` micro-batches of one impression and one click (ads a0..a2 in turn), the
/// query started with `options()` and restarted before each micro-batch in `restarts`;
/// the new output rows and the state size of each micro-batch. With `clock`, it is moved
/// 3 s on before each micro-batch.
async fn feeding_run(
    fx: &Fixture,
    batches: usize,
    restarts: &[usize],
    options: impl Fn() -> StreamingOptions,
    clock: Option<&ManualClock>,
) -> Vec<(Vec<String>, u64)> {
    let mut got = Vec::new();
    let mut run = fx.start_with(options()).await;
    for k in 0..batches {
        if let Some(c) = clock {
            c.advance(3_000);
        }
        if restarts.contains(&k) {
            drop(run);
            run = fx.start_with(options()).await;
            run.new_rows("out");
        }
        let ad = format!("a{}", k % 3);
        let t = 5 * k as i64;
        run.feed(&[
            ("imps", vec![imp(t, &ad)]),
            ("clicks", vec![click(t + 1, &ad)]),
        ])
        .await;
        let state = op(
            run.progress().last().expect("a micro-batch"),
            "numRowsTotal",
        );
        got.push((run.new_rows("out"), state));
    }
    // Closing waits for a whole snapshot being written in the background.
    run.query.close().await.expect("the query closes");
    got
}

#[tokio::test]
async fn join_state_is_checkpointed_as_changes_between_whole_snapshots() {
    let reference = long_run(
        &join_fixture(
            "ssj_log_ref",
            "left",
            Some("10 seconds"),
            Some("5 seconds"),
            RANGE,
        ),
        &[],
    )
    .await;
    assert!(reference.iter().any(|(r, _)| !r.is_empty()));
    // Restarts before, at and after the whole snapshot of version 10, each restoring
    // from a snapshot with changes applied (or from changes alone).
    let fx = join_fixture(
        "ssj_log",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = long_run(&fx, &[3, 5, 6, 9, 12]).await;
    assert_eq!(got, reference);
    let names = state_file_names(&fx);
    assert!(names.contains(&"10.arrow".to_string()), "{names:?}");
    assert!(logged_versions(&fx).contains(&11));
    assert!(!names.contains(&"11.arrow".to_string()), "{names:?}");
}

/// Under a state checkpoint interval (10 s here, with micro-batches 3 s apart) only every
/// fourth micro-batch writes the join's state, as changes since the previous write. A
/// restart restores the newest written version and runs the committed micro-batches after
/// it again, through the join only: the output and the state equal a run without
/// restarts, and no sink gets a micro-batch twice.
#[tokio::test]
async fn a_state_checkpoint_interval_writes_state_now_and_then_and_restarts_rebuild_it() {
    let fixture = |name: &str| {
        join_fixture(name, "left", Some("10 seconds"), Some("5 seconds"), RANGE).with_profile(|p| {
            p.state_checkpoint_interval = Some("10 seconds".parse().expect("duration"))
        })
    };
    let reference = long_run(&fixture("ssj_interval_ref"), &[]).await;
    assert!(reference.iter().any(|(r, _)| !r.is_empty()));
    let fx = fixture("ssj_interval");
    let clock = ManualClock::new(0);
    let options = || {
        let mut opts = fx.options();
        opts.clock = clock.clock();
        opts
    };
    // Restarts right after a state write (5), between writes (7, 10) and twice in a row.
    let got = feeding_run(&fx, 14, &[5, 7, 10, 11], options, Some(&clock)).await;
    assert_eq!(got, reference);
    let run = fx.start_with(options()).await;
    let batches = run.written_batches("out");
    assert!(batches.windows(2).all(|w| w[0] < w[1]), "{batches:?}");
    drop(run);
    // Feed k runs at 3(k+1) s: the state is written at 12 s (k = 3), 24 s (7) and 36 s
    // (11), each 10 s or more after the previous write (a restart counts from the write
    // it restored, not from its start); the other micro-batches write none.
    let mut versions: Vec<u64> = state_file_names(&fx)
        .iter()
        .filter_map(|n| n.split('.').next()?.parse().ok())
        .chain(logged_versions(&fx))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 3, "{versions:?}");
    let log = etlantic_datafusion::streaming::batch_log::read_all(&fx.checkpoint().join("log"))
        .expect("the log");
    let (_, last) = log.commits.last_key_value().expect("a commit");
    let entry = serde_json::to_value(last).expect("JSON");
    assert_eq!(
        entry["stateVersion"].as_u64(),
        versions.last().copied(),
        "{entry}"
    );
}

/// [`feeding_run`] over 32 micro-batches with whole snapshots written before the commit,
/// so which versions have one does not depend on how fast a background write finishes.
async fn growing_run(fx: &Fixture, restarts: &[usize]) -> Vec<(Vec<String>, u64)> {
    feeding_run(
        fx,
        32,
        restarts,
        || {
            let mut opts = fx.options();
            opts.background_snapshots = false;
            opts
        },
        None,
    )
    .await
}

/// A join state that only grows (no watermark on either side) is not rewritten whole on
/// every tenth version: each whole snapshot waits until the changes since the last one
/// are half the state. With two rows a micro-batch, versions 10 and 20 are snapshotted,
/// 30 is not (20 changed rows against 60 held). A restart after version 30 then restores
/// version 20's snapshot with ten versions of changes applied, and goes on like a run
/// without restarts.
#[tokio::test]
async fn a_growing_join_state_is_snapshotted_as_it_doubles_and_restores_from_the_chain() {
    let reference = growing_run(&join_fixture("ssj_grow_ref", "inner", None, None, ""), &[]).await;
    // Nothing is evicted: the state holds every row fed.
    assert_eq!(reference.last().map(|(_, s)| *s), Some(64));
    let fx = join_fixture("ssj_grow", "inner", None, None, "");
    let got = growing_run(&fx, &[31]).await;
    assert_eq!(got, reference);
    let names = state_file_names(&fx);
    for whole in ["10.arrow", "20.arrow"] {
        assert!(names.contains(&whole.to_string()), "{names:?}");
    }
    assert!(!names.contains(&"30.arrow".to_string()), "{names:?}");
    let logged = logged_versions(&fx);
    for changes in [21, 30, 32] {
        assert!(logged.contains(&changes), "{logged:?}");
    }
}

/// [`join_fixture`] with 10/5-second watermarks and [`RANGE`], the impressions' contract
/// declaring `ad_id` its primary key (one impression per ad).
fn keyed_join_fixture(name: &str, how: &str) -> Fixture {
    imps_and_clicks(
        name,
        Src::new("imps")
            .watermark("imp_ts", "10 seconds")
            .primary_key(&["ad_id"]),
        Src::new("clicks").watermark("click_ts", "5 seconds"),
        &ranged_join(how),
    )
}

/// With one impression per ad declared, a click that has met its impression is not
/// kept (no other impression can come for it), nor is an impression's earlier click
/// once the impression came (an inner join's unmatched rows too: their one partner has
/// passed): the join keeps fewer rows and outputs exactly the same, for every join type
/// and across a restart.
#[tokio::test]
async fn a_declared_unique_key_keeps_less_state_and_the_same_output() {
    for how in ["inner", "left", "right", "full"] {
        let plain = run_scenario(&join_fixture(
            &format!("ssj_plain_{how}"),
            how,
            Some("10 seconds"),
            Some("5 seconds"),
            RANGE,
        ))
        .await;
        let keyed = run_scenario(&keyed_join_fixture(&format!("ssj_keyed_{how}"), how)).await;
        for (i, (p, k)) in plain.iter().zip(&keyed).enumerate() {
            assert_eq!(k.0, p.0, "{how}: rows of batch {i}");
            assert_eq!((k.2, k.3), (p.2, p.3), "{how}: late rows, micro-batches");
            assert!(
                k.1 <= p.1,
                "{how}: state rows after batch {i}: {} > {}",
                k.1,
                p.1
            );
        }
        let held = |r: &[(Vec<String>, u64, u64, u64)]| r.iter().map(|b| b.1).sum::<u64>();
        assert!(
            held(&keyed) < held(&plain),
            "{how}: {} state rows in all, {} without the key",
            held(&keyed),
            held(&plain)
        );
    }

    // A restart between every batch gives the same rows.
    let reference = run_scenario(&keyed_join_fixture("ssj_keyed_ref", "left")).await;
    let fx = keyed_join_fixture("ssj_keyed_restart", "left");
    for (i, (imps, clicks)) in scenario().into_iter().enumerate() {
        let mut run = fx.start().await;
        run.new_rows("out");
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        assert_eq!(run.new_rows("out"), reference[i].0, "batch {i}");
    }
}

/// A second impression of an ad whose first the join still holds breaks the contract's
/// primary key: it is quarantined (ETL704, with the key named) and joins nothing, so
/// the output is that of the stream without it.
#[tokio::test]
async fn a_repeated_unique_key_is_quarantined_not_joined() {
    let fx = keyed_join_fixture("ssj_keyed_repeat", "inner");
    let mut run = fx.start().await;
    run.feed(&[("imps", vec![imp(0, "a"), imp(2, "b")]), ("clicks", vec![])])
        .await;
    run.feed(&[
        ("imps", vec![imp(3, "a")]),
        ("clicks", vec![click(5, "a"), click(6, "b")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[
            out(Some((0, "a")), Some((5, "a"))),
            out(Some((2, "b")), Some((6, "b"))),
        ])
    );
    let lines = fx.quarantined();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["code"], "ETL704");
    assert!(
        lines[0]["reason"]
            .as_str()
            .unwrap()
            .contains("duplicate key (ad_id)"),
        "{}",
        lines[0]["reason"]
    );
    let raw: Value = serde_json::from_str(lines[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["ad_id"], "a");
    // The second `a`, not the first (the quarantine writes whole seconds without
    // fractions).
    assert_eq!(raw["imp_ts"].as_str().unwrap()[..19], ts(3)[..19]);
    let p = run.progress();
    let sum = |at: &str| {
        p.iter()
            .filter_map(|p| p.pointer(at)?.as_u64())
            .sum::<u64>()
    };
    assert_eq!(sum("/quarantinedRows"), 1, "{p:?}");
    // Both clicks met their impression, held in state: neither is kept.
    assert_eq!(
        sum("/stateOperators/0/customMetrics/numRowsReleasedByUniqueKey"),
        2,
        "{p:?}"
    );
}

/// The join's inputs are pruned to the columns it and the `select` after it read, but a
/// unique side keeps all of its columns: a repeated key's row is quarantined whole, with
/// `campaign` too, which nothing after the join reads.
#[tokio::test]
async fn a_repeated_unique_key_is_quarantined_with_the_columns_the_join_does_not_read() {
    const CAMPAIGN_IMPS: &[(&str, &str)] = &[
        ("ad_id", "string"),
        ("imp_ts", "timestamp"),
        ("campaign", "string"),
    ];
    const NARROW: &[(&str, &str)] = &[("ad_id", "string"), ("click_ts", "timestamp")];
    let fx = Fixture::new("ssj_keyed_repeat_whole")
        .source(Src {
            cols: CAMPAIGN_IMPS,
            ..Src::new("imps")
                .watermark("imp_ts", "10 seconds")
                .primary_key(&["ad_id"])
        })
        .source(Src {
            cols: CLICKS,
            ..Src::new("clicks").watermark("click_ts", "5 seconds")
        })
        .transform_yaml(
            "joined",
            &["imps", "clicks"],
            &[&ranged_join("inner"), "select: [ad_id, click_ts]"],
        )
        .sink("out", "joined", NARROW, OutputMode::Append);
    let campaign_imp = |secs: i64, ad: &str, campaign: &str| json!({"ad_id": ad, "imp_ts": ts(secs), "campaign": campaign});
    let mut run = fx.start().await;
    run.feed(&[
        ("imps", vec![campaign_imp(0, "a", "spring")]),
        ("clicks", vec![]),
    ])
    .await;
    run.feed(&[
        ("imps", vec![campaign_imp(3, "a", "summer")]),
        ("clicks", vec![click(5, "a")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[json!({"ad_id": "a", "click_ts": ts(5)})])
    );
    let lines = fx.quarantined();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["code"], "ETL704");
    let raw: Value = serde_json::from_str(lines[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["ad_id"], "a", "{raw}");
    assert_eq!(raw["campaign"], "summer", "{raw}");
}

/// Without a unique key the join reports no unique-key metric.
#[tokio::test]
async fn a_join_without_a_unique_side_has_no_unique_key_metric() {
    let fx = join_fixture(
        "ssj_plain_metric",
        "inner",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let mut run = fx.start().await;
    run.feed(&[("imps", vec![imp(0, "a")]), ("clicks", vec![click(5, "a")])])
        .await;
    let p = run.progress();
    let op = &p.last().unwrap()["stateOperators"][0];
    assert!(
        op["customMetrics"]["numRowsReleasedByUniqueKey"].is_null(),
        "{op}"
    );
}
