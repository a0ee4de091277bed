//! Running a PipelinePlan: a batch plan as one bounded micro-batch of the runtime's
//! driver, a streaming plan with its trigger, and the run report of either.
//!
//! The runner executes exactly the plan it is given — the run report carries the plan's
//! fingerprint — and reconstructs everything it needs (contracts, DTCS plans) from the
//! plan itself, so a saved plan runs without the original files.

use crate::openlineage::LineageRun;
use crate::progress_view::ProgressView;
use chrono::{SecondsFormat, Utc};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::profile::{resolve_secrets, Profile};
use etlantic_core::storage::{Location, StorageOptions};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::regions::RegionsProgram;
use etlantic_runtime::report::RunTotals;
pub use etlantic_runtime::report::{QualityReport, RunReport, SinkReport, SourceReport};
use etlantic_runtime::secrets::Scrubber;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Everything a run needs besides the plan.
#[derive(Clone, Debug)]
pub struct RunContext {
    /// Directory relative binding paths resolve against.
    pub root: PathBuf,
    /// The profile's secrets table, to resolve `${secret:...}` references (values come
    /// from the environment at run time and are never written anywhere).
    pub secrets_profile: Profile,
}

impl RunContext {
    /// A context for the plan: secrets from the plan's profile references.
    pub fn for_plan(plan: &PipelinePlan, root: impl Into<PathBuf>) -> Self {
        let mut p = Profile::new(plan.profile.name.clone());
        p.secrets = plan.profile.secrets.clone();
        RunContext {
            root: root.into(),
            secrets_profile: p,
        }
    }

    fn resolve_uri(&self, text: &str) -> Result<BindingUri> {
        BindingUri::parse(&resolve_secrets(text, &self.secrets_profile)?)
    }

    /// Resolves the secret references of a text with the profile's secrets table.
    fn secrets(&self) -> impl Fn(&str) -> Result<String> + '_ {
        |s| resolve_secrets(s, &self.secrets_profile)
    }

    /// Hides the values of the secrets `plan` references.
    fn scrubber(&self, plan: &PipelinePlan) -> Scrubber {
        Scrubber::for_plan(plan, &self.secrets())
    }
}

/// The quarantine file, and how reports name it: the location as the plan writes it,
/// with secret references unresolved.
fn quarantine_path(plan: &PipelinePlan, ctx: &RunContext) -> Result<(PathBuf, String)> {
    let uri = ctx.resolve_uri(&plan.profile.quarantine)?;
    let abs = etlantic_core::uri::located(&ctx.root, &uri.location);
    let display = BindingUri::parse(&plan.profile.quarantine)
        .map(|u| u.location)
        .unwrap_or_else(|_| uri.location.clone());
    Ok((abs, display))
}

/// A new run id.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Runs a batch plan: one bounded micro-batch of the runtime's driver, with no
/// checkpoint (see [`etlantic_runtime::StreamingQuery::start_batch`]).
pub async fn run_batch(plan: &PipelinePlan, ctx: &RunContext) -> RunReport {
    run_batch_with(plan, ctx, None).await
}

/// [`run_batch`], showing the progress of its reads in `progress`.
pub async fn run_batch_with(
    plan: &PipelinePlan,
    ctx: &RunContext,
    progress: Option<Arc<ProgressView>>,
) -> RunReport {
    let started = Instant::now();
    let started_at = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
    let mut report = RunReport::new(plan, &new_run_id(), &started_at);
    let totals = Arc::new(Mutex::new(RunTotals::default()));
    let in_place = RegionsProgram::in_place_sources(plan);
    let sources: Vec<&str> = plan
        .sources
        .iter()
        .map(|s| s.id.as_str())
        .filter(|id| !in_place.contains(id))
        .collect();
    let lineage = lineage_of(plan, ctx);
    let result: Result<()> = async {
        let lineage = lineage.as_ref().map_err(Clone::clone)?;
        let mut opts = etlantic_runtime::BatchOptions::new(ctx.root.clone());
        opts.storage_options = storage_options(plan, ctx)?;
        opts.resolve = resolver(ctx);
        let view = progress.clone();
        opts.on_progress = Some(listener(
            &totals,
            lineage.clone(),
            Counts::new(&report, plan, &sources),
            move |p| {
                if let Some(v) = &view {
                    v.batch_done(p);
                }
            },
        ));
        let mut q = etlantic_runtime::StreamingQuery::start_batch(plan, opts).await?;
        report.identify(&q.ids());
        if let Some(v) = &progress {
            v.watch(q.read_progress().into_iter().map(|(_, r)| r).collect());
        }
        if let Some(l) = lineage {
            l.started(&q.ids());
        }
        q.run_bounded().await.map(|_| ())
    }
    .await;
    if let Some(v) = &progress {
        v.finish();
    }
    finish_report(plan, ctx, &mut report, &totals, &sources, result);
    report.duration_ms = started.elapsed().as_millis() as u64;
    if let Ok(Some(l)) = &lineage {
        l.finish(&report, false).await;
    }
    report
}

