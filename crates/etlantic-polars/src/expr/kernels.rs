//! Element-wise functions whose DTCS semantics Polars' built-ins do not have, run inside
//! Polars as anonymous element-wise expressions ([`Expr::map_many`]).
//!
//! - Integer `+ - *` fail on overflow, `/` and `%` on a zero divisor (Polars wraps
//!   around and returns null); `/` truncates and `%` keeps the dividend's sign.
//! - Exact decimal `+ - *` on the 128-bit representation.
//! - String functions with Rust's (and the reference engine's) definitions: Unicode case
//!   mapping, `substr` counting characters from 0, `trim` of Unicode white space,
//!   `replace`, `length` in characters.
//! - `round` ties to even (`etlantic_core::ir::numeric::round_half_even`), `least`/`greatest` in
//!   Arrow's total order of floats, null when any argument is.
//!
//! Functions that can fail take an optional *guard*: a boolean column that is true on the
//! rows where the value is actually used. `case_when`, `coalesce` and the right side of
//! `&&`/`||` evaluate their operands only where they matter (as the reference engine
//! does), so an error on a row whose value is discarded is not an error.

use crate::types::MAX_PRECISION;
use polars::prelude::*;

/// Unicode `White_Space` characters, which DTCS `trim` removes (Rust's `str::trim`).
pub(crate) const WHITE_SPACE: &str = "\u{9}\u{a}\u{b}\u{c}\u{d}\u{20}\u{85}\u{a0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// Arithmetic operators of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
}

impl Arith {
    fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::Rem => "%",
        }
    }
}

fn compute_err(msg: String) -> PolarsError {
    PolarsError::ComputeError(msg.into())
}

/// The common length of the inputs: a length-1 input (a literal) is broadcast.
fn height(cols: &[Column]) -> PolarsResult<usize> {
    let mut n = None;
    for c in cols {
        let l = c.len();
        if l != 1 {
            match n {
                None => n = Some(l),
                Some(m) if m == l => {}
                Some(m) => {
                    return Err(compute_err(format!(
                        "inputs of different lengths ({m} and {l})"
                    )))
                }
            }
        }
    }
    Ok(n.unwrap_or(1))
}

fn broadcast(c: &Column, n: usize) -> Series {
    let s = c.as_materialized_series();
    if s.len() == n {
        s.clone()
    } else {
        s.new_from_index(0, n)
    }
}

