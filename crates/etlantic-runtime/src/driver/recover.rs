//! Resuming a query from its checkpoint.

use super::StreamingQuery;
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};

impl StreamingQuery {
    /// Picks up where the checkpoint left off: the watermark and source positions of the
    /// last committed batch, the newest durable state (its commit names the version), the
    /// committed batches after that state to run again, and an uncommitted batch to re-run.
    pub(super) fn recover(&mut self) -> Result<()> {
        // A batch run has no checkpoint: it always starts afresh.
        let Some(cp) = self.checkpoint.as_ref() else {
            return Ok(());
        };
        let last_offsets = cp.latest_offsets()?;
        let last_commit = cp.latest_commit()?;
        let Some(n) = last_offsets else { return Ok(()) };
        let committed = last_commit == Some(n);
        // The batch whose state we restore: everything up to `base` is committed.
        let base = if committed { Some(n) } else { n.checked_sub(1) };
        if let Some(b) = base {
            let commit = cp.commit(b)?.ok_or_else(|| {
                Error::from(Diagnostic::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the commit of batch {b} is missing while batch {n} is logged"),
                ))
            })?;
            self.watermark.restore(
                commit.next_batch_watermark_ms,
                commit.max_event_time_ms.clone(),
            );
            let prev = cp.offsets(b)?.ok_or_else(|| {
                Error::from(Diagnostic::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the offsets of batch {b} are missing"),
                ))
            })?;
            self.prev_watermark_ms = prev.batch_watermark_ms;
            for s in self.sources.iter_mut() {
                s.position = prev
                    .sources
                    .get(&s.id)
                    .and_then(|r| r.end.clone())
                    .map(Offset);
            }
            // Under a state checkpoint interval the newest durable state may be older
            // than the commit: the committed batches after it run again to rebuild it.
            let version = commit.state_version_of(b);
            if version > b + 1 {
                return Err(Diagnostic::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the commit of batch {b} names state version {version}, after its own batch"),
                )
                .into());
            }
            if version <= b {
                self.rebuild = Some((version, b));
            }
            // The interval counts from the micro-batch that wrote that state.
            let written_ms = match version.checked_sub(1) {
                Some(wrote) => cp.offsets(wrote)?.map(|e| e.batch_timestamp_ms),
                None => None,
            };
            self.state.restored(version, written_ms);
            for op in self.program.operators() {
                if let Some(store) = op.store() {
                    store.restore((version > 0).then_some(version))?;
                    continue;
                }
                let identity = op.changelog_identity();
                if let Some(state) = cp.read_state_chain(op.id(), version, identity)? {
                    op.restore(&state)?;
                }
            }
        }
        if committed {
            self.next_batch = n + 1;
            // A committed data batch that advanced the watermark may still owe its
            // no-data batch.
            let entry = cp.offsets(n)?.expect("exists");
            self.needs_no_data = self.plan.profile.no_data_batches
                && self.has_watermarked_state()
                && self.watermark.current_ms() > entry.batch_watermark_ms;
        } else {
            self.next_batch = n;
            self.replay = cp.offsets(n)?;
        }
        Ok(())
    }

    /// Runs the committed batches that a restart must run again to rebuild the state
    /// (see [`StreamingQuery::recover`]): with the logged offsets and watermarks, through
    /// the operators only — their outputs reach no sink, quarantine or progress record,
    /// which the first run wrote — and writing no checkpoint file.
    pub(super) async fn rebuild_state(&mut self) -> Result<()> {
        let Some((first, last)) = self.rebuild.take() else {
            return Ok(());
        };
        let (next_batch, watermark) = (self.next_batch, self.watermark.clone());
        self.rebuilding = true;
        for batch in first..=last {
            let entry = self.checkpoint()?.offsets(batch)?.ok_or_else(|| {
                Error::from(Diagnostic::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the offsets of batch {batch} are missing; the state cannot be rebuilt from version {first}"),
                ))
            })?;
            self.next_batch = batch;
            if let Err(e) = self.execute_inner(entry, true).await {
                self.rebuilding = false;
                return Err(e.map_diagnostics(|d| {
                    d.help(format!(
                        "Rebuilding the state after a restart runs the committed micro-batches {first}..={last} again; their sources must still give the logged offsets."
                    ))
                }));
            }
        }
        self.rebuilding = false;
        self.next_batch = next_batch;
        self.watermark = watermark;
        Ok(())
    }
}
