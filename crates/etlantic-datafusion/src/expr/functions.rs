//! DTCS scalar functions (`dtcs:stdlib.functions`) on DataFusion.
//!
//! Where DataFusion's function of the same name has other semantics, the DTCS one is
//! built from parts: `concat` propagates nulls (DataFusion skips them), `substr` counts
//! from 0, `least`/`greatest` are null when any argument is, `trim` strips Unicode white
//! space, `round` rounds ties to even (as ETLantic-py),
//! `round`/`floor`/`ceil`/`power`/`sqrt` return decimals, and so on.

use super::types::{
    cast_target, describe, is_boolean, is_date, is_integer, is_list, is_null, is_numeric,
    is_string, is_temporal, millis_in_unit,
};
use super::{compile, literal, null_if_any_null, Scope};
use crate::error;
use arrow::datatypes::{DataType, IntervalMonthDayNano, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::config::ConfigOptions;
use datafusion::functions;
use datafusion::functions_nested::expr_fn::array_has;
use datafusion::logical_expr::{cast, lit, try_cast, when, Expr as DfExpr};
use etlantic_core::diagnostics::codes;
use etlantic_core::ir::{Expr, Literal};
use etlantic_core::Result;

/// The scalar functions this compiler implements (registry ids).
pub(crate) const SCALAR_FUNCTIONS: &[&str] = &[
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
    "dtcs:cast",
    "dtcs:try_cast",
    "dtcs:to_string",
    "dtcs:to_integer",
    "dtcs:to_decimal",
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
    "dtcs:date_trunc",
    "dtcs:date_add",
    "dtcs:extract",
    "dtcs:date_part",
    "dtcs:current_date",
    "dtcs:current_timestamp",
    "dtcs:split",
    "dtcs:regex_extract",
    "dtcs:regex_replace",
    "dtcs:array",
    "dtcs:size",
    "dtcs:index",
    "dtcs:element_at",
    "dtcs:object",
    "dtcs:field",
];

/// Aggregate functions: valid only in `dtcs:aggregate` / `etlantic:window_aggregate`.
const AGGREGATES: &[&str] = &[
    "dtcs:count_all",
    "dtcs:count",
    "dtcs:count_distinct",
    "dtcs:sum",
    "dtcs:average",
    "dtcs:first",
    "dtcs:last",
];

/// Unicode `White_Space` characters, which DTCS `trim` removes (Rust's `str::trim`).
const WHITE_SPACE: &str = "\u{9}\u{a}\u{b}\u{c}\u{d}\u{20}\u{85}\u{a0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

fn bad_call(function: &str, msg: impl std::fmt::Display) -> etlantic_core::Error {
    error::type_mismatch(format!("{}: {msg}", short(function)))
}

fn short(function: &str) -> &str {
    function.strip_prefix("dtcs:").unwrap_or(function)
}

fn arity(function: &str, args: &[Expr], min: usize, max: Option<usize>) -> Result<()> {
    let n = args.len();
    let ok = n >= min && max.is_none_or(|m| n <= m);
    if ok {
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

/// A compiled argument with its type.
struct Arg {
    e: DfExpr,
    t: DataType,
}

fn typed(args: &[Expr], scope: &Scope) -> Result<Vec<Arg>> {
    args.iter()
        .map(|a| {
            let e = compile(a, scope)?;
            let t = scope.type_of(&e)?;
            Ok(Arg { e, t })
        })
        .collect()
}

fn expect(function: &str, a: &Arg, ok: fn(&DataType) -> bool, what: &str) -> Result<()> {
    if ok(&a.t) || is_null(&a.t) {
        Ok(())
    } else {
        Err(bad_call(
            function,
            format!("expects {what}, got {} (`{}`)", describe(&a.t), a.e),
        ))
    }
}

fn strings(function: &str, args: &[Arg]) -> Result<()> {
    args.iter()
        .try_for_each(|a| expect(function, a, is_string, "a string"))
}

fn numbers(function: &str, args: &[Arg]) -> Result<()> {
    args.iter()
        .try_for_each(|a| expect(function, a, is_numeric, "a number"))
}

fn exprs(args: Vec<Arg>) -> Vec<DfExpr> {
    args.into_iter().map(|a| a.e).collect()
}

fn f64_arg(a: Arg) -> DfExpr {
    if a.t == DataType::Float64 {
        a.e
    } else {
        cast(a.e, DataType::Float64)
    }
}

/// A string literal argument (type names, units, policies).
fn literal_str<'a>(function: &str, arg: &'a Expr, what: &str) -> Result<&'a str> {
    match arg {
        Expr::Literal(Literal::String(s)) => Ok(s.as_str()),
        other => Err(bad_call(
            function,
            format!("the {what} must be a string literal, got `{other}`"),
        )),
    }
}

/// An expression that fails at run time, quoting `value`, when it is evaluated (used in
/// `CASE` branches for DTCS's row-level errors).
fn runtime_error(message: &str, value: DfExpr, ty: DataType) -> DfExpr {
    super::checked::raise_error(message, value, ty)
}

/// The value of an integer literal (including a negated one).
fn const_int(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(Literal::Integer(i)) => Some(*i),
        Expr::Unary(etlantic_core::ir::UnaryOp::Negate, inner) => {
            const_int(inner).and_then(i64::checked_neg)
        }
        _ => None,
    }
}

