//! Contract-aware decoding: turning text records (JSON objects, CSV rows) and foreign
//! Arrow batches (Parquet files, pushed batches) into batches of exactly the contract's
//! schema, without ever losing a record.
//!
//! Every record is either decoded into the output or rejected with a [`RecordProblem`]:
//!
//! | code | when |
//! |---|---|
//! | `ETL701` | the record does not parse (bad JSON, not an object, wrong CSV column count, invalid UTF-8) |
//! | `ETL702` | a value has the wrong type for the schema (`"abc"` for an integer, an object for a string, a number out of the type's range, a decimal with too many digits) |
//! | `ETL703` | a required (non-nullable) field is missing or null |
//! | `ETL704` | a value breaks a [`FieldConstraints`] bound (minimum, maximum, exclusive bounds, lengths, pattern) |
//!
//! The first problem of a record (in schema field order) is the one reported.
//!
//! JSON values map to Arrow as follows: integers and floats to the numeric types (an
//! integral float such as `3.0` is accepted for an integer; out-of-range values are
//! rejected), strings to `Utf8`/`Binary`, booleans to `Boolean`, ISO-8601 strings (with
//! `Z` or an offset; naive means UTC; a bare date means midnight UTC) or epoch
//! milliseconds (numbers) to timestamps, `YYYY-MM-DD` strings to dates, `HH:MM:SS[.f]`
//! strings to times, numbers or strings to decimals (never rounded: more fractional
//! digits than the scale is a rejection), objects to structs and arrays to lists. Unknown
//! extra fields are ignored and a missing nullable field is null.
//!
//! CSV cells are text: an empty cell is null, and the text is parsed with the same rules
//! (epoch milliseconds are digits; struct and list cells hold JSON).

use arrow::array::{new_null_array, Array, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, FieldRef, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use etlantic_core::contract::{Contract, FieldConstraints};
use etlantic_core::data::{RejectedRecord, SourcePosition};
use etlantic_core::diagnostics::{codes, CodeInfo, Error, Result};
use regex::Regex;
use serde_json::Value;
use std::fmt::Display;
use std::sync::Arc;

mod arrays;
mod cells;
mod columns;
mod conform;
mod fast;
#[cfg(test)]
mod tests;

use arrays::build_array;
use cells::{check_cell, json_cell, json_kind, show_str, text_cell};
pub use cells::{millis_to_unit, parse_timestamp, parse_timestamp_in};
use columns::ColumnBuilder;
use conform::{cast_lossless, check_array};

/// Why one record was rejected: a code from the `ETL70x` range, the field at fault and a
/// reason naming the field and the value.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordProblem {
    /// `ETL701`..`ETL704`.
    pub code: &'static CodeInfo,
    /// The field at fault (a dotted path for nested fields), when one is.
    pub field: Option<String>,
    /// Human-readable reason.
    pub reason: String,
}

impl RecordProblem {
    /// A record that does not parse (`ETL701`).
    pub fn unparsable(reason: impl Into<String>) -> Self {
        RecordProblem {
            code: &codes::RECORD_UNPARSABLE,
            field: None,
            reason: reason.into(),
        }
    }

    /// A value of the wrong type (`ETL702`).
    pub fn type_mismatch(field: &str, reason: impl Into<String>) -> Self {
        RecordProblem {
            code: &codes::RECORD_TYPE_MISMATCH,
            field: Some(field.to_string()),
            reason: reason.into(),
        }
    }

    /// A required field that is missing or null (`ETL703`).
    pub fn missing_required(field: &str, how: &str) -> Self {
        RecordProblem {
            code: &codes::RECORD_MISSING_REQUIRED,
            field: Some(field.to_string()),
            reason: format!("required field `{field}` is {how}"),
        }
    }

    /// A value that breaks a contract rule (`ETL704`).
    pub fn rule_violation(field: &str, reason: impl Into<String>) -> Self {
        RecordProblem {
            code: &codes::RECORD_RULE_VIOLATION,
            field: Some(field.to_string()),
            reason: reason.into(),
        }
    }

    /// The rejected record this problem makes, at `position`, with the raw record text.
    pub fn into_rejected(self, position: SourcePosition, raw: impl Into<String>) -> RejectedRecord {
        RejectedRecord {
            code: self.code.code.to_string(),
            reason: self.reason,
            field: self.field,
            position,
            raw: raw.into(),
        }
    }
}

