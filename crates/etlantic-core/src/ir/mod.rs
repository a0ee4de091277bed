//! The portable transformation IR: DTCS's `dtcs.transform-plan/2`.
//!
//! A [`TransformPlan`] holds the plan document exactly as the `dtcs` crate reads it
//! ([`dtcs::PortablePlan`], checked with `from_json_migrating` and `validate_budgets`) and
//! a decoded view of it ([`DecodedPlan`]) that engines compile: the actions in execution
//! order, each reading named relations, and the relation each output port publishes.
//!
//! The decoded view is not a second IR; it is derived from the document and never
//! serialised. Plans reach us in two dialects and both decode:
//! - ETLantic-py's: each action targets an input port or an *earlier action id*
//!   (a chain of relations), and the output is the relation named by the `lineage`
//!   dependency of the output port;
//! - the `dtcs` crate's export: actions target *interface ids* and transform them in
//!   place, in the order of `requirements.dependencies`.
//!
//! ETLantic's streaming extensions are vendor actions (`etlantic:window_aggregate`,
//! `etlantic:deduplicate_within_watermark`) and vendor keys on inputs
//! (`etlantic:eventTime`, `etlantic:watermark`), as DTCS's extensibility model
//! prescribes (`vendor:key`). See `docs/dtcs-extensions.md`.

pub mod action;
pub mod builder;
pub mod column_lineage;
pub mod columns;
pub mod envelope;
pub mod expr;
pub mod keys;
pub mod lineage;
pub mod numeric;
pub mod types;

pub use action::{
    Action, ActionNode, AggFunc, Aggregate, JoinTimeRange, JoinType, NamedExpr, SortKey,
    WindowField, WindowKind, WindowSpec, WINDOW_FUNCTIONS,
};
pub use builder::TransformPlanBuilder;
pub use expr::{BinaryOp, Expr, Literal, UnaryOp};

use crate::diagnostics::{codes, Diagnostic, Error, Result};
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A field declared on a plan input or output (`schema.fields[]`).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanField {
    /// Column name.
    pub name: String,
    /// DTCS logical type (`integer`, `decimal`, `string`, `datetime`, ...).
    pub dtcs_type: String,
    /// Whether nulls are allowed.
    pub nullable: bool,
}

/// A declared plan input.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// The input id (the transformation's port name).
    pub id: String,
    /// Declared fields (may be empty).
    pub fields: Vec<PlanField>,
    /// Whether the plan declares the input unbounded (`streaming.mode: unbounded`).
    pub unbounded: bool,
}

/// The decoded, executable view of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedPlan {
    /// Inputs, in declaration order.
    pub inputs: Vec<PlanInput>,
    /// Actions in execution order. `target` and secondary inputs name relations: an
    /// input id or the id of an earlier step (whose result it reads).
    pub steps: Vec<ActionNode>,
    /// Output port → the relation it publishes.
    pub outputs: IndexMap<String, String>,
    /// Declared output fields per output port (informative: ETLantic-py writes them
    /// loosely, so they are not enforced).
    pub output_fields: IndexMap<String, Vec<PlanField>>,
}

impl DecodedPlan {
    /// The relation the output port `output` publishes (`ETL208` when there is no such
    /// port).
    pub fn published(&self, output: &str) -> Result<&str> {
        self.outputs.get(output).map(String::as_str).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_PORT,
                format!(
                    "the plan has no output `{output}` (outputs: {})",
                    self.outputs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// Runs the plan's actions in order over `inputs` (a relation per plan input id) and
    /// returns the relation the output port `output` publishes. Every engine compiles a
    /// plan this way; `apply` computes one action, its parameters already bound, from
    /// the relation it targets and its secondary input (a join's right side, a union's
    /// other side). Errors without a path get `steps[<action id>]`; a relation that is
    /// neither an input nor an earlier action is `ETL201`.
    pub fn evaluate<R: Clone>(
        &self,
        parameters: &IndexMap<String, Value>,
        inputs: impl IntoIterator<Item = (String, R)>,
        output: &str,
        mut apply: impl FnMut(&ActionNode, &Action, R, Option<R>) -> Result<R>,
    ) -> Result<R> {
        let published = self.published(output)?;
        let mut relations: HashMap<String, R> = inputs.into_iter().collect();
        for step in &self.steps {
            let path = format!("steps[{}]", step.id);
            let with_path =
                |e: Error| e.map_diagnostics(|d| if d.path.is_empty() { d.at(&path) } else { d });
            let action = step.op.bind_parameters(parameters).map_err(with_path)?;
            let lookup = |name: &str| {
                relations.get(name).cloned().ok_or_else(|| {
                    with_path(Error::new(
                        &codes::UNKNOWN_NODE,
                        format!("step `{}` reads unknown relation `{name}`", step.id),
                    ))
                })
            };
            let target = lookup(&step.target)?;
            let secondary = action
                .secondary_inputs()
                .first()
                .map(|s| lookup(s))
                .transpose()?;
            let result = apply(step, &action, target, secondary).map_err(with_path)?;
            relations.insert(step.id.clone(), result);
        }
        relations.remove(published).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_NODE,
                format!("output `{output}` publishes unknown relation `{published}`"),
            )
        })
    }

    /// Ids of all registry entries used (actions and functions), sorted.
    pub fn registry_ids(&self) -> (Vec<String>, Vec<String>) {
        let mut actions: Vec<String> = self.steps.iter().map(|s| s.action.clone()).collect();
        actions.sort();
        actions.dedup();
        let mut functions: Vec<String> = self
            .steps
            .iter()
            .flat_map(|s| s.op.expressions().into_iter().flat_map(|e| e.functions()))
            .chain(self.steps.iter().flat_map(|s| match &s.op {
                Action::Aggregate { aggregates, .. }
                | Action::WindowAggregate { aggregates, .. } => {
                    aggregates.iter().map(|a| a.func.id().to_string()).collect()
                }
                _ => vec![],
            }))
            .collect();
        functions.sort();
        functions.dedup();
        (actions, functions)
    }
}

