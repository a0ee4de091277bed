//! Portable expressions (`etlantic_core::ir::Expr`) as Spark SQL expressions.
//!
//! Every expression becomes the text of one Spark SQL expression, sent inside a Spark
//! Connect plan as an `SQLExpression` (Spark parses and type-checks it on the server).
//! The text is built so that Spark computes what DTCS defines, under Spark 4's ANSI mode:
//!
//! - integer literals are `BIGINT` (`5L`) and decimal literals are `DOUBLE`, as in the
//!   embedded engine; integer `+ - *` overflow is an error in both;
//! - `/` of two integers is integer division (`div`), as in DataFusion; division by zero
//!   is an error in both;
//! - `+` of two strings concatenates (null if either is null);
//! - the functions listed in [`crate::capabilities::FUNCTIONS`], each with DTCS's
//!   semantics (0-based `substr`, trimming DTCS's white space set, ...).
//!
//! What is not listed is refused with `ETL501`, so the planner never places it here.

use arrow::datatypes::DataType;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::{BinaryOp, Expr, Literal, UnaryOp};
use indexmap::IndexMap;

/// The characters DTCS's `trim` removes (Unicode White_Space), as the embedded engine
/// trims them.
const WHITE_SPACE: &str = "\u{9}\u{a}\u{b}\u{c}\u{d}\u{20}\u{85}\u{a0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}";

/// A quoted Spark identifier.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A Spark SQL string literal (backslash escapes are on by default).
pub fn string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            // Spark's lexer reads these escapes; raw control characters would also do,
            // but escaped text is readable in `explain`.
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The kind of a value, as far as compiling needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Any integer.
    Int,
    /// A binary floating-point number.
    Float,
    /// A decimal.
    Decimal,
    /// A string.
    Text,
    /// A boolean.
    Bool,
    /// A date or timestamp.
    Temporal,
    /// A list.
    List,
    /// The null literal.
    Null,
    /// Anything else.
    Other,
}

impl Kind {
    /// The kind of an Arrow type.
    pub fn of(dt: &DataType) -> Kind {
        use DataType::*;
        match dt {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => Kind::Int,
            Float16 | Float32 | Float64 => Kind::Float,
            Decimal128(..) | Decimal256(..) => Kind::Decimal,
            Utf8 | LargeUtf8 | Utf8View => Kind::Text,
            Boolean => Kind::Bool,
            Date32 | Date64 | Timestamp(..) => Kind::Temporal,
            List(_) | LargeList(_) | FixedSizeList(..) => Kind::List,
            Null => Kind::Null,
            _ => Kind::Other,
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Kind::Int | Kind::Float | Kind::Decimal | Kind::Null)
    }
}

/// A compiled expression: Spark SQL text and the kind of its value.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The expression text.
    pub sql: String,
    /// Its kind.
    pub kind: Kind,
}

/// The columns an expression can name: name → (Spark reference, kind).
#[derive(Clone, Debug, Default)]
pub struct Scope {
    columns: IndexMap<String, (String, Kind)>,
}

impl Scope {
    /// A scope over a relation's columns, referenced by their plain names.
    pub fn plain<'a>(columns: impl IntoIterator<Item = (&'a str, &'a DataType)>) -> Scope {
        Scope {
            columns: columns
                .into_iter()
                .map(|(n, t)| (n.to_string(), (ident(n), Kind::of(t))))
                .collect(),
        }
    }

    /// Adds (or keeps, when present) a column under a reference.
    pub fn bind(&mut self, name: &str, reference: String, kind: Kind) {
        self.columns
            .entry(name.to_string())
            .or_insert((reference, kind));
    }
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!("the Spark backend does not compute {what}"),
    )
}

fn mismatch(what: impl std::fmt::Display) -> Error {
    Error::new(&codes::TYPE_MISMATCH, what.to_string())
}

