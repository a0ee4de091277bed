//! `etlantic generate`: contract documents for a planned pipeline, in the layout
//! ETLantic-py's `Pipeline.write_contracts()` uses, so the bundle loads there:
//!
//! ```text
//! <out>/data/<asset>.odcs.yaml                       ODCS v3.1.0 (checked with `odcs`)
//! <out>/data/<transform>_output.odcs.yaml            ODCS of each transformation's output
//! <out>/transformations/<transform>.dtcs.yaml        DTCS transformation contract (checked with `dtcs`)
//! <out>/transformations/<transform>.transform-plan.json   the dtcs.transform-plan/2 itself
//! <out>/pipelines/<pipeline>.dpcs.yaml               DPCS pipeline contract (checked with `dpcs`)
//! ```
//!
//! Every DTCS and DPCS document is parsed back and validated with the `dtcs` / `dpcs`
//! crate before it is written; an invalid one is an error (`ETL005`), never a file.
//!
//! ## Streaming metadata
//!
//! The documents say whether data is bounded (batch) or unbounded (streaming), with the
//! standards' own fields where they have one and `etlantic:` vendor keys (the namespaced
//! extension form both standards accept) for the rest:
//!
//! - DTCS inputs and outputs carry the standard `streaming: {mode: bounded|unbounded}`.
//!   A source is unbounded in a streaming plan unless it is static (`static_refresh`); a
//!   transformation's input or output is unbounded when any source upstream of it is.
//!   An input read from a source also carries `etlantic:eventTime` (column),
//!   `etlantic:eventTimeZone`, and, when unbounded, `etlantic:watermark: {field, delay}`
//!   and `etlantic:lateEvents: {policy[, sink]}`; an input read from a transformation
//!   carries those of its upstream source when it has exactly one unbounded source with
//!   an event time and that column is still in the input's schema.
//! - DPCS: a `scheduling` intent with mode `streaming` (with `etlantic:trigger`,
//!   `etlantic:watermarkPolicy`, `etlantic:noDataBatches` and, when the profile sets
//!   them, `etlantic:requireGuarantee` and `etlantic:stateCheckpointInterval`) or `onDemand` for a batch plan; interface inputs
//!   carry `etlantic:streaming: {mode}`, the source keys above, `etlantic:sourceGuarantee`
//!   and `etlantic:staticRefresh`; interface outputs carry `etlantic:streaming`,
//!   `etlantic:outputMode` (streaming) or `etlantic:writeMode` (batch),
//!   `etlantic:commitProtocol`, `etlantic:allowedLateness` (see below), and the end-to-end `etlantic:deliveryGuarantee` (the
//!   weakest of its source/sink pairs, `exactly_once`, `at_least_once` or
//!   `at_most_once`) with `etlantic:deliveryGuarantees` per source.
//! - Allowed lateness: a window step's own `allowedLateness` is in the transform plan; the
//!   DTCS output of a transformation whose windows allow lateness on a stream, the DPCS
//!   output of a sink reading it, and the ODCS contract of that output (a root
//!   `customProperties` entry) carry `etlantic:allowedLateness`, the largest of them: how
//!   long after the watermark passes a window's end its row may still change.

use etlantic_core::contract::{contract_from_schema, sanitize_id};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::ir::types::dtcs_type;
use etlantic_core::ir::Action;
use etlantic_core::streaming::{Duration, ExecutionMode};
use etlantic_plan::plan::{PipelinePlan, PlanLogic, PlanSource};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// Which documents to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standard {
    /// ODCS data contracts.
    Odcs,
    /// DTCS transformation contracts and transform plans.
    Dtcs,
    /// The DPCS pipeline contract.
    Dpcs,
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", d.display())))?;
    }
    std::fs::write(path, text)
        .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", path.display())))
}

fn invalid(what: &str, msgs: Vec<String>) -> Error {
    Error::from(Diagnostic::new(
        &codes::CONTRACT_INVALID,
        format!("generated {what} is invalid: {}", msgs.join("; ")),
    ))
}

