//! Data exchanged between plugins: Arrow tables, offsets, source positions and rejected
//! records.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};

/// A materialised Arrow table: a schema and zero or more record batches of that schema.
///
/// This is what crosses a backend transition and what sinks receive.
#[derive(Clone, Debug)]
pub struct Table {
    /// The schema of every batch.
    pub schema: SchemaRef,
    /// The rows, in batches.
    pub batches: Vec<RecordBatch>,
}

impl Table {
    /// A table with no rows.
    pub fn empty(schema: SchemaRef) -> Self {
        Table {
            schema,
            batches: Vec::new(),
        }
    }

    /// A table from batches (the schema is the given one, not re-derived).
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Table { schema, batches }
    }

    /// Total number of rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// Casts every column to `schema`'s type (the lossless conversions the planner
    /// accepts) and orders columns as `schema` does. Nullability is the contract's
    /// business, not Arrow's: when data holds nulls in a non-nullable column the batch
    /// keeps a nullable field so that record-level checks can report them.
    pub fn conform_to(self, schema: &SchemaRef) -> crate::Result<Table> {
        use crate::diagnostics::{codes, Error};
        if self.schema.fields() == schema.fields() {
            return Ok(Table::new(schema.clone(), self.batches));
        }
        let relaxed = std::sync::Arc::new(arrow::datatypes::Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let mut out = Vec::with_capacity(self.batches.len());
        let mut all_strict = true;
        for b in &self.batches {
            let mut cols = Vec::with_capacity(schema.fields().len());
            for f in schema.fields() {
                let col = b.column_by_name(f.name()).ok_or_else(|| {
                    Error::new(
                        &codes::SINK_CONTRACT_MISMATCH,
                        format!("column `{}` is missing", f.name()),
                    )
                })?;
                cols.push(arrow::compute::cast(col, f.data_type()).map_err(|e| {
                    Error::new(
                        &codes::SINK_CONTRACT_MISMATCH,
                        format!("column `{}`: {e}", f.name()),
                    )
                })?);
            }
            let batch = match RecordBatch::try_new(schema.clone(), cols.clone()) {
                Ok(b) => b,
                Err(_) => {
                    all_strict = false;
                    RecordBatch::try_new(relaxed.clone(), cols)
                        .map_err(|e| Error::new(&codes::ENGINE_ERROR, e.to_string()))?
                }
            };
            out.push(batch);
        }
        let schema = if all_strict { schema.clone() } else { relaxed };
        let out = out
            .into_iter()
            .map(|b| {
                b.with_schema(schema.clone())
                    .expect("same columns, looser or equal nullability")
            })
            .collect();
        Ok(Table::new(schema, out))
    }

    /// Concatenates all batches into one (an empty batch when there are none).
    pub fn concat(&self) -> arrow::error::Result<RecordBatch> {
        arrow::compute::concat_batches(&self.schema, &self.batches)
    }
}

/// A source-defined position in its input, serialised into the offsets log.
///
/// Offsets are opaque to the runtime; only the source that produced an offset interprets
/// it. They must be plain JSON so that the checkpoint stays readable and portable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Offset(pub serde_json::Value);

/// Where a record came from, precisely enough to find it again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    /// The logical asset read.
    pub asset: String,
    /// The file, relative to the project root where possible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// 1-based line in a text file (JSON lines, CSV including its header line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// 0-based row in a file or table without lines (Parquet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row: Option<u64>,
    /// Topic of a log (Kafka).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Partition of a partitioned log (Kafka).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// Offset inside the partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.asset)?;
        if let Some(file) = &self.file {
            write!(f, " {file}")?;
        }
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(r) = self.row {
            write!(f, " row {r}")?;
        }
        if let Some(t) = &self.topic {
            write!(f, " topic {t}")?;
        }
        if let (Some(p), Some(o)) = (self.partition, self.offset) {
            write!(f, " partition {p} offset {o}")?;
        }
        Ok(())
    }
}

/// A record that did not pass its contract, with why and where from.
///
/// Rejected records are never dropped: the runtime writes them to the quarantine output
/// (or fails the run when the policy says so) and counts them in the run report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectedRecord {
    /// Diagnostic code of the reason, e.g. `ETL702`.
    pub code: String,
    /// Human-readable reason naming the field and the value.
    pub reason: String,
    /// The field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Where the record came from.
    pub position: SourcePosition,
    /// The raw record as read (a text line, or the row rendered as JSON).
    pub raw: String,
}

/// Row `row` of `batch` rendered as one JSON object (nulls explicit): how a record that
/// was decoded before it was rejected is kept as its `raw` text. Empty if the row cannot
/// be rendered.
pub fn row_as_json(batch: &RecordBatch, row: usize) -> String {
    let slice = batch.slice(row, 1);
    let mut writer = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::LineDelimited>(Vec::new());
    if writer.write(&slice).and_then(|_| writer.finish()).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&writer.into_inner())
        .trim_end()
        .to_string()
}
