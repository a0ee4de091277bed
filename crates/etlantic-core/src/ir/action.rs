//! DTCS semantic actions, decoded from a plan's `actions[]` into typed values, and encoded
//! back in ETLantic-py's dialect. ETLantic's streaming extensions (event-time windows and
//! watermark dedup) are vendor actions in the `etlantic:` namespace with the same shape.

use super::expr::{literal_from_json, Expr};
use crate::streaming::{Duration, TimeMode};
use indexmap::IndexMap;
use serde_json::{json, Map, Value};

/// An expression with the name of the column it produces.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedExpr {
    /// Output column name.
    pub name: String,
    /// The value.
    pub expr: Expr,
}

impl NamedExpr {
    /// A column passed through under its own name.
    pub fn column(name: &str) -> Self {
        NamedExpr {
            name: name.to_string(),
            expr: Expr::col(name),
        }
    }
}

/// Join types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinType {
    /// Matching rows only.
    Inner,
    /// All left rows.
    Left,
    /// All right rows.
    Right,
    /// All rows of both sides.
    Full,
    /// Left rows with a match.
    Semi,
    /// Left rows without a match.
    Anti,
    /// Cartesian product.
    Cross,
}

impl JoinType {
    /// The DTCS name.
    pub fn name(self) -> &'static str {
        match self {
            JoinType::Inner => "inner",
            JoinType::Left => "left",
            JoinType::Right => "right",
            JoinType::Full => "full",
            JoinType::Semi => "semi",
            JoinType::Anti => "anti",
            JoinType::Cross => "cross",
        }
    }

    /// Parses DTCS and Spark spellings.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "inner" => JoinType::Inner,
            "left" | "left_outer" | "leftouter" => JoinType::Left,
            "right" | "right_outer" | "rightouter" => JoinType::Right,
            "full" | "full_outer" | "outer" | "fullouter" => JoinType::Full,
            "semi" | "left_semi" | "leftsemi" => JoinType::Semi,
            "anti" | "left_anti" | "leftanti" => JoinType::Anti,
            "cross" => JoinType::Cross,
            _ => return None,
        })
    }
}

/// An event-time range condition of a join, the ETLantic extension `etlantic:timeRange`
/// of `dtcs:join`: `left.<left> BETWEEN right.<right> - lower AND right.<right> + upper`,
/// both ends inclusive (Spark's time-interval join condition). On unbounded inputs it is
/// what lets a stream-stream join drop old state (see `docs/streaming.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinTimeRange {
    /// The event-time column of the left side (a timestamp).
    pub left: String,
    /// The event-time column of the right side (a timestamp).
    pub right: String,
    /// How far the left time may be before the right time.
    pub lower: Duration,
    /// How far the left time may be after the right time.
    pub upper: Duration,
}

/// Aggregate functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggFunc {
    /// `count(*)`: rows.
    CountAll,
    /// Non-null values.
    Count,
    /// Distinct non-null values.
    CountDistinct,
    /// Sum of non-null values (null when there are none).
    Sum,
    /// Mean of non-null values.
    Average,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// First value in input order.
    First,
    /// Last value in input order.
    Last,
}

impl AggFunc {
    /// The DTCS function id.
    pub fn id(self) -> &'static str {
        match self {
            AggFunc::CountAll => "dtcs:count_all",
            AggFunc::Count => "dtcs:count",
            AggFunc::CountDistinct => "dtcs:count_distinct",
            AggFunc::Sum => "dtcs:sum",
            AggFunc::Average => "dtcs:average",
            AggFunc::Min => "dtcs:min",
            AggFunc::Max => "dtcs:max",
            AggFunc::First => "dtcs:first",
            AggFunc::Last => "dtcs:last",
        }
    }

    /// Parses a function id or short name.
    pub fn parse(s: &str) -> Option<Self> {
        let short = s.strip_prefix("dtcs:").unwrap_or(s).to_ascii_lowercase();
        Some(match short.as_str() {
            "count_all" | "count(*)" => AggFunc::CountAll,
            "count" => AggFunc::Count,
            "count_distinct" => AggFunc::CountDistinct,
            "sum" => AggFunc::Sum,
            "average" | "avg" | "mean" => AggFunc::Average,
            "min" => AggFunc::Min,
            "max" => AggFunc::Max,
            "first" => AggFunc::First,
            "last" => AggFunc::Last,
            _ => return None,
        })
    }
}

