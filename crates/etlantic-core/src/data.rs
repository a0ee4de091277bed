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

impl SourcePosition {
    /// The position `k` records further on: the line, else the row, else the offset moves
    /// by `k` (the one counter a position of this kind has).
    pub fn advanced(&self, k: u64) -> SourcePosition {
        let mut p = self.clone();
        if let Some(l) = &mut p.line {
            *l += k;
        } else if let Some(r) = &mut p.row {
            *r += k;
        } else if let Some(o) = &mut p.offset {
            *o += k as i64;
        }
        p
    }
}

/// Consecutive good rows of one read that came from consecutive places: `rows` rows, the
/// first at `first`, each next one at the previous position advanced by one
/// ([`SourcePosition::advanced`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginRun {
    /// The position of the run's first row.
    pub first: SourcePosition,
    /// How many rows the run has.
    pub rows: u64,
}

/// The source positions of the good rows of one read, in row order, as runs. A source
/// that knows where its rows came from fills it as it decodes (a rejected line ends a
/// run), so that rows a quality rule takes out later are quarantined with their real
/// position; one that does not leaves it empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowOrigins {
    runs: Vec<OriginRun>,
    /// Rows before each run (for lookups by row).
    starts: Vec<u64>,
    rows: u64,
}

impl RowOrigins {
    /// Appends `rows` rows, the first at `first`.
    pub fn push_run(&mut self, first: SourcePosition, rows: u64) {
        if rows == 0 {
            return;
        }
        self.starts.push(self.rows);
        self.runs.push(OriginRun { first, rows });
        self.rows += rows;
    }

    /// The number of rows whose positions are known.
    pub fn len(&self) -> u64 {
        self.rows
    }

    /// Whether no position is known.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The runs, in row order.
    pub fn runs(&self) -> &[OriginRun] {
        &self.runs
    }

    /// The position of row `i` (0-based over the read), if known.
    pub fn position(&self, i: u64) -> Option<SourcePosition> {
        if i >= self.rows {
            return None;
        }
        let run = self.starts.partition_point(|&s| s <= i) - 1;
        Some(self.runs[run].first.advanced(i - self.starts[run]))
    }
}

/// Records a source could not read any more because they were gone (a Kafka
/// partition's retention deleted them before the query read them). A source reports a
/// loss only when its binding allows the query to go on past one (Spark's
/// `failOnDataLoss=false`); otherwise it fails with `ETL712`. The runtime shows every loss
/// in the micro-batch's progress record and in the run report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataLoss {
    /// The first record lost.
    pub from: SourcePosition,
    /// How many records were lost, when the source can tell (offsets `from..from+records`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// What happened, for people.
    pub reason: String,
}

/// How much a source holds that the query has not read yet (its lag behind the source):
/// what `etlantic status` and the metrics show. Each figure is `None` when the source
/// cannot tell it cheaply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backlog {
    /// Records not yet read (a Kafka topic: the offsets behind the partitions' ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Files not yet read (a directory stream: files found and waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// Bytes not yet read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: &str, line: Option<u64>, row: Option<u64>) -> SourcePosition {
        SourcePosition {
            asset: "a".into(),
            file: Some(file.into()),
            line,
            row,
            ..SourcePosition::default()
        }
    }

    #[test]
    fn row_origins_find_each_rows_position_across_runs() {
        let mut o = RowOrigins::default();
        o.push_run(at("x.jsonl", Some(1), None), 3); // lines 1-3
        o.push_run(at("x.jsonl", Some(5), None), 0); // empty: ignored
        o.push_run(at("x.jsonl", Some(5), None), 2); // lines 5-6 (line 4 was rejected)
        o.push_run(at("y.parquet", None, Some(0)), 4); // rows 0-3
        assert_eq!(o.len(), 9);
        assert_eq!(o.runs().len(), 3);
        let got: Vec<(Option<String>, Option<u64>, Option<u64>)> = (0..9)
            .map(|i| {
                let p = o.position(i).unwrap();
                (p.file, p.line, p.row)
            })
            .collect();
        let x = Some("x.jsonl".to_string());
        let y = Some("y.parquet".to_string());
        assert_eq!(
            got,
            vec![
                (x.clone(), Some(1), None),
                (x.clone(), Some(2), None),
                (x.clone(), Some(3), None),
                (x.clone(), Some(5), None),
                (x, Some(6), None),
                (y.clone(), None, Some(0)),
                (y.clone(), None, Some(1)),
                (y.clone(), None, Some(2)),
                (y, None, Some(3)),
            ]
        );
        assert_eq!(o.position(9), None);
        assert_eq!(RowOrigins::default().position(0), None);
        let kafka = SourcePosition {
            asset: "a".into(),
            topic: Some("t".into()),
            partition: Some(1),
            offset: Some(40),
            ..SourcePosition::default()
        };
        assert_eq!(kafka.advanced(2).offset, Some(42));
    }
}