/// An element-wise function of `inputs` with the output type `out`.
pub(crate) fn udf<F>(name: &'static str, inputs: Vec<Expr>, out: DataType, f: F) -> Expr
where
    F: Fn(&[Series]) -> PolarsResult<Series> + Send + Sync + 'static,
{
    let mut it = inputs.into_iter();
    let first = it.next().expect("a function has an input");
    let rest: Vec<Expr> = it.collect();
    let out_field = out.clone();
    first.map_many(
        move |cols: &mut [Column]| {
            let n = height(cols)?;
            let series: Vec<Series> = cols.iter().map(|c| broadcast(c, n)).collect();
            let result = f(&series)
                .map_err(|e| e.wrap_msg(|m| format!("{name}: {m}")))?
                .with_name(cols[0].name().clone());
            let result = if result.dtype() == &out {
                result
            } else {
                result.strict_cast(&out)?
            };
            Ok(result.into_column())
        },
        &rest,
        move |_, fields| Ok(Field::new(fields[0].name().clone(), out_field.clone())),
    )
}

/// The guard of the rows, if any (the last input when `guarded`).
fn guard(inputs: &[Series], guarded: bool) -> PolarsResult<Option<BooleanChunked>> {
    if !guarded {
        return Ok(None);
    }
    let g = inputs.last().expect("guard input");
    Ok(Some(g.cast(&DataType::Boolean)?.bool()?.clone()))
}

fn active(g: &Option<BooleanChunked>, i: usize) -> bool {
    g.as_ref().is_none_or(|g| g.get(i) == Some(true))
}

fn ints(s: &Series) -> PolarsResult<Int64Chunked> {
    Ok(s.strict_cast(&DataType::Int64)?.i64()?.clone())
}

fn floats(s: &Series) -> PolarsResult<Float64Chunked> {
    Ok(s.cast(&DataType::Float64)?.f64()?.clone())
}

fn strs(s: &Series) -> PolarsResult<StringChunked> {
    Ok(s.cast(&DataType::String)?.str()?.clone())
}

/// `(unscaled values, scale)` of a decimal or integer series.
fn decimals(s: &Series) -> PolarsResult<(Vec<Option<i128>>, usize)> {
    match s.dtype() {
        DataType::Decimal(_, scale) => {
            let ca = s.decimal()?;
            Ok((ca.physical().iter().collect(), *scale))
        }
        _ => Ok((ints(s)?.iter().map(|v| v.map(i128::from)).collect(), 0)),
    }
}

fn pow10(k: usize) -> Option<i128> {
    10i128.checked_pow(u32::try_from(k).ok()?)
}

fn decimal_series(values: Vec<Option<i128>>, scale: usize) -> PolarsResult<Series> {
    let limit = pow10(MAX_PRECISION).expect("10^38 fits");
    if let Some(v) = values
        .iter()
        .flatten()
        .find(|v| v.unsigned_abs() >= limit as u128)
    {
        return Err(compute_err(format!(
            "decimal overflow: {v} (scale {scale}) has more than {MAX_PRECISION} digits"
        )));
    }
    Ok(Int128Chunked::from_iter(values)
        .into_decimal_unchecked(MAX_PRECISION, scale)
        .into_series())
}

/// `a op b` on integers, as `Int64`: overflow and a zero divisor are errors (on guarded
/// rows); `/` truncates, `%` takes the dividend's sign.
pub(crate) fn int_arith(op: Arith, inputs: Vec<Expr>, guarded: bool) -> Expr {
    udf("integer arithmetic", inputs, DataType::Int64, move |s| {
        let (a, b) = (ints(&s[0])?, ints(&s[1])?);
        let g = guard(s, guarded)?;
        let mut out = Vec::with_capacity(a.len());
        for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
            let (Some(x), Some(y)) = (x, y) else {
                out.push(None);
                continue;
            };
            if !active(&g, i) {
                out.push(None);
                continue;
            }
            let v = match op {
                Arith::Add => x.checked_add(y),
                Arith::Sub => x.checked_sub(y),
                Arith::Mul => x.checked_mul(y),
                Arith::Div | Arith::Rem if y == 0 => {
                    return Err(compute_err("Divide by zero error".into()))
                }
                Arith::Div => x.checked_div(y),
                Arith::Rem => Some(x.wrapping_rem(y)),
            };
            match v {
                Some(v) => out.push(Some(v)),
                None => {
                    return Err(compute_err(format!(
                        "integer overflow: {x} {} {y}",
                        op.symbol()
                    )))
                }
            }
        }
        Ok(Int64Chunked::from_iter(out).into_series())
    })
}

/// `a op b` on floating point numbers (IEEE; `%` is the truncated remainder), as `out`
/// (`Float64`, or `Float32` when both operands are).
pub(crate) fn float_arith(op: Arith, inputs: Vec<Expr>, out: DataType) -> Expr {
    udf("arithmetic", inputs, out, move |s| {
        let (a, b) = (floats(&s[0])?, floats(&s[1])?);
        let v: Float64Chunked = a
            .iter()
            .zip(b.iter())
            .map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) => Some(match op {
                    Arith::Add => x + y,
                    Arith::Sub => x - y,
                    Arith::Mul => x * y,
                    Arith::Div => x / y,
                    Arith::Rem => x % y,
                }),
                _ => None,
            })
            .collect();
        Ok(v.into_series())
    })
}

