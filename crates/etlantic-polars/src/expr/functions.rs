//! DTCS scalar functions (`dtcs:stdlib.functions`) on Polars.
//!
//! Each is defined as DTCS (and the reference engine) define it: `concat` and `+` on
//! strings are null when an argument is, `substr` counts characters from 0, `trim`
//! strips Unicode white space, `round` rounds ties to even and returns a decimal
//! (`Float64`), `least`/`greatest` compare as decimals and are null when an argument is,
//! `coalesce` and `case_when` evaluate an argument only where it is used, `x in (...)` is
//! SQL's `IN` (three-valued). Functions outside [`FUNCTIONS`] are refused (`ETL501`).

use super::kernels::{self, string_fn, string_predicate};
use super::{comparable_pair, compile_guarded, guarded, narrow, Compiled, Guard, Scope};
use crate::error;
use crate::types::{
    common_type, describe, is_boolean, is_decimal, is_float, is_integer, is_null, is_numeric,
    is_string, scale, MAX_PRECISION,
};
use etlantic_core::diagnostics::codes;
use etlantic_core::ir::{Expr as IrExpr, Literal};
use etlantic_core::Result;
use polars::prelude::*;

/// The scalar function ids the compiler implements.
pub(crate) const FUNCTIONS: &[&str] = &[
    "dtcs:lower",
    "dtcs:upper",
    "dtcs:concat",
    "dtcs:concat_ws",
    "dtcs:substr",
    "dtcs:replace",
    "dtcs:length",
    "dtcs:contains",
    "dtcs:starts_with",
    "dtcs:ends_with",
    "dtcs:trim",
    "dtcs:ltrim",
    "dtcs:rtrim",
    "dtcs:coalesce",
    "dtcs:if_null",
    "dtcs:null_if",
    "dtcs:case_when",
    "dtcs:is_null",
    "dtcs:is_missing",
    "dtcs:is_invalid",
    "dtcs:abs",
    "dtcs:round",
    "dtcs:floor",
    "dtcs:ceil",
    "dtcs:power",
    "dtcs:sqrt",
    "dtcs:least",
    "dtcs:greatest",
    "dtcs:in",
    "dtcs:between",
];

/// Aggregate functions: valid only in `dtcs:aggregate` (`min`/`max` with two or more
/// arguments are `least`/`greatest`).
const AGGREGATES: &[&str] = &[
    "dtcs:count_all",
    "dtcs:count",
    "dtcs:count_distinct",
    "dtcs:sum",
    "dtcs:average",
    "dtcs:first",
    "dtcs:last",
    "dtcs:variance",
    "dtcs:stddev",
    "dtcs:min",
    "dtcs:max",
];

fn short(function: &str) -> &str {
    function.strip_prefix("dtcs:").unwrap_or(function)
}

fn bad_call(function: &str, msg: impl std::fmt::Display) -> etlantic_core::Error {
    error::type_mismatch(format!("{}: {msg}", short(function)))
}

fn arity(function: &str, args: &[IrExpr], min: usize, max: Option<usize>) -> Result<()> {
    let n = args.len();
    if n >= min && max.is_none_or(|m| n <= m) {
        return Ok(());
    }
    let expected = match max {
        Some(m) if m == min => format!("{min}"),
        Some(m) => format!("{min} to {m}"),
        None => format!("at least {min}"),
    };
    Err(bad_call(
        function,
        format!("takes {expected} argument(s), got {n}"),
    ))
}

fn typed(args: &[IrExpr], scope: &Scope, guard: &Guard) -> Result<Vec<Compiled>> {
    args.iter()
        .map(|a| compile_guarded(a, scope, guard))
        .collect()
}

fn expect(function: &str, a: &Compiled, ok: fn(&DataType) -> bool, what: &str) -> Result<()> {
    if ok(&a.dtype) || is_null(&a.dtype) {
        Ok(())
    } else {
        Err(bad_call(
            function,
            format!("expects {what}, got {}", describe(&a.dtype)),
        ))
    }
}

fn strings(function: &str, args: &[Compiled]) -> Result<()> {
    args.iter()
        .try_for_each(|a| expect(function, a, is_string, "a string"))
}

