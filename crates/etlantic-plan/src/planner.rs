//! Validation phases and the planner.
//!
//! Phases run in order — structural, reference, semantic (contracts and port types),
//! streaming, capability, guarantee, policy — and planning stops after the first phase
//! that reports an error, so later phases never see a broken graph. Warnings of every
//! phase that ran are kept in the plan.

use crate::plan::*;
use crate::project::Project;
use crate::schema::{check_compatible, Compatibility};
use crate::streaming_rules;
use arrow::datatypes::SchemaRef;
use etlantic_core::contract::Contract;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result, Severity};
use etlantic_core::guarantee::{end_to_end, SourceGuarantee};
use etlantic_core::ir::{TransformPlan, TransformPlanBuilder};
use etlantic_core::model::{ContractRef, PlanRef, TransformDef, WriteMode};
use etlantic_core::plugin::{self, Backend, RegionKind, StepLogic, StepTask};
use etlantic_core::streaming::{ExecutionMode, LatePolicy};
use etlantic_core::uri::BindingUri;
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The backend used for a step unless the profile overrides it.
pub const DEFAULT_BACKEND: &str = "datafusion";

/// The result of planning: a plan when no phase failed, and every diagnostic.
#[derive(Debug)]
pub struct PlanOutcome {
    /// The sealed plan, when planning succeeded.
    pub plan: Option<PipelinePlan>,
    /// Errors and warnings.
    pub diagnostics: Diagnostics,
}

impl PlanOutcome {
    /// The plan, or an error carrying every diagnostic.
    pub fn into_result(self) -> Result<PipelinePlan> {
        match self.plan {
            Some(p) if !self.diagnostics.has_errors() => Ok(p),
            _ => Err(Error(self.diagnostics)),
        }
    }
}

/// Validates and plans a project.
pub fn plan(project: &Project) -> PlanOutcome {
    let mut planner = Planner::new(project);
    let plan = planner.run().ok();
    PlanOutcome {
        plan,
        diagnostics: planner.diags,
    }
}

/// Runs the validation phases only (no plan is built); what `etlantic validate` does.
pub fn validate(project: &Project) -> Diagnostics {
    plan(project).diagnostics
}

struct Planner<'a> {
    p: &'a Project,
    diags: Diagnostics,
    contracts: IndexMap<String, Arc<Contract>>,
    contract_files: IndexMap<String, String>,
    port_contracts: HashMap<(String, String), Arc<Contract>>,
    output_contracts: HashMap<String, Arc<Contract>>,
    plan_files: IndexMap<String, String>,
    loaded_plans: HashMap<String, Arc<TransformPlan>>,
    bindings: IndexMap<String, BindingUri>,
    order: Vec<String>,
    schemas: HashMap<String, SchemaRef>,
    logic: HashMap<String, (StepLogic, PlanLogic)>,
    backend_of: HashMap<String, &'static dyn Backend>,
    /// Step → the binding of the database its SQL region runs in.
    location_of: HashMap<String, String>,
    /// Sources an SQL region reads in place (`read=in_place`): source id → table.
    in_place: HashMap<String, String>,
}

