//! DTCS expressions compiled to SQL expressions of a dialect: columns, literals
//! (temporal strings read against a date or timestamp), operators and the declared
//! functions, each with DTCS's null and type rules.

use super::{cast_to, mismatch, unify, unsupported, Rel};
use crate::dialect::{quote, string_literal, Dialect, Ty};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{BinaryOp, Expr, Literal, UnaryOp};

/// Unicode `White_Space`, which DTCS `trim` removes.
const WHITE_SPACE: &str = "\u{9}\u{a}\u{b}\u{c}\u{d}\u{20}\u{85}\u{a0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// A compiled expression.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// SQL text.
    pub sql: String,
    /// Its value kind.
    pub ty: Ty,
}

impl Compiled {
    fn new(sql: impl Into<String>, ty: Ty) -> Self {
        Compiled {
            sql: sql.into(),
            ty,
        }
    }

    /// As a `WHERE`/`ON` condition.
    pub(super) fn as_predicate(&self, d: Dialect) -> String {
        match (d, &self.ty) {
            (Dialect::Postgres, Ty::Null) => "CAST(NULL AS BOOLEAN)".into(),
            _ => format!("({})", self.sql),
        }
    }
}

/// Compiles expressions over named columns.
pub(super) struct ExprCompiler {
    dialect: Dialect,
    /// name → (SQL reference, kind)
    scope: Vec<(String, String, Ty)>,
}

impl ExprCompiler {
    pub(super) fn over(dialect: Dialect, r: &Rel) -> Self {
        ExprCompiler {
            dialect,
            scope: r
                .columns
                .iter()
                .map(|(n, t)| (n.clone(), quote(n), t.clone()))
                .collect(),
        }
    }

    pub(super) fn with_scope(dialect: Dialect, scope: Vec<(String, String, Ty)>) -> Self {
        ExprCompiler { dialect, scope }
    }

    pub(super) fn compile(&self, e: &Expr) -> Result<Compiled> {
        let d = self.dialect;
        match e {
            Expr::Column(c) => self
                .scope
                .iter()
                .find(|(n, _, _)| n == c)
                .map(|(_, s, t)| Compiled::new(s.clone(), t.clone()))
                .ok_or_else(|| Error::new(&codes::UNKNOWN_COLUMN, format!("unknown column `{c}`"))),
            Expr::Parameter(p) => Err(Error::new(
                &codes::UNKNOWN_PARAMETER,
                format!("parameter `{p}` has no value"),
            )),
            Expr::Literal(l) => Ok(literal(d, l)),
            Expr::Unary(UnaryOp::Not, x) => {
                let x = self.compile(x)?;
                if !matches!(x.ty, Ty::Bool | Ty::Null) {
                    return Err(mismatch("`!` needs a boolean"));
                }
                Ok(Compiled::new(format!("(NOT {})", x.sql), Ty::Bool))
            }
            Expr::Unary(UnaryOp::Negate, x) => {
                let x = self.compile(x)?;
                if !x.ty.is_numeric() && x.ty != Ty::Null {
                    return Err(mismatch("`-` needs a number"));
                }
                Ok(Compiled::new(format!("(-{})", x.sql), x.ty))
            }
            Expr::Binary(op, l, r) => self.binary(*op, l, r),
            Expr::Call { function, args } => self.call(function, args),
        }
    }

    /// Compiles `r` compared with `l`'s kind: a string literal compared with a date or
    /// timestamp is read as one (SQLite keeps them as integers).
    fn comparand(&self, other: &Compiled, e: &Expr) -> Result<Compiled> {
        if let (Expr::Literal(Literal::String(s)), true) = (e, other.ty.is_temporal()) {
            return temporal_literal(self.dialect, s, &other.ty);
        }
        self.compile(e)
    }

