//! Opening a plan's sources and sinks: the asset's binding with its secret references
//! resolved, the provider of its scheme from the plugin registry, the connector created
//! for the asset's contract. Batch runs and streaming queries open them alike.

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{self, Sink, SinkContext, Source, SourceContext};
use etlantic_core::storage::{Storage, StorageOptions};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use std::path::Path;
use std::sync::Arc;

/// `asset`'s binding in `plan`, its `${...}` references resolved by `resolve`.
fn binding(
    plan: &PipelinePlan,
    asset: &str,
    resolve: &dyn Fn(&str) -> Result<String>,
) -> Result<BindingUri> {
    let text = &plan
        .assets
        .get(asset)
        .ok_or_else(|| Error::new(&codes::PLAN_INVALID, format!("no asset `{asset}`")))?
        .binding;
    BindingUri::parse(&resolve(text)?)
}

/// The source of `asset`, read in `mode` (a streaming source keeps what it must
/// remember across restarts in `state`, the checkpoint's `sources/<n>/`); `ETL204` when no linked plugin handles its
/// scheme.
pub fn open_source(
    plan: &PipelinePlan,
    asset: &str,
    resolve: &dyn Fn(&str) -> Result<String>,
    root: &Path,
    mode: ExecutionMode,
    state: Option<Arc<dyn Storage>>,
    storage_options: &StorageOptions,
) -> Result<Box<dyn Source>> {
    let contract = plan.asset_contract(asset)?;
    let uri = binding(plan, asset, resolve)?;
    let provider = plugin::source_provider(&uri.scheme).ok_or_else(|| {
        Error::new(
            &codes::UNKNOWN_SCHEME,
            format!("no source plugin for `{}`", uri.scheme),
        )
    })?;
    provider.create(SourceContext {
        storage_options: storage_options.clone(),
        asset: asset.to_string(),
        uri,
        schema: contract.arrow_schema(),
        contract: Some(contract),
        root: root.to_path_buf(),
        mode,
        state,
    })
}

/// The sink of `asset`, written in `mode` and `output_mode`; `ETL204` when no linked
/// plugin handles its scheme.
pub fn open_sink(
    plan: &PipelinePlan,
    asset: &str,
    resolve: &dyn Fn(&str) -> Result<String>,
    root: &Path,
    mode: ExecutionMode,
    output_mode: OutputMode,
    storage_options: &StorageOptions,
) -> Result<Box<dyn Sink>> {
    let contract = plan.asset_contract(asset)?;
    let uri = binding(plan, asset, resolve)?;
    let provider = plugin::sink_provider(&uri.scheme).ok_or_else(|| {
        Error::new(
            &codes::UNKNOWN_SCHEME,
            format!("no sink plugin for `{}`", uri.scheme),
        )
    })?;
    provider.create(SinkContext {
        storage_options: storage_options.clone(),
        asset: asset.to_string(),
        uri,
        schema: contract.arrow_schema(),
        contract: Some(contract),
        root: root.to_path_buf(),
        mode,
        output_mode,
    })
}