fn numbers(function: &str, args: &[Compiled]) -> Result<()> {
    args.iter()
        .try_for_each(|a| expect(function, a, is_numeric, "a number"))
}

fn exprs(args: Vec<Compiled>) -> Vec<Expr> {
    args.into_iter().map(|a| a.expr).collect()
}

fn f64s(args: Vec<Compiled>) -> Vec<Expr> {
    args.into_iter()
        .map(|a| a.cast_to(&DataType::Float64))
        .collect()
}

/// The value of an integer literal (including a negated one).
fn const_int(e: &IrExpr) -> Option<i64> {
    match e {
        IrExpr::Literal(Literal::Integer(i)) => Some(*i),
        IrExpr::Unary(etlantic_core::ir::UnaryOp::Negate, inner) => {
            const_int(inner).and_then(i64::checked_neg)
        }
        _ => None,
    }
}

/// The type the arguments of `coalesce`/`if_null` are unified to: integers as `Int64`,
/// integers and decimals as a decimal, anything with a float as `Float64`.
fn value_union(function: &str, args: &[Compiled]) -> Result<DataType> {
    let mut t = DataType::Null;
    for a in args {
        let u = &a.dtype;
        t = if is_numeric(&t) && is_numeric(u) && t != *u {
            if is_float(&t) || is_float(u) {
                DataType::Float64
            } else if is_decimal(&t) || is_decimal(u) {
                DataType::Decimal(MAX_PRECISION, scale(&t).max(scale(u)))
            } else {
                DataType::Int64
            }
        } else {
            common_type(&t, u).ok_or_else(|| {
                bad_call(
                    function,
                    format!(
                        "arguments of different types: {} and {}",
                        describe(&t),
                        describe(u)
                    ),
                )
            })?
        };
    }
    Ok(t)
}

/// Null when any of `args` is null, `value` otherwise.
fn null_if_any_null(args: &[Expr], value: Expr, dtype: &DataType) -> Expr {
    match args
        .iter()
        .map(|a| a.clone().is_null())
        .reduce(|a, b| a.or(b))
    {
        None => value,
        Some(any) => when(any)
            .then(lit(NULL).cast(dtype.clone()))
            .otherwise(value),
    }
}

