//! `diff` of two PipelinePlans: every added, removed and changed member, by path.
//!
//! Nodes are compared by id (not by position), so reordering sources does not show up as
//! a change; contracts and transform plans are compared by content.

use crate::plan::PipelinePlan;
use serde::Serialize;
use serde_json::{Map, Value};

/// What happened at a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Only in the new plan.
    Added,
    /// Only in the old plan.
    Removed,
    /// In both, with different values.
    Changed,
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// Added, removed or changed.
    pub kind: ChangeKind,
    /// Path, e.g. `transforms.clean.backend`.
    pub path: String,
    /// Old value (absent when added).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<Value>,
    /// New value (absent when removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<Value>,
}

/// The differences between two plans (empty when the fingerprints are equal).
pub fn diff(old: &PipelinePlan, new: &PipelinePlan) -> Vec<Change> {
    let mut out = Vec::new();
    if old.fingerprint == new.fingerprint {
        return out;
    }
    walk("", &keyed(old), &keyed(new), &mut out);
    out
}

/// A plan as JSON with node lists turned into maps keyed by id, and the DTCS plans'
/// action lists keyed by action id.
fn keyed(plan: &PipelinePlan) -> Value {
    let mut v = serde_json::to_value(plan).expect("plans serialise");
    let m = v.as_object_mut().expect("object");
    m.remove("fingerprint");
    m.remove("provenance");
    for key in ["sources", "transforms", "sinks", "regions"] {
        if let Some(Value::Array(items)) = m.remove(key) {
            let mut by_id = Map::new();
            for item in items {
                let id = item
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string();
                by_id.insert(id, item);
            }
            m.insert(key.into(), Value::Object(by_id));
        }
    }
    if let Some(Value::Object(ts)) = m.get_mut("transforms") {
        for t in ts.values_mut() {
            if let Some(Value::Array(actions)) =
                t.pointer_mut("/logic/plan/actions").map(Value::take)
            {
                let mut by_id = Map::new();
                for a in actions {
                    let id = a
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string();
                    by_id.insert(id, a);
                }
                if let Some(p) = t.pointer_mut("/logic/plan") {
                    p["actions"] = Value::Object(by_id);
                }
            }
        }
    }
    v
}

fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<Change>) {
    if a == b {
        return;
    }
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(ma), Value::Object(mb)) => {
            let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                match (ma.get(k), mb.get(k)) {
                    (Some(x), Some(y)) => walk(&join(k), x, y, out),
                    (Some(x), None) => out.push(Change {
                        kind: ChangeKind::Removed,
                        path: join(k),
                        old: Some(x.clone()),
                        new: None,
                    }),
                    (None, Some(y)) => out.push(Change {
                        kind: ChangeKind::Added,
                        path: join(k),
                        old: None,
                        new: Some(y.clone()),
                    }),
                    (None, None) => {}
                }
            }
        }
        _ => out.push(Change {
            kind: ChangeKind::Changed,
            path: path.to_string(),
            old: Some(a.clone()),
            new: Some(b.clone()),
        }),
    }
}

/// Renders changes as text lines (`+ path`, `- path`, `~ path: old → new`).
pub fn render_text(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "The plans are identical.\n".into();
    }
    let short = |v: &Option<Value>| {
        let s = v.as_ref().map(|v| v.to_string()).unwrap_or_default();
        if s.len() > 80 {
            format!(
                "{}…",
                &s[..s.char_indices().nth(77).map(|(i, _)| i).unwrap_or(s.len())]
            )
        } else {
            s
        }
    };
    let mut o = String::new();
    for c in changes {
        match c.kind {
            ChangeKind::Added => o.push_str(&format!("+ {}: {}\n", c.path, short(&c.new))),
            ChangeKind::Removed => o.push_str(&format!("- {}: {}\n", c.path, short(&c.old))),
            ChangeKind::Changed => o.push_str(&format!(
                "~ {}: {} → {}\n",
                c.path,
                short(&c.old),
                short(&c.new)
            )),
        }
    }
    o.push_str(&format!("{} change(s)\n", changes.len()));
    o
}
