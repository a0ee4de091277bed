//! Relations: a Polars [`LazyFrame`] with its user columns (and their types) and the
//! hidden ordinal column that carries the DTCS row order.
//!
//! DTCS relations are ordered (a stable sort, "first row per key", `first`/`last`,
//! `limit` after `sort` all depend on it) while Polars is free to reorder rows in joins
//! and aggregations. So every relation has the column [`ORD`] (Polars' row-index type),
//! unique per row, whose ascending order is the relation's row order: inputs number
//! their rows, `dtcs:sort` renumbers them (ties keep their order), joins number them
//! left-major. Order-dependent actions read it; the final result is sorted by it.

use crate::error;
use crate::expr::{Compiled, Scope};
use etlantic_core::Result;
use indexmap::IndexMap;
use polars::prelude::*;

/// The hidden ordinal column.
pub(crate) const ORD: &str = "__etl_ord";

/// Column names starting with this prefix are reserved for the engine.
pub(crate) const RESERVED_PREFIX: &str = "__etl_";

/// Whether a column name is reserved for the engine.
pub(crate) fn is_reserved(name: &str) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

/// The ordinal column.
pub(crate) fn ord() -> Expr {
    col(ORD)
}

/// A relation being compiled.
#[derive(Clone)]
pub(crate) struct Relation {
    /// The rows: the user columns and [`ORD`].
    pub(crate) lf: LazyFrame,
    /// User columns in order, with their Polars types.
    pub(crate) columns: Vec<(String, DataType)>,
    /// Whether the rows are physically in ordinal order (after a scan, a sort, or
    /// anything that only filters or projects them), so that no sort is needed to read
    /// them in order.
    pub(crate) sorted: bool,
}

impl Relation {
    /// A relation over a frame of user columns, numbering its rows in their order.
    pub(crate) fn scan(df: DataFrame, name: &str) -> Result<Relation> {
        let mut columns = Vec::with_capacity(df.width());
        for c in df.columns() {
            if is_reserved(c.name()) {
                return Err(error::invalid_plan(format!(
                    "{name} has a column `{}`; names starting with `{RESERVED_PREFIX}` are reserved by the Polars backend",
                    c.name()
                )));
            }
            columns.push((c.name().to_string(), c.dtype().clone()));
        }
        Ok(Relation {
            lf: df.lazy().with_row_index(ORD, None),
            columns,
            sorted: true,
        })
    }

    /// The user column names, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.columns.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The type of a user column.
    pub(crate) fn dtype(&self, name: &str) -> Option<&DataType> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Checks that a user column exists (`ETL206` otherwise).
    pub(crate) fn require(&self, name: &str) -> Result<&DataType> {
        self.dtype(name)
            .ok_or_else(|| error::unknown_column(name, &self.names()))
    }

    /// The scope expressions over this relation are compiled in.
    pub(crate) fn scope(&self) -> Scope {
        Scope::new(
            self.columns
                .iter()
                .map(|(n, t)| (n.clone(), Compiled::new(col(n.as_str()), t.clone())))
                .collect::<IndexMap<_, _>>(),
        )
    }

    /// References to every user column, in order.
    pub(crate) fn column_exprs(&self) -> Vec<Expr> {
        self.columns.iter().map(|(n, _)| col(n.as_str())).collect()
    }

    /// The same rows, physically in ordinal order.
    pub(crate) fn in_order(self) -> Relation {
        if self.sorted {
            return self;
        }
        Relation {
            lf: self.lf.sort([ORD], SortMultipleOptions::default()),
            sorted: true,
            ..self
        }
    }

    /// Projects named values (keeping the ordinal and the row order).
    pub(crate) fn select(self, values: Vec<(String, Compiled)>) -> Relation {
        let mut exprs: Vec<Expr> = Vec::with_capacity(values.len() + 1);
        let mut columns = Vec::with_capacity(values.len());
        for (name, c) in values {
            exprs.push(c.expr.alias(name.as_str()));
            columns.push((name, c.dtype));
        }
        exprs.push(ord());
        Relation {
            lf: self.lf.select(exprs),
            columns,
            sorted: self.sorted,
        }
    }

    /// Numbers the rows again in their current physical order (which must be the
    /// intended one).
    pub(crate) fn renumber(self) -> Relation {
        let exprs = self.column_exprs();
        let lf = self.lf.select(exprs).with_row_index(ORD, None);
        Relation {
            lf,
            sorted: true,
            ..self
        }
    }

    /// The final frame: user columns only, rows in relation order.
    pub(crate) fn finish(self) -> LazyFrame {
        let exprs = self.column_exprs();
        self.in_order().lf.select(exprs)
    }
}