fn schema_fields(plan: &PipelinePlan, node: &str) -> Vec<Value> {
    let spec = plan
        .transform(node)
        .map(|t| t.schema.clone())
        .or_else(|| {
            plan.source(node)
                .map(|s| plan.assets[&s.asset].schema.clone())
        })
        .unwrap_or_default();
    let arrow_schema = etlantic_plan::plan::arrow_schema(&spec);
    arrow_schema
        .fields()
        .iter()
        .map(|f| json!({"name": f.name(), "type": dtcs_type(f.data_type()), "nullable": f.is_nullable()}))
        .collect()
}

fn streaming(plan: &PipelinePlan) -> bool {
    plan.profile.mode == ExecutionMode::Streaming
}

/// Whether `node` (a source or a transformation) produces unbounded data: a source of a
/// streaming plan that is not static, or a transformation with such a source upstream.
fn unbounded(plan: &PipelinePlan, node: &str) -> bool {
    if let Some(s) = plan.source(node) {
        return unbounded_source(plan, s);
    }
    plan.transform(node)
        .is_some_and(|t| t.inputs.values().any(|from| unbounded(plan, from)))
}

/// A source is unbounded in a streaming plan unless it is static (`static_refresh`).
fn unbounded_source(plan: &PipelinePlan, s: &PlanSource) -> bool {
    streaming(plan) && s.static_refresh.is_none()
}

/// The largest allowed lateness of the windows of transformation `node` on a stream: how
/// long after the watermark passes a window's end its output row may still change
/// (`None` when none of its windows allows lateness, or it reads no stream).
fn allowed_lateness(plan: &PipelinePlan, node: &str) -> Option<Duration> {
    let t = plan.transform(node)?;
    let PlanLogic::Portable { plan: doc, .. } = &t.logic else {
        return None;
    };
    if !unbounded(plan, node) {
        return None;
    }
    let decoded = etlantic_core::ir::TransformPlan::from_value(doc, &t.id).ok()?;
    decoded
        .decoded()
        .steps
        .iter()
        .filter_map(|s| match &s.op {
            Action::WindowAggregate { window, .. } => Some(window.allowed_lateness),
            _ => None,
        })
        .filter(|d| *d > Duration::ZERO)
        .max()
}

/// An ODCS contract with the custom property that carries a transformation output's
/// allowed lateness, checked with `odcs` again.
fn with_lateness_property(doc: odcs::DataContract, d: Duration) -> Result<odcs::DataContract> {
    let mut v = serde_json::to_value(&doc).expect("contracts serialise");
    let property = json!({
        "property": "etlantic:allowedLateness",
        "value": d.to_string(),
        "description": "Rows of this output may still change until the watermark passes their window's end plus this.",
    });
    match v.get_mut("customProperties").and_then(Value::as_array_mut) {
        Some(list) => list.push(property),
        None => v["customProperties"] = json!([property]),
    }
    let doc: odcs::DataContract =
        serde_json::from_value(v).map_err(|e| invalid("ODCS contract", vec![e.to_string()]))?;
    let report = odcs::validate(&doc);
    if !report.is_valid() {
        return Err(invalid(
            "ODCS contract",
            report.errors().iter().map(|d| d.message.clone()).collect(),
        ));
    }
    Ok(doc)
}

/// DTCS's `streaming` declaration (also used as the `etlantic:streaming` DPCS key).
fn streaming_mode(unbounded: bool) -> Value {
    json!({"mode": if unbounded { "unbounded" } else { "bounded" }})
}

/// The sources upstream of `node` (itself when it is a source), in first-seen order.
fn upstream_sources<'p>(plan: &'p PipelinePlan, node: &str, out: &mut Vec<&'p PlanSource>) {
    if let Some(s) = plan.source(node) {
        if !out.iter().any(|o| o.id == s.id) {
            out.push(s);
        }
    } else if let Some(t) = plan.transform(node) {
        for from in t.inputs.values() {
            upstream_sources(plan, from, out);
        }
    }
}

