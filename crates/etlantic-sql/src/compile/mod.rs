//! Portable DTCS plans compiled to one SQL query: a `WITH` chain of one common table
//! expression per action, in PostgreSQL's or SQLite's dialect.
//!
//! Every relation carries, besides its columns, an ordinal column (`__etl_ord`) that
//! records the DTCS row order: staged inputs number their rows, `dtcs:sort` renumbers
//! them (stable: ties keep their order), joins number left-major. The order-dependent
//! actions — `dtcs:limit`, `dtcs:distinct` and `dtcs:deduplicate` (first or last row per
//! key) and the `first`/`last` aggregates — read it, so their results are the same as on
//! the embedded engine. The final query returns the rows in that order.
//!
//! Semantics kept from DTCS: three-valued logic (SQL's own), nulls group and partition
//! together (SQL's `GROUP BY`/`PARTITION BY`), null keys never join unless the join is
//! null-safe (`IS NOT DISTINCT FROM`, SQLite `IS`), `concat` and `+` on strings are null
//! when any argument is, `least`/`greatest` are null when any argument is, `substr`
//! counts from 0, `trim` strips Unicode white space, `round` rounds ties to even (as ETLantic-py).
//!
//! What a dialect cannot compute exactly is not declared (see [`crate::capabilities`]):
//! the compiler returns `ETL501` for it instead of computing something else.

mod actions;
mod expr;
#[cfg(test)]
mod tests;

pub use expr::{parse_instant_micros, Compiled};

use crate::dialect::{quote, Dialect, Ty};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::DecodedPlan;
use indexmap::IndexMap;
use serde_json::Value;

/// The ordinal column every relation carries.
pub const ORD: &str = "__etl_ord";

/// A relation of the query: a table or CTE with typed user columns and [`ORD`].
#[derive(Clone, Debug)]
pub struct Rel {
    /// The quoted name to select from.
    pub from: String,
    /// User columns in order.
    pub columns: Vec<(String, Ty)>,
}

impl Rel {
    fn ty(&self, name: &str) -> Option<&Ty> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    fn column_list(&self, alias: Option<&str>) -> String {
        self.columns
            .iter()
            .map(|(n, _)| match alias {
                Some(a) => format!("{a}.{}", quote(n)),
                None => quote(n),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn unsupported(what: impl std::fmt::Display, dialect: Dialect) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!(
            "the `{}` backend cannot compute {what}",
            dialect.backend_name()
        ),
    )
}

fn mismatch(msg: impl Into<String>) -> Error {
    Error::new(&codes::TYPE_MISMATCH, msg.into())
}

/// Builds the `WITH` chain.
pub struct QueryBuilder {
    dialect: Dialect,
    ctes: Vec<(String, String)>,
    relations: IndexMap<String, Rel>,
    counter: usize,
}

impl QueryBuilder {
    /// A builder in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        QueryBuilder {
            dialect,
            ctes: Vec::new(),
            relations: IndexMap::new(),
            counter: 0,
        }
    }

    /// Names a relation (a staged table, or a step's result).
    pub fn bind(&mut self, name: &str, rel: Rel) {
        self.relations.insert(name.to_string(), rel);
    }

    /// A relation by name.
    pub fn relation(&self, name: &str) -> Result<&Rel> {
        self.relations.get(name).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_NODE,
                format!("the SQL region has no relation `{name}`"),
            )
        })
    }

    fn push(&mut self, sql: String, columns: Vec<(String, Ty)>) -> Rel {
        self.counter += 1;
        let name = format!("__etl_q{}", self.counter);
        self.ctes.push((name.clone(), sql));
        Rel {
            from: quote(&name),
            columns,
        }
    }

    /// The query that returns relation `rel` (user columns only) in its row order.
    pub fn finish(&self, rel: &Rel) -> String {
        let mut sql = String::new();
        if !self.ctes.is_empty() {
            sql.push_str("WITH ");
            let parts: Vec<String> = self
                .ctes
                .iter()
                .map(|(n, q)| format!("{} AS ({q})", quote(n)))
                .collect();
            sql.push_str(&parts.join(",\n"));
            sql.push('\n');
        }
        let cols = if rel.columns.is_empty() {
            "1 AS __etl_empty".to_string()
        } else {
            rel.column_list(None)
        };
        sql.push_str(&format!(
            "SELECT {cols} FROM {} ORDER BY {}",
            rel.from,
            quote(ORD)
        ));
        sql
    }

    /// Compiles the actions of `plan` whose relations lead to `output`, reading the plan
    /// inputs from `inputs` (plan input id → relation name bound in this builder).
    pub fn plan(
        &mut self,
        plan: &DecodedPlan,
        parameters: &IndexMap<String, Value>,
        inputs: &IndexMap<String, String>,
        output: &str,
    ) -> Result<Rel> {
        let mut bound = Vec::with_capacity(plan.inputs.len());
        for input in &plan.inputs {
            let relation = inputs.get(&input.id).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_NODE,
                    format!("plan input `{}` is not connected", input.id),
                )
            })?;
            bound.push((input.id.clone(), self.relation(relation)?.clone()));
        }
        plan.evaluate(parameters, bound, output, |_, op, target, secondary| {
            self.action(op, target, secondary)
        })
    }
}

/// The common type of two sides (numbers widen; null takes the other side's type).
fn unify(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Null, t) | (t, Ty::Null) => t.clone(),
        (Ty::Float, t) | (t, Ty::Float) if t.is_numeric() => Ty::Float,
        (Ty::Decimal(p, s), Ty::Int) | (Ty::Int, Ty::Decimal(p, s)) => Ty::Decimal(*p, *s),
        (Ty::Decimal(p1, s1), Ty::Decimal(p2, s2)) => Ty::Decimal((*p1).max(*p2), (*s1).max(*s2)),
        (a, _) => a.clone(),
    }
}

fn typed_null(d: Dialect, t: &Ty) -> String {
    match (d, t.column_type(d)) {
        (Dialect::Postgres, Some(ct)) => format!("CAST(NULL AS {ct})"),
        _ => "NULL".into(),
    }
}

fn cast_to(d: Dialect, sql: &str, from: &Ty, to: &Ty) -> String {
    if from == to {
        return sql.to_string();
    }
    match (d, to.column_type(d)) {
        (Dialect::Postgres, Some(ct)) => format!("CAST({sql} AS {ct})"),
        _ => sql.to_string(),
    }
}
