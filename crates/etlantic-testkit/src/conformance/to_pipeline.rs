//! Turns a conformance scenario into an ordinary ETLantic pipeline and profile: memory
//! sources fed batch by batch, the query as portable steps, a memory sink. Nothing in
//! the runtime knows it is being tested.

use super::scenario::{Column, Scenario};
use etlantic_core::ir::{
    Action, AggFunc, Aggregate, BinaryOp, Expr, JoinTimeRange, JoinType, Literal, NamedExpr,
    TransformPlanBuilder, UnaryOp, WindowKind, WindowSpec,
};
use etlantic_core::model::{Pipeline, SourceDef, TransformBuilder};
use etlantic_core::profile::Profile;
use etlantic_core::streaming::{
    Duration, EventTime, ExecutionMode, LatePolicy, OutputMode, StaticRefresh, Trigger,
};
use indexmap::IndexMap;
use serde_json::{json, Value};

/// The pipeline for a scenario, its profile, and the names of the memory tables used.
#[derive(Clone, Debug)]
pub struct ScenarioPipeline {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// Its streaming profile.
    pub profile: Profile,
    /// Scenario source name → memory stream name.
    pub streams: Vec<(String, String)>,
    /// The memory sink name.
    pub sink: String,
}

fn odcs_type(t: &str) -> Result<Value, String> {
    Ok(match t {
        "string" => json!({"logicalType": "string"}),
        "long" => json!({"logicalType": "integer", "logicalTypeOptions": {"format": "i64"}}),
        "double" => json!({"logicalType": "number", "logicalTypeOptions": {"format": "f64"}}),
        "boolean" => json!({"logicalType": "boolean"}),
        "timestamp" => json!({"logicalType": "timestamp"}),
        other => return Err(format!("unsupported scenario type `{other}`")),
    })
}

