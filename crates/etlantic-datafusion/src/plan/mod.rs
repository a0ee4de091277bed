//! The plan compiler: a DTCS [`DecodedPlan`] → one DataFusion data frame per output.
//!
//! Steps run in the order the plan decoded them. Each reads relations by name (a plan
//! input or an earlier step id), applies its action (see [`crate::actions`]) and
//! publishes its result under its own id. Parameter references are bound first; the
//! result of every step is analyzed (type coercion) before the next step sees it, so
//! type errors are reported at the step that causes them.

pub(crate) mod order;

use crate::actions;
use crate::relation::Relation;
use etlantic_core::ir::DecodedPlan;
use etlantic_core::Result;
use indexmap::IndexMap;
use order::Demand;
use serde_json::Value;
use std::collections::HashMap;

/// Compiles `plan` over `inputs` (relation per plan input id) and returns the relation
/// published by the plan output port `output`.
pub(crate) fn compile_plan(
    plan: &DecodedPlan,
    parameters: &IndexMap<String, Value>,
    inputs: HashMap<String, Relation>,
    output: &str,
) -> Result<Relation> {
    let published = plan.published(output)?;
    let demand = order::demands(plan, &[published]);
    plan.evaluate(
        parameters,
        inputs,
        output,
        |step, action, target, secondary| {
            let d = demand.get(&step.id).copied().unwrap_or(Demand::None);
            actions::apply(action, target, secondary, d).and_then(Relation::analyzed)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::scan;
    use arrow::array::{Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use etlantic_core::data::Table;
    use etlantic_core::ir::{Action, ActionNode, JoinType};
    use std::sync::Arc;

    fn int_table(name: &str, values: Vec<i64>) -> Table {
        let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, true)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(values))]).unwrap();
        Table::new(schema, vec![batch])
    }

    /// A decoded plan built in code can hold a join without any condition (the JSON
    /// decoder refuses it): outer joins then match every pair.
    #[tokio::test]
    async fn unconditional_outer_join_keeps_unmatched_rows() {
        let ctx = crate::session::new_context();
        let state = ctx.state();
        let mut relations = HashMap::new();
        relations.insert(
            "a".to_string(),
            Relation::scan(scan(&state, "a", &int_table("a", vec![1, 2])).unwrap()),
        );
        relations.insert(
            "b".to_string(),
            Relation::scan(scan(&state, "b", &int_table("b", vec![])).unwrap()),
        );
        let mut outputs = IndexMap::new();
        outputs.insert("result".to_string(), "j".to_string());
        let plan = DecodedPlan {
            inputs: vec![],
            steps: vec![ActionNode {
                id: "j".into(),
                action: "dtcs:join".into(),
                target: "a".into(),
                op: Action::Join {
                    right: "b".into(),
                    join_type: JoinType::Left,
                    left_keys: vec![],
                    right_keys: vec![],
                    predicate: None,
                    null_safe: false,
                    time_range: None,
                },
            }],
            outputs,
            output_fields: IndexMap::new(),
        };
        let rel = compile_plan(&plan, &IndexMap::new(), relations, "result").unwrap();
        let batches = rel.finish().unwrap().collect().await.unwrap();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 2);
        assert!(batches
            .iter()
            .all(|b| b.column(1).null_count() == b.num_rows()));
        let err = compile_plan(&plan, &IndexMap::new(), HashMap::new(), "result").unwrap_err();
        assert_eq!(err.code(), "ETL201");
        let err = compile_plan(&plan, &IndexMap::new(), HashMap::new(), "nope").unwrap_err();
        assert_eq!(err.code(), "ETL208");
    }
}
