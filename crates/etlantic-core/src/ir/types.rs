//! DTCS logical types ↔ Arrow types.
//!
//! DTCS has one integer type and one (floating) decimal type; Arrow has many. Going to
//! DTCS loses the width; coming back picks the widest common Arrow type (`Int64`,
//! `Float64`), which is what engines compute in anyway.

use arrow::datatypes::{DataType, Field, TimeUnit};
use std::sync::Arc;

// Type classes of DTCS values over Arrow types, shared by the engines.

/// Integers of any width.
pub fn is_integer(dt: &DataType) -> bool {
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

/// DTCS `integer` or `decimal`.
pub fn is_numeric(dt: &DataType) -> bool {
    is_integer(dt)
        || matches!(
            dt,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Decimal32(..)
                | DataType::Decimal64(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
        )
}

/// DTCS `string`.
pub fn is_string(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// DTCS `date` or `datetime`.
pub fn is_temporal(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(..)
    )
}

/// DTCS `date`.
pub fn is_date(dt: &DataType) -> bool {
    matches!(dt, DataType::Date32 | DataType::Date64)
}

/// Lists of any kind.
pub fn is_list(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
    )
}

/// The untyped null.
pub fn is_null(dt: &DataType) -> bool {
    *dt == DataType::Null
}

/// Boolean or the untyped null.
pub fn is_boolean(dt: &DataType) -> bool {
    matches!(dt, DataType::Boolean | DataType::Null)
}

/// The DTCS logical type name of an Arrow type.
pub fn dtcs_type(dt: &DataType) -> String {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => "integer".into(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "decimal".into(),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => "decimal".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(..) => "datetime".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time".into(),
        DataType::Duration(_) | DataType::Interval(_) => "duration".into(),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => "binary".into(),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            format!("list<{}>", dtcs_type(f.data_type()))
        }
        DataType::Null => "string".into(),
        other => format!("etlantic:arrow<{other}>"),
    }
}

/// The Arrow type of a DTCS logical type name (`None` when it has no Arrow equivalent).
pub fn arrow_type(dtcs: &str) -> Option<DataType> {
    let t = dtcs.trim();
    Some(match t {
        "integer" => DataType::Int64,
        "decimal" | "number" => DataType::Float64,
        "string" => DataType::Utf8,
        "boolean" => DataType::Boolean,
        "date" => DataType::Date32,
        "datetime" | "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "binary" => DataType::Binary,
        "duration" => DataType::Duration(TimeUnit::Microsecond),
        _ => {
            let inner = t.strip_prefix("list<")?.strip_suffix('>')?;
            DataType::List(Arc::new(Field::new("item", arrow_type(inner)?, true)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for t in [
            "integer",
            "decimal",
            "string",
            "boolean",
            "date",
            "datetime",
            "time",
            "binary",
            "list<integer>",
        ] {
            assert_eq!(dtcs_type(&arrow_type(t).unwrap()), t);
        }
        assert!(arrow_type("map<string,integer>").is_none());
    }
}