/// The event-time keys of a source: `etlantic:eventTime` and `etlantic:eventTimeZone`
/// always (when declared); `etlantic:watermark` and `etlantic:lateEvents` when the source
/// is unbounded (a bounded read has no watermark and nothing is late).
fn event_time_keys(s: &PlanSource, unbounded: bool) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(et) = &s.event_time {
        m.insert("etlantic:eventTime".into(), json!(et.column));
        m.insert("etlantic:eventTimeZone".into(), json!(et.timezone));
    }
    if unbounded {
        if let Some(delay) = s.watermark {
            let mut w = Map::new();
            if let Some(et) = &s.event_time {
                w.insert("field".into(), json!(et.column));
            }
            w.insert("delay".into(), json!(delay.to_string()));
            m.insert("etlantic:watermark".into(), Value::Object(w));
        }
        m.insert(
            "etlantic:lateEvents".into(),
            serde_json::to_value(&s.late_events).expect("late policies serialise"),
        );
    }
    m
}

/// A DTCS input read from `from`, with its streaming declaration and event-time keys.
fn dtcs_input(plan: &PipelinePlan, port: &str, from: &str) -> Value {
    let fields = schema_fields(plan, from);
    let unbounded = unbounded(plan, from);
    let mut input = json!({
        "id": port,
        "schema": {"fields": fields},
        "streaming": streaming_mode(unbounded),
    });
    let keys = if let Some(s) = plan.source(from) {
        event_time_keys(s, unbounded)
    } else {
        // Through a transformation: the event time of its one unbounded, event-timed
        // source, when that column survived to this input.
        let mut sources = Vec::new();
        upstream_sources(plan, from, &mut sources);
        let timed: Vec<&PlanSource> = sources
            .into_iter()
            .filter(|s| s.event_time.is_some() && unbounded_source(plan, s))
            .collect();
        match timed.as_slice() {
            [s] if fields
                .iter()
                .any(|f| f["name"] == json!(s.event_time.as_ref().expect("filtered").column)) =>
            {
                event_time_keys(s, true)
            }
            _ => Map::new(),
        }
    };
    input.as_object_mut().expect("an object").extend(keys);
    input
}

/// The DPCS interface input of a source.
fn dpcs_input(plan: &PipelinePlan, s: &PlanSource) -> Value {
    let unbounded = unbounded_source(plan, s);
    let mut port = json!({
        "id": s.id, "name": s.id, "contractRef": format!("odcs:{}", s.asset),
        "purpose": format!("Pipeline source '{}'", s.id), "etlantic:binding": s.asset,
        "etlantic:streaming": streaming_mode(unbounded),
        "etlantic:sourceGuarantee": s.guarantee,
    });
    let m = port.as_object_mut().expect("an object");
    m.extend(event_time_keys(s, unbounded));
    if let Some(r) = s.static_refresh {
        m.insert(
            "etlantic:staticRefresh".into(),
            serde_json::to_value(r).expect("refresh policies serialise"),
        );
    }
    port
}

/// The DPCS interface output of a sink: boundedness, output or write mode, commit
/// protocol and the end-to-end delivery guarantee.
fn dpcs_output(plan: &PipelinePlan, s: &etlantic_plan::plan::PlanSink) -> Value {
    let unbounded = unbounded(plan, &s.input);
    let mut port = json!({
        "id": s.id, "name": s.id, "contractRef": format!("odcs:{}", s.asset),
        "purpose": format!("Pipeline sink '{}'", s.id), "etlantic:binding": s.asset,
        "etlantic:streaming": streaming_mode(unbounded),
        "etlantic:commitProtocol": s.guarantee.protocol,
    });
    let m = port.as_object_mut().expect("an object");
    if streaming(plan) {
        m.insert("etlantic:outputMode".into(), json!(s.output_mode.as_str()));
        if let Some(d) = allowed_lateness(plan, &s.input) {
            m.insert("etlantic:allowedLateness".into(), json!(d.to_string()));
        }
    } else {
        m.insert("etlantic:writeMode".into(), json!(s.write_mode));
    }
    if !s.keys.is_empty() {
        m.insert("etlantic:keys".into(), json!(s.keys));
    }
    let pairs: Vec<_> = plan.guarantees.iter().filter(|g| g.sink == s.id).collect();
    if let Some(weakest) = pairs.iter().map(|g| g.guarantee).min() {
        m.insert("etlantic:deliveryGuarantee".into(), json!(weakest.as_str()));
        m.insert(
            "etlantic:deliveryGuarantees".into(),
            Value::Array(
                pairs
                    .iter()
                    .map(|g| {
                        let mut v = json!({"source": g.source, "guarantee": g.guarantee.as_str()});
                        if let Some(c) = &g.condition {
                            v["condition"] = json!(c);
                        }
                        v
                    })
                    .collect(),
            ),
        );
    }
    port
}

