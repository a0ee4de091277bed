//! Contracts of streaming pipelines and contract evolution:
//! - `generate dtcs|dpcs` for a streaming pipeline writes documents that say the inputs are
//!   unbounded and carry event time, watermark, late policy, output mode and delivery
//!   guarantee, and that parse and validate with the `dtcs` / `dpcs` crates; a batch
//!   plan's say bounded;
//! - `diff` of two contract versions (ODCS, DTCS, DPCS) classifies every change as
//!   breaking or compatible with the standard's crate and exits 5 on a breaking one.

mod common;

use common::crash::{CLICKS, COUNTS};
use common::*;
use etlantic::contract_diff::{diff_files, ContractStandard};
use etlantic::generate::{generate, Standard};
use serde_json::{json, Value};
use std::path::Path;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: click_counts
assets:
  clicks:
    contract: contracts/clicks.yaml
  counts:
    contract: contracts/counts.yaml
sources:
  - id: clicks
    asset: clicks
    event_time: {column: ts}
    watermark: 10 seconds
    late_events: {policy: quarantine}
transforms:
  - id: valid
    inputs:
      clicks: clicks
    steps:
      - filter: "campaign != ''"
  - id: per_minute
    inputs:
      clicks: valid
    steps:
      - window_aggregate:
          window: {type: tumbling, column: ts, size: 1 minute}
          group_by: [campaign]
          aggregates: {n: "count_all()"}
sinks:
  - id: write_counts
    input: per_minute
    asset: counts
    output_mode: append
"#;

const STREAMING: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: streaming
mode: streaming
trigger: processing_time 5 seconds
checkpoint: file://chk
bindings:
  clicks: file://in?format=jsonl
  counts: file://out/counts/?format=jsonl
quarantine: file://out/quarantine.jsonl
"#;

const BATCH: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: batch
bindings:
  clicks: file://in/clicks.jsonl
  counts: file://out/counts.jsonl
quarantine: file://out/quarantine.jsonl
"#;

/// A project with the click-count pipeline and a streaming and a batch profile.
fn click_project() -> Project {
    let p = Project::empty();
    p.write("pipeline.yaml", PIPELINE);
    p.write("contracts/clicks.yaml", CLICKS);
    p.write("contracts/counts.yaml", COUNTS);
    p.write("profiles/streaming.yaml", STREAMING);
    p.write("profiles/batch.yaml", BATCH);
    p.write("in/clicks.jsonl", "");
    p
}

