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

use arrow::array::{
    make_array, new_null_array, Array, ArrayRef, BinaryArray, BooleanArray, Date32Array,
    Date64Array, Decimal128Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    Int8Array, LargeBinaryArray, LargeStringArray, ListArray, RecordBatch, RecordBatchOptions,
    StringArray, StructArray, Time32MillisecondArray, Time32SecondArray, Time64MicrosecondArray,
    Time64NanosecondArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array,
    UInt8Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, FieldRef, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc};
use etlantic_core::contract::{Contract, FieldConstraints};
use etlantic_core::data::{RejectedRecord, SourcePosition};
use etlantic_core::diagnostics::{codes, CodeInfo, Error, Result};
use regex::Regex;
use serde_json::Value;
use std::fmt::Display;
use std::sync::Arc;

mod columns;
mod fast;

use columns::ColumnBuilder;

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

// ---------------------------------------------------------------------------------------
// Values → cells

fn show_str(s: &str) -> String {
    show(&Value::String(s.to_string()))
}

fn show(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn type_name(dt: &DataType) -> String {
    use DataType::*;
    match dt {
        Boolean => "a boolean".into(),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            format!("an integer ({dt})")
        }
        Float32 | Float64 => format!("a number ({dt})"),
        Decimal128(p, s) => format!("a decimal({p},{s})"),
        Utf8 | LargeUtf8 => "a string".into(),
        Binary | LargeBinary => "a string (binary)".into(),
        Date32 | Date64 => "a date (YYYY-MM-DD)".into(),
        Time32(_) | Time64(_) => "a time (HH:MM:SS)".into(),
        Timestamp(_, _) => "a timestamp (ISO-8601 string or epoch milliseconds)".into(),
        Struct(_) => "an object".into(),
        List(_) => "an array".into(),
        other => other.to_string(),
    }
}

fn int_range(dt: &DataType) -> (i128, i128) {
    use DataType::*;
    match dt {
        Int8 => (i8::MIN as i128, i8::MAX as i128),
        Int16 => (i16::MIN as i128, i16::MAX as i128),
        Int32 => (i32::MIN as i128, i32::MAX as i128),
        Int64 => (i64::MIN as i128, i64::MAX as i128),
        UInt8 => (0, u8::MAX as i128),
        UInt16 => (0, u16::MAX as i128),
        UInt32 => (0, u32::MAX as i128),
        _ => (0, u64::MAX as i128),
    }
}

fn is_signed(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    )
}

fn int_cell(
    v: i128,
    dt: &DataType,
    path: &str,
    shown: &str,
) -> std::result::Result<Cell, RecordProblem> {
    let (lo, hi) = int_range(dt);
    if v < lo || v > hi {
        return Err(RecordProblem::type_mismatch(
            path,
            format!("field `{path}`: value {shown} is out of range for {dt}"),
        ));
    }
    Ok(if is_signed(dt) {
        Cell::Int(v as i64)
    } else {
        Cell::UInt(v as u64)
    })
}

fn json_integer(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i as i128);
    }
    if let Some(u) = n.as_u64() {
        return Some(u as i128);
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 1.0e20).then_some(f as i128)
}

fn float_cell(
    f: f64,
    dt: &DataType,
    path: &str,
    shown: &str,
) -> std::result::Result<Cell, RecordProblem> {
    if *dt == DataType::Float32 && f.is_finite() && f.abs() > f32::MAX as f64 {
        return Err(RecordProblem::type_mismatch(
            path,
            format!("field `{path}`: value {shown} is out of range for Float32"),
        ));
    }
    Ok(Cell::Float(f))
}

