//! Streaming semantics through the Rust API, on memory sources and sinks: watermarks
//! (min/max policy, never backwards, no-data batches on and off), late events under each
//! policy, every window kind in every output mode it supports, plain group-by, dedup
//! (with and without a watermark, within the watermark) and stateless steps.
//!
//! Every test feeds scenario batches (one push per source, then everything available)
//! and compares each batch's sink output with exact expected rows (multisets).

mod streaming_support;

use etlantic_core::streaming::{LatePolicy, OutputMode, WatermarkPolicy};
use serde_json::{json, Value};
use streaming_support::*;

use etlantic_sinks as _;
use etlantic_sources as _;

const TUMBLING: &str = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";
const SLIDING: &str = "window_aggregate: {window: {type: sliding, column: ts, size: 10 seconds, slide: 5 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";
const SESSION: &str = "window_aggregate: {window: {type: session, column: ts, gap: 5 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";

/// The shared data set of the window tests (users a and b; watermark delay 5 s):
/// b0 max 12 → watermark 7; b1 max 25 → 20; b2 holds a row at 4 s that is late for
/// tumbling/sliding/session windows and one at 21 s; b3 max 40 → 35; b4 is empty.
fn window_data() -> Vec<Vec<Value>> {
    vec![
        vec![ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)],
        vec![ev(8, "a", 4), ev(25, "a", 1)],
        vec![ev(4, "b", 9), ev(21, "b", 3)],
        vec![ev(40, "a", 1)],
        vec![],
    ]
}

/// Runs `data` batch by batch; returns each batch's new `out` rows and the number of
/// micro-batches each batch took.
async fn run_all(fx: &Fixture, data: Vec<Vec<Value>>) -> (Vec<Vec<String>>, Vec<u64>, Vec<i64>) {
    let mut q = fx.start().await;
    let mut outs = Vec::new();
    let mut micro = Vec::new();
    let mut wms = Vec::new();
    for rows in data {
        micro.push(q.feed(&[("events", rows)]).await);
        outs.push(q.new_rows("out"));
        wms.push(q.query.watermark_ms());
    }
    (outs, micro, wms)
}

fn dropped(progress: &[Value]) -> Vec<u64> {
    progress
        .iter()
        .map(|p| {
            p["stateOperators"]
                .as_array()
                .expect("stateOperators")
                .iter()
                .map(|o| o["numRowsDroppedByWatermark"].as_u64().expect("count"))
                .sum()
        })
        .collect()
}

fn state_rows(progress: &[Value]) -> Vec<u64> {
    progress
        .iter()
        .map(|p| {
            p["stateOperators"][0]["numRowsTotal"]
                .as_u64()
                .expect("rows")
        })
        .collect()
}

fn kinds(progress: &[Value]) -> Vec<String> {
    progress
        .iter()
        .map(|p| p["kind"].as_str().expect("kind").to_string())
        .collect()
}

// ------------------------------------------------------------------ watermarks

/// Two watermarked inputs unioned into a tumbling count (append), in `policy`.
fn two_inputs(name: &str, policy: WatermarkPolicy) -> Fixture {
    Fixture::new(name)
        .source(Src::new("a").watermark("ts", "5 seconds"))
        .source(Src::new("b").watermark("ts", "10 seconds"))
        .transform_yaml(
            "agg",
            &["a", "b"],
            &[
                "union: {other: b}",
                "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\"}}",
            ],
        )
        .sink(
            "out",
            "agg",
            &[("window_start", "timestamp"), ("window_end", "timestamp"), ("user", "string"), ("cnt", "long")],
            OutputMode::Append,
        )
        .with_profile(|p| p.watermark_policy = policy)
}

fn two_input_batches() -> Vec<(Vec<Value>, Vec<Value>)> {
    vec![
        (vec![ev(20, "u", 1)], vec![]),
        (vec![], vec![ev(12, "u", 1)]),
        (vec![ev(10, "u", 1)], vec![ev(5, "u", 1)]),
        (vec![], vec![ev(40, "u", 1)]),
        (vec![ev(1, "u", 1)], vec![]),
    ]
}

fn w4(start: i64, end: i64, cnt: i64) -> Value {
    json!({"window_start": ts(start), "window_end": ts(end), "user": "u", "cnt": cnt})
}