/// One aggregate of an aggregation.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregate {
    /// Output column.
    pub name: String,
    /// The function.
    pub func: AggFunc,
    /// Its argument (`None` for `count_all`).
    pub arg: Option<Expr>,
}

/// A sort key.
#[derive(Clone, Debug, PartialEq)]
pub struct SortKey {
    /// What to sort by.
    pub expr: Expr,
    /// Descending order.
    pub descending: bool,
    /// Nulls first (DTCS default: nulls last).
    pub nulls_first: bool,
}

/// The geometry of an event-time window.
#[derive(Clone, Debug, PartialEq)]
pub enum WindowKind {
    /// Fixed, non-overlapping windows aligned to the epoch.
    Tumbling {
        /// Window length.
        size: Duration,
    },
    /// Overlapping windows `[k*slide, k*slide+size)`.
    Sliding {
        /// Window length.
        size: Duration,
        /// Distance between window starts.
        slide: Duration,
    },
    /// Per-key sessions closed by `gap` of inactivity.
    Session {
        /// Inactivity gap.
        gap: Duration,
    },
}

/// An event-time window over a timestamp column.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSpec {
    /// The event-time column.
    pub time_column: String,
    /// Its geometry.
    pub kind: WindowKind,
}

/// A decoded semantic action.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// `dtcs:filter` / `dtcs:select`: keep rows whose predicate is true.
    Filter {
        /// The predicate (three-valued; null drops the row).
        predicate: Expr,
    },
    /// `dtcs:project`: exactly these columns, in this order.
    Project {
        /// Output columns.
        fields: Vec<NamedExpr>,
    },
    /// `dtcs:with_fields`: add or replace columns, evaluated in order.
    WithFields {
        /// Assignments.
        assignments: Vec<NamedExpr>,
    },
    /// `dtcs:drop_fields`.
    DropFields {
        /// Columns to drop.
        fields: Vec<String>,
        /// Whether a missing column is ignored (`missingPolicy: ignore`).
        ignore_missing: bool,
    },
    /// `dtcs:rename_fields`.
    RenameFields {
        /// old → new.
        mapping: IndexMap<String, String>,
    },
    /// `dtcs:join`: the target is the left side.
    Join {
        /// The right relation.
        right: String,
        /// Join type.
        join_type: JoinType,
        /// Left key columns.
        left_keys: Vec<String>,
        /// Right key columns (same length as `left_keys`).
        right_keys: Vec<String>,
        /// A predicate over the joined row (instead of, or in addition to, keys).
        predicate: Option<Expr>,
        /// Whether null keys match each other.
        null_safe: bool,
        /// An event-time range condition (`etlantic:timeRange`), AND-ed with the keys.
        time_range: Option<JoinTimeRange>,
    },
    /// `dtcs:union`: target ∪ other.
    Union {
        /// The other relation.
        other: String,
        /// Align columns by name (else by position).
        by_name: bool,
        /// Fill columns missing on one side with nulls (by-name only).
        allow_missing: bool,
        /// Remove duplicate rows.
        distinct: bool,
    },
    /// `dtcs:aggregate` / `dtcs:group`.
    Aggregate {
        /// Grouping columns.
        group_by: Vec<NamedExpr>,
        /// Aggregates.
        aggregates: Vec<Aggregate>,
    },
    /// `dtcs:sort` (stable).
    Sort {
        /// Keys, most significant first.
        keys: Vec<SortKey>,
    },
    /// `dtcs:limit`.
    Limit {
        /// Rows to keep.
        count: u64,
        /// Rows to skip first.
        offset: u64,
    },
    /// `dtcs:distinct`: first row of each group of equal rows (or equal `fields`).
    Distinct {
        /// Columns compared (all when `None`).
        fields: Option<Vec<String>>,
    },
    /// `dtcs:deduplicate`: first (or last) row per key. On an unbounded input with a
    /// watermark it is Spark's `dropDuplicates` (state kept until the watermark passes
    /// the event time in the key).
    Deduplicate {
        /// Key columns (all columns when empty).
        keys: Vec<String>,
        /// Keep the last row instead of the first (bounded inputs only).
        keep_last: bool,
    },
    /// `dtcs:explode`: one row per list element.
    Explode {
        /// The list column.
        column: String,
        /// Name of the element column.
        alias: String,
        /// Keep rows with empty or null lists (with a null element).
        outer: bool,
    },
    /// `etlantic:window_aggregate`: event-time window aggregation. Output columns are
    /// `window_start`, `window_end`, the group columns, then the aggregates.
    WindowAggregate {
        /// The window.
        window: WindowSpec,
        /// Grouping columns besides the window.
        group_by: Vec<NamedExpr>,
        /// Aggregates.
        aggregates: Vec<Aggregate>,
    },
    /// `etlantic:deduplicate_within_watermark`: Spark's `dropDuplicatesWithinWatermark`.
    DeduplicateWithinWatermark {
        /// Key columns.
        keys: Vec<String>,
    },
    /// `etlantic:process`: a custom stateful processor (Spark's `transformWithState`)
    /// over the rows grouped by `keys`; its output schema is the processor's.
    Process {
        /// The name of a linked [`crate::plugin::ProcessorProvider`].
        processor: String,
        /// Grouping key columns.
        keys: Vec<String>,
        /// The clock its timers follow.
        time_mode: TimeMode,
        /// Processor options (a JSON object).
        options: Value,
    },
}

