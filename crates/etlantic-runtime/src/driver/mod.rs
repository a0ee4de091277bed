//! The micro-batch driver: Spark's `MicroBatchExecution` for ETLantic plans.
//!
//! Batch protocol, for batch N:
//! 1. ask every source for its latest offset (bounded by its read limit);
//! 2. log the offsets of N (synced) — the write-ahead log: source ranges, the watermark
//!    in force, the watermark of the previous micro-batch, the batch timestamp; sources
//!    learn what the last state write let them release (`Source::commit`);
//! 3. read the ranges; quarantine records that break their contract; track event times
//!    ([`read`]);
//! 4. run the transformations on the engine's program ([`crate::engine`]): stateless
//!    steps and stateful operators; route late rows by the late-event policy
//!    ([`transform`]);
//! 5. hand each sink its rows, identified by (query id, N) — sinks are idempotent or
//!    transactional per batch id, or declare at-least-once ([`publish`]);
//! 6. write the operators' state (version N+1) while the sinks write;
//! 7. log the commit of N with the next watermark (durable with the next offsets, see
//!    [`crate::checkpoint::batch_log`]) ([`persist`]);
//! 8. append a progress record.
//!
//! When the watermark moved and a stateful operator depends on it, a no-data batch N+1
//! runs right away (Spark's `noDataMicroBatches`), so windows close without new input.
//!
//! On restart the query resumes after the last commit; a batch whose offsets are logged
//! but not committed runs again with exactly the logged offsets and watermarks
//! ([`recover`]).

mod bounded;
mod micro_batch;
mod open;
mod persist;
mod publish;
mod read;
mod recover;
mod transform;

pub use bounded::BatchOptions;
pub use open::compatibility_fingerprint;

use crate::checkpoint::{Checkpoint, OffsetEntry, SourceRange};
use crate::clock::Clock;
use crate::engine::MicroBatchProgram;
use crate::progress::QueryProgress;
use crate::quality::{QualityGate, RuleCount};
use crate::quarantine::Quarantine;
use crate::secrets::{Scrubber, SecretResolver};
use crate::static_source::StaticSource;
use crate::watermark::{MeasuredRows, WatermarkTracker};
use arrow::datatypes::SchemaRef;
use etlantic_core::data::{DataLoss, Offset};
use etlantic_core::diagnostics::{codes, Diagnostic, Result};
use etlantic_core::plugin::{ReadLimit, Sink, Source};
use etlantic_core::storage::{Location, StorageOptions};
use etlantic_core::streaming::{OutputMode, Trigger};
use etlantic_plan::plan::PipelinePlan;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Receives every progress record.
pub type ProgressListener = Arc<dyn Fn(&QueryProgress) + Send + Sync>;

/// How a streaming query runs.
#[derive(Clone)]
pub struct StreamingOptions {
    /// Directory relative binding paths resolve against.
    pub root: PathBuf,
    /// The checkpoint: a local directory or an object-store prefix (`s3://bucket/chk`).
    pub checkpoint: Location,
    /// Options of the object stores the query reaches (the profile's `storage_options`,
    /// secrets resolved).
    pub storage_options: StorageOptions,
    /// Resolves `${...}` secret references in binding URIs.
    pub resolve: SecretResolver,
    /// Called with each progress record.
    pub on_progress: Option<ProgressListener>,
    /// Stop the processing-time loop when set.
    pub stop: Arc<AtomicBool>,
    /// Stop after this many micro-batches (processing-time trigger), if set.
    pub max_batches: Option<u64>,
    /// The processing-time clock: batch timestamps (hence state TTL and processing-time
    /// timers) come from it. The system clock unless a test injects a
    /// [`crate::clock::ManualClock`].
    pub clock: Clock,
    /// Write the periodic whole snapshot of a changelog operator in the background
    /// (default) instead of before the commit. Either way the version is recoverable;
    /// this only moves the snapshot's write out of the micro-batch's critical path.
    pub background_snapshots: bool,
    /// Where the run serves metrics, if it does: recorded in the status record for
    /// `etlantic status`.
    pub metrics_addr: Option<String>,
}

