//! The plan compiler: a DTCS [`DecodedPlan`] → one Polars [`LazyFrame`] per output.
//!
//! Steps run in the order the plan decoded them. Each reads relations by name (a plan
//! input or an earlier step id), applies its action (see [`crate::actions`]) with its
//! parameter references bound, and publishes its result under its own id.

use crate::actions;
use crate::relation::Relation;
use etlantic_core::ir::DecodedPlan;
use etlantic_core::Result;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::HashMap;

/// Compiles `plan` over `inputs` (a relation per plan input id) and returns the relation
/// published by the plan output port `output`.
pub(crate) fn compile_plan(
    plan: &DecodedPlan,
    parameters: &IndexMap<String, Value>,
    inputs: HashMap<String, Relation>,
    output: &str,
) -> Result<Relation> {
    plan.evaluate(
        parameters,
        inputs,
        output,
        |_, action, target, secondary| actions::apply(action, target, secondary),
    )
}
