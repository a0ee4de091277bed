//! The Rust builder and the YAML form of a pipeline produce the same value, and a
//! pipeline survives YAML → value → YAML → value unchanged.

use etlantic_core::ir::{Action, AggFunc, Aggregate, BinaryOp, Expr, Literal, NamedExpr, SortKey};
use etlantic_core::model::{Pipeline, SourceDef, TransformBuilder};
use etlantic_core::streaming::{Duration, EventTime, LatePolicy};

const YAML: &str = r#"
apiVersion: etlantic/v1
kind: Pipeline
name: customer_revenue
description: Revenue per customer.
assets:
  orders:
    contract: contracts/orders.odcs.yaml
  customer_revenue:
    contract: contracts/customer_revenue.odcs.yaml
sources:
  - id: orders
    asset: orders
    event_time: {column: ordered_at}
    watermark: 10 minutes
    late_events: {policy: side_output, sink: late}
transforms:
  - id: revenue
    inputs:
      orders: orders
    steps:
      - filter: "status != 'cancelled'"
      - aggregate:
          group_by: [customer]
          aggregates:
            orders: "count_all()"
            revenue: "sum(amount)"
      - sort: [customer]
    parameters: {min: 3}
sinks:
  - id: write_revenue
    input: revenue
    asset: customer_revenue
  - id: late
    input: orders
    asset: orders
"#;

fn built() -> Pipeline {
    Pipeline::builder("customer_revenue")
        .description("Revenue per customer.")
        .asset("orders", "contracts/orders.odcs.yaml")
        .asset("customer_revenue", "contracts/customer_revenue.odcs.yaml")
        .source_def(SourceDef {
            id: "orders".into(),
            asset: "orders".into(),
            event_time: Some(EventTime {
                column: "ordered_at".into(),
                timezone: "UTC".into(),
            }),
            watermark: Some(Duration::from_secs(600)),
            late_events: LatePolicy::SideOutput {
                sink: "late".into(),
            },
            read_limit: None,
            static_refresh: None,
        })
        .transform(
            TransformBuilder::new("revenue")
                .input("orders", "orders")
                .step(Action::Filter {
                    predicate: Expr::Binary(
                        BinaryOp::NotEq,
                        Box::new(Expr::col("status")),
                        Box::new(Expr::Literal(Literal::String("cancelled".into()))),
                    ),
                })
                .step(Action::Aggregate {
                    group_by: vec![NamedExpr::column("customer")],
                    aggregates: vec![
                        Aggregate {
                            name: "orders".into(),
                            func: AggFunc::CountAll,
                            arg: None,
                        },
                        Aggregate {
                            name: "revenue".into(),
                            func: AggFunc::Sum,
                            arg: Some(Expr::col("amount")),
                        },
                    ],
                })
                .step(Action::Sort {
                    keys: vec![SortKey {
                        expr: Expr::col("customer"),
                        descending: false,
                        nulls_first: false,
                    }],
                })
                .parameter("min", serde_json::json!(3)),
        )
        .sink("write_revenue", "revenue", "customer_revenue")
        .sink("late", "orders", "orders")
        .build()
}

#[test]
fn builder_and_yaml_give_the_same_pipeline() {
    let from_yaml = Pipeline::from_yaml(YAML, "pipeline.yaml").unwrap();
    assert_eq!(from_yaml, built());
}

#[test]
fn yaml_round_trip_is_lossless() {
    let p = built();
    let yaml = p.to_yaml();
    let back = Pipeline::from_yaml(&yaml, "again.yaml").unwrap();
    assert_eq!(back, p);
    assert_eq!(back.to_yaml(), yaml);
}