impl StreamingOptions {
    /// Options with no secret resolution and no listener.
    pub fn new(root: impl Into<PathBuf>, checkpoint: impl Into<Location>) -> Self {
        StreamingOptions {
            root: root.into(),
            checkpoint: checkpoint.into(),
            storage_options: StorageOptions::default(),
            resolve: Arc::new(|s| Ok(s.to_string())),
            on_progress: None,
            stop: Arc::new(AtomicBool::new(false)),
            max_batches: None,
            clock: crate::clock::system_clock(),
            background_snapshots: true,
            metrics_addr: None,
        }
    }
}

/// Where the process may be killed on purpose (fault-injection tests), set with the
/// environment variable `ETLANTIC_FAIL_POINT=<point>:<batch id>` (see
/// [`etlantic_core::faults`]; sinks check `in_sink` themselves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailPoint {
    /// After the offsets of batch N are logged.
    AfterOffsets,
    /// After the first sink wrote, before the others (the state snapshot may be written:
    /// it is written while the sinks write).
    AfterSink,
    /// After the state snapshot, before the commit of batch N is logged.
    AfterState,
    /// After the commit of batch N is logged.
    AfterCommit,
}

fn fail_point() -> Option<(FailPoint, u64)> {
    let (p, n) = etlantic_core::faults::armed()?;
    let point = match p.as_str() {
        "after_offsets" => FailPoint::AfterOffsets,
        "after_sink" => FailPoint::AfterSink,
        "after_state" => FailPoint::AfterState,
        "after_commit" => FailPoint::AfterCommit,
        // Other points (e.g. `in_sink`) are checked where they are, with
        // `etlantic_core::faults::check`.
        _ => return None,
    };
    Some((point, n))
}

/// A streaming source of the query, where it stands.
struct SourceRt {
    id: String,
    asset: String,
    source: Box<dyn Source>,
    limit: ReadLimit,
    position: Option<Offset>,
    /// What the program knows of it (event time, watermark delay, late policy).
    info: crate::engine::ProgramSource,
    /// The source contract's batch-level quality rules (record rules are the decoder's).
    gate: Option<QualityGate>,
    /// The rows its watermark is measured on, when not every row.
    measured: Option<MeasuredRows>,
}

/// A sink of the query.
struct SinkRt {
    id: String,
    input: String,
    sink: Box<dyn Sink>,
    output_mode: OutputMode,
    schema: SchemaRef,
    description: String,
    /// The sink contract's quality rules, checked before the sink publishes.
    gate: Option<QualityGate>,
}

/// Counters of one micro-batch.
#[derive(Default)]
struct BatchStats {
    input_rows: HashMap<String, u64>,
    /// Per source: records gone before they were read that the binding let the query go
    /// on without.
    lost: HashMap<String, Vec<DataLoss>>,
    /// Records quarantined in the batch: rejected while decoding, taken out by a quality
    /// rule, or late under the `quarantine` policy.
    rejected: u64,
    /// Those records by diagnostic code.
    rejected_by_code: BTreeMap<String, u64>,
    /// Per source: records quarantined (rejected while decoding, or by a quality rule).
    source_quarantined: HashMap<String, u64>,
    /// Per source: records its decoder rejected for breaking a record rule, by rule id.
    source_rule_rejects: HashMap<String, BTreeMap<String, u64>>,
    /// Per source: rows read that a quality rule took out.
    source_ruled_out: HashMap<String, u64>,
    late: u64,
    output_rows: u64,
    /// Rows each sink wrote (by index; `None` when it skipped the micro-batch as
    /// already committed).
    sink_rows: Vec<Option<u64>>,
    event_min_us: Option<i64>,
    event_max_us: Option<i64>,
    event_sum: i128,
    event_count: u64,
    /// Quality rule outcomes: (asset, outcome).
    quality: Vec<(String, RuleCount)>,
}

