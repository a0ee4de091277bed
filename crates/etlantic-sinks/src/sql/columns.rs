//! Column plans: each Arrow column's SQL type per dialect, how its values are rendered
//! (exact text for decimals, dates and times) and how they are bound to a statement.

use super::Dialect;
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Float32Type, Float64Type, Int64Type, Schema,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt64Type,
};
use etlantic_core::diagnostics::{codes, Error, Result};
use sqlx::postgres::PgArguments;
use sqlx::sqlite::SqliteArguments;
use sqlx::Arguments;

/// How one column's values are bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bind {
    I16,
    I32,
    I64,
    F32,
    F64,
    Bool,
    Text,
    Bytes,
}

#[derive(Clone, Debug)]
pub(super) struct ColumnPlan {
    pub(super) name: String,
    pub(super) sql_type: String,
    pub(super) not_null: bool,
    bind: Bind,
    /// PostgreSQL: a cast applied to the bound text (`numeric`, `timestamptz`, ...).
    pub(super) cast: Option<&'static str>,
}

pub(super) fn column_plan(
    dialect: Dialect,
    name: &str,
    dt: &DataType,
    nullable: bool,
) -> Result<ColumnPlan> {
    use DataType::*;
    let pg = dialect == Dialect::Postgres;
    let (sql_type, bind, cast): (String, Bind, Option<&'static str>) = match dt {
        Int8 | Int16 | UInt8 if pg => ("SMALLINT".into(), Bind::I16, None),
        Int32 | UInt16 if pg => ("INTEGER".into(), Bind::I32, None),
        Int64 | UInt32 if pg => ("BIGINT".into(), Bind::I64, None),
        UInt64 if pg => ("NUMERIC(20,0)".into(), Bind::Text, Some("numeric")),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            ("INTEGER".into(), Bind::I64, None)
        }
        Float16 | Float32 if pg => ("REAL".into(), Bind::F32, None),
        Float64 if pg => ("DOUBLE PRECISION".into(), Bind::F64, None),
        Float16 | Float32 | Float64 => ("REAL".into(), Bind::F64, None),
        Decimal128(p, s) | Decimal256(p, s) if pg => {
            (format!("NUMERIC({p},{s})"), Bind::Text, Some("numeric"))
        }
        Decimal128(_, _) | Decimal256(_, _) => ("TEXT".into(), Bind::Text, None),
        Utf8 | LargeUtf8 | Utf8View => ("TEXT".into(), Bind::Text, None),
        Boolean => ("BOOLEAN".into(), Bind::Bool, None),
        Date32 | Date64 if pg => ("DATE".into(), Bind::Text, Some("date")),
        Timestamp(_, None) if pg => ("TIMESTAMP".into(), Bind::Text, Some("timestamp")),
        Timestamp(_, Some(_)) if pg => ("TIMESTAMPTZ".into(), Bind::Text, Some("timestamptz")),
        Time32(_) | Time64(_) if pg => ("TIME".into(), Bind::Text, Some("time")),
        Date32 | Date64 | Timestamp(_, _) | Time32(_) | Time64(_) => {
            ("TEXT".into(), Bind::Text, None)
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) if pg => {
            ("BYTEA".into(), Bind::Bytes, None)
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            ("BLOB".into(), Bind::Bytes, None)
        }
        other => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!("column `{name}`: the SQL sink cannot write values of type {other}"),
            ))
        }
    };
    Ok(ColumnPlan {
        name: name.to_string(),
        sql_type,
        not_null: !nullable,
        bind,
        cast,
    })
}

/// One value ready to bind.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Val {
    Null,
    I(i64),
    F(f64),
    B(bool),
    T(String),
    Y(Vec<u8>),
}

pub(super) fn arrow_err(e: arrow::error::ArrowError) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"))
}

fn frac_format(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Second => "",
        TimeUnit::Millisecond => "%.3f",
        TimeUnit::Microsecond => "%.6f",
        TimeUnit::Nanosecond => "%.9f",
    }
}