/// The record-level rules of one top-level field ([`FieldConstraints`] with its pattern
/// compiled).
#[derive(Clone, Debug, Default)]
pub struct FieldChecks {
    name: String,
    constraints: FieldConstraints,
    pattern: Option<Regex>,
}

impl FieldChecks {
    /// Compiles the constraints of field `name`. A pattern that is not a valid regular
    /// expression is a contract error (`ETL005`).
    pub fn new(name: &str, constraints: &FieldConstraints) -> Result<Self> {
        let pattern = match &constraints.pattern {
            Some(p) => Some(Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                Error::new(
                    &codes::CONTRACT_INVALID,
                    format!("field `{name}`: pattern `{p}` is not a valid regular expression: {e}"),
                )
            })?),
            None => None,
        };
        Ok(FieldChecks {
            name: name.to_string(),
            constraints: constraints.clone(),
            pattern,
        })
    }

    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty()
    }

    /// Checks a numeric value (`shown` is how the value is named in the reason).
    pub fn check_number(&self, v: f64, shown: &dyn Display) -> Option<RecordProblem> {
        let c = &self.constraints;
        let n = &self.name;
        let fail = |what: String| Some(RecordProblem::rule_violation(n, what));
        if let Some(min) = c.minimum {
            if v < min {
                return fail(format!(
                    "field `{n}`: value {shown} is below the minimum {min}"
                ));
            }
        }
        if let Some(max) = c.maximum {
            if v > max {
                return fail(format!(
                    "field `{n}`: value {shown} is above the maximum {max}"
                ));
            }
        }
        if let Some(min) = c.exclusive_minimum {
            if v <= min {
                return fail(format!(
                    "field `{n}`: value {shown} is not above the exclusive minimum {min}"
                ));
            }
        }
        if let Some(max) = c.exclusive_maximum {
            if v >= max {
                return fail(format!(
                    "field `{n}`: value {shown} is not below the exclusive maximum {max}"
                ));
            }
        }
        if v.is_nan()
            && (c.minimum.is_some()
                || c.maximum.is_some()
                || c.exclusive_minimum.is_some()
                || c.exclusive_maximum.is_some())
        {
            return fail(format!("field `{n}`: value NaN cannot satisfy its bounds"));
        }
        None
    }

    /// Checks a string value (lengths in characters, and the pattern).
    pub fn check_str(&self, s: &str) -> Option<RecordProblem> {
        let c = &self.constraints;
        let n = &self.name;
        if c.min_length.is_some() || c.max_length.is_some() {
            let len = s.chars().count() as u64;
            if let Some(min) = c.min_length {
                if len < min {
                    return Some(RecordProblem::rule_violation(
                        n,
                        format!(
                            "field `{n}`: value {} has {len} characters, fewer than the minimum length {min}",
                            show_str(s)
                        ),
                    ));
                }
            }
            if let Some(max) = c.max_length {
                if len > max {
                    return Some(RecordProblem::rule_violation(
                        n,
                        format!(
                            "field `{n}`: value {} has {len} characters, more than the maximum length {max}",
                            show_str(s)
                        ),
                    ));
                }
            }
        }
        if let Some(re) = &self.pattern {
            if !re.is_match(s) {
                return Some(RecordProblem::rule_violation(
                    n,
                    format!(
                        "field `{n}`: value {} does not match the pattern `{}`",
                        show_str(s),
                        c.pattern.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
        None
    }
}

/// One decoded value, before it becomes part of an Arrow array.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Dec(i128),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Cell>),
    Struct(Vec<Cell>),
}

struct Column {
    field: FieldRef,
    checks: FieldChecks,
}

/// Decodes records into batches of a contract's Arrow schema, checking its record-level
/// rules. Create one per source; it is cheap to clone.
#[derive(Clone)]
pub struct ContractDecoder {
    schema: SchemaRef,
    columns: Arc<Vec<Column>>,
    fast: Arc<fast::FastSchema>,
    fast_path: bool,
}

impl std::fmt::Debug for ContractDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContractDecoder")
            .field("schema", &self.schema)
            .finish()
    }
}

impl ContractDecoder {
    /// A decoder producing `schema`, checking the field constraints of `contract` (when
    /// given). Fails with `ETL304` when the schema has a type the decoder cannot produce,
    /// or `ETL005` when a pattern does not compile.
    pub fn new(schema: SchemaRef, contract: Option<&Contract>) -> Result<Self> {
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            if let Err(t) = supported(field.data_type()) {
                return Err(Error::new(
                    &codes::UNSUPPORTED_TYPE,
                    format!(
                        "field `{}`: sources cannot decode values of type {t}",
                        field.name()
                    ),
                ));
            }
            let constraints = contract
                .and_then(|c| c.field(field.name()))
                .map(|f| f.constraints.clone())
                .unwrap_or_default();
            columns.push(Column {
                field: field.clone(),
                checks: FieldChecks::new(field.name(), &constraints)?,
            });
        }
        Ok(ContractDecoder {
            schema,
            fast: Arc::new(fast::FastSchema::new(&columns)),
            columns: Arc::new(columns),
            fast_path: true,
        })
    }

    /// The schema of every batch produced.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Whether a column of type `found` in the input can be left undecoded (and read as
    /// nulls) without skipping a record-level rule: it is nullable, unconstrained, and of
    /// exactly the contract's type (a conversion could reject values). Unknown columns
    /// cannot.
    pub fn may_skip(&self, name: &str, found: &DataType) -> bool {
        self.columns.iter().any(|c| {
            c.field.name() == name
                && c.field.is_nullable()
                && c.checks.is_empty()
                && c.field.data_type() == found
        })
    }

    /// A builder accumulating decoded records into batches.
    pub fn builder(&self) -> BatchBuilder {
        BatchBuilder {
            decoder: self.clone(),
            columns: self
                .columns
                .iter()
                .map(|c| ColumnBuilder::new(c.field.data_type()))
                .collect(),
            rows: 0,
            scratch: fast::Scratch::default(),
            preset: Vec::new(),
        }
    }

    /// The same decoder with its fast path on (the default) or off. Both decode the same
    /// records into the same values; off, every record takes the per-record path, which is
    /// how tests and benchmarks compare the two.
    pub fn with_fast_path(mut self, on: bool) -> Self {
        self.fast_path = on;
        self
    }

    /// The index of the schema's field `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.field.name() == name)
    }

    /// Conforms an Arrow batch read from elsewhere (a Parquet file, a pushed batch) to the
    /// schema: columns are matched by name, cast where the cast is lossless (e.g. `Int32`
    /// to `Int64`, a timestamp unit change), and missing nullable columns become nulls.
    ///
    /// A missing required column or a cast that may lose data is an error for the whole
    /// batch (`ETL702`). Rows with nulls in non-nullable columns (`ETL703`), values that
    /// a unit change cannot represent exactly (`ETL702`) or values breaking a constraint
    /// (`ETL704`) are returned as `(row index, problem)`; the other rows form the batch.
    pub fn conform_batch(&self, batch: &RecordBatch) -> Result<ConformedBatch> {
        let n = batch.num_rows();
        // One slot per row, allocated when a column may have a problem: clean batches of
        // matching types (the usual case) cost no per-row pass.
        let mut problems: Vec<Option<RecordProblem>> = Vec::new();
        let slots = |p: &mut Vec<Option<RecordProblem>>| {
            if p.is_empty() {
                p.resize(n, None);
            }
        };
        let mut out = Vec::with_capacity(self.columns.len());
        for col in self.columns.iter() {
            let name = col.field.name();
            let target = col.field.data_type();
            let src = match batch.schema().index_of(name) {
                Ok(i) => batch.column(i).clone(),
                Err(_) if col.field.is_nullable() => new_null_array(target, n),
                Err(_) => {
                    return Err(Error::new(
                        &codes::RECORD_TYPE_MISMATCH,
                        format!("column `{name}`, required by the contract, is missing"),
                    ))
                }
            };
            let array = if src.data_type() == target {
                src
            } else {
                slots(&mut problems);
                cast_lossless(&src, target, name, &mut problems)?
            };
            if !col.field.is_nullable() && array.null_count() > 0 {
                slots(&mut problems);
                for (i, p) in problems.iter_mut().enumerate() {
                    if p.is_none() && array.is_null(i) {
                        *p = Some(RecordProblem::missing_required(name, "null"));
                    }
                }
            }
            if !col.checks.is_empty() {
                slots(&mut problems);
                check_array(&array, &col.checks, &mut problems)?;
            }
            out.push(array);
        }
        let rejected: Vec<(usize, RecordProblem)> = problems
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.clone().map(|p| (i, p)))
            .collect();
        let columns = if rejected.is_empty() {
            out
        } else {
            let keep: BooleanArray = problems.iter().map(|p| Some(p.is_none())).collect();
            out.iter()
                .map(|a| arrow::compute::filter(a, &keep))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(engine_error)?
        };
        let rows = n - rejected.len();
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(engine_error)?;
        Ok(ConformedBatch { batch, rejected })
    }

    fn json_record(&self, value: &Value) -> std::result::Result<Vec<Cell>, RecordProblem> {
        let obj = value.as_object().ok_or_else(|| {
            RecordProblem::unparsable(format!(
                "the record is not a JSON object but {}",
                json_kind(value)
            ))
        })?;
        let mut cells = Vec::with_capacity(self.columns.len());
        for col in self.columns.iter() {
            let name = col.field.name();
            let cell = match obj.get(name) {
                None if !col.field.is_nullable() => {
                    return Err(RecordProblem::missing_required(name, "missing"))
                }
                None => Cell::Null,
                Some(v) => json_cell(v, &col.field, name)?,
            };
            check_cell(&cell, col)?;
            cells.push(cell);
        }
        Ok(cells)
    }
}

