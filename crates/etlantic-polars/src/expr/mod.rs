//! The expression compiler: DTCS [`IrExpr`] → Polars [`Expr`], with the type of the
//! result.
//!
//! Semantics are DTCS's (SQL's three-valued logic): comparisons with null are null,
//! `&&`/`||` follow Kleene logic, `!null` is null, a filter keeps the rows whose
//! predicate is true. Numbers compute in the class of type the reference engine uses:
//! integers as `Int64` (overflow and division by zero are errors, `/` truncates), exact
//! decimals as 128-bit decimals, anything with a float as `Float64`; `+` on two strings
//! concatenates. A string literal compared with a date or datetime is read as one (with
//! Arrow's parser, as the reference engine does).
//!
//! Polars evaluates every operand of an expression on every row. DTCS (and the reference
//! engine) evaluate the branches of `case_when`, the later arguments of `coalesce` and
//! the right side of `&&`/`||` only where their value is used, so a failing function
//! (integer overflow, `sqrt(-1)`, ...) is compiled with a [`Guard`]: the rows whose value
//! is used. It fails only there.

mod functions;
pub(crate) mod kernels;

use crate::error;
use crate::types::{
    comparison_type, describe, is_boolean, is_decimal, is_float, is_null, is_numeric, is_string,
    is_temporal, scale, MAX_PRECISION,
};
use etlantic_core::diagnostics::codes;
use etlantic_core::ir::{BinaryOp, Expr as IrExpr, Literal, UnaryOp};
use etlantic_core::Result;
use indexmap::IndexMap;
use kernels::Arith;
use polars::prelude::*;

pub(crate) use functions::FUNCTIONS;

/// A compiled expression and the Polars type of its values.
#[derive(Clone, Debug)]
pub(crate) struct Compiled {
    /// The Polars expression.
    pub(crate) expr: Expr,
    /// The type of its values.
    pub(crate) dtype: DataType,
}

impl Compiled {
    pub(crate) fn new(expr: Expr, dtype: DataType) -> Self {
        Compiled { expr, dtype }
    }

    /// The value cast to `to` (unchanged when it already has that type).
    pub(crate) fn cast_to(self, to: &DataType) -> Expr {
        if &self.dtype == to {
            self.expr
        } else {
            self.expr.strict_cast(to.clone())
        }
    }

    /// As a condition: the untyped null becomes a null boolean.
    pub(crate) fn into_condition(self) -> Expr {
        self.cast_to(&DataType::Boolean)
    }
}

/// The rows on which a value is used (`None`: every row). A non-null boolean.
pub(crate) type Guard = Option<Expr>;

/// `guard && cond` (a null `cond` counts as false).
pub(crate) fn narrow(guard: &Guard, cond: Expr) -> Guard {
    let cond = cond.fill_null(lit(false));
    Some(match guard {
        None => cond,
        Some(g) => g.clone().and(cond),
    })
}

/// The inputs of a failing kernel: its arguments, then the guard when there is one.
fn guarded(mut inputs: Vec<Expr>, guard: &Guard) -> (Vec<Expr>, bool) {
    match guard {
        Some(g) => {
            inputs.push(g.clone());
            (inputs, true)
        }
        None => (inputs, false),
    }
}

/// The columns an expression can see.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scope {
    columns: IndexMap<String, Compiled>,
}

impl Scope {
    /// A scope of named values.
    pub(crate) fn new(columns: IndexMap<String, Compiled>) -> Self {
        Scope { columns }
    }

    /// The value a column name stands for (`ETL206` if there is none).
    pub(crate) fn column(&self, name: &str) -> Result<Compiled> {
        self.columns
            .get(name)
            .cloned()
            .ok_or_else(|| error::unknown_column(name, &self.names()))
    }

    /// Whether the scope has the column.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.columns.contains_key(name)
    }

    /// Column names, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.columns.keys().cloned().collect()
    }
}

/// Compiles an expression whose value is used on every row.
pub(crate) fn compile(e: &IrExpr, scope: &Scope) -> Result<Compiled> {
    compile_guarded(e, scope, &None)
}

