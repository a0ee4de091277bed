//! Builds `dtcs.transform-plan/2` documents in ETLantic-py's dialect, so that plans we
//! emit load in ETLantic-py unchanged.

use super::action::{encode_action, Action};
use super::types::dtcs_type;
use super::TransformPlan;
use crate::diagnostics::Result;
use arrow::datatypes::Schema;
use indexmap::IndexMap;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// Builds a transform plan step by step. Each step applies to the *current* relation
/// (an input chosen with [`TransformPlanBuilder::from_input`], or the previous step).
#[derive(Clone, Debug)]
pub struct TransformPlanBuilder {
    transformation: String,
    inputs: IndexMap<String, Value>,
    actions: Vec<Value>,
    dependencies: Vec<Value>,
    outputs: IndexMap<String, Value>,
    current: Option<String>,
    root: String,
    counter: usize,
    uses_extensions: bool,
    uses_relational: bool,
}

impl TransformPlanBuilder {
    /// A plan for the transformation `id`.
    pub fn new(transformation: impl Into<String>) -> Self {
        TransformPlanBuilder {
            transformation: transformation.into(),
            inputs: IndexMap::new(),
            actions: Vec::new(),
            dependencies: Vec::new(),
            outputs: IndexMap::new(),
            current: None,
            root: String::new(),
            counter: 0,
            uses_extensions: false,
            uses_relational: false,
        }
    }

    /// Declares an input port with its schema; the first input becomes current.
    pub fn input(mut self, id: &str, schema: Option<&Schema>) -> Self {
        let mut v = json!({"id": id, "optional": false});
        if let Some(s) = schema {
            v["schema"] = schema_json(s);
        }
        self.inputs.insert(id.to_string(), v);
        if self.current.is_none() {
            self.current = Some(id.to_string());
            self.root = id.to_string();
        }
        self
    }

    /// Marks an input unbounded and records its streaming metadata as ETLantic vendor
    /// keys (`etlantic:eventTime`, `etlantic:watermark`).
    pub fn streaming_input(
        mut self,
        id: &str,
        event_time: Option<&str>,
        watermark_delay: Option<&str>,
    ) -> Self {
        if let Some(v) = self.inputs.get_mut(id) {
            v["streaming"] = json!({"mode": "unbounded"});
            if let Some(et) = event_time {
                v["etlantic:eventTime"] = json!(et);
                if let Some(d) = watermark_delay {
                    v["etlantic:watermark"] = json!({"field": et, "delay": d});
                }
            }
        }
        self
    }

    /// Makes an input (or an earlier step id) the current relation.
    pub fn from_input(mut self, relation: &str) -> Self {
        self.current = Some(relation.to_string());
        if self.inputs.contains_key(relation) {
            self.root = relation.to_string();
        }
        self
    }

    /// The id of the current relation (an input or the last step).
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    /// Appends an action applied to the current relation; returns its id through
    /// [`TransformPlanBuilder::current`].
    pub fn step(mut self, action: Action) -> Self {
        let target = self.current.clone().unwrap_or_default();
        let id_name = action.id();
        let params = encode_action(&action);
        let mut hasher = Sha256::new();
        hasher.update(
            serde_json::to_string(
                &json!({"action": id_name, "target": target, "parameters": params}),
            )
            .expect("JSON serialises")
            .as_bytes(),
        );
        let hash = hex::encode(hasher.finalize());
        self.counter += 1;
        let suffix = id_name.split(':').nth(1).unwrap_or(id_name);
        let id = format!("{}__a{}_{}_{}", self.root, self.counter, suffix, &hash[..8]);
        let mut kind = Map::new();
        kind.insert("action".into(), json!(id_name));
        kind.insert("id".into(), json!(id));
        kind.insert("kind".into(), json!("semanticAction"));
        if let Some(p) = params {
            kind.insert("parameters".into(), p);
        }
        kind.insert("target".into(), json!(target));
        self.actions.push(json!({"id": id, "kind": Value::Object(kind), "objectRef": format!("semanticActions.{id}")}));
        self.dependencies
            .push(json!({"from": target, "reason": "fieldRead", "to": id}));
        for other in action.secondary_inputs() {
            self.dependencies
                .push(json!({"from": other, "reason": "fieldRead", "to": id}));
        }
        if id_name.starts_with("etlantic:")
            || matches!(
                &action,
                Action::Join {
                    time_range: Some(_),
                    ..
                }
            )
        {
            self.uses_extensions = true;
        }
        if matches!(
            action,
            Action::Join { .. }
                | Action::Union { .. }
                | Action::Aggregate { .. }
                | Action::Sort { .. }
                | Action::Distinct { .. }
                | Action::Deduplicate { .. }
                | Action::Limit { .. }
        ) {
            self.uses_relational = true;
        }
        self.current = Some(id);
        self
    }