fn json_cell(v: &Value, field: &Field, path: &str) -> std::result::Result<Cell, RecordProblem> {
    if v.is_null() {
        return if field.is_nullable() {
            Ok(Cell::Null)
        } else {
            Err(RecordProblem::missing_required(path, "null"))
        };
    }
    let dt = field.data_type();
    let wrong = || {
        RecordProblem::type_mismatch(
            path,
            format!(
                "field `{path}`: expected {}, got {} {}",
                type_name(dt),
                json_kind(v),
                show(v)
            ),
        )
    };
    use DataType::*;
    match dt {
        Boolean => v.as_bool().map(Cell::Bool).ok_or_else(wrong),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => match v {
            Value::Number(n) => {
                let i = json_integer(n).ok_or_else(wrong)?;
                int_cell(i, dt, path, &show(v))
            }
            _ => Err(wrong()),
        },
        Float32 | Float64 => match v {
            Value::Number(n) => float_cell(n.as_f64().ok_or_else(wrong)?, dt, path, &show(v)),
            _ => Err(wrong()),
        },
        Utf8 | LargeUtf8 => v
            .as_str()
            .map(|s| Cell::Str(s.to_string()))
            .ok_or_else(wrong),
        Binary | LargeBinary => v
            .as_str()
            .map(|s| Cell::Bytes(s.as_bytes().to_vec()))
            .ok_or_else(wrong),
        Decimal128(p, s) => {
            let text = match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.trim().to_string(),
                _ => return Err(wrong()),
            };
            parse_decimal(&text, *p, *s)
                .map(Cell::Dec)
                .map_err(|why| decimal_problem(path, v, *p, *s, why))
        }
        Date32 | Date64 => {
            let s = v.as_str().ok_or_else(wrong)?;
            date_cell(s, dt).ok_or_else(wrong)
        }
        Time32(_) | Time64(_) => {
            let s = v.as_str().ok_or_else(wrong)?;
            time_cell(s, dt).ok_or_else(wrong)
        }
        Timestamp(unit, tz) => {
            let t = match v {
                Value::String(s) => {
                    parse_timestamp_in(s, tz.as_deref()).and_then(|t| datetime_to_unit(&t, *unit))
                }
                Value::Number(n) => json_integer(n)
                    .and_then(|ms| i64::try_from(ms).ok())
                    .and_then(|ms| millis_to_unit(ms, *unit)),
                _ => None,
            };
            t.map(Cell::Int).ok_or_else(wrong)
        }
        Struct(fields) => {
            let obj = v.as_object().ok_or_else(wrong)?;
            let mut cells = Vec::with_capacity(fields.len());
            for child in fields.iter() {
                let child_path = format!("{path}.{}", child.name());
                let cell = match obj.get(child.name()) {
                    None if !child.is_nullable() => {
                        return Err(RecordProblem::missing_required(&child_path, "missing"))
                    }
                    None => Cell::Null,
                    Some(cv) => json_cell(cv, child, &child_path)?,
                };
                cells.push(cell);
            }
            Ok(Cell::Struct(cells))
        }
        List(item) => {
            let arr = v.as_array().ok_or_else(wrong)?;
            let mut cells = Vec::with_capacity(arr.len());
            for (i, iv) in arr.iter().enumerate() {
                cells.push(json_cell(iv, item, &format!("{path}[{i}]"))?);
            }
            Ok(Cell::List(cells))
        }
        _ => Err(wrong()),
    }
}

fn text_cell(s: &str, field: &Field, path: &str) -> std::result::Result<Cell, RecordProblem> {
    if s.is_empty() {
        return if field.is_nullable() {
            Ok(Cell::Null)
        } else {
            Err(RecordProblem::missing_required(path, "empty"))
        };
    }
    let dt = field.data_type();
    let wrong = || {
        RecordProblem::type_mismatch(
            path,
            format!(
                "field `{path}`: expected {}, got {}",
                type_name(dt),
                show_str(s)
            ),
        )
    };
    let t = s.trim();
    use DataType::*;
    match dt {
        Boolean => {
            if t.eq_ignore_ascii_case("true") {
                Ok(Cell::Bool(true))
            } else if t.eq_ignore_ascii_case("false") {
                Ok(Cell::Bool(false))
            } else {
                Err(wrong())
            }
        }
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            let i: i128 = t.parse().map_err(|_| wrong())?;
            int_cell(i, dt, path, t)
        }
        Float32 | Float64 => float_cell(t.parse().map_err(|_| wrong())?, dt, path, t),
        Utf8 | LargeUtf8 => Ok(Cell::Str(s.to_string())),
        Binary | LargeBinary => Ok(Cell::Bytes(s.as_bytes().to_vec())),
        Decimal128(p, sc) => parse_decimal(t, *p, *sc)
            .map(Cell::Dec)
            .map_err(|why| decimal_problem(path, &Value::String(t.to_string()), *p, *sc, why)),
        Date32 | Date64 => date_cell(t, dt).ok_or_else(wrong),
        Time32(_) | Time64(_) => time_cell(t, dt).ok_or_else(wrong),
        Timestamp(unit, tz) => {
            let v = if let Ok(ms) = t.parse::<i64>() {
                millis_to_unit(ms, *unit)
            } else {
                parse_timestamp_in(t, tz.as_deref()).and_then(|d| datetime_to_unit(&d, *unit))
            };
            v.map(Cell::Int).ok_or_else(wrong)
        }
        Struct(_) | List(_) => {
            let v: Value = serde_json::from_str(t).map_err(|_| wrong())?;
            json_cell(&v, field, path)
        }
        _ => Err(wrong()),
    }
}

