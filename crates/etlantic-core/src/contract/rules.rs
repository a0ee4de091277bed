//! A contract's quality rules as ETLantic evaluates them: one typed [`Rule`] per check,
//! with a stable id, a scope, a threshold and a policy.
//!
//! Rules come from three places in an ODCS v3 document:
//!
//! | ODCS | rule | scope |
//! |---|---|---|
//! | `logicalTypeOptions` `minimum`/`maximum`/`exclusive*` | [`Check::Range`] | record |
//! | `logicalTypeOptions` `minLength`/`maxLength` | [`Check::Length`] | record |
//! | `logicalTypeOptions` `pattern` | [`Check::Pattern`] | record |
//! | property `unique: true` | [`Check::DuplicateValues`] over the column | batch |
//! | `quality` `metric: nullValues` | [`Check::NullValues`] | batch |
//! | `quality` `metric: missingValues` (`arguments.missingValues`) | [`Check::MissingValues`] | batch |
//! | `quality` `metric: invalidValues` (`arguments.validValues`, `arguments.pattern`) | [`Check::InvalidValues`] | batch |
//! | `quality` `metric: duplicateValues` (`arguments.properties` at object level) | [`Check::DuplicateValues`] | batch |
//! | `quality` `metric: rowCount` | [`Check::RowCount`] | batch |
//! | `quality` `type: sql` | [`Check::Sql`] | batch |
//!
//! `required` and the column types are checked while records are decoded (a record that
//! does not fit the schema cannot be kept); they are not listed here.
//!
//! **Scope.** A record rule judges each record on its own. A batch rule measures a
//! micro-batch (in a batch run: the whole input) and compares the measure with the rule's
//! [`Threshold`] (ODCS `mustBe`, `mustBeLessThan`, …, with `unit: rows | percent`); a rule
//! without a threshold means `mustBe: 0`. A batch rule fails when its measure breaks the
//! threshold.
//!
//! **Policy.** What happens when a rule fails is operational, so the profile decides it
//! (`quality.policies`, by rule id), falling back to the rule's own `customProperties`
//! entry `etlantic.policy`, then to the profile's `on_error` for rules that point at
//! records and [`Policy::Warn`] for a row count. [`Policy::Drop`] and [`Policy::Quarantine`]
//! act on the records that violate the rule ([`Check::offending_rows`]): the rows with a
//! null, a missing or an invalid value, or the second and later rows of a duplicated key.
//! A rule that points at no rows (`rowCount`, `sql`) accepts only `fail` and `warn`.
//!
//! **Ids.** `<object>.<field>.<check>` for rules derived from a property
//! (`orders.amount.range`), the rule's own `id` or `name` when it has one, else
//! `<object>[.<field>].quality[<i>]`. Ids are unique within a contract.

use super::Contract;
use crate::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use odcs::model::DataQuality;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What happens when a rule fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Stop the query with `ETL705`; the micro-batch is not committed.
    Fail,
    /// Remove the offending records and count them.
    Drop,
    /// Send the offending records to the dead-letter output with the rule, the reason and
    /// their position; count them.
    Quarantine,
    /// Keep everything; count the violations (progress and run report).
    Warn,
}

impl Policy {
    /// The policy's name as written in profiles.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fail => "fail",
            Policy::Drop => "drop",
            Policy::Quarantine => "quarantine",
            Policy::Warn => "warn",
        }
    }

    /// Parses a policy name.
    pub fn parse(text: &str) -> Option<Policy> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "fail" => Policy::Fail,
            "drop" => Policy::Drop,
            "quarantine" => Policy::Quarantine,
            "warn" => Policy::Warn,
            _ => return None,
        })
    }
}

/// Whether a rule judges records one by one or measures a whole batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Each record on its own.
    Record,
    /// A measure over the micro-batch, compared with a threshold.
    Batch,
}

/// The unit of a batch measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasureUnit {
    /// A number of rows.
    #[default]
    Rows,
    /// Offending rows as a percentage of the batch's rows (0 for an empty batch).
    Percent,
}