/// The result of [`ContractDecoder::conform_batch`].
#[derive(Clone, Debug)]
pub struct ConformedBatch {
    /// The good rows, in the decoder's schema.
    pub batch: RecordBatch,
    /// The rejected rows: index in the input batch, and why.
    pub rejected: Vec<(usize, RecordProblem)>,
}

/// Accumulates decoded records; [`BatchBuilder::finish`] turns them into a batch.
///
/// Text records have a fast path ([`BatchBuilder::push_json_text`], and every cell of
/// [`BatchBuilder::push_text`]) that decodes the common shapes straight into Arrow
/// buffers; what it does not recognise with certainty goes through the per-record rules,
/// so both give the same rows and the same rejections.
pub struct BatchBuilder {
    decoder: ContractDecoder,
    columns: Vec<ColumnBuilder>,
    rows: usize,
    scratch: fast::Scratch,
    preset: Vec<bool>,
}

impl BatchBuilder {
    /// Decodes one JSON record (it must be an object). On error nothing is added.
    pub fn push_json(&mut self, value: &Value) -> std::result::Result<(), RecordProblem> {
        let cells = self.decoder.json_record(value)?;
        self.add(cells);
        Ok(())
    }

    /// Decodes the JSON text of one record through the fast path. Returns `false` when
    /// nothing was added because the record needs the per-record rules: parse it with
    /// `serde_json` and give it to [`BatchBuilder::push_json`], which adds it or says why
    /// not. Never adds a record that the per-record rules would reject.
    pub fn push_json_text(&mut self, text: &str) -> bool {
        self.push_json_bytes_with(text.as_bytes(), &[])
    }

