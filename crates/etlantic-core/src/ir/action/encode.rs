//! Encoding actions back into plan parameters in ETLantic-py's dialect, the inverse of
//! [`super::decode_action`].

use super::{
    Action, Aggregate, JoinTimeRange, NamedExpr, SortKey, WindowKind, WindowSpec, JOIN_TIME_RANGE,
};
use crate::ir::expr::Expr;
use crate::streaming::Duration;
use serde_json::{json, Value};

/// Encodes a time range as `{left, right, lower, upper}`.
pub fn encode_time_range(r: &JoinTimeRange) -> Value {
    json!({"left": r.left, "right": r.right, "lower": r.lower.to_string(), "upper": r.upper.to_string()})
}

fn encode_window(w: &WindowSpec) -> Value {
    let mut v = match &w.kind {
        WindowKind::Tumbling { size } => {
            json!({"type": "tumbling", "timeField": w.time_column, "size": size.to_string()})
        }
        WindowKind::Sliding { size, slide } => json!({
            "type": "sliding", "timeField": w.time_column,
            "size": size.to_string(), "slide": slide.to_string(),
        }),
        WindowKind::Session { gap } => {
            json!({"type": "session", "timeField": w.time_column, "gap": gap.to_string()})
        }
    };
    // Written only when set, so plans without it keep their bytes (and fingerprints).
    if w.allowed_lateness > Duration::ZERO {
        v["allowedLateness"] = json!(w.allowed_lateness.to_string());
    }
    v
}

fn encode_named(items: &[NamedExpr]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|n| match &n.expr {
                Expr::Column(c) if *c == n.name => json!(c),
                e => json!({"name": n.name, "expression": e.encode()}),
            })
            .collect(),
    )
}

fn encode_aggregates(items: &[Aggregate]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|a| {
                let mut args: Vec<Value> = a.arg.iter().map(Expr::encode).collect();
                if let Some(mode) = a.func.mode() {
                    args.push(
                        json!({"kind": "literal", "value": {"type": "string", "value": mode}}),
                    );
                }
                json!({"name": a.name, "expression": {
                    "kind": "call", "callee": a.func.id(), "args": args,
                }})
            })
            .collect(),
    )
}

fn encode_sort_keys(keys: &[SortKey]) -> Value {
    Value::Array(
        keys.iter()
            .map(|k| {
                let mut v = json!({"expression": k.expr.encode(), "direction": if k.descending { "desc" } else { "asc" }});
                if k.nulls_first {
                    v["nulls"] = json!("first");
                }
                v
            })
            .collect(),
    )
}

fn one_or_many(keys: &[String]) -> Value {
    if keys.len() == 1 {
        json!(keys[0])
    } else {
        json!(keys)
    }
}

/// Encodes an action's parameters in ETLantic-py's dialect (`None`: no parameters).
pub fn encode_action(action: &Action) -> Option<Value> {
    Some(match action {
        Action::Filter { predicate } => json!({"predicate": predicate.encode()}),
        Action::Project { fields } => json!({"fields": encode_named(fields)}),
        Action::WithFields { assignments } => json!({"assignments": Value::Array(
            assignments.iter().map(|a| json!({"name": a.name, "expression": a.expr.encode()})).collect())}),
        Action::DropFields {
            fields,
            ignore_missing,
        } => {
            let mut v = json!({"fields": fields});
            if *ignore_missing {
                v["missingPolicy"] = json!("ignore");
            }
            v
        }
        Action::RenameFields { mapping } => json!({"mapping": mapping}),
        Action::Join {
            right,
            join_type,
            left_keys,
            right_keys,
            predicate,
            null_safe,
            time_range,
        } => {
            let mut v = json!({"right": right, "type": join_type.name(), "nullSafe": null_safe, "collisionPolicy": "fail"});
            if !left_keys.is_empty() {
                v["leftKey"] = one_or_many(left_keys);
                v["rightKey"] = one_or_many(right_keys);
            }
            if let Some(p) = predicate {
                v["predicate"] = p.encode();
            }
            if let Some(r) = time_range {
                v[JOIN_TIME_RANGE] = encode_time_range(r);
            }
            v
        }
        Action::Union {
            other,
            by_name,
            allow_missing,
            distinct,
        } => {
            let mut v = json!({"other": other, "mode": if *by_name { "byName" } else { "byPosition" }, "allowMissingColumns": allow_missing});
            if *distinct {
                v["duplicatePolicy"] = json!("distinct");
            }
            v
        }
        Action::Aggregate {
            group_by,
            aggregates,
        } => {
            json!({"groupBy": encode_named(group_by), "aggregates": encode_aggregates(aggregates)})
        }
        Action::Sort { keys } => json!({"keys": encode_sort_keys(keys)}),
        Action::WindowFields { assignments } => json!({"assignments": Value::Array(
            assignments.iter().map(|a| json!({
                "name": a.name,
                "expression": a.call.encode(),
                "window": {
                    "partitionBy": a.partition_by.iter().map(Expr::encode).collect::<Vec<_>>(),
                    "orderBy": encode_sort_keys(&a.order_by),
                },
            })).collect())}),
        Action::Limit { count, offset } => {
            let mut v = json!({"count": count});
            if *offset > 0 {
                v["offset"] = json!(offset);
            }
            v
        }
        Action::Distinct { fields } => match fields {
            Some(f) => json!({"fields": f}),
            None => return None,
        },
        Action::Deduplicate { keys, keep_last } => {
            let mut v = json!({"keys": keys});
            if *keep_last {
                v["retain"] = json!("last");
            }
            v
        }
        Action::Explode {
            column,
            alias,
            outer,
        } => {
            json!({"expr": Expr::col(column).encode(), "as": [alias], "outer": outer, "includePosition": false, "maxExpansion": 1_000_000})
        }
        Action::WindowAggregate {
            window,
            group_by,
            aggregates,
        } => {
            json!({"window": encode_window(window), "groupBy": encode_named(group_by), "aggregates": encode_aggregates(aggregates)})
        }
        Action::DeduplicateWithinWatermark { keys } => json!({"keys": keys}),
        Action::Process {
            processor,
            keys,
            time_mode,
            options,
        } => {
            json!({"processor": processor, "keys": keys, "timeMode": time_mode.as_str(), "options": options})
        }
    })
}
