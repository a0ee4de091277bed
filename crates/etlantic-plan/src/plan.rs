//! The PipelinePlan: the validated pipeline, bound to a profile, split into regions, as
//! canonical JSON with a SHA-256 fingerprint.
//!
//! A plan is self-contained: it embeds every contract document and every DTCS transform
//! plan, so `etlantic run --plan plan.json` needs nothing but the data. It holds no
//! absolute path, no working directory and no secret value (binding URIs keep
//! `${env:...}` references; literal passwords are refused by the policy phase), so the
//! same pipeline and profile give the same bytes on every machine.
//!
//! The fingerprint is `sha256:` + hex SHA-256 of the canonical JSON of the plan without
//! its `fingerprint` and `provenance` members (provenance records where contracts and
//! plans were read from, which does not change what runs), and without the `file`/`line`
//! of its warnings (which name the pipeline and profile files, provenance as well).

use etlantic_core::canonical;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use etlantic_core::guarantee::{DeliveryGuarantee, SinkGuarantee, SourceGuarantee};
use etlantic_core::model::WriteMode;
use etlantic_core::plugin::{ReadLimit, RegionKind};
use etlantic_core::profile::OnError;
use etlantic_core::streaming::{
    Duration, EventTime, ExecutionMode, LatePolicy, OutputMode, StaticRefresh, Trigger,
    WatermarkPolicy,
};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The identity of the plan format.
pub const PLAN_FORMAT: &str = "etlantic.pipeline-plan/1";

/// One column of a schema, as shown in plans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldSpec {
    /// Column name.
    pub name: String,
    /// The Arrow type, as Arrow displays it.
    #[serde(rename = "type")]
    pub data_type: String,
    /// Whether nulls are allowed.
    pub nullable: bool,
}

/// A schema as shown in plans.
pub type SchemaSpec = Vec<FieldSpec>;

/// Converts an Arrow schema.
pub fn schema_spec(schema: &arrow::datatypes::Schema) -> SchemaSpec {
    schema
        .fields()
        .iter()
        .map(|f| FieldSpec {
            name: f.name().clone(),
            data_type: f.data_type().to_string(),
            nullable: f.is_nullable(),
        })
        .collect()
}

/// The Arrow schema of a plan schema (types parse from Arrow's display form).
pub fn arrow_schema(spec: &SchemaSpec) -> arrow::datatypes::Schema {
    arrow::datatypes::Schema::new(
        spec.iter()
            .map(|f| {
                let dt = f
                    .data_type
                    .parse()
                    .unwrap_or(arrow::datatypes::DataType::Utf8);
                arrow::datatypes::Field::new(&f.name, dt, f.nullable)
            })
            .collect::<Vec<_>>(),
    )
}

/// The profile settings that affect execution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanProfile {
    /// Profile name.
    pub name: String,
    /// The application the query belongs to (see
    /// `etlantic_core::profile::Profile::application_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    /// Where the runs' OpenLineage events go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<etlantic_core::profile::LineageConfig>,
    /// Batch or streaming.
    pub mode: ExecutionMode,
    /// Bad-record policy.
    pub on_error: OnError,
    /// Quarantine URI.
    pub quarantine: String,
    /// Streaming trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Checkpoint location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Watermark combination policy.
    pub watermark_policy: WatermarkPolicy,
    /// Whether no-data micro-batches run.
    pub no_data_batches: bool,
    /// Required end-to-end guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_guarantee: Option<DeliveryGuarantee>,
    /// Secret references (never values).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub secrets: IndexMap<String, String>,
    /// Object-store options (credentials as references, never values).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub storage_options: IndexMap<String, String>,
    /// Streaming state TTL: transformation or operator id → time to live without an
    /// update (processing time). Empty in batch plans.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub state_ttl: IndexMap<String, Duration>,
    /// How often streaming state is written to the checkpoint (processing time); `None`:
    /// after every micro-batch. See `etlantic_core::profile::Profile::state_checkpoint_interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_checkpoint_interval: Option<Duration>,
    /// Where streaming operators keep their state (see
    /// `etlantic_core::profile::Profile::state_store`).
    #[serde(default = "memory_store", skip_serializing_if = "is_memory_store")]
    pub state_store: String,
    /// What a disk state store may hold in memory for the whole query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_memory_limit: Option<etlantic_core::streaming::ByteSize>,
    /// How many versions the disk state store may commit before a snapshot (see
    /// `etlantic_core::profile::Profile::state_snapshot_every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_snapshot_every: Option<std::num::NonZeroU64>,
    /// The local directory of the disk state store's working copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_local_dir: Option<String>,
    /// Quality-rule policies by rule id (see `etlantic_core::contract::rules`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub quality_policies: IndexMap<String, etlantic_core::contract::rules::Policy>,
}

