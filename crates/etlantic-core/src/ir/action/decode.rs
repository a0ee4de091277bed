//! Decoding actions from a plan's `actions[]` parameters, in both the dialect of
//! ETLantic-py and that of the `dtcs` crate, with the parameter shapes they share
//! (field lists, aggregates, windows, durations, join time ranges).

use super::{
    Action, AggFunc, Aggregate, JoinTimeRange, JoinType, NamedExpr, SortKey, WindowField,
    WindowKind, WindowSpec, DEDUP_WITHIN_WATERMARK, JOIN_TIME_RANGE, PROCESS, WINDOW_AGGREGATE,
    WINDOW_FUNCTIONS,
};
use crate::ir::expr::{literal_from_json, Expr};
use crate::streaming::{Duration, TimeMode};
use serde_json::{json, Map, Value};

/// Decodes `{left, right, lower, upper}` (durations as `"20 seconds"` or ISO-8601).
pub fn decode_time_range(v: &Value) -> Result<JoinTimeRange, String> {
    let m = v
        .as_object()
        .ok_or("a join time range is `{left, right, lower, upper}`")?;
    let column = |k: &str| {
        m.get(k)
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| format!("a join time range needs `{k}` (a column name)"))
    };
    let bound = |k: &str| -> Result<Duration, String> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(Duration::ZERO),
            Some(Value::String(s)) => parse_duration_any(s),
            Some(other) => Err(format!(
                "join time range `{k}` must be a duration, got {other}"
            )),
        }
    };
    for k in m.keys() {
        if !matches!(k.as_str(), "left" | "right" | "lower" | "upper") {
            return Err(format!(
                "unknown join time range field `{k}` (use left, right, lower, upper)"
            ));
        }
    }
    Ok(JoinTimeRange {
        left: column("left")?,
        right: column("right")?,
        lower: bound("lower")?,
        upper: bound("upper")?,
    })
}

fn params_get<'a>(p: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| p.get(*k))
}

fn string_list(v: Option<&Value>) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Object(m) => m
                    .get("field")
                    .or_else(|| m.get("name"))
                    .and_then(Value::as_str)
                    .map(String::from)
                    .ok_or_else(|| format!("expected a column name, got {x}")),
                _ => Err(format!("expected a column name, got {x}")),
            })
            .collect(),
        Some(other) => Err(format!("expected a list of column names, got {other}")),
    }
}

/// Decodes `name`, `{name, expression}`, `{as, expr}` or `{field}` entries.
fn named_exprs(v: Option<&Value>) -> Result<Vec<NamedExpr>, String> {
    let items = match v {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::String(s)) => return Ok(vec![NamedExpr::column(s)]),
        Some(Value::Array(a)) => a,
        Some(Value::Object(m)) => {
            // `{new_name: expr, ...}` map form.
            return m
                .iter()
                .map(|(k, e)| {
                    Ok(NamedExpr {
                        name: k.clone(),
                        expr: Expr::decode(e)?,
                    })
                })
                .collect();
        }
        Some(other) => return Err(format!("expected a list of fields, got {other}")),
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(NamedExpr::column(s)),
            Value::Object(m) => {
                if m.contains_key("window") {
                    return Err(format!(
                        "a window function is a `dtcs:with_fields` assignment, not a field here: {item}"
                    ));
                }
                let expr = match params_get(m, &["expression", "expr"]) {
                    Some(e) => Expr::decode(e)?,
                    None => Expr::col(
                        m.get("field")
                            .and_then(Value::as_str)
                            .ok_or_else(|| format!("field entry without expression: {item}"))?,
                    ),
                };
                let name = params_get(m, &["name", "as", "alias"])
                    .and_then(Value::as_str)
                    .map(String::from)
                    .unwrap_or_else(|| expr.default_name());
                Ok(NamedExpr { name, expr })
            }
            other => Err(format!("expected a field, got {other}")),
        })
        .collect()
}

