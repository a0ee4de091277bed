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

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder, RecordBatch};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{DataType, Float64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use etlantic_core::contract::rules::{Check, MeasureUnit, Policy, Rule, RuleSet, Scope};
use etlantic_core::data::{row_as_json, RejectedRecord, RowOrigins, SourcePosition, Table};
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use indexmap::IndexMap;
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
        let ctx = crate::session::new_context();
        let mem = datafusion::datasource::MemTable::try_new(
            table.schema.clone(),
            vec![table.batches.clone()],
        )
        .map_err(engine)?;
        ctx.register_table(self.object.as_str(), std::sync::Arc::new(mem))
            .map_err(engine)?;
        let sql_error = |e: &dyn std::fmt::Display| {
            Error::new(
                &codes::CONTRACT_INVALID,
                format!("the SQL quality rule of `{}` failed: {e}", self.asset),
            )
            .map_diagnostics(|d| d.help(format!("The query runs on DataFusion over the batch, registered as the table `{}`, and must return one number.", self.object)))
        };
        let batches = ctx
            .sql(query)
            .await
            .map_err(|e| sql_error(&e))?
            .collect()
            .await
            .map_err(|e| sql_error(&e))?;
        let cell = batches
            .iter()
            .find(|b| b.num_rows() > 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use etlantic_core::contract::Contract;
    use std::sync::Arc;

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
      - id: positive_total
        type: sql
        query: "SELECT COUNT(*) FROM orders WHERE amount < 0"
        mustBeLessOrEqualTo: 1
    properties:
      - name: "id"
        logicalType: "integer"
        unique: true
      - name: "amount"
        logicalType: "number"
        logicalTypeOptions: {minimum: 0, maximum: 100}
      - name: "status"
        logicalType: "string"
        quality:
          - id: known
            metric: invalidValues
            arguments: {validValues: [new, paid]}
            mustBe: 0
      - name: "customer"
        logicalType: "string"
        logicalTypeOptions: {pattern: "[a-z]+"}
        quality:
          - id: mostly_known
            metric: nullValues
            unit: percent
            mustBeLessThan: 30
"#;

    fn table() -> Table {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("customer", DataType::Utf8, true),
        ]));
        let batch = |ids: Vec<i64>,
                     amounts: Vec<Option<f64>>,
                     status: Vec<Option<&str>>,
                     customers: Vec<Option<&str>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Float64Array::from(amounts)),
                    Arc::new(StringArray::from(status)),
                    Arc::new(StringArray::from(customers)),
                ],
            )
            .unwrap()
        };
        Table::new(
            schema.clone(),
            vec![
                batch(
                    vec![1, 2, 3],
                    vec![Some(10.0), Some(-5.0), None],
                    vec![Some("new"), Some("paid"), Some("lost")],
                    vec![Some("ann"), Some("Bob"), None],
                ),
                // Row 3 repeats id 1 (a duplicate across the batch's Arrow batches).
                batch(
                    vec![1, 4],
                    vec![Some(150.0), Some(20.0)],
                    vec![None, Some("new")],
                    vec![Some("cy"), Some("dee")],
                ),
            ],
        )
    }

    fn gate(policies: &[(&str, Policy)], decoded: bool) -> QualityGate {
        let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
        let rules = RuleSet::of(&c).unwrap();
        let policies = policies.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        QualityGate::new(
            "orders",
            "orders",
            &rules,
            table().schema,
            &policies,
            Policy::Quarantine,
            decoded,
        )
        .unwrap()
        .unwrap()
    }

    fn position(row: usize) -> SourcePosition {
        SourcePosition {
            asset: "orders".into(),
            row: Some(row as u64),
            ..SourcePosition::default()
        }
    }

    fn count<'a>(out: &'a GateOutcome, id: &str) -> &'a RuleCount {
        out.counts.iter().find(|c| c.id == id).unwrap()
    }

    #[tokio::test]
    async fn every_rule_is_measured_and_each_policy_applied() {
        let g = gate(
            &[
                ("orders.amount.range", Policy::Drop),
                ("orders.customer.pattern", Policy::Warn),
            ],
            false,
        );
        let out = g.apply(table(), &position).await.unwrap();
        // amount: -5 (row 1) and 150 (row 3) are out of range; null passes. Dropped.
        let range = count(&out, "orders.amount.range");
        assert_eq!(
            (range.violations, range.failed, range.removed),
            (2, true, 2)
        );
        // status `lost` (row 2) is invalid; null passes. Quarantined (on_error default).
        let known = count(&out, "orders.status.known");
        assert_eq!((known.violations, known.policy), (1, Policy::Quarantine));
        // id 1 again in row 3: a duplicate, quarantined.
        assert_eq!(count(&out, "orders.id.unique").violations, 1);
        // `Bob` breaks the pattern; warned, kept.
        let pattern = count(&out, "orders.customer.pattern");
        assert_eq!((pattern.violations, pattern.removed), (1, 0));
        // 1 null customer of 5 = 20 % < 30 %: passes.
        let nulls = count(&out, "orders.customer.mostly_known");
        assert_eq!((nulls.measure, nulls.failed), (20.0, false));
        assert_eq!(count(&out, "orders.quality[0]").measure, 5.0);
        let sql = count(&out, "orders.positive_total");
        assert_eq!((sql.measure, sql.failed), (1.0, false));
        // Kept: rows 0 and 4 (row 1 dropped, 2 quarantined, 3 dropped and quarantined).
        let ids: Vec<i64> = out
            .table
            .batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, [1, 4]);
        assert_eq!(out.dropped, 1);
        let q: Vec<(u64, &str)> = out
            .quarantined
            .iter()
            .map(|r| (r.position.row.unwrap(), r.reason.as_str()))
            .collect();
        assert_eq!(q.len(), 2, "{q:?}");
        assert_eq!(q[0].0, 2);
        assert!(q[0].1.contains("orders.status.known") && q[0].1.contains("status=lost"));
        // Row 3 broke the range (drop) and uniqueness (quarantine): quarantined once,
        // with both reasons.
        assert_eq!(q[1].0, 3);
        assert!(q[1].1.contains("orders.amount.range") && q[1].1.contains("orders.id.unique"));
        assert_eq!(out.quarantined[1].code, "ETL704");
        assert!(out.quarantined[1].raw.contains("\"amount\":150"));
    }

    #[tokio::test]
    async fn a_failing_rule_with_the_fail_policy_stops_and_names_every_failure() {
        let g = gate(
            &[
                ("orders.status.known", Policy::Fail),
                ("orders.customer.mostly_known", Policy::Fail),
            ],
            false,
        );
        let e = g.apply(table(), &position).await.unwrap_err();
        assert_eq!(e.code(), "ETL705");
        assert!(e.to_string().contains("orders.status.known"), "{e}");
        assert!(
            !e.to_string().contains("mostly_known"),
            "passing rules do not fail: {e}"
        );
        // An empty batch breaks rowCount > 0; with `fail` it stops, with `warn` it counts.
        let g = gate(&[("orders.quality[0]", Policy::Fail)], false);
        let empty = Table::empty(table().schema);
        assert!(g.apply(empty.clone(), &position).await.is_err());
        let g = gate(&[], false);
        let out = g.apply(empty, &position).await.unwrap();
        let rows = count(&out, "orders.quality[0]");
        assert_eq!(
            (rows.failed, rows.violations, rows.policy),
            (true, 1, Policy::Warn)
        );
    }

    #[tokio::test]
    async fn decoded_sources_leave_record_rules_to_the_decoder_and_bad_policies_are_refused() {
        let g = gate(&[], true);
        let ids: Vec<&str> = g.policies().into_iter().map(|(id, _)| id).collect();
        assert!(!ids.contains(&"orders.amount.range"));
        assert!(!ids.contains(&"orders.customer.pattern"));
        assert!(ids.contains(&"orders.id.unique"));
        let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
        let rules = RuleSet::of(&c).unwrap();
        let policies = [("orders.quality[0]".to_string(), Policy::Quarantine)]
            .into_iter()
            .collect();
        let e = QualityGate::new(
            "orders",
            "orders",
            &rules,
            table().schema,
            &policies,
            Policy::Quarantine,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot `quarantine`"), "{e}");
    }

    /// One contract with a single rule of `kind` (its YAML snippet under a property or the
    /// object) and its id.
    fn single_rule(kind: &str) -> (String, &'static str, &'static str) {
        let (field, snippet, id): (Option<&str>, &str, &str) = match kind {
            "range" => (Some("amount"), "logicalTypeOptions: {minimum: 0}", "orders.amount.range"),
            "length" => (Some("customer"), "logicalTypeOptions: {maxLength: 3}", "orders.customer.length"),
            "pattern" => (Some("customer"), "logicalTypeOptions: {pattern: \"[a-z]+\"}", "orders.customer.pattern"),
            "unique" => (Some("id"), "unique: true", "orders.id.unique"),
            "nullValues" => (Some("status"), "quality: [{id: present, metric: nullValues, mustBe: 0}]", "orders.status.present"),
            "missingValues" => (Some("status"), "quality: [{id: given, metric: missingValues, arguments: {missingValues: [\"n/a\"]}, mustBe: 0}]", "orders.status.given"),
            "invalidValues" => (Some("status"), "quality: [{id: known, metric: invalidValues, arguments: {validValues: [new, paid, \"n/a\"]}, mustBe: 0}]", "orders.status.known"),
            "duplicateValues" => (None, "quality: [{id: one_per_customer, metric: duplicateValues, arguments: {properties: [customer]}, mustBe: 0}]", "orders.one_per_customer"),
            "rowCount" => (None, "quality: [{id: small, metric: rowCount, mustBeLessThan: 3}]", "orders.small"),
            "sql" => (None, "quality: [{id: no_negative, type: sql, query: \"SELECT COUNT(*) FROM orders WHERE amount < 0\", mustBe: 0}]", "orders.no_negative"),
            other => panic!("unknown rule kind {other}"),
        };
        let prop = |name: &str, t: &str| {
            let extra = match field {
                Some(f) if f == name => format!("\n        {snippet}"),
                _ => String::new(),
            };
            format!("      - name: \"{name}\"\n        logicalType: \"{t}\"{extra}\n")
        };
        let object_rules = match field {
            None => format!("    {snippet}\n"),
            Some(_) => String::new(),
        };
        let doc = format!(
            "version: \"1.0.0\"\napiVersion: \"v3.1.0\"\nkind: \"DataContract\"\nid: \"orders\"\nstatus: \"active\"\nschema:\n  - name: \"orders\"\n    logicalType: \"object\"\n{object_rules}    properties:\n{}{}{}{}",
            prop("id", "integer"),
            prop("amount", "number"),
            prop("status", "string"),
            prop("customer", "string"),
        );
        let offending = match kind {
            "range" | "length" | "pattern" => "1",
            "unique" | "nullValues" | "duplicateValues" => "2",
            "missingValues" => "3",
            "invalidValues" => "4",
            _ => "",
        };
        (doc, id, offending)
    }

    /// Five rows; the comments name the rules each one breaks.
    fn matrix_table() -> Table {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("status", DataType::Utf8, true),
            Field::new("customer", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                // 0: good; 1: amount < 0, customer too long and not lower case (and the
                // sql count); 2: id and customer repeated, status null; 3: status `n/a`
                // (missing); 4: status `lost` (invalid).
                Arc::new(Int64Array::from(vec![1, 2, 1, 3, 4])),
                Arc::new(Float64Array::from(vec![10.0, -5.0, 20.0, 30.0, 40.0])),
                Arc::new(StringArray::from(vec![
                    Some("new"),
                    Some("paid"),
                    None,
                    Some("n/a"),
                    Some("lost"),
                ])),
                Arc::new(StringArray::from(vec!["ann", "Bobby", "ann", "dee", "eve"])),
            ],
        )
        .unwrap();
        Table::new(schema, vec![batch])
    }

    fn ids(table: &Table) -> Vec<i64> {
        table
            .batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[tokio::test]
    async fn every_rule_kind_under_every_policy() {
        let kinds = [
            "range",
            "length",
            "pattern",
            "unique",
            "nullValues",
            "missingValues",
            "invalidValues",
            "duplicateValues",
            "rowCount",
            "sql",
        ];
        let all_ids = ids(&matrix_table());
        for kind in kinds {
            let (doc, id, offending) = single_rule(kind);
            let contract = Contract::parse(&doc, "orders.yaml", None)
                .unwrap_or_else(|e| panic!("{kind}: {e}\n{doc}"));
            let rules = RuleSet::of(&contract).unwrap();
            assert!(
                rules.rules.iter().any(|r| r.id == id),
                "{kind}: rule {id} in {:?}",
                rules.rules
            );
            let points_at_rows = !offending.is_empty();
            let bad: Vec<usize> = offending
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            for policy in [Policy::Fail, Policy::Drop, Policy::Quarantine, Policy::Warn] {
                let label = format!("{kind} × {}", policy.as_str());
                let policies: IndexMap<String, Policy> = [(id.to_string(), policy)].into();
                let gate = QualityGate::new(
                    "orders",
                    "orders",
                    &rules,
                    matrix_table().schema,
                    &policies,
                    Policy::Quarantine,
                    false,
                );
                if !points_at_rows && matches!(policy, Policy::Drop | Policy::Quarantine) {
                    let e = gate.expect_err(&label);
                    assert_eq!(e.code(), "ETL222", "{label}: {e}");
                    continue;
                }
                let gate = gate.unwrap().unwrap();
                let out = gate.apply(matrix_table(), &position).await;
                if policy == Policy::Fail {
                    let e = out.expect_err(&label);
                    assert_eq!(e.code(), "ETL705", "{label}");
                    assert!(e.to_string().contains(id), "{label}: {e}");
                    continue;
                }
                let out = out.unwrap();
                let c = count(&out, id);
                assert!(c.failed, "{label}: the rule fails on this table");
                assert_eq!(c.policy, policy, "{label}");
                let kept = ids(&out.table);
                let expected_kept: Vec<i64> = all_ids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| policy == Policy::Warn || !bad.contains(i))
                    .map(|(_, v)| *v)
                    .collect();
                assert_eq!(kept, expected_kept, "{label}: rows that go on");
                match policy {
                    Policy::Drop => {
                        assert_eq!(
                            (out.dropped, out.quarantined.len()),
                            (bad.len() as u64, 0),
                            "{label}"
                        );
                        assert_eq!(c.removed, bad.len() as u64, "{label}");
                    }
                    Policy::Quarantine => {
                        assert_eq!(out.dropped, 0, "{label}");
                        let rows: Vec<u64> = out
                            .quarantined
                            .iter()
                            .map(|r| r.position.row.unwrap())
                            .collect();
                        assert_eq!(
                            rows,
                            bad.iter().map(|&b| b as u64).collect::<Vec<_>>(),
                            "{label}"
                        );
                        for r in &out.quarantined {
                            assert_eq!(r.code, "ETL704", "{label}");
                            assert!(r.reason.contains(id), "{label}: {}", r.reason);
                            assert!(r.raw.starts_with('{'), "{label}: {}", r.raw);
                        }
                    }
                    Policy::Warn => {
                        assert_eq!(
                            (out.dropped, out.quarantined.len(), c.removed),
                            (0, 0, 0),
                            "{label}"
                        );
                        if points_at_rows {
                            assert_eq!(c.violations, bad.len() as u64, "{label}");
                        }
                    }
                    Policy::Fail => unreachable!(),
                }
            }
        }
    }
}