fn memory_store() -> String {
    etlantic_core::profile::MEMORY_STATE_STORE.into()
}

fn is_memory_store(name: &str) -> bool {
    name == etlantic_core::profile::MEMORY_STATE_STORE
}

/// A contract embedded in the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanContract {
    /// ODCS id.
    pub id: String,
    /// ODCS version.
    pub version: String,
    /// The schema object used.
    pub object: String,
    /// The ODCS document (canonical JSON).
    pub document: Value,
}

/// An asset with its contract and binding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanAsset {
    /// The contract.
    pub contract: PlanContract,
    /// The binding URI (secret references unresolved).
    pub binding: String,
    /// Its scheme.
    pub scheme: String,
    /// The Arrow schema of the contract.
    pub schema: SchemaSpec,
}

/// A source in the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanSource {
    /// Node id.
    pub id: String,
    /// Asset read.
    pub asset: String,
    /// Event-time column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTime>,
    /// Watermark delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Duration>,
    /// Late-event policy.
    pub late_events: LatePolicy,
    /// Read limit per micro-batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_limit: Option<ReadLimit>,
    /// Whether the source replays.
    pub guarantee: SourceGuarantee,
    /// Static in a streaming run: read as a bounded table with this refresh policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_refresh: Option<StaticRefresh>,
    /// The rows the watermark is measured on: those where this predicate (an encoded
    /// DTCS expression over the source's columns) is true; every row when absent. Spark
    /// measures a watermark after the filters its optimizer moves below it, inferred
    /// ones included (see [`crate::watermark_rows`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_rows: Option<serde_json::Value>,
}

/// How a transformation is implemented, in the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanLogic {
    /// A DTCS transform plan.
    Portable {
        /// The `dtcs.transform-plan/2` document.
        plan: Value,
        /// Its dtcs fingerprint.
        #[serde(rename = "dtcsFingerprint")]
        dtcs_fingerprint: String,
        /// Parameter values.
        #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
        parameters: IndexMap<String, Value>,
        /// The plan output used.
        output: String,
    },
    /// Engine-specific SQL.
    Sql {
        /// Engine.
        engine: String,
        /// Query.
        query: String,
    },
    /// A registered implementation.
    Impl {
        /// Name.
        name: String,
    },
}

/// A transformation in the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanTransform {
    /// Node id.
    pub id: String,
    /// Port → upstream node.
    pub inputs: IndexMap<String, String>,
    /// Implementation.
    pub logic: PlanLogic,
    /// Backend it runs on.
    pub backend: String,
    /// Region it belongs to.
    pub region: String,
    /// Output schema.
    pub schema: SchemaSpec,
}

/// A sink in the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanSink {
    /// Node id.
    pub id: String,
    /// Upstream node.
    pub input: String,
    /// Asset written.
    pub asset: String,
    /// Streaming output mode.
    pub output_mode: OutputMode,
    /// Batch write mode.
    pub write_mode: WriteMode,
    /// Upsert keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// Schema received.
    pub schema: SchemaSpec,
    /// The sink's declared guarantee.
    pub guarantee: SinkGuarantee,
}

/// A region: consecutive steps run by one backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Region {
    /// Region id (`r0`, `r1`, ...).
    pub id: String,
    /// Kind.
    pub kind: RegionKind,
    /// Backend.
    pub backend: String,
    /// Transformation ids, in execution order.
    pub steps: Vec<String>,
    /// Relations it reads (source ids or steps of earlier regions).
    pub inputs: Vec<String>,
    /// Relations other regions or sinks read from it.
    pub outputs: Vec<String>,
    /// Where it runs, for backends that run inside another system: the binding (secret
    /// references unresolved) of the database an SQL region runs in. `None` for
    /// in-process engines and for SQLite regions in a private in-memory database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Sources the region reads in place, in its own database (`read=in_place` on the
    /// binding): source id → table. Their rows are not read by ETLantic.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub in_place: IndexMap<String, String>,
}