/// The DPCS scheduling intent: `streaming` with the trigger and watermark settings, or
/// `onDemand` for a batch plan (it runs when `etlantic run` is invoked).
fn dpcs_scheduling(plan: &PipelinePlan) -> Value {
    if !streaming(plan) {
        return json!([{"id": "etlantic-run", "mode": "onDemand"}]);
    }
    let p = &plan.profile;
    let mut intent = json!({
        "id": "etlantic-run",
        "mode": "streaming",
        "etlantic:trigger": p.trigger.unwrap_or_default().to_string(),
        "etlantic:watermarkPolicy": p.watermark_policy,
        "etlantic:noDataBatches": p.no_data_batches,
    });
    if let Some(g) = p.require_guarantee {
        intent["etlantic:requireGuarantee"] = json!(g.as_str());
    }
    if let Some(d) = p.state_checkpoint_interval {
        intent["etlantic:stateCheckpointInterval"] = json!(d.to_string());
    }
    json!([intent])
}

/// Writes the documents of `standard` under `out`; returns the files written.
pub fn generate(plan: &PipelinePlan, standard: Standard, out: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    match standard {
        Standard::Odcs => {
            for asset in plan.assets.keys() {
                let c = plan.asset_contract(asset)?;
                let path = out.join("data").join(format!("{asset}.odcs.yaml"));
                write(&path, &c.to_yaml())?;
                written.push(path);
            }
            for t in &plan.transforms {
                let schema = etlantic_plan::plan::arrow_schema(&t.schema);
                let mut doc = contract_from_schema(&format!("{}_output", t.id), &t.id, &schema)?;
                if let Some(d) = allowed_lateness(plan, &t.id) {
                    doc = with_lateness_property(doc, d)?;
                }
                let path = out.join("data").join(format!("{}_output.odcs.yaml", t.id));
                write(
                    &path,
                    &serde_yaml::to_string(&doc).expect("contracts serialise"),
                )?;
                written.push(path);
            }
        }
        Standard::Dtcs => {
            for t in &plan.transforms {
                let PlanLogic::Portable {
                    plan: tp, output, ..
                } = &t.logic
                else {
                    continue;
                };
                let id = format!("{}.{}", sanitize_id(&plan.pipeline), t.id);
                let inputs: Vec<Value> = t
                    .inputs
                    .iter()
                    .map(|(port, from)| dtcs_input(plan, port, from))
                    .collect();
                let mut out_port = json!({
                    "id": output,
                    "schema": {"fields": schema_fields(plan, &t.id)},
                    "streaming": streaming_mode(unbounded(plan, &t.id)),
                });
                if let Some(d) = allowed_lateness(plan, &t.id) {
                    out_port["etlantic:allowedLateness"] = json!(d.to_string());
                }
                let doc = json!({
                    "dtcsVersion": "1.0.0",
                    "id": id,
                    "name": t.id,
                    "version": "0.1.0",
                    "inputs": inputs,
                    "outputs": [out_port],
                    "lineage": {"mappings": [{"output": output, "inputs": t.inputs.keys().collect::<Vec<_>>()}]},
                });
                let yaml = serde_yaml::to_string(&doc).expect("JSON values serialise");
                let parsed = dtcs::parse(yaml.as_bytes(), dtcs::DocumentFormat::Yaml)
                    .into_contract()
                    .map_err(|r| {
                        invalid(
                            "DTCS contract",
                            r.errors().iter().map(|d| d.message.clone()).collect(),
                        )
                    })?;
                let report = dtcs::validate(&parsed);
                if !report.is_valid() {
                    return Err(invalid(
                        "DTCS contract",
                        report.errors().iter().map(|d| d.message.clone()).collect(),
                    ));
                }
                let path = out.join("transformations").join(format!("{id}.dtcs.yaml"));
                write(&path, &yaml)?;
                written.push(path);
                let path = out
                    .join("transformations")
                    .join(format!("{id}.transform-plan.json"));
                write(
                    &path,
                    &serde_json::to_string_pretty(tp).expect("plans serialise"),
                )?;
                written.push(path);
            }
        }
        Standard::Dpcs => {
            let pid = sanitize_id(&plan.pipeline);
            let mut refs = Vec::new();
            for asset in plan.assets.keys() {
                refs.push(json!({"id": format!("odcs:{asset}"), "type": "odcs", "location": format!("data/{asset}.odcs.yaml")}));
            }
            let mut steps = Vec::new();
            let mut flows = Vec::new();
            for t in &plan.transforms {
                let tid = format!("{pid}.{}", t.id);
                let contract_ref = match &t.logic {
                    PlanLogic::Portable { .. } => {
                        refs.push(json!({"id": format!("dtcs:{tid}"), "type": "dtcs", "location": format!("transformations/{tid}.dtcs.yaml")}));
                        Some(format!("dtcs:{tid}"))
                    }
                    _ => None,
                };
                let mut step = json!({
                    "id": t.id,
                    "type": if contract_ref.is_some() { "dtcs:transform" } else { "etlantic:engine-specific" },
                    "inputs": t.inputs.keys().map(|p| json!({"id": p})).collect::<Vec<_>>(),
                    "outputs": [{"id": "result"}],
                });
                if let Some(r) = contract_ref {
                    step["contractRef"] = json!(r);
                }
                steps.push(step);
                for (port, from) in &t.inputs {
                    let from_ep = if plan.source(from).is_some() {
                        format!("interface.inputs.{from}")
                    } else {
                        format!("steps.{from}.outputs.result")
                    };
                    flows.push(json!({"from": from_ep, "to": format!("steps.{}.inputs.{port}", t.id), "dataset": format!("{from}.result")}));
                }
            }
            for s in &plan.sinks {
                let from_ep = if plan.source(&s.input).is_some() {
                    format!("interface.inputs.{}", s.input)
                } else {
                    format!("steps.{}.outputs.result", s.input)
                };
                flows.push(json!({"from": from_ep, "to": format!("interface.outputs.{}", s.id), "dataset": format!("{}.result", s.input)}));
            }
            refs.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            let doc = json!({
                "dpcsVersion": "1.0.0",
                "id": pid,
                "name": plan.pipeline,
                "version": "0.1.0",
                "interface": {
                    "inputs": plan.sources.iter().map(|s| dpcs_input(plan, s)).collect::<Vec<_>>(),
                    "outputs": plan.sinks.iter().map(|s| dpcs_output(plan, s)).collect::<Vec<_>>(),
                },
                "contractReferences": refs,
                "steps": steps,
                "graph": {"edges": []},
                "dataFlow": flows,
                "scheduling": dpcs_scheduling(plan),
            });
            let yaml = serde_yaml::to_string(&doc).expect("JSON values serialise");
            let parsed = dpcs::parse_yaml(&yaml)
                .map_err(|e| invalid("DPCS contract", vec![e.to_string()]))?;
            let report = dpcs::validate(&parsed);
            if !report.is_valid() {
                return Err(invalid(
                    "DPCS contract",
                    report
                        .errors()
                        .map(|d| format!("{} {}", d.id, d.message))
                        .collect(),
                ));
            }
            let path = out.join("pipelines").join(format!("{pid}.dpcs.yaml"));
            write(&path, &yaml)?;
            written.push(path);
        }
    }
    Ok(written)
}