/// Sort keys: `"col"`, or `{expression | field | column, direction, nulls}`.
fn sort_keys(items: &[Value]) -> Result<Vec<SortKey>, String> {
    items
        .iter()
        .map(|k| {
            let m = match k {
                Value::String(s) => {
                    return Ok(SortKey {
                        expr: Expr::col(s),
                        descending: false,
                        nulls_first: false,
                    })
                }
                Value::Object(m) => m,
                other => return Err(format!("bad sort key {other}")),
            };
            let expr = match params_get(m, &["expression", "expr"]) {
                Some(e) => Expr::decode(e)?,
                None => Expr::col(
                    params_get(m, &["field", "column"])
                        .and_then(Value::as_str)
                        .ok_or("sort key without field")?,
                ),
            };
            let descending = m.get("direction").and_then(Value::as_str) == Some("desc")
                || m.get("descending").and_then(Value::as_bool) == Some(true);
            let nulls_first = m.get("nulls").and_then(Value::as_str) == Some("first");
            Ok(SortKey {
                expr,
                descending,
                nulls_first,
            })
        })
        .collect()
}

/// The assignments of a `dtcs:with_fields` when they are window functions (each with a
/// `window`), `None` when none is. Mixing both kinds in one action, a window `frame`, or
/// a function that is not a window function is an error: nothing is dropped unread.
fn window_fields(items: Option<&Value>) -> Result<Option<Vec<WindowField>>, String> {
    let Some(Value::Array(items)) = items else {
        return Ok(None);
    };
    let windowed = items.iter().filter(|i| i.get("window").is_some()).count();
    if windowed == 0 {
        return Ok(None);
    }
    if windowed != items.len() {
        return Err(
            "with_fields mixes window functions and row expressions: split it into two actions"
                .into(),
        );
    }
    items
        .iter()
        .map(|item| {
            let m = item.as_object().ok_or_else(|| format!("bad assignment {item}"))?;
            let name = params_get(m, &["name", "as", "alias"])
                .and_then(Value::as_str)
                .ok_or_else(|| format!("window assignment without a name: {item}"))?
                .to_string();
            let call = Expr::decode(
                params_get(m, &["expression", "expr"])
                    .ok_or_else(|| format!("window assignment `{name}` without an expression"))?,
            )?;
            match &call {
                Expr::Call { function, .. } if WINDOW_FUNCTIONS.contains(&function.as_str()) => {}
                other => {
                    return Err(format!(
                        "window assignment `{name}`: `{other}` is not a window function ({})",
                        WINDOW_FUNCTIONS.join(", ")
                    ))
                }
            }
            let window = m
                .get("window")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("window assignment `{name}`: `window` must be a mapping"))?;
            for k in window.keys() {
                match k.as_str() {
                    "partitionBy" | "orderBy" => {}
                    "frame" => {
                        return Err(format!(
                            "window assignment `{name}`: window frames (`frame`, window_frame) are not supported; the functions take their partition as DTCS defines"
                        ))
                    }
                    other => {
                        return Err(format!(
                            "window assignment `{name}`: unknown window field `{other}` (partitionBy, orderBy)"
                        ))
                    }
                }
            }
            let partition_by = match window.get("partitionBy") {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|p| match p {
                        Value::String(c) => Ok(Expr::col(c)),
                        other => Expr::decode(other),
                    })
                    .collect::<Result<_, String>>()?,
                Some(other) => return Err(format!("`partitionBy` must be a list, got {other}")),
            };
            let order_by = match window.get("orderBy") {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(a)) => sort_keys(a)?,
                Some(other) => return Err(format!("`orderBy` must be a list, got {other}")),
            };
            Ok(WindowField {
                name,
                call,
                partition_by,
                order_by,
            })
        })
        .collect::<Result<_, String>>()
        .map(Some)
}