    fn binary(&self, op: BinaryOp, le: &Expr, re: &Expr) -> Result<Compiled> {
        let d = self.dialect;
        let mut l = self.compile(le)?;
        let r = self.comparand(&l, re)?;
        if matches!(le, Expr::Literal(Literal::String(_))) && r.ty.is_temporal() {
            l = self.comparand(&r, le)?;
        }
        let cmp = |sym: &str| {
            Ok(Compiled::new(
                format!("({} {sym} {})", l.sql, r.sql),
                Ty::Bool,
            ))
        };
        match op {
            BinaryOp::Eq => cmp("="),
            BinaryOp::NotEq => cmp("<>"),
            BinaryOp::Lt => cmp("<"),
            BinaryOp::LtEq => cmp("<="),
            BinaryOp::Gt => cmp(">"),
            BinaryOp::GtEq => cmp(">="),
            BinaryOp::NullSafeEq => cmp(match d {
                Dialect::Postgres => "IS NOT DISTINCT FROM",
                Dialect::Sqlite => "IS",
            }),
            BinaryOp::And | BinaryOp::Or => {
                for x in [&l, &r] {
                    if !matches!(x.ty, Ty::Bool | Ty::Null) {
                        return Err(mismatch("`&&`/`||` need booleans"));
                    }
                }
                let (ls, rs) = (l.as_predicate(d), r.as_predicate(d));
                let sym = if op == BinaryOp::And { "AND" } else { "OR" };
                Ok(Compiled::new(format!("({ls} {sym} {rs})"), Ty::Bool))
            }
            BinaryOp::Contains => self.contains(l, r),
            BinaryOp::Add if l.ty == Ty::Text && r.ty == Ty::Text => {
                Ok(Compiled::new(format!("({} || {})", l.sql, r.sql), Ty::Text))
            }
            BinaryOp::Add
            | BinaryOp::Subtract
            | BinaryOp::Multiply
            | BinaryOp::Divide
            | BinaryOp::Modulo => {
                for x in [&l, &r] {
                    if !x.ty.is_numeric() && x.ty != Ty::Null {
                        return Err(unsupported(
                            format!("arithmetic on {:?}", x.ty).to_lowercase(),
                            d,
                        ));
                    }
                }
                let ty = unify(&l.ty, &r.ty);
                let sym = match op {
                    BinaryOp::Add => "+",
                    BinaryOp::Subtract => "-",
                    BinaryOp::Multiply => "*",
                    BinaryOp::Divide => "/",
                    _ => "%",
                };
                if op == BinaryOp::Divide && d == Dialect::Sqlite {
                    // SQLite divides by zero into NULL; DTCS fails. `abs(i64::MIN)`
                    // raises SQLite's integer-overflow error for a zero divisor.
                    return Ok(Compiled::new(
                        format!(
                            "({} / CASE WHEN {r} = 0 THEN abs(-9223372036854775807 - 1) ELSE {r} END)",
                            l.sql,
                            r = r.sql
                        ),
                        ty,
                    ));
                }
                if op == BinaryOp::Modulo && d == Dialect::Postgres && ty != Ty::Int {
                    return Ok(Compiled::new(
                        format!(
                            "mod(CAST({} AS NUMERIC), CAST({} AS NUMERIC))",
                            l.sql, r.sql
                        ),
                        ty,
                    ));
                }
                Ok(Compiled::new(format!("({} {sym} {})", l.sql, r.sql), ty))
            }
        }
    }

    fn contains(&self, l: Compiled, r: Compiled) -> Result<Compiled> {
        if !matches!(l.ty, Ty::Text | Ty::Null) || !matches!(r.ty, Ty::Text | Ty::Null) {
            return Err(unsupported("`contains` on non-strings", self.dialect));
        }
        let f = match self.dialect {
            Dialect::Postgres => "strpos",
            Dialect::Sqlite => "instr",
        };
        Ok(Compiled::new(
            format!("({f}({}, {}) > 0)", l.sql, r.sql),
            Ty::Bool,
        ))
    }

    fn args(&self, args: &[Expr]) -> Result<Vec<Compiled>> {
        args.iter().map(|a| self.compile(a)).collect()
    }

