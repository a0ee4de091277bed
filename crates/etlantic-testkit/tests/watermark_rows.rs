//! Where each source's watermark is measured (`PlanSource::watermark_rows`), on the
//! pending Spark recordings and on variants of them: the filters Spark's optimizer
//! moves below the watermark, and the `is not null` it infers from a join's keys.

use etlantic_core::ir::{BinaryOp, Expr};
use etlantic_testkit::conformance::scenario::Scenario;
use etlantic_testkit::conformance::to_pipeline::scenario_pipeline;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use etlantic_sinks as _;
use etlantic_sources as _;

fn pending(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/conformance/spark-pending")
        .join(format!("{name}.json"))
}

/// Source → the rows its watermark is measured on (`None`: every row), for scenario
/// `name` with its query edited by `edit`.
fn measured(name: &str, edit: impl FnOnce(&mut Value)) -> BTreeMap<String, Option<String>> {
    let mut s = Scenario::load(&pending(name)).expect("the scenario loads");
    edit(&mut s.query);
    let sp = scenario_pipeline(&s, "wr").expect("the scenario maps to a pipeline");
    let dir = tempfile::tempdir().unwrap();
    let project = etlantic_plan::Project::from_parts(dir.path(), sp.pipeline, sp.profile);
    etlantic_datafusion::link();
    let plan = etlantic_plan::plan(&project)
        .into_result()
        .expect("the scenario plans");
    plan.sources
        .iter()
        .map(|s| {
            let rows = s
                .watermark_rows
                .as_ref()
                .map(|v| Expr::decode(v).expect("an expression").to_string());
            (s.id.clone(), rows)
        })
        .collect()
}

fn rows(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect()
}

const NOT_NULL_AD: Option<&str> = Some("!(is_null(ad_id))");

#[test]
fn a_filter_without_the_event_time_moves_below_the_watermark() {
    assert_eq!(
        measured("min_filter_below_watermark", |_| {}),
        rows(&[("events", Some("(amount > 5)"))])
    );
    // Through a union, into both inputs.
    assert_eq!(
        measured("min_union_filter_below_watermark", |_| {}),
        rows(&[("a", Some("(user == 'a')")), ("b", Some("(user == 'a')"))])
    );
}

#[test]
fn conjuncts_reading_the_event_time_stay_above_it() {
    let edited = measured("min_filter_below_watermark", |q| {
        q["filter"] = json!({"and": [
            {"col": "amount", "op": ">", "value": 5},
            {"col": "ts", "op": "is_not_null"},
        ]})
    });
    assert_eq!(edited, rows(&[("events", Some("(amount > 5)"))]));
    let only_time = measured("min_filter_below_watermark", |q| {
        q["filter"] = json!({"col": "ts", "op": "is_not_null"})
    });
    assert_eq!(only_time, rows(&[("events", None)]));
    // A disjunction is one conjunct: it moves whole or not at all.
    let or = measured("min_filter_below_watermark", |q| {
        q["filter"] = json!({"or": [
            {"col": "amount", "op": ">", "value": 5},
            {"col": "ts", "op": "is_null"},
        ]})
    });
    assert_eq!(or, rows(&[("events", None)]));
}

#[test]
fn a_join_keeps_null_keys_out_of_the_sides_it_does_not_preserve() {
    let join = |jt: &str| {
        measured("min_left_outer_null_right_key_watermark", |q| {
            q["join_type"] = json!(jt)
        })
    };
    assert_eq!(
        join("inner"),
        rows(&[("clicks", NOT_NULL_AD), ("impressions", NOT_NULL_AD)])
    );
    assert_eq!(
        join("left_outer"),
        rows(&[("clicks", NOT_NULL_AD), ("impressions", None)])
    );
    assert_eq!(
        join("right_outer"),
        rows(&[("clicks", None), ("impressions", NOT_NULL_AD)])
    );
    assert_eq!(
        join("full_outer"),
        rows(&[("clicks", None), ("impressions", None)])
    );
    assert_eq!(
        measured("min_join_null_key_watermark", |_| {}),
        rows(&[("clicks", NOT_NULL_AD), ("impressions", NOT_NULL_AD)])
    );
}

#[test]
fn a_deduplication_stops_filters() {
    assert_eq!(
        measured("min_union_dedup_tskey_drop_duplicates", |_| {}),
        rows(&[("a", None), ("b", None)])
    );
}