/// A running streaming query.
pub struct StreamingQuery {
    plan: PipelinePlan,
    opts: StreamingOptions,
    /// The checkpoint; a batch run has none ([`StreamingQuery::start_batch`]).
    checkpoint: Option<Checkpoint>,
    /// The application the query belongs to.
    application_id: String,
    query_id: String,
    run_id: String,
    sources: Vec<SourceRt>,
    /// Static sources: bounded tables read for the micro-batches (stream-static joins).
    statics: Vec<StaticSource>,
    sinks: Vec<SinkRt>,
    /// Side-output sink id → its index in `sinks`.
    side_sinks: HashMap<String, usize>,
    /// The transformations, compiled by the engine.
    program: Box<dyn MicroBatchProgram>,
    watermark: WatermarkTracker,
    /// The watermark in force for the previous micro-batch.
    prev_watermark_ms: i64,
    next_batch: u64,
    /// A batch whose offsets are logged but not committed (re-run first).
    replay: Option<OffsetEntry>,
    needs_no_data: bool,
    /// How long asking the sources for their latest offsets took before the micro-batch
    /// about to run (Spark's `durationMs.latestOffset`).
    latest_offset_took: std::time::Duration,
    quarantine: Quarantine,
    /// Hides secret values from everything the query reports.
    scrub: Scrubber,
    fail: Option<(FailPoint, u64)>,
    last_progress: Option<QueryProgress>,
    /// Object-store requests of the process when the last progress record was made.
    requests_at_last_progress: etlantic_core::storage::requests::RequestCounts,
    batches_run: u64,
    /// A micro-batch that failed half-way (the query must be restarted).
    failed_batch: Option<u64>,
    /// The operators' state and where its writing stands.
    state: persist::StateWrites,
    /// Committed batches to run again after a restart to rebuild the state from
    /// `state.version` (first, last).
    rebuild: Option<(u64, u64)>,
    /// Set while those batches run: they only rebuild state, writing nothing.
    rebuilding: bool,
    /// Source ends that a state write made releasable ([`Source::commit`]), told to the
    /// sources once the commit that names that state is durable: with the next offsets
    /// record, or at [`StreamingQuery::close`] (see [`crate::checkpoint::batch_log`]).
    pending_release: Vec<(usize, Offset)>,
}

impl StreamingQuery {
    /// The stable query id.
    pub fn id(&self) -> &str {
        &self.query_id
    }

    /// This run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The application the query belongs to: the profile's `application_id`, else the
    /// one its checkpoint keeps (a batch run: one of its own).
    pub fn application_id(&self) -> &str {
        &self.application_id
    }

    /// The read counters of the sources that keep them ([`Source::read_progress`]), by
    /// source id: what a progress bar polls while a micro-batch reads.
    pub fn read_progress(&self) -> Vec<(String, Arc<etlantic_core::read_progress::ReadProgress>)> {
        self.sources
            .iter()
            .filter_map(|s| Some((s.id.clone(), s.source.read_progress()?)))
            .collect()
    }

    /// The application, query and run ids together.
    pub fn ids(&self) -> crate::status::QueryIds {
        crate::status::QueryIds {
            application_id: self.application_id.clone(),
            query_id: self.query_id.clone(),
            run_id: self.run_id.clone(),
        }
    }

    /// The watermark in force for the next batch (epoch ms).
    pub fn watermark_ms(&self) -> i64 {
        self.watermark.current_ms()
    }

    /// The id the next micro-batch will get.
    pub fn next_batch_id(&self) -> u64 {
        self.next_batch
    }

    /// The last progress record.
    pub fn last_progress(&self) -> Option<&QueryProgress> {
        self.last_progress.as_ref()
    }

    /// The checkpoint, for what only a streaming query does (a batch run has none, nor
    /// state to keep in one).
    fn checkpoint(&self) -> Result<&Checkpoint> {
        self.checkpoint.as_ref().ok_or_else(|| {
            Diagnostic::new(
                &codes::ENGINE_ERROR,
                "a batch run has no checkpoint to keep state or logs in",
            )
            .into()
        })
    }

    /// Whether a watermark advance calls for a no-data batch: some watermarked stateful
    /// operator evicts or emits on it in its output mode (complete-mode aggregations do
    /// not, as in Spark).
    fn has_watermarked_state(&self) -> bool {
        self.program.needs_no_data_batch()
    }

    /// Runs micro-batches until no source has new data and no no-data batch is owed
    /// (Spark's `processAllAvailable`, and the available-now trigger).
    pub async fn process_all_available(&mut self) -> Result<u64> {
        let mut ran = 0;
        while self.run_once().await? {
            ran += 1;
        }
        Ok(ran)
    }