fn case(cond: DfExpr, then: DfExpr, otherwise: DfExpr) -> Result<DfExpr> {
    when(cond, then)
        .otherwise(otherwise)
        .map_err(|e| error::datafusion(e, "case"))
}

/// `a contains b`: substring for strings, membership for lists; `None` on other types.
pub(crate) fn contains(a: DfExpr, at: &DataType, b: DfExpr, bt: &DataType) -> Option<DfExpr> {
    if (is_string(at) || is_null(at)) && (is_string(bt) || is_null(bt)) {
        Some(functions::string::contains().call(vec![a, b]))
    } else if is_list(at) {
        Some(array_has(a, b))
    } else {
        None
    }
}

/// Compiles a function call.
pub(crate) fn call(function: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    let f = function;
    match f {
        "dtcs:lower" | "dtcs:upper" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            let udf = if f == "dtcs:lower" {
                functions::string::lower()
            } else {
                functions::string::upper()
            };
            Ok(udf.call(exprs(a)))
        }
        "dtcs:concat" => {
            arity(f, args, 2, None)?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            let es = exprs(a);
            let value = functions::string::concat().call(es.clone());
            null_if_any_null(&es, value, &DataType::Utf8)
        }
        "dtcs:concat_ws" => {
            arity(f, args, 2, None)?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            Ok(functions::string::concat_ws().call(exprs(a)))
        }
        "dtcs:substr" => substr(f, args, scope),
        "dtcs:replace" => {
            arity(f, args, 3, Some(3))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            Ok(functions::string::replace().call(exprs(a)))
        }
        "dtcs:length" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            Ok(cast(
                functions::unicode::character_length().call(exprs(a)),
                DataType::Int64,
            ))
        }
        "dtcs:contains" => {
            arity(f, args, 2, Some(2))?;
            let mut a = typed(args, scope)?;
            let b = a.pop().expect("two args");
            let x = a.pop().expect("two args");
            let (xt, bt) = (x.t.clone(), b.t.clone());
            contains(x.e, &xt, b.e, &bt).ok_or_else(|| {
                bad_call(
                    f,
                    format!("expects strings or a list, got {}", describe(&xt)),
                )
            })
        }
        "dtcs:starts_with" | "dtcs:ends_with" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            let udf = if f == "dtcs:starts_with" {
                functions::string::starts_with()
            } else {
                functions::string::ends_with()
            };
            Ok(udf.call(exprs(a)))
        }
        "dtcs:trim" | "dtcs:ltrim" | "dtcs:rtrim" => {
            arity(f, args, 1, Some(2))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            let mut es = exprs(a);
            if es.len() == 1 {
                es.push(lit(WHITE_SPACE));
            }
            let udf = match f {
                "dtcs:trim" => functions::string::btrim(),
                "dtcs:ltrim" => functions::string::ltrim(),
                _ => functions::string::rtrim(),
            };
            Ok(udf.call(es))
        }
        "dtcs:coalesce" => {
            arity(f, args, 1, None)?;
            let a = typed(args, scope)?;
            unify(f, &a)?;
            Ok(functions::core::coalesce().call(exprs(a)))
        }
        "dtcs:if_null" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope)?;
            unify(f, &a)?;
            Ok(functions::core::coalesce().call(exprs(a)))
        }
        "dtcs:null_if" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope)?;
            if !super::types::comparable(&a[0].t, &a[1].t) {
                return Err(bad_call(
                    f,
                    format!(
                        "cannot compare {} with {}",
                        describe(&a[0].t),
                        describe(&a[1].t)
                    ),
                ));
            }
            Ok(functions::core::nullif().call(exprs(a)))
        }
        "dtcs:case_when" => case_when(f, args, scope),
        "dtcs:is_null" => {
            arity(f, args, 1, Some(1))?;
            Ok(compile(&args[0], scope)?.is_null())
        }
        "dtcs:is_missing" => {
            arity(f, args, 1, Some(1))?;
            // Relations have a fixed schema: a column is missing from every row or from none.
            Ok(lit(match &args[0] {
                Expr::Column(c) => !scope.has(c),
                other => {
                    compile(other, scope)?;
                    false
                }
            }))
        }
        "dtcs:is_invalid" => {
            arity(f, args, 1, Some(1))?;
            // Arrow values are never DTCS `invalid`.
            compile(&args[0], scope)?;
            Ok(lit(false))
        }
        "dtcs:cast" | "dtcs:try_cast" => cast_call(f, args, scope),
        "dtcs:to_string" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            if is_list(&a[0].t) {
                return Err(bad_call(f, "is not defined for lists"));
            }
            Ok(cast(exprs(a).remove(0), DataType::Utf8))
        }
        "dtcs:to_integer" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?.remove(0);
            to_integer(f, a)
        }
        "dtcs:to_decimal" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?.remove(0);
            if !(is_numeric(&a.t) || is_string(&a.t) || is_null(&a.t)) {
                return Err(bad_call(f, format!("cannot convert {}", describe(&a.t))));
            }
            Ok(cast(a.e, DataType::Float64))
        }
        "dtcs:abs" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            numbers(f, &a)?;
            Ok(functions::math::abs().call(exprs(a)))
        }
        "dtcs:round" => {
            arity(f, args, 1, Some(2))?;
            let mut a = typed(args, scope)?;
            numbers(f, &a)?;
            let digits = if a.len() == 2 {
                let d = a.pop().expect("two args");
                if !(is_integer(&d.t) || is_null(&d.t)) {
                    return Err(bad_call(f, "the number of digits must be an integer"));
                }
                cast(d.e, DataType::Int64)
            } else {
                lit(0i64)
            };
            let x = f64_arg(a.remove(0));
            Ok(super::rounding::round_half_even_expr(x, digits))
        }
        "dtcs:floor" | "dtcs:ceil" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            numbers(f, &a)?;
            let x = f64_arg(a.into_iter().next().expect("one arg"));
            let udf = if f == "dtcs:floor" {
                functions::math::floor()
            } else {
                functions::math::ceil()
            };
            Ok(udf.call(vec![x]))
        }
        "dtcs:power" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope)?;
            numbers(f, &a)?;
            let es: Vec<DfExpr> = a.into_iter().map(f64_arg).collect();
            Ok(functions::math::power().call(es))
        }
        "dtcs:sqrt" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?;
            numbers(f, &a)?;
            let x = f64_arg(a.into_iter().next().expect("one arg"));
            case(
                x.clone().lt(lit(0f64)),
                runtime_error(
                    "dtcs:sqrt is not defined for negative numbers",
                    x.clone(),
                    DataType::Float64,
                ),
                functions::math::sqrt().call(vec![x]),
            )
        }
        "dtcs:least" | "dtcs:greatest" | "dtcs:min" | "dtcs:max" if args.len() >= 2 => {
            let a = typed(args, scope)?;
            numbers(f, &a)?;
            // Integers stay integers (as in ETLantic-py); any other number makes a float.
            let integers = a.iter().all(|x| is_integer(&x.t) || is_null(&x.t));
            let ty = if integers {
                DataType::Int64
            } else {
                DataType::Float64
            };
            let es: Vec<DfExpr> = a
                .into_iter()
                .map(|x| if integers { cast(x.e, DataType::Int64) } else { f64_arg(x) })
                .collect();
            let udf = if matches!(f, "dtcs:least" | "dtcs:min") {
                functions::core::least()
            } else {
                functions::core::greatest()
            };
            let value = udf.call(es.clone());
            null_if_any_null(&es, value, &ty)
        }
        "dtcs:in" => in_list(f, args, scope),
        "dtcs:split" => {
            arity(f, args, 2, Some(2))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            Ok(datafusion::functions_nested::string::string_to_array_udf().call(exprs(a)))
        }
        "dtcs:regex_replace" => {
            arity(f, args, 3, Some(3))?;
            let a = typed(args, scope)?;
            strings(f, &a)?;
            let mut es = exprs(a);
            // Every match, as the `regex` crate's `replace_all` (the reference runtime).
            es.push(lit("g"));
            Ok(functions::regex::regexp_replace().call(es))
        }
        "dtcs:regex_extract" => regex_extract(f, args, scope),
        "dtcs:array" => {
            arity(f, args, 1, None)?;
            let a = typed(args, scope)?;
            Ok(datafusion::functions_nested::make_array::make_array_udf().call(exprs(a)))
        }
        "dtcs:size" => {
            arity(f, args, 1, Some(1))?;
            let a = typed(args, scope)?.remove(0);
            if is_string(&a.t) {
                return Ok(cast(
                    functions::unicode::character_length().call(vec![a.e]),
                    DataType::Int64,
                ));
            }
            if !(is_list(&a.t) || matches!(a.t, DataType::Map(..)) || is_null(&a.t)) {
                return Err(bad_call(f, format!("expects a list, a map or a string, got {}", describe(&a.t))));
            }
            // The number of elements (0 for an empty list), null for a null list.
            let n = cast(
                datafusion::functions_nested::cardinality::cardinality_udf().call(vec![a.e.clone()]),
                DataType::Int64,
            );
            case(
                a.e.is_null(),
                lit(ScalarValue::Int64(None)),
                functions::core::coalesce().call(vec![n, lit(0i64)]),
            )
        }
        "dtcs:index" | "dtcs:element_at" => list_element(f, args, scope),
        "dtcs:object" => {
            if !args.len().is_multiple_of(2) || args.is_empty() {
                return Err(bad_call(f, "takes name/value pairs"));
            }
            let mut parts = Vec::with_capacity(args.len());
            let mut names = std::collections::HashSet::new();
            for pair in args.chunks(2) {
                let name = literal_str(f, &pair[0], "field name")?;
                if !names.insert(name.to_string()) {
                    return Err(bad_call(f, format!("names `{name}` twice")));
                }
                parts.push(lit(name));
                parts.push(compile(&pair[1], scope)?);
            }
            Ok(functions::core::named_struct().call(parts))
        }
        "dtcs:field" => {
            arity(f, args, 2, Some(2))?;
            let object = typed(&args[..1], scope)?.remove(0);
            let name = literal_str(f, &args[1], "field name")?;
            match &object.t {
                DataType::Struct(fields) if fields.iter().any(|x| x.name() == name) => {
                    Ok(functions::core::get_field().call(vec![object.e, lit(name)]))
                }
                DataType::Struct(fields) => Err(bad_call(
                    f,
                    format!(
                        "the object has no field `{name}` (fields: {})",
                        fields.iter().map(|x| x.name().as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )),
                other if is_null(other) => Ok(lit(ScalarValue::Null)),
                other => Err(bad_call(f, format!("expects an object, got {}", describe(other)))),
            }
        }
        "dtcs:between" => {
            arity(f, args, 3, Some(3))?;
            let a = typed(args, scope)?;
            for b in &a[1..] {
                if !super::types::comparable(&a[0].t, &b.t) {
                    return Err(bad_call(
                        f,
                        format!("cannot compare {} with {}", describe(&a[0].t), describe(&b.t)),
                    ));
                }
            }
            let es = exprs(a);
            let value = es[0]
                .clone()
                .gt_eq(es[1].clone())
                .and(es[0].clone().lt_eq(es[2].clone()));
            null_if_any_null(&es, value, &DataType::Boolean)
        }
        "dtcs:date_trunc" => date_trunc(f, args, scope),
        "dtcs:date_add" => date_add(f, args, scope),
        "dtcs:extract" | "dtcs:date_part" => extract(f, args, scope),
        "dtcs:current_date" => {
            arity(f, args, 0, Some(0))?;
            Ok(functions::datetime::current_date().call(vec![]))
        }
        "dtcs:current_timestamp" => {
            arity(f, args, 0, Some(0))?;
            Ok(cast(
                functions::datetime::now(&ConfigOptions::default()).call(vec![]),
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ))
        }
        _ if AGGREGATES.contains(&f) || matches!(f, "dtcs:min" | "dtcs:max") => Err(bad_call(
            f,
            "is an aggregate function; use it in `dtcs:aggregate` (or pass at least two arguments to min/max)",
        )),
        _ => Err(unknown(f)),
    }
}