/// The run's OpenLineage events, when the profile's `lineage` asks for them.
fn lineage_of(plan: &PipelinePlan, ctx: &RunContext) -> Result<Option<Arc<LineageRun>>> {
    let Some(config) = &plan.profile.lineage else {
        return Ok(None);
    };
    LineageRun::new(plan, config, &ctx.root, &ctx.secrets())
        .map(Arc::new)
        .map(Some)
}

/// A run's counts so far, as a report: what `RUNNING` lineage events carry.
struct Counts {
    blank: RunReport,
    sources: Vec<String>,
    sinks: Vec<String>,
}

impl Counts {
    fn new(blank: &RunReport, plan: &PipelinePlan, sources: &[&str]) -> Self {
        Counts {
            blank: blank.clone(),
            sources: sources.iter().map(|s| s.to_string()).collect(),
            sinks: plan.sinks.iter().map(|s| s.id.clone()).collect(),
        }
    }

    fn report(&self, totals: &RunTotals) -> RunReport {
        let mut r = self.blank.clone();
        let sources: Vec<&str> = self.sources.iter().map(String::as_str).collect();
        let sinks: Vec<&str> = self.sinks.iter().map(String::as_str).collect();
        totals.fill(&sources, &sinks, &mut r);
        r
    }
}

/// The progress listener of a run: adds each record to the run's totals, tells the
/// lineage events, then calls `also`.
fn listener(
    totals: &Arc<Mutex<RunTotals>>,
    lineage: Option<Arc<LineageRun>>,
    counts: Counts,
    also: impl Fn(&QueryProgress) + Send + Sync + 'static,
) -> etlantic_runtime::ProgressListener {
    let totals = totals.clone();
    Arc::new(move |p: &QueryProgress| {
        if let Ok(mut t) = totals.lock() {
            t.add(p);
            if let Some(l) = &lineage {
                l.progressed(p, || counts.report(&t));
            }
        }
        also(p);
    })
}

/// Completes a run's report: its counts from the progress records, the quarantine as
/// the plan names it, and the errors (secrets scrubbed) when it failed.
fn finish_report(
    plan: &PipelinePlan,
    ctx: &RunContext,
    report: &mut RunReport,
    totals: &Mutex<RunTotals>,
    sources: &[&str],
    result: Result<()>,
) {
    let sinks: Vec<&str> = plan.sinks.iter().map(|s| s.id.as_str()).collect();
    if let Ok(t) = totals.lock() {
        t.fill(sources, &sinks, report);
    }
    if let Ok((_, q)) = quarantine_path(plan, ctx) {
        report.quarantine = q;
    }
    if let Err(e) = result {
        let scrub = ctx.scrubber(plan);
        report.fail(e.0 .0.into_iter().map(|d| scrub.diagnostic(d)).collect());
    }
}

/// Options of a streaming run; the default runs until the trigger finishes (or forever).
#[derive(Default)]
pub struct StreamingRun {
    /// Called with every progress record (e.g. to print it live).
    pub on_progress: Option<etlantic_runtime::ProgressListener>,
    /// Set to stop a processing-time query after the current micro-batch.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Stop a processing-time query after this many micro-batches.
    pub max_batches: Option<u64>,
    /// Serve Prometheus metrics at `http://<addr>/metrics` while the query runs.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Shows the progress of the run's reads (the caller reports each micro-batch to
    /// it, and prints through it); the run starts watching the sources and finishes it.
    pub progress: Option<Arc<ProgressView>>,
}