/// An inline ODCS contract for a scenario schema.
pub fn contract(name: &str, schema: &[Column]) -> Result<Value, String> {
    let props = schema
        .iter()
        .map(|c| {
            let mut p = odcs_type(&c.data_type)?;
            p["name"] = json!(c.name);
            Ok(p)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(json!({
        "version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract",
        "id": name, "status": "draft",
        "schema": [{"name": name, "logicalType": "object", "properties": props}],
    }))
}

fn duration(v: &Value) -> Result<Duration, String> {
    v.as_str()
        .ok_or("duration must be a string")?
        .parse::<Duration>()
        .map_err(|e| e.to_string())
}

fn literal(v: &Value, col_type: &str) -> Result<Expr, String> {
    let lit = match v {
        Value::Null => Literal::Null,
        Value::Bool(b) => Literal::Boolean(*b),
        Value::Number(n) if col_type == "double" => {
            Literal::Decimal(n.as_f64().ok_or("bad number")?)
        }
        Value::Number(n) => match n.as_i64() {
            Some(i) => Literal::Integer(i),
            None => Literal::Decimal(n.as_f64().ok_or("bad number")?),
        },
        Value::String(s) if col_type == "timestamp" => {
            return Ok(Expr::Call {
                function: "dtcs:cast".into(),
                args: vec![
                    Expr::Literal(Literal::String(s.clone())),
                    Expr::Literal(Literal::String("datetime".into())),
                ],
            })
        }
        Value::String(s) => Literal::String(s.clone()),
        other => return Err(format!("unsupported literal {other}")),
    };
    Ok(Expr::Literal(lit))
}

fn predicate(p: &Value, schema: &[Column]) -> Result<Expr, String> {
    if let Some(items) = p.get("and").and_then(Value::as_array) {
        return fold(items, BinaryOp::And, schema);
    }
    if let Some(items) = p.get("or").and_then(Value::as_array) {
        return fold(items, BinaryOp::Or, schema);
    }
    if let Some(inner) = p.get("not") {
        return Ok(Expr::Unary(
            UnaryOp::Not,
            Box::new(predicate(inner, schema)?),
        ));
    }
    let col = p
        .get("col")
        .and_then(Value::as_str)
        .ok_or("predicate without col")?;
    let ty = schema
        .iter()
        .find(|c| c.name == col)
        .map(|c| c.data_type.as_str())
        .ok_or_else(|| format!("unknown column `{col}`"))?;
    let op = p
        .get("op")
        .and_then(Value::as_str)
        .ok_or("predicate without op")?;
    let is_null = Expr::Call {
        function: "dtcs:is_null".into(),
        args: vec![Expr::col(col)],
    };
    let bin = |op| -> Result<Expr, String> {
        Ok(Expr::Binary(
            op,
            Box::new(Expr::col(col)),
            Box::new(literal(p.get("value").unwrap_or(&Value::Null), ty)?),
        ))
    };
    match op {
        "is_null" => Ok(is_null),
        "is_not_null" => Ok(Expr::Unary(UnaryOp::Not, Box::new(is_null))),
        "=" => bin(BinaryOp::Eq),
        "!=" => bin(BinaryOp::NotEq),
        "<" => bin(BinaryOp::Lt),
        "<=" => bin(BinaryOp::LtEq),
        ">" => bin(BinaryOp::Gt),
        ">=" => bin(BinaryOp::GtEq),
        other => Err(format!("unknown operator `{other}`")),
    }
}

fn fold(items: &[Value], op: BinaryOp, schema: &[Column]) -> Result<Expr, String> {
    let mut exprs = items.iter().map(|i| predicate(i, schema));
    let first = exprs.next().ok_or("empty and/or")??;
    exprs.try_fold(first, |acc, e| {
        Ok(Expr::Binary(op, Box::new(acc), Box::new(e?)))
    })
}

fn aggregates(q: &Value) -> Result<Vec<Aggregate>, String> {
    q.get("aggregates")
        .and_then(Value::as_array)
        .ok_or("window_aggregate without aggregates")?
        .iter()
        .map(|a| {
            let name = a
                .get("as")
                .and_then(Value::as_str)
                .ok_or("aggregate without `as`")?
                .to_string();
            let col = a
                .get("column")
                .and_then(Value::as_str)
                .filter(|c| *c != "*");
            let f = a
                .get("fn")
                .and_then(Value::as_str)
                .ok_or("aggregate without fn")?;
            let func = match (f, col) {
                ("count", None) => AggFunc::CountAll,
                ("count", Some(_)) => AggFunc::Count,
                ("sum", _) => AggFunc::Sum,
                ("min", _) => AggFunc::Min,
                ("max", _) => AggFunc::Max,
                ("avg", _) => AggFunc::Average,
                (other, _) => return Err(format!("unknown aggregate `{other}`")),
            };
            Ok(Aggregate {
                name,
                func,
                arg: col.map(Expr::col),
            })
        })
        .collect()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Builds the pipeline of a scenario.
pub fn scenario_pipeline(s: &Scenario, tag: &str) -> Result<ScenarioPipeline, String> {
    let q = &s.query;
    let kind = q
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("query without kind")?;
    // Inputs with their watermarks.
    let inputs: Vec<(String, Option<(String, Duration)>)> =
        match q.get("union").and_then(Value::as_array) {
            Some(items) => items
                .iter()
                .map(|i| {
                    let src = i
                        .get("source")
                        .and_then(Value::as_str)
                        .ok_or("union input without source")?
                        .to_string();
                    let wm = i.get("watermark").map(watermark).transpose()?;
                    Ok((src, wm))
                })
                .collect::<Result<_, String>>()?,
            None => match kind {
                "project_filter" | "window_aggregate" | "dedup" => {
                    let src = q
                        .get("source")
                        .and_then(Value::as_str)
                        .ok_or("query without source")?
                        .to_string();
                    vec![(src, q.get("watermark").map(watermark).transpose()?)]
                }
                "stream_stream_join" => ["left", "right"]
                    .iter()
                    .map(|side| {
                        let input = q
                            .get(*side)
                            .ok_or_else(|| format!("stream_stream_join without `{side}`"))?;
                        let src = input
                            .get("source")
                            .and_then(Value::as_str)
                            .ok_or_else(|| format!("`{side}` without source"))?
                            .to_string();
                        Ok((src, input.get("watermark").map(watermark).transpose()?))
                    })
                    .collect::<Result<_, String>>()?,
                "stream_static_join" => {
                    let src = |k: &str| {
                        q.get(k)
                            .and_then(Value::as_str)
                            .map(String::from)
                            .ok_or_else(|| format!("stream_static_join without `{k}`"))
                    };
                    vec![(src("stream")?, None), (src("static")?, None)]
                }
                other => {
                    return Err(format!(
                        "query kind `{other}` is not supported by the embedded runtime yet"
                    ))
                }
            },
        };
    let mut b = Pipeline::builder(format!("conformance_{}", s.name));
    let mut profile = Profile::new("conformance");
    profile.mode = ExecutionMode::Streaming;
    profile.trigger = Some(Trigger::AvailableNow);
    profile.no_data_batches = s.options.no_data_micro_batches;
    let mut streams = Vec::new();
    for (name, spec) in &s.sources {
        b = b.asset_inline(name.clone(), contract(name, &spec.schema)?);
        let stream = format!("{tag}_{name}");
        profile
            .bindings
            .insert(name.clone(), format!("memory://{stream}"));
        streams.push((name.clone(), stream));
    }
    for (src, wm) in &inputs {
        let spec = s
            .sources
            .get(src)
            .ok_or_else(|| format!("the query reads unknown source `{src}`"))?;
        b = b.source_def(SourceDef {
            id: src.clone(),
            asset: src.clone(),
            event_time: wm.as_ref().map(|(c, _)| EventTime {
                column: c.clone(),
                timezone: "UTC".into(),
            }),
            watermark: wm.as_ref().map(|(_, d)| *d),
            late_events: LatePolicy::Drop,
            read_limit: None,
            // A static table is a memory source read whole for every micro-batch.
            static_refresh: spec.is_static.then_some(StaticRefresh::PerBatch),
        });
    }
    let schema = &s.sources[&inputs[0].0].schema;
    let mut t = TransformBuilder::new("query");
    for (src, _) in &inputs {
        t = t.input(src.clone(), src.clone());
    }
    for (other, _) in inputs.iter().skip(1) {
        t = t.step(Action::Union {
            other: other.clone(),
            by_name: true,
            allow_missing: false,
            distinct: false,
        });
    }
    let output_mode = match q
        .get("output_mode")
        .and_then(Value::as_str)
        .unwrap_or("append")
    {
        "append" => OutputMode::Append,
        "update" => OutputMode::Update,
        "complete" => OutputMode::Complete,
        other => return Err(format!("unknown output mode `{other}`")),
    };
    // An extension of the corpus format (the scenarios `cargo xtask spark-diff` records):
    // `filter` before a window aggregation or a dedup, on its input.
    if matches!(kind, "window_aggregate" | "dedup") {
        if let Some(p) = q.get("filter") {
            t = t.step(Action::Filter {
                predicate: predicate(p, schema)?,
            });
        }
    }
    match kind {
        "project_filter" => {
            if let Some(p) = q.get("filter") {
                t = t.step(Action::Filter {
                    predicate: predicate(p, schema)?,
                });
            }
            if let Some(cols) = q.get("columns").and_then(Value::as_array) {
                let fields = cols
                    .iter()
                    .map(|c| match c {
                        Value::String(s) => Ok(NamedExpr::column(s)),
                        Value::Object(m) => Ok(NamedExpr {
                            name: m
                                .get("as")
                                .and_then(Value::as_str)
                                .ok_or("column without as")?
                                .to_string(),
                            expr: Expr::col(
                                m.get("col")
                                    .and_then(Value::as_str)
                                    .ok_or("column without col")?,
                            ),
                        }),
                        other => Err(format!("bad column {other}")),
                    })
                    .collect::<Result<_, String>>()?;
                t = t.step(Action::Project { fields });
            }
        }
        "window_aggregate" => {
            let group_by = strings(q.get("group_by"))
                .iter()
                .map(|g| NamedExpr::column(g))
                .collect();
            let aggregates = aggregates(q)?;
            match q.get("window") {
                None | Some(Value::Null) => {
                    t = t.step(Action::Aggregate {
                        group_by,
                        aggregates,
                    })
                }
                Some(w) => {
                    let column = w
                        .get("column")
                        .and_then(Value::as_str)
                        .ok_or("window without column")?
                        .to_string();
                    let kind = match w.get("type").and_then(Value::as_str) {
                        Some("tumbling") => WindowKind::Tumbling {
                            size: duration(&w["size"])?,
                        },
                        Some("sliding") => WindowKind::Sliding {
                            size: duration(&w["size"])?,
                            slide: duration(&w["slide"])?,
                        },
                        Some("session") => WindowKind::Session {
                            gap: duration(&w["gap"])?,
                        },
                        other => return Err(format!("unknown window type {other:?}")),
                    };
                    t = t.step(Action::WindowAggregate {
                        window: WindowSpec {
                            time_column: column,
                            kind,
                            allowed_lateness: etlantic_core::streaming::Duration::ZERO,
                        },
                        group_by,
                        aggregates,
                    });
                }
            }
        }
        "dedup" => {
            let keys = strings(q.get("keys"));
            t = t.step(match q.get("mode").and_then(Value::as_str) {
                Some("within_watermark") => Action::DeduplicateWithinWatermark { keys },
                _ => Action::Deduplicate {
                    keys,
                    keep_last: false,
                },
            });
        }
        "stream_stream_join" | "stream_static_join" => {
            t = join_transform(s, kind, &inputs[0].0, &inputs[1].0)?;
        }
        _ => unreachable!("checked above"),
    }
    b = b.transform(t);
    // The sink's contract: the expected output columns (or, for rejected queries, none
    // is needed because planning fails first; use the first source's schema).
    let out_cols: Vec<Column> = s
        .expected
        .as_ref()
        .map(|e| e.output_columns.clone())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| schema.clone());
    let sink_asset = "scenario_output".to_string();
    b = b.asset_inline(sink_asset.clone(), contract(&sink_asset, &out_cols)?);
    let sink = format!("{tag}_output");
    profile
        .bindings
        .insert(sink_asset.clone(), format!("memory://{sink}"));
    b = b.sink_def(etlantic_core::model::SinkDef {
        id: "output".into(),
        input: "query".into(),
        asset: sink_asset,
        output_mode: Some(output_mode),
        write_mode: None,
        keys: vec![],
    });
    Ok(ScenarioPipeline {
        pipeline: b.build(),
        profile,
        streams,
        sink,
    })
}

/// A join query as a transformation: the right side's columns that collide with left
/// ones are renamed (`right_<name>`) before the join, so that `select` can pick either;
/// then the join (keys, type, time range) and the projection of `select`.
fn join_transform(
    s: &Scenario,
    kind: &str,
    left: &str,
    right: &str,
) -> Result<TransformBuilder, String> {
    let q = &s.query;
    let (lname, rname) = if kind == "stream_static_join" {
        ("stream", "static")
    } else {
        ("left", "right")
    };
    let lcols: Vec<&str> = s.sources[left]
        .schema
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let mut renamed: IndexMap<String, String> = IndexMap::new();
    for c in &s.sources[right].schema {
        if lcols.contains(&c.name.as_str()) {
            let mut n = format!("right_{}", c.name);
            while lcols.contains(&n.as_str()) {
                n = format!("_{n}");
            }
            renamed.insert(c.name.clone(), n);
        }
    }
    let right_name = |c: &str| renamed.get(c).cloned().unwrap_or_else(|| c.to_string());
    let mut left_keys = Vec::new();
    let mut right_keys = Vec::new();
    for k in q
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("a join query without keys")?
    {
        let side = |n: &str| {
            k.get(n)
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| format!("join key without `{n}`"))
        };
        left_keys.push(side(lname)?);
        right_keys.push(right_name(&side(rname)?));
    }
    let join_type = match q.get("join_type").and_then(Value::as_str) {
        Some(t) => JoinType::parse(t).ok_or_else(|| format!("unknown join type `{t}`"))?,
        None => JoinType::Inner,
    };
    let time_range = match q.get("time_range") {
        None | Some(Value::Null) => None,
        Some(r) => {
            let get = |k: &str| r.get(k).ok_or_else(|| format!("time_range without `{k}`"));
            Some(JoinTimeRange {
                left: get("left")?.as_str().ok_or("bad time_range")?.to_string(),
                right: right_name(get("right")?.as_str().ok_or("bad time_range")?),
                lower: duration(get("lower")?)?,
                upper: duration(get("upper")?)?,
            })
        }
    };
    let select = q
        .get("select")
        .and_then(Value::as_array)
        .ok_or("a join query without select")?
        .iter()
        .map(|item| {
            let col = item
                .get("col")
                .and_then(Value::as_str)
                .ok_or("select item without col")?;
            let from = item
                .get("from")
                .and_then(Value::as_str)
                .ok_or("select item without from")?;
            let name = item.get("as").and_then(Value::as_str).unwrap_or(col);
            let source_col = if from == rname {
                right_name(col)
            } else if from == lname {
                col.to_string()
            } else {
                return Err(format!("select item from unknown side `{from}`"));
            };
            Ok(NamedExpr {
                name: name.to_string(),
                expr: Expr::col(&source_col),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut pb = TransformPlanBuilder::new("query")
        .input(left, None)
        .input(right, None);
    let right_rel = if renamed.is_empty() {
        right.to_string()
    } else {
        pb = pb
            .from_input(right)
            .step(Action::RenameFields { mapping: renamed });
        pb.current().expect("a step").to_string()
    };
    pb = pb
        .from_input(left)
        .step(Action::Join {
            right: right_rel,
            join_type,
            left_keys,
            right_keys,
            predicate: None,
            null_safe: false,
            time_range,
        })
        .step(Action::Project { fields: select })
        .output("result", None);
    Ok(TransformBuilder::new("query")
        .input(left, left)
        .input(right, right)
        .plan_inline(pb.to_value()))
}

fn watermark(v: &Value) -> Result<(String, Duration), String> {
    Ok((
        v.get("column")
            .and_then(Value::as_str)
            .ok_or("watermark without column")?
            .to_string(),
        duration(v.get("delay").ok_or("watermark without delay")?)?,
    ))
}