/// An ODCS threshold on a measure. Every bound that is set must hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Threshold {
    /// `mustBe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub must_be: Option<f64>,
    /// `mustNotBe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub must_not_be: Option<f64>,
    /// `mustBeGreaterThan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greater_than: Option<f64>,
    /// `mustBeGreaterOrEqualTo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greater_or_equal: Option<f64>,
    /// `mustBeLessThan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub less_than: Option<f64>,
    /// `mustBeLessOrEqualTo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub less_or_equal: Option<f64>,
    /// `mustBeBetween` (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<(f64, f64)>,
    /// `mustNotBeBetween` (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_between: Option<(f64, f64)>,
}

impl Threshold {
    /// `mustBe: 0`, the threshold of a rule that states none.
    pub fn zero() -> Self {
        Threshold {
            must_be: Some(0.0),
            ..Threshold::default()
        }
    }

    /// Whether no bound is set.
    pub fn is_empty(&self) -> bool {
        *self == Threshold::default()
    }

    /// Whether `value` satisfies every bound.
    pub fn holds(&self, value: f64) -> bool {
        self.must_be.is_none_or(|b| value == b)
            && self.must_not_be.is_none_or(|b| value != b)
            && self.greater_than.is_none_or(|b| value > b)
            && self.greater_or_equal.is_none_or(|b| value >= b)
            && self.less_than.is_none_or(|b| value < b)
            && self.less_or_equal.is_none_or(|b| value <= b)
            && self
                .between
                .is_none_or(|(lo, hi)| lo <= value && value <= hi)
            && self
                .not_between
                .is_none_or(|(lo, hi)| value < lo || hi < value)
    }

    /// The threshold in ODCS words, for messages (`mustBe 0`, `mustBeLessThan 5`, …).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |name: &str, v: Option<f64>| {
            if let Some(v) = v {
                parts.push(format!("{name} {v}"));
            }
        };
        add("mustBe", self.must_be);
        add("mustNotBe", self.must_not_be);
        add("mustBeGreaterThan", self.greater_than);
        add("mustBeGreaterOrEqualTo", self.greater_or_equal);
        add("mustBeLessThan", self.less_than);
        add("mustBeLessOrEqualTo", self.less_or_equal);
        if let Some((lo, hi)) = self.between {
            parts.push(format!("mustBeBetween [{lo}, {hi}]"));
        }
        if let Some((lo, hi)) = self.not_between {
            parts.push(format!("mustNotBeBetween [{lo}, {hi}]"));
        }
        parts.join(" and ")
    }
}

/// What a rule checks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Check {
    /// A number within bounds (nulls pass).
    Range {
        /// Inclusive lower bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        minimum: Option<f64>,
        /// Inclusive upper bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        maximum: Option<f64>,
        /// Exclusive lower bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exclusive_minimum: Option<f64>,
        /// Exclusive upper bound.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exclusive_maximum: Option<f64>,
    },
    /// A string's length in characters within bounds (nulls pass).
    Length {
        /// Minimum length.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u64>,
        /// Maximum length.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u64>,
    },
    /// A string matching a regular expression as a whole (nulls pass).
    Pattern {
        /// The expression.
        pattern: String,
    },
    /// Rows whose value is null.
    NullValues,
    /// Rows whose value is one of `values` (a `null` in the list counts nulls).
    MissingValues {
        /// The values that mean "missing".
        values: Vec<Value>,
    },
    /// Rows whose non-null value is not among `valid` or does not match `pattern`.
    InvalidValues {
        /// The valid values, when listed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        valid: Option<Vec<Value>>,
        /// A regular expression valid strings match as a whole.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pattern: Option<String>,
    },
    /// Rows whose key (the columns) already occurred earlier in the batch; null keys are
    /// ordinary keys.
    DuplicateValues {
        /// The key columns.
        columns: Vec<String>,
    },
    /// The number of rows of the batch.
    RowCount,
    /// A SQL query over the batch (the table is named after the schema object) returning
    /// one number.
    Sql {
        /// The query.
        query: String,
    },
}

impl Check {
    /// Whether the check points at offending records (so `drop` and `quarantine` apply).
    pub fn offending_rows(&self) -> bool {
        !matches!(self, Check::RowCount | Check::Sql { .. })
    }

    /// The scope the check is evaluated in.
    pub fn scope(&self) -> Scope {
        match self {
            Check::Range { .. } | Check::Length { .. } | Check::Pattern { .. } => Scope::Record,
            _ => Scope::Batch,
        }
    }

