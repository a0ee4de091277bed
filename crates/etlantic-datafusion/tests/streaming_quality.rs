//! Contract quality rules in a stream: the source contract's rules judge each micro-batch
//! as it is read, the sink contract's rules judge what is about to be published, each
//! rule's policy (from the profile, the contract or the default) is applied, the
//! quarantine keeps the offending records with the rule and the reason, and every rule's
//! counts appear in the progress record.

mod streaming_support;

use etlantic_core::contract::rules::Policy;
use etlantic_core::streaming::OutputMode;
use serde_json::{json, Value};
use streaming_support::*;

use etlantic_sinks as _;
use etlantic_sources as _;

/// The event contract with rules: `amount` within [0, 100]; `user` one of a, b, c; at
/// most one row per (user, amount) in a batch.
fn events_contract() -> Value {
    let mut c = contract("events", EVENTS);
    let props = c["schema"][0]["properties"].as_array_mut().unwrap();
    props[1]["quality"] = json!([{
        "id": "known", "metric": "invalidValues",
        "arguments": {"validValues": ["a", "b", "c"]}, "mustBe": 0
    }]);
    props[2]["logicalTypeOptions"]["minimum"] = json!(0);
    props[2]["logicalTypeOptions"]["maximum"] = json!(100);
    c["schema"][0]["quality"] = json!([{
        "id": "one_per_user_amount", "metric": "duplicateValues",
        "arguments": {"properties": ["user", "amount"]}, "mustBe": 0
    }]);
    c
}

/// The sink contract: `amount` at most 50 (warned, not enforced).
fn sink_contract() -> Value {
    let mut c = contract("out_asset", EVENTS);
    c["schema"][0]["properties"][2]["logicalTypeOptions"]["maximum"] = json!(50);
    c
}

fn quality_of(progress: &Value) -> Vec<(String, String, u64, bool, u64)> {
    let mut v: Vec<_> = progress["quality"]
        .as_array()
        .expect("a quality member")
        .iter()
        .map(|q| {
            (
                q["id"].as_str().unwrap().to_string(),
                q["policy"].as_str().unwrap().to_string(),
                q["violations"].as_u64().unwrap(),
                q["failed"].as_bool().unwrap(),
                q["removed"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn source_and_sink_rules_apply_their_policies_and_are_counted() {
    let mut fx = Fixture::new("quality")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.quality_policies
                .insert("out_asset.amount.range".into(), Policy::Warn);
        });
    fx.builder = fx
        .builder
        .asset_inline("events", events_contract())
        .asset_inline("out_asset", sink_contract());
    let mut run = fx.start().await;
    let rows = run
        .step(
            "events",
            vec![
                ev(1, "a", 10),
                ev(2, "b", 200), // out of range: quarantined by the source's decoder
                ev(3, "z", 5),   // unknown user: quarantined
                ev(4, "c", 60),  // breaks the sink's maximum: warned, published
                ev(5, "a", 10),  // (a, 10) again: quarantined
            ],
            "out",
        )
        .await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().any(|r| r.contains("\"amount\":60")));
    let progress = run.query.last_progress().unwrap().to_json();
    assert_eq!(
        quality_of(&progress),
        vec![
            (
                "events.one_per_user_amount".into(),
                "quarantine".into(),
                1,
                true,
                1
            ),
            ("events.user.known".into(), "quarantine".into(), 1, true, 1),
            ("out_asset.amount.range".into(), "warn".into(), 1, true, 0),
        ]
    );
    // The rows the source decoded (the out-of-range one was rejected while decoding); the
    // gate's removals happen after they are counted.
    assert_eq!(progress["numInputRows"], json!(4));
    // Per source: the records quarantined (one while decoding, two by rules) and the
    // rows read that the rules took out; per sink, what it wrote.
    assert_eq!(progress["sources"][0]["numQuarantinedRows"], json!(3));
    assert_eq!(progress["sources"][0]["numRowsRuledOut"], json!(2));
    assert_eq!(progress["sinks"][0]["sinkId"], json!("out"));
    assert_eq!(progress["sinks"][0]["numOutputRows"], json!(2));
    let q = etlantic_runtime::quarantine::read_quarantine(fx.quarantine()).unwrap();
    assert_eq!(q.len(), 3, "{q:?}");
    let reasons: Vec<&str> = q.iter().map(|l| l["reason"].as_str().unwrap()).collect();
    assert!(reasons
        .iter()
        .any(|r| r.contains("events.user.known") && r.contains("user=z")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("events.one_per_user_amount")));
    assert!(reasons.iter().any(|r| r.contains("200")), "{reasons:?}");
    for l in &q {
        assert_eq!(l["code"], json!("ETL704"));
        assert_eq!(l["position"]["asset"], json!("events"));
        assert!(l["raw"].as_str().unwrap().starts_with('{'));
        assert_eq!(l["batch_id"], json!(0));
    }
    // Nothing is lost: published + quarantined = input.
    assert_eq!(rows.len() + q.len(), 5);
}

#[tokio::test]
async fn a_fail_policy_stops_the_query_before_the_sink_publishes() {
    let mut fx = Fixture::new("quality_fail")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.quality_policies
                .insert("events.user.known".into(), Policy::Fail);
        });
    fx.builder = fx.builder.asset_inline("events", events_contract());
    let mut run = fx.start().await;
    run.push("events", &[ev(1, "a", 1), ev(2, "nobody", 2)]);
    let e = run.query.process_all_available().await.unwrap_err();
    assert_eq!(e.code(), "ETL705");
    assert!(e.to_string().contains("events.user.known"), "{e}");
    assert_eq!(run.writes("out"), 0, "nothing published");
}

