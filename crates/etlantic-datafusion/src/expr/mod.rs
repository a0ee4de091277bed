//! The expression compiler: DTCS [`Expr`] → DataFusion [`DfExpr`].
//!
//! Semantics are SQL's three-valued logic, which is what DTCS prescribes for portable
//! plans: comparisons with null are null, `and`/`or` follow Kleene logic, a filter keeps
//! only rows whose predicate is true. Arithmetic on integers stays integer (integer
//! division truncates; overflow and division by zero are run-time errors), mixing
//! integers and decimals gives decimals, `+` on two strings concatenates.
//!
//! Every expression is type-checked against the input schema while it is compiled, so a
//! type error is reported as `ETL302` at planning time, and a missing column as `ETL206`.

mod checked;
mod functions;
mod rounding;
pub(crate) mod types;

use crate::error;
use crate::table::is_reserved;
use arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchemaRef, ScalarValue};
use datafusion::logical_expr::{
    binary_expr, cast, lit, when, BinaryExpr, Expr as DfExpr, ExprSchemable, Operator,
};
use etlantic_core::ir::{BinaryOp, Expr, Literal, UnaryOp};
use etlantic_core::Result;
use indexmap::IndexMap;
use types::{comparable, describe, is_boolean, is_numeric, is_string, is_temporal};

/// The scalar function ids the compiler implements.
pub(crate) fn functions_list() -> &'static [&'static str] {
    functions::SCALAR_FUNCTIONS
}

/// The columns an expression can see, and the schema its result types are computed in.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    schema: DFSchemaRef,
    columns: IndexMap<String, DfExpr>,
}

impl Scope {
    /// Every user column of `schema`, referenced by its qualified name.
    pub(crate) fn of(schema: DFSchemaRef) -> Self {
        let columns = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !is_reserved(n))
            .map(|n| {
                let e = column_of(&schema, &n);
                (n, e)
            })
            .collect();
        Scope { schema, columns }
    }

    /// Explicit name → expression bindings over `schema` (e.g. both sides of a join).
    pub(crate) fn with_columns(schema: DFSchemaRef, columns: IndexMap<String, DfExpr>) -> Self {
        Scope { schema, columns }
    }

    /// The expression a column name stands for.
    pub(crate) fn column(&self, name: &str) -> Result<DfExpr> {
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

    /// The type of a compiled expression.
    pub(crate) fn type_of(&self, e: &DfExpr) -> Result<DataType> {
        e.get_type(self.schema.as_ref())
            .map_err(|err| error::type_mismatch(format!("`{e}`: {}", err.find_root())))
    }
}

/// Type-checks a DTCS expression over the columns of `schema` as a step compiles it,
/// and returns the type of its result, or the diagnostic a step would report (`ETL206`
/// unknown column, `ETL302` type mismatch, `ETL306` unknown function, ...).
pub fn expression_type(e: &Expr, schema: &arrow::datatypes::Schema) -> Result<DataType> {
    let df = datafusion::common::DFSchema::try_from(schema.clone())
        .map_err(|err| error::type_mismatch(err.to_string()))?;
    let scope = Scope::of(std::sync::Arc::new(df));
    let x = compile(e, &scope)?;
    scope.type_of(&x)
}

/// Compiles an expression.
pub(crate) fn compile(e: &Expr, scope: &Scope) -> Result<DfExpr> {
    match e {
        Expr::Column(c) => scope.column(c),
        Expr::Parameter(p) => Err(error::err(
            &etlantic_core::diagnostics::codes::UNKNOWN_PARAMETER,
            format!("missing value for transformation parameter `{p}`"),
        )),
        Expr::Literal(l) => Ok(literal(l)),
        Expr::Unary(op, inner) => {
            let x = compile(inner, scope)?;
            let t = scope.type_of(&x)?;
            match op {
                UnaryOp::Not => {
                    if !is_boolean(&t) {
                        return Err(error::type_mismatch(format!(
                            "`!` needs a boolean, got {} in `{e}`",
                            describe(&t)
                        )));
                    }
                    Ok(DfExpr::Not(Box::new(as_boolean(x, &t))))
                }
                UnaryOp::Negate => {
                    if !(is_numeric(&t) || types::is_null(&t)) {
                        return Err(error::type_mismatch(format!(
                            "`-` needs a number, got {} in `{e}`",
                            describe(&t)
                        )));
                    }
                    Ok(DfExpr::Negative(Box::new(x)))
                }
            }
        }
        Expr::Binary(op, l, r) => binary(*op, l, r, e, scope),
        Expr::Call { function, args } => functions::call(function, args, scope),
    }
}

/// Compiles a predicate: the result must be boolean (or the null literal, which keeps
/// no row).
pub(crate) fn compile_predicate(e: &Expr, scope: &Scope) -> Result<DfExpr> {
    let x = compile(e, scope)?;
    let t = scope.type_of(&x)?;
    if !is_boolean(&t) {
        return Err(error::type_mismatch(format!(
            "a predicate must be boolean, `{e}` is {}",
            describe(&t)
        )));
    }
    Ok(as_boolean(x, &t))
}

/// A DTCS literal.
pub(crate) fn literal(l: &Literal) -> DfExpr {
    match l {
        Literal::Null => lit(ScalarValue::Null),
        Literal::Boolean(b) => lit(*b),
        Literal::Integer(i) => lit(*i),
        Literal::Decimal(d) => lit(*d),
        Literal::String(s) => lit(s.clone()),
    }
}