pub(super) fn timestamp_text(v: i64, unit: TimeUnit, zoned: bool) -> Option<String> {
    let t = match unit {
        TimeUnit::Second => chrono::DateTime::from_timestamp(v, 0),
        TimeUnit::Millisecond => chrono::DateTime::from_timestamp_millis(v),
        TimeUnit::Microsecond => chrono::DateTime::from_timestamp_micros(v),
        TimeUnit::Nanosecond => Some(chrono::DateTime::from_timestamp_nanos(v)),
    }?;
    let fmt = format!("%Y-%m-%dT%H:%M:%S{}", frac_format(unit));
    let mut s = t.naive_utc().format(&fmt).to_string();
    if zoned {
        s.push('Z');
    }
    Some(s)
}

pub(super) fn time_text(nanos: i64, unit: TimeUnit) -> Option<String> {
    let secs = u32::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
    let frac = u32::try_from(nanos.rem_euclid(1_000_000_000)).ok()?;
    let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(secs, frac)?;
    Some(
        t.format(&format!("%H:%M:%S{}", frac_format(unit)))
            .to_string(),
    )
}

/// The values of one column, rendered for binding.
pub(super) fn column_values(col: &ArrayRef, name: &str) -> Result<Vec<Val>> {
    use DataType::*;
    let n = col.len();
    let bad_value = |what: String| {
        Error::new(
            &codes::SINK_WRITE_FAILED,
            format!("column `{name}`: {what}"),
        )
    };
    let mut out = Vec::with_capacity(n);
    let nulls = |i: usize| col.is_null(i);
    match col.data_type() {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
            let c = cast(col, &Int64).map_err(arrow_err)?;
            let a = c.as_primitive::<Int64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::I(a.value(i))
                });
            }
        }
        UInt64 => {
            let a = col.as_primitive::<UInt64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value(i).to_string())
                });
            }
        }
        Float16 | Float32 => {
            let c = cast(col, &Float32).map_err(arrow_err)?;
            let a = c.as_primitive::<Float32Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::F(a.value(i) as f64)
                });
            }
        }
        Float64 => {
            let a = col.as_primitive::<Float64Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::F(a.value(i))
                });
            }
        }
        Decimal128(_, _) => {
            let a = col.as_primitive::<arrow::datatypes::Decimal128Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value_as_string(i))
                });
            }
        }
        Decimal256(_, _) => {
            let a = col.as_primitive::<arrow::datatypes::Decimal256Type>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value_as_string(i))
                });
            }
        }
        Utf8 | LargeUtf8 | Utf8View => {
            let c = cast(col, &Utf8).map_err(arrow_err)?;
            let a = c.as_string::<i32>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value(i).to_string())
                });
            }
        }
        Boolean => {
            let a = col.as_boolean();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::B(a.value(i))
                });
            }
        }
        Date32 | Date64 => {
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let d = if col.data_type() == &Date32 {
                    arrow::temporal_conversions::as_date::<Date32Type>(
                        col.as_primitive::<Date32Type>().value(i) as i64,
                    )
                } else {
                    arrow::temporal_conversions::as_date::<Date64Type>(
                        col.as_primitive::<Date64Type>().value(i),
                    )
                };
                let d = d.ok_or_else(|| bad_value(format!("row {i}: date out of range")))?;
                out.push(Val::T(d.format("%Y-%m-%d").to_string()));
            }
        }
        Timestamp(unit, tz) => {
            let zoned = tz.is_some();
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let v = match unit {
                    TimeUnit::Second => col.as_primitive::<TimestampSecondType>().value(i),
                    TimeUnit::Millisecond => {
                        col.as_primitive::<TimestampMillisecondType>().value(i)
                    }
                    TimeUnit::Microsecond => {
                        col.as_primitive::<TimestampMicrosecondType>().value(i)
                    }
                    TimeUnit::Nanosecond => col.as_primitive::<TimestampNanosecondType>().value(i),
                };
                let s = timestamp_text(v, *unit, zoned)
                    .ok_or_else(|| bad_value(format!("row {i}: timestamp {v} out of range")))?;
                out.push(Val::T(s));
            }
        }
        Time32(unit) | Time64(unit) => {
            for i in 0..n {
                if nulls(i) {
                    out.push(Val::Null);
                    continue;
                }
                let nanos = match unit {
                    TimeUnit::Second => {
                        col.as_primitive::<Time32SecondType>().value(i) as i64 * 1_000_000_000
                    }
                    TimeUnit::Millisecond => {
                        col.as_primitive::<Time32MillisecondType>().value(i) as i64 * 1_000_000
                    }
                    TimeUnit::Microsecond => {
                        col.as_primitive::<Time64MicrosecondType>().value(i) * 1_000
                    }
                    TimeUnit::Nanosecond => col.as_primitive::<Time64NanosecondType>().value(i),
                };
                let s = time_text(nanos, *unit)
                    .ok_or_else(|| bad_value(format!("row {i}: time out of range")))?;
                out.push(Val::T(s));
            }
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            let c = cast(col, &LargeBinary).map_err(arrow_err)?;
            let a = c.as_binary::<i64>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Val::Null
                } else {
                    Val::Y(a.value(i).to_vec())
                });
            }
        }
        other => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!("column `{name}`: the SQL sink cannot write values of type {other}"),
            ))
        }
    }
    Ok(out)
}

