//! Running a PipelinePlan in batch mode: read every source, run the regions in order on
//! their backends, write every sink, quarantine every bad record, report.
//!
//! The runner executes exactly the plan it is given — the run report carries the plan's
//! fingerprint — and reconstructs everything it needs (contracts, DTCS plans) from the
//! plan itself, so a saved plan runs without the original files.

use chrono::{SecondsFormat, Utc};
use etlantic_core::data::{RowOrigins, Table};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::plugin::{self, ReadLimit, RegionLocation, SinkBatch, WriteOutcome};
use etlantic_core::profile::{resolve_secrets, Profile};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use etlantic_runtime::connect::{open_sink, open_source};
use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::quality::{QualityGate, RuleCount};
use etlantic_runtime::quarantine::Quarantine;
use etlantic_runtime::secrets::Scrubber;
use indexmap::IndexMap;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// Counts for one source.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SourceReport {
    /// Source id.
    pub id: String,
    /// Records that passed the contract.
    pub rows: u64,
    /// Records quarantined.
    pub rejected: u64,
    /// Records that were gone before they were read and that the binding let the run go
    /// on without (e.g. Kafka's `failOnDataLoss=false`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_loss: Vec<etlantic_core::data::DataLoss>,
}

/// Counts for one sink.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SinkReport {
    /// Sink id.
    pub id: String,
    /// Rows written.
    pub rows: u64,
    /// The backend did not report the rows it wrote (Spark's file sink reports -1):
    /// `rows` is then not a count.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rows_unknown: bool,
}

/// One contract quality rule's outcome over a run (summed over the micro-batches of a
/// streaming run).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QualityReport {
    /// The asset whose contract has the rule.
    pub asset: String,
    /// The rule id.
    pub id: String,
    /// The policy in force.
    pub policy: etlantic_core::contract::rules::Policy,
    /// Offending rows (for `rowCount` and `sql`: the evaluations that failed).
    pub violations: u64,
    /// Evaluations (the batch, or micro-batches) in which the rule broke its threshold.
    pub failed: u64,
    /// Rows the policy took out (dropped or quarantined).
    pub removed: u64,
}

impl QualityReport {
    /// Adds one evaluation's outcome to the rule's entry in `into`.
    fn add(into: &mut Vec<QualityReport>, asset: &str, c: &RuleCount) {
        let entry = match into.iter().position(|q| q.asset == asset && q.id == c.id) {
            Some(i) => &mut into[i],
            None => {
                into.push(QualityReport {
                    asset: asset.to_string(),
                    id: c.id.clone(),
                    policy: c.policy,
                    violations: 0,
                    failed: 0,
                    removed: 0,
                });
                into.last_mut().expect("pushed")
            }
        };
        entry.violations += c.violations;
        entry.failed += u64::from(c.failed);
        entry.removed += c.removed;
    }
}

/// What a run did.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Unique id of this run.
    pub run_id: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Fingerprint of the plan that ran.
    pub fingerprint: String,
    /// Batch or streaming.
    pub mode: ExecutionMode,
    /// `succeeded` or `failed`.
    pub status: String,
    /// Start time (UTC, ISO-8601).
    pub started_at: String,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Per-source counts.
    pub sources: Vec<SourceReport>,
    /// Per-sink counts.
    pub sinks: Vec<SinkReport>,
    /// Where rejected records went, as the plan names it (relative to the project root;
    /// secret references stay unresolved).
    pub quarantine: String,
    /// Records quarantined in total.
    pub quarantined: u64,
    /// The outcomes of the contracts' quality rules (see `docs/streaming.md`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<QualityReport>,
    /// Errors, when the run failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Diagnostic>,
}

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

