//! The semantic phase: contract quality rules, event-time columns, and the schema of
//! every port, transformation output and sink, which resolves each transformation's
//! logic and places it on a backend.

use super::{Planner, DEFAULT_BACKEND};
use crate::plan::PlanLogic;
use crate::schema::{check_compatible, Compatibility};
use arrow::datatypes::SchemaRef;
use etlantic_core::contract::Contract;
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::ir::{TransformPlan, TransformPlanBuilder};
use etlantic_core::model::{TransformDef, WriteMode};
use etlantic_core::plugin::{self, RegionKind, StepLogic, StepTask};
use etlantic_core::streaming::ExecutionMode;
use indexmap::IndexMap;
use std::sync::Arc;

impl Planner<'_> {
    /// The contracts' quality rules must read (`ETL005`), every `quality_policies` entry
    /// must name one with a policy it can have (`ETL222`), and rules ETLantic cannot
    /// evaluate are listed (`ETL223`).
    fn quality_rules(&mut self) {
        use etlantic_core::contract::rules::{check_configured_policy, RuleSet};
        let mut rules = Vec::new();
        let contracts: Vec<(String, Arc<Contract>)> = self
            .contracts
            .iter()
            .map(|(a, c)| (a.clone(), c.clone()))
            .collect();
        for (asset, c) in contracts {
            match RuleSet::of(&c) {
                Ok(set) => {
                    for u in &set.unevaluated {
                        self.push(
                            Diagnostic::new(
                                &codes::QUALITY_RULE_NOT_EVALUATED,
                                format!(
                                    "quality rule `{}` of `{asset}` is not evaluated: {}",
                                    u.id, u.reason
                                ),
                            )
                            .at(u.path.clone()),
                        );
                    }
                    rules.extend(set.rules);
                }
                Err(e) => {
                    for d in e.0 {
                        self.push(d);
                    }
                }
            }
        }
        let file = self.p.profile_file.clone().unwrap_or_default();
        for (id, policy) in self.p.profile.quality_policies.clone() {
            let rule = rules.iter().find(|r| r.id == id);
            if let Err(e) = check_configured_policy(rule, &id, policy) {
                for d in e.0 {
                    self.push(
                        Diagnostic::new(&codes::UNKNOWN_QUALITY_RULE, d.message)
                            .at(format!("quality_policies.{id}"))
                            .in_file(file.clone()),
                    );
                }
            }
        }
    }

    pub(super) fn semantic(&mut self) {
        self.quality_rules();
        let pl = self.p.pipeline.clone();
        for s in &pl.sources {
            let Some(c) = self.contracts.get(&s.asset) else {
                continue;
            };
            let schema = c.arrow_schema();
            if let Some(et) = &s.event_time {
                match schema.field_with_name(&et.column) {
                    Ok(f) if matches!(f.data_type(), arrow::datatypes::DataType::Timestamp(..)) => {
                        // One source of truth for the zone of naive timestamps: the
                        // contract column's `defaultTimezone`.
                        let zone = match f.data_type() {
                            arrow::datatypes::DataType::Timestamp(_, tz) => {
                                tz.as_deref().unwrap_or("UTC").to_string()
                            }
                            _ => unreachable!("matched a timestamp"),
                        };
                        let utc = |z: &str| matches!(z, "UTC" | "Etc/UTC" | "+00:00" | "Z");
                        if et.timezone != zone && !(utc(&et.timezone) && utc(&zone)) {
                            self.push(
                                Diagnostic::new(
                                    &codes::BAD_WATERMARK,
                                    format!(
                                        "event time of `{}` is declared in time zone `{}` but column `{}` of `{}` is in `{zone}`",
                                        s.id, et.timezone, et.column, s.asset
                                    ),
                                )
                                .at(format!("sources[{}].event_time.timezone", s.id))
                                .help(format!(
                                    "Set `logicalTypeOptions: {{defaultTimezone: {}}}` on `{}` in the contract (naive timestamps are read in that zone), or remove `timezone`.",
                                    et.timezone, et.column
                                )),
                            );
                        }
                    }
                    Ok(f) => self.push(
                        Diagnostic::new(
                            &codes::BAD_WATERMARK,
                            format!(
                                "event-time column `{}` of `{}` is {}, not a timestamp",
                                et.column,
                                s.id,
                                f.data_type()
                            ),
                        )
                        .at(format!("sources[{}].event_time", s.id)),
                    ),
                    Err(_) => self.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_COLUMN,
                            format!(
                                "event-time column `{}` is not in the contract of `{}`",
                                et.column, s.asset
                            ),
                        )
                        .at(format!("sources[{}].event_time", s.id)),
                    ),
                }
            } else if s.watermark.is_some() {
                self.push(
                    Diagnostic::new(
                        &codes::BAD_WATERMARK,
                        format!("source `{}` has a watermark but no event_time", s.id),
                    )
                    .at(format!("sources[{}].watermark", s.id))
                    .help(
                        "Declare `event_time: {column: <timestamp column>}` next to the watermark.",
                    ),
                );
            }
            self.schemas.insert(s.id.clone(), schema);
        }
        let order = self.order.clone();
        for id in &order {
            let t = pl.transform(id).expect("ordered transforms exist").clone();
            if let Err(e) = self.semantic_transform(&t) {
                self.extend(e, &format!("transforms[{id}]"));
            }
        }
        for s in &pl.sinks {
            let (Some(schema), Some(c)) = (
                self.schemas.get(&s.input).cloned(),
                self.contracts.get(&s.asset).cloned(),
            ) else {
                continue;
            };
            if let Compatibility::Incompatible(problems) =
                check_compatible(&schema, &c.arrow_schema())
            {
                self.push(
                    Diagnostic::new(
                        &codes::SINK_CONTRACT_MISMATCH,
                        format!(
                            "`{}` does not match the contract of asset `{}`: {}",
                            s.input,
                            s.asset,
                            problems.join("; ")
                        ),
                    )
                    .at(format!("sinks[{}]", s.id)),
                );
            }
            if s.write_mode == Some(WriteMode::Upsert) && s.keys.is_empty() {
                self.push(
                    Diagnostic::new(
                        &codes::SINK_MODE_UNSUPPORTED,
                        format!("sink `{}` upserts without `keys`", s.id),
                    )
                    .at(format!("sinks[{}].keys", s.id)),
                );
            }
            for k in &s.keys {
                if schema.field_with_name(k).is_err() {
                    self.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_COLUMN,
                            format!("key `{k}` of sink `{}` is not a column", s.id),
                        )
                        .at(format!("sinks[{}].keys", s.id)),
                    );
                }
            }
        }
    }

    fn semantic_transform(&mut self, t: &TransformDef) -> Result<()> {
        let mut inputs: IndexMap<String, SchemaRef> = IndexMap::new();
        for (port, r) in &t.inputs {
            let Some(schema) = self.schemas.get(r.from()).cloned() else {
                // The upstream failed; its error is already reported.
                return Ok(());
            };
            if let Some(c) = self.port_contracts.get(&(t.id.clone(), port.clone())) {
                if let Compatibility::Incompatible(problems) =
                    check_compatible(&schema, &c.arrow_schema())
                {
                    return Err(Diagnostic::new(
                        &codes::PORT_TYPE_MISMATCH,
                        format!(
                            "port `{port}` of `{}` requires contract `{}` but `{}` provides: {}",
                            t.id,
                            c.id(),
                            r.from(),
                            problems.join("; ")
                        ),
                    )
                    .at(format!("transforms[{}].inputs.{port}", t.id))
                    .into());
                }
                inputs.insert(port.clone(), c.arrow_schema());
            } else {
                inputs.insert(port.clone(), schema);
            }
        }
        let backend_name = self
            .p
            .profile
            .engines
            .get(&t.id)
            .cloned()
            .unwrap_or_else(|| DEFAULT_BACKEND.to_string());
        let (logic, plan_logic) = self.resolve_logic(t, &inputs)?;
        let backend_name = match &logic {
            // The implementation on the backend the profile names, else the one linked
            // (resolve_logic refused a name no backend implements).
            StepLogic::Impl { name } => {
                let on: Vec<&str> = plugin::transform_impls_named(name)
                    .map(|i| i.backend())
                    .collect();
                if on.contains(&backend_name.as_str()) {
                    backend_name
                } else {
                    on.first().map(|b| b.to_string()).unwrap_or(backend_name)
                }
            }
            StepLogic::Sql { .. } => match &plan_logic {
                PlanLogic::Sql { engine, .. } if !self.p.profile.engines.contains_key(&t.id) => {
                    engine.clone()
                }
                _ => backend_name,
            },
            _ => backend_name,
        };
        let backend = plugin::backend(&backend_name).ok_or_else(|| {
            let linked: Vec<&str> = plugin::backends().map(|b| b.name()).collect();
            Error::from(
                Diagnostic::new(
                    &codes::NO_BACKEND,
                    format!("backend `{backend_name}` for `{}` is not linked", t.id),
                )
                .help(format!("Linked backends: {linked:?}.")),
            )
        })?;
        let kind = match self.p.profile.mode {
            ExecutionMode::Batch => RegionKind::Batch,
            ExecutionMode::Streaming => RegionKind::Streaming,
        };
        crate::capability::check_step(backend, &t.id, &logic, kind)?;
        let caps = backend.capabilities();
        let sql_region = caps.region_kinds.contains(&RegionKind::Sql);
        if sql_region && kind == RegionKind::Streaming {
            // An SQL region in a streaming query runs once per micro-batch, on that
            // micro-batch's rows: it keeps no state between them.
            if let StepLogic::Portable { plan, .. } = &logic {
                if let Some(s) = plan.decoded().steps.iter().find(|s| s.op.is_stateful()) {
                    return Err(Diagnostic::new(
                        &codes::UNSUPPORTED_STREAMING_OP,
                        format!(
                            "`{}` runs on `{}`, an SQL region, which a streaming query runs per micro-batch without state; `{}` ({}) needs state across micro-batches",
                            t.id,
                            backend.name(),
                            s.id,
                            s.action
                        ),
                    )
                    .help("Run the stateful step on the embedded engine (drop its `engines:` override) and give the SQL region the stateless rest.")
                    .at(format!("engines.{}", t.id))
                    .into());
                }
            }
        }
        if !sql_region && !caps.region_kinds.contains(&kind) {
            return Err(Diagnostic::new(
                &codes::NO_BACKEND,
                format!(
                    "backend `{}` does not run {kind:?} regions (`{}`)",
                    backend.name(),
                    t.id
                ),
            )
            .into());
        }
        let task = StepTask {
            id: t.id.clone(),
            inputs: t.inputs.keys().map(|p| (p.clone(), p.clone())).collect(),
            logic: logic.clone(),
        };
        let schema = backend.output_schema(&task, &inputs)?;
        if let Some(c) = self.output_contracts.get(&t.id) {
            if let Compatibility::Incompatible(problems) =
                check_compatible(&schema, &c.arrow_schema())
            {
                return Err(Diagnostic::new(
                    &codes::OUTPUT_CONTRACT_MISMATCH,
                    format!(
                        "`{}` produces a schema that breaks its output contract `{}`: {}",
                        t.id,
                        c.id(),
                        problems.join("; ")
                    ),
                )
                .at(format!("transforms[{}].output", t.id))
                .into());
            }
        }
        self.schemas.insert(t.id.clone(), schema);
        self.logic.insert(t.id.clone(), (logic, plan_logic));
        self.backend_of.insert(t.id.clone(), backend);
        Ok(())
    }

    fn resolve_logic(
        &self,
        t: &TransformDef,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<(StepLogic, PlanLogic)> {
        let portable = |plan: Arc<TransformPlan>| -> Result<(StepLogic, PlanLogic)> {
            let outputs: Vec<&String> = plan.decoded().outputs.keys().collect();
            let output = if outputs.len() == 1 {
                outputs[0].clone()
            } else if plan.decoded().outputs.contains_key("result") {
                "result".to_string()
            } else {
                return Err(Diagnostic::new(
                    &codes::TRANSFORM_PLAN_INVALID,
                    format!("the plan of `{}` has outputs {outputs:?}; ETLantic uses `result` or the only output", t.id),
                )
                .into());
            };
            crate::schema::check_plan_inputs(&plan, inputs, &t.id)?;
            for e in plan.decoded().steps.iter().flat_map(|s| s.op.expressions()) {
                e.bind_parameters(&t.parameters).map_err(|m| {
                    Error::from(
                        Diagnostic::new(&codes::UNKNOWN_PARAMETER, format!("`{}`: {m}", t.id))
                            .help("Give the value under `parameters:` of the transformation."),
                    )
                })?;
            }
            let logic = PlanLogic::Portable {
                plan: plan.to_value(),
                dtcs_fingerprint: plan.fingerprint(),
                parameters: t.parameters.clone(),
                output: output.clone(),
            };
            Ok((
                StepLogic::Portable {
                    plan,
                    parameters: t.parameters.clone(),
                    output,
                },
                logic,
            ))
        };
        if let Some(steps) = &t.steps {
            let streaming = self.p.profile.mode == ExecutionMode::Streaming;
            let mut b = TransformPlanBuilder::new(&t.id);
            for (port, schema) in inputs {
                b = b.input(port, Some(schema));
                let source = self.p.pipeline.source(t.inputs[port].from());
                if streaming && !source.is_some_and(|s| s.is_static()) {
                    let et = source
                        .and_then(|s| s.event_time.as_ref())
                        .map(|e| e.column.clone());
                    let wm = source.and_then(|s| s.watermark).map(|d| d.to_string());
                    b = b.streaming_input(port, et.as_deref(), wm.as_deref());
                }
            }
            if let Some(first) = inputs.keys().next() {
                b = b.from_input(first);
            }
            for s in steps {
                b = b.step(s.0.clone());
            }
            let plan = b.output("result", None).build()?;
            return portable(Arc::new(plan));
        }
        if t.plan.is_some() {
            let plan = self.loaded_plans.get(&t.id).cloned().ok_or_else(|| {
                Error::new(
                    &codes::TRANSFORM_PLAN_INVALID,
                    format!("the plan of `{}` did not load", t.id),
                )
            })?;
            return portable(plan);
        }
        if let Some(sql) = &t.sql {
            return Ok((
                StepLogic::Sql {
                    query: sql.query.clone(),
                },
                PlanLogic::Sql {
                    engine: sql.engine.clone(),
                    query: sql.query.clone(),
                },
            ));
        }
        let name = t.implementation.clone().unwrap_or_default();
        if plugin::transform_impls_named(&name).next().is_none() {
            return Err(Diagnostic::new(
                &codes::NO_BACKEND,
                format!("no linked implementation is named `{name}`"),
            )
            .into());
        }
        Ok((
            StepLogic::Impl { name: name.clone() },
            PlanLogic::Impl { name },
        ))
    }
}
