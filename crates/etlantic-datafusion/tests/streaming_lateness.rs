//! Allowed lateness (Flink's and Beam's): a window stays open for `allowed_lateness`
//! after the watermark passes its end. A late row inside that bound updates its window —
//! emitted again in update mode, counted in the one row append mode emits when the
//! watermark passes the window's end plus the lateness; a row later than that follows
//! the source's late policy; a window's state is evicted only once the watermark passes
//! its end plus the lateness. The setting survives a restart from the checkpoint, and a
//! restart with another lateness is refused (the state was evicted by the old one).
//!
//! Every expected row below is computed by hand in the comments (times in seconds after
//! 2024-01-01T00:00:00Z; watermark delay 5 s, so the watermark is the maximum event
//! time seen minus 5; rows are judged late against the previous micro-batch's watermark,
//! windows closed with the current one, as in Spark).

mod streaming_support;

use etlantic_core::streaming::{LatePolicy, OutputMode};
use serde_json::{json, Value};
use streaming_support::*;

use etlantic_sinks as _;
use etlantic_sources as _;

/// Counts and sums per user in 10-second windows that allow 10 seconds of lateness.
const TUMBLING_LATE: &str = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds, allowed_lateness: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";
const SESSION_LATE: &str = "window_aggregate: {window: {type: session, column: ts, gap: 5 seconds, allowed_lateness: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";

/// [`windowed`] on the memory or the disk state store.
fn windowed_on(store: &str, name: &str, step: &str, mode: OutputMode, late: LatePolicy) -> Fixture {
    // The `disk` state store registers itself when its crate is linked: name it.
    let _ = etlantic_rocksdb::DiskStoreProvider;
    windowed(&format!("{name}_{store}"), step, mode, late)
        .with_profile(|p| p.state_store = store.into())
}

/// The tumbling scenario. `L` is the lateness (10 s): a row is late when its window's
/// end is at or before the previous watermark minus 10.
fn tumbling_data() -> Vec<Vec<Value>> {
    vec![
        // [0,10) a: 2 rows (3); [10,20) b: 1 (5). Watermark 12 - 5 = 7.
        vec![ev(1, "a", 1), ev(3, "a", 2), ev(12, "b", 5)],
        // [20,30) a: 1 (1). Watermark 20: [0,10) is evicted (10 <= 20 - 10), while
        // [10,20) stays open although the watermark reached its end.
        vec![ev(25, "a", 1)],
        // 14 s: [10,20) ends at 20 > 20 - 10, inside the lateness: b becomes 2 (9).
        // 8 s: [0,10) ends at 10 <= 10: later than the lateness, so late.
        // 28 s: [20,30) a becomes 2 (2). Watermark 23.
        vec![ev(14, "b", 4), ev(8, "a", 7), ev(28, "a", 1)],
        // 19 s: 20 > 23 - 10, still inside: b becomes 3 (10). 41 s: [40,50) a 1 (1).
        // Watermark 36: [10,20) is evicted (20 <= 26); [20,30) stays (30 > 26).
        vec![ev(19, "b", 1), ev(41, "a", 1)],
        // 15 s: 20 <= 36 - 10: late. 27 s: [20,30) a becomes 3 (7).
        vec![ev(15, "b", 100), ev(27, "a", 5)],
    ]
}

/// Update mode: every window a micro-batch changed, the late updates included.
fn tumbling_update_expected() -> Vec<Vec<String>> {
    vec![
        rows(&[win(0, 10, "a", 2, 3), win(10, 20, "b", 1, 5)]),
        rows(&[win(20, 30, "a", 1, 1)]),
        rows(&[win(10, 20, "b", 2, 9), win(20, 30, "a", 2, 2)]),
        rows(&[win(10, 20, "b", 3, 10), win(40, 50, "a", 1, 1)]),
        rows(&[win(20, 30, "a", 3, 7)]),
    ]
}

async fn outputs(q: &mut Running<'_>, data: Vec<Vec<Value>>) -> Vec<Vec<String>> {
    let mut outs = Vec::new();
    for batch in data {
        q.feed(&[("events", batch)]).await;
        outs.push(q.new_rows("out"));
    }
    outs
}

fn per_batch(progress: &[Value], field: &str) -> Vec<u64> {
    progress
        .iter()
        .map(|p| p["stateOperators"][0][field].as_u64().expect(field))
        .collect()
}