/// Compiles a function call.
pub(crate) fn call(
    function: &str,
    args: &[IrExpr],
    scope: &Scope,
    guard: &Guard,
) -> Result<Compiled> {
    let f = function;
    match f {
        "dtcs:lower" | "dtcs:upper" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            let e = if f == "dtcs:lower" {
                string_fn("dtcs:lower", exprs(a), |p| p[0].to_lowercase())
            } else {
                string_fn("dtcs:upper", exprs(a), |p| p[0].to_uppercase())
            };
            Ok(Compiled::new(e, DataType::String))
        }
        "dtcs:concat" => {
            arity(f, args, 2, None)?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            Ok(Compiled::new(
                string_fn("dtcs:concat", exprs(a), |p| p.concat()),
                DataType::String,
            ))
        }
        "dtcs:concat_ws" => {
            arity(f, args, 2, None)?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            Ok(Compiled::new(kernels::concat_ws(exprs(a)), DataType::String))
        }
        "dtcs:substr" => {
            arity(f, args, 2, Some(3))?;
            if const_int(&args[1]).is_some_and(|s| s < 0) {
                return Err(bad_call(f, "the start (0-based) must not be negative"));
            }
            if args.get(2).and_then(const_int).is_some_and(|n| n < 0) {
                return Err(bad_call(f, "the length must not be negative"));
            }
            let a = typed(args, scope, guard)?;
            expect(f, &a[0], is_string, "a string")?;
            for x in &a[1..] {
                expect(f, x, is_integer, "an integer")?;
            }
            let with_length = a.len() == 3;
            let (inputs, g) = guarded(exprs(a), guard);
            Ok(Compiled::new(
                kernels::substr(inputs, with_length, g),
                DataType::String,
            ))
        }
        "dtcs:replace" => {
            arity(f, args, 3, Some(3))?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            Ok(Compiled::new(
                string_fn("dtcs:replace", exprs(a), |p| p[0].replace(p[1], p[2])),
                DataType::String,
            ))
        }
        "dtcs:length" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            Ok(Compiled::new(
                kernels::length(exprs(a).remove(0)),
                DataType::Int64,
            ))
        }
        "dtcs:contains" | "dtcs:starts_with" | "dtcs:ends_with" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope, guard)?;
            if f == "dtcs:contains" && matches!(a[0].dtype, DataType::List(_)) {
                return Err(error::unsupported("`contains` on lists"));
            }
            strings(f, &a)?;
            let e = match f {
                "dtcs:contains" => string_predicate("dtcs:contains", exprs(a), |a, b| a.contains(b)),
                "dtcs:starts_with" => {
                    string_predicate("dtcs:starts_with", exprs(a), |a, b| a.starts_with(b))
                }
                _ => string_predicate("dtcs:ends_with", exprs(a), |a, b| a.ends_with(b)),
            };
            Ok(Compiled::new(e, DataType::Boolean))
        }
        "dtcs:trim" | "dtcs:ltrim" | "dtcs:rtrim" => {
            arity(f, args, 1, Some(2))?;
            let a = typed(args, scope, guard)?;
            strings(f, &a)?;
            let (start, end) = match f {
                "dtcs:trim" => (true, true),
                "dtcs:ltrim" => (true, false),
                _ => (false, true),
            };
            let name = match f {
                "dtcs:trim" => "dtcs:trim",
                "dtcs:ltrim" => "dtcs:ltrim",
                _ => "dtcs:rtrim",
            };
            Ok(Compiled::new(
                kernels::trim(name, exprs(a), start, end),
                DataType::String,
            ))
        }
        "dtcs:coalesce" | "dtcs:if_null" => {
            if f == "dtcs:if_null" {
                arity(f, args, 2, Some(2))?;
            } else {
                arity(f, args, 1, None)?;
            }
            coalesce(f, args, scope, guard)
        }
        "dtcs:null_if" => {
            arity(f, args, 2, Some(2))?;
            let (a, b, t) = comparable_pair(&args[0], &args[1], scope, guard, &|x, y| {
                format!(
                    "null_if: cannot compare {} with {}",
                    describe(x),
                    describe(y)
                )
            })?;
            Ok(Compiled::new(
                when(a.clone().eq(b))
                    .then(lit(NULL).cast(t.clone()))
                    .otherwise(a),
                t,
            ))
        }
        "dtcs:case_when" => case_when(f, args, scope, guard),
        "dtcs:is_null" => {
            arity(f, args, 1, Some(1))?;
            let x = compile_guarded(&args[0], scope, guard)?;
            Ok(Compiled::new(x.expr.is_null(), DataType::Boolean))
        }
        "dtcs:is_missing" => {
            arity(f, args, 1, Some(1))?;
            // Relations have a fixed schema: a column is missing from every row or none.
            let missing = match &args[0] {
                IrExpr::Column(c) => !scope.has(c),
                other => {
                    compile_guarded(other, scope, guard)?;
                    false
                }
            };
            Ok(Compiled::new(lit(missing), DataType::Boolean))
        }
        "dtcs:is_invalid" => {
            arity(f, args, 1, Some(1))?;
            // Arrow values are never DTCS `invalid`.
            compile_guarded(&args[0], scope, guard)?;
            Ok(Compiled::new(lit(false), DataType::Boolean))
        }
        "dtcs:abs" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            let dt = a[0].dtype.clone();
            if is_null(&dt) {
                return Ok(a.into_iter().next().expect("one arg"));
            }
            let (inputs, g) = guarded(exprs(a), guard);
            Ok(Compiled::new(kernels::abs(inputs, dt.clone(), g), dt))
        }
        "dtcs:round" => {
            arity(f, args, 1, Some(2))?;
            let mut a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            let mut inputs = Vec::new();
            let digits = if a.len() == 2 {
                let d = a.pop().expect("two args");
                if !(is_integer(&d.dtype) || is_null(&d.dtype)) {
                    return Err(bad_call(f, "the number of digits must be an integer"));
                }
                Some(d.cast_to(&DataType::Int64))
            } else {
                None
            };
            inputs.push(a.remove(0).cast_to(&DataType::Float64));
            inputs.extend(digits);
            Ok(Compiled::new(kernels::round(inputs), DataType::Float64))
        }
        "dtcs:floor" | "dtcs:ceil" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            let x = f64s(a).remove(0);
            let e = if f == "dtcs:floor" {
                kernels::float_unary("dtcs:floor", x, f64::floor)
            } else {
                kernels::float_unary("dtcs:ceil", x, f64::ceil)
            };
            Ok(Compiled::new(e, DataType::Float64))
        }
        "dtcs:power" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            Ok(Compiled::new(kernels::power(f64s(a)), DataType::Float64))
        }
        "dtcs:sqrt" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            let (inputs, g) = guarded(f64s(a), guard);
            Ok(Compiled::new(kernels::sqrt(inputs, g), DataType::Float64))
        }
        "dtcs:least" | "dtcs:greatest" | "dtcs:min" | "dtcs:max" if args.len() >= 2 => {
            let a = typed(args, scope, guard)?;
            numbers(f, &a)?;
            let greatest = matches!(f, "dtcs:greatest" | "dtcs:max");
            let integers = a
                .iter()
                .all(|x| is_integer(&x.dtype) || is_null(&x.dtype));
            if integers {
                let inputs = a.into_iter().map(|x| x.cast_to(&DataType::Int64)).collect();
                return Ok(Compiled::new(
                    kernels::least_greatest(inputs, greatest, true),
                    DataType::Int64,
                ));
            }
            Ok(Compiled::new(
                kernels::least_greatest(f64s(a), greatest, false),
                DataType::Float64,
            ))
        }
        "dtcs:in" => in_list(f, args, scope, guard),
        "dtcs:between" => {
            arity(f, args, 3, Some(3))?;
            let what = |x: &DataType, y: &DataType| {
                format!("between: cannot compare {} with {}", describe(x), describe(y))
            };
            let (v1, lo, _) = comparable_pair(&args[0], &args[1], scope, guard, &what)?;
            let (v2, hi, _) = comparable_pair(&args[0], &args[2], scope, guard, &what)?;
            let value = v1.clone().gt_eq(lo.clone()).and(v2.lt_eq(hi.clone()));
            Ok(Compiled::new(
                null_if_any_null(&[v1, lo, hi], value, &DataType::Boolean),
                DataType::Boolean,
            ))
        }
        _ if AGGREGATES.contains(&f) => Err(bad_call(
            f,
            "is an aggregate function; use it in `dtcs:aggregate` (or pass at least two arguments to min/max)",
        )),
        _ => Err(unknown(f)),
    }
}

