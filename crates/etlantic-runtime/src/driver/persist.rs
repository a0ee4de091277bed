//! Persisting a micro-batch: the operators' state (written while the sinks write), the
//! commit record, and where the sources may release from.
//!
//! The state is written while the sinks write: both must be durable before the commit
//! of N and neither depends on the other, so their fsyncs overlap. A crash before the
//! commit leaves state of an uncommitted batch, which the restart overwrites when it
//! re-runs the batch.
//!
//! An operator with a changelog writes its changes, and a whole snapshot every
//! [`FULL_SNAPSHOT_EVERY`](crate::checkpoint::FULL_SNAPSHOT_EVERY) versions once its
//! changes since the last one are half its state ([`whole_snapshot_due`]). That snapshot
//! is taken at once but written in the background after the changes are durable (like
//! the maintenance thread of Spark's RocksDB changelog checkpointing): the changes alone
//! make the version recoverable, so the commit never waits for it. One is in flight at a
//! time; while one is, the next is skipped and the chain just grows longer.
//!
//! An operator that keeps its state in a [`StateStore`](crate::state_store::StateStore)
//! (the profile's `state_store`) writes nothing of the above: its store commits the
//! version instead (durable in the checkpoint when `commit` returns, so before the
//! micro-batch's commit names it), and after the micro-batch commit drops versions older
//! than the [`KEPT_STORE_VERSIONS`] newest.
//!
//! Under a state checkpoint interval (the profile's `state_checkpoint_interval`) only a
//! micro-batch that comes once the interval has passed writes the state (a restart
//! rebuilds the rest); the changes of a changelog operator then span every micro-batch
//! since the last write.

use super::{FailPoint, StreamingQuery};
use crate::checkpoint::state_log::LogEntry;
use crate::checkpoint::{whole_snapshot_due, CommitEntry, OffsetEntry};
use crate::state_store::{CommitStats, KEPT_STORE_VERSIONS};
use arrow::array::RecordBatch;
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Error, Result};
use std::collections::HashMap;
use tokio::task::JoinHandle;

/// What a micro-batch writes of an operator's state.
enum StateWrite {
    /// The whole state, as a snapshot file (an operator with a changelog).
    Whole(RecordBatch),
    /// The changes since the previous version, logged.
    Changes(RecordBatch),
    /// The whole state, logged (an operator without a changelog).
    Logged(RecordBatch),
}

/// Where the writing of the operators' state stands.
pub(super) struct StateWrites {
    /// The newest state version that is durable (0: none yet, the empty state).
    pub(super) version: u64,
    /// State writes so far (the version, when every micro-batch writes its state): every
    /// [`crate::checkpoint::FULL_SNAPSHOT_EVERY`]th may be a whole snapshot.
    writes: u64,
    /// The processing time (epoch ms) of the last state write, or of the start: the
    /// profile's `state_checkpoint_interval` counts from it.
    written_ms: i64,
    /// Per changelog operator: rows of the changes written since its last whole snapshot.
    /// Starts at 0, also after a restart, which only delays the next whole snapshot.
    changes_since_whole: HashMap<String, u64>,
    /// Whole snapshots of changelog operators being written in the background.
    background: Option<JoinHandle<Result<()>>>,
    /// What each operator's state store committed in the last micro-batch, and how long
    /// it took (progress `customMetrics`).
    pub(super) store_commits: HashMap<String, (CommitStats, std::time::Duration)>,
}

/// The state write of one micro-batch, under way while the sinks write.
pub(super) struct Pending {
    /// The version it writes, if it writes one.
    version: Option<u64>,
    /// The write itself (`None`: nothing to write).
    task: Option<JoinHandle<Result<()>>>,
    /// Whole snapshots to write in the background once the micro-batch commits.
    background: Vec<(String, RecordBatch)>,
}

impl StateWrites {
    /// Nothing written yet; the interval counts from `now_ms`.
    pub(super) fn new(now_ms: i64) -> Self {
        StateWrites {
            version: 0,
            writes: 0,
            written_ms: now_ms,
            changes_since_whole: HashMap::new(),
            background: None,
            store_commits: HashMap::new(),
        }
    }

    /// After a restart: `version` is the newest durable state, written by the micro-batch
    /// whose timestamp is `written_ms` (if known).
    pub(super) fn restored(&mut self, version: u64, written_ms: Option<i64>) {
        self.version = version;
        self.writes = version;
        if let Some(ms) = written_ms {
            self.written_ms = ms;
        }
    }

    /// Waits for the whole snapshot being written in the background, if any. Its
    /// failure is reported (the changes it would have shortened the chain of are
    /// durable, so nothing is lost, but a checkpoint that cannot be written is a fault).
    pub(super) async fn finish_background(&mut self) -> Result<()> {
        if let Some(h) = self.background.take() {
            h.await.map_err(|e| {
                Error::new(
                    &codes::ENGINE_ERROR,
                    format!("writing a state snapshot in the background failed: {e}"),
                )
            })??;
        }
        Ok(())
    }
}