/// The byte budget of a plan document: the `dtcs` crate's (8 MiB), which it does not
/// export; a larger document is left to it to refuse.
const MAX_PLAN_BYTES: usize = 8 * 1024 * 1024;

/// A loaded `dtcs.transform-plan/2` document and its decoded view.
#[derive(Clone, Debug)]
pub struct TransformPlan {
    portable: dtcs::PortablePlan,
    decoded: DecodedPlan,
}

fn plan_error(origin: &str, msg: impl std::fmt::Display) -> Error {
    Diagnostic::new(&codes::TRANSFORM_PLAN_INVALID, format!("{origin}: {msg}"))
        .in_file(origin)
        .into()
}

/// The canonical id of a DTCS or ETLantic action id: the id the decoded [`Action`]
/// reports ([`Action::id`]). The aliases the IR decodes map to it — `dtcs:select` is
/// `dtcs:filter`, `dtcs:group` is `dtcs:aggregate`, the field actions
/// (`dtcs:lowercase`, `dtcs:uppercase`, `dtcs:trim`) are `dtcs:with_fields` — and any
/// other id is its own. Backends declare canonical ids only.
pub fn canonical_action_id(id: &str) -> &str {
    match id {
        "dtcs:select" => "dtcs:filter",
        "dtcs:group" => "dtcs:aggregate",
        _ if FIELD_ACTIONS.iter().any(|(a, _)| *a == id) => "dtcs:with_fields",
        other => other,
    }
}

/// Field actions of DTCS that target `interface.field` and rewrite one column.
const FIELD_ACTIONS: &[(&str, &str)] = &[
    ("dtcs:lowercase", "dtcs:lower"),
    ("dtcs:uppercase", "dtcs:upper"),
    ("dtcs:trim", "dtcs:trim"),
];