#[tokio::test]
async fn update_mode_emits_late_updates_inside_the_lateness_on_every_state_store() {
    for store in ["memory", "disk"] {
        let fx = windowed_on(
            store,
            "late_update",
            TUMBLING_LATE,
            OutputMode::Update,
            LatePolicy::Quarantine,
        );
        let mut q = fx.start().await;
        let outs = outputs(&mut q, tumbling_data()).await;
        assert_eq!(outs, tumbling_update_expected(), "{store}");
        let p = q.progress();
        let kinds: Vec<&str> = p.iter().map(|p| p["kind"].as_str().unwrap()).collect();
        // A no-data micro-batch follows each watermark advance (7, 20, 23, 36).
        assert_eq!(
            kinds,
            ["data", "no_data", "data", "no_data", "data", "no_data", "data", "no_data", "data"],
            "{store}"
        );
        // State: [0,10) goes at watermark 20, [10,20) at 36 — each when the watermark
        // passes its end plus the lateness, not its end.
        assert_eq!(
            per_batch(&p, "numRowsTotal"),
            [2, 2, 3, 2, 2, 2, 3, 2, 2],
            "{store}"
        );
        assert_eq!(
            per_batch(&p, "numRowsDroppedByWatermark"),
            [0, 0, 0, 0, 1, 0, 0, 0, 1],
            "{store}"
        );
        // Rows later than the lateness follow the late policy, with the reason.
        let lines = fx.quarantined();
        let mut amounts = Vec::new();
        for l in &lines {
            assert_eq!(l["code"], json!("ETL708"));
            let reason = l["reason"].as_str().unwrap();
            assert!(
                reason.contains("more than the allowed lateness (10 seconds)"),
                "{reason}"
            );
            let raw: Value = serde_json::from_str(l["raw"].as_str().unwrap()).unwrap();
            amounts.push(raw["amount"].clone());
        }
        assert_eq!(amounts, [json!(7), json!(100)], "{store}");
    }
}

#[tokio::test]
async fn append_mode_emits_each_window_once_when_its_lateness_is_over() {
    let fx = windowed(
        "late_append",
        TUMBLING_LATE,
        OutputMode::Append,
        LatePolicy::Drop,
    );
    let mut data = tumbling_data();
    // 60 s: watermark 55 closes [20,30) (30 <= 45) and [40,50) (50 <= 45? no).
    data.push(vec![ev(60, "c", 1)]);
    // 75 s: watermark 70 closes [40,50) (50 <= 60) and [60,70)? (70 <= 60: no).
    data.push(vec![ev(75, "c", 1)]);
    let mut q = fx.start().await;
    let outs = outputs(&mut q, data).await;
    assert_eq!(
        outs,
        vec![
            vec![],
            // Watermark 20: [0,10) is final (10 <= 20 - 10).
            rows(&[win(0, 10, "a", 2, 3)]),
            vec![],
            // Watermark 36: [10,20) with both late rows inside the lateness.
            rows(&[win(10, 20, "b", 3, 10)]),
            vec![],
            rows(&[win(20, 30, "a", 3, 7)]),
            rows(&[win(40, 50, "a", 1, 1)]),
        ]
    );
    // Each window once: no window appears twice in the sink.
    let all: Vec<String> = outs.concat();
    let mut unique = all.clone();
    unique.dedup();
    assert_eq!(all.len(), unique.len());
}

#[tokio::test]
async fn a_late_row_inside_the_lateness_extends_a_session() {
    let fx = windowed(
        "late_session",
        SESSION_LATE,
        OutputMode::Append,
        LatePolicy::Drop,
    );
    let data = vec![
        // a: [1,8) 2 (3). Watermark -2.
        vec![ev(1, "a", 1), ev(3, "a", 2)],
        // b: [20,25). Watermark 15: [1,8) stays (8 > 15 - 10).
        vec![ev(20, "b", 1)],
        // 6 s: its session [6,11) ends after 15 - 10 = 5: inside the lateness, it
        // merges with a's into [1,11) 3 (7). b: [20,29) 2 (2). Watermark 19.
        vec![ev(6, "a", 4), ev(24, "b", 1)],
        // Watermark 35: [1,11) is final (11 <= 25); [20,29) is not (29 > 25).
        vec![ev(40, "c", 1)],
        // 2 s: [2,7) ends at or before 35 - 10: late. Watermark 45: [20,29) is final.
        vec![ev(2, "a", 9), ev(50, "c", 1)],
        // Watermark 65: c's two sessions are final.
        vec![ev(70, "d", 1)],
    ];
    let mut q = fx.start().await;
    let outs = outputs(&mut q, data).await;
    assert_eq!(
        outs,
        vec![
            vec![],
            vec![],
            vec![],
            rows(&[win(1, 11, "a", 3, 7)]),
            rows(&[win(20, 29, "b", 2, 2)]),
            rows(&[win(40, 45, "c", 1, 1), win(50, 55, "c", 1, 1)]),
        ]
    );
    let dropped: u64 = per_batch(&q.progress(), "numRowsDroppedByWatermark")
        .iter()
        .sum();
    assert_eq!(dropped, 1);
}

