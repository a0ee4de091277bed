//! `explain` (text and Mermaid), `diff`, `validate` in its three formats and `plugins`.

mod common;

use common::*;

#[test]
fn explain_as_text_names_sources_regions_sinks_and_guarantees() {
    let p = Project::init();
    let fp = plan_fingerprint(p.path(), &["plan", "-o", "plan.json"]);
    let r = p.run(&["explain"]);
    r.ok();
    let t = &r.stdout;
    for needle in [
        "Pipeline customer_revenue (profile local",
        fp.as_str(),
        "Sources",
        "orders ← asset orders (file://data/orders.jsonl)",
        "Regions",
        "r0 (Batch on datafusion)",
        "revenue (orders←orders)",
        "filter (status != 'cancelled')",
        "aggregate by [customer]",
        "sort [customer]",
        "Sinks",
        "write_revenue ← revenue → asset customer_revenue (file://out/customer_revenue.csv)",
        "Transitions",
        "source:orders → region:r0: orders (arrow)",
        "region:r0 → sink:write_revenue: revenue (arrow)",
        "Delivery guarantees",
        "orders → write_revenue: exactly_once",
        "Quarantine → file://out/quarantine.jsonl",
    ] {
        assert!(t.contains(needle), "explain lacks {needle:?}:\n{t}");
    }
    // A saved plan explains the same.
    let saved = p.run(&["explain", "--plan", "plan.json"]);
    saved.ok();
    assert_eq!(saved.stdout, r.stdout);
    assert!(!p.exists("out"), "explain runs nothing");
}

#[test]
fn explain_as_mermaid_is_a_flowchart_of_the_plan() {
    let p = Project::init();
    let r = p.run(&["explain", "--mermaid"]);
    r.ok();
    let m = &r.stdout;
    assert!(m.starts_with("flowchart LR\n"), "{m}");
    for needle in [
        "src_orders[",
        "subgraph region_r0[\"r0: Batch on datafusion\"]",
        "t_revenue[\"revenue\"]",
        "end",
        "sink_write_revenue[/",
        "src_orders -->|arrow| t_revenue",
        "t_revenue -->|arrow| sink_write_revenue",
    ] {
        assert!(m.contains(needle), "mermaid lacks {needle:?}:\n{m}");
    }
    // Every edge goes between declared nodes.
    let declared: Vec<&str> = m
        .lines()
        .map(str::trim)
        .filter(|l| !l.contains("-->") && !l.starts_with("subgraph") && *l != "end")
        .filter_map(|l| l.split(['[', '(']).next())
        .collect();
    for edge in m.lines().filter(|l| l.contains("-->")) {
        let parts: Vec<&str> = edge.split_whitespace().collect();
        assert!(declared.contains(&parts[0]), "{edge}");
        assert!(declared.contains(parts.last().unwrap()), "{edge}");
    }
}

#[test]
fn diff_of_identical_plans_and_of_a_changed_filter() {
    let p = Project::init();
    p.run(&["plan", "-o", "a.json"]).ok();
    p.run(&["plan", "-o", "b.json"]).ok();
    let r = p.run(&["diff", "a.json", "b.json"]);
    r.ok();
    assert!(r.stdout.contains("identical"), "{}", r.stdout);
    let r = p.run(&["diff", "a.json", "b.json", "--format", "json"]);
    r.ok();
    let j = r.stdout_json();
    assert_eq!(j["old"], j["new"]);
    assert_eq!(j["changes"].as_array().unwrap().len(), 0);
    // A pipeline and its saved plan are identical too.
    let r = p.run(&[
        "diff",
        "a.json",
        "pipeline.yaml",
        "-p",
        "profiles/local.yaml",
    ]);
    r.ok();
    assert!(r.stdout.contains("identical"), "{}", r.stdout);

    // Change the filter.
    p.write(
        "changed.yaml",
        &p.read("pipeline.yaml")
            .replace("status != 'cancelled'", "status == 'paid'"),
    );
    p.run(&[
        "plan",
        "changed.yaml",
        "-p",
        "profiles/local.yaml",
        "-o",
        "c.json",
    ])
    .ok();
    let r = p.run(&["diff", "a.json", "c.json"]);
    r.ok();
    let t = &r.stdout;
    assert!(!t.contains("identical"), "{t}");
    assert!(t.contains("change(s)"), "{t}");
    assert!(t.contains("transforms.revenue.logic"), "{t}");
    assert!(t.contains("_filter_"), "the filter action changed: {t}");
    let r = p.run(&["diff", "a.json", "c.json", "--format", "json"]);
    r.ok();
    let j = r.stdout_json();
    assert_ne!(j["old"], j["new"]);
    let changes = j["changes"].as_array().unwrap();
    assert!(!changes.is_empty());
    // The new predicate is in the changes, the old one too.
    let all = serde_json::to_string(changes).unwrap();
    assert!(all.contains("\"paid\""), "{all}");
    assert!(all.contains("\"cancelled\""), "{all}");
    assert!(
        changes.iter().all(|c| c["path"]
            .as_str()
            .unwrap()
            .starts_with("transforms.revenue.")
            || c["path"] == "regions"),
        "only the transformation changed: {changes:#?}"
    );
    // Pipelines can be compared directly.
    let r = p.run(&[
        "diff",
        "pipeline.yaml",
        "changed.yaml",
        "-p",
        "profiles/local.yaml",
    ]);
    r.ok();
    assert!(
        r.stdout.contains("transforms.revenue.logic"),
        "{}",
        r.stdout
    );
    // A broken side fails with its own diagnostic.
    p.write(
        "broken.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\n\tname: x\n",
    );
    let r = p.run(&["diff", "a.json", "broken.yaml"]);
    r.expect_code(exit::INVALID_PIPELINE);
    assert!(r.stderr.contains("ETL002"), "{}", r.stderr);
}