#[tokio::test]
async fn min_policy_waits_for_the_slowest_input_and_never_moves_back() {
    let fx = two_inputs("wm_min", WatermarkPolicy::Min);
    let mut q = fx.start().await;
    let mut wms = Vec::new();
    let mut outs = Vec::new();
    for (a, b) in two_input_batches() {
        q.feed(&[("a", a), ("b", b)]).await;
        wms.push(q.query.watermark_ms());
        outs.push(q.new_rows("out"));
    }
    // a: max 20 → 15; b has seen nothing → epoch; min = epoch. Then b: 12 → 2; older
    // rows move nothing; b: 40 → 30 so min(15, 30) = 15; a late row moves nothing.
    assert_eq!(wms, vec![0, ms(2), ms(2), ms(15), ms(15)]);
    assert_eq!(
        outs,
        vec![vec![], vec![], vec![], rows(&[w4(0, 10, 1)]), vec![]]
    );
    // The 1 s row of the last batch is behind 15 s: dropped and counted.
    let p = q.progress();
    assert_eq!(dropped(&p).iter().sum::<u64>(), 1);
    assert_eq!(dropped(&p).last(), Some(&1));
    // The watermark in each progress record never decreases.
    let marks: Vec<String> = p
        .iter()
        .map(|r| r["eventTime"]["watermark"].as_str().unwrap().to_string())
        .collect();
    let mut sorted = marks.clone();
    sorted.sort();
    assert_eq!(marks, sorted);
}

#[tokio::test]
async fn max_policy_follows_the_fastest_input() {
    let fx = two_inputs("wm_max", WatermarkPolicy::Max);
    let mut q = fx.start().await;
    let mut wms = Vec::new();
    let mut outs = Vec::new();
    for (a, b) in two_input_batches() {
        q.feed(&[("a", a), ("b", b)]).await;
        wms.push(q.query.watermark_ms());
        outs.push(q.new_rows("out"));
    }
    assert_eq!(wms, vec![ms(15), ms(15), ms(15), ms(30), ms(30)]);
    assert_eq!(
        outs,
        vec![
            vec![],
            vec![],
            vec![],
            rows(&[w4(10, 20, 2), w4(20, 30, 1)]),
            vec![]
        ]
    );
    // b's 5 s row (window end 10 <= 15) and a's 1 s row are late under the max policy.
    assert_eq!(dropped(&q.progress()).iter().sum::<u64>(), 2);
}