    fn call(&self, function: &str, args: &[Expr]) -> Result<Compiled> {
        let d = self.dialect;
        let short = function.strip_prefix("dtcs:").unwrap_or(function);
        let arity = |min: usize, max: Option<usize>| -> Result<()> {
            if args.len() < min || max.is_some_and(|m| args.len() > m) {
                return Err(mismatch(format!(
                    "{short}: wrong number of arguments ({})",
                    args.len()
                )));
            }
            Ok(())
        };
        let strings = |a: &[Compiled]| -> Result<()> {
            if a.iter().all(|x| matches!(x.ty, Ty::Text | Ty::Null)) {
                Ok(())
            } else {
                Err(mismatch(format!("{short}: expects strings")))
            }
        };
        let numbers = |a: &[Compiled]| -> Result<()> {
            if a.iter().all(|x| x.ty.is_numeric() || x.ty == Ty::Null) {
                Ok(())
            } else {
                Err(mismatch(format!("{short}: expects numbers")))
            }
        };
        let any_null = |a: &[Compiled]| -> String {
            a.iter()
                .map(|x| format!("{} IS NULL", x.sql))
                .collect::<Vec<_>>()
                .join(" OR ")
        };
        match function {
            "dtcs:concat" => {
                arity(2, None)?;
                let a = self.args(args)?;
                strings(&a)?;
                let parts: Vec<String> = a.iter().map(|x| x.sql.clone()).collect();
                Ok(Compiled::new(format!("({})", parts.join(" || ")), Ty::Text))
            }
            "dtcs:substr" => {
                arity(2, Some(3))?;
                let a = self.args(args)?;
                if !matches!(a[0].ty, Ty::Text | Ty::Null)
                    || a[1..].iter().any(|x| !matches!(x.ty, Ty::Int | Ty::Null))
                {
                    return Err(mismatch("substr: expects a string and integers"));
                }
                for x in args[1..].iter() {
                    if let Expr::Literal(Literal::Integer(n)) = x {
                        if *n < 0 {
                            return Err(mismatch("substr: negative start or length"));
                        }
                    } else {
                        // A computed start could be negative, which DTCS makes an error.
                        return Err(unsupported("`substr` with a computed start or length", d));
                    }
                }
                // PostgreSQL's substr takes INTEGER positions.
                let int = |x: &Compiled| match d {
                    Dialect::Postgres => format!("CAST({} AS INTEGER)", x.sql),
                    Dialect::Sqlite => x.sql.clone(),
                };
                let len = a
                    .get(2)
                    .map(|l| format!(", {}", int(l)))
                    .unwrap_or_default();
                Ok(Compiled::new(
                    format!("substr({}, {} + 1{len})", a[0].sql, int(&a[1])),
                    Ty::Text,
                ))
            }
            "dtcs:replace" => {
                arity(3, Some(3))?;
                let a = self.args(args)?;
                strings(&a)?;
                if matches!(&args[1], Expr::Literal(Literal::String(s)) if s.is_empty()) {
                    // Replacing the empty string differs between engines.
                    return Err(unsupported("`replace` of the empty string", d));
                }
                Ok(Compiled::new(
                    format!("replace({}, {}, {})", a[0].sql, a[1].sql, a[2].sql),
                    Ty::Text,
                ))
            }
            "dtcs:length" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                strings(&a)?;
                Ok(Compiled::new(format!("length({})", a[0].sql), Ty::Int))
            }
            "dtcs:contains" => {
                arity(2, Some(2))?;
                let mut a = self.args(args)?;
                let r = a.pop().expect("two");
                let l = a.pop().expect("two");
                self.contains(l, r)
            }
            "dtcs:starts_with" | "dtcs:ends_with" => {
                arity(2, Some(2))?;
                let a = self.args(args)?;
                strings(&a)?;
                let (s, p) = (&a[0].sql, &a[1].sql);
                let sql = if function == "dtcs:starts_with" {
                    format!("(substr({s}, 1, length({p})) = {p})")
                } else {
                    format!(
                        "(length({p}) <= length({s}) AND substr({s}, length({s}) - length({p}) + 1) = {p})"
                    )
                };
                Ok(Compiled::new(sql, Ty::Bool))
            }
            "dtcs:trim" | "dtcs:ltrim" | "dtcs:rtrim" => {
                arity(1, Some(2))?;
                let a = self.args(args)?;
                strings(&a)?;
                let chars = a
                    .get(1)
                    .map(|c| c.sql.clone())
                    .unwrap_or_else(|| string_literal(WHITE_SPACE));
                let f = match (d, short) {
                    (Dialect::Postgres, "trim") => "btrim",
                    _ => short,
                };
                Ok(Compiled::new(
                    format!("{f}({}, {chars})", a[0].sql),
                    Ty::Text,
                ))
            }
            "dtcs:coalesce" | "dtcs:if_null" => {
                arity(
                    if short == "if_null" { 2 } else { 1 },
                    if short == "if_null" { Some(2) } else { None },
                )?;
                let a = self.args(args)?;
                let ty = a.iter().fold(Ty::Null, |t, x| unify(&t, &x.ty));
                let parts: Vec<String> = a.iter().map(|x| cast_to(d, &x.sql, &x.ty, &ty)).collect();
                if parts.len() == 1 {
                    return Ok(Compiled::new(parts[0].clone(), ty));
                }
                Ok(Compiled::new(format!("COALESCE({})", parts.join(", ")), ty))
            }
            "dtcs:null_if" => {
                arity(2, Some(2))?;
                let a = self.args(args)?;
                Ok(Compiled::new(
                    format!("NULLIF({}, {})", a[0].sql, a[1].sql),
                    a[0].ty.clone(),
                ))
            }
            "dtcs:case_when" => {
                arity(2, None)?;
                let a = self.args(args)?;
                let mut sql = String::from("CASE");
                let mut ty = Ty::Null;
                let mut i = 0;
                while i + 1 < a.len() {
                    if !matches!(a[i].ty, Ty::Bool | Ty::Null) {
                        return Err(mismatch("case_when: conditions must be boolean"));
                    }
                    ty = unify(&ty, &a[i + 1].ty);
                    i += 2;
                }
                if a.len() % 2 == 1 {
                    ty = unify(&ty, &a[a.len() - 1].ty);
                }
                let mut i = 0;
                while i + 1 < a.len() {
                    sql.push_str(&format!(
                        " WHEN {} THEN {}",
                        a[i].as_predicate(d),
                        cast_to(d, &a[i + 1].sql, &a[i + 1].ty, &ty)
                    ));
                    i += 2;
                }
                if a.len() % 2 == 1 {
                    let o = &a[a.len() - 1];
                    sql.push_str(&format!(" ELSE {}", cast_to(d, &o.sql, &o.ty, &ty)));
                }
                sql.push_str(" END");
                Ok(Compiled::new(sql, ty))
            }
            "dtcs:is_null" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                Ok(Compiled::new(format!("({} IS NULL)", a[0].sql), Ty::Bool))
            }
            "dtcs:abs" => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                numbers(&a)?;
                Ok(Compiled::new(format!("abs({})", a[0].sql), a[0].ty.clone()))
            }
            "dtcs:round" => {
                arity(1, Some(2))?;
                let a = self.args(args)?;
                numbers(&a)?;
                // Ties to even, as ETLantic-py rounds (and
                // `etlantic_core::ir::numeric::round_half_even`): the tie is judged on
                // y = x * 10^digits in double precision. PostgreSQL's float `round` is
                // half to even; SQLite's rounds ties away from zero, so a tie is taken
                // to the even neighbour by hand.
                let digits = match args.get(1) {
                    None => 0,
                    Some(e) => match const_int(e) {
                        Some(n) => n.clamp(-300, 300),
                        None => {
                            return Err(unsupported("`round` with a computed number of digits", d))
                        }
                    },
                };
                let real = match d {
                    Dialect::Postgres => "DOUBLE PRECISION",
                    Dialect::Sqlite => "REAL",
                };
                let factor = format!(
                    "CAST({:e} AS {real})",
                    10f64.powi(digits.unsigned_abs() as i32)
                );
                let x = format!("CAST({} AS {real})", a[0].sql);
                let (y, back) = if digits >= 0 { ("*", "/") } else { ("/", "*") };
                let y = format!("({x} {y} {factor})");
                let rounded = match d {
                    Dialect::Postgres => format!("round({y})"),
                    Dialect::Sqlite => format!(
                        "(CASE WHEN abs({y} - CAST({y} AS INTEGER)) = 0.5 \
                         THEN CAST({y} AS INTEGER) + (CAST({y} AS INTEGER) % 2) ELSE round({y}) END)"
                    ),
                };
                Ok(Compiled::new(
                    format!("({rounded} {back} {factor})"),
                    Ty::Float,
                ))
            }
            "dtcs:floor" | "dtcs:ceil" if d == Dialect::Postgres => {
                arity(1, Some(1))?;
                let a = self.args(args)?;
                numbers(&a)?;
                Ok(Compiled::new(
                    format!("{short}(CAST({} AS DOUBLE PRECISION))", a[0].sql),
                    Ty::Float,
                ))
            }
            "dtcs:least" | "dtcs:greatest" => {
                arity(2, None)?;
                let a = self.args(args)?;
                numbers(&a)?;
                // Integers stay integers (as in ETLantic-py); any other number makes a float.
                let integers = a.iter().all(|x| matches!(x.ty, Ty::Int | Ty::Null));
                let parts: Vec<String> = a
                    .iter()
                    .map(|x| match (d, integers) {
                        (Dialect::Postgres, true) => format!("CAST({} AS BIGINT)", x.sql),
                        (Dialect::Sqlite, true) => format!("CAST({} AS INTEGER)", x.sql),
                        (Dialect::Postgres, false) => {
                            format!("CAST({} AS DOUBLE PRECISION)", x.sql)
                        }
                        (Dialect::Sqlite, false) => format!("CAST({} AS REAL)", x.sql),
                    })
                    .collect();
                let f = match (d, short) {
                    (Dialect::Postgres, _) => short.to_uppercase(),
                    (Dialect::Sqlite, "least") => "min".into(),
                    _ => "max".into(),
                };
                Ok(Compiled::new(
                    format!(
                        "(CASE WHEN {} THEN NULL ELSE {f}({}) END)",
                        any_null(&a),
                        parts.join(", ")
                    ),
                    if integers { Ty::Int } else { Ty::Float },
                ))
            }
            "dtcs:in" => {
                arity(2, Some(2))?;
                let v = self.compile(&args[0])?;
                match &args[1] {
                    Expr::Call {
                        function,
                        args: items,
                    } if matches!(function.as_str(), "dtcs:list" | "dtcs:tuple") => {
                        if items.is_empty() {
                            return Ok(Compiled::new("FALSE", Ty::Bool));
                        }
                        let items: Vec<String> = items
                            .iter()
                            .map(|i| self.comparand(&v, i).map(|c| c.sql))
                            .collect::<Result<_>>()?;
                        Ok(Compiled::new(
                            format!("({} IN ({}))", v.sql, items.join(", ")),
                            Ty::Bool,
                        ))
                    }
                    Expr::Literal(Literal::String(_)) if matches!(v.ty, Ty::Text | Ty::Null) => {
                        let hay = self.compile(&args[1])?;
                        self.contains(hay, v)
                    }
                    other => {
                        let item = self.comparand(&v, other)?;
                        if item.ty == Ty::Text && matches!(v.ty, Ty::Text | Ty::Null) {
                            return self.contains(item, v);
                        }
                        Ok(Compiled::new(
                            format!("({} IN ({}))", v.sql, item.sql),
                            Ty::Bool,
                        ))
                    }
                }
            }
            "dtcs:between" => {
                arity(3, Some(3))?;
                let v = self.compile(&args[0])?;
                let lo = self.comparand(&v, &args[1])?;
                let hi = self.comparand(&v, &args[2])?;
                Ok(Compiled::new(
                    format!(
                        "({v} >= {lo} AND {v} <= {hi})",
                        v = v.sql,
                        lo = lo.sql,
                        hi = hi.sql
                    ),
                    Ty::Bool,
                ))
            }
            other => Err(unsupported(format!("the function `{other}`"), d)),
        }
    }
}

