//! `etlantic plan --emit-pipeline FILE`: a pipeline YAML written back from a plan.
//!
//! The pipeline is self-contained, like the plan it comes from: every asset carries its
//! ODCS contract inline (`contract:` takes an inline mapping) and every transformation is
//! a `plan:` holding its DTCS transform plan inline (inline `steps:` were compiled to that
//! plan), with its parameters; SQL and registered implementations are kept as they are.
//! Ids, sources, sinks and their settings are kept. Planning the emitted file with the same
//! profile gives the same plan, and so the same fingerprint.
//!
//! What a plan does not hold cannot come back: comments, descriptions of assets, port and
//! output contracts (they were checked when the plan was made; the emitted transform plans
//! carry the schemas they were compiled against) and assets nothing uses.

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::model::{
    AssetDef, ContractRef, Pipeline, PlanRef, PortRef, SinkDef, SourceDef, SqlStep, TransformDef,
    API_VERSION,
};
use etlantic_plan::plan::{PipelinePlan, PlanLogic};
use indexmap::IndexMap;

/// The pipeline a plan was made from, as far as the plan determines it.
pub fn pipeline_from_plan(plan: &PipelinePlan) -> Result<Pipeline> {
    let mut assets = IndexMap::new();
    for (name, a) in &plan.assets {
        let first = a.contract.document["schema"][0]["name"].as_str();
        if first != Some(a.contract.object.as_str()) {
            return Err(Error::new(
                &codes::PLAN_INVALID,
                format!(
                    "asset `{name}` uses schema object `{}` of its contract, which is not the first one; an inline contract always describes its first object",
                    a.contract.object
                ),
            ));
        }
        assets.insert(
            name.clone(),
            AssetDef {
                contract: ContractRef::Inline(a.contract.document.clone()),
                description: None,
            },
        );
    }
    let sources = plan
        .sources
        .iter()
        .map(|s| SourceDef {
            id: s.id.clone(),
            asset: s.asset.clone(),
            event_time: s.event_time.clone(),
            watermark: s.watermark,
            late_events: s.late_events.clone(),
            read_limit: s.read_limit.clone(),
            static_refresh: s.static_refresh,
        })
        .collect();
    let transforms = plan
        .transforms
        .iter()
        .map(|t| {
            let mut def = TransformDef {
                id: t.id.clone(),
                inputs: t
                    .inputs
                    .iter()
                    .map(|(port, from)| (port.clone(), PortRef::Node(from.clone())))
                    .collect(),
                steps: None,
                plan: None,
                sql: None,
                implementation: None,
                parameters: IndexMap::new(),
                output: None,
            };
            match &t.logic {
                PlanLogic::Portable {
                    plan, parameters, ..
                } => {
                    def.plan = Some(PlanRef::Inline(plan.clone()));
                    def.parameters = parameters.clone();
                }
                PlanLogic::Sql { engine, query } => {
                    def.sql = Some(SqlStep {
                        engine: engine.clone(),
                        query: query.clone(),
                    })
                }
                PlanLogic::Impl { name } => def.implementation = Some(name.clone()),
            }
            def
        })
        .collect();
    let sinks = plan
        .sinks
        .iter()
        .map(|s| SinkDef {
            id: s.id.clone(),
            input: s.input.clone(),
            asset: s.asset.clone(),
            output_mode: Some(s.output_mode),
            write_mode: Some(s.write_mode),
            keys: s.keys.clone(),
        })
        .collect();
    Ok(Pipeline {
        api_version: API_VERSION.into(),
        kind: "Pipeline".into(),
        name: plan.pipeline.clone(),
        description: plan.description.clone(),
        assets,
        sources,
        transforms,
        sinks,
        extensions: IndexMap::new(),
    })
}

/// The YAML text of [`pipeline_from_plan`], with a header comment naming the plan.
pub fn pipeline_yaml(plan: &PipelinePlan) -> Result<String> {
    let p = pipeline_from_plan(plan)?;
    Ok(format!(
        "# Written by `etlantic plan --emit-pipeline` from plan {}.\n# Contracts and transform plans are inline; bind the assets with a profile as before.\n{}",
        plan.fingerprint,
        p.to_yaml()
    ))
}
