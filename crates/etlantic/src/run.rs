//! Running a PipelinePlan in batch mode: read every source, run the regions in order on
//! their backends, write every sink, quarantine every bad record, report.
//!
//! The runner executes exactly the plan it is given — the run report carries the plan's
//! fingerprint — and reconstructs everything it needs (contracts, DTCS plans) from the
//! plan itself, so a saved plan runs without the original files.

use chrono::{SecondsFormat, Utc};
use etlantic_core::data::{RejectedRecord, RowOrigins, Table};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::plugin::{
    self, ReadLimit, RegionLocation, SinkBatch, SinkContext, SourceContext, WriteOutcome,
};
use etlantic_core::profile::{resolve_secrets, OnError, Profile};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use etlantic_datafusion::quality::{QualityGate, RuleCount};
use etlantic_plan::plan::PipelinePlan;
use indexmap::IndexMap;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
}

/// The quarantine file, and how reports name it: the location as the plan writes it,
/// with secret references unresolved.
fn quarantine_path(plan: &PipelinePlan, ctx: &RunContext) -> Result<(PathBuf, String)> {
    let uri = ctx.resolve_uri(&plan.profile.quarantine)?;
    let p = Path::new(&uri.location);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        ctx.root.join(p)
    };
    let display = BindingUri::parse(&plan.profile.quarantine)
        .map(|u| u.location)
        .unwrap_or_else(|_| uri.location.clone());
    Ok((abs, display))
}

/// The resolved values of every secret a plan references, to be hidden from everything a
/// run reports: a secret can end up in a path (`file://data/${env:TENANT}/orders.jsonl`)
/// and from there in a record's position or an I/O error message.
struct Scrubber(Vec<String>);

impl Scrubber {
    fn for_plan(plan: &PipelinePlan, ctx: &RunContext) -> Self {
        let mut texts: Vec<&str> = plan.assets.values().map(|a| a.binding.as_str()).collect();
        texts.push(&plan.profile.quarantine);
        texts.extend(plan.profile.checkpoint.as_deref());
        texts.extend(plan.profile.secrets.values().map(String::as_str));
        texts.extend(plan.regions.iter().filter_map(|r| r.location.as_deref()));
        let mut values: Vec<String> = Vec::new();
        for text in texts {
            let mut rest = text;
            while let Some(start) = rest.find("${") {
                let after = &rest[start..];
                let Some(end) = after.find('}') else { break };
                if let Ok(v) = resolve_secrets(&after[..=end], &ctx.secrets_profile) {
                    if !v.is_empty() && !values.contains(&v) {
                        values.push(v);
                    }
                }
                rest = &after[end + 1..];
            }
        }
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Scrubber(values)
    }

    fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.0 {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "***");
            }
        }
        out
    }

    fn diagnostic(&self, mut d: Diagnostic) -> Diagnostic {
        d.message = self.text(&d.message);
        d.path = self.text(&d.path);
        d.help = self.text(&d.help);
        d.file = d.file.map(|f| self.text(&f));
        d
    }

    /// The reason and position of a rejected record (the raw record is data, kept as read).
    fn record(&self, mut r: RejectedRecord) -> RejectedRecord {
        r.reason = self.text(&r.reason);
        r.position.file = r.position.file.map(|f| self.text(&f));
        r
    }
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
    let scrub = Scrubber::for_plan(plan, ctx);
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
    let (qpath, qdisplay) = quarantine_path(plan, ctx)?;
    report.quarantine = qdisplay;
    let mut quarantine: Option<etlantic_sinks::quarantine::QuarantineWriter> = None;
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
        let contract = plan.asset_contract(&s.asset)?;
        let uri = ctx.resolve_uri(&plan.assets[&s.asset].binding)?;
        let provider = plugin::source_provider(&uri.scheme).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_SCHEME,
                format!("no source plugin for `{}`", uri.scheme),
            )
        })?;
        let mut source = provider.create(SourceContext {
            asset: s.asset.clone(),
            uri,
            schema: contract.arrow_schema(),
            contract: Some(contract.clone()),
            root: ctx.root.clone(),
            mode: ExecutionMode::Batch,
            state_dir: None,
        })?;
        let limit = ReadLimit::unlimited();
        let batch = match source.latest_offset(None, &limit).await? {
            Some(end) => source.read(None, &end).await?,
            None => Default::default(),
        };
        let mut rejected = batch.rejected.len() as u64;
        if rejected > 0 {
            let records: Vec<RejectedRecord> = batch
                .rejected
                .iter()
                .map(|r| scrub.record(r.clone()))
                .collect();
            handle_rejects(plan, &records, &qpath, &mut quarantine, run_id)?;
            report.quarantined += rejected;
        }
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
            let taken = apply_gate(
                &gate,
                table,
                &origins,
                report,
                (&qpath, &mut quarantine, run_id),
                scrub,
            )
            .await?;
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
                (&qpath, &mut quarantine, run_id),
                scrub,
            )
            .await?
            .0;
        }
        let uri = ctx.resolve_uri(&plan.assets[&s.asset].binding)?;
        let provider = plugin::sink_provider(&uri.scheme).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_SCHEME,
                format!("no sink plugin for `{}`", uri.scheme),
            )
        })?;
        let mut sink = provider.create(SinkContext {
            asset: s.asset.clone(),
            uri,
            schema: contract.arrow_schema(),
            contract: Some(contract.clone()),
            root: ctx.root.clone(),
            mode: ExecutionMode::Batch,
            output_mode: s.output_mode,
        })?;
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
    drop(quarantine);
    Ok(())
}

/// The quarantine file, its writer (opened on first use) and the run id.
type QuarantineOut<'a> = (
    &'a Path,
    &'a mut Option<etlantic_sinks::quarantine::QuarantineWriter>,
    &'a str,
);

/// Runs a quality gate on a whole input of a batch run (row positions from `origins`):
/// counts its rules in the report and quarantines what its quarantine policies took out
/// (a `fail` policy's error stops the run). Returns the rows that go on and how many were
/// quarantined.
async fn apply_gate(
    gate: &QualityGate,
    table: Table,
    origins: &RowOrigins,
    report: &mut RunReport,
    (qpath, quarantine, run_id): QuarantineOut<'_>,
    scrub: &Scrubber,
) -> Result<(Table, u64)> {
    let out = gate.apply_at(table, origins).await?;
    for c in &out.counts {
        QualityReport::add(&mut report.quality, gate.asset(), c);
    }
    let n = out.quarantined.len() as u64;
    if n > 0 {
        let records: Vec<RejectedRecord> = out
            .quarantined
            .into_iter()
            .map(|r| scrub.record(r))
            .collect();
        write_quarantine(&records, qpath, quarantine, run_id)?;
        report.quarantined += n;
    }
    Ok((out.table, n))
}

fn handle_rejects(
    plan: &PipelinePlan,
    rejected: &[RejectedRecord],
    path: &Path,
    writer: &mut Option<etlantic_sinks::quarantine::QuarantineWriter>,
    run_id: &str,
) -> Result<()> {
    if plan.profile.on_error == OnError::Fail {
        let mut d = etlantic_core::Diagnostics::new();
        d.push(Diagnostic::new(
            &codes::BAD_RECORDS_FAIL,
            format!(
                "{} record(s) broke their contract and the policy is `fail`",
                rejected.len()
            ),
        ));
        for r in rejected.iter().take(20) {
            let mut diag = Diagnostic::new(
                codes::lookup(&r.code).unwrap_or(&codes::RECORD_UNPARSABLE),
                format!("{}: {}", r.position, r.reason),
            );
            if let Some(f) = &r.position.file {
                diag = diag.in_file(f.clone());
            }
            if let Some(l) = r.position.line {
                diag = diag.on_line(l);
            }
            d.push(diag);
        }
        return Err(Error(d));
    }
    write_quarantine(rejected, path, writer, run_id)
}

