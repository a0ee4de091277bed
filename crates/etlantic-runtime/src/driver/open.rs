//! Starting a query: the checkpoint and its metadata, the sources and sinks, the
//! engine's program.

use super::{fail_point, SinkRt, SourceRt, StreamingOptions, StreamingQuery};
use crate::checkpoint::{Checkpoint, Metadata};
use crate::connect::{open_sink, open_source};
use crate::engine::{ProgramContext, ProgramSource};
use crate::quality::QualityGate;
use crate::quarantine::Quarantine;
use crate::secrets::Scrubber;
use crate::static_source::StaticSource;
use crate::watermark::{MeasuredRows, WatermarkTracker};
use chrono::Utc;
use etlantic_core::canonical;
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::ir::Expr;
use etlantic_core::plugin;
use etlantic_core::streaming::{ExecutionMode, LatePolicy};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::{PipelinePlan, PlanLogic};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};

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

/// Opens the sinks of `plan` for a run in `mode`, each with its contract's schema and
/// quality rules.
pub(super) fn open_sinks(
    plan: &PipelinePlan,
    resolve: &dyn Fn(&str) -> Result<String>,
    root: &std::path::Path,
    mode: ExecutionMode,
    storage_options: &etlantic_core::storage::StorageOptions,
) -> Result<Vec<SinkRt>> {
    let mut sinks = Vec::new();
    for s in &plan.sinks {
        let contract = plan.asset_contract(&s.asset)?;
        let sink = open_sink(
            plan,
            &s.asset,
            resolve,
            root,
            mode,
            s.output_mode,
            storage_options,
        )?;
        sinks.push(SinkRt {
            id: s.id.clone(),
            input: s.input.clone(),
            sink,
            output_mode: s.output_mode,
            schema: contract.arrow_schema(),
            description: etlantic_core::uri::redact(&plan.assets[&s.asset].binding),
            gate: QualityGate::for_asset(plan, &s.asset, contract.arrow_schema(), false)?,
        });
    }
    Ok(sinks)
}

/// Gives every stateful operator of `program` its state store, when the profile's
/// `state_store` is not `memory`: each operator its own, with a working copy under
/// `state_local_dir/<query id>/<operator>` and its place in the checkpoint under
/// `state-store/<operator>`, sharing the query's `state_memory_limit` evenly. A checkpoint
/// whose state another store wrote is refused (`ETL804`), as is an unknown store
/// (`ETL434`) and an operator that cannot use it (`ETL435`).
fn open_state_stores(
    plan: &PipelinePlan,
    opts: &StreamingOptions,
    checkpoint: &Checkpoint,
    metadata: &Metadata,
    program: &mut dyn crate::engine::MicroBatchProgram,
) -> Result<()> {
    use crate::state_store::{provider, StateStoreRegistration, StoreContext};
    use etlantic_core::profile::{
        DEFAULT_STATE_LOCAL_DIR, DEFAULT_STATE_MEMORY_LIMIT, MEMORY_STATE_STORE,
    };
    if !program.has_state() {
        return Ok(());
    }
    let wanted = plan.profile.state_store.as_str();
    if metadata.state_store != wanted {
        return Err(Diagnostic::new(
            &codes::STATE_STORE_CHANGED,
            format!(
                "checkpoint {} holds state written by the `{}` state store, and the profile's `state_store` is `{wanted}`",
                opts.checkpoint,
                metadata.state_store
            ),
        )
        .into());
    }
    if wanted == MEMORY_STATE_STORE {
        return Ok(());
    }
    let Some(store_provider) = provider(wanted) else {
        let mut linked: Vec<&str> = inventory::iter::<StateStoreRegistration>
            .into_iter()
            .map(|r| r.0.name())
            .collect();
        linked.push(MEMORY_STATE_STORE);
        linked.sort_unstable();
        return Err(Diagnostic::new(
            &codes::STATE_STORE_UNKNOWN,
            format!(
                "the profile's `state_store` is `{wanted}`, which is not linked into this program (linked: {})",
                linked.join(", ")
            ),
        )
        .at("state_store")
        .into());
    };
    let local_root = opts
        .root
        .join(
            plan.profile
                .state_local_dir
                .as_deref()
                .unwrap_or(DEFAULT_STATE_LOCAL_DIR),
        )
        .join(&metadata.id);
    let mut operators = program.operators();
    let limit = plan
        .profile
        .state_memory_limit
        .unwrap_or(DEFAULT_STATE_MEMORY_LIMIT)
        .as_bytes();
    let each = (limit / operators.len().max(1) as u64) as usize;
    for op in operators.iter_mut() {
        let id = op.id().to_string();
        let store = store_provider.open(StoreContext {
            operator: id.clone(),
            local_dir: local_root.join(&id),
            checkpoint: checkpoint.state_store_dir(&id),
            memory_limit_bytes: each,
            snapshot_every: plan.profile.state_snapshot_every.map(|n| n.get()),
        })?;
        op.use_store(store)?;
    }
    Ok(())
}