    /// A short name (`range`, `null_values`, …), the last part of derived rule ids.
    pub fn name(&self) -> &'static str {
        match self {
            Check::Range { .. } => "range",
            Check::Length { .. } => "length",
            Check::Pattern { .. } => "pattern",
            Check::NullValues => "null_values",
            Check::MissingValues { .. } => "missing_values",
            Check::InvalidValues { .. } => "invalid_values",
            Check::DuplicateValues { .. } => "duplicate_values",
            Check::RowCount => "row_count",
            Check::Sql { .. } => "sql",
        }
    }
}

/// One quality rule of a contract.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Stable id (see the module docs).
    pub id: String,
    /// The property the rule is about (`None` for an object-level rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is checked.
    pub check: Check,
    /// The bound on the measure (batch rules; record rules always use `mustBe 0`).
    pub threshold: Threshold,
    /// The measure's unit.
    #[serde(default)]
    pub unit: MeasureUnit,
    /// The policy the contract itself asks for (`customProperties: etlantic.policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_policy: Option<Policy>,
    /// Where the rule is in the document (`schema[orders].properties[amount].quality[0]`).
    pub path: String,
    /// The rule's description, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl Rule {
    /// The scope of the rule's check.
    pub fn scope(&self) -> Scope {
        self.check.scope()
    }

    /// The policy in force: `configured` (the profile's, by id) over the contract's own,
    /// over the default (`on_error` for rules that point at records, `warn` otherwise).
    pub fn policy(&self, configured: Option<Policy>, on_error: Policy) -> Policy {
        configured
            .or(self.declared_policy)
            .unwrap_or(if self.check.offending_rows() {
                on_error
            } else {
                Policy::Warn
            })
    }
}

/// A quality rule ETLantic cannot evaluate (`type: text`, `type: custom` for another
/// engine, an unknown metric): the plan lists it instead of skipping it silently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnevaluatedRule {
    /// The rule's id.
    pub id: String,
    /// Where the rule is in the document.
    pub path: String,
    /// Why it is not evaluated.
    pub reason: String,
}

/// The rules of a contract's schema object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleSet {
    /// The rules ETLantic evaluates, in document order.
    pub rules: Vec<Rule>,
    /// The rules it cannot evaluate.
    pub unevaluated: Vec<UnevaluatedRule>,
}