/// `ETL501` for a registered function this backend lacks, `ETL306` for an unknown one.
fn unknown(f: &str) -> etlantic_core::Error {
    if dtcs::registry::resolve_default(f).is_some() {
        error::unsupported(format!(
            "function `{f}` is not supported by the DataFusion backend"
        ))
    } else {
        error::err(
            &codes::UNKNOWN_FUNCTION,
            format!("unknown function `{f}`: it is not in the DTCS function registry"),
        )
    }
}

/// Checks that all arguments share a type DataFusion can unify.
fn unify(f: &str, args: &[Arg]) -> Result<()> {
    let mut t = DataType::Null;
    for a in args {
        t = super::types::common_type(&t, &a.t).ok_or_else(|| {
            bad_call(
                f,
                format!(
                    "arguments of different types: {} and {}",
                    describe(&t),
                    describe(&a.t)
                ),
            )
        })?;
    }
    Ok(())
}

fn substr(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(3))?;
    if const_int(&args[1]).is_some_and(|s| s < 0) {
        return Err(bad_call(f, "the start (0-based) must not be negative"));
    }
    if args.get(2).and_then(const_int).is_some_and(|n| n < 0) {
        return Err(bad_call(f, "the length must not be negative"));
    }
    let mut a = typed(args, scope)?;
    expect(f, &a[0], is_string, "a string")?;
    for x in &a[1..] {
        expect(f, x, is_integer, "an integer")?;
    }
    let s = a.remove(0);
    let start = a.remove(0);
    let start0 = cast(start.e, DataType::Int64);
    // DTCS counts from 0, SQL from 1; a negative start is an error.
    let mut call_args = vec![s.e, start0.clone() + lit(1i64)];
    if let Some(len) = a.pop() {
        call_args.push(cast(len.e, DataType::Int64));
    }
    let value = functions::unicode::substr().call(call_args);
    case(
        start0.clone().lt(lit(0i64)),
        runtime_error(
            "dtcs:substr start (0-based) must not be negative",
            start0,
            DataType::Utf8,
        ),
        value,
    )
}