#[test]
fn validate_in_human_json_and_sarif() {
    let p = Project::init();
    let r = p.run(&["validate"]);
    r.ok();
    assert_eq!(r.stdout, "valid: no problems found\n");
    let r = p.run(&["validate", "--format", "json"]);
    r.ok();
    let j = r.stdout_json();
    assert_eq!(j["errors"], 0);
    assert_eq!(j["warnings"], 0);
    assert_eq!(j["diagnostics"].as_array().unwrap().len(), 0);
    let r = p.run(&["validate", "--format", "sarif"]);
    r.ok();
    let s = r.stdout_json();
    assert_eq!(s["version"], "2.1.0");
    assert!(
        s["$schema"].as_str().unwrap_or("").contains("sarif"),
        "{s:#}"
    );
    assert_eq!(s["runs"][0]["tool"]["driver"]["name"], "etlantic");
    assert_eq!(s["runs"][0]["results"].as_array().unwrap().len(), 0);

    // A warning does not fail validation, and is reported in every format.
    p.edit(
        "pipeline.yaml",
        "sources:\n",
        "sources:\n  - id: spare\n    asset: orders\n",
    );
    let r = p.run(&["validate"]);
    r.ok();
    assert!(r.stdout.contains("warning[ETL106]"), "{}", r.stdout);
    assert!(r.stdout.contains("= at: sources[spare]"), "{}", r.stdout);
    let r = p.run(&["validate", "--format", "json"]);
    r.ok();
    let j = r.stdout_json();
    assert_eq!(j["warnings"], 1);
    assert_eq!(j["errors"], 0);
    let d = find_diag(&j, "ETL106");
    assert_eq!(d["severity"], "warning");
    assert_eq!(d["path"], "sources[spare]");
    let r = p.run(&["validate", "--format", "sarif"]);
    r.ok();
    let s = r.stdout_json();
    assert_sarif_has(&s, "ETL106");
    let res = &s["runs"][0]["results"][0];
    assert_eq!(res["level"], "warning");
    assert_eq!(
        res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "pipeline.yaml"
    );
    // Warnings of `plan` and `run` go to stderr; the output stays clean.
    let plan = p.run(&["plan"]);
    plan.ok();
    assert!(plan.stderr.contains("ETL106"), "{}", plan.stderr);
    plan.stdout_json();
    let run = p.run(&["run", "--format", "json"]);
    run.ok();
    assert_eq!(run.stdout_json()["status"], "succeeded");
}

#[test]
fn plugins_lists_the_linked_plugins() {
    let p = Project::empty();
    let r = p.run(&["plugins"]);
    r.ok();
    let t = &r.stdout;
    let section = |name: &str| -> String {
        t.split(name)
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {t}"))
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let backends = section("Backends:");
    assert!(backends.contains("datafusion"), "{t}");
    assert!(
        backends.contains("Batch") && backends.contains("Streaming"),
        "{t}"
    );
    let sources = section("Sources:");
    for s in ["file://", "memory://", "rate://"] {
        assert!(sources.contains(s), "source {s} in {t}");
    }
    let sinks = section("Sinks:");
    for s in ["file://", "memory://", "console://"] {
        assert!(sinks.contains(s), "sink {s} in {t}");
    }
}

/// `conformance spark --backend spark` at an endpoint where nothing listens: the
/// scenarios fail with the engine-unreachable diagnostic and the run exits 4, at once
/// (the Spark client alone would retry for minutes).
#[test]
fn conformance_on_an_unreachable_spark_endpoint_fails_fast() {
    let p = Project::empty();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/spark");
    let endpoint = format!("sc://127.0.0.1:{port}");
    let r = p.run(&[
        "conformance",
        "spark",
        corpus.to_str().unwrap(),
        "--backend",
        "spark",
        "--endpoint",
        &endpoint,
    ]);
    r.expect_code(4);
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("project_filter_basic"))
        .unwrap_or_default();
    assert!(
        line.starts_with("FAIL") && line.contains("ETL710"),
        "{}",
        r.stdout
    );
}