fn decimal_problem(path: &str, v: &Value, p: u8, s: i8, why: DecimalError) -> RecordProblem {
    let reason = match why {
        DecimalError::Syntax => format!(
            "field `{path}`: expected a decimal({p},{s}), got {} {}",
            json_kind(v),
            show(v)
        ),
        DecimalError::Scale => format!(
            "field `{path}`: value {} has more than {s} decimal places (decimal({p},{s})); it is not rounded",
            show(v)
        ),
        DecimalError::Precision => format!(
            "field `{path}`: value {} does not fit decimal({p},{s})",
            show(v)
        ),
    };
    RecordProblem::type_mismatch(path, reason)
}

fn check_cell(cell: &Cell, col: &Column) -> std::result::Result<(), RecordProblem> {
    if col.checks.is_empty() {
        return Ok(());
    }
    let problem = match cell {
        Cell::Int(i) => col.checks.check_number(*i as f64, i),
        Cell::UInt(u) => col.checks.check_number(*u as f64, u),
        Cell::Float(f) => col.checks.check_number(*f, f),
        Cell::Dec(d) => {
            if let DataType::Decimal128(_, s) = col.field.data_type() {
                let v = *d as f64 / 10f64.powi(*s as i32);
                col.checks.check_number(v, &v)
            } else {
                None
            }
        }
        Cell::Str(s) => col.checks.check_str(s),
        _ => None,
    };
    match problem {
        Some(p) => Err(p),
        None => Ok(()),
    }
}

/// Why a decimal did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecimalError {
    Syntax,
    Scale,
    Precision,
}

/// Parses a decimal number (`-12.50`, `1e3`, `+.5`) into its unscaled value at `scale`,
/// refusing rounding and overflow.
fn parse_decimal(text: &str, precision: u8, scale: i8) -> std::result::Result<i128, DecimalError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
        negative = bytes[i] == b'-';
        i += 1;
    }
    let mut digits = String::new();
    let mut frac_len: i64 = 0;
    let mut seen_digit = false;
    let mut seen_dot = false;
    while i < bytes.len() {
        match bytes[i] {
            b'0'..=b'9' => {
                digits.push(bytes[i] as char);
                seen_digit = true;
                if seen_dot {
                    frac_len += 1;
                }
            }
            b'.' if !seen_dot => seen_dot = true,
            b'e' | b'E' => break,
            _ => return Err(DecimalError::Syntax),
        }
        i += 1;
    }
    if !seen_digit {
        return Err(DecimalError::Syntax);
    }
    let mut exp: i64 = 0;
    if i < bytes.len() {
        let e = &text[i + 1..];
        if e.is_empty() {
            return Err(DecimalError::Syntax);
        }
        exp = e.parse().map_err(|_| DecimalError::Syntax)?;
    }
    // value = digits * 10^(exp - frac_len)
    let mut exp10 = exp - frac_len;
    let mut digits = digits.trim_start_matches('0').to_string();
    while digits.ends_with('0') {
        digits.pop();
        exp10 += 1;
    }
    if digits.is_empty() {
        return Ok(0);
    }
    let shift = scale as i64 + exp10;
    if shift < 0 {
        return Err(DecimalError::Scale);
    }
    if digits.len() as i64 + shift > precision as i64 {
        return Err(DecimalError::Precision);
    }
    let mut v: i128 = digits.parse().map_err(|_| DecimalError::Precision)?;
    for _ in 0..shift {
        v = v.checked_mul(10).ok_or(DecimalError::Precision)?;
    }
    Ok(if negative { -v } else { v })
}

const EPOCH_DAYS_CE: i32 = 719_163;

fn date_cell(s: &str, dt: &DataType) -> Option<Cell> {
    let d = NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").ok()?;
    let days = d.num_days_from_ce() - EPOCH_DAYS_CE;
    Some(match dt {
        DataType::Date64 => Cell::Int(days as i64 * 86_400_000),
        _ => Cell::Int(days as i64),
    })
}

fn time_cell(s: &str, dt: &DataType) -> Option<Cell> {
    let t = NaiveTime::parse_from_str(s.trim(), "%H:%M:%S%.f")
        .or_else(|_| NaiveTime::parse_from_str(s.trim(), "%H:%M"))
        .ok()?;
    let nanos = t.num_seconds_from_midnight() as i64 * 1_000_000_000 + t.nanosecond() as i64;
    Some(Cell::Int(match dt {
        DataType::Time32(TimeUnit::Second) => nanos / 1_000_000_000,
        DataType::Time32(TimeUnit::Millisecond) => nanos / 1_000_000,
        DataType::Time64(TimeUnit::Microsecond) => nanos / 1_000,
        _ => nanos,
    }))
}