const PER_USER_LATE: &str = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds, allowed_lateness: 10 seconds}, group_by: [user], aggregates: {n: \"count_all()\"}}";
const PER_WINDOW: &str = "aggregate: {group_by: [window_start, window_end], aggregates: {top: \"max(n)\", users: \"count_all()\"}}";

fn top(start: i64, top: i64, users: i64) -> Value {
    json!({"window_start": ts(start), "window_end": ts(start + 10), "top": top, "users": users})
}

/// A window with lateness feeding another aggregation: the second one reads the
/// window's bounds as event time that lags the watermark by the lateness, so it neither
/// drops the windows the first one emits late nor closes its groups before them.
#[tokio::test]
async fn a_chained_aggregation_waits_for_the_windows_lateness() {
    let fx = Fixture::new("late_chain")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("per_user", &["events"], &[PER_USER_LATE])
        .transform_yaml("per_window", &["per_user"], &[PER_WINDOW])
        .sink(
            "out",
            "per_window",
            &[
                ("window_start", "timestamp"),
                ("window_end", "timestamp"),
                ("top", "long"),
                ("users", "long"),
            ],
            OutputMode::Append,
        );
    let data = vec![
        // Watermark 7.
        vec![ev(1, "a", 1), ev(2, "a", 1), ev(3, "b", 1), ev(12, "a", 1)],
        // Watermark 20: [0,10) is final in both (10 <= 20 - 10).
        vec![ev(16, "b", 1), ev(25, "a", 1)],
        // 8 s: late (10 <= 20 - 10). 15 s: inside the lateness, a's [10,20) is 2.
        // Watermark 26: nothing new is final (20 > 16).
        vec![ev(8, "a", 1), ev(15, "a", 1), ev(31, "c", 1)],
        // Watermark 35: [10,20) is final (20 <= 25): a 2, b 1.
        vec![ev(40, "c", 1)],
        // Watermark 50: [20,30) (a) and [30,40) (c) are final.
        vec![ev(55, "d", 1)],
    ];
    let mut q = fx.start().await;
    let outs = outputs(&mut q, data).await;
    assert_eq!(
        outs,
        vec![
            vec![],
            rows(&[top(0, 2, 2)]),
            vec![],
            rows(&[top(10, 2, 2)]),
            rows(&[top(20, 1, 1), top(30, 1, 1)]),
        ]
    );
}

#[tokio::test]
async fn a_restart_inside_the_lateness_keeps_the_open_windows() {
    for store in ["memory", "disk"] {
        let fx = windowed_on(
            store,
            "late_restart",
            TUMBLING_LATE,
            OutputMode::Update,
            LatePolicy::Drop,
        );
        let mut data = tumbling_data();
        let after = data.split_off(2);
        let mut outs = {
            let mut q = fx.start().await;
            outputs(&mut q, data).await
        };
        // Stopped at watermark 20: [10,20) has ended but is inside its lateness. The
        // restarted query must still hold it, so 14 s and 19 s update it.
        let mut q = fx.start().await;
        let _already_seen = q.new_rows("out");
        outs.extend(outputs(&mut q, after).await);
        assert_eq!(outs, tumbling_update_expected(), "{store}");
    }
}

#[tokio::test]
async fn a_restart_with_another_lateness_is_refused() {
    let fx = windowed(
        "late_compat",
        TUMBLING_LATE,
        OutputMode::Update,
        LatePolicy::Drop,
    );
    {
        let mut q = fx.start().await;
        q.feed(&[("events", vec![ev(1, "a", 1)])]).await;
    }
    // The old lateness evicted state the new one would still need (or keeps state the
    // new one would have emitted): a new checkpoint is the way to change it.
    let changed = windowed(
        "late_compat",
        &TUMBLING_LATE.replace("allowed_lateness: 10 seconds", "allowed_lateness: 1 minute"),
        OutputMode::Update,
        LatePolicy::Drop,
    );
    let err = etlantic_runtime::StreamingQuery::start(&changed.plan(), fx.options())
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), "ETL802", "{err}");
}

#[tokio::test]
async fn lateness_without_a_watermark_is_refused_at_planning() {
    let fx = Fixture::new("late_no_watermark")
        .source(Src::new("events"))
        .transform_yaml("agg", &["events"], &[TUMBLING_LATE])
        .sink("out", "agg", WIN_COLS, OutputMode::Update);
    let (ok, codes) = codes_of(&fx);
    assert!(!ok);
    assert_eq!(codes, ["ETL436"]);
}
