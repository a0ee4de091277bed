//! DTCS expressions, decoded from the structured nodes of a `dtcs.transform-plan/2` and
//! encoded back in the dialect ETLantic-py writes.
//!
//! Two dialects of the same node format exist in the wild and both decode here:
//! the `dtcs` crate's (with `span`s and short operator names such as `neq`, `sub`) and
//! ETLantic-py's (no spans; `not_eq`, `subtract`, `null` literals, `scope: parameter`).
//! Plans we emit use ETLantic-py's dialect so that they load there unchanged.

use serde_json::{json, Value};
use std::fmt;

/// A literal value.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    /// SQL NULL.
    Null,
    /// A boolean.
    Boolean(bool),
    /// A 64-bit integer.
    Integer(i64),
    /// A double.
    Decimal(f64),
    /// A string.
    String(String),
}

/// Unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// Boolean negation (three-valued).
    Not,
    /// Arithmetic negation.
    Negate,
}

/// Binary operators (DTCS `dtcs:stdlib.operators`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `=`
    Eq,
    /// `!=`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
    /// Null-safe equality (`<=>`).
    NullSafeEq,
    /// Three-valued AND.
    And,
    /// Three-valued OR.
    Or,
    /// `+`
    Add,
    /// `-`
    Subtract,
    /// `*`
    Multiply,
    /// `/`
    Divide,
    /// `%`
    Modulo,
    /// String containment (`a contains b`).
    Contains,
}

impl BinaryOp {
    /// The operator name ETLantic-py writes.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Eq => "eq",
            BinaryOp::NotEq => "not_eq",
            BinaryOp::Lt => "lt",
            BinaryOp::LtEq => "lte",
            BinaryOp::Gt => "gt",
            BinaryOp::GtEq => "gte",
            BinaryOp::NullSafeEq => "null_safe_eq",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Add => "add",
            BinaryOp::Subtract => "subtract",
            BinaryOp::Multiply => "multiply",
            BinaryOp::Divide => "divide",
            BinaryOp::Modulo => "modulo",
            BinaryOp::Contains => "contains",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "eq" => BinaryOp::Eq,
            "neq" | "not_eq" | "notEq" => BinaryOp::NotEq,
            "lt" => BinaryOp::Lt,
            "lte" => BinaryOp::LtEq,
            "gt" => BinaryOp::Gt,
            "gte" => BinaryOp::GtEq,
            "nullSafeEq" | "null_safe_eq" => BinaryOp::NullSafeEq,
            "and" => BinaryOp::And,
            "or" => BinaryOp::Or,
            "add" => BinaryOp::Add,
            "sub" | "subtract" => BinaryOp::Subtract,
            "mul" | "multiply" => BinaryOp::Multiply,
            "div" | "divide" => BinaryOp::Divide,
            "mod" | "modulo" => BinaryOp::Modulo,
            "contains" => BinaryOp::Contains,
            _ => return None,
        })
    }

    /// How the operator is written in DTCS expressions (and in diagnostics).
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Eq => "==",
            BinaryOp::NotEq => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::LtEq => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::GtEq => ">=",
            BinaryOp::NullSafeEq => "<=>",
            BinaryOp::And => "&&",
            BinaryOp::Or => "||",
            BinaryOp::Add => "+",
            BinaryOp::Subtract => "-",
            BinaryOp::Multiply => "*",
            BinaryOp::Divide => "/",
            BinaryOp::Modulo => "%",
            BinaryOp::Contains => "contains",
        }
    }
}

/// A decoded DTCS expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A column of the current relation.
    Column(String),
    /// A runtime parameter of the transformation (`scope: parameter`).
    Parameter(String),
    /// A constant.
    Literal(Literal),
    /// A unary operation.
    Unary(UnaryOp, Box<Expr>),
    /// A binary operation.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// A function call; `function` is the full registry id, e.g. `dtcs:upper`.
    Call {
        /// Namespaced function id.
        function: String,
        /// Arguments.
        args: Vec<Expr>,
    },
}

impl Expr {
    /// A column reference.
    pub fn col(name: impl Into<String>) -> Self {
        Expr::Column(name.into())
    }