fn aggregates(v: Option<&Value>) -> Result<Vec<Aggregate>, String> {
    let items = v
        .and_then(Value::as_array)
        .ok_or("an aggregation needs `aggregates: [...]` (or `aggregations`)")?;
    items
        .iter()
        .map(|item| {
            let m = item
                .as_object()
                .ok_or_else(|| format!("bad aggregate {item}"))?;
            let name = params_get(m, &["name", "as"])
                .and_then(Value::as_str)
                .ok_or_else(|| format!("aggregate without a name: {item}"))?
                .to_string();
            // ETLantic-py form: {name, expression: call}
            if let Some(e) = params_get(m, &["expression"]) {
                let expr = Expr::decode(e)?;
                return match expr {
                    Expr::Call { function, args } => aggregate_call(name, &function, args),
                    other => Err(format!(
                        "aggregate `{name}` must be a function call, got {other}"
                    )),
                };
            }
            // dtcs crate form: {as, op|function, field|expr, distinct}
            let op = params_get(m, &["op", "function"])
                .and_then(Value::as_str)
                .ok_or_else(|| format!("aggregate `{name}` without op"))?;
            let mut func =
                AggFunc::parse(op).ok_or_else(|| format!("unknown aggregate function `{op}`"))?;
            if m.get("distinct").and_then(Value::as_bool) == Some(true) && func == AggFunc::Count {
                func = AggFunc::CountDistinct;
            }
            let arg = match (m.get("field"), m.get("expr")) {
                (Some(Value::String(f)), _) => Some(Expr::col(f)),
                (_, Some(e)) => Some(Expr::decode(e)?),
                _ => None,
            };
            Ok(Aggregate { name, func, arg })
        })
        .collect()
}

/// The aggregate `name` computed by the call `function(args)`: `count_all()`, `sum(x)`,
/// `variance(x, 'population')`. `variance`/`stddev` take a mode after the value; no other
/// aggregate takes a second argument, and none is dropped unread.
pub(crate) fn aggregate_call(
    name: String,
    function: &str,
    mut args: Vec<Expr>,
) -> Result<Aggregate, String> {
    let mut func = AggFunc::parse(function)
        .ok_or_else(|| format!("`{function}` is not an aggregate function"))?;
    if args.len() == 2 {
        func = with_mode(func, &args[1])
            .ok_or_else(|| format!("aggregate `{name}`: `{function}` takes one argument"))?;
        args.truncate(1);
    }
    if args.len() > 2 {
        return Err(format!(
            "aggregate `{name}`: `{function}` takes one argument, got {}",
            args.len()
        ));
    }
    let arg = if args.is_empty() {
        None
    } else {
        Some(args.remove(0))
    };
    Ok(Aggregate { name, func, arg })
}

/// `variance`/`stddev` with the DTCS mode argument `'sample'` or `'population'`.
fn with_mode(func: AggFunc, mode: &Expr) -> Option<AggFunc> {
    let Expr::Literal(crate::ir::expr::Literal::String(mode)) = mode else {
        return None;
    };
    Some(match (func, mode.as_str()) {
        (AggFunc::Variance | AggFunc::VariancePopulation, "sample") => AggFunc::Variance,
        (AggFunc::Variance | AggFunc::VariancePopulation, "population") => {
            AggFunc::VariancePopulation
        }
        (AggFunc::Stddev | AggFunc::StddevPopulation, "sample") => AggFunc::Stddev,
        (AggFunc::Stddev | AggFunc::StddevPopulation, "population") => AggFunc::StddevPopulation,
        _ => return None,
    })
}

fn duration(v: Option<&Value>, what: &str) -> Result<Duration, String> {
    let s = v
        .and_then(Value::as_str)
        .ok_or_else(|| format!("window needs `{what}`"))?;
    parse_duration_any(s)
}