/// Types the untyped null as boolean.
fn as_boolean(x: DfExpr, t: &DataType) -> DfExpr {
    if types::is_null(t) {
        cast(x, DataType::Boolean)
    } else {
        x
    }
}

/// `CASE WHEN any arg IS NULL THEN NULL ELSE value END` (null propagation for functions
/// whose DataFusion counterpart skips nulls).
pub(crate) fn null_if_any_null(args: &[DfExpr], value: DfExpr, ty: &DataType) -> Result<DfExpr> {
    let Some(cond) = args
        .iter()
        .map(|a| a.clone().is_null())
        .reduce(|a, b| a.or(b))
    else {
        return Ok(value);
    };
    let null = ScalarValue::try_from(ty).unwrap_or(ScalarValue::Null);
    when(cond, lit(null))
        .otherwise(value)
        .map_err(|e| error::datafusion(e, "null propagation"))
}

fn binary(op: BinaryOp, l: &Expr, r: &Expr, whole: &Expr, scope: &Scope) -> Result<DfExpr> {
    let left = compile(l, scope)?;
    let right = compile(r, scope)?;
    let lt = scope.type_of(&left)?;
    let rt = scope.type_of(&right)?;
    let mismatch = |what: &str| {
        error::type_mismatch(format!(
            "{what}: {} {} {} in `{whole}`",
            describe(&lt),
            op.symbol(),
            describe(&rt)
        ))
    };
    let operator = match op {
        BinaryOp::Eq => Operator::Eq,
        BinaryOp::NotEq => Operator::NotEq,
        BinaryOp::Lt => Operator::Lt,
        BinaryOp::LtEq => Operator::LtEq,
        BinaryOp::Gt => Operator::Gt,
        BinaryOp::GtEq => Operator::GtEq,
        BinaryOp::NullSafeEq => Operator::IsNotDistinctFrom,
        BinaryOp::And => Operator::And,
        BinaryOp::Or => Operator::Or,
        BinaryOp::Add => Operator::Plus,
        BinaryOp::Subtract => Operator::Minus,
        BinaryOp::Multiply => Operator::Multiply,
        BinaryOp::Divide => Operator::Divide,
        BinaryOp::Modulo => Operator::Modulo,
        BinaryOp::Contains => {
            return functions::contains(left, &lt, right, &rt)
                .ok_or_else(|| mismatch("`contains` needs a string or a list on the left"))
        }
    };
    match op {
        BinaryOp::Eq
        | BinaryOp::NotEq
        | BinaryOp::Lt
        | BinaryOp::LtEq
        | BinaryOp::Gt
        | BinaryOp::GtEq
        | BinaryOp::NullSafeEq => {
            // A string literal compared with a date/datetime is read as one.
            let (left, right) = match (l, r) {
                (_, Expr::Literal(Literal::String(_))) if is_temporal(&lt) => {
                    (left, cast(right, lt.clone()))
                }
                (Expr::Literal(Literal::String(_)), _) if is_temporal(&rt) => {
                    (cast(left, rt.clone()), right)
                }
                _ if comparable(&lt, &rt) => (left, right),
                _ => return Err(mismatch("cannot compare")),
            };
            Ok(DfExpr::BinaryExpr(BinaryExpr::new(
                Box::new(left),
                operator,
                Box::new(right),
            )))
        }
        BinaryOp::And | BinaryOp::Or => {
            if !(is_boolean(&lt) && is_boolean(&rt)) {
                return Err(mismatch("`&&`/`||` need booleans"));
            }
            Ok(binary_expr(
                as_boolean(left, &lt),
                operator,
                as_boolean(right, &rt),
            ))
        }
        BinaryOp::Add if is_string(&lt) && is_string(&rt) => {
            // DTCS: `+` concatenates two strings (null propagates).
            let args = vec![left, right];
            let value = datafusion::functions::string::concat().call(args.clone());
            null_if_any_null(&args, value, &DataType::Utf8)
        }
        BinaryOp::Subtract if is_temporal(&lt) && is_temporal(&rt) => {
            Ok(binary_expr(left, operator, right))
        }
        _ => {
            let ok = |t: &DataType| is_numeric(t) || types::is_null(t);
            if !(ok(&lt) && ok(&rt)) {
                return Err(mismatch("arithmetic needs numbers"));
            }
            // Integer overflow is an error in DTCS (DataFusion wraps around).
            let int = |t: &DataType| types::is_integer(t) || types::is_null(t);
            let checked_op = match op {
                BinaryOp::Add => Some(checked::ArithOp::Add),
                BinaryOp::Subtract => Some(checked::ArithOp::Sub),
                BinaryOp::Multiply => Some(checked::ArithOp::Mul),
                _ => None,
            };
            match checked_op {
                Some(c)
                    if int(&lt) && int(&rt) && !(types::is_null(&lt) && types::is_null(&rt)) =>
                {
                    Ok(checked::checked(c, left, right))
                }
                _ => Ok(binary_expr(left, operator, right)),
            }
        }
    }
}

/// A column reference that never parses dots in the name.
pub(crate) fn ident_expr(name: &str) -> DfExpr {
    DfExpr::Column(Column::new_unqualified(name))
}

/// The qualified reference to the column `name` of `schema` (unqualified if absent).
pub(crate) fn column_of(schema: &DFSchemaRef, name: &str) -> DfExpr {
    match schema.qualified_field_with_unqualified_name(name) {
        Ok((q, f)) => DfExpr::Column(Column::new(q.cloned(), f.name())),
        Err(_) => ident_expr(name),
    }
}