fn case_when(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, None)?;
    let a = typed(args, scope)?;
    let mut pairs = Vec::new();
    let mut it = a.into_iter();
    let mut otherwise = None;
    loop {
        match (it.next(), it.next()) {
            (Some(c), Some(v)) => {
                if !is_boolean(&c.t) {
                    return Err(bad_call(
                        f,
                        format!(
                            "conditions must be boolean, got {} (`{}`)",
                            describe(&c.t),
                            c.e
                        ),
                    ));
                }
                let cond = if is_null(&c.t) {
                    cast(c.e, DataType::Boolean)
                } else {
                    c.e
                };
                pairs.push((cond, v));
            }
            (Some(e), None) => {
                otherwise = Some(e);
                break;
            }
            _ => break,
        }
    }
    let mut t = otherwise
        .as_ref()
        .map(|o| o.t.clone())
        .unwrap_or(DataType::Null);
    for (_, v) in &pairs {
        t = super::types::common_type(&t, &v.t).ok_or_else(|| {
            bad_call(
                f,
                format!(
                    "branches of different types: {} and {}",
                    describe(&t),
                    describe(&v.t)
                ),
            )
        })?;
    }
    let unify = |e: DfExpr, et: &DataType| {
        if *et == t {
            e
        } else {
            cast(e, t.clone())
        }
    };
    let mut pairs = pairs.into_iter();
    let (c0, v0) = pairs.next().expect("at least one pair");
    let mut builder = when(c0, unify(v0.e, &v0.t));
    for (c, v) in pairs {
        builder = builder.when(c, unify(v.e, &v.t));
    }
    let result = match otherwise {
        Some(o) => builder.otherwise(unify(o.e, &o.t)),
        None => builder.end(),
    };
    result.map_err(|e| error::datafusion(e, "case_when"))
}

