//! The pipeline model: logical assets with data contracts, sources, transformations with
//! typed input and output ports, and sinks. A YAML pipeline file (`apiVersion:
//! etlantic/v1`, `kind: Pipeline`) and the Rust [`PipelineBuilder`] produce the same
//! [`Pipeline`] value.
//!
//! The model is declarative and operational-free: *where* assets live (URIs), triggers,
//! checkpoints and secrets belong to a [`crate::profile::Profile`].

mod builder;
pub mod steps;
pub mod yaml;

pub use builder::{PipelineBuilder, TransformBuilder};
pub use steps::Step;

use crate::diagnostics::{codes, Diagnostic, Diagnostics, Result};
use crate::plugin::ReadLimit;
use crate::streaming::{Duration, EventTime, LatePolicy, OutputMode, StaticRefresh};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A contract reference: a file path (relative to the pipeline file; `#object` selects a
/// schema object) or an inline ODCS document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContractRef {
    /// Path to an ODCS YAML/JSON file.
    Path(String),
    /// An inline ODCS document.
    Inline(Value),
}

/// A logical asset: a named dataset with its contract. Where it lives is the profile's
/// business.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssetDef {
    /// The asset's ODCS data contract.
    pub contract: ContractRef,
    /// What the asset is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A source: reads one asset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceDef {
    /// Node id.
    pub id: String,
    /// The logical asset read.
    pub asset: String,
    /// The event-time column (streaming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTime>,
    /// Watermark delay behind the maximum event time seen (streaming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Duration>,
    /// What happens to events behind the watermark.
    #[serde(default, skip_serializing_if = "is_default_late")]
    pub late_events: LatePolicy,
    /// How much one micro-batch may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_limit: Option<ReadLimit>,
    /// Makes the source *static* in a streaming run: it is read as a bounded table (the
    /// static side of a stream-static join), again for every micro-batch or when the
    /// cached copy is older than an interval. Batch runs read every source bounded and
    /// ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_refresh: Option<StaticRefresh>,
}

impl SourceDef {
    /// A source of `asset` without event time, read as a stream in streaming runs.
    pub fn new(id: impl Into<String>, asset: impl Into<String>) -> Self {
        SourceDef {
            id: id.into(),
            asset: asset.into(),
            event_time: None,
            watermark: None,
            late_events: LatePolicy::Drop,
            read_limit: None,
            static_refresh: None,
        }
    }

    /// Whether the source is static (bounded) in a streaming run.
    pub fn is_static(&self) -> bool {
        self.static_refresh.is_some()
    }
}

fn is_default_late(p: &LatePolicy) -> bool {
    *p == LatePolicy::Drop
}

/// An input port: the upstream node and, optionally, the contract the port requires.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    /// Just the upstream node id; the port takes the upstream's schema.
    Node(String),
    /// The upstream node and the contract the port declares.
    Typed {
        /// Upstream node id.
        from: String,
        /// Contract the incoming schema must match.
        contract: ContractRef,
    },
}

impl PortRef {
    /// The upstream node id.
    pub fn from(&self) -> &str {
        match self {
            PortRef::Node(n) => n,
            PortRef::Typed { from, .. } => from,
        }
    }

    /// The declared contract, if any.
    pub fn contract(&self) -> Option<&ContractRef> {
        match self {
            PortRef::Node(_) => None,
            PortRef::Typed { contract, .. } => Some(contract),
        }
    }
}

/// A DTCS transform plan given as a file path or inline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PlanRef {
    /// Path to a `dtcs.transform-plan/2` JSON (or YAML) file.
    Path(String),
    /// The plan document inline.
    Inline(Value),
}

/// An engine-specific SQL step (allowed by DTCS as an engine-specific implementation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlStep {
    /// The engine that runs it (default `datafusion`).
    #[serde(default = "default_sql_engine")]
    pub engine: String,
    /// The query; input ports are tables named after the ports.
    pub query: String,
}

fn default_sql_engine() -> String {
    "datafusion".into()
}

/// The declared output port of a transformation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputDef {
    /// The contract the output must satisfy.
    pub contract: ContractRef,
}

