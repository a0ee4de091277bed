//! Arrow → Arrow: conforming a column of a foreign batch (a Parquet file, a pushed
//! batch) to the contract's type with casts that lose nothing, and checking the field
//! constraints of a whole column.

use super::{engine_error, FieldChecks, RecordProblem};
use arrow::array::{make_array, Array, ArrayRef, Float64Array, StringArray};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, TimeUnit};
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use etlantic_core::diagnostics::{codes, Error, Result};

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

pub(super) fn cast_lossless(
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

pub(super) fn check_array(
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