/// A hand-over of a relation between two places (sources, regions, sinks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// Producer: `source:<id>` or `region:<id>`.
    pub from: String,
    /// Consumer: `region:<id>` or `sink:<id>`.
    pub to: String,
    /// The relation handed over.
    pub relation: String,
    /// How: `arrow` (record batches handed over in memory), `arrow→staged-table` (into
    /// an SQL region: written to a temporary table of its database),
    /// `query-result→arrow` (out of an SQL region: its query's rows read back),
    /// `query-result→staged-table` (between SQL regions) or `in-place` (an SQL region
    /// reads a source table of its own database where it lies).
    pub materialization: String,
}

/// The end-to-end guarantee of one source/sink pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PairGuarantee {
    /// Source id.
    pub source: String,
    /// Sink id.
    pub sink: String,
    /// What the pair gives.
    pub guarantee: DeliveryGuarantee,
    /// A condition it depends on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

/// Where contracts and plans were read from (excluded from the fingerprint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    /// The pipeline file, relative to the project root.
    pub pipeline_file: String,
    /// The profile file, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_file: Option<String>,
    /// Asset → contract file.
    #[serde(default)]
    pub contracts: IndexMap<String, String>,
    /// Transformation → DTCS plan file.
    #[serde(default)]
    pub plans: IndexMap<String, String>,
}

/// A planned pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelinePlan {
    /// Always [`PLAN_FORMAT`].
    pub format: String,
    /// Pipeline name.
    pub pipeline: String,
    /// Pipeline description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The profile settings.
    pub profile: PlanProfile,
    /// Assets by name.
    pub assets: IndexMap<String, PlanAsset>,
    /// Sources.
    pub sources: Vec<PlanSource>,
    /// Transformations, in execution order.
    pub transforms: Vec<PlanTransform>,
    /// Sinks.
    pub sinks: Vec<PlanSink>,
    /// Regions, in execution order.
    pub regions: Vec<Region>,
    /// Every hand-over between sources, regions and sinks.
    pub transitions: Vec<Transition>,
    /// End-to-end guarantee of every source/sink pair connected by the graph.
    pub guarantees: Vec<PairGuarantee>,
    /// Warnings found while planning.
    #[serde(default, skip_serializing_if = "Diagnostics::is_empty")]
    pub warnings: Diagnostics,
    /// Where inputs were read from (not fingerprinted).
    #[serde(default)]
    pub provenance: Provenance,
    /// `sha256:<hex>` of the canonical plan without `fingerprint` and `provenance`.
    #[serde(default)]
    pub fingerprint: String,
}

impl PipelinePlan {
    /// Computes the fingerprint of the plan's content.
    pub fn compute_fingerprint(&self) -> String {
        let mut v = serde_json::to_value(self).expect("plans serialise");
        if let Some(m) = v.as_object_mut() {
            m.remove("fingerprint");
            m.remove("provenance");
            // Where a warning points (the pipeline or profile file, as named on the
            // command line) is provenance too: the same pipeline under another file
            // name or profile path must plan to the same fingerprint.
            if let Some(Value::Array(warnings)) = m.get_mut("warnings") {
                for w in warnings.iter_mut().filter_map(Value::as_object_mut) {
                    w.remove("file");
                    w.remove("line");
                }
            }
        }
        canonical::fingerprint(&v)
    }

    /// Sets the fingerprint from the content.
    pub fn seal(mut self) -> Self {
        self.fingerprint = self.compute_fingerprint();
        self
    }

    /// Canonical JSON text (sorted keys, compact).
    pub fn to_canonical_json(&self) -> String {
        canonical::to_canonical_string(&serde_json::to_value(self).expect("plans serialise"))
    }

    /// Pretty JSON with sorted keys (what `etlantic plan` prints).
    pub fn to_pretty_json(&self) -> String {
        let v = canonical::canonicalize(&serde_json::to_value(self).expect("plans serialise"));
        serde_json::to_string_pretty(&v).expect("plans serialise")
    }

