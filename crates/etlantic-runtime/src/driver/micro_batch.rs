//! One micro-batch, phase by phase: log its offsets, read, transform, route, publish,
//! persist, report (see the [batch protocol](super)).

use super::{BatchStats, FailPoint, StreamingQuery};
use crate::checkpoint::OffsetEntry;
use crate::progress::{
    iso_ms, EventTimeProgress, QualityProgress, QueryProgress, SinkProgress, SourceProgress,
};
use etlantic_core::data::RejectedRecord;
use etlantic_core::diagnostics::Result;
use etlantic_core::uri::redact;
use std::collections::HashMap;
use std::time::Instant;

/// Records of a replayed micro-batch that its crashed attempt already quarantined (a key
/// per record → count).
type AlreadyQuarantined = HashMap<String, usize>;

impl StreamingQuery {
    /// Runs one micro-batch. A failure leaves the operators' in-memory state (and the
    /// watermark tracker) holding part of the batch, so the query refuses to go on; a
    /// restart re-runs the batch from the checkpoint.
    pub(super) async fn execute(&mut self, entry: OffsetEntry, replaying: bool) -> Result<()> {
        let batch_id = self.next_batch;
        let result = self.execute_inner(entry, replaying).await;
        if result.is_err() {
            self.failed_batch = Some(batch_id);
        }
        result
    }

    /// The phases of micro-batch `self.next_batch`; `replaying` when its offsets are
    /// already logged (a re-run after a restart, or a rebuild of state).
    pub(super) async fn execute_inner(
        &mut self,
        entry: OffsetEntry,
        replaying: bool,
    ) -> Result<()> {
        let batch_id = self.next_batch;
        let t_start = Instant::now();
        let mut progress = QueryProgress::start(
            &self.query_id,
            &self.run_id,
            &self.plan.pipeline,
            batch_id,
            (&entry.kind, entry.batch_timestamp_ms),
        );
        progress.application_id = self.application_id.clone();
        if let (Some(cp), false) = (&self.checkpoint, replaying) {
            cp.write_offsets(batch_id, &entry)?;
            // Appending them synced the log: the last commit is durable.
            self.release_sources().await?;
        }
        progress.duration("walCommit", t_start.elapsed());
        self.maybe_fail(FailPoint::AfterOffsets, batch_id);

        // Read.
        let t_read = Instant::now();
        let mut stats = BatchStats::default();
        let read = self.read(&entry, &mut stats).await?;
        progress.duration("getBatch", t_read.elapsed());
        let mut relations = read.relations;
        // A replayed batch may have quarantined records before the crash: those are not
        // written twice.
        let mut already = if replaying && !self.rebuilding {
            self.quarantine.written_for(batch_id)?
        } else {
            AlreadyQuarantined::new()
        };
        self.quarantine_records(&read.rejected, batch_id, &mut already, true, &mut stats)?;
        self.quarantine_records(&read.ruled_out, batch_id, &mut already, false, &mut stats)?;

        // Transform and route.
        let t_exec = Instant::now();
        let mut run = self.transform(&mut relations, &entry, &mut stats).await?;
        progress.duration("queryPlanning", std::time::Duration::ZERO);
        let routed = self.route(&mut run, entry.late_watermark_ms)?;
        self.quarantine_records(
            &routed.quarantined,
            batch_id,
            &mut already,
            true,
            &mut stats,
        )?;

        // A batch run again to rebuild state ends here: its sinks, state and commit were
        // written by its first run.
        if self.rebuilding {
            return Ok(());
        }

        // Publish, with the state written meanwhile.
        let pending = self.start_state_write(batch_id, &entry).await?;
        let ruled_out = self
            .publish(batch_id, &relations, routed.side, &mut stats)
            .await?;
        self.quarantine_records(&ruled_out, batch_id, &mut already, false, &mut stats)?;
        progress.duration("addBatch", t_exec.elapsed());

        // Persist.
        let t_commit = Instant::now();
        let batch_watermark = entry.batch_watermark_ms;
        let moved = self.commit(batch_id, &entry, pending).await?;
        progress.duration("commitOffsets", t_commit.elapsed());
        self.prev_watermark_ms = batch_watermark;
        self.next_batch = batch_id + 1;
        self.batches_run += 1;
        let no_data = entry.kind == "no_data";
        self.needs_no_data =
            !no_data && moved && self.plan.profile.no_data_batches && self.has_watermarked_state();

        // Report. Like Spark's, the trigger's time includes asking the sources for new
        // data.
        let latest_offset = std::mem::take(&mut self.latest_offset_took);
        progress.duration("latestOffset", latest_offset);
        progress.duration("triggerExecution", t_start.elapsed() + latest_offset);
        self.finish_progress(progress, &entry, stats, run.state, batch_watermark)
    }

