//! The backend and engine-specific transformation contracts.

use crate::data::Table;
use crate::diagnostics::Result;
use crate::ir::TransformPlan;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// The kinds of plan regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionKind {
    /// Bounded inputs, run once.
    Batch,
    /// Unbounded inputs, run in micro-batches.
    Streaming,
    /// Pushed down into a database.
    Sql,
}

/// What a backend executes. The planner places a step on a backend only if every DTCS
/// action and function the step uses is listed here (it fails closed otherwise).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendCapabilities {
    /// Region kinds it runs.
    pub region_kinds: Vec<RegionKind>,
    /// DTCS profiles it implements completely.
    pub dtcs_profiles: Vec<String>,
    /// DTCS (and `etlantic:`) action ids it implements: canonical ids only (aliases are
    /// matched through [`crate::ir::canonical_action_id`]).
    pub actions: Vec<String>,
    /// DTCS function ids it implements.
    pub functions: Vec<String>,
    /// SQL dialects/engines of the SQL steps it runs (e.g. `datafusion`).
    pub sql_engines: Vec<String>,
    /// Whether it runs the continuous trigger.
    pub continuous: bool,
    /// URI schemes of the systems its regions run inside (an SQL backend: its
    /// database's, e.g. `postgres`). Empty for in-process engines. The planner binds such
    /// a region to the binding of an asset it reads or writes with one of these schemes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub location_schemes: Vec<String>,
    /// What its streaming regions provide beyond the actions; read only for backends
    /// whose `region_kinds` include [`RegionKind::Streaming`].
    #[serde(default)]
    pub streaming: StreamingSupport,
}

/// What a backend's streaming regions do besides running the steps: the planner refuses
/// (`ETL507`) a streaming pipeline that asks a region's backend for more.
///
/// An implementer declares only what its streaming execution really does: a policy
/// listed here must be applied to every late row, and `quarantine: true` means every
/// malformed record and every record breaking a record-level contract rule reaches the
/// quarantine output with its reason and source position (never dropped, never nulled).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamingSupport {
    /// The late-event policies it applies, by name (`drop`, `accept`, `quarantine`,
    /// `side_output`; see [`crate::streaming::LatePolicy::name`]).
    #[serde(default)]
    pub late_policies: Vec<String>,
    /// Whether bad records go to the quarantine output. Without it the pipeline must run
    /// with `on_error: fail` (the query stops at the first bad record).
    #[serde(default)]
    pub quarantine: bool,
    /// Whether a streaming region on it is a whole query in another system: it reads
    /// the sources and writes the sinks itself, so it must hold every transformation of
    /// the pipeline. Otherwise the embedded runtime drives it micro-batch by
    /// micro-batch.
    #[serde(default)]
    pub whole_query: bool,
    /// For a whole-query backend: the binding schemes of the sources and sinks it reads
    /// and writes itself (e.g. `file`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub io_schemes: Vec<String>,
    /// Action ids its streaming regions run when that list differs from
    /// [`BackendCapabilities::actions`] (empty: the same list). A backend whose
    /// incremental operators differ from its batch ones (Spark's `window` aggregation
    /// runs only on streams here) lists them here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
    /// Whether its streaming window aggregations keep a window open for the window's
    /// `allowed_lateness` after the watermark passes its end (see
    /// [`crate::ir::WindowSpec::allowed_lateness`]). A backend without it is never given
    /// a window with allowed lateness on a stream (`ETL501` at planning).
    #[serde(default)]
    pub allowed_lateness: bool,
}

impl BackendCapabilities {
    /// Whether an action id (or an alias of it, see
    /// [`crate::ir::canonical_action_id`]) is supported in batch regions.
    pub fn supports_action(&self, id: &str) -> bool {
        let id = crate::ir::canonical_action_id(id);
        self.actions.iter().any(|a| a == id)
    }

    /// Whether an action id is supported in regions of `kind` (streaming regions use
    /// [`StreamingSupport::actions`] when the backend lists any).
    pub fn supports_action_in(&self, kind: RegionKind, id: &str) -> bool {
        if kind == RegionKind::Streaming && !self.streaming.actions.is_empty() {
            let id = crate::ir::canonical_action_id(id);
            self.streaming.actions.iter().any(|a| a == id)
        } else {
            self.supports_action(id)
        }
    }

    /// Whether a function id is supported.
    pub fn supports_function(&self, id: &str) -> bool {
        self.functions.iter().any(|f| f == id)
    }
}