#[tokio::test]
async fn drop_or_warn_on_a_rule_the_source_checks_while_decoding_is_refused() {
    let mut fx = Fixture::new("quality_refused")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.quality_policies
                .insert("events.amount.range".into(), Policy::Drop);
        });
    fx.builder = fx.builder.asset_inline("events", events_contract());
    let plan = fx.plan();
    let Err(e) = etlantic_runtime::StreamingQuery::start(&plan, fx.options()).await else {
        panic!("refused at start");
    };
    assert_eq!(e.code(), "ETL222");
    assert!(e.to_string().contains("events.amount.range"), "{e}");
}

#[tokio::test]
async fn an_unknown_rule_id_in_the_profile_fails_planning() {
    let fx = Fixture::new("quality_unknown")
        .source(Src::new("events"))
        .transform_yaml("pass", &["events"], &["select: [ts, user, amount]"])
        .sink("out", "pass", EVENTS, OutputMode::Append)
        .with_profile(|p| {
            p.quality_policies
                .insert("events.no_such_rule".into(), Policy::Warn);
        });
    let Err(e) = fx.plan_outcome().into_result() else {
        panic!("planning must fail");
    };
    assert!(e.0.iter().any(|d| d.code == "ETL222"), "{e}");
}

/// Rules on emitted window aggregates live in the sink's contract: a window whose count
/// breaks the contract's maximum is quarantined when it is emitted (with the rule and the
/// window row), the others are published, and the rule is counted in the progress record.
#[tokio::test]
async fn rules_on_emitted_window_aggregates_judge_each_window_before_publication() {
    let tumbling = "window_aggregate: {window: {type: tumbling, column: ts, size: 10 seconds}, group_by: [user], aggregates: {cnt: \"count_all()\", total: \"sum(amount)\"}}";
    let mut fx = Fixture::new("quality_windows")
        .source(Src::new("events").watermark("ts", "5 seconds"))
        .transform_yaml("agg", &["events"], &[tumbling])
        .sink("out", "agg", WIN_COLS, OutputMode::Append);
    let mut sink = contract("out_asset", WIN_COLS);
    sink["schema"][0]["properties"][3]["logicalTypeOptions"]["maximum"] = json!(2);
    fx.builder = fx.builder.asset_inline("out_asset", sink);
    let mut run = fx.start().await;
    let mut rows = run
        .step(
            "events",
            vec![ev(1, "a", 1), ev(2, "a", 1), ev(3, "a", 1), ev(4, "b", 5)],
            "out",
        )
        .await;
    // Event time 30 s moves the watermark to 25 s: the window [0, 10) closes.
    rows.extend(run.step("events", vec![ev(30, "b", 1)], "out").await);
    assert_eq!(rows.len(), 1, "only b's window is published: {rows:?}");
    assert!(rows[0].contains("\"user\":\"b\""), "{rows:?}");
    let q = etlantic_runtime::quarantine::read_quarantine(fx.quarantine()).unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["code"], json!("ETL704"));
    let reason = q[0]["reason"].as_str().unwrap();
    assert!(reason.contains("out_asset.cnt.range"), "{reason}");
    let raw: Value = serde_json::from_str(q[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(
        (raw["user"].clone(), raw["cnt"].clone()),
        (json!("a"), json!(3))
    );
    assert_eq!(q[0]["position"]["asset"], json!("out_asset"));
    // The rule was counted in the micro-batch that emitted the window.
    let counted: u64 = run
        .progress()
        .iter()
        .flat_map(|p| p["quality"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["id"] == json!("out_asset.cnt.range"))
        .map(|c| c["removed"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 1);
}