/// Compiles an expression over `scope`.
pub fn compile(e: &Expr, scope: &Scope) -> Result<Compiled> {
    Ok(match e {
        Expr::Column(name) => {
            let (sql, kind) = scope.columns.get(name).cloned().ok_or_else(|| {
                Error::new(&codes::UNKNOWN_COLUMN, format!("unknown column `{name}`"))
            })?;
            Compiled { sql, kind }
        }
        Expr::Parameter(p) => {
            return Err(Error::new(
                &codes::UNKNOWN_PARAMETER,
                format!("parameter `{p}` has no value"),
            ))
        }
        Expr::Literal(l) => literal(l),
        Expr::Unary(UnaryOp::Not, inner) => {
            let c = compile(inner, scope)?;
            expect_bool(&c, "`!`")?;
            Compiled {
                sql: format!("(NOT {})", c.sql),
                kind: Kind::Bool,
            }
        }
        Expr::Unary(UnaryOp::Negate, inner) => {
            let c = compile(inner, scope)?;
            if !c.kind.numeric() {
                return Err(mismatch("unary `-` needs a number"));
            }
            Compiled {
                sql: format!("(- {})", c.sql),
                kind: c.kind,
            }
        }
        Expr::Binary(op, l, r) => binary(*op, compile(l, scope)?, compile(r, scope)?)?,
        Expr::Call { function, args } => call(function, args, scope)?,
    })
}

/// Compiles a predicate (a boolean expression; rows where it is null are not kept).
pub fn predicate(e: &Expr, scope: &Scope) -> Result<String> {
    let c = compile(e, scope)?;
    expect_bool(&c, "a predicate")?;
    Ok(c.sql)
}

fn expect_bool(c: &Compiled, what: &str) -> Result<()> {
    match c.kind {
        Kind::Bool | Kind::Null => Ok(()),
        _ => Err(mismatch(format!("{what} needs a boolean, got `{}`", c.sql))),
    }
}

fn literal(l: &Literal) -> Compiled {
    match l {
        Literal::Null => Compiled {
            sql: "NULL".into(),
            kind: Kind::Null,
        },
        Literal::Boolean(b) => Compiled {
            sql: if *b { "TRUE" } else { "FALSE" }.into(),
            kind: Kind::Bool,
        },
        Literal::Integer(i) => Compiled {
            // i64::MIN has no positive literal; `CAST` reads it from text.
            sql: format!("CAST('{i}' AS BIGINT)"),
            kind: Kind::Int,
        },
        Literal::Decimal(d) => {
            let text = if d.is_nan() {
                "NaN".to_string()
            } else if d.is_infinite() {
                if *d > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
            } else {
                format!("{d:?}")
            };
            Compiled {
                sql: format!("CAST('{text}' AS DOUBLE)"),
                kind: Kind::Float,
            }
        }
        Literal::String(s) => Compiled {
            sql: string_literal(s),
            kind: Kind::Text,
        },
    }
}