impl StreamingQuery {
    /// Starts writing the operators' state after micro-batch `batch_id` (version
    /// `batch_id + 1`), if this micro-batch writes it (see the module docs).
    pub(super) async fn start_state_write(
        &mut self,
        batch_id: u64,
        entry: &OffsetEntry,
    ) -> Result<Pending> {
        let version = batch_id + 1;
        let write_state = !self.program.has_state()
            || self.plan.profile.state_checkpoint_interval.is_none_or(|d| {
                entry
                    .batch_timestamp_ms
                    .saturating_sub(self.state.written_ms)
                    >= d.as_millis()
            });
        if !write_state {
            return Ok(Pending {
                version: None,
                task: None,
                background: Vec::new(),
            });
        }
        let since = self.state.version;
        let previous_done = self
            .state
            .background
            .as_ref()
            .is_none_or(|h| h.is_finished());
        if previous_done {
            self.state.finish_background().await?;
        }
        self.state.writes += 1;
        let writes = self.state.writes;
        let in_background = self.opts.background_snapshots;
        let mut writes_of_ops = Vec::new();
        let mut background = Vec::new();
        self.state.store_commits.clear();
        for op in self.program.operators() {
            let id = op.id().to_string();
            if let Some(store) = op.store() {
                let started = std::time::Instant::now();
                let stats = store.commit(version)?;
                self.state
                    .store_commits
                    .insert(id, (stats, started.elapsed()));
                continue;
            }
            let write = match op.changes()? {
                Some(changes) => {
                    let changed = self
                        .state
                        .changes_since_whole
                        .entry(id.clone())
                        .or_default();
                    *changed += changes.num_rows() as u64;
                    let due = whole_snapshot_due(writes, *changed, op.rows_total());
                    if due && !in_background {
                        *changed = 0;
                        StateWrite::Whole(op.snapshot()?)
                    } else {
                        if due && previous_done {
                            *changed = 0;
                            background.push((id.clone(), op.snapshot()?));
                        }
                        StateWrite::Changes(changes)
                    }
                }
                None => StateWrite::Logged(op.snapshot()?),
            };
            writes_of_ops.push((id, write));
        }
        let files = match writes_of_ops.is_empty() {
            true => None,
            false => Some(self.checkpoint()?.state_files()),
        };
        let task = files.map(|files| {
            tokio::task::spawn_blocking(move || -> Result<()> {
                let mut logged = Vec::new();
                for (id, state) in &writes_of_ops {
                    match state {
                        StateWrite::Whole(s) => files.write(id, version, s)?,
                        StateWrite::Changes(c) => logged.push((id.as_str(), LogEntry::Changes(c))),
                        StateWrite::Logged(s) => logged.push((id.as_str(), LogEntry::Whole(s))),
                    }
                }
                // Every operator's entry in one record of the state log: one sync per
                // micro-batch, however many operators.
                if !logged.is_empty() {
                    files.write_logged(version, since, &logged)?;
                }
                Ok(())
            })
        });
        Ok(Pending {
            version: Some(version),
            task,
            background,
        })
    }

    /// Finishes the state write of micro-batch `batch_id`, logs its commit and notes what
    /// the sources may release; returns whether the watermark moved.
    pub(super) async fn commit(
        &mut self,
        batch_id: u64,
        entry: &OffsetEntry,
        pending: Pending,
    ) -> Result<bool> {
        if let Some(task) = pending.task {
            task.await.map_err(|e| {
                Error::new(
                    &codes::ENGINE_ERROR,
                    format!("writing the state of batch {batch_id} failed: {e}"),
                )
            })??;
        }
        let wrote_state = pending.version.is_some();
        if let Some(version) = pending.version {
            self.state.version = version;
            self.state.written_ms = entry.batch_timestamp_ms;
            if !pending.background.is_empty() {
                let files = self.checkpoint()?.state_files();
                let background = pending.background;
                self.state.background = Some(tokio::task::spawn_blocking(move || {
                    for (id, state) in &background {
                        files.write(id, version, state)?;
                    }
                    Ok(())
                }));
            }
        }
        self.maybe_fail(FailPoint::AfterState, batch_id);
        let moved = self.watermark.advance();
        let version = batch_id + 1;
        if let Some(cp) = &self.checkpoint {
            cp.write_commit(
                batch_id,
                &CommitEntry {
                    next_batch_watermark_ms: self.watermark.current_ms(),
                    max_event_time_ms: self.watermark.max_event_times().clone(),
                    state_version: (self.state.version != version).then_some(self.state.version),
                },
            )?;
        }
        self.maybe_fail(FailPoint::AfterCommit, batch_id);
        // The commit names the new version: the oldest ones no restart reads can go.
        if wrote_state && self.checkpoint.is_some() {
            if let Some(oldest) = (version + 1).checked_sub(KEPT_STORE_VERSIONS) {
                for op in self.program.operators() {
                    if let Some(store) = op.store() {
                        store.retain(oldest)?;
                    }
                }
            }
        }
        for (i, s) in self.sources.iter_mut().enumerate() {
            if let Some(end) = entry.sources.get(&s.id).and_then(|r| r.end.clone()) {
                let end = Offset(end);
                // A source may release only what no restart reads again: up to the
                // batch whose state is durable, once its commit is (a batch run, with
                // no checkpoint, releases nothing).
                if wrote_state && self.checkpoint.is_some() {
                    self.pending_release.retain(|(at, _)| *at != i);
                    self.pending_release.push((i, end.clone()));
                }
                s.position = Some(end);
            }
        }
        Ok(moved)
    }
}
