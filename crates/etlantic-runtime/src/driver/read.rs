//! Reading a micro-batch: every source's logged range, the source contracts' quality
//! rules on what was read, the event times the watermark follows, and the static tables.

use super::{BatchStats, StreamingQuery};
use crate::checkpoint::{OffsetEntry, SourceRange};
use crate::quality::QualityGate;
use crate::watermark::micros;
use arrow::array::Array;
use etlantic_core::data::{Offset, RejectedRecord, RowOrigins, Table};
use etlantic_core::diagnostics::Result;
use std::collections::HashMap;

/// What reading a micro-batch gave.
pub(super) struct Read {
    /// Source id (streaming and static) → its rows.
    pub(super) relations: HashMap<String, Table>,
    /// Records that broke their contract while decoding (subject to `on_error`).
    pub(super) rejected: Vec<RejectedRecord>,
    /// Records a quality rule's `quarantine` policy took out (not subject to `on_error`).
    pub(super) ruled_out: Vec<RejectedRecord>,
}

/// Runs `gate` on `table` (row positions from `origins`, else row indexes), counts its
/// rules in `stats` and adds what its quarantine policy took out to `ruled_out`; returns
/// the rows that go on.
pub(super) async fn gated(
    gate: &QualityGate,
    table: Table,
    origins: &RowOrigins,
    stats: &mut BatchStats,
    ruled_out: &mut Vec<RejectedRecord>,
) -> Result<Table> {
    let out = gate.apply_at(table, origins).await?;
    ruled_out.extend(out.quarantined);
    let asset = gate.asset();
    stats
        .quality
        .extend(out.counts.into_iter().map(|c| (asset.to_string(), c)));
    Ok(out.table)
}

/// Counts the records of source `id` its decoder rejected for breaking a record rule of
/// its contract, by rule ([`crate::quality::record_rule_of`]).
fn count_rule_rejects(
    plan: &etlantic_plan::plan::PipelinePlan,
    id: &str,
    asset: &str,
    rejected: &[RejectedRecord],
    stats: &mut BatchStats,
) {
    let code = etlantic_core::diagnostics::codes::RECORD_RULE_VIOLATION.code;
    if !rejected.iter().any(|r| r.code == code) {
        return;
    }
    // Only when there are such records: the rules are read from the contract again.
    let Ok(contract) = plan.asset_contract(asset) else {
        return;
    };
    let Ok(rules) = etlantic_core::contract::rules::RuleSet::of(&contract) else {
        return;
    };
    let counts = stats.source_rule_rejects.entry(id.to_string()).or_default();
    for r in rejected {
        if let Some(rule) = crate::quality::record_rule_of(&rules.rules, r) {
            *counts.entry(rule.to_string()).or_default() += 1;
        }
    }
}

impl StreamingQuery {
    /// Reads the ranges `entry` logged (nothing for a no-data micro-batch).
    pub(super) async fn read(
        &mut self,
        entry: &OffsetEntry,
        stats: &mut BatchStats,
    ) -> Result<Read> {
        let mut relations: HashMap<String, Table> = HashMap::new();
        let mut rejected: Vec<RejectedRecord> = Vec::new();
        // Records a quality rule's `quarantine` policy took out (not subject to on_error).
        let mut ruled_out: Vec<RejectedRecord> = Vec::new();
        let no_data = entry.kind == "no_data";
        let bounded = self.checkpoint.is_none();
        for s in self.sources.iter_mut() {
            let range = entry.sources.get(&s.id).cloned().unwrap_or(SourceRange {
                start: None,
                end: None,
            });
            let schema = s.source.schema();
            let (table, origins) = match (&range.end, no_data) {
                (Some(end), false) if range.start.as_ref() != Some(end) => {
                    let start = range.start.clone().map(Offset);
                    let b = s.source.read(start.as_ref(), &Offset(end.clone())).await?;
                    *stats.source_quarantined.entry(s.id.clone()).or_default() +=
                        b.rejected.len() as u64;
                    count_rule_rejects(&self.plan, &s.id, &s.asset, &b.rejected, stats);
                    rejected.extend(b.rejected);
                    if !b.lost.is_empty() {
                        stats.lost.insert(s.id.clone(), b.lost);
                    }
                    (Table::new(schema, b.batches), b.origins)
                }
                _ => (Table::empty(schema), RowOrigins::default()),
            };
            let rows = table.num_rows() as u64;
            stats.input_rows.insert(s.id.clone(), rows);
            // Batch-level quality rules of the source contract, on what this batch read
            // (a batch run's whole input, even when empty: a row count rule judges it).
            let table = match &s.gate {
                Some(gate) if rows > 0 || bounded => {
                    let before = ruled_out.len();
                    let kept = gated(gate, table, &origins, stats, &mut ruled_out).await?;
                    let quarantined = (ruled_out.len() - before) as u64;
                    *stats.source_quarantined.entry(s.id.clone()).or_default() += quarantined;
                    stats
                        .source_ruled_out
                        .insert(s.id.clone(), rows - kept.num_rows() as u64);
                    kept
                }
                _ => table,
            };
            if let Some(col) = &s.info.event_time {
                for b in &table.batches {
                    if let Some(c) = b.column_by_name(col) {
                        let mut t = micros(c)?;
                        if let Some(rows) = &mut s.measured {
                            t = rows.select(b, t)?;
                        }
                        // Whole-column kernels: this runs on every input row.
                        let (Some(min), Some(max)) =
                            (arrow::compute::min(&t), arrow::compute::max(&t))
                        else {
                            continue;
                        };
                        stats.event_min_us = Some(stats.event_min_us.map_or(min, |m| m.min(min)));
                        stats.event_max_us = Some(stats.event_max_us.map_or(max, |m| m.max(max)));
                        stats.event_sum += if t.null_count() == 0 {
                            t.values().iter().map(|&v| v as i128).sum::<i128>()
                        } else {
                            t.iter().flatten().map(|v| v as i128).sum::<i128>()
                        };
                        stats.event_count += (t.len() - t.null_count()) as u64;
                        self.watermark.observe(&s.id, max);
                    }
                }
            }
            relations.insert(s.id.clone(), table);
        }
        for st in self.statics.iter_mut() {
            let (table, bad) = st.table(entry.batch_timestamp_ms).await?;
            rejected.extend(bad);
            relations.insert(st.id.clone(), table);
        }
        Ok(Read {
            relations,
            rejected,
            ruled_out,
        })
    }
}