/// An action of a plan with its identity and the relation it applies to.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionNode {
    /// Node id, unique in the plan.
    pub id: String,
    /// Registry id, e.g. `dtcs:filter`.
    pub action: String,
    /// The relation it applies to: an input id or an earlier action id.
    pub target: String,
    /// The decoded action.
    pub op: Action,
}

impl ActionNode {
    /// Node `id` applying `op` to `target`, with `op`'s registry id.
    pub fn new(id: impl Into<String>, target: impl Into<String>, op: Action) -> Self {
        ActionNode {
            id: id.into(),
            action: op.id().into(),
            target: target.into(),
            op,
        }
    }
}

impl Action {
    /// The action with every parameter reference (`Expr::Parameter`) replaced by its value
    /// from `params`; `ETL209` names the first parameter that has no value.
    pub fn bind_parameters(&self, params: &IndexMap<String, Value>) -> crate::Result<Action> {
        let mut action = self.clone();
        let bind = |e: &mut Expr| -> crate::Result<()> {
            *e = e.bind_parameters(params).map_err(|m| {
                crate::diagnostics::Diagnostic::new(
                    &crate::diagnostics::codes::UNKNOWN_PARAMETER,
                    m,
                )
                .help("Give the value under `parameters:` of the transformation.")
            })?;
            Ok(())
        };
        match &mut action {
            Action::Filter { predicate } => bind(predicate)?,
            Action::Project { fields }
            | Action::WithFields {
                assignments: fields,
            } => {
                for f in fields {
                    bind(&mut f.expr)?;
                }
            }
            Action::Join {
                predicate: Some(p), ..
            } => bind(p)?,
            Action::Aggregate {
                group_by,
                aggregates,
            }
            | Action::WindowAggregate {
                group_by,
                aggregates,
                ..
            } => {
                for g in group_by {
                    bind(&mut g.expr)?;
                }
                for a in aggregates {
                    if let Some(e) = &mut a.arg {
                        bind(e)?;
                    }
                }
            }
            Action::Sort { keys } => {
                for k in keys {
                    bind(&mut k.expr)?;
                }
            }
            _ => {}
        }
        Ok(action)
    }