impl TransformPlan {
    /// Reads a plan from JSON (v1 plans are migrated, as the `dtcs` crate does). A
    /// `dtcs.transform-plan/2` document may leave out its envelope — `profile`,
    /// `specificationVersion`, `transformation`, `errorMode` — as the plans ETLantic-py's
    /// compilers take do: see [`envelope`] for the defaults and the checks of values
    /// that are given.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self> {
        let completed = match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(mut doc)) if bytes.len() <= MAX_PLAN_BYTES => {
                envelope::complete(&mut doc, origin)?;
                Some(serde_json::to_vec(&doc).expect("JSON values serialise"))
            }
            // Not an object, or too large: the `dtcs` crate says what is wrong.
            _ => None,
        };
        let portable =
            dtcs::PortablePlan::from_json_migrating(completed.as_deref().unwrap_or(bytes))
                .map_err(|e| plan_error(origin, e))?;
        Self::from_portable(portable, origin)
    }

    /// Reads a plan from YAML (the same document as JSON, in YAML syntax).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self> {
        let value: Value = serde_yaml::from_str(text).map_err(|e| plan_error(origin, e))?;
        let bytes = serde_json::to_vec(&value).expect("JSON values serialise");
        Self::from_json(&bytes, origin)
    }

    /// Reads a plan from a JSON value.
    pub fn from_value(value: &Value, origin: &str) -> Result<Self> {
        Self::from_json(
            &serde_json::to_vec(value).expect("JSON values serialise"),
            origin,
        )
    }

    /// Wraps a plan document, checking budgets and decoding it.
    pub fn from_portable(portable: dtcs::PortablePlan, origin: &str) -> Result<Self> {
        portable
            .validate_budgets()
            .map_err(|e| plan_error(origin, e))?;
        if portable.plan_identity != dtcs::TRANSFORM_PLAN_IDENTITY {
            return Err(plan_error(
                origin,
                format!("unsupported plan identity `{}`", portable.plan_identity),
            ));
        }
        envelope::check(&portable, origin)?;
        if !portable.rules.is_empty() {
            return Err(plan_error(
                origin,
                "plans with `rules` are not supported; express checks as contract quality rules",
            ));
        }
        let decoded = decode(&portable).map_err(|e| plan_error(origin, e))?;
        Ok(TransformPlan { portable, decoded })
    }

    /// The plan document.
    pub fn portable(&self) -> &dtcs::PortablePlan {
        &self.portable
    }

    /// The decoded view.
    pub fn decoded(&self) -> &DecodedPlan {
        &self.decoded
    }

    /// The plan as a JSON value (as written, not canonicalised).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(&self.portable).expect("plans serialise")
    }

    /// The canonical JSON bytes (the `dtcs` crate's canonical form).
    pub fn canonical_json(&self) -> Vec<u8> {
        self.portable.to_canonical_json().expect("plans serialise")
    }

    /// The `dtcs` fingerprint: SHA-256 hex of the canonical bytes.
    pub fn fingerprint(&self) -> String {
        self.portable.fingerprint().expect("plans serialise")
    }

    /// The transformation id.
    pub fn transformation(&self) -> &str {
        &self.portable.transformation
    }

    /// The declared DTCS profile.
    pub fn profile(&self) -> &str {
        &self.portable.profile
    }

    /// Vendor keys of an input (e.g. `etlantic:watermark`).
    pub fn input_extension(&self, input: &str, key: &str) -> Option<&Value> {
        self.portable.inputs.get(input).and_then(|i| i.get(key))
    }
}

