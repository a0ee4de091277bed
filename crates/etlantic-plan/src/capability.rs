//! The capability phase for steps: a step is placed on a backend only if the backend
//! declares every action and function the step uses. We fail closed instead of guessing.
//! A function that is in no registry at all is reported as unknown (`ETL306`) instead.

use etlantic_core::diagnostics::{codes, Diagnostic, Result};
use etlantic_core::plugin::{Backend, RegionKind, StepLogic};

/// Checks that `backend` can run `logic` in a region of `kind`.
pub fn check_step(
    backend: &dyn Backend,
    step: &str,
    logic: &StepLogic,
    kind: RegionKind,
) -> Result<()> {
    let caps = backend.capabilities();
    match logic {
        StepLogic::Portable { plan, .. } => {
            let (actions, functions) = plan.decoded().registry_ids();
            // A function no registry knows is a semantic error (ETL306), not a gap of
            // this backend (ETL501).
            let unknown: Vec<&String> = functions
                .iter()
                .filter(|f| !caps.supports_function(f))
                .filter(|f| dtcs::registry::resolve_default(f).is_none())
                .filter(|f| !etlantic_core::ir::expr::ETLANTIC_PY_FUNCTIONS.contains(&f.as_str()))
                .collect();
            if !unknown.is_empty() {
                return Err(Diagnostic::new(
                    &codes::UNKNOWN_FUNCTION,
                    format!(
                        "`{step}` calls unknown function(s) {}: not in the DTCS function registry",
                        unknown
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .at(format!("transforms[{step}]"))
                .into());
            }
            let missing: Vec<String> = actions
                .iter()
                .filter(|a| !caps.supports_action_in(kind, a))
                .map(|a| format!("action {a}"))
                .chain(
                    functions
                        .iter()
                        .filter(|f| !caps.supports_function(f))
                        .map(|f| format!("function {f}")),
                )
                .collect();
            if !missing.is_empty() {
                return Err(Diagnostic::new(
                    &codes::BACKEND_UNSUPPORTED_ACTION,
                    format!(
                        "backend `{}` cannot run `{step}`{}: it does not support {}",
                        backend.name(),
                        if kind == RegionKind::Streaming {
                            " in a streaming region"
                        } else {
                            ""
                        },
                        missing.join(", ")
                    ),
                )
                .at(format!("transforms[{step}]"))
                .into());
            }
        }
        StepLogic::Sql { .. } => {
            if caps.sql_engines.is_empty() {
                return Err(Diagnostic::new(
                    &codes::BACKEND_UNSUPPORTED_ACTION,
                    format!(
                        "backend `{}` does not run SQL steps (`{step}`)",
                        backend.name()
                    ),
                )
                .at(format!("transforms[{step}].sql"))
                .into());
            }
        }
        StepLogic::Impl { .. } => {}
    }
    Ok(())
}