/// `a op b` on exact decimals (`+ - *`; integers are decimals of scale 0), as a decimal
/// of scale `out_scale`. More than 38 digits is an error (on guarded rows).
pub(crate) fn decimal_arith(op: Arith, inputs: Vec<Expr>, out_scale: usize, guarded: bool) -> Expr {
    udf(
        "decimal arithmetic",
        inputs,
        DataType::Decimal(MAX_PRECISION, out_scale),
        move |s| {
            let (a, sa) = decimals(&s[0])?;
            let (b, sb) = decimals(&s[1])?;
            let g = guard(s, guarded)?;
            let overflow = || compute_err(format!("decimal overflow in {}", op.symbol()));
            let rescale = |v: i128, from: usize| -> Option<i128> {
                v.checked_mul(pow10(out_scale.checked_sub(from)?)?)
            };
            let mut out = Vec::with_capacity(a.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                let (Some(x), Some(y)) = (*x, *y) else {
                    out.push(None);
                    continue;
                };
                if !active(&g, i) {
                    out.push(None);
                    continue;
                }
                let v = match op {
                    Arith::Add => rescale(x, sa)
                        .zip(rescale(y, sb))
                        .and_then(|(x, y)| x.checked_add(y)),
                    Arith::Sub => rescale(x, sa)
                        .zip(rescale(y, sb))
                        .and_then(|(x, y)| x.checked_sub(y)),
                    Arith::Mul => x.checked_mul(y),
                    Arith::Div | Arith::Rem => {
                        return Err(compute_err("decimal division is not supported".into()))
                    }
                };
                out.push(Some(v.ok_or_else(overflow)?));
            }
            let out = if guarded {
                // Unused rows may hold values that do not fit: they are null.
                let limit = pow10(MAX_PRECISION).expect("fits");
                out.into_iter()
                    .enumerate()
                    .map(|(i, v)| v.filter(|v| active(&g, i) || v.unsigned_abs() < limit as u128))
                    .collect()
            } else {
                out
            };
            decimal_series(out, out_scale)
        },
    )
}

/// Arithmetic negation (integers wrap around, as in the reference engine).
pub(crate) fn negate(input: Expr, out: DataType) -> Expr {
    udf("negation", vec![input], out.clone(), move |s| {
        let x = &s[0];
        match x.dtype() {
            DataType::Decimal(_, scale) => {
                let (v, _) = decimals(x)?;
                decimal_series(
                    v.into_iter().map(|v| v.map(i128::wrapping_neg)).collect(),
                    *scale,
                )
            }
            dt if dt.is_float() => {
                let v: Float64Chunked = floats(x)?.iter().map(|v| v.map(|v| -v)).collect();
                Ok(v.into_series())
            }
            DataType::Null => Ok(x.clone()),
            _ => {
                let v: Int64Chunked = ints(x)?.iter().map(|v| v.map(i64::wrapping_neg)).collect();
                Ok(v.into_series())
            }
        }
    })
}

/// `abs`: integers fail on overflow (on guarded rows), decimals wrap around, as in the
/// reference engine.
pub(crate) fn abs(inputs: Vec<Expr>, out: DataType, guarded: bool) -> Expr {
    udf("dtcs:abs", inputs, out.clone(), move |s| {
        let x = &s[0];
        let g = guard(s, guarded)?;
        match x.dtype() {
            DataType::Decimal(_, scale) => {
                let (v, _) = decimals(x)?;
                decimal_series(
                    v.into_iter().map(|v| v.map(i128::wrapping_abs)).collect(),
                    *scale,
                )
            }
            dt if dt.is_float() => {
                let v: Float64Chunked = floats(x)?.iter().map(|v| v.map(f64::abs)).collect();
                Ok(v.into_series())
            }
            dt if dt.is_unsigned_integer() || dt.is_null() => Ok(x.clone()),
            dt => {
                let dt = dt.clone();
                let mut out = Vec::with_capacity(x.len());
                for (i, v) in ints(x)?.iter().enumerate() {
                    match v {
                        Some(v) if active(&g, i) => {
                            let a = v
                                .checked_abs()
                                .filter(|a| fits(*a, &dt))
                                .ok_or_else(|| compute_err(format!("{dt} overflow on abs({v})")))?;
                            out.push(Some(a));
                        }
                        _ => out.push(None),
                    }
                }
                Int64Chunked::from_iter(out).into_series().strict_cast(&dt)
            }
        }
    })
}

