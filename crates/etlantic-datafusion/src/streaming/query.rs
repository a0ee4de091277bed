//! The micro-batch driver: Spark's `MicroBatchExecution` for ETLantic plans.
//!
//! Batch protocol, for batch N:
//! 1. ask every source for its latest offset (bounded by its read limit);
//! 2. log the offsets of N (synced) — the write-ahead log: source ranges, the watermark
//!    in force, the watermark of the previous micro-batch, the batch timestamp; sources
//!    learn what the last state write let them release (`Source::commit`);
//! 3. read the ranges; quarantine records that break their contract; track event times;
//! 4. run the transformations: stateless steps on DataFusion, stateful steps on their
//!    operators; route late rows by the late-event policy;
//! 5. hand each sink its rows, identified by (query id, N) — sinks are idempotent or
//!    transactional per batch id, or declare at-least-once;
//! 6. write the operators' state snapshots (version N+1);
//! 7. log the commit of N with the next watermark (durable with the next offsets, see
//!    [`super::batch_log`]);
//! 8. append a progress record.
//!
//! When the watermark moved and a stateful operator depends on it, a no-data batch N+1
//! runs right away (Spark's `noDataMicroBatches`), so windows close without new input.
//!
//! On restart the query resumes after the last commit; a batch whose offsets are logged
//! but not committed runs again with exactly the logged offsets and watermarks.

use super::checkpoint::{Checkpoint, CommitEntry, Metadata, OffsetEntry, SourceRange};
use super::operators::OpContext;
use super::program::{
    build_transform, gather_rows, prepare_input, SourceInfo, TransformUnit, Unit,
};
use super::progress::{ProgressBuilder, SourceProgress, StateProgress};
use super::state_log::LogEntry;
use super::static_source::StaticSource;
use super::watermark::{MeasuredRows, WatermarkTracker};
use crate::quality::{QualityGate, RuleCount};
use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use chrono::Utc;
use etlantic_core::canonical;
use etlantic_core::data::{Offset, RejectedRecord, RowOrigins, SourcePosition, Table};
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use etlantic_core::ir::keys::UniqueKey;
use etlantic_core::ir::lineage::EventColumn;
use etlantic_core::ir::Expr;
use etlantic_core::plugin::{
    self, ReadLimit, Sink, SinkBatch, SinkContext, Source, SourceContext, StepTask, WriteOutcome,
};
use etlantic_core::profile::OnError;
use etlantic_core::streaming::{ExecutionMode, LatePolicy, OutputMode, Trigger};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::{PipelinePlan, PlanLogic};
use indexmap::IndexMap;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Receives every progress record.
pub type ProgressListener = Arc<dyn Fn(&Value) + Send + Sync>;

/// Resolves `${...}` secret references in binding URIs.
pub type SecretResolver = Arc<dyn Fn(&str) -> Result<String> + Send + Sync>;

/// How a streaming query runs.
#[derive(Clone)]
pub struct StreamingOptions {
    /// Directory relative binding paths resolve against.
    pub root: PathBuf,
    /// The checkpoint directory.
    pub checkpoint: PathBuf,
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
    /// [`super::clock::ManualClock`].
    pub clock: super::clock::Clock,
    /// Write the periodic whole snapshot of a changelog operator in the background
    /// (default) instead of before the commit. Either way the version is recoverable;
    /// this only moves the snapshot's write out of the micro-batch's critical path.
    pub background_snapshots: bool,
}

impl StreamingOptions {
    /// Options with no secret resolution and no listener.
    pub fn new(root: impl Into<PathBuf>, checkpoint: impl Into<PathBuf>) -> Self {
        StreamingOptions {
            root: root.into(),
            checkpoint: checkpoint.into(),
            resolve: Arc::new(|s| Ok(s.to_string())),
            on_progress: None,
            stop: Arc::new(AtomicBool::new(false)),
            max_batches: None,
            clock: super::clock::system_clock(),
            background_snapshots: true,
        }
    }
}

