//! The run report: what a batch run or a streaming run did, summed from its progress
//! records ([`RunTotals`]) — a batch run has one, a streaming run one per micro-batch.

use crate::progress::QueryProgress;
use crate::quality::RuleCount;
use etlantic_core::data::DataLoss;
use etlantic_core::diagnostics::Diagnostic;
use etlantic_core::streaming::ExecutionMode;
use etlantic_plan::plan::PipelinePlan;
use serde::Serialize;
use std::collections::HashMap;

/// Counts for one source.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SourceReport {
    /// Source id.
    pub id: String,
    /// Records that passed the contract.
    pub rows: u64,
    /// Records quarantined.
    pub rejected: u64,
    /// Records that were gone before they were read and that the binding let the run go
    /// on without (e.g. Kafka's `failOnDataLoss=false`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_loss: Vec<DataLoss>,
    /// Of the records quarantined, those that broke a record rule of the contract
    /// (range, length, pattern), by rule id.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub quarantined_by_rule: std::collections::BTreeMap<String, u64>,
}

/// Counts for one sink.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SinkReport {
    /// Sink id (the ids joined with `,` when the system that ran the query counted its
    /// sinks only together).
    pub id: String,
    /// Rows written.
    pub rows: u64,
    /// The backend did not report the rows it wrote (Spark's file sink reports -1):
    /// `rows` is then not a count.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rows_unknown: bool,
}

/// One contract quality rule's outcome over a run (summed over the micro-batches of a
/// streaming run).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QualityReport {
    /// The asset whose contract has the rule.
    pub asset: String,
    /// The rule id.
    pub id: String,
    /// The policy in force.
    pub policy: etlantic_core::contract::rules::Policy,
    /// Offending rows (for `rowCount` and `sql`: the evaluations that failed).
    pub violations: u64,
    /// Evaluations (the batch, or micro-batches) in which the rule broke its threshold.
    pub failed: u64,
    /// Rows the policy took out (dropped or quarantined).
    pub removed: u64,
}

impl QualityReport {
    /// Adds one evaluation's outcome to the rule's entry in `into`.
    pub fn add(into: &mut Vec<QualityReport>, asset: &str, c: &RuleCount) {
        let entry = match into.iter().position(|q| q.asset == asset && q.id == c.id) {
            Some(i) => &mut into[i],
            None => {
                into.push(QualityReport {
                    asset: asset.to_string(),
                    id: c.id.clone(),
                    policy: c.policy,
                    violations: 0,
                    failed: 0,
                    removed: 0,
                });
                into.last_mut().expect("pushed")
            }
        };
        entry.violations += c.violations;
        entry.failed += u64::from(c.failed);
        entry.removed += c.removed;
    }
}

/// What a run did.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The application the run belongs to (empty when the run failed before it knew).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub application_id: String,
    /// The query id: stable across the restarts of a streaming query (a batch run: the
    /// plan's fingerprint). Empty when the run failed before it knew.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub query_id: String,
    /// Unique id of this run.
    pub run_id: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Fingerprint of the plan that ran.
    pub fingerprint: String,
    /// Batch or streaming.
    pub mode: ExecutionMode,
    /// `succeeded` or `failed`.
    pub status: String,
    /// Start time (UTC, ISO-8601).
    pub started_at: String,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Per-source counts.
    pub sources: Vec<SourceReport>,
    /// Per-sink counts.
    pub sinks: Vec<SinkReport>,
    /// Where rejected records went, as the plan names it (relative to the project root;
    /// secret references stay unresolved).
    pub quarantine: String,
    /// Records quarantined in total.
    pub quarantined: u64,
    /// The outcomes of the contracts' quality rules (see `docs/streaming.md`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<QualityReport>,
    /// Errors, when the run failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Diagnostic>,
}

impl RunReport {
    /// The report of a run of `plan` that started at `started_at` and has done nothing
    /// yet.
    pub fn new(plan: &PipelinePlan, run_id: &str, started_at: &str) -> Self {
        Self::empty(
            &plan.pipeline,
            &plan.fingerprint,
            plan.profile.mode,
            run_id,
            started_at,
        )
    }

    fn empty(
        pipeline: &str,
        fingerprint: &str,
        mode: ExecutionMode,
        run_id: &str,
        started_at: &str,
    ) -> Self {
        RunReport {
            application_id: String::new(),
            query_id: String::new(),
            run_id: run_id.to_string(),
            pipeline: pipeline.to_string(),
            fingerprint: fingerprint.to_string(),
            mode,
            status: "succeeded".into(),
            started_at: started_at.to_string(),
            duration_ms: 0,
            sources: vec![],
            sinks: vec![],
            quarantine: String::new(),
            quarantined: 0,
            quality: vec![],
            errors: vec![],
        }
    }

    /// Names the run's application, query and run.
    pub fn identify(&mut self, ids: &crate::status::QueryIds) {
        self.application_id = ids.application_id.clone();
        self.query_id = ids.query_id.clone();
        self.run_id = ids.run_id.clone();
    }

    /// Marks the run failed with `errors`.
    pub fn fail(&mut self, errors: Vec<Diagnostic>) {
        self.status = "failed".into();
        self.errors = errors;
    }
}

/// A run's counts so far, summed from its progress records.
#[derive(Debug, Default)]
pub struct RunTotals {
    /// Per source id: (rows that passed, quarantined, data loss, quarantined by rule).
    #[allow(clippy::type_complexity)]
    sources: HashMap<
        String,
        (
            u64,
            u64,
            Vec<DataLoss>,
            std::collections::BTreeMap<String, u64>,
        ),
    >,
    /// Per sink id, in the order first seen: (rows, rows unknown).
    sinks: Vec<(String, u64, bool)>,
    quarantined: u64,
    quality: Vec<QualityReport>,
    /// Progress records added.
    records: u64,
}

