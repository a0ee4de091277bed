//! The stream-stream join scenario shared by the join tests: impressions and clicks,
//! the fixtures that join them, and the expected rows per micro-batch.

use super::*;
use etlantic_core::streaming::OutputMode;
use serde_json::{json, Value};

pub const IMPS: &[(&str, &str)] = &[("ad_id", "string"), ("imp_ts", "timestamp")];
pub const CLICKS: &[(&str, &str)] = &[("click_ad", "string"), ("click_ts", "timestamp")];
pub const OUT: &[(&str, &str)] = &[
    ("ad_id", "string"),
    ("imp_ts", "timestamp"),
    ("click_ad", "string"),
    ("click_ts", "timestamp"),
];

pub fn imp(secs: i64, ad: &str) -> Value {
    json!({"ad_id": ad, "imp_ts": ts(secs)})
}

pub fn click(secs: i64, ad: &str) -> Value {
    json!({"click_ad": ad, "click_ts": ts(secs)})
}

/// An output row; `None` is the null side of an outer row.
pub fn out(i: Option<(i64, &str)>, c: Option<(i64, &str)>) -> Value {
    json!({
        "ad_id": i.map(|x| x.1), "imp_ts": i.map(|x| ts(x.0)),
        "click_ad": c.map(|x| x.1), "click_ts": c.map(|x| ts(x.0)),
    })
}

pub const RANGE: &str =
    "time_range: {left: imp_ts, right: click_ts, lower: 20 seconds, upper: 0 seconds}";

/// Impressions joined with clicks, `how` and `extra` (e.g. the time range) in the step.
pub fn join_fixture(
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
pub fn join_fixture_step(
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
pub fn imps_and_clicks(name: &str, imps: Src<'_>, clicks: Src<'_>, step: &str) -> Fixture {
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
pub fn ranged_join(how: &str) -> String {
    format!(
        "join: {{right: clicks, on: {{left: [ad_id], right: [click_ad]}}, how: {how}, {RANGE}}}"
    )
}

/// The scenario: a click before its impression (d), a click too late for its impression
/// (c), clicks without impressions (x, the second a), late rows on both sides in batch 3.
pub fn scenario() -> Vec<(Vec<Value>, Vec<Value>)> {
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
pub fn matches() -> Vec<Vec<Value>> {
    vec![
        vec![out(Some((0, "a")), Some((5, "a")))],
        vec![out(Some((2, "b")), Some((21, "b")))],
        vec![out(Some((40, "e")), Some((45, "e")))],
        vec![out(Some((70, "f")), Some((75, "f")))],
        vec![out(Some((120, "h")), Some((121, "h")))],
    ]
}

pub fn op(p: &Value, k: &str) -> u64 {
    p["stateOperators"][0][k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} in {p}"))
}

/// Runs the scenario; returns per batch: (rows, state rows after, late rows, micro-batches).
pub async fn run_scenario(fx: &Fixture) -> Vec<(Vec<String>, u64, u64, u64)> {
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

pub fn expect(got: &[(Vec<String>, u64, u64, u64)], outer: [Vec<Value>; 5], label: &str) {
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

pub fn rebuild(p: etlantic_core::model::Pipeline) -> etlantic_core::model::PipelineBuilder {
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