    /// Whether the run must stop before its next micro-batch: asked to (Ctrl-C), or it
    /// ran `max_batches`. Every trigger checks it between micro-batches, so a stopped
    /// run leaves only committed batches behind and the next run goes on from there.
    fn stop_requested(&self) -> bool {
        self.opts.stop.load(Ordering::SeqCst)
            || self.opts.max_batches.is_some_and(|m| self.batches_run >= m)
    }

    /// Runs the query by its trigger until it finishes (available-now, once) or is stopped,
    /// keeping the checkpoint's status record (`status.json`, see [`crate::status`]):
    /// `running` with a heartbeat while it runs, then `stopped` and why, or `failed` and
    /// its errors (secrets scrubbed).
    pub async fn run(&mut self) -> Result<()> {
        let status = match &self.checkpoint {
            Some(cp) => Some(crate::status::StatusWriter::start(
                cp.storage(),
                self.ids(),
                &self.plan.pipeline,
                self.opts.metrics_addr.clone(),
            )),
            None => None,
        };
        let result = self.run_by_trigger().await;
        let closed = match result {
            Ok(reason) => self.close().await.map(|_| reason),
            Err(e) => Err(e),
        };
        if let Some(status) = status {
            let ended = match &closed {
                Ok(reason) => status.end(Ok(reason)),
                Err(e) => status.end(Err(&self.scrub.error(e.clone()))),
            };
            if let Err(e) = ended {
                tracing::warn!("the status record was not written: {e}");
            }
        }
        closed.map(|_| ())
    }