/// How a step is implemented.
#[derive(Clone, Debug)]
pub enum StepLogic {
    /// A portable DTCS plan with its parameter values.
    Portable {
        /// The plan.
        plan: Arc<TransformPlan>,
        /// Values of the plan's runtime parameters.
        parameters: IndexMap<String, Value>,
        /// The plan output port this step publishes.
        output: String,
    },
    /// An engine-specific SQL query over tables named after the input ports.
    Sql {
        /// The query.
        query: String,
    },
    /// A registered [`TransformImpl`].
    Impl {
        /// Its name.
        name: String,
    },
}

/// One transformation handed to a backend.
#[derive(Clone, Debug)]
pub struct StepTask {
    /// The transformation id; its result is the relation of this name.
    pub id: String,
    /// Port → relation name (a table handed in, or an earlier step of the region).
    pub inputs: IndexMap<String, String>,
    /// The implementation.
    pub logic: StepLogic,
}

impl StepTask {
    /// The step's inputs by port, looked up by relation name in `relations` (the
    /// region's inputs and the results of its earlier steps); `ETL201` when one is
    /// missing.
    pub fn port_inputs<T: Clone>(
        &self,
        relations: &IndexMap<String, T>,
    ) -> Result<IndexMap<String, T>> {
        self.inputs
            .iter()
            .map(|(port, relation)| {
                relations
                    .get(relation)
                    .cloned()
                    .map(|t| (port.clone(), t))
                    .ok_or_else(|| {
                        crate::diagnostics::Error::new(
                            &crate::diagnostics::codes::UNKNOWN_NODE,
                            format!(
                                "step `{}` reads `{relation}` (port `{port}`), which is neither an input of the region nor an earlier step",
                                self.id
                            ),
                        )
                    })
            })
            .collect()
    }
}

/// Where a region runs, for backends that run inside another system (an SQL region runs
/// inside the database named by `uri`).
#[derive(Clone, Debug, PartialEq)]
pub struct RegionLocation {
    /// The database (or other system), secret references already resolved.
    pub uri: crate::uri::BindingUri,
    /// The project root, against which relative file paths (SQLite files) resolve.
    pub root: std::path::PathBuf,
    /// Relations the region reads where they lie instead of receiving them in
    /// `execute_batch`: relation name → (table in that database, the schema it is read
    /// as). An implementer reads exactly these columns, converted to these types, and
    /// fails (never guesses) when a value does not convert.
    pub tables: IndexMap<String, (String, SchemaRef)>,
}

/// An execution engine for batch regions.
///
/// # Invariants an implementer must keep
/// - `capabilities()` is constant and never claims an action or function that
///   `execute_batch` would reject or compute with different semantics than DTCS defines
///   (SQL three-valued logic, nulls as ordinary group keys, ...).
/// - `output_schema` is pure (no data is read) and returns exactly the schema that
///   `execute_batch` produces for the same step and input schemas.
/// - `execute_batch` runs `steps` in order; a step may read relations in `inputs` or
///   results of earlier steps. It returns a table for every name in `outputs`, and
///   neither drops nor invents rows.
/// - Errors are diagnostics with codes (`ETL707` for engine failures).
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The backend's name, as used in profiles' engine overrides (e.g. `datafusion`).
    fn name(&self) -> &'static str;

    /// What it can execute.
    fn capabilities(&self) -> BackendCapabilities;

    /// The schema a step produces from input schemas.
    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef>;

    /// Runs a batch region.
    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>>;

    /// This backend bound to a location: the same capabilities, executing inside
    /// `location` (an SQL backend runs its regions in that database). Backends that run
    /// in-process have no locations and refuse (`ETL506`), which is the default.
    fn at_location(&self, location: &RegionLocation) -> Result<Arc<dyn Backend>> {
        Err(crate::diagnostics::Diagnostic::new(
            &crate::diagnostics::codes::REGION_LOCATION,
            format!(
                "backend `{}` runs in-process and cannot run a region in {}",
                self.name(),
                location.uri.redacted()
            ),
        )
        .into())
    }
}

/// An engine-specific implementation of a named transformation (the escape hatch when
/// portable DTCS cannot express a step).
///
/// # Invariants an implementer must keep
/// - `name()` is unique among linked implementations for its backend.
/// - `output_schema` is pure and matches what `execute` returns.
/// - `execute` is deterministic for the same inputs when the pipeline runs in streaming
///   mode (micro-batches may be replayed after a failure).
pub trait TransformImpl: Send + Sync + 'static {
    /// The name referenced by `impl:` in a pipeline.
    fn name(&self) -> &'static str;
    /// The backend it runs on.
    fn backend(&self) -> &'static str;
    /// The output schema for the given input schemas (by port).
    fn output_schema(&self, inputs: &IndexMap<String, SchemaRef>) -> Result<SchemaRef>;
    /// Computes the output from the inputs (by port).
    fn execute(&self, inputs: IndexMap<String, Table>) -> Result<Table>;
}