    /// Completes the progress record of a micro-batch, appends it to the checkpoint's
    /// progress log and hands it to the listener.
    fn finish_progress(
        &mut self,
        mut progress: QueryProgress,
        entry: &OffsetEntry,
        mut stats: BatchStats,
        state: Vec<crate::progress::StateOperatorProgress>,
        batch_watermark_ms: i64,
    ) -> Result<()> {
        progress.sources = self
            .sources
            .iter()
            .map(|s| {
                let r = entry.sources.get(&s.id);
                let end = r.and_then(|r| r.end.clone());
                let backlog = s
                    .source
                    .backlog(end.clone().map(etlantic_core::data::Offset).as_ref());
                SourceProgress {
                    backlog,
                    source_id: Some(s.id.clone()),
                    description: format!("{} ({})", s.id, s.asset),
                    start_offset: r.and_then(|r| r.start.clone()),
                    latest_offset: end.clone(),
                    end_offset: end,
                    num_input_rows: stats.input_rows.get(&s.id).copied().unwrap_or(0),
                    data_loss: stats.lost.remove(&s.id).unwrap_or_default(),
                    num_quarantined_rows: stats.source_quarantined.get(&s.id).copied().unwrap_or(0),
                    num_rows_ruled_out: stats.source_ruled_out.get(&s.id).copied().unwrap_or(0),
                    quarantined_by_rule: stats
                        .source_rule_rejects
                        .remove(&s.id)
                        .unwrap_or_default(),
                    ..Default::default()
                }
            })
            .collect();
        progress.set_rates();
        let watermark = self.watermark.is_active();
        let at = |us: Option<i64>| us.map(|v| iso_ms(v.div_euclid(1000)));
        progress.event_time = EventTimeProgress {
            min: at(stats.event_min_us),
            max: at(stats.event_max_us),
            avg: at((stats.event_count > 0)
                .then(|| (stats.event_sum / stats.event_count as i128) as i64)),
            watermark: watermark.then(|| iso_ms(batch_watermark_ms)),
            next_watermark: watermark.then(|| iso_ms(self.watermark.current_ms())),
            ..Default::default()
        };
        progress.state_operators = state;
        // What the operators' state stores committed (a store's figures, named after
        // Spark's RocksDB ones: what a commit copied to the checkpoint and what it reused).
        for op in progress.state_operators.iter_mut() {
            if let Some((commit, took)) = self.state.store_commits.get(&op.operator_id) {
                let metrics = &mut op.custom_metrics;
                let mut put = |name: &str, value: u64| {
                    metrics.insert(name.to_string(), value.min(i64::MAX as u64) as i64);
                };
                put("stateStoreCommitMs", took.as_millis() as u64);
                put("stateStoreFilesCopied", commit.files_uploaded);
                put("stateStoreBytesCopied", commit.bytes_uploaded);
                put(
                    "stateStoreFilesReused",
                    commit.files_total.saturating_sub(commit.files_uploaded),
                );
                put("stateStoreTotalBytes", commit.bytes_total);
                put(
                    "stateStoreSnapshotFilesCopied",
                    commit.snapshot_files_uploaded,
                );
                put(
                    "stateStoreSnapshotBytesCopied",
                    commit.snapshot_bytes_uploaded,
                );
            }
        }
        progress.sink = SinkProgress {
            description: self
                .sinks
                .iter()
                .map(|s| s.description.clone())
                .collect::<Vec<_>>()
                .join(", "),
            num_output_rows: stats.output_rows as i64,
            ..Default::default()
        };
        // A sink that skipped the micro-batch as already committed wrote nothing in it.
        progress.sinks = self
            .sinks
            .iter()
            .enumerate()
            .map(|(i, s)| SinkProgress {
                sink_id: Some(s.id.clone()),
                description: s.description.clone(),
                num_output_rows: stats.sink_rows.get(i).copied().flatten().unwrap_or(0) as i64,
                ..Default::default()
            })
            .collect();
        progress.quarantined_rows = stats.rejected;
        progress.quarantined_by_code = std::mem::take(&mut stats.rejected_by_code);
        progress.late_rows = stats.late;
        progress.checkpoint_location = self.scrub.text(&redact(&self.opts.checkpoint.to_string()));
        progress.quality = stats
            .quality
            .into_iter()
            .map(|(asset, count)| QualityProgress { asset, count })
            .collect();
        let requests = etlantic_core::storage::requests::request_counts();
        let spent = requests.since(&self.requests_at_last_progress);
        self.requests_at_last_progress = requests;
        progress.storage_requests = (spent.total() > 0).then_some(spent);
        if let Some(cp) = &self.checkpoint {
            progress.storage_retries = cp.storage_retries();
            cp.append_progress(&progress)?;
        }
        if let Some(l) = &self.opts.on_progress {
            l(&progress);
        }
        self.last_progress = Some(progress);
        Ok(())
    }

    /// Quarantines `records` of micro-batch `batch_id` (see
    /// [`crate::quarantine::Quarantine::write`]) and counts them; a micro-batch run again to
    /// rebuild state writes nothing.
    fn quarantine_records(
        &mut self,
        records: &[RejectedRecord],
        batch_id: u64,
        already: &mut AlreadyQuarantined,
        follow_on_error: bool,
        stats: &mut BatchStats,
    ) -> Result<()> {
        if records.is_empty() || self.rebuilding {
            return Ok(());
        }
        stats.rejected += records.len() as u64;
        for r in records {
            *stats.rejected_by_code.entry(r.code.clone()).or_default() += 1;
        }
        // A batch run's records name no micro-batch: it has one, and no checkpoint.
        let batch = self.checkpoint.as_ref().map(|_| batch_id);
        self.quarantine
            .write(records, batch, already, follow_on_error)
            .map(|_| ())
    }
}