/// `ETL501` for a registered function this backend lacks, `ETL306` for an unknown one.
fn unknown(f: &str) -> etlantic_core::Error {
    if dtcs_known(f) {
        error::unsupported(format!("the function `{f}`"))
    } else {
        error::err(
            &codes::UNKNOWN_FUNCTION,
            format!("unknown function `{f}`: it is not in the DTCS function registry"),
        )
    }
}

fn dtcs_known(f: &str) -> bool {
    // Everything in the `dtcs:` namespace and every vendor function is "known": only
    // the reference engine (which runs first in `output_schema`) decides that a name
    // is not in the registry.
    f.contains(':')
}

fn coalesce(f: &str, args: &[IrExpr], scope: &Scope, guard: &Guard) -> Result<Compiled> {
    // Argument i is used where arguments 0..i are null.
    let mut compiled = Vec::with_capacity(args.len());
    let mut g = guard.clone();
    for a in args {
        let c = compile_guarded(a, scope, &g)?;
        g = narrow(&g, c.expr.clone().is_null());
        compiled.push(c);
    }
    let t = value_union(f, &compiled)?;
    let mut it = compiled.into_iter().rev();
    let last = it.next().expect("at least one argument").cast_to(&t);
    let e = it.fold(last, |acc, c| {
        let v = c.cast_to(&t);
        when(v.clone().is_not_null()).then(v).otherwise(acc)
    });
    Ok(Compiled::new(e, t))
}

