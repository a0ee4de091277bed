//! DTCS semantic actions, decoded from a plan's `actions[]` into typed values, and encoded
//! back in ETLantic-py's dialect. ETLantic's streaming extensions (event-time windows and
//! watermark dedup) are vendor actions in the `etlantic:` namespace with the same shape.

use super::expr::Expr;
use crate::streaming::{Duration, TimeMode};
use indexmap::IndexMap;
use serde_json::Value;

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub(crate) use decode::aggregate_call;
pub use decode::{decode_action, decode_time_range, parse_duration_any};
pub use encode::{encode_action, encode_time_range};

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
    /// Sample variance of non-null numbers (`n - 1` in the denominator); null for fewer
    /// than two values.
    Variance,
    /// Population variance (`dtcs:variance(x, 'population')`); null for no values.
    VariancePopulation,
    /// Sample standard deviation; null for fewer than two values.
    Stddev,
    /// Population standard deviation (`dtcs:stddev(x, 'population')`).
    StddevPopulation,
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
            AggFunc::Variance | AggFunc::VariancePopulation => "dtcs:variance",
            AggFunc::Stddev | AggFunc::StddevPopulation => "dtcs:stddev",
        }
    }

    /// The mode argument DTCS writes after the value (`'population'`), if any.
    pub fn mode(self) -> Option<&'static str> {
        matches!(
            self,
            AggFunc::VariancePopulation | AggFunc::StddevPopulation
        )
        .then_some("population")
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
            "variance" | "var_samp" => AggFunc::Variance,
            "var_pop" => AggFunc::VariancePopulation,
            "stddev" | "stddev_samp" => AggFunc::Stddev,
            "stddev_pop" => AggFunc::StddevPopulation,
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
    /// How long a window stays open after the watermark passes its end (Flink's and
    /// Beam's *allowed lateness*): a late row within it updates the window, which is
    /// emitted again in update mode; append mode emits each window once, when the
    /// watermark passes its end plus this. Zero (the default) is Spark's behaviour.
    pub allowed_lateness: Duration,
}

impl WindowSpec {
    /// A window over `time_column` without allowed lateness.
    pub fn new(time_column: impl Into<String>, kind: WindowKind) -> Self {
        WindowSpec {
            time_column: time_column.into(),
            kind,
            allowed_lateness: Duration::ZERO,
        }
    }
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
    /// `dtcs:with_fields` whose assignments are window functions (`window:
    /// {partitionBy, orderBy}` on each): every row gets the function's value over the
    /// rows of its partition in the window's order. Bounded inputs only.
    WindowFields {
        /// Assignments, evaluated over the same input rows.
        assignments: Vec<WindowField>,
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

/// The window functions of [`Action::WindowFields`].
pub const WINDOW_FUNCTIONS: &[&str] = &[
    "dtcs:row_number",
    "dtcs:rank",
    "dtcs:dense_rank",
    "dtcs:lag",
    "dtcs:lead",
];

/// One window-function assignment of [`Action::WindowFields`].
#[derive(Clone, Debug, PartialEq)]
pub struct WindowField {
    /// Output column.
    pub name: String,
    /// The call of one of [`WINDOW_FUNCTIONS`]: `row_number()`, `rank()`,
    /// `dense_rank()`, `lag(x[, offset[, default]])`, `lead(x[, offset[, default]])`.
    pub call: Expr,
    /// Partition columns (one partition when empty).
    pub partition_by: Vec<Expr>,
    /// The order within a partition; rows equal in it keep their input order.
    pub order_by: Vec<SortKey>,
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
            Action::WindowFields { assignments } => {
                for a in assignments {
                    bind(&mut a.call)?;
                    for p in &mut a.partition_by {
                        bind(p)?;
                    }
                    for k in &mut a.order_by {
                        bind(&mut k.expr)?;
                    }
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
            Action::WithFields { .. } | Action::WindowFields { .. } => "dtcs:with_fields",
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

    /// The columns a `with_fields`-like action assigns (adds or replaces), in order:
    /// its row assignments or its window-function assignments; empty for any other
    /// action.
    pub fn assigned_columns(&self) -> Vec<&str> {
        match self {
            Action::WithFields { assignments } => {
                assignments.iter().map(|a| a.name.as_str()).collect()
            }
            Action::WindowFields { assignments } => {
                assignments.iter().map(|a| a.name.as_str()).collect()
            }
            _ => vec![],
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
            Action::WindowFields { assignments } => assignments
                .iter()
                .flat_map(|a| {
                    std::iter::once(&a.call)
                        .chain(&a.partition_by)
                        .chain(a.order_by.iter().map(|k| &k.expr))
                })
                .collect(),
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