    /// Runs micro-batches by the trigger; returns why it stopped.
    async fn run_by_trigger(&mut self) -> Result<&'static str> {
        match self.plan.profile.trigger.unwrap_or_default() {
            Trigger::AvailableNow => {
                // A backfill can be long: it stops between micro-batches when asked.
                while !self.stop_requested() && self.run_once().await? {}
                if self.stop_requested() {
                    return Ok(self.stop_reason());
                }
                Ok("the available-now trigger processed everything available")
            }
            Trigger::Once => {
                // One micro-batch with everything available: like Spark's Trigger.Once,
                // read limits do not apply (available-now is the trigger that keeps them).
                self.run_batch(true).await?;
                Ok("the once trigger ran its micro-batch")
            }
            Trigger::ProcessingTime(interval) | Trigger::Continuous(interval) => loop {
                if self.stop_requested() {
                    return Ok(self.stop_reason());
                }
                let started = Instant::now();
                self.run_once().await?;
                let elapsed = started.elapsed();
                if elapsed < interval.to_std() {
                    let wait = interval.to_std() - elapsed;
                    let stop = self.opts.stop.clone();
                    let deadline = Instant::now() + wait;
                    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
                        tokio::time::sleep(
                            std::time::Duration::from_millis(20).min(deadline - Instant::now()),
                        )
                        .await;
                    }
                }
            },
        }
    }

    /// Why a run asked to stop stopped.
    fn stop_reason(&self) -> &'static str {
        if self.opts.stop.load(Ordering::SeqCst) {
            "stopped on request"
        } else {
            "stopped after the micro-batches it was allowed (max_batches)"
        }
    }

    /// Closes sinks (and the stateful operators); makes the last commit durable.
    pub async fn close(&mut self) -> Result<()> {
        self.state.finish_background().await?;
        if let Some(cp) = &self.checkpoint {
            cp.sync_log()?;
        }
        self.release_sources().await?;
        for s in self.sinks.iter_mut() {
            s.sink.close().await?;
        }
        self.program.close()
    }

    /// Tells the sources what they may release (see `pending_release`); the commit that
    /// made it releasable must be durable.
    async fn release_sources(&mut self) -> Result<()> {
        for (i, end) in std::mem::take(&mut self.pending_release) {
            self.sources[i].source.commit(&end).await?;
        }
        Ok(())
    }

    /// Whether a stateful operator has a timer due now (processing time from the clock,
    /// event time from the watermark in force).
    fn has_due_work(&self) -> bool {
        let watermark = self
            .watermark
            .is_active()
            .then(|| self.watermark.current_ms());
        let now = (self.opts.clock)();
        self.program.has_due_work(watermark, now)
    }

    /// Runs at most one micro-batch; returns whether one ran.
    pub async fn run_once(&mut self) -> Result<bool> {
        self.run_batch(false).await
    }

    /// Runs at most one micro-batch, reading up to the sources' read limits or, with
    /// `ignore_limits`, everything available; returns whether one ran.
    async fn run_batch(&mut self, ignore_limits: bool) -> Result<bool> {
        if let Some(batch) = self.failed_batch {
            return Err(Diagnostic::new(
                &codes::ENGINE_ERROR,
                format!("micro-batch {batch} failed; this query cannot run further batches"),
            )
            .help("Start the query again: it re-runs the uncommitted batch from the checkpoint.")
            .into());
        }
        if let Some(entry) = self.replay.take() {
            self.execute(entry, true).await?;
            return Ok(true);
        }
        // New data? Like Spark (`MicroBatchExecution.constructNextBatch`), new data comes
        // first: a batch owed for a watermark advance runs as this data batch, which
        // evicts with the advanced watermark, so a backlog runs data batches back to back
        // and a no-data batch runs only when the sources have nothing new.
        let started = Instant::now();
        let mut ranges = BTreeMap::new();
        let mut any = false;
        let unlimited = ReadLimit::unlimited();
        for s in self.sources.iter_mut() {
            let limit = if ignore_limits { &unlimited } else { &s.limit };
            let end = s.source.latest_offset(s.position.as_ref(), limit).await?;
            if end.is_some() && end != s.position {
                any = true;
            }
            ranges.insert(
                s.id.clone(),
                SourceRange {
                    start: s.position.clone().map(|o| o.0),
                    end: end.map(|o| o.0),
                },
            );
        }
        self.latest_offset_took = started.elapsed();
        if !any {
            // A watermark advance owes a no-data batch that emits and evicts what it
            // finalised; so do timers that are due without new input — a processing-time
            // timer the clock passed, an event-time timer at or behind the watermark.
            let owed = std::mem::take(&mut self.needs_no_data);
            if owed || (self.plan.profile.no_data_batches && self.has_due_work()) {
                let entry = self.entry("no_data", |s| {
                    (
                        s.position.clone().map(|o| o.0),
                        s.position.clone().map(|o| o.0),
                    )
                });
                self.execute(entry, false).await?;
                return Ok(true);
            }
            return Ok(false);
        }
        self.needs_no_data = false;
        let entry = OffsetEntry {
            batch_watermark_ms: self.watermark.current_ms(),
            late_watermark_ms: self.prev_watermark_ms,
            batch_timestamp_ms: (self.opts.clock)(),
            kind: "data".into(),
            sources: ranges,
            conf: self.conf(),
        };
        self.execute(entry, false).await?;
        Ok(true)
    }

    fn conf(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "watermarkPolicy".to_string(),
                format!("{:?}", self.plan.profile.watermark_policy).to_lowercase(),
            ),
            (
                "noDataMicroBatches".to_string(),
                self.plan.profile.no_data_batches.to_string(),
            ),
            ("planFingerprint".to_string(), self.plan.fingerprint.clone()),
        ])
    }

    fn entry(
        &self,
        kind: &str,
        range: impl Fn(&SourceRt) -> (Option<serde_json::Value>, Option<serde_json::Value>),
    ) -> OffsetEntry {
        OffsetEntry {
            batch_watermark_ms: self.watermark.current_ms(),
            late_watermark_ms: self.prev_watermark_ms,
            batch_timestamp_ms: (self.opts.clock)(),
            kind: kind.into(),
            sources: self
                .sources
                .iter()
                .map(|s| {
                    let (start, end) = range(s);
                    (s.id.clone(), SourceRange { start, end })
                })
                .collect(),
            conf: self.conf(),
        }
    }

    fn maybe_fail(&self, point: FailPoint, batch: u64) {
        if self.fail == Some((point, batch)) {
            eprintln!("ETLANTIC_FAIL_POINT reached: {point:?} of batch {batch}; aborting");
            std::process::abort();
        }
    }
}