#[tokio::test]
async fn no_data_batches_close_windows_without_new_input() {
    let data = vec![
        vec![ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)],
        vec![ev(26, "a", 1)],
        vec![],
    ];
    let closed = rows(&[win(0, 10, "a", 2, 3), win(10, 20, "b", 1, 5)]);

    // On (Spark's default): a no-data micro-batch follows every batch that moved the
    // watermark, so the windows closed by batch 1 are emitted with batch 1.
    let fx = windowed("nodata_on", TUMBLING, OutputMode::Append, LatePolicy::Drop);
    let (outs, micro, wms) = run_all(&fx, data.clone()).await;
    assert_eq!(outs, vec![vec![], closed.clone(), vec![]]);
    assert_eq!(micro, vec![2, 2, 1]);
    assert_eq!(wms, vec![ms(7), ms(21), ms(21)]);
    let p = streaming_support::progress_of(&fx.checkpoint());
    assert_eq!(kinds(&p), ["data", "no_data", "data", "no_data", "data"]);
    assert_eq!(
        p.iter()
            .map(|r| r["batchId"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    // The no-data batch runs with the new watermark and reads nothing.
    assert_eq!(p[3]["eventTime"]["watermark"], json!(ts(21)));
    assert_eq!(p[3]["numInputRows"], json!(0));

    // Off: one data micro-batch per batch; windows closed by batch 1's watermark come
    // out only with the next batch (here an empty one).
    let fx = windowed("nodata_off", TUMBLING, OutputMode::Append, LatePolicy::Drop)
        .with_profile(|p| p.no_data_batches = false);
    let (outs, micro, wms) = run_all(&fx, data).await;
    assert_eq!(outs, vec![vec![], vec![], closed]);
    assert_eq!(micro, vec![1, 1, 1]);
    assert_eq!(wms, vec![ms(7), ms(21), ms(21)]);
    let p = streaming_support::progress_of(&fx.checkpoint());
    assert_eq!(kinds(&p), ["data", "data", "data"]);
}

// ------------------------------------------------------------------ late events

/// b0: 2 s and 16 s → watermark 11 (closes [0,10)); b1: a late 5 s row (window end
/// 10 <= 11) and an on-time 12 s row; b2: 30 s → watermark 25.
fn late_data() -> Vec<Vec<Value>> {
    vec![
        vec![ev(2, "a", 1), ev(16, "a", 2)],
        vec![ev(5, "a", 10), ev(12, "b", 3)],
        vec![ev(30, "a", 4)],
    ]
}

fn late_expected() -> Vec<Vec<String>> {
    vec![
        rows(&[win(0, 10, "a", 1, 1)]),
        vec![],
        rows(&[win(10, 20, "a", 1, 2), win(10, 20, "b", 1, 3)]),
    ]
}

#[tokio::test]
async fn late_events_are_dropped_and_counted() {
    let fx = windowed("late_drop", TUMBLING, OutputMode::Append, LatePolicy::Drop);
    let (outs, _, _) = run_all(&fx, late_data()).await;
    assert_eq!(outs, late_expected());
    let p = progress_of(&fx.checkpoint());
    // Micro-batches: 0 data, 1 no-data, 2 data (the late row), 3 data, 4 no-data.
    assert_eq!(kinds(&p), ["data", "no_data", "data", "data", "no_data"]);
    assert_eq!(dropped(&p), [0, 0, 1, 0, 0]);
    assert_eq!(p[2]["lateRows"], json!(1));
    assert!(!fx.quarantine().exists(), "drop writes no quarantine");
}

#[tokio::test]
async fn late_events_are_accepted_and_processed() {
    let fx = windowed(
        "late_accept",
        TUMBLING,
        OutputMode::Append,
        LatePolicy::Accept,
    );
    let (outs, _, _) = run_all(&fx, late_data()).await;
    // The late row opens a new [0,10) state, which the watermark (11) closes at once.
    let mut expected = late_expected();
    expected[1] = rows(&[win(0, 10, "a", 1, 10)]);
    assert_eq!(outs, expected);
    assert_eq!(dropped(&progress_of(&fx.checkpoint())), [0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn late_events_are_quarantined_with_a_reason() {
    let fx = windowed(
        "late_quarantine",
        TUMBLING,
        OutputMode::Append,
        LatePolicy::Quarantine,
    );
    let (outs, _, _) = run_all(&fx, late_data()).await;
    assert_eq!(outs, late_expected());
    let lines = etlantic_runtime::quarantine::read_quarantine(fx.quarantine()).unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let l = &lines[0];
    assert_eq!(l["code"], json!("ETL708"));
    assert_eq!(l["batch_id"], json!(2));
    assert_eq!(l["position"]["asset"], json!("events"));
    let reason = l["reason"].as_str().unwrap();
    assert!(
        reason.contains("late") && reason.contains("2024-01-01T00:00:11"),
        "{reason}"
    );
    // The raw record is the late input row, as it entered the aggregation.
    let raw: Value = serde_json::from_str(l["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["user"], json!("a"));
    assert_eq!(raw["amount"], json!(10));
    assert!(
        raw["ts"]
            .as_str()
            .unwrap()
            .starts_with("2024-01-01T00:00:05"),
        "{raw}"
    );
    assert_eq!(dropped(&progress_of(&fx.checkpoint())), [0, 0, 1, 0, 0]);
}

#[tokio::test]
async fn late_events_are_quarantined_even_when_bad_records_fail_the_run() {
    // `on_error: fail` concerns records that break their contract, not late events.
    let fx = windowed(
        "late_quarantine_on_error_fail",
        TUMBLING,
        OutputMode::Append,
        LatePolicy::Quarantine,
    )
    .with_profile(|p| p.on_error = etlantic_core::profile::OnError::Fail);
    let (outs, _, _) = run_all(&fx, late_data()).await;
    assert_eq!(outs, late_expected());
    let lines = etlantic_runtime::quarantine::read_quarantine(fx.quarantine()).unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["code"], json!("ETL708"));
}

#[tokio::test]
async fn late_events_go_to_the_side_output() {
    let fx = Fixture::new("late_side")
        .source(
            Src::new("events")
                .watermark("ts", "5 seconds")
                .late(LatePolicy::SideOutput {
                    sink: "late".into(),
                }),
        )
        .transform_yaml("agg", &["events"], &[TUMBLING])
        .sink("out", "agg", WIN_COLS, OutputMode::Append)
        .sink("late", "events", EVENTS, OutputMode::Append);
    let mut q = fx.start().await;
    let mut outs = Vec::new();
    let mut late = Vec::new();
    for rows in late_data() {
        q.feed(&[("events", rows)]).await;
        outs.push(q.new_rows("out"));
        late.push(q.new_rows("late"));
    }
    assert_eq!(outs, late_expected());
    // Only the late row reaches the side sink, in the batch that saw it.
    assert_eq!(late, vec![vec![], rows(&[ev(5, "a", 10)]), vec![]]);
}

#[tokio::test]
async fn late_rows_keep_their_shape_when_the_aggregation_computes_its_input() {
    // `sum(amount * 2)` and a computed key make the aggregation evaluate its input with
    // DataFusion first; the late rows routed out are still the rows that entered it.
    let fx = Fixture::new("late_side_computed")
        .source(Src::new("events").watermark("ts", "5 seconds").late(LatePolicy::SideOutput {
            sink: "late".into(),
        }))
        .transform_yaml(
            "agg",
            &["events"],
            &["window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: {user: \"upper(user)\"}, aggregates: {cnt: \"count_all()\", total: \"sum(amount * 2)\"}}"],
        )
        .sink("out", "agg", WIN_COLS, OutputMode::Append)
        .sink("late", "events", EVENTS, OutputMode::Append);
    let mut q = fx.start().await;
    let mut outs = Vec::new();
    let mut late = Vec::new();
    for rows in late_data() {
        q.feed(&[("events", rows)]).await;
        outs.push(q.new_rows("out"));
        late.push(q.new_rows("late"));
    }
    assert_eq!(
        outs,
        vec![
            rows(&[win(0, 10, "A", 1, 2)]),
            vec![],
            rows(&[win(10, 20, "A", 1, 4), win(10, 20, "B", 1, 6)]),
        ]
    );
    assert_eq!(late, vec![vec![], rows(&[ev(5, "a", 10)]), vec![]]);
}

// ------------------------------------------------------------------ windows

#[tokio::test]
async fn tumbling_append() {
    let fx = windowed(
        "tumbling_append",
        TUMBLING,
        OutputMode::Append,
        LatePolicy::Drop,
    );
    let (outs, micro, wms) = run_all(&fx, window_data()).await;
    assert_eq!(
        outs,
        vec![
            vec![],
            rows(&[win(0, 10, "a", 3, 7), win(10, 20, "b", 1, 5)]),
            vec![],
            rows(&[win(20, 30, "a", 1, 1), win(20, 30, "b", 1, 3)]),
            vec![],
        ]
    );
    assert_eq!(micro, vec![2, 2, 1, 2, 1]);
    assert_eq!(wms, vec![ms(7), ms(20), ms(20), ms(35), ms(35)]);
    // The 4 s row of batch 2 (window [0,10) closed at 20) is dropped.
    let p = progress_of(&fx.checkpoint());
    assert_eq!(dropped(&p)[4], 1);
    // State: after batch 3's no-data batch only [40,50) is open.
    assert_eq!(state_rows(&p).last(), Some(&1));
}

#[tokio::test]
async fn tumbling_update_emits_changes_and_evicts_closed_windows() {
    let fx = windowed(
        "tumbling_update",
        TUMBLING,
        OutputMode::Update,
        LatePolicy::Drop,
    );
    let (outs, micro, _) = run_all(&fx, window_data()).await;
    assert_eq!(
        outs,
        vec![
            rows(&[win(0, 10, "a", 2, 3), win(10, 20, "b", 1, 5)]),
            rows(&[win(0, 10, "a", 3, 7), win(20, 30, "a", 1, 1)]),
            rows(&[win(20, 30, "b", 1, 3)]),
            rows(&[win(40, 50, "a", 1, 1)]),
            vec![],
        ]
    );
    assert_eq!(micro, vec![2, 2, 1, 2, 1]);
    let p = progress_of(&fx.checkpoint());
    // Micro-batches: 0 d, 1 nd, 2 d, 3 nd (evicts [0,10) a and [10,20) b), 4 d (late row
    // dropped), 5 d, 6 nd (evicts the [20,30) windows), 7 d.
    assert_eq!(state_rows(&p), [2, 2, 3, 1, 2, 3, 1, 1]);
    assert_eq!(dropped(&p), [0, 0, 0, 0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn tumbling_complete_keeps_everything() {
    // Complete mode (Spark): the whole table every batch, no eviction, no late-row
    // filtering (the 4 s row of batch 2 counts), and no no-data batches.
    let fx = windowed(
        "tumbling_complete",
        TUMBLING,
        OutputMode::Complete,
        LatePolicy::Drop,
    );
    let mut q = fx.start().await;
    let mut tables = Vec::new();
    let mut micro = Vec::new();
    for rows in window_data() {
        micro.push(q.feed(&[("events", rows)]).await);
        tables.push(q.last_write("out"));
    }
    let b1 = vec![
        win(0, 10, "a", 3, 7),
        win(10, 20, "b", 1, 5),
        win(20, 30, "a", 1, 1),
    ];
    let mut b2 = b1.clone();
    b2.extend([win(0, 10, "b", 1, 9), win(20, 30, "b", 1, 3)]);
    let mut b3 = b2.clone();
    b3.push(win(40, 50, "a", 1, 1));
    assert_eq!(
        tables,
        vec![
            rows(&[win(0, 10, "a", 2, 3), win(10, 20, "b", 1, 5)]),
            rows(&b1),
            rows(&b2),
            rows(&b3),
            rows(&b3),
        ]
    );
    assert_eq!(micro, vec![1, 1, 1, 1, 1]);
    assert_eq!(q.writes("out"), 5);
    assert_eq!(dropped(&q.progress()), [0, 0, 0, 0, 0]);
    assert_eq!(q.query.watermark_ms(), ms(35));
}

#[tokio::test]
async fn sliding_append() {
    let fx = windowed(
        "sliding_append",
        SLIDING,
        OutputMode::Append,
        LatePolicy::Drop,
    );
    let (outs, _, _) = run_all(&fx, window_data()).await;
    assert_eq!(
        outs,
        vec![
            rows(&[win(-5, 5, "a", 2, 3)]),
            rows(&[
                win(0, 10, "a", 3, 7),
                win(5, 15, "a", 1, 4),
                win(5, 15, "b", 1, 5),
                win(10, 20, "b", 1, 5),
            ]),
            vec![],
            rows(&[
                win(20, 30, "a", 1, 1),
                win(25, 35, "a", 1, 1),
                win(15, 25, "b", 1, 3),
                win(20, 30, "b", 1, 3),
            ]),
            vec![],
        ]
    );
    let p = progress_of(&fx.checkpoint());
    assert_eq!(
        dropped(&p)[4],
        1,
        "the 4 s row is late for both its windows"
    );
}

#[tokio::test]
async fn sliding_update() {
    let fx = windowed(
        "sliding_update",
        SLIDING,
        OutputMode::Update,
        LatePolicy::Drop,
    );
    let (outs, _, _) = run_all(&fx, window_data()).await;
    assert_eq!(
        outs,
        vec![
            rows(&[
                win(-5, 5, "a", 2, 3),
                win(0, 10, "a", 2, 3),
                win(5, 15, "b", 1, 5),
                win(10, 20, "b", 1, 5),
            ]),
            rows(&[
                win(0, 10, "a", 3, 7),
                win(5, 15, "a", 1, 4),
                win(20, 30, "a", 1, 1),
                win(25, 35, "a", 1, 1),
            ]),
            rows(&[win(15, 25, "b", 1, 3), win(20, 30, "b", 1, 3)]),
            rows(&[win(35, 45, "a", 1, 1), win(40, 50, "a", 1, 1)]),
            vec![],
        ]
    );
    // After the last no-data batch only [35,45) and [40,50) are open.
    assert_eq!(state_rows(&progress_of(&fx.checkpoint())).last(), Some(&2));
}

#[tokio::test]
async fn sliding_complete() {
    let fx = windowed(
        "sliding_complete",
        SLIDING,
        OutputMode::Complete,
        LatePolicy::Drop,
    );
    let mut q = fx.start().await;
    for rows in window_data() {
        q.feed(&[("events", rows)]).await;
    }
    assert_eq!(q.writes("out"), 5);
    assert_eq!(
        q.last_write("out"),
        rows(&[
            win(-5, 5, "a", 2, 3),
            win(0, 10, "a", 3, 7),
            win(5, 15, "a", 1, 4),
            win(20, 30, "a", 1, 1),
            win(25, 35, "a", 1, 1),
            win(35, 45, "a", 1, 1),
            win(40, 50, "a", 1, 1),
            win(-5, 5, "b", 1, 9),
            win(0, 10, "b", 1, 9),
            win(5, 15, "b", 1, 5),
            win(10, 20, "b", 1, 5),
            win(15, 25, "b", 1, 3),
            win(20, 30, "b", 1, 3),
        ])
    );
}

/// The window data with a last batch holding a row for a new user `c` at 2 s, late
/// under both the append (watermark 35) and the complete (previous watermark 20) runs.
fn session_data() -> Vec<Vec<Value>> {
    let mut d = window_data();
    d[4] = vec![ev(2, "c", 1)];
    d
}

#[tokio::test]
async fn session_append() {
    let fx = windowed(
        "session_append",
        SESSION,
        OutputMode::Append,
        LatePolicy::Drop,
    );
    let (outs, _, _) = run_all(&fx, session_data()).await;
    // a: 1 s and 3 s merge into [1,8); 8 s touches it → [1,13). b: the 4 s row of batch
    // 2 ([4,9), end <= 20) is late.
    assert_eq!(
        outs,
        vec![
            vec![],
            rows(&[win(1, 13, "a", 3, 7), win(12, 17, "b", 1, 5)]),
            vec![],
            rows(&[win(25, 30, "a", 1, 1), win(21, 26, "b", 1, 3)]),
            vec![],
        ]
    );
    let p = progress_of(&fx.checkpoint());
    assert_eq!(
        p[0]["stateOperators"][0]["operatorName"],
        json!("sessionWindowStateStoreSaveExec")
    );
    assert_eq!(dropped(&p).iter().sum::<u64>(), 2);
}

#[tokio::test]
async fn session_complete() {
    // Complete mode never evicts sessions; Spark still drops late rows of session
    // windows (judged against the previous micro-batch's watermark, as no no-data batches
    // run in complete mode): batch 2's 4 s row is on time against 7 s, batch 4's `c` row
    // ([2,7)) is late against 20 s.
    let fx = windowed(
        "session_complete",
        SESSION,
        OutputMode::Complete,
        LatePolicy::Drop,
    );
    let mut q = fx.start().await;
    let mut tables = Vec::new();
    for rows in session_data() {
        q.feed(&[("events", rows)]).await;
        tables.push(q.last_write("out"));
    }
    let b2 = vec![
        win(1, 13, "a", 3, 7),
        win(25, 30, "a", 1, 1),
        win(4, 9, "b", 1, 9),
        win(12, 17, "b", 1, 5),
        win(21, 26, "b", 1, 3),
    ];
    let mut b3 = b2.clone();
    b3.push(win(40, 45, "a", 1, 1));
    assert_eq!(
        tables,
        vec![
            rows(&[win(1, 8, "a", 2, 3), win(12, 17, "b", 1, 5)]),
            rows(&[
                win(1, 13, "a", 3, 7),
                win(25, 30, "a", 1, 1),
                win(12, 17, "b", 1, 5)
            ]),
            rows(&b2),
            rows(&b3),
            rows(&b3),
        ]
    );
    assert_eq!(q.writes("out"), 5);
    assert_eq!(dropped(&q.progress()), [0, 0, 0, 0, 1]);
}

#[tokio::test]
async fn session_update_is_rejected_at_planning() {
    let fx = windowed(
        "session_update",
        SESSION,
        OutputMode::Update,
        LatePolicy::Drop,
    );
    let outcome = fx.plan_outcome();
    assert!(outcome.plan.is_none());
    let codes: Vec<&str> = outcome
        .diagnostics
        .iter()
        .map(|d| d.code.as_str())
        .collect();
    assert_eq!(codes, ["ETL402"], "{:?}", outcome.diagnostics);
}

// ------------------------------------------------------------------ plain group-by

#[tokio::test]
async fn group_by_complete_and_update_with_a_null_key() {
    let data = vec![
        vec![
            json!({"ts": ts(1), "user": "a", "amount": 1}),
            json!({"ts": ts(2), "user": null, "amount": 2}),
            json!({"ts": ts(3), "user": "a", "amount": 3}),
        ],
        vec![
            json!({"ts": ts(4), "user": null, "amount": 5}),
            json!({"ts": ts(5), "user": "b", "amount": 1}),
        ],
    ];
    let cols = &[("user", "string"), ("cnt", "long"), ("total", "long")];
    let step =
        "aggregate: {group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";
    let g = |u: Value, c: i64, t: i64| json!({"user": u, "cnt": c, "total": t});

    let fx = Fixture::new("groupby_complete")
        .source(Src::new("events"))
        .transform_yaml("agg", &["events"], &[step])
        .sink("out", "agg", cols, OutputMode::Complete);
    let mut q = fx.start().await;
    let mut tables = Vec::new();
    for rows in data.clone() {
        q.feed(&[("events", rows)]).await;
        tables.push(q.last_write("out"));
    }
    assert_eq!(
        tables,
        vec![
            rows(&[g(json!("a"), 2, 4), g(Value::Null, 1, 2)]),
            rows(&[
                g(json!("a"), 2, 4),
                g(Value::Null, 2, 7),
                g(json!("b"), 1, 1)
            ]),
        ]
    );

    let fx = Fixture::new("groupby_update")
        .source(Src::new("events"))
        .transform_yaml("agg", &["events"], &[step])
        .sink("out", "agg", cols, OutputMode::Update);
    let mut q = fx.start().await;
    let mut outs = Vec::new();
    for rows in data {
        q.feed(&[("events", rows)]).await;
        outs.push(q.new_rows("out"));
    }
    assert_eq!(
        outs,
        vec![
            rows(&[g(json!("a"), 2, 4), g(Value::Null, 1, 2)]),
            rows(&[g(Value::Null, 2, 7), g(json!("b"), 1, 1)]),
        ]
    );
}

#[tokio::test]
async fn group_by_event_time_in_append_mode() {
    // Grouping by the watermarked column itself: a group is final once the watermark
    // passes its key.
    let fx = Fixture::new("groupby_ts_append")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml(
            "agg",
            &["events"],
            &["aggregate: {group_by: [ts], aggregates: {cnt: \"count_all()\"}}"],
        )
        .sink(
            "out",
            "agg",
            &[("ts", "timestamp"), ("cnt", "long")],
            OutputMode::Append,
        );
    let mut q = fx.start().await;
    let b0 = q
        .step(
            "events",
            vec![ev(1, "a", 1), ev(1, "b", 1), ev(12, "a", 1)],
            "out",
        )
        .await;
    let b1 = q
        .step("events", vec![ev(3, "a", 1), ev(20, "a", 1)], "out")
        .await;
    assert_eq!(b0, rows(&[json!({"ts": ts(1), "cnt": 2})]));
    assert_eq!(b1, rows(&[json!({"ts": ts(12), "cnt": 1})]));
    assert_eq!(
        dropped(&q.progress()).iter().sum::<u64>(),
        1,
        "the 3 s row is late"
    );
}

// ------------------------------------------------------------------ dedup

fn dedup_fixture(name: &str, step: &str, watermark: bool) -> Fixture {
    let mut src = Src::new("events");
    src.cols = &[("ts", "timestamp"), ("id", "long"), ("v", "string")];
    if watermark {
        src = src.watermark("ts", "5 seconds");
    }
    Fixture::new(name)
        .source(src)
        .transform_yaml("dedup", &["events"], &[step])
        .sink(
            "out",
            "dedup",
            &[("ts", "timestamp"), ("id", "long"), ("v", "string")],
            OutputMode::Append,
        )
}

fn d(secs: i64, id: i64, v: &str) -> Value {
    json!({"ts": ts(secs), "id": id, "v": v})
}

#[tokio::test]
async fn dedup_without_watermark_keeps_the_first_occurrence_forever() {
    let fx = dedup_fixture("dedup_plain", "deduplicate: [id]", false);
    let mut q = fx.start().await;
    let b0 = q
        .step(
            "events",
            vec![d(1, 1, "x"), d(2, 2, "y"), d(3, 1, "z")],
            "out",
        )
        .await;
    let b1 = q
        .step("events", vec![d(4, 2, "w"), d(5, 3, "u")], "out")
        .await;
    assert_eq!(b0, rows(&[d(1, 1, "x"), d(2, 2, "y")]));
    assert_eq!(b1, rows(&[d(5, 3, "u")]));
    assert_eq!(state_rows(&q.progress()), [2, 3]);
}

#[tokio::test]
async fn dedup_with_the_event_time_in_the_key_evicts_and_drops_late_rows() {
    let fx = dedup_fixture("dedup_wm_key", "deduplicate: [id, ts]", true);
    let mut q = fx.start().await;
    let b0 = q
        .step(
            "events",
            vec![d(1, 1, "x"), d(1, 1, "dup"), d(10, 2, "y")],
            "out",
        )
        .await;
    // Watermark 5: (1, 1 s) is evicted by the no-data batch. Then 1 s and 5 s are late
    // (event time <= watermark; the boundary is late), 6 s is new, (2, 10 s) a duplicate.
    let b1 = q
        .step(
            "events",
            vec![
                d(1, 1, "again"),
                d(5, 3, "edge"),
                d(6, 3, "new"),
                d(10, 2, "dup"),
            ],
            "out",
        )
        .await;
    assert_eq!(b0, rows(&[d(1, 1, "x"), d(10, 2, "y")]));
    assert_eq!(b1, rows(&[d(6, 3, "new")]));
    let p = q.progress();
    assert_eq!(kinds(&p), ["data", "no_data", "data"]);
    assert_eq!(dropped(&p), [0, 0, 2]);
    assert_eq!(state_rows(&p), [2, 1, 2]);
}

#[tokio::test]
async fn dedup_with_a_watermark_but_no_time_key_never_evicts() {
    let fx = dedup_fixture("dedup_wm_nokey", "deduplicate: [id]", true);
    let mut q = fx.start().await;
    let b0 = q
        .step("events", vec![d(1, 1, "x"), d(10, 2, "y")], "out")
        .await;
    let b1 = q
        .step(
            "events",
            vec![d(3, 3, "late"), d(12, 1, "dup"), d(12, 4, "new")],
            "out",
        )
        .await;
    assert_eq!(b0, rows(&[d(1, 1, "x"), d(10, 2, "y")]));
    assert_eq!(b1, rows(&[d(12, 4, "new")]));
    let p = q.progress();
    assert_eq!(dropped(&p).iter().sum::<u64>(), 1);
    assert_eq!(state_rows(&p).last(), Some(&3));
}

#[tokio::test]
async fn dedup_within_watermark() {
    let fx = dedup_fixture(
        "dedup_within",
        "deduplicate: {keys: [id], within_watermark: true}",
        true,
    );
    let mut q = fx.start().await;
    // id 1 expires at 1 + 5 = 6 s, id 2 at 15 s. Watermark 5.
    let b0 = q
        .step(
            "events",
            vec![d(1, 1, "x"), d(4, 1, "dup"), d(10, 2, "y")],
            "out",
        )
        .await;
    // 6 s > 5: on time, but id 1 is still held (6 > 5) → duplicate. 14 s: new (expires
    // 19). Watermark 9 → id 1 expires.
    let b1 = q
        .step("events", vec![d(6, 1, "z"), d(14, 3, "u")], "out")
        .await;
    // id 1 again at 11 s: its state expired → emitted. id 2 at 9 s: late (<= 9).
    let b2 = q
        .step("events", vec![d(11, 1, "w"), d(9, 2, "late")], "out")
        .await;
    assert_eq!(b0, rows(&[d(1, 1, "x"), d(10, 2, "y")]));
    assert_eq!(b1, rows(&[d(14, 3, "u")]));
    assert_eq!(b2, rows(&[d(11, 1, "w")]));
    let p = q.progress();
    assert_eq!(
        p[0]["stateOperators"][0]["operatorName"],
        json!("dedupeWithinWatermark")
    );
    assert_eq!(dropped(&p).iter().sum::<u64>(), 1);
}

// ------------------------------------------------------------------ stateless

#[tokio::test]
async fn stateless_union_filter_with_column_cast_project() {
    let fx = Fixture::new("stateless")
        .source(Src::new("a"))
        .source(Src::new("b"))
        .transform_yaml(
            "shape",
            &["a", "b"],
            &[
                "union: {other: b}",
                "filter: \"amount > 2\"",
                "with_columns: {doubled: \"amount * 2\", amount_s: \"cast(amount, 'string')\"}",
                "select: [user, doubled, amount_s]",
            ],
        )
        .sink(
            "out",
            "shape",
            &[
                ("user", "string"),
                ("doubled", "long"),
                ("amount_s", "string"),
            ],
            OutputMode::Append,
        );
    let mut q = fx.start().await;
    let r = |u: &str, d: i64, s: &str| json!({"user": u, "doubled": d, "amount_s": s});
    q.feed(&[
        ("a", vec![ev(1, "u1", 1), ev(2, "u2", 3)]),
        ("b", vec![ev(3, "u3", 5)]),
    ])
    .await;
    let b0 = q.new_rows("out");
    q.feed(&[
        (
            "a",
            vec![json!({"ts": ts(4), "user": "u4", "amount": null})],
        ),
        ("b", vec![ev(5, "u5", 4)]),
    ])
    .await;
    let b1 = q.new_rows("out");
    assert_eq!(b0, rows(&[r("u2", 6, "3"), r("u3", 10, "5")]));
    // A null amount makes the predicate unknown: the row is dropped.
    assert_eq!(b1, rows(&[r("u5", 8, "4")]));
    // Stateless queries keep no state and run no no-data batches.
    let p = q.progress();
    assert_eq!(kinds(&p), ["data", "data"]);
    assert!(p.iter().all(|r| r["stateOperators"] == json!([])));
}