/// A transformation: typed input ports, one implementation, an optional typed output.
///
/// Exactly one of `steps`, `plan`, `sql` and `implementation` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformDef {
    /// Node id.
    pub id: String,
    /// Port name → upstream node. The first port is the primary input of `steps`.
    pub inputs: IndexMap<String, PortRef>,
    /// Inline portable steps, compiled to a DTCS plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<Step>>,
    /// A DTCS transform plan (e.g. written by ETLantic-py).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRef>,
    /// An engine-specific SQL step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlStep>,
    /// The name of a registered engine-specific implementation.
    #[serde(default, rename = "impl", skip_serializing_if = "Option::is_none")]
    pub implementation: Option<String>,
    /// Values of the plan's runtime parameters.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub parameters: IndexMap<String, Value>,
    /// The declared output contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputDef>,
}

/// How a batch run writes a sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// Replace the target's content (batch default for files).
    #[default]
    Overwrite,
    /// Add to the target.
    Append,
    /// Insert or update by key.
    Upsert,
}

/// A sink: writes the output of one node to an asset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkDef {
    /// Node id.
    pub id: String,
    /// The upstream node.
    pub input: String,
    /// The logical asset written.
    pub asset: String,
    /// Streaming output mode (default append).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<OutputMode>,
    /// Batch write mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_mode: Option<WriteMode>,
    /// Key columns for `upsert`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// A pipeline definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pipeline {
    /// Must be `etlantic/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Must be `Pipeline`.
    pub kind: String,
    /// Pipeline name (used in query ids and reports).
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Logical assets by name.
    #[serde(default)]
    pub assets: IndexMap<String, AssetDef>,
    /// Sources.
    #[serde(default)]
    pub sources: Vec<SourceDef>,
    /// Transformations.
    #[serde(default)]
    pub transforms: Vec<TransformDef>,
    /// Sinks.
    #[serde(default)]
    pub sinks: Vec<SinkDef>,
    /// Unknown keys; only `x-` extensions are allowed.
    #[serde(flatten)]
    pub extensions: IndexMap<String, Value>,
}

/// The current pipeline/profile API version.
pub const API_VERSION: &str = "etlantic/v1";

/// The kind of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A source.
    Source,
    /// A transformation.
    Transform,
    /// A sink.
    Sink,
}

impl Pipeline {
    /// Parses a pipeline YAML document (header and unknown keys are checked here;
    /// everything else by the validation phases of `etlantic-plan`).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self> {
        let p: Pipeline = yaml::from_str(text, origin)?;
        let mut d = Diagnostics::new();
        if p.api_version != API_VERSION || p.kind != "Pipeline" {
            d.push(
                Diagnostic::new(
                    &codes::UNSUPPORTED_VERSION,
                    format!(
                        "unsupported pipeline header `{}`/`{}`",
                        p.api_version, p.kind
                    ),
                )
                .in_file(origin),
            );
        }
        for k in p.extensions.keys().filter(|k| !k.starts_with("x-")) {
            d.push(
                Diagnostic::new(
                    &codes::UNKNOWN_FIELD,
                    format!("unknown pipeline field `{k}`"),
                )
                .at(k.clone())
                .in_file(origin),
            );
        }
        d.into_result()?;
        Ok(p)
    }

    /// Serialises to YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("pipelines serialise")
    }

    /// Starts a builder.
    pub fn builder(name: impl Into<String>) -> PipelineBuilder {
        PipelineBuilder::new(name)
    }

    /// The kind of the node with this id.
    pub fn node_kind(&self, id: &str) -> Option<NodeKind> {
        if self.sources.iter().any(|s| s.id == id) {
            Some(NodeKind::Source)
        } else if self.transforms.iter().any(|t| t.id == id) {
            Some(NodeKind::Transform)
        } else if self.sinks.iter().any(|s| s.id == id) {
            Some(NodeKind::Sink)
        } else {
            None
        }
    }

    /// A source by id.
    pub fn source(&self, id: &str) -> Option<&SourceDef> {
        self.sources.iter().find(|s| s.id == id)
    }

    /// A transformation by id.
    pub fn transform(&self, id: &str) -> Option<&TransformDef> {
        self.transforms.iter().find(|t| t.id == id)
    }
}