/// Appends records to the quarantine file, opening it on first use.
fn write_quarantine(
    rejected: &[RejectedRecord],
    path: &Path,
    writer: &mut Option<etlantic_sinks::quarantine::QuarantineWriter>,
    run_id: &str,
) -> Result<()> {
    if writer.is_none() {
        *writer = Some(etlantic_sinks::quarantine::QuarantineWriter::open(path)?);
    }
    writer
        .as_mut()
        .expect("opened")
        .write(run_id, None, rejected)
        .map(|_| ())
}

/// Options of a streaming run; the default runs until the trigger finishes (or forever).
#[derive(Default)]
pub struct StreamingRun {
    /// Called with every progress record (e.g. to print it live).
    pub on_progress: Option<etlantic_datafusion::streaming::ProgressListener>,
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
    let result: Result<()> =
        async {
            let checkpoint = checkpoint_dir(plan, ctx)?;
            let resolver_ctx = ctx.clone();
            let t = totals.clone();
            let quality = quality_totals.clone();
            let unknown = sink_rows_unknown.clone();
            let user = run.on_progress.clone();
            let listener: etlantic_datafusion::streaming::ProgressListener =
                std::sync::Arc::new(move |p: &serde_json::Value| {
                    if let Ok(mut g) = t.lock() {
                        for s in p["sources"].as_array().into_iter().flatten() {
                            let id = s["description"]
                                .as_str()
                                .unwrap_or("")
                                .split(' ')
                                .next()
                                .unwrap_or("")
                                .to_string();
                            *g.0.entry(id.clone()).or_default() +=
                                s["numInputRows"].as_u64().unwrap_or(0);
                            if let Ok(lost) = serde_json::from_value::<
                                Vec<etlantic_core::data::DataLoss>,
                            >(s["dataLoss"].clone())
                            {
                                g.3.entry(id).or_default().extend(lost);
                            }
                        }
                        g.1 += p["sink"]["numOutputRows"].as_u64().unwrap_or(0);
                        if p["sink"]["numOutputRows"].as_i64().is_some_and(|n| n < 0) {
                            unknown.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        g.2 += p["quarantinedRows"].as_u64().unwrap_or(0);
                    }
                    if let Ok(mut q) = quality.lock() {
                        for c in p["quality"].as_array().into_iter().flatten() {
                            let Ok(count) = serde_json::from_value::<RuleCount>(c.clone()) else {
                                continue;
                            };
                            QualityReport::add(
                                &mut q,
                                c["asset"].as_str().unwrap_or_default(),
                                &count,
                            );
                        }
                    }
                    if let Some(u) = &user {
                        u(p);
                    }
                });
            if let Some(region) = whole_query_region(plan) {
                return run_whole_query(plan, ctx, region, checkpoint, listener, &run)
                    .await
                    .map(|run_id| report.run_id = run_id);
            }
            let mut opts =
                etlantic_datafusion::streaming::StreamingOptions::new(ctx.root.clone(), checkpoint);
            opts.resolve =
                std::sync::Arc::new(move |s| resolve_secrets(s, &resolver_ctx.secrets_profile));
            opts.on_progress = Some(listener);
            opts.stop = run.stop.clone();
            opts.max_batches = run.max_batches;
            let mut q = etlantic_datafusion::streaming::StreamingQuery::start(plan, opts).await?;
            report.run_id = q.run_id().to_string();
            q.run().await
        }
        .await;
    if let Err(e) = result {
        let scrub = Scrubber::for_plan(plan, ctx);
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

/// The region of a streaming plan that runs the whole query in another system (on a
/// backend whose streaming regions are whole queries, such as Spark), if any. The
/// planner makes sure such a region holds every transformation (`ETL507`).
fn whole_query_region(plan: &PipelinePlan) -> Option<&etlantic_plan::plan::Region> {
    plan.regions.iter().find(|r| {
        r.kind == plugin::RegionKind::Streaming
            && plugin::backend(&r.backend).is_some_and(|b| b.capabilities().streaming.whole_query)
    })
}

/// Runs a streaming plan as one query on the backend of `region` (Spark): its endpoint
/// is the region's location, its checkpoint the plan's; Spark's progress records,
/// mapped into ETLantic's, go to `listener`. Returns Spark's run id.
#[cfg(feature = "spark")]
async fn run_whole_query(
    plan: &PipelinePlan,
    ctx: &RunContext,
    region: &etlantic_plan::plan::Region,
    checkpoint: PathBuf,
    listener: etlantic_datafusion::streaming::ProgressListener,
    run: &StreamingRun,
) -> Result<String> {
    use etlantic_spark_compat::streaming::{SparkQueryOptions, SparkSink, SparkStreamingQuery};
    if region.backend != "spark" {
        return Err(Error::new(
            &codes::NO_BACKEND,
            format!(
                "this build runs whole streaming queries on Spark only, not on `{}`",
                region.backend
            ),
        ));
    }
    let place = region.location.as_deref().ok_or_else(|| {
        Error::new(
            &codes::REGION_LOCATION,
            format!("region {} runs on Spark but has no endpoint", region.id),
        )
        .with_help(
            "Name the endpoint under `endpoints:` in the profile (e.g. `spark: sc://host:15002`).",
        )
    })?;
    let url = etlantic_spark_compat::backend::endpoint_url(&ctx.resolve_uri(place)?)?;
    let options = SparkQueryOptions {
        url,
        root: ctx.root.clone(),
        checkpoint,
        sink: SparkSink::Binding,
        trigger: plan.profile.trigger.unwrap_or_default(),
        default_max_files: None,
        fail_on_bad_records: plan.profile.on_error == OnError::Fail,
    };
    // Spark's progress, mapped into ETLantic's records, is kept where the embedded
    // runtime keeps its own: `<checkpoint>/progress.jsonl`.
    std::fs::create_dir_all(&options.checkpoint).map_err(|e| {
        Error::new(
            &codes::IO_ERROR,
            format!("cannot create {}: {e}", options.checkpoint.display()),
        )
    })?;
    let log_path = options.checkpoint.join("progress.jsonl");
    let plan = plan.clone();
    let stop = run.stop.clone();
    let max_batches = run.max_batches;
    // The Spark Connect client blocks: it runs on a blocking thread.
    tokio::task::spawn_blocking(move || {
        let query = SparkStreamingQuery::start_with(&plan, &options)?;
        let log = std::sync::Mutex::new(
            etlantic_datafusion::streaming::progress::ProgressLog::new(&options.checkpoint),
        );
        let log_failed = std::sync::atomic::AtomicBool::new(false);
        let record = |p: &serde_json::Value| {
            let appended = log.lock().map(|mut l| l.append(p).is_ok()).unwrap_or(false);
            if !appended {
                log_failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            listener(p)
        };
        query.drive(&stop, max_batches, &record)?;
        if log_failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::new(
                &codes::IO_ERROR,
                format!("cannot append to {}", log_path.display()),
            ));
        }
        Ok(query.run_id().to_string())
    })
    .await
    .map_err(|e| {
        Error::new(
            &codes::ENGINE_ERROR,
            format!("the Spark driver thread failed: {e}"),
        )
    })?
}

/// Without the `spark` feature no whole-query backend is linked, so the planner never
/// places such a region.
#[cfg(not(feature = "spark"))]
async fn run_whole_query(
    _plan: &PipelinePlan,
    _ctx: &RunContext,
    region: &etlantic_plan::plan::Region,
    _checkpoint: PathBuf,
    _listener: etlantic_datafusion::streaming::ProgressListener,
    _run: &StreamingRun,
) -> Result<String> {
    Err(Error::new(
        &codes::NO_BACKEND,
        format!(
            "backend `{}` is not linked (cargo feature `spark`)",
            region.backend
        ),
    ))
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
    let p = Path::new(&uri.location);
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        ctx.root.join(p)
    })
}