#[test]
fn unknown_fields_and_bad_headers_are_diagnosed() {
    let e =
        Pipeline::from_yaml(&YAML.replace("description:", "descripton:"), "p.yaml").unwrap_err();
    assert_eq!(e.code(), "ETL003");
    let e = Pipeline::from_yaml(&YAML.replace("etlantic/v1", "etlantic/v9"), "p.yaml").unwrap_err();
    assert_eq!(e.code(), "ETL004");
    let e = Pipeline::from_yaml("name: [", "p.yaml").unwrap_err();
    assert_eq!(e.code(), "ETL002");
    assert!(e.0.iter().next().unwrap().line.is_some());
    let e = Pipeline::from_yaml(&YAML.replace("- filter:", "- filtr:"), "p.yaml").unwrap_err();
    assert!(e.code() == "ETL002" || e.code() == "ETL003", "{e}");
    assert!(e.to_string().contains("unknown step kind"));
}

const JOINS: &str = r#"
apiVersion: etlantic/v1
kind: Pipeline
name: attribution
assets:
  impressions: {contract: contracts/impressions.yaml}
  clicks: {contract: contracts/clicks.yaml}
  campaigns: {contract: contracts/campaigns.yaml}
  out: {contract: contracts/out.yaml}
sources:
  - id: impressions
    asset: impressions
    event_time: {column: imp_ts}
    watermark: 10 seconds
  - id: clicks
    asset: clicks
    event_time: {column: click_ts}
    watermark: 5 seconds
  - id: campaigns
    asset: campaigns
    static_refresh: {interval: 10 minutes}
transforms:
  - id: attributed
    inputs: {impressions: impressions, clicks: clicks, campaigns: campaigns}
    steps:
      - join:
          right: clicks
          on: {left: [ad_id], right: [click_ad]}
          how: left
          time_range: {left: imp_ts, right: click_ts, lower: 20 seconds, upper: 0 seconds}
      - join: {right: campaigns, on: {left: [campaign], right: [id]}}
sinks:
  - id: write
    input: attributed
    asset: out
"#;

#[test]
fn join_time_ranges_and_static_sources_round_trip() {
    use etlantic_core::ir::{JoinTimeRange, JoinType};
    use etlantic_core::streaming::StaticRefresh;
    let p = Pipeline::from_yaml(JOINS, "p.yaml").unwrap();
    assert_eq!(
        p.source("campaigns").unwrap().static_refresh,
        Some(StaticRefresh::Interval(Duration::from_secs(600)))
    );
    assert!(p.source("campaigns").unwrap().is_static());
    assert!(!p.source("clicks").unwrap().is_static());
    let steps = p.transform("attributed").unwrap().steps.as_ref().unwrap();
    match &steps[0].0 {
        Action::Join {
            join_type,
            time_range: Some(r),
            ..
        } => {
            assert_eq!(*join_type, JoinType::Left);
            assert_eq!(
                r,
                &JoinTimeRange {
                    left: "imp_ts".into(),
                    right: "click_ts".into(),
                    lower: Duration::from_secs(20),
                    upper: Duration::ZERO,
                }
            );
        }
        other => panic!("{other:?}"),
    }
    let again = Pipeline::from_yaml(&p.to_yaml(), "again.yaml").unwrap();
    assert_eq!(again, p);
    let per_batch = JOINS.replace("{interval: 10 minutes}", "per_batch");
    let p = Pipeline::from_yaml(&per_batch, "p.yaml").unwrap();
    assert_eq!(
        p.source("campaigns").unwrap().static_refresh,
        Some(StaticRefresh::PerBatch)
    );
    assert_eq!(Pipeline::from_yaml(&p.to_yaml(), "again.yaml").unwrap(), p);
    for bad in [
        "always",
        "{interval: soon}",
        "{interval: 0 seconds}",
        "{every: 1 minute}",
    ] {
        let e = Pipeline::from_yaml(&JOINS.replace("{interval: 10 minutes}", bad), "p.yaml")
            .unwrap_err();
        assert!(
            e.to_string().contains("static_refresh") || e.to_string().contains("duration"),
            "{bad}: {e}"
        );
    }
    let e = Pipeline::from_yaml(
        &JOINS.replace("lower: 20 seconds", "lowr: 20 seconds"),
        "p.yaml",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("unknown join time range field"),
        "{e}"
    );
}