/// The application of the query: the profile's `application_id`, else the one the
/// checkpoint keeps, else a new one; the checkpoint's metadata is made to name it.
fn keep_application_id(
    plan: &PipelinePlan,
    checkpoint: &Checkpoint,
    metadata: &mut Metadata,
) -> Result<String> {
    let id = plan
        .profile
        .application_id
        .clone()
        .or_else(|| metadata.application_id.clone())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if metadata.application_id.as_deref() != Some(id.as_str()) {
        metadata.application_id = Some(id.clone());
        checkpoint.write_metadata(metadata)?;
    }
    Ok(id)
}

/// What a query opens besides its checkpoint.
struct Opened {
    sources: Vec<SourceRt>,
    statics: Vec<StaticSource>,
    sinks: Vec<SinkRt>,
    side_sinks: HashMap<String, usize>,
    program: Box<dyn crate::engine::MicroBatchProgram>,
    watermark: WatermarkTracker,
    quarantine: Quarantine,
}

/// Records in the status record that run `ids` failed to start with `e` (its secrets
/// already scrubbed), and gives `e` back.
fn start_failed(
    checkpoint: &Checkpoint,
    ids: crate::status::QueryIds,
    plan: &PipelinePlan,
    e: Error,
) -> Error {
    let recorded =
        crate::status::StatusWriter::start(checkpoint.storage(), ids, &plan.pipeline, None)
            .end(Err(&e));
    if let Err(w) = recorded {
        tracing::warn!("the status record was not written: {w}");
    }
    e
}

