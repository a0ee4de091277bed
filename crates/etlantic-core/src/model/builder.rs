//! The Rust builder of [`Pipeline`]s. It produces exactly the value the YAML form of the
//! same pipeline deserialises to.

use super::*;
use crate::ir::Action;

/// Builds a [`Pipeline`].
#[derive(Clone, Debug)]
pub struct PipelineBuilder {
    pipeline: Pipeline,
}

impl PipelineBuilder {
    /// A pipeline with this name.
    pub fn new(name: impl Into<String>) -> Self {
        PipelineBuilder {
            pipeline: Pipeline {
                api_version: API_VERSION.into(),
                kind: "Pipeline".into(),
                name: name.into(),
                description: None,
                assets: IndexMap::new(),
                sources: Vec::new(),
                transforms: Vec::new(),
                sinks: Vec::new(),
                extensions: IndexMap::new(),
            },
        }
    }

    /// Sets the description.
    pub fn description(mut self, d: impl Into<String>) -> Self {
        self.pipeline.description = Some(d.into());
        self
    }

    /// Declares an asset whose contract is a file.
    pub fn asset(mut self, name: impl Into<String>, contract_path: impl Into<String>) -> Self {
        self.pipeline.assets.insert(
            name.into(),
            AssetDef {
                contract: ContractRef::Path(contract_path.into()),
                description: None,
            },
        );
        self
    }

    /// Declares an asset with an inline ODCS contract.
    pub fn asset_inline(mut self, name: impl Into<String>, contract: Value) -> Self {
        self.pipeline.assets.insert(
            name.into(),
            AssetDef {
                contract: ContractRef::Inline(contract),
                description: None,
            },
        );
        self
    }

    /// Adds a bounded/unbounded source without event time.
    pub fn source(self, id: impl Into<String>, asset: impl Into<String>) -> Self {
        self.source_def(SourceDef::new(id, asset))
    }

    /// Adds a static source: read as a bounded table in streaming runs (the static side
    /// of a stream-static join), refreshed as `refresh` says.
    pub fn static_source(
        self,
        id: impl Into<String>,
        asset: impl Into<String>,
        refresh: StaticRefresh,
    ) -> Self {
        self.source_def(SourceDef {
            static_refresh: Some(refresh),
            ..SourceDef::new(id, asset)
        })
    }

    /// Adds a fully specified source.
    pub fn source_def(mut self, def: SourceDef) -> Self {
        self.pipeline.sources.push(def);
        self
    }

    /// Adds a transformation.
    pub fn transform(mut self, t: TransformBuilder) -> Self {
        self.pipeline.transforms.push(t.def);
        self
    }

    /// Adds a sink with default modes.
    pub fn sink(
        self,
        id: impl Into<String>,
        input: impl Into<String>,
        asset: impl Into<String>,
    ) -> Self {
        self.sink_def(SinkDef {
            id: id.into(),
            input: input.into(),
            asset: asset.into(),
            output_mode: None,
            write_mode: None,
            keys: Vec::new(),
        })
    }

    /// Adds a fully specified sink.
    pub fn sink_def(mut self, def: SinkDef) -> Self {
        self.pipeline.sinks.push(def);
        self
    }

    /// The pipeline.
    pub fn build(self) -> Pipeline {
        self.pipeline
    }
}

/// Builds a [`TransformDef`].
#[derive(Clone, Debug)]
pub struct TransformBuilder {
    def: TransformDef,
}

impl TransformBuilder {
    /// A transformation with this id and no inputs yet.
    pub fn new(id: impl Into<String>) -> Self {
        TransformBuilder {
            def: TransformDef {
                id: id.into(),
                inputs: IndexMap::new(),
                steps: None,
                plan: None,
                sql: None,
                implementation: None,
                parameters: IndexMap::new(),
                output: None,
            },
        }
    }

    /// Connects an input port to an upstream node.
    pub fn input(mut self, port: impl Into<String>, from: impl Into<String>) -> Self {
        self.def
            .inputs
            .insert(port.into(), PortRef::Node(from.into()));
        self
    }

    /// Connects an input port and declares the contract it requires.
    pub fn typed_input(
        mut self,
        port: impl Into<String>,
        from: impl Into<String>,
        contract: impl Into<String>,
    ) -> Self {
        self.def.inputs.insert(
            port.into(),
            PortRef::Typed {
                from: from.into(),
                contract: ContractRef::Path(contract.into()),
            },
        );
        self
    }

    /// Appends an inline step.
    pub fn step(mut self, action: Action) -> Self {
        self.def
            .steps
            .get_or_insert_with(Vec::new)
            .push(Step(action));
        self
    }

    /// Appends a step written in the YAML short syntax (e.g. `filter: "a > 1"`).
    pub fn step_yaml(self, yaml: &str) -> std::result::Result<Self, String> {
        let v: Value = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        Ok(self.step(steps::parse_step(&v)?))
    }

    /// Uses a DTCS plan file.
    pub fn plan_file(mut self, path: impl Into<String>) -> Self {
        self.def.plan = Some(PlanRef::Path(path.into()));
        self
    }

    /// Uses a DTCS plan given inline (e.g. built with
    /// [`crate::ir::TransformPlanBuilder::to_value`]).
    pub fn plan_inline(mut self, plan: Value) -> Self {
        self.def.plan = Some(PlanRef::Inline(plan));
        self
    }

    /// Uses an engine-specific SQL query.
    pub fn sql(mut self, engine: impl Into<String>, query: impl Into<String>) -> Self {
        self.def.sql = Some(SqlStep {
            engine: engine.into(),
            query: query.into(),
        });
        self
    }

    /// Sets a runtime parameter.
    pub fn parameter(mut self, name: impl Into<String>, value: Value) -> Self {
        self.def.parameters.insert(name.into(), value);
        self
    }

    /// Declares the output contract.
    pub fn output_contract(mut self, path: impl Into<String>) -> Self {
        self.def.output = Some(OutputDef {
            contract: ContractRef::Path(path.into()),
        });
        self
    }
}
