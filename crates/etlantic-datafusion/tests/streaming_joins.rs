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

use etlantic_core::streaming::{LatePolicy, OutputMode};
use serde_json::{json, Value};
use streaming_support::joins::*;
use streaming_support::*;

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