/// What a micro-batch writes of an operator's state.
enum StateWrite {
    /// The whole state, as a snapshot file (an operator with a changelog).
    Whole(RecordBatch),
    /// The changes since the previous version, logged.
    Changes(RecordBatch),
    /// The whole state, logged (an operator without a changelog).
    Logged(RecordBatch),
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

/// Runs `gate` on `table` (row positions from `origins`, else row indexes), counts its
/// rules in `stats` and adds what its quarantine policy took out to `ruled_out`; returns
/// the rows that go on.
async fn gated(
    gate: &QualityGate,
    table: Table,
    origins: &RowOrigins,
    stats: &mut BatchStats,
    ruled_out: &mut Vec<RejectedRecord>,
) -> Result<Table> {
    let out = gate.apply_at(table, origins).await?;
    ruled_out.extend(out.quarantined);
    let asset = gate.asset();
    stats
        .quality
        .extend(out.counts.into_iter().map(|c| (asset.to_string(), c)));
    Ok(out.table)
}

struct SourceRt {
    id: String,
    asset: String,
    source: Box<dyn Source>,
    limit: ReadLimit,
    position: Option<Offset>,
    info: SourceInfo,
    /// The source contract's batch-level quality rules (record rules are the decoder's).
    gate: Option<QualityGate>,
    /// The rows its watermark is measured on, when not every row.
    measured: Option<MeasuredRows>,
}

struct SinkRt {
    id: String,
    input: String,
    asset: String,
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
    lost: HashMap<String, Vec<etlantic_core::data::DataLoss>>,
    /// Records quarantined in the batch: rejected while decoding, taken out by a quality
    /// rule, or late under the `quarantine` policy.
    rejected: u64,
    late: u64,
    output_rows: u64,
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
    checkpoint: Checkpoint,
    query_id: String,
    run_id: String,
    sources: Vec<SourceRt>,
    /// Static sources: bounded tables read for the micro-batches (stream-static joins).
    statics: Vec<StaticSource>,
    sinks: Vec<SinkRt>,
    side_sinks: HashMap<String, usize>,
    transforms: Vec<TransformUnit>,
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
    quarantine: Option<PathBuf>,
    fail: Option<(FailPoint, u64)>,
    last_progress: Option<Value>,
    batches_run: u64,
    /// A micro-batch that failed half-way (the query must be restarted).
    failed_batch: Option<u64>,
    /// Whole snapshots of changelog operators being written in the background.
    background_snapshot: Option<tokio::task::JoinHandle<Result<()>>>,
    /// The newest state version that is durable (0: none yet, the empty state).
    state_version: u64,
    /// State writes so far (the version, when every micro-batch writes its state): every
    /// [`super::checkpoint::FULL_SNAPSHOT_EVERY`]th may be a whole snapshot.
    state_writes: u64,
    /// The processing time (epoch ms) of the last state write, or of the start: the
    /// profile's `state_checkpoint_interval` counts from it.
    state_written_ms: i64,
    /// Committed batches to run again after a restart to rebuild the state from
    /// `state_version` (first, last).
    rebuild: Option<(u64, u64)>,
    /// Set while those batches run: they only rebuild state, writing nothing.
    rebuilding: bool,
    /// Source ends that a state write made releasable ([`Source::commit`]), told to the
    /// sources once the commit that names that state is durable: with the next offsets
    /// record, or at [`StreamingQuery::close`] (see [`super::batch_log`]).
    ///
    /// [`Source::commit`]: etlantic_core::plugin::Source::commit
    pending_release: Vec<(usize, Offset)>,
}

/// The columns of a source the streaming region reads, when it provably reads fewer
/// than all (for [`etlantic_core::plugin::Source::read_only`]): no sink reads the source
/// directly, every step that reads it is a portable aggregation (window or group-by)
/// whose input is the source itself, and late rows are dropped or accepted (quarantined
/// or side-output late rows leave with every column). The columns are those the
/// aggregations read plus the event-time column. `None` when any of this does not hold.
fn columns_read(
    plan: &PipelinePlan,
    source: &etlantic_plan::plan::PlanSource,
) -> Result<Option<Vec<String>>> {
    use etlantic_core::ir::{Action, Aggregate, NamedExpr};
    if !matches!(source.late_events, LatePolicy::Drop | LatePolicy::Accept)
        || plan.sinks.iter().any(|k| k.input == source.id)
    {
        return Ok(None);
    }
    let mut columns: Vec<String> = source.event_time.iter().map(|e| e.column.clone()).collect();
    if let Some(v) = &source.watermark_rows {
        let e = etlantic_core::ir::Expr::decode(v).map_err(|m| {
            Error::new(
                &codes::PLAN_INVALID,
                format!(
                    "source `{}`: the rows its watermark is measured on: {m}",
                    source.id
                ),
            )
        })?;
        for c in e.columns() {
            if !columns.contains(&c) {
                columns.push(c);
            }
        }
    }
    let mut add = |group_by: &[NamedExpr], aggregates: &[Aggregate]| {
        let exprs = group_by
            .iter()
            .map(|g| &g.expr)
            .chain(aggregates.iter().filter_map(|a| a.arg.as_ref()));
        for c in exprs.flat_map(|e| e.columns()) {
            if !columns.contains(&c) {
                columns.push(c);
            }
        }
    };
    for t in &plan.transforms {
        let task = plan.step_task(&t.id)?;
        let ports: Vec<&String> = task
            .inputs
            .iter()
            .filter(|(_, node)| **node == source.id)
            .map(|(port, _)| port)
            .collect();
        if ports.is_empty() {
            continue;
        }
        let etlantic_core::plugin::StepLogic::Portable {
            plan: portable,
            output,
            ..
        } = &task.logic
        else {
            return Ok(None);
        };
        let decoded = portable.decoded();
        for port in ports {
            if output == port {
                return Ok(None);
            }
            for step in &decoded.steps {
                if step.op.secondary_inputs().contains(&port.as_str()) {
                    return Ok(None);
                }
                if step.target != *port {
                    continue;
                }
                match &step.op {
                    Action::Aggregate {
                        group_by,
                        aggregates,
                    } => add(group_by, aggregates),
                    Action::WindowAggregate {
                        window,
                        group_by,
                        aggregates,
                    } => {
                        add(group_by, aggregates);
                        add(
                            &[NamedExpr {
                                name: window.time_column.clone(),
                                expr: etlantic_core::ir::Expr::Column(window.time_column.clone()),
                            }],
                            &[],
                        );
                    }
                    _ => return Ok(None),
                }
            }
        }
    }
    Ok(Some(columns))
}

fn io(e: impl std::fmt::Display) -> Error {
    Error::new(&codes::IO_ERROR, e.to_string())
}

/// The fingerprint of what a restarted query must keep equal: sources (schemas, event
/// time, watermarks), transformation logic and sinks (inputs, output modes). Bindings,
/// triggers and profile names may change between runs.
pub fn compatibility_fingerprint(plan: &PipelinePlan) -> String {
    let v = json!({
        "sources": plan.sources.iter().map(|s| {
            let mut v = json!({
                "id": s.id, "schema": plan.assets.get(&s.asset).map(|a| serde_json::to_value(&a.schema).expect("serialises")),
                "eventTime": s.event_time, "watermark": s.watermark,
            });
            if s.static_refresh.is_some() {
                // Static or streaming is part of the query (refresh policies may change).
                v["static"] = json!(true);
            }
            v
        }).collect::<Vec<_>>(),
        "transforms": plan.transforms.iter().map(|t| json!({
            "id": t.id, "inputs": t.inputs, "logic": match &t.logic {
                PlanLogic::Portable { dtcs_fingerprint, parameters, output, .. } => json!({"dtcs": dtcs_fingerprint, "parameters": parameters, "output": output}),
                other => serde_json::to_value(other).expect("serialises"),
            },
        })).collect::<Vec<_>>(),
        "sinks": plan.sinks.iter().map(|s| json!({"id": s.id, "input": s.input, "outputMode": s.output_mode})).collect::<Vec<_>>(),
    });
    canonical::fingerprint(&v)
}

impl StreamingQuery {
    /// Starts (or resumes) a query: opens the checkpoint, creates sources and sinks,
    /// restores state. Nothing is read yet.
    pub async fn start(plan: &PipelinePlan, opts: StreamingOptions) -> Result<Self> {
        if plan.profile.mode != ExecutionMode::Streaming {
            return Err(Error::new(&codes::PLAN_INVALID, "not a streaming plan"));
        }
        let checkpoint = Checkpoint::open(&opts.checkpoint)?;
        let compat = compatibility_fingerprint(plan);
        let metadata = match checkpoint.metadata()? {
            Some(m) => {
                if m.compatibility != compat {
                    return Err(Diagnostic::new(
                        &codes::CHECKPOINT_INCOMPATIBLE,
                        format!(
                            "checkpoint {} was written by a different query (its sources, logic or sinks changed since plan {})",
                            opts.checkpoint.display(),
                            m.plan_fingerprint
                        ),
                    )
                    .into());
                }
                m
            }
            None => {
                let m = Metadata {
                    id: uuid::Uuid::new_v4().to_string(),
                    pipeline: plan.pipeline.clone(),
                    plan_fingerprint: plan.fingerprint.clone(),
                    compatibility: compat,
                    created_at: Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                };
                checkpoint.write_metadata(&m)?;
                m
            }
        };
        let resolve_uri =
            |text: &str| -> Result<BindingUri> { BindingUri::parse(&(opts.resolve)(text)?) };

        // Sources.
        let mut sources = Vec::new();
        let mut statics = Vec::new();
        let mut delays = BTreeMap::new();
        for (n, s) in plan.sources.iter().enumerate() {
            let contract = plan.asset_contract(&s.asset)?;
            let uri = resolve_uri(&plan.assets[&s.asset].binding)?;
            let provider = plugin::source_provider(&uri.scheme).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_SCHEME,
                    format!("no source plugin for `{}`", uri.scheme),
                )
            })?;
            if let Some(refresh) = s.static_refresh {
                // Read bounded, like a batch run reads it.
                let source = provider.create(SourceContext {
                    asset: s.asset.clone(),
                    uri,
                    schema: contract.arrow_schema(),
                    contract: Some(contract),
                    root: opts.root.clone(),
                    mode: ExecutionMode::Batch,
                    state_dir: None,
                })?;
                statics.push(StaticSource::new(&s.id, source, refresh));
                continue;
            }
            let source = provider.create(SourceContext {
                asset: s.asset.clone(),
                uri,
                schema: contract.arrow_schema(),
                contract: Some(contract),
                root: opts.root.clone(),
                mode: ExecutionMode::Streaming,
                state_dir: Some(checkpoint.source_dir(n)),
            })?;
            let mut source = source;
            let gate = QualityGate::for_asset(
                plan,
                &s.asset,
                source.schema(),
                source.checks_record_rules(),
            )?;
            if let Some(columns) = columns_read(plan, s)?.filter(|_| gate.is_none()) {
                source.read_only(&columns);
            }
            let event_time = s
                .watermark
                .and(s.event_time.as_ref().map(|e| e.column.clone()));
            let measured = match &s.watermark_rows {
                Some(v) => Some(MeasuredRows::new(Expr::decode(v).map_err(|m| {
                    Error::new(
                        &codes::PLAN_INVALID,
                        format!(
                            "source `{}`: the rows its watermark is measured on: {m}",
                            s.id
                        ),
                    )
                })?)),
                None => None,
            };
            if let (Some(_), Some(d)) = (&event_time, s.watermark) {
                delays.insert(s.id.clone(), d.as_millis());
            }
            sources.push(SourceRt {
                id: s.id.clone(),
                asset: s.asset.clone(),
                source,
                limit: s.read_limit.clone().unwrap_or_default(),
                position: None,
                info: SourceInfo {
                    event_time,
                    delay_us: s.watermark.map(|d| d.as_micros()),
                    late: s.late_events.clone(),
                    is_static: false,
                },
                gate,
                measured,
            });
        }
        // Sinks.
        let mut sinks = Vec::new();
        for s in &plan.sinks {
            let contract = plan.asset_contract(&s.asset)?;
            let binding = plan.assets[&s.asset].binding.clone();
            let uri = resolve_uri(&binding)?;
            let provider = plugin::sink_provider(&uri.scheme).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_SCHEME,
                    format!("no sink plugin for `{}`", uri.scheme),
                )
            })?;
            let sink = provider.create(SinkContext {
                asset: s.asset.clone(),
                uri,
                schema: contract.arrow_schema(),
                contract: Some(contract.clone()),
                root: opts.root.clone(),
                mode: ExecutionMode::Streaming,
                output_mode: s.output_mode,
            })?;
            sinks.push(SinkRt {
                id: s.id.clone(),
                input: s.input.clone(),
                asset: s.asset.clone(),
                sink,
                output_mode: s.output_mode,
                schema: contract.arrow_schema(),
                description: etlantic_core::uri::redact(&binding),
                gate: QualityGate::for_asset(plan, &s.asset, contract.arrow_schema(), false)?,
            });
        }
        let side_sinks: HashMap<String, usize> = sources
            .iter()
            .filter_map(|s| match &s.info.late {
                LatePolicy::SideOutput { sink } => sinks
                    .iter()
                    .position(|k| &k.id == sink)
                    .map(|i| (sink.clone(), i)),
                _ => None,
            })
            .collect();

        // Program.
        let mut source_infos: HashMap<String, SourceInfo> = sources
            .iter()
            .map(|s| {
                (
                    s.id.clone(),
                    SourceInfo {
                        event_time: s.info.event_time.clone(),
                        delay_us: s.info.delay_us,
                        late: s.info.late.clone(),
                        is_static: false,
                    },
                )
            })
            .collect();
        let mut upstream: HashMap<String, Vec<String>> = sources
            .iter()
            .map(|s| (s.id.clone(), vec![s.id.clone()]))
            .collect();
        let mut node_schemas: HashMap<String, SchemaRef> = sources
            .iter()
            .map(|s| (s.id.clone(), s.source.schema()))
            .collect();
        for (st, s) in statics
            .iter()
            .zip(plan.sources.iter().filter(|s| s.static_refresh.is_some()))
        {
            let schema = plan.asset_contract(&s.asset)?.arrow_schema();
            source_infos.insert(
                st.id.clone(),
                SourceInfo {
                    event_time: None,
                    delay_us: None,
                    late: LatePolicy::Drop,
                    is_static: true,
                },
            );
            upstream.insert(st.id.clone(), vec![st.id.clone()]);
            node_schemas.insert(st.id.clone(), schema);
        }
        // The event-time columns of every node's output, through the transformations
        // (a window's bounds are event time downstream: chained stateful operators).
        let mut node_event_time: HashMap<String, Vec<EventColumn>> = source_infos
            .iter()
            .map(|(id, i)| {
                (
                    id.clone(),
                    i.event_time.iter().map(EventColumn::new).collect(),
                )
            })
            .collect();
        // The unique keys of every node's output: the sources' contracts declare them,
        // the transformations' steps keep some (a stream-stream join keeps less state
        // when a side is unique on its join keys).
        let mut node_unique: HashMap<String, Vec<UniqueKey>> = HashMap::new();
        for s in &plan.sources {
            node_unique.insert(s.id.clone(), plan.asset_contract(&s.asset)?.unique_keys());
        }
        let mut transforms = Vec::new();
        for t in &plan.transforms {
            let task = plan.step_task(&t.id)?;
            let mut schemas: HashMap<String, SchemaRef> = HashMap::new();
            let mut fed = Vec::new();
            for (port, node) in &task.inputs {
                schemas.insert(
                    port.clone(),
                    node_schemas.get(node).cloned().ok_or_else(|| {
                        Error::new(&codes::PLAN_INVALID, format!("unknown node `{node}`"))
                    })?,
                );
                fed.extend(upstream.get(node).cloned().unwrap_or_default());
            }
            let port_upstream: HashMap<String, Vec<String>> = task
                .inputs
                .iter()
                .map(|(_, n)| (n.clone(), upstream.get(n).cloned().unwrap_or_default()))
                .collect();
            let unit = if t.backend == crate::capabilities::BACKEND_NAME {
                // An accepted late row or an expired key lets a stateful step emit a
                // key again.
                let accepts_late = fed.iter().any(|s| {
                    source_infos
                        .get(s)
                        .is_some_and(|i| i.late == LatePolicy::Accept)
                });
                let has_ttl = plan
                    .profile
                    .state_ttl
                    .keys()
                    .any(|k| *k == t.id || k.starts_with(&format!("{}.", t.id)));
                build_transform(
                    &task,
                    &port_upstream,
                    &node_event_time,
                    super::program::UpstreamKeys {
                        of_nodes: &node_unique,
                        stateful_keys: !accepts_late && !has_ttl,
                    },
                    &source_infos,
                    &mut schemas,
                )?
            } else {
                // Placed on another backend (an SQL region): run whole per micro-batch.
                let backend = plugin::backend(&t.backend).ok_or_else(|| {
                    Error::new(
                        &codes::NO_BACKEND,
                        format!("backend `{}` of `{}` is not linked", t.backend, t.id),
                    )
                })?;
                let location = plan
                    .regions
                    .iter()
                    .find(|r| r.steps.contains(&t.id))
                    .and_then(|r| r.location.clone());
                let backend: Arc<dyn etlantic_core::plugin::Backend> = match location {
                    Some(place) => backend.at_location(&etlantic_core::plugin::RegionLocation {
                        uri: resolve_uri(&place)?,
                        root: opts.root.clone(),
                        // Streaming regions read no table in place (the planner refuses it).
                        tables: IndexMap::new(),
                    })?,
                    None => Arc::new(BackendRef(backend)),
                };
                TransformUnit {
                    id: t.id.clone(),
                    inputs: task.inputs.clone(),
                    units: vec![],
                    output: t.id.clone(),
                    parameters: IndexMap::new(),
                    opaque: Some(task.clone()),
                    backend: Some(backend),
                    event_columns: vec![],
                    unique_keys: vec![],
                }
            };
            let out_schema = match &unit.opaque {
                Some(_) => etlantic_plan::plan::arrow_schema(&t.schema).into(),
                None => schemas
                    .get(&unit.output)
                    .cloned()
                    .ok_or_else(|| Error::new(&codes::PLAN_INVALID, "no output schema"))?,
            };
            node_schemas.insert(t.id.clone(), out_schema.clone());
            fed.sort();
            fed.dedup();
            let event_time = match &unit.opaque {
                // An opaque step keeps the event-time columns of its inputs that it
                // outputs under the same name.
                Some(_) => {
                    let mut cols: Vec<EventColumn> = Vec::new();
                    for c in task
                        .inputs
                        .values()
                        .flat_map(|n| node_event_time.get(n).cloned().unwrap_or_default())
                        .filter(|c| out_schema.field_with_name(&c.name).is_ok())
                    {
                        EventColumn::merge_into(&mut cols, c);
                    }
                    cols
                }
                None => unit.event_columns.clone(),
            };
            node_event_time.insert(t.id.clone(), event_time);
            node_unique.insert(t.id.clone(), unit.unique_keys.clone());
            upstream.insert(t.id.clone(), fed);
            transforms.push(unit);
        }

        super::program::mark_inner_units(&mut transforms);
        super::ttl::apply_profile_ttl(&plan.profile.state_ttl, &mut transforms)?;
        let watermark = WatermarkTracker::new(delays, plan.profile.watermark_policy);
        let quarantine = {
            let uri = resolve_uri(&plan.profile.quarantine)?;
            let p = Path::new(&uri.location);
            Some(if p.is_absolute() {
                p.to_path_buf()
            } else {
                opts.root.join(p)
            })
        };
        let mut q = StreamingQuery {
            plan: plan.clone(),
            checkpoint,
            query_id: metadata.id,
            run_id: uuid::Uuid::new_v4().to_string(),
            sources,
            statics,
            sinks,
            side_sinks,
            transforms,
            watermark,
            prev_watermark_ms: 0,
            next_batch: 0,
            replay: None,
            needs_no_data: false,
            latest_offset_took: std::time::Duration::ZERO,
            quarantine,
            fail: fail_point(),
            last_progress: None,
            batches_run: 0,
            failed_batch: None,
            background_snapshot: None,
            state_version: 0,
            state_writes: 0,
            state_written_ms: (opts.clock)(),
            rebuild: None,
            rebuilding: false,
            pending_release: Vec::new(),
            opts,
        };
        q.recover()?;
        q.rebuild_state().await?;
        Ok(q)
    }

    /// The stable query id.
    pub fn id(&self) -> &str {
        &self.query_id
    }

    /// This run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
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
    pub fn last_progress(&self) -> Option<&Value> {
        self.last_progress.as_ref()
    }

    /// Whether a watermark advance calls for a no-data batch: some watermarked stateful
    /// operator evicts or emits on it in its output mode (complete-mode aggregations do
    /// not, as in Spark).
    fn has_watermarked_state(&self) -> bool {
        let modes = output_modes(&self.plan);
        self.transforms.iter().any(|t| {
            let mode = modes.get(&t.id).copied().unwrap_or_default();
            t.units.iter().any(
                |u| matches!(u, Unit::Stateful(s) if s.watermarked && s.op.needs_no_data_batch(s.mode(mode))),
            )
        })
    }

    /// Picks up where the checkpoint left off: the watermark and source positions of the
    /// last committed batch, the newest durable state (its commit names the version), the
    /// committed batches after that state to run again, and an uncommitted batch to re-run.
    fn recover(&mut self) -> Result<()> {
        let last_offsets = self.checkpoint.latest_offsets()?;
        let last_commit = self.checkpoint.latest_commit()?;
        let Some(n) = last_offsets else { return Ok(()) };
        let committed = last_commit == Some(n);
        // The batch whose state we restore: everything up to `base` is committed.
        let base = if committed { Some(n) } else { n.checked_sub(1) };
        if let Some(b) = base {
            let commit = self.checkpoint.commit(b)?.ok_or_else(|| {
                Error::from(Diagnostic::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the commit of batch {b} is missing while batch {n} is logged"),
                ))
            })?;
            self.watermark.restore(
                commit.next_batch_watermark_ms,
                commit.max_event_time_ms.clone(),
            );
            let prev = self.checkpoint.offsets(b)?.ok_or_else(|| {
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
            self.state_version = version;
            self.state_writes = version;
            // The interval counts from the micro-batch that wrote that state.
            if let Some(wrote) = version.checked_sub(1) {
                if let Some(e) = self.checkpoint.offsets(wrote)? {
                    self.state_written_ms = e.batch_timestamp_ms;
                }
            }
            let cp = &self.checkpoint;
            let mut restored = Vec::new();
            for t in self.transforms.iter_mut() {
                for u in t.units.iter_mut() {
                    if let Unit::Stateful(s) = u {
                        let identity = s.op.changelog_identity();
                        if let Some(state) = cp.read_state_chain(&s.id, version, identity)? {
                            s.op.restore(&state)?;
                            restored.push(s.id.clone());
                        }
                    }
                }
            }
            let _ = restored;
        }
        if committed {
            self.next_batch = n + 1;
            // A committed data batch that advanced the watermark may still owe its
            // no-data batch.
            let entry = self.checkpoint.offsets(n)?.expect("exists");
            self.needs_no_data = self.plan.profile.no_data_batches
                && self.has_watermarked_state()
                && self.watermark.current_ms() > entry.batch_watermark_ms;
        } else {
            self.next_batch = n;
            self.replay = self.checkpoint.offsets(n)?;
        }
        Ok(())
    }

    /// Runs the committed batches that a restart must run again to rebuild the state
    /// (see [`StreamingQuery::recover`]): with the logged offsets and watermarks, through
    /// the operators only — their outputs reach no sink, quarantine or progress record,
    /// which the first run wrote — and writing no checkpoint file.
    async fn rebuild_state(&mut self) -> Result<()> {
        let Some((first, last)) = self.rebuild.take() else {
            return Ok(());
        };
        let (next_batch, watermark) = (self.next_batch, self.watermark.clone());
        self.rebuilding = true;
        for batch in first..=last {
            let entry = self.checkpoint.offsets(batch)?.ok_or_else(|| {
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

    /// Runs the query by its trigger until it finishes (available-now, once) or is stopped.
    pub async fn run(&mut self) -> Result<()> {
        match self.plan.profile.trigger.unwrap_or_default() {
            Trigger::AvailableNow => {
                // A backfill can be long: it stops between micro-batches when asked.
                while !self.stop_requested() && self.run_once().await? {}
            }
            Trigger::Once => {
                // One micro-batch with everything available: like Spark's Trigger.Once,
                // read limits do not apply (available-now is the trigger that keeps them).
                self.run_batch(true).await?;
            }
            Trigger::ProcessingTime(interval) | Trigger::Continuous(interval) => loop {
                if self.stop_requested() {
                    break;
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
        self.close().await
    }

    /// Closes sinks (and the stateful operators); makes the last commit durable.
    pub async fn close(&mut self) -> Result<()> {
        self.finish_background_snapshot().await?;
        self.checkpoint.sync_log()?;
        self.release_sources().await?;
        for s in self.sinks.iter_mut() {
            s.sink.close().await?;
        }
        for t in self.transforms.iter_mut() {
            for u in t.units.iter_mut() {
                if let Unit::Stateful(s) = u {
                    s.op.close()?;
                }
            }
        }
        Ok(())
    }

    /// Tells the sources what they may release (see `pending_release`); the commit that
    /// made it releasable must be durable.
    async fn release_sources(&mut self) -> Result<()> {
        for (i, end) in std::mem::take(&mut self.pending_release) {
            self.sources[i].source.commit(&end).await?;
        }
        Ok(())
    }

    /// Waits for the whole snapshot being written in the background, if any. Its
    /// failure is reported (the changes it would have shortened the chain of are
    /// durable, so nothing is lost, but a checkpoint that cannot be written is a fault).
    async fn finish_background_snapshot(&mut self) -> Result<()> {
        if let Some(h) = self.background_snapshot.take() {
            h.await.map_err(|e| {
                Error::new(
                    &codes::ENGINE_ERROR,
                    format!("writing a state snapshot in the background failed: {e}"),
                )
            })??;
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
        self.transforms.iter().any(|t| {
            t.units
                .iter()
                .any(|u| matches!(u, Unit::Stateful(s) if s.op.has_due_work(watermark.map(|w| w.saturating_sub(s.watermark_lag_us / 1000)), now)))
        })
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
        range: impl Fn(&SourceRt) -> (Option<Value>, Option<Value>),
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

    /// Runs one micro-batch. A failure leaves the operators' in-memory state (and the
    /// watermark tracker) holding part of the batch, so the query refuses to go on; a
    /// restart re-runs the batch from the checkpoint.
    async fn execute(&mut self, entry: OffsetEntry, replaying: bool) -> Result<()> {
        let batch_id = self.next_batch;
        let result = self.execute_inner(entry, replaying).await;
        if result.is_err() {
            self.failed_batch = Some(batch_id);
        }
        result
    }

    async fn execute_inner(&mut self, entry: OffsetEntry, replaying: bool) -> Result<()> {
        let batch_id = self.next_batch;
        let t_start = Instant::now();
        let mut progress = ProgressBuilder::new(
            &self.query_id,
            &self.run_id,
            &self.plan.pipeline,
            batch_id,
            &entry,
        );
        if !replaying {
            self.checkpoint.write_offsets(batch_id, &entry)?;
            // Appending them synced the log: the last commit is durable.
            self.release_sources().await?;
        }
        progress.duration("walCommit", t_start.elapsed());
        self.maybe_fail(super::query::FailPoint::AfterOffsets, batch_id);

        // Read.
        let t_read = Instant::now();
        let mut stats = BatchStats::default();
        let mut relations: HashMap<String, Table> = HashMap::new();
        let mut rejected: Vec<RejectedRecord> = Vec::new();
        // Records a quality rule's `quarantine` policy took out (not subject to on_error).
        let mut ruled_out: Vec<RejectedRecord> = Vec::new();
        let no_data = entry.kind == "no_data";
        for s in self.sources.iter_mut() {
            let range = entry.sources.get(&s.id).cloned().unwrap_or(SourceRange {
                start: None,
                end: None,
            });
            let schema = s.source.schema();
            let (table, origins) = match (&range.end, no_data) {
                (Some(end), false) if range.start.as_ref() != Some(end) => {
                    let start = range.start.clone().map(Offset);
                    let b = s.source.read(start.as_ref(), &Offset(end.clone())).await?;
                    rejected.extend(b.rejected);
                    if !b.lost.is_empty() {
                        stats.lost.insert(s.id.clone(), b.lost);
                    }
                    (Table::new(schema, b.batches), b.origins)
                }
                _ => (Table::empty(schema), RowOrigins::default()),
            };
            let rows = table.num_rows() as u64;
            stats.input_rows.insert(s.id.clone(), rows);
            // Batch-level quality rules of the source contract, on what this batch read.
            let table = match &s.gate {
                Some(gate) if rows > 0 => {
                    gated(gate, table, &origins, &mut stats, &mut ruled_out).await?
                }
                _ => table,
            };
            if let Some(col) = &s.info.event_time {
                for b in &table.batches {
                    if let Some(c) = b.column_by_name(col) {
                        let mut t = super::operators::micros(c)?;
                        if let Some(rows) = &mut s.measured {
                            t = rows.select(b, t)?;
                        }
                        // Whole-column kernels: this runs on every input row.
                        let (Some(min), Some(max)) =
                            (arrow::compute::min(&t), arrow::compute::max(&t))
                        else {
                            continue;
                        };
                        stats.event_min_us = Some(stats.event_min_us.map_or(min, |m| m.min(min)));
                        stats.event_max_us = Some(stats.event_max_us.map_or(max, |m| m.max(max)));
                        stats.event_sum += if t.null_count() == 0 {
                            t.values().iter().map(|&v| v as i128).sum::<i128>()
                        } else {
                            t.iter().flatten().map(|v| v as i128).sum::<i128>()
                        };
                        stats.event_count += (t.len() - t.null_count()) as u64;
                        self.watermark.observe(&s.id, max);
                    }
                }
            }
            relations.insert(s.id.clone(), table);
        }
        for st in self.statics.iter_mut() {
            let (table, bad) = st.table(entry.batch_timestamp_ms).await?;
            rejected.extend(bad);
            relations.insert(st.id.clone(), table);
        }
        progress.duration("getBatch", t_read.elapsed());
        stats.rejected = rejected.len() as u64;
        // A replayed batch may have quarantined records before the crash: those are not
        // written twice.
        let mut already_quarantined = if replaying && !self.rebuilding {
            self.quarantined_by_batch(batch_id)?
        } else {
            HashMap::new()
        };
        if !rejected.is_empty() {
            self.quarantine(&rejected, batch_id, &mut already_quarantined, true)?;
        }
        if !ruled_out.is_empty() {
            stats.rejected += ruled_out.len() as u64;
            self.quarantine(&ruled_out, batch_id, &mut already_quarantined, false)?;
        }

        // Transform.
        let t_exec = Instant::now();
        let ctx_base = OpContext {
            late_watermark_us: entry.late_watermark_ms * 1000,
            evict_watermark_us: entry.batch_watermark_ms * 1000,
            has_watermark: false,
            output_mode: OutputMode::Append,
            accept_late: false,
            processing_time_ms: entry.batch_timestamp_ms,
        };
        let output_modes = output_modes(&self.plan);
        let mut late_routes: Vec<(LatePolicy, RecordBatch, String)> = Vec::new();
        let mut duplicates: Vec<super::join::DuplicateRows> = Vec::new();
        let mut state_progress = Vec::new();
        for t in self.transforms.iter_mut() {
            let mut local: HashMap<String, Table> = HashMap::new();
            for (port, node) in &t.inputs {
                let table = relations.get(node).cloned().ok_or_else(|| {
                    Error::new(
                        &codes::PLAN_INVALID,
                        format!("`{}` reads `{node}`, which nothing produced", t.id),
                    )
                })?;
                local.insert(port.clone(), table);
            }
            if let Some(task) = &t.opaque {
                let backend: &dyn etlantic_core::plugin::Backend = match &t.backend {
                    Some(b) => b.as_ref(),
                    None => plugin::backend("datafusion").expect("this crate registers it"),
                };
                // A backend is handed relations by name; the task maps its ports to them.
                let inputs = t
                    .inputs
                    .iter()
                    .map(|(port, node)| (node.clone(), local[port].clone()))
                    .collect();
                let mut out = backend
                    .execute_batch(
                        std::slice::from_ref(task),
                        inputs,
                        std::slice::from_ref(&task.id),
                    )
                    .await?;
                relations.insert(
                    t.id.clone(),
                    out.swap_remove(&task.id).expect("requested output"),
                );
                continue;
            }
            let mode = output_modes.get(&t.id).copied().unwrap_or_default();
            for unit in t.units.iter_mut() {
                match unit {
                    Unit::Stateless {
                        steps,
                        outputs,
                        prepared,
                    } => {
                        prepared
                            .run(steps, outputs, &mut local, &t.parameters)
                            .await?;
                    }
                    Unit::Stateful(s) if s.secondary.is_some() => {
                        // Two inputs: a stream-stream join (see `super::join`).
                        let ctx = OpContext {
                            has_watermark: s.watermarked,
                            output_mode: s.mode(mode),
                            ..ctx_base
                        };
                        let run = super::join::run_pair_unit(s, &local, &ctx)?;
                        stats.late += run.late_count;
                        late_routes.extend(run.late_routes);
                        duplicates.extend(run.duplicates);
                        state_progress.push(run.progress);
                        local.insert(s.step.id.clone(), run.output);
                    }
                    Unit::Stateful(s) => {
                        let input = local.get(&s.step.target).cloned().ok_or_else(|| {
                            Error::new(
                                &codes::PLAN_INVALID,
                                format!("unknown relation `{}`", s.step.target),
                            )
                        })?;
                        let (originals, prepared) =
                            prepare_input(&input, &s.prepare, &mut s.prepared).await?;
                        // After a stream-stream join its event time may lag the
                        // watermark by the join's time range: both watermarks lag too.
                        let ctx = OpContext {
                            late_watermark_us: ctx_base
                                .late_watermark_us
                                .saturating_sub(s.watermark_lag_us),
                            evict_watermark_us: ctx_base
                                .evict_watermark_us
                                .saturating_sub(s.watermark_lag_us),
                            has_watermark: s.watermarked,
                            output_mode: s.mode(mode),
                            accept_late: s.late_policy == LatePolicy::Accept,
                            ..ctx_base
                        };
                        let t_op = Instant::now();
                        let out = s.op.process(&prepared, &ctx)?;
                        stats.late += out.late_count;
                        // Late rows are routed as they entered the step, not as the
                        // operator's prepared input (keys, `__arg*`, `__time`).
                        let late = if s.prepare.is_empty() {
                            out.late
                        } else {
                            gather_rows(&originals, &out.late_index)?
                        };
                        if let Some(late) = late {
                            late_routes.push((s.late_policy.clone(), late, s.sources.join(",")));
                        }
                        let m = s.op.metrics();
                        state_progress.push(StateProgress {
                            operator_name: s.op.name().to_string(),
                            id: s.id.clone(),
                            metrics: m,
                            dropped_by_watermark: out.late_count,
                            time_ms: t_op.elapsed().as_millis() as u64,
                        });
                        local.insert(
                            s.step.id.clone(),
                            Table::new(s.op.output_schema(), out.rows),
                        );
                    }
                }
            }
            let output = local.remove(&t.output).ok_or_else(|| {
                Error::new(
                    &codes::PLAN_INVALID,
                    format!("`{}` produced no `{}`", t.id, t.output),
                )
            })?;
            relations.insert(t.id.clone(), output);
        }
        progress.duration("queryPlanning", std::time::Duration::ZERO);

        // Rows a join rejected for repeating a unique key.
        for d in &duplicates {
            let records = duplicate_records(d)?;
            stats.rejected += records.len() as u64;
            self.quarantine(&records, batch_id, &mut already_quarantined, true)?;
        }
        // Late rows that the policy routes somewhere.
        let mut side: HashMap<usize, Vec<RecordBatch>> = HashMap::new();
        for (policy, late, sources) in late_routes {
            match policy {
                LatePolicy::Drop | LatePolicy::Accept => {}
                LatePolicy::Quarantine => {
                    let records = late_records(&late, &sources, entry.late_watermark_ms)?;
                    stats.rejected += records.len() as u64;
                    self.quarantine(&records, batch_id, &mut already_quarantined, true)?;
                }
                LatePolicy::SideOutput { sink } => {
                    if let Some(&i) = self.side_sinks.get(&sink) {
                        side.entry(i).or_default().push(late);
                    }
                }
            }
        }

        // A batch run again to rebuild state ends here: its sinks, state and commit were
        // written by its first run.
        if self.rebuilding {
            return Ok(());
        }
        // The state snapshots are written while the sinks write: both must be durable
        // before the commit of N and neither depends on the other, so their fsyncs overlap.
        // A crash before the commit leaves a snapshot of an uncommitted batch, which the
        // restart overwrites when it re-runs the batch.
        // An operator with a changelog writes its changes, and a whole snapshot every
        // `FULL_SNAPSHOT_EVERY` versions once its changes since the last one are half
        // its state (`super::checkpoint::whole_snapshot_due`).
        // That snapshot is taken now but written in the background after the changes
        // are durable (like the maintenance thread of Spark's RocksDB changelog
        // checkpointing): the changes alone make the version recoverable, so the commit
        // never waits for it. One is in flight at a time; while one is, the next is
        // skipped and the chain just grows longer.
        let version = batch_id + 1;
        // Under a state checkpoint interval, only a micro-batch that comes once the
        // interval has passed writes the state (a restart rebuilds the rest); the changes
        // of a changelog operator then span every micro-batch since the last write.
        let stateless = !self
            .transforms
            .iter()
            .any(|t| t.units.iter().any(|u| matches!(u, Unit::Stateful(_))));
        let write_state = stateless
            || self.plan.profile.state_checkpoint_interval.is_none_or(|d| {
                entry
                    .batch_timestamp_ms
                    .saturating_sub(self.state_written_ms)
                    >= d.as_millis()
            });
        let since = self.state_version;
        let previous_done = self
            .background_snapshot
            .as_ref()
            .is_none_or(|h| h.is_finished());
        if previous_done {
            self.finish_background_snapshot().await?;
        }
        let mut snapshots = Vec::new();
        let mut background = Vec::new();
        if write_state {
            self.state_writes += 1;
        }
        for t in self.transforms.iter_mut().filter(|_| write_state) {
            for u in t.units.iter_mut() {
                if let Unit::Stateful(s) = u {
                    let state = match s.op.changes()? {
                        Some(changes) => {
                            s.changes_since_whole += changes.num_rows() as u64;
                            let due = super::checkpoint::whole_snapshot_due(
                                self.state_writes,
                                s.changes_since_whole,
                                s.op.metrics().rows_total,
                            );
                            if due && !self.opts.background_snapshots {
                                s.changes_since_whole = 0;
                                StateWrite::Whole(s.op.snapshot()?)
                            } else {
                                if due && previous_done {
                                    s.changes_since_whole = 0;
                                    background.push((s.id.clone(), s.op.snapshot()?));
                                }
                                StateWrite::Changes(changes)
                            }
                        }
                        None => StateWrite::Logged(s.op.snapshot()?),
                    };
                    snapshots.push((s.id.clone(), state));
                }
            }
        }
        let state_write = (!snapshots.is_empty()).then(|| {
            let files = self.checkpoint.state_files();
            tokio::task::spawn_blocking(move || -> Result<()> {
                let mut logged = Vec::new();
                for (id, state) in &snapshots {
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

        // Sinks.
        let t_sink = Instant::now();
        let mut sink_rows = 0u64;
        let fail_after_first_sink = self.fail == Some((FailPoint::AfterSink, batch_id));
        let mut sink_ruled_out: Vec<RejectedRecord> = Vec::new();
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
                    &mut stats,
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
                .map_err(|e| {
                    e.map_diagnostics(|d| {
                        d.help(format!(
                            "Batch {batch_id} is not committed; it runs again on restart."
                        ))
                    })
                })?;
            if let WriteOutcome::Written { rows } = outcome {
                sink_rows += rows;
            }
            let _ = &s.asset;
            if i == 0 && fail_after_first_sink {
                eprintln!("ETLANTIC_FAIL_POINT reached: AfterSink of batch {batch_id}; aborting");
                std::process::abort();
            }
        }
        stats.output_rows = sink_rows;
        if !sink_ruled_out.is_empty() {
            stats.rejected += sink_ruled_out.len() as u64;
            self.quarantine(&sink_ruled_out, batch_id, &mut already_quarantined, false)?;
        }
        progress.duration("addBatch", t_exec.elapsed());
        let _ = t_sink;

        // State, watermark, commit.
        let t_commit = Instant::now();
        if let Some(write) = state_write {
            write.await.map_err(|e| {
                Error::new(
                    &codes::ENGINE_ERROR,
                    format!("writing the state of batch {batch_id} failed: {e}"),
                )
            })??;
        }
        if write_state {
            self.state_version = version;
            self.state_written_ms = entry.batch_timestamp_ms;
        }
        if !background.is_empty() {
            let files = self.checkpoint.state_files();
            self.background_snapshot = Some(tokio::task::spawn_blocking(move || {
                for (id, state) in &background {
                    files.write(id, version, state)?;
                }
                Ok(())
            }));
        }
        self.maybe_fail(FailPoint::AfterState, batch_id);
        let batch_watermark = entry.batch_watermark_ms;
        let moved = self.watermark.advance();
        self.checkpoint.write_commit(
            batch_id,
            &CommitEntry {
                next_batch_watermark_ms: self.watermark.current_ms(),
                max_event_time_ms: self.watermark.max_event_times().clone(),
                state_version: (self.state_version != version).then_some(self.state_version),
            },
        )?;
        progress.duration("commitOffsets", t_commit.elapsed());
        self.maybe_fail(FailPoint::AfterCommit, batch_id);
        for (i, s) in self.sources.iter_mut().enumerate() {
            if let Some(end) = entry.sources.get(&s.id).and_then(|r| r.end.clone()) {
                let end = Offset(end);
                // A source may release only what no restart reads again: up to the
                // batch whose state is durable, once its commit is.
                if write_state {
                    self.pending_release.retain(|(at, _)| *at != i);
                    self.pending_release.push((i, end.clone()));
                }
                s.position = Some(end);
            }
        }
        self.prev_watermark_ms = batch_watermark;
        self.next_batch = batch_id + 1;
        self.batches_run += 1;
        self.needs_no_data =
            !no_data && moved && self.plan.profile.no_data_batches && self.has_watermarked_state();

        // Progress.
        // Like Spark's, the trigger's time includes asking the sources for new data.
        let latest_offset = std::mem::take(&mut self.latest_offset_took);
        progress.duration("latestOffset", latest_offset);
        progress.duration("triggerExecution", t_start.elapsed() + latest_offset);
        let sources_progress: Vec<SourceProgress> = self
            .sources
            .iter()
            .map(|s| {
                let r = entry.sources.get(&s.id);
                SourceProgress {
                    description: format!("{} ({})", s.id, s.asset),
                    start_offset: r.and_then(|r| r.start.clone()),
                    end_offset: r.and_then(|r| r.end.clone()),
                    num_input_rows: stats.input_rows.get(&s.id).copied().unwrap_or(0),
                    lost: stats.lost.remove(&s.id).unwrap_or_default(),
                }
            })
            .collect();
        let custom = super::progress::custom_metrics_of(&self.transforms);
        let mut value = progress.finish(
            &stats_view(
                &stats,
                self.watermark.is_active().then_some(batch_watermark),
            ),
            sources_progress,
            state_progress,
            self.sinks
                .iter()
                .map(|s| s.description.clone())
                .collect::<Vec<_>>()
                .join(", "),
            stats.output_rows,
            self.opts.checkpoint.display().to_string(),
            self.watermark
                .is_active()
                .then(|| self.watermark.current_ms()),
        );
        super::progress::attach_custom_metrics(&mut value, &custom);
        if !stats.quality.is_empty() {
            value["quality"] = super::progress::quality_json(&stats.quality);
        }
        self.checkpoint.append_progress(&value)?;
        if let Some(l) = &self.opts.on_progress {
            l(&value);
        }
        self.last_progress = Some(value);
        Ok(())
    }

    /// Identifies a quarantined record of a batch: its code, reason, field, position and
    /// raw text (run ids differ between attempts).
    fn quarantine_key(line: &Value) -> String {
        json!([
            line["code"],
            line["reason"],
            line["field"],
            line["position"],
            line["raw"]
        ])
        .to_string()
    }

    /// [`Self::quarantine_key`] of the line `record` is written as.
    fn record_key(record: &RejectedRecord) -> String {
        json!([
            record.code,
            record.reason,
            record.field,
            record.position,
            record.raw
        ])
        .to_string()
    }

    /// What this query already quarantined for `batch_id` (key → count).
    fn quarantined_by_batch(&self, batch_id: u64) -> Result<HashMap<String, usize>> {
        let mut out = HashMap::new();
        let Some(path) = self.quarantine.as_ref() else {
            return Ok(out);
        };
        for line in etlantic_sinks::quarantine::read_quarantine_if_any(path)? {
            if line["query_id"].as_str() == Some(self.query_id.as_str())
                && line["batch_id"].as_u64() == Some(batch_id)
            {
                *out.entry(Self::quarantine_key(&line)).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// Writes `records` to the quarantine output, skipping what a crashed attempt of the
    /// batch already wrote. With `follow_on_error`, records that break their contract stop
    /// the query instead when `on_error` is `fail` (records a quality rule's `quarantine`
    /// policy routed here are written either way).
    fn quarantine(
        &mut self,
        records: &[RejectedRecord],
        batch_id: u64,
        already: &mut HashMap<String, usize>,
        follow_on_error: bool,
    ) -> Result<()> {
        if self.rebuilding {
            return Ok(());
        }
        // `on_error: fail` is about records that break their contract; late events go to
        // the quarantine because their own policy says so.
        let contract_breaks = records.iter().any(|r| r.code != codes::LATE_EVENT.code);
        if follow_on_error && contract_breaks && self.plan.profile.on_error == OnError::Fail {
            let mut d = Diagnostics::new();
            d.push(Diagnostic::new(
                &codes::BAD_RECORDS_FAIL,
                format!("{} record(s) broke their contract in batch {batch_id} and the policy is `fail`", records.len()),
            ));
            for r in records.iter().take(20) {
                d.push(Diagnostic::new(
                    codes::lookup(&r.code).unwrap_or(&codes::RECORD_UNPARSABLE),
                    format!("{}: {}", r.position, r.reason),
                ));
            }
            return Err(Error(d));
        }
        let Some(path) = &self.quarantine else {
            return Ok(());
        };
        use etlantic_sinks::quarantine::QuarantineWriter;
        let mut lines = Vec::with_capacity(records.len());
        for r in records {
            // Only a replayed batch has lines of a crashed attempt to skip.
            if !already.is_empty() {
                if let Some(n) = already.get_mut(&Self::record_key(r)).filter(|n| **n > 0) {
                    *n -= 1;
                    continue;
                }
            }
            lines.push(QuarantineWriter::line(
                r,
                &self.run_id,
                Some(batch_id),
                Some(&self.query_id),
            ));
        }
        let mut w = QuarantineWriter::open(path)?;
        w.write_text_lines(&lines).map(|_| ())
    }
}

fn late_records(
    late: &RecordBatch,
    sources: &str,
    watermark_ms: i64,
) -> Result<Vec<RejectedRecord>> {
    let reason = format!(
        "late event: behind the watermark {}",
        chrono::DateTime::from_timestamp_millis(watermark_ms)
            .map(|d| d.to_rfc3339())
            .unwrap_or_default()
    );
    rows_as_records(late, sources, &codes::LATE_EVENT, &reason, None)
}

/// The rows a stream-stream join rejected for repeating a unique key, as quarantine
/// records: they break their contract's uniqueness (`ETL704`).
fn duplicate_records(d: &super::join::DuplicateRows) -> Result<Vec<RejectedRecord>> {
    let keys = d.keys.join(", ");
    let reason = format!(
        "duplicate key ({keys}): its contract declares it unique and a stream-stream join \
         still holds an earlier row of it; the join went on without this row"
    );
    rows_as_records(
        &d.rows,
        &d.sources,
        &codes::RECORD_RULE_VIOLATION,
        &reason,
        d.keys.first().cloned(),
    )
}

/// One quarantine record per row of `rows` (the row as JSON), all with `code` and
/// `reason`.
fn rows_as_records(
    rows: &RecordBatch,
    sources: &str,
    code: &codes::CodeInfo,
    reason: &str,
    field: Option<String>,
) -> Result<Vec<RejectedRecord>> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(rows).map_err(io)?;
        w.finish().map_err(io)?;
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text
        .lines()
        .map(|line| RejectedRecord {
            code: code.code.to_string(),
            reason: reason.to_string(),
            field: field.clone(),
            position: SourcePosition {
                asset: sources.to_string(),
                ..Default::default()
            },
            raw: line.to_string(),
        })
        .collect())
}

fn stats_view(stats: &BatchStats, watermark_ms: Option<i64>) -> super::progress::BatchView {
    super::progress::BatchView {
        num_input_rows: stats.input_rows.values().sum(),
        rejected: stats.rejected,
        late: stats.late,
        event_min_us: stats.event_min_us,
        event_max_us: stats.event_max_us,
        event_avg_us: (stats.event_count > 0)
            .then(|| (stats.event_sum / stats.event_count as i128) as i64),
        watermark_ms,
    }
}

/// The output mode each transformation emits in: that of the sink downstream of it,
/// through any stateless transformations in between (an aggregation feeding an SQL
/// region that feeds an update-mode sink emits updates). With several sinks downstream,
/// the last declared wins.
fn output_modes(plan: &PipelinePlan) -> HashMap<String, OutputMode> {
    let mut modes = HashMap::new();
    for sink in &plan.sinks {
        let mut stack = vec![sink.input.as_str()];
        let mut seen = std::collections::HashSet::new();
        while let Some(node) = stack.pop() {
            if !seen.insert(node) {
                continue;
            }
            if let Some(t) = plan.transforms.iter().find(|t| t.id == node) {
                modes.insert(t.id.clone(), sink.output_mode);
                stack.extend(t.inputs.values().map(String::as_str));
            }
        }
    }
    modes
}

/// A registered (static) backend used where an owned one is expected.
struct BackendRef(&'static dyn etlantic_core::plugin::Backend);

#[async_trait::async_trait]
impl etlantic_core::plugin::Backend for BackendRef {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn capabilities(&self) -> etlantic_core::plugin::BackendCapabilities {
        self.0.capabilities()
    }

    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        self.0.output_schema(step, inputs)
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        self.0.execute_batch(steps, inputs, outputs).await
    }
}