/// Runs a batch plan.
pub async fn run_batch(plan: &PipelinePlan, ctx: &RunContext) -> RunReport {
    let started = Instant::now();
    let started_at = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
    let run_id = new_run_id();
    let mut report = RunReport {
        run_id: run_id.clone(),
        pipeline: plan.pipeline.clone(),
        fingerprint: plan.fingerprint.clone(),
        mode: plan.profile.mode,
        status: "succeeded".into(),
        started_at,
        duration_ms: 0,
        sources: vec![],
        sinks: vec![],
        quarantine: String::new(),
        quarantined: 0,
        quality: vec![],
        errors: vec![],
    };
    let scrub = ctx.scrubber(plan);
    if let Err(e) = run_batch_inner(plan, ctx, &run_id, &mut report, &scrub).await {
        report.status = "failed".into();
        report.errors = e.0 .0.into_iter().map(|d| scrub.diagnostic(d)).collect();
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    report
}

async fn run_batch_inner(
    plan: &PipelinePlan,
    ctx: &RunContext,
    run_id: &str,
    report: &mut RunReport,
    scrub: &Scrubber,
) -> Result<()> {
    if plan.profile.mode != ExecutionMode::Batch {
        return Err(Error::new(
            &codes::PLAN_INVALID,
            "this plan is a streaming plan; run it with the streaming runtime",
        ));
    }
    plugin::check_registry()?;
    let (qpath, qdisplay) = quarantine_path(plan, ctx)?;
    report.quarantine = qdisplay;
    let mut quarantine = Quarantine::new(qpath, scrub.clone(), run_id, None, plan.profile.on_error);
    let mut relations: HashMap<String, Table> = HashMap::new();

    // 1. Sources (except tables an SQL region reads where they lie).
    let in_place: HashMap<&str, &str> = plan
        .regions
        .iter()
        .flat_map(|r| r.in_place.iter())
        .map(|(s, t)| (s.as_str(), t.as_str()))
        .collect();
    for s in &plan.sources {
        if in_place.contains_key(s.id.as_str()) {
            continue;
        }
        let mut source = open_source(
            plan,
            &s.asset,
            &ctx.secrets(),
            &ctx.root,
            ExecutionMode::Batch,
            None,
        )?;
        let limit = ReadLimit::unlimited();
        let batch = match source.latest_offset(None, &limit).await? {
            Some(end) => source.read(None, &end).await?,
            None => Default::default(),
        };
        let mut rejected = batch.rejected.len() as u64;
        report.quarantined += quarantine.write(&batch.rejected, None, &mut HashMap::new(), true)?;
        let origins = batch.origins;
        let data_loss = batch.lost;
        let mut table = Table::new(source.schema(), batch.batches);
        // The contract's quality rules the decoder did not check, on the whole input.
        let gate = QualityGate::for_asset(
            plan,
            &s.asset,
            source.schema(),
            source.checks_record_rules(),
        )?;
        if let Some(gate) = gate {
            let taken = apply_gate(&gate, table, &origins, report, &mut quarantine).await?;
            table = taken.0;
            rejected += taken.1;
        }
        report.sources.push(SourceReport {
            id: s.id.clone(),
            rows: table.num_rows() as u64,
            rejected,
            data_loss,
        });
        relations.insert(s.id.clone(), table);
    }

    // 2. Regions, in order.
    for region in &plan.regions {
        let backend = plugin::backend(&region.backend).ok_or_else(|| {
            Error::new(
                &codes::NO_BACKEND,
                format!("backend `{}` is not linked", region.backend),
            )
        })?;
        let steps = region
            .steps
            .iter()
            .map(|id| plan.step_task(id))
            .collect::<Result<Vec<_>>>()?;
        let mut inputs = IndexMap::new();
        for name in region
            .inputs
            .iter()
            .filter(|n| !region.in_place.contains_key(*n))
        {
            let t = relations.get(name).cloned().ok_or_else(|| {
                Error::new(
                    &codes::PLAN_INVALID,
                    format!(
                        "region {} reads `{name}`, which nothing produced",
                        region.id
                    ),
                )
            })?;
            inputs.insert(name.clone(), t);
        }
        let outputs = match &region.location {
            Some(place) => {
                let mut tables = IndexMap::new();
                for (source, table) in &region.in_place {
                    let asset = &plan
                        .sources
                        .iter()
                        .find(|s| &s.id == source)
                        .ok_or_else(|| {
                            Error::new(&codes::PLAN_INVALID, format!("no source `{source}`"))
                        })?
                        .asset;
                    let schema = plan.asset_contract(asset)?.arrow_schema();
                    tables.insert(source.clone(), (table.clone(), schema));
                }
                let located = backend.at_location(&RegionLocation {
                    uri: ctx.resolve_uri(place)?,
                    root: ctx.root.clone(),
                    tables,
                })?;
                located
                    .execute_batch(&steps, inputs, &region.outputs)
                    .await?
            }
            None => {
                backend
                    .execute_batch(&steps, inputs, &region.outputs)
                    .await?
            }
        };
        relations.extend(outputs);
    }

    // 3. Sinks.
    for s in &plan.sinks {
        let contract = plan.asset_contract(&s.asset)?;
        let table = relations.get(&s.input).cloned().ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!(
                    "sink `{}` reads `{}`, which nothing produced",
                    s.id, s.input
                ),
            )
        })?;
        let mut table = table.conform_to(&contract.arrow_schema())?;
        // The sink contract's quality rules, before anything is published.
        if let Some(gate) = QualityGate::for_asset(plan, &s.asset, table.schema.clone(), false)? {
            table = apply_gate(
                &gate,
                table,
                &RowOrigins::default(),
                report,
                &mut quarantine,
            )
            .await?
            .0;
        }
        let mut sink = open_sink(
            plan,
            &s.asset,
            &ctx.secrets(),
            &ctx.root,
            ExecutionMode::Batch,
            s.output_mode,
        )?;
        let rows = match sink
            .write(SinkBatch {
                query_id: &plan.fingerprint,
                batch_id: 0,
                output_mode: s.output_mode,
                data: &table,
            })
            .await?
        {
            WriteOutcome::Written { rows } => rows,
            // A batch run has no checkpoint, so nothing of it can have been committed
            // before: a sink that skips the write would let the run report rows it never
            // wrote as done.
            WriteOutcome::AlreadyCommitted => {
                return Err(Error::new(
                    &codes::SINK_WRITE_FAILED,
                    format!(
                        "sink `{}` skipped the rows of this batch run as already committed; a batch run must write them",
                        s.id
                    ),
                )
                .with_help("the sink plugin treats a batch run like a replayed micro-batch: report this to its author"))
            }
        };
        sink.close().await?;
        report.sinks.push(SinkReport {
            id: s.id.clone(),
            rows,
            rows_unknown: false,
        });
    }
    Ok(())
}

