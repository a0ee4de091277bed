//! Typed column builders: decoded values go straight into the buffers of their Arrow
//! array, so a record of plain values costs no allocation of its own.
//!
//! Every builder can be cut back to a row count ([`ColumnBuilder::truncate`]): a record
//! decoded part-way by the fast path and then found to need the per-record path leaves
//! nothing behind.

use super::{build_array, Cell};
use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date64Array, Float64Array, Int64Array, PrimitiveArray,
    StringArray, Time64MicrosecondArray, Time64NanosecondArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt64Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowPrimitiveType, DataType, TimeUnit};
use arrow::error::ArrowError;
use std::sync::Arc;

/// How a column's values are held while a batch is built.
#[derive(Debug)]
pub(crate) enum Values {
    /// Signed integers, dates, times and timestamps (in the column's unit).
    Ints(Vec<i64>),
    /// Unsigned integers.
    UInts(Vec<u64>),
    /// Floating point numbers (`Float32` is narrowed when the array is built).
    Floats(Vec<f64>),
    /// Booleans.
    Bools(Vec<bool>),
    /// UTF-8 text or bytes: the concatenated values and their end offsets.
    Bytes { data: Vec<u8>, ends: Vec<usize> },
    /// Anything else (decimals, structs, lists, large strings): decoded cells.
    Cells(Vec<Cell>),
}

/// The values of one column of the batch being built, and which of them are valid.
#[derive(Debug)]
pub(crate) struct ColumnBuilder {
    pub(crate) data_type: DataType,
    pub(crate) values: Values,
    valid: Vec<bool>,
}

impl ColumnBuilder {
    pub(crate) fn new(data_type: &DataType) -> Self {
        use DataType::*;
        let values = match data_type {
            Int8
            | Int16
            | Int32
            | Int64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _) => Values::Ints(Vec::new()),
            UInt8 | UInt16 | UInt32 | UInt64 => Values::UInts(Vec::new()),
            Float32 | Float64 => Values::Floats(Vec::new()),
            Boolean => Values::Bools(Vec::new()),
            Utf8 | Binary => Values::Bytes {
                data: Vec::new(),
                ends: Vec::new(),
            },
            _ => Values::Cells(Vec::new()),
        };
        ColumnBuilder {
            data_type: data_type.clone(),
            values,
            valid: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.valid.len()
    }

    /// Keeps the first `rows` values.
    pub(crate) fn truncate(&mut self, rows: usize) {
        if self.valid.len() <= rows {
            return;
        }
        self.valid.truncate(rows);
        match &mut self.values {
            Values::Ints(v) => v.truncate(rows),
            Values::UInts(v) => v.truncate(rows),
            Values::Floats(v) => v.truncate(rows),
            Values::Bools(v) => v.truncate(rows),
            Values::Bytes { data, ends } => {
                ends.truncate(rows);
                data.truncate(ends.last().copied().unwrap_or(0));
            }
            Values::Cells(v) => v.truncate(rows),
        }
    }

    pub(crate) fn push_null(&mut self) {
        self.valid.push(false);
        match &mut self.values {
            Values::Ints(v) => v.push(0),
            Values::UInts(v) => v.push(0),
            Values::Floats(v) => v.push(0.0),
            Values::Bools(v) => v.push(false),
            Values::Bytes { data, ends } => ends.push(data.len()),
            Values::Cells(v) => v.push(Cell::Null),
        }
    }

    /// Adds a signed integer (the caller knows the column holds [`Values::Ints`]).
    pub(crate) fn push_int(&mut self, x: i64) {
        if let Values::Ints(v) = &mut self.values {
            v.push(x);
            self.valid.push(true);
        }
    }

    pub(crate) fn push_uint(&mut self, x: u64) {
        if let Values::UInts(v) = &mut self.values {
            v.push(x);
            self.valid.push(true);
        }
    }

    pub(crate) fn push_float(&mut self, x: f64) {
        if let Values::Floats(v) = &mut self.values {
            v.push(x);
            self.valid.push(true);
        }
    }

    pub(crate) fn push_bool(&mut self, x: bool) {
        if let Values::Bools(v) = &mut self.values {
            v.push(x);
            self.valid.push(true);
        }
    }

    pub(crate) fn push_bytes(&mut self, x: &[u8]) {
        if let Values::Bytes { data, ends } = &mut self.values {
            data.extend_from_slice(x);
            ends.push(data.len());
            self.valid.push(true);
        }
    }

    /// Adds a cell decoded by the per-record path (of this column's type).
    pub(crate) fn push_cell(&mut self, cell: Cell) {
        let valid = !matches!(cell, Cell::Null);
        match (&mut self.values, cell) {
            (Values::Cells(v), cell) => v.push(cell),
            (_, Cell::Null) => {
                self.push_null();
                return;
            }
            (Values::Ints(v), Cell::Int(x)) => v.push(x),
            (Values::Ints(v), Cell::UInt(x)) => v.push(x as i64),
            (Values::UInts(v), Cell::UInt(x)) => v.push(x),
            (Values::UInts(v), Cell::Int(x)) => v.push(x as u64),
            (Values::Floats(v), Cell::Float(x)) => v.push(x),
            (Values::Bools(v), Cell::Bool(x)) => v.push(x),
            (Values::Bytes { data, ends }, Cell::Str(s)) => {
                data.extend_from_slice(s.as_bytes());
                ends.push(data.len());
            }
            (Values::Bytes { data, ends }, Cell::Bytes(b)) => {
                data.extend_from_slice(&b);
                ends.push(data.len());
            }
            // A cell of another kind than the column's cannot come from the decoders of
            // this module; it is kept as a null rather than misplaced.
            _ => {
                self.push_null();
                return;
            }
        }
        self.valid.push(valid);
    }

