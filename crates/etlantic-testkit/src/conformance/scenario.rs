//! The neutral streaming scenario format of the Spark conformance corpus
//! (`shared/conformance/spark/FORMAT.md`), as Rust types.

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

/// One scenario file.
#[derive(Clone, Debug, Deserialize)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// What it probes.
    #[serde(default)]
    pub description: String,
    /// Sources by name.
    pub sources: IndexMap<String, SourceSpec>,
    /// The query.
    pub query: Value,
    /// Micro-batches: source name → rows.
    pub batches: Vec<IndexMap<String, Vec<Value>>>,
    /// Options.
    #[serde(default)]
    pub options: Options,
    /// Spark rejects the query.
    #[serde(default)]
    pub expect_error: bool,
    /// Spark's recorded behaviour.
    pub expected: Option<Expected>,
}

/// Scenario options.
#[derive(Clone, Debug, Deserialize)]
pub struct Options {
    /// `spark.sql.streaming.noDataMicroBatches.enabled`.
    #[serde(default = "yes")]
    pub no_data_micro_batches: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            no_data_micro_batches: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// A column of a source schema.
#[derive(Clone, Debug, Deserialize)]
pub struct Column {
    /// Name.
    pub name: String,
    /// `string`, `long`, `double`, `boolean` or `timestamp`.
    #[serde(rename = "type")]
    pub data_type: String,
}

/// A source.
#[derive(Clone, Debug, Deserialize)]
pub struct SourceSpec {
    /// Columns.
    pub schema: Vec<Column>,
    /// A fixed table (stream-static joins).
    #[serde(default, rename = "static")]
    pub is_static: bool,
    /// Rows of a static source.
    #[serde(default)]
    pub rows: Vec<Value>,
}

/// Spark's recorded result.
#[derive(Clone, Debug, Deserialize)]
pub struct Expected {
    /// Output mode.
    #[serde(default)]
    pub output_mode: Option<String>,
    /// Output columns in order.
    #[serde(default)]
    pub output_columns: Vec<Column>,
    /// Per scenario batch.
    #[serde(default)]
    pub batches: Vec<ExpectedBatch>,
    /// The memory sink at the end.
    #[serde(default, rename = "final")]
    pub final_rows: Vec<Value>,
    /// The rejection, for `expect_error` scenarios.
    #[serde(default)]
    pub error: Option<Value>,
}

/// Spark's result for one scenario batch.
#[derive(Clone, Debug, Deserialize)]
pub struct ExpectedBatch {
    /// Scenario batch index.
    pub index: usize,
    /// Rows the sink received.
    pub output: Vec<Value>,
    /// Watermark while the batch's rows were processed.
    pub watermark_during: Option<String>,
    /// Watermark computed from the batch.
    pub watermark_after: Option<String>,
    /// `lastProgress.eventTime.watermark` after the batch.
    #[serde(default)]
    pub last_progress_watermark: Option<String>,
    /// Spark's micro-batches.
    #[serde(default)]
    pub micro_batches: Vec<Value>,
}

impl Scenario {
    /// Reads a scenario file.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}