/// Parses `"10 seconds"` or an ISO-8601 duration like `PT10S` / `PT1M` / `PT1H`.
pub fn parse_duration_any(s: &str) -> Result<Duration, String> {
    if let Some(iso) = s.strip_prefix("PT") {
        let mut total: i64 = 0;
        let mut num = String::new();
        for c in iso.chars() {
            if c.is_ascii_digit() || c == '.' {
                num.push(c);
                continue;
            }
            let n: f64 = num.parse().map_err(|_| format!("bad duration `{s}`"))?;
            num.clear();
            total += match c {
                'H' => (n * 3_600_000.0) as i64,
                'M' => (n * 60_000.0) as i64,
                'S' => (n * 1000.0) as i64,
                _ => return Err(format!("bad duration `{s}`")),
            };
        }
        if !num.is_empty() {
            return Err(format!("bad duration `{s}`"));
        }
        return Ok(Duration::from_millis(total));
    }
    s.parse::<Duration>().map_err(|e| e.to_string())
}

fn window_spec(v: Option<&Value>) -> Result<WindowSpec, String> {
    let m = v
        .and_then(Value::as_object)
        .ok_or("`etlantic:window_aggregate` needs `window: {...}`")?;
    let time_column = params_get(m, &["timeField", "column", "field"])
        .and_then(Value::as_str)
        .ok_or("window needs `timeField`")?
        .to_string();
    // A key this decoder does not read would be silently dropped from the window.
    const KNOWN: [&str; 9] = [
        "type",
        "timeField",
        "column",
        "field",
        "size",
        "slide",
        "gap",
        "allowedLateness",
        "allowed_lateness",
    ];
    if let Some(k) = m.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!(
            "unknown window key `{k}` (a window has type, timeField, size, slide, gap and allowedLateness)"
        ));
    }
    let allowed_lateness = match params_get(m, &["allowedLateness", "allowed_lateness"]) {
        None | Some(Value::Null) => Duration::ZERO,
        v => duration(v, "allowedLateness")?,
    };
    let kind = match m.get("type").and_then(Value::as_str).unwrap_or("tumbling") {
        "tumbling" => WindowKind::Tumbling {
            size: duration(m.get("size"), "size")?,
        },
        "sliding" | "hopping" => WindowKind::Sliding {
            size: duration(m.get("size"), "size")?,
            slide: duration(m.get("slide"), "slide")?,
        },
        "session" => WindowKind::Session {
            gap: duration(m.get("gap"), "gap")?,
        },
        other => return Err(format!("unknown window type `{other}`")),
    };
    match &kind {
        WindowKind::Tumbling { size } | WindowKind::Sliding { size, .. }
            if size.as_millis() <= 0 =>
        {
            return Err("window size must be positive".into())
        }
        WindowKind::Sliding { slide, size } if slide.as_millis() <= 0 || slide > size => {
            return Err("slide must be positive and at most the window size".into())
        }
        WindowKind::Session { gap } if gap.as_millis() <= 0 => {
            return Err("session gap must be positive".into())
        }
        _ => {}
    }
    Ok(WindowSpec {
        time_column,
        kind,
        allowed_lateness,
    })
}