    /// The registry id.
    pub fn id(&self) -> &'static str {
        match self {
            Action::Filter { .. } => "dtcs:filter",
            Action::Project { .. } => "dtcs:project",
            Action::WithFields { .. } => "dtcs:with_fields",
            Action::DropFields { .. } => "dtcs:drop_fields",
            Action::RenameFields { .. } => "dtcs:rename_fields",
            Action::Join { .. } => "dtcs:join",
            Action::Union { .. } => "dtcs:union",
            Action::Aggregate { .. } => "dtcs:aggregate",
            Action::Sort { .. } => "dtcs:sort",
            Action::Limit { .. } => "dtcs:limit",
            Action::Distinct { .. } => "dtcs:distinct",
            Action::Deduplicate { .. } => "dtcs:deduplicate",
            Action::Explode { .. } => "dtcs:explode",
            Action::WindowAggregate { .. } => WINDOW_AGGREGATE,
            Action::DeduplicateWithinWatermark { .. } => DEDUP_WITHIN_WATERMARK,
            Action::Process { .. } => PROCESS,
        }
    }

    /// Relations other than the target that this action reads.
    pub fn secondary_inputs(&self) -> Vec<&str> {
        match self {
            Action::Join { right, .. } => vec![right.as_str()],
            Action::Union { other, .. } => vec![other.as_str()],
            _ => vec![],
        }
    }

    /// Renames the secondary input relations (used when resolving SSA names).
    pub fn map_secondary(&mut self, f: impl Fn(&str) -> String) {
        match self {
            Action::Join { right, .. } => *right = f(right),
            Action::Union { other, .. } => *other = f(other),
            _ => {}
        }
    }

    /// Whether it keeps state across micro-batches on an unbounded input.
    pub fn is_stateful(&self) -> bool {
        matches!(
            self,
            Action::Aggregate { .. }
                | Action::WindowAggregate { .. }
                | Action::Deduplicate { .. }
                | Action::DeduplicateWithinWatermark { .. }
                | Action::Distinct { .. }
                | Action::Process { .. }
        )
    }

    /// Whether it is an aggregation (the output-mode rules care).
    pub fn is_aggregation(&self) -> bool {
        matches!(
            self,
            Action::Aggregate { .. } | Action::WindowAggregate { .. }
        )
    }

    /// Every expression of the action (for reference and function checks).
    pub fn expressions(&self) -> Vec<&Expr> {
        match self {
            Action::Filter { predicate } => vec![predicate],
            Action::Project { fields } => fields.iter().map(|f| &f.expr).collect(),
            Action::WithFields { assignments } => assignments.iter().map(|f| &f.expr).collect(),
            Action::Join { predicate, .. } => predicate.iter().collect(),
            Action::Aggregate {
                group_by,
                aggregates,
            }
            | Action::WindowAggregate {
                group_by,
                aggregates,
                ..
            } => group_by
                .iter()
                .map(|g| &g.expr)
                .chain(aggregates.iter().filter_map(|a| a.arg.as_ref()))
                .collect(),
            Action::Sort { keys } => keys.iter().map(|k| &k.expr).collect(),
            _ => vec![],
        }
    }
}

/// The vendor action id of event-time window aggregation.
pub const WINDOW_AGGREGATE: &str = "etlantic:window_aggregate";
/// The vendor action id of dedup within the watermark.
pub const DEDUP_WITHIN_WATERMARK: &str = "etlantic:deduplicate_within_watermark";
/// The vendor action id of a custom stateful processor.
pub const PROCESS: &str = "etlantic:process";
/// The vendor parameter of `dtcs:join` holding its event-time range condition.
pub const JOIN_TIME_RANGE: &str = "etlantic:timeRange";

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