fn binary(op: BinaryOp, l: Compiled, r: Compiled) -> Result<Compiled> {
    let bool_of = |sql: String| Compiled {
        sql,
        kind: Kind::Bool,
    };
    let comparable = |a: Kind, b: Kind| {
        a == b
            || a == Kind::Null
            || b == Kind::Null
            || (a.numeric() && b.numeric())
            // A string literal compared with a date/datetime is read as one.
            || matches!((a, b), (Kind::Temporal, Kind::Text) | (Kind::Text, Kind::Temporal))
    };
    Ok(match op {
        BinaryOp::Eq
        | BinaryOp::NotEq
        | BinaryOp::Lt
        | BinaryOp::LtEq
        | BinaryOp::Gt
        | BinaryOp::GtEq
        | BinaryOp::NullSafeEq => {
            if !comparable(l.kind, r.kind) {
                return Err(mismatch(format!(
                    "cannot compare `{}` with `{}`",
                    l.sql, r.sql
                )));
            }
            let symbol = match op {
                BinaryOp::Eq => "=",
                BinaryOp::NotEq => "!=",
                BinaryOp::Lt => "<",
                BinaryOp::LtEq => "<=",
                BinaryOp::Gt => ">",
                BinaryOp::GtEq => ">=",
                _ => "<=>",
            };
            bool_of(format!("({} {symbol} {})", l.sql, r.sql))
        }
        BinaryOp::And | BinaryOp::Or => {
            expect_bool(&l, "`&&`/`||`")?;
            expect_bool(&r, "`&&`/`||`")?;
            let word = if op == BinaryOp::And { "AND" } else { "OR" };
            bool_of(format!("({} {word} {})", l.sql, r.sql))
        }
        BinaryOp::Contains => contains(&l, &r)?,
        BinaryOp::Add if l.kind == Kind::Text && r.kind == Kind::Text => Compiled {
            sql: format!("concat({}, {})", l.sql, r.sql),
            kind: Kind::Text,
        },
        _ => {
            if !(l.kind.numeric() && r.kind.numeric()) {
                return Err(mismatch(format!(
                    "arithmetic needs numbers, got `{}` and `{}`",
                    l.sql, r.sql
                )));
            }
            let kind = match (l.kind, r.kind) {
                (Kind::Float, _) | (_, Kind::Float) => Kind::Float,
                (Kind::Decimal, _) | (_, Kind::Decimal) => Kind::Decimal,
                (Kind::Null, Kind::Null) => Kind::Null,
                _ => Kind::Int,
            };
            let symbol = match op {
                BinaryOp::Add => "+",
                BinaryOp::Subtract => "-",
                BinaryOp::Multiply => "*",
                // Integer division truncates, as in the embedded engine.
                BinaryOp::Divide if kind == Kind::Int => "div",
                BinaryOp::Divide => "/",
                _ => "%",
            };
            Compiled {
                sql: format!("({} {symbol} {})", l.sql, r.sql),
                kind,
            }
        }
    })
}

fn contains(l: &Compiled, r: &Compiled) -> Result<Compiled> {
    let sql = match l.kind {
        Kind::Text | Kind::Null => format!("contains({}, {})", l.sql, r.sql),
        Kind::List => format!("array_contains({}, {})", l.sql, r.sql),
        _ => return Err(mismatch("`contains` needs a string or a list on the left")),
    };
    Ok(Compiled {
        sql,
        kind: Kind::Bool,
    })
}

fn arity(f: &str, args: &[Expr], min: usize, max: Option<usize>) -> Result<()> {
    if args.len() < min || max.is_some_and(|m| args.len() > m) {
        return Err(mismatch(format!(
            "{f} takes {}{} arguments, got {}",
            min,
            match max {
                Some(m) if m == min => String::new(),
                Some(m) => format!(" to {m}"),
                None => " or more".into(),
            },
            args.len()
        )));
    }
    Ok(())
}

fn strings(f: &str, args: &[Compiled]) -> Result<()> {
    match args
        .iter()
        .find(|a| !matches!(a.kind, Kind::Text | Kind::Null))
    {
        Some(a) => Err(mismatch(format!("{f} expects strings, got `{}`", a.sql))),
        None => Ok(()),
    }
}

fn common_kind(f: &str, args: &[Compiled]) -> Result<Kind> {
    let mut kind = Kind::Null;
    for a in args {
        kind = match (kind, a.kind) {
            (Kind::Null, k) | (k, Kind::Null) => k,
            (a, b) if a == b => a,
            (a, b) if a.numeric() && b.numeric() => {
                if a == Kind::Float || b == Kind::Float {
                    Kind::Float
                } else {
                    Kind::Decimal
                }
            }
            _ => {
                return Err(mismatch(format!(
                    "{f}: arguments of different types (`{}`)",
                    a.sql
                )))
            }
        };
    }
    Ok(kind)
}

