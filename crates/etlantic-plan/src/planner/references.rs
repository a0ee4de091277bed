//! The reference phase: every edge, asset, binding, contract, plan file, late-event
//! side output, engine override and processor a pipeline names must exist and load.

use super::Planner;
use etlantic_core::contract::Contract;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::ir::TransformPlan;
use etlantic_core::model::{ContractRef, PlanRef};
use etlantic_core::plugin;
use etlantic_core::streaming::{ExecutionMode, LatePolicy};
use etlantic_core::uri::BindingUri;
use std::collections::HashSet;
use std::sync::Arc;

impl Planner<'_> {
    fn load_contract(
        &mut self,
        r: &ContractRef,
        path: &str,
    ) -> Option<(Arc<Contract>, Option<String>)> {
        let result = match r {
            ContractRef::Path(file) => {
                let (f, object) = match file.rsplit_once('#') {
                    Some((f, o)) => (f.to_string(), Some(o.to_string())),
                    None => (file.clone(), None),
                };
                match std::fs::read_to_string(self.p.resolve(&f)) {
                    Ok(text) => Contract::parse(&text, &f, object.as_deref()).map(|c| (c, Some(f))),
                    Err(e) => Err(Diagnostic::new(
                        &codes::UNKNOWN_CONTRACT,
                        format!("contract file `{f}` cannot be read: {e}"),
                    )
                    .at(path.to_string())
                    .into()),
                }
            }
            ContractRef::Inline(v) => Contract::parse(
                &serde_json::to_string(v).expect("JSON serialises"),
                path,
                None,
            )
            .map(|c| (c, None)),
        };
        match result {
            Ok((c, f)) => Some((Arc::new(c), f)),
            Err(e) => {
                self.extend(e, path);
                None
            }
        }
    }

    pub(super) fn references(&mut self) {
        let pl = self.p.pipeline.clone();
        let nodes: HashSet<&str> = pl
            .sources
            .iter()
            .map(|s| s.id.as_str())
            .chain(pl.transforms.iter().map(|t| t.id.as_str()))
            .collect();
        for t in &pl.transforms {
            for (port, r) in &t.inputs {
                if !nodes.contains(r.from()) && pl.sinks.iter().all(|s| s.id != r.from()) {
                    self.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_NODE,
                            format!(
                                "port `{port}` of `{}` reads unknown node `{}`",
                                t.id,
                                r.from()
                            ),
                        )
                        .at(format!("transforms[{}].inputs.{port}", t.id)),
                    );
                }
            }
        }
        for s in &pl.sinks {
            if !nodes.contains(s.input.as_str()) && pl.sinks.iter().all(|x| x.id != s.input) {
                self.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_NODE,
                        format!("sink `{}` reads unknown node `{}`", s.id, s.input),
                    )
                    .at(format!("sinks[{}].input", s.id)),
                );
            }
        }
        // Assets used, their contracts and bindings.
        let mut used_assets: Vec<(String, String, bool)> = Vec::new(); // (asset, path, is_source)
        for s in &pl.sources {
            used_assets.push((s.asset.clone(), format!("sources[{}].asset", s.id), true));
        }
        for s in &pl.sinks {
            used_assets.push((s.asset.clone(), format!("sinks[{}].asset", s.id), false));
        }
        for (asset, path, is_source) in used_assets {
            let Some(def) = pl.assets.get(&asset) else {
                let known: Vec<&String> = pl.assets.keys().collect();
                self.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_ASSET,
                        format!("asset `{asset}` is not declared"),
                    )
                    .at(path)
                    .help(format!("Declare it under `assets:` (declared: {known:?}).")),
                );
                continue;
            };
            if !self.contracts.contains_key(&asset) {
                if let Some((c, f)) =
                    self.load_contract(&def.contract, &format!("assets.{asset}.contract"))
                {
                    self.contracts.insert(asset.clone(), c);
                    if let Some(f) = f {
                        self.contract_files.insert(asset.clone(), f);
                    }
                }
            }
            let uri = match self.p.profile.binding(&asset) {
                None => {
                    let profile = self
                        .p
                        .profile_file
                        .clone()
                        .unwrap_or_else(|| "(no profile file)".into());
                    self.push(
                        Diagnostic::new(
                            &codes::UNBOUND_ASSET,
                            format!("asset `{asset}` is bound to nothing in profile `{}`", self.p.profile.name),
                        )
                        .at(path)
                        .help(format!(
                            "Add `{asset}: <uri>` under `bindings:` in {profile}; an unbound asset is never silently discarded."
                        )),
                    );
                    continue;
                }
                Some(Err(e)) => {
                    self.extend(e, &format!("bindings.{asset}"));
                    continue;
                }
                Some(Ok(u)) => u,
            };
            let known = if is_source {
                plugin::source_provider(&uri.scheme).is_some()
            } else {
                plugin::sink_provider(&uri.scheme).is_some()
            };
            if !known {
                let role = if is_source { "source" } else { "sink" };
                let schemes: Vec<&str> = if is_source {
                    plugin::source_providers().map(|p| p.scheme()).collect()
                } else {
                    plugin::sink_providers().map(|p| p.scheme()).collect()
                };
                self.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_SCHEME,
                        format!("no {role} plugin handles scheme `{}` (asset `{asset}`)", uri.scheme),
                    )
                    .at(path)
                    .help(format!("Linked {role} schemes: {schemes:?}. Enable the cargo feature that provides `{}`.", uri.scheme)),
                );
                continue;
            }
            self.bindings.insert(asset.clone(), uri);
        }
        // Quarantine output.
        match BindingUri::parse(self.p.profile.quarantine_uri()) {
            Ok(u)
                if u.scheme == "file"
                    || etlantic_core::storage::OBJECT_SCHEMES.contains(&u.scheme.as_str()) => {}
            Ok(u) => self.push(
                Diagnostic::new(
                    &codes::UNKNOWN_SCHEME,
                    format!(
                        "the quarantine output must be a file:// URI or an object store's (s3://, gs://, az://), got `{}`",
                        u.scheme
                    ),
                )
                .at("quarantine"),
            ),
            Err(e) => self.extend(e, "quarantine"),
        }
        // Port and output contracts, plan files.
        for t in &pl.transforms {
            for (port, r) in &t.inputs {
                if let Some(c) = r.contract() {
                    if let Some((c, _)) = self
                        .load_contract(c, &format!("transforms[{}].inputs.{port}.contract", t.id))
                    {
                        self.port_contracts.insert((t.id.clone(), port.clone()), c);
                    }
                }
            }
            if let Some(o) = &t.output {
                if let Some((c, _)) = self.load_contract(
                    &o.contract,
                    &format!("transforms[{}].output.contract", t.id),
                ) {
                    self.output_contracts.insert(t.id.clone(), c);
                }
            }
            if let Some(plan) = &t.plan {
                let path = format!("transforms[{}].plan", t.id);
                let loaded = match plan {
                    PlanRef::Path(f) => self.p.read(f, &codes::FILE_UNREADABLE).and_then(|text| {
                        self.plan_files.insert(t.id.clone(), f.clone());
                        if f.ends_with(".json") || text.trim_start().starts_with('{') {
                            TransformPlan::from_json(text.as_bytes(), f)
                        } else {
                            TransformPlan::from_yaml(&text, f)
                        }
                    }),
                    PlanRef::Inline(v) => TransformPlan::from_value(v, &path),
                };
                match loaded {
                    Ok(tp) => {
                        let inputs: Vec<String> =
                            tp.decoded().inputs.iter().map(|i| i.id.clone()).collect();
                        for i in &inputs {
                            if !t.inputs.contains_key(i) {
                                self.push(
                                    Diagnostic::new(
                                        &codes::UNKNOWN_PORT,
                                        format!("the plan reads input `{i}`, which `{}` does not declare", t.id),
                                    )
                                    .at(format!("transforms[{}].inputs", t.id))
                                    .help(format!("Declare port `{i}` under `inputs:` (ports: {:?}).", t.inputs.keys().collect::<Vec<_>>())),
                                );
                            }
                        }
                        for port in t.inputs.keys() {
                            if !inputs.contains(port) {
                                self.push(
                                    Diagnostic::new(
                                        &codes::PORT_UNCONNECTED,
                                        format!(
                                            "port `{port}` of `{}` is not an input of its plan",
                                            t.id
                                        ),
                                    )
                                    .at(format!("transforms[{}].inputs.{port}", t.id)),
                                );
                            }
                        }
                        self.loaded_plans.insert(t.id.clone(), Arc::new(tp));
                    }
                    Err(e) => self.extend(e, &path),
                }
            }
        }
        // Late-event side outputs and engine overrides.
        for s in &pl.sources {
            if let LatePolicy::SideOutput { sink } = &s.late_events {
                if pl.sinks.iter().all(|x| &x.id != sink) {
                    self.push(
                        Diagnostic::new(
                            &codes::SIDE_OUTPUT_UNKNOWN,
                            format!("late events of `{}` go to unknown sink `{sink}`", s.id),
                        )
                        .at(format!("sources[{}].late_events", s.id)),
                    );
                }
            }
        }
        for (t, b) in &self.p.profile.engines.clone() {
            if pl.transform(t).is_none() {
                self.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_NODE,
                        format!("engine override for unknown transformation `{t}`"),
                    )
                    .at(format!("engines.{t}"))
                    .in_file(self.p.profile_file.clone().unwrap_or_default()),
                );
            }
            if plugin::backend(b).is_none() {
                let linked: Vec<&str> = plugin::backends().map(|b| b.name()).collect();
                self.push(
                    Diagnostic::new(&codes::NO_BACKEND, format!("backend `{b}` is not linked"))
                        .at(format!("engines.{t}"))
                        .help(format!("Linked backends: {linked:?}.")),
                );
            }
        }
        self.processor_references();
    }

    /// Custom stateful processors named by `process` steps must be linked; `state_ttl`
    /// entries must name transformations (whether they keep state is a streaming rule).
    fn processor_references(&mut self) {
        let pl = self.p.pipeline.clone();
        for t in &pl.transforms {
            let mut actions: Vec<(String, etlantic_core::ir::Action)> = Vec::new();
            if let Some(steps) = &t.steps {
                for (i, s) in steps.iter().enumerate() {
                    actions.push((format!("transforms[{}].steps[{i}]", t.id), s.0.clone()));
                }
            }
            if let Some(plan) = self.loaded_plans.get(&t.id) {
                for s in &plan.decoded().steps {
                    actions.push((format!("transforms[{}].plan.{}", t.id, s.id), s.op.clone()));
                }
            }
            for (path, a) in actions {
                if let etlantic_core::ir::Action::Process { processor, .. } = a {
                    if plugin::processor(&processor).is_none() {
                        let linked: Vec<&str> = plugin::processors().map(|p| p.name()).collect();
                        self.push(
                            Diagnostic::new(
                                &codes::UNKNOWN_PROCESSOR,
                                format!("no linked stateful processor is named `{processor}`"),
                            )
                            .at(path)
                            .help(format!(
                                "Linked processors: {linked:?}. A processor is linked by the crate that registers it (`inventory::submit!`)."
                            )),
                        );
                    }
                }
            }
        }
        if self.p.profile.mode == ExecutionMode::Streaming {
            for op in self.p.profile.state_ttl.keys() {
                let transform = op.split_once('.').map_or(op.as_str(), |(t, _)| t);
                if pl.transform(transform).is_none() {
                    self.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_STATE_OPERATOR,
                            format!("`state_ttl` names `{op}`, but the pipeline has no transformation `{transform}`"),
                        )
                        .at(format!("state_ttl.{op}"))
                        .in_file(self.p.profile_file.clone().unwrap_or_default()),
                    );
                }
            }
        }
    }
}