/// Decodes an action from its registry id and parameters.
pub fn decode_action(action: &str, params: &Map<String, Value>) -> Result<Action, String> {
    Ok(match action {
        "dtcs:filter" | "dtcs:select" => {
            let predicate = match params_get(params, &["predicate", "condition", "expr"]) {
                Some(p) => Expr::decode(p)?,
                None => {
                    let field = params
                        .get("field")
                        .and_then(Value::as_str)
                        .ok_or("filter needs `predicate`")?;
                    match params.get("equals") {
                        Some(v) => Expr::Binary(
                            crate::ir::expr::BinaryOp::Eq,
                            Box::new(Expr::col(field)),
                            Box::new(Expr::Literal(literal_from_json(v)?)),
                        ),
                        None => Expr::Unary(
                            crate::ir::expr::UnaryOp::Not,
                            Box::new(Expr::Call {
                                function: "dtcs:is_null".into(),
                                args: vec![Expr::col(field)],
                            }),
                        ),
                    }
                }
            };
            Action::Filter { predicate }
        }
        "dtcs:project" => Action::Project {
            fields: named_exprs(params.get("fields"))?,
        },
        "dtcs:with_fields" => {
            let items = params_get(params, &["assignments", "fields"]);
            match window_fields(items)? {
                Some(assignments) => Action::WindowFields { assignments },
                None => Action::WithFields {
                    assignments: named_exprs(items)?,
                },
            }
        }
        "dtcs:drop_fields" => Action::DropFields {
            fields: string_list(params.get("fields"))?,
            ignore_missing: params.get("missingPolicy").and_then(Value::as_str) == Some("ignore"),
        },
        "dtcs:rename_fields" => {
            let mapping = params
                .get("mapping")
                .and_then(Value::as_object)
                .ok_or("rename_fields needs `mapping: {old: new}`")?
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|s| (k.clone(), s.to_string()))
                        .ok_or_else(|| format!("rename target of `{k}` must be a string"))
                })
                .collect::<Result<_, String>>()?;
            Action::RenameFields { mapping }
        }
        "dtcs:join" => {
            let right = params
                .get("right")
                .and_then(Value::as_str)
                .ok_or("join needs `right`")?
                .to_string();
            let ty = params
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("inner");
            let join_type =
                JoinType::parse(ty).ok_or_else(|| format!("unknown join type `{ty}`"))?;
            let left_keys = string_list(params.get("leftKey").or_else(|| params.get("leftKeys")))?;
            let mut right_keys =
                string_list(params.get("rightKey").or_else(|| params.get("rightKeys")))?;
            if right_keys.is_empty() {
                right_keys = left_keys.clone();
            }
            if left_keys.len() != right_keys.len() {
                return Err("join needs as many right keys as left keys".into());
            }
            let predicate = params_get(params, &["predicate", "on"])
                .map(Expr::decode)
                .transpose()?;
            if left_keys.is_empty()
                && predicate.is_none()
                && !params.contains_key(JOIN_TIME_RANGE)
                && join_type != JoinType::Cross
            {
                return Err("join needs `leftKey`/`rightKey` or a `predicate`".into());
            }
            if let Some(policy) = params.get("collisionPolicy").and_then(Value::as_str) {
                if !matches!(policy, "fail" | "error") {
                    return Err(format!(
                        "join collisionPolicy `{policy}` is not supported (use `fail`)"
                    ));
                }
            }
            let time_range = params
                .get(JOIN_TIME_RANGE)
                .map(decode_time_range)
                .transpose()?;
            if time_range.is_some() && matches!(join_type, JoinType::Cross) {
                return Err("a cross join cannot have a time range".into());
            }
            Action::Join {
                right,
                join_type,
                left_keys,
                right_keys,
                predicate,
                null_safe: params
                    .get("nullSafe")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                time_range,
            }
        }
        "dtcs:union" => {
            let other = params
                .get("other")
                .and_then(Value::as_str)
                .ok_or("union needs `other`")?
                .to_string();
            let mode = params
                .get("mode")
                .and_then(Value::as_str)
                .unwrap_or("byName");
            Action::Union {
                other,
                by_name: matches!(mode, "byName" | "by_name"),
                allow_missing: params.get("allowMissingColumns").and_then(Value::as_bool)
                    == Some(true)
                    || params.get("missingColumnPolicy").and_then(Value::as_str)
                        == Some("nullFill"),
                distinct: params.get("duplicatePolicy").and_then(Value::as_str) == Some("distinct"),
            }
        }
        "dtcs:aggregate" | "dtcs:group" => Action::Aggregate {
            group_by: named_exprs(params.get("groupBy"))?,
            aggregates: aggregates(params_get(params, &["aggregates", "aggregations"]))?,
        },
        "dtcs:sort" => {
            let keys = match params.get("keys") {
                Some(Value::Array(a)) => sort_keys(a)?,
                _ => {
                    let field = params
                        .get("field")
                        .and_then(Value::as_str)
                        .ok_or("sort needs `keys`")?;
                    vec![SortKey {
                        expr: Expr::col(field),
                        descending: params.get("descending").and_then(Value::as_bool) == Some(true),
                        nulls_first: false,
                    }]
                }
            };
            Action::Sort { keys }
        }
        "dtcs:limit" => Action::Limit {
            // ETLantic-py writes `n`.
            count: params_get(params, &["count", "n"])
                .and_then(Value::as_u64)
                .ok_or("limit needs a non-negative integer `count`")?,
            offset: params.get("offset").and_then(Value::as_u64).unwrap_or(0),
        },
        "dtcs:distinct" => {
            let fields = string_list(params.get("fields"))?;
            Action::Distinct {
                fields: (!fields.is_empty()).then_some(fields),
            }
        }
        "dtcs:deduplicate" => Action::Deduplicate {
            keys: string_list(params.get("keys"))?,
            keep_last: params.get("retain").and_then(Value::as_str) == Some("last"),
        },
        "dtcs:explode" => {
            let column = params
                .get("expr")
                .or_else(|| params.get("field"))
                .map(|v| match Expr::decode(v) {
                    Ok(Expr::Column(c)) => Ok(c),
                    Ok(other) => Err(format!("explode needs a column, got {other}")),
                    Err(e) => Err(e),
                })
                .transpose()?
                .ok_or("explode needs `expr`")?;
            let names = string_list(params.get("as"))?;
            if names.len() > 1
                || params.get("includePosition").and_then(Value::as_bool) == Some(true)
            {
                return Err("explode with a position column is not supported".into());
            }
            // ETLantic-py's form (`field`, exploded in place) keeps a row whose list is
            // empty or null, with a null element; the `dtcs` crate's form (`expr`, `as`)
            // drops it unless `outer` is set, as Spark's `explode` does.
            let etlantic_py_form = params.get("expr").is_none();
            Action::Explode {
                alias: names.into_iter().next().unwrap_or_else(|| column.clone()),
                column,
                outer: params
                    .get("outer")
                    .and_then(Value::as_bool)
                    .unwrap_or(etlantic_py_form),
            }
        }
        WINDOW_AGGREGATE => Action::WindowAggregate {
            window: window_spec(params.get("window"))?,
            group_by: named_exprs(params.get("groupBy"))?,
            aggregates: aggregates(params_get(params, &["aggregates", "aggregations"]))?,
        },
        DEDUP_WITHIN_WATERMARK => Action::DeduplicateWithinWatermark {
            keys: string_list(params.get("keys"))?,
        },
        PROCESS => decode_process(params)?,
        other => return Err(format!("unsupported action `{other}`")),
    })
}

fn decode_process(params: &Map<String, Value>) -> Result<Action, String> {
    for k in params.keys() {
        if !matches!(
            k.as_str(),
            "processor" | "keys" | "timeMode" | "time_mode" | "options"
        ) {
            return Err(format!(
                "unknown `process` field `{k}` (processor, keys, time_mode, options)"
            ));
        }
    }
    let processor = params
        .get("processor")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or("`process` needs `processor: <name>`")?
        .to_string();
    let keys = string_list(params.get("keys"))?;
    let time_mode = match params_get(params, &["timeMode", "time_mode"]) {
        None | Some(Value::Null) => TimeMode::None,
        Some(Value::String(s)) => TimeMode::parse(s).ok_or_else(|| {
            format!("`time_mode` is none, processing_time or event_time, got `{s}`")
        })?,
        Some(other) => return Err(format!("`time_mode` must be a string, got {other}")),
    };
    let options = match params.get("options") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(other) => return Err(format!("`options` must be a mapping, got {other}")),
    };
    Ok(Action::Process {
        processor,
        keys,
        time_mode,
        options,
    })
}