    /// [`BatchBuilder::push_json_text`] on bytes not yet known to be UTF-8 (the fast path
    /// checks the strings it reads; a record that is not UTF-8 is left to the per-record
    /// path, which rejects it).
    pub fn push_json_bytes(&mut self, bytes: &[u8]) -> bool {
        self.push_json_bytes_with(bytes, &[])
    }

    /// [`BatchBuilder::push_json_bytes`] with the values of some columns given
    /// (`(column index, value)`, as [`ContractDecoder::column_index`] numbers them): they
    /// take the place of the record's own keys of those names, as if inserted into the
    /// parsed object before [`BatchBuilder::push_json`].
    pub fn push_json_bytes_with(&mut self, bytes: &[u8], given: &[(usize, Value)]) -> bool {
        if !self.decoder.fast_path {
            return false;
        }
        let columns = self.decoder.columns.clone();
        self.preset.clear();
        if !given.is_empty() {
            self.preset.resize(columns.len(), false);
            for (c, v) in given {
                let Some(col) = columns.get(*c) else {
                    return self.undo();
                };
                match json_cell(v, &col.field, col.field.name()) {
                    Ok(cell) if !self.preset[*c] && check_cell(&cell, col).is_ok() => {
                        self.columns[*c].push_cell(cell);
                        self.preset[*c] = true;
                    }
                    _ => return self.undo(),
                }
            }
        }
        let ok = fast::json_record(
            &self.decoder.fast,
            &columns,
            &mut self.columns,
            bytes,
            &self.preset,
            &mut self.scratch,
        );
        if !ok {
            return self.undo();
        }
        self.rows += 1;
        true
    }