/// Encodes a time range as `{left, right, lower, upper}`.
pub fn encode_time_range(r: &JoinTimeRange) -> Value {
    json!({"left": r.left, "right": r.right, "lower": r.lower.to_string(), "upper": r.upper.to_string()})
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

fn aggregates(v: Option<&Value>) -> Result<Vec<Aggregate>, String> {
    let items = v
        .and_then(Value::as_array)
        .ok_or("an aggregation needs `aggregates: [...]`")?;
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
                    Expr::Call { function, mut args } => {
                        let func = AggFunc::parse(&function)
                            .ok_or_else(|| format!("`{function}` is not an aggregate function"))?;
                        let arg = if args.is_empty() {
                            None
                        } else {
                            Some(args.remove(0))
                        };
                        Ok(Aggregate { name, func, arg })
                    }
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
    Ok(WindowSpec { time_column, kind })
}

fn encode_window(w: &WindowSpec) -> Value {
    match &w.kind {
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
    }
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
                            super::expr::BinaryOp::Eq,
                            Box::new(Expr::col(field)),
                            Box::new(Expr::Literal(literal_from_json(v)?)),
                        ),
                        None => Expr::Unary(
                            super::expr::UnaryOp::Not,
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
        "dtcs:with_fields" => Action::WithFields {
            assignments: named_exprs(params_get(params, &["assignments", "fields"]))?,
        },
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
            aggregates: aggregates(params.get("aggregates"))?,
        },
        "dtcs:sort" => {
            let keys = match params.get("keys") {
                Some(Value::Array(a)) => a
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
                                m.get("field")
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
                    .collect::<Result<_, String>>()?,
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
            count: params
                .get("count")
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
            Action::Explode {
                alias: names.into_iter().next().unwrap_or_else(|| column.clone()),
                column,
                outer: params
                    .get("outer")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            }
        }
        WINDOW_AGGREGATE => Action::WindowAggregate {
            window: window_spec(params.get("window"))?,
            group_by: named_exprs(params.get("groupBy"))?,
            aggregates: aggregates(params.get("aggregates"))?,
        },
        DEDUP_WITHIN_WATERMARK => Action::DeduplicateWithinWatermark {
            keys: string_list(params.get("keys"))?,
        },
        PROCESS => decode_process(params)?,
        other => return Err(format!("unsupported action `{other}`")),
    })
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
                json!({"name": a.name, "expression": {
                    "kind": "call", "callee": a.func.id(),
                    "args": a.arg.iter().map(Expr::encode).collect::<Vec<_>>(),
                }})
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
        Action::Sort { keys } => json!({"keys": Value::Array(keys.iter().map(|k| {
            let mut v = json!({"expression": k.expr.encode(), "direction": if k.descending { "desc" } else { "asc" }});
            if k.nulls_first { v["nulls"] = json!("first"); }
            v
        }).collect())}),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn binds_parameters_and_reports_missing_values() {
        let a = Action::Filter {
            predicate: Expr::Binary(
                super::super::expr::BinaryOp::GtEq,
                Box::new(Expr::col("amount")),
                Box::new(Expr::Parameter("min".into())),
            ),
        };
        let mut p = IndexMap::new();
        p.insert("min".to_string(), json!(20));
        match a.bind_parameters(&p).unwrap() {
            Action::Filter { predicate } => assert_eq!(
                predicate,
                Expr::Binary(
                    super::super::expr::BinaryOp::GtEq,
                    Box::new(Expr::col("amount")),
                    Box::new(Expr::Literal(super::super::expr::Literal::Integer(20)))
                )
            ),
            _ => panic!("not a filter"),
        }
        let e = a.bind_parameters(&IndexMap::new()).unwrap_err();
        assert_eq!(e.code(), "ETL209");
        assert!(e.to_string().contains("`min`"));
    }

    #[test]
    fn decodes_py_and_crate_aggregate_forms() {
        let py = decode_action(
            "dtcs:aggregate",
            &obj(json!({"groupBy": ["g"], "aggregates": [{"name": "t", "expression": {"kind": "call", "callee": "dtcs:sum", "args": [{"kind": "fieldRef", "target": "v"}]}}]})),
        )
        .unwrap();
        let krate = decode_action(
            "dtcs:aggregate",
            &obj(json!({"groupBy": ["g"], "aggregates": [{"as": "t", "op": "sum", "field": "v"}]})),
        )
        .unwrap();
        assert_eq!(py, krate);
        let back = decode_action("dtcs:aggregate", &obj(encode_action(&py).unwrap())).unwrap();
        assert_eq!(back, py);
    }

    #[test]
    fn window_actions_round_trip() {
        let a = decode_action(
            WINDOW_AGGREGATE,
            &obj(json!({"window": {"type": "sliding", "timeField": "ts", "size": "PT10S", "slide": "5 seconds"},
                        "groupBy": ["user"], "aggregates": [{"as": "n", "op": "count_all"}]})),
        )
        .unwrap();
        match &a {
            Action::WindowAggregate { window, .. } => assert_eq!(
                window.kind,
                WindowKind::Sliding {
                    size: Duration::from_secs(10),
                    slide: Duration::from_secs(5)
                }
            ),
            _ => panic!(),
        }
        assert_eq!(
            decode_action(WINDOW_AGGREGATE, &obj(encode_action(&a).unwrap())).unwrap(),
            a
        );
        assert!(decode_action(
            WINDOW_AGGREGATE,
            &obj(json!({"window": {"type": "sliding", "timeField": "ts", "size": "5 seconds", "slide": "10 seconds"}, "aggregates": []}))
        )
        .is_err());
    }

    #[test]
    fn join_time_range_decodes_and_round_trips() {
        let a = decode_action(
            "dtcs:join",
            &obj(json!({"right": "clicks", "leftKey": "ad_id", "type": "left_outer",
                        "etlantic:timeRange": {"left": "imp_ts", "right": "click_ts", "lower": "20 seconds", "upper": "PT5S"}})),
        )
        .unwrap();
        let Action::Join {
            time_range: Some(r),
            join_type,
            ..
        } = &a
        else {
            panic!("{a:?}")
        };
        assert_eq!(*join_type, JoinType::Left);
        assert_eq!(
            r,
            &JoinTimeRange {
                left: "imp_ts".into(),
                right: "click_ts".into(),
                lower: Duration::from_secs(20),
                upper: Duration::from_secs(5),
            }
        );
        let enc = encode_action(&a).unwrap();
        assert_eq!(enc[JOIN_TIME_RANGE]["lower"], json!("20 seconds"));
        assert_eq!(decode_action("dtcs:join", &obj(enc)).unwrap(), a);
        // A time range alone is a condition; bad ranges are refused.
        assert!(decode_action(
            "dtcs:join",
            &obj(json!({"right": "r", "etlantic:timeRange": {"left": "a", "right": "b"}}))
        )
        .is_ok());
        for bad in [
            json!({"left": "a"}),
            json!({"left": "a", "right": "b", "lower": 5}),
            json!({"left": "a", "right": "b", "within": "5 seconds"}),
            json!({"left": "a", "right": "b", "lower": "-5 seconds"}),
        ] {
            assert!(
                decode_action(
                    "dtcs:join",
                    &obj(json!({"right": "r", "leftKey": "k", JOIN_TIME_RANGE: bad}))
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_action_round_trips() {
        let samples = vec![
            ("dtcs:filter", json!({"predicate": "a > 1"})),
            (
                "dtcs:project",
                json!({"fields": ["a", {"name": "b2", "expression": "b * 2"}]}),
            ),
            (
                "dtcs:with_fields",
                json!({"assignments": [{"as": "c", "expr": "a + 1"}]}),
            ),
            (
                "dtcs:drop_fields",
                json!({"fields": ["a"], "missingPolicy": "ignore"}),
            ),
            ("dtcs:rename_fields", json!({"mapping": {"a": "x"}})),
            (
                "dtcs:join",
                json!({"right": "r", "leftKey": ["a", "b"], "rightKey": ["c", "d"], "type": "left"}),
            ),
            (
                "dtcs:join",
                json!({"right": "r", "leftKey": "ad", "type": "full",
                       "etlantic:timeRange": {"left": "imp_ts", "right": "click_ts", "lower": "20 seconds", "upper": "PT0S"}}),
            ),
            (
                "dtcs:union",
                json!({"other": "o", "mode": "byName", "allowMissingColumns": true}),
            ),
            (
                "dtcs:sort",
                json!({"keys": [{"field": "a", "descending": true, "nulls": "first"}]}),
            ),
            ("dtcs:limit", json!({"count": 3, "offset": 1})),
            ("dtcs:distinct", json!({})),
            (
                "dtcs:deduplicate",
                json!({"keys": ["id"], "retain": "last"}),
            ),
            (
                "dtcs:explode",
                json!({"expr": "items", "as": ["item"], "outer": true}),
            ),
            (DEDUP_WITHIN_WATERMARK, json!({"keys": ["id"]})),
        ];
        for (id, p) in samples {
            let a = decode_action(id, &obj(p)).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(a.id(), id);
            let enc = encode_action(&a).unwrap_or(json!({}));
            assert_eq!(decode_action(id, &obj(enc)).unwrap(), a, "{id}");
        }
        assert!(decode_action("dtcs:pivot", &Map::new()).is_err());
        assert!(decode_action("dtcs:limit", &obj(json!({"count": -1}))).is_err());
    }
}