/// Parses an ISO-8601 timestamp like [`parse_timestamp`], except that a naive value (no
/// `Z`, no offset) is local time in `zone` (an IANA name or an offset) when the column has
/// a zone other than UTC — the contract's `defaultTimezone`. A local time that does not
/// exist (a DST gap) is not a timestamp; an ambiguous one takes the earlier instant.
pub fn parse_timestamp_in(s: &str, zone: Option<&str>) -> Option<DateTime<Utc>> {
    let zone = match zone {
        None | Some("UTC") | Some("+00:00") | Some("Z") | Some("Etc/UTC") => {
            return parse_timestamp(s)
        }
        Some(z) => z,
    };
    let t = s.trim();
    let has_offset = t.ends_with(['Z', 'z'])
        || DateTime::parse_from_rfc3339(t).is_ok()
        // Bytes, not a `str` slice: offset 10 may fall inside a multi-byte character.
        || t.as_bytes()
            .get(10..)
            .is_some_and(|rest| rest.contains(&b'+') || rest.contains(&b'-'));
    if has_offset {
        return parse_timestamp(s);
    }
    let naive = parse_timestamp(s)?.naive_utc();
    let tz: arrow::array::timezone::Tz = zone.parse().ok()?;
    use chrono::TimeZone;
    tz.from_local_datetime(&naive)
        .earliest()
        .map(|d| d.with_timezone(&Utc))
}

/// Parses an ISO-8601 timestamp: with `Z` or an offset, or naive (taken as UTC), with `T`
/// or a space between date and time, with or without fractional seconds; a bare date is
/// midnight UTC.
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    for fmt in [
        "%Y-%m-%dT%H:%M:%S%.f%:z",
        "%Y-%m-%d %H:%M:%S%.f%:z",
        "%Y-%m-%dT%H:%M:%S%.f%z",
        "%Y-%m-%d %H:%M:%S%.f%z",
        "%Y-%m-%dT%H:%M%:z",
        "%Y-%m-%d %H:%M%:z",
    ] {
        if let Ok(t) = DateTime::parse_from_str(s, fmt) {
            return Some(t.with_timezone(&Utc));
        }
    }
    let naive = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix('z'))
        .unwrap_or(s);
    for fmt in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(naive, fmt) {
            return Some(t.and_utc());
        }
    }
    if naive.len() == 10 {
        if let Ok(d) = NaiveDate::parse_from_str(naive, "%Y-%m-%d") {
            return Some(d.and_hms_opt(0, 0, 0)?.and_utc());
        }
    }
    None
}

fn datetime_to_unit(t: &DateTime<Utc>, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => Some(t.timestamp()),
        TimeUnit::Millisecond => Some(t.timestamp_millis()),
        TimeUnit::Microsecond => Some(t.timestamp_micros()),
        TimeUnit::Nanosecond => t.timestamp_nanos_opt(),
    }
}

/// Converts epoch milliseconds to a value of `unit` (floor for seconds).
pub fn millis_to_unit(ms: i64, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => Some(ms.div_euclid(1000)),
        TimeUnit::Millisecond => Some(ms),
        TimeUnit::Microsecond => ms.checked_mul(1_000),
        TimeUnit::Nanosecond => ms.checked_mul(1_000_000),
    }
}

// ---------------------------------------------------------------------------------------
// Cells → arrays