impl RunTotals {
    /// Adds a micro-batch's record.
    pub fn add(&mut self, p: &QueryProgress) {
        self.records += 1;
        for s in &p.sources {
            let Some(id) = &s.source_id else { continue };
            let e = self.sources.entry(id.clone()).or_default();
            e.0 += s.num_input_rows.saturating_sub(s.num_rows_ruled_out);
            e.1 += s.num_quarantined_rows;
            e.2.extend(s.data_loss.iter().cloned());
            for (rule, n) in &s.quarantined_by_rule {
                *e.3.entry(rule.clone()).or_default() += n;
            }
        }
        // A record with each sink on its own, or (a whole-query backend's) the sinks
        // together, named by their joined ids.
        let entries: Vec<(String, i64)> = match p.sinks.is_empty() {
            false => p
                .sinks
                .iter()
                .map(|s| (s.sink_id.clone().unwrap_or_default(), s.num_output_rows))
                .collect(),
            true => vec![(String::new(), p.sink.num_output_rows)],
        };
        for (id, rows) in entries {
            let i = match self.sinks.iter().position(|s| s.0 == id) {
                Some(i) => i,
                None => {
                    self.sinks.push((id, 0, false));
                    self.sinks.len() - 1
                }
            };
            match u64::try_from(rows) {
                Ok(n) => self.sinks[i].1 += n,
                Err(_) => self.sinks[i].2 = true,
            }
        }
        self.quarantined += p.quarantined_rows;
        for c in &p.quality {
            QualityReport::add(&mut self.quality, &c.asset, &c.count);
        }
    }

    /// Fills `report`'s counts: a source for each of `sources` (in that order), the
    /// sinks as the records counted them — each on its own, or together under the ids
    /// `sinks` joined with `,` — the quarantined records and the quality rules. A run
    /// that wrote no record (it failed first) reports no sink.
    pub fn fill(&self, sources: &[&str], sinks: &[&str], report: &mut RunReport) {
        report.sources = sources
            .iter()
            .map(|id| {
                let (rows, rejected, lost, by_rule) =
                    self.sources.get(*id).cloned().unwrap_or_default();
                SourceReport {
                    id: id.to_string(),
                    rows,
                    rejected,
                    data_loss: lost,
                    quarantined_by_rule: by_rule,
                }
            })
            .collect();
        let together = sinks.join(",");
        report.sinks = self
            .sinks
            .iter()
            .map(|(id, rows, unknown)| SinkReport {
                id: if id.is_empty() {
                    together.clone()
                } else {
                    id.clone()
                },
                rows: *rows,
                rows_unknown: *unknown,
            })
            .collect();
        report.quarantined = self.quarantined;
        report.quality = self.quality.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{SinkProgress, SourceProgress};

    fn empty_report() -> RunReport {
        RunReport::empty("p", "f", ExecutionMode::Streaming, "r", "t")
    }

    fn record(
        rows: u64,
        ruled_out: u64,
        quarantined: u64,
        sink_rows: &[(&str, i64)],
    ) -> QueryProgress {
        QueryProgress {
            sources: vec![SourceProgress {
                source_id: Some("orders".into()),
                num_input_rows: rows,
                num_rows_ruled_out: ruled_out,
                num_quarantined_rows: quarantined,
                ..Default::default()
            }],
            sinks: sink_rows
                .iter()
                .map(|(id, n)| SinkProgress {
                    sink_id: Some(id.to_string()),
                    num_output_rows: *n,
                    ..Default::default()
                })
                .collect(),
            quarantined_rows: quarantined,
            ..Default::default()
        }
    }

    /// Sources count the rows that passed their contract and the records quarantined;
    /// sinks are counted one by one, over every record.
    #[test]
    fn totals_sum_the_records_per_source_and_per_sink() {
        let mut t = RunTotals::default();
        t.add(&record(10, 2, 3, &[("a", 8), ("b", 1)]));
        t.add(&record(5, 0, 1, &[("a", 5), ("b", 0)]));
        let mut report = empty_report();
        t.fill(&["orders", "other"], &["a", "b"], &mut report);
        assert_eq!(
            report.sources,
            vec![
                SourceReport {
                    id: "orders".into(),
                    rows: 13,
                    rejected: 4,
                    ..Default::default()
                },
                SourceReport {
                    id: "other".into(),
                    ..Default::default()
                }
            ]
        );
        let sinks: Vec<(&str, u64)> = report
            .sinks
            .iter()
            .map(|s| (s.id.as_str(), s.rows))
            .collect();
        assert_eq!(sinks, vec![("a", 13), ("b", 1)]);
        assert_eq!(report.quarantined, 4);
    }

    /// A whole-query backend's records count the sinks together, and `-1` means it did
    /// not count them.
    #[test]
    fn sinks_counted_together_are_reported_under_their_joined_ids() {
        let mut t = RunTotals::default();
        let mut p = QueryProgress::default();
        p.sink.num_output_rows = -1;
        t.add(&p);
        let mut report = empty_report();
        t.fill(&[], &["a", "b"], &mut report);
        assert_eq!(report.sinks.len(), 1);
        assert_eq!(report.sinks[0].id, "a,b");
        assert!(report.sinks[0].rows_unknown);
    }
}
