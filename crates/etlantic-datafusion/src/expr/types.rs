//! Type classes of DTCS values over Arrow types, and the few coercions DTCS defines.

use arrow::datatypes::{DataType, TimeUnit};

pub(crate) use etlantic_core::ir::types::{
    is_boolean, is_date, is_integer, is_list, is_null, is_numeric, is_string, is_temporal,
};

/// Whether two values can be compared with `==`, `<`, ... (DTCS allows numbers with
/// numbers, strings with strings, booleans with booleans, dates and datetimes with each
/// other, and null with anything).
pub(crate) fn comparable(a: &DataType, b: &DataType) -> bool {
    is_null(a)
        || is_null(b)
        || a == b
        || (is_numeric(a) && is_numeric(b))
        || (is_string(a) && is_string(b))
        || (is_temporal(a) && is_temporal(b))
}

/// The DTCS-friendly name of an Arrow type, for messages.
pub(crate) fn describe(dt: &DataType) -> String {
    let t = etlantic_core::ir::types::dtcs_type(dt);
    if is_null(dt) {
        "null".into()
    } else {
        t
    }
}

/// The type two sides of a union (or two branches) are unified to, if any.
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
    if is_string(a) && is_string(b) {
        return Some(DataType::Utf8);
    }
    match (a, b) {
        (DataType::Timestamp(ua, za), DataType::Timestamp(ub, zb)) if za == zb => {
            Some(DataType::Timestamp(finer(*ua, *ub), za.clone()))
        }
        (DataType::Date32, DataType::Date64) | (DataType::Date64, DataType::Date32) => {
            Some(DataType::Date64)
        }
        _ => None,
    }
}

fn rank(u: TimeUnit) -> u8 {
    match u {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    }
}

fn finer(a: TimeUnit, b: TimeUnit) -> TimeUnit {
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}

/// Ticks of `unit` per millisecond numerator/denominator: a duration of `ms`
/// milliseconds in `unit` ticks, if it is a whole number of ticks.
pub(crate) fn millis_in_unit(ms: i64, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => (ms % 1000 == 0).then_some(ms / 1000),
        TimeUnit::Millisecond => Some(ms),
        TimeUnit::Microsecond => ms.checked_mul(1000),
        TimeUnit::Nanosecond => ms.checked_mul(1_000_000),
    }
}

/// The Arrow type a DTCS cast target names (`string`, `integer`, `decimal`, `boolean`,
/// `date`, `datetime`).
pub(crate) fn cast_target(name: &str) -> Option<DataType> {
    match name.trim().to_ascii_lowercase().as_str() {
        n @ ("string" | "integer" | "decimal" | "number" | "boolean" | "date" | "datetime"
        | "timestamp") => etlantic_core::ir::types::arrow_type(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_coercions() {
        assert!(comparable(&DataType::Int32, &DataType::Float64));
        assert!(!comparable(&DataType::Utf8, &DataType::Int64));
        assert!(comparable(&DataType::Null, &DataType::Utf8));
        assert_eq!(
            common_type(&DataType::Int32, &DataType::Int64),
            Some(DataType::Int64)
        );
        assert_eq!(
            common_type(&DataType::Int64, &DataType::Float32),
            Some(DataType::Float64)
        );
        assert_eq!(common_type(&DataType::Utf8, &DataType::Int64), None);
        assert_eq!(millis_in_unit(1500, TimeUnit::Second), None);
        assert_eq!(millis_in_unit(2000, TimeUnit::Second), Some(2));
        assert_eq!(millis_in_unit(2, TimeUnit::Nanosecond), Some(2_000_000));
        assert_eq!(cast_target("integer"), Some(DataType::Int64));
        assert!(cast_target("list<integer>").is_none());
    }
}