/// Compiles an expression whose value is used on the rows of `guard`.
pub(crate) fn compile_guarded(e: &IrExpr, scope: &Scope, guard: &Guard) -> Result<Compiled> {
    match e {
        IrExpr::Column(c) => scope.column(c),
        IrExpr::Parameter(p) => Err(error::err(
            &codes::UNKNOWN_PARAMETER,
            format!("missing value for transformation parameter `{p}`"),
        )),
        IrExpr::Literal(l) => Ok(literal(l)),
        IrExpr::Unary(op, inner) => {
            let x = compile_guarded(inner, scope, guard)?;
            match op {
                UnaryOp::Not => {
                    if !is_boolean(&x.dtype) {
                        return Err(error::type_mismatch(format!(
                            "`!` needs a boolean, got {} in `{e}`",
                            describe(&x.dtype)
                        )));
                    }
                    Ok(Compiled::new(x.into_condition().not(), DataType::Boolean))
                }
                UnaryOp::Negate => {
                    if is_null(&x.dtype) {
                        return Ok(x);
                    }
                    if !is_numeric(&x.dtype) {
                        return Err(error::type_mismatch(format!(
                            "`-` needs a number, got {} in `{e}`",
                            describe(&x.dtype)
                        )));
                    }
                    let dt = x.dtype.clone();
                    Ok(Compiled::new(kernels::negate(x.expr, dt.clone()), dt))
                }
            }
        }
        IrExpr::Binary(op, l, r) => binary(*op, l, r, e, scope, guard),
        IrExpr::Call { function, args } => functions::call(function, args, scope, guard),
    }
}

/// Compiles a predicate: the result must be boolean (or the null literal, which keeps no
/// row).
pub(crate) fn compile_predicate(e: &IrExpr, scope: &Scope) -> Result<Expr> {
    let x = compile(e, scope)?;
    if !is_boolean(&x.dtype) {
        return Err(error::type_mismatch(format!(
            "a predicate must be boolean, `{e}` is {}",
            describe(&x.dtype)
        )));
    }
    Ok(x.into_condition())
}

/// A typed `Int64` literal (Polars' `lit` of an integer adapts to the other operand).
pub(crate) fn int_lit(v: i64) -> Expr {
    lit(Scalar::new(DataType::Int64, AnyValue::Int64(v)))
}

fn float_lit(v: f64) -> Expr {
    lit(Scalar::new(DataType::Float64, AnyValue::Float64(v)))
}

/// A DTCS literal.
pub(crate) fn literal(l: &Literal) -> Compiled {
    match l {
        Literal::Null => Compiled::new(lit(NULL), DataType::Null),
        Literal::Boolean(b) => Compiled::new(lit(*b), DataType::Boolean),
        Literal::Integer(i) => Compiled::new(int_lit(*i), DataType::Int64),
        Literal::Decimal(d) => Compiled::new(float_lit(*d), DataType::Float64),
        Literal::String(s) => Compiled::new(lit(s.clone()), DataType::String),
    }
}

/// A string literal read as a value of the temporal type `to` (Arrow's cast, as in the
/// reference engine).
pub(crate) fn temporal_literal(s: &str, to: &DataType) -> Result<Compiled> {
    use arrow::array::{Array, AsArray, StringArray};
    let bad = |why: String| {
        error::type_mismatch(format!("cannot read `{s}` as a {}: {why}", describe(to)))
    };
    let target = crate::types::arrow_type(to).ok_or_else(|| bad("no such type".into()))?;
    let text: arrow::array::ArrayRef = std::sync::Arc::new(StringArray::from(vec![s]));
    let v = arrow::compute::cast_with_options(
        &text,
        &target,
        &arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        },
    )
    .map_err(|e| bad(e.to_string()))?;
    if v.is_null(0) {
        return Err(bad("not a valid value".into()));
    }
    let physical = arrow::compute::cast(&v, &arrow::datatypes::DataType::Int64)
        .map_err(|e| bad(e.to_string()))?;
    let n = physical
        .as_primitive::<arrow::datatypes::Int64Type>()
        .value(0);
    let value = match to {
        DataType::Date => AnyValue::Date(i32::try_from(n).map_err(|e| bad(e.to_string()))?),
        DataType::Datetime(u, tz) => {
            AnyValue::DatetimeOwned(n, *u, tz.clone().map(std::sync::Arc::new))
        }
        _ => return Err(bad("no such type".into())),
    };
    let expr = lit(Scalar::new(to.clone(), value));
    Ok(Compiled::new(expr, to.clone()))
}

