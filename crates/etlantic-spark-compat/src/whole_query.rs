//! Spark as a whole-query backend of the runtime: a streaming pipeline whose every
//! transformation the planner placed on Spark runs as one Structured Streaming query at
//! the region's Spark Connect endpoint, with the plan's trigger and checkpoint.

use crate::backend::{endpoint_url, BACKEND_NAME};
use crate::streaming::{SparkQueryOptions, SparkSink, SparkStreamingQuery};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::profile::OnError;
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::{PipelinePlan, Region};
use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::whole_query::{WholeQueryBackend, WholeQueryOptions, WholeQueryRegistration};

/// Runs streaming queries whole on Spark (registered with the runtime as `spark`).
pub struct SparkWholeQuery;

inventory::submit! { WholeQueryRegistration(&SparkWholeQuery) }

impl WholeQueryBackend for SparkWholeQuery {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn run(
        &self,
        plan: &PipelinePlan,
        region: &Region,
        opts: &WholeQueryOptions,
        on_progress: &dyn Fn(QueryProgress),
    ) -> Result<String> {
        let place = region.location.as_deref().ok_or_else(|| {
            Error::new(
                &codes::REGION_LOCATION,
                format!("region {} runs on Spark but has no endpoint", region.id),
            )
            .with_help(
                "Name the endpoint under `endpoints:` in the profile (e.g. `spark: sc://host:15002`).",
            )
        })?;
        let url = endpoint_url(&BindingUri::parse(&(opts.resolve)(place)?)?)?;
        let options = SparkQueryOptions {
            url,
            root: opts.root.clone(),
            checkpoint: opts.checkpoint.clone(),
            sink: SparkSink::Binding,
            trigger: plan.profile.trigger.unwrap_or_default(),
            default_max_files: None,
            fail_on_bad_records: plan.profile.on_error == OnError::Fail,
        };
        let query = SparkStreamingQuery::start_with(plan, &options)?;
        // A record that does not read as a progress record would leave the run's report
        // short: the first such failure fails the run once the query has stopped.
        let unreadable = std::cell::RefCell::new(None);
        query.drive(
            &opts.stop,
            opts.max_batches,
            &|record| match QueryProgress::from_json(record) {
                Ok(progress) => on_progress(progress),
                Err(e) => {
                    unreadable.borrow_mut().get_or_insert(e);
                }
            },
        )?;
        if let Some(e) = unreadable.into_inner() {
            return Err(e.map_diagnostics(|d| {
                d.help("Spark's progress record (StreamingQueryProgress) has a member of an unexpected type; the query's output is committed, but its figures are not in the report.")
            }));
        }
        Ok(query.run_id().to_string())
    }
}