    /// Builds the column's array and starts over.
    pub(crate) fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        let valid = std::mem::take(&mut self.valid);
        let nulls = if valid.iter().all(|v| *v) {
            None
        } else {
            Some(NullBuffer::from(valid))
        };
        let dt = self.data_type.clone();
        use DataType::*;
        let array: ArrayRef = match &mut self.values {
            Values::Ints(v) => {
                let v = std::mem::take(v);
                match &dt {
                    Int8 => narrow::<arrow::datatypes::Int8Type, _>(v, nulls, |x| x as i8),
                    Int16 => narrow::<arrow::datatypes::Int16Type, _>(v, nulls, |x| x as i16),
                    Int32 => narrow::<arrow::datatypes::Int32Type, _>(v, nulls, |x| x as i32),
                    Date32 => narrow::<arrow::datatypes::Date32Type, _>(v, nulls, |x| x as i32),
                    Time32(TimeUnit::Second) => {
                        narrow::<arrow::datatypes::Time32SecondType, _>(v, nulls, |x| x as i32)
                    }
                    Time32(_) => {
                        narrow::<arrow::datatypes::Time32MillisecondType, _>(v, nulls, |x| x as i32)
                    }
                    Int64 => Arc::new(Int64Array::new(v.into(), nulls)),
                    Date64 => Arc::new(Date64Array::new(v.into(), nulls)),
                    Time64(TimeUnit::Microsecond) => {
                        Arc::new(Time64MicrosecondArray::new(v.into(), nulls))
                    }
                    Time64(_) => Arc::new(Time64NanosecondArray::new(v.into(), nulls)),
                    Timestamp(TimeUnit::Second, tz) => Arc::new(
                        TimestampSecondArray::new(v.into(), nulls).with_timezone_opt(tz.clone()),
                    ),
                    Timestamp(TimeUnit::Millisecond, tz) => Arc::new(
                        TimestampMillisecondArray::new(v.into(), nulls)
                            .with_timezone_opt(tz.clone()),
                    ),
                    Timestamp(TimeUnit::Microsecond, tz) => Arc::new(
                        TimestampMicrosecondArray::new(v.into(), nulls)
                            .with_timezone_opt(tz.clone()),
                    ),
                    Timestamp(TimeUnit::Nanosecond, tz) => Arc::new(
                        TimestampNanosecondArray::new(v.into(), nulls)
                            .with_timezone_opt(tz.clone()),
                    ),
                    other => return Err(unexpected(other)),
                }
            }
            Values::UInts(v) => {
                let v = std::mem::take(v);
                match &dt {
                    UInt8 => narrow::<arrow::datatypes::UInt8Type, _>(v, nulls, |x| x as u8),
                    UInt16 => narrow::<arrow::datatypes::UInt16Type, _>(v, nulls, |x| x as u16),
                    UInt32 => narrow::<arrow::datatypes::UInt32Type, _>(v, nulls, |x| x as u32),
                    UInt64 => Arc::new(UInt64Array::new(v.into(), nulls)),
                    other => return Err(unexpected(other)),
                }
            }
            Values::Floats(v) => {
                let v = std::mem::take(v);
                match &dt {
                    Float32 => narrow::<arrow::datatypes::Float32Type, _>(v, nulls, |x| x as f32),
                    _ => Arc::new(Float64Array::new(v.into(), nulls)),
                }
            }
            Values::Bools(v) => {
                let v = std::mem::take(v);
                Arc::new(BooleanArray::new(v.into(), nulls))
            }
            Values::Bytes { data, ends } => {
                let (data, ends) = (std::mem::take(data), std::mem::take(ends));
                let mut offsets = Vec::with_capacity(ends.len() + 1);
                offsets.push(0i32);
                for end in ends {
                    offsets.push(i32::try_from(end).map_err(|_| {
                        ArrowError::ComputeError(
                            "the text of one batch exceeds 2 GiB (i32 offsets)".into(),
                        )
                    })?);
                }
                let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
                match &dt {
                    Utf8 => Arc::new(StringArray::try_new(offsets, data.into(), nulls)?),
                    _ => Arc::new(BinaryArray::try_new(offsets, data.into(), nulls)?),
                }
            }
            Values::Cells(v) => build_array(&dt, std::mem::take(v))?,
        };
        Ok(array)
    }
}

fn unexpected(dt: &DataType) -> ArrowError {
    ArrowError::NotYetImplemented(format!("decoding into {dt}"))
}

fn narrow<T: ArrowPrimitiveType, S>(
    values: Vec<S>,
    nulls: Option<NullBuffer>,
    f: impl Fn(S) -> T::Native,
) -> ArrayRef {
    let native: Vec<T::Native> = values.into_iter().map(f).collect();
    Arc::new(PrimitiveArray::<T>::new(native.into(), nulls))
}
