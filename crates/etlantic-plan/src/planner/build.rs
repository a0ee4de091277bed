//! Building the sealed plan once every phase passed: assets, sources with their
//! watermark rows, regions of consecutive steps on one backend, the transitions
//! between them, transformations, sinks and provenance.

use super::{source_guarantee, Planner};
use crate::plan::*;
use etlantic_core::diagnostics::Diagnostics;
use etlantic_core::plugin::{self, RegionKind, StepLogic};
use etlantic_core::streaming::ExecutionMode;
use indexmap::IndexMap;
use std::collections::HashMap;

impl Planner<'_> {
    pub(super) fn build(&mut self, guarantees: Vec<PairGuarantee>) -> PipelinePlan {
        let pl = &self.p.pipeline;
        let prof = &self.p.profile;
        let mode = prof.mode;
        let mut assets = IndexMap::new();
        for (name, c) in &self.contracts {
            let Some(uri) = self.bindings.get(name) else {
                continue;
            };
            assets.insert(
                name.clone(),
                PlanAsset {
                    contract: PlanContract {
                        id: c.id().to_string(),
                        version: c.version().to_string(),
                        object: c.object.clone(),
                        document: c.canonical_json(),
                    },
                    binding: prof.bindings[name].clone(),
                    scheme: uri.scheme.clone(),
                    schema: schema_spec(&c.arrow_schema()),
                },
            );
        }
        let mut watermark_rows = if mode == ExecutionMode::Streaming {
            let columns: HashMap<String, Vec<String>> = self
                .schemas
                .iter()
                .map(|(id, s)| {
                    (
                        id.clone(),
                        s.fields().iter().map(|f| f.name().clone()).collect(),
                    )
                })
                .collect();
            let portable: HashMap<String, crate::watermark_rows::PortableLogic<'_>> = self
                .logic
                .iter()
                .filter_map(|(id, (logic, _))| match logic {
                    StepLogic::Portable {
                        plan,
                        parameters,
                        output,
                    } => Some((
                        id.clone(),
                        crate::watermark_rows::PortableLogic {
                            plan,
                            parameters,
                            output,
                        },
                    )),
                    _ => None,
                })
                .collect();
            crate::watermark_rows::watermark_rows(self.p, &self.order, &columns, &portable)
        } else {
            IndexMap::new()
        };
        let sources = pl
            .sources
            .iter()
            .map(|s| {
                let uri = &self.bindings[&s.asset];
                let guarantee = source_guarantee(uri);
                PlanSource {
                    id: s.id.clone(),
                    asset: s.asset.clone(),
                    event_time: s.event_time.clone(),
                    watermark: s.watermark,
                    late_events: s.late_events.clone(),
                    read_limit: s.read_limit.clone(),
                    guarantee,
                    static_refresh: s.static_refresh,
                    watermark_rows: watermark_rows
                        .swap_remove(&s.id)
                        .flatten()
                        .map(|e| e.encode()),
                }
            })
            .collect();
        // Regions: consecutive transformations (in execution order) on one backend.
        let kind = match mode {
            ExecutionMode::Batch => RegionKind::Batch,
            ExecutionMode::Streaming => RegionKind::Streaming,
        };
        let mut regions: Vec<Region> = Vec::new();
        let mut region_of: HashMap<String, String> = HashMap::new();
        for id in &self.order {
            let b = self.backend_of[id];
            let backend = b.name().to_string();
            let location = self.location_of.get(id).cloned();
            let start_new = regions
                .last()
                .map(|r| r.backend != backend || r.location != location)
                .unwrap_or(true);
            if start_new {
                let sql = b.capabilities().region_kinds.contains(&RegionKind::Sql);
                regions.push(Region {
                    id: format!("r{}", regions.len()),
                    kind: if sql { RegionKind::Sql } else { kind },
                    backend,
                    steps: vec![],
                    inputs: vec![],
                    outputs: vec![],
                    location,
                    in_place: IndexMap::new(),
                });
            }
            let r = regions.last_mut().expect("just pushed");
            r.steps.push(id.clone());
            region_of.insert(id.clone(), r.id.clone());
        }
        let mut transitions = Vec::new();
        let place = |node: &str, region_of: &HashMap<String, String>| -> String {
            match region_of.get(node) {
                Some(r) => format!("region:{r}"),
                None => format!("source:{node}"),
            }
        };
        let sql_regions: Vec<String> = regions
            .iter()
            .filter(|r| r.kind == RegionKind::Sql)
            .map(|r| r.id.clone())
            .collect();
        let materialization = |from: Option<&String>, to: Option<&String>| -> String {
            let is_sql = |r: Option<&String>| r.is_some_and(|r| sql_regions.contains(r));
            match (is_sql(from), is_sql(to)) {
                (true, true) => "query-result→staged-table".into(),
                (false, true) => "arrow→staged-table".into(),
                (true, false) => "query-result→arrow".into(),
                _ => "arrow".into(),
            }
        };
        for id in &self.order {
            let t = pl.transform(id).expect("exists");
            let my_region = region_of[id].clone();
            for r in t.inputs.values() {
                let from = r.from();
                if region_of.get(from) != Some(&my_region) {
                    let ri = regions
                        .iter_mut()
                        .find(|x| x.id == my_region)
                        .expect("region");
                    if !ri.inputs.iter().any(|x| x == from) {
                        ri.inputs.push(from.to_string());
                        let in_place = self.in_place.get(from);
                        if let Some(table) = in_place {
                            ri.in_place.insert(from.to_string(), table.clone());
                        }
                        transitions.push(Transition {
                            from: place(from, &region_of),
                            to: format!("region:{my_region}"),
                            relation: from.to_string(),
                            materialization: match in_place {
                                Some(_) => "in-place".into(),
                                None => materialization(region_of.get(from), Some(&my_region)),
                            },
                        });
                    }
                    if let Some(producer) = region_of.get(from) {
                        let pr = regions
                            .iter_mut()
                            .find(|x| &x.id == producer)
                            .expect("region");
                        if !pr.outputs.iter().any(|x| x == from) {
                            pr.outputs.push(from.to_string());
                        }
                    }
                }
            }
        }
        for s in &pl.sinks {
            if let Some(producer) = region_of.get(&s.input) {
                let pr = regions
                    .iter_mut()
                    .find(|x| &x.id == producer)
                    .expect("region");
                if !pr.outputs.iter().any(|x| x == &s.input) {
                    pr.outputs.push(s.input.clone());
                }
            }
            transitions.push(Transition {
                from: place(&s.input, &region_of),
                to: format!("sink:{}", s.id),
                relation: s.input.clone(),
                materialization: materialization(region_of.get(&s.input), None),
            });
        }
        let transforms = self
            .order
            .iter()
            .map(|id| {
                let t = pl.transform(id).expect("exists");
                PlanTransform {
                    id: id.clone(),
                    inputs: t
                        .inputs
                        .iter()
                        .map(|(p, r)| (p.clone(), r.from().to_string()))
                        .collect(),
                    logic: self.logic[id].1.clone(),
                    backend: self.backend_of[id].name().to_string(),
                    region: region_of[id].clone(),
                    schema: schema_spec(&self.schemas[id]),
                }
            })
            .collect();
        let sinks = pl
            .sinks
            .iter()
            .map(|s| {
                let uri = &self.bindings[&s.asset];
                let guarantee = plugin::sink_provider(&uri.scheme)
                    .and_then(|p| p.capabilities(uri).ok())
                    .map(|c| c.guarantee)
                    .expect("checked in the capability phase");
                PlanSink {
                    id: s.id.clone(),
                    input: s.input.clone(),
                    asset: s.asset.clone(),
                    output_mode: s.output_mode.unwrap_or_default(),
                    write_mode: s.write_mode.unwrap_or_default(),
                    keys: s.keys.clone(),
                    schema: schema_spec(&self.schemas[&s.input]),
                    guarantee,
                }
            })
            .collect();
        let warnings = Diagnostics(
            self.diags
                .iter()
                .filter(|d| !d.is_error())
                .cloned()
                .collect(),
        );
        PipelinePlan {
            format: PLAN_FORMAT.into(),
            pipeline: pl.name.clone(),
            description: pl.description.clone(),
            profile: PlanProfile {
                name: prof.name.clone(),
                application_id: prof.application_id.clone(),
                lineage: prof.lineage.clone(),
                mode,
                on_error: prof.on_error,
                quarantine: prof.quarantine_uri().to_string(),
                trigger: prof.trigger,
                checkpoint: prof.checkpoint.clone(),
                watermark_policy: prof.watermark_policy,
                no_data_batches: prof.no_data_batches,
                require_guarantee: prof.require_guarantee,
                secrets: prof.secrets.clone(),
                storage_options: prof.storage_options.clone(),
                state_ttl: if mode == ExecutionMode::Streaming {
                    prof.state_ttl.clone()
                } else {
                    IndexMap::new()
                },
                state_checkpoint_interval: prof
                    .state_checkpoint_interval
                    .filter(|_| mode == ExecutionMode::Streaming),
                state_store: prof.state_store.clone(),
                state_memory_limit: prof.state_memory_limit,
                state_snapshot_every: prof.state_snapshot_every,
                state_local_dir: prof.state_local_dir.clone(),
                quality_policies: prof.quality_policies.clone(),
            },
            assets,
            sources,
            transforms,
            sinks,
            regions,
            transitions,
            guarantees,
            warnings,
            provenance: Provenance {
                pipeline_file: self.p.pipeline_file.clone(),
                profile_file: self.p.profile_file.clone(),
                contracts: self.contract_files.clone(),
                plans: self.plan_files.clone(),
            },
            fingerprint: String::new(),
        }
        .seal()
    }
}