    /// Cuts every column back to the rows added; `false`.
    fn undo(&mut self) -> bool {
        for c in &mut self.columns {
            c.truncate(self.rows);
        }
        false
    }

    /// Decodes one text record whose values are aligned with the schema's fields
    /// (`None`: the column is absent; `Some("")`: an empty cell, i.e. null). On error
    /// nothing is added.
    pub fn push_text(&mut self, values: &[Option<&str>]) -> std::result::Result<(), RecordProblem> {
        let columns = self.decoder.columns.clone();
        for (c, (col, v)) in columns.iter().zip(values).enumerate() {
            let name = col.field.name();
            let builder = &mut self.columns[c];
            let done = match v {
                Some(s) if !s.is_empty() && self.decoder.fast_path => {
                    fast::text_cell(&self.decoder.fast, c, col, s, builder)
                }
                _ => false,
            };
            if done {
                continue;
            }
            let cell = match v {
                None if !col.field.is_nullable() => {
                    Err(RecordProblem::missing_required(name, "missing"))
                }
                None => Ok(Cell::Null),
                Some(s) => text_cell(s, &col.field, name),
            }
            .and_then(|cell| check_cell(&cell, col).map(|()| cell));
            match cell {
                Ok(cell) => builder.push_cell(cell),
                Err(p) => {
                    self.undo();
                    return Err(p);
                }
            }
        }
        // Fewer values than fields: the rest are absent.
        for (c, col) in columns.iter().enumerate().skip(values.len()) {
            if !col.field.is_nullable() {
                self.undo();
                return Err(RecordProblem::missing_required(col.field.name(), "missing"));
            }
            self.columns[c].push_null();
        }
        self.rows += 1;
        Ok(())
    }

    fn add(&mut self, cells: Vec<Cell>) {
        for (col, cell) in self.columns.iter_mut().zip(cells) {
            col.push_cell(cell);
        }
        self.rows += 1;
    }

    /// Number of records accumulated since the last [`BatchBuilder::finish`].
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no record is accumulated.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Builds a batch of the accumulated records (`None` when there are none) and starts
    /// over.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.rows == 0 {
            return Ok(None);
        }
        let rows = std::mem::take(&mut self.rows);
        let mut arrays = Vec::with_capacity(self.columns.len());
        for col in self.columns.iter_mut() {
            debug_assert_eq!(col.len(), rows);
            arrays.push(col.finish().map_err(engine_error)?);
        }
        let batch = RecordBatch::try_new_with_options(
            self.decoder.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(engine_error)?;
        Ok(Some(batch))
    }
}

fn engine_error(e: ArrowError) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"))
}

pub use etlantic_core::data::row_as_json;

// ---------------------------------------------------------------------------------------
// Supported types

fn supported(dt: &DataType) -> std::result::Result<(), DataType> {
    use DataType::*;
    match dt {
        Boolean
        | Int8
        | Int16
        | Int32
        | Int64
        | UInt8
        | UInt16
        | UInt32
        | UInt64
        | Float32
        | Float64
        | Utf8
        | LargeUtf8
        | Binary
        | LargeBinary
        | Date32
        | Date64
        | Timestamp(_, _)
        | Decimal128(_, _) => Ok(()),
        Time32(TimeUnit::Second | TimeUnit::Millisecond)
        | Time64(TimeUnit::Microsecond | TimeUnit::Nanosecond) => Ok(()),
        Struct(fields) => fields.iter().try_for_each(|f| supported(f.data_type())),
        List(item) => supported(item.data_type()),
        other => Err(other.clone()),
    }
}
