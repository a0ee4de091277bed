//! Inline transformation steps in pipeline YAML: a short, readable syntax that compiles
//! to DTCS actions.
//!
//! ```yaml
//! steps:
//!   - filter: "amount > 0 && status != 'cancelled'"
//!   - with_columns: {total: "amount * qty"}
//!   - select: [order_id, customer, total]
//!   - rename: {customer: customer_id}
//!   - drop: [internal]
//!   - join: {right: customers, on: [customer_id], how: left}
//!   - join:                                     # a stream-stream join with a time bound
//!       right: clicks
//!       on: {left: [ad_id], right: [click_ad_id]}
//!       how: left
//!       time_range: {left: imp_ts, right: click_ts, lower: 20 seconds, upper: 0 seconds}
//!   - union: {other: more_orders, by_name: true, allow_missing: false}
//!   - aggregate: {group_by: [customer_id], aggregates: {n: "count_all()", total: "sum(total)"}}
//!   - window_aggregate:
//!       window: {type: tumbling, column: ts, size: 1 minute, allowed_lateness: 30 seconds}
//!       group_by: [campaign]
//!       aggregates: {clicks: "count_all()"}
//!   - sort: [customer_id, {expr: total, descending: true}]
//!   - limit: 10
//!   - distinct: true
//!   - deduplicate: {keys: [id, ts]}              # or {keys: [id], within_watermark: true}
//!   - explode: {column: items, as: item}
//!   - process:                                  # a custom stateful processor
//!       processor: session_summary
//!       keys: [user]
//!       time_mode: event_time                     # none | processing_time | event_time
//!       options: {time_column: ts, gap: 30 minutes}
//!   - action: dtcs:filter                         # any DTCS action, as in a plan
//!     parameters: {predicate: "a > 1"}
//! ```

use crate::ir::action::{
    decode_action, encode_action, Aggregate, DEDUP_WITHIN_WATERMARK, JOIN_TIME_RANGE, PROCESS,
    WINDOW_AGGREGATE,
};
use crate::ir::{Action, Expr, NamedExpr};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Map, Value};

/// One inline step: a DTCS action applied to the result of the previous step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step(pub Action);

impl Serialize for Step {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = Map::new();
        m.insert("action".into(), json!(self.0.id()));
        if let Some(p) = encode_action(&self.0) {
            m.insert("parameters".into(), p);
        }
        Value::Object(m).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        parse_step(&v).map(Step).map_err(serde::de::Error::custom)
    }
}

fn aggregates_map(v: &Value) -> Result<Vec<Aggregate>, String> {
    let m = match v {
        Value::Object(m) => m,
        // A list in DTCS form is decoded by the action decoder.
        Value::Array(_) => return Err("list".into()),
        _ => {
            return Err(
                "`aggregates` must map names to expressions, e.g. {n: \"count_all()\"}".into(),
            )
        }
    };
    m.iter()
        .map(|(name, e)| {
            let expr = Expr::decode(e)?;
            match expr {
                Expr::Call { function, args } => {
                    crate::ir::action::aggregate_call(name.clone(), &function, args)
                }
                other => Err(format!(
                    "aggregate `{name}` must be a function call, got `{other}`"
                )),
            }
        })
        .collect()
}

fn group_by(v: Option<&Value>) -> Result<Value, String> {
    Ok(v.cloned().unwrap_or(json!([])))
}

fn aggregation(body: &Map<String, Value>, action: &str) -> Result<Action, String> {
    let mut params = Map::new();
    params.insert(
        "groupBy".into(),
        group_by(body.get("group_by").or_else(|| body.get("groupBy")))?,
    );
    if let Some(w) = body.get("window") {
        params.insert("window".into(), w.clone());
    }
    let aggs = body
        .get("aggregates")
        .ok_or("an aggregation needs `aggregates`")?;
    match aggregates_map(aggs) {
        Ok(list) => {
            params.insert("aggregates".into(), json!([]));
            let mut a = decode_action(action, &params)?;
            match &mut a {
                Action::Aggregate { aggregates, .. }
                | Action::WindowAggregate { aggregates, .. } => *aggregates = list,
                _ => unreachable!(),
            }
            Ok(a)
        }
        Err(e) if e == "list" => {
            params.insert("aggregates".into(), aggs.clone());
            decode_action(action, &params)
        }
        Err(e) => Err(e),
    }
}

