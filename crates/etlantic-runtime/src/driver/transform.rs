//! Transforming a micro-batch on the engine's program, and routing what its stateful
//! operators set aside: late rows by their policy (dropped, accepted, quarantined, or
//! to a side-output sink) and rows that repeated a unique key (quarantined).

use super::{BatchStats, StreamingQuery};
use crate::checkpoint::OffsetEntry;
use crate::engine::{BatchTimes, DuplicateRows, LateRows, ProgramRun};
use arrow::array::RecordBatch;
use etlantic_core::data::{RejectedRecord, SourcePosition, Table};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::streaming::{Duration, LatePolicy};
use std::collections::HashMap;

fn io(e: impl std::fmt::Display) -> Error {
    Error::new(&codes::IO_ERROR, e.to_string())
}

/// Where the rows a program set aside go.
#[derive(Default)]
pub(super) struct Routed {
    /// Records for the quarantine (subject to `on_error`).
    pub(super) quarantined: Vec<RejectedRecord>,
    /// Late rows per side-output sink (by index).
    pub(super) side: HashMap<usize, Vec<RecordBatch>>,
}

impl StreamingQuery {
    /// Runs the transformations over `relations` with the times `entry` logged.
    pub(super) async fn transform(
        &mut self,
        relations: &mut HashMap<String, Table>,
        entry: &OffsetEntry,
        stats: &mut BatchStats,
    ) -> Result<ProgramRun> {
        let times = BatchTimes {
            late_watermark_ms: entry.late_watermark_ms,
            batch_watermark_ms: entry.batch_watermark_ms,
            batch_timestamp_ms: entry.batch_timestamp_ms,
        };
        let run = self.program.run(relations, &times).await?;
        stats.late += run.late_count;
        Ok(run)
    }

    /// Routes the late and duplicate rows of `run` (late rows judged against
    /// `late_watermark_ms`).
    pub(super) fn route(&self, run: &mut ProgramRun, late_watermark_ms: i64) -> Result<Routed> {
        let mut routed = Routed::default();
        for d in &run.duplicates {
            routed.quarantined.extend(duplicate_records(d)?);
        }
        for late in std::mem::take(&mut run.late) {
            match late.policy {
                LatePolicy::Drop | LatePolicy::Accept => {}
                LatePolicy::Quarantine => {
                    routed
                        .quarantined
                        .extend(late_records(&late, late_watermark_ms)?);
                }
                LatePolicy::SideOutput { sink } => {
                    if let Some(&i) = self.side_sinks.get(&sink) {
                        routed.side.entry(i).or_default().push(late.rows);
                    }
                }
            }
        }
        Ok(routed)
    }
}

fn late_records(late: &LateRows, watermark_ms: i64) -> Result<Vec<RejectedRecord>> {
    let watermark = chrono::DateTime::from_timestamp_millis(watermark_ms)
        .map(|d| d.to_rfc3339())
        .unwrap_or_default();
    let reason = if late.allowed_lateness > Duration::ZERO {
        format!(
            "late event: its window ended more than the allowed lateness ({}) before the watermark {watermark}",
            late.allowed_lateness
        )
    } else {
        format!("late event: behind the watermark {watermark}")
    };
    rows_as_records(&late.rows, &late.sources, &codes::LATE_EVENT, &reason, None)
}

/// The rows a stream-stream join rejected for repeating a unique key, as quarantine
/// records: they break their contract's uniqueness (`ETL704`).
fn duplicate_records(d: &DuplicateRows) -> Result<Vec<RejectedRecord>> {
    let keys = d.keys.join(", ");
    let reason = format!(
        "duplicate key ({keys}): its contract declares it unique and a stream-stream join \
         still holds an earlier row of it; the join went on without this row"
    );
    rows_as_records(
        &d.rows,
        &d.sources,
        &codes::RECORD_RULE_VIOLATION,
        &reason,
        d.keys.first().cloned(),
    )
}

/// One quarantine record per row of `rows` (the row as JSON), all with `code` and
/// `reason`.
fn rows_as_records(
    rows: &RecordBatch,
    sources: &str,
    code: &codes::CodeInfo,
    reason: &str,
    field: Option<String>,
) -> Result<Vec<RejectedRecord>> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(rows).map_err(io)?;
        w.finish().map_err(io)?;
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text
        .lines()
        .map(|line| RejectedRecord {
            code: code.code.to_string(),
            reason: reason.to_string(),
            field: field.clone(),
            position: SourcePosition {
                asset: sources.to_string(),
                ..Default::default()
            },
            raw: line.to_string(),
        })
        .collect())
}
