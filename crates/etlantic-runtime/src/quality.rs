//! A contract's quality rules ([`etlantic_core::contract::rules`]) evaluated on Arrow
//! batches, with each rule's policy applied.
//!
//! A [`QualityGate`] stands where data crosses a contract: after a source is read (its
//! contract), and before a sink publishes (the sink's contract, which is where rules on
//! emitted window aggregates live). [`QualityGate::apply`] evaluates every rule on a
//! micro-batch (a whole input in a batch run) column by column:
//!
//! - a rule that points at records computes a mask of offending rows with Arrow kernels
//!   (a range, a length, a pattern, nulls, missing or invalid values, repeated keys); its
//!   measure is the number of offending rows, or their percentage of the batch;
//! - `rowCount` measures the batch's rows; a `sql` rule runs its query on DataFusion over
//!   the batch, registered under the schema object's name, and reads one number.
//!
//! A rule whose measure breaks its threshold **fails**, and its policy decides:
//! `fail` stops with `ETL705` (after every rule is evaluated, so the error names all that
//! failed), `drop` removes the offending rows, `quarantine` removes them and returns them
//! as [`RejectedRecord`]s (code `ETL704`, the rule id and reason, the position, the row as
//! JSON), `warn` keeps everything. A row that several rules remove leaves once, with
//! every reason; quarantine wins over drop, so nothing a policy wants kept is lost.
//! Every rule's outcome is counted ([`RuleCount`]) whether it failed or not.
//!
//! Its tests are in `etlantic-datafusion`'s `tests/quality_gates.rs`, where an engine
//! that runs the `sql` rules is linked.

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Float64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use etlantic_core::contract::rules::{Check, MeasureUnit, Policy, Rule, RuleSet, Scope};
use etlantic_core::data::{row_as_json, RejectedRecord, RowOrigins, SourcePosition, Table};
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use etlantic_core::plugin::{StepLogic, StepTask};
use indexmap::IndexMap;

/// The SQL dialect `sql` quality rules are written in.
const SQL_ENGINE: &str = "datafusion";
use serde::Serialize;
use std::collections::HashSet;

fn engine(e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::ENGINE_ERROR,
        format!("evaluating a quality rule: {e}"),
    )
}

/// One rule's outcome on one batch.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleCount {
    /// The rule's id.
    pub id: String,
    /// The policy in force.
    pub policy: Policy,
    /// Offending rows (for `rowCount` and `sql`: 1 when the rule failed, else 0).
    pub violations: u64,
    /// The measure compared with the threshold.
    pub measure: f64,
    /// Whether the measure broke the threshold.
    pub failed: bool,
    /// Rows the policy removed from the batch (dropped or quarantined) for this rule.
    pub removed: u64,
}

/// What a gate let through, and what it took out.
#[derive(Debug)]
pub struct GateOutcome {
    /// The rows that go on.
    pub table: Table,
    /// Rows the `quarantine` policy took out, with their reasons.
    pub quarantined: Vec<RejectedRecord>,
    /// Rows the `drop` policy took out.
    pub dropped: u64,
    /// Every rule's outcome.
    pub counts: Vec<RuleCount>,
}

struct Compiled {
    rule: Rule,
    policy: Policy,
    columns: Vec<usize>,
    regex: Option<regex::Regex>,
}

/// The rules of one contract at one crossing, ready to evaluate.
pub struct QualityGate {
    asset: String,
    object: String,
    schema: SchemaRef,
    rules: Vec<Compiled>,
}

