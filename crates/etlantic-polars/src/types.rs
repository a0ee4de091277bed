//! Type classes of DTCS values over Polars types, and the coercions the reference engine
//! (DataFusion) applies, so that every expression computes in the same class of type
//! (integer, floating point, exact decimal, string, ...) as there. The exact Arrow type
//! of a step's result is the reference engine's; results are cast to it at the end.

use polars::prelude::{DataType, TimeUnit, TimeZone};

/// The widest decimal precision.
pub(crate) const MAX_PRECISION: usize = 38;

/// Integers of any width.
pub(crate) fn is_integer(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

/// Unsigned integers.
pub(crate) fn is_unsigned(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64
    )
}

/// Binary floating point.
pub(crate) fn is_float(dt: &DataType) -> bool {
    matches!(dt, DataType::Float32 | DataType::Float64)
}

/// Exact decimals.
pub(crate) fn is_decimal(dt: &DataType) -> bool {
    matches!(dt, DataType::Decimal(..))
}

/// DTCS `integer` or `decimal`.
pub(crate) fn is_numeric(dt: &DataType) -> bool {
    is_integer(dt) || is_float(dt) || is_decimal(dt)
}

/// DTCS `string`.
pub(crate) fn is_string(dt: &DataType) -> bool {
    *dt == DataType::String
}

/// DTCS `date` or `datetime`.
pub(crate) fn is_temporal(dt: &DataType) -> bool {
    matches!(dt, DataType::Date | DataType::Datetime(..))
}

/// The untyped null.
pub(crate) fn is_null(dt: &DataType) -> bool {
    *dt == DataType::Null
}

/// Boolean or the untyped null.
pub(crate) fn is_boolean(dt: &DataType) -> bool {
    matches!(dt, DataType::Boolean | DataType::Null)
}

/// The scale of a decimal (0 for integers).
pub(crate) fn scale(dt: &DataType) -> usize {
    match dt {
        DataType::Decimal(_, s) => *s,
        _ => 0,
    }
}

/// The precision of a decimal (the number of digits of an integer type otherwise).
pub(crate) fn precision(dt: &DataType) -> usize {
    match dt {
        DataType::Decimal(p, _) => *p,
        DataType::Int8 | DataType::UInt8 => 3,
        DataType::Int16 | DataType::UInt16 => 5,
        DataType::Int32 | DataType::UInt32 => 10,
        _ => 20,
    }
}

/// The type two sides of a union, the branches of a `case_when`, the arguments of a
/// `coalesce` or two join keys are unified to (the reference engine's rule: integers
/// widen to `Int64`, other mixes of numbers become `Float64`, strings stay strings,
/// timestamps of one zone take the finer unit).
pub(crate) fn common_type(a: &DataType, b: &DataType) -> Option<DataType> {
    if a == b {
        return Some(a.clone());
    }
    if is_null(a) {
        return Some(b.clone());
    }
    if is_null(b) {
        return Some(a.clone());
    }
    if is_integer(a) && is_integer(b) {
        return Some(DataType::Int64);
    }
    if is_numeric(a) && is_numeric(b) {
        return Some(DataType::Float64);
    }
    match (a, b) {
        (DataType::Datetime(ua, za), DataType::Datetime(ub, zb)) if za == zb => {
            Some(DataType::Datetime(finer(*ua, *ub), za.clone()))
        }
        _ => None,
    }
}

/// The type two values are compared in (`None`: they cannot be compared). Numbers are
/// compared exactly: integers as integers, decimals (and integers with decimals) as
/// decimals of the larger scale, anything with a float as `Float64`.
pub(crate) fn comparison_type(a: &DataType, b: &DataType) -> Option<DataType> {
    if a == b {
        return Some(a.clone());
    }
    if is_null(a) {
        return Some(b.clone());
    }
    if is_null(b) {
        return Some(a.clone());
    }
    if is_integer(a) && is_integer(b) {
        return Some(if is_unsigned(a) && is_unsigned(b) {
            DataType::UInt64
        } else {
            DataType::Int64
        });
    }
    if is_numeric(a) && is_numeric(b) {
        if is_float(a) || is_float(b) {
            return Some(DataType::Float64);
        }
        return Some(DataType::Decimal(MAX_PRECISION, scale(a).max(scale(b))));
    }
    match (a, b) {
        (DataType::Datetime(ua, za), DataType::Datetime(ub, _)) => {
            Some(DataType::Datetime(finer(*ua, *ub), za.clone()))
        }
        (DataType::Date, DataType::Datetime(u, z)) | (DataType::Datetime(u, z), DataType::Date) => {
            Some(DataType::Datetime(*u, z.clone()))
        }
        _ => None,
    }
}

fn rank(u: TimeUnit) -> u8 {
    match u {
        TimeUnit::Milliseconds => 1,
        TimeUnit::Microseconds => 2,
        TimeUnit::Nanoseconds => 3,
    }
}

fn finer(a: TimeUnit, b: TimeUnit) -> TimeUnit {
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}

/// The arrow-rs type of a Polars type (for the temporal literals parsed with Arrow's
/// casts; `None` for types without one here).
pub(crate) fn arrow_type(dt: &DataType) -> Option<arrow::datatypes::DataType> {
    use arrow::datatypes::{DataType as A, TimeUnit as U};
    Some(match dt {
        DataType::Date => A::Date32,
        DataType::Datetime(u, tz) => A::Timestamp(
            match u {
                TimeUnit::Milliseconds => U::Millisecond,
                TimeUnit::Microseconds => U::Microsecond,
                TimeUnit::Nanoseconds => U::Nanosecond,
            },
            tz.as_ref().map(|z: &TimeZone| z.as_str().into()),
        ),
        _ => return None,
    })
}

/// The DTCS-friendly name of a type, for messages.
pub(crate) fn describe(dt: &DataType) -> String {
    if is_null(dt) {
        "null".into()
    } else if is_integer(dt) {
        "integer".into()
    } else if is_numeric(dt) {
        "decimal".into()
    } else if is_string(dt) {
        "string".into()
    } else if *dt == DataType::Boolean {
        "boolean".into()
    } else if *dt == DataType::Date {
        "date".into()
    } else if matches!(dt, DataType::Datetime(..)) {
        "datetime".into()
    } else {
        format!("{dt}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coercions_follow_the_reference_engine() {
        assert_eq!(
            common_type(&DataType::Int32, &DataType::Int64),
            Some(DataType::Int64)
        );
        assert_eq!(
            common_type(&DataType::Decimal(10, 2), &DataType::Int64),
            Some(DataType::Float64)
        );
        assert_eq!(common_type(&DataType::String, &DataType::Int64), None);
        assert_eq!(
            comparison_type(&DataType::Decimal(10, 2), &DataType::Int64),
            Some(DataType::Decimal(38, 2))
        );
        assert_eq!(
            comparison_type(&DataType::Decimal(10, 2), &DataType::Float64),
            Some(DataType::Float64)
        );
        assert_eq!(
            comparison_type(&DataType::Null, &DataType::String),
            Some(DataType::String)
        );
    }
}