fn fits(v: i64, dt: &DataType) -> bool {
    match dt {
        DataType::Int8 => i8::try_from(v).is_ok(),
        DataType::Int16 => i16::try_from(v).is_ok(),
        DataType::Int32 => i32::try_from(v).is_ok(),
        _ => true,
    }
}

/// `round(x, digits)` in `Float64`, ties to even
/// ([`etlantic_core::ir::numeric::round_half_even`]).
pub(crate) fn round(inputs: Vec<Expr>) -> Expr {
    udf("dtcs:round", inputs, DataType::Float64, |s| {
        let x = floats(&s[0])?;
        let d = match s.get(1) {
            Some(d) => ints(d)?,
            None => Int64Chunked::full(PlSmallStr::EMPTY, 0, x.len()),
        };
        let mut out = Vec::with_capacity(x.len());
        for (x, d) in x.iter().zip(d.iter()) {
            out.push(match (x, d) {
                (Some(x), Some(d)) => Some(etlantic_core::ir::numeric::round_half_even(x, d)),
                _ => None,
            });
        }
        Ok(Float64Chunked::from_iter(out).into_series())
    })
}

/// A unary function of a `Float64` (`floor`, `ceil`).
pub(crate) fn float_unary(name: &'static str, input: Expr, f: fn(f64) -> f64) -> Expr {
    udf(name, vec![input], DataType::Float64, move |s| {
        let v: Float64Chunked = floats(&s[0])?.iter().map(|v| v.map(f)).collect();
        Ok(v.into_series())
    })
}

/// `power(a, b)` in `Float64`.
pub(crate) fn power(inputs: Vec<Expr>) -> Expr {
    udf("dtcs:power", inputs, DataType::Float64, |s| {
        let (a, b) = (floats(&s[0])?, floats(&s[1])?);
        let v: Float64Chunked = a
            .iter()
            .zip(b.iter())
            .map(|(a, b)| Some(a?.powf(b?)))
            .collect();
        Ok(v.into_series())
    })
}

/// `sqrt(x)` in `Float64`; a negative number is an error (on guarded rows).
pub(crate) fn sqrt(inputs: Vec<Expr>, guarded: bool) -> Expr {
    udf("dtcs:sqrt", inputs, DataType::Float64, move |s| {
        let x = floats(&s[0])?;
        let g = guard(s, guarded)?;
        let mut out = Vec::with_capacity(x.len());
        for (i, v) in x.iter().enumerate() {
            match v {
                Some(v) if active(&g, i) => {
                    if v < 0.0 {
                        return Err(compute_err(format!(
                            "dtcs:sqrt is not defined for negative numbers; got {v}"
                        )));
                    }
                    out.push(Some(v.sqrt()));
                }
                _ => out.push(None),
            }
        }
        Ok(Float64Chunked::from_iter(out).into_series())
    })
}

