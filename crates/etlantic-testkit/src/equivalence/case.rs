//! One equivalence case: input tables, the steps of one transformation, the expected
//! result. Cases are YAML files (see `equivalence/README.md` next to the corpus):
//!
//! ```yaml
//! description: a filter keeps rows whose predicate is true (null drops the row)
//! inputs:
//!   orders:                          # the first input is the steps' target
//!     columns: {id: integer, amount: "decimal(10,2)", region: string}
//!     rows:
//!       - [1, "10.50", eu]
//!       - [2, null, us]
//! steps:
//!   - filter: "amount > 5"
//! expect:
//!   rows:
//!     - [1, 10.5, eu]
//!   ordered: false                   # true: compare as a sequence (after a sort)
//! tolerance: 1e-9                    # optional relative numeric tolerance, documented
//! ```
//!
//! Instead of `steps`, `from: {pipeline: <file>, transform: <id>}` runs the steps of a
//! transformation of a pipeline file (the examples' pipelines are run this way).

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_core::data::Table;
use etlantic_core::model::steps::Step;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// An input table of a case.
#[derive(Clone, Debug, Deserialize)]
pub struct InputSpec {
    /// Column name → type (`integer`, `float`, `decimal(p,s)`, `string`, `boolean`,
    /// `date`, `timestamp` (an instant, UTC)).
    pub columns: IndexMap<String, String>,
    /// Rows, one value per column (`null` for null; decimals, dates and timestamps as
    /// strings).
    #[serde(default)]
    pub rows: Vec<Vec<Value>>,
}

/// A transformation of a pipeline file whose steps a case runs.
#[derive(Clone, Debug, Deserialize)]
pub struct TransformRef {
    /// The pipeline file, relative to the case file.
    pub pipeline: String,
    /// The transformation id.
    pub transform: String,
}

/// The expected result.
#[derive(Clone, Debug, Deserialize)]
pub struct Expected {
    /// Output column names in order (checked when given).
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// The rows.
    #[serde(default)]
    pub rows: Vec<Vec<Value>>,
    /// Compare as a sequence instead of a multiset.
    #[serde(default)]
    pub ordered: bool,
}

/// A case file.
#[derive(Clone, Debug, Deserialize)]
pub struct Case {
    /// The file stem (set when loaded).
    #[serde(skip)]
    pub name: String,
    /// What it checks.
    #[serde(default)]
    pub description: String,
    /// Input tables by name (port); the first is the target of the first step.
    pub inputs: IndexMap<String, InputSpec>,
    /// The steps, in pipeline YAML syntax (or taken from `from`).
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Run the steps of a transformation of a pipeline file (an example's) instead of
    /// `steps`; its parameters are the defaults of `parameters`.
    #[serde(default)]
    pub from: Option<TransformRef>,
    /// Transformation parameters.
    #[serde(default)]
    pub parameters: IndexMap<String, Value>,
    /// The expected result.
    pub expect: Expected,
    /// Relative numeric tolerance (exact when absent).
    #[serde(default)]
    pub tolerance: Option<f64>,
}

impl Case {
    /// Loads a case file.
    pub fn load(path: &Path) -> Result<Case, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut c: Case =
            serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        c.name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        if c.inputs.is_empty() {
            return Err(format!("{}: a case needs at least one input", c.name));
        }
        match (&c.from, c.steps.is_empty()) {
            (Some(_), false) => {
                return Err(format!("{}: give `steps` or `from`, not both", c.name))
            }
            (None, true) => return Err(format!("{}: a case needs `steps` or `from`", c.name)),
            (Some(r), true) => {
                let r = r.clone();
                c.take_steps(
                    &path.parent().unwrap_or(Path::new(".")).join(&r.pipeline),
                    &r,
                )?
            }
            (None, false) => {}
        }
        Ok(c)
    }

    /// Takes the steps, and the parameters the case does not set, of `r.transform` in
    /// the pipeline file `file`; the case's inputs must be its ports, in order.
    fn take_steps(&mut self, file: &Path, r: &TransformRef) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let pipeline: etlantic_core::model::Pipeline =
            serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let t = pipeline
            .transforms
            .iter()
            .find(|t| t.id == r.transform)
            .ok_or_else(|| format!("{}: no transformation `{}`", file.display(), r.transform))?;
        let steps = t.steps.clone().ok_or_else(|| {
            format!(
                "{}: `{}` has no portable `steps`",
                file.display(),
                r.transform
            )
        })?;
        let ports: Vec<&String> = t.inputs.keys().collect();
        let inputs: Vec<&String> = self.inputs.keys().collect();
        if ports != inputs {
            return Err(format!(
                "{}: the inputs {inputs:?} are not the ports {ports:?} of `{}`",
                self.name, r.transform
            ));
        }
        self.steps = steps;
        for (k, v) in &t.parameters {
            self.parameters
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        Ok(())
    }

    /// Every case file (`*.yaml`) of a directory, sorted by name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Case>, String> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        files.iter().map(|p| Case::load(p)).collect()
    }

    /// The Arrow schema of an input.
    pub fn schema(&self, input: &str) -> Result<SchemaRef, String> {
        let spec = &self.inputs[input];
        let fields = spec
            .columns
            .iter()
            .map(|(n, t)| Ok(Field::new(n, data_type(t)?, true)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The rows of an input as one Arrow batch.
    pub fn batch(&self, input: &str, rows: &[Vec<Value>]) -> Result<RecordBatch, String> {
        let schema = self.schema(input)?;
        let width = schema.fields().len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(width);
        for (i, f) in schema.fields().iter().enumerate() {
            let texts: Vec<Option<String>> = rows
                .iter()
                .map(|r| match r.get(i) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
                    Some(other) => Err(format!("{}: `{other}` is not a scalar", self.name)),
                })
                .collect::<Result<_, _>>()?;
            if rows.iter().any(|r| r.len() != width) {
                return Err(format!(
                    "{}: input `{input}` has a row without {width} values",
                    self.name
                ));
            }
            let text: ArrayRef = Arc::new(StringArray::from(texts));
            let col = cast_with_options(
                &text,
                f.data_type(),
                &CastOptions {
                    safe: false,
                    ..Default::default()
                },
            )
            .map_err(|e| format!("{}: input `{input}` column `{}`: {e}", self.name, f.name()))?;
            columns.push(col);
        }
        RecordBatch::try_new(schema, columns).map_err(|e| e.to_string())
    }

    /// Every input as a table.
    pub fn tables(&self) -> Result<IndexMap<String, Table>, String> {
        self.inputs
            .iter()
            .map(|(n, spec)| {
                let b = self.batch(n, &spec.rows)?;
                Ok((n.clone(), Table::new(b.schema(), vec![b])))
            })
            .collect()
    }
}

/// The Arrow type of a case column type.
pub fn data_type(t: &str) -> Result<DataType, String> {
    let t = t.trim();
    Ok(match t {
        "integer" => DataType::Int64,
        "float" => DataType::Float64,
        "string" => DataType::Utf8,
        "boolean" => DataType::Boolean,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        d if d.starts_with("decimal(") && d.ends_with(')') => {
            let inner = &d["decimal(".len()..d.len() - 1];
            let (p, s) = inner
                .split_once(',')
                .ok_or_else(|| format!("bad decimal type `{d}`"))?;
            DataType::Decimal128(
                p.trim()
                    .parse()
                    .map_err(|_| format!("bad precision in `{d}`"))?,
                s.trim()
                    .parse()
                    .map_err(|_| format!("bad scale in `{d}`"))?,
            )
        }
        other => return Err(format!("unknown column type `{other}`")),
    })
}
