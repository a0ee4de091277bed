//! Arrow columns to bind values (staging), and result values back to Arrow columns.

use crate::dialect::{Dialect, Ty};
use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int32Array, Int64Array, StringArray,
};
use arrow::compute::{cast, cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, TimeUnit};
use etlantic_core::diagnostics::{codes, Error, Result};
use std::sync::Arc;

/// One value to bind or one value read.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    /// NULL.
    Null,
    /// An integer.
    I(i64),
    /// A float.
    F(f64),
    /// Text.
    T(String),
}

fn arrow_err(what: &str, e: arrow::error::ArrowError) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("{what}: {e}"))
}

fn strict() -> CastOptions<'static> {
    CastOptions {
        safe: false,
        ..Default::default()
    }
}

/// The values of a column, as the dialect stores them (see [`crate::dialect`]).
pub fn column_values(dialect: Dialect, col: &ArrayRef, name: &str) -> Result<Vec<Val>> {
    let ty = Ty::of(col.data_type());
    let err = |e| arrow_err(&format!("staging column `{name}`"), e);
    let n = col.len();
    let collect_i64 = |a: &ArrayRef| -> Vec<Val> {
        let a = a.as_primitive::<Int64Type>();
        (0..n)
            .map(|i| {
                if a.is_null(i) {
                    Val::Null
                } else {
                    Val::I(a.value(i))
                }
            })
            .collect()
    };
    let collect_text = |a: &ArrayRef| -> Vec<Val> {
        let a = a.as_string::<i32>();
        (0..n)
            .map(|i| {
                if a.is_null(i) {
                    Val::Null
                } else {
                    Val::T(a.value(i).to_string())
                }
            })
            .collect()
    };
    Ok(match (dialect, ty) {
        (_, Ty::Other) => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!(
                    "column `{name}`: an SQL region cannot hold values of type {}",
                    col.data_type()
                ),
            ))
        }
        (_, Ty::Null) => vec![Val::Null; n],
        (_, Ty::Int) => collect_i64(&cast(col, &DataType::Int64).map_err(err)?),
        (Dialect::Sqlite, Ty::Float | Ty::Decimal(..)) => {
            let a = cast(col, &DataType::Float64).map_err(err)?;
            let a = a.as_primitive::<Float64Type>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Val::Null
                    } else {
                        Val::F(a.value(i))
                    }
                })
                .collect()
        }
        (Dialect::Sqlite, Ty::Bool) => {
            let a = col.as_boolean();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Val::Null
                    } else {
                        Val::I(a.value(i) as i64)
                    }
                })
                .collect()
        }
        (Dialect::Sqlite, Ty::Date) => {
            let days = cast(col, &DataType::Date32).map_err(err)?;
            let days = cast(&days, &DataType::Int32).map_err(err)?;
            let a = days.as_primitive::<Int32Type>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Val::Null
                    } else {
                        Val::I(a.value(i) as i64)
                    }
                })
                .collect()
        }
        (Dialect::Sqlite, Ty::Timestamp { .. }) => {
            let tz = match col.data_type() {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            let us = cast(col, &DataType::Timestamp(TimeUnit::Microsecond, tz)).map_err(err)?;
            collect_i64(&cast(&us, &DataType::Int64).map_err(err)?)
        }
        (Dialect::Sqlite, Ty::Text) | (Dialect::Postgres, _) => {
            collect_text(&cast(col, &DataType::Utf8).map_err(err)?)
        }
    })
}

/// The placeholder of the `n`th (1-based) bind of a value of kind `ty`.
pub fn placeholder(dialect: Dialect, n: usize, ty: &Ty) -> String {
    match dialect {
        Dialect::Postgres => format!(
            "CAST(${n} AS {})",
            ty.column_type(dialect).unwrap_or_else(|| "TEXT".into())
        ),
        Dialect::Sqlite => "?".into(),
    }
}