/// `least`/`greatest` of `Float64`s in Arrow's total order, or of `Int64`s when
/// `integers` (as ETLantic-py keeps integers integers); null when any argument is.
pub(crate) fn least_greatest(inputs: Vec<Expr>, greatest: bool, integers: bool) -> Expr {
    let name = if greatest {
        "dtcs:greatest"
    } else {
        "dtcs:least"
    };
    fn pick<T: Copy>(cols: &[Vec<Option<T>>], keep_first: impl Fn(T, T) -> bool) -> Vec<Option<T>> {
        let n = cols.first().map_or(0, Vec::len);
        (0..n)
            .map(|i| {
                let mut acc: Option<T> = None;
                for c in cols {
                    let v = c[i]?;
                    acc = Some(match acc {
                        Some(a) if keep_first(a, v) => a,
                        _ => v,
                    });
                }
                acc
            })
            .collect()
    }
    let out = if integers {
        DataType::Int64
    } else {
        DataType::Float64
    };
    udf(name, inputs, out, move |s| {
        if integers {
            let cols = s
                .iter()
                .map(|c| Ok(ints(c)?.iter().collect()))
                .collect::<PolarsResult<Vec<Vec<Option<i64>>>>>()?;
            let v = pick(&cols, |a, b| if greatest { a >= b } else { a <= b });
            return Ok(Int64Chunked::from_iter(v).into_series());
        }
        let cols = s
            .iter()
            .map(|c| Ok(floats(c)?.iter().collect()))
            .collect::<PolarsResult<Vec<Vec<Option<f64>>>>>()?;
        let v = pick(&cols, |a: f64, b: f64| {
            if greatest {
                a.total_cmp(&b).is_ge()
            } else {
                a.total_cmp(&b).is_le()
            }
        });
        Ok(Float64Chunked::from_iter(v).into_series())
    })
}

