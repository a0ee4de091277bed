//! A batch run: the same driver, one bounded micro-batch, no checkpoint.
//!
//! Sources are read whole (their latest offsets, no read limit), the plan's regions run
//! on their backends ([`crate::regions::RegionsProgram`]), and sinks are written once as
//! micro-batch 0 of a query whose id is the plan's fingerprint. Quality gates,
//! quarantine (with secrets scrubbed), sink contracts and the progress record are those
//! of a streaming micro-batch; what a batch run leaves out is what needs a checkpoint:
//! logs, state, recovery, watermarks, and the release of source positions.

use super::{SourceRt, StreamingOptions, StreamingQuery};
use crate::checkpoint::{OffsetEntry, SourceRange};
use crate::connect::open_source;
use crate::engine::ProgramSource;
use crate::progress::QueryProgress;
use crate::quality::QualityGate;
use crate::quarantine::Quarantine;
use crate::regions::RegionsProgram;
use crate::secrets::Scrubber;
use crate::watermark::WatermarkTracker;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{self, ReadLimit};
use etlantic_core::streaming::{ExecutionMode, LatePolicy};
use etlantic_plan::plan::PipelinePlan;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// How a batch run runs.
#[derive(Clone)]
pub struct BatchOptions {
    /// Directory relative binding paths resolve against.
    pub root: PathBuf,
    /// Resolves `${...}` secret references in binding URIs.
    pub resolve: crate::SecretResolver,
    /// Called with the run's progress record.
    pub on_progress: Option<super::ProgressListener>,
    /// Options of the object stores the run reaches (the profile's `storage_options`,
    /// secrets resolved).
    pub storage_options: etlantic_core::storage::StorageOptions,
}

impl BatchOptions {
    /// Options with no secret resolution and no listener.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        BatchOptions {
            root: root.into(),
            resolve: Arc::new(|s| Ok(s.to_string())),
            on_progress: None,
            storage_options: Default::default(),
        }
    }
}

impl StreamingQuery {
    /// Prepares a batch run of `plan`: opens its sources (all but those a region reads
    /// in place) and sinks for a bounded read and write. Nothing is read yet; run it with
    /// [`StreamingQuery::run_bounded`].
    pub async fn start_batch(plan: &PipelinePlan, opts: BatchOptions) -> Result<Self> {
        if plan.profile.mode != ExecutionMode::Batch {
            return Err(Error::new(
                &codes::PLAN_INVALID,
                "this plan is a streaming plan; run it with the streaming runtime",
            ));
        }
        plugin::check_registry()?;
        let resolve = opts.resolve.as_ref();
        let in_place = RegionsProgram::in_place_sources(plan);
        let mut sources = Vec::new();
        for s in plan.sources.iter().filter(|s| !in_place.contains(&&*s.id)) {
            let source = open_source(
                plan,
                &s.asset,
                resolve,
                &opts.root,
                ExecutionMode::Batch,
                None,
                &opts.storage_options,
            )?;
            let schema = source.schema();
            let gate = QualityGate::for_asset(
                plan,
                &s.asset,
                schema.clone(),
                source.checks_record_rules(),
            )?;
            sources.push(SourceRt {
                id: s.id.clone(),
                asset: s.asset.clone(),
                source,
                limit: ReadLimit::unlimited(),
                position: None,
                info: ProgramSource {
                    id: s.id.clone(),
                    schema,
                    event_time: None,
                    delay_us: None,
                    late: LatePolicy::Accept,
                    is_static: false,
                },
                gate,
                measured: None,
            });
        }
        let sinks = super::open::open_sinks(
            plan,
            resolve,
            &opts.root,
            ExecutionMode::Batch,
            &opts.storage_options,
        )?;
        let quarantine_location = crate::quarantine::quarantine_location(
            &resolve(&plan.profile.quarantine)?,
            &opts.root,
        )?;
        let scrub = Scrubber::for_plan(plan, resolve);
        let run_id = uuid::Uuid::new_v4().to_string();
        let quarantine = Quarantine::new(
            quarantine_location,
            opts.storage_options.clone(),
            scrub.clone(),
            &run_id,
            None,
            plan.profile.on_error,
        );
        let program = Box::new(RegionsProgram::new(
            plan,
            opts.root.clone(),
            opts.resolve.clone(),
        ));
        let mut streaming = StreamingOptions::new(opts.root, PathBuf::new());
        streaming.resolve = opts.resolve;
        streaming.on_progress = opts.on_progress;
        Ok(StreamingQuery {
            plan: plan.clone(),
            checkpoint: None,
            // No checkpoint to keep one in: the profile's, else one for the run.
            application_id: plan
                .profile
                .application_id
                .clone()
                .unwrap_or_else(|| run_id.clone()),
            // Sinks know a batch run's rows as micro-batch 0 of the plan: a sink that
            // keys idempotence on (query id, batch id) sees the same plan's runs as one.
            query_id: plan.fingerprint.clone(),
            run_id,
            sources,
            statics: Vec::new(),
            sinks,
            side_sinks: HashMap::new(),
            program,
            watermark: WatermarkTracker::new(BTreeMap::new(), plan.profile.watermark_policy),
            prev_watermark_ms: 0,
            next_batch: 0,
            replay: None,
            needs_no_data: false,
            latest_offset_took: std::time::Duration::ZERO,
            quarantine,
            scrub,
            // Fault injection is for the checkpointed protocol.
            fail: None,
            last_progress: None,
            requests_at_last_progress: Default::default(),
            batches_run: 0,
            failed_batch: None,
            state: super::persist::StateWrites::new((streaming.clock)()),
            rebuild: None,
            rebuilding: false,
            pending_release: Vec::new(),
            opts: streaming,
        })
    }

    /// Runs a batch run's one micro-batch — every source read whole, even when none has
    /// rows (sinks are written all the same: an overwrite of nothing is still an
    /// overwrite) — and closes the sinks. Returns its progress record.
    pub async fn run_bounded(&mut self) -> Result<QueryProgress> {
        if self.checkpoint.is_some() || self.batches_run > 0 {
            return Err(Error::new(
                &codes::ENGINE_ERROR,
                "run_bounded runs a batch run's one micro-batch, once",
            ));
        }
        let started = std::time::Instant::now();
        let mut ranges = BTreeMap::new();
        for s in self.sources.iter_mut() {
            let end = s.source.latest_offset(None, &s.limit).await?;
            ranges.insert(
                s.id.clone(),
                SourceRange {
                    start: None,
                    end: end.map(|o| o.0),
                },
            );
        }
        self.latest_offset_took = started.elapsed();
        let entry = OffsetEntry {
            batch_watermark_ms: 0,
            late_watermark_ms: 0,
            batch_timestamp_ms: (self.opts.clock)(),
            kind: "data".into(),
            sources: ranges,
            conf: BTreeMap::from([("planFingerprint".to_string(), self.plan.fingerprint.clone())]),
        };
        self.execute(entry, false).await?;
        self.close().await?;
        self.last_progress.clone().ok_or_else(|| {
            Error::new(
                &codes::ENGINE_ERROR,
                "the batch run's micro-batch left no progress record",
            )
        })
    }
}