fn join(args: &[Compiled]) -> String {
    args.iter()
        .map(|a| a.sql.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn call(function: &str, args: &[Expr], scope: &Scope) -> Result<Compiled> {
    let f = function;
    let compiled = || -> Result<Vec<Compiled>> { args.iter().map(|a| compile(a, scope)).collect() };
    let of = |sql: String, kind: Kind| Ok(Compiled { sql, kind });
    match f {
        "dtcs:lower" | "dtcs:upper" => {
            // Java's case mapping is Unicode's full mapping (`ß` → `SS`), as DTCS's.
            arity(f, args, 1, Some(1))?;
            let a = compiled()?;
            strings(f, &a)?;
            of(format!("{}({})", &f[5..], a[0].sql), Kind::Text)
        }
        "dtcs:concat" => {
            arity(f, args, 2, None)?;
            let a = compiled()?;
            strings(f, &a)?;
            // Spark's concat is null when any argument is, as DTCS's.
            of(format!("concat({})", join(&a)), Kind::Text)
        }
        "dtcs:concat_ws" => {
            arity(f, args, 2, None)?;
            let a = compiled()?;
            strings(f, &a)?;
            of(format!("concat_ws({})", join(&a)), Kind::Text)
        }
        "dtcs:substr" => {
            arity(f, args, 2, Some(3))?;
            let a = compiled()?;
            strings(f, &a[..1])?;
            if a[1..]
                .iter()
                .any(|x| !matches!(x.kind, Kind::Int | Kind::Null))
            {
                return Err(mismatch("dtcs:substr: start and length are integers"));
            }
            let start = &a[1].sql;
            let length = match a.get(2) {
                Some(n) => format!(
                    ", CASE WHEN {n} < 0 THEN raise_error('dtcs:substr length must not be negative') ELSE CAST({n} AS INT) END",
                    n = n.sql
                ),
                None => String::new(),
            };
            // DTCS counts from 0, Spark from 1; a negative start is an error.
            of(
                format!(
                    "CASE WHEN {start} < 0 THEN raise_error('dtcs:substr start (0-based) must not be negative') ELSE substring({}, CAST({start} + 1 AS INT){length}) END",
                    a[0].sql
                ),
                Kind::Text,
            )
        }
        "dtcs:replace" => {
            arity(f, args, 3, Some(3))?;
            let a = compiled()?;
            strings(f, &a)?;
            of(format!("replace({})", join(&a)), Kind::Text)
        }
        "dtcs:length" => {
            arity(f, args, 1, Some(1))?;
            let a = compiled()?;
            strings(f, &a)?;
            // Characters (code points), as DTCS counts them.
            of(
                format!("CAST(char_length({}) AS BIGINT)", a[0].sql),
                Kind::Int,
            )
        }
        "dtcs:contains" => {
            arity(f, args, 2, Some(2))?;
            let a = compiled()?;
            contains(&a[0], &a[1])
        }
        "dtcs:starts_with" | "dtcs:ends_with" => {
            arity(f, args, 2, Some(2))?;
            let a = compiled()?;
            strings(f, &a)?;
            let name = if f == "dtcs:starts_with" {
                "startswith"
            } else {
                "endswith"
            };
            of(format!("{name}({})", join(&a)), Kind::Bool)
        }
        "dtcs:trim" | "dtcs:ltrim" | "dtcs:rtrim" => {
            arity(f, args, 1, Some(2))?;
            let a = compiled()?;
            strings(f, &a)?;
            let chars = match a.get(1) {
                Some(c) => c.sql.clone(),
                None => string_literal(WHITE_SPACE),
            };
            let side = match f {
                "dtcs:trim" => "BOTH",
                "dtcs:ltrim" => "LEADING",
                _ => "TRAILING",
            };
            of(
                format!("trim({side} {chars} FROM {})", a[0].sql),
                Kind::Text,
            )
        }
        "dtcs:coalesce" | "dtcs:if_null" => {
            if f == "dtcs:if_null" {
                arity(f, args, 2, Some(2))?;
            } else {
                arity(f, args, 1, None)?;
            }
            let a = compiled()?;
            let kind = common_kind(f, &a)?;
            of(format!("coalesce({})", join(&a)), kind)
        }
        "dtcs:null_if" => {
            arity(f, args, 2, Some(2))?;
            let a = compiled()?;
            common_kind(f, &a)?;
            of(format!("nullif({})", join(&a)), a[0].kind)
        }
        "dtcs:case_when" => {
            arity(f, args, 2, None)?;
            let a = compiled()?;
            let mut sql = String::from("CASE");
            let mut values = Vec::new();
            let mut it = a.chunks(2);
            for pair in &mut it {
                match pair {
                    [c, v] => {
                        expect_bool(c, "dtcs:case_when conditions")?;
                        sql.push_str(&format!(" WHEN {} THEN {}", c.sql, v.sql));
                        values.push(v.clone());
                    }
                    [otherwise] => {
                        sql.push_str(&format!(" ELSE {}", otherwise.sql));
                        values.push(otherwise.clone());
                    }
                    _ => unreachable!("chunks of two"),
                }
            }
            sql.push_str(" END");
            let kind = common_kind(f, &values)?;
            of(sql, kind)
        }
        "dtcs:is_null" => {
            arity(f, args, 1, Some(1))?;
            let a = compiled()?;
            of(format!("({} IS NULL)", a[0].sql), Kind::Bool)
        }
        "dtcs:abs" => {
            arity(f, args, 1, Some(1))?;
            let a = compiled()?;
            if !a[0].kind.numeric() {
                return Err(mismatch("dtcs:abs needs a number"));
            }
            of(format!("abs({})", a[0].sql), a[0].kind)
        }
        "dtcs:round" => {
            arity(f, args, 1, Some(2))?;
            let a = compiled()?;
            if !a[0].kind.numeric() || a.get(1).is_some_and(|d| d.kind != Kind::Int) {
                return Err(mismatch("dtcs:round needs a number and integer digits"));
            }
            // Ties to even, as ETLantic-py rounds (Spark's HALF_EVEN `bround`).
            let digits = a
                .get(1)
                .map(|d| format!(", CAST({} AS INT)", d.sql))
                .unwrap_or_default();
            of(format!("bround({}{digits})", a[0].sql), a[0].kind)
        }
        "dtcs:least" | "dtcs:greatest" | "dtcs:min" | "dtcs:max" if args.len() >= 2 => {
            let a = compiled()?;
            if let Some(x) = a.iter().find(|x| !x.kind.numeric()) {
                return Err(mismatch(format!("{f} needs numbers, got `{}`", x.sql)));
            }
            // DTCS: computed as doubles, null when any argument is null (Spark's
            // least/greatest skip nulls).
            let name = if matches!(f, "dtcs:least" | "dtcs:min") {
                "least"
            } else {
                "greatest"
            };
            let any_null = a
                .iter()
                .map(|x| format!("{} IS NULL", x.sql))
                .collect::<Vec<_>>()
                .join(" OR ");
            let doubles = a
                .iter()
                .map(|x| format!("CAST({} AS DOUBLE)", x.sql))
                .collect::<Vec<_>>()
                .join(", ");
            of(
                format!(
                    "CASE WHEN {any_null} THEN CAST(NULL AS DOUBLE) ELSE {name}({doubles}) END"
                ),
                Kind::Float,
            )
        }
        "dtcs:in" => {
            arity(f, args, 2, Some(2))?;
            let value = compile(&args[0], scope)?;
            match &args[1] {
                Expr::Call {
                    function,
                    args: items,
                } if matches!(function.as_str(), "dtcs:list" | "dtcs:tuple") => {
                    let mut all = vec![value.clone()];
                    for i in items {
                        all.push(compile(i, scope)?);
                    }
                    common_kind(f, &all)?;
                    of(
                        format!("({} IN ({}))", value.sql, join(&all[1..])),
                        Kind::Bool,
                    )
                }
                // `x in 'text'` is substring containment in DTCS; a scalar is equality.
                Expr::Literal(Literal::String(text))
                    if matches!(value.kind, Kind::Text | Kind::Null) =>
                {
                    of(
                        format!("contains({}, {})", string_literal(text), value.sql),
                        Kind::Bool,
                    )
                }
                Expr::Literal(l) => {
                    let item = literal(l);
                    common_kind(f, &[value.clone(), item.clone()])?;
                    of(format!("({} IN ({}))", value.sql, item.sql), Kind::Bool)
                }
                other => {
                    let list = compile(other, scope)?;
                    match list.kind {
                        Kind::List => of(
                            format!("array_contains({}, {})", list.sql, value.sql),
                            Kind::Bool,
                        ),
                        Kind::Text if matches!(value.kind, Kind::Text | Kind::Null) => {
                            of(format!("contains({}, {})", list.sql, value.sql), Kind::Bool)
                        }
                        _ => Err(mismatch(format!(
                            "dtcs:in: the right side must be a list, got `{}`",
                            list.sql
                        ))),
                    }
                }
            }
        }
        "dtcs:between" => {
            arity(f, args, 3, Some(3))?;
            let a = compiled()?;
            common_kind(f, &a)?;
            of(
                format!("({} BETWEEN {} AND {})", a[0].sql, a[1].sql, a[2].sql),
                Kind::Bool,
            )
        }
        // Only a timestamp literal written as text (how plans spell them); casts in
        // general are not declared: Spark's ANSI casts differ from DTCS's on bad text.
        "dtcs:cast"
            if matches!(
                args,
                [Expr::Literal(Literal::String(_)), Expr::Literal(Literal::String(t))]
                    if matches!(t.as_str(), "datetime" | "timestamp")
            ) =>
        {
            let [Expr::Literal(Literal::String(text)), _] = args else {
                unreachable!("matched above")
            };
            of(
                format!("CAST({} AS TIMESTAMP)", string_literal(text)),
                Kind::Temporal,
            )
        }
        // Internal to the compiler: a join's event-time range.
        "etlantic:__spark_time_range" => {
            let a = compiled()?;
            of(
                format!(
                    "({l} >= {r} - INTERVAL {lower} AND {l} <= {r} + INTERVAL {upper})",
                    l = a[0].sql,
                    r = a[1].sql,
                    lower = a[2].sql,
                    upper = a[3].sql
                ),
                Kind::Bool,
            )
        }
        other => Err(unsupported(format!("the function `{other}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope::plain([
            ("amount", &DataType::Int64),
            ("name", &DataType::Utf8),
            ("price", &DataType::Float64),
        ])
    }

    fn sql(e: &str) -> String {
        compile(&Expr::parse(e).expect("parses"), &scope())
            .expect("compiles")
            .sql
    }

    #[test]
    fn literals_are_typed_like_the_embedded_engine() {
        assert_eq!(sql("amount + 1"), "(`amount` + CAST('1' AS BIGINT))");
        assert_eq!(sql("price * 1.5"), "(`price` * CAST('1.5' AS DOUBLE))");
        assert_eq!(string_literal("it's \\ ok"), "'it\\'s \\\\ ok'");
    }

    #[test]
    fn integer_division_truncates_and_strings_concatenate() {
        assert_eq!(sql("amount / 2"), "(`amount` div CAST('2' AS BIGINT))");
        assert_eq!(sql("price / 2"), "(`price` / CAST('2' AS BIGINT))");
        assert_eq!(sql("name + name"), "concat(`name`, `name`)");
    }

    #[test]
    fn substr_counts_from_zero() {
        let s = sql("substr(name, 1, 2)");
        assert!(
            s.contains("substring(`name`, CAST(CAST('1' AS BIGINT) + 1 AS INT)"),
            "{s}"
        );
    }

    #[test]
    fn unknown_functions_and_columns_are_refused_with_codes() {
        let e = compile(&Expr::parse("sqrt(price)").unwrap(), &scope()).unwrap_err();
        assert_eq!(e.code(), "ETL501");
        let e = compile(&Expr::parse("missing > 1").unwrap(), &scope()).unwrap_err();
        assert_eq!(e.code(), codes::UNKNOWN_COLUMN.code);
        let e = compile(&Expr::parse("name > 1").unwrap(), &scope()).unwrap_err();
        assert_eq!(e.code(), codes::TYPE_MISMATCH.code);
    }
}