const ASSETS: &str = r#"
assets:
  bids:
    contract: {version: "1.0.0", apiVersion: v3.1.0, kind: DataContract, id: bids, name: bids, status: active, schema: [{name: bids, logicalType: object, properties: [{name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: bidder, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: price, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: channel, logicalType: string}, {name: url, logicalType: string}, {name: date_time, logicalType: timestamp}, {name: extra, logicalType: string}]}]}
  auctions:
    contract: {version: "1.0.0", apiVersion: v3.1.0, kind: DataContract, id: auctions, name: auctions, status: active, schema: [{name: auctions, logicalType: object, properties: [{name: id, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: seller, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: category, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: date_time, logicalType: timestamp}]}]}
  out:
    contract: {version: "1.0.0", apiVersion: v3.1.0, kind: DataContract, id: out, name: out, status: active, schema: [{name: out, logicalType: object, properties: [{name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: date_time, logicalType: timestamp}]}]}
  counts:
    contract: {version: "1.0.0", apiVersion: v3.1.0, kind: DataContract, id: counts, name: counts, status: active, schema: [{name: counts, logicalType: object, properties: [{name: window_start, logicalType: timestamp}, {name: window_end, logicalType: timestamp}, {name: auction, logicalType: integer, logicalTypeOptions: {format: i64}}, {name: n, logicalType: integer, logicalTypeOptions: {format: i64}}]}]}
sources:
  - {id: bids, asset: bids, event_time: {column: date_time}, watermark: 2 seconds}
  - {id: auctions, asset: auctions, event_time: {column: date_time}, watermark: 2 seconds}
"#;

/// The auctions with the columns a join with the bids needs (`opened_at`: its time).
const OPENED: &str = r#"
  - id: opened
    inputs: {auctions: auctions}
    steps:
      - select: [id, seller, date_time]
      - rename: {date_time: opened_at}
"#;

const PROFILE: &str = "apiVersion: etlantic/v1\nkind: Profile\nname: t\nmode: streaming\ncheckpoint: file://chk\nbindings:\n  bids: nexmark://bids\n  auctions: nexmark://auctions\n  out: file://out/a/?format=jsonl\n  counts: file://out/c/?format=jsonl\n";

/// A conjunction's predicates, sorted; a source's rows are a disjunction of them (empty:
/// every row).
type Dnf = Vec<Vec<String>>;

/// Source → the rows its watermark is measured on, for a pipeline of the Nexmark sources
/// with `transforms` and `sinks` (YAML list items).
fn conjunctions(transforms: &str, sinks: &str) -> BTreeMap<String, Dnf> {
    let text = format!(
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: t\n{ASSETS}transforms:\n{transforms}sinks:\n{sinks}"
    );
    let pipeline = etlantic_core::model::Pipeline::from_yaml(&text, "pipeline.yaml")
        .expect("the pipeline reads");
    let profile = etlantic_core::profile::Profile::from_yaml(PROFILE, "profile.yaml").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let project = etlantic_plan::Project::from_parts(dir.path(), pipeline, profile);
    etlantic_datafusion::link();
    let plan = match etlantic_plan::plan(&project).into_result() {
        Ok(p) => p,
        Err(e) => panic!("the pipeline plans: {e}"),
    };
    fn split(e: &Expr, op: BinaryOp, out: &mut Vec<Expr>) {
        match e {
            Expr::Binary(o, a, b) if *o == op => {
                split(a, op, out);
                split(b, op, out);
            }
            e => out.push(e.clone()),
        }
    }
    plan.sources
        .iter()
        .map(|s| {
            let mut dnf = Vec::new();
            if let Some(v) = &s.watermark_rows {
                let mut ors = Vec::new();
                split(&Expr::decode(v).unwrap(), BinaryOp::Or, &mut ors);
                for c in ors {
                    let mut ands = Vec::new();
                    split(&c, BinaryOp::And, &mut ands);
                    let mut conj: Vec<String> = ands.iter().map(|e| e.to_string()).collect();
                    conj.sort();
                    dnf.push(conj);
                }
            }
            dnf.sort();
            (s.id.clone(), dnf)
        })
        .collect()
}

fn expect(pairs: &[(&str, &[&[&str]])]) -> BTreeMap<String, Dnf> {
    pairs
        .iter()
        .map(|(k, dnf)| {
            let dnf = dnf
                .iter()
                .map(|c| {
                    let mut c: Vec<String> = c.iter().map(|e| e.to_string()).collect();
                    c.sort();
                    c
                })
                .collect::<Vec<_>>();
            let mut dnf = dnf;
            dnf.sort();
            (k.to_string(), dnf)
        })
        .collect()
}

const SINK_OUT: &str = "  - {id: w, input: t, asset: out, output_mode: append}\n";

/// Bids over 100 joined (`how`) with the auctions opened up to 10 s before, then `after`.
fn join(how: &str, after: &str) -> String {
    format!(
        r#"{OPENED}  - id: t
    inputs: {{bids: bids, opened: opened}}
    steps:
      - filter: "auction > 100"
      - join:
          right: opened
          'on': {{left: [auction], right: [id]}}
          how: {how}
          time_range: {{left: date_time, right: opened_at, lower: 0 seconds, upper: 10 seconds}}
{after}      - select: [auction, date_time]
"#
    )
}