    /// Reads a plan and checks its format and fingerprint.
    pub fn from_json(text: &str, origin: &str) -> Result<Self> {
        let plan: PipelinePlan = serde_json::from_str(text).map_err(|e| {
            Error::from(
                Diagnostic::new(
                    &codes::PLAN_INVALID,
                    format!("{origin}: cannot read plan: {e}"),
                )
                .in_file(origin),
            )
        })?;
        if plan.format != PLAN_FORMAT {
            return Err(Diagnostic::new(
                &codes::PLAN_TOO_NEW,
                format!(
                    "{origin}: plan format `{}` is not `{PLAN_FORMAT}`",
                    plan.format
                ),
            )
            .in_file(origin)
            .into());
        }
        let actual = plan.compute_fingerprint();
        if actual != plan.fingerprint {
            return Err(Diagnostic::new(
                &codes::PLAN_INVALID,
                format!(
                    "{origin}: fingerprint mismatch (file says {}, content is {actual}); the plan was edited",
                    plan.fingerprint
                ),
            )
            .in_file(origin)
            .into());
        }
        // A plan never holds a credential in plain text (the profile check refuses it);
        // one written by hand or by an older version is refused the same way.
        let mut texts: Vec<(String, &str)> = plan
            .assets
            .iter()
            .map(|(k, a)| (format!("assets.{k}.binding"), a.binding.as_str()))
            .collect();
        texts.push(("profile.quarantine".into(), &plan.profile.quarantine));
        texts.extend(
            plan.profile
                .checkpoint
                .as_deref()
                .map(|c| ("profile.checkpoint".to_string(), c)),
        );
        texts.extend(plan.regions.iter().filter_map(|r| {
            r.location
                .as_deref()
                .map(|l| (format!("regions.{}.location", r.id), l))
        }));
        let mut d = Diagnostics::new();
        for (path, text) in texts {
            for what in etlantic_core::uri::plain_credentials(text) {
                d.push(
                    Diagnostic::new(
                        &codes::SECRET_IN_PLAIN,
                        format!(
                            "{origin}: `{path}` holds a credential in plain text (`{what}`): {}",
                            etlantic_core::uri::redact(text)
                        ),
                    )
                    .at(path.clone())
                    .in_file(origin),
                );
            }
        }
        d.into_result()?;
        Ok(plan)
    }

    /// A source by id.
    pub fn source(&self, id: &str) -> Option<&PlanSource> {
        self.sources.iter().find(|s| s.id == id)
    }

    /// A transformation by id.
    pub fn transform(&self, id: &str) -> Option<&PlanTransform> {
        self.transforms.iter().find(|t| t.id == id)
    }

    /// A sink by id.
    pub fn sink(&self, id: &str) -> Option<&PlanSink> {
        self.sinks.iter().find(|s| s.id == id)
    }

    /// Reconstructs the contract of an asset from the document embedded in the plan.
    pub fn asset_contract(
        &self,
        asset: &str,
    ) -> Result<std::sync::Arc<etlantic_core::contract::Contract>> {
        let a = self.assets.get(asset).ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!("the plan has no asset `{asset}`"),
            )
        })?;
        let doc = serde_json::from_value(a.contract.document.clone()).map_err(|e| {
            Error::new(
                &codes::PLAN_INVALID,
                format!("contract of `{asset}` in the plan: {e}"),
            )
        })?;
        Ok(std::sync::Arc::new(
            etlantic_core::contract::Contract::from_document(doc, asset, Some(&a.contract.object))?,
        ))
    }

    /// Rebuilds the backend step of a planned transformation.
    pub fn step_task(&self, id: &str) -> Result<etlantic_core::plugin::StepTask> {
        use etlantic_core::plugin::StepLogic;
        let t = self.transform(id).ok_or_else(|| {
            Error::new(
                &codes::PLAN_INVALID,
                format!("the plan has no transformation `{id}`"),
            )
        })?;
        let logic = match &t.logic {
            PlanLogic::Portable {
                plan,
                parameters,
                output,
                ..
            } => StepLogic::Portable {
                plan: std::sync::Arc::new(etlantic_core::ir::TransformPlan::from_value(plan, id)?),
                parameters: parameters.clone(),
                output: output.clone(),
            },
            PlanLogic::Sql { query, .. } => StepLogic::Sql {
                query: query.clone(),
            },
            PlanLogic::Impl { name } => StepLogic::Impl { name: name.clone() },
        };
        Ok(etlantic_core::plugin::StepTask {
            id: id.to_string(),
            inputs: t.inputs.clone(),
            logic,
        })
    }
}