    /// Decodes a structured node or, when `value` is a string, parses DTCS expression
    /// text (`amount > 10 && status != 'x'`; `null` is the null literal; functions may be
    /// written without the `dtcs:` prefix).
    pub fn decode(value: &Value) -> Result<Self, String> {
        match value {
            Value::String(s) => Self::parse(s),
            Value::Object(m) => {
                let kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "fieldRef" => {
                        let name = m
                            .get("target")
                            .or_else(|| m.get("name"))
                            .and_then(Value::as_str)
                            .ok_or("fieldRef without target")?;
                        match m.get("scope").and_then(Value::as_str) {
                            Some("parameter") => Ok(Expr::Parameter(name.to_string())),
                            Some("lambda") => Err("lambda expressions are not supported".into()),
                            _ => Ok(Expr::Column(name.to_string())),
                        }
                    }
                    "literal" => decode_literal(m.get("value").unwrap_or(&Value::Null)),
                    "unary" => {
                        let op = match m.get("op").and_then(Value::as_str) {
                            Some("not") => UnaryOp::Not,
                            Some("negate") | Some("neg") => UnaryOp::Negate,
                            other => return Err(format!("unknown unary operator {other:?}")),
                        };
                        let inner = m
                            .get("expr")
                            .or_else(|| m.get("operand"))
                            .ok_or("unary without expr")?;
                        Ok(Expr::Unary(op, Box::new(Self::decode(inner)?)))
                    }
                    "binary" => {
                        let name = m.get("op").and_then(Value::as_str).unwrap_or("");
                        let left = Self::decode(m.get("left").ok_or("binary without left")?)?;
                        let right = Self::decode(m.get("right").ok_or("binary without right")?)?;
                        match name {
                            // `in` and `between` are calls in ETLantic's dialect.
                            "in" => Ok(Expr::Call {
                                function: "dtcs:in".into(),
                                args: vec![left, right],
                            }),
                            _ => {
                                let op = BinaryOp::parse(name)
                                    .ok_or_else(|| format!("unknown binary operator `{name}`"))?;
                                Ok(Expr::Binary(op, Box::new(left), Box::new(right)))
                            }
                        }
                    }
                    "call" => {
                        let callee = m
                            .get("callee")
                            .or_else(|| m.get("function"))
                            .and_then(Value::as_str)
                            .ok_or("call without callee")?;
                        let args = m
                            .get("args")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().map(Self::decode).collect::<Result<Vec<_>, _>>())
                            .transpose()?
                            .unwrap_or_default();
                        let function = qualify(callee);
                        // ETLantic-py writes `in(x, 3, 4)`: the values after the first
                        // are the list (`in(x, v)` keeps its meaning: equality, or
                        // containment in a list or a string).
                        if function == "dtcs:in" && args.len() > 2 {
                            let mut args = args;
                            let items = args.split_off(1);
                            args.push(Expr::Call {
                                function: "dtcs:list".into(),
                                args: items,
                            });
                            return Ok(Expr::Call { function, args });
                        }
                        Ok(Expr::Call { function, args })
                    }
                    "lambda" => Err("lambda expressions are not supported".into()),
                    other => Err(format!("unknown expression kind `{other}`")),
                }
            }
            other => Err(format!(
                "an expression must be a string or an object, got {other}"
            )),
        }
    }

    /// Parses DTCS expression text with the `dtcs` crate's grammar.
    pub fn parse(text: &str) -> Result<Self, String> {
        let node = dtcs::to_structured_node(text)
            .map_err(|e| format!("cannot parse expression `{text}`: {e}"))?;
        let expr = Self::decode(&node)?;
        Ok(expr.map_columns(&|name| {
            if name == "null" || name == "NULL" {
                Expr::Literal(Literal::Null)
            } else {
                Expr::Column(name.to_string())
            }
        }))
    }

    fn map_columns(self, f: &dyn Fn(&str) -> Expr) -> Expr {
        match self {
            Expr::Column(c) => f(&c),
            Expr::Unary(op, e) => Expr::Unary(op, Box::new(e.map_columns(f))),
            Expr::Binary(op, l, r) => {
                Expr::Binary(op, Box::new(l.map_columns(f)), Box::new(r.map_columns(f)))
            }
            Expr::Call { function, args } => Expr::Call {
                function,
                args: args.into_iter().map(|a| a.map_columns(f)).collect(),
            },
            other => other,
        }
    }

    /// Encodes as a structured node in ETLantic-py's dialect.
    pub fn encode(&self) -> Value {
        match self {
            Expr::Column(c) => json!({"kind": "fieldRef", "target": c}),
            Expr::Parameter(p) => json!({"kind": "fieldRef", "scope": "parameter", "target": p}),
            Expr::Literal(l) => json!({"kind": "literal", "value": encode_literal(l)}),
            Expr::Unary(op, e) => json!({
                "kind": "unary",
                "op": match op { UnaryOp::Not => "not", UnaryOp::Negate => "negate" },
                "expr": e.encode(),
            }),
            Expr::Binary(op, l, r) => json!({
                "kind": "binary", "op": op.name(), "left": l.encode(), "right": r.encode(),
            }),
            Expr::Call { function, args } => json!({
                "kind": "call",
                "callee": function,
                "args": args.iter().map(Expr::encode).collect::<Vec<_>>(),
            }),
        }
    }

    /// Every column this expression reads.
    pub fn columns(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.visit(&mut |e| {
            if let Expr::Column(c) = e {
                if !out.contains(c) {
                    out.push(c.clone());
                }
            }
        });
        out
    }

    /// Every function this expression calls. The list on the right of `in`
    /// (`x in list(1, 2)`) is the membership syntax, not a call of `dtcs:list`.
    pub fn functions(&self) -> Vec<String> {
        fn walk(e: &Expr, out: &mut Vec<String>) {
            match e {
                Expr::Unary(_, e) => walk(e, out),
                Expr::Binary(_, l, r) => {
                    walk(l, out);
                    walk(r, out);
                }
                Expr::Call { function, args } => {
                    if !out.contains(function) {
                        out.push(function.clone());
                    }
                    for (i, a) in args.iter().enumerate() {
                        match a {
                            Expr::Call {
                                function: list,
                                args: items,
                            } if i == 1
                                && function == "dtcs:in"
                                && matches!(list.as_str(), "dtcs:list" | "dtcs:tuple") =>
                            {
                                items.iter().for_each(|item| walk(item, out))
                            }
                            a => walk(a, out),
                        }
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Unary(_, e) => e.visit(f),
            Expr::Binary(_, l, r) => {
                l.visit(f);
                r.visit(f);
            }
            Expr::Call { args, .. } => args.iter().for_each(|a| a.visit(f)),
            _ => {}
        }
    }

    /// Replaces parameter references by their values; a missing value is an error.
    pub fn bind_parameters(
        &self,
        params: &indexmap::IndexMap<String, Value>,
    ) -> Result<Expr, String> {
        Ok(match self {
            Expr::Parameter(p) => {
                let v = params
                    .get(p)
                    .ok_or_else(|| format!("missing value for transformation parameter `{p}`"))?;
                Expr::Literal(literal_from_json(v)?)
            }
            Expr::Unary(op, e) => Expr::Unary(*op, Box::new(e.bind_parameters(params)?)),
            Expr::Binary(op, l, r) => Expr::Binary(
                *op,
                Box::new(l.bind_parameters(params)?),
                Box::new(r.bind_parameters(params)?),
            ),
            Expr::Call { function, args } => Expr::Call {
                function: function.clone(),
                args: args
                    .iter()
                    .map(|a| a.bind_parameters(params))
                    .collect::<Result<_, _>>()?,
            },
            other => other.clone(),
        })
    }

    /// The name an unaliased expression gets as an output column.
    pub fn default_name(&self) -> String {
        match self {
            Expr::Column(c) => c.clone(),
            other => other.to_string(),
        }
    }
}

/// Function ids ETLantic-py's portable baseline uses that the `dtcs` crate's registry
/// does not list (it builds lists with `dtcs:list`): known functions, so a backend
/// without them refuses them as a gap (`ETL501`), not as unknown (`ETL306`).
pub const ETLANTIC_PY_FUNCTIONS: &[&str] = &["dtcs:array"];

/// Adds the `dtcs:` namespace to an unqualified function name.
pub fn qualify(name: &str) -> String {
    if name.contains(':') {
        name.to_string()
    } else {
        format!("dtcs:{}", name.to_ascii_lowercase())
    }
}

fn decode_literal(v: &Value) -> Result<Expr, String> {
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
    let val = v.get("value").unwrap_or(&Value::Null);
    let lit = match ty {
        "null" => Literal::Null,
        "boolean" => Literal::Boolean(val.as_bool().ok_or("boolean literal without a boolean")?),
        "integer" => Literal::Integer(val.as_i64().ok_or("integer literal out of range")?),
        "decimal" | "number" => {
            Literal::Decimal(val.as_f64().ok_or("decimal literal without a number")?)
        }
        "string" => Literal::String(
            val.as_str()
                .ok_or("string literal without a string")?
                .to_string(),
        ),
        // DTCS's `missing` and `invalid` are values only engines with three-state
        // distinct semantics can carry; ETLantic's columns are null or a value.
        "missing" | "invalid" => {
            return Err(format!(
                "a `{ty}` literal needs three-state values (three_state_distinct), which this engine does not have: use a null literal"
            ))
        }
        other => return Err(format!("unsupported literal type `{other}`")),
    };
    Ok(Expr::Literal(lit))
}

fn encode_literal(l: &Literal) -> Value {
    match l {
        Literal::Null => json!({"type": "null", "value": null}),
        Literal::Boolean(b) => json!({"type": "boolean", "value": b}),
        Literal::Integer(i) => json!({"type": "integer", "value": i}),
        Literal::Decimal(d) => json!({"type": "decimal", "value": d}),
        Literal::String(s) => json!({"type": "string", "value": s}),
    }
}

/// A literal from a plain JSON value (parameters, equality filters).
pub fn literal_from_json(v: &Value) -> Result<Literal, String> {
    Ok(match v {
        Value::Null => Literal::Null,
        Value::Bool(b) => Literal::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Literal::Integer(i),
            None => Literal::Decimal(n.as_f64().ok_or("number out of range")?),
        },
        Value::String(s) => Literal::String(s.clone()),
        other => return Err(format!("a parameter must be a scalar, got {other}")),
    })
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Null => write!(f, "null"),
            Literal::Boolean(b) => write!(f, "{b}"),
            Literal::Integer(i) => write!(f, "{i}"),
            Literal::Decimal(d) => {
                if d.fract() == 0.0 && d.is_finite() {
                    write!(f, "{d:.1}")
                } else {
                    write!(f, "{d}")
                }
            }
            Literal::String(s) => write!(f, "'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Column(c) => write!(f, "{c}"),
            Expr::Parameter(p) => write!(f, "${p}"),
            Expr::Literal(l) => write!(f, "{l}"),
            Expr::Unary(UnaryOp::Not, e) => write!(f, "!({e})"),
            Expr::Unary(UnaryOp::Negate, e) => write!(f, "-({e})"),
            Expr::Binary(op, l, r) => write!(f, "({l} {} {r})", op.symbol()),
            Expr::Call { function, args } => {
                let name = function.strip_prefix("dtcs:").unwrap_or(function);
                write!(f, "{name}(")?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{a}")?;
                }
                write!(f, ")")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_text_and_round_trips_nodes() {
        let e =
            Expr::parse("amount >= 10 && status != 'cancelled' || upper(name) == null").unwrap();
        assert_eq!(e.columns(), vec!["amount", "status", "name"]);
        assert_eq!(e.functions(), vec!["dtcs:upper"]);
        let back = Expr::decode(&e.encode()).unwrap();
        assert_eq!(back, e);
        assert!(e.to_string().contains("upper(name)"));
    }

    #[test]
    fn the_list_of_an_in_is_syntax_not_a_function() {
        let e = Expr::parse("region in list('eu', lower(x))").unwrap();
        assert_eq!(e.functions(), vec!["dtcs:in", "dtcs:lower"]);
        // A list anywhere else is a call.
        let e = Expr::parse("size(list(1, 2)) > 1").unwrap();
        assert!(e.functions().contains(&"dtcs:list".to_string()));
    }

    #[test]
    fn decodes_both_dialects() {
        let crate_dialect = json!({"kind":"binary","op":"neq","left":{"kind":"fieldRef","span":{"start":0,"end":1},"target":"g"},
            "right":{"kind":"literal","span":{"start":4,"end":7},"value":{"type":"string","value":"x"}},"span":{"start":0,"end":7}});
        let py_dialect = json!({"kind":"binary","op":"not_eq","left":{"kind":"fieldRef","target":"g"},
            "right":{"kind":"literal","value":{"type":"string","value":"x"}}});
        assert_eq!(
            Expr::decode(&crate_dialect).unwrap(),
            Expr::decode(&py_dialect).unwrap()
        );
        let p = json!({"kind":"fieldRef","scope":"parameter","target":"min"});
        let e = Expr::decode(&p).unwrap();
        let mut params = indexmap::IndexMap::new();
        params.insert("min".to_string(), json!(20));
        assert_eq!(
            e.bind_parameters(&params).unwrap(),
            Expr::Literal(Literal::Integer(20))
        );
        assert!(e.bind_parameters(&indexmap::IndexMap::new()).is_err());
    }

    #[test]
    fn bad_expressions_are_errors() {
        assert!(Expr::parse("a + ").is_err());
        assert!(Expr::decode(&json!({"kind":"wat"})).is_err());
        assert!(Expr::decode(&json!(3)).is_err());
    }
}