/// Parses one step in the short syntax or the generic `{action, parameters}` form.
pub fn parse_step(v: &Value) -> Result<Action, String> {
    let m = v
        .as_object()
        .ok_or_else(|| format!("a step must be a mapping, got {v}"))?;
    if let Some(action) = m.get("action").and_then(Value::as_str) {
        let empty = Map::new();
        let params = m
            .get("parameters")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let action = if action.contains(':') {
            action.to_string()
        } else {
            format!("dtcs:{action}")
        };
        return decode_action(&action, params);
    }
    if m.len() != 1 {
        return Err(format!(
            "a step has exactly one key (its kind), got {:?}",
            m.keys().collect::<Vec<_>>()
        ));
    }
    let (kind, body) = m.iter().next().expect("one key");
    let obj = |what: &str| {
        body.as_object()
            .ok_or_else(|| format!("`{what}` takes a mapping"))
    };
    match kind.as_str() {
        "filter" | "where" => Ok(Action::Filter {
            predicate: Expr::decode(body)?,
        }),
        "select" | "project" => {
            let items = body.as_array().ok_or("`select` takes a list")?;
            let fields = items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Ok(NamedExpr::column(s)),
                    Value::Object(o) if o.len() == 1 => {
                        let (name, e) = o.iter().next().expect("one key");
                        Ok(NamedExpr {
                            name: name.clone(),
                            expr: Expr::decode(e)?,
                        })
                    }
                    other => Err(format!(
                        "select item must be a column or {{name: expr}}, got {other}"
                    )),
                })
                .collect::<Result<_, String>>()?;
            Ok(Action::Project { fields })
        }
        "with_columns" | "with_fields" => {
            let o = obj(kind)?;
            let assignments = o
                .iter()
                .map(|(name, e)| {
                    Ok(NamedExpr {
                        name: name.clone(),
                        expr: Expr::decode(e)?,
                    })
                })
                .collect::<Result<_, String>>()?;
            Ok(Action::WithFields { assignments })
        }
        "drop" | "drop_fields" => decode_action("dtcs:drop_fields", &map1("fields", body.clone())),
        "rename" | "rename_fields" => {
            decode_action("dtcs:rename_fields", &map1("mapping", body.clone()))
        }
        "join" => {
            let o = obj("join")?;
            let mut p = Map::new();
            p.insert(
                "right".into(),
                o.get("right").cloned().ok_or("`join` needs `right`")?,
            );
            p.insert(
                "type".into(),
                o.get("how")
                    .or_else(|| o.get("type"))
                    .cloned()
                    .unwrap_or(json!("inner")),
            );
            match o.get("on") {
                Some(Value::Object(keys)) => {
                    p.insert(
                        "leftKey".into(),
                        keys.get("left").cloned().unwrap_or(Value::Null),
                    );
                    p.insert(
                        "rightKey".into(),
                        keys.get("right").cloned().unwrap_or(Value::Null),
                    );
                }
                Some(Value::String(s))
                    if s.contains(|c: char| !c.is_alphanumeric() && c != '_') =>
                {
                    p.insert("predicate".into(), json!(s));
                }
                Some(keys) => {
                    p.insert("leftKey".into(), keys.clone());
                }
                None => {}
            }
            if let Some(pred) = o.get("predicate") {
                p.insert("predicate".into(), pred.clone());
            }
            if let Some(ns) = o.get("null_safe") {
                p.insert("nullSafe".into(), ns.clone());
            }
            if let Some(r) = o.get("time_range") {
                p.insert(JOIN_TIME_RANGE.into(), r.clone());
            }
            for k in o.keys() {
                if !matches!(
                    k.as_str(),
                    "right" | "how" | "type" | "on" | "predicate" | "null_safe" | "time_range"
                ) {
                    return Err(format!(
                        "unknown `join` field `{k}` (right, on, how, predicate, null_safe, time_range)"
                    ));
                }
            }
            decode_action("dtcs:join", &p)
        }
        "union" => {
            let o = obj("union")?;
            let mut p = Map::new();
            p.insert(
                "other".into(),
                o.get("other").cloned().ok_or("`union` needs `other`")?,
            );
            let by_name = o.get("by_name").and_then(Value::as_bool).unwrap_or(true);
            p.insert(
                "mode".into(),
                json!(if by_name { "byName" } else { "byPosition" }),
            );
            p.insert(
                "allowMissingColumns".into(),
                o.get("allow_missing").cloned().unwrap_or(json!(false)),
            );
            if o.get("distinct").and_then(Value::as_bool) == Some(true) {
                p.insert("duplicatePolicy".into(), json!("distinct"));
            }
            decode_action("dtcs:union", &p)
        }
        "aggregate" | "group_by" => aggregation(obj(kind)?, "dtcs:aggregate"),
        "window_aggregate" => {
            let o = obj(kind)?;
            let mut body = o.clone();
            if let Some(Value::Object(w)) = o.get("window") {
                let mut w = w.clone();
                if let Some(c) = w.remove("column") {
                    w.insert("timeField".into(), c);
                }
                body.insert("window".into(), Value::Object(w));
            }
            aggregation(&body, WINDOW_AGGREGATE)
        }
        "sort" | "order_by" => {
            let items = body.as_array().ok_or("`sort` takes a list")?;
            let keys: Vec<Value> = items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Ok(json!({"expr": s})),
                    Value::Object(o) => {
                        let mut k = Map::new();
                        k.insert(
                            "expr".into(),
                            o.get("expr")
                                .or_else(|| o.get("column"))
                                .cloned()
                                .ok_or("sort key needs `expr`")?,
                        );
                        if let Some(d) = o.get("descending") {
                            k.insert("descending".into(), d.clone());
                        }
                        if let Some(n) = o.get("nulls") {
                            k.insert("nulls".into(), n.clone());
                        }
                        Ok(Value::Object(k))
                    }
                    other => Err(format!("bad sort key {other}")),
                })
                .collect::<Result<_, String>>()?;
            decode_action("dtcs:sort", &map1("keys", Value::Array(keys)))
        }
        "limit" => decode_action("dtcs:limit", &map1("count", body.clone())),
        "distinct" => match body {
            Value::Bool(true) | Value::Null => Ok(Action::Distinct { fields: None }),
            other => decode_action("dtcs:distinct", &map1("fields", other.clone())),
        },
        "deduplicate" | "drop_duplicates" => {
            let (keys, within) = match body {
                Value::Object(o) => (
                    o.get("keys").cloned().unwrap_or(json!([])),
                    o.get("within_watermark")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                ),
                other => (other.clone(), false),
            };
            if within {
                decode_action(DEDUP_WITHIN_WATERMARK, &map1("keys", keys))
            } else {
                decode_action("dtcs:deduplicate", &map1("keys", keys))
            }
        }
        "explode" => {
            let o = obj("explode")?;
            let mut p = Map::new();
            p.insert(
                "expr".into(),
                o.get("column").cloned().ok_or("`explode` needs `column`")?,
            );
            if let Some(a) = o.get("as") {
                p.insert("as".into(), a.clone());
            }
            if let Some(outer) = o.get("outer") {
                p.insert("outer".into(), outer.clone());
            }
            decode_action("dtcs:explode", &p)
        }
        "process" => {
            let o = obj("process")?;
            decode_action(PROCESS, o)
        }
        other => Err(format!("unknown step kind `{other}`")),
    }
}