fn cast_call(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    if f == "dtcs:cast" {
        arity(f, args, 2, Some(2))?;
    } else {
        arity(f, args, 2, Some(3))?;
    }
    let name = literal_str(f, &args[1], "target type")?;
    let target = cast_target(name).ok_or_else(|| {
        bad_call(
            f,
            format!("unsupported target type `{name}` (string, integer, decimal, boolean, date, datetime)"),
        )
    })?;
    let strict = match args.get(2) {
        None => f == "dtcs:cast",
        Some(p) => match literal_str(f, p, "policy")? {
            "fail" => true,
            "null" | "invalid" => false,
            other => {
                return Err(bad_call(
                    f,
                    format!("unknown policy `{other}` (fail, null, invalid)"),
                ))
            }
        },
    };
    let x = compile(&args[0], scope)?;
    let t = scope.type_of(&x)?;
    if is_list(&t) {
        return Err(bad_call(f, "lists cannot be cast"));
    }
    Ok(if strict {
        cast(x, target)
    } else {
        try_cast(x, target)
    })
}

fn to_integer(f: &str, a: Arg) -> Result<DfExpr> {
    if is_integer(&a.t) || is_null(&a.t) || is_string(&a.t) {
        return Ok(cast(a.e, DataType::Int64));
    }
    if !is_numeric(&a.t) {
        return Err(bad_call(f, format!("cannot convert {}", describe(&a.t))));
    }
    // DTCS: a decimal converts only when it has no fractional part.
    let x = f64_arg(a);
    case(
        x.clone()
            .not_eq(functions::math::trunc().call(vec![x.clone()])),
        runtime_error(
            "dtcs:to_integer requires an integer-valued decimal",
            x.clone(),
            DataType::Int64,
        ),
        cast(x, DataType::Int64),
    )
}