/// A function of string arguments producing a string; null when any argument is.
pub(crate) fn string_fn<F>(name: &'static str, inputs: Vec<Expr>, f: F) -> Expr
where
    F: Fn(&[&str]) -> String + Send + Sync + 'static,
{
    udf(name, inputs, DataType::String, move |s| {
        let cols = s.iter().map(strs).collect::<PolarsResult<Vec<_>>>()?;
        let n = cols.first().map_or(0, |c| c.len());
        let mut args: Vec<&str> = Vec::with_capacity(cols.len());
        let mut out: Vec<Option<String>> = Vec::with_capacity(n);
        for i in 0..n {
            args.clear();
            let mut null = false;
            for c in &cols {
                match c.get(i) {
                    Some(v) => args.push(v),
                    None => null = true,
                }
            }
            out.push(if null { None } else { Some(f(&args)) });
        }
        Ok(StringChunked::from_iter(out).into_series())
    })
}

/// A predicate of string arguments; null when any argument is.
pub(crate) fn string_predicate<F>(name: &'static str, inputs: Vec<Expr>, f: F) -> Expr
where
    F: Fn(&str, &str) -> bool + Send + Sync + 'static,
{
    udf(name, inputs, DataType::Boolean, move |s| {
        let (a, b) = (strs(&s[0])?, strs(&s[1])?);
        let v: BooleanChunked = a
            .iter()
            .zip(b.iter())
            .map(|(a, b)| Some(f(a?, b?)))
            .collect();
        Ok(v.into_series())
    })
}

/// `length(s)`: the number of characters, as `Int64`.
pub(crate) fn length(input: Expr) -> Expr {
    udf("dtcs:length", vec![input], DataType::Int64, |s| {
        let v: Int64Chunked = strs(&s[0])?
            .iter()
            .map(|v| v.map(|v| v.chars().count() as i64))
            .collect();
        Ok(v.into_series())
    })
}

/// `concat_ws(separator, ...)`: null arguments are skipped; null when the separator is.
pub(crate) fn concat_ws(inputs: Vec<Expr>) -> Expr {
    udf("dtcs:concat_ws", inputs, DataType::String, |s| {
        let cols = s.iter().map(strs).collect::<PolarsResult<Vec<_>>>()?;
        let n = cols.first().map_or(0, |c| c.len());
        let mut out: Vec<Option<String>> = Vec::with_capacity(n);
        for i in 0..n {
            out.push(cols[0].get(i).map(|sep| {
                cols[1..]
                    .iter()
                    .filter_map(|c| c.get(i))
                    .collect::<Vec<_>>()
                    .join(sep)
            }));
        }
        Ok(StringChunked::from_iter(out).into_series())
    })
}

/// `substr(s, start, length?)`: characters from `start` (counted from 0); a negative
/// start or length is an error (on guarded rows).
pub(crate) fn substr(inputs: Vec<Expr>, with_length: bool, guarded: bool) -> Expr {
    udf("dtcs:substr", inputs, DataType::String, move |s| {
        let text = strs(&s[0])?;
        let start = ints(&s[1])?;
        let len = if with_length {
            Some(ints(&s[2])?)
        } else {
            None
        };
        let g = guard(s, guarded)?;
        let mut out: Vec<Option<String>> = Vec::with_capacity(text.len());
        for i in 0..text.len() {
            let (Some(t), Some(st)) = (text.get(i), start.get(i)) else {
                out.push(None);
                continue;
            };
            let n = match &len {
                Some(l) => match l.get(i) {
                    Some(n) => Some(n),
                    None => {
                        out.push(None);
                        continue;
                    }
                },
                None => None,
            };
            if !active(&g, i) {
                out.push(None);
                continue;
            }
            if st < 0 {
                return Err(compute_err(format!(
                    "dtcs:substr start (0-based) must not be negative; got {st}"
                )));
            }
            if let Some(n) = n {
                if n < 0 {
                    return Err(compute_err(format!(
                        "negative substring length not allowed: substr(<str>, {}, {n})",
                        st.saturating_add(1)
                    )));
                }
            }
            let chars = t.chars().skip(st as usize);
            out.push(Some(match n {
                Some(n) => chars.take(n as usize).collect(),
                None => chars.collect(),
            }));
        }
        Ok(StringChunked::from_iter(out).into_series())
    })
}

/// Trims the characters of `chars` (Unicode white space by default) from both ends, the
/// start or the end.
pub(crate) fn trim(name: &'static str, inputs: Vec<Expr>, start: bool, end: bool) -> Expr {
    let with_chars = inputs.len() > 1;
    string_fn(name, inputs, move |a| {
        let set = if with_chars { a[1] } else { WHITE_SPACE };
        let matches = |c: char| set.contains(c);
        let s = a[0];
        let s = if start {
            s.trim_start_matches(matches)
        } else {
            s
        };
        let s = if end { s.trim_end_matches(matches) } else { s };
        s.to_string()
    })
}

/// The exact average of a decimal group from its sum and count, as the reference engine
/// computes it: `sum * 10^(out_scale - scale) / count`, truncated.
pub(crate) fn decimal_average(sum: Expr, count: Expr, out: DataType) -> Expr {
    let out_scale = crate::types::scale(&out);
    udf("dtcs:average", vec![sum, count], out, move |s| {
        let (sums, scale) = decimals(&s[0])?;
        let counts = ints(&s[1])?;
        let mul = pow10(out_scale.saturating_sub(scale))
            .ok_or_else(|| compute_err("decimal overflow in average".into()))?;
        let mut out = Vec::with_capacity(sums.len());
        for (v, n) in sums.iter().zip(counts.iter()) {
            out.push(match (v, n) {
                (Some(v), Some(n)) if n > 0 => Some(
                    v.checked_mul(mul)
                        .ok_or_else(|| compute_err("decimal overflow in average".into()))?
                        / i128::from(n),
                ),
                _ => None,
            });
        }
        decimal_series(out, out_scale)
    })
}

/// The sum (or mean) of the non-null `Float64` values of a group, added one by one in
/// the order they come (the caller sorts them by the row order), as the reference
/// engine's grouped aggregation adds them; null when there are none.
pub(crate) fn sequential_sum(values: Expr, mean: bool) -> Expr {
    let name = if mean { "dtcs:average" } else { "dtcs:sum" };
    values.agg_with_fmt_str(
        move |c: Column| {
            let s = c.as_materialized_series().cast(&DataType::Float64)?;
            let mut acc = 0f64;
            let mut n = 0u64;
            for v in s.f64()?.iter().flatten() {
                acc += v;
                n += 1;
            }
            let value = match (n, mean) {
                (0, _) => None,
                (_, true) => Some(acc / n as f64),
                (_, false) => Some(acc),
            };
            Ok(Float64Chunked::from_iter([value])
                .into_series()
                .with_name(c.name().clone())
                .into_column())
        },
        |_, f| Ok(Field::new(f.name().clone(), DataType::Float64)),
        name,
    )
}