/// PostgreSQL's text output of a value of `target` type, in the form Arrow parses.
fn pg_text(text: &str, target: &DataType) -> String {
    match target {
        DataType::Timestamp(_, _) => {
            // `2024-01-01 10:00:00.5+00` → `2024-01-01T10:00:00.5+00:00`
            let t = text.replacen(' ', "T", 1);
            match t.rfind(['+', '-']) {
                Some(p) if p > 10 && t.len() - p == 3 => format!("{t}:00"),
                _ => t,
            }
        }
        DataType::Boolean => match text {
            "t" => "true".into(),
            "f" => "false".into(),
            other => other.into(),
        },
        _ => text.to_string(),
    }
}

/// A result column of `target` type from the values read.
pub fn build_column(
    dialect: Dialect,
    values: Vec<Val>,
    target: &DataType,
    name: &str,
) -> Result<ArrayRef> {
    let err = |e| arrow_err(&format!("result column `{name}`"), e);
    let bad = |v: &Val| {
        Error::new(
            &codes::ENGINE_ERROR,
            format!("result column `{name}`: the database returned {v:?} for a {target} column"),
        )
    };
    let natural: ArrayRef = match (dialect, Ty::of(target)) {
        (Dialect::Sqlite, Ty::Timestamp { .. } | Ty::Date | Ty::Int | Ty::Bool) => {
            let ints: Vec<Option<i64>> = values
                .iter()
                .map(|v| match v {
                    Val::Null => Ok(None),
                    Val::I(i) => Ok(Some(*i)),
                    Val::F(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(Some(*f as i64)),
                    Val::T(t) => t.trim().parse().map(Some).map_err(|_| bad(v)),
                    other => Err(bad(other)),
                })
                .collect::<Result<_>>()?;
            match target {
                DataType::Timestamp(unit, tz) => {
                    let us = cast(
                        &(Arc::new(Int64Array::from(ints)) as ArrayRef),
                        &DataType::Timestamp(TimeUnit::Microsecond, None),
                    )
                    .map_err(err)?;
                    let us = cast(&us, &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()))
                        .map_err(err)?;
                    return cast_with_options(
                        &us,
                        &DataType::Timestamp(*unit, tz.clone()),
                        &strict(),
                    )
                    .map_err(err);
                }
                DataType::Date32 | DataType::Date64 => {
                    let days: Vec<Option<i32>> = ints
                        .into_iter()
                        .map(|d| {
                            d.map(|d| i32::try_from(d).map_err(|_| bad(&Val::I(d))))
                                .transpose()
                        })
                        .collect::<Result<_>>()?;
                    let d32 = cast(
                        &(Arc::new(Int32Array::from(days)) as ArrayRef),
                        &DataType::Date32,
                    )
                    .map_err(err)?;
                    return cast(&d32, target).map_err(err);
                }
                DataType::Boolean => Arc::new(BooleanArray::from(
                    ints.into_iter()
                        .map(|i| i.map(|i| i != 0))
                        .collect::<Vec<_>>(),
                )),
                _ => Arc::new(Int64Array::from(ints)),
            }
        }
        (Dialect::Sqlite, Ty::Float | Ty::Decimal(..)) => {
            let fs: Vec<Option<f64>> = values
                .iter()
                .map(|v| match v {
                    Val::Null => Ok(None),
                    Val::I(i) => Ok(Some(*i as f64)),
                    Val::F(f) => Ok(Some(*f)),
                    Val::T(t) => t.trim().parse().map(Some).map_err(|_| bad(v)),
                })
                .collect::<Result<_>>()?;
            Arc::new(Float64Array::from(fs))
        }
        (Dialect::Sqlite, _) => Arc::new(StringArray::from(
            values
                .iter()
                .map(|v| match v {
                    Val::Null => None,
                    Val::I(i) => Some(i.to_string()),
                    Val::F(f) => Some(f.to_string()),
                    Val::T(t) => Some(t.clone()),
                })
                .collect::<Vec<_>>(),
        )),
        (Dialect::Postgres, _) => Arc::new(StringArray::from(
            values
                .iter()
                .map(|v| match v {
                    Val::Null => None,
                    Val::I(i) => Some(i.to_string()),
                    Val::F(f) => Some(f.to_string()),
                    Val::T(t) => Some(pg_text(t, target)),
                })
                .collect::<Vec<_>>(),
        )),
    };
    if natural.data_type() == target {
        return Ok(natural);
    }
    cast_with_options(&natural, target, &strict()).map_err(err)
}