impl StreamingQuery {
    /// Starts (or resumes) a query: opens the checkpoint, creates sources and sinks,
    /// restores state. Nothing is read yet.
    pub async fn start(plan: &PipelinePlan, opts: StreamingOptions) -> Result<Self> {
        plugin::check_registry()?;
        let engine = crate::engine::engine_for(plan)?;
        if plan.profile.mode != ExecutionMode::Streaming {
            return Err(Error::new(&codes::PLAN_INVALID, "not a streaming plan"));
        }
        let checkpoint = Checkpoint::open_at(&opts.checkpoint, &opts.storage_options)?;
        let compat = compatibility_fingerprint(plan);
        let mut metadata = match checkpoint.metadata()? {
            Some(m) => {
                if m.compatibility != compat {
                    return Err(Diagnostic::new(
                        &codes::CHECKPOINT_INCOMPATIBLE,
                        format!(
                            "checkpoint {} was written by a different query (its sources, logic or sinks changed since plan {})",
                            opts.checkpoint,
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
                    state_store: plan.profile.state_store.clone(),
                    application_id: None,
                };
                checkpoint.write_metadata(&m)?;
                m
            }
        };
        let application_id = keep_application_id(plan, &checkpoint, &mut metadata)?;
        let run_id = uuid::Uuid::new_v4().to_string();
        let ids = crate::status::QueryIds {
            application_id: application_id.clone(),
            query_id: metadata.id.clone(),
            run_id: run_id.clone(),
        };
        // Everything that can fail from here on is recorded in the status record, so
        // `etlantic status` tells a query that cannot start from one that stopped.
        let scrub = Scrubber::for_plan(plan, opts.resolve.as_ref());
        let opened = async {
            let resolve_uri =
                |text: &str| -> Result<BindingUri> { BindingUri::parse(&(opts.resolve)(text)?) };

            // Sources.
            let mut sources = Vec::new();
            let mut statics = Vec::new();
            let mut delays = BTreeMap::new();
            for (n, s) in plan.sources.iter().enumerate() {
                let resolve = opts.resolve.as_ref();
                if let Some(refresh) = s.static_refresh {
                    // Read bounded, like a batch run reads it.
                    let source = open_source(
                        plan,
                        &s.asset,
                        resolve,
                        &opts.root,
                        ExecutionMode::Batch,
                        None,
                        &opts.storage_options,
                    )?;
                    statics.push(StaticSource::new(&s.id, source, refresh));
                    continue;
                }
                let mut source = open_source(
                    plan,
                    &s.asset,
                    resolve,
                    &opts.root,
                    ExecutionMode::Streaming,
                    Some(checkpoint.source_state(n)),
                    &opts.storage_options,
                )?;
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
                    Some(v) => Some(MeasuredRows::new(engine.row_filter(
                        &Expr::decode(v).map_err(|m| {
                            Error::new(
                                &codes::PLAN_INVALID,
                                format!(
                                    "source `{}`: the rows its watermark is measured on: {m}",
                                    s.id
                                ),
                            )
                        })?,
                    )?)),
                    None => None,
                };
                if let (Some(_), Some(d)) = (&event_time, s.watermark) {
                    delays.insert(s.id.clone(), d.as_millis());
                }
                let schema = source.schema();
                sources.push(SourceRt {
                    id: s.id.clone(),
                    asset: s.asset.clone(),
                    source,
                    limit: s.read_limit.clone().unwrap_or_default(),
                    position: None,
                    info: ProgramSource {
                        id: s.id.clone(),
                        schema,
                        event_time,
                        delay_us: s.watermark.map(|d| d.as_micros()),
                        late: s.late_events.clone(),
                        is_static: false,
                    },
                    gate,
                    measured,
                });
            }
            let sinks = open_sinks(
                plan,
                opts.resolve.as_ref(),
                &opts.root,
                ExecutionMode::Streaming,
                &opts.storage_options,
            )?;
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
            let mut program_sources: Vec<ProgramSource> =
                sources.iter().map(|s| s.info.clone()).collect();
            for (st, s) in statics
                .iter()
                .zip(plan.sources.iter().filter(|s| s.static_refresh.is_some()))
            {
                program_sources.push(ProgramSource {
                    id: st.id.clone(),
                    schema: plan.asset_contract(&s.asset)?.arrow_schema(),
                    event_time: None,
                    delay_us: None,
                    late: LatePolicy::Drop,
                    is_static: true,
                });
            }
            let program = engine.compile(ProgramContext {
                plan,
                sources: program_sources,
                root: &opts.root,
                resolve: &resolve_uri,
            })?;
            let mut program = program;
            open_state_stores(plan, &opts, &checkpoint, &metadata, program.as_mut())?;
            let watermark = WatermarkTracker::new(delays, plan.profile.watermark_policy);
            let quarantine = Quarantine::new(
                crate::quarantine::quarantine_location(
                    &(opts.resolve)(&plan.profile.quarantine)?,
                    &opts.root,
                )?,
                opts.storage_options.clone(),
                scrub.clone(),
                &run_id,
                Some(&metadata.id),
                plan.profile.on_error,
            );
            Ok(Opened {
                sources,
                statics,
                sinks,
                side_sinks,
                program,
                watermark,
                quarantine,
            })
        }
        .await;
        let Opened {
            sources,
            statics,
            sinks,
            side_sinks,
            program,
            watermark,
            quarantine,
        } = match opened {
            Ok(o) => o,
            Err(e) => return Err(start_failed(&checkpoint, ids, plan, scrub.error(e))),
        };
        let mut q = StreamingQuery {
            plan: plan.clone(),
            checkpoint: Some(checkpoint),
            application_id,
            query_id: metadata.id,
            run_id,
            sources,
            statics,
            sinks,
            side_sinks,
            program,
            watermark,
            prev_watermark_ms: 0,
            next_batch: 0,
            replay: None,
            needs_no_data: false,
            latest_offset_took: std::time::Duration::ZERO,
            quarantine,
            scrub,
            fail: fail_point(),
            last_progress: None,
            requests_at_last_progress: Default::default(),
            batches_run: 0,
            failed_batch: None,
            state: super::persist::StateWrites::new((opts.clock)()),
            rebuild: None,
            rebuilding: false,
            pending_release: Vec::new(),
            opts,
        };
        let recovered = match q.recover() {
            Ok(()) => q.rebuild_state().await,
            Err(e) => Err(e),
        };
        match recovered {
            Ok(()) => Ok(q),
            Err(e) => Err(start_failed(q.checkpoint()?, ids, plan, q.scrub.error(e))),
        }
    }
}