    /// Declares an output port fed by the current relation.
    pub fn output(mut self, id: &str, schema: Option<&Schema>) -> Self {
        let mut v = json!({"id": id});
        if let Some(s) = schema {
            v["schema"] = schema_json(s);
        }
        self.outputs.insert(id.to_string(), v);
        let from = self.current.clone().unwrap_or_default();
        self.dependencies
            .push(json!({"from": from, "reason": "lineage", "to": id}));
        self
    }

    /// The plan document as JSON.
    pub fn to_value(&self) -> Value {
        let profile = if self.uses_relational || self.uses_extensions {
            dtcs::RELATIONAL_PROFILE
        } else {
            dtcs::KERNEL_PROFILE
        };
        let mut v = json!({
            "planIdentity": dtcs::TRANSFORM_PLAN_IDENTITY,
            "profile": profile,
            "specificationVersion": dtcs::SPEC_VERSION,
            "registryVersions": {"actions": "3.0.0", "functions": "3.0.0", "operators": "1.0.0", "types": "1.0.0"},
            "transformation": self.transformation,
            "inputs": self.inputs,
            "parameters": {},
            "actions": self.actions,
            "outputs": self.outputs,
            "rules": [],
            "lineage": [],
            "requirements": {
                "planIdentity": dtcs::TRANSFORM_PLAN_IDENTITY,
                "dependencies": self.dependencies,
                "regexGrammar": "dtcs-regex/1",
                "formatGrammar": "dtcs-format/1",
                "unicodeVersion": "unicode-15.1",
                "timezoneData": "iana-2025b",
                "randomAlgorithm": "xorshift64star/1",
                "errorMode": "fail",
            },
            "errorMode": "fail",
        });
        if self.uses_extensions {
            v["extensions"] =
                json!({"etlantic:extensions": "https://etlantic.dev/dtcs-extensions/1"});
        }
        v
    }

    /// Builds and checks the plan.
    pub fn build(&self) -> Result<TransformPlan> {
        TransformPlan::from_value(&self.to_value(), &self.transformation)
    }
}

/// `{"fields": [{name, nullable, type}]}` for an Arrow schema.
pub fn schema_json(schema: &Schema) -> Value {
    json!({"fields": schema.fields().iter().map(|f| json!({
        "name": f.name(), "nullable": f.is_nullable(), "type": dtcs_type(f.data_type()),
    })).collect::<Vec<_>>()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Action, Expr, JoinType};
    use arrow::datatypes::{DataType, Field};

    #[test]
    fn builds_a_chained_plan() {
        let schema = Schema::new(vec![Field::new("a", DataType::Int64, true)]);
        let b = TransformPlanBuilder::new("t")
            .input("orders", Some(&schema))
            .input("dim", None)
            .step(Action::Filter {
                predicate: Expr::parse("a > 1").unwrap(),
            })
            .step(Action::Join {
                right: "dim".into(),
                join_type: JoinType::Left,
                left_keys: vec!["a".into()],
                right_keys: vec!["a".into()],
                predicate: None,
                null_safe: false,
                time_range: None,
            })
            .output("result", None);
        let plan = b.build().unwrap();
        let d = plan.decoded();
        assert_eq!(d.steps.len(), 2);
        assert_eq!(d.steps[1].target, d.steps[0].id);
        assert_eq!(d.outputs["result"], d.steps[1].id);
        assert!(d.steps[0].id.starts_with("orders__a1_filter_"));
        assert_eq!(plan.profile(), dtcs::RELATIONAL_PROFILE);
        // Same input, same bytes.
        assert_eq!(plan.fingerprint(), b.build().unwrap().fingerprint());
    }
}
