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

use etlantic_core::contract::{contract_from_schema, sanitize_id};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::ir::types::dtcs_type;
use etlantic_plan::plan::{PipelinePlan, PlanLogic};
use serde_json::{json, Value};
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
                let doc = contract_from_schema(&format!("{}_output", t.id), &t.id, &schema)?;
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
                    .map(|(port, from)| json!({"id": port, "schema": {"fields": schema_fields(plan, from)}}))
                    .collect();
                let doc = json!({
                    "dtcsVersion": "1.0.0",
                    "id": id,
                    "name": t.id,
                    "version": "0.1.0",
                    "inputs": inputs,
                    "outputs": [{"id": output, "schema": {"fields": schema_fields(plan, &t.id)}}],
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
                    "inputs": plan.sources.iter().map(|s| json!({
                        "id": s.id, "name": s.id, "contractRef": format!("odcs:{}", s.asset),
                        "purpose": format!("Pipeline source '{}'", s.id), "etlantic:binding": s.asset,
                    })).collect::<Vec<_>>(),
                    "outputs": plan.sinks.iter().map(|s| json!({
                        "id": s.id, "name": s.id, "contractRef": format!("odcs:{}", s.asset),
                        "purpose": format!("Pipeline sink '{}'", s.id), "etlantic:binding": s.asset,
                    })).collect::<Vec<_>>(),
                },
                "contractReferences": refs,
                "steps": steps,
                "graph": {"edges": []},
                "dataFlow": flows,
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