/// `regex_extract(text, pattern[, group])`: the group (0: the whole match) of the first
/// match, null when nothing matches or the group did not take part. DataFusion's
/// `regexp_match` returns the capture groups only, so the pattern is wrapped in one more
/// group, which holds the whole match.
fn regex_extract(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(3))?;
    let mut a = typed(args, scope)?;
    strings(f, &a[..2])?;
    let group = if a.len() == 3 {
        let g = a.pop().expect("three args");
        expect(f, &g, is_integer, "an integer group")?;
        if const_int(&args[2]).is_some_and(|g| g < 0) {
            return Err(bad_call(f, "the group must not be negative"));
        }
        cast(g.e, DataType::Int64)
    } else {
        lit(0i64)
    };
    let mut es = exprs(a);
    let pattern = es.pop().expect("a pattern");
    let text = es.pop().expect("a text");
    let whole = functions::string::concat().call(vec![lit("("), pattern, lit(")")]);
    let groups = functions::regex::regexp_match().call(vec![text, whole]);
    Ok(datafusion::functions_nested::extract::array_element_udf()
        .call(vec![groups, group + lit(1i64)]))
}

/// `index(list, i)` and `element_at(list, i)`: the element at `i` counted from 0
/// (negative: from the end, -1 the last). Out of bounds, `element_at` is null and `index`
/// an error, as in the reference runtime.
fn list_element(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(2))?;
    let a = typed(args, scope)?;
    let (list, i) = (&a[0], &a[1]);
    let item = match &list.t {
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            item.data_type().clone()
        }
        t if is_null(t) => return Ok(lit(ScalarValue::Null)),
        t => return Err(bad_call(f, format!("expects a list, got {}", describe(t)))),
    };
    expect(f, i, is_integer, "an integer index")?;
    let i = cast(i.e.clone(), DataType::Int64);
    // DataFusion counts from 1, and from the end with negative positions.
    let position = case(i.clone().gt_eq(lit(0i64)), i.clone() + lit(1i64), i.clone())?;
    let element = datafusion::functions_nested::extract::array_element_udf()
        .call(vec![list.e.clone(), position]);
    if f == "dtcs:element_at" {
        return Ok(element);
    }
    let len = cast(
        datafusion::functions_nested::cardinality::cardinality_udf().call(vec![list.e.clone()]),
        DataType::Int64,
    );
    let len = functions::core::coalesce().call(vec![len, lit(0i64)]);
    let out_of_bounds = i
        .clone()
        .gt_eq(len.clone())
        .or(i.clone().lt(lit(0i64) - len));
    case(
        list.e.clone().is_not_null().and(out_of_bounds),
        runtime_error("dtcs:index: the list index is out of bounds", i, item),
        element,
    )
}