impl Cell {
    fn as_i64(&self) -> Option<i64> {
        match self {
            Cell::Int(v) => Some(*v),
            Cell::UInt(v) => Some(*v as i64),
            _ => None,
        }
    }
    fn as_u64(&self) -> Option<u64> {
        match self {
            Cell::UInt(v) => Some(*v),
            Cell::Int(v) => Some(*v as u64),
            _ => None,
        }
    }
    fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::Float(v) => Some(*v),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            Cell::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Cell::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

fn nulls_of(valid: Vec<bool>) -> Option<NullBuffer> {
    if valid.iter().all(|v| *v) {
        None
    } else {
        Some(NullBuffer::from(valid))
    }
}

pub(crate) fn build_array(
    dt: &DataType,
    cells: Vec<Cell>,
) -> std::result::Result<ArrayRef, ArrowError> {
    use DataType::*;
    macro_rules! ints {
        ($arr:ty, $t:ty) => {
            Arc::new(<$arr>::from_iter(
                cells.iter().map(|c| c.as_i64().map(|v| v as $t)),
            )) as ArrayRef
        };
    }
    macro_rules! uints {
        ($arr:ty, $t:ty) => {
            Arc::new(<$arr>::from_iter(
                cells.iter().map(|c| c.as_u64().map(|v| v as $t)),
            )) as ArrayRef
        };
    }
    Ok(match dt {
        Boolean => Arc::new(BooleanArray::from_iter(cells.iter().map(|c| match c {
            Cell::Bool(b) => Some(*b),
            _ => None,
        }))),
        Int8 => ints!(Int8Array, i8),
        Int16 => ints!(Int16Array, i16),
        Int32 => ints!(Int32Array, i32),
        Int64 => ints!(Int64Array, i64),
        UInt8 => uints!(UInt8Array, u8),
        UInt16 => uints!(UInt16Array, u16),
        UInt32 => uints!(UInt32Array, u32),
        UInt64 => uints!(UInt64Array, u64),
        Float32 => Arc::new(Float32Array::from_iter(
            cells.iter().map(|c| c.as_f64().map(|v| v as f32)),
        )),
        Float64 => Arc::new(Float64Array::from_iter(cells.iter().map(Cell::as_f64))),
        Utf8 => Arc::new(StringArray::from_iter(cells.iter().map(Cell::as_str))),
        LargeUtf8 => Arc::new(LargeStringArray::from_iter(cells.iter().map(Cell::as_str))),
        Binary => Arc::new(BinaryArray::from_iter(cells.iter().map(Cell::as_bytes))),
        LargeBinary => Arc::new(LargeBinaryArray::from_iter(
            cells.iter().map(Cell::as_bytes),
        )),
        Date32 => ints!(Date32Array, i32),
        Date64 => ints!(Date64Array, i64),
        Time32(TimeUnit::Second) => ints!(Time32SecondArray, i32),
        Time32(_) => ints!(Time32MillisecondArray, i32),
        Time64(TimeUnit::Microsecond) => ints!(Time64MicrosecondArray, i64),
        Time64(_) => ints!(Time64NanosecondArray, i64),
        Timestamp(unit, tz) => {
            let values = cells.iter().map(Cell::as_i64);
            match unit {
                TimeUnit::Second => {
                    Arc::new(TimestampSecondArray::from_iter(values).with_timezone_opt(tz.clone()))
                        as ArrayRef
                }
                TimeUnit::Millisecond => Arc::new(
                    TimestampMillisecondArray::from_iter(values).with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Microsecond => Arc::new(
                    TimestampMicrosecondArray::from_iter(values).with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Nanosecond => Arc::new(
                    TimestampNanosecondArray::from_iter(values).with_timezone_opt(tz.clone()),
                ),
            }
        }
        Decimal128(p, s) => Arc::new(
            Decimal128Array::from_iter(cells.iter().map(|c| match c {
                Cell::Dec(v) => Some(*v),
                _ => None,
            }))
            .with_precision_and_scale(*p, *s)?,
        ),
        Struct(fields) => {
            let mut children: Vec<Vec<Cell>> = fields.iter().map(|_| Vec::new()).collect();
            let mut valid = Vec::with_capacity(cells.len());
            for cell in cells {
                match cell {
                    Cell::Struct(values) => {
                        for (child, v) in children.iter_mut().zip(values) {
                            child.push(v);
                        }
                        valid.push(true);
                    }
                    _ => {
                        for child in children.iter_mut() {
                            child.push(Cell::Null);
                        }
                        valid.push(false);
                    }
                }
            }
            let arrays = fields
                .iter()
                .zip(children)
                .map(|(f, c)| build_array(f.data_type(), c))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            if fields.is_empty() {
                Arc::new(StructArray::new_empty_fields(valid.len(), nulls_of(valid)))
            } else {
                Arc::new(StructArray::try_new(
                    fields.clone(),
                    arrays,
                    nulls_of(valid),
                )?)
            }
        }
        List(item) => {
            let mut offsets = Vec::with_capacity(cells.len() + 1);
            offsets.push(0i32);
            let mut values = Vec::new();
            let mut valid = Vec::with_capacity(cells.len());
            for cell in cells {
                match cell {
                    Cell::List(items) => {
                        values.extend(items);
                        valid.push(true);
                    }
                    _ => valid.push(false),
                }
                let len = i32::try_from(values.len()).map_err(|_| {
                    ArrowError::ComputeError("list values exceed i32 offsets".into())
                })?;
                offsets.push(len);
            }
            let child = build_array(item.data_type(), values)?;
            Arc::new(ListArray::try_new(
                item.clone(),
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                child,
                nulls_of(valid),
            )?)
        }
        other => {
            return Err(ArrowError::NotYetImplemented(format!(
                "decoding into {other}"
            )))
        }
    })
}

// ---------------------------------------------------------------------------------------
// Arrow → Arrow (Parquet, pushed batches)

fn unit_rank(u: &TimeUnit) -> u8 {
    match u {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    }
}

fn int_digits(dt: &DataType) -> Option<u8> {
    use DataType::*;
    Some(match dt {
        Int8 | UInt8 => 3,
        Int16 | UInt16 => 5,
        Int32 | UInt32 => 10,
        Int64 => 19,
        UInt64 => 20,
        _ => return None,
    })
}

/// Whether casting `from` to `to` never loses information: `Some(false)` always exact,
/// `Some(true)` exact only for some values (each row is checked by a round trip),
/// `None` not allowed.
fn lossless(from: &DataType, to: &DataType) -> Option<bool> {
    use DataType::*;
    if from == to {
        return Some(false);
    }
    let exact = Some(false);
    match (from, to) {
        (Null, _) => exact,
        (Dictionary(_, v), t) => lossless(v, t),
        (Int8, Int16 | Int32 | Int64 | Float32 | Float64) => exact,
        (Int16, Int32 | Int64 | Float32 | Float64) => exact,
        (Int32, Int64 | Float64) => exact,
        (UInt8, UInt16 | UInt32 | UInt64 | Int16 | Int32 | Int64 | Float32 | Float64) => exact,
        (UInt16, UInt32 | UInt64 | Int32 | Int64 | Float32 | Float64) => exact,
        (UInt32, UInt64 | Int64 | Float64) => exact,
        (Float16, Float32 | Float64) | (Float32, Float64) => exact,
        (f, Decimal128(p, s)) if int_digits(f).is_some() => {
            (*p as i16 - *s as i16 >= int_digits(f).unwrap_or(u8::MAX) as i16).then_some(false)
        }
        (Decimal32(p1, s1) | Decimal64(p1, s1) | Decimal128(p1, s1), Decimal128(p2, s2)) => {
            (s2 >= s1 && (*p2 as i16 - *s2 as i16) >= (*p1 as i16 - *s1 as i16)).then_some(false)
        }
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8) => exact,
        (Binary | LargeBinary | BinaryView | FixedSizeBinary(_), Binary | LargeBinary) => exact,
        (Date32, Date64) => exact,
        (Date64, Date32) => Some(true),
        (Timestamp(fu, _), Timestamp(tu, _)) => Some(unit_rank(fu) > unit_rank(tu)),
        (Time32(fu) | Time64(fu), Time32(tu) | Time64(tu)) => Some(unit_rank(fu) > unit_rank(tu)),
        (List(a) | LargeList(a), List(b)) => match lossless(a.data_type(), b.data_type()) {
            Some(false) => exact,
            _ => None,
        },
        (Struct(fa), Struct(fb)) => {
            let same = fa.len() == fb.len()
                && fa.iter().zip(fb.iter()).all(|(a, b)| {
                    a.name() == b.name() && lossless(a.data_type(), b.data_type()) == Some(false)
                });
            same.then_some(false)
        }
        _ => None,
    }
}

fn cast_lossless(
    src: &ArrayRef,
    to: &DataType,
    name: &str,
    problems: &mut [Option<RecordProblem>],
) -> Result<ArrayRef> {
    let from = src.data_type();
    let refuse = || {
        Error::new(
            &codes::RECORD_TYPE_MISMATCH,
            format!("column `{name}` has type {from}, which cannot be cast to the contract's {to} without losing data"),
        )
    };
    let needs_check = lossless(from, to).ok_or_else(refuse)?;
    let opts = CastOptions {
        safe: false,
        format_options: FormatOptions::default(),
    };
    let cast_err = |e: ArrowError| {
        Error::new(
            &codes::RECORD_TYPE_MISMATCH,
            format!("column `{name}` of type {from} cannot be cast to {to}: {e}"),
        )
    };
    // Timestamps: change the unit keeping the zone, then re-label the zone, so that the
    // stored instants never move (naive values are UTC, like in text formats).
    let (src, from) = match from {
        DataType::Dictionary(_, v) => {
            let unpacked = cast_with_options(src, v, &opts).map_err(cast_err)?;
            (unpacked, v.as_ref().clone())
        }
        _ => (src.clone(), from.clone()),
    };
    let (mid_type, relabel) = match (&from, to) {
        (DataType::Timestamp(_, ftz), DataType::Timestamp(tu, ttz)) if ftz != ttz => {
            (DataType::Timestamp(*tu, ftz.clone()), true)
        }
        _ => (to.clone(), false),
    };
    let mid = if &mid_type == src.data_type() {
        src.clone()
    } else {
        cast_with_options(&src, &mid_type, &opts).map_err(cast_err)?
    };
    if needs_check {
        let back = cast_with_options(&mid, src.data_type(), &opts).map_err(cast_err)?;
        let differs = arrow::compute::kernels::cmp::neq(&src, &back).map_err(cast_err)?;
        let fmt =
            ArrayFormatter::try_new(src.as_ref(), &FormatOptions::default()).map_err(cast_err)?;
        for (i, p) in problems.iter_mut().enumerate() {
            if p.is_none() && differs.is_valid(i) && differs.value(i) {
                *p = Some(RecordProblem::type_mismatch(
                    name,
                    format!(
                        "field `{name}`: value {} cannot be represented as {to} without losing precision",
                        fmt.value(i)
                    ),
                ));
            }
        }
    }
    if relabel {
        let data = mid
            .to_data()
            .into_builder()
            .data_type(to.clone())
            .build()
            .map_err(cast_err)?;
        Ok(make_array(data))
    } else {
        Ok(mid)
    }
}

fn check_array(
    array: &ArrayRef,
    checks: &FieldChecks,
    problems: &mut [Option<RecordProblem>],
) -> Result<()> {
    use DataType::*;
    let dt = array.data_type();
    let opts = CastOptions {
        safe: false,
        format_options: FormatOptions::default(),
    };
    let err = |e: ArrowError| engine_error(e);
    match dt {
        Int8
        | Int16
        | Int32
        | Int64
        | UInt8
        | UInt16
        | UInt32
        | UInt64
        | Float32
        | Float64
        | Decimal128(_, _) => {
            let f = cast_with_options(array, &Float64, &opts).map_err(err)?;
            let f = f
                .as_any()
                .downcast_ref::<Float64Array>()
                .expect("cast to Float64");
            for (i, p) in problems.iter_mut().enumerate() {
                if p.is_none() && f.is_valid(i) {
                    let v = f.value(i);
                    *p = checks.check_number(v, &v);
                }
            }
        }
        Utf8 | LargeUtf8 => {
            let s = cast_with_options(array, &Utf8, &opts).map_err(err)?;
            let s = s
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("cast to Utf8");
            for (i, p) in problems.iter_mut().enumerate() {
                if p.is_none() && s.is_valid(i) {
                    *p = checks.check_str(s.value(i));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Schema;
    use serde_json::json;

    #[test]
    fn decimals_are_exact_or_rejected() {
        assert_eq!(parse_decimal("12.5", 10, 2), Ok(1250));
        assert_eq!(parse_decimal("-0.01", 10, 2), Ok(-1));
        assert_eq!(parse_decimal("1e3", 10, 2), Ok(100000));
        assert_eq!(parse_decimal("1.500", 10, 1), Ok(15));
        assert_eq!(parse_decimal("0", 3, 2), Ok(0));
        assert_eq!(parse_decimal("1.234", 10, 2), Err(DecimalError::Scale));
        assert_eq!(parse_decimal("12345", 5, 2), Err(DecimalError::Precision));
        assert_eq!(parse_decimal("999.99", 5, 2), Ok(99999));
        assert_eq!(parse_decimal("abc", 5, 2), Err(DecimalError::Syntax));
        assert_eq!(parse_decimal("1.2.3", 5, 2), Err(DecimalError::Syntax));
        assert_eq!(parse_decimal("", 5, 2), Err(DecimalError::Syntax));
    }

    #[test]
    fn timestamps_parse_in_every_documented_form() {
        let base = 1_704_164_645_000i64; // 2024-01-02T03:04:05Z
        for s in [
            "2024-01-02T03:04:05Z",
            "2024-01-02T03:04:05.000Z",
            "2024-01-02 03:04:05Z",
            "2024-01-02T04:04:05+01:00",
            "2024-01-02T04:04:05+0100",
            "2024-01-02 04:04:05+01:00",
            "2024-01-02T03:04:05",
            "2024-01-02 03:04:05",
        ] {
            let t = parse_timestamp(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(t.timestamp_millis(), base, "{s}");
        }
        assert_eq!(
            parse_timestamp("2024-01-02T03:04:05.123456Z")
                .unwrap()
                .timestamp_micros(),
            base * 1000 + 123_456
        );
        assert_eq!(
            parse_timestamp("2024-01-02").unwrap().timestamp_millis(),
            1_704_153_600_000
        );
        assert!(parse_timestamp("yesterday").is_none());
        // Naive values are local time in the column's zone; explicit offsets win.
        let paris = parse_timestamp_in("2024-07-01T12:00:00", Some("Europe/Paris")).unwrap();
        assert_eq!(paris.to_rfc3339(), "2024-07-01T10:00:00+00:00");
        let z = parse_timestamp_in("2024-07-01T12:00:00Z", Some("Europe/Paris")).unwrap();
        assert_eq!(z.to_rfc3339(), "2024-07-01T12:00:00+00:00");
        let utc = parse_timestamp_in("2024-07-01T12:00:00", Some("UTC")).unwrap();
        assert_eq!(utc.to_rfc3339(), "2024-07-01T12:00:00+00:00");
        assert!(parse_timestamp_in("2024-03-31T02:30:00", Some("Europe/Paris")).is_none());
        assert!(parse_timestamp("2024-13-02T00:00:00Z").is_none());
        // A multi-byte character across byte 10 is not a timestamp (it used to panic).
        for s in [
            "2024-01-0é:00:00",
            "2024-01-01é12:00",
            "日本語の時刻です",
            "2024-01-01\u{1F600}",
        ] {
            assert!(parse_timestamp_in(s, Some("Europe/Paris")).is_none(), "{s}");
        }
    }

    #[test]
    fn json_records_decode_and_problems_have_codes() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new(
                "s",
                DataType::Struct(vec![Field::new("x", DataType::Int64, false)].into()),
                true,
            ),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
        ]));
        let d = ContractDecoder::new(schema.clone(), None).unwrap();
        let mut b = d.builder();
        b.push_json(&json!({"id": 1, "s": {"x": 5}, "tags": ["a", null]}))
            .unwrap();
        b.push_json(&json!({"id": 2.0, "extra": true})).unwrap();
        let e = b.push_json(&json!({"id": 3, "s": {}})).unwrap_err();
        assert_eq!(e.code.code, "ETL703");
        assert_eq!(e.field.as_deref(), Some("s.x"));
        let e = b.push_json(&json!({"id": 3000000000i64})).unwrap_err();
        assert_eq!(e.code.code, "ETL702");
        assert!(e.reason.contains("out of range for Int32"), "{}", e.reason);
        let e = b.push_json(&json!({"id": 4, "tags": [1]})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tags[0]"));
        let e = b.push_json(&json!([1])).unwrap_err();
        assert_eq!(e.code.code, "ETL701");
        assert_eq!(b.len(), 2);
        let batch = b.finish().unwrap().unwrap();
        assert_eq!(batch.schema(), schema);
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(
            row_as_json(&batch, 0),
            r#"{"id":1,"s":{"x":5},"tags":["a",null]}"#
        );
        assert_eq!(row_as_json(&batch, 1), r#"{"id":2,"s":null,"tags":null}"#);
        assert!(b.finish().unwrap().is_none());
    }

    #[test]
    fn conform_casts_losslessly_and_refuses_narrowing() {
        let target = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("missing", DataType::Utf8, true),
        ]));
        let d = ContractDecoder::new(target.clone(), None).unwrap();
        let src = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int32, true),
                Field::new("t", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])),
                Arc::new(TimestampNanosecondArray::from(vec![
                    Some(1_000_000_000),
                    Some(5),
                    Some(1_500),
                ])),
            ],
        )
        .unwrap();
        let c = d.conform_batch(&src).unwrap();
        assert_eq!(c.batch.schema(), target);
        assert_eq!(c.batch.num_rows(), 1);
        assert_eq!(c.rejected.len(), 2);
        assert_eq!(c.rejected[0].0, 1);
        assert_eq!(c.rejected[0].1.code.code, "ETL703");
        assert_eq!(c.rejected[1].0, 2);
        assert_eq!(c.rejected[1].1.code.code, "ETL702");
        let t = c
            .batch
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(t.value(0), 1_000_000);

        let narrow = Arc::new(Schema::new(vec![Field::new("a", DataType::Int8, true)]));
        let d = ContractDecoder::new(narrow, None).unwrap();
        let e = d.conform_batch(&src).unwrap_err();
        assert_eq!(e.code(), "ETL702");
    }
}