impl RuleSet {
    /// Reads the rules of `contract`'s schema object. A rule that is malformed (a metric
    /// without the arguments it needs, a policy name that does not exist, a regular
    /// expression that does not compile, an id used twice) is an `ETL005` error.
    pub fn of(contract: &Contract) -> Result<RuleSet> {
        let object = contract.object.clone();
        let mut set = RuleSet::default();
        let mut diags = Diagnostics::new();
        let Some(schema) = contract
            .document
            .schema
            .iter()
            .find(|o| o.name() == Some(object.as_str()))
        else {
            return Ok(set);
        };
        for prop in &schema.properties {
            let Some(name) = prop.name() else { continue };
            if let Some(cf) = contract.field(name) {
                let c = &cf.constraints;
                let base = format!("schema[{object}].properties[{name}].logicalTypeOptions");
                let mut derived = |check: Check| {
                    set.rules.push(Rule {
                        id: format!("{object}.{name}.{}", check.name()),
                        field: Some(name.to_string()),
                        check,
                        threshold: Threshold::zero(),
                        unit: MeasureUnit::Rows,
                        declared_policy: None,
                        path: base.clone(),
                        description: None,
                    })
                };
                if c.minimum.is_some()
                    || c.maximum.is_some()
                    || c.exclusive_minimum.is_some()
                    || c.exclusive_maximum.is_some()
                {
                    derived(Check::Range {
                        minimum: c.minimum,
                        maximum: c.maximum,
                        exclusive_minimum: c.exclusive_minimum,
                        exclusive_maximum: c.exclusive_maximum,
                    });
                }
                if c.min_length.is_some() || c.max_length.is_some() {
                    derived(Check::Length {
                        min: c.min_length,
                        max: c.max_length,
                    });
                }
                if let Some(p) = &c.pattern {
                    derived(Check::Pattern { pattern: p.clone() });
                }
                if cf.unique {
                    set.rules.push(Rule {
                        id: format!("{object}.{name}.unique"),
                        field: Some(name.to_string()),
                        check: Check::DuplicateValues {
                            columns: vec![name.to_string()],
                        },
                        threshold: Threshold::zero(),
                        unit: MeasureUnit::Rows,
                        declared_policy: None,
                        path: format!("schema[{object}].properties[{name}].unique"),
                        description: None,
                    });
                }
            }
            for (i, q) in prop.quality.iter().flatten().enumerate() {
                let path = format!("schema[{object}].properties[{name}].quality[{i}]");
                let fallback_id = format!("{object}.{name}.quality[{i}]");
                match quality_rule(q, Some(name), &object, &path, fallback_id) {
                    Ok(Ok(rule)) => set.rules.push(rule),
                    Ok(Err(skip)) => set.unevaluated.push(skip),
                    Err(d) => diags.push(*d),
                }
            }
        }
        for (i, q) in schema.quality.iter().flatten().enumerate() {
            let path = format!("schema[{object}].quality[{i}]");
            let fallback_id = format!("{object}.quality[{i}]");
            match quality_rule(q, None, &object, &path, fallback_id) {
                Ok(Ok(rule)) => set.rules.push(rule),
                Ok(Err(skip)) => set.unevaluated.push(skip),
                Err(d) => diags.push(*d),
            }
        }
        let mut seen = std::collections::HashSet::new();
        for r in &set.rules {
            if !seen.insert(r.id.clone()) {
                diags.push(
                    Diagnostic::new(
                        &codes::CONTRACT_INVALID,
                        format!("two quality rules have the id `{}`", r.id),
                    )
                    .at(r.path.clone())
                    .help("Give each rule its own `id` (or `name`)."),
                );
            }
            if let Some(p) = pattern_of(&r.check) {
                if let Err(e) = regex::Regex::new(&format!("^(?:{p})$")) {
                    diags.push(
                        Diagnostic::new(
                            &codes::CONTRACT_INVALID,
                            format!("rule `{}` has an invalid pattern `{p}`: {e}", r.id),
                        )
                        .at(r.path.clone()),
                    );
                }
            }
        }
        diags.into_result()?;
        Ok(set)
    }