/// Plans the project with `profile` and generates `standard` into `out`.
fn generated(p: &Project, profile: &str, standard: Standard, out: &str) {
    let project = etlantic::plan::Project::load(
        &p.join("pipeline.yaml"),
        Some(&p.join(&format!("profiles/{profile}.yaml"))),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let plan = etlantic::plan::plan(&project)
        .into_result()
        .unwrap_or_else(|e| panic!("{e}"));
    let files = generate(&plan, standard, &p.join(out)).unwrap_or_else(|e| panic!("{e}"));
    assert!(!files.is_empty());
}

/// A generated DTCS contract: parsed and validated by the `dtcs` crate, and as JSON.
#[track_caller]
fn dtcs_doc(p: &Project, rel: &str) -> (dtcs::TransformationContract, Value) {
    let text = p.read(rel);
    let c = dtcs::parse(text.as_bytes(), dtcs::DocumentFormat::Yaml)
        .into_contract()
        .unwrap_or_else(|r| panic!("{rel} does not parse: {:?}", r.errors()));
    let report = dtcs::validate(&c);
    assert!(report.is_valid(), "{rel}: {:?}", report.errors());
    (c, serde_yaml::from_str(&text).unwrap())
}

/// A generated DPCS contract: parsed and validated by the `dpcs` crate, and as JSON.
#[track_caller]
fn dpcs_doc(p: &Project, rel: &str) -> (dpcs::PipelineContract, Value) {
    let text = p.read(rel);
    let c = dpcs::parse_yaml(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let report = dpcs::validate(&c);
    assert!(
        report.is_valid(),
        "{rel}: {:?}",
        report
            .errors()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    );
    (c, serde_yaml::from_str(&text).unwrap())
}

#[test]
fn streaming_dtcs_contracts_declare_unbounded_inputs_with_event_time_watermark_and_late_policy() {
    let p = click_project();
    generated(&p, "streaming", Standard::Dtcs, "s");

    // `valid` reads the source directly.
    let (c, v) = dtcs_doc(&p, "s/transformations/click_counts.valid.dtcs.yaml");
    assert_eq!(
        c.inputs[0].streaming.as_ref().map(|s| s.mode),
        Some(dtcs::model::StreamingMode::Unbounded)
    );
    assert_eq!(
        c.outputs[0].streaming.as_ref().map(|s| s.mode),
        Some(dtcs::model::StreamingMode::Unbounded)
    );
    let input = &v["inputs"][0];
    assert_eq!(input["etlantic:eventTime"], "ts", "{input:#}");
    assert_eq!(input["etlantic:eventTimeZone"], "UTC");
    assert_eq!(
        input["etlantic:watermark"],
        json!({"field": "ts", "delay": "10 seconds"})
    );
    assert_eq!(
        input["etlantic:lateEvents"],
        json!({"policy": "quarantine"})
    );
    // The vendor keys are the crate's flattened extensions, not unknown fields.
    assert_eq!(c.inputs[0].extensions["etlantic:eventTime"], json!("ts"));

    // `per_minute` reads `valid`: still unbounded, with the source's event time since
    // `ts` survives the filter.
    let (c, v) = dtcs_doc(&p, "s/transformations/click_counts.per_minute.dtcs.yaml");
    assert_eq!(
        c.inputs[0].streaming.as_ref().map(|s| s.mode),
        Some(dtcs::model::StreamingMode::Unbounded)
    );
    assert_eq!(v["inputs"][0]["etlantic:eventTime"], "ts");
    assert_eq!(v["inputs"][0]["etlantic:watermark"]["delay"], "10 seconds");
    assert_eq!(v["outputs"][0]["streaming"]["mode"], "unbounded");

    // The same pipeline in batch: bounded, no watermark or late policy.
    generated(&p, "batch", Standard::Dtcs, "b");
    for t in ["valid", "per_minute"] {
        let (c, v) = dtcs_doc(&p, &format!("b/transformations/click_counts.{t}.dtcs.yaml"));
        assert_eq!(
            c.inputs[0].streaming.as_ref().map(|s| s.mode),
            Some(dtcs::model::StreamingMode::Bounded),
            "{t}"
        );
        assert_eq!(
            c.outputs[0].streaming.as_ref().map(|s| s.mode),
            Some(dtcs::model::StreamingMode::Bounded),
            "{t}"
        );
        assert!(v["inputs"][0].get("etlantic:watermark").is_none(), "{v:#}");
        assert!(v["inputs"][0].get("etlantic:lateEvents").is_none(), "{v:#}");
    }
    let (_, v) = dtcs_doc(&p, "b/transformations/click_counts.valid.dtcs.yaml");
    assert_eq!(v["inputs"][0]["etlantic:eventTime"], "ts");

    // The dtcs crate tells the two apart: bounded → unbounded is a breaking change.
    let d = diff_files(
        &p.join("b/transformations/click_counts.valid.dtcs.yaml"),
        &p.join("s/transformations/click_counts.valid.dtcs.yaml"),
    )
    .unwrap()
    .expect("contracts");
    assert_eq!(d.standard, ContractStandard::Dtcs);
    assert!(d.breaking, "{}", d.render_text());
    assert!(
        d.breaking_changes()
            .any(|c| c.path == "inputs.clicks.streaming"),
        "{}",
        d.render_text()
    );
    assert_eq!(d.exit_code(), exit::BREAKING_CHANGES);
}

#[test]
fn streaming_dpcs_contract_declares_streaming_scheduling_and_per_port_semantics() {
    let p = click_project();
    generated(&p, "streaming", Standard::Dpcs, "s");
    let (c, v) = dpcs_doc(&p, "s/pipelines/click_counts.dpcs.yaml");
    assert_eq!(c.scheduling.len(), 1);
    assert_eq!(c.scheduling[0].mode, dpcs::SchedulingMode::Streaming);
    let sched = &v["scheduling"][0];
    assert_eq!(sched["etlantic:trigger"], "processing_time 5 seconds");
    assert_eq!(sched["etlantic:watermarkPolicy"], "min");

    let input = &v["interface"]["inputs"][0];
    assert_eq!(input["id"], "clicks");
    assert_eq!(input["etlantic:streaming"], json!({"mode": "unbounded"}));
    assert_eq!(input["etlantic:eventTime"], "ts");
    assert_eq!(input["etlantic:eventTimeZone"], "UTC");
    assert_eq!(
        input["etlantic:watermark"],
        json!({"field": "ts", "delay": "10 seconds"})
    );
    assert_eq!(
        input["etlantic:lateEvents"],
        json!({"policy": "quarantine"})
    );
    assert_eq!(input["etlantic:sourceGuarantee"], "replayable");

    let output = &v["interface"]["outputs"][0];
    assert_eq!(output["id"], "write_counts");
    assert_eq!(output["etlantic:streaming"], json!({"mode": "unbounded"}));
    assert_eq!(output["etlantic:outputMode"], "append");
    // A replayable file source into the file sink: exactly once, as `explain` says.
    assert_eq!(
        output["etlantic:deliveryGuarantee"], "exactly_once",
        "{output:#}"
    );
    assert_eq!(
        output["etlantic:deliveryGuarantees"][0],
        json!({"source": "clicks", "guarantee": "exactly_once"})
    );
    // The crate keeps the vendor keys as the port's extensions.
    let port = c.interface.output("write_counts").unwrap();
    assert_eq!(
        port.extensions["etlantic:deliveryGuarantee"].as_str(),
        Some("exactly_once")
    );

    // Batch: bounded ports, run on demand, write mode instead of output mode.
    generated(&p, "batch", Standard::Dpcs, "b");
    let (c, v) = dpcs_doc(&p, "b/pipelines/click_counts.dpcs.yaml");
    assert_eq!(c.scheduling[0].mode, dpcs::SchedulingMode::OnDemand);
    assert_eq!(
        v["interface"]["inputs"][0]["etlantic:streaming"],
        json!({"mode": "bounded"})
    );
    let output = &v["interface"]["outputs"][0];
    assert_eq!(output["etlantic:streaming"], json!({"mode": "bounded"}));
    assert!(output.get("etlantic:outputMode").is_none(), "{output:#}");
    assert_eq!(output["etlantic:writeMode"], "overwrite");
    assert!(v["interface"]["inputs"][0]
        .get("etlantic:watermark")
        .is_none());

    // For the dpcs crate, running the pipeline as a stream instead of on demand is a
    // breaking change of the pipeline contract.
    let r = p.run(&[
        "diff",
        "b/pipelines/click_counts.dpcs.yaml",
        "s/pipelines/click_counts.dpcs.yaml",
        "--format",
        "json",
    ]);
    r.expect_code(exit::BREAKING_CHANGES);
    let j = r.stdout_json();
    assert_eq!(j["standard"], "dpcs");
    assert_eq!(j["compatibility"], "incompatible");
    assert!(
        j["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["breaking"] == true && c["path"] == "scheduling"),
        "{j:#}"
    );
    // The same document twice: nothing changed.
    let r = p.run(&[
        "diff",
        "s/pipelines/click_counts.dpcs.yaml",
        "s/pipelines/click_counts.dpcs.yaml",
    ]);
    r.ok();
    assert!(r.stdout.contains("fullyCompatible"), "{}", r.stdout);
}

const ORDERS_V1: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
name: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "order_id"
        logicalType: "integer"
        required: true
      - name: "customer"
        logicalType: "string"
        required: true
      - name: "amount"
        logicalType: "number"
"#;

/// `ORDERS_V1` with `extra` appended to its properties and `version` set.
fn orders_v2(version: &str, extra: &str) -> String {
    format!(
        "{}{extra}",
        ORDERS_V1.replace("\"1.0.0\"", &format!("\"{version}\""))
    )
}

#[test]
fn odcs_diff_tells_breaking_from_compatible_changes() {
    let p = Project::empty();
    p.write("v1.yaml", ORDERS_V1);
    // An optional field added: compatible, exit 0.
    p.write(
        "optional.yaml",
        &orders_v2(
            "1.1.0",
            "      - name: \"note\"\n        logicalType: \"string\"\n",
        ),
    );
    // A required field added: breaking.
    p.write(
        "required.yaml",
        &orders_v2(
            "2.0.0",
            "      - name: \"channel\"\n        logicalType: \"string\"\n        required: true\n",
        ),
    );
    // A field removed: breaking.
    p.write(
        "removed.yaml",
        &ORDERS_V1.replace(
            "      - name: \"amount\"\n        logicalType: \"number\"\n",
            "",
        ),
    );

    let r = p.run(&["diff", "v1.yaml", "optional.yaml"]);
    r.ok();
    assert!(
        r.stdout.contains("compatible")
            && r.stdout.contains("property 'note' was added")
            && !r.stdout.contains("BREAKING"),
        "{}",
        r.stdout
    );
    let r = p.run(&["diff", "v1.yaml", "optional.yaml", "--format", "json"]);
    r.ok();
    let j = r.stdout_json();
    assert_eq!(j["standard"], "odcs");
    assert_eq!(j["breaking"], false);
    assert_eq!(j["old"]["version"], "1.0.0");
    assert_eq!(j["new"]["version"], "1.1.0");
    let note = j["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "schema[orders].properties[note]")
        .unwrap_or_else(|| panic!("{j:#}"))
        .clone();
    assert_eq!(note["breaking"], false);
    assert_eq!(note["kind"], "additive");

    for (file, path, message) in [
        (
            "required.yaml",
            "schema[orders].properties[channel]",
            "property 'channel' was added",
        ),
        (
            "removed.yaml",
            "schema[orders].properties[amount]",
            "property 'amount' was removed",
        ),
    ] {
        let r = p.run(&["diff", "v1.yaml", file]);
        r.expect_code(exit::BREAKING_CHANGES);
        assert!(
            r.stdout.contains(&format!("BREAKING    {path}: {message}")),
            "{}",
            r.stdout
        );
        let r = p.run(&["diff", "v1.yaml", file, "--format", "json"]);
        r.expect_code(exit::BREAKING_CHANGES);
        let j = r.stdout_json();
        assert_eq!(j["breaking"], true);
        assert_eq!(j["compatibility"], "incompatible");
        let c = j["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["path"] == path)
            .unwrap_or_else(|| panic!("{j:#}"))
            .clone();
        assert_eq!(c["breaking"], true, "{c:#}");
        assert_eq!(c["kind"], "breaking");
    }

    // JSON documents work as well as YAML.
    let v1: serde_yaml::Value = serde_yaml::from_str(ORDERS_V1).unwrap();
    p.write("v1.json", &serde_json::to_string_pretty(&v1).unwrap());
    let r = p.run(&["diff", "v1.json", "removed.yaml"]);
    r.expect_code(exit::BREAKING_CHANGES);
    // And through the library.
    let d = diff_files(&p.join("v1.yaml"), &p.join("optional.yaml"))
        .unwrap()
        .unwrap();
    assert_eq!(d.exit_code(), exit::OK);
    assert!(!d.breaking);
}

/// Generates the `init` example's DTCS contract and returns it as JSON.
fn revenue_dtcs(p: &Project) -> Value {
    p.run(&["generate", "dtcs", "-o", "gen"]).ok();
    serde_yaml::from_str(&p.read("gen/transformations/customer_revenue.revenue.dtcs.yaml")).unwrap()
}

fn write_yaml(p: &Project, rel: &str, v: &Value) {
    p.write(rel, &serde_yaml::to_string(v).unwrap());
}

#[test]
fn dtcs_diff_tells_breaking_from_compatible_changes() {
    let p = Project::init();
    let v1 = revenue_dtcs(&p);
    write_yaml(&p, "v1.dtcs.yaml", &v1);

    // A nullable output field added: compatible.
    let mut added = v1.clone();
    added["version"] = json!("0.2.0");
    added["outputs"][0]["schema"]["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "note", "type": "string", "nullable": true}));
    write_yaml(&p, "added.dtcs.yaml", &added);
    let r = p.run(&[
        "diff",
        "v1.dtcs.yaml",
        "added.dtcs.yaml",
        "--format",
        "json",
    ]);
    r.ok();
    let j = r.stdout_json();
    assert_eq!(j["standard"], "dtcs");
    assert_eq!(j["breaking"], false, "{j:#}");
    assert_eq!(j["compatibility"], "backwardCompatible", "{j:#}");
    assert!(
        j["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["path"] == "outputs.result.schema.fields.note" && c["breaking"] == false),
        "{j:#}"
    );

    // The input made unbounded, and an output field removed: breaking.
    let mut streamed = v1.clone();
    streamed["version"] = json!("1.0.0");
    streamed["inputs"][0]["streaming"] = json!({"mode": "unbounded"});
    let fields = streamed["outputs"][0]["schema"]["fields"]
        .as_array_mut()
        .unwrap();
    let customer = fields.iter().position(|f| f["name"] == "customer").unwrap();
    assert_eq!(fields[customer]["nullable"], false);
    fields.remove(customer);
    p.write(
        "streamed.dtcs.json",
        &serde_json::to_string_pretty(&streamed).unwrap(),
    );
    let r = p.run(&["diff", "v1.dtcs.yaml", "streamed.dtcs.json"]);
    r.expect_code(exit::BREAKING_CHANGES);
    assert!(
        r.stdout.contains("BREAKING    inputs.orders.streaming:"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("BREAKING    outputs.result.schema.fields.customer:"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("incompatible"), "{}", r.stdout);
}

#[test]
fn diff_refuses_documents_of_different_kinds_and_invalid_contracts() {
    let p = Project::init();
    p.run(&["generate", "dtcs", "-o", "gen"]).ok();
    p.run(&["generate", "dpcs", "-o", "gen"]).ok();
    let dtcs = "gen/transformations/customer_revenue.revenue.dtcs.yaml";
    let dpcs = "gen/pipelines/customer_revenue.dpcs.yaml";
    let odcs = "contracts/orders.odcs.yaml";

    for (old, new) in [(odcs, dtcs), (dtcs, dpcs), (odcs, "pipeline.yaml")] {
        let r = p.run(&["diff", old, new, "--format", "json"]);
        r.expect_code(exit::USAGE);
        let d = find_diag(&r.stderr_json(), "ETL009");
        assert!(d["help"].as_str().unwrap().contains("same kind"), "{d:#}");
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }

    // A DPCS document that does not validate: ETL010 with the crate's message.
    p.write("broken.dpcs.yaml", "dpcsVersion: \"1.0.0\"\nid: broken\n");
    let r = p.run(&["diff", dpcs, "broken.dpcs.yaml"]);
    r.expect_code(exit::INVALID_PIPELINE);
    assert!(r.stderr.contains("ETL010"), "{}", r.stderr);
    assert!(r.stderr.contains("broken.dpcs.yaml"), "{}", r.stderr);
    // Malformed YAML of a DTCS contract: ETL010, not a pipeline error.
    p.write("broken.dtcs.yaml", "dtcsVersion: [1.0.0\nid: {");
    let r = p.run(&["diff", dtcs, "broken.dtcs.yaml", "--format", "json"]);
    r.expect_code(exit::INVALID_PIPELINE);
    find_diag(&r.stderr_json(), "ETL010");
    // An ODCS contract that does not validate: ETL005.
    p.write(
        "broken.odcs.yaml",
        "apiVersion: v3.1.0\nkind: DataContract\nid: x\n",
    );
    let r = p.run(&["diff", odcs, "broken.odcs.yaml", "--format", "json"]);
    r.expect_code(exit::INVALID_PIPELINE);
    find_diag(&r.stderr_json(), "ETL005");

    // Plans and pipelines still diff as before.
    let r = p.run(&["diff", "pipeline.yaml", "pipeline.yaml"]);
    r.ok();
    assert!(Path::new(&p.join("pipeline.yaml")).exists());
}

/// A window's allowed lateness travels with the pipeline: in the transform plan's window,
/// as `etlantic:allowedLateness` on the DTCS output of its transformation, the DPCS
/// output of the sink reading it and the ODCS contract of that output, and in `explain`.
/// A batch run has no lateness to declare.
#[test]
fn allowed_lateness_is_carried_in_every_standard_and_shown_by_explain() {
    let p = click_project();
    p.write(
        "pipeline.yaml",
        &PIPELINE.replace(
            "size: 1 minute}",
            "size: 1 minute, allowed_lateness: 30 seconds}",
        ),
    );
    for standard in [Standard::Dtcs, Standard::Dpcs, Standard::Odcs] {
        generated(&p, "streaming", standard, "s");
        generated(&p, "batch", standard, "b");
    }
    let (_, v) = dtcs_doc(&p, "s/transformations/click_counts.per_minute.dtcs.yaml");
    assert_eq!(v["outputs"][0]["etlantic:allowedLateness"], "30 seconds");
    // The transformation before the window has none.
    let (_, v) = dtcs_doc(&p, "s/transformations/click_counts.valid.dtcs.yaml");
    assert!(v["outputs"][0].get("etlantic:allowedLateness").is_none());
    // The plan itself: the window's parameter, read back unchanged.
    let text = p.read("s/transformations/click_counts.per_minute.transform-plan.json");
    let plan = etlantic_core::ir::TransformPlan::from_json(text.as_bytes(), "plan").unwrap();
    let lateness: Vec<String> = plan
        .decoded()
        .steps
        .iter()
        .filter_map(|s| match &s.op {
            etlantic_core::ir::Action::WindowAggregate { window, .. } => {
                Some(window.allowed_lateness.to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(lateness, ["30 seconds"]);

    let (_, v) = dpcs_doc(&p, "s/pipelines/click_counts.dpcs.yaml");
    assert_eq!(
        v["interface"]["outputs"][0]["etlantic:allowedLateness"],
        "30 seconds"
    );
    let odcs: Value = serde_yaml::from_str(&p.read("s/data/per_minute_output.odcs.yaml")).unwrap();
    assert_eq!(
        odcs["customProperties"][0]["property"],
        "etlantic:allowedLateness"
    );
    assert_eq!(odcs["customProperties"][0]["value"], "30 seconds");

    // Batch: the documents declare no lateness.
    let (_, v) = dtcs_doc(&p, "b/transformations/click_counts.per_minute.dtcs.yaml");
    assert!(v["outputs"][0].get("etlantic:allowedLateness").is_none());
    let (_, v) = dpcs_doc(&p, "b/pipelines/click_counts.dpcs.yaml");
    assert!(v["interface"]["outputs"][0]
        .get("etlantic:allowedLateness")
        .is_none());
    let odcs: Value = serde_yaml::from_str(&p.read("b/data/per_minute_output.odcs.yaml")).unwrap();
    assert!(odcs.get("customProperties").is_none(), "{odcs:#}");

    // `explain` names it with the window.
    let r = p.run(&["explain", "--profile", "profiles/streaming.yaml"]);
    r.ok();
    assert!(
        r.stdout
            .contains("tumbling 1 minute window on ts, allowed lateness 30 seconds"),
        "{}",
        r.stdout
    );
}