fn literal(d: Dialect, l: &Literal) -> Compiled {
    match l {
        Literal::Null => Compiled::new("NULL", Ty::Null),
        Literal::Boolean(b) => Compiled::new(
            match (d, b) {
                (Dialect::Postgres, true) => "TRUE",
                (Dialect::Postgres, false) => "FALSE",
                (Dialect::Sqlite, true) => "1",
                (Dialect::Sqlite, false) => "0",
            },
            Ty::Bool,
        ),
        Literal::Integer(i) => Compiled::new(
            match d {
                Dialect::Postgres => format!("CAST({i} AS BIGINT)"),
                Dialect::Sqlite => i.to_string(),
            },
            Ty::Int,
        ),
        Literal::Decimal(f) => {
            let text = if f.is_finite() {
                format!("{f:?}")
            } else {
                "NULL".into()
            };
            Compiled::new(
                match d {
                    Dialect::Postgres => format!("CAST({text} AS DOUBLE PRECISION)"),
                    Dialect::Sqlite => format!("CAST({text} AS REAL)"),
                },
                Ty::Float,
            )
        }
        Literal::String(s) => Compiled::new(
            match d {
                Dialect::Postgres => format!("CAST({} AS TEXT)", string_literal(s)),
                Dialect::Sqlite => string_literal(s),
            },
            Ty::Text,
        ),
    }
}