/// Runs a streaming plan with its trigger until it finishes or is stopped. The checkpoint
/// location comes from the profile (default `.etlantic/checkpoints/<pipeline>`).
pub async fn run_streaming(plan: &PipelinePlan, ctx: &RunContext, run: StreamingRun) -> RunReport {
    let started = Instant::now();
    let started_at = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
    let mut report = RunReport::new(plan, "", &started_at);
    let totals = Arc::new(Mutex::new(RunTotals::default()));
    let sources: Vec<&str> = plan.sources.iter().map(|s| s.id.as_str()).collect();
    let lineage = lineage_of(plan, ctx);
    let stop = run.stop.clone();
    let result: Result<()> = async {
        let lineage = lineage.as_ref().map_err(Clone::clone)?;
        let checkpoint = checkpoint_location(plan, ctx)?;
        let storage_options = storage_options(plan, ctx)?;
        let user = run.on_progress.clone();
        let metrics: crate::metrics::SharedMetrics = Arc::default();
        let served = match run.metrics_addr {
            Some(addr) => Some(crate::metrics::serve(addr, metrics.clone()).await.map_err(|e| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("cannot serve metrics at {addr}: {e}"),
                )
                .with_help("Choose a free address with `--metrics-addr` (port 0 picks one).")
            })?),
            None => None,
        };
        // Stops serving when the run ends, however it ends.
        let _serving = served.as_ref().map(|(_, task)| AbortOnDrop(task.abort_handle()));
        let m = served.is_some().then(|| metrics.clone());
        let also = move |p: &QueryProgress| {
            if let Some(Ok(mut m)) = m.as_ref().map(|m| m.lock()) {
                // A query run whole by another system is known by its first record.
                let m = m.get_or_insert_with(|| {
                    let ids = etlantic_runtime::status::QueryIds {
                        application_id: p.application_id.clone(),
                        query_id: p.id.clone(),
                        run_id: p.run_id.clone(),
                    };
                    crate::metrics::QueryMetrics::new(&ids, p.name.as_deref().unwrap_or_default())
                });
                m.observe(p);
            }
            if let Some(u) = &user {
                u(p);
            }
        };
        let listener = listener(
            &totals,
            lineage.clone(),
            Counts::new(&report, plan, &sources),
            also,
        );
        if let Some(region) = etlantic_runtime::whole_query::region_of(plan) {
            let checkpoint = match checkpoint {
                Location::Local(dir) => dir,
                remote => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                            "the checkpoint of a query run whole by `{}` must be a local directory (file://), not {remote}",
                            region.backend
                        ),
                    ))
                }
            };
            let opts = etlantic_runtime::whole_query::WholeQueryOptions {
                root: ctx.root.clone(),
                checkpoint,
                resolve: resolver(ctx),
                stop: run.stop.clone(),
                max_batches: run.max_batches,
            };
            return etlantic_runtime::whole_query::run(plan, region, opts, Some(listener))
                .await
                .map(|run_id| report.run_id = run_id);
        }
        let mut opts = etlantic_runtime::StreamingOptions::new(ctx.root.clone(), checkpoint);
        opts.storage_options = storage_options;
        opts.resolve = resolver(ctx);
        opts.on_progress = Some(listener);
        opts.stop = run.stop.clone();
        opts.max_batches = run.max_batches;
        opts.metrics_addr = served.as_ref().map(|(addr, _)| addr.to_string());
        let mut q = etlantic_runtime::StreamingQuery::start(plan, opts).await?;
        report.identify(&q.ids());
        if let Some(l) = lineage {
            l.started(&q.ids());
        }
        if let Some(v) = &run.progress {
            v.watch(q.read_progress().into_iter().map(|(_, r)| r).collect());
        }
        if let Some((addr, _)) = &served {
            if let Ok(mut m) = metrics.lock() {
                *m = Some(crate::metrics::QueryMetrics::new(&q.ids(), &plan.pipeline));
            }
            eprintln!("serving metrics at http://{addr}/metrics");
        }
        let span = tracing::info_span!(
            "query",
            application_id = q.application_id(),
            query_id = q.id(),
            run_id = q.run_id()
        );
        tracing::Instrument::instrument(q.run(), span).await
    }
    .await;
    if let Some(v) = &run.progress {
        v.finish();
    }
    finish_report(plan, ctx, &mut report, &totals, &sources, result);
    report.duration_ms = started.elapsed().as_millis() as u64;
    if let Ok(Some(l)) = &lineage {
        let on_request = stop.load(std::sync::atomic::Ordering::SeqCst);
        l.finish(&report, on_request).await;
    }
    report
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves the secret references of `ctx`'s profile.
fn resolver(ctx: &RunContext) -> etlantic_runtime::SecretResolver {
    let ctx = ctx.clone();
    std::sync::Arc::new(move |s| resolve_secrets(s, &ctx.secrets_profile))
}

/// The checkpoint location of a streaming plan: a local directory or an object-store
/// prefix (default `.etlantic/checkpoints/<pipeline>`).
pub fn checkpoint_location(plan: &PipelinePlan, ctx: &RunContext) -> Result<Location> {
    let text = plan
        .profile
        .checkpoint
        .clone()
        .unwrap_or_else(|| format!("file://.etlantic/checkpoints/{}", plan.pipeline));
    Location::parse(&resolve_secrets(&text, &ctx.secrets_profile)?, &ctx.root)
}

/// The plan's object-store options (`storage_options`), their secret references
/// resolved.
pub fn storage_options(plan: &PipelinePlan, ctx: &RunContext) -> Result<StorageOptions> {
    plan.profile
        .storage_options
        .iter()
        .map(|(k, v)| Ok((k.clone(), resolve_secrets(v, &ctx.secrets_profile)?)))
        .collect::<Result<std::collections::BTreeMap<_, _>>>()
        .map(StorageOptions::new)
}