/// Compiles both sides of a comparison in their comparison type.
pub(crate) fn comparable_pair(
    l: &IrExpr,
    r: &IrExpr,
    scope: &Scope,
    guard: &Guard,
    what: &dyn Fn(&DataType, &DataType) -> String,
) -> Result<(Expr, Expr, DataType)> {
    let mut left = compile_guarded(l, scope, guard)?;
    let mut right = compile_guarded(r, scope, guard)?;
    // A string literal compared with a date/datetime is read as one.
    if let IrExpr::Literal(Literal::String(s)) = r {
        if is_temporal(&left.dtype) {
            right = temporal_literal(s, &left.dtype)?;
        }
    }
    if let IrExpr::Literal(Literal::String(s)) = l {
        if is_temporal(&right.dtype) {
            left = temporal_literal(s, &right.dtype)?;
        }
    }
    let t = comparison_type(&left.dtype, &right.dtype)
        .ok_or_else(|| error::type_mismatch(what(&left.dtype, &right.dtype)))?;
    Ok((left.cast_to(&t), right.cast_to(&t), t))
}

fn binary(
    op: BinaryOp,
    l: &IrExpr,
    r: &IrExpr,
    whole: &IrExpr,
    scope: &Scope,
    guard: &Guard,
) -> Result<Compiled> {
    let mismatch = |what: &str, lt: &DataType, rt: &DataType| {
        error::type_mismatch(format!(
            "{what}: {} {} {} in `{whole}`",
            describe(lt),
            op.symbol(),
            describe(rt)
        ))
    };
    match op {
        BinaryOp::Eq
        | BinaryOp::NotEq
        | BinaryOp::Lt
        | BinaryOp::LtEq
        | BinaryOp::Gt
        | BinaryOp::GtEq
        | BinaryOp::NullSafeEq => {
            let (a, b, _) = comparable_pair(l, r, scope, guard, &|lt, rt| {
                format!(
                    "cannot compare: {} {} {} in `{whole}`",
                    describe(lt),
                    op.symbol(),
                    describe(rt)
                )
            })?;
            let e = match op {
                BinaryOp::Eq => a.eq(b),
                BinaryOp::NotEq => a.neq(b),
                BinaryOp::Lt => a.lt(b),
                BinaryOp::LtEq => a.lt_eq(b),
                BinaryOp::Gt => a.gt(b),
                BinaryOp::GtEq => a.gt_eq(b),
                _ => a.eq_missing(b),
            };
            Ok(Compiled::new(e, DataType::Boolean))
        }
        BinaryOp::And | BinaryOp::Or => {
            let left = compile_guarded(l, scope, guard)?;
            if !is_boolean(&left.dtype) {
                return Err(mismatch(
                    "`&&`/`||` need booleans",
                    &left.dtype,
                    &DataType::Boolean,
                ));
            }
            let a = left.into_condition();
            // The right side matters where the left one does not decide.
            let undecided = if op == BinaryOp::And {
                a.clone().fill_null(lit(true))
            } else {
                a.clone().not().fill_null(lit(true))
            };
            let right = compile_guarded(r, scope, &narrow(guard, undecided))?;
            if !is_boolean(&right.dtype) {
                return Err(mismatch(
                    "`&&`/`||` need booleans",
                    &DataType::Boolean,
                    &right.dtype,
                ));
            }
            let b = right.into_condition();
            let e = if op == BinaryOp::And {
                a.and(b)
            } else {
                a.or(b)
            };
            Ok(Compiled::new(e, DataType::Boolean))
        }
        BinaryOp::Contains => {
            let a = compile_guarded(l, scope, guard)?;
            let b = compile_guarded(r, scope, guard)?;
            let stringy = |t: &DataType| is_string(t) || is_null(t);
            if stringy(&a.dtype) && stringy(&b.dtype) {
                Ok(Compiled::new(
                    kernels::string_predicate("contains", vec![a.expr, b.expr], |a, b| {
                        a.contains(b)
                    }),
                    DataType::Boolean,
                ))
            } else if matches!(a.dtype, DataType::List(_)) {
                Err(error::unsupported("`contains` on lists"))
            } else {
                Err(mismatch(
                    "`contains` needs a string or a list on the left",
                    &a.dtype,
                    &b.dtype,
                ))
            }
        }
        BinaryOp::Add
        | BinaryOp::Subtract
        | BinaryOp::Multiply
        | BinaryOp::Divide
        | BinaryOp::Modulo => {
            let a = compile_guarded(l, scope, guard)?;
            let b = compile_guarded(r, scope, guard)?;
            arithmetic(op, a, b, guard, &mismatch)
        }
    }
}

