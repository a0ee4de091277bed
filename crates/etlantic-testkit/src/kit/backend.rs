//! The backend kit: runs the backend-equivalence corpus ([`crate::equivalence`]) and
//! ETLantic-py's portable conformance corpus on a [`Backend`] and holds it to what it
//! declares.
//!
//! For every case:
//! - when the backend declares every action and function the case uses (the planner's
//!   capability check passes), the case must run and give the reference rows, and the
//!   executed schema must be the one `output_schema` promised (`case:<name>`); refusing it
//!   then (`ETL501` from `output_schema`) is a capability that does not tell the truth;
//! - when it does not, a refusal is expected, and anything it runs anyway must be right.
//!
//! `coverage` lists the declared actions and functions no passing case exercised: they
//! are not failures (the corpus does not cover every function of every backend), but a
//! backend author should add cases for them (see `equivalence/README.md` of this crate).

use super::KitReport;
use crate::equivalence::etlantic_py::{self, PyCase};
use crate::equivalence::{run_case, BackendUnderTest, Case, Outcome};
use etlantic_core::plugin::{Backend, RegionKind};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Checks `backend` (its matrix label `label`, with the relative numeric `tolerance` it
/// documents) on both corpora.
pub async fn check_backend(label: &str, backend: Arc<dyn Backend>, tolerance: f64) -> KitReport {
    let mut report = KitReport::new(format!("backend `{label}`"));
    let under_test = BackendUnderTest::batch(label, backend.clone(), tolerance);
    let mut exercised: BTreeSet<String> = BTreeSet::new();
    let cases = match Case::load_dir(&crate::equivalence::corpus_dir()) {
        Ok(c) => c,
        Err(e) => {
            report.fail("kit", format!("the equivalence corpus does not load: {e}"));
            return report;
        }
    };
    for case in &cases {
        let declared = match crate::equivalence::runner::step_task(case) {
            Ok(task) => {
                let ok = etlantic_plan::capability::check_step(
                    backend.as_ref(),
                    &task.id,
                    &task.logic,
                    RegionKind::Batch,
                )
                .is_ok();
                (ok, ids_of(&task.logic))
            }
            Err(e) => {
                report.fail(&format!("case:{}", case.name), e);
                continue;
            }
        };
        let outcome = run_case(case, &under_test).await;
        judge(&mut report, &case.name, declared.0, &outcome);
        if outcome == Outcome::Pass {
            exercised.extend(declared.1);
        }
    }
    match etlantic_py::load_corpus(&etlantic_py::corpus_path()) {
        Ok(py) => {
            for case in &py {
                let declared = py_declared(case, backend.as_ref());
                let outcome = etlantic_py::run_py_case(case, &under_test).await;
                judge(
                    &mut report,
                    &format!("etlantic-py:{}", case.name),
                    declared.0 && !case.expect_unsupported,
                    &outcome,
                );
                if outcome == Outcome::Pass {
                    exercised.extend(declared.1);
                }
            }
        }
        Err(e) => report.fail("kit", format!("ETLantic-py's corpus does not load: {e}")),
    }
    let caps = backend.capabilities();
    let unexercised: Vec<String> = caps
        .actions
        .iter()
        .chain(&caps.functions)
        .filter(|id| !exercised.contains(*id))
        .cloned()
        .collect();
    report.coverage = unexercised;
    report
}

/// Records one case: a declared case must pass; an undeclared one may be refused.
fn judge(report: &mut KitReport, name: &str, declared: bool, outcome: &Outcome) {
    let check = format!("case:{name}");
    match outcome {
        Outcome::Pass => report.pass(&check),
        Outcome::Unsupported(why) if declared => report.fail(
            &check,
            format!(
                "the backend declares every action and function of the case, yet refused it: {why}"
            ),
        ),
        Outcome::Unsupported(_) => report.pass(&check),
        Outcome::Fail(why) => report.fail(&check, why.clone()),
    }
}

/// The registry ids (actions and functions) a step uses.
fn ids_of(logic: &etlantic_core::plugin::StepLogic) -> Vec<String> {
    match logic {
        etlantic_core::plugin::StepLogic::Portable { plan, .. } => {
            let (actions, functions) = plan.decoded().registry_ids();
            actions
                .into_iter()
                .map(|a| etlantic_core::ir::canonical_action_id(&a).to_string())
                .chain(functions)
                .collect()
        }
        _ => vec![],
    }
}

/// Whether the backend declares everything an ETLantic-py case uses, and those ids.
fn py_declared(case: &PyCase, backend: &dyn Backend) -> (bool, Vec<String>) {
    let Ok(plan) = etlantic_core::ir::TransformPlan::from_value(&case.plan, &case.name) else {
        return (false, vec![]);
    };
    let logic = etlantic_core::plugin::StepLogic::Portable {
        plan: Arc::new(plan),
        parameters: case.parameters.clone(),
        output: String::new(),
    };
    let ok = etlantic_plan::capability::check_step(backend, &case.name, &logic, RegionKind::Batch)
        .is_ok();
    (ok, ids_of(&logic))
}