/// A string literal read as a date or timestamp of kind `ty`.
fn temporal_literal(d: Dialect, s: &str, ty: &Ty) -> Result<Compiled> {
    let bad = || mismatch(format!("`{s}` is not a date or timestamp"));
    match d {
        Dialect::Postgres => {
            let ct = ty.column_type(d).expect("temporal");
            Ok(Compiled::new(
                format!("CAST({} AS {ct})", string_literal(s)),
                ty.clone(),
            ))
        }
        Dialect::Sqlite => {
            let micros = parse_instant_micros(s).ok_or_else(bad)?;
            let value = match ty {
                Ty::Date => micros.div_euclid(86_400_000_000),
                _ => micros,
            };
            Ok(Compiled::new(value.to_string(), ty.clone()))
        }
    }
}

/// Microseconds since the epoch of an ISO date or date-time (UTC when it has no zone).
pub fn parse_instant_micros(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    for f in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc().timestamp_micros());
        }
    }
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .map(|d| {
            d.and_hms_opt(0, 0, 0)
                .expect("midnight")
                .and_utc()
                .timestamp_micros()
        })
}

/// The value of an integer literal (including a negated one).
pub(super) fn const_int(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(Literal::Integer(i)) => Some(*i),
        Expr::Unary(etlantic_core::ir::UnaryOp::Negate, inner) => {
            const_int(inner).and_then(i64::checked_neg)
        }
        _ => None,
    }
}
