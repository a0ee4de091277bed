//! Streaming queries run whole by another system.
//!
//! A backend whose streaming regions are whole queries (it declares
//! `streaming.whole_query`; Spark through Spark Connect) reads the sources and writes the
//! sinks itself: the runtime's driver does not run it micro-batch by micro-batch, but
//! hands it the plan and relays what it reports. Its progress records, in ETLantic's
//! shape, go to `<checkpoint>/progress.jsonl` like the driver's and to the run's listener.

use crate::driver::ProgressListener;
use crate::progress::{ProgressLog, QueryProgress};
use crate::secrets::SecretResolver;
use crate::status::{QueryIds, StatusWriter};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{self, RegionKind};
use etlantic_plan::plan::{PipelinePlan, Region};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How a whole query runs.
#[derive(Clone)]
pub struct WholeQueryOptions {
    /// The project root: relative locations resolve against it.
    pub root: PathBuf,
    /// The query's checkpoint location.
    pub checkpoint: PathBuf,
    /// Resolves `${...}` secret references (the region's endpoint, bindings).
    pub resolve: SecretResolver,
    /// Stop the query when set.
    pub stop: Arc<AtomicBool>,
    /// Stop after this many micro-batches, if set.
    pub max_batches: Option<u64>,
}

/// A backend that runs a whole streaming query in another system.
///
/// # Invariants an implementer must keep
/// - `run` blocks until the query ends by its trigger, `opts.stop` is set, or
///   `opts.max_batches` micro-batches ran; it stops the query in the other system
///   before returning.
/// - Every micro-batch's progress reaches `on_progress` once, in batch order, with each
///   source's `source_id` set to the pipeline's source id.
/// - A failed query is an error with a code (`ETL705` for bad records, `ETL707` else).
pub trait WholeQueryBackend: Send + Sync {
    /// The backend name regions name it by (`spark`).
    fn name(&self) -> &'static str;

    /// Runs `plan`'s streaming query, whose transformations are all in `region`;
    /// returns the other system's run id.
    fn run(
        &self,
        plan: &PipelinePlan,
        region: &Region,
        opts: &WholeQueryOptions,
        on_progress: &dyn Fn(QueryProgress),
    ) -> Result<String>;
}

/// Links a [`WholeQueryBackend`] into the runtime.
pub struct WholeQueryRegistration(pub &'static dyn WholeQueryBackend);

inventory::collect!(WholeQueryRegistration);

/// The linked whole-query backend named `name`.
pub fn backend(name: &str) -> Option<&'static dyn WholeQueryBackend> {
    inventory::iter::<WholeQueryRegistration>
        .into_iter()
        .map(|r| r.0)
        .find(|b| b.name() == name)
}

/// The region of a streaming plan that a linked backend runs as a whole query, if any
/// (the planner makes sure such a region holds every transformation, `ETL507`).
pub fn region_of(plan: &PipelinePlan) -> Option<&Region> {
    plan.regions.iter().find(|r| {
        r.kind == RegionKind::Streaming
            && plugin::backend(&r.backend).is_some_and(|b| b.capabilities().streaming.whole_query)
    })
}

/// Runs `plan` on the backend of `region` (on a blocking thread: such clients block),
/// appending its progress records to the checkpoint's progress log and handing them to
/// `listener`. Returns the other system's run id.
pub async fn run(
    plan: &PipelinePlan,
    region: &Region,
    opts: WholeQueryOptions,
    listener: Option<ProgressListener>,
) -> Result<String> {
    let runner = backend(&region.backend).ok_or_else(|| {
        Error::new(
            &codes::NO_BACKEND,
            format!(
                "backend `{}` runs whole streaming queries, but its runner is not linked",
                region.backend
            ),
        )
    })?;
    etlantic_core::storage::create_dirs(&opts.checkpoint)?;
    let storage = etlantic_core::storage::open_location(
        &etlantic_core::storage::Location::Local(opts.checkpoint.clone()),
        &Default::default(),
    )?;
    let backend_name = region.backend.clone();
    let (plan, region) = (plan.clone(), region.clone());
    tokio::task::spawn_blocking(move || {
        let log = Mutex::new(ProgressLog::new(&opts.checkpoint));
        let log_failed = AtomicBool::new(false);
        let application_id = plan.profile.application_id.clone().unwrap_or_default();
        // `status.json`, as a query the runtime drives writes it: the backend names the
        // query and the run in its first progress record.
        let status: Mutex<Option<StatusWriter>> = Mutex::new(None);
        let on_progress = |mut p: QueryProgress| {
            if p.application_id.is_empty() {
                p.application_id = application_id.clone();
            }
            if let Ok(mut s) = status.lock() {
                if s.is_none() {
                    *s = Some(StatusWriter::start(
                        storage.clone(),
                        ids_of(&p),
                        &plan.pipeline,
                        None,
                    ));
                }
            }
            let appended = log
                .lock()
                .map(|mut l| l.append(&p).is_ok())
                .unwrap_or(false);
            if !appended {
                log_failed.store(true, Ordering::Relaxed);
            }
            if let Some(l) = &listener {
                l(&p);
            }
        };
        let result = runner
            .run(&plan, &region, &opts, &on_progress)
            .and_then(|run_id| {
                if log_failed.load(Ordering::Relaxed) {
                    return Err(Error::new(
                        &codes::IO_ERROR,
                        format!(
                            "cannot append to {}",
                            ProgressLog::current_path(&opts.checkpoint).display()
                        ),
                    ));
                }
                Ok(run_id)
            });
        let writer = status.lock().ok().and_then(|mut s| s.take());
        let writer = writer.unwrap_or_else(|| {
            // It ended before its first record: known by the profile's ids alone.
            let ids = QueryIds {
                application_id: application_id.clone(),
                query_id: String::new(),
                run_id: result.as_deref().unwrap_or_default().to_string(),
            };
            StatusWriter::start(storage.clone(), ids, &plan.pipeline, None)
        });
        let reason = match (opts.stop.load(Ordering::SeqCst), opts.max_batches) {
            (true, _) => "stopped on request".to_string(),
            (false, Some(n)) => {
                format!(
                    "ran at most {n} micro-batches as asked, on {}",
                    region.backend
                )
            }
            (false, None) => format!("the {} query finished", region.backend),
        };
        // The record is for people: failing to write it does not change the outcome.
        let _ = writer.end(result.as_ref().map(|_| reason.as_str()));
        result
    })
    .await
    .map_err(|e| {
        Error::new(
            &codes::ENGINE_ERROR,
            format!("the thread running the {backend_name} query failed: {e}"),
        )
    })?
}

/// The ids a backend's progress record names.
fn ids_of(p: &QueryProgress) -> QueryIds {
    QueryIds {
        application_id: p.application_id.clone(),
        query_id: p.id.clone(),
        run_id: p.run_id.clone(),
    }
}