fn in_list(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(2))?;
    let value = compile(&args[0], scope)?;
    let vt = scope.type_of(&value)?;
    match &args[1] {
        Expr::Call {
            function,
            args: items,
        } if matches!(function.as_str(), "dtcs:list" | "dtcs:tuple") => {
            let items = typed(items, scope)?;
            for i in &items {
                if !super::types::comparable(&vt, &i.t) {
                    return Err(bad_call(
                        f,
                        format!("cannot compare {} with {}", describe(&vt), describe(&i.t)),
                    ));
                }
            }
            Ok(value.in_list(exprs(items), false))
        }
        Expr::Literal(l) => {
            // `x in 'text'` is substring containment in DTCS; a scalar is equality.
            let item = literal(l);
            match l {
                Literal::String(_) if is_string(&vt) || is_null(&vt) => {
                    Ok(functions::string::contains().call(vec![item, value]))
                }
                _ => Ok(value.in_list(vec![item], false)),
            }
        }
        other => {
            let list = compile(other, scope)?;
            let lt = scope.type_of(&list)?;
            if is_list(&lt) {
                Ok(array_has(list, value))
            } else if is_string(&lt) && (is_string(&vt) || is_null(&vt)) {
                Ok(functions::string::contains().call(vec![list, value]))
            } else {
                Err(bad_call(
                    f,
                    format!("the right side must be a list, got {}", describe(&lt)),
                ))
            }
        }
    }
}

/// Time units of `date_trunc` / `date_add` / `extract`.
fn unit_name(f: &str, u: &str) -> Result<&'static str> {
    Ok(match u.trim().to_ascii_lowercase().as_str() {
        "year" | "years" => "year",
        "quarter" | "quarters" => "quarter",
        "month" | "months" => "month",
        "week" | "weeks" => "week",
        "day" | "days" => "day",
        "hour" | "hours" => "hour",
        "minute" | "minutes" => "minute",
        "second" | "seconds" => "second",
        "dow" => "dow",
        "doy" => "doy",
        other => return Err(bad_call(f, format!("unknown time unit `{other}`"))),
    })
}

const UTC_MICROS: DataType = DataType::Timestamp(TimeUnit::Microsecond, None);

fn utc_micros() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn date_trunc(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(2))?;
    let unit = unit_name(f, literal_str(f, &args[1], "unit")?)?;
    if matches!(unit, "dow" | "doy") {
        return Err(bad_call(f, format!("cannot truncate to `{unit}`")));
    }
    let a = typed(&args[..1], scope)?.remove(0);
    expect(f, &a, is_temporal, "a date or datetime")?;
    let v = if is_date(&a.t) || is_null(&a.t) {
        cast(a.e, utc_micros())
    } else {
        a.e
    };
    Ok(functions::datetime::date_trunc().call(vec![lit(unit), v]))
}