#[test]
fn a_condition_on_a_join_key_carries_over_to_the_key_it_equals() {
    assert_eq!(
        conjunctions(&join("inner", ""), SINK_OUT),
        expect(&[
            ("bids", &[&["(auction > 100)", "!(is_null(auction))"]]),
            ("auctions", &[&["(id > 100)", "!(is_null(id))"]]),
        ])
    );
    // A left outer join preserves the left side: only the right side gets more.
    assert_eq!(
        conjunctions(&join("left", ""), SINK_OUT),
        expect(&[
            ("bids", &[&["(auction > 100)"]]),
            ("auctions", &[&["(id > 100)", "!(is_null(id))"]]),
        ])
    );
}

#[test]
fn a_filter_that_rejects_nulls_of_the_outer_side_makes_the_join_inner() {
    let after = "      - filter: \"seller > 5\"\n";
    assert_eq!(
        conjunctions(&join("left", after), SINK_OUT),
        expect(&[
            ("bids", &[&["(auction > 100)", "!(is_null(auction))"]]),
            (
                "auctions",
                // `seller is not null` is implied by `seller > 5`: Spark infers it too.
                &[&[
                    "(id > 100)",
                    "!(is_null(id))",
                    "(seller > 5)",
                    "!(is_null(seller))",
                ]]
            ),
        ])
    );
}

#[test]
fn computed_and_renamed_columns_are_replaced_by_what_they_compute() {
    let t = r#"  - id: t
    inputs: {bids: bids}
    steps:
      - select: [auction, price, date_time]
      - rename: {price: p}
      - with_fields: {dbl: "p * 2"}
      - filter: "dbl > 10 && p < 1000"
      - select: [auction, date_time]
"#;
    assert_eq!(
        conjunctions(t, SINK_OUT),
        expect(&[
            ("bids", &[&["((price * 2) > 10)", "(price < 1000)"]]),
            ("auctions", &[]),
        ])
    );
}

#[test]
fn through_an_aggregation_only_conditions_on_grouping_columns_move() {
    let t = r#"  - id: t
    inputs: {bids: bids}
    steps:
      - window_aggregate:
          window: {type: tumbling, column: date_time, size: 10 seconds}
          group_by: [auction]
          aggregates: {n: "count_all()"}
      - filter: "auction > 7 && n > 2"
"#;
    assert_eq!(
        conjunctions(
            t,
            "  - {id: w, input: t, asset: counts, output_mode: append}\n"
        ),
        expect(&[("bids", &[&["(auction > 7)"]]), ("auctions", &[])])
    );
}

#[test]
fn a_deduplication_keeps_the_filters_after_it_above_the_watermark() {
    let t = r#"  - id: t
    inputs: {bids: bids}
    steps:
      - deduplicate: {keys: [bidder, auction], within_watermark: true}
      - filter: "price > 1"
      - select: [auction, date_time]
"#;
    assert_eq!(
        conjunctions(t, SINK_OUT),
        expect(&[("bids", &[]), ("auctions", &[])])
    );
}

#[test]
fn a_source_read_by_several_paths_counts_a_row_any_of_them_sees() {
    let path = |id: &str, filter: &str| {
        format!(
            "  - id: {id}\n    inputs: {{bids: bids}}\n    steps:\n{filter}      - select: [auction, date_time]\n"
        )
    };
    let sink =
        |id: &str| format!("  - {{id: w_{id}, input: {id}, asset: out, output_mode: append}}\n");
    let two = format!(
        "{}{}",
        path("t", "      - filter: \"price > 10\"\n"),
        path("u", "      - filter: \"channel == 'x'\"\n")
    );
    assert_eq!(
        conjunctions(&two, &format!("{}{}", sink("t"), sink("u"))),
        expect(&[
            ("bids", &[&["(price > 10)"], &["(channel == 'x')"]]),
            ("auctions", &[]),
        ])
    );
    let three = format!("{two}{}", path("v", ""));
    assert_eq!(
        conjunctions(&three, &format!("{}{}{}", sink("t"), sink("u"), sink("v"))),
        expect(&[("bids", &[]), ("auctions", &[])])
    );
}

#[test]
fn explain_says_where_each_watermark_is_measured() {
    let mut s = Scenario::load(&pending("min_left_outer_null_right_key_watermark")).unwrap();
    s.query["join_type"] = json!("left_outer");
    let sp = scenario_pipeline(&s, "wr").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let project = etlantic_plan::Project::from_parts(dir.path(), sp.pipeline, sp.profile);
    etlantic_datafusion::link();
    let plan = etlantic_plan::plan(&project).into_result().unwrap();
    let text = etlantic_plan::explain::explain_text(&plan);
    assert!(
        text.contains("watermark measured on max(click_ts) of the rows where !(is_null(ad_id))"),
        "{text}"
    );
    assert!(
        text.contains("watermark measured on max(imp_ts) of every row read"),
        "{text}"
    );
    let mermaid = etlantic_plan::explain::explain_mermaid(&plan);
    assert!(mermaid.contains("watermark: max(click_ts)"), "{mermaid}");
}
