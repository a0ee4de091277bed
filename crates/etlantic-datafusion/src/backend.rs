//! [`DataFusionBackend`]: the `datafusion` batch backend.

use crate::capabilities::{self, BACKEND_NAME};
use crate::error;
use crate::step;
use arrow::datatypes::SchemaRef;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::codes;
use etlantic_core::plugin::{Backend, BackendCapabilities, StepTask};
use etlantic_core::Result;
use indexmap::IndexMap;

/// The embedded batch engine on Apache DataFusion.
///
/// Runs portable DTCS plans (compiled to DataFusion logical plans), SQL steps (DataFusion
/// SQL over tables named after the input ports) and registered
/// [`TransformImpl`](etlantic_core::plugin::TransformImpl)s for this backend. Every step
/// runs in its own single-partition session; its result is materialised and handed to
/// the steps that read it.
#[derive(Clone, Copy, Debug, Default)]
pub struct DataFusionBackend;

#[async_trait::async_trait]
impl Backend for DataFusionBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> BackendCapabilities {
        capabilities::capabilities()
    }

    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        // Inputs are keyed by port; accept relation names too.
        let mut by_port = IndexMap::new();
        for (port, relation) in &step.inputs {
            if let Some(s) = inputs.get(port).or_else(|| inputs.get(relation)) {
                by_port.insert(port.clone(), s.clone());
            }
        }
        for (k, s) in inputs {
            if !by_port.contains_key(k) && !step.inputs.values().any(|r| r == k) {
                by_port.insert(k.clone(), s.clone());
            }
        }
        // Planning never waits on I/O: every table is in memory.
        futures::executor::block_on(step::output_schema(step, &by_port))
            .map_err(|e| error::at(e, &format!("transforms[{}]", step.id)))
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        let mut relations = inputs;
        for task in steps {
            tracing::debug!(step = %task.id, "datafusion: running step");
            let inputs = task.port_inputs(&relations)?;
            let table = step::execute(task, inputs)
                .await
                .map_err(|e| error::at(e, &format!("transforms[{}]", task.id)))?;
            relations.insert(task.id.clone(), table);
        }
        outputs
            .iter()
            .map(|name| {
                relations
                    .get(name)
                    .cloned()
                    .map(|t| (name.clone(), t))
                    .ok_or_else(|| {
                        error::err(
                            &codes::UNKNOWN_NODE,
                            format!("output `{name}` is neither an input of the region nor a step"),
                        )
                    })
            })
            .collect()
    }
}