fn date_add(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(3))?;
    let unit = match args.get(2) {
        Some(u) => unit_name(f, literal_str(f, u, "unit")?)?,
        None => "day",
    };
    if matches!(unit, "dow" | "doy" | "quarter") {
        return Err(bad_call(f, format!("cannot add `{unit}`s")));
    }
    let mut a = typed(&args[..2], scope)?;
    expect(f, &a[0], is_temporal, "a date or datetime")?;
    expect(f, &a[1], is_integer, "an integer amount")?;
    let n = a.pop().expect("two args");
    let v = a.pop().expect("two args");
    let sub_day = matches!(unit, "hour" | "minute" | "second");
    // Hours on a date make a datetime.
    let (v, vt) = if (is_date(&v.t) && sub_day) || is_null(&v.t) {
        (cast(v.e, utc_micros()), utc_micros())
    } else {
        (v.e, v.t)
    };
    if let Expr::Literal(Literal::Integer(k)) = &args[1] {
        let k = *k;
        let overflow = || bad_call(f, "amount out of range");
        let iv = match unit {
            "year" => IntervalMonthDayNano::new(
                i32::try_from(k.checked_mul(12).ok_or_else(overflow)?).map_err(|_| overflow())?,
                0,
                0,
            ),
            "month" => IntervalMonthDayNano::new(i32::try_from(k).map_err(|_| overflow())?, 0, 0),
            "week" => IntervalMonthDayNano::new(
                0,
                i32::try_from(k.checked_mul(7).ok_or_else(overflow)?).map_err(|_| overflow())?,
                0,
            ),
            "day" => IntervalMonthDayNano::new(0, i32::try_from(k).map_err(|_| overflow())?, 0),
            _ => {
                let per: i64 = match unit {
                    "hour" => 3_600_000_000_000,
                    "minute" => 60_000_000_000,
                    _ => 1_000_000_000,
                };
                IntervalMonthDayNano::new(0, 0, k.checked_mul(per).ok_or_else(overflow)?)
            }
        };
        return Ok(v + lit(ScalarValue::IntervalMonthDayNano(Some(iv))));
    }
    // A computed amount: whole days on dates, ticks on datetimes.
    let n = cast(n.e, DataType::Int64);
    match (&vt, unit) {
        (DataType::Date32, "day" | "week") => {
            let days = if unit == "week" { n * lit(7i64) } else { n };
            Ok(cast(
                cast(
                    cast(cast(v, DataType::Int32), DataType::Int64) + days,
                    DataType::Int32,
                ),
                DataType::Date32,
            ))
        }
        (DataType::Timestamp(tu, tz), _) if !matches!(unit, "month" | "year") => {
            let ms: i64 = match unit {
                "week" => 7 * 86_400_000,
                "day" => 86_400_000,
                "hour" => 3_600_000,
                "minute" => 60_000,
                _ => 1000,
            };
            let ticks =
                millis_in_unit(ms, *tu).ok_or_else(|| bad_call(f, "unit finer than the column"))?;
            Ok(cast(
                cast(v, DataType::Int64) + n * lit(ticks),
                DataType::Timestamp(*tu, tz.clone()),
            ))
        }
        _ => Err(bad_call(
            f,
            format!("a computed amount of `{unit}`s is not supported; use a literal amount"),
        )),
    }
}

fn extract(f: &str, args: &[Expr], scope: &Scope) -> Result<DfExpr> {
    arity(f, args, 2, Some(2))?;
    // DTCS accepts extract(unit, value) and extract(value, unit).
    let is_unit =
        |e: &Expr| matches!(e, Expr::Literal(Literal::String(s)) if unit_name(f, s).is_ok());
    let (unit, value) = if is_unit(&args[0]) {
        (&args[0], &args[1])
    } else {
        (&args[1], &args[0])
    };
    let unit = unit_name(f, literal_str(f, unit, "unit")?)?;
    let a = typed(std::slice::from_ref(value), scope)?.remove(0);
    expect(f, &a, is_temporal, "a date or datetime")?;
    let v = if is_null(&a.t) {
        cast(a.e, UTC_MICROS)
    } else {
        a.e
    };
    Ok(cast(
        functions::datetime::date_part().call(vec![lit(unit), v]),
        DataType::Int64,
    ))
}