/// Runs a quality gate on a whole input of a batch run (row positions from `origins`):
/// counts its rules in the report and quarantines what its quarantine policies took out
/// (a `fail` policy's error stops the run). Returns the rows that go on and how many were
/// quarantined.
async fn apply_gate(
    gate: &QualityGate,
    table: Table,
    origins: &RowOrigins,
    report: &mut RunReport,
    quarantine: &mut Quarantine,
) -> Result<(Table, u64)> {
    let out = gate.apply_at(table, origins).await?;
    for c in &out.counts {
        QualityReport::add(&mut report.quality, gate.asset(), c);
    }
    let n = quarantine.write(&out.quarantined, None, &mut HashMap::new(), false)?;
    report.quarantined += n;
    Ok((out.table, n))
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
}

/// Runs a streaming plan with its trigger until it finishes or is stopped. The checkpoint
/// location comes from the profile (default `.etlantic/checkpoints/<pipeline>`).
pub async fn run_streaming(plan: &PipelinePlan, ctx: &RunContext, run: StreamingRun) -> RunReport {
    let started = Instant::now();
    let started_at = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
    let mut report = RunReport {
        run_id: String::new(),
        pipeline: plan.pipeline.clone(),
        fingerprint: plan.fingerprint.clone(),
        mode: plan.profile.mode,
        status: "succeeded".into(),
        started_at,
        duration_ms: 0,
        sources: vec![],
        sinks: vec![],
        quarantine: String::new(),
        quarantined: 0,
        quality: vec![],
        errors: vec![],
    };
    let totals = std::sync::Arc::new(std::sync::Mutex::new((
        HashMap::<String, u64>::new(),
        0u64,
        0u64,
        HashMap::<String, Vec<etlantic_core::data::DataLoss>>::new(),
    )));
    let quality_totals = std::sync::Arc::new(std::sync::Mutex::new(Vec::<QualityReport>::new()));
    let sink_rows_unknown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let result: Result<()> = async {
        let checkpoint = checkpoint_dir(plan, ctx)?;
        let t = totals.clone();
        let quality = quality_totals.clone();
        let unknown = sink_rows_unknown.clone();
        let user = run.on_progress.clone();
        let listener: etlantic_runtime::ProgressListener =
            std::sync::Arc::new(move |p: &QueryProgress| {
                if let Ok(mut g) = t.lock() {
                    for s in &p.sources {
                        let Some(id) = s.source_id.clone() else {
                            continue;
                        };
                        *g.0.entry(id.clone()).or_default() += s.num_input_rows;
                        g.3.entry(id)
                            .or_default()
                            .extend(s.data_loss.iter().cloned());
                    }
                    if p.sink.num_output_rows < 0 {
                        unknown.store(true, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        g.1 += p.sink.num_output_rows as u64;
                    }
                    g.2 += p.quarantined_rows;
                }
                if let Ok(mut q) = quality.lock() {
                    for c in &p.quality {
                        QualityReport::add(&mut q, &c.asset, &c.count);
                    }
                }
                if let Some(u) = &user {
                    u(p);
                }
            });
        if let Some(region) = etlantic_runtime::whole_query::region_of(plan) {
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
        opts.resolve = resolver(ctx);
        opts.on_progress = Some(listener);
        opts.stop = run.stop.clone();
        opts.max_batches = run.max_batches;
        let mut q = etlantic_runtime::StreamingQuery::start(plan, opts).await?;
        report.run_id = q.run_id().to_string();
        q.run().await
    }
    .await;
    if let Err(e) = result {
        let scrub = ctx.scrubber(plan);
        report.status = "failed".into();
        report.errors = e.0 .0.into_iter().map(|d| scrub.diagnostic(d)).collect();
    }
    if let Ok(g) = totals.lock() {
        report.sources = plan
            .sources
            .iter()
            .map(|s| SourceReport {
                id: s.id.clone(),
                rows: g.0.get(&s.id).copied().unwrap_or(0),
                rejected: 0,
                data_loss: g.3.get(&s.id).cloned().unwrap_or_default(),
            })
            .collect();
        report.sinks = vec![SinkReport {
            id: plan
                .sinks
                .iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>()
                .join(","),
            rows: g.1,
            rows_unknown: sink_rows_unknown.load(std::sync::atomic::Ordering::Relaxed),
        }];
        report.quarantined = g.2;
    }
    if let Ok(q) = quality_totals.lock() {
        report.quality = q.clone();
    }
    if let Ok((_, q)) = quarantine_path(plan, ctx) {
        report.quarantine = q;
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    report
}

/// Resolves the secret references of `ctx`'s profile.
fn resolver(ctx: &RunContext) -> etlantic_runtime::SecretResolver {
    let ctx = ctx.clone();
    std::sync::Arc::new(move |s| resolve_secrets(s, &ctx.secrets_profile))
}

/// The checkpoint directory of a streaming plan.
pub fn checkpoint_dir(plan: &PipelinePlan, ctx: &RunContext) -> Result<PathBuf> {
    let text = plan
        .profile
        .checkpoint
        .clone()
        .unwrap_or_else(|| format!("file://.etlantic/checkpoints/{}", plan.pipeline));
    let uri = ctx.resolve_uri(&text)?;
    if uri.scheme != "file" {
        return Err(Error::new(
            &codes::BAD_URI,
            format!(
                "the checkpoint location must be a file:// URI, got `{}`",
                uri.scheme
            ),
        ));
    }
    Ok(etlantic_core::uri::located(&ctx.root, &uri.location))
}