fn type_err(name: &str, v: &Val) -> sqlx::error::BoxDynError {
    format!("column `{name}`: value {v:?} does not fit the column's bind type").into()
}

pub(super) fn add_pg(
    args: &mut PgArguments,
    col: &ColumnPlan,
    v: &Val,
) -> std::result::Result<(), sqlx::error::BoxDynError> {
    match (col.bind, v) {
        (Bind::I16, Val::Null) => args.add(None::<i16>),
        (Bind::I16, Val::I(x)) => args.add(i16::try_from(*x).map_err(|_| type_err(&col.name, v))?),
        (Bind::I32, Val::Null) => args.add(None::<i32>),
        (Bind::I32, Val::I(x)) => args.add(i32::try_from(*x).map_err(|_| type_err(&col.name, v))?),
        (Bind::I64, Val::Null) => args.add(None::<i64>),
        (Bind::I64, Val::I(x)) => args.add(*x),
        (Bind::F32, Val::Null) => args.add(None::<f32>),
        (Bind::F32, Val::F(x)) => args.add(*x as f32),
        (Bind::F64, Val::Null) => args.add(None::<f64>),
        (Bind::F64, Val::F(x)) => args.add(*x),
        (Bind::Bool, Val::Null) => args.add(None::<bool>),
        (Bind::Bool, Val::B(x)) => args.add(*x),
        (Bind::Text, Val::Null) => args.add(None::<String>),
        (Bind::Text, Val::T(x)) => args.add(x.clone()),
        (Bind::Bytes, Val::Null) => args.add(None::<Vec<u8>>),
        (Bind::Bytes, Val::Y(x)) => args.add(x.clone()),
        _ => Err(type_err(&col.name, v)),
    }
}

pub(super) fn add_sqlite(
    args: &mut SqliteArguments<'static>,
    col: &ColumnPlan,
    v: &Val,
) -> std::result::Result<(), sqlx::error::BoxDynError> {
    match v {
        Val::Null => args.add(None::<i64>),
        Val::I(x) => args.add(*x),
        Val::F(x) => args.add(*x),
        Val::B(x) => args.add(*x),
        Val::T(x) if col.bind == Bind::Text => args.add(x.clone()),
        // UInt64 in SQLite: an INTEGER when it fits.
        Val::T(x) => {
            args.add(x.parse::<i64>().map_err(|_| {
                format!("column `{}`: {x} does not fit an SQLite INTEGER", col.name)
            })?)
        }
        Val::Y(x) => args.add(x.clone()),
    }
}

pub(super) fn columns_of(dialect: Dialect, schema: &Schema) -> Result<Vec<ColumnPlan>> {
    schema
        .fields()
        .iter()
        .map(|f| column_plan(dialect, f.name(), f.data_type(), f.is_nullable()))
        .collect()
}

/// The Arrow schema the sink would create a table for, with every column's SQL type
/// (for docs, `etlantic plugins` and tests).
pub fn sql_types(dialect: Dialect, schema: &Schema) -> Result<Vec<(String, String)>> {
    Ok(columns_of(dialect, schema)?
        .into_iter()
        .map(|c| (c.name, c.sql_type))
        .collect())
}