fn decode_fields(v: Option<&Value>) -> Vec<PlanField> {
    v.and_then(|s| s.get("fields"))
        .and_then(Value::as_array)
        .map(|fields| {
            fields
                .iter()
                .filter_map(|f| {
                    Some(PlanField {
                        name: f.get("name")?.as_str()?.to_string(),
                        dtcs_type: f
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("string")
                            .to_string(),
                        nullable: f.get("nullable").and_then(Value::as_bool).unwrap_or(true),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(p: &dtcs::PortablePlan) -> std::result::Result<DecodedPlan, String> {
    let inputs: Vec<PlanInput> = p
        .inputs
        .iter()
        .map(|(id, v)| PlanInput {
            id: v
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or(id)
                .to_string(),
            fields: decode_fields(v.get("schema")),
            unbounded: v
                .get("streaming")
                .and_then(|s| s.get("mode"))
                .and_then(Value::as_str)
                == Some("unbounded"),
        })
        .collect();
    let input_ids: HashSet<&str> = inputs.iter().map(|i| i.id.as_str()).collect();

    // Decode every action node.
    let mut nodes: Vec<ActionNode> = Vec::new();
    for raw in &p.actions {
        let kind = raw.get("kind").ok_or("action without `kind`")?;
        let id = raw
            .get("id")
            .or_else(|| kind.get("id"))
            .and_then(Value::as_str)
            .ok_or("action without `id`")?
            .to_string();
        match kind.get("kind").and_then(Value::as_str) {
            Some("semanticAction") | None => {}
            Some(other) => return Err(format!("action `{id}`: unsupported node kind `{other}`")),
        }
        let action = kind
            .get("action")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("action `{id}` without `action`"))?;
        let target = kind
            .get("target")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("action `{id}` without `target`"))?
            .to_string();
        let empty = serde_json::Map::new();
        let params = kind
            .get("parameters")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        if let Some((_, func)) = FIELD_ACTIONS.iter().find(|(a, _)| *a == action) {
            let (relation, field) = target.split_once('.').ok_or_else(|| {
                format!("action `{id}`: `{action}` needs a `relation.field` target")
            })?;
            nodes.push(ActionNode {
                id,
                action: action.to_string(),
                target: relation.to_string(),
                op: Action::WithFields {
                    assignments: vec![NamedExpr {
                        name: field.to_string(),
                        expr: Expr::Call {
                            function: func.to_string(),
                            args: vec![Expr::col(field)],
                        },
                    }],
                },
            });
            continue;
        }
        let op =
            action::decode_action(action, params).map_err(|e| format!("action `{id}`: {e}"))?;
        nodes.push(ActionNode {
            id,
            action: action.to_string(),
            target,
            op,
        });
    }
    let node_ids: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    if node_ids.len() != nodes.len() {
        return Err("duplicate action ids".into());
    }
    for n in &nodes {
        for r in std::iter::once(n.target.as_str()).chain(n.op.secondary_inputs()) {
            if !input_ids.contains(r) && !node_ids.contains_key(r) {
                return Err(format!("action `{}` reads unknown relation `{r}`", n.id));
            }
        }
    }

    let deps: Vec<(String, String, String)> = p
        .requirements
        .get("dependencies")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|d| {
                    Some((
                        d.get("from")?.as_str()?.to_string(),
                        d.get("to")?.as_str()?.to_string(),
                        d.get("reason")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let lineage: BTreeMap<&str, &str> = deps
        .iter()
        .filter(|(_, _, r)| r == "lineage")
        .map(|(f, t, _)| (t.as_str(), f.as_str()))
        .collect();

    // Chained (ETLantic-py) or in-place (dtcs crate) dialect.
    let chained = nodes.iter().any(|n| {
        std::iter::once(n.target.as_str())
            .chain(n.op.secondary_inputs())
            .any(|r| node_ids.contains_key(r))
    }) || lineage.values().any(|f| node_ids.contains_key(f));

    // Topological order: explicit dependencies between actions, plus reads of action
    // results; ties keep document order.
    let n = nodes.len();
    let mut succ: Vec<Vec<usize>> = vec![vec![]; n];
    let mut indeg = vec![0usize; n];
    let add_edge = |a: usize, b: usize, succ: &mut Vec<Vec<usize>>, indeg: &mut Vec<usize>| {
        if a != b && !succ[a].contains(&b) {
            succ[a].push(b);
            indeg[b] += 1;
        }
    };
    for (f, t, _) in &deps {
        if let (Some(&a), Some(&b)) = (node_ids.get(f.as_str()), node_ids.get(t.as_str())) {
            add_edge(a, b, &mut succ, &mut indeg);
        }
    }
    for (b, node) in nodes.iter().enumerate() {
        for r in std::iter::once(node.target.as_str()).chain(node.op.secondary_inputs()) {
            if let Some(&a) = node_ids.get(r) {
                add_edge(a, b, &mut succ, &mut indeg);
            }
        }
    }
    if !chained {
        // In-place dialect without explicit order: writers of one interface run in id
        // order, as the dtcs crate's planner chains them.
        let mut by_target: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            by_target.entry(node.target.as_str()).or_default().push(i);
        }
        for writers in by_target.values() {
            let mut sorted = writers.clone();
            sorted.sort_by(|a, b| nodes[*a].id.cmp(&nodes[*b].id));
            for w in sorted.windows(2) {
                if !succ[w[0]].contains(&w[1]) && !reachable(&succ, w[1], w[0]) {
                    add_edge(w[0], w[1], &mut succ, &mut indeg);
                }
            }
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|i| indeg[*i] == 0).collect();
    while let Some(&i) = ready.iter().next() {
        ready.remove(&i);
        order.push(i);
        for &j in &succ[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() != n {
        return Err("the actions' dependencies form a cycle".into());
    }

    // Resolve every relation name to the relation (input or step) it denotes.
    let mut current: HashMap<String, String> = input_ids
        .iter()
        .map(|i| (i.to_string(), i.to_string()))
        .collect();
    let mut steps = Vec::with_capacity(n);
    for i in order {
        let mut node = nodes[i].clone();
        let resolve = |r: &str, current: &HashMap<String, String>| -> String {
            if chained {
                r.to_string()
            } else {
                current.get(r).cloned().unwrap_or_else(|| r.to_string())
            }
        };
        let target_name = node.target.clone();
        node.target = resolve(&target_name, &current);
        let snapshot = current.clone();
        node.op.map_secondary(|r| resolve(r, &snapshot));
        if !chained {
            current.insert(target_name, node.id.clone());
        }
        current.insert(node.id.clone(), node.id.clone());
        steps.push(node);
    }

    let mut outputs = IndexMap::new();
    let mut output_fields = IndexMap::new();
    for (id, v) in &p.outputs {
        let from = match lineage.get(id.as_str()) {
            Some(f) => current
                .get(*f)
                .cloned()
                .ok_or_else(|| format!("output `{id}` derives from unknown relation `{f}`"))?,
            None => match (chained, steps.last(), inputs.first()) {
                (true, Some(last), _) => last.id.clone(),
                (false, _, Some(first)) => current[&first.id].clone(),
                (_, None, Some(first)) => first.id.clone(),
                _ => {
                    return Err(format!(
                        "output `{id}` has no lineage and the plan has no input"
                    ))
                }
            },
        };
        outputs.insert(id.clone(), from);
        output_fields.insert(id.clone(), decode_fields(v.get("schema")));
    }
    if outputs.is_empty() {
        return Err("the plan declares no output".into());
    }
    Ok(DecodedPlan {
        inputs,
        steps,
        outputs,
        output_fields,
    })
}

fn reachable(succ: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut stack = vec![from];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if x == to {
            return true;
        }
        if seen.insert(x) {
            stack.extend(&succ[x]);
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(id: &str, action: &str, target: &str, params: Value) -> Value {
        json!({"id": id, "kind": {"action": action, "id": id, "kind": "semanticAction", "parameters": params, "target": target}, "objectRef": format!("semanticActions.{id}")})
    }

    fn plan(actions: Vec<Value>, deps: Value) -> Value {
        json!({
            "planIdentity": "dtcs.transform-plan/2", "profile": "dtcs:profile/portable-relational/2",
            "specificationVersion": "3.0.0", "transformation": "t",
            "inputs": {"orders": {"id": "orders", "optional": false, "schema": {"fields": [{"name": "a", "type": "integer", "nullable": true}]}},
                       "dim": {"id": "dim", "optional": false}},
            "actions": actions, "outputs": {"result": {"id": "result"}},
            "requirements": {"dependencies": deps}, "errorMode": "fail"
        })
    }

    #[test]
    fn chained_dialect() {
        let p = plan(
            vec![
                node(
                    "a2",
                    "dtcs:join",
                    "a1",
                    json!({"right": "dim", "leftKey": "a", "type": "left"}),
                ),
                node("a1", "dtcs:filter", "orders", json!({"predicate": "a > 1"})),
            ],
            json!([{"from": "a2", "to": "result", "reason": "lineage"}]),
        );
        let t = TransformPlan::from_value(&p, "t.json").unwrap();
        let d = t.decoded();
        assert_eq!(
            d.steps.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            vec!["a1", "a2"]
        );
        assert_eq!(d.outputs["result"], "a2");
        assert_eq!(t.fingerprint().len(), 64);
    }

    #[test]
    fn in_place_dialect() {
        let p = plan(
            vec![
                node(
                    "b",
                    "dtcs:sort",
                    "orders",
                    json!({"keys": [{"field": "a"}]}),
                ),
                node("a", "dtcs:filter", "orders", json!({"predicate": "a > 1"})),
            ],
            json!([{"from": "orders", "to": "result", "reason": "lineage"}]),
        );
        let t = TransformPlan::from_value(&p, "t.json").unwrap();
        let d = t.decoded();
        assert_eq!(d.steps[0].id, "a");
        assert_eq!(d.steps[1].target, "a");
        assert_eq!(d.outputs["result"], "b");
    }

    #[test]
    fn broken_plans_are_diagnosed() {
        let p = plan(
            vec![node(
                "a",
                "dtcs:filter",
                "nope",
                json!({"predicate": "a > 1"}),
            )],
            json!([]),
        );
        let e = TransformPlan::from_value(&p, "t.json").unwrap_err();
        assert_eq!(e.code(), "ETL006");
        assert!(e.to_string().contains("unknown relation `nope`"));
        let mut p = plan(vec![], json!([]));
        p["planIdentity"] = json!("dtcs.transform-plan/9");
        assert!(TransformPlan::from_value(&p, "t.json").is_err());
    }

    #[test]
    fn loads_every_etlantic_py_fixture() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/etlantic-py");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let plan = entry.unwrap().path().join("plan.json");
            if plan.exists() {
                let bytes = std::fs::read(&plan).unwrap();
                let t = TransformPlan::from_json(&bytes, &plan.display().to_string()).unwrap();
                let raw: Value = serde_json::from_slice(&bytes).unwrap();
                // The dtcs fingerprint of what we hold equals the one of the file.
                let direct = dtcs::PortablePlan::from_json_migrating(&bytes)
                    .unwrap()
                    .fingerprint()
                    .unwrap();
                assert_eq!(t.fingerprint(), direct);
                assert!(
                    !t.decoded().steps.is_empty() || raw["actions"].as_array().unwrap().is_empty()
                );
                n += 1;
            }
        }
        assert!(n >= 6, "found {n} fixtures");
    }
}