type Phased = std::result::Result<(), ()>;

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl<'a> Planner<'a> {
    fn new(p: &'a Project) -> Self {
        Planner {
            p,
            diags: Diagnostics::new(),
            contracts: IndexMap::new(),
            contract_files: IndexMap::new(),
            port_contracts: HashMap::new(),
            output_contracts: HashMap::new(),
            plan_files: IndexMap::new(),
            loaded_plans: HashMap::new(),
            bindings: IndexMap::new(),
            order: Vec::new(),
            schemas: HashMap::new(),
            logic: HashMap::new(),
            backend_of: HashMap::new(),
            location_of: HashMap::new(),
            in_place: HashMap::new(),
        }
    }

    fn push(&mut self, d: Diagnostic) {
        let d = if d.file.is_none() && !d.path.is_empty() {
            d.in_file(self.p.pipeline_file.clone())
        } else {
            d
        };
        self.diags.push(d);
    }

    fn extend(&mut self, e: Error, path: &str) {
        for d in e.0 {
            let d = if d.path.is_empty() {
                d.at(path.to_string())
            } else {
                d
            };
            self.push(d);
        }
    }

    /// Fails the phase when any error was reported since `mark`.
    fn gate(&self, mark: usize) -> Phased {
        if self.diags.0[mark..]
            .iter()
            .any(|d| d.severity == Severity::Error)
        {
            Err(())
        } else {
            Ok(())
        }
    }

    fn run(&mut self) -> std::result::Result<PipelinePlan, ()> {
        let m = self.diags.0.len();
        self.structural();
        self.gate(m)?;
        let m = self.diags.0.len();
        self.references();
        self.gate(m)?;
        let m = self.diags.0.len();
        self.semantic();
        self.gate(m)?;
        let m = self.diags.0.len();
        if self.p.profile.mode == ExecutionMode::Streaming {
            let found = streaming_rules::check(self.p, &self.logic_plans());
            self.diags.extend(found);
            let found = crate::state_rules::check(self.p, &self.logic_plans());
            self.diags.extend(found);
        }
        self.gate(m)?;
        let m = self.diags.0.len();
        self.capability();
        self.gate(m)?;
        let m = self.diags.0.len();
        let guarantees = self.guarantees();
        self.gate(m)?;
        let m = self.diags.0.len();
        self.policy();
        self.gate(m)?;
        Ok(self.build(guarantees))
    }

    fn logic_plans(&self) -> HashMap<String, Arc<TransformPlan>> {
        self.logic
            .iter()
            .filter_map(|(id, (l, _))| match l {
                StepLogic::Portable { plan, .. } => Some((id.clone(), plan.clone())),
                _ => None,
            })
            .collect()
    }

    // ------------------------------------------------------------------ structural

    fn structural(&mut self) {
        let pl = &self.p.pipeline;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut found = Vec::new();
        let nodes = pl
            .sources
            .iter()
            .map(|s| ("sources", s.id.as_str()))
            .chain(pl.transforms.iter().map(|t| ("transforms", t.id.as_str())))
            .chain(pl.sinks.iter().map(|s| ("sinks", s.id.as_str())));
        for (section, id) in nodes {
            if !valid_id(id) {
                found.push(
                    Diagnostic::new(&codes::INVALID_ID, format!("invalid id `{id}`"))
                        .at(format!("{section}[{id}]")),
                );
            } else if !seen.insert(id) {
                found.push(
                    Diagnostic::new(
                        &codes::DUPLICATE_ID,
                        format!("id `{id}` is used by more than one node"),
                    )
                    .at(format!("{section}[{id}]")),
                );
            }
        }
        if pl.sources.is_empty() || pl.sinks.is_empty() {
            found.push(
                Diagnostic::new(
                    &codes::EMPTY_PIPELINE,
                    format!(
                        "the pipeline has {} source(s) and {} sink(s)",
                        pl.sources.len(),
                        pl.sinks.len()
                    ),
                )
                .at("pipeline"),
            );
        }
        for t in &pl.transforms {
            let count = [
                t.steps.is_some(),
                t.plan.is_some(),
                t.sql.is_some(),
                t.implementation.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if count != 1 {
                found.push(
                    Diagnostic::new(
                        &codes::IMPLEMENTATION_COUNT,
                        format!("transformation `{}` has {count} implementations", t.id),
                    )
                    .at(format!("transforms[{}]", t.id)),
                );
            }
            if t.inputs.is_empty() {
                found.push(
                    Diagnostic::new(
                        &codes::PORT_UNCONNECTED,
                        format!("transformation `{}` has no input port", t.id),
                    )
                    .at(format!("transforms[{}].inputs", t.id)),
                );
            }
        }
        for s in &pl.sinks {
            if pl.sinks.iter().any(|x| x.id == s.input) {
                found.push(
                    Diagnostic::new(
                        &codes::SINK_AS_INPUT,
                        format!("sink `{}` reads from sink `{}`", s.id, s.input),
                    )
                    .at(format!("sinks[{}].input", s.id)),
                );
            }
        }
        for t in &pl.transforms {
            for (port, r) in &t.inputs {
                if pl.sinks.iter().any(|x| x.id == r.from()) {
                    found.push(
                        Diagnostic::new(
                            &codes::SINK_AS_INPUT,
                            format!("port `{port}` of `{}` reads from sink `{}`", t.id, r.from()),
                        )
                        .at(format!("transforms[{}].inputs.{port}", t.id)),
                    );
                }
            }
        }
        // Cycles among transformations (edges to unknown nodes are the reference
        // phase's business).
        let ids: HashMap<&str, &TransformDef> =
            pl.transforms.iter().map(|t| (t.id.as_str(), t)).collect();
        let mut state: HashMap<&str, u8> = HashMap::new(); // 1 = on stack, 2 = done
        let mut order = Vec::new();
        fn visit<'b>(
            id: &'b str,
            ids: &HashMap<&'b str, &'b TransformDef>,
            state: &mut HashMap<&'b str, u8>,
            stack: &mut Vec<&'b str>,
            order: &mut Vec<String>,
            cycles: &mut Vec<Vec<String>>,
        ) {
            match state.get(id) {
                Some(2) => return,
                Some(1) => {
                    let start = stack.iter().position(|x| *x == id).unwrap_or(0);
                    let mut c: Vec<String> = stack[start..].iter().map(|s| s.to_string()).collect();
                    c.push(id.to_string());
                    cycles.push(c);
                    return;
                }
                _ => {}
            }
            state.insert(id, 1);
            stack.push(id);
            if let Some(t) = ids.get(id) {
                for r in t.inputs.values() {
                    if ids.contains_key(r.from()) {
                        visit(r.from(), ids, state, stack, order, cycles);
                    }
                }
            }
            stack.pop();
            state.insert(id, 2);
            order.push(id.to_string());
        }
        let mut cycles = Vec::new();
        for t in &pl.transforms {
            let mut stack = Vec::new();
            visit(&t.id, &ids, &mut state, &mut stack, &mut order, &mut cycles);
        }
        for c in cycles {
            found.push(
                Diagnostic::new(&codes::CYCLE, format!("cycle: {}", c.join(" -> ")))
                    .at(format!("transforms[{}].inputs", c[0]))
                    .help("A pipeline is a directed acyclic graph; remove one of these edges."),
            );
        }
        self.order = order;
        // Unused nodes (warnings).
        let used: HashSet<&str> = pl
            .transforms
            .iter()
            .flat_map(|t| t.inputs.values().map(|r| r.from()))
            .chain(pl.sinks.iter().map(|s| s.input.as_str()))
            .collect();
        for s in &pl.sources {
            if !used.contains(s.id.as_str()) {
                found.push(
                    Diagnostic::new(
                        &codes::UNUSED_NODE,
                        format!("source `{}` feeds nothing", s.id),
                    )
                    .at(format!("sources[{}]", s.id)),
                );
            }
        }
        for t in &pl.transforms {
            if !used.contains(t.id.as_str()) {
                found.push(
                    Diagnostic::new(
                        &codes::UNUSED_NODE,
                        format!("transformation `{}` feeds nothing", t.id),
                    )
                    .at(format!("transforms[{}]", t.id)),
                );
            }
        }
        for d in found {
            self.push(d);
        }
    }

    // ------------------------------------------------------------------ reference

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

    fn references(&mut self) {
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
            Ok(u) if u.scheme == "file" => {}
            Ok(u) => self.push(
                Diagnostic::new(
                    &codes::UNKNOWN_SCHEME,
                    format!(
                        "the quarantine output must be a file:// URI, got `{}`",
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

    // ------------------------------------------------------------------ semantic

    fn semantic(&mut self) {
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
            StepLogic::Impl { name } => plugin::transform_impl(name)
                .map(|i| i.backend().to_string())
                .unwrap_or(backend_name),
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
        if plugin::transform_impl(&name).is_none() {
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

    // ------------------------------------------------------------------ capability

    fn capability(&mut self) {
        let pl = self.p.pipeline.clone();
        let mode = self.p.profile.mode;
        if let (
            ExecutionMode::Streaming,
            Some(etlantic_core::streaming::Trigger::Continuous(interval)),
        ) = (mode, self.p.profile.trigger)
        {
            let continuous = self
                .backend_of
                .values()
                .all(|b| b.capabilities().continuous)
                && !self.backend_of.is_empty();
            if !continuous {
                self.push(
                    Diagnostic::new(
                        &codes::CONTINUOUS_FALLBACK,
                        format!("the continuous trigger is not supported here; falling back to `processing_time {interval}` micro-batches"),
                    )
                    .at("trigger")
                    .in_file(self.p.profile_file.clone().unwrap_or_default()),
                );
            }
        }
        for s in &pl.sources {
            let Some(uri) = self.bindings.get(&s.asset) else {
                continue;
            };
            let provider =
                plugin::source_provider(&uri.scheme).expect("checked in the reference phase");
            match provider.capabilities(uri) {
                Ok(c) => {
                    let ok = match mode {
                        ExecutionMode::Batch => c.bounded,
                        ExecutionMode::Streaming if s.is_static() => c.bounded,
                        ExecutionMode::Streaming => c.unbounded,
                    };
                    if !ok && s.is_static() {
                        self.push(
                            Diagnostic::new(
                                &codes::STATIC_SOURCE_UNBOUNDED,
                                format!(
                                    "static source `{}` ({}) cannot be read as a bounded table",
                                    s.id,
                                    uri.redacted()
                                ),
                            )
                            .at(format!("sources[{}].static_refresh", s.id)),
                        );
                    } else if !ok {
                        self.push(
                            Diagnostic::new(
                                &codes::SOURCE_NOT_STREAMABLE,
                                format!(
                                    "source `{}` ({}) cannot be read in a {} run",
                                    s.id,
                                    uri.redacted(),
                                    if mode == ExecutionMode::Batch {
                                        "batch"
                                    } else {
                                        "streaming"
                                    }
                                ),
                            )
                            .at(format!("sources[{}]", s.id)),
                        );
                    }
                }
                Err(e) => self.extend(e, &format!("sources[{}]", s.id)),
            }
        }
        for s in &pl.sinks {
            let Some(uri) = self.bindings.get(&s.asset) else {
                continue;
            };
            let provider =
                plugin::sink_provider(&uri.scheme).expect("checked in the reference phase");
            match provider.capabilities(uri) {
                Ok(c) => {
                    let mode_ok = match mode {
                        ExecutionMode::Batch => c.batch,
                        ExecutionMode::Streaming => c.streaming,
                    };
                    let om = s.output_mode.unwrap_or_default();
                    if !mode_ok
                        || (mode == ExecutionMode::Streaming && !c.output_modes.contains(&om))
                    {
                        self.push(
                            Diagnostic::new(
                                &codes::SINK_MODE_UNSUPPORTED,
                                format!("sink `{}` ({}) does not support this run (mode {:?}, output mode {})", s.id, uri.redacted(), mode, om.as_str()),
                            )
                            .at(format!("sinks[{}]", s.id)),
                        );
                    }
                }
                Err(e) => self.extend(e, &format!("sinks[{}]", s.id)),
            }
        }
        self.region_locations();
        self.in_place_sources();
        if mode == ExecutionMode::Streaming {
            self.whole_query_streaming();
        }
    }

    /// A streaming pipeline with a step on a backend that runs whole queries in another
    /// system (Spark) runs there as one query: that backend reads the sources and writes
    /// the sinks itself, so every step must be on it, and it must give what the
    /// pipeline asks of the runtime (late policies, quarantine, contract rules).
    /// Anything else is `ETL507`. (The embedded runtime gives all of it.)
    fn whole_query_streaming(&mut self) {
        let Some((first, backend)) = self.order.iter().find_map(|id| {
            let b = self.backend_of.get(id)?;
            b.capabilities()
                .streaming
                .whole_query
                .then(|| (id.clone(), *b))
        }) else {
            return;
        };
        let name = backend.name();
        let support = backend.capabilities().streaming;
        let unsupported = |message: String, at: String, help: String| {
            Diagnostic::new(&codes::STREAMING_REGION_UNSUPPORTED, message)
                .at(at)
                .help(help)
        };
        let mut found = Vec::new();
        for id in &self.order {
            let b = self.backend_of[id].name();
            if b != name {
                found.push(unsupported(
                    format!("`{first}` runs on `{name}`, which runs a streaming pipeline as one query of its own, but `{id}` runs on `{b}`"),
                    format!("engines.{id}"),
                    format!("Place every transformation on `{name}` (`engines: {{{id}: {name}}}`), or none."),
                ));
            }
        }
        let pl = self.p.pipeline.clone();
        let io = |kind: &str, id: &str, asset: &str| -> Option<Diagnostic> {
            let uri = self.bindings.get(asset)?;
            (!support.io_schemes.contains(&uri.scheme)).then(|| {
                unsupported(
                    format!("{kind} `{id}` is bound to `{}`, which a streaming query on `{name}` does not {}", uri.redacted(), if kind == "source" { "read" } else { "write" }),
                    format!("{kind}s[{id}]"),
                    format!("Bind it to one of: {}.", support.io_schemes.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(", ")),
                )
            })
        };
        for s in &pl.sources {
            found.extend(io("source", &s.id, &s.asset));
            let policy = s.late_events.name();
            if !support.late_policies.iter().any(|p| p == policy) {
                found.push(unsupported(
                    format!(
                        "source `{}` sends late events to `{policy}`, which `{name}` does not do",
                        s.id
                    ),
                    format!("sources[{}].late_events", s.id),
                    format!("`{name}` applies: {}.", support.late_policies.join(", ")),
                ));
            }
        }
        for s in &pl.sinks {
            found.extend(io("sink", &s.id, &s.asset));
        }
        if !support.quarantine {
            if self.p.profile.on_error == etlantic_core::profile::OnError::Quarantine {
                found.push(unsupported(
                    format!("bad records are to be quarantined (`on_error: quarantine`), which a streaming query on `{name}` cannot do"),
                    "on_error".into(),
                    "Set `on_error: fail`: the query then stops at the first malformed record or missing required field.".into(),
                ));
            }
            for (asset, c) in &self.contracts {
                let rules = etlantic_core::contract::rules::RuleSet::of(c)
                    .map(|set| set.rules.len())
                    .unwrap_or(0);
                if rules > 0 {
                    found.push(unsupported(
                        format!("the contract of `{asset}` has {rules} quality rule(s), which a streaming query on `{name}` does not evaluate"),
                        format!("assets[{asset}]"),
                        "Run the pipeline on the embedded runtime, or check the rules downstream.".into(),
                    ));
                }
            }
        }
        for d in found {
            self.push(d);
        }
    }

    /// Binds every step on a backend that runs inside another system (an SQL backend)
    /// to the database it runs in: the binding of a source it reads directly, else of a
    /// sink it feeds directly, whose scheme the backend declares, else the database of
    /// an input computed on the same backend. A step with none of these runs in a
    /// private database when the backend has one (SQLite in memory), otherwise it is an
    /// error (`ETL506`).
    fn region_locations(&mut self) {
        let pl = self.p.pipeline.clone();
        for id in self.order.clone() {
            let Some(backend) = self.backend_of.get(&id).copied() else {
                continue;
            };
            let schemes = backend.capabilities().location_schemes;
            if schemes.is_empty() {
                continue;
            }
            let t = pl.transform(&id).expect("ordered transforms exist");
            let from_sources = t
                .inputs
                .values()
                .filter_map(|r| pl.source(r.from()))
                .map(|s| s.asset.clone());
            let from_sinks = pl
                .sinks
                .iter()
                .filter(|s| s.input == id)
                .map(|s| s.asset.clone());
            let found = from_sources.chain(from_sinks).find(|asset| {
                self.bindings
                    .get(asset)
                    .is_some_and(|u| schemes.contains(&u.scheme))
            });
            // Else the database of an input computed on this backend: the region goes on
            // there instead of leaving the database and coming back.
            let inherited = t.inputs.values().find_map(|r| {
                let same_backend = self
                    .backend_of
                    .get(r.from())
                    .is_some_and(|b| b.name() == backend.name());
                same_backend
                    .then(|| self.location_of.get(r.from()).cloned())
                    .flatten()
            });
            match found {
                None if inherited.is_some() => {
                    self.location_of
                        .insert(id.clone(), inherited.expect("checked"));
                }
                Some(asset) => {
                    let db = self.database_of(&asset);
                    self.location_of.insert(id.clone(), db);
                }
                None if backend.name() == "sqlite" => {}
                None if self.p.profile.endpoints.contains_key(backend.name()) => {
                    let endpoint = self.p.profile.endpoints[backend.name()].clone();
                    self.location_of.insert(id.clone(), endpoint);
                }
                None => self.push(
                    Diagnostic::new(
                        &codes::REGION_LOCATION,
                        format!(
                            "`{id}` runs on `{}` but reads no source and feeds no sink in such a database ({}), so there is no database to run it in",
                            backend.name(),
                            schemes.join(", ")
                        ),
                    )
                    .at(format!("engines.{id}"))
                    .help(format!(
                        "Name where `{}` runs under `endpoints:` in the profile (e.g. `{}: {}://host:port`).",
                        backend.name(),
                        backend.name(),
                        schemes[0]
                    )),
                ),
            }
        }
    }

    /// The database of an SQL asset's binding, not the table:
    /// `scheme://location[?sslmode=..]` (secret references unresolved).
    fn database_of(&self, asset: &str) -> String {
        let uri = &self.bindings[asset];
        let binding = &self.p.profile.bindings[asset];
        let mut db = binding.split('?').next().unwrap_or(binding).to_string();
        if let Some(mode) = uri.param("sslmode") {
            db.push_str(&format!("?sslmode={mode}"));
        }
        db
    }

    /// Sources whose binding says `read=in_place`: an SQL region of their own database
    /// reads the table where it lies, so its rows never leave the database. That needs a
    /// batch run, a PostgreSQL table (`table=`, not `query=`), and every reader of the
    /// source in an SQL region of that database; otherwise `ETL506`. The source's
    /// contract still gives the schema, but no record is decoded or quarantined: the
    /// database's types are the check, and a value that does not convert fails the run.
    fn in_place_sources(&mut self) {
        let pl = self.p.pipeline.clone();
        for src in &pl.sources {
            let Some(uri) = self.bindings.get(&src.asset) else {
                continue;
            };
            match uri.param("read") {
                None | Some("rows") => continue,
                Some("in_place") => {}
                Some(other) => {
                    self.push(
                        Diagnostic::new(
                            &codes::REGION_LOCATION,
                            format!("`read={other}` on the binding of `{}`: expected `in_place` or `rows`", src.asset),
                        )
                        .at(format!("bindings.{}", src.asset)),
                    );
                    continue;
                }
            }
            let why_not = if self.p.profile.mode != ExecutionMode::Batch {
                Some("a streaming query reads its sources per micro-batch".to_string())
            } else if !matches!(uri.scheme.as_str(), "postgres" | "postgresql") {
                Some(format!("`{}` tables are read through the source (only PostgreSQL tables are read in place)", uri.scheme))
            } else if uri.param("table").is_none() {
                Some("only a `table=` is read in place, not a `query=`".to_string())
            } else {
                let db = self.database_of(&src.asset);
                let outside: Vec<String> = pl
                    .transforms
                    .iter()
                    .filter(|t| t.inputs.values().any(|r| r.from() == src.id))
                    .filter(|t| self.location_of.get(&t.id) != Some(&db))
                    .map(|t| format!("`{}`", t.id))
                    .chain(
                        pl.sinks
                            .iter()
                            .filter(|k| k.input == src.id)
                            .map(|k| format!("sink `{}`", k.id)),
                    )
                    .collect();
                (!outside.is_empty()).then(|| {
                    format!(
                        "{} read(s) it outside an SQL region of its database",
                        outside.join(", ")
                    )
                })
            };
            match why_not {
                Some(why) => self.push(
                    Diagnostic::new(
                        &codes::REGION_LOCATION,
                        format!("source `{}` cannot be read in place: {why}", src.id),
                    )
                    .help("Drop `read=in_place` from the binding (the source then reads, checks and hands on the rows), or place every reader of the source on the database's backend with `engines:`.")
                    .at(format!("bindings.{}", src.asset)),
                ),
                None => {
                    let table = uri.param("table").expect("checked").to_string();
                    self.in_place.insert(src.id.clone(), table);
                }
            }
        }
    }

    // ------------------------------------------------------------------ guarantee

    fn upstream_sources(&self, node: &str, out: &mut Vec<String>) {
        if self.p.pipeline.source(node).is_some() {
            if !out.iter().any(|x| x == node) {
                out.push(node.to_string());
            }
            return;
        }
        if let Some(t) = self.p.pipeline.transform(node) {
            for r in t.inputs.values() {
                self.upstream_sources(r.from(), out);
            }
        }
    }

    fn guarantees(&mut self) -> Vec<PairGuarantee> {
        let pl = self.p.pipeline.clone();
        let mut out = Vec::new();
        // A state checkpoint interval rebuilds state by reading committed micro-batches
        // again: every stream must be replayable.
        if self.p.profile.mode == ExecutionMode::Streaming
            && self.p.profile.state_checkpoint_interval.is_some()
        {
            for s in pl.sources.iter().filter(|s| s.static_refresh.is_none()) {
                let Some(uri) = self.bindings.get(&s.asset) else {
                    continue;
                };
                if source_guarantee(uri) != SourceGuarantee::Replayable {
                    self.push(
                        Diagnostic::new(
                            &codes::STATE_INTERVAL_NEEDS_REPLAY,
                            format!(
                                "source `{}` ({}) cannot be read again, and `state_checkpoint_interval` needs to read committed micro-batches again after a restart",
                                s.id, uri.scheme
                            ),
                        )
                        .at(format!("sources[{}]", s.id)),
                    );
                }
            }
        }
        for sink in &pl.sinks {
            let Some(uri) = self.bindings.get(&sink.asset) else {
                continue;
            };
            let Ok(sc) = plugin::sink_provider(&uri.scheme)
                .expect("checked")
                .capabilities(uri)
            else {
                continue;
            };
            let mut sources = Vec::new();
            self.upstream_sources(&sink.input, &mut sources);
            for src in sources {
                let s = pl.source(&src).expect("exists");
                let Some(su) = self.bindings.get(&s.asset) else {
                    continue;
                };
                let Ok(srcc) = plugin::source_provider(&su.scheme)
                    .expect("checked")
                    .capabilities(su)
                else {
                    continue;
                };
                let g = end_to_end(srcc.guarantee, sc.guarantee.protocol);
                if let Some(req) = self.p.profile.require_guarantee {
                    if g < req {
                        self.push(
                            Diagnostic::new(
                                &codes::GUARANTEE_UNMET,
                                format!(
                                    "the profile requires {req} but `{src}` → `{}` gives {g} ({:?} source, {:?} sink)",
                                    sink.id, srcc.guarantee, sc.guarantee.protocol
                                ),
                            )
                            .at(format!("sinks[{}]", sink.id)),
                        );
                    }
                }
                out.push(PairGuarantee {
                    source: src.clone(),
                    sink: sink.id.clone(),
                    guarantee: g,
                    condition: sc.guarantee.condition.clone(),
                });
            }
        }
        out
    }

    // ------------------------------------------------------------------ policy

    fn policy(&mut self) {
        // Secrets and URIs were checked when the profile was read (`Profile::check`);
        // re-check here for profiles built in code.
        if let Err(e) = self
            .p
            .profile
            .check(self.p.profile_file.as_deref().unwrap_or("profile"))
        {
            self.extend(e, "profile");
        }
    }

    // ------------------------------------------------------------------ build

    fn build(&mut self, guarantees: Vec<PairGuarantee>) -> PipelinePlan {
        let pl = &self.p.pipeline;
        let prof = &self.p.profile;
        let mode = prof.mode;
        let mut assets = IndexMap::new();
        for (name, c) in &self.contracts {
            let Some(uri) = self.bindings.get(name) else {
                continue;
            };
            assets.insert(
                name.clone(),
                PlanAsset {
                    contract: PlanContract {
                        id: c.id().to_string(),
                        version: c.version().to_string(),
                        object: c.object.clone(),
                        document: c.canonical_json(),
                    },
                    binding: prof.bindings[name].clone(),
                    scheme: uri.scheme.clone(),
                    schema: schema_spec(&c.arrow_schema()),
                },
            );
        }
        let mut watermark_rows = if mode == ExecutionMode::Streaming {
            let columns: HashMap<String, Vec<String>> = self
                .schemas
                .iter()
                .map(|(id, s)| {
                    (
                        id.clone(),
                        s.fields().iter().map(|f| f.name().clone()).collect(),
                    )
                })
                .collect();
            let portable: HashMap<String, crate::watermark_rows::PortableLogic<'_>> = self
                .logic
                .iter()
                .filter_map(|(id, (logic, _))| match logic {
                    StepLogic::Portable {
                        plan,
                        parameters,
                        output,
                    } => Some((
                        id.clone(),
                        crate::watermark_rows::PortableLogic {
                            plan,
                            parameters,
                            output,
                        },
                    )),
                    _ => None,
                })
                .collect();
            crate::watermark_rows::watermark_rows(self.p, &self.order, &columns, &portable)
        } else {
            IndexMap::new()
        };
        let sources = pl
            .sources
            .iter()
            .map(|s| {
                let uri = &self.bindings[&s.asset];
                let guarantee = source_guarantee(uri);
                PlanSource {
                    id: s.id.clone(),
                    asset: s.asset.clone(),
                    event_time: s.event_time.clone(),
                    watermark: s.watermark,
                    late_events: s.late_events.clone(),
                    read_limit: s.read_limit.clone(),
                    guarantee,
                    static_refresh: s.static_refresh,
                    watermark_rows: watermark_rows
                        .swap_remove(&s.id)
                        .flatten()
                        .map(|e| e.encode()),
                }
            })
            .collect();
        // Regions: consecutive transformations (in execution order) on one backend.
        let kind = match mode {
            ExecutionMode::Batch => RegionKind::Batch,
            ExecutionMode::Streaming => RegionKind::Streaming,
        };
        let mut regions: Vec<Region> = Vec::new();
        let mut region_of: HashMap<String, String> = HashMap::new();
        for id in &self.order {
            let b = self.backend_of[id];
            let backend = b.name().to_string();
            let location = self.location_of.get(id).cloned();
            let start_new = regions
                .last()
                .map(|r| r.backend != backend || r.location != location)
                .unwrap_or(true);
            if start_new {
                let sql = b.capabilities().region_kinds.contains(&RegionKind::Sql);
                regions.push(Region {
                    id: format!("r{}", regions.len()),
                    kind: if sql { RegionKind::Sql } else { kind },
                    backend,
                    steps: vec![],
                    inputs: vec![],
                    outputs: vec![],
                    location,
                    in_place: IndexMap::new(),
                });
            }
            let r = regions.last_mut().expect("just pushed");
            r.steps.push(id.clone());
            region_of.insert(id.clone(), r.id.clone());
        }
        let mut transitions = Vec::new();
        let place = |node: &str, region_of: &HashMap<String, String>| -> String {
            match region_of.get(node) {
                Some(r) => format!("region:{r}"),
                None => format!("source:{node}"),
            }
        };
        let sql_regions: Vec<String> = regions
            .iter()
            .filter(|r| r.kind == RegionKind::Sql)
            .map(|r| r.id.clone())
            .collect();
        let materialization = |from: Option<&String>, to: Option<&String>| -> String {
            let is_sql = |r: Option<&String>| r.is_some_and(|r| sql_regions.contains(r));
            match (is_sql(from), is_sql(to)) {
                (true, true) => "query-result→staged-table".into(),
                (false, true) => "arrow→staged-table".into(),
                (true, false) => "query-result→arrow".into(),
                _ => "arrow".into(),
            }
        };
        for id in &self.order {
            let t = pl.transform(id).expect("exists");
            let my_region = region_of[id].clone();
            for r in t.inputs.values() {
                let from = r.from();
                if region_of.get(from) != Some(&my_region) {
                    let ri = regions
                        .iter_mut()
                        .find(|x| x.id == my_region)
                        .expect("region");
                    if !ri.inputs.iter().any(|x| x == from) {
                        ri.inputs.push(from.to_string());
                        let in_place = self.in_place.get(from);
                        if let Some(table) = in_place {
                            ri.in_place.insert(from.to_string(), table.clone());
                        }
                        transitions.push(Transition {
                            from: place(from, &region_of),
                            to: format!("region:{my_region}"),
                            relation: from.to_string(),
                            materialization: match in_place {
                                Some(_) => "in-place".into(),
                                None => materialization(region_of.get(from), Some(&my_region)),
                            },
                        });
                    }
                    if let Some(producer) = region_of.get(from) {
                        let pr = regions
                            .iter_mut()
                            .find(|x| &x.id == producer)
                            .expect("region");
                        if !pr.outputs.iter().any(|x| x == from) {
                            pr.outputs.push(from.to_string());
                        }
                    }
                }
            }
        }
        for s in &pl.sinks {
            if let Some(producer) = region_of.get(&s.input) {
                let pr = regions
                    .iter_mut()
                    .find(|x| &x.id == producer)
                    .expect("region");
                if !pr.outputs.iter().any(|x| x == &s.input) {
                    pr.outputs.push(s.input.clone());
                }
            }
            transitions.push(Transition {
                from: place(&s.input, &region_of),
                to: format!("sink:{}", s.id),
                relation: s.input.clone(),
                materialization: materialization(region_of.get(&s.input), None),
            });
        }
        let transforms = self
            .order
            .iter()
            .map(|id| {
                let t = pl.transform(id).expect("exists");
                PlanTransform {
                    id: id.clone(),
                    inputs: t
                        .inputs
                        .iter()
                        .map(|(p, r)| (p.clone(), r.from().to_string()))
                        .collect(),
                    logic: self.logic[id].1.clone(),
                    backend: self.backend_of[id].name().to_string(),
                    region: region_of[id].clone(),
                    schema: schema_spec(&self.schemas[id]),
                }
            })
            .collect();
        let sinks = pl
            .sinks
            .iter()
            .map(|s| {
                let uri = &self.bindings[&s.asset];
                let guarantee = plugin::sink_provider(&uri.scheme)
                    .and_then(|p| p.capabilities(uri).ok())
                    .map(|c| c.guarantee)
                    .expect("checked in the capability phase");
                PlanSink {
                    id: s.id.clone(),
                    input: s.input.clone(),
                    asset: s.asset.clone(),
                    output_mode: s.output_mode.unwrap_or_default(),
                    write_mode: s.write_mode.unwrap_or_default(),
                    keys: s.keys.clone(),
                    schema: schema_spec(&self.schemas[&s.input]),
                    guarantee,
                }
            })
            .collect();
        let warnings = Diagnostics(
            self.diags
                .iter()
                .filter(|d| !d.is_error())
                .cloned()
                .collect(),
        );
        PipelinePlan {
            format: PLAN_FORMAT.into(),
            pipeline: pl.name.clone(),
            description: pl.description.clone(),
            profile: PlanProfile {
                name: prof.name.clone(),
                mode,
                on_error: prof.on_error,
                quarantine: prof.quarantine_uri().to_string(),
                trigger: prof.trigger,
                checkpoint: prof.checkpoint.clone(),
                watermark_policy: prof.watermark_policy,
                no_data_batches: prof.no_data_batches,
                require_guarantee: prof.require_guarantee,
                secrets: prof.secrets.clone(),
                state_ttl: if mode == ExecutionMode::Streaming {
                    prof.state_ttl.clone()
                } else {
                    IndexMap::new()
                },
                state_checkpoint_interval: prof
                    .state_checkpoint_interval
                    .filter(|_| mode == ExecutionMode::Streaming),
                quality_policies: prof.quality_policies.clone(),
            },
            assets,
            sources,
            transforms,
            sinks,
            regions,
            transitions,
            guarantees,
            warnings,
            provenance: Provenance {
                pipeline_file: self.p.pipeline_file.clone(),
                profile_file: self.p.profile_file.clone(),
                contracts: self.contract_files.clone(),
                plans: self.plan_files.clone(),
            },
            fingerprint: String::new(),
        }
        .seal()
    }
}

/// What the source bound to `uri` declares about reading an offset range again; a
/// source whose provider or capabilities are unknown is taken as not replayable.
fn source_guarantee(uri: &BindingUri) -> SourceGuarantee {
    plugin::source_provider(&uri.scheme)
        .and_then(|p| p.capabilities(uri).ok())
        .map_or(SourceGuarantee::NotReplayable, |c| c.guarantee)
}