impl std::fmt::Debug for QualityGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QualityGate")
            .field("asset", &self.asset)
            .field(
                "rules",
                &self.rules.iter().map(|r| &r.rule.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl QualityGate {
    /// A gate for `asset`'s rules over data of `schema`; `None` when there is no rule.
    /// `policies` are the profile's, by rule id; `on_error` is the default for rules that
    /// point at records. With `decoded`, the record rules (range, length, pattern) are left
    /// out: the source's decoder checked them with each record's file position and routed
    /// violations by `on_error`. A rule about a column the data lacks is an `ETL206` error.
    pub fn new(
        asset: &str,
        object: &str,
        rules: &RuleSet,
        schema: SchemaRef,
        policies: &IndexMap<String, Policy>,
        on_error: Policy,
        decoded: bool,
    ) -> Result<Option<Self>> {
        let mut compiled = Vec::new();
        let mut diags = Diagnostics::new();
        for rule in &rules.rules {
            let policy = rule.policy(policies.get(&rule.id).copied(), on_error);
            if decoded && rule.scope() == Scope::Record {
                // The decoder quarantines or fails by `on_error`; it cannot drop or warn.
                if matches!(policy, Policy::Drop | Policy::Warn) {
                    diags.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_QUALITY_RULE,
                            format!(
                                "quality rule `{}` of `{asset}` is checked while its source decodes records, which quarantines or fails them (on_error); it cannot `{}` there",
                                rule.id,
                                policy.as_str()
                            ),
                        )
                        .at(format!("quality_policies.{}", rule.id))
                        .help("Use `quarantine` or `fail` for this rule, or put a rule with `drop` or `warn` on the sink's contract."),
                    );
                }
                continue;
            }
            if let Err(e) = etlantic_core::contract::rules::check_configured_policy(
                Some(rule),
                &rule.id,
                policy,
            ) {
                // A policy from the profile is the profile's error (as the planner reports
                // it); one the contract declares stays the contract's.
                if policies.contains_key(&rule.id) {
                    for d in e.0 .0 {
                        diags.push(
                            Diagnostic::new(&codes::UNKNOWN_QUALITY_RULE, d.message)
                                .at(format!("quality_policies.{}", rule.id)),
                        );
                    }
                } else {
                    diags.extend(e.0);
                }
                continue;
            }
            let names: Vec<&str> = match (&rule.check, &rule.field) {
                (Check::DuplicateValues { columns }, _) => {
                    columns.iter().map(String::as_str).collect()
                }
                (_, Some(f)) => vec![f.as_str()],
                (_, None) => vec![],
            };
            let mut columns = Vec::new();
            for n in names {
                match schema.index_of(n) {
                    Ok(i) => columns.push(i),
                    Err(_) => diags.push(
                        Diagnostic::new(
                            &codes::UNKNOWN_COLUMN,
                            format!("quality rule `{}` of `{asset}` is about `{n}`, which the data has no column for", rule.id),
                        )
                        .at(rule.path.clone()),
                    ),
                }
            }
            let regex = etlantic_core::contract::rules::pattern_of(&rule.check)
                .map(|p| regex::Regex::new(&format!("^(?:{p})$")))
                .transpose()
                .map_err(engine)?;
            compiled.push(Compiled {
                rule: rule.clone(),
                policy,
                columns,
                regex,
            });
        }
        diags.into_result()?;
        if compiled.is_empty() {
            return Ok(None);
        }
        Ok(Some(QualityGate {
            asset: asset.to_string(),
            object: object.to_string(),
            schema,
            rules: compiled,
        }))
    }

    /// The gate of `asset`'s contract in `plan`, with the profile's policies and its
    /// `on_error` as the default; see [`QualityGate::new`] for `decoded`.
    pub fn for_asset(
        plan: &etlantic_plan::plan::PipelinePlan,
        asset: &str,
        schema: SchemaRef,
        decoded: bool,
    ) -> Result<Option<QualityGate>> {
        let contract = plan.asset_contract(asset)?;
        let rules = RuleSet::of(&contract)?;
        QualityGate::new(
            asset,
            &contract.object,
            &rules,
            schema,
            &plan.profile.quality_policies,
            plan.profile.on_error.as_policy(),
            decoded,
        )
    }

    /// The asset whose contract the gate checks.
    pub fn asset(&self) -> &str {
        &self.asset
    }

    /// [`QualityGate::apply`] where a row's position is its index in `table`, under the
    /// gate's asset (for data whose source positions are no longer known).
    pub async fn apply_by_row(&self, table: Table) -> Result<GateOutcome> {
        self.apply_at(table, &RowOrigins::default()).await
    }

    /// [`QualityGate::apply`] to rows as a source read them: row `i`'s position is the
    /// `i`-th of `origins`, or its index in `table` where the source did not say.
    pub async fn apply_at(&self, table: Table, origins: &RowOrigins) -> Result<GateOutcome> {
        let asset = self.asset.clone();
        self.apply(table, &|row| {
            origins
                .position(row as u64)
                .unwrap_or_else(|| SourcePosition {
                    asset: asset.clone(),
                    row: Some(row as u64),
                    ..SourcePosition::default()
                })
        })
        .await
    }

    /// The rule ids with their policies, in evaluation order.
    pub fn policies(&self) -> Vec<(&str, Policy)> {
        self.rules
            .iter()
            .map(|r| (r.rule.id.as_str(), r.policy))
            .collect()
    }

    /// Evaluates every rule on `table` and applies the policies of those that fail.
    /// `position(i)` names the source position of the table's `i`-th row (0-based over
    /// all its batches).
    pub async fn apply(
        &self,
        table: Table,
        position: &(dyn Fn(usize) -> SourcePosition + Sync),
    ) -> Result<GateOutcome> {
        let total = table.num_rows();
        // Per rule, per batch: the offending rows.
        let mut masks: Vec<Option<Vec<BooleanArray>>> = Vec::with_capacity(self.rules.len());
        let mut counts = Vec::with_capacity(self.rules.len());
        let mut failures = Diagnostics::new();
        for c in &self.rules {
            let (violations, measure, mask) = match &c.rule.check {
                Check::RowCount => (0, total as f64, None),
                Check::Sql { query } => (0, self.sql_measure(&table, query).await?, None),
                Check::DuplicateValues { .. } => {
                    let m = duplicate_masks(&table, &c.columns)?;
                    let n = count(&m);
                    (n, self.unit_measure(c, n, total), Some(m))
                }
                _ => {
                    let mut m = Vec::with_capacity(table.batches.len());
                    for b in &table.batches {
                        m.push(offending(c, b.column(c.columns[0]))?);
                    }
                    let n = count(&m);
                    (n, self.unit_measure(c, n, total), Some(m))
                }
            };
            let failed = !c.rule.threshold.holds(measure);
            if failed && c.policy == Policy::Fail {
                failures.push(
                    Diagnostic::new(
                        &codes::BAD_RECORDS_FAIL,
                        format!(
                            "`{}` broke the quality rule `{}` ({}): measured {measure}{}, the rule says {}; the policy is `fail`",
                            self.asset,
                            c.rule.id,
                            c.rule.check.name(),
                            if c.rule.unit == MeasureUnit::Percent { " %" } else { " rows" },
                            c.rule.threshold.describe()
                        ),
                    )
                    .at(c.rule.path.clone())
                    .help("Fix the input, or give the rule another policy (quality.policies in the profile)."),
                );
            }
            counts.push(RuleCount {
                id: c.rule.id.clone(),
                policy: c.policy,
                violations: if c.rule.check.offending_rows() {
                    violations
                } else {
                    u64::from(failed)
                },
                measure,
                failed,
                removed: 0,
            });
            masks.push(
                if failed && matches!(c.policy, Policy::Drop | Policy::Quarantine) {
                    mask
                } else {
                    None
                },
            );
        }
        failures.into_result()?;
        if masks.iter().all(Option::is_none) {
            return Ok(GateOutcome {
                table,
                quarantined: Vec::new(),
                dropped: 0,
                counts,
            });
        }
        // Remove what drop and quarantine take; quarantine wins over drop.
        let mut kept = Vec::with_capacity(table.batches.len());
        let mut quarantined = Vec::new();
        let mut dropped = 0u64;
        let mut offset = 0usize;
        for (bi, batch) in table.batches.iter().enumerate() {
            let n = batch.num_rows();
            let mut keep = BooleanBufferBuilder::new(n);
            keep.append_n(n, true);
            let mut reasons: Vec<Vec<usize>> = vec![Vec::new(); n];
            for (ri, m) in masks.iter().enumerate() {
                let Some(m) = m else { continue };
                for row in m[bi].values().set_indices() {
                    keep.set_bit(row, false);
                    reasons[row].push(ri);
                    counts[ri].removed += 1;
                }
            }
            for (row, rules) in reasons.iter().enumerate() {
                if rules.is_empty() {
                    continue;
                }
                if rules
                    .iter()
                    .any(|&ri| self.rules[ri].policy == Policy::Quarantine)
                {
                    quarantined.push(self.rejected(batch, row, rules, position(offset + row)));
                } else {
                    dropped += 1;
                }
            }
            let keep = BooleanArray::new(keep.finish(), None);
            kept.push(arrow::compute::filter_record_batch(batch, &keep).map_err(engine)?);
            offset += n;
        }
        Ok(GateOutcome {
            table: Table::new(table.schema.clone(), kept),
            quarantined,
            dropped,
            counts,
        })
    }

    fn unit_measure(&self, c: &Compiled, n: u64, total: usize) -> f64 {
        match c.rule.unit {
            MeasureUnit::Rows => n as f64,
            MeasureUnit::Percent if total == 0 => 0.0,
            MeasureUnit::Percent => 100.0 * n as f64 / total as f64,
        }
    }

    fn rejected(
        &self,
        batch: &RecordBatch,
        row: usize,
        rules: &[usize],
        position: SourcePosition,
    ) -> RejectedRecord {
        let reasons: Vec<String> = rules
            .iter()
            .map(|&ri| {
                let c = &self.rules[ri];
                let shown = c
                    .columns
                    .iter()
                    .map(|&col| {
                        format!(
                            "{}={}",
                            self.schema.field(col).name(),
                            cell_text(batch.column(col), row)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("rule `{}` ({}): {shown}", c.rule.id, explain(&c.rule.check))
            })
            .collect();
        let first = &self.rules[rules[0]];
        RejectedRecord {
            code: codes::RECORD_RULE_VIOLATION.code.to_string(),
            reason: reasons.join("; "),
            field: first.rule.field.clone(),
            position,
            raw: row_as_json(batch, row),
        }
    }

    async fn sql_measure(&self, table: &Table, query: &str) -> Result<f64> {
        let sql_error = |e: &dyn std::fmt::Display| {
            Error::new(
                &codes::CONTRACT_INVALID,
                format!("the SQL quality rule of `{}` failed: {e}", self.asset),
            )
            .map_diagnostics(|d| d.help(format!("The query runs on DataFusion over the batch, registered as the table `{}`, and must return one number.", self.object)))
        };
        // Any linked backend that runs DataFusion's SQL dialect.
        let backend = etlantic_core::plugin::backends()
            .find(|b| b.capabilities().sql_engines.iter().any(|e| e == SQL_ENGINE))
            .ok_or_else(|| {
                Error::new(
                    &codes::NO_BACKEND,
                    format!(
                        "the SQL quality rule of `{}` needs a backend that runs `{SQL_ENGINE}` SQL, and none is linked",
                        self.asset
                    ),
                )
            })?;
        const OUT: &str = "__quality_measure";
        let step = StepTask {
            id: OUT.to_string(),
            inputs: IndexMap::from([(self.object.clone(), self.object.clone())]),
            logic: StepLogic::Sql {
                query: query.to_string(),
            },
        };
        let inputs = IndexMap::from([(self.object.clone(), table.clone())]);
        let mut out = backend
            .execute_batch(&[step], inputs, &[OUT.to_string()])
            .await
            .map_err(|e| sql_error(&e))?;
        let result = out
            .swap_remove(OUT)
            .unwrap_or_else(|| Table::empty(table.schema.clone()));
        let cell = result
            .batches
            .iter()
            .find(|b| b.num_rows() > 0 && b.num_columns() > 0)
            .map(|b| b.column(0).clone());
        let Some(cell) = cell else {
            return Err(sql_error(&"the query returned no row"));
        };
        let as_f64 = arrow::compute::cast(&cell.slice(0, 1), &DataType::Float64)
            .map_err(|e| sql_error(&e))?;
        let v = as_f64.as_primitive::<Float64Type>();
        Ok(if v.is_null(0) { 0.0 } else { v.value(0) })
    }
}

fn count(masks: &[BooleanArray]) -> u64 {
    masks.iter().map(|m| m.true_count() as u64).sum()
}

/// A mask with no nulls: a null comparison (a null value) does not offend.
fn definite(mask: BooleanArray) -> BooleanArray {
    if mask.null_count() == 0 {
        mask
    } else {
        arrow::compute::prep_null_mask_filter(&mask)
    }
}

fn offending(c: &Compiled, col: &ArrayRef) -> Result<BooleanArray> {
    Ok(match &c.rule.check {
        Check::Range {
            minimum,
            maximum,
            exclusive_minimum,
            exclusive_maximum,
        } => {
            let v = arrow::compute::cast(col, &DataType::Float64).map_err(engine)?;
            let mut out: Option<BooleanArray> = None;
            let mut or = |m: BooleanArray| -> Result<()> {
                out = Some(match out.take() {
                    None => m,
                    Some(o) => arrow::compute::or(&o, &m).map_err(engine)?,
                });
                Ok(())
            };
            let scalar = |x: f64| arrow::array::Float64Array::new_scalar(x);
            if let Some(x) = minimum {
                or(cmp::lt(&v, &scalar(*x)).map_err(engine)?)?;
            }
            if let Some(x) = maximum {
                or(cmp::gt(&v, &scalar(*x)).map_err(engine)?)?;
            }
            if let Some(x) = exclusive_minimum {
                or(cmp::lt_eq(&v, &scalar(*x)).map_err(engine)?)?;
            }
            if let Some(x) = exclusive_maximum {
                or(cmp::gt_eq(&v, &scalar(*x)).map_err(engine)?)?;
            }
            definite(out.unwrap_or_else(|| BooleanArray::from(vec![false; col.len()])))
        }
        Check::Length { min, max } => {
            let s = strings(col)?;
            let s = s.as_string::<i32>();
            s.iter()
                .map(|v| {
                    Some(v.is_some_and(|v| {
                        let n = v.chars().count() as u64;
                        min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m)
                    }))
                })
                .collect()
        }
        Check::Pattern { .. } => {
            let re = c.regex.as_ref().expect("compiled with the rule");
            let s = strings(col)?;
            let s = s.as_string::<i32>();
            s.iter()
                .map(|v| Some(v.is_some_and(|v| !re.is_match(v))))
                .collect()
        }
        Check::NullValues => arrow::compute::is_null(col).map_err(engine)?,
        Check::MissingValues { values } => {
            let nulls_missing = values.iter().any(serde_json::Value::is_null);
            let listed: HashSet<String> = values.iter().filter_map(value_text).collect();
            let s = strings(col)?;
            let s = s.as_string::<i32>();
            s.iter()
                .map(|v| {
                    Some(match v {
                        None => nulls_missing,
                        Some(v) => listed.contains(v),
                    })
                })
                .collect()
        }
        Check::InvalidValues { valid, .. } => {
            let listed: Option<HashSet<String>> = valid
                .as_ref()
                .map(|vs| vs.iter().filter_map(value_text).collect());
            let s = strings(col)?;
            let s = s.as_string::<i32>();
            s.iter()
                .map(|v| {
                    Some(v.is_some_and(|v| {
                        listed.as_ref().is_some_and(|l| !l.contains(v))
                            || c.regex.as_ref().is_some_and(|re| !re.is_match(v))
                    }))
                })
                .collect()
        }
        Check::DuplicateValues { .. } | Check::RowCount | Check::Sql { .. } => {
            unreachable!("measured over the whole batch")
        }
    })
}

/// The column as `Utf8` (numbers, dates and booleans as their text).
fn strings(col: &ArrayRef) -> Result<ArrayRef> {
    arrow::compute::cast(col, &DataType::Utf8).map_err(engine)
}

/// A listed value as the text a column cast to `Utf8` shows.
fn value_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Per batch: the rows whose key occurred earlier in the table (null keys included).
fn duplicate_masks(table: &Table, columns: &[usize]) -> Result<Vec<BooleanArray>> {
    let fields = columns
        .iter()
        .map(|&i| SortField::new(table.schema.field(i).data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).map_err(engine)?;
    let mut seen: HashSet<Box<[u8]>, foldhash::fast::RandomState> = HashSet::default();
    let mut out = Vec::with_capacity(table.batches.len());
    for b in &table.batches {
        let cols: Vec<ArrayRef> = columns.iter().map(|&i| b.column(i).clone()).collect();
        let rows = converter.convert_columns(&cols).map_err(engine)?;
        out.push(
            rows.iter()
                .map(|r| Some(!seen.insert(r.as_ref().into())))
                .collect(),
        );
    }
    Ok(out)
}

fn explain(check: &Check) -> String {
    match check {
        Check::Range {
            minimum,
            maximum,
            exclusive_minimum,
            exclusive_maximum,
        } => {
            let mut parts = Vec::new();
            if let Some(x) = minimum {
                parts.push(format!(">= {x}"));
            }
            if let Some(x) = exclusive_minimum {
                parts.push(format!("> {x}"));
            }
            if let Some(x) = maximum {
                parts.push(format!("<= {x}"));
            }
            if let Some(x) = exclusive_maximum {
                parts.push(format!("< {x}"));
            }
            format!("must be {}", parts.join(" and "))
        }
        Check::Length { min, max } => format!(
            "length must be within [{}, {}]",
            min.map_or("0".into(), |m| m.to_string()),
            max.map_or("∞".into(), |m| m.to_string())
        ),
        Check::Pattern { pattern } => format!("must match `{pattern}`"),
        Check::NullValues => "must not be null".into(),
        Check::MissingValues { .. } => "must not be a missing value".into(),
        Check::InvalidValues { valid, pattern } => match (valid, pattern) {
            (Some(v), _) => format!("must be one of {}", serde_json::Value::Array(v.clone())),
            (None, Some(p)) => format!("must match `{p}`"),
            (None, None) => "must be valid".into(),
        },
        Check::DuplicateValues { columns } => format!("({}) must be unique", columns.join(", ")),
        Check::RowCount => "row count".into(),
        Check::Sql { .. } => "sql".into(),
    }
}

fn cell_text(col: &ArrayRef, row: usize) -> String {
    if col.is_null(row) {
        return "null".into();
    }
    arrow::util::display::array_value_to_string(col, row).unwrap_or_else(|_| "?".into())
}

/// The record rule of `rules` (a source contract's) that a decoder's `ETL704` rejection
/// broke: the rule on the record's field, told apart by the check its reason names when
/// the field has several (range, length, pattern). `None` for other rejections.
pub fn record_rule_of<'a>(rules: &'a [Rule], r: &RejectedRecord) -> Option<&'a str> {
    if r.code != codes::RECORD_RULE_VIOLATION.code {
        return None;
    }
    let field = r.field.as_deref()?;
    let on_field: Vec<&Rule> = rules
        .iter()
        .filter(|x| x.scope() == Scope::Record && x.field.as_deref() == Some(field))
        .collect();
    if let [only] = on_field.as_slice() {
        return Some(&only.id);
    }
    // The decoder's messages: "does not match the pattern", "… characters, fewer/more
    // than the … length", else a bound ("below the minimum", "above the maximum").
    let check = if r.reason.contains("does not match the pattern") {
        "pattern"
    } else if r.reason.contains(" characters, ") && r.reason.contains(" length ") {
        "length"
    } else {
        "range"
    };
    on_field
        .into_iter()
        .find(|x| x.check.name() == check)
        .map(|x| x.id.as_str())
}

#[cfg(test)]
mod record_rule_tests {
    use super::*;
    use etlantic_core::contract::rules::Threshold;

    fn rule(id: &str, field: &str, check: Check) -> Rule {
        Rule {
            id: id.into(),
            field: Some(field.into()),
            check,
            threshold: Threshold::zero(),
            unit: MeasureUnit::default(),
            declared_policy: None,
            path: String::new(),
            description: None,
        }
    }

    fn rejected(code: &str, field: &str, reason: &str) -> RejectedRecord {
        RejectedRecord {
            code: code.into(),
            reason: reason.into(),
            field: Some(field.into()),
            position: SourcePosition::default(),
            raw: String::new(),
        }
    }

    #[test]
    fn a_rejection_is_counted_against_the_record_rule_it_broke() {
        let rules = [
            rule(
                "o.code.length",
                "code",
                Check::Length {
                    min: Some(2),
                    max: None,
                },
            ),
            rule(
                "o.code.pattern",
                "code",
                Check::Pattern {
                    pattern: "^[a-z]+$".into(),
                },
            ),
            rule(
                "o.amount.range",
                "amount",
                Check::Range {
                    minimum: Some(0.0),
                    maximum: None,
                    exclusive_minimum: None,
                    exclusive_maximum: None,
                },
            ),
        ];
        let v = codes::RECORD_RULE_VIOLATION.code;
        let of = |r: RejectedRecord| record_rule_of(&rules, &r).map(str::to_string);
        assert_eq!(
            of(rejected(
                v,
                "amount",
                "field `amount`: value -1 is below the minimum 0"
            )),
            Some("o.amount.range".into())
        );
        assert_eq!(
            of(rejected(
                v,
                "code",
                "field `code`: value \"A1\" does not match the pattern `^[a-z]+$`"
            )),
            Some("o.code.pattern".into())
        );
        assert_eq!(
            of(rejected(
                v,
                "code",
                "field `code`: value \"a\" has 1 characters, fewer than the minimum length 2"
            )),
            Some("o.code.length".into())
        );
        // Not a record rule's rejection, or no rule on the field.
        assert_eq!(of(rejected("ETL702", "amount", "not a number")), None);
        assert_eq!(of(rejected(v, "other", "below the minimum")), None);
    }
}
