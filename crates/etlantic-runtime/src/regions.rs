//! The program of a batch run: the plan's regions, in order, each on its backend.
//!
//! A batch run is the micro-batch driver with one bounded micro-batch and no checkpoint
//! ([`crate::StreamingQuery::start_batch`]). Its transformations are not one engine's
//! compiled program but the planner's regions — a run of steps on DataFusion, then one
//! on Polars, then one inside a database — so [`RegionsProgram`] hands each region's
//! inputs to its backend's [`Backend::execute_batch`] (bound to the region's database
//! with [`Backend::at_location`] when it runs in one) and collects the outputs. It keeps
//! no state, so the checkpoint never asks it for any.

use crate::engine::{BatchTimes, MicroBatchProgram, OperatorState, ProgramRun};
use async_trait::async_trait;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{self, Backend, RegionLocation};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use indexmap::IndexMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The regions of a batch plan, as a stateless [`MicroBatchProgram`].
pub struct RegionsProgram {
    plan: PipelinePlan,
    root: PathBuf,
    resolve: crate::SecretResolver,
}

impl RegionsProgram {
    /// The program of `plan`'s regions; locations resolve their secret references with
    /// `resolve` and relative paths against `root`.
    pub fn new(plan: &PipelinePlan, root: PathBuf, resolve: crate::SecretResolver) -> Self {
        RegionsProgram {
            plan: plan.clone(),
            root,
            resolve,
        }
    }

    /// The sources a region reads where they lie, in its own database: the driver does
    /// not read them.
    pub fn in_place_sources(plan: &PipelinePlan) -> Vec<&str> {
        plan.regions
            .iter()
            .flat_map(|r| r.in_place.keys())
            .map(String::as_str)
            .collect()
    }

    /// `backend` bound to the database `place` that `region` runs in.
    fn located(
        &self,
        region: &etlantic_plan::plan::Region,
        place: &str,
        backend: &dyn Backend,
    ) -> Result<Arc<dyn Backend>> {
        let mut tables = IndexMap::new();
        for (source, table) in &region.in_place {
            let asset = &self
                .plan
                .sources
                .iter()
                .find(|s| &s.id == source)
                .ok_or_else(|| Error::new(&codes::PLAN_INVALID, format!("no source `{source}`")))?
                .asset;
            let schema = self.plan.asset_contract(asset)?.arrow_schema();
            tables.insert(source.clone(), (table.clone(), schema));
        }
        backend.at_location(&RegionLocation {
            uri: BindingUri::parse(&(self.resolve)(place)?)?,
            root: self.root.clone(),
            tables,
        })
    }
}

#[async_trait]
impl MicroBatchProgram for RegionsProgram {
    async fn run(
        &mut self,
        relations: &mut HashMap<String, Table>,
        _times: &BatchTimes,
    ) -> Result<ProgramRun> {
        for region in &self.plan.regions {
            let linked = plugin::backend(&region.backend).ok_or_else(|| {
                Error::new(
                    &codes::NO_BACKEND,
                    format!("backend `{}` is not linked", region.backend),
                )
            })?;
            let located = match &region.location {
                Some(place) => Some(self.located(region, place, linked)?),
                None => None,
            };
            let backend: &dyn Backend = located.as_deref().unwrap_or(linked);
            let steps = region
                .steps
                .iter()
                .map(|id| self.plan.step_task(id))
                .collect::<Result<Vec<_>>>()?;
            let mut inputs = IndexMap::new();
            for name in region
                .inputs
                .iter()
                .filter(|n| !region.in_place.contains_key(*n))
            {
                let table = relations.get(name).cloned().ok_or_else(|| {
                    Error::new(
                        &codes::PLAN_INVALID,
                        format!(
                            "region {} reads `{name}`, which nothing produced",
                            region.id
                        ),
                    )
                })?;
                inputs.insert(name.clone(), table);
            }
            let outputs = backend
                .execute_batch(&steps, inputs, &region.outputs)
                .await?;
            relations.extend(outputs);
        }
        Ok(ProgramRun::default())
    }

    fn operators(&mut self) -> Vec<&mut dyn OperatorState> {
        Vec::new()
    }

    fn has_state(&self) -> bool {
        false
    }

    fn needs_no_data_batch(&self) -> bool {
        false
    }

    fn has_due_work(&self, _watermark_ms: Option<i64>, _now_ms: i64) -> bool {
        false
    }

    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}