fn case_when(f: &str, args: &[IrExpr], scope: &Scope, guard: &Guard) -> Result<Compiled> {
    arity(f, args, 2, None)?;
    let mut pairs: Vec<(Expr, Compiled)> = Vec::new();
    let mut otherwise: Option<Compiled> = None;
    // Rows no earlier condition took.
    let mut rest = guard.clone();
    let mut i = 0;
    while i < args.len() {
        if i + 1 == args.len() {
            otherwise = Some(compile_guarded(&args[i], scope, &rest)?);
            break;
        }
        let c = compile_guarded(&args[i], scope, &rest)?;
        if !is_boolean(&c.dtype) {
            return Err(bad_call(
                f,
                format!("conditions must be boolean, got {}", describe(&c.dtype)),
            ));
        }
        let cond = c.into_condition();
        let v = compile_guarded(&args[i + 1], scope, &narrow(&rest, cond.clone()))?;
        rest = narrow(&rest, cond.clone().not());
        pairs.push((cond, v));
        i += 2;
    }
    let mut t = otherwise
        .as_ref()
        .map(|o| o.dtype.clone())
        .unwrap_or(DataType::Null);
    for (_, v) in &pairs {
        t = common_type(&t, &v.dtype).ok_or_else(|| {
            bad_call(
                f,
                format!(
                    "branches of different types: {} and {}",
                    describe(&t),
                    describe(&v.dtype)
                ),
            )
        })?;
    }
    let mut e = match otherwise {
        Some(o) => o.cast_to(&t),
        None => lit(NULL).cast(t.clone()),
    };
    for (c, v) in pairs.into_iter().rev() {
        e = when(c).then(v.cast_to(&t)).otherwise(e);
    }
    Ok(Compiled::new(e, t))
}

fn in_list(f: &str, args: &[IrExpr], scope: &Scope, guard: &Guard) -> Result<Compiled> {
    arity(f, args, 2, Some(2))?;
    let value = compile_guarded(&args[0], scope, guard)?;
    let stringy = |t: &DataType| is_string(t) || is_null(t);
    match &args[1] {
        IrExpr::Call {
            function,
            args: items,
        } if matches!(function.as_str(), "dtcs:list" | "dtcs:tuple") => {
            // SQL's IN: true if an item is equal, else null if the value or an item is
            // null, else false; which is the disjunction of the equalities.
            let mut any: Option<Expr> = None;
            for item in items {
                let (a, b, _) = comparable_pair(&args[0], item, scope, guard, &|x, y| {
                    format!("in: cannot compare {} with {}", describe(x), describe(y))
                })?;
                let eq = a.eq(b);
                any = Some(match any {
                    None => eq,
                    Some(acc) => acc.or(eq),
                });
            }
            Ok(Compiled::new(
                any.unwrap_or_else(|| lit(false)),
                DataType::Boolean,
            ))
        }
        IrExpr::Literal(Literal::String(_)) if stringy(&value.dtype) => {
            // `x in 'text'` is substring containment.
            let hay = compile_guarded(&args[1], scope, guard)?;
            Ok(Compiled::new(
                string_predicate("dtcs:in", vec![hay.expr, value.expr], |a, b| a.contains(b)),
                DataType::Boolean,
            ))
        }
        IrExpr::Literal(_) => {
            let (a, b, _) = comparable_pair(&args[0], &args[1], scope, guard, &|x, y| {
                format!("in: cannot compare {} with {}", describe(x), describe(y))
            })?;
            Ok(Compiled::new(a.eq(b), DataType::Boolean))
        }
        other => {
            let list = compile_guarded(other, scope, guard)?;
            if is_string(&list.dtype) && stringy(&value.dtype) {
                Ok(Compiled::new(
                    string_predicate("dtcs:in", vec![list.expr, value.expr], |a, b| a.contains(b)),
                    DataType::Boolean,
                ))
            } else if matches!(list.dtype, DataType::List(_)) {
                Err(error::unsupported("`in` over a list column"))
            } else {
                Err(bad_call(
                    f,
                    format!(
                        "the right side must be a list, got {}",
                        describe(&list.dtype)
                    ),
                ))
            }
        }
    }
}