fn map1(k: &str, v: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(k.to_string(), v);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(yaml: &str) -> Action {
        let v: Value = serde_yaml::from_str(yaml).unwrap();
        parse_step(&v).unwrap_or_else(|e| panic!("{yaml}: {e}"))
    }

    #[test]
    fn short_forms_and_generic_form_agree() {
        let a = step("filter: \"a > 1\"");
        let b = step("action: filter\nparameters: {predicate: \"a > 1\"}");
        assert_eq!(a, b);
        let s = Step(step(
            "aggregate: {group_by: [g], aggregates: {n: \"count_all()\", t: \"sum(v)\"}}",
        ));
        let yaml = serde_yaml::to_string(&s).unwrap();
        let back: Step = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn every_short_form_parses() {
        for y in [
            "select: [a, {b2: \"b * 2\"}]",
            "with_columns: {c: \"a + 1\"}",
            "drop: [a]",
            "rename: {a: x}",
            "join: {right: r, on: [k], how: left}",
            "join: {right: r, on: {left: [a], right: [b]}}",
            "join: {right: r, on: [k], how: full, time_range: {left: t, right: u, lower: 1 minute, upper: 5 seconds}}",
            "union: {other: o}",
            "window_aggregate: {window: {type: session, column: ts, gap: 5 seconds}, group_by: [u], aggregates: {n: \"count_all()\"}}",
            "sort: [a, {expr: b, descending: true}]",
            "limit: 5",
            "distinct: true",
            "deduplicate: [id]",
            "deduplicate: {keys: [id], within_watermark: true}",
            "explode: {column: items, as: item}",
            "process: {processor: p, keys: [u], time_mode: event_time, options: {gap: 5 seconds}}",
            "process: {processor: p}",
        ] {
            let a = step(y);
            let s = Step(a.clone());
            let back: Step = serde_yaml::from_str(&serde_yaml::to_string(&s).unwrap()).unwrap();
            assert_eq!(back.0, a, "{y}");
        }
        let v: Value = serde_yaml::from_str("frobnicate: 1").unwrap();
        assert!(parse_step(&v).unwrap_err().contains("unknown step kind"));
        for (bad, why) in [
            ("process: {keys: [u]}", "needs `processor"),
            ("process: {processor: p, time_mode: sometimes}", "time_mode"),
            (
                "process: {processor: p, key: [u]}",
                "unknown `process` field",
            ),
            (
                "process: {processor: p, options: [1]}",
                "`options` must be a mapping",
            ),
        ] {
            let v: Value = serde_yaml::from_str(bad).unwrap();
            let e = parse_step(&v).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        match step("process: {processor: p, keys: [u], time_mode: eventTime}") {
            Action::Process {
                processor,
                keys,
                time_mode,
                options,
            } => {
                assert_eq!(processor, "p");
                assert_eq!(keys, ["u"]);
                assert_eq!(time_mode, crate::streaming::TimeMode::EventTime);
                assert_eq!(options, json!({}));
            }
            other => panic!("{other:?}"),
        }
    }
}
