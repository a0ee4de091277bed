//! Publishing a micro-batch: every sink gets its input's rows (a side output the late
//! rows routed to it), checked by the sink contract's quality rules, identified by
//! (query id, batch id) so that a replay changes nothing.

use super::read::gated;
use super::{BatchStats, FailPoint, StreamingQuery};
use arrow::array::RecordBatch;
use etlantic_core::data::{RejectedRecord, RowOrigins, Table};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{SinkBatch, WriteOutcome};
use std::collections::HashMap;

impl StreamingQuery {
    /// Writes micro-batch `batch_id` to every sink: `relations` by name, `side` the late
    /// rows for side-output sinks (by index). Returns the rows the sink contracts'
    /// `quarantine` policies took out.
    pub(super) async fn publish(
        &mut self,
        batch_id: u64,
        relations: &HashMap<String, Table>,
        mut side: HashMap<usize, Vec<RecordBatch>>,
        stats: &mut BatchStats,
    ) -> Result<Vec<RejectedRecord>> {
        let mut sink_rows = 0u64;
        let fail_after_first_sink = self.fail == Some((FailPoint::AfterSink, batch_id));
        let mut sink_ruled_out: Vec<RejectedRecord> = Vec::new();
        let checkpointed = self.checkpoint.is_some();
        for (i, s) in self.sinks.iter_mut().enumerate() {
            let is_side = self.side_sinks.values().any(|v| *v == i);
            let table = match side.remove(&i) {
                Some(batches) if is_side => {
                    let schema = batches[0].schema();
                    Table::new(schema, batches)
                }
                // A side output receives the late rows only (none in this batch).
                _ if is_side => Table::empty(s.schema.clone()),
                _ => match relations.get(&s.input) {
                    Some(t) => t.clone(),
                    None => {
                        return Err(Error::new(
                            &codes::PLAN_INVALID,
                            format!(
                                "sink `{}` reads `{}`, which nothing produced",
                                s.id, s.input
                            ),
                        ))
                    }
                },
            };
            let mut table = table.conform_to(&s.schema)?;
            if let (Some(gate), false) = (&s.gate, is_side) {
                table = gated(
                    gate,
                    table,
                    &RowOrigins::default(),
                    stats,
                    &mut sink_ruled_out,
                )
                .await?;
            }
            let outcome = s
                .sink
                .write(SinkBatch {
                    query_id: &self.query_id,
                    batch_id,
                    output_mode: s.output_mode,
                    data: &table,
                })
                .await
                .map_err(|e| match checkpointed {
                    true => e.map_diagnostics(|d| {
                        d.help(format!(
                            "Batch {batch_id} is not committed; it runs again on restart."
                        ))
                    }),
                    false => e,
                })?;
            match outcome {
                WriteOutcome::Written { rows } => {
                    sink_rows += rows;
                    stats.sink_rows.push(Some(rows));
                }
                // A batch run has no checkpoint, so nothing of it can have been committed
                // before: a sink that skips the write would let the run report rows it
                // never wrote as done.
                WriteOutcome::AlreadyCommitted if !checkpointed => {
                    return Err(Error::new(
                        &codes::SINK_WRITE_FAILED,
                        format!(
                            "sink `{}` skipped the rows of this batch run as already committed; a batch run must write them",
                            s.id
                        ),
                    )
                    .with_help("the sink plugin treats a batch run like a replayed micro-batch: report this to its author"));
                }
                WriteOutcome::AlreadyCommitted => stats.sink_rows.push(None),
            }
            if i == 0 && fail_after_first_sink {
                eprintln!("ETLANTIC_FAIL_POINT reached: AfterSink of batch {batch_id}; aborting");
                std::process::abort();
            }
        }
        stats.output_rows = sink_rows;
        Ok(sink_ruled_out)
    }
}
