//! Stream-static joins on the embedded runtime: the static table read for every
//! micro-batch or cached for an interval, prepared by a transformation before the join,
//! and the places a static source is refused.

mod common;
mod streaming_support;

use etlantic_core::model::SourceDef;
use etlantic_core::streaming::{OutputMode, StaticRefresh};
use serde_json::{json, Value};
use streaming_support::joins::rebuild;
use streaming_support::*;

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