fn arithmetic(
    op: BinaryOp,
    a: Compiled,
    b: Compiled,
    guard: &Guard,
    mismatch: &dyn Fn(&str, &DataType, &DataType) -> etlantic_core::Error,
) -> Result<Compiled> {
    let (lt, rt) = (a.dtype.clone(), b.dtype.clone());
    if op == BinaryOp::Add && is_string(&lt) && is_string(&rt) {
        // DTCS: `+` concatenates two strings (null propagates).
        return Ok(Compiled::new(
            kernels::string_fn("concat", vec![a.expr, b.expr], |p| p.concat()),
            DataType::String,
        ));
    }
    if op == BinaryOp::Subtract && is_temporal(&lt) && is_temporal(&rt) {
        return Err(error::unsupported("subtracting dates or datetimes"));
    }
    let ok = |t: &DataType| is_numeric(t) || is_null(t);
    if !(ok(&lt) && ok(&rt)) {
        return Err(mismatch("arithmetic needs numbers", &lt, &rt));
    }
    if is_null(&lt) && is_null(&rt) {
        return Ok(Compiled::new(lit(NULL), DataType::Null));
    }
    let arith = match op {
        BinaryOp::Add => Arith::Add,
        BinaryOp::Subtract => Arith::Sub,
        BinaryOp::Multiply => Arith::Mul,
        BinaryOp::Divide => Arith::Div,
        _ => Arith::Rem,
    };
    if is_float(&lt) || is_float(&rt) {
        let f32_or_null = |t: &DataType| matches!(t, DataType::Float32 | DataType::Null);
        let out = if f32_or_null(&lt) && f32_or_null(&rt) {
            DataType::Float32
        } else {
            DataType::Float64
        };
        return Ok(Compiled::new(
            kernels::float_arith(arith, vec![a.expr, b.expr], out.clone()),
            out,
        ));
    }
    if is_decimal(&lt) || is_decimal(&rt) {
        let out_scale = match arith {
            Arith::Add | Arith::Sub => scale(&lt).max(scale(&rt)),
            Arith::Mul => scale(&lt) + scale(&rt),
            Arith::Div | Arith::Rem => {
                return Err(error::unsupported(
                    "`/` and `%` on exact decimals (convert them with `to_decimal` or cast)",
                ))
            }
        };
        if out_scale > MAX_PRECISION {
            return Err(error::unsupported(format!(
                "a decimal result with {out_scale} digits after the point"
            )));
        }
        let (inputs, g) = guarded(vec![a.expr, b.expr], guard);
        return Ok(Compiled::new(
            kernels::decimal_arith(arith, inputs, out_scale, g),
            DataType::Decimal(MAX_PRECISION, out_scale),
        ));
    }
    let (inputs, g) = guarded(vec![a.expr, b.expr], guard);
    Ok(Compiled::new(
        kernels::int_arith(arith, inputs, g),
        DataType::Int64,
    ))
}
