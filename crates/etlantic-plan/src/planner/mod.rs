//! Validation phases and the planner.
//!
//! Phases run in order — structural, reference, semantic (contracts and port types),
//! streaming, capability, guarantee, policy — and planning stops after the first phase
//! that reports an error, so later phases never see a broken graph. Warnings of every
//! phase that ran are kept in the plan.

use crate::plan::*;
use crate::project::Project;
use crate::streaming_rules;
use arrow::datatypes::SchemaRef;
use etlantic_core::contract::Contract;
use etlantic_core::diagnostics::{Diagnostic, Diagnostics, Error, Result, Severity};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::ir::TransformPlan;
use etlantic_core::plugin::{self, Backend, StepLogic};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use indexmap::IndexMap;
use std::collections::HashMap;
use std::sync::Arc;

mod build;
mod capability;
mod guarantees;
mod locations;
mod references;
mod semantic;
mod structural;

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

    pub(super) fn logic_plans(&self) -> HashMap<String, Arc<TransformPlan>> {
        self.logic
            .iter()
            .filter_map(|(id, (l, _))| match l {
                StepLogic::Portable { plan, .. } => Some((id.clone(), plan.clone())),
                _ => None,
            })
            .collect()
    }

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
}

/// What the source bound to `uri` declares about reading an offset range again; a
/// source whose provider or capabilities are unknown is taken as not replayable.
fn source_guarantee(uri: &BindingUri) -> SourceGuarantee {
    plugin::source_provider(&uri.scheme)
        .and_then(|p| p.capabilities(uri).ok())
        .map_or(SourceGuarantee::NotReplayable, |c| c.guarantee)
}
