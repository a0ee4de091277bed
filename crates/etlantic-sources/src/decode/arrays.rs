//! Cells → arrays: an Arrow array of a field's type built from decoded cells, the last
//! step of the per-record path (and of the column builders for the types they keep as
//! cells).

use super::Cell;
use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Date64Array, Decimal128Array, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeBinaryArray,
    LargeStringArray, ListArray, StringArray, StructArray, Time32MillisecondArray,
    Time32SecondArray, Time64MicrosecondArray, Time64NanosecondArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, TimeUnit};
use arrow::error::ArrowError;
use std::sync::Arc;

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