    /// A rule by id.
    pub fn get(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// Whether there is nothing to evaluate.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The regular expression a check uses, if any.
pub fn pattern_of(check: &Check) -> Option<&str> {
    match check {
        Check::Pattern { pattern } => Some(pattern),
        Check::InvalidValues {
            pattern: Some(p), ..
        } => Some(p),
        _ => None,
    }
}

fn bad_rule(path: &str, msg: String) -> Box<Diagnostic> {
    Box::new(
        Diagnostic::new(&codes::CONTRACT_INVALID, msg)
            .at(path.to_string())
            .help("See ODCS v3.1 data quality: `metric` with `arguments`, `mustBe…` thresholds and `unit: rows | percent`."),
    )
}

fn quality_rule(
    q: &DataQuality,
    field: Option<&str>,
    object: &str,
    path: &str,
    fallback_id: String,
) -> std::result::Result<std::result::Result<Rule, UnevaluatedRule>, Box<Diagnostic>> {
    let id =
        q.id.as_ref()
            .map(|i| i.0.clone())
            .or_else(|| q.name.clone())
            .map(|n| match field {
                Some(f) => format!("{object}.{f}.{n}"),
                None => format!("{object}.{n}"),
            })
            .unwrap_or(fallback_id);
    let skip = |reason: String| {
        Ok(Err(UnevaluatedRule {
            id: id.clone(),
            path: path.to_string(),
            reason,
        }))
    };
    let rule_type = q.rule_type.as_deref().unwrap_or("library");
    let args = q.arguments.as_ref();
    let arg = |k: &str| args.and_then(|a| a.get(k));
    let check = match rule_type {
        "text" => return skip("a `text` rule is documentation, not a check".into()),
        "custom" => {
            return skip(format!(
                "a `custom` rule for engine `{}` is not evaluated by ETLantic",
                q.engine.as_deref().unwrap_or("?")
            ))
        }
        "sql" => match &q.query {
            Some(query) => Check::Sql {
                query: query.clone(),
            },
            None => return Err(bad_rule(path, format!("SQL rule `{id}` has no `query`"))),
        },
        "library" => {
            let metric = q.metric.as_deref().or(q.rule.as_deref()).unwrap_or("");
            match metric {
                "nullValues" | "nullCheck" => {
                    need_field(field, path, &id, metric)?;
                    Check::NullValues
                }
                "missingValues" => {
                    need_field(field, path, &id, metric)?;
                    let values = arg("missingValues")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_else(|| vec![Value::Null, Value::String(String::new())]);
                    Check::MissingValues { values }
                }
                "invalidValues" | "validValues" => {
                    need_field(field, path, &id, metric)?;
                    let valid = arg("validValues").and_then(Value::as_array).cloned();
                    let pattern = arg("pattern").and_then(Value::as_str).map(String::from);
                    if valid.is_none() && pattern.is_none() {
                        return Err(bad_rule(
                            path,
                            format!("rule `{id}` (invalidValues) needs `arguments.validValues` or `arguments.pattern`"),
                        ));
                    }
                    Check::InvalidValues { valid, pattern }
                }
                "duplicateValues" | "duplicateCount" | "uniqueCheck" => {
                    let columns = match (field, arg("properties").and_then(Value::as_array)) {
                        (_, Some(list)) => list
                            .iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect(),
                        (Some(f), None) => vec![f.to_string()],
                        (None, None) => {
                            return Err(bad_rule(
                                path,
                                format!("object-level rule `{id}` (duplicateValues) needs `arguments.properties`"),
                            ))
                        }
                    };
                    Check::DuplicateValues { columns }
                }
                "rowCount" => Check::RowCount,
                "" => {
                    return Err(bad_rule(
                        path,
                        format!("library rule `{id}` names no `metric`"),
                    ))
                }
                other => return skip(format!("the library metric `{other}` is not known")),
            }
        }
        other => return skip(format!("the rule type `{other}` is not known")),
    };
    let threshold = Threshold {
        must_be: q.must_be.as_ref().and_then(Value::as_f64),
        must_not_be: q.must_not_be.as_ref().and_then(Value::as_f64),
        greater_than: q.must_be_greater_than,
        greater_or_equal: q.must_be_greater_or_equal_to,
        less_than: q.must_be_less_than,
        less_or_equal: q.must_be_less_or_equal_to,
        between: pair(q.must_be_between.as_deref(), path, &id)?,
        not_between: pair(q.must_not_be_between.as_deref(), path, &id)?,
    };
    let threshold = if threshold.is_empty() {
        Threshold::zero()
    } else {
        threshold
    };
    let unit = match q.unit.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("rows") => MeasureUnit::Rows,
        Some("percent") => MeasureUnit::Percent,
        Some(other) => {
            return Err(bad_rule(
                path,
                format!("rule `{id}` has the unit `{other}` (rows or percent)"),
            ))
        }
    };
    let mut declared_policy = None;
    for p in q.custom_properties.iter().flatten() {
        if p.property == "etlantic.policy" {
            let text = p.value.as_str().unwrap_or_default();
            declared_policy = Some(Policy::parse(text).ok_or_else(|| {
                bad_rule(
                    path,
                    format!(
                        "rule `{id}` asks for the policy `{text}` (fail, drop, quarantine or warn)"
                    ),
                )
            })?);
        }
    }
    Ok(Ok(Rule {
        id,
        field: field.map(String::from),
        check,
        threshold,
        unit,
        declared_policy,
        path: path.to_string(),
        description: q.description.clone(),
    }))
}

fn need_field(
    field: Option<&str>,
    path: &str,
    id: &str,
    metric: &str,
) -> std::result::Result<(), Box<Diagnostic>> {
    match field {
        Some(_) => Ok(()),
        None => Err(bad_rule(
            path,
            format!("rule `{id}` ({metric}) belongs on a property, not on the object"),
        )),
    }
}

fn pair(
    v: Option<&[f64]>,
    path: &str,
    id: &str,
) -> std::result::Result<Option<(f64, f64)>, Box<Diagnostic>> {
    match v {
        None => Ok(None),
        Some([lo, hi]) => Ok(Some((*lo, *hi))),
        Some(_) => Err(bad_rule(
            path,
            format!("rule `{id}`: a between threshold takes two numbers"),
        )),
    }
}

/// An error for a configured policy that does not fit its rule (`drop` or `quarantine`
/// on a rule that points at no records), or a policy for a rule id no contract has.
pub fn check_configured_policy(rule: Option<&Rule>, id: &str, policy: Policy) -> Result<()> {
    match rule {
        None => Err(Error::new(
            &codes::CONTRACT_INVALID,
            format!("the profile sets a policy for the quality rule `{id}`, which no contract of the pipeline has"),
        )),
        Some(r) if !r.check.offending_rows() && matches!(policy, Policy::Drop | Policy::Quarantine) => {
            Err(Error::new(
                &codes::CONTRACT_INVALID,
                format!(
                    "rule `{id}` ({}) measures the whole batch and points at no records, so it cannot `{}`; use `fail` or `warn`",
                    r.check.name(),
                    policy.as_str()
                ),
            ))
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDERS: &str = r#"
version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    quality:
      - metric: rowCount
        mustBeGreaterThan: 0
      - metric: duplicateValues
        arguments: {properties: [order_id, customer]}
        mustBe: 0
      - type: text
        description: "orders are reviewed weekly"
    properties:
      - name: "order_id"
        logicalType: "integer"
        logicalTypeOptions: {minimum: 1}
        required: true
        unique: true
      - name: "customer"
        logicalType: "string"
        logicalTypeOptions: {pattern: "[a-z]+"}
        quality:
          - metric: nullValues
            mustBeLessThan: 5
            unit: percent
            customProperties:
              - property: etlantic.policy
                value: warn
      - name: "status"
        logicalType: "string"
        quality:
          - id: status_valid
            metric: invalidValues
            arguments: {validValues: [new, paid]}
            mustBe: 0
"#;

    #[test]
    fn reads_every_rule_with_ids_thresholds_and_policies() {
        let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
        let set = RuleSet::of(&c).unwrap();
        let ids: Vec<&str> = set.rules.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "orders.order_id.range",
                "orders.order_id.unique",
                "orders.customer.pattern",
                "orders.customer.quality[0]",
                "orders.status.status_valid",
                "orders.quality[0]",
                "orders.quality[1]",
            ]
        );
        let nulls = set.get("orders.customer.quality[0]").unwrap();
        assert_eq!(nulls.check, Check::NullValues);
        assert_eq!(nulls.unit, MeasureUnit::Percent);
        assert!(nulls.threshold.holds(4.9) && !nulls.threshold.holds(5.0));
        assert_eq!(nulls.policy(None, Policy::Quarantine), Policy::Warn);
        assert_eq!(
            nulls.policy(Some(Policy::Drop), Policy::Quarantine),
            Policy::Drop
        );
        let rows = set.get("orders.quality[0]").unwrap();
        assert_eq!(rows.check.scope(), Scope::Batch);
        assert_eq!(rows.policy(None, Policy::Fail), Policy::Warn);
        assert!(!rows.threshold.holds(0.0) && rows.threshold.holds(1.0));
        let valid = set.get("orders.status.status_valid").unwrap();
        assert_eq!(valid.threshold, Threshold::zero());
        assert_eq!(valid.policy(None, Policy::Quarantine), Policy::Quarantine);
        assert_eq!(set.unevaluated.len(), 1);
        assert!(set.unevaluated[0].reason.contains("text"));
        assert!(check_configured_policy(Some(rows), &rows.id, Policy::Drop).is_err());
        assert!(check_configured_policy(Some(valid), &valid.id, Policy::Drop).is_ok());
        assert!(check_configured_policy(None, "nope", Policy::Warn).is_err());
    }

    #[test]
    fn malformed_rules_are_errors_with_paths() {
        let bad = ORDERS.replace("            arguments: {validValues: [new, paid]}\n", "");
        let e = RuleSet::of(&Contract::parse(&bad, "o.yaml", None).unwrap()).unwrap_err();
        assert_eq!(e.code(), "ETL005");
        assert!(e.to_string().contains("validValues"), "{e}");
        let bad = ORDERS.replace("value: warn", "value: ignore");
        let e = RuleSet::of(&Contract::parse(&bad, "o.yaml", None).unwrap()).unwrap_err();
        assert!(e.to_string().contains("ignore"), "{e}");
        let bad = ORDERS.replace("pattern: \"[a-z]+\"", "pattern: \"[a-z\"");
        let e = RuleSet::of(&Contract::parse(&bad, "o.yaml", None).unwrap()).unwrap_err();
        assert!(e.to_string().contains("invalid pattern"), "{e}");
    }
}
